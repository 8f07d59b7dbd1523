//! The Anthropic routes through `app()` with the scripted fake backend.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::http::tests::{
    handler_config, ids, last_prompt, ok_backend, post, post_request, send, test_app, test_state,
    FakeBackend, Script,
};
use crate::http::{app, ApiKeys};
use crate::scheduler::{FinishReason, SchedulerError};

const MESSAGES: &str = "/v1/messages";
const HELLO: &str =
    r#"{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}"#;

/// The `event:` names of an SSE body, in order.
fn event_names(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect()
}

fn assert_anthropic_error(body: &Value, error_type: &str) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], error_type, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}

#[tokio::test]
async fn a_message_answers_with_text_usage_and_the_stop_reason() {
    let backend = FakeBackend::new(Script::Tokens(ids("Hello!"), FinishReason::Eos));
    let app = test_app(backend.clone(), 4);
    let reply = post(&app, MESSAGES, HELLO).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert!(body["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (&body["type"], &body["role"], &body["model"]),
        (&json!("message"), &json!("assistant"), &json!("test-model"))
    );
    assert_eq!(body["content"], json!([{"type": "text", "text": "Hello!"}]));
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["stop_sequence"], Value::Null);
    // The fake's prefix cache served half the prompt.
    let prompt_tokens = backend.requests.lock().unwrap()[0].input_ids.len();
    assert_eq!(
        body["usage"],
        json!({"input_tokens": prompt_tokens - prompt_tokens / 2, "output_tokens": ids("Hello!").len(),
               "cache_creation_input_tokens": 0, "cache_read_input_tokens": prompt_tokens / 2})
    );
    assert_eq!(last_prompt(&backend), "<|user|>Hi\n<|assistant|>");
}

#[tokio::test]
async fn a_stop_sequence_and_the_length_limit_are_reported() {
    let backend = FakeBackend::new(Script::Tokens(ids("one END two"), FinishReason::Length));
    let app = test_app(backend, 4);
    let body = r#"{"max_tokens": 20, "stop_sequences": ["xyz", "END"], "messages": [{"role": "user", "content": "Hi"}]}"#;
    let reply = post(&app, MESSAGES, body).await.json();
    assert_eq!(reply["content"], json!([{"type": "text", "text": "one "}]));
    assert_eq!(reply["stop_reason"], "stop_sequence");
    assert_eq!(reply["stop_sequence"], "END");
    let long = post(&test_app(ok_backend(), 4), MESSAGES, HELLO)
        .await
        .json();
    assert_eq!(long["stop_reason"], "max_tokens");
}

#[tokio::test]
async fn a_stream_sends_anthropics_named_event_sequence() {
    let backend = FakeBackend::new(Script::Tokens(ids("Hey"), FinishReason::Eos));
    let app = test_app(backend, 4);
    let body =
        r#"{"max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "Hi"}]}"#;
    let reply = post(&app, MESSAGES, body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.content_type.starts_with("text/event-stream"));
    assert_eq!(
        event_names(&reply.body),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(!reply.body.contains("[DONE]"));
    let events = reply.json_events();
    let text: String = events
        .iter()
        .filter_map(|event| event.pointer("/delta/text").and_then(Value::as_str))
        .collect();
    assert_eq!(text, "Hey");
    assert_eq!(events[6]["delta"]["stop_reason"], "end_turn");
    assert_eq!(events[6]["usage"]["output_tokens"], ids("Hey").len());
}

#[tokio::test]
async fn a_failure_mid_stream_ends_it_with_an_error_event() {
    let failure = SchedulerError::ShardFailed("boom".into());
    let backend = FakeBackend::new(Script::FailAfter(ids("a"), failure));
    let app = test_app(backend, 4);
    let body =
        r#"{"max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "Hi"}]}"#;
    let reply = post(&app, MESSAGES, body).await;
    let names = event_names(&reply.body);
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"error"));
    let error = reply.json_events().pop().unwrap();
    assert_anthropic_error(&error, "api_error");
}

