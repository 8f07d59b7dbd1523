//! Loading and unloading LoRA adapters while serving, with vLLM's routes and bodies:
//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`. Registered only with
//! `--allow-runtime-lora-updating`, and behind the API keys like every generation route.

use axum::extract::State;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::error::{ApiError, AppError, OpenAi};
use crate::http::state::AppState;
use crate::http::transport::json::ApiJson;
use crate::scheduler::AdapterUpdateError;

/// `POST /v1/load_lora_adapter`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadLoraAdapterRequest {
    /// The name requests select it by (OpenAI `model`, TGI `adapter_id`).
    lora_name: String,
    /// A PEFT directory (adapter_config.json, adapter_model.safetensors) on the shards' machines.
    lora_path: String,
}

/// `POST /v1/unload_lora_adapter`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UnloadLoraAdapterRequest {
    lora_name: String,
}

/// Every shard loads the adapter; requests may select it once this answers.
#[utoipa::path(post, path = "/v1/load_lora_adapter", tag = "OpenAI",
    request_body = LoadLoraAdapterRequest,
    responses((status = 200, description = "The adapter is loaded", body = String)))]
pub async fn load(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<LoadLoraAdapterRequest, OpenAi>,
) -> Result<String, ApiError<OpenAi>> {
    let name = request.lora_name.trim();
    let adapters = state.validator.lora_adapters();
    if name.is_empty() || name == state.config.model_id {
        return Err(AppError::from(AdapterUpdateError::Refused {
            name: name.to_owned(),
            message: "give it a name that is neither empty nor the served model's".to_owned(),
        })
        .into());
    }
    if adapters.names().iter().any(|loaded| loaded == name) {
        return Err(AppError::from(AdapterUpdateError::AlreadyLoaded(name.to_owned())).into());
    }
    let info = state
        .backend
        .load_lora_adapter(name, &request.lora_path)
        .await
        .map_err(AppError::from)?;
    if adapters.add(name).is_none() {
        return Err(AppError::from(AdapterUpdateError::AlreadyLoaded(name.to_owned())).into());
    }
    tracing::info!(name, rank = info.rank, path = %request.lora_path, "LoRA adapter loaded");
    Ok(format!(
        "Success: LoRA adapter '{name}' added successfully."
    ))
}

/// Stops new requests from selecting the adapter, then every shard forgets it. Refused while
/// requests still wait or run under it.
#[utoipa::path(post, path = "/v1/unload_lora_adapter", tag = "OpenAI",
    request_body = UnloadLoraAdapterRequest,
    responses((status = 200, description = "The adapter is unloaded", body = String)))]
pub async fn unload(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<UnloadLoraAdapterRequest, OpenAi>,
) -> Result<String, ApiError<OpenAi>> {
    let name = request.lora_name.as_str();
    let adapters = state.validator.lora_adapters();
    let Some(key) = adapters.remove(name) else {
        return Err(AppError::from(AdapterUpdateError::NotLoaded(name.to_owned())).into());
    };
    let requests = state.backend.requests_under_adapter(name).await;
    if requests > 0 {
        adapters.restore(key);
        let busy = AdapterUpdateError::InUse {
            name: name.to_owned(),
            requests,
        };
        return Err(AppError::from(busy).into());
    }
    if let Err(error) = state.backend.unload_lora_adapter(name).await {
        adapters.restore(key);
        return Err(AppError::from(error).into());
    }
    tracing::info!(name, "LoRA adapter unloaded");
    Ok(format!(
        "Success: LoRA adapter '{name}' removed successfully."
    ))
}
