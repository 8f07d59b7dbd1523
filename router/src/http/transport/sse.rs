//! Server-sent events: JSON events, keep-alive, and the response wrapper every stream uses.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::Value;

/// An event whose data is `value` as JSON.
pub fn json_event(value: &impl Serialize) -> Event {
    let data = serde_json::to_string(value)
        .expect("invariant: response types have string keys and finite numbers");
    Event::default().data(data)
}

/// An event named by its payload's `type` (`fallback` when it has none), as Anthropic and
/// Responses clients dispatch on the name.
pub fn typed_event(payload: &Value, fallback: &'static str) -> Event {
    let name = payload
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or(fallback);
    Event::default().event(name).data(payload.to_string())
}

/// The OpenAI end-of-stream marker.
pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

/// An SSE response with keep-alive comments, so idle proxies keep long generations open.
pub fn sse_response(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<Event, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}
