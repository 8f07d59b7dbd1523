//! The router's one HTTP error type and the one place it is rendered.
//!
//! OpenAI routes (`/v1/*`) answer `{"error": {"message", "type", "param", "code"}}`; the
//! Anthropic routes (`/v1/messages*`) answer `{"type": "error", "error": {"type", "message"}}`;
//! native routes answer TGI's `{"error", "error_type"}`. All render from the same `AppError`.

mod bodies;

use std::marker::PhantomData;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

pub use bodies::{
    AnthropicError, AnthropicErrorBody, NativeErrorBody, NativeGenerationErrorResponses,
    OpenAiError, OpenAiErrorBody, OpenAiErrorResponses,
};

use crate::scheduler::{AdapterUpdateError, RequestFailureKind, SchedulerError};
use crate::stream::StreamError;
use crate::validation::ValidationError;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("invalid request body: {message}")]
    InvalidBody {
        message: String,
        param: Option<String>,
    },
    #[error("the request body exceeds the payload limit of {0} bytes")]
    PayloadTooLarge(usize),
    #[error("the request body must be JSON: send `Content-Type: application/json`")]
    NotJson,
    #[error("the server is handling its maximum of {0} concurrent requests; retry later")]
    Overloaded(usize),
    #[error("the queue holds {queued} of at most {limit} tokens (--max-queued-tokens) and this request needs {needed}; retry later")]
    QueueFull {
        needed: usize,
        queued: usize,
        limit: usize,
    },
    #[error(transparent)]
    Unauthorized(AuthError),
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("the model is not healthy: {0}")]
    Unhealthy(SchedulerError),
    #[error(transparent)]
    AdapterUpdate(#[from] AdapterUpdateError),
    #[error("{what} with id '{id}' not found")]
    NotFound {
        what: &'static str,
        id: String,
        param: Option<&'static str>,
    },
}

/// What kind of failure an `AppError` is; decides status codes and type strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Validation,
    TooLarge,
    NotJson,
    Overloaded,
    Unauthorized,
    NotFound,
    Conflict,
    Generation,
    Unavailable,
}

/// Why a request carried no valid API key. The messages never echo what was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`")]
    Missing,
    #[error("invalid API key")]
    Invalid,
}

impl AppError {
    fn kind(&self) -> Kind {
        match self {
            Self::Validation(ValidationError::TextTooLarge(_)) => Kind::TooLarge,
            Self::Validation(_)
            | Self::InvalidBody { .. }
            | Self::Scheduler(SchedulerError::ExceedsKvCapacity { .. }) => Kind::Validation,
            // The shards ended this request alone; non-finite logits and an unreadable adapter are not the
            // request's own doing.
            Self::Scheduler(SchedulerError::RequestFailed(failure))
            | Self::Stream(StreamError::Scheduler(SchedulerError::RequestFailed(failure))) => {
                match failure.kind {
                    RequestFailureKind::Model | RequestFailureKind::AdapterUnavailable => {
                        Kind::Generation
                    }
                    _ => Kind::Validation,
                }
            }
            Self::PayloadTooLarge(_) => Kind::TooLarge,
            Self::NotJson => Kind::NotJson,
            Self::Overloaded(_) | Self::QueueFull { .. } => Kind::Overloaded,
            Self::Unauthorized(_) => Kind::Unauthorized,
            Self::NotFound { .. } | Self::AdapterUpdate(AdapterUpdateError::NotLoaded(_)) => {
                Kind::NotFound
            }
            Self::AdapterUpdate(
                AdapterUpdateError::AlreadyLoaded(_) | AdapterUpdateError::Refused { .. },
            ) => Kind::Validation,
            Self::AdapterUpdate(AdapterUpdateError::InUse { .. }) => Kind::Conflict,
            Self::AdapterUpdate(AdapterUpdateError::Shards(_)) => Kind::Generation,
            Self::Scheduler(
                SchedulerError::ShuttingDown
                | SchedulerError::Recovering
                | SchedulerError::QueueTimeout(_),
            )
            | Self::Stream(StreamError::Scheduler(
                SchedulerError::ShuttingDown
                | SchedulerError::Recovering
                | SchedulerError::QueueTimeout(_),
            ))
            | Self::Unhealthy(_) => Kind::Unavailable,
            Self::Scheduler(_) | Self::Stream(_) => Kind::Generation,
        }
    }

