//! A reasoning model's output on every chat surface: the reasoning kept apart from the answer,
//! whole and streamed, and the reasoning settings turned into a template switch or a budget
//! grammar.

use serde_json::json;

use super::*;
use crate::reasoning::ReasoningParser;
use crate::scheduler::Grammar;
use crate::validation::testing::EOS_ID;
use crate::validation::GrammarCompiler;

/// A template that opens the reasoning itself, as DeepSeek-R1's does.
const R1_TEMPLATE: &str = "{% for message in messages %}<|{{ message.role }}|>{{ message.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}";
/// The model's output: its reasoning, the end marker (one byte token at a time), the answer.
const OUTPUT: &str = "Let me see.</think>\n\nHi!";

/// A template switched by `enable_thinking`, as Qwen3's is: off, it closes an empty reasoning.
const QWEN3_TEMPLATE: &str = "{% for message in messages %}<|{{ message.role }}|>{{ message.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

fn reasoning_app(backend: Arc<FakeBackend>) -> axum::Router {
    app_with(backend, R1_TEMPLATE, ReasoningParser::DeepseekR1)
}

fn app_with(backend: Arc<FakeBackend>, template: &str, parser: ReasoningParser) -> axum::Router {
    let tokenizer = Arc::new(testing::tokenizer());
    let template =
        ChatTemplate::new(template.to_owned(), Some("<s>".into()), Some("</s>".into())).unwrap();
    let grammars = GrammarCompiler::from_tokenizer_json(&testing::tokenizer_json(), &[EOS_ID]);
    let limits = Limits {
        max_input_tokens: MAX_INPUT_TOKENS,
        max_total_tokens: MAX_TOTAL_TOKENS,
        max_stop_sequences: 4,
    };
    let validator = Validator::new(Arc::clone(&tokenizer), Ok(template), limits)
        .with_eos_token_ids(vec![EOS_ID])
        .with_grammars(Arc::new(grammars.unwrap()))
        .with_reasoning_parser(Some(parser));
    let state = state_with_validator(
        backend,
        validator,
        TokenDecoding::new(tokenizer),
        handler_config(4),
    );
    app(state)
}

fn thinking_backend() -> Arc<FakeBackend> {
    let mut tokens = ids(OUTPUT);
    tokens.push(EOS_ID);
    FakeBackend::new(Script::Tokens(tokens, FinishReason::Eos))
}

const HI: &str = r#"[{"role": "user", "content": "hi"}]"#;

/// The text of every event's `field` (a JSON pointer), joined.
fn joined(events: &[Value], pointer: &str) -> String {
    events
        .iter()
        .filter_map(|event| event.pointer(pointer).and_then(Value::as_str))
        .collect()
}

/// The grammar the engine was asked to run the last request under.
fn last_grammar(backend: &FakeBackend) -> Option<Grammar> {
    backend
        .requests
        .lock()
        .unwrap()
        .last()
        .unwrap()
        .grammar
        .clone()
}

