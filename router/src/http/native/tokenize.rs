//! `POST /tokenize`: the prompt's tokens as TGI reports them.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::{ApiError, Native, NativeErrorBody};
use crate::http::state::AppState;
use crate::http::transport::json::ApiJson;
use crate::validation::{
    reject_unsupported, OffsetTokens, TokenizationReservation, ValidationError, Validator,
};

/// `POST /tokenize` body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct TokenizeRequest {
    /// Text to tokenize, with the tokenizer's special tokens, exactly as `/generate` does.
    #[schema(example = "My name is Olivier and I")]
    inputs: String,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Map<String, Value>,
}

/// One token of the prompt: its id, its text, and where that text sits in `inputs`
/// (character offsets, `stop` exclusive; special tokens added by the tokenizer span nothing).
#[derive(Debug, Serialize, ToSchema)]
pub struct SimpleToken<'a> {
    pub id: u32,
    pub text: &'a str,
    pub start: usize,
    pub stop: usize,
}

/// `POST /tokenize`: the tokens `/generate` would see for `inputs`. It holds an admission
/// permit like a generation (429 when the server is full, 503 while draining) and keeps only
/// the input, the ids with their offsets, and the JSON answer it writes from them.
#[utoipa::path(post, path = "/tokenize", tag = "TGI", request_body = TokenizeRequest, responses(
    (status = 200, description = "The tokens", body = Vec<SimpleToken>),
    (status = 413, description = "Body over the payload limit", body = NativeErrorBody),
    (status = 415, description = "Body not sent as JSON", body = NativeErrorBody),
    (status = 422, description = "Invalid request", body = NativeErrorBody),
    (status = 429, description = "Too many requests in flight", body = NativeErrorBody),
    (status = 503, description = "Draining or recovering", body = NativeErrorBody)))]
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<TokenizeRequest, Native>,
) -> Result<Response, ApiError<Native>> {
    reject_unsupported(&request.extra, &[])?;
    let _permit = state.load_shedder.admit_requests(1)?;
    let answer = tokenize_answer(&state.validator, request.inputs).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        answer.into_body(),
    )
        .into_response())
}

/// `/tokenize`'s JSON answer and the tokenization memory reserved for it until it is sent.
#[derive(Debug)]
pub struct TokenizeAnswer {
    pub json: Vec<u8>,
    reservation: TokenizationReservation,
}

impl TokenizeAnswer {
    /// A response body that returns the reservation once it has been sent or dropped.
    fn into_body(self) -> Body {
        let Self { json, reservation } = self;
        let chunk = stream::iter([Ok::<_, Infallible>(Bytes::from(json))]);
        Body::from_stream(chunk.inspect(move |_| {
            let _ = &reservation;
        }))
    }
}

/// Tokenizes `inputs` and writes the answer, within the validator's tokenization budget.
pub async fn tokenize_answer(
    validator: &Validator,
    inputs: String,
) -> Result<TokenizeAnswer, ValidationError> {
    let OffsetTokens {
        text,
        tokens,
        reservation,
    } = validator.tokenize_with_offsets(inputs).await?;
    let json = tokio::task::spawn_blocking(move || tokens_json(&text, &tokens))
        .await
        .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
    Ok(TokenizeAnswer { json, reservation })
}

/// The JSON array of `SimpleToken`s, written token by token from byte offsets into `text`.
fn tokens_json(text: &str, tokens: &[(u32, (usize, usize))]) -> Vec<u8> {
    let mut characters = CharacterOffsets::new(text);
    let mut body = Vec::with_capacity(tokens.len() * 48 + 2);
    body.push(b'[');
    for (index, &(id, (start, stop))) in tokens.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        let (start, stop) = (characters.floor(start), characters.ceil(stop.max(start)));
        let token = SimpleToken {
            id,
            text: text.get(start..stop).unwrap_or_default(),
            start: characters.count_before(start),
            stop: characters.count_before(stop),
        };
        // Writing to a Vec cannot fail, and a SimpleToken always serializes.
        let _ = serde_json::to_writer(&mut body, &token);
    }
    body.push(b']');
    body
}

/// Character counts at byte offsets of one text, computed incrementally for offsets that
/// mostly move forward.
struct CharacterOffsets<'a> {
    text: &'a str,
    byte: usize,
    characters: usize,
}

impl<'a> CharacterOffsets<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text,
            byte: 0,
            characters: 0,
        }
    }

    /// The character boundary at or before `byte` (clamped to the text).
    fn floor(&self, byte: usize) -> usize {
        let mut byte = byte.min(self.text.len());
        while !self.text.is_char_boundary(byte) {
            byte -= 1;
        }
        byte
    }

    /// The character boundary at or after `byte` (clamped to the text).
    fn ceil(&self, byte: usize) -> usize {
        let mut byte = byte.min(self.text.len());
        while !self.text.is_char_boundary(byte) {
            byte += 1;
        }
        byte
    }

    /// Characters before the character boundary `byte`.
    fn count_before(&mut self, byte: usize) -> usize {
        if byte < self.byte {
            (self.byte, self.characters) = (0, 0);
        }
        self.characters += self.text[self.byte..byte].chars().count();
        self.byte = byte;
        self.characters
    }
}
