use serde_json::json;

use super::*;
use crate::validation::testing::EOS_ID;

fn finished_with_eos(text: &str) -> Script {
    let mut tokens = ids(text);
    tokens.push(EOS_ID);
    Script::Tokens(tokens, FinishReason::Eos)
}

const CHAT: &str = r#"{"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "seed": 7}"#;

#[tokio::test]
async fn chat_completion_returns_the_message_usage_and_stop() {
    let backend = FakeBackend::new(finished_with_eos("Hello wörld"));
    let app = test_app(backend.clone(), 4);
    let reply = post(&app, "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL_ID);
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello wörld");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let prompt_tokens = ids("<|user|>hi\n<|assistant|>").len();
    let completion_tokens = ids("Hello wörld").len() + 1;
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
               "total_tokens": prompt_tokens + completion_tokens,
               "prompt_tokens_details": {"cached_tokens": prompt_tokens / 2}})
    );
    let request = backend.requests.lock().unwrap()[0].clone();
    assert_eq!(request.stopping.max_new_tokens, 20);
    assert_eq!(request.sampling.seed, 7);
    assert_eq!(request.input_ids, ids("<|user|>hi\n<|assistant|>"));
}

#[tokio::test]
async fn chat_stream_announces_the_role_then_streams_content_and_ends_with_done() {
    let app = test_app(FakeBackend::new(finished_with_eos("Hi é")), 4);
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "stream": true}"#;
    let reply = post(&app, "/v1/chat/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.content_type.starts_with("text/event-stream"));
    assert_eq!(reply.events().last().unwrap(), "[DONE]");
    let chunks = reply.json_events();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hi é");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
}

#[tokio::test]
async fn include_usage_adds_a_final_chunk_with_no_choices() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids("abc"), FinishReason::Length)),
        4,
    );
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "stream": true,
                   "stream_options": {"include_usage": true}}"#;
    let chunks = post(&app, "/v1/chat/completions", body).await.json_events();
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 3);
    let finish_chunk = &chunks[chunks.len() - 2];
    assert_eq!(finish_chunk["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn completion_returns_text_and_length_finish() {
    let backend = FakeBackend::new(Script::Tokens(ids(" world"), FinishReason::Length));
    let app = test_app(backend.clone(), 4);
    let reply = post(
        &app,
        "/v1/completions",
        r#"{"prompt": "hello", "max_tokens": 2}"#,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], " world");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens"], 2, "BOS + `hello`");
    let request = backend.requests.lock().unwrap()[0].clone();
    assert_eq!(request.input_ids, vec![testing::BOS_ID, 261]);
}

#[tokio::test]
async fn completion_stream_sends_text_chunks_and_done() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids("ok!"), FinishReason::Length)),
        4,
    );
    let reply = post(
        &app,
        "/v1/completions",
        r#"{"prompt": ["p"], "stream": true}"#,
    )
    .await;
    let events = reply.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = reply.json_events();
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "ok!");
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
}

#[tokio::test]
async fn stop_string_cuts_the_text_and_cancels_the_request() {
    let backend = FakeBackend::new(Script::Hold(ids("one two three four")));
    let app = test_app(backend.clone(), 4);
    let body = r#"{"prompt": "count", "stop": ["thr", "zzz"]}"#;
    let reply = post(&app, "/v1/completions", body).await;
    let body = reply.json();
    assert_eq!(body["choices"][0]["text"], "one two ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(backend.all_streams_closed(), "the request was cancelled");
}

#[tokio::test]
async fn stop_string_in_a_stream_is_never_emitted() {
    let backend = FakeBackend::new(Script::Hold(ids("a STOP b")));
    let app = test_app(backend.clone(), 4);
    let body =
        r#"{"messages": [{"role": "user", "content": "x"}], "stop": "STOP", "stream": true}"#;
    let reply = post(&app, "/v1/chat/completions", body).await;
    assert!(!reply.body.contains("STOP"));
    assert!(!reply.body.contains(" b"));
    assert_eq!(reply.events().last().unwrap(), "[DONE]");
    assert!(backend.all_streams_closed());
}

#[tokio::test]
async fn content_parts_are_joined_as_text() {
    let backend = FakeBackend::new(finished_with_eos("x"));
    let app = test_app(backend.clone(), 4);
    let body = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                  {"type": "text", "text": "b"}]}]}"#;
    assert_eq!(
        post(&app, "/v1/chat/completions", body).await.status,
        StatusCode::OK
    );
    let request = backend.requests.lock().unwrap()[0].clone();
    assert_eq!(request.input_ids, ids("<|user|>a\nb\n<|assistant|>"));
}

#[tokio::test]
async fn models_lists_the_served_model() {
    let app = test_app(FakeBackend::new(finished_with_eos("")), 4);
    let body = get(&app, "/v1/models").await.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], MODEL_ID);
}
