//! The serving lifecycle as HTTP sees it: liveness (`/health`) and readiness (`/ready`).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::AppError;
use crate::http::middleware::serving::refusal;
use crate::http::state::AppState;
use crate::scheduler::{EnginePhase, SchedulerError};

/// `/health`'s body.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthBody {
    /// `ok`, `recovering` or `draining`.
    status: &'static str,
    queued_requests: usize,
    running_requests: usize,
    /// Why the shards are not healthy (TGI's error fields), on 503 only.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_type: Option<&'static str>,
}

/// `/ready`'s body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReadyBody {
    /// `ready`, `recovering` or `draining`.
    status: &'static str,
}

/// The query of `/health`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HealthQuery {
    /// Run a real one-token forward on every shard instead of a plain Health call.
    #[serde(default)]
    deep: bool,
}

/// `GET /health`: liveness. 200 while the router is up and every shard answers (also while
/// draining), else 503; the body names the state (`ok`, `recovering` or `draining`). With
/// `?deep=true` every shard runs a one-token forward, queued between two steps and bounded
/// by the step timeout; one probe runs at a time and its answer is shared for a second (see
/// `deep_health`). Probes take no admission permit and count in no request metric.
#[utoipa::path(get, path = "/health", tag = "Operations", params(HealthQuery), responses(
    (status = 200, description = "Every shard answers", body = HealthBody),
    (status = 400, description = "`deep` is not `true` or `false`"),
    (status = 503, description = "A shard does not answer", body = HealthBody)))]
pub async fn health(State(state): State<AppState>, Query(query): Query<HealthQuery>) -> Response {
    let draining = state.draining.is_set();
    let shards = if state.backend.phase() == EnginePhase::Recovering {
        Err(SchedulerError::Recovering)
    } else if query.deep {
        state.deep_probe.check(state.backend.as_ref()).await
    } else {
        state.backend.health().await
    };
    let status = match (draining, &shards) {
        (true, _) => "draining",
        (false, Ok(())) => "ok",
        (false, Err(_)) => "recovering",
    };
    let load = state.backend.load();
    let mut body = HealthBody {
        status,
        queued_requests: load.queued_requests,
        running_requests: load.running_requests,
        error: None,
        error_type: None,
    };
    match shards {
        Ok(()) => (StatusCode::OK, Json(body)).into_response(),
        Err(error) => {
            // TGI's error fields too, so TGI clients read the failure as usual.
            body.error = Some(AppError::Unhealthy(error).to_string());
            body.error_type = Some("unhealthy");
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// `GET /ready`: readiness. 200 only while warmed up, not draining and not recovering.
#[utoipa::path(get, path = "/ready", tag = "Operations", responses(
    (status = 200, description = "Serving", body = ReadyBody),
    (status = 503, description = "Draining or recovering", body = ReadyBody)))]
pub async fn ready(State(state): State<AppState>) -> Response {
    let status = match refusal(&state) {
        None => return (StatusCode::OK, Json(ReadyBody { status: "ready" })).into_response(),
        Some(SchedulerError::ShuttingDown) => "draining",
        Some(_) => "recovering",
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(ReadyBody { status })).into_response()
}
