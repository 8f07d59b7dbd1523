use super::*;

fn app() -> axum::Router {
    test_app(
        FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length)),
        4,
    )
}

const CHAT: &str = r#""messages": [{"role": "user", "content": "a"}]"#;

#[tokio::test]
async fn chat_logprobs_list_each_token_with_bytes_and_alternatives() {
    let body = format!(r#"{{{CHAT}, "logprobs": true, "top_logprobs": 2}}"#);
    let reply = post(&app(), "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let logprobs = &reply.json()["choices"][0]["logprobs"];
    assert_eq!(logprobs["refusal"], Value::Null);
    let content = logprobs["content"].as_array().unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["token"], "o");
    assert_eq!(content[0]["bytes"], serde_json::json!([111]));
    assert_eq!(content[0]["logprob"], -0.25);
    assert_eq!(content[0]["top_logprobs"][1]["logprob"], -1.5);
}

#[tokio::test]
async fn chat_without_logprobs_renders_null() {
    let reply = post(&app(), "/v1/chat/completions", &format!("{{{CHAT}}}")).await;
    assert_eq!(reply.json()["choices"][0]["logprobs"], Value::Null);
}

#[tokio::test]
async fn completion_logprobs_are_parallel_lists_with_offsets() {
    let reply = post(
        &app(),
        "/v1/completions",
        r#"{"prompt": "a", "logprobs": 1}"#,
    )
    .await;
    let logprobs = &reply.json()["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"], serde_json::json!(["o", "k"]));
    assert_eq!(
        logprobs["token_logprobs"],
        serde_json::json!([-0.25, -0.25])
    );
    assert_eq!(logprobs["text_offset"], serde_json::json!([0, 1]));
    assert_eq!(logprobs["top_logprobs"][0]["o"], -0.25);
}

#[tokio::test]
async fn native_details_carry_top_tokens_and_the_stream_per_token() {
    let body = r#"{"inputs": "a", "parameters": {"details": true, "top_n_tokens": 2}}"#;
    let reply = post(&app(), "/generate", body).await;
    let details = &reply.json()["details"];
    assert_eq!(details["top_tokens"].as_array().unwrap().len(), 2);
    assert_eq!(details["top_tokens"][0][0]["text"], "o");
    let reply = post(&app(), "/generate_stream", body).await;
    assert!(
        reply.body.contains(r#""top_tokens":[{"id""#),
        "{}",
        reply.body
    );
}

#[tokio::test]
async fn logprob_counts_and_penalties_are_range_checked() {
    let cases = [
        (
            "/v1/chat/completions",
            format!(r#"{{{CHAT}, "logprobs": true, "top_logprobs": 21}}"#),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{{CHAT}, "top_logprobs": 2}}"#),
            "logprobs",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "logprobs": 6}"#.to_owned(),
            "logprobs",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "presence_penalty": 2.5}"#.to_owned(),
            "presence_penalty",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "logit_bias": {"99999": 1}}"#.to_owned(),
            "logit_bias",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "min_tokens": 5, "max_tokens": 2}"#.to_owned(),
            "min_tokens",
        ),
    ];
    for (path, body, param) in cases {
        let reply = post(&app(), path, &body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            reply.body
        );
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
    }
}

#[tokio::test]
async fn accepted_processor_parameters_reach_the_backend() {
    let backend = FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length));
    let body = r#"{"prompt": "a", "frequency_penalty": 0.5, "repetition_penalty": 1.2, "min_p": 0.1,
                   "logit_bias": {"3": -100}, "min_tokens": 1, "ignore_eos": true, "stop_token_ids": [4]}"#;
    let reply = post(&test_app(Arc::clone(&backend), 4), "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let request = backend.requests.lock().unwrap()[0].clone();
    assert_eq!(request.sampling.frequency_penalty, 0.5);
    assert_eq!(request.sampling.repetition_penalty, 1.2);
    assert_eq!(request.sampling.logit_bias, vec![(3, -100.0)]);
    assert_eq!(request.stopping.min_new_tokens, 1);
    assert_eq!(request.stopping.stop_token_ids, vec![4]);
}
