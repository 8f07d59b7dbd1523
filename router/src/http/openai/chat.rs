//! `POST /v1/chat/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{
    finish_reason, stream_chunks, ChunkBuilder, ResponseMeta, StopSpec, StreamOptions, Usage,
};
use crate::error::{ApiError, OpenAi};
use crate::http::generation::Generation;
use crate::http::json::ApiJson;
use crate::http::AppState;
use crate::validation::{
    reject_unsupported, require_single_choice, ChatMessage, GenerationParams, Prompt,
    ValidationError,
};

/// The request body.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    messages: Option<Vec<RequestMessage>>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<StopSpec>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct RequestMessage {
    role: String,
    content: Option<MessageContent>,
    name: Option<String>,
    tool_call_id: Option<String>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

impl RequestMessage {
    /// Flattens text parts (joined by newlines); other part types are not supported yet.
    fn into_chat_message(self, index: usize) -> Result<ChatMessage, ValidationError> {
        reject_unsupported(&self.extra, &[]).map_err(|error| match error {
            ValidationError::Unsupported { param, detail } => ValidationError::Unsupported {
                param: format!("messages[{index}].{param}"),
                detail,
            },
            other => other,
        })?;
        let content = match self.content {
            None => String::new(),
            Some(MessageContent::Text(text)) => text,
            Some(MessageContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (part_index, part) in parts.into_iter().enumerate() {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(text)) => texts.push(text),
                        _ => {
                            return Err(ValidationError::Unsupported {
                                param: format!("messages[{index}].content[{part_index}]"),
                                detail: format!(": content of type `{}`", part.kind),
                            })
                        }
                    }
                }
                texts.join("\n")
            }
        };
        Ok(ChatMessage {
            role: self.role,
            content,
            name: self.name,
            tool_call_id: self.tool_call_id,
        })
    }
}

impl ChatRequest {
    fn into_parts(self) -> Result<(Prompt, GenerationParams), ValidationError> {
        reject_unsupported(&self.extra, &super::ACCEPTED_IGNORED)?;
        require_single_choice("n", self.n)?;
        let messages = self
            .messages
            .ok_or(ValidationError::Missing("messages"))?
            .into_iter()
            .enumerate()
            .map(|(index, message)| message.into_chat_message(index))
            .collect::<Result<Vec<_>, _>>()?;
        let (max_new_tokens, max_new_tokens_param) = match self.max_completion_tokens {
            Some(n) => (Some(n), "max_completion_tokens"),
            None => (self.max_tokens, "max_tokens"),
        };
        let params = GenerationParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_new_tokens,
            max_new_tokens_param,
            seed: self.seed,
            stop: StopSpec::into_vec(self.stop),
        };
        Ok((Prompt::Chat(messages), params))
    }
}

#[derive(Debug, Serialize)]
struct ChatCompletion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: [ChatChoice; 1],
    usage: Usage,
}

#[derive(Debug, Serialize)]
struct ChatChoice {
    index: u32,
    message: AssistantMessage,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
struct AssistantMessage {
    role: &'static str,
    content: String,
}

/// Chunks of `object: "chat.completion.chunk"`; the first one announces the role.
struct ChatChunks(ResponseMeta);

impl ChatChunks {
    fn chunk(&self, choices: Value, usage: Option<Usage>) -> Value {
        let mut chunk = json!({
            "id": self.0.id,
            "object": "chat.completion.chunk",
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

impl ChunkBuilder for ChatChunks {
    fn opening(&self) -> Option<Value> {
        let delta = json!({"role": "assistant", "content": ""});
        let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null});
        Some(self.chunk(json!([choice]), None))
    }

    fn text(&self, text: String, finish: Option<&'static str>) -> Value {
        let delta = if text.is_empty() {
            json!({})
        } else {
            json!({"content": text})
        };
        let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
        self.chunk(json!([choice]), None)
    }

    fn usage(&self, usage: Usage) -> Value {
        self.chunk(json!([]), Some(usage))
    }
}

/// `POST /v1/chat/completions`.
pub async fn completions(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<ChatRequest, OpenAi>,
) -> Result<Response, ApiError<OpenAi>> {
    let stream = request.stream == Some(true);
    let include_usage = request.stream_options.unwrap_or_default().include_usage;
    let (prompt, params) = request.into_parts()?;
    let generation = Generation::start(&state, "chat_completions", prompt, &params).await?;
    let meta = ResponseMeta::new("chatcmpl", &state.info.model_id);
    if stream {
        return Ok(stream_chunks(generation, ChatChunks(meta), include_usage));
    }
    let completed = generation.collect().await?;
    let body = ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices: [ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: completed.text,
            },
            logprobs: None,
            finish_reason: finish_reason(completed.finish),
        }],
        usage: Usage::new(completed.input_tokens, completed.tokens.len()),
    };
    Ok(Json(body).into_response())
}
