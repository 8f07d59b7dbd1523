use serde_json::Value;

use super::*;

fn app_ok() -> axum::Router {
    test_app(
        FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length)),
        4,
    )
}

/// Asserts the OpenAI error shape and returns `error`.
fn openai_error(reply: &Reply, status: StatusCode) -> Value {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert!(reply.content_type.starts_with("application/json"));
    let error = reply.json()["error"].clone();
    for key in ["message", "type", "param", "code"] {
        assert!(error.get(key).is_some(), "missing {key}: {}", reply.body);
    }
    error
}

/// Asserts TGI's error shape and returns `(error, error_type)`.
fn native_error(reply: &Reply, status: StatusCode) -> (String, String) {
    assert_eq!(reply.status, status, "{}", reply.body);
    let body = reply.json();
    (
        body["error"].as_str().unwrap().to_owned(),
        body["error_type"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn malformed_json_is_an_error_in_the_route_shape() {
    let app = app_ok();
    let reply = post(&app, "/v1/chat/completions", "{not json").await;
    let error = openai_error(&reply, StatusCode::BAD_REQUEST);
    assert_eq!(error["type"], "invalid_request_error");
    let reply = post(&app, "/generate", "{not json").await;
    let (_, error_type) = native_error(&reply, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(error_type, "validation");
}

#[tokio::test]
async fn wrong_field_types_name_the_field() {
    let reply = post(
        &app_ok(),
        "/v1/completions",
        r#"{"prompt": "a", "seed": -1}"#,
    )
    .await;
    let error = openai_error(&reply, StatusCode::BAD_REQUEST);
    assert_eq!(error["param"], "seed");
}

#[tokio::test]
async fn missing_messages_is_400_naming_messages() {
    let reply = post(&app_ok(), "/v1/chat/completions", r#"{"model": "m"}"#).await;
    let error = openai_error(&reply, StatusCode::BAD_REQUEST);
    assert_eq!(error["param"], "messages");
    assert_eq!(error["message"], "`messages` is required");
    let reply = post(&app_ok(), "/v1/chat/completions", r#"{"messages": []}"#).await;
    assert_eq!(
        openai_error(&reply, StatusCode::BAD_REQUEST)["param"],
        "messages"
    );
}

#[tokio::test]
async fn negative_or_zero_max_tokens_is_rejected() {
    for value in ["-1", "0"] {
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "a"}}], "max_tokens": {value}}}"#
        );
        let reply = post(&app_ok(), "/v1/chat/completions", &body).await;
        let error = openai_error(&reply, StatusCode::BAD_REQUEST);
        assert_eq!(error["param"], "max_tokens");
    }
    let body = r#"{"inputs": "a", "parameters": {"max_new_tokens": -1}}"#;
    let (message, _) = native_error(
        &post(&app_ok(), "/generate", body).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert!(message.contains("`max_new_tokens`"), "{message}");
}

#[tokio::test]
async fn prompt_too_long_reports_both_numbers() {
    let prompt = "x".repeat(MAX_INPUT_TOKENS + 10);
    let body = format!(r#"{{"prompt": "{prompt}"}}"#);
    let reply = post(&app_ok(), "/v1/completions", &body).await;
    let error = openai_error(&reply, StatusCode::BAD_REQUEST);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&(MAX_INPUT_TOKENS + 11).to_string()),
        "{message}"
    );
    assert!(message.contains(&MAX_INPUT_TOKENS.to_string()), "{message}");
    assert_eq!(error["code"], "context_length_exceeded");
}

