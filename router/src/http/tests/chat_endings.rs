//! How the chat prompt ends: generation prompt, closed, or a continued assistant message.

use super::*;

const PARTIAL: &str = r#"[{"role": "system", "content": "Hi"},
    {"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2, "}]"#;

async fn chat(backend: &Arc<FakeBackend>, fields: &str, messages: &str) -> Reply {
    let body = format!(r#"{{"messages": {messages}, "max_tokens": 2{fields}}}"#);
    post(&test_app(backend.clone(), 4), "/v1/chat/completions", &body).await
}

#[tokio::test]
async fn a_trailing_assistant_message_is_continued_on_request() {
    let backend = ok_backend();
    let reply = chat(&backend, r#", "continue_final_message": true"#, PARTIAL).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        last_prompt(&backend),
        "<|system|>Hi\n<|user|>Count\n<|assistant|>1, 2,"
    );
}

#[tokio::test]
async fn the_generation_prompt_follows_by_default_and_can_be_left_out() {
    let backend = ok_backend();
    let reply = chat(&backend, "", PARTIAL).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(last_prompt(&backend).ends_with("1, 2,\n<|assistant|>"));
    chat(&backend, r#", "add_generation_prompt": false"#, PARTIAL).await;
    assert!(last_prompt(&backend).ends_with("1, 2,\n"));
}

#[tokio::test]
async fn continuing_needs_an_assistant_message_and_no_generation_prompt() {
    let backend = ok_backend();
    let user_last = r#"[{"role": "user", "content": "Count"}]"#;
    for (fields, messages) in [
        (r#", "continue_final_message": true"#, user_last),
        (
            r#", "continue_final_message": true, "add_generation_prompt": true"#,
            PARTIAL,
        ),
    ] {
        let reply = chat(&backend, fields, messages).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        assert_eq!(reply.json()["error"]["param"], "continue_final_message");
    }
    assert!(backend.requests.lock().unwrap().is_empty());
}
