//! The one streaming driver every API surface renders through. A surface (OpenAI chunks,
//! Anthropic message events, Responses events, TGI tokens) only says which events each step
//! of a generation sends; this loop reads the generations, interleaves siblings as their
//! tokens arrive, and ends the stream after the closing events or the first error, which
//! cancels the other siblings.

use axum::response::sse::Event;
use axum::response::Response;
use futures::StreamExt;

use super::sse::sse_response;
use crate::error::AppError;
use crate::generation::AdmittedRequest;
use crate::scheduler::PromptLogprobs;
use crate::stream::TextDelta;

/// One API surface's server-sent events for a streamed request. The driver calls `opening`
/// once, then per delta `prompt` (on a generation's first delta, which carries its prompt
/// logprobs) and `delta`, then `closing` once every generation finished, or `error` once
/// when one fails. Every method returns the events to send, in order.
pub trait SurfaceEvents: Send + 'static {
    /// The events before any token.
    fn opening(&mut self) -> Vec<Event> {
        Vec::new()
    }

    /// The events generation `index` sends once its prompt logprobs are known, just before
    /// its first token.
    fn prompt(&mut self, _index: usize, _prompt: &PromptLogprobs) -> Vec<Event> {
        Vec::new()
    }

    /// The events one delta of generation `index` sends; `generated_tokens` counts its
    /// tokens so far, this one included. The last delta carries the finish.
    fn delta(&mut self, index: usize, delta: TextDelta, generated_tokens: usize) -> Vec<Event>;

    /// The events after every generation finished (usage, end markers).
    fn closing(&mut self) -> Vec<Event> {
        Vec::new()
    }

    /// The events that end a stream whose generation failed with `error`.
    fn error(&mut self, error: &AppError) -> Vec<Event>;
}

/// Streams `generations` (one, or sibling choices numbered from 0) as `surface` renders them.
pub fn stream_generations(
    generations: Vec<AdmittedRequest>,
    mut surface: impl SurfaceEvents,
) -> Response {
    let mut deltas = futures::stream::select_all(
        generations
            .into_iter()
            .enumerate()
            .map(|(index, generation)| Box::pin(generation.into_deltas(index))),
    );
    let events = async_stream::stream! {
        for event in surface.opening() {
            yield event;
        }
        while let Some(sibling) = deltas.next().await {
            if let Some(prompt) = sibling.prompt_logprobs.as_ref() {
                for event in surface.prompt(sibling.index, prompt) {
                    yield event;
                }
            }
            let sent = match sibling.delta {
                Ok(delta) => surface.delta(sibling.index, delta, sibling.generated_tokens),
                Err(error) => {
                    for event in surface.error(&error) {
                        yield event;
                    }
                    return;
                }
            };
            for event in sent {
                yield event;
            }
        }
        for event in surface.closing() {
            yield event;
        }
    };
    sse_response(events)
}
