//! The non-streamed `/v1/chat/completions` response: the whole completion as one JSON body.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::generation::Completed;
use crate::http::openai::logprobs::chat_logprobs;
use crate::http::openai::{finish_reason, ResponseMeta, Usage};
use crate::stream::TokenDecoding;
use crate::tools::{parse_output, ToolCall, ToolPlan};

/// A chat completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<ChatChoice>,
    usage: Usage,
}

/// One choice of a chat completion.
#[derive(Debug, Serialize, ToSchema)]
struct ChatChoice {
    index: usize,
    message: AssistantMessage,
    /// With `logprobs: true`: `{content: [{token, logprob, bytes, top_logprobs}], refusal: null}`.
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
    /// `stop` or `length`.
    finish_reason: &'static str,
}

/// The generated message.
#[derive(Debug, Serialize, ToSchema)]
struct AssistantMessage {
    role: &'static str,
    /// `null` when the model called tools.
    content: Option<String>,
    /// A reasoning model's reasoning, split off its answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCall>>,
    /// Always `null`: the model never refuses through a separate channel.
    refusal: Option<String>,
}

impl ChatCompletion {
    /// The completion of every choice; with tools the model may call (`callable`), a
    /// choice's calls become its `tool_calls`.
    pub fn new(
        meta: ResponseMeta,
        completed: Vec<Completed>,
        decoding: Option<&TokenDecoding>,
        callable: Option<&ToolPlan>,
    ) -> Self {
        let prompt_tokens = completed.first().map_or(0, |choice| choice.input_tokens);
        let cached_tokens = completed.first().map_or(0, |choice| choice.cached_tokens);
        let completion_tokens = completed.iter().map(|choice| choice.tokens.len()).sum();
        let reasoning_tokens: Option<usize> = completed
            .iter()
            .map(|choice| choice.reasoning.as_ref().map(|reasoning| reasoning.tokens))
            .sum();
        let choices = completed
            .into_iter()
            .enumerate()
            .map(|(index, choice)| ChatChoice {
                index,
                logprobs: decoding.map(|decoding| chat_logprobs(&choice.tokens, decoding)),
                finish_reason: finish_reason(choice.finish),
                message: AssistantMessage {
                    role: "assistant",
                    reasoning_content: choice
                        .reasoning
                        .map(|reasoning| reasoning.text)
                        .filter(|text| !text.is_empty()),
                    content: Some(choice.text),
                    tool_calls: None,
                    refusal: None,
                },
            });
        let choices = match callable {
            Some(plan) => choices
                .map(|choice| with_tool_calls(choice, plan))
                .collect(),
            None => choices.collect(),
        };
        ChatCompletion {
            id: meta.id,
            object: "chat.completion",
            created: meta.created,
            model: meta.model,
            choices,
            usage: {
                let usage =
                    Usage::new(prompt_tokens, completion_tokens).with_cached_tokens(cached_tokens);
                match reasoning_tokens {
                    Some(tokens) => usage.with_reasoning_tokens(tokens),
                    None => usage,
                }
            },
        }
    }
}

/// Moves calls out of `content` into `tool_calls` (finish reason `tool_calls`); text before
/// them stays the content.
fn with_tool_calls(mut choice: ChatChoice, plan: &ToolPlan) -> ChatChoice {
    let text = choice.message.content.take().unwrap_or_default();
    let parsed = parse_output(plan, &text);
    if !parsed.calls.is_empty() {
        if choice.finish_reason == "stop" {
            choice.finish_reason = "tool_calls";
        }
        choice.message.tool_calls = Some(parsed.calls);
    }
    choice.message.content = parsed.content;
    choice
}
