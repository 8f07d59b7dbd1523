//! The `message` object `/v1/messages` answers with, and how a finished output becomes one.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::generation::CompletedReasoning;
use crate::stream::Finish;
use crate::tools::{parse_output, ParsedOutput, ToolPlan};

/// A generated message.
#[derive(Debug, Serialize, ToSchema)]
pub struct Message {
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    pub model: String,
    pub content: Vec<OutputBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: &'static str,
    /// The stop sequence that ended the message, with `stop_reason: "stop_sequence"`.
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

/// A content block of the answer.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBlock {
    /// A reasoning model's reasoning; `signature` is always empty (Tandem signs nothing).
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

/// Token accounting of one message, as Anthropic counts it: the prompt is `input_tokens`
/// computed plus `cache_read_input_tokens` served by the prefix cache (Tandem writes to the
/// cache without charge, so `cache_creation_input_tokens` is always 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct MessageUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

impl MessageUsage {
    /// A prompt of `prompt_tokens`, `cached_tokens` of them from the prefix cache, and
    /// `output_tokens` generated.
    pub fn new(prompt_tokens: usize, cached_tokens: usize, output_tokens: usize) -> Self {
        let cached_tokens = cached_tokens.min(prompt_tokens);
        Self {
            input_tokens: prompt_tokens - cached_tokens,
            output_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached_tokens,
        }
    }
}

/// `POST /v1/messages/count_tokens` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCount {
    /// Tokens of the rendered conversation, tool descriptions included.
    pub input_tokens: usize,
}

/// A fresh message id in Anthropic's `msg_...` form.
pub fn message_id() -> String {
    format!("msg_{}", uuid::Uuid::new_v4().simple())
}

/// A fresh tool call id in Anthropic's `toolu_...` form.
pub fn tool_use_id() -> String {
    format!("toolu_{}", uuid::Uuid::new_v4().simple())
}

/// Why a message ended, as Anthropic names it: a stop of the model's own after tool calls is
/// `tool_use`.
pub fn stop_reason(finish: Finish, called_tools: bool) -> &'static str {
    match finish {
        Finish::Length => "max_tokens",
        Finish::StopSequence => "stop_sequence",
        Finish::EosToken if called_tools => "tool_use",
        Finish::EosToken => "end_turn",
    }
}

/// The blocks of a finished output: its reasoning (when split off and not empty), then the
/// answer's blocks.
pub fn blocks_with_thinking(
    reasoning: Option<CompletedReasoning>,
    text: String,
    callable: Option<&ToolPlan>,
) -> Vec<OutputBlock> {
    let thinking = reasoning
        .filter(|reasoning| !reasoning.text.is_empty())
        .map(|reasoning| OutputBlock::Thinking {
            thinking: reasoning.text,
            signature: String::new(),
        });
    thinking
        .into_iter()
        .chain(output_blocks(text, callable))
        .collect()
}

/// The blocks of a finished output: its text (none when empty), then its calls as
/// `tool_use` blocks when tools may be called (`callable`).
pub fn output_blocks(text: String, callable: Option<&ToolPlan>) -> Vec<OutputBlock> {
    let parsed = match callable {
        Some(plan) => parse_output(plan, &text),
        None => ParsedOutput {
            content: Some(text),
            calls: Vec::new(),
        },
    };
    let text = parsed
        .content
        .filter(|text| !text.is_empty())
        .map(|text| OutputBlock::Text { text });
    let calls = parsed.calls.into_iter().map(|call| OutputBlock::ToolUse {
        id: tool_use_id(),
        name: call.function.name,
        // Complete calls only: `parse_output` keeps an output with broken arguments as text.
        input: serde_json::from_str(&call.function.arguments).unwrap_or_default(),
    });
    text.into_iter().chain(calls).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_calls_document_becomes_tool_use_blocks_only_when_tools_are_callable() {
        let document =
            r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}"#;
        let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let plan = crate::tools::plan(Some(tools), None, None)
            .unwrap()
            .unwrap();
        let callable = Some(&plan);
        let blocks = output_blocks(document.to_owned(), callable);
        match blocks.as_slice() {
            [OutputBlock::ToolUse { id, name, input }] => {
                assert!(id.starts_with("toolu_"));
                assert_eq!(name, "get_weather");
                assert_eq!(input, &json!({"city": "Paris"}));
            }
            other => panic!("expected one tool_use block, got {other:?}"),
        }
        assert_eq!(
            output_blocks(document.to_owned(), None),
            vec![OutputBlock::Text {
                text: document.to_owned()
            }]
        );
        assert!(output_blocks(String::new(), callable).is_empty());
        assert_eq!(
            output_blocks("Sunny.".into(), callable),
            vec![OutputBlock::Text {
                text: "Sunny.".into()
            }]
        );
    }

    #[test]
    fn stop_reasons_follow_anthropic_names() {
        assert_eq!(stop_reason(Finish::Length, true), "max_tokens");
        assert_eq!(stop_reason(Finish::StopSequence, false), "stop_sequence");
        assert_eq!(stop_reason(Finish::EosToken, true), "tool_use");
        assert_eq!(stop_reason(Finish::EosToken, false), "end_turn");
    }
}
