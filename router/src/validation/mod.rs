//! Turns a client's prompt and parameters into a tokenized, bounded `GenerationRequest`.

mod adapters;
mod bounds;
mod budget;
pub mod cache_hints;
mod chat_template;
mod error;
mod family_templates;
mod grammar;
mod grammar_refusal;
mod model_files;
mod params;
mod processors;
mod prompt_check;
mod prompt_images;
#[cfg(test)]
mod prompt_images_tests;
mod reasoning;
pub mod request_rules;
mod requested_grammar;
pub mod response_format;
mod sampling_defaults;
pub mod serde_wording;
mod template_clock;
mod template_json;
mod template_kwargs;
mod template_python;
mod template_source;
#[cfg(test)]
pub(crate) mod testing;
mod tokenize;

use std::sync::Arc;

use tokenizers::Tokenizer;

pub use adapters::{AdapterChoice, LoraAdapters};
pub use budget::{peak_bytes as tokenization_peak_bytes, TextTooLarge, TokenizationReservation};
pub use chat_template::{
    ChatEnding, ChatMessage, ChatTemplate, ContentPart, ImageData, TemplateExtras,
};
pub use error::ValidationError;
pub use family_templates::FamilyTemplate;
pub use grammar::{GrammarCompiler, GrammarSetupError};
pub use grammar_refusal::{GrammarRefusal, GrammarSource};
pub use model_files::{ModelFiles, ModelFilesError};
pub use params::{check_choices, check_count, reject_unsupported, GenerationParams};
pub use processors::ProcessorParams;
pub use requested_grammar::{with_json_layout, RequestedGrammar, TgiGrammarSite, TOOLS_PARAM};
pub use sampling_defaults::SamplingDefaults;
pub use template_kwargs::template_kwargs;
pub use template_source::{ChatUnavailable, TemplateSource, TemplateSourceError};

use crate::images::{ImageTokens, MediaFetcher};
use crate::limits::RequestLimits;
use crate::reasoning::{ReasoningParser, ReasoningSplitter};
use crate::scheduler::{GenerationRequest, SchedulingPolicy, StoppingParams};

/// Bytes of memory tokenization takes at once unless `with_tokenization_budget` says
/// otherwise: two `/tokenize` answers for bodies of the default payload limit.
pub const DEFAULT_TOKENIZATION_BUDGET: usize = 2 * tokenization_peak_bytes(2_000_000);

/// Roles a chat message may have.
pub const CHAT_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// What to generate from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Raw text, tokenized with the tokenizer's special tokens (BOS), as `transformers` does.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
    /// A conversation rendered by the chat template; the rendering already holds any special
    /// tokens, so it is tokenized without adding more.
    Chat(Vec<ChatMessage>, ChatEnding, TemplateExtras),
}

/// A request ready for the scheduler, plus what the HTTP layer reports back.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    pub request: GenerationRequest,
    pub stop: Vec<String>,
    /// Splits each choice's output into reasoning and answer; `None` for other models.
    pub reasoning: Option<ReasoningSplitter>,
}

/// `/tokenize`'s tokens: ids with byte offsets into `text`, and the memory reserved for them
/// and the answer written from them.
#[derive(Debug)]
pub struct OffsetTokens {
    pub text: String,
    pub tokens: Vec<(u32, (usize, usize))>,
    pub reservation: TokenizationReservation,
}

/// Token limits every request must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub max_stop_sequences: usize,
}

/// Validates and tokenizes requests; cheap to share across handlers.
#[derive(Debug)]
pub struct Validator {
    tokenizer: Arc<Tokenizer>,
    chat_template: Result<Arc<ChatTemplate>, ChatUnavailable>,
    limits: Limits,
    request_limits: RequestLimits,
    /// Token ids below this exist in both the tokenizer and the model.
    vocab_size: usize,
    /// The model's end-of-sequence ids, as the shard's `Info` reports them.
    eos_token_ids: Vec<u32>,
    /// `None`: this model serves no grammars (requests asking for one are rejected).
    grammars: Option<Arc<GrammarCompiler>>,
    /// Text rendered and tokenized at once (see `budget`).
    tokenizing: budget::TokenizationBudget,
    /// The server's `--speculate`: the most drafts per step a request may ask for.
    max_drafts: u32,
    /// The reasoning format of chat output; `None`: output is not split.
    reasoning: Option<ReasoningParser>,
    /// The LoRA adapters requests may select.
    adapters: LoraAdapters,
    /// The scheduler's order: only `SchedulingPolicy::Priority` accepts a `priority` other
    /// than 0.
    scheduling: SchedulingPolicy,
    /// How the model's prompts hold images; `None`: the model takes text only.
    image_tokens: Option<Arc<ImageTokens>>,
    /// Most tokens one scheduler step computes: an image's whole span must fit in one step.
    max_step_tokens: usize,
    /// Fetches images by URL from the allowed hosts; `None`: no image is fetched.
    media_fetcher: Option<Arc<MediaFetcher>>,
}

