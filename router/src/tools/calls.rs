//! Call objects out of generated text as `tool_calls` deltas: first a call's id and name,
//! then its arguments in fragments.
//!
//! Every family writes a call as `{"name": "f", "<arguments key>": {...}}` with `", "` and
//! `": "` separators and names as declared (the grammar fixes the layout), whatever wraps the
//! calls (Tandem's document, Hermes tags, Mistral's list), so the scanner only tracks where it
//! is in a call object and the nesting of the arguments. Work is constant per character.

use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::format::ToolFamily;

/// One call as the response carries it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments object as JSON text, as OpenAI sends it.
    pub arguments: String,
}

/// A fresh call id: OpenAI's `call_...` form, or the 9 letters and digits Mistral's
/// template requires of the ids it renders back.
pub fn call_id(family: ToolFamily) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    match family {
        ToolFamily::Mistral => random[..9].to_owned(),
        _ => format!("call_{random}"),
    }
}

const NAME_OPENING: &str = "{\"name\": \"";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before a call's `{"name": "`.
    SeekName,
    Name(String),
    /// Between the name's closing quote and the arguments value.
    SeekArguments,
    /// The arguments value, until it closes.
    Arguments(JsonValueEnd),
}

/// Turns streamed text of call objects into OpenAI `tool_calls` delta entries.
#[derive(Debug)]
pub struct ToolCallStream {
    family: ToolFamily,
    /// `, "<arguments key>": `, the landmark before a call's arguments.
    arguments_opening: String,
    phase: Phase,
    /// The last characters seen while looking for the next landmark, never longer than it.
    pending: String,
    /// Calls announced so far; the current one is `count - 1`.
    count: usize,
}

impl ToolCallStream {
    /// A scanner for `family`'s call objects.
    pub fn new(family: ToolFamily) -> Self {
        Self {
            family,
            arguments_opening: format!(", \"{}\": ", family.arguments_key()),
            phase: Phase::SeekName,
            pending: String::new(),
            count: 0,
        }
    }

    /// How many calls were announced (a finished document with none is not a call).
    pub fn count(&self) -> usize {
        self.count
    }

    /// The delta entries `text` completes: a call's opening entry as soon as its name is
    /// known, then one entry per run of argument characters.
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
            Phase::SeekName => {
                push_bounded(&mut self.pending, c, NAME_OPENING.len());
                if self.pending.ends_with(NAME_OPENING) {
                    self.pending.clear();
                    self.phase = Phase::Name(String::new());
                }
            }
            Phase::Name(name) if c == '"' => {
                let name = std::mem::take(name);
                deltas.push(
                    json!({"index": self.count, "id": call_id(self.family), "type": "function",
                                   "function": {"name": name, "arguments": ""}}),
                );
                self.count += 1;
                self.phase = Phase::SeekArguments;
            }
            Phase::Name(name) => name.push(c),
            Phase::SeekArguments => {
                push_bounded(&mut self.pending, c, self.arguments_opening.len());
                if self.pending.ends_with(self.arguments_opening.as_str()) {
                    self.pending.clear();
                    self.phase = Phase::Arguments(JsonValueEnd::default());
                }
            }
            Phase::Arguments(value) => {
                arguments.push(c);
                if value.closes_at(c) {
                    self.flush_arguments(arguments, deltas);
                    self.phase = Phase::SeekName;
                }
            }
        }
    }

    fn flush_arguments(&self, arguments: &mut String, deltas: &mut Vec<Value>) {
        if !arguments.is_empty() && self.count > 0 {
            deltas.push(json!({"index": self.count - 1,
                               "function": {"arguments": std::mem::take(arguments)}}));
        }
    }
}

/// Appends `c`, then drops whole characters from the front past `limit` bytes.
fn push_bounded(text: &mut String, c: char, limit: usize) {
    text.push(c);
    while text.len() > limit {
        text.remove(0);
    }
}

/// Finds where a streamed JSON value ends: nesting depth and string state, one character at a time.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct JsonValueEnd {
    depth: u32,
    in_string: bool,
    escaped: bool,
}

impl JsonValueEnd {
    /// Takes the value's next character; true when it closes the outermost object or array.
    pub(super) fn closes_at(&mut self, c: char) -> bool {
        if self.in_string {
            match (c, self.escaped) {
                (_, true) => self.escaped = false,
                ('\\', false) => self.escaped = true,
                ('"', false) => self.in_string = false,
                _ => {}
            }
            return false;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ => {}
        }
        false
    }
}

/// Bytes at the end of `text` that are a proper prefix of `trigger`, on char boundaries.
pub(super) fn trigger_prefix_len(text: &str, trigger: &str) -> usize {
    (1..trigger.len())
        .rev()
        .find(|&len| trigger.is_char_boundary(len) && text.ends_with(&trigger[..len]))
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
