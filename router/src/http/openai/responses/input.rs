//! `input` turned into chat messages as the chat route writes them: a message's text parts
//! joined by newlines, consecutive function calls one assistant message in the call format the
//! model is shown, and each function call output a `tool` message.

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::request::{ContentPart, InputItem};
use crate::tools::{self, HistoryCalls, ToolFamily};
use crate::validation::{request_rules, serde_wording};
use crate::validation::{ChatMessage, ValidationError};

const ITEM_TYPES: [&str; 4] = [
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
];
const PART_TYPES: [&str; 3] = ["input_text", "output_text", "input_image"];

/// The chat messages of `input`: text is one user message; calls are written for `family`;
/// images take at most `max_image_bytes` each.
pub fn messages(
    input: Value,
    family: ToolFamily,
    max_image_bytes: usize,
) -> Result<Vec<ChatMessage>, ValidationError> {
    let items = match input {
        Value::String(text) => return Ok(vec![ChatMessage::new("user", text)]),
        Value::Array(items) => items,
        other => {
            return Err(ValidationError::OutOfRange {
                param: "input".to_owned(),
                expected: "a string or an array of input items",
                value: other.to_string(),
            })
        }
    };
    let mut messages = Vec::with_capacity(items.len());
    let mut calls = PendingCalls {
        family,
        ..PendingCalls::default()
    };
    for (index, item) in items.into_iter().enumerate() {
        match parse_item(item, index)? {
            InputItem::Reasoning(item) => {
                let text: Vec<String> = item.content.into_iter().map(|part| part.text).collect();
                calls.reasoning = Some(text.join("\n"));
            }
            InputItem::FunctionCall(call) => calls.push(
                index,
                json!({"id": call.call_id, "type": "function",
                       "function": {"name": call.name, "arguments": call.arguments}}),
            ),
            InputItem::Message(message) => {
                calls.flush(&mut messages)?;
                let role = chat_role(&message.role, index)?;
                let param = format!("input[{index}].content");
                let (content, parts) = match parts(message.content, &param)? {
                    Ok(text) => (text, None),
                    Err(parts) => {
                        let sent = parts.into_iter().map(ContentPart::sent);
                        request_rules::message_content(&param, sent, max_image_bytes)?
                    }
                };
                let reasoning = calls.reasoning.take().filter(|_| role == "assistant");
                messages.push(ChatMessage {
                    reasoning_content: reasoning.clone(),
                    thinking: reasoning,
                    parts,
                    ..ChatMessage::new(role, content)
                });
            }
            InputItem::FunctionCallOutput(output) => {
                calls.flush(&mut messages)?;
                let content = text(output.output, &format!("input[{index}].output"))?;
                messages.push(ChatMessage {
                    tool_call_id: Some(output.call_id),
                    ..ChatMessage::new("tool", content)
                });
            }
        }
    }
    calls.flush(&mut messages)?;
    Ok(messages)
}

/// Function calls in a row, written as one assistant message once the row ends.
#[derive(Debug, Default)]
struct PendingCalls {
    family: ToolFamily,
    first_index: usize,
    calls: Vec<Value>,
    /// The reasoning item before the next assistant turn, which carries it.
    reasoning: Option<String>,
}

impl PendingCalls {
    fn push(&mut self, index: usize, call: Value) {
        if self.calls.is_empty() {
            self.first_index = index;
        }
        self.calls.push(call);
    }

    fn flush(&mut self, messages: &mut Vec<ChatMessage>) -> Result<(), ValidationError> {
        if self.calls.is_empty() {
            return Ok(());
        }
        let calls = Value::Array(std::mem::take(&mut self.calls));
        let param = format!("input[{}].arguments", self.first_index);
        let message = match tools::history(self.family, calls, &param)? {
            HistoryCalls::Text(text) => ChatMessage::new("assistant", text),
            HistoryCalls::Native(calls) => ChatMessage {
                tool_calls: Some(calls),
                ..ChatMessage::new("assistant", "")
            },
        };
        let reasoning = self.reasoning.take();
        messages.push(ChatMessage {
            reasoning_content: reasoning.clone(),
            thinking: reasoning,
            ..message
        });
        Ok(())
    }
}

/// `developer` messages are system messages, as chat templates know no other name.
fn chat_role(role: &str, index: usize) -> Result<&'static str, ValidationError> {
    match role {
        "user" => Ok("user"),
        "assistant" => Ok("assistant"),
        "system" | "developer" => Ok("system"),
        other => Err(ValidationError::OutOfRange {
            param: format!("input[{index}].role"),
            expected: "\"user\", \"assistant\", \"system\" or \"developer\"",
            value: format!("{other:?}"),
        }),
    }
}

/// An item, its `type` defaulting to `message`; a type Tandem does not serve is named.
fn parse_item(mut item: Value, index: usize) -> Result<InputItem, ValidationError> {
    if let Some(fields) = item.as_object_mut() {
        fields
            .entry("type")
            .or_insert_with(|| Value::from("message"));
    }
    parse(
        item,
        &format!("input[{index}]"),
        &ITEM_TYPES,
        "a `message`, `function_call`, `function_call_output` or `reasoning` item",
        "items",
    )
}

/// A message's or an output's content at `param`: its text (`Ok`), or its parts.
fn parts(content: Value, param: &str) -> Result<Result<String, Vec<ContentPart>>, ValidationError> {
    let parts = match content {
        Value::String(text) => return Ok(Ok(text)),
        Value::Array(parts) => parts,
        other => {
            return Err(ValidationError::OutOfRange {
                param: param.to_owned(),
                expected:
                    "a string or an array of `input_text`, `output_text` or `input_image` parts",
                value: other.to_string(),
            })
        }
    };
    let parsed = parts.into_iter().enumerate().map(|(index, part)| {
        parse(
            part,
            &format!("{param}[{index}]"),
            &PART_TYPES,
            "an `input_text`, `output_text` or `input_image` part",
            "content",
        )
    });
    parsed.collect::<Result<_, _>>().map(Err)
}

/// An output's text: a string, or text parts joined by newlines (an output holds no image).
fn text(content: Value, param: &str) -> Result<String, ValidationError> {
    match parts(content, param)? {
        Ok(text) => Ok(text),
        Err(parts) if parts.iter().any(ContentPart::is_image) => {
            Err(ValidationError::Unsupported {
                param: param.to_owned(),
                detail: ": images in a function call's output".to_owned(),
            })
        }
        Err(parts) => {
            let sent = parts.into_iter().map(ContentPart::sent);
            Ok(request_rules::message_content(param, sent, 0)?.0)
        }
    }
}

/// Parses a tagged `value`: a known type with bad fields is out of range, another type is
/// unsupported (`what` of type `...`).
fn parse<T: DeserializeOwned>(
    value: Value,
    param: &str,
    known: &[&str],
    expected: &'static str,
    what: &str,
) -> Result<T, ValidationError> {
    let kind = value.get("type").and_then(Value::as_str).map(str::to_owned);
    serde_json::from_value(value).map_err(|error| match kind {
        Some(kind) if !known.contains(&kind.as_str()) => ValidationError::Unsupported {
            param: format!("{param}.type"),
            detail: format!(": {what} of type `{kind}`"),
        },
        _ => ValidationError::OutOfRange {
            param: param.to_owned(),
            expected,
            value: serde_wording::error_text(&error),
        },
    })
}
