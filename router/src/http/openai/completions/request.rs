//! The `/v1/completions` request body and its translation into prompts and parameters.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::http::openai::{StopSpec, StreamOptions};
use crate::http::state::HandlerConfig;
use crate::scheduler::LogprobOptions;
use crate::validation::{
    check_choices, check_count, reject_unsupported, request_rules, AdapterChoice, GenerationParams,
    Prompt, ValidationError,
};

/// Most alternatives per token OpenAI's completions route returns.
pub const MAX_LOGPROBS: u32 = 5;

/// The request body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CompletionRequest {
    /// Required: a string, a list of strings, a list of token ids, or a list of token-id lists.
    /// Each prompt gets its own `n` choices.
    prompt: Option<PromptSpec>,
    /// Accepted and ignored: the served model answers.
    #[allow(dead_code)]
    model: Option<String>,
    /// Accepted and ignored: an opaque end-user id.
    #[allow(dead_code)]
    user: Option<String>,
    /// 0 only with `echo`: the prompt alone is scored and echoed.
    #[schema(minimum = 0)]
    max_tokens: Option<i64>,
    pub(super) stream: Option<bool>,
    pub(super) stream_options: Option<StreamOptions>,
    #[schema(minimum = 1, maximum = 16)]
    n: Option<i64>,
    /// Candidates per prompt (at least `n`, at most `max_best_of`); the `n` most likely are returned.
    #[schema(minimum = 1)]
    best_of: Option<i64>,
    /// The chosen token's logprob plus this many alternatives (0 to 5).
    #[schema(minimum = 0, maximum = 5)]
    pub(super) logprobs: Option<i64>,
    /// Prepend the prompt to each choice's text; with `logprobs`, the prompt's tokens and
    /// logprobs come first too (the first token's logprob is `null`).
    echo: Option<bool>,
    /// Only empty: the served model has no fill-in-the-middle mode.
    suffix: Option<String>,
    #[schema(minimum = 0.0, maximum = 100.0)]
    temperature: Option<f64>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    #[schema(minimum = 0)]
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<StopSpec>,
    #[schema(minimum = 0)]
    min_tokens: Option<i64>,
    ignore_eos: Option<bool>,
    stop_token_ids: Option<Vec<u32>>,
    /// Tandem extension: at most this many draft tokens per decode step for this request, from 0
    /// (no speculative decoding) to the server's `--speculate` (the default).
    #[schema(minimum = 0)]
    speculate: Option<i64>,
    /// vLLM's extension: lower runs earlier; only 0 unless the server runs
    /// `--scheduling-policy priority`.
    priority: Option<i64>,
    /// Names the prompt's shared prefix; alone it asks for `in_memory` retention.
    #[schema(max_length = 1024)]
    prompt_cache_key: Option<String>,
    /// `in_memory` (10 minutes) or `24h`: the cached prompt stays ahead of LRU eviction for
    /// that long after the request, as a bias, never a lock.
    #[schema(pattern = "^(in_memory|24h)$")]
    prompt_cache_retention: Option<String>,
    /// `{"ttl": "30m" | "12h"}`: the cached prompt's minimum lifetime ahead of LRU eviction
    /// (`mode` `implicit` only).
    #[schema(value_type = Option<Object>)]
    prompt_cache_options: Option<Map<String, Value>>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    min_p: Option<f64>,
    #[schema(exclusive_minimum = 0.0)]
    repetition_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    presence_penalty: Option<f64>,
    /// Token id (decimal string) → bias in -100..100.
    logit_bias: Option<BTreeMap<String, f64>>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Map<String, Value>,
}

/// `prompt`'s four forms.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "expected a string, an array of strings, an array of token ids or an array of token id arrays"
)]
enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl PromptSpec {
    fn into_prompts(self) -> Vec<Prompt> {
        match self {
            Self::Text(text) => vec![Prompt::Text(text)],
            Self::Texts(texts) => texts.into_iter().map(Prompt::Text).collect(),
            Self::Tokens(ids) => vec![Prompt::Tokens(ids)],
            Self::TokenLists(lists) => lists.into_iter().map(Prompt::Tokens).collect(),
        }
    }
}

