//! Per-request bounds through the routes, JSON-only bodies, `/tokenize` under admission and
//! the shared deep health probe.

use std::sync::atomic::Ordering;

use serde_json::json;

use super::*;
use crate::limits::RequestLimits;

fn bounded(script: Script, max_concurrent: usize) -> (axum::Router, AppState, Arc<FakeBackend>) {
    let backend = FakeBackend::new(script);
    let config = HandlerConfig {
        request_limits: RequestLimits {
            max_stop_sequence_length: 4,
            max_stop_token_ids: 2,
            max_logit_bias: 1,
            max_tools: 1,
            max_choices: 4,
            ..RequestLimits::default()
        },
        ..handler_config(max_concurrent)
    };
    let state = test_state(Arc::clone(&backend) as Arc<dyn Backend>, config);
    (app(state.clone()), state, backend)
}

/// The parameter an error names, in either shape (native errors name it in the message).
fn named_param(reply: &Reply) -> String {
    let body = reply.json();
    match &body["error"] {
        Value::String(message) => message.clone(),
        error => error["param"].as_str().unwrap_or_default().to_owned(),
    }
}

fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}})
}

#[tokio::test]
async fn each_input_over_its_bound_is_refused_naming_it_before_reaching_the_engine() {
    let (app, _, backend) = bounded(Script::Tokens(ids("ok"), FinishReason::Length), 8);
    let chat = json!([{"role": "user", "content": "hi"}]);
    let long_ids: Vec<u32> = vec![ids("a")[0]; MAX_INPUT_TOKENS + 1];
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "a", "stop": ["abcde"]}),
            "stop",
        ),
        (
            "/generate",
            json!({"inputs": "a", "parameters": {"stop": ["abcde"]}}),
            "`stop`",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stop_token_ids": [1, 2, 3]}),
            "stop_token_ids",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logit_bias": {"1": 1, "2": 1}}),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": chat, "tools": [tool("a"), tool("b")]}),
            "tools",
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b", "c"], "n": 2}),
            "n",
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b"], "best_of": 3}),
            "best_of",
        ),
        ("/v1/completions", json!({"prompt": "a", "n": 5}), "n"),
        (
            "/v1/chat/completions",
            json!({"messages": chat, "n": 5}),
            "n",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "min_tokens": 5, "max_tokens": 2}),
            "min_tokens",
        ),
    ];
    for (path, body, param) in cases {
        let reply = post(&app, path, &body.to_string()).await;
        assert!(
            reply.status.is_client_error(),
            "{path} {body}: {}",
            reply.body
        );
        assert!(
            named_param(&reply).contains(param),
            "{path} {body}: {}",
            reply.body
        );
    }
    let echo = json!({"prompt": long_ids, "echo": true, "max_tokens": 1});
    let reply = post(&app, "/v1/completions", &echo.to_string()).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "context_length_exceeded");
    assert!(backend.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn inputs_at_their_bounds_are_served() {
    let (app, _, backend) = bounded(Script::Tokens(ids("ok"), FinishReason::Length), 8);
    let body = json!({
        "prompt": ["a", "b"], "n": 2, "stop": ["abcd"], "stop_token_ids": [1, 2],
        "logit_bias": {"1": 1}
    });
    let reply = post(&app, "/v1/completions", &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(backend.requests.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn speculate_over_the_servers_bound_is_refused_and_within_it_reaches_the_engine() {
    let (app, _, backend) = bounded(Script::Tokens(ids("ok"), FinishReason::Length), 8);
    let chat = json!([{"role": "user", "content": "hi"}]);
    // The server runs without --speculate: 0 is the most drafts a request may ask for.
    let over = [
        (
            "/generate",
            json!({"inputs": "a", "parameters": {"speculate": 1}}),
        ),
        ("/v1/completions", json!({"prompt": "a", "speculate": 1})),
        (
            "/v1/chat/completions",
            json!({"messages": chat, "speculate": 1}),
        ),
    ];
    for (path, body) in over {
        let reply = post(&app, path, &body.to_string()).await;
        assert!(reply.status.is_client_error(), "{path}: {}", reply.body);
        let named = named_param(&reply);
        assert!(named.contains("speculate"), "{path}: {}", reply.body);
        if path == "/generate" {
            assert!(named.contains("from 0 to 0, got 1"), "{}", reply.body);
        }
    }
    assert!(backend.requests.lock().unwrap().is_empty());
    let bodies = [
        (
            "/generate",
            json!({"inputs": "a", "parameters": {"speculate": 0}}),
        ),
        ("/v1/completions", json!({"prompt": "a", "speculate": 0})),
        (
            "/v1/chat/completions",
            json!({"messages": chat, "speculate": 0}),
        ),
        ("/v1/completions", json!({"prompt": "a"})),
    ];
    for (path, body) in bodies {
        let reply = post(&app, path, &body.to_string()).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
    }
    let asked: Vec<_> = backend
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|request| request.max_drafts)
        .collect();
    assert_eq!(asked, [Some(0), Some(0), Some(0), None]);
}

#[tokio::test]
async fn json_routes_refuse_bodies_not_sent_as_json_with_415_in_their_shape() {
    let app = test_app(ok_backend(), 8);
    let routes = [
        ("/generate", r#"{"inputs": "a"}"#),
        ("/generate_stream", r#"{"inputs": "a"}"#),
        ("/tokenize", r#"{"inputs": "a"}"#),
        ("/v1/completions", r#"{"prompt": "a"}"#),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "a"}]}"#,
        ),
    ];
    for (path, body) in routes {
        for content_type in [
            None,
            Some("application/x-www-form-urlencoded"),
            Some("text/plain"),
        ] {
            let mut request = Request::post(path);
            if let Some(content_type) = content_type {
                request = request.header("content-type", content_type);
            }
            let reply = send(&app, request.body(Body::from(body)).unwrap()).await;
            assert_eq!(
                reply.status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{path} {content_type:?}"
            );
            let error = reply.json();
            let kind = if path.starts_with("/v1/") {
                &error["error"]["type"]
            } else {
                &error["error_type"]
            };
            assert!(["invalid_request_error", "validation"].contains(&kind.as_str().unwrap()));
        }
        let typed = Request::post(path)
            .header("content-type", "application/json; charset=utf-8")
            .body(Body::from(body))
            .unwrap();
        assert_eq!(send(&app, typed).await.status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn tokenize_takes_an_admission_permit_and_is_refused_while_draining() {
    let (app, state, _) = bounded(Script::Hold(vec![]), 1);
    let held = app
        .clone()
        .oneshot(post_request("/generate_stream", r#"{"inputs": "a"}"#))
        .await
        .unwrap();
    let full = post(&app, "/tokenize", r#"{"inputs": "a"}"#).await;
    assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS, "{}", full.body);
    drop(held);
    assert_eq!(
        post(&app, "/tokenize", r#"{"inputs": "a"}"#).await.status,
        StatusCode::OK
    );
    state.draining.start();
    let draining = post(&app, "/tokenize", r#"{"inputs": "a"}"#).await;
    assert_eq!(
        draining.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        draining.body
    );
}

#[tokio::test]
async fn a_large_input_is_tokenized_with_offsets_matching_its_characters() {
    let app = test_app(ok_backend(), 8);
    let text = "héllo wörld ".repeat(2000);
    let body = json!({ "inputs": text }).to_string();
    let tokens = post(&app, "/tokenize", &body).await.json();
    let tokens = tokens.as_array().unwrap();
    let characters: Vec<char> = text.chars().collect();
    for token in tokens {
        let (start, stop) = (
            token["start"].as_u64().unwrap(),
            token["stop"].as_u64().unwrap(),
        );
        let span: String = characters[start as usize..stop as usize].iter().collect();
        assert_eq!(token["text"], span.as_str());
    }
    let expected = testing::tokenizer().encode(text.as_str(), true).unwrap();
    assert_eq!(tokens.len(), expected.get_ids().len());
}

#[tokio::test]
async fn concurrent_deep_probes_share_one_forward() {
    let backend = ok_backend();
    let app = test_app(Arc::clone(&backend), 8);
    let probes = (0..50).map(|_| get(&app, "/health?deep=true"));
    for reply in futures::future::join_all(probes).await {
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(backend.deep_probes.load(Ordering::SeqCst), 1);
}