#[tokio::test]
async fn choice_counts_outside_one_to_sixteen_are_rejected_by_name() {
    for n in [0, 17] {
        let body = format!(r#"{{"messages": [{{"role": "user", "content": "a"}}], "n": {n}}}"#);
        let error = openai_error(
            &post(&app_ok(), "/v1/chat/completions", &body).await,
            StatusCode::BAD_REQUEST,
        );
        assert_eq!(error["param"], "n");
    }
}

#[tokio::test]
async fn unimplemented_parameters_are_rejected_by_name() {
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_object"}}"#,
            "response_format",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}"#,
            "tools[0]",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "suffix": "b"}"#,
            "suffix",
        ),
    ];
    for (path, body, param) in cases {
        let error = openai_error(&post(&app_ok(), path, body).await, StatusCode::BAD_REQUEST);
        assert_eq!(error["param"], param, "{body}");
    }
    let body = r#"{"inputs": "a", "parameters": {"watermark": true}}"#;
    let (message, error_type) = native_error(
        &post(&app_ok(), "/generate", body).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert!(message.contains("`watermark`"), "{message}");
    assert!(message.contains("Kirchenbauer"), "{message}");
    assert_eq!(error_type, "validation");
    let body = r#"{"inputs": "a", "parameters": {"adapter_id": "lora-1"}}"#;
    let (message, _) = native_error(
        &post(&app_ok(), "/generate", body).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert!(message.contains("`adapter_id` is `lora-1`"), "{message}");
    assert!(message.contains("no LoRA adapters are loaded"), "{message}");
}

#[tokio::test]
async fn neutral_values_of_unimplemented_parameters_are_accepted() {
    let body = r#"{"messages": [{"role": "user", "content": "a"}], "presence_penalty": 0,
                   "logprobs": false, "user": "u1", "model": "anything"}"#;
    assert_eq!(
        post(&app_ok(), "/v1/chat/completions", body).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn requests_over_max_concurrent_get_429_overloaded() {
    let app = test_app(FakeBackend::new(Script::Hold(ids("a"))), 1);
    let first = app
        .clone()
        .oneshot(post_request(
            "/v1/completions",
            r#"{"prompt": "a", "stream": true}"#,
        ))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let reply = post(&app, "/v1/completions", r#"{"prompt": "b"}"#).await;
    assert_eq!(
        openai_error(&reply, StatusCode::TOO_MANY_REQUESTS)["type"],
        "overloaded"
    );
    let reply = post(&app, "/generate", r#"{"inputs": "b"}"#).await;
    assert_eq!(
        native_error(&reply, StatusCode::TOO_MANY_REQUESTS).1,
        "overloaded"
    );
    drop(first);
    let reply = post(
        &app,
        "/generate",
        r#"{"inputs": "b", "parameters": {"stop": ["a"]}}"#,
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "a dropped stream frees its permit"
    );
}

#[tokio::test]
async fn shard_failure_is_424_native_and_500_openai() {
    let failure = SchedulerError::ShardFailed("rank 1 crashed".into());
    let app = test_app(FakeBackend::new(Script::Refuse(failure)), 4);
    let (message, error_type) = native_error(
        &post(&app, "/generate", r#"{"inputs": "a"}"#).await,
        StatusCode::FAILED_DEPENDENCY,
    );
    assert!(message.contains("rank 1 crashed"));
    assert_eq!(error_type, "generation");
    let reply = post(&app, "/v1/completions", r#"{"prompt": "a"}"#).await;
    assert_eq!(
        openai_error(&reply, StatusCode::INTERNAL_SERVER_ERROR)["type"],
        "server_error"
    );
}

#[tokio::test]
async fn shutting_down_is_503() {
    let app = test_app(
        FakeBackend::new(Script::Refuse(SchedulerError::ShuttingDown)),
        4,
    );
    let reply = post(&app, "/v1/completions", r#"{"prompt": "a"}"#).await;
    openai_error(&reply, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn mid_stream_errors_become_error_events() {
    let failure = SchedulerError::ShardFailed("step failed".into());
    let app = test_app(FakeBackend::new(Script::FailAfter(ids("ab"), failure)), 4);
    let reply = post(
        &app,
        "/v1/completions",
        r#"{"prompt": "a", "stream": true}"#,
    )
    .await;
    let events = reply.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], "server_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("step failed"));

    let reply = post(&app, "/generate_stream", r#"{"inputs": "a"}"#).await;
    let last = reply.json_events().pop().unwrap();
    assert_eq!(last["error_type"], "generation");
    assert!(!reply.body.contains("[DONE]"));
}

#[tokio::test]
async fn unknown_routes_and_methods_do_not_reach_handlers() {
    assert_eq!(get(&app_ok(), "/nope").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        get(&app_ok(), "/generate").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn oversized_bodies_get_413_in_the_route_shape() {
    let prompt = "x".repeat(super::PAYLOAD_LIMIT);
    let body = format!(r#"{{"prompt": "{prompt}"}}"#);
    let reply = post(&app_ok(), "/v1/completions", &body).await;
    let error = openai_error(&reply, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains(&super::PAYLOAD_LIMIT.to_string()),
        "{error}"
    );
    let body = format!(r#"{{"inputs": "{prompt}"}}"#);
    let (message, error_type) = native_error(
        &post(&app_ok(), "/generate", &body).await,
        StatusCode::PAYLOAD_TOO_LARGE,
    );
    assert!(message.contains("payload limit"), "{message}");
    assert_eq!(error_type, "validation");
}
