//! Reads the answer stream `channels.rs` writes into content and OpenAI `tool_calls` deltas:
//! text is content until a call's normalized header, `<|channel|>commentary
//! to=functions.NAME<|message|>`, announces a call; its arguments run to `<|call|>`, and
//! content may follow. Work is constant per character, however the text is cut.

use serde_json::{json, Value};

use super::{partial_marker_len, CALL, CHANNEL, FUNCTIONS, MESSAGE};

#[derive(Debug)]
enum Phase {
    /// Content; `held` may begin a call's header.
    Content { held: String },
    /// Inside a call's header, collected until `<|message|>` (bounded by `channels.rs`).
    Header(String),
    /// A call's arguments; `held` may begin `<|call|>`.
    Arguments { held: String },
}

/// One choice's answer reader.
#[derive(Debug)]
pub struct HarmonyAnswer {
    phase: Phase,
    /// Calls announced so far; the current one is `count - 1`.
    count: usize,
}

impl Default for HarmonyAnswer {
    fn default() -> Self {
        Self::new()
    }
}

impl HarmonyAnswer {
    pub fn new() -> Self {
        Self {
            phase: Phase::Content {
                held: String::new(),
            },
            count: 0,
        }
    }

    /// How many calls were announced.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The content and `tool_calls` delta entries `text` completes.
    pub fn push(&mut self, text: &str) -> (String, Vec<Value>) {
        let mut content = String::new();
        let mut deltas = Vec::new();
        let mut rest = text.to_owned();
        while let Some(next) = self.step(rest, &mut content, &mut deltas) {
            rest = next;
        }
        (content, deltas)
    }

    /// The text held back at the end: content that never became a call's header.
    pub fn finish(&mut self) -> String {
        match &mut self.phase {
            Phase::Content { held } => std::mem::take(held),
            _ => String::new(),
        }
    }

    fn step(
        &mut self,
        text: String,
        content: &mut String,
        deltas: &mut Vec<Value>,
    ) -> Option<String> {
        match &mut self.phase {
            Phase::Content { held } => {
                let mut text = std::mem::take(held) + &text;
                if let Some(at) = text.find(CHANNEL) {
                    let rest = text.split_off(at + CHANNEL.len());
                    text.truncate(at);
                    content.push_str(&text);
                    self.phase = Phase::Header(String::new());
                    return Some(rest).filter(|rest| !rest.is_empty());
                }
                *held = text.split_off(text.len() - partial_marker_len(&text, &[CHANNEL]));
                content.push_str(&text);
                None
            }
            Phase::Header(header) => {
                header.push_str(&text);
                let at = header.find(MESSAGE)?;
                let rest = header.split_off(at + MESSAGE.len());
                let name = header[..at]
                    .split_once(FUNCTIONS)
                    .map_or("", |(_, name)| name);
                deltas.push(
                    json!({"index": self.count, "id": call_id(), "type": "function",
                                   "function": {"name": name, "arguments": ""}}),
                );
                self.count += 1;
                self.phase = Phase::Arguments {
                    held: String::new(),
                };
                Some(rest).filter(|rest| !rest.is_empty())
            }
            Phase::Arguments { held } => {
                let mut text = std::mem::take(held) + &text;
                let (arguments, rest) = match text.find(CALL) {
                    Some(at) => {
                        let rest = text.split_off(at + CALL.len());
                        text.truncate(at);
                        (text, Some(rest))
                    }
                    None => {
                        *held = text.split_off(text.len() - partial_marker_len(&text, &[CALL]));
                        (text, None)
                    }
                };
                if !arguments.is_empty() {
                    deltas.push(json!({"index": self.count - 1,
                                       "function": {"arguments": arguments}}));
                }
                if rest.is_some() {
                    self.phase = Phase::Content {
                        held: String::new(),
                    };
                }
                rest.filter(|rest| !rest.is_empty())
            }
        }
    }
}

/// A fresh call id in OpenAI's `call_...` form.
fn call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
