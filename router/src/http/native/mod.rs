//! TGI-compatible routes: `POST /generate`, `POST /generate_stream` and `POST /tokenize`.

mod request;
mod response;
pub mod tokenize;

use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;

use request::GenerateRequest;
use response::{BestOfSequence, GenerateResponse, StreamDetails, StreamResponse};

use crate::error::{
    error_event, Api, ApiError, AppError, Native, NativeErrorBody, NativeGenerationErrorResponses,
};
use crate::generation::{collect_siblings, AdmittedRequest};
use crate::http::middleware::caller::Caller;
use crate::http::state::AppState;
use crate::http::transport::json::ApiJson;
use crate::http::transport::sse::json_event;
use crate::http::transport::streaming::{stream_generations, SurfaceEvents};
use crate::stream::{TextDelta, TokenDecoding};
use crate::validation::request_rules;
use response::{answer, top_tokens};

/// `POST /generate`: the whole generation as one JSON object.
#[utoipa::path(post, path = "/generate", tag = "TGI", request_body = GenerateRequest, responses(
    (status = 200, description = "The generated text", body = GenerateResponse),
    NativeGenerationErrorResponses))]
pub async fn generate(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request, _): ApiJson<GenerateRequest, Native>,
) -> Result<Response, ApiError<Native>> {
    let use_generate_stream = " on /generate: use /generate_stream";
    request_rules::refuse_feature(request.wants_stream(), "stream", use_generate_stream)?;
    generate_whole(state, caller, request).await
}

/// `POST /`: TGI's compatibility route, where `huggingface_hub.InferenceClient` sends text
/// generation; `stream` picks `/generate_stream`'s or `/generate`'s answer.
#[utoipa::path(post, path = "/", tag = "TGI", request_body = GenerateRequest, responses(
    (status = 200, description = "`/generate`'s answer, or with `stream: true` `/generate_stream`'s events",
        content(
            (GenerateResponse = "application/json"),
            (StreamResponse = "text/event-stream"))),
    NativeGenerationErrorResponses))]
pub async fn compat_generate(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request, _): ApiJson<GenerateRequest, Native>,
) -> Result<Response, ApiError<Native>> {
    if request.wants_stream() {
        stream_tokens(state, caller, request).await
    } else {
        generate_whole(state, caller, request).await
    }
}

async fn generate_whole(
    state: AppState,
    caller: Caller,
    request: GenerateRequest,
) -> Result<Response, ApiError<Native>> {
    let (prompt, params, options) = request.into_parts(&state.config)?;
    let generations = AdmittedRequest::start_siblings(
        state.engine(caller),
        "generate",
        prompt,
        &params,
        options.best_of,
    )
    .await?;
    let mut candidates = collect_siblings(generations).await?;
    let best = candidates
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| a.cumulative_logprob().total_cmp(&b.cumulative_logprob()))
        .map_or(0, |(index, _)| index);
    let chosen = candidates.swap_remove(best);
    let others = (options.best_of > 1).then(|| {
        candidates
            .into_iter()
            .map(|candidate| {
                let (generated_text, details) = answer(candidate, &options, &state.decoding);
                BestOfSequence::new(generated_text, details)
            })
            .collect()
    });
    let (generated_text, mut details) = answer(chosen, &options, &state.decoding);
    details.best_of_sequences = others;
    let body = GenerateResponse {
        generated_text,
        details: options.details.then_some(details),
    };
    Ok(Json(body).into_response())
}

/// `POST /generate_stream`: one event per token; the last carries the full text and details.
#[utoipa::path(post, path = "/generate_stream", tag = "TGI", request_body = GenerateRequest, responses(
    (status = 200, description = "Server-sent events, one `StreamResponse` per token (`data: {json}`)",
        content_type = "text/event-stream", body = StreamResponse),
    (status = 413, description = "Body over the payload limit", body = NativeErrorBody),
    (status = 422, description = "Invalid request", body = NativeErrorBody),
    (status = 429, description = "Too many requests in flight", body = NativeErrorBody),
    (status = 503, description = "Draining or recovering", body = NativeErrorBody)))]
pub async fn generate_stream(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request, _): ApiJson<GenerateRequest, Native>,
) -> Result<Response, ApiError<Native>> {
    stream_tokens(state, caller, request).await
}

async fn stream_tokens(
    state: AppState,
    caller: Caller,
    request: GenerateRequest,
) -> Result<Response, ApiError<Native>> {
    let (prompt, params, options) = request.into_parts(&state.config)?;
    let use_generate = " on /generate_stream: use /generate";
    request_rules::refuse_feature(options.best_of > 1, "best_of", use_generate)?;
    let generation =
        AdmittedRequest::start(state.engine(caller), "generate_stream", prompt, &params).await?;
    let surface = TokenStream {
        text: options.full_text_prefix.unwrap_or_default(),
        seed: generation.seed,
        input_tokens: generation.input_tokens,
        decoding: Arc::clone(&state.decoding),
    };
    Ok(stream_generations(vec![generation], surface))
}

/// TGI's token stream: one `StreamResponse` per token, the last one carrying the full text
/// and details; an error ends it with an error event (no end marker).
struct TokenStream {
    /// The text so far (after the prompt, with `return_full_text`).
    text: String,
    seed: u64,
    input_tokens: usize,
    decoding: Arc<TokenDecoding>,
}

impl SurfaceEvents for TokenStream {
    fn delta(&mut self, _index: usize, delta: TextDelta, generated_tokens: usize) -> Vec<Event> {
        self.text.push_str(&delta.token.text);
        let details = delta.finish.map(|finish| StreamDetails {
            finish_reason: finish.into(),
            generated_tokens,
            seed: self.seed,
            input_length: self.input_tokens,
        });
        let generated_text = details.is_some().then(|| std::mem::take(&mut self.text));
        let top_tokens = top_tokens(&delta.token.top_logprobs, &self.decoding);
        let event = StreamResponse {
            index: generated_tokens,
            token: delta.token.into(),
            top_tokens,
            generated_text,
            details,
        };
        vec![json_event(&event)]
    }

    fn error(&mut self, error: &AppError) -> Vec<Event> {
        vec![error_event(Api::Native, error)]
    }
}
