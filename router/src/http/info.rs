//! Operational routes: `/info`, `/metrics`, `/v1/models` (`/health` and `/ready` live in `lifecycle`).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::json;

use super::AppState;

/// What `/info` reports: the model, the limits and the KV cache size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerInfo {
    pub model_id: String,
    pub model_dtype: String,
    pub model_device_type: String,
    pub model_architecture: String,
    pub num_shard: usize,
    pub max_concurrent_requests: usize,
    /// Tokens admitted requests may hold before their first token; `None`: no limit
    /// beyond `max_concurrent_requests`.
    pub max_queued_tokens: Option<usize>,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub max_batch_prefill_tokens: usize,
    pub max_batch_size: usize,
    pub block_size: usize,
    pub kv_cache_blocks: usize,
    pub kv_cache_tokens: usize,
    pub router: &'static str,
    pub version: &'static str,
    /// Seconds since the Unix epoch when the router started; `created` of `/v1/models`.
    #[serde(skip)]
    pub started_at: u64,
}

/// `GET /info`; the KV size follows the shards' latest Warmup (it may change after a restart).
pub async fn info(State(state): State<AppState>) -> Json<ServerInfo> {
    let mut info = state.info.as_ref().clone();
    let kv_blocks = state.backend.load().kv_blocks_total;
    if kv_blocks > 0 {
        info.kv_cache_blocks = kv_blocks;
        info.kv_cache_tokens = kv_blocks * info.block_size;
    }
    Json(info)
}

/// `GET /metrics`: Prometheus text exposition.
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// `GET /v1/models`: the one served model.
pub async fn models(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.info.model_id,
            "object": "model",
            "created": state.info.started_at,
            "owned_by": "tandem",
        }],
    }))
}
