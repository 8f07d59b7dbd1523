//! `POST /v1/chat/completions`: the request body (`request.rs`), the whole completion
//! (`response.rs`) and the streamed chunks (`streaming.rs`), joined by the handler here.

mod render;
mod request;
mod response;
mod streaming;

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

pub use render::render_chat_request;
pub use request::ChatRequest;
pub use response::ChatCompletion;
pub use streaming::ChatChunks;

use super::chunks::ChatChunk;
use super::{stream_chunks, PromptUsage, ResponseMeta, StreamOptions};
use crate::error::{ApiError, OpenAi, OpenAiErrorResponses};
use crate::generation::{collect_siblings, AdmittedRequest};
use crate::http::middleware::caller::Caller;
use crate::http::state::AppState;
use crate::http::transport::json::ApiJson;

/// `POST /v1/chat/completions`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "OpenAI", request_body = ChatRequest, responses(
    (status = 200, description = "The completion, or with `stream: true` server-sent events of \
        `chat.completion.chunk` objects ending with `data: [DONE]`",
        content(
            (ChatCompletion = "application/json"),
            (ChatChunk = "text/event-stream"))),
    OpenAiErrorResponses))]
pub async fn completions(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request, _): ApiJson<ChatRequest, OpenAi>,
) -> Result<Response, ApiError<OpenAi>> {
    let stream = request.stream == Some(true);
    let include_usage =
        StreamOptions::usage_wanted(request.stream_options, state.config.always_include_usage);
    let with_logprobs = request.logprobs == Some(true);
    let config = &state.config;
    let plan = request.into_plan(
        &config.request_limits,
        &config.default_sampling,
        config.tool_format,
    )?;
    let generations = AdmittedRequest::start_siblings(
        state.engine(caller),
        "chat_completions",
        plan.prompt,
        &plan.params,
        plan.n,
    )
    .await?;
    let meta = ResponseMeta::new("chatcmpl", &state.answering_model(&plan.params));
    let decoding = with_logprobs.then(|| Arc::clone(&state.decoding));
    if stream {
        let reasoning = generations.first().and_then(|g| g.reasoning.clone());
        let chunks = ChatChunks::new(meta, decoding, plan.tool_plan.as_ref(), plan.n)
            .with_reasoning(reasoning.as_ref());
        let usage = PromptUsage {
            tokens: generations.first().map_or(0, |g| g.input_tokens),
            choices_per_prompt: generations.len(),
        };
        return Ok(stream_chunks(
            generations,
            chunks,
            include_usage.then_some(usage),
        ));
    }
    let completed = collect_siblings(generations).await?;
    let callable = plan.tool_plan.as_ref().filter(|tools| tools.may_call());
    let body = ChatCompletion::new(meta, completed, decoding.as_deref(), callable);
    Ok(Json(body).into_response())
}
