//! API keys: every route but the probes, the metrics scrape and the API description requires one.

use std::io::Write;

use axum::http::header;

use super::*;
use crate::http::ApiKeys;

const FIRST_KEY: &str = "sk-tandem-First";
const SECOND_KEY: &str = "sk-tandem-second";

/// (method, path, body) of every protected route.
const PROTECTED: [(&str, &str, &str); 8] = [
    ("POST", "/generate", r#"{"inputs": "a"}"#),
    ("POST", "/", r#"{"inputs": "a"}"#),
    ("POST", "/tokenize", r#"{"inputs": "a"}"#),
    ("POST", "/generate_stream", r#"{"inputs": "a"}"#),
    (
        "POST",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "a"}]}"#,
    ),
    ("POST", "/v1/completions", r#"{"prompt": "a"}"#),
    ("GET", "/v1/models", ""),
    ("GET", "/info", ""),
];

fn keyed_app(keys: Option<ApiKeys>) -> (axum::Router, Arc<FakeBackend>) {
    let backend = FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length));
    let state = test_state(backend.clone(), handler_config(8)).with_api_keys(keys);
    (app(state), backend)
}

fn inline_keys() -> ApiKeys {
    let keys = [FIRST_KEY.to_owned(), SECOND_KEY.to_owned()];
    ApiKeys::load(&keys, &[]).unwrap().unwrap()
}

fn request(method: &str, path: &str, body: &str, authorization: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(value) = authorization {
        builder = builder.header(header::AUTHORIZATION, value);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

/// Sends `authorization` to every protected route; returns (path, status, body, WWW-Authenticate).
async fn every_route(
    app: &axum::Router,
    authorization: Option<&str>,
) -> Vec<(&'static str, StatusCode, Value, Option<String>)> {
    let mut replies = Vec::new();
    for (method, path, body) in PROTECTED {
        let response = app
            .clone()
            .oneshot(request(method, path, body, authorization))
            .await
            .unwrap();
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .map(|value| value.to_str().unwrap().to_owned());
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        replies.push((path, status, json, challenge));
    }
    replies
}

/// Every protected route answered 401 with `message`, in its family's shape.
fn assert_refused(replies: &[(&str, StatusCode, Value, Option<String>)], message: &str) {
    for (path, status, body, challenge) in replies {
        assert_eq!(*status, StatusCode::UNAUTHORIZED, "{path}: {body}");
        assert_eq!(challenge.as_deref(), Some("Bearer"), "{path}");
        if path.starts_with("/v1/") {
            assert_eq!(body["error"]["message"], message, "{path}");
            assert_eq!(body["error"]["type"], "invalid_request_error", "{path}");
            assert_eq!(body["error"]["code"], "invalid_api_key", "{path}");
        } else {
            assert_eq!(body["error"], message, "{path}");
            assert_eq!(body["error_type"], "unauthorized", "{path}");
        }
    }
}

#[tokio::test]
async fn a_missing_key_is_refused_on_every_protected_route() {
    let (app, backend) = keyed_app(Some(inline_keys()));
    let replies = every_route(&app, None).await;
    assert_refused(
        &replies,
        "missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
    );
    assert!(backend.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn wrong_truncated_and_case_altered_keys_are_refused_without_being_echoed() {
    let (app, backend) = keyed_app(Some(inline_keys()));
    let altered = format!("Bearer {}", FIRST_KEY.to_lowercase());
    let truncated = format!("Bearer {}", &FIRST_KEY[..FIRST_KEY.len() - 1]);
    let not_bearer = format!("Basic {FIRST_KEY}");
    for authorization in [
        "Bearer sk-wrong",
        altered.as_str(),
        truncated.as_str(),
        not_bearer.as_str(),
        "Bearer",
        FIRST_KEY,
    ] {
        let replies = every_route(&app, Some(authorization)).await;
        assert_refused(&replies, "invalid API key");
        for (_, _, body, _) in &replies {
            assert!(!body.to_string().contains("sk-"), "{body}");
        }
    }
    assert!(backend.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn either_key_opens_every_route_and_the_scheme_is_case_insensitive() {
    let (app, _) = keyed_app(Some(inline_keys()));
    let first = format!("Bearer {FIRST_KEY}");
    let second = format!("bearer {SECOND_KEY}");
    for authorization in [first.as_str(), second.as_str()] {
        for (path, status, body, _) in every_route(&app, Some(authorization)).await {
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
        }
    }
}

#[tokio::test]
async fn probes_metrics_and_the_api_description_stay_open() {
    let (app, _) = keyed_app(Some(inline_keys()));
    for path in ["/health", "/ready", "/metrics", "/openapi.json", "/docs/"] {
        assert_eq!(get(&app, path).await.status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn without_keys_every_route_is_open() {
    let (app, _) = keyed_app(None);
    for (path, status, body, _) in every_route(&app, None).await {
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
}

#[tokio::test]
async fn a_reloaded_key_file_takes_effect_at_once() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "sk-old").unwrap();
    let keys = ApiKeys::load(&[], &[file.path().to_path_buf()])
        .unwrap()
        .unwrap();
    let (app, _) = keyed_app(Some(keys.clone()));
    let models = |key: &str| request("GET", "/v1/models", "", Some(&format!("Bearer {key}")));
    assert_eq!(send(&app, models("sk-old")).await.status, StatusCode::OK);
    std::fs::write(file.path(), "sk-new\n").unwrap();
    assert_eq!(keys.reload().unwrap(), 1);
    assert_eq!(
        send(&app, models("sk-old")).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(send(&app, models("sk-new")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn every_generation_carries_its_keys_id_and_file_weight_to_the_scheduler() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "sk-light\nsk-heavy weight=3").unwrap();
    let keys = ApiKeys::load(&[], &[file.path().to_path_buf()])
        .unwrap()
        .unwrap();
    let (app, backend) = keyed_app(Some(keys));
    let generating = [
        ("/generate", r#"{"inputs": "a"}"#),
        ("/generate_stream", r#"{"inputs": "a"}"#),
        ("/v1/completions", r#"{"prompt": "a"}"#),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "a"}]}"#,
        ),
        ("/v1/responses", r#"{"input": "a"}"#),
        (
            "/v1/messages",
            r#"{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "a"}]}"#,
        ),
    ];
    for (path, body) in generating {
        let reply = send(&app, request("POST", path, body, Some("Bearer sk-heavy"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {:?}", reply.body);
    }
    let heavy = crate::tenant::Tenant {
        key: crate::tenant::KeyId::of(b"sk-heavy"),
        weight: std::num::NonZeroU32::new(3).unwrap(),
        name: None,
    };
    let requests = backend.requests.lock().unwrap();
    assert_eq!(requests.len(), generating.len());
    assert!(requests.iter().all(|request| request.tenant == Some(heavy)));
}

#[tokio::test]
async fn without_keys_generations_carry_no_tenant() {
    let (app, backend) = keyed_app(None);
    let reply = send(
        &app,
        request("POST", "/v1/completions", r#"{"prompt": "a"}"#, None),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let requests = backend.requests.lock().unwrap();
    assert!(requests.iter().all(|request| request.tenant.is_none()));
    assert_eq!(requests.len(), 1);
}
