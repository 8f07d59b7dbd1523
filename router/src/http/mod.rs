//! The axum application: routes, request ids, body limit. The folders read by kind:
//! `middleware/` (API keys, draining, request logs, the launch id), `ops/` (health,
//! readiness, info, metrics, the API description), `transport/` (the accept loop, JSON bodies,
//! server-sent events and the one streaming driver every surface renders through), and one
//! folder per API surface mapping its requests and responses (`openai/`, `anthropic/`,
//! `native/`). The shared state is `state`; generation itself is `crate::generation`.

mod anthropic;
mod middleware;
mod native;
mod openai;
mod ops;
mod state;
#[cfg(test)]
pub(crate) mod tests;
mod transport;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderValue, Method};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::Response;
use axum::Router;
use tracing::Instrument;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use middleware::api_keys::{reload_api_keys_on_sighup, ApiKeyError, ApiKeys};
pub use middleware::draining::Draining;
pub use middleware::launch_identity::{read_launch_id, LaunchIdError};
pub use native::tokenize::{tokenize_answer, TokenizeAnswer};
pub use openai::chat::render_chat_request;
pub use openai::responses::store::ResponseStoreLimits;
pub use ops::server_info::{ServerInfo, VALIDATION_WORKERS};
pub use state::{AppState, HandlerConfig};
pub use transport::connections::serve as serve_connections;

use middleware::{auth, launch_identity, request_log, serving, trace_context, RequestId};
use ops::{info, lifecycle, lora_updates, openapi};

const REQUEST_ID_HEADER: &str = "x-request-id";

/// The router's HTTP application: every route is registered with its OpenAPI operation, so
/// `/openapi.json` (browsable at `/docs`) lists exactly what is served. Probes, the metrics
/// scrape and the API description (`/health`, `/ready`, `/metrics`, `/openapi.json`, `/docs`)
/// are open; every other route requires an API key when keys are configured.
pub fn app(state: AppState) -> Router {
    let mut inference = OpenApiRouter::new()
        .routes(routes!(native::generate))
        .routes(routes!(native::compat_generate))
        .routes(routes!(native::generate_stream))
        .routes(routes!(openai::chat::completions))
        .routes(routes!(openai::completions::completions))
        .routes(routes!(anthropic::messages))
        .routes(routes!(anthropic::count_tokens))
        .routes(routes!(openai::responses::create))
        .routes(routes!(native::tokenize::tokenize))
        .route_layer(from_fn_with_state(
            state.clone(),
            serving::admit_when_serving,
        ));
    if state.log_requests {
        inference =
            inference.route_layer(from_fn_with_state(state.clone(), request_log::log_bodies));
    }
    if crate::telemetry::active().is_some() {
        inference = inference.route_layer(from_fn(trace_context::trace_request));
    }
    let mut protected = OpenApiRouter::new()
        .merge(inference)
        .routes(routes!(
            openai::responses::retrieve,
            openai::responses::delete
        ))
        .routes(routes!(info::models))
        .routes(routes!(info::info));
    if state.config.runtime_lora_updates {
        protected = protected
            .routes(routes!(lora_updates::load))
            .routes(routes!(lora_updates::unload));
    }
    let protected = protected.route_layer(from_fn_with_state(state.clone(), auth::require_api_key));
    let health = OpenApiRouter::new()
        .routes(routes!(lifecycle::health))
        .route_layer(from_fn_with_state(
            state.clone(),
            launch_identity::answer_with_launch_id,
        ));
    let (routes, spec) = OpenApiRouter::with_openapi(openapi::base())
        .merge(protected)
        .merge(health)
        .routes(routes!(lifecycle::ready))
        .routes(routes!(info::metrics))
        .split_for_parts();
    routes
        .merge(openapi::docs(&spec))
        .layer(DefaultBodyLimit::max(state.config.payload_limit))
        .layer(from_fn(request_span))
        .with_state(state)
}

/// Gives every request an id (the client's `x-request-id`, else a fresh one), a span
/// carrying it, and echoes it in the response.
async fn request_span(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty() && value.len() <= 128)
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
    let span = tracing::info_span!(
        "request",
        id = %id,
        method = %request.method(),
        path = %request.uri().path()
    );
    request.extensions_mut().insert(RequestId(id.clone()));
    let is_probe = request.method() == Method::GET;
    let started = std::time::Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    let latency_ms = started.elapsed().as_millis();
    span.in_scope(|| {
        if is_probe {
            tracing::debug!(status, latency_ms, "response");
        } else {
            tracing::info!(status, latency_ms, "response");
        }
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}
