//! Prompt-cache hints on every surface: OpenAI's `prompt_cache_key`, `prompt_cache_retention`
//! and `prompt_cache_options`, and Anthropic's `cache_control`, reach the scheduler as how long
//! the prompt's cached prefix outlives LRU eviction; a value Tandem does not serve is a 400
//! naming the field, and nothing reaches the engine.

use std::time::Duration;

use axum::http::StatusCode;

use super::*;

const MINUTE: u64 = 60;

fn retentions(backend: &FakeBackend) -> Vec<Option<Duration>> {
    let requests = backend.requests.lock().unwrap();
    requests
        .iter()
        .map(|request| request.cache_retention)
        .collect()
}

#[tokio::test]
async fn every_surfaces_hints_reach_the_scheduler_as_a_retention() {
    let backend = ok_backend();
    let app = test_app(Arc::clone(&backend), 4);
    let bodies = [
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt_cache_key": "agent-7"}"#,
        ),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "max_tokens": 2, "prompt_cache_retention": "24h"}"#,
        ),
        (
            "/v1/responses",
            r#"{"input": "hi", "max_output_tokens": 2, "store": false, "prompt_cache_options": {"ttl": "12h"}}"#,
        ),
        (
            "/v1/messages",
            r#"{"max_tokens": 2, "system": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral", "ttl": "1h"}}], "messages": [{"role": "user", "content": "hi"}]}"#,
        ),
    ];
    for (path, body) in bodies {
        let reply = post(&app, path, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
    }
    assert_eq!(
        retentions(&backend),
        [
            None,
            Some(Duration::from_secs(10 * MINUTE)),
            Some(Duration::from_secs(24 * 60 * MINUTE)),
            Some(Duration::from_secs(12 * 60 * MINUTE)),
            Some(Duration::from_secs(60 * MINUTE)),
        ]
    );
}

#[tokio::test]
async fn a_hint_tandem_does_not_serve_is_a_400_naming_it_and_reaches_nothing() {
    let backend = ok_backend();
    let app = test_app(Arc::clone(&backend), 4);
    let refused = [
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "prompt_cache_retention": "1w"}"#,
            "`prompt_cache_retention` must be `in_memory` or `24h`, got `1w`",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "prompt_cache_options": {"mode": "explicit"}}"#,
            "`prompt_cache_options.mode` is not supported yet with the value `explicit`",
        ),
        (
            "/v1/responses",
            r#"{"input": "hi", "prompt_cache_options": {"ttl": "1d"}}"#,
            "`prompt_cache_options.ttl` must be `30m` or `12h`, got `1d`",
        ),
        (
            "/v1/messages",
            r#"{"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}]}"#,
            "`messages[0].content[0].cache_control.ttl` must be `5m` or `1h`, got `2h`",
        ),
    ];
    for (path, body, message) in refused {
        let reply = post(&app, path, body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{path}: {}",
            reply.body
        );
        assert!(reply.body.contains(message), "{path}: {}", reply.body);
    }
    assert!(retentions(&backend).is_empty());
}
