//! The `response` object `/v1/responses` answers with (and keeps), its output items, and how a
//! finished generation becomes one.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::store::{ResponseStore, StoredResponse};
use crate::http::middleware::api_keys::KeyId;
use crate::stream::Finish;
use crate::validation::ChatMessage;

/// What a response repeats of its request.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// The function tools, as `{"type": "function", "name", "description", "parameters", "strict"}`.
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    #[schema(value_type = Value)]
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    /// `{"format": ...}`.
    #[schema(value_type = Object)]
    pub text: Value,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub user: Option<String>,
}

/// A response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseObject {
    pub id: String,
    /// Always `response`.
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress` while streamed, then `completed`, or `incomplete` when
    /// `max_output_tokens` (or the context) ended it.
    pub status: &'static str,
    /// Always `null`: a failed generation is answered with an error instead.
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    /// Always `false`: responses run while the request is open.
    pub background: bool,
    /// Always `disabled`.
    pub truncation: &'static str,
    #[serde(flatten)]
    pub echo: Echo,
}

/// Why a response is incomplete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: &'static str,
}

/// An output item.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        /// Always `assistant`.
        role: &'static str,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        /// The arguments object as JSON text.
        arguments: String,
        status: &'static str,
    },
    /// A reasoning model's reasoning, as `reasoning_text` content (no summary is made).
    Reasoning {
        id: String,
        /// Always empty.
        #[schema(value_type = Vec<Object>)]
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: &'static str,
    },
}

/// The text of a reasoning item.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ReasoningText {
    /// Always `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

impl ReasoningText {
    pub fn new(text: String) -> Self {
        Self {
            kind: "reasoning_text",
            text,
        }
    }
}

/// The text of an output message.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    /// Always empty.
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
    /// Always empty.
    #[schema(value_type = Vec<Object>)]
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// Token accounting of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

/// `cached_tokens`: input tokens the prefix cache served; `cache_write_tokens` is always 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
    pub cache_write_tokens: usize,
}

/// Tokens of the output that a reasoning model spent on its reasoning (0 for other models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

impl ResponseUsage {
    pub fn new(input_tokens: usize, output_tokens: usize) -> Self {
        Self {
            input_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: 0,
                cache_write_tokens: 0,
            },
            output_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: input_tokens + output_tokens,
        }
    }

    /// Counts `cached_tokens` of the input as served by the prefix cache.
    #[must_use]
    pub fn with_cached_tokens(mut self, cached_tokens: usize) -> Self {
        self.input_tokens_details.cached_tokens = cached_tokens;
        self
    }

    /// Counts `reasoning_tokens` of the output as reasoning.
    #[must_use]
    pub fn with_reasoning_tokens(mut self, reasoning_tokens: usize) -> Self {
        self.output_tokens_details.reasoning_tokens = reasoning_tokens;
        self
    }
}

/// `DELETE /v1/responses/{response_id}` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedResponse {
    pub id: String,
    /// Always `response`.
    pub object: &'static str,
    /// Always `true`.
    pub deleted: bool,
}

fn fresh_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A fresh output message id.
pub fn message_id() -> String {
    fresh_id("msg")
}

/// A fresh function call item id.
pub fn function_call_id() -> String {
    fresh_id("fc")
}

/// A fresh reasoning item id.
pub fn reasoning_id() -> String {
    fresh_id("rs")
}

/// A response on its way: what is known before the first token.
#[derive(Debug, Clone)]
pub struct Draft {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub echo: Echo,
    /// Earlier turns and this request's input, as chat messages; the output joins them.
    pub conversation: Vec<ChatMessage>,
    /// The API key the response is stored for.
    pub owner: Option<KeyId>,
}

impl Draft {
    pub fn new(
        model: String,
        echo: Echo,
        conversation: Vec<ChatMessage>,
        owner: Option<KeyId>,
    ) -> Self {
        let created_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        Self {
            id: fresh_id("resp"),
            created_at,
            model,
            echo,
            conversation,
            owner,
        }
    }

    /// The response before any output, as `response.created` carries it.
    pub fn in_progress(&self) -> ResponseObject {
        self.object("in_progress", None, Vec::new(), None)
    }

    /// The finished response; kept in `store` when the request asked for it, with the raw
    /// generated `text` as the conversation's last assistant message, so a continuation
    /// renders the very prompt this response saw, extended.
    pub fn finish(
        self,
        output: Vec<OutputItem>,
        finish: Finish,
        usage: ResponseUsage,
        text: String,
        store: &ResponseStore,
    ) -> ResponseObject {
        let (status, details) = match finish {
            Finish::Length => (
                "incomplete",
                Some(IncompleteDetails {
                    reason: "max_output_tokens",
                }),
            ),
            Finish::EosToken | Finish::StopSequence => ("completed", None),
        };
        let body = self.object(status, details, output, Some(usage));
        if self.echo.store {
            let mut conversation = self.conversation;
            conversation.push(ChatMessage::new("assistant", text));
            let stored = StoredResponse {
                body: serde_json::to_value(&body)
                    .expect("invariant: a response object is plain JSON"),
                conversation,
                owner: self.owner,
            };
            match store.insert(body.id.clone(), stored) {
                Ok(evicted) if !evicted.is_empty() => {
                    tracing::debug!(evicted = evicted.len(), "responses evicted from the store");
                }
                Ok(_) => {}
                Err(bytes) => tracing::warn!(bytes, "response too large for the store, not kept"),
            }
        }
        body
    }

    fn object(
        &self,
        status: &'static str,
        incomplete_details: Option<IncompleteDetails>,
        output: Vec<OutputItem>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            error: None,
            incomplete_details,
            model: self.model.clone(),
            output,
            usage,
            background: false,
            truncation: "disabled",
            echo: self.echo.clone(),
        }
    }
}