impl Validator {
    /// A validator for a model without end-of-sequence ids until `with_eos_token_ids`; chat
    /// prompts render with `chat_template`, or are refused for its reason.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        chat_template: Result<ChatTemplate, ChatUnavailable>,
        limits: Limits,
    ) -> Self {
        Self {
            vocab_size: tokenizer.get_vocab_size(true),
            tokenizer,
            chat_template: chat_template.map(Arc::new),
            limits,
            request_limits: RequestLimits::default(),
            eos_token_ids: Vec::new(),
            grammars: None,
            tokenizing: budget::TokenizationBudget::new(DEFAULT_TOKENIZATION_BUDGET),
            max_drafts: 0,
            reasoning: None,
            adapters: LoraAdapters::default(),
            scheduling: SchedulingPolicy::default(),
            image_tokens: None,
            max_step_tokens: 0,
            media_fetcher: None,
        }
    }

    /// The scheduler's order; under `SchedulingPolicy::Priority` requests may set a
    /// `priority` other than 0, which the scheduler orders them by.
    #[must_use]
    pub fn with_scheduling_policy(mut self, scheduling: SchedulingPolicy) -> Self {
        self.scheduling = scheduling;
        self
    }

    /// Lets requests select one of `adapters`.
    #[must_use]
    pub fn with_lora_adapters(mut self, adapters: LoraAdapters) -> Self {
        self.adapters = adapters;
        self
    }

    /// The LoRA adapters requests may select.
    pub fn lora_adapters(&self) -> &LoraAdapters {
        &self.adapters
    }

    /// Lets a request ask for at most `max_drafts` drafts per step (`speculate`).
    #[must_use]
    pub fn with_max_drafts(mut self, max_drafts: usize) -> Self {
        self.max_drafts = u32::try_from(max_drafts).unwrap_or(u32::MAX);
        self
    }

    /// Lets tokenization take at most `bytes` of memory at once (see `tokenization_peak_bytes`); more
    /// waits, and a larger job runs alone.
    #[must_use]
    pub fn with_tokenization_budget(mut self, bytes: usize) -> Self {
        self.tokenizing = budget::TokenizationBudget::new(bytes);
        self
    }

    /// Bounds stop strings, stop token ids and logit bias entries by `limits`.
    #[must_use]
    pub fn with_request_limits(mut self, limits: RequestLimits) -> Self {
        self.request_limits = limits;
        self
    }

    /// Accepts only token ids the model has too: its embedding has `model_vocab_size` rows.
    #[must_use]
    pub fn with_model_vocab_size(mut self, model_vocab_size: usize) -> Self {
        self.vocab_size = self.vocab_size.min(model_vocab_size);
        self
    }

    /// Every request stops on `eos_token_ids` unless it sets `ignore_eos`: the router is the
    /// only one that decides where a sequence ends, and the shard stops only on the stop token
    /// ids each request carries.
    #[must_use]
    pub fn with_eos_token_ids(mut self, eos_token_ids: Vec<u32>) -> Self {
        self.eos_token_ids = eos_token_ids;
        self
    }

    /// Enables grammar-constrained requests.
    #[must_use]
    pub fn with_grammars(mut self, grammars: Arc<GrammarCompiler>) -> Self {
        self.grammars = Some(grammars);
        self
    }

    /// Checks parameters, renders and tokenizes the prompt, and bounds the request's length.
    pub async fn validate(
        &self,
        prompt: Prompt,
        params: &GenerationParams,
    ) -> Result<ValidRequest, ValidationError> {
        bounds::check(params, &self.request_limits)?;
        let adapter = self.adapters.select(params.adapter.as_ref())?;
        let checked = params::check(params, self.limits.max_stop_sequences)?;
        self.check_token_ids(&params.stop_token_ids, &checked.sampling.logit_bias)?;
        self.check_prompt(&prompt)?;
        if let Some(requested) = &params.grammar {
            self.check_grammar(requested).await?;
        }
        let truncate = self.check_truncate(params.truncate)?;
        let cache_retention = params.cache_hint.retention()?;
        let priority = params::check_priority(params.priority, self.scheduling)?;
        let max_drafts = params
            .speculate
            .map(|asked| check_count("speculate", Some(asked), self.max_drafts))
            .transpose()?;
        let reasoning = self.reasoning_for(&prompt);
        let switches = reasoning
            .map(|parser| params.reasoning.template_switches(parser))
            .unwrap_or_default();
        let (input_ids, images) = self.prompt_ids(prompt, switches, truncate).await?;
        let input_tokens = input_ids.len();
        if input_tokens > self.limits.max_input_tokens {
            return Err(ValidationError::InputTooLong {
                input_tokens,
                max_input_tokens: self.limits.max_input_tokens,
            });
        }
        let room = self.limits.max_total_tokens.saturating_sub(input_tokens);
        let max_new_tokens = match checked.max_new_tokens {
            None => u32::try_from(room).unwrap_or(u32::MAX),
            Some(asked) => usize::try_from(asked)
                .ok()
                .filter(|&n| n <= room)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(ValidationError::TotalTooLong {
                    param: params.max_new_tokens_param,
                    input_tokens,
                    max_new_tokens: asked,
                    max_total_tokens: self.limits.max_total_tokens,
                })?,
        };
        let mut stop_token_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_token_ids.extend(&self.eos_token_ids);
        }
        if checked.min_new_tokens > max_new_tokens {
            return Err(ValidationError::OutOfRange {
                param: "min_tokens".to_owned(),
                expected: "at most the number of new tokens the prompt leaves room for",
                value: format!("{} (room for {max_new_tokens})", checked.min_new_tokens),
            });
        }
        let stopping = StoppingParams {
            max_new_tokens,
            min_new_tokens: checked.min_new_tokens,
            stop_token_ids,
        };
        let reasoning = self.reasoning_plan(reasoning, &input_ids, params).await?;
        Ok(ValidRequest {
            request: GenerationRequest {
                input_ids,
                sampling: checked.sampling,
                stopping,
                logprobs: params.logprobs,
                grammar: reasoning.grammar.map(|g| g.grammar),
                max_drafts: max_drafts.map(|drafts| drafts as usize),
                adapter,
                priority,
                cache_retention,
                // The HTTP layer sets who the request is for.
                tenant: None,
                images,
                // The generation sets its trace.
                trace: None,
            },
            stop: checked.stop,
            reasoning: reasoning.splitter,
        })
    }

    /// A grammar must compile, and only a model with a grammar engine accepts one.
    async fn check_grammar(&self, requested: &RequestedGrammar) -> Result<(), ValidationError> {
        match &self.grammars {
            Some(grammars) => grammars.check(requested).await,
            None => Err(ValidationError::Unsupported {
                param: requested.param.to_owned(),
                detail: " by this model (its tokenizer.json has no usable vocabulary)".to_owned(),
            }),
        }
    }

    /// Token ids in `stop_token_ids` and `logit_bias` must exist in the vocabulary.
    fn check_token_ids(
        &self,
        stop_token_ids: &[u32],
        logit_bias: &[(u32, f32)],
    ) -> Result<(), ValidationError> {
        let vocab_size = self.vocab_size;
        let biased = logit_bias.iter().map(|(id, _)| *id);
        let named = stop_token_ids.iter().map(|id| ("stop_token_ids", *id));
        match named
            .chain(biased.map(|id| ("logit_bias", id)))
            .find(|(_, id)| usize::try_from(*id).map_or(true, |id| id >= vocab_size))
        {
            Some((param, id)) => Err(ValidationError::UnknownToken {
                param,
                id,
                vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// `truncate`: from 1 to `max_input_tokens`.
    fn check_truncate(&self, truncate: Option<i64>) -> Result<Option<usize>, ValidationError> {
        let max = self.limits.max_input_tokens;
        truncate
            .map(|keep| {
                usize::try_from(keep)
                    .ok()
                    .filter(|keep| (1..=max).contains(keep))
                    .ok_or_else(|| ValidationError::OutOfRange {
                        param: "truncate".to_owned(),
                        expected: "an integer from 1 to max_input_tokens",
                        value: format!("{keep} (max_input_tokens {max})"),
                    })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests;
