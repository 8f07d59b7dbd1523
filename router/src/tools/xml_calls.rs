//! XML-style calls (and DSML's) out of generated text as `tool_calls` deltas: a call's id and name as soon
//! as the name is closed, then its arguments as JSON text in fragments (`{"key": ` when a
//! parameter's name is closed, its value as it streams, `}` at the call's end).
//!
//! Raw values are JSON-escaped into a string; JSON values pass through. A value's tail that
//! may begin its closing marker is held back until the next text decides it, so a marker
//! split across tokens never leaks into the arguments. Work is constant per character.

use serde_json::{json, Value};

use super::calls::{call_id, trigger_prefix_len};
use super::format::ToolFamily;
use super::xml_syntax::{ValueKind, ValueKinds, XmlSyntax};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before a call's opening (`<tool_call>` and the name's opening).
    SeekCall,
    Name(String),
    /// After the name or a value: a parameter's name or the call's end follows.
    SeekParameter,
    Key(String),
    Value {
        kind: ValueKind,
        /// Text that may begin the closing marker (or, for JSON, that marker's whole tail).
        held: String,
        in_string: bool,
        escaped: bool,
    },
}

/// Turns streamed text of one XML family's calls into OpenAI `tool_calls` delta entries.
#[derive(Debug)]
pub struct XmlCallStream {
    family: ToolFamily,
    syntax: &'static XmlSyntax,
    kinds: ValueKinds,
    call_open: String,
    call_end: String,
    phase: Phase,
    /// The last characters seen while looking for the next landmark, never longer than it.
    pending: String,
    /// Calls announced so far; the current one is `count - 1`.
    count: usize,
    /// The current call's name and how many parameters it has written.
    name: String,
    parameters: usize,
}

impl XmlCallStream {
    /// A scanner for `family`'s calls, reading values back by `kinds`.
    pub fn new(family: ToolFamily, syntax: &'static XmlSyntax, kinds: ValueKinds) -> Self {
        Self {
            family,
            syntax,
            kinds,
            call_open: syntax.call_open(),
            call_end: syntax.call_end(),
            phase: Phase::SeekCall,
            pending: String::new(),
            count: 0,
            name: String::new(),
            parameters: 0,
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
        let syntax = self.syntax;
        match &mut self.phase {
            Phase::SeekCall => {
                if landmark(&mut self.pending, c, &self.call_open) {
                    self.phase = Phase::Name(String::new());
                }
            }
            Phase::Name(name) => {
                name.push(c);
                if let Some(name) = name.strip_suffix(syntax.name_close) {
                    self.name = name.to_owned();
                    self.parameters = 0;
                    deltas.push(json!({"index": self.count, "id": call_id(self.family),
                        "type": "function", "function": {"name": self.name, "arguments": ""}}));
                    self.count += 1;
                    self.phase = Phase::SeekParameter;
                }
            }
            Phase::SeekParameter => {
                push_bounded(
                    &mut self.pending,
                    c,
                    syntax.key_open.len().max(self.call_end.len()),
                );
                if self.pending.ends_with(syntax.key_open) {
                    self.pending.clear();
                    self.phase = Phase::Key(String::new());
                } else if self.pending.ends_with(self.call_end.as_str()) {
                    self.pending.clear();
                    arguments.push_str(if self.parameters == 0 { "{}" } else { "}" });
                    self.flush_arguments(arguments, deltas);
                    self.phase = Phase::SeekCall;
                }
            }
            Phase::Key(key) => {
                key.push(c);
                if let Some((key, said)) = syntax.close_key(key) {
                    let kind = said.unwrap_or_else(|| self.kinds.kind(&self.name, key));
                    let separator = if self.parameters == 0 { "{" } else { ", " };
                    arguments.push_str(&format!("{separator}{}: ", json!(key)));
                    if kind == ValueKind::Raw {
                        arguments.push('"');
                    }
                    self.parameters += 1;
                    self.phase = Phase::Value {
                        kind,
                        held: String::new(),
                        in_string: false,
                        escaped: false,
                    };
                }
            }
            Phase::Value { .. } => self.value_step(c, arguments),
        }
    }

    /// One character of a value: released unless it may begin the closing marker.
    fn value_step(&mut self, c: char, arguments: &mut String) {
        let close = self.syntax.value_close;
        let Phase::Value {
            kind,
            held,
            in_string,
            escaped,
        } = &mut self.phase
        else {
            return;
        };
        let kind = *kind;
        // Inside a JSON string the closing marker is text: only outside one may it end.
        let quoted = kind == ValueKind::Json && (*in_string || c == '"');
        if kind == ValueKind::Json {
            match (c, *in_string, *escaped) {
                (_, true, true) => *escaped = false,
                ('\\', true, false) => *escaped = true,
                ('"', _, false) => *in_string = !*in_string,
                _ => {}
            }
        }
        held.push(c);
        if !quoted && held.ends_with(close) {
            let value = &held[..held.len() - close.len()];
            release(kind, value, arguments);
            if kind == ValueKind::Raw {
                arguments.push('"');
            }
            self.phase = Phase::SeekParameter;
            return;
        }
        let keep = if quoted {
            0
        } else {
            trigger_prefix_len(held, close)
        };
        let released: String = held.drain(..held.len() - keep).collect();
        release(kind, &released, arguments);
    }

    fn flush_arguments(&self, arguments: &mut String, deltas: &mut Vec<Value>) {
        if !arguments.is_empty() && self.count > 0 {
            deltas.push(json!({"index": self.count - 1,
                               "function": {"arguments": std::mem::take(arguments)}}));
        }
    }
}

/// Appends a value's text as its JSON: raw text escaped into the open string.
pub(super) fn release(kind: ValueKind, text: &str, arguments: &mut String) {
    match kind {
        ValueKind::Json => arguments.push_str(text),
        ValueKind::Raw => {
            let quoted = json!(text).to_string();
            arguments.push_str(&quoted[1..quoted.len() - 1]);
        }
    }
}

/// Whether `pending`, with `c` appended, ends with `landmark` (then cleared).
pub(super) fn landmark(pending: &mut String, c: char, landmark: &str) -> bool {
    push_bounded(pending, c, landmark.len());
    let found = pending.ends_with(landmark);
    if found {
        pending.clear();
    }
    found
}

/// Appends `c`, then drops whole characters from the front past `limit` bytes.
fn push_bounded(text: &mut String, c: char, limit: usize) {
    text.push(c);
    while text.len() > limit {
        text.remove(0);
    }
}

#[cfg(test)]
#[path = "xml_calls_tests.rs"]
mod tests;
