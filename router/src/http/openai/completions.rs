//! `POST /v1/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use std::collections::BTreeMap;
use std::sync::Arc;

use super::logprobs::CompletionLogprobs;
use super::{
    finish_reason, stream_chunks, ChunkBuilder, ResponseMeta, SamplingFields, StopSpec,
    StreamOptions, Usage, ACCEPTED_IGNORED,
};
use crate::error::{ApiError, OpenAi};
use crate::http::generation::Generation;
use crate::http::json::ApiJson;
use crate::http::AppState;
use crate::scheduler::LogprobOptions;
use crate::stream::{TokenDecoding, TokenText};
use crate::validation::{
    check_count, reject_unsupported, require_single_choice, GenerationParams, ProcessorParams,
    Prompt, ValidationError,
};

/// Most alternatives per token OpenAI's completions route returns.
pub const MAX_LOGPROBS: u32 = 5;

/// The request body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    prompt: Option<PromptSpec>,
    max_tokens: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    best_of: Option<i64>,
    /// `None`: no logprobs; `Some(n)`: the chosen token's plus `n` alternatives.
    logprobs: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<StopSpec>,
    min_tokens: Option<i64>,
    ignore_eos: Option<bool>,
    stop_token_ids: Option<Vec<u32>>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    logit_bias: Option<BTreeMap<String, f64>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// `prompt`: a string, or a list holding exactly one string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptSpec {
    One(String),
    Many(Vec<String>),
}

impl CompletionRequest {
    fn sampling_fields(&mut self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.take(),
            min_tokens: self.min_tokens,
            ignore_eos: self.ignore_eos,
            stop_token_ids: self.stop_token_ids.take(),
            processors: ProcessorParams {
                min_p: self.min_p,
                typical_p: None,
                repetition_penalty: self.repetition_penalty,
                frequency_penalty: self.frequency_penalty,
                presence_penalty: self.presence_penalty,
                logit_bias: self.logit_bias.take(),
            },
        }
    }

    fn into_parts(mut self) -> Result<(Prompt, GenerationParams), ValidationError> {
        reject_unsupported(&self.extra, &ACCEPTED_IGNORED)?;
        require_single_choice("n", self.n)?;
        require_single_choice("best_of", self.best_of)?;
        let prompt = match self
            .prompt
            .take()
            .ok_or(ValidationError::Missing("prompt"))?
        {
            PromptSpec::One(prompt) => prompt,
            PromptSpec::Many(mut prompts) if prompts.len() == 1 => prompts.remove(0),
            PromptSpec::Many(prompts) => {
                return Err(ValidationError::Unsupported {
                    param: "prompt".to_owned(),
                    detail: format!(
                        ": got {} prompts, only one per request is accepted",
                        prompts.len()
                    ),
                })
            }
        };
        let logprobs = LogprobOptions {
            top_logprobs: check_count("logprobs", self.logprobs, MAX_LOGPROBS)?,
            prompt_logprobs: false,
        };
        let params = self
            .sampling_fields()
            .into_params((self.max_tokens, "max_tokens"), logprobs);
        Ok((Prompt::Text(prompt), params))
    }
}

#[derive(Debug, Serialize)]
struct Completion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: [CompletionChoice; 1],
    usage: Usage,
}

#[derive(Debug, Serialize)]
struct CompletionChoice {
    index: u32,
    text: String,
    logprobs: Option<Value>,
    finish_reason: &'static str,
}

/// Chunks of `object: "text_completion"`; with logprobs, one per token.
struct CompletionChunks {
    meta: ResponseMeta,
    logprobs: Option<(Arc<TokenDecoding>, CompletionLogprobs)>,
}

impl CompletionChunks {
    fn chunk(&self, choices: Value, usage: Option<Usage>) -> Value {
        let mut chunk = json!({
            "id": self.meta.id,
            "object": "text_completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = json!(usage);
        }
        chunk
    }
}

impl ChunkBuilder for CompletionChunks {
    fn opening(&self) -> Option<Value> {
        None
    }

    fn token(&mut self, token: TokenText, finish: Option<&'static str>) -> Option<Value> {
        let logprobs = match &mut self.logprobs {
            Some((decoding, logprobs)) => {
                logprobs.push(&token, decoding);
                logprobs.take()
            }
            None if token.text.is_empty() && finish.is_none() => return None,
            None => Value::Null,
        };
        let choice =
            json!({"index": 0, "text": token.text, "logprobs": logprobs, "finish_reason": finish});
        Some(self.chunk(json!([choice]), None))
    }

    fn usage(&self, usage: Usage) -> Value {
        self.chunk(json!([]), Some(usage))
    }
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<CompletionRequest, OpenAi>,
) -> Result<Response, ApiError<OpenAi>> {
    let stream = request.stream == Some(true);
    let include_usage = request.stream_options.unwrap_or_default().include_usage;
    let with_logprobs = request.logprobs.is_some();
    let (prompt, params) = request.into_parts()?;
    let generation = Generation::start(&state, "completions", prompt, &params).await?;
    let meta = ResponseMeta::new("cmpl", &state.info.model_id);
    let decoding = with_logprobs.then(|| Arc::clone(&state.decoding));
    if stream {
        let chunks = CompletionChunks {
            meta,
            logprobs: decoding.map(|decoding| (decoding, CompletionLogprobs::default())),
        };
        return Ok(stream_chunks(generation, chunks, include_usage));
    }
    let completed = generation.collect().await?;
    let body = Completion {
        id: meta.id,
        object: "text_completion",
        created: meta.created,
        model: meta.model,
        choices: [CompletionChoice {
            index: 0,
            text: completed.text,
            logprobs: decoding.map(|decoding| {
                let mut logprobs = CompletionLogprobs::default();
                for token in &completed.tokens {
                    logprobs.push(token, &decoding);
                }
                logprobs.take()
            }),
            finish_reason: finish_reason(completed.finish),
        }],
        usage: Usage::new(completed.input_tokens, completed.tokens.len()),
    };
    Ok(Json(body).into_response())
}
