//! Bounded admission: 429 with `Retry-After` beyond the request or queued-token limit;
//! health probes never count as load.

use axum::http::header;

use super::*;
use crate::error::OVERLOADED_RETRY_AFTER_SECS;

/// The status, `Retry-After` and JSON body of one request.
async fn answer(app: &axum::Router, path: &str, body: &str) -> (StatusCode, Option<String>, Value) {
    let response = app.clone().oneshot(post_request(path, body)).await.unwrap();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|value| value.to_str().unwrap().to_owned());
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, serde_json::from_slice(&bytes).unwrap())
}

fn limited(
    script: Script,
    max_concurrent: usize,
    max_queued_tokens: Option<usize>,
) -> (axum::Router, AppState) {
    let config = HandlerConfig {
        max_queued_tokens,
        ..handler_config(max_concurrent)
    };
    let state = test_state(FakeBackend::new(script), config);
    (app(state.clone()), state)
}

#[tokio::test]
async fn a_full_server_answers_429_at_once_with_retry_after_in_each_shape() {
    let (app, state) = limited(Script::Hold(vec![]), 1, None);
    let held = app
        .clone()
        .oneshot(post_request("/generate_stream", r#"{"inputs": "a"}"#))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let retry = Some(OVERLOADED_RETRY_AFTER_SECS.to_string());
    let (status, retry_after, body) = answer(&app, "/v1/completions", r#"{"prompt": "b"}"#).await;
    assert_eq!(
        (status, retry_after.clone()),
        (StatusCode::TOO_MANY_REQUESTS, retry.clone())
    );
    assert_eq!(body["error"]["type"], "overloaded");
    assert_eq!(
        body["error"]["message"],
        "the server is handling its maximum of 1 concurrent requests; retry later"
    );
    let (status, retry_after, body) = answer(&app, "/generate", r#"{"inputs": "b"}"#).await;
    assert_eq!(
        (status, retry_after),
        (StatusCode::TOO_MANY_REQUESTS, retry)
    );
    assert_eq!(body["error_type"], "overloaded");
    assert_eq!(state.in_flight(), 1, "refused requests hold nothing");
    drop(held);
    assert_eq!(state.in_flight(), 0);
}

#[tokio::test]
async fn queued_tokens_beyond_the_limit_are_refused_until_the_queue_moves() {
    // Each request reserves its prompt (1 token) plus 100 new tokens; 150 fit one.
    let (app, state) = limited(Script::Hold(vec![]), 8, Some(150));
    let body = r#"{"prompt": "a", "max_tokens": 100, "stream": true}"#;
    let waiting = app
        .clone()
        .oneshot(post_request("/v1/completions", body))
        .await
        .unwrap();
    assert_eq!(waiting.status(), StatusCode::OK);
    let (status, retry_after, reply) = answer(&app, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after, Some(OVERLOADED_RETRY_AFTER_SECS.to_string()));
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("--max-queued-tokens"), "{message}");
    assert!(message.contains("at most 150 tokens"), "{message}");
    let (status, _, reply) = answer(
        &app,
        "/generate",
        r#"{"inputs": "a", "parameters": {"max_new_tokens": 100}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply["error_type"], "overloaded");
    assert_eq!(state.in_flight(), 1);
    drop(waiting);
    assert_eq!(state.in_flight(), 0);
    let again = app
        .clone()
        .oneshot(post_request("/v1/completions", body))
        .await
        .unwrap();
    assert_eq!(
        again.status(),
        StatusCode::OK,
        "a cancelled request frees its tokens"
    );
}

#[tokio::test]
async fn the_first_token_releases_a_requests_queued_tokens() {
    let (app, _) = limited(Script::Hold(ids("a")), 8, Some(150));
    let body = r#"{"prompt": "a", "max_tokens": 100, "stream": true}"#;
    let running = app
        .clone()
        .oneshot(post_request("/v1/completions", body))
        .await
        .unwrap();
    let mut stream = running.into_body();
    // Read until the first token's chunk: the request has left the queue.
    loop {
        let frame = stream.frame().await.unwrap().unwrap();
        if frame
            .data_ref()
            .is_some_and(|data| String::from_utf8_lossy(data).contains("\"text\""))
        {
            break;
        }
    }
    let second = app
        .clone()
        .oneshot(post_request("/v1/completions", body))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
}

#[tokio::test]
async fn n_choices_count_as_n_against_the_queued_tokens() {
    let (app, state) = limited(Script::Hold(vec![]), 8, Some(250));
    let two = r#"{"prompt": "a", "max_tokens": 100, "n": 2, "stream": true}"#;
    let held = app
        .clone()
        .oneshot(post_request("/v1/completions", two))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(state.in_flight(), 2);
    let (status, _, _) = answer(
        &app,
        "/v1/completions",
        r#"{"prompt": "a", "max_tokens": 100}"#,
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn health_probes_take_no_admission_slot() {
    let backend = FakeBackend::new(Script::Hold(vec![]));
    let state = test_state(backend.clone(), handler_config(1));
    let app = app(state.clone());
    let held = app
        .clone()
        .oneshot(post_request("/generate_stream", r#"{"inputs": "a"}"#))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    for path in ["/health", "/health?deep=true", "/ready"] {
        assert_eq!(get(&app, path).await.status, StatusCode::OK, "{path}");
    }
    assert_eq!(state.in_flight(), 1, "probes never count as requests");
    assert_eq!(backend.requests.lock().unwrap().len(), 1);
}
