//! The request fields both OpenAI generation routes declare alike: sampling and stopping
//! parameters, `stop` and `stream_options`.

use serde::Deserialize;
use utoipa::ToSchema;

use crate::reasoning::{ReasoningEffort, ReasoningRequest};
use crate::scheduler::LogprobOptions;
use crate::validation::cache_hints::CacheHint;
use crate::validation::{
    request_rules, GenerationParams, ProcessorParams, SamplingDefaults, ValidationError,
};

/// Both OpenAI request bodies carry the sampling fields under the same names; this moves
/// them into one `SamplingFields`.
macro_rules! impl_sampling_fields {
    ($request:ty) => {
        impl $request {
            fn sampling_fields(&mut self) -> $crate::http::openai::fields::SamplingFields {
                $crate::http::openai::fields::SamplingFields {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    seed: self.seed,
                    stop: self.stop.take(),
                    min_tokens: self.min_tokens,
                    ignore_eos: self.ignore_eos,
                    stop_token_ids: self.stop_token_ids.take(),
                    speculate: self.speculate,
                    priority: self.priority,
                    cache_hint: $crate::validation::cache_hints::CacheHint::OpenAi {
                        key: self.prompt_cache_key.take(),
                        retention: self.prompt_cache_retention.take(),
                        options: self.prompt_cache_options.take(),
                    },
                    processors: $crate::validation::ProcessorParams {
                        min_p: self.min_p,
                        typical_p: None,
                        repetition_penalty: self.repetition_penalty,
                        frequency_penalty: self.frequency_penalty,
                        presence_penalty: self.presence_penalty,
                        logit_bias: self.logit_bias.take(),
                    },
                }
            }
        }
    };
}
pub(crate) use impl_sampling_fields;

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    /// The stop strings as a list.
    pub fn into_vec(spec: Option<Self>) -> Vec<String> {
        match spec {
            None => Vec::new(),
            Some(Self::One(stop)) => vec![stop],
            Some(Self::Many(stops)) => stops,
        }
    }
}

/// Sampling and stopping parameters both OpenAI routes accept, OpenAI's and vLLM's extras.
/// Declared field by field in each route body (no `flatten`) so type errors name the field.
#[derive(Debug, Default)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<StopSpec>,
    pub min_tokens: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    /// Most draft tokens per step (Tandem's extension); `None` means the server's `--speculate`.
    pub speculate: Option<i64>,
    /// vLLM's `priority`: lower runs earlier under `--scheduling-policy priority`.
    pub priority: Option<i64>,
    /// `prompt_cache_key` and `prompt_cache_retention`, checked by the validator.
    pub cache_hint: CacheHint,
    pub processors: ProcessorParams,
}

impl SamplingFields {
    /// Fills the fields the client left unset with the model's recommended values.
    pub fn or_defaults(mut self, defaults: &SamplingDefaults) -> Self {
        self.temperature = self.temperature.or(defaults.temperature);
        self.top_p = self.top_p.or(defaults.top_p);
        self.top_k = self.top_k.or(defaults.top_k);
        let processors = &mut self.processors;
        processors.min_p = processors.min_p.or(defaults.min_p);
        processors.repetition_penalty = processors
            .repetition_penalty
            .or(defaults.repetition_penalty);
        self
    }

    /// The route-independent parameters; `max_new_tokens` is named by the route.
    pub fn into_params(
        self,
        max_new_tokens: (Option<i64>, &'static str),
        logprobs: LogprobOptions,
    ) -> GenerationParams {
        GenerationParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_new_tokens: max_new_tokens.0,
            max_new_tokens_param: max_new_tokens.1,
            seed: self.seed,
            stop: StopSpec::into_vec(self.stop),
            processors: self.processors,
            min_new_tokens: self.min_tokens,
            ignore_eos: self.ignore_eos == Some(true),
            stop_token_ids: self.stop_token_ids.unwrap_or_default(),
            logprobs,
            truncate: None,
            grammar: None,
            speculate: self.speculate,
            reasoning: ReasoningRequest::default(),
            adapter: None,
            priority: self.priority,
            cache_hint: self.cache_hint,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// End the stream with a chunk carrying `usage` and no choices.
    #[serde(default)]
    pub include_usage: bool,
}

impl StreamOptions {
    /// Whether a stream ends with a usage chunk: asked for, or the server always sends it.
    pub fn usage_wanted(options: Option<Self>, always: bool) -> bool {
        always || options.is_some_and(|options| options.include_usage)
    }
}

/// The reasoning an OpenAI `effort` (sent as `param`) asks for; the model's default without one.
pub fn reasoning_effort(
    effort: Option<&str>,
    param: &'static str,
) -> Result<ReasoningRequest, ValidationError> {
    let Some(effort) = effort else {
        return Ok(ReasoningRequest::default());
    };
    match ReasoningEffort::parse(effort) {
        Some(level) => Ok(level.request(param)),
        None => request_rules::refuse_value(param, ReasoningEffort::NAMES, format!("{effort:?}")),
    }
}
