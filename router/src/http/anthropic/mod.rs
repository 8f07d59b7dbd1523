//! The Anthropic Messages API: `POST /v1/messages` (plain or streamed) and
//! `POST /v1/messages/count_tokens`, on the chat route's template, sampling and tool paths.

mod cache_hints;
mod convert;
mod events;
mod request;
mod response;
mod turn_content;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::Value;

use self::events::MessageEvents;
use self::request::{CountTokensRequest, MessagesRequest};
use self::response::{
    blocks_with_thinking, message_id, stop_reason, Message, MessageUsage, TokenCount,
};
use crate::error::{error_event, Anthropic, AnthropicErrorBody, Api, ApiError, AppError};
use crate::generation::{AdmittedRequest, CompletedOutput};
use crate::http::middleware::caller::Caller;
use crate::http::state::AppState;
use crate::http::transport::json::ApiJson;
use crate::http::transport::sse::typed_event;
use crate::http::transport::streaming::{stream_generations, SurfaceEvents};
use crate::stream::{StreamError, TextDelta};
use crate::tools::ToolChoice;

/// The error answers of the Anthropic routes.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only documents responses; the answers are built by `ApiError`
pub enum AnthropicErrorResponses {
    #[response(status = 400, description = "Invalid request")]
    Invalid(AnthropicErrorBody),
    #[response(status = 401, description = "Missing or invalid API key")]
    Unauthorized(AnthropicErrorBody),
    #[response(status = 413, description = "Body over the payload limit")]
    TooLarge(AnthropicErrorBody),
    #[response(status = 415, description = "Body not sent as JSON")]
    NotJson(AnthropicErrorBody),
    #[response(status = 429, description = "Too many requests in flight")]
    Overloaded(AnthropicErrorBody),
    #[response(status = 500, description = "Generation failed")]
    Generation(AnthropicErrorBody),
    #[response(status = 503, description = "Draining or recovering")]
    Unavailable(AnthropicErrorBody),
}

/// `POST /v1/messages`.
#[utoipa::path(post, path = "/v1/messages", tag = "Anthropic", request_body = MessagesRequest, responses(
    (status = 200, description = "The message, or with `stream: true` server-sent events named \
        by their `type`: `message_start`, content blocks, `message_delta`, `message_stop`",
        content(
            (Message = "application/json"),
            (Object = "text/event-stream"))),
    AnthropicErrorResponses))]
pub async fn messages(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request, _): ApiJson<MessagesRequest, Anthropic>,
) -> Result<Response, ApiError<Anthropic>> {
    let generation = convert::generation(request, &state.config)?;
    let tools_callable = generation.tools.is_some();
    let call_required = generation
        .tools
        .as_ref()
        .is_some_and(|plan| plan.choice != ToolChoice::Auto);
    let admitted = AdmittedRequest::start(
        state.engine(caller),
        "messages",
        generation.prompt,
        &generation.params,
    )
    .await?;
    let id = message_id();
    let model = state.answering_model(&generation.params);
    let renderer = MessageEvents::new(tools_callable, call_required)
        .with_tool_family(state.config.tool_format.family)
        .with_tools(generation.tools.as_ref())
        .with_reasoning(admitted.reasoning.clone());
    if generation.stream {
        let input_tokens = admitted.input_tokens;
        let surface = MessageStream {
            renderer,
            id,
            model,
            input_tokens,
        };
        return Ok(stream_generations(vec![admitted], surface));
    }
    let input_tokens = admitted.input_tokens;
    let mut output = CompletedOutput::new(admitted.reasoning.clone());
    let mut deltas = Box::pin(admitted.into_deltas(0));
    while let Some(sibling) = deltas.next().await {
        let delta = sibling.delta?;
        output.push(&delta.token.text);
        if let Some(finish) = delta.finish {
            let (text, reasoning) = output.finish();
            let content = blocks_with_thinking(reasoning, text, generation.tools.as_ref());
            let called_tools = content
                .iter()
                .any(|block| matches!(block, response::OutputBlock::ToolUse { .. }));
            let body = Message {
                id,
                kind: "message",
                role: "assistant",
                model,
                content,
                stop_reason: stop_reason(finish, called_tools),
                stop_sequence: delta.stop_sequence,
                usage: MessageUsage::new(
                    input_tokens,
                    delta.cached_tokens,
                    sibling.generated_tokens,
                ),
            };
            return Ok(Json(body).into_response());
        }
    }
    Err(AppError::Stream(StreamError::Incomplete).into())
}

/// An event named by its payload's `type`.
fn named_event(payload: &Value) -> Event {
    typed_event(payload, "message_delta")
}

/// Anthropic's message stream: `message_start`, then the message's blocks as tokens arrive
/// (`MessageEvents`), ending with `message_delta` and `message_stop`; an error ends it with an
/// `error` event.
struct MessageStream {
    renderer: MessageEvents,
    id: String,
    model: String,
    input_tokens: usize,
}

impl SurfaceEvents for MessageStream {
    fn opening(&mut self) -> Vec<Event> {
        let start = MessageEvents::start(&self.id, &self.model, self.input_tokens);
        vec![named_event(&start)]
    }

    fn delta(&mut self, _index: usize, delta: TextDelta, generated_tokens: usize) -> Vec<Event> {
        let mut payloads = self.renderer.text(delta.token.text);
        if let Some(finish) = delta.finish {
            let usage = MessageUsage::new(self.input_tokens, delta.cached_tokens, generated_tokens);
            let closing = self.renderer.finish(finish, delta.stop_sequence, usage);
            payloads.extend(closing);
        }
        payloads.iter().map(named_event).collect()
    }

    fn error(&mut self, error: &AppError) -> Vec<Event> {
        vec![error_event(Api::Anthropic, error)]
    }
}

/// `POST /v1/messages/count_tokens`: the tokens the conversation (system prompt and tool
/// descriptions included) takes once rendered by the chat template.
#[utoipa::path(post, path = "/v1/messages/count_tokens", tag = "Anthropic",
    request_body = CountTokensRequest, responses(
    (status = 200, description = "The count", body = TokenCount),
    AnthropicErrorResponses))]
pub async fn count_tokens(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<CountTokensRequest, Anthropic>,
) -> Result<Json<TokenCount>, ApiError<Anthropic>> {
    let prompt = convert::counted_prompt(request, &state.config)?;
    let _permit = state.load_shedder.admit_requests(1)?;
    let input_tokens = state.validator.count_tokens(prompt).await?;
    Ok(Json(TokenCount { input_tokens }))
}

#[cfg(test)]
mod tests;