    /// The `reason` label of `tandem_request_failure_total`: validation, overloaded, timeout,
    /// shard_error, unavailable or generation (`cancelled` is recorded when a request is dropped).
    pub fn metric_reason(&self) -> &'static str {
        let scheduler = match self {
            Self::Scheduler(error) | Self::Stream(StreamError::Scheduler(error)) => Some(error),
            _ => None,
        };
        match (self.kind(), scheduler) {
            (_, Some(SchedulerError::QueueTimeout(_))) => "timeout",
            (_, Some(SchedulerError::ShardFailed(_))) => "shard_error",
            (
                Kind::Validation | Kind::TooLarge | Kind::NotJson | Kind::NotFound | Kind::Conflict,
                _,
            ) => "validation",
            (Kind::Overloaded, _) => "overloaded",
            (Kind::Unauthorized, _) => "unauthorized",
            (Kind::Unavailable, _) => "unavailable",
            (Kind::Generation, _) => "generation",
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            Self::Validation(error) => error.param(),
            Self::InvalidBody { param, .. } => param.as_deref(),
            Self::NotFound { param, .. } => *param,
            _ => None,
        }
    }

    fn openai_code(&self) -> Option<&'static str> {
        match self {
            Self::Validation(
                ValidationError::InputTooLong { .. } | ValidationError::TotalTooLong { .. },
            ) => Some("context_length_exceeded"),
            Self::Unauthorized(_) => Some("invalid_api_key"),
            _ => None,
        }
    }
}

/// Which API family a route belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAi,
    Anthropic,
    Native,
}

/// Where the Anthropic Messages routes live.
pub const ANTHROPIC_PATH_PREFIX: &str = "/v1/messages";

impl Api {
    /// The family a request path belongs to, for answers given before a handler runs.
    pub fn for_path(path: &str) -> Self {
        if path.starts_with(ANTHROPIC_PATH_PREFIX) {
            Self::Anthropic
        } else if path.starts_with("/v1/") {
            Self::OpenAi
        } else {
            Self::Native
        }
    }
}

/// Marks a handler's API family at the type level, so `?` renders errors correctly.
pub trait Flavor: Send + Sync + 'static {
    const API: Api;
}

/// The `/v1/*` routes.
#[derive(Debug)]
pub struct OpenAi;
impl Flavor for OpenAi {
    const API: Api = Api::OpenAi;
}

/// The Anthropic Messages routes.
#[derive(Debug)]
pub struct Anthropic;
impl Flavor for Anthropic {
    const API: Api = Api::Anthropic;
}

/// The TGI-compatible routes.
#[derive(Debug)]
pub struct Native;
impl Flavor for Native {
    const API: Api = Api::Native;
}

fn native_type(kind: Kind) -> &'static str {
    match kind {
        Kind::Validation | Kind::TooLarge | Kind::NotJson => "validation",
        Kind::Overloaded => "overloaded",
        Kind::Unauthorized => "unauthorized",
        Kind::NotFound => "not_found",
        Kind::Conflict => "conflict",
        Kind::Generation => "generation",
        Kind::Unavailable => "unhealthy",
    }
}

