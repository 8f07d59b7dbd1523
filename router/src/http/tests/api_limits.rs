//! Server-side API limits and options, `/tokenize` and `/info`.

use serde_json::json;

use super::*;
use crate::validation::SamplingDefaults;

fn native_error(reply: &Reply, param: &str) {
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.body
    );
    let body = reply.json();
    assert_eq!(body["error_type"], "validation");
    let message = body["error"].as_str().unwrap();
    assert!(message.contains(&format!("`{param}`")), "{message}");
}

#[tokio::test]
async fn native_limits_come_from_the_server_flags() {
    let app = test_app(ok_backend(), 4);
    let cases = [
        (r#"{"best_of": 5, "do_sample": true}"#, "best_of"),
        (r#"{"top_n_tokens": 6}"#, "top_n_tokens"),
        (r#"{"stop": ["a", "b", "c", "d", "e"]}"#, "stop"),
        (r#"{"truncate": 0}"#, "truncate"),
        (r#"{"truncate": 65}"#, "truncate"),
    ];
    for (parameters, param) in cases {
        let body = format!(r#"{{"inputs": "hello", "parameters": {parameters}}}"#);
        native_error(&post(&app, "/generate", &body).await, param);
    }
    let body = r#"{"inputs": "q", "parameters": {"best_of": 4, "do_sample": true}}"#;
    assert_eq!(post(&app, "/generate", body).await.status, StatusCode::OK);
}

#[tokio::test]
async fn truncate_keeps_the_last_prompt_tokens() {
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    let body = r#"{"inputs": "abcdef", "parameters": {"truncate": 3, "details": true}}"#;
    let reply = post(&app, "/generate", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(backend.requests.lock().unwrap()[0].input_ids, ids("def"));
}

#[tokio::test]
async fn always_include_usage_ends_every_stream_with_usage() {
    let config = HandlerConfig {
        always_include_usage: true,
        ..handler_config(4)
    };
    let app = test_app_with(ok_backend(), config);
    let chat = r#"{"messages": [{"role": "user", "content": "a"}], "stream": true}"#;
    let completion = r#"{"prompt": "a", "stream": true}"#;
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ] {
        let chunks = post(&app, path, body).await.json_events();
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]), "{path}");
        assert_eq!(last["usage"]["completion_tokens"], 2, "{path}");
    }
    let chunks = post(&test_app(ok_backend(), 4), "/v1/completions", completion)
        .await
        .json_events();
    assert!(chunks.iter().all(|chunk| chunk.get("usage").is_none()));
}

#[tokio::test]
async fn tokenize_lists_ids_texts_and_character_offsets() {
    let app = test_app(ok_backend(), 4);
    let reply = post(&app, "/tokenize", r#"{"inputs": "hello wé"}"#).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let tokens = reply.json();
    let tokens = tokens.as_array().unwrap();
    assert_eq!(
        tokens[0],
        json!({"id": testing::BOS_ID, "text": "", "start": 0, "stop": 0})
    );
    assert_eq!(
        tokens[1],
        json!({"id": ids("hello")[0], "text": "hello", "start": 0, "stop": 5})
    );
    // `é` is two byte tokens; each spans the whole character.
    let last_two = &tokens[tokens.len() - 2..];
    for token in last_two {
        assert_eq!(
            (&token["text"], &token["start"], &token["stop"]),
            (&json!("é"), &json!(7), &json!(8))
        );
    }
    let ids_seen: Vec<u32> = tokens
        .iter()
        .map(|t| u32::try_from(t["id"].as_u64().unwrap()).unwrap())
        .collect();
    let expected = testing::tokenizer().encode("hello wé", true).unwrap();
    assert_eq!(ids_seen, expected.get_ids());
}

#[tokio::test]
async fn tokenize_refuses_bad_bodies_in_tgi_shape() {
    let app = test_app(ok_backend(), 4);
    for body in [
        r#"{"inputs": 3}"#,
        r#"{"inputs": "a", "parameters": {"x": 1}}"#,
        "{",
    ] {
        let reply = post(&app, "/tokenize", body).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(reply.json()["error_type"], "validation");
    }
}

#[tokio::test]
async fn info_reports_tgi_limits() {
    let info = get(&test_app(ok_backend(), 4), "/info").await.json();
    for (key, value) in [
        ("max_stop_sequences", 4),
        ("max_best_of", 4),
        ("max_client_batch_size", 3),
        ("max_top_n_tokens", 5),
        ("validation_workers", 512),
    ] {
        assert_eq!(info[key], value, "{key}");
    }
    assert_eq!(info["payload_limit"], PAYLOAD_LIMIT);
    assert_eq!(info["always_include_usage"], false);
}

#[tokio::test]
async fn model_sampling_defaults_fill_only_what_openai_requests_leave_unset() {
    let backend = ok_backend();
    let config = HandlerConfig {
        default_sampling: SamplingDefaults {
            temperature: Some(0.6),
            top_p: Some(0.9),
            top_k: Some(20),
            min_p: None,
            repetition_penalty: Some(1.25),
        },
        ..handler_config(4)
    };
    let app = test_app_with(backend.clone(), config);
    let chat = r#"{"messages": [{"role": "user", "content": "a"}]}"#;
    let completion = r#"{"prompt": "a", "temperature": 0, "top_k": 0}"#;
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
        ("/generate", r#"{"inputs": "a"}"#),
    ] {
        assert_eq!(
            post(&app, path, body).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
    let sampled: Vec<_> = backend
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|request| {
            let s = &request.sampling;
            (
                s.temperature,
                s.top_k,
                s.top_p,
                s.min_p,
                s.repetition_penalty,
            )
        })
        .collect();
    assert_eq!(
        sampled,
        vec![
            (0.6, 20, 0.9, 0.0, 1.25),
            // What the client set wins, even where it turns an option off.
            (0.0, 0, 0.9, 0.0, 1.25),
            // The native route keeps TGI's defaults: greedy, no processors.
            (0.0, 0, 1.0, 0.0, 1.0),
        ]
    );
    let reported = get(&app, "/info").await.json();
    assert_eq!(
        reported["default_sampling"],
        json!({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.25})
    );
}
