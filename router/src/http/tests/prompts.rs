//! `/v1/completions` prompts in all four forms, several prompts per request, and `echo`.

use serde_json::json;

use super::*;

fn app(backend: &Arc<FakeBackend>) -> axum::Router {
    test_app(backend.clone(), 16)
}

#[tokio::test]
async fn each_prompt_of_a_list_gets_its_own_n_choices_indexed_as_openai_does() {
    let backend = ok_backend();
    let body = r#"{"prompt": ["hello", "abc"], "n": 2, "max_tokens": 2}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let completion = reply.json();
    let indexes: Vec<u64> = completion["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|choice| choice["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1, 2, 3]);
    let prompts: Vec<Vec<u32>> = backend
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|request| request.input_ids.clone())
        .collect();
    assert_eq!(prompts.len(), 4);
    // `hello` is one merged token after BOS; `abc` is three byte tokens after BOS.
    let prompt_tokens = 2 + 4;
    assert_eq!(completion["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(completion["usage"]["completion_tokens"], 4 * 2);
}

#[tokio::test]
async fn token_id_prompts_are_used_as_given() {
    let backend = ok_backend();
    let body = r#"{"prompt": [104, 105], "max_tokens": 2}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        backend.requests.lock().unwrap()[0].input_ids,
        vec![104, 105]
    );
    let body = r#"{"prompt": [[104], [105, 106]], "max_tokens": 2}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    assert_eq!(reply.json()["choices"].as_array().unwrap().len(), 2);
    let requests = backend.requests.lock().unwrap();
    assert_eq!(requests[1].input_ids, vec![104]);
    assert_eq!(requests[2].input_ids, vec![105, 106]);
}

#[tokio::test]
async fn bad_prompts_are_refused_by_name() {
    let backend = ok_backend();
    for body in [
        r#"{"prompt": [104, 999999]}"#,
        r#"{"prompt": [[104], [999999]]}"#,
        r#"{"prompt": []}"#,
        r#"{"prompt": [[]]}"#,
        r#"{"prompt": ["a", "b", "c", "d"]}"#,
        r#"{"prompt": [-1]}"#,
    ] {
        let reply = post(&app(&backend), "/v1/completions", body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            reply.body
        );
        assert_eq!(reply.json()["error"]["param"], "prompt", "{body}");
    }
    assert!(backend.requests.lock().unwrap().is_empty());
    let reply = post(
        &app(&backend),
        "/v1/completions",
        r#"{"prompt": ["a", "b", "c", "d"]}"#,
    )
    .await;
    let message = reply.json()["error"]["message"].clone();
    assert!(message.as_str().unwrap().contains("at most 3"), "{message}");
}

#[tokio::test]
async fn echo_prepends_the_prompt_text_or_the_decoded_ids() {
    let backend = ok_backend();
    let body = r#"{"prompt": "hello", "echo": true, "max_tokens": 2}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    assert_eq!(reply.json()["choices"][0]["text"], "hellook");
    let body = json!({"prompt": ids("hi"), "echo": true, "max_tokens": 2}).to_string();
    let reply = post(&app(&backend), "/v1/completions", &body).await;
    assert_eq!(reply.json()["choices"][0]["text"], "hiok");
}

#[tokio::test]
async fn echo_streams_the_prompt_first_in_every_choice() {
    let backend = ok_backend();
    let body = r#"{"prompt": ["ab", "cd"], "echo": true, "stream": true, "max_tokens": 2}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    let chunks = reply.json_events();
    let mut texts = [String::new(), String::new()];
    for chunk in &chunks {
        let choice = &chunk["choices"][0];
        let index = usize::try_from(choice["index"].as_u64().unwrap()).unwrap();
        texts[index].push_str(choice["text"].as_str().unwrap());
    }
    assert_eq!(texts, ["abok", "cdok"]);
    assert_eq!(chunks[0]["choices"][0]["text"], "ab");
}

#[tokio::test]
async fn a_non_empty_suffix_is_refused() {
    let backend = ok_backend();
    let body = r#"{"prompt": "a", "suffix": "b"}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["param"], "suffix");
    let reply = post(
        &app(&backend),
        "/v1/completions",
        r#"{"prompt": "a", "suffix": ""}"#,
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "an empty suffix changes nothing"
    );
}

#[tokio::test]
async fn completions_read_response_format_and_refuse_a_malformed_one_by_name() {
    let backend = ok_backend();
    let body = r#"{"prompt": "a", "response_format": {"type": "xml"}}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(reply.json()["error"]["param"], "response_format");
    let body = r#"{"prompt": "a", "response_format": {"type": "text"}}"#;
    let reply = post(&app(&backend), "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(backend.requests.lock().unwrap()[0].grammar.is_none());
}
