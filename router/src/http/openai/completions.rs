//! `POST /v1/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{
    finish_reason, stream_chunks, ChunkBuilder, ResponseMeta, StopSpec, StreamOptions, Usage,
    ACCEPTED_IGNORED,
};
use crate::error::{ApiError, OpenAi};
use crate::http::generation::Generation;
use crate::http::json::ApiJson;
use crate::http::AppState;
use crate::validation::{
    reject_unsupported, require_single_choice, GenerationParams, Prompt, ValidationError,
};

/// The request body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    prompt: Option<PromptSpec>,
    max_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<StopSpec>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    best_of: Option<i64>,
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
    fn into_parts(self) -> Result<(Prompt, GenerationParams), ValidationError> {
        reject_unsupported(&self.extra, &ACCEPTED_IGNORED)?;
        require_single_choice("n", self.n)?;
        require_single_choice("best_of", self.best_of)?;
        let prompt = match self.prompt.ok_or(ValidationError::Missing("prompt"))? {
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
        let params = GenerationParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_new_tokens: self.max_tokens,
            max_new_tokens_param: "max_tokens",
            seed: self.seed,
            stop: StopSpec::into_vec(self.stop),
        };
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
    logprobs: Option<()>,
    finish_reason: &'static str,
}

/// Chunks of `object: "text_completion"`.
struct CompletionChunks(ResponseMeta);

impl CompletionChunks {
    fn chunk(&self, choices: Value, usage: Option<Usage>) -> Value {
        let mut chunk = json!({
            "id": self.0.id,
            "object": "text_completion",
            "created": self.0.created,
            "model": self.0.model,
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

    fn text(&self, text: String, finish: Option<&'static str>) -> Value {
        let choice = json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish});
        self.chunk(json!([choice]), None)
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
    let (prompt, params) = request.into_parts()?;
    let generation = Generation::start(&state, "completions", prompt, &params).await?;
    let meta = ResponseMeta::new("cmpl", &state.info.model_id);
    if stream {
        return Ok(stream_chunks(
            generation,
            CompletionChunks(meta),
            include_usage,
        ));
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
            logprobs: None,
            finish_reason: finish_reason(completed.finish),
        }],
        usage: Usage::new(completed.input_tokens, completed.tokens.len()),
    };
    Ok(Json(body).into_response())
}
