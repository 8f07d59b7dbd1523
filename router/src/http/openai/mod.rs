//! OpenAI-compatible routes and the chunk stream they share; their common request fields are
//! in `fields.rs`, the envelope every response shares in `envelope.rs`.

pub mod chat;
mod chunks;
pub mod completions;
mod envelope;
mod fields;
mod logprobs;
pub mod responses;

use axum::response::sse::Event;
use axum::response::Response;

pub use envelope::{finish_reason, ChunkBuilder, ResponseMeta, Usage};
use fields::impl_sampling_fields;
pub use fields::{reasoning_effort, SamplingFields, StopSpec, StreamOptions};

use crate::error::{error_event, Api, AppError};
use crate::generation::AdmittedRequest;
use crate::http::transport::sse::{done_event, json_event};
use crate::http::transport::streaming::{stream_generations, SurfaceEvents};
use crate::scheduler::PromptLogprobs;
use crate::stream::TextDelta;

/// What the usage chunk that ends a stream counts of its prompts.
#[derive(Debug, Clone, Copy)]
pub struct PromptUsage {
    /// Prompt tokens, each prompt counted once.
    pub tokens: usize,
    /// Consecutive choices that share one prompt; the first of them computed it.
    pub choices_per_prompt: usize,
}

/// Streams the choices' `generations` as OpenAI chunks (see `ChunkStream`).
/// `usage`: send a usage chunk last, counting those prompt tokens.
pub fn stream_chunks(
    generations: Vec<AdmittedRequest>,
    chunks: impl ChunkBuilder,
    usage: Option<PromptUsage>,
) -> Response {
    let surface = ChunkStream {
        chunks,
        choices: generations.len(),
        usage,
        completion_tokens: 0,
        cached_tokens: 0,
    };
    stream_generations(generations, surface)
}

/// The OpenAI stream of one route's chunks: every choice's chunks as `data:` events,
/// interleaved as tokens arrive, then the usage chunk when asked for, then `data: [DONE]`;
/// an error in any choice becomes an error event followed by `[DONE]`.
struct ChunkStream<C> {
    chunks: C,
    choices: usize,
    usage: Option<PromptUsage>,
    /// Tokens of the choices finished so far.
    completion_tokens: usize,
    /// Cached prompt tokens of the prompts whose first choice finished so far.
    cached_tokens: usize,
}

impl<C: ChunkBuilder> SurfaceEvents for ChunkStream<C> {
    fn opening(&mut self) -> Vec<Event> {
        (0..self.choices)
            .filter_map(|index| self.chunks.opening(index))
            .map(|chunk| json_event(&chunk))
            .collect()
    }

    fn prompt(&mut self, index: usize, prompt: &PromptLogprobs) -> Vec<Event> {
        let chunk = self.chunks.prompt(index, prompt);
        chunk.iter().map(json_event).collect()
    }

    fn delta(&mut self, index: usize, delta: TextDelta, generated_tokens: usize) -> Vec<Event> {
        let finish = delta.finish.map(finish_reason);
        if finish.is_some() {
            self.completion_tokens += generated_tokens;
            let first_of_prompt = self
                .usage
                .is_some_and(|usage| index.is_multiple_of(usage.choices_per_prompt.max(1)));
            if first_of_prompt {
                self.cached_tokens += delta.cached_tokens;
            }
        }
        let chunk = self.chunks.token(index, delta.token, finish);
        chunk.iter().map(json_event).collect()
    }

    fn closing(&mut self) -> Vec<Event> {
        let usage = self.usage.map(|prompts| {
            let usage = Usage::new(prompts.tokens, self.completion_tokens)
                .with_cached_tokens(self.cached_tokens);
            json_event(&self.chunks.usage(usage))
        });
        usage.into_iter().chain([done_event()]).collect()
    }

    fn error(&mut self, error: &AppError) -> Vec<Event> {
        vec![error_event(Api::OpenAi, error), done_event()]
    }
}
