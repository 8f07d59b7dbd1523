//! Several choices of one prompt: OpenAI `n` (and completions' `best_of`), TGI `best_of`.

use serde_json::json;

use super::*;

fn backend(text: &str) -> Arc<FakeBackend> {
    FakeBackend::ranked_by_seed(Script::Tokens(ids(text), FinishReason::Length))
}

fn seeds(backend: &FakeBackend) -> Vec<u64> {
    let requests = backend.requests.lock().unwrap();
    requests
        .iter()
        .map(|request| request.sampling.seed)
        .collect()
}

#[tokio::test]
async fn chat_n_returns_indexed_choices_seeded_in_turn_with_usage_summed() {
    let backend = backend("abc");
    let app = test_app(Arc::clone(&backend), 4);
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 10}"#;
    let reply = post(&app, "/v1/chat/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (index, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], index);
        assert_eq!(choice["message"]["content"], "abc");
        assert_eq!(choice["finish_reason"], "length");
    }
    assert_eq!(seeds(&backend), vec![10, 11, 12]);
    let usage = &body["usage"];
    let prompt_tokens = backend.requests.lock().unwrap()[0].input_ids.len();
    assert_eq!(usage["prompt_tokens"], prompt_tokens);
    assert_eq!(usage["completion_tokens"], 9);
    assert_eq!(usage["total_tokens"], prompt_tokens + 9);
}

#[tokio::test]
async fn chat_stream_n_tags_every_chunk_with_its_choice() {
    let app = test_app(backend("ab"), 4);
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": true,
                   "stream_options": {"include_usage": true}}"#;
    let reply = post(&app, "/v1/chat/completions", body).await;
    assert_eq!(reply.events().last().unwrap(), "[DONE]");
    let chunks = reply.json_events();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    for index in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter_map(|chunk| chunk["choices"].as_array()?.first())
            .filter(|choice| choice["index"] == index)
            .collect();
        assert_eq!(mine[0]["delta"]["role"], "assistant");
        let text: String = mine
            .iter()
            .filter_map(|choice| choice["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "ab");
        assert_eq!(mine.last().unwrap()["finish_reason"], "length");
    }
}

#[tokio::test]
async fn completions_n_streams_logprobs_per_choice() {
    let app = test_app(backend("xy"), 4);
    let body = r#"{"prompt": "q", "n": 2, "stream": true, "logprobs": 0}"#;
    let chunks = post(&app, "/v1/completions", body).await.json_events();
    for index in 0..2 {
        let offsets: Vec<Value> = chunks
            .iter()
            .map(|chunk| &chunk["choices"][0])
            .filter(|choice| choice["index"] == index)
            .map(|choice| choice["logprobs"]["text_offset"][0].clone())
            .collect();
        // Each choice counts its own text offsets from 0.
        assert_eq!(offsets, vec![json!(0), json!(1)]);
    }
}

#[tokio::test]
async fn completions_best_of_returns_the_n_most_likely_candidates() {
    let backend = backend("z");
    let app = test_app(Arc::clone(&backend), 4);
    // Seeds 3, 4, 5: the fake engine makes seed 4 the most likely, then seed 5.
    let body = r#"{"prompt": "q", "best_of": 3, "n": 2, "seed": 3, "temperature": 1.0,
                   "logprobs": 0}"#;
    let body = post(&app, "/v1/completions", body).await.json();
    assert_eq!(seeds(&backend), vec![3, 4, 5]);
    let logprobs: Vec<Value> = body["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|choice| choice["logprobs"]["token_logprobs"][0].clone())
        .collect();
    assert_eq!(logprobs, vec![json!(-0.25), json!(-0.75)]);
    assert_eq!(body["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn completions_best_of_below_n_is_rejected() {
    let reply = post(
        &test_app(backend("z"), 4),
        "/v1/completions",
        r#"{"prompt": "q", "best_of": 1, "n": 2}"#,
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(reply.json()["error"]["param"], "best_of");
}

#[tokio::test]
async fn generate_best_of_returns_the_most_likely_and_lists_the_others() {
    let backend = backend("z");
    let app = test_app(Arc::clone(&backend), 4);
    let body = r#"{"inputs": "q", "parameters": {"best_of": 3, "do_sample": true, "seed": 3,
                   "details": true}}"#;
    let reply = post(&app, "/generate", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let details = &reply.json()["details"];
    assert_eq!(details["seed"], 4);
    let others = details["best_of_sequences"].as_array().unwrap();
    let mut other_seeds: Vec<u64> = others.iter().map(|s| s["seed"].as_u64().unwrap()).collect();
    other_seeds.sort_unstable();
    assert_eq!(other_seeds, vec![3, 5]);
    for other in others {
        assert_eq!(other["generated_text"], "z");
        assert_eq!(other["finish_reason"], "length");
        assert_eq!(other["generated_tokens"], 1);
    }
}

#[tokio::test]
async fn generate_best_of_requires_sampling_and_no_stream() {
    let app = test_app(backend("z"), 4);
    let greedy = r#"{"inputs": "q", "parameters": {"best_of": 2}}"#;
    let reply = post(&app, "/generate", greedy).await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.body
    );
    assert!(reply.json()["error"].as_str().unwrap().contains("best_of"));
    let sampled = r#"{"inputs": "q", "parameters": {"best_of": 2, "do_sample": true}}"#;
    let reply = post(&app, "/generate_stream", sampled).await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.body
    );
}

#[tokio::test]
async fn every_choice_counts_against_the_concurrency_limit() {
    let backend = backend("z");
    let app = test_app(Arc::clone(&backend), 2);
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "n": 3}"#;
    let reply = post(&app, "/v1/chat/completions", body).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    assert!(backend.requests.lock().unwrap().is_empty());
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "n": 2}"#;
    assert_eq!(
        post(&app, "/v1/chat/completions", body).await.status,
        StatusCode::OK
    );
}