/// How many candidates run per prompt (`best_of`) and how many of them are returned (`n`).
#[derive(Debug, Clone, Copy)]
pub struct Choices {
    pub n: usize,
    pub best_of: usize,
}

/// What one completions request asks for.
#[derive(Debug)]
pub struct CompletionPlan {
    pub prompts: Vec<Prompt>,
    pub params: GenerationParams,
    pub choices: Choices,
    pub echo: Echo,
}

/// What `echo` and `max_tokens: 0` ask to be returned besides the generated text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Echo {
    /// Prepend the prompt's text.
    pub prompt_text: bool,
    /// Prepend the prompt's tokens and their logprobs to the choice's logprobs.
    pub prompt_logprobs: bool,
    /// `max_tokens: 0`: one token is sampled (the prompt's forward pass yields it anyway)
    /// and dropped, so a choice holds the prompt alone.
    pub prompt_only: bool,
}

super::super::impl_sampling_fields!(CompletionRequest);

impl CompletionRequest {
    /// `best_of` defaults to `n` and must be at least `n`; streaming returns every
    /// candidate as it is generated, so it needs `best_of == n`.
    fn choices(&self, limits: &HandlerConfig) -> Result<Choices, ValidationError> {
        let n = check_choices("n", self.n, limits.request_limits.max_choices)?;
        let best_of = match self.best_of {
            None => n,
            Some(_) => check_choices("best_of", self.best_of, limits.max_best_of)?,
        };
        request_rules::check_best_of(n, best_of, self.stream == Some(true))?;
        Ok(Choices { n, best_of })
    }

    /// `suffix` is refused; `max_tokens: 0` needs `echo`, no `min_tokens` and no `best_of`
    /// beyond `n` (a prompt alone has nothing to rank).
    fn echo(&self, choices: Choices) -> Result<Echo, ValidationError> {
        let suffix = self
            .suffix
            .as_deref()
            .is_some_and(|suffix| !suffix.is_empty());
        let no_fill_in_the_middle = ": the served model has no fill-in-the-middle mode";
        request_rules::refuse_feature(suffix, "suffix", no_fill_in_the_middle)?;
        let prompt_text = self.echo == Some(true);
        let prompt_only = self.max_tokens == Some(0);
        if prompt_only {
            let Choices { n, best_of } = choices;
            request_rules::check_prompt_only(prompt_text, self.min_tokens, n, best_of)?;
        }
        Ok(Echo {
            prompt_text,
            prompt_logprobs: prompt_text && self.logprobs.is_some(),
            prompt_only,
        })
    }

    pub fn into_plan(mut self, limits: &HandlerConfig) -> Result<CompletionPlan, ValidationError> {
        let response_format = self.extra.remove("response_format");
        reject_unsupported(&self.extra, &[])?;
        let choices = self.choices(limits)?;
        let echo = self.echo(choices)?;
        if echo.prompt_only {
            self.max_tokens = Some(1);
        }
        let prompts = request_rules::required("prompt", self.prompt.take())?.into_prompts();
        request_rules::check_prompt_count(prompts.len(), limits.max_client_batch_size)?;
        request_rules::check_generations(
            prompts.len(),
            choices.n,
            choices.best_of,
            limits.request_limits.max_choices,
        )?;
        let logprobs = LogprobOptions {
            top_logprobs: check_count("logprobs", self.logprobs, MAX_LOGPROBS)?,
            prompt_logprobs: echo.prompt_logprobs,
        };
        let mut params = self
            .sampling_fields()
            .or_defaults(&limits.default_sampling)
            .into_params((self.max_tokens, "max_tokens"), logprobs);
        params.grammar = crate::validation::response_format::grammar(response_format)?;
        params.adapter = self.model.take().map(AdapterChoice::Model);
        Ok(CompletionPlan {
            prompts,
            params,
            choices,
            echo,
        })
    }
}
