//! What every OpenAI response shares: its identity (id, creation time, model), its token
//! usage and finish reason, and the chunk builder each route's stream implements.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::scheduler::PromptLogprobs;
use crate::stream::{Finish, TokenText};

/// Token accounting of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// How many prompt tokens the prefix cache served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// A reasoning model's chat usage: how many completion tokens were reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// The part of the prompt tokens that was already computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose keys and values came from the prefix cache instead of a forward pass.
    pub cached_tokens: usize,
}

/// The parts of the completion tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: usize,
}

impl Usage {
    /// Usage of one prompt whose choices generated `completion_tokens` in all (the prompt
    /// is counted once, however many choices share it).
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
            completion_tokens_details: None,
        }
    }

    /// This usage with `cached_tokens` of its prompt tokens served by the prefix cache.
    #[must_use]
    pub fn with_cached_tokens(mut self, cached_tokens: usize) -> Self {
        self.prompt_tokens_details = Some(PromptTokensDetails { cached_tokens });
        self
    }

    /// This usage with `reasoning_tokens` of its completion tokens counted as reasoning.
    #[must_use]
    pub fn with_reasoning_tokens(mut self, reasoning_tokens: usize) -> Self {
        self.completion_tokens_details = Some(CompletionTokensDetails { reasoning_tokens });
        self
    }
}

/// OpenAI's two finish reasons: the model or a stop string ended it, or the length limit.
pub fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "length",
        Finish::EosToken | Finish::StopSequence => "stop",
    }
}

/// Identity shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// A fresh id with `prefix` (`chatcmpl`, `cmpl`), stamped now.
    pub fn new(prefix: &str, model: &str) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        Self {
            id: format!("{prefix}-{}", uuid::Uuid::new_v4().simple()),
            created,
            model: model.to_owned(),
        }
    }
}

/// Builds one route's stream chunks; `index` is the choice a chunk belongs to.
pub trait ChunkBuilder: Send + 'static {
    /// The chunk sent for choice `index` before any token, if the route has one.
    fn opening(&self, index: usize) -> Option<Value>;
    /// The chunk for one token of choice `index` (its text may be empty) and the finish
    /// reason on the last one; `None` when there is nothing to send.
    fn token(
        &mut self,
        index: usize,
        token: TokenText,
        finish: Option<&'static str>,
    ) -> Option<Value>;
    /// The trailing `choices: []` chunk carrying usage.
    fn usage(&self, usage: Usage) -> Value;
    /// The chunk sent for choice `index` once its prompt logprobs are known, just before its
    /// first token, if the route has one.
    fn prompt(&mut self, _index: usize, _logprobs: &PromptLogprobs) -> Option<Value> {
        None
    }
}
