//! `--log-requests`: logs request and response bodies (prompts and outputs). Without the
//! flag this layer is not installed, so no prompt or output ever reaches the logs.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;

use crate::error::{error_response, Api, AppError};
use crate::http::state::AppState;

/// Logs the request body, then the response body once it has been sent in full (streams too).
/// A body over the payload limit is answered 413 here, as the handler would.
pub async fn log_bodies(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let limit = state.config.payload_limit;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        let api = if parts.uri.path().starts_with("/v1/") {
            Api::OpenAi
        } else {
            Api::Native
        };
        return error_response(api, &AppError::PayloadTooLarge(limit));
    };
    tracing::info!(body = %String::from_utf8_lossy(&bytes), "request body");
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let (parts, body) = response.into_parts();
    let span = tracing::Span::current();
    let mut stream = body.into_data_stream();
    let logged = async_stream::stream! {
        let mut sent = Vec::new();
        while let Some(chunk) = stream.next().await {
            if let Ok(bytes) = &chunk {
                sent.extend_from_slice(bytes);
            }
            yield chunk;
        }
        span.in_scope(|| tracing::info!(body = %String::from_utf8_lossy(&sent), "response body"));
    };
    Response::from_parts(parts, Body::from_stream(logged))
}
