//! Start-up picks the tool-call syntax from the chat template, `--tool-call-parser` overrides
//! it, and every chat route then shows the tools and constrains the calls in that syntax.

use axum::http::StatusCode;
use serde_json::json;
use tempfile::TempDir;

use super::tests::config;
use super::*;
use crate::http::tests::{handler_config, ids, post, state_with_validator, FakeBackend, Script};
use crate::http::HandlerConfig;
use crate::scheduler::{FinishReason, Grammar};
use crate::validation::testing::{write_model_dir, EOS_ID};
use crate::validation::GrammarCompiler;

/// Shows the template's `tools` by name; its comment holds the Hermes call marker.
const HERMES_STYLE: &str = "{# <tool_call> #}{% for tool in tools or [] %}[{{ tool.function.name }}]{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}";

fn started(dir: &TempDir, flags: &[&str]) -> (axum::Router, Arc<FakeBackend>) {
    let files = ModelFiles::load(dir.path()).unwrap();
    let (validator, decoding, tool_format) = tokenization(files, &config(flags)).unwrap();
    let grammars = GrammarCompiler::load(&dir.path().join("tokenizer.json"), &[EOS_ID]).unwrap();
    let validator = validator.with_grammars(Arc::new(grammars));
    let backend = FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length));
    let handlers = HandlerConfig {
        tool_format,
        ..handler_config(4)
    };
    let state = state_with_validator(backend.clone(), validator, decoding, handlers);
    (http::app(state), backend)
}

/// The grammar and the prompt text the backend received for a required call.
async fn required_call(app: &axum::Router, backend: &FakeBackend) -> (Grammar, Vec<u32>) {
    let body = json!({"max_tokens": 2, "tool_choice": "required",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "now"}}]});
    let reply = post(app, "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let requests = backend.requests.lock().unwrap();
    let request = requests.last().unwrap();
    (request.grammar.clone().unwrap(), request.input_ids.clone())
}

#[tokio::test]
async fn the_template_picks_the_syntax_and_the_flag_overrides_it() {
    let tokenizer_config = json!({"eos_token": "</s>", "chat_template": HERMES_STYLE});
    let dir = write_model_dir(&tokenizer_config, None);
    let (app, backend) = started(&dir, &[]);
    let (grammar, prompt) = required_call(&app, &backend).await;
    assert!(
        matches!(&grammar, Grammar::Lark(lark) if lark.contains("<tool_call>")),
        "{grammar:?}"
    );
    assert_eq!(prompt, ids("[now]Hi"));
    let (app, backend) = started(&dir, &["--tool-call-parser", "tandem"]);
    let (grammar, prompt) = required_call(&app, &backend).await;
    assert!(
        matches!(&grammar, Grammar::JsonSchema(schema) if schema.contains("tool_calls")),
        "{grammar:?}"
    );
    let tokenizer = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let shown = tokenizer.decode(&prompt, false).unwrap();
    assert!(shown.starts_with("You can call these functions"), "{shown}");
}
