//! OpenAI's Responses API: `POST /v1/responses` (plain or streamed) on the chat route's
//! template, sampling, grammar and tool paths, and the stored responses behind
//! `previous_response_id`, `GET` and `DELETE /v1/responses/{response_id}`.

mod convert;
mod events;
mod input;
mod output;
mod request;
pub(crate) mod store;

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use self::store::ResponseStore;

use self::events::ResponseEvents;
use self::output::{DeletedResponse, Draft, ResponseObject, ResponseUsage};
use self::request::ResponsesRequest;
use crate::error::{ApiError, AppError, OpenAi, OpenAiErrorBody};
use crate::generation::AdmittedRequest;
use crate::http::middleware::caller::Caller;
use crate::http::state::AppState;
use crate::http::transport::json::ApiJson;
use crate::http::transport::sse::typed_event;
use crate::http::transport::streaming::{stream_generations, SurfaceEvents};
use crate::stream::TextDelta;
use crate::tools::ToolChoice;
use crate::validation::ValidationError;

/// The error answers of `POST /v1/responses`.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only documents responses; the answers are built by `ApiError`
pub enum CreateErrorResponses {
    #[response(status = 400, description = "Invalid request")]
    Invalid(OpenAiErrorBody),
    #[response(
        status = 404,
        description = "`previous_response_id` names no stored response"
    )]
    NotFound(OpenAiErrorBody),
    #[response(status = 413, description = "Body over the payload limit")]
    TooLarge(OpenAiErrorBody),
    #[response(status = 415, description = "Body not sent as JSON")]
    NotJson(OpenAiErrorBody),
    #[response(status = 429, description = "Too many requests in flight")]
    Overloaded(OpenAiErrorBody),
    #[response(status = 500, description = "Generation failed")]
    Generation(OpenAiErrorBody),
    #[response(status = 503, description = "Draining or recovering")]
    Unavailable(OpenAiErrorBody),
}

/// The error answers of the stored-response routes.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only documents responses; the answers are built by `ApiError`
pub enum StoredErrorResponses {
    #[response(status = 400, description = "A query parameter that is not served")]
    Invalid(OpenAiErrorBody),
    #[response(status = 404, description = "No stored response has this id")]
    NotFound(OpenAiErrorBody),
}

/// `POST /v1/responses`.
#[utoipa::path(post, path = "/v1/responses", tag = "OpenAI", request_body = ResponsesRequest, responses(
    (status = 200, description = "The response, or with `stream: true` server-sent events named \
        by their `type`: `response.created`, `response.in_progress`, the output items' events, \
        then `response.completed` or `response.incomplete`",
        content(
            (ResponseObject = "application/json"),
            (Object = "text/event-stream"))),
    CreateErrorResponses))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request, _): ApiJson<ResponsesRequest, OpenAi>,
) -> Result<Response, ApiError<OpenAi>> {
    let owner = caller.key();
    let generation = convert::generation(request, &state.config, &state.responses, owner)?;
    let call_required = generation
        .tools
        .as_ref()
        .is_some_and(|plan| plan.choice != ToolChoice::Auto);
    let renderer = ResponseEvents::new(generation.tools.is_some(), call_required)
        .with_tool_family(state.config.tool_format.family)
        .with_tools(generation.tools.as_ref());
    let draft = Draft::new(
        state.answering_model(&generation.params),
        generation.echo,
        generation.conversation,
        owner,
    );
    let admitted = AdmittedRequest::start(
        state.engine(caller),
        "responses",
        generation.prompt,
        &generation.params,
    )
    .await?;
    let store = Arc::clone(&state.responses);
    if generation.stream {
        let surface = ResponseStream {
            renderer: renderer.with_reasoning(admitted.reasoning.clone()),
            input_tokens: admitted.input_tokens,
            draft: Some(draft),
            store,
            text: String::new(),
        };
        return Ok(stream_generations(vec![admitted], surface));
    }
    let completed = admitted.collect().await?;
    let mut renderer = renderer;
    let reasoning = completed.reasoning.unwrap_or_default();
    renderer.reasoning_text(&reasoning.text);
    renderer.answer(completed.text);
    let (_, output) = renderer.finish(completed.finish);
    let usage = ResponseUsage::new(completed.input_tokens, completed.tokens.len())
        .with_cached_tokens(completed.cached_tokens)
        .with_reasoning_tokens(reasoning.tokens);
    let generated: String = completed
        .tokens
        .iter()
        .map(|token| token.text.as_str())
        .collect();
    let body = draft.finish(output, completed.finish, usage, generated, &store);
    Ok(Json(body).into_response())
}

