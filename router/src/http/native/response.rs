//! TGI response shapes: `GenerateResponse`, `StreamResponse` and what they hold.

use serde::Serialize;
use utoipa::ToSchema;

use super::request::ResponseOptions;
use crate::generation::Completed;
use crate::scheduler::{PromptLogprobs, TokenLogprob};
use crate::stream::{Finish, TokenDecoding, TokenText};

/// `/generate`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct GenerateResponse {
    pub generated_text: String,
    /// With `details: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Length,
    EosToken,
    StopSequence,
}

impl From<Finish> for FinishReason {
    fn from(finish: Finish) -> Self {
        match finish {
            Finish::Length => Self::Length,
            Finish::EosToken => Self::EosToken,
            Finish::StopSequence => Self::StopSequence,
        }
    }
}

/// Generation details.
#[derive(Debug, Serialize, ToSchema)]
pub struct Details {
    pub finish_reason: FinishReason,
    pub generated_tokens: usize,
    pub seed: u64,
    /// Prompt tokens, with `decoder_input_details: true`.
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    /// Alternatives per generated token, with `top_n_tokens`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
    /// The candidates not chosen, when `best_of` > 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_of_sequences: Option<Vec<BestOfSequence>>,
}

/// A candidate `best_of` generated and did not choose.
#[derive(Debug, Serialize, ToSchema)]
pub struct BestOfSequence {
    pub generated_text: String,
    pub finish_reason: FinishReason,
    pub generated_tokens: usize,
    pub seed: u64,
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
}

impl BestOfSequence {
    /// The candidate's text and details.
    pub fn new(generated_text: String, details: Details) -> Self {
        Self {
            generated_text,
            finish_reason: details.finish_reason,
            generated_tokens: details.generated_tokens,
            seed: details.seed,
            prefill: details.prefill,
            tokens: details.tokens,
            top_tokens: details.top_tokens,
        }
    }
}

/// One token with its log-probability.
#[derive(Debug, Serialize, ToSchema)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub special: bool,
}

impl From<TokenText> for Token {
    fn from(token: TokenText) -> Self {
        Self {
            id: token.id,
            text: token.text,
            logprob: token.logprob,
            special: token.special,
        }
    }
}

/// A prompt token; the first one has no logprob (nothing precedes it).
#[derive(Debug, Serialize, ToSchema)]
pub struct PrefillToken {
    pub id: u32,
    pub text: String,
    pub logprob: Option<f32>,
}

/// One `/generate_stream` event: a token; the last one also carries the text and details.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamResponse {
    /// 1 for the first generated token.
    pub index: usize,
    pub token: Token,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Token>,
    pub generated_text: Option<String>,
    pub details: Option<StreamDetails>,
}

/// The last stream event's details.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamDetails {
    pub finish_reason: FinishReason,
    pub generated_tokens: usize,
    pub seed: u64,
    pub input_length: usize,
}

fn prefill(
    input_ids: &[u32],
    logprobs: &PromptLogprobs,
    decoding: &TokenDecoding,
) -> Vec<PrefillToken> {
    input_ids
        .iter()
        .enumerate()
        .map(|(position, &id)| PrefillToken {
            id,
            text: decoding.token_text(id),
            logprob: position
                .checked_sub(logprobs.first_position)
                .and_then(|index| logprobs.logprobs.get(index).copied()),
        })
        .collect()
}

/// Alternatives of one generated token as TGI `Token`s.
pub fn top_tokens(alternatives: &[TokenLogprob], decoding: &TokenDecoding) -> Vec<Token> {
    alternatives
        .iter()
        .map(|alt| Token {
            id: alt.id,
            text: decoding.token_text(alt.id),
            logprob: alt.logprob,
            special: decoding.is_special(alt.id),
        })
        .collect()
}

/// A finished generation's text (with the prompt when `return_full_text`) and details.
pub fn answer(
    completed: Completed,
    options: &ResponseOptions,
    decoding: &TokenDecoding,
) -> (String, Details) {
    let details = Details {
        finish_reason: completed.finish.into(),
        generated_tokens: completed.tokens.len(),
        seed: completed.seed,
        prefill: if options.decoder_input_details {
            prefill(&completed.input_ids, &completed.prompt_logprobs, decoding)
        } else {
            Vec::new()
        },
        top_tokens: if completed.tokens.iter().any(|t| !t.top_logprobs.is_empty()) {
            completed
                .tokens
                .iter()
                .map(|t| top_tokens(&t.top_logprobs, decoding))
                .collect()
        } else {
            Vec::new()
        },
        tokens: completed.tokens.into_iter().map(Token::from).collect(),
        best_of_sequences: None,
    };
    let generated_text = match &options.full_text_prefix {
        Some(prefix) => format!("{prefix}{}", completed.text),
        None => completed.text,
    };
    (generated_text, details)
}
