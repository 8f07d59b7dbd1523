//! Gemma 4's calls out of generated text as `tool_calls` deltas: a call's id and name when its
//! `{` opens, then its arguments rewritten as JSON text in fragments: bare keys quoted, each
//! `<|"|>`-quoted string JSON-escaped between `"`s, other values passed through.
//!
//! A string's tail that may begin its closing quote is held back until the next text decides
//! it, so a quote split across tokens never leaks into the arguments. Work is constant per
//! character.

use serde_json::{json, Value};

use super::calls::{call_id, trigger_prefix_len};
use super::format::ToolFamily;
use super::gemma::{CALL_OPEN, NAME_PREFIX, QUOTE};
use super::xml_calls::{landmark, release};
use super::xml_syntax::ValueKind;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before a call's `<|tool_call>call:`.
    SeekCall,
    Name(String),
    /// A bare key, up to its `:`.
    Key(String),
    /// Between a value's pieces, outside strings.
    Value,
    /// Inside a string; `held` may begin its closing quote.
    Text {
        held: String,
    },
}

/// Turns streamed text of Gemma 4's calls into OpenAI `tool_calls` delta entries.
#[derive(Debug)]
pub struct GemmaCallStream {
    family: ToolFamily,
    call_open: String,
    phase: Phase,
    /// The last characters seen while looking for the next landmark or an opening quote.
    pending: String,
    /// The closing brackets of the objects and arrays open in the current call.
    open: Vec<char>,
    /// Calls announced so far; the current one is `count - 1`.
    count: usize,
}

impl GemmaCallStream {
    pub fn new(family: ToolFamily) -> Self {
        Self {
            family,
            call_open: format!("{CALL_OPEN}{NAME_PREFIX}"),
            phase: Phase::SeekCall,
            pending: String::new(),
            open: Vec::new(),
            count: 0,
        }
    }

    /// How many calls were announced.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The delta entries `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Value> {
        let mut deltas = Vec::new();
        let mut arguments = String::new();
        for c in text.chars() {
            self.step(c, &mut arguments, &mut deltas);
        }
        self.flush_arguments(&mut arguments, &mut deltas);
        deltas
    }

    fn step(&mut self, c: char, arguments: &mut String, deltas: &mut Vec<Value>) {
        match &mut self.phase {
            Phase::SeekCall => {
                if landmark(&mut self.pending, c, &self.call_open) {
                    self.phase = Phase::Name(String::new());
                }
            }
            Phase::Name(name) if c == '{' => {
                deltas.push(json!({"index": self.count, "id": call_id(self.family),
                    "type": "function", "function": {"name": name.trim(), "arguments": ""}}));
                self.count += 1;
                arguments.push('{');
                self.open = vec!['}'];
                self.phase = Phase::Key(String::new());
            }
            Phase::Name(name) => name.push(c),
            Phase::Key(key) if c == ':' => {
                arguments.push_str(&format!("{}: ", json!(key.trim())));
                self.phase = Phase::Value;
            }
            Phase::Key(key) if c == '}' && key.trim().is_empty() => {
                self.close(c, arguments, deltas);
            }
            Phase::Key(key) => key.push(c),
            Phase::Value => self.value_step(c, arguments, deltas),
            Phase::Text { held } => {
                held.push(c);
                if let Some(text) = held.strip_suffix(QUOTE) {
                    release(ValueKind::Raw, text, arguments);
                    arguments.push('"');
                    self.phase = Phase::Value;
                    return;
                }
                let keep = trigger_prefix_len(held, QUOTE);
                let released: String = held.drain(..held.len() - keep).collect();
                release(ValueKind::Raw, &released, arguments);
            }
        }
    }

    /// One character outside strings: a quote opening, a bracket, a comma or a scalar's.
    fn value_step(&mut self, c: char, arguments: &mut String, deltas: &mut Vec<Value>) {
        if c == '<' || !self.pending.is_empty() {
            self.pending.push(c);
            if self.pending == QUOTE {
                self.pending.clear();
                arguments.push('"');
                self.phase = Phase::Text {
                    held: String::new(),
                };
            } else if !QUOTE.starts_with(self.pending.as_str()) {
                self.pending.clear();
            }
            return;
        }
        match c {
            '{' => {
                arguments.push(c);
                self.open.push('}');
                self.phase = Phase::Key(String::new());
            }
            '[' => {
                arguments.push(c);
                self.open.push(']');
            }
            '}' | ']' => self.close(c, arguments, deltas),
            ',' => {
                arguments.push_str(", ");
                if self.open.last() == Some(&'}') {
                    self.phase = Phase::Key(String::new());
                }
            }
            c if c.is_whitespace() => {}
            c => arguments.push(c),
        }
    }

    /// Closes the innermost object or array; closing the arguments ends the call.
    fn close(&mut self, c: char, arguments: &mut String, deltas: &mut Vec<Value>) {
        arguments.push(c);
        self.open.pop();
        self.phase = Phase::Value;
        if self.open.is_empty() {
            self.flush_arguments(arguments, deltas);
            self.phase = Phase::SeekCall;
        }
    }

    fn flush_arguments(&self, arguments: &mut String, deltas: &mut Vec<Value>) {
        if !arguments.is_empty() && self.count > 0 {
            deltas.push(json!({"index": self.count - 1,
                               "function": {"arguments": std::mem::take(arguments)}}));
        }
    }
}

#[cfg(test)]
#[path = "gemma_calls_tests.rs"]
mod tests;
