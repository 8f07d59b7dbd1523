//! The streamed chunks of both OpenAI routes: `chat.completion.chunk` and streamed `text_completion`.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::envelope::{ResponseMeta, Usage};

/// One `chat.completion.chunk` (a `data:` event; the stream ends with `data: [DONE]`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChunk {
    id: String,
    /// Always `chat.completion.chunk`.
    object: &'static str,
    created: u64,
    model: String,
    /// One choice's delta; empty in the final usage chunk.
    choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// A choice's piece of a chat stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    /// With `logprobs: true`: this chunk's tokens, `{content: [...], refusal: null}`.
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    /// `stop` or `length` on the choice's last chunk, else `null`.
    pub finish_reason: Option<&'static str>,
}

/// What a chat chunk adds to its choice's message.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct ChatDelta {
    /// `assistant`, on each choice's first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A reasoning model's reasoning, before its answer in `content`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool-call fragments: `index`, then `id`, `type` and `function.name` once, then
    /// `function.arguments` pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<serde_json::Value>>,
}

/// One streamed `text_completion` (a `data:` event; the stream ends with `data: [DONE]`).
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChunk {
    id: String,
    /// Always `text_completion`.
    object: &'static str,
    created: u64,
    model: String,
    /// One choice's text; empty in the final usage chunk.
    choices: Vec<CompletionChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// A choice's piece of a completion stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChunkChoice {
    pub index: usize,
    pub text: String,
    /// With `logprobs`: this chunk's tokens, `{tokens, token_logprobs, top_logprobs, text_offset}`.
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    /// `stop` or `length` on the choice's last chunk, else `null`.
    pub finish_reason: Option<&'static str>,
}

fn to_json(chunk: &impl Serialize) -> Value {
    serde_json::to_value(chunk).expect("invariant: chunks hold only strings, numbers and lists")
}

/// A chat chunk of `meta`'s response as JSON.
pub fn chat_chunk(
    meta: &ResponseMeta,
    choices: Vec<ChatChunkChoice>,
    usage: Option<Usage>,
) -> Value {
    to_json(&ChatChunk {
        id: meta.id.clone(),
        object: "chat.completion.chunk",
        created: meta.created,
        model: meta.model.clone(),
        choices,
        usage,
    })
}

/// A completion chunk of `meta`'s response as JSON.
pub fn completion_chunk(
    meta: &ResponseMeta,
    choices: Vec<CompletionChunkChoice>,
    usage: Option<Usage>,
) -> Value {
    to_json(&CompletionChunk {
        id: meta.id.clone(),
        object: "text_completion",
        created: meta.created,
        model: meta.model.clone(),
        choices,
        usage,
    })
}
