use serde_json::json;

use super::*;
use crate::validation::testing::EOS_ID;

#[tokio::test]
async fn generate_with_details_reports_token_ids_finish_and_seed() {
    let mut tokens = ids("Hi!");
    tokens.push(EOS_ID);
    let backend = FakeBackend::new(Script::Tokens(tokens.clone(), FinishReason::Eos));
    let app = test_app(backend.clone(), 4);
    let body =
        r#"{"inputs": "hello", "parameters": {"max_new_tokens": 10, "details": true, "seed": 3}}"#;
    let reply = post(&app, "/generate", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["generated_text"], "Hi!");
    let details = &body["details"];
    assert_eq!(details["finish_reason"], "eos_token");
    assert_eq!(details["generated_tokens"], 4);
    assert_eq!(details["seed"], 3);
    let reported: Vec<u64> = details["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        reported,
        tokens.iter().map(|&t| u64::from(t)).collect::<Vec<_>>()
    );
    assert_eq!(
        details["tokens"][3],
        json!({"id": EOS_ID, "text": "", "logprob": -0.25, "special": true})
    );
    let request = backend.requests.lock().unwrap()[0].clone();
    assert_eq!(
        request.sampling.temperature, 0.0,
        "no sampling parameter: greedy"
    );
}

#[tokio::test]
async fn generate_without_details_returns_only_text() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length)),
        4,
    );
    let body = post(&app, "/generate", r#"{"inputs": "q"}"#).await.json();
    assert_eq!(body, json!({"generated_text": "ok"}));
}

#[tokio::test]
async fn sampling_parameters_turn_sampling_on() {
    let backend = FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length));
    let app = test_app(backend.clone(), 4);
    let body = r#"{"inputs": "q", "parameters": {"temperature": 0.5, "top_k": 5, "top_p": 0.9}}"#;
    assert_eq!(post(&app, "/generate", body).await.status, StatusCode::OK);
    let sampling = backend.requests.lock().unwrap()[0].sampling.clone();
    assert_eq!(
        (sampling.temperature, sampling.top_k, sampling.top_p),
        (0.5, 5, 0.9)
    );
}

#[tokio::test]
async fn return_full_text_prepends_the_prompt() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids(" there"), FinishReason::Length)),
        4,
    );
    let body = r#"{"inputs": "hello", "parameters": {"return_full_text": true}}"#;
    let body = post(&app, "/generate", body).await.json();
    assert_eq!(body["generated_text"], "hello there");
}

#[tokio::test]
async fn generate_stream_has_tgi_shape_and_no_done_marker() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids("abc"), FinishReason::Length)),
        4,
    );
    let body = r#"{"inputs": "q", "parameters": {"seed": 9}}"#;
    let reply = post(&app, "/generate_stream", body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(!reply.body.contains("[DONE]"));
    let events = reply.json_events();
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[0],
        json!({"index": 1, "token": {"id": u32::from(b'a'), "text": "a", "logprob": -0.25, "special": false},
               "generated_text": null, "details": null})
    );
    let last = &events[2];
    assert_eq!(last["index"], 3);
    assert_eq!(last["generated_text"], "abc");
    assert_eq!(
        last["details"],
        json!({"finish_reason": "length", "generated_tokens": 3, "seed": 9, "input_length": 2})
    );
}

#[tokio::test]
async fn stop_sequence_finish_is_reported_natively() {
    let backend = FakeBackend::new(Script::Hold(ids("x END y")));
    let app = test_app(backend.clone(), 4);
    let body = r#"{"inputs": "q", "parameters": {"stop": ["END"], "details": true}}"#;
    let body = post(&app, "/generate", body).await.json();
    assert_eq!(body["generated_text"], "x ");
    assert_eq!(body["details"]["finish_reason"], "stop_sequence");
    assert!(backend.all_streams_closed());
}

#[tokio::test]
async fn health_follows_the_backend() {
    let healthy = test_app(FakeBackend::new(Script::Hold(vec![])), 1);
    assert_eq!(get(&healthy, "/health").await.status, StatusCode::OK);
    let sick = test_app(FakeBackend::unhealthy(), 1);
    let reply = get(&sick, "/health").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["error_type"], "unhealthy");
}

#[tokio::test]
async fn info_reports_model_limits_and_kv_cache() {
    let app = test_app(FakeBackend::new(Script::Hold(vec![])), 5);
    let body = get(&app, "/info").await.json();
    assert_eq!(body["model_id"], MODEL_ID);
    assert_eq!(body["max_concurrent_requests"], 5);
    assert_eq!(body["max_total_tokens"], MAX_TOTAL_TOKENS);
    assert_eq!(body["kv_cache_tokens"], 1600);
    assert_eq!(body["kv_cache_bytes_per_token"], 576);
    // No step has answered: nothing is known of what the shards compiled.
    assert!(body["compiled_decode_rows"].is_null() && body["compiling"].is_null());
    assert_eq!(body["router"], "tandem-router");
    assert!(body.get("started_at").is_none());
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let app = test_app(FakeBackend::new(Script::Hold(vec![])), 1);
    let reply = get(&app, "/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.content_type.starts_with("text/plain"));
}

#[tokio::test]
async fn explicit_nulls_and_neutral_values_are_accepted() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length)),
        4,
    );
    let body = r#"{"inputs": "q", "stream": false, "parameters": {"details": null, "do_sample": false,
                   "stop": null, "best_of": null, "truncate": null, "watermark": false, "grammar": null,
                   "top_n_tokens": null, "decoder_input_details": false, "adapter_id": null}}"#;
    let reply = post(&app, "/generate", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

#[tokio::test]
async fn streaming_is_refused_on_generate() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length)),
        4,
    );
    let reply = post(&app, "/generate", r#"{"inputs": "q", "stream": true}"#).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(reply.json()["error"]
        .as_str()
        .unwrap()
        .contains("/generate_stream"));
}

#[tokio::test]
async fn the_root_route_generates_or_streams_as_stream_says() {
    let app = test_app(
        FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length)),
        4,
    );
    let whole = post(
        &app,
        "/",
        r#"{"inputs": "q", "parameters": {"details": true}}"#,
    )
    .await;
    assert_eq!(whole.status, StatusCode::OK, "{}", whole.body);
    assert_eq!(whole.json()["generated_text"], "ok");
    assert_eq!(whole.json()["details"]["generated_tokens"], 2);
    let streamed = post(&app, "/", r#"{"inputs": "q", "stream": true}"#).await;
    assert!(streamed.content_type.starts_with("text/event-stream"));
    let events = streamed.json_events();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["generated_text"], "ok");
    let refused = post(&app, "/", r#"{"inputs": ""}"#).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused.json()["error_type"], "validation");
}
