//! Operational routes: `/info`, `/metrics`, `/v1/models` (`/health` and `/ready` live in `lifecycle`).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::server_info::ServerInfo;
use crate::http::state::AppState;

/// `GET /info`; the KV size follows the shards' latest Warmup (it may change after a restart), what
/// has compiled their latest step.
#[utoipa::path(get, path = "/info", tag = "TGI",
    responses((status = 200, description = "Model, limits and KV cache size", body = ServerInfo)))]
pub async fn info(State(state): State<AppState>) -> Json<ServerInfo> {
    let mut info = state.info.as_ref().clone();
    let load = state.backend.load();
    if load.kv_blocks_total > 0 {
        info.kv_cache_blocks = load.kv_blocks_total;
        info.kv_cache_tokens = load.kv_blocks_total * info.block_size;
    }
    if let Some(compilation) = load.compilation {
        info.compiled_decode_rows = Some(compilation.decode_rows);
        info.compiling = Some(compilation.compiling);
    }
    Json(info)
}

/// `GET /metrics`: Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "Operations",
    responses((status = 200, description = "Prometheus metrics", content_type = "text/plain", body = String)))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// `GET /v1/models`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    object: &'static str,
    data: Vec<Model>,
}

/// A model requests may name: the served model, or a LoRA adapter of it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Model {
    id: String,
    /// Always `model`.
    object: &'static str,
    /// When the router started (seconds since the Unix epoch).
    created: u64,
    owned_by: &'static str,
    /// The model an adapter applies to; `null` for the served model itself.
    parent: Option<String>,
}

/// `GET /v1/models`: the served model, then each LoRA adapter with the served model as its
/// `parent`.
#[utoipa::path(get, path = "/v1/models", tag = "OpenAI",
    responses((status = 200, description = "The served model and its LoRA adapters", body = ModelList)))]
pub async fn models(State(state): State<AppState>) -> Json<ModelList> {
    let base = &state.config.model_id;
    let model = |id: String, parent: Option<&String>| Model {
        id,
        object: "model",
        created: state.config.started_at,
        owned_by: "tandem",
        parent: parent.cloned(),
    };
    let adapters = state.validator.lora_adapters().names();
    Json(ModelList {
        object: "list",
        data: std::iter::once(model(base.clone(), None))
            .chain(adapters.into_iter().map(|name| model(name, Some(base))))
            .collect(),
    })
}
