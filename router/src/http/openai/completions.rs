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
    finish_reason, stream_chunks, ChunkBuilder, ResponseMeta, StopSpec, StreamOptions, Usage,
    ACCEPTED_IGNORED,
};
use crate::error::{ApiError, OpenAi};
use crate::http::generation::{collect_siblings, Completed, Generation};
use crate::http::json::ApiJson;
use crate::http::AppState;
use crate::scheduler::LogprobOptions;
use crate::stream::{TokenDecoding, TokenText};
use crate::validation::{
    check_choices, check_count, reject_unsupported, GenerationParams, Prompt, ValidationError,
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

/// How many candidates run (`best_of`) and how many of them are returned (`n`).
#[derive(Debug, Clone, Copy)]
struct Choices {
    n: usize,
    best_of: usize,
}

super::impl_sampling_fields!(CompletionRequest);

impl CompletionRequest {
    /// `best_of` defaults to `n` and must be at least `n`; streaming returns every
    /// candidate as it is generated, so it needs `best_of == n`.
    fn choices(&self) -> Result<Choices, ValidationError> {
        let n = check_choices("n", self.n)?;
        let best_of = match self.best_of {
            None => n,
            Some(_) => check_choices("best_of", self.best_of)?,
        };
        if best_of < n {
            return Err(ValidationError::OutOfRange {
                param: "best_of".to_owned(),
                expected: "at least `n`",
                value: format!("{best_of} (n = {n})"),
            });
        }
        if best_of > n && self.stream == Some(true) {
            return Err(ValidationError::Unsupported {
                param: "best_of".to_owned(),
                detail: " greater than `n` when streaming".to_owned(),
            });
        }
        Ok(Choices { n, best_of })
    }

    fn into_parts(mut self) -> Result<(Prompt, GenerationParams, Choices), ValidationError> {
        reject_unsupported(&self.extra, &ACCEPTED_IGNORED)?;
        let choices = self.choices()?;
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
        Ok((Prompt::Text(prompt), params, choices))
    }
}

#[derive(Debug, Serialize)]
struct Completion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<CompletionChoice>,
    usage: Usage,
}

#[derive(Debug, Serialize)]
struct CompletionChoice {
    index: usize,
    text: String,
    logprobs: Option<Value>,
    finish_reason: &'static str,
}

/// Chunks of `object: "text_completion"`; with logprobs, one per token.
struct CompletionChunks {
    meta: ResponseMeta,
    /// The token decoding and one logprobs builder per choice.
    logprobs: Option<(Arc<TokenDecoding>, Vec<CompletionLogprobs>)>,
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
    fn opening(&self, _index: usize) -> Option<Value> {
        None
    }

    fn token(
        &mut self,
        index: usize,
        token: TokenText,
        finish: Option<&'static str>,
    ) -> Option<Value> {
        let logprobs = match &mut self.logprobs {
            Some((decoding, per_choice)) => {
                let logprobs = per_choice.get_mut(index)?;
                logprobs.push(&token, decoding);
                logprobs.take()
            }
            None if token.text.is_empty() && finish.is_none() => return None,
            None => Value::Null,
        };
        let choice = json!({"index": index, "text": token.text, "logprobs": logprobs, "finish_reason": finish});
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
    let (prompt, params, choices) = request.into_parts()?;
    let generations =
        Generation::start_siblings(&state, "completions", prompt, &params, choices.best_of).await?;
    let meta = ResponseMeta::new("cmpl", &state.info.model_id);
    let decoding = with_logprobs.then(|| Arc::clone(&state.decoding));
    if stream {
        let chunks = CompletionChunks {
            meta,
            logprobs: decoding.map(|decoding| {
                let per_choice = (0..choices.n).map(|_| CompletionLogprobs::default());
                (decoding, per_choice.collect())
            }),
        };
        return Ok(stream_chunks(generations, chunks, include_usage));
    }
    let mut completed = collect_siblings(generations).await?;
    let prompt_tokens = completed.first().map_or(0, |choice| choice.input_tokens);
    let completion_tokens = completed.iter().map(|choice| choice.tokens.len()).sum();
    if choices.best_of > choices.n {
        completed.sort_by(|a, b| b.cumulative_logprob().total_cmp(&a.cumulative_logprob()));
        completed.truncate(choices.n);
    }
    let body = Completion {
        id: meta.id,
        object: "text_completion",
        created: meta.created,
        model: meta.model,
        choices: completed
            .into_iter()
            .enumerate()
            .map(|(index, choice)| completion_choice(index, choice, decoding.as_deref()))
            .collect(),
        usage: Usage::new(prompt_tokens, completion_tokens),
    };
    Ok(Json(body).into_response())
}

fn completion_choice(
    index: usize,
    completed: Completed,
    decoding: Option<&TokenDecoding>,
) -> CompletionChoice {
    CompletionChoice {
        index,
        logprobs: decoding.map(|decoding| {
            let mut logprobs = CompletionLogprobs::default();
            for token in &completed.tokens {
                logprobs.push(token, decoding);
            }
            logprobs.take()
        }),
        finish_reason: finish_reason(completed.finish),
        text: completed.text,
    }
}