#[tokio::test]
async fn chat_returns_the_reasoning_apart_from_the_content() {
    let app = reasoning_app(thinking_backend());
    let reply = post(
        &app,
        "/v1/chat/completions",
        &format!(r#"{{"messages": {HI}}}"#),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let message = &reply.json()["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "Let me see.");
    assert_eq!(message["content"], "Hi!");
}

#[tokio::test]
async fn chat_streams_reasoning_deltas_then_content_deltas() {
    let app = reasoning_app(thinking_backend());
    let body = format!(r#"{{"messages": {HI}, "stream": true}}"#);
    let chunks = post(&app, "/v1/chat/completions", &body)
        .await
        .json_events();
    assert_eq!(
        joined(&chunks, "/choices/0/delta/reasoning_content"),
        "Let me see."
    );
    assert_eq!(joined(&chunks, "/choices/0/delta/content"), "Hi!");
    let first_content = chunks.iter().position(|c| {
        c["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    });
    let last_reasoning = chunks
        .iter()
        .rposition(|c| c["choices"][0]["delta"]["reasoning_content"].is_string());
    assert!(last_reasoning < first_content, "{chunks:?}");
}

#[tokio::test]
async fn anthropic_returns_and_streams_a_thinking_block_before_the_text() {
    let app = reasoning_app(thinking_backend());
    let body = format!(r#"{{"max_tokens": 50, "messages": {HI}}}"#);
    let message = post(&app, "/v1/messages", &body).await.json();
    assert_eq!(
        message["content"],
        json!([{"type": "thinking", "thinking": "Let me see.", "signature": ""},
               {"type": "text", "text": "Hi!"}])
    );
    let body = format!(r#"{{"max_tokens": 50, "stream": true, "messages": {HI}}}"#);
    let events = post(&app, "/v1/messages", &body).await.json_events();
    assert_eq!(events[1]["content_block"]["type"], "thinking");
    assert_eq!(joined(&events, "/delta/thinking"), "Let me see.");
    assert_eq!(joined(&events, "/delta/text"), "Hi!");
    let text_start = events
        .iter()
        .position(|e| e["content_block"]["type"] == "text")
        .unwrap();
    assert_eq!(events[text_start]["index"], 1);
}

#[tokio::test]
async fn responses_carry_a_reasoning_item_and_count_its_tokens() {
    let app = reasoning_app(thinking_backend());
    let response = post(&app, "/v1/responses", r#"{"input": "hi"}"#)
        .await
        .json();
    assert_eq!(response["output"][0]["type"], "reasoning");
    assert_eq!(response["output"][0]["content"][0]["text"], "Let me see.");
    assert_eq!(response["output"][1]["content"][0]["text"], "Hi!");
    let reasoning_tokens = ids("Let me see.</think>").len();
    assert_eq!(
        response["usage"]["output_tokens_details"]["reasoning_tokens"],
        reasoning_tokens
    );
    let events = post(&app, "/v1/responses", r#"{"input": "hi", "stream": true}"#)
        .await
        .json_events();
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .collect();
    assert_eq!(
        joined(&deltas.into_iter().cloned().collect::<Vec<_>>(), "/delta"),
        "Let me see."
    );
    let done = events
        .iter()
        .find(|e| e["type"] == "response.reasoning_text.done")
        .unwrap();
    assert_eq!(done["text"], "Let me see.");
    let completed = events.last().unwrap();
    assert_eq!(
        completed["response"]["usage"]["output_tokens_details"]["reasoning_tokens"],
        reasoning_tokens
    );
}

#[tokio::test]
async fn a_reasoning_budget_is_a_grammar_that_bounds_the_reasoning() {
    let backend = thinking_backend();
    let app = reasoning_app(backend.clone());
    let body = format!(
        r#"{{"max_tokens": 50, "messages": {HI}, "thinking": {{"type": "enabled", "budget_tokens": 1024}}}}"#
    );
    assert_eq!(
        post(&app, "/v1/messages", &body).await.status,
        StatusCode::OK
    );
    let Some(Grammar::Lark(lark)) = last_grammar(&backend) else {
        panic!("expected a Lark grammar");
    };
    // The output starts inside the reasoning, where llguidance allows k + 1 tokens.
    assert!(lark.contains("reasoning[max_tokens=1023]"), "{lark}");
    let body = format!(r#"{{"messages": {HI}, "reasoning_effort": "high"}}"#);
    assert_eq!(
        post(&app, "/v1/chat/completions", &body).await.status,
        StatusCode::OK
    );
    assert_eq!(last_grammar(&backend), None);
}

#[tokio::test]
async fn a_response_format_applies_to_the_answer_after_the_reasoning() {
    let backend = thinking_backend();
    let app = reasoning_app(backend.clone());
    let body = format!(r#"{{"messages": {HI}, "response_format": {{"type": "json_object"}}}}"#);
    assert_eq!(
        post(&app, "/v1/chat/completions", &body).await.status,
        StatusCode::OK
    );
    let Some(Grammar::Lark(lark)) = last_grammar(&backend) else {
        panic!("expected a Lark grammar");
    };
    assert!(
        lark.starts_with("start: reasoning think_end BLANKS? answer"),
        "{lark}"
    );
    assert!(lark.contains("answer: %json"), "{lark}");
}

#[tokio::test]
async fn qwen3_effort_none_switches_thinking_off_in_the_template_and_leaves_the_output_whole() {
    let mut tokens = ids("<think>x</think>Hi");
    tokens.push(EOS_ID);
    let backend = FakeBackend::new(Script::Tokens(tokens, FinishReason::Eos));
    let app = app_with(backend.clone(), QWEN3_TEMPLATE, ReasoningParser::Qwen3);
    let body = format!(r#"{{"messages": {HI}, "reasoning_effort": "none"}}"#);
    let message =
        post(&app, "/v1/chat/completions", &body).await.json()["choices"][0]["message"].clone();
    assert_eq!(
        last_prompt(&backend),
        "<|user|>hi\n<|assistant|><think>\n\n</think>\n\n"
    );
    assert_eq!(message["content"], "<think>x</think>Hi");
    assert!(message.get("reasoning_content").is_none(), "{message}");
    assert_eq!(last_grammar(&backend), None);
}

#[tokio::test]
async fn qwen3_with_thinking_on_splits_what_the_model_opens_and_a_budget_makes_it_open() {
    let mut tokens = ids("<think>x</think>Hi");
    tokens.push(EOS_ID);
    let backend = FakeBackend::new(Script::Tokens(tokens, FinishReason::Eos));
    let app = app_with(backend.clone(), QWEN3_TEMPLATE, ReasoningParser::Qwen3);
    let body = format!(r#"{{"messages": {HI}, "reasoning_effort": "low"}}"#);
    let message =
        post(&app, "/v1/chat/completions", &body).await.json()["choices"][0]["message"].clone();
    assert_eq!(last_prompt(&backend), "<|user|>hi\n<|assistant|>");
    assert_eq!(
        (
            message["reasoning_content"].as_str(),
            message["content"].as_str()
        ),
        (Some("x"), Some("Hi"))
    );
    let Some(Grammar::Lark(lark)) = last_grammar(&backend) else {
        panic!("expected a Lark grammar");
    };
    // Here the reasoning follows the opening marker, so llguidance's bound is the budget itself.
    assert!(
        lark.starts_with("start: think_open reasoning think_end answer"),
        "{lark}"
    );
    assert!(lark.contains("reasoning[max_tokens=1024]"), "{lark}");
}