/// An event named by its payload's `type`.
fn named_event(payload: &Value) -> Event {
    typed_event(payload, "error")
}

/// The Responses API's stream (`ResponseEvents`): `response.created` and
/// `response.in_progress`, the output items' events as tokens arrive, then
/// `response.completed` or `response.incomplete`, once the response is stored; an error ends
/// it with an `error` event.
struct ResponseStream {
    renderer: ResponseEvents,
    /// Taken when the response finishes.
    draft: Option<Draft>,
    store: Arc<ResponseStore>,
    input_tokens: usize,
    /// The generated text so far.
    text: String,
}

impl SurfaceEvents for ResponseStream {
    fn opening(&mut self) -> Vec<Event> {
        let Some(draft) = &self.draft else {
            return Vec::new();
        };
        let opening = self.renderer.start(&draft.in_progress());
        opening.iter().map(named_event).collect()
    }

    fn delta(&mut self, _index: usize, delta: TextDelta, generated_tokens: usize) -> Vec<Event> {
        self.text.push_str(&delta.token.text);
        let mut payloads = self.renderer.text(delta.token.text);
        if let Some(finish) = delta.finish {
            let (closing, output) = self.renderer.finish(finish);
            payloads.extend(closing);
            if let Some(draft) = self.draft.take() {
                let usage = ResponseUsage::new(self.input_tokens, generated_tokens)
                    .with_cached_tokens(delta.cached_tokens)
                    .with_reasoning_tokens(self.renderer.reasoning_tokens());
                let text = std::mem::take(&mut self.text);
                let body = draft.finish(output, finish, usage, text, &self.store);
                payloads.push(self.renderer.end(&body));
            }
        }
        payloads.iter().map(named_event).collect()
    }

    fn error(&mut self, error: &AppError) -> Vec<Event> {
        vec![named_event(&self.renderer.error(error))]
    }
}

/// Query parameters of `GET /v1/responses/{response_id}` are not served (no `stream`,
/// `include` or `starting_after`); `include_obfuscation` only shapes streams and is ignored.
fn refuse_query(query: Option<&str>) -> Result<(), ValidationError> {
    let served = |name: &str| name.is_empty() || name == "include_obfuscation";
    match query
        .unwrap_or_default()
        .split('&')
        .map(|pair| pair.split('=').next().unwrap_or_default())
        .find(|name| !served(name))
    {
        Some(name) => Err(ValidationError::Unsupported {
            param: name.to_owned(),
            detail: " on GET /v1/responses/{response_id}".to_owned(),
        }),
        None => Ok(()),
    }
}

fn not_found(id: String) -> AppError {
    AppError::NotFound {
        what: "Response",
        id,
        param: None,
    }
}

/// `GET /v1/responses/{response_id}`: a stored response, as it was answered, to the key that
/// created it.
#[utoipa::path(get, path = "/v1/responses/{response_id}", tag = "OpenAI",
    params(("response_id" = String, Path, description = "The response's `id`")),
    responses(
        (status = 200, description = "The stored response", body = ResponseObject),
        StoredErrorResponses))]
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError<OpenAi>> {
    refuse_query(query.as_deref())?;
    match state.responses.get(&id, caller.key()) {
        Some(stored) => Ok(Json(stored.body.clone())),
        None => Err(not_found(id).into()),
    }
}

/// `DELETE /v1/responses/{response_id}`: forgets a stored response of the key that created it.
#[utoipa::path(delete, path = "/v1/responses/{response_id}", tag = "OpenAI",
    params(("response_id" = String, Path, description = "The response's `id`")),
    responses(
        (status = 200, description = "The deletion", body = DeletedResponse),
        StoredErrorResponses))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<DeletedResponse>, ApiError<OpenAi>> {
    if !state.responses.remove(&id, caller.key()) {
        return Err(not_found(id).into());
    }
    Ok(Json(DeletedResponse {
        id,
        object: "response",
        deleted: true,
    }))
}

#[cfg(test)]
mod tests;
