//! `--log-requests`: logs request and response bodies (prompts and outputs). Without the
//! flag this layer is not installed, so no prompt or output ever reaches the logs.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;

use super::BODY_LIMIT_BYTES;

/// Logs the request body, then the response body once it has been sent in full (streams too).
pub async fn log_bodies(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, BODY_LIMIT_BYTES).await {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::info!(%error, "request body unreadable");
            Bytes::new()
        }
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
