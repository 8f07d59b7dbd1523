//! The error bodies each API family answers with, as their OpenAPI schemas describe them.

use serde::Serialize;
use utoipa::ToSchema;

/// The error body of the native (TGI) routes.
#[derive(Debug, Serialize, ToSchema)]
pub struct NativeErrorBody {
    /// What went wrong.
    pub error: String,
    /// `validation`, `overloaded`, `generation` or `unhealthy`.
    pub error_type: &'static str,
}

/// The error answers of the native routes that return one generation (`/generate` and `POST /`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only documents responses; the answers are built by `ApiError`
pub enum NativeGenerationErrorResponses {
    #[response(status = 413, description = "Body over the payload limit")]
    TooLarge(NativeErrorBody),
    #[response(status = 422, description = "Invalid request")]
    Invalid(NativeErrorBody),
    #[response(status = 424, description = "Generation failed")]
    Generation(NativeErrorBody),
    #[response(status = 429, description = "Too many requests in flight")]
    Overloaded(NativeErrorBody),
    #[response(status = 503, description = "Draining or recovering")]
    Unavailable(NativeErrorBody),
}

/// The error answers of the OpenAI generation routes, documented once for both.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only documents responses; the answers are built by `ApiError`
pub enum OpenAiErrorResponses {
    #[response(status = 400, description = "Invalid request")]
    Invalid(OpenAiErrorBody),
    #[response(status = 413, description = "Body over the payload limit")]
    TooLarge(OpenAiErrorBody),
    #[response(status = 429, description = "Too many requests in flight")]
    Overloaded(OpenAiErrorBody),
    #[response(status = 500, description = "Generation failed")]
    Generation(OpenAiErrorBody),
    #[response(status = 503, description = "Draining or recovering")]
    Unavailable(OpenAiErrorBody),
}

/// The error body of the OpenAI routes.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiError,
}

/// OpenAI's `error` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiError {
    /// What went wrong.
    pub message: String,
    /// `invalid_request_error`, `overloaded`, `server_error` or `service_unavailable`.
    #[serde(rename = "type")]
    pub error_type: &'static str,
    /// The request parameter at fault.
    pub param: Option<String>,
    /// `context_length_exceeded` for length limits.
    pub code: Option<&'static str>,
}

/// The error body of the Anthropic routes.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: AnthropicError,
}

/// Anthropic's `error` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicError {
    /// `invalid_request_error`, `authentication_error`, `request_too_large`,
    /// `rate_limit_error`, `api_error` or `overloaded_error`.
    #[serde(rename = "type")]
    pub error_type: &'static str,
    /// What went wrong.
    pub message: String,
}
