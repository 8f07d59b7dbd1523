//! A JSON body extractor whose rejections use the route's error shape, never axum's plain text.
//! Like axum's own `Json`, it takes only bodies sent as JSON: a `Content-Type` of
//! `application/json` or `application/*+json` (parameters such as `charset` allowed). Any other
//! type, or none, is answered 415 before the body is read. The OpenAI SDKs, `huggingface_hub`
//! and `curl -H 'Content-Type: application/json'` all send it; `curl -d` alone sends a form type.

use std::marker::PhantomData;

use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, AppError, Flavor};
use crate::http::state::AppState;
use crate::validation::serde_wording;

/// The request body parsed as `T`; failures render in flavor `F`'s error shape and name
/// the offending field when there is one.
#[derive(Debug)]
pub struct ApiJson<T, F>(pub T, pub PhantomData<F>);

impl<T, F> FromRequest<AppState> for ApiJson<T, F>
where
    T: DeserializeOwned,
    F: Flavor,
{
    type Rejection = ApiError<F>;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        if !is_json(request.headers()) {
            return Err(AppError::NotJson.into());
        }
        let body = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    AppError::PayloadTooLarge(state.config.payload_limit)
                } else {
                    AppError::InvalidBody {
                        message: rejection.body_text(),
                        param: None,
                    }
                }
            })?;
        parse(&body)
            .map(|value| Self(value, PhantomData))
            .map_err(Into::into)
    }
}

/// Whether the body is declared as JSON, as axum's `Json` decides it.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.to_ascii_lowercase();
    kind.eq_ignore_ascii_case("application") && (subtype == "json" || subtype.ends_with("+json"))
}

/// Parses `body`; a refusal names the field, what it must be and the value as the client
/// wrote it, in JSON's words rather than Rust's.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, AppError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path();
        let known = path.iter().next().is_some()
            && !path
                .iter()
                .any(|segment| matches!(segment, serde_path_to_error::Segment::Unknown));
        let param = known.then(|| path.to_string());
        let inner = error.inner();
        let literal = number_ending_at(body, inner.line(), inner.column());
        let plain = serde_wording::plain_with_literal(&inner.to_string(), literal);
        let message = match &param {
            Some(param) if plain.starts_with("must be ") => format!("`{param}` {plain}"),
            Some(param) => format!("`{param}`: {plain}"),
            None if plain.starts_with("must be ") => format!("the body {plain}"),
            None => plain,
        };
        AppError::InvalidBody { message, param }
    })
}

/// The number literal that ends at 1-based `line` and `column` of `body`, where serde_json
/// reports a number it could not use.
fn number_ending_at(body: &[u8], line: usize, column: usize) -> Option<&str> {
    let line_start = match line {
        0 => return None,
        1 => 0,
        _ => {
            body.iter()
                .enumerate()
                .filter(|(_, byte)| **byte == b'\n')
                .nth(line - 2)?
                .0
                + 1
        }
    };
    let end = line_start.checked_add(column)?.min(body.len());
    let head = body.get(line_start..end)?;
    let start = head
        .iter()
        .rposition(|byte| !matches!(byte, b'0'..=b'9' | b'+' | b'-' | b'.' | b'e' | b'E'))
        .map_or(0, |at| at + 1);
    let literal = std::str::from_utf8(&head[start..]).ok()?;
    (!literal.is_empty()).then_some(literal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Body {
        n: u32,
        nested: Option<Nested>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Nested {
        seed: u64,
    }

    fn error_of(body: &str) -> (String, Option<String>) {
        match parse::<Body>(body.as_bytes()).unwrap_err() {
            AppError::InvalidBody { message, param } => (message, param),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn type_errors_name_the_field_path() {
        let (message, param) = error_of(r#"{"n": 1, "nested": {"seed": -1}}"#);
        assert_eq!(param.as_deref(), Some("nested.seed"));
        assert_eq!(
            message,
            "`nested.seed` must be a non-negative integer, got -1 at line 1 column 30"
        );
    }

    #[test]
    fn numbers_are_quoted_as_the_client_wrote_them() {
        for (body, quoted) in [
            (r#"{"n": 1e12}"#, "got 1e12 "),
            (
                "{\n  \"n\": 1,\n  \"nested\": {\"seed\": 2.50}}",
                "got 2.50 ",
            ),
            (r#"{"n": -7E+3}"#, "got -7E+3 "),
        ] {
            let (message, _) = error_of(body);
            assert!(message.contains(quoted), "{message}");
            assert!(
                !message.contains("u32") && !message.contains("u64"),
                "{message}"
            );
        }
    }

    #[test]
    fn only_json_content_types_are_json() {
        let declared = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
            }
            is_json(&headers)
        };
        for json in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/vnd.api+json",
        ] {
            assert!(declared(Some(json)), "{json}");
        }
        for other in [
            None,
            Some("application/x-www-form-urlencoded"),
            Some("text/plain"),
            Some("text/json"),
            Some("application/jsonx"),
            Some("json"),
        ] {
            assert!(!declared(other), "{other:?}");
        }
    }

    #[test]
    fn malformed_json_has_no_param() {
        let (message, param) = error_of("{not json");
        assert_eq!(param, None);
        assert!(message.contains("line 1"), "{message}");
    }
}
