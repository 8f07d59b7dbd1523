//! Refusing inference requests with 503 + `Retry-After` while the server drains or the
//! shards restart.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::{error_response, Api, AppError};
use crate::http::state::AppState;
use crate::scheduler::{EnginePhase, SchedulerError};

/// Why a new inference request is refused right now, if it is.
pub(crate) fn refusal(state: &AppState) -> Option<SchedulerError> {
    if state.draining.is_set() {
        Some(SchedulerError::ShuttingDown)
    } else if state.backend.phase() == EnginePhase::Recovering {
        Some(SchedulerError::Recovering)
    } else {
        None
    }
}

/// Middleware on the inference routes: 503 with `Retry-After`, in the route's error shape,
/// while the server drains or the shards restart.
pub async fn admit_when_serving(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match refusal(&state) {
        None => next.run(request).await,
        Some(error) => error_response(
            Api::for_path(request.uri().path()),
            &AppError::Scheduler(error),
        ),
    }
}
