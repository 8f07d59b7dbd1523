//! Tool calls out of generated text: the whole document at the end, or `tool_calls` deltas
//! while it streams (first the call's id and name, then its arguments in fragments).
//!
//! The grammar (`plan.rs`) fixes the layout (`{"tool_calls": [{"name": "f", "arguments":
//! {...}}, ...]}` with `", "` and `": "` separators, names as declared), so the scanner only
//! tracks where it is in that layout and the nesting of the arguments object.

use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

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

/// A fresh call id in OpenAI's `call_...` form.
pub fn call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

/// The calls in a finished output, or `None` when the output is not a calls document.
pub fn parse(text: &str) -> Option<Vec<ToolCall>> {
    if !text.starts_with('{') {
        return None;
    }
    let document: Value = serde_json::from_str(text).ok()?;
    let calls = document.get("tool_calls")?.as_array()?;
    calls
        .iter()
        .map(|call| {
            Some(ToolCall {
                id: call_id(),
                kind: "function",
                function: FunctionCall {
                    name: call.get("name")?.as_str()?.to_owned(),
                    arguments: call.get("arguments")?.to_string(),
                },
            })
        })
        .collect()
}

const NAME_OPENING: &str = "{\"name\": \"";
const ARGUMENTS_OPENING: &str = ", \"arguments\": ";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before a call's `{"name": "`.
    SeekName,
    Name(String),
    /// Between the name's closing quote and the arguments value.
    SeekArguments,
    Arguments {
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

/// Turns streamed text of a calls document into OpenAI `tool_calls` delta entries.
#[derive(Debug)]
pub struct ToolCallStream {
    phase: Phase,
    /// Text seen since the phase began, while looking for the next landmark.
    pending: String,
    /// Calls announced so far; the current one is `count - 1`.
    count: usize,
}

impl Default for ToolCallStream {
    fn default() -> Self {
        Self {
            phase: Phase::SeekName,
            pending: String::new(),
            count: 0,
        }
    }
}

impl ToolCallStream {
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
                self.pending.push(c);
                if self.pending.ends_with(NAME_OPENING) {
                    self.pending.clear();
                    self.phase = Phase::Name(String::new());
                }
            }
            Phase::Name(name) if c == '"' => {
                let name = std::mem::take(name);
                deltas.push(
                    json!({"index": self.count, "id": call_id(), "type": "function",
                                   "function": {"name": name, "arguments": ""}}),
                );
                self.count += 1;
                self.phase = Phase::SeekArguments;
            }
            Phase::Name(name) => name.push(c),
            Phase::SeekArguments => {
                self.pending.push(c);
                if self.pending.ends_with(ARGUMENTS_OPENING) {
                    self.pending.clear();
                    self.phase = Phase::Arguments {
                        depth: 0,
                        in_string: false,
                        escaped: false,
                    };
                }
            }
            Phase::Arguments {
                depth,
                in_string,
                escaped,
            } => {
                arguments.push(c);
                if *in_string {
                    match (c, *escaped) {
                        (_, true) => *escaped = false,
                        ('\\', false) => *escaped = true,
                        ('"', false) => *in_string = false,
                        _ => {}
                    }
                    return;
                }
                match c {
                    '"' => *in_string = true,
                    '{' | '[' => *depth += 1,
                    '}' | ']' => {
                        *depth = depth.saturating_sub(1);
                        if *depth == 0 {
                            self.flush_arguments(arguments, deltas);
                            self.phase = Phase::SeekName;
                        }
                    }
                    _ => {}
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

/// One choice's streamed output when tools may be called: undecided until the first
/// character (`auto`), then plain content or a calls document.
#[derive(Debug)]
pub enum ChoiceOutput {
    Undecided,
    Content,
    Calls(ToolCallStream),
}

/// What one piece of streamed text becomes in a chunk's `delta`.
#[derive(Debug, PartialEq)]
pub enum DeltaBody {
    Nothing,
    Content(String),
    ToolCalls(Vec<Value>),
}

/// Routes `text` through `output` when the request may call tools, else to plain content.
pub fn route_text(output: Option<&mut ChoiceOutput>, text: String) -> DeltaBody {
    match output {
        Some(output) => output.push(text),
        None if text.is_empty() => DeltaBody::Nothing,
        None => DeltaBody::Content(text),
    }
}

impl ChoiceOutput {
    /// `Calls` from the start when a call is required, else undecided.
    pub fn new(call_required: bool) -> Self {
        if call_required {
            Self::Calls(ToolCallStream::default())
        } else {
            Self::Undecided
        }
    }

    /// Routes `text` to content or to call deltas.
    pub fn push(&mut self, text: String) -> DeltaBody {
        if let Self::Undecided = self {
            match text.chars().next() {
                None => return DeltaBody::Nothing,
                Some('{') => *self = Self::Calls(ToolCallStream::default()),
                Some(_) => *self = Self::Content,
            }
        }
        match self {
            Self::Calls(stream) => {
                let deltas = stream.push(&text);
                if deltas.is_empty() {
                    DeltaBody::Nothing
                } else {
                    DeltaBody::ToolCalls(deltas)
                }
            }
            _ if text.is_empty() => DeltaBody::Nothing,
            _ => DeltaBody::Content(text),
        }
    }

    /// `tool_calls` when the output ended normally as a document with calls.
    pub fn finish_reason(&self, finish: &'static str) -> &'static str {
        match self {
            Self::Calls(stream) if finish == "stop" && stream.count() > 0 => "tool_calls",
            _ => finish,
        }
    }
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