fn status(api: Api, kind: Kind) -> StatusCode {
    match (kind, api) {
        (Kind::Validation, Api::OpenAi | Api::Anthropic) => StatusCode::BAD_REQUEST,
        (Kind::Validation, Api::Native) => StatusCode::UNPROCESSABLE_ENTITY,
        (Kind::TooLarge, _) => StatusCode::PAYLOAD_TOO_LARGE,
        (Kind::NotJson, _) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        (Kind::Overloaded, _) => StatusCode::TOO_MANY_REQUESTS,
        (Kind::Unauthorized, _) => StatusCode::UNAUTHORIZED,
        (Kind::NotFound, _) => StatusCode::NOT_FOUND,
        (Kind::Conflict, _) => StatusCode::CONFLICT,
        (Kind::Generation, Api::OpenAi | Api::Anthropic) => StatusCode::INTERNAL_SERVER_ERROR,
        (Kind::Generation, Api::Native) => StatusCode::FAILED_DEPENDENCY,
        (Kind::Unavailable, _) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn anthropic_type(kind: Kind) -> &'static str {
    match kind {
        Kind::Validation | Kind::NotJson => "invalid_request_error",
        Kind::TooLarge => "request_too_large",
        Kind::Unauthorized => "authentication_error",
        Kind::NotFound => "not_found_error",
        Kind::Conflict => "invalid_request_error",
        Kind::Overloaded => "rate_limit_error",
        Kind::Generation => "api_error",
        Kind::Unavailable => "overloaded_error",
    }
}

/// The JSON body for `error` in `api`'s shape.
pub fn error_body(api: Api, error: &AppError) -> Value {
    let kind = error.kind();
    let body = match api {
        Api::Native => serde_json::to_value(NativeErrorBody {
            error: error.to_string(),
            error_type: native_type(kind),
        }),
        Api::Anthropic => serde_json::to_value(AnthropicErrorBody {
            kind: "error",
            error: AnthropicError {
                error_type: anthropic_type(kind),
                message: error.to_string(),
            },
        }),
        Api::OpenAi => {
            let error_type = match kind {
                Kind::Validation
                | Kind::TooLarge
                | Kind::NotJson
                | Kind::Unauthorized
                | Kind::NotFound
                | Kind::Conflict => "invalid_request_error",
                Kind::Overloaded => "overloaded",
                Kind::Generation => "server_error",
                Kind::Unavailable => "service_unavailable",
            };
            serde_json::to_value(OpenAiErrorBody {
                error: OpenAiError {
                    message: error.to_string(),
                    error_type,
                    param: error.param().map(str::to_owned),
                    code: error.openai_code(),
                },
            })
        }
    };
    body.expect("invariant: error bodies are plain strings")
}

/// Seconds a client is told to wait before retrying a 503.
pub const RETRY_AFTER_SECS: u64 = 5;

/// Seconds a client is told to wait before retrying a 429: a slot frees as soon as one
/// request finishes, so the wait is short.
pub const OVERLOADED_RETRY_AFTER_SECS: u64 = 1;

/// The full HTTP response for `error` in `api`'s shape; a 503 and a 429 carry `Retry-After`,
/// a 401 carries `WWW-Authenticate`.
pub fn error_response(api: Api, error: &AppError) -> Response {
    let kind = error.kind();
    let mut response = (status(api, kind), Json(error_body(api, error))).into_response();
    let headers = response.headers_mut();
    match kind {
        Kind::Unavailable => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        Kind::Overloaded => {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(OVERLOADED_RETRY_AFTER_SECS),
            );
        }
        Kind::Unauthorized => {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        Kind::Validation
        | Kind::TooLarge
        | Kind::NotJson
        | Kind::NotFound
        | Kind::Conflict
        | Kind::Generation => {}
    }
    response
}

/// The SSE event that reports `error` in the middle of a stream (named `error` on the
/// Anthropic routes, whose clients dispatch on event names).
pub fn error_event(api: Api, error: &AppError) -> Event {
    let event = Event::default().data(error_body(api, error).to_string());
    match api {
        Api::Anthropic => event.event("error"),
        Api::OpenAi | Api::Native => event,
    }
}

/// An `AppError` on its way out of a handler of flavor `F`.
#[derive(Debug)]
pub struct ApiError<F> {
    pub error: AppError,
    flavor: PhantomData<F>,
}

impl<F: Flavor> IntoResponse for ApiError<F> {
    fn into_response(self) -> Response {
        error_response(F::API, &self.error)
    }
}

impl<F> From<AppError> for ApiError<F> {
    fn from(error: AppError) -> Self {
        Self {
            error,
            flavor: PhantomData,
        }
    }
}

impl<F> From<ValidationError> for ApiError<F> {
    fn from(error: ValidationError) -> Self {
        AppError::from(error).into()
    }
}

#[cfg(test)]
mod tests;