#[tokio::test]
async fn invalid_requests_get_anthropic_errors_and_reach_no_backend() {
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    let cases = [
        (
            r#"{"messages": [{"role": "user", "content": "Hi"}]}"#,
            "max_tokens",
        ),
        (
            r#"{"max_tokens": 0, "messages": [{"role": "user", "content": "Hi"}]}"#,
            "max_tokens",
        ),
        (r#"{"max_tokens": 5, "messages": []}"#, "messages"),
        (
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "enabled", "budget_tokens": 0}}"#,
            "thinking.budget_tokens",
        ),
        (
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "enabled"}}"#,
            "thinking",
        ),
        (
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "sometimes"}}"#,
            "thinking",
        ),
        (
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#,
            "messages[0].content[0]",
        ),
        (
            r#"{"max_tokens": 5, "temperature": -1, "messages": [{"role": "user", "content": "Hi"}]}"#,
            "temperature",
        ),
        (
            r#"{"max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "Hi"}]}"#,
            "temperature",
        ),
        (
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "tools": [{"name": "f", "input_schema": {"type": "object"}}]}"#,
            "tools",
        ),
        (r#"{"max_tokens": 5, "messages": "Hi"}"#, "messages"),
        (
            r#"{"max_tokens": 5, "metadata": "u1", "messages": [{"role": "user", "content": "Hi"}]}"#,
            "metadata",
        ),
        (
            r#"{"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]}"#,
            "messages[0].content[0]",
        ),
        ("{not json", ""),
    ];
    for (body, param) in cases {
        let reply = post(&app, MESSAGES, body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            reply.body
        );
        let error = reply.json();
        assert_anthropic_error(&error, "invalid_request_error");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(param), "{body}: {message}");
    }
    let plain = Request::post(MESSAGES).body(Body::from(HELLO)).unwrap();
    let reply = send(&app, plain).await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_anthropic_error(&reply.json(), "invalid_request_error");
    assert!(backend.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_prompt_over_the_length_limit_is_refused() {
    let long = "word ".repeat(200);
    let body = json!({"max_tokens": 5, "messages": [{"role": "user", "content": long}]});
    let reply = post(&test_app(ok_backend(), 4), MESSAGES, &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_anthropic_error(&reply.json(), "invalid_request_error");
}

#[tokio::test]
async fn a_full_server_answers_429_in_anthropic_shape() {
    let backend = FakeBackend::new(Script::Hold(ids("a")));
    let app = test_app(backend, 1);
    let stream =
        r#"{"max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "Hi"}]}"#;
    let held = app
        .clone()
        .oneshot(post_request(MESSAGES, stream))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let reply = post(&app, MESSAGES, HELLO).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_anthropic_error(&reply.json(), "rate_limit_error");
    drop(held);
}

#[tokio::test]
async fn count_tokens_counts_what_a_generation_would_see() {
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    let conversation =
        r#""system": "Be brief.", "messages": [{"role": "user", "content": "Hi there"}]"#;
    let counted = post(
        &app,
        "/v1/messages/count_tokens",
        &format!("{{{conversation}}}"),
    )
    .await;
    assert_eq!(counted.status, StatusCode::OK, "{}", counted.body);
    assert!(
        backend.requests.lock().unwrap().is_empty(),
        "counting generates nothing"
    );
    post(
        &app,
        MESSAGES,
        &format!(r#"{{"max_tokens": 2, {conversation}}}"#),
    )
    .await;
    let generated = backend.requests.lock().unwrap()[0].input_ids.len();
    assert_eq!(counted.json(), json!({"input_tokens": generated}));
    let refused = post(&app, "/v1/messages/count_tokens", r#"{"messages": []}"#).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_anthropic_error(&refused.json(), "invalid_request_error");
}

fn keyed_request(path: &str, header: Option<(&str, &str)>) -> Request<Body> {
    let mut builder = Request::post(path).header("content-type", "application/json");
    if let Some((name, value)) = header {
        builder = builder.header(name, value);
    }
    let body = if path == MESSAGES {
        HELLO
    } else {
        r#"{"prompt": "a"}"#
    };
    builder.body(Body::from(body)).unwrap()
}

#[tokio::test]
async fn x_api_key_carries_the_api_key_and_refusals_use_the_routes_shape() {
    let keys = ApiKeys::load(&["sk-anthropic".to_owned()], &[]).unwrap();
    let state = test_state(ok_backend(), handler_config(4)).with_api_keys(keys);
    let app = app(state);
    for path in [MESSAGES, "/v1/completions"] {
        let accepted = send(
            &app,
            keyed_request(path, Some(("x-api-key", "sk-anthropic"))),
        )
        .await;
        assert_eq!(accepted.status, StatusCode::OK, "{path}: {}", accepted.body);
    }
    let bearer = send(
        &app,
        keyed_request(MESSAGES, Some(("authorization", "Bearer sk-anthropic"))),
    )
    .await;
    assert_eq!(bearer.status, StatusCode::OK);
    for header in [None, Some(("x-api-key", "sk-wrong"))] {
        let refused = send(&app, keyed_request(MESSAGES, header)).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert_anthropic_error(&refused.json(), "authentication_error");
    }
    let missing = send(&app, keyed_request(MESSAGES, None)).await.json();
    assert!(missing["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-api-key"));
    let openai = send(
        &app,
        keyed_request("/v1/completions", Some(("x-api-key", "sk-wrong"))),
    )
    .await;
    assert_eq!(openai.json()["error"]["type"], "invalid_request_error");
    assert!(openai.json()["error"]["code"] == "invalid_api_key");
}

#[tokio::test]
async fn the_openapi_document_lists_both_routes_and_their_streams_end_without_done() {
    let spec = crate::http::tests::get(&test_app(ok_backend(), 4), "/openapi.json")
        .await
        .json();
    let paths = &spec["paths"];
    assert!(paths["/v1/messages/count_tokens"]["post"].is_object());
    let stream = &paths["/v1/messages"]["post"]["responses"]["200"]["content"]["text/event-stream"]
        ["schema"];
    assert!(
        stream["properties"]["data"]["contentSchema"].is_object(),
        "{stream}"
    );
    assert!(stream["properties"]["data"].get("if").is_none(), "{stream}");
}
