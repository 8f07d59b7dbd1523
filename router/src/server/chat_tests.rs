//! A model without a chat template starts: it serves completions, and chat in its family's
//! known format or, for an unknown family, not at all.

use axum::http::StatusCode;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokenizers::Tokenizer;

use super::tests::config;
use super::*;
use crate::http::tests::{
    handler_config, ids, post, state_with_validator, FakeBackend, Reply, Script,
};
use crate::scheduler::FinishReason;
use crate::validation::testing::templateless_model_dir;

const GEMMA_TOKENS: [&str; 2] = ["<start_of_turn>", "<end_of_turn>"];

/// The Gemma rendering of a system message "Be brief." and a user message "Hi".
const GEMMA_PROMPT: &str =
    "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n";

/// "Be brief." then "Hi" on every chat-shaped route, as (path, body).
fn chats() -> [(&'static str, Value); 3] {
    [
        (
            "/v1/chat/completions",
            json!({"max_tokens": 2, "messages": [
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "system": "Be brief.",
                   "messages": [{"role": "user", "content": "Hi"}]}),
        ),
        (
            "/v1/responses",
            json!({"max_output_tokens": 2, "instructions": "Be brief.", "input": "Hi"}),
        ),
    ]
}

/// The app over the model in `dir`, its validator built by start-up under `flags`.
fn started(dir: &TempDir, flags: &[&str]) -> (axum::Router, Arc<FakeBackend>) {
    let files = ModelFiles::load(dir.path()).unwrap();
    let (validator, decoding, _) =
        tokenization(files, &config(flags)).expect("a model without a chat template starts");
    let backend = FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length));
    let state = state_with_validator(backend.clone(), validator, decoding, handler_config(4));
    (http::app(state), backend)
}

/// The prompt the backend received last, decoded by the model's own tokenizer.
fn last_prompt(backend: &FakeBackend, dir: &TempDir) -> String {
    let tokenizer = Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let requests = backend.requests.lock().unwrap();
    let ids = &requests.last().unwrap().input_ids;
    tokenizer.decode(ids, false).unwrap()
}

async fn assert_completions_served(app: &axum::Router) {
    for (path, body) in [
        ("/v1/completions", r#"{"prompt": "Hi", "max_tokens": 2}"#),
        ("/generate", r#"{"inputs": "Hi"}"#),
    ] {
        let reply = post(app, path, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
    }
}

fn assert_chat_refused(path: &str, reply: &Reply, flag: &str) {
    assert_eq!(
        reply.status,
        StatusCode::BAD_REQUEST,
        "{path}: {}",
        reply.body
    );
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains(flag), "{path}: {message}");
}

#[tokio::test]
async fn a_known_family_without_a_template_chats_in_its_familys_format() {
    let dir = templateless_model_dir("gemma3_text", &GEMMA_TOKENS);
    let (app, backend) = started(&dir, &[]);
    for (path, body) in chats() {
        let reply = post(&app, path, &body.to_string()).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        assert_eq!(last_prompt(&backend, &dir), GEMMA_PROMPT, "{path}");
    }
    assert_completions_served(&app).await;
}

#[tokio::test]
async fn an_unknown_family_without_a_template_serves_completions_and_refuses_chat_naming_the_flag()
{
    let dir = templateless_model_dir("mistral", &[]);
    let (app, backend) = started(&dir, &[]);
    for (path, body) in chats() {
        let reply = post(&app, path, &body.to_string()).await;
        assert_chat_refused(path, &reply, "--chat-template");
    }
    assert!(backend.requests.lock().unwrap().is_empty());
    assert_completions_served(&app).await;
}

#[tokio::test]
async fn disabled_chat_is_refused_even_for_a_known_family() {
    let dir = templateless_model_dir("gemma3_text", &GEMMA_TOKENS);
    let (app, _) = started(&dir, &["--disable-chat-completions"]);
    for (path, body) in chats() {
        let reply = post(&app, path, &body.to_string()).await;
        assert_chat_refused(path, &reply, "--disable-chat-completions");
    }
    assert_completions_served(&app).await;
}
