//! Why a request is refused, naming the offending parameter.

use super::grammar_refusal::GrammarRefusal;
use super::template_source::ChatUnavailable;
use crate::images::{ImageError, ImageTokensError};

/// A request the router refuses, with a message naming the offending parameter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("`{param}` must be {expected}, got {value}")]
    OutOfRange {
        param: String,
        expected: &'static str,
        value: String,
    },
    #[error("`{param}` must be an integer from 0 to {max}, got {value}")]
    CountOutOfRange {
        param: &'static str,
        max: u32,
        value: i64,
    },
    #[error("`{param}` holds token id {id}, but the vocabulary has {vocab_size} tokens")]
    UnknownToken {
        param: &'static str,
        id: u32,
        vocab_size: usize,
    },
    #[error("`{0}` is required")]
    Missing(&'static str),
    #[error("`{0}` must not be empty")]
    Empty(&'static str),
    #[error("`{param}` is not supported yet{detail}")]
    Unsupported { param: String, detail: String },
    #[error("`messages[{index}].role` must be one of system, user, assistant, tool; got `{role}`")]
    InvalidRole { index: usize, role: String },
    #[error("`stop` accepts at most {max} strings, got {got}")]
    TooManyStops { max: usize, got: usize },
    #[error("`{param}` accepts at most {max} entries, got {got}")]
    TooMany {
        param: &'static str,
        max: usize,
        got: usize,
    },
    #[error("`{param}` holds a string of {got} bytes, at most {max} are allowed")]
    TooLong {
        param: &'static str,
        max: usize,
        got: usize,
    },
    #[error("the prompt has {input_tokens} tokens but at most {max_input_tokens} are allowed (`max_input_tokens`)")]
    InputTooLong {
        input_tokens: usize,
        max_input_tokens: usize,
    },
    #[error("the prompt has {input_tokens} tokens and `{param}` is {max_new_tokens}: together they must be at most {max_total_tokens} (`max_total_tokens`), so `{param}` can be at most {}", .max_total_tokens.saturating_sub(*.input_tokens))]
    TotalTooLong {
        param: &'static str,
        input_tokens: usize,
        /// As the client sent it.
        max_new_tokens: i64,
        max_total_tokens: usize,
    },
    #[error(transparent)]
    NoChat(ChatUnavailable),
    #[error("`prompt` lists {got} prompts but at most {max} are accepted per request")]
    TooManyPrompts { max: usize, got: usize },
    #[error("`messages` cannot be rendered by the model's chat template: {0}")]
    Template(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    TextTooLarge(#[from] super::TextTooLarge),
    #[error("`{param}` is `{name}`, which this server does not serve; it serves {served}")]
    UnknownAdapter {
        param: &'static str,
        name: String,
        served: String,
    },
    #[error("`{param}`: {refusal}")]
    InvalidGrammar {
        param: &'static str,
        refusal: GrammarRefusal,
    },
    #[error("`{param}`: {source}")]
    ImagePart { param: String, source: ImageError },
    #[error("image {number} of the request: {source}")]
    Image { number: usize, source: ImageError },
    #[error("the request carries images, but this model takes text only")]
    TextOnlyModel,
    #[error(transparent)]
    ImagePlacement(ImageTokensError),
    #[error(
        "image {number} of the request takes {tokens} prompt tokens, more than the \
         {max_step_tokens} one step computes (--max-batch-prefill-tokens): an image's tokens are \
         computed in one step"
    )]
    ImageSpanTooLong {
        number: usize,
        tokens: usize,
        max_step_tokens: usize,
    },
}

impl ValidationError {
    /// `param`'s value is not what it must be.
    pub(crate) fn out_of_range(
        param: &'static str,
        expected: &'static str,
        value: impl ToString,
    ) -> Self {
        Self::OutOfRange {
            param: param.to_owned(),
            expected,
            value: value.to_string(),
        }
    }

    /// The request parameter at fault, when there is one.
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::OutOfRange { param, .. }
            | Self::Unsupported { param, .. }
            | Self::ImagePart { param, .. } => Some(param),
            Self::Missing(param) | Self::Empty(param) => Some(param),
            Self::InvalidRole { .. } | Self::NoChat(_) | Self::Template(_) => Some("messages"),
            Self::Image { .. }
            | Self::TextOnlyModel
            | Self::ImagePlacement(_)
            | Self::ImageSpanTooLong { .. } => Some("messages"),
            Self::TooManyStops { .. } => Some("stop"),
            Self::TooManyPrompts { .. } => Some("prompt"),
            Self::TotalTooLong { param, .. }
            | Self::CountOutOfRange { param, .. }
            | Self::UnknownToken { param, .. }
            | Self::TooMany { param, .. }
            | Self::TooLong { param, .. }
            | Self::InvalidGrammar { param, .. }
            | Self::UnknownAdapter { param, .. } => Some(param),
            Self::InputTooLong { .. } | Self::Tokenizer(_) | Self::TextTooLarge(_) => None,
        }
    }
}
