//! `/v1/completions` with `echo` and `logprobs`: the prompt's own tokens and logprobs first,
//! and `max_tokens: 0` returning the prompt alone.

use serde_json::json;

use super::*;
use crate::scheduler::PromptLogprobs;

/// Logprob the fake shard gives prompt position `p`: `-p / 4`.
#[allow(clippy::cast_precision_loss)]
fn prompt_logprob(position: usize) -> f32 {
    -(position as f32) / 4.0
}

/// The "ok" backend, but a request asking for prompt logprobs receives them before its
/// first token, as the scheduler delivers them.
struct ScoringBackend {
    inner: Arc<FakeBackend>,
}

#[async_trait::async_trait]
impl Backend for ScoringBackend {
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, SchedulerError> {
        let input_len = request.input_ids.len();
        let prompt = request.logprobs.prompt_logprobs.then(|| PromptLogprobs {
            first_position: 1,
            logprobs: (1..input_len).map(prompt_logprob).collect(),
            top: (1..input_len)
                .map(|position| {
                    let logprob = prompt_logprob(position);
                    vec![TokenLogprob { id: 0, logprob }]
                })
                .filter(|_| request.logprobs.top_logprobs > 0)
                .collect(),
        });
        let mut inner = self.inner.submit(request)?;
        let (sender, events) = mpsc::unbounded_channel();
        let _ = sender.send(GenerationEvent::Started { cached_tokens: 0 });
        if let Some(prompt) = prompt {
            let _ = sender.send(GenerationEvent::PromptLogprobs(prompt));
        }
        while let Ok(event) = inner.events.try_recv() {
            if !matches!(event, GenerationEvent::Started { .. }) {
                let _ = sender.send(event);
            }
        }
        Ok(GenerationStream { events })
    }

    fn load(&self) -> LoadSnapshot {
        self.inner.load()
    }

    async fn health(&self) -> Result<(), SchedulerError> {
        self.inner.health().await
    }
}

fn scoring_app() -> (Arc<FakeBackend>, axum::Router) {
    let inner = ok_backend();
    let backend = Arc::new(ScoringBackend {
        inner: Arc::clone(&inner),
    });
    (inner, app(test_state(backend, handler_config(16))))
}

async fn completion(body: &Value) -> Value {
    let (_, app) = scoring_app();
    let reply = post(&app, "/v1/completions", &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

#[tokio::test]
async fn echo_with_logprobs_lists_the_prompt_tokens_then_the_generated_ones() {
    let body = json!({"prompt": "ab", "echo": true, "logprobs": 1, "max_tokens": 2});
    let choice = &completion(&body).await["choices"][0];
    assert_eq!(choice["text"], "abok");
    let logprobs = &choice["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["<s>", "a", "b", "o", "k"]));
    assert_eq!(
        logprobs["token_logprobs"],
        json!([null, -0.25, -0.5, -0.25, -0.25])
    );
    assert_eq!(logprobs["text_offset"], json!([0, 3, 4, 5, 6]));
    assert_eq!(logprobs["top_logprobs"][0], Value::Null);
    assert_eq!(logprobs["top_logprobs"][2], json!({"\u{0}": -0.5}));
    assert_eq!(logprobs["top_logprobs"][3]["o"], -0.25);
}

#[tokio::test]
async fn max_tokens_zero_returns_the_scored_prompt_alone() {
    let body = json!({"prompt": "ab", "echo": true, "logprobs": 0, "max_tokens": 0});
    let (inner, app) = scoring_app();
    let reply = post(&app, "/v1/completions", &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let completion = reply.json();
    let choice = &completion["choices"][0];
    assert_eq!(choice["text"], "ab");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["logprobs"]["tokens"], json!(["<s>", "a", "b"]));
    assert_eq!(
        choice["logprobs"]["token_logprobs"],
        json!([null, -0.25, -0.5])
    );
    assert_eq!(choice["logprobs"]["top_logprobs"], json!([null, {}, {}]));
    assert_eq!(completion["usage"]["completion_tokens"], 0);
    let sent = inner.requests.lock().unwrap();
    assert_eq!(sent[0].stopping.max_new_tokens, 1, "one token is sampled");
    assert!(sent[0].logprobs.prompt_logprobs);
}

#[tokio::test]
async fn echo_without_logprobs_or_logprobs_without_echo_asks_for_no_prompt_logprobs() {
    for body in [
        json!({"prompt": "ab", "echo": true, "max_tokens": 1}),
        json!({"prompt": "ab", "logprobs": 1, "max_tokens": 1}),
    ] {
        let (inner, app) = scoring_app();
        let reply = post(&app, "/v1/completions", &body.to_string()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert!(!inner.requests.lock().unwrap()[0].logprobs.prompt_logprobs);
    }
}

#[tokio::test]
async fn streamed_echo_sends_the_scored_prompt_before_the_tokens() {
    let body = json!({"prompt": "ab", "echo": true, "logprobs": 0, "max_tokens": 2,
                      "stream": true, "stream_options": {"include_usage": true}});
    let (_, app) = scoring_app();
    let chunks = post(&app, "/v1/completions", &body.to_string())
        .await
        .json_events();
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["text"], "ab");
    assert_eq!(
        first["logprobs"]["token_logprobs"],
        json!([null, -0.25, -0.5])
    );
    let second = &chunks[1]["choices"][0];
    assert_eq!(second["text"], "o");
    assert_eq!(second["logprobs"]["text_offset"], json!([5]));
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn streamed_max_tokens_zero_sends_the_prompt_then_an_empty_finish() {
    let body = json!({"prompt": "ab", "echo": true, "logprobs": 1, "max_tokens": 0,
                      "stream": true, "stream_options": {"include_usage": true}});
    let (_, app) = scoring_app();
    let chunks = post(&app, "/v1/completions", &body.to_string())
        .await
        .json_events();
    assert_eq!(chunks.len(), 3, "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["text"], "ab");
    let prompt = &chunks[0]["choices"][0]["logprobs"];
    assert_eq!(prompt["tokens"], json!(["<s>", "a", "b"]));
    assert_eq!(prompt["token_logprobs"], json!([null, -0.25, -0.5]));
    let finish = &chunks[1]["choices"][0];
    assert_eq!(finish["text"], "");
    assert_eq!(finish["finish_reason"], "length");
    assert_eq!(finish["logprobs"]["tokens"], json!([]));
    assert_eq!(chunks[2]["usage"]["completion_tokens"], 0);
}

#[tokio::test]
async fn max_tokens_zero_without_echo_or_with_something_to_generate_is_refused() {
    let cases = [
        (json!({"prompt": "ab", "max_tokens": 0}), "max_tokens"),
        (
            json!({"prompt": "ab", "echo": true, "max_tokens": 0, "min_tokens": 1}),
            "min_tokens",
        ),
        (
            json!({"prompt": "ab", "echo": true, "max_tokens": 0, "best_of": 2}),
            "best_of",
        ),
        (
            json!({"prompt": "ab", "echo": true, "logprobs": 6, "max_tokens": 0}),
            "logprobs",
        ),
        (
            json!({"prompt": "ab", "echo": true, "max_tokens": -1}),
            "max_tokens",
        ),
    ];
    for (body, param) in cases {
        let (inner, app) = scoring_app();
        let reply = post(&app, "/v1/completions", &body.to_string()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
        assert!(inner.requests.lock().unwrap().is_empty(), "{body}");
    }
}
