//! The TGI request body (`inputs` + `GenerateParameters`) and its translation into generation parameters.

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::http::state::HandlerConfig;
use crate::reasoning::ReasoningRequest;
use crate::scheduler::LogprobOptions;
use crate::validation::cache_hints::CacheHint;
use crate::validation::{
    check_choices, check_count, reject_unsupported, request_rules, AdapterChoice, GenerationParams,
    ProcessorParams, Prompt, RequestedGrammar, ValidationError,
};

/// `POST /generate` and `/generate_stream` body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct GenerateRequest {
    /// The prompt, tokenized with the tokenizer's special tokens.
    #[schema(example = "My name is Olivier and I")]
    inputs: String,
    parameters: Option<GenerateParameters>,
    /// `POST /` streams when `true`; must be `false` or absent on `/generate`; `/generate_stream`
    /// always streams.
    stream: Option<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Map<String, Value>,
}

/// TGI's `GenerateParameters`.
#[derive(Debug, Default, Deserialize, ToSchema)]
struct GenerateParameters {
    /// Candidates generated; the most likely is returned (needs sampling).
    #[schema(minimum = 1)]
    best_of: Option<i64>,
    /// Return `details`.
    details: Option<bool>,
    /// Sample instead of greedy decoding.
    do_sample: Option<bool>,
    #[schema(minimum = 1)]
    max_new_tokens: Option<i64>,
    /// Prepend the prompt to `generated_text`.
    return_full_text: Option<bool>,
    seed: Option<u64>,
    /// At most `max_stop_sequences` non-empty strings.
    stop: Option<Vec<String>>,
    #[schema(minimum = 0.0, maximum = 100.0)]
    temperature: Option<f64>,
    #[schema(minimum = 0)]
    top_k: Option<i64>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    /// Alternatives per generated token in `details.top_tokens` (at most `max_top_n_tokens`).
    #[schema(minimum = 0)]
    top_n_tokens: Option<i64>,
    /// Return `details.prefill` with the prompt tokens' log-probabilities.
    decoder_input_details: Option<bool>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    typical_p: Option<f64>,
    #[schema(exclusive_minimum = 0.0)]
    repetition_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
    /// Keep only the last `truncate` prompt tokens (1 to `max_input_tokens`).
    #[schema(minimum = 1)]
    truncate: Option<i64>,
    /// Only `false`: the Kirchenbauer watermark is not implemented.
    watermark: Option<bool>,
    /// The LoRA adapter to generate with, by name (`/v1/models` lists them); `null` or empty: the
    /// base model.
    adapter_id: Option<String>,
    /// Tandem extension: at most this many draft tokens per decode step for this request, from 0
    /// (no speculative decoding) to the server's `--speculate` (the default).
    #[schema(minimum = 0)]
    speculate: Option<i64>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Map<String, Value>,
}

/// How the response is shaped, beyond what the scheduler needs.
pub struct ResponseOptions {
    /// Candidates generated; the most likely one (highest cumulative logprob) is returned.
    pub best_of: usize,
    pub details: bool,
    pub decoder_input_details: bool,
    pub full_text_prefix: Option<String>,
}

impl GenerateParameters {
    /// `watermark` is accepted only with a value that changes nothing.
    fn reject_unimplemented(&self) -> Result<(), ValidationError> {
        let watermark = self.watermark == Some(true);
        let no_watermark = ": the Kirchenbauer watermark is not implemented";
        request_rules::refuse_feature(watermark, "watermark", no_watermark)
    }

    fn sampling_requested(&self) -> bool {
        self.do_sample == Some(true)
            || self.temperature.is_some_and(|t| t != 1.0)
            || self.top_k.is_some_and(|k| k != 0)
            || self.top_p.is_some_and(|t| t != 1.0)
            || self.typical_p.is_some_and(|t| t != 1.0)
    }
}

impl GenerateRequest {
    /// Whether the body asked `/generate` to stream.
    pub fn wants_stream(&self) -> bool {
        self.stream == Some(true)
    }

    pub fn into_parts(
        self,
        limits: &HandlerConfig,
    ) -> Result<(Prompt, GenerationParams, ResponseOptions), ValidationError> {
        reject_unsupported(&self.extra, &[])?;
        let mut p = self.parameters.unwrap_or_default();
        let grammar = RequestedGrammar::from_tgi(p.extra.remove("grammar"))?;
        reject_unsupported(&p.extra, &[])?;
        p.reject_unimplemented()?;
        let best_of = check_choices("best_of", p.best_of, limits.max_best_of)?;
        let sampling_requested = p.sampling_requested();
        request_rules::check_best_of_samples(best_of, sampling_requested)?;
        let params = GenerationParams {
            temperature: if sampling_requested {
                p.temperature
            } else {
                Some(0.0)
            },
            top_p: p.top_p,
            top_k: p.top_k,
            max_new_tokens: p.max_new_tokens,
            max_new_tokens_param: "max_new_tokens",
            seed: p.seed,
            stop: p.stop.unwrap_or_default(),
            processors: ProcessorParams {
                typical_p: p.typical_p,
                repetition_penalty: p.repetition_penalty,
                frequency_penalty: p.frequency_penalty,
                ..ProcessorParams::default()
            },
            min_new_tokens: None,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            logprobs: LogprobOptions {
                top_logprobs: check_count("top_n_tokens", p.top_n_tokens, limits.max_top_n_tokens)?,
                prompt_logprobs: p.decoder_input_details == Some(true),
            },
            truncate: p.truncate,
            grammar,
            speculate: p.speculate,
            reasoning: ReasoningRequest::default(),
            adapter: p.adapter_id.map(AdapterChoice::AdapterId),
            priority: None,
            cache_hint: CacheHint::None,
        };
        let options = ResponseOptions {
            best_of,
            details: p.details == Some(true),
            decoder_input_details: p.decoder_input_details == Some(true),
            full_text_prefix: (p.return_full_text == Some(true)).then(|| self.inputs.clone()),
        };
        Ok((Prompt::Text(self.inputs), params, options))
    }
}
