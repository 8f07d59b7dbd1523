//! `POST /tokenize`: the prompt's tokens as TGI reports them.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::{ApiError, Native, NativeErrorBody};
use crate::http::json::ApiJson;
use crate::http::AppState;
use crate::validation::reject_unsupported;

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
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub start: usize,
    pub stop: usize,
}

/// `POST /tokenize`: the tokens `/generate` would see for `inputs`.
#[utoipa::path(post, path = "/tokenize", tag = "TGI", request_body = TokenizeRequest, responses(
    (status = 200, description = "The tokens", body = Vec<SimpleToken>),
    (status = 413, description = "Body over the payload limit", body = NativeErrorBody),
    (status = 422, description = "Invalid request", body = NativeErrorBody)))]
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<TokenizeRequest, Native>,
) -> Result<Json<Vec<SimpleToken>>, ApiError<Native>> {
    reject_unsupported(&request.extra, &[])?;
    let characters: Vec<char> = request.inputs.chars().collect();
    let tokens = state
        .validator
        .tokenize_with_offsets(request.inputs)
        .await?
        .into_iter()
        .map(|(id, (start, stop))| {
            let span = characters.get(start..stop).unwrap_or_default();
            SimpleToken {
                id,
                text: span.iter().collect(),
                start,
                stop,
            }
        })
        .collect();
    Ok(Json(tokens))
}
