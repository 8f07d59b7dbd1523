//! Usage names the prompt tokens the prefix cache served, on every surface, streamed or
//! not; a prompt shared by several choices counts once. The fake backend's cache serves the
//! first half of every prompt.

use axum::http::StatusCode;
use serde_json::Value;

use super::*;

/// The prompt lengths the fake backend received, in order.
fn prompt_lengths(backend: &FakeBackend) -> Vec<usize> {
    let requests = backend.requests.lock().unwrap();
    requests
        .iter()
        .map(|request| request.input_ids.len())
        .collect()
}

fn last_usage(events: &[Value]) -> Value {
    let last = events
        .iter()
        .rev()
        .find(|event| event.get("usage").is_some());
    last.map(|event| event["usage"].clone()).unwrap_or_default()
}

#[tokio::test]
async fn chat_counts_the_cached_half_of_its_one_prompt_streamed_or_not() {
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    let body = r#"{"messages": [{"role": "user", "content": "hello there"}], "n": 2}"#;
    let reply = post(&app, "/v1/chat/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let prompt = prompt_lengths(&backend)[0];
    assert!(prompt >= 4);
    let cached = &reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(cached, prompt / 2);
    let streamed = r#"{"messages": [{"role": "user", "content": "hello there"}], "n": 2,
        "stream": true, "stream_options": {"include_usage": true}}"#;
    let events = post(&app, "/v1/chat/completions", streamed)
        .await
        .json_events();
    let usage = last_usage(&events);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], prompt / 2);
    assert_eq!(usage["prompt_tokens"], prompt);
}

#[tokio::test]
async fn completions_add_the_cached_tokens_of_each_prompt_once() {
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    let body = r#"{"prompt": ["one two three four", "five six"], "n": 2}"#;
    let reply = post(&app, "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let lengths = prompt_lengths(&backend);
    assert_eq!(lengths.len(), 4);
    let expected = lengths[0] / 2 + lengths[2] / 2;
    assert_ne!(lengths[0], lengths[2]);
    let usage = &reply.json()["usage"];
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], expected);
    let streamed = r#"{"prompt": ["one two three four", "five six"], "n": 2, "stream": true,
        "stream_options": {"include_usage": true}}"#;
    let events = post(&app, "/v1/completions", streamed).await.json_events();
    assert_eq!(
        last_usage(&events)["prompt_tokens_details"]["cached_tokens"],
        expected
    );
}

#[tokio::test]
async fn responses_fill_input_tokens_details_streamed_or_not() {
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    let reply = post(&app, "/v1/responses", r#"{"input": "hello there"}"#).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let prompt = prompt_lengths(&backend)[0];
    let usage = &reply.json()["usage"];
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], prompt / 2);
    let streamed = r#"{"input": "hello there", "stream": true}"#;
    let events = post(&app, "/v1/responses", streamed).await.json_events();
    // The fake stops at its length limit: the response ends incomplete, with its usage.
    let completed = events
        .iter()
        .find(|event| event["type"] == "response.incomplete")
        .expect("a response.incomplete event");
    let details = &completed["response"]["usage"]["input_tokens_details"];
    assert_eq!(details["cached_tokens"], prompt / 2);
}

#[tokio::test]
async fn anthropic_reads_the_cached_part_apart_from_the_computed_input_when_streamed() {
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    let body = r#"{"model": "m", "max_tokens": 8, "stream": true,
        "messages": [{"role": "user", "content": "hello there"}]}"#;
    let reply = post(&app, "/v1/messages", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let prompt = prompt_lengths(&backend)[0];
    let events = reply.json_events();
    let delta = events
        .iter()
        .find(|event| event["type"] == "message_delta")
        .expect("a message_delta event");
    assert_eq!(delta["usage"]["cache_read_input_tokens"], prompt / 2);
    assert_eq!(delta["usage"]["input_tokens"], prompt - prompt / 2);
    assert_eq!(delta["usage"]["cache_creation_input_tokens"], 0);
}
