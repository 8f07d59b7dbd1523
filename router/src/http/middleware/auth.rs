//! API keys: every inference, tokenize and admin route requires `Authorization: Bearer <key>`
//! (or `x-api-key: <key>`) when keys are configured; `/health`, `/ready` and `/metrics` stay open for probes and
//! scrapers.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::{error_response, Api, AppError};
use crate::http::state::AppState;

/// Middleware on every route but the probes: 401 in the route's error shape unless the
/// request carries an accepted key (no keys configured: everything passes). An accepted key's
/// id and weight ride along with the request for `Caller`.
pub async fn require_api_key(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(keys) = &state.api_keys else {
        return next.run(request).await;
    };
    match keys.check(&request) {
        Ok(tenant) => {
            request.extensions_mut().insert(tenant);
            next.run(request).await
        }
        Err(error) => error_response(
            Api::for_path(request.uri().path()),
            &AppError::Unauthorized(error),
        ),
    }
}
