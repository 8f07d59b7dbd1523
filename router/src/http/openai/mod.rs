//! OpenAI-compatible routes and the streaming driver they share; their common request fields
//! are in `fields.rs`, the envelope every response shares in `envelope.rs`.

pub mod chat;
mod chunks;
pub mod completions;
mod envelope;
mod fields;
mod logprobs;
pub mod responses;

use axum::response::Response;
use futures::StreamExt;

pub use envelope::{finish_reason, ChunkBuilder, ResponseMeta, Usage};
use fields::impl_sampling_fields;
pub use fields::{SamplingFields, StopSpec, StreamOptions};

use crate::error::{error_event, Api};
use crate::generation::AdmittedRequest;
use crate::http::transport::sse::{done_event, json_event, sse_response};

/// Streams the choices' `generations` as OpenAI chunks, interleaved as tokens arrive and
/// ending with `data: [DONE]`; an error in any choice becomes an error event followed by
/// `[DONE]` and cancels the other choices. `usage_prompt_tokens`: send a usage chunk last,
/// counting that many prompt tokens.
pub fn stream_chunks(
    generations: Vec<AdmittedRequest>,
    mut chunks: impl ChunkBuilder,
    usage_prompt_tokens: Option<usize>,
) -> Response {
    let count = generations.len();
    let mut choices = futures::stream::select_all(
        generations
            .into_iter()
            .enumerate()
            .map(|(index, generation)| Box::pin(generation.into_deltas(index))),
    );
    let events = async_stream::stream! {
        for index in 0..count {
            if let Some(opening) = chunks.opening(index) {
                yield json_event(&opening);
            }
        }
        let mut completion_tokens = 0;
        while let Some(sibling) = choices.next().await {
            if let Some(prompt) = sibling.prompt_logprobs.as_ref() {
                if let Some(chunk) = chunks.prompt(sibling.index, prompt) {
                    yield json_event(&chunk);
                }
            }
            match sibling.delta {
                Ok(delta) => {
                    let finish = delta.finish.map(finish_reason);
                    if let Some(chunk) = chunks.token(sibling.index, delta.token, finish) {
                        yield json_event(&chunk);
                    }
                    if finish.is_some() {
                        completion_tokens += sibling.generated_tokens;
                    }
                }
                Err(error) => {
                    yield error_event(Api::OpenAi, &error);
                    yield done_event();
                    return;
                }
            }
        }
        if let Some(prompt_tokens) = usage_prompt_tokens {
            yield json_event(&chunks.usage(Usage::new(prompt_tokens, completion_tokens)));
        }
        yield done_event();
    };
    sse_response(events)
}
