//! OpenAI-compatible routes: shared request pieces, usage, and the streaming driver.

pub mod chat;
pub mod completions;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::generation::Generation;
use super::sse::{done_event, json_event, sse_response};
use crate::error::{error_event, Api, AppError};
use crate::stream::{Finish, StreamError};

/// Parameters accepted and deliberately without effect: the served model answers whatever
/// `model` names, and `user` is an opaque end-user id.
pub const ACCEPTED_IGNORED: [&str; 2] = ["model", "user"];

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
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

/// `stream_options`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Token accounting of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    /// Usage of a prompt of `prompt_tokens` that generated `completion_tokens`.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
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

/// Builds one route's stream chunks.
pub trait ChunkBuilder: Send + 'static {
    /// The chunk sent before any token, if the route has one.
    fn opening(&self) -> Option<Value>;
    /// A chunk carrying `text`, and the finish reason on the last one.
    fn text(&self, text: String, finish: Option<&'static str>) -> Value;
    /// The trailing `choices: []` chunk carrying usage.
    fn usage(&self, usage: Usage) -> Value;
}

/// Streams `generation` as OpenAI chunks ending with `data: [DONE]`; an error mid-stream
/// becomes an error event followed by `[DONE]`.
pub fn stream_chunks(
    mut generation: Generation,
    chunks: impl ChunkBuilder,
    include_usage: bool,
) -> Response {
    let events = async_stream::stream! {
        if let Some(opening) = chunks.opening() {
            yield json_event(&opening);
        }
        loop {
            let error = match generation.next().await {
                Some(Ok(delta)) => {
                    let finish = delta.finish.map(finish_reason);
                    if !delta.token.text.is_empty() || finish.is_some() {
                        yield json_event(&chunks.text(delta.token.text, finish));
                    }
                    if finish.is_none() {
                        continue;
                    }
                    if include_usage {
                        let usage = Usage::new(generation.input_tokens, generation.generated_tokens());
                        yield json_event(&chunks.usage(usage));
                    }
                    generation.succeed();
                    break;
                }
                Some(Err(error)) => error,
                None => AppError::Stream(StreamError::Incomplete),
            };
            yield error_event(Api::OpenAi, &error);
            generation.fail(&error);
            break;
        }
        yield done_event();
    };
    sse_response(events)
}
