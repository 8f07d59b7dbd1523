//! Hostile input: each body gets a 4xx in its route's shape with a precise message, and the
//! server answers the next valid request as before.

use super::*;

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

fn app_ok() -> (axum::Router, AppState) {
    let backend = FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length));
    // Room for the 100k-message body, so it is refused for its tokens rather than its size.
    let config = HandlerConfig {
        payload_limit: 8 << 20,
        ..handler_config(4)
    };
    let state = test_state(backend, config);
    (app(state.clone()), state)
}

fn nested(depth: usize) -> String {
    format!(
        r#"{{"prompt": {}"a"{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

fn many_messages(count: usize) -> String {
    let message = r#"{"role": "user", "content": "a"},"#;
    let mut body = String::from(r#"{"messages": ["#);
    body.push_str(&message.repeat(count));
    body.pop();
    body.push_str("]}");
    body
}

/// The message of an error reply in either shape.
fn message(reply: &Reply) -> String {
    let body = reply.json();
    match &body["error"] {
        Value::String(text) => text.clone(),
        error => error["message"].as_str().unwrap_or_default().to_owned(),
    }
}

async fn assert_refused(app: &axum::Router, path: &str, body: Vec<u8>, named: &str) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let reply = send(app, request).await;
    assert!(
        reply.status.is_client_error(),
        "{path} {named}: {} {}",
        reply.status,
        reply.body
    );
    assert!(
        reply.content_type.starts_with("application/json"),
        "{path} {named}"
    );
    let text = message(&reply);
    assert!(text.contains(named), "{path}: `{named}` not in {text}");
}

#[tokio::test]
async fn malformed_bodies_are_refused_precisely() {
    let (app, _) = app_ok();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            COMPLETIONS,
            b"{\"prompt\": \"\xff\xfe\"}".to_vec(),
            "invalid unicode",
        ),
        (
            "/generate",
            b"{\"inputs\": \"a\xc3\"}".to_vec(),
            "invalid unicode",
        ),
        (COMPLETIONS, nested(10_000).into_bytes(), "recursion limit"),
        (
            CHAT,
            "[".repeat(100_000).into_bytes(),
            "the body must be an object, got an array",
        ),
        (
            CHAT,
            format!(r#"{{"messages": {}"#, "[".repeat(100_000)).into_bytes(),
            "messages[0]",
        ),
        (
            COMPLETIONS,
            br#"{"prompt": "a", "temperature": NaN}"#.to_vec(),
            "expected value",
        ),
        (
            COMPLETIONS,
            br#"{"prompt": "a", "top_p": Infinity}"#.to_vec(),
            "expected value",
        ),
        (
            COMPLETIONS,
            br#"{"prompt": "a", "max_tokens": 1e400}"#.to_vec(),
            "number out of range",
        ),
        (
            COMPLETIONS,
            br#"{"prompt": "a", "max_tokens": 18446744073709551616}"#.to_vec(),
            "max_tokens",
        ),
        (
            COMPLETIONS,
            br#"{"prompt": "a", "seed": 1.5}"#.to_vec(),
            "seed",
        ),
        (CHAT, br#"{"messages": "hi"}"#.to_vec(), "messages"),
        (
            CHAT,
            br#"{"messages": [{"role": "user", "content": 5}]}"#.to_vec(),
            "messages",
        ),
        (
            COMPLETIONS,
            br#"{"prompt": [1, 2, 4000000000]}"#.to_vec(),
            "prompt",
        ),
        (
            "/generate",
            br#"{"inputs": "a", "parameters": []}"#.to_vec(),
            "parameters",
        ),
        (COMPLETIONS, b"".to_vec(), "EOF"),
        (COMPLETIONS, b"null".to_vec(), "must be an object, got null"),
    ];
    for (path, body, named) in cases {
        assert_refused(&app, path, body, named).await;
    }
}

#[tokio::test]
async fn requests_beyond_the_limits_are_refused_with_the_limit() {
    let (app, _) = app_ok();
    let input_limit = MAX_INPUT_TOKENS.to_string();
    let long_prompt = format!(r#"{{"prompt": "{}"}}"#, "a ".repeat(10 * MAX_TOTAL_TOKENS));
    let cases: Vec<(&str, String, &str)> = vec![
        (COMPLETIONS, long_prompt, &input_limit),
        (
            COMPLETIONS,
            r#"{"prompt": "a", "max_tokens": 100000}"#.into(),
            "max_tokens",
        ),
        (
            "/generate",
            r#"{"inputs": "a", "parameters": {"max_new_tokens": 4294967295}}"#.into(),
            "max_new_tokens",
        ),
        (CHAT, r#"{"messages": []}"#.into(), "messages"),
        (
            CHAT,
            r#"{"messages": [{"role": "wizard", "content": "a"}]}"#.into(),
            "messages[0].role",
        ),
        (
            COMPLETIONS,
            r#"{"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}"#.into(),
            "stop",
        ),
        (
            COMPLETIONS,
            r#"{"prompt": "a", "stop": [""]}"#.into(),
            "stop",
        ),
        (
            COMPLETIONS,
            r#"{"prompt": "a", "logit_bias": {"abc": 1}}"#.into(),
            "logit_bias",
        ),
        (
            COMPLETIONS,
            r#"{"prompt": "a", "logit_bias": {"-1": 1}}"#.into(),
            "logit_bias",
        ),
        (
            COMPLETIONS,
            r#"{"prompt": "a", "logit_bias": {"5": 1000}}"#.into(),
            "logit_bias",
        ),
        (
            COMPLETIONS,
            r#"{"prompt": "a", "temperature": -1}"#.into(),
            "temperature",
        ),
        (COMPLETIONS, r#"{"prompt": "a", "n": 1000000}"#.into(), "n"),
    ];
    for (path, body, named) in cases {
        assert_refused(&app, path, body.into_bytes(), named).await;
    }
}

#[tokio::test]
async fn a_hundred_thousand_messages_are_refused_and_the_server_keeps_serving() {
    let (app, state) = app_ok();
    let body = many_messages(100_000);
    assert!(body.len() < state.config.payload_limit);
    assert_refused(&app, CHAT, body.into_bytes(), "tokens").await;
    assert_eq!(
        state.in_flight(),
        0,
        "refused requests hold no admission slot"
    );
    let reply = post(
        &app,
        CHAT,
        r#"{"messages": [{"role": "user", "content": "a"}]}"#,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}
