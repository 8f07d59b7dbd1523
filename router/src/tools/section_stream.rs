//! A sectioned family's calls (`section.rs`) out of streamed text as `tool_calls` deltas: a
//! call's id and name once its header is closed by the arguments marker, then its arguments
//! in fragments as they arrive.
//!
//! Markers may arrive split over deltas or several in one delta: only the last characters that
//! may still complete a marker are kept, so the work is constant per character.

use serde_json::{json, Value};

use super::calls::{call_id, JsonValueEnd};
use super::format::ToolFamily;
use super::section::{Marker, SectionSyntax};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before a call's opening marker.
    SeekCall,
    /// A call's header, until the arguments marker.
    Header(String),
    /// The arguments value, until it closes.
    Arguments(JsonValueEnd),
    /// After the section's closing marker: nothing more is a call.
    Closed,
}

/// Turns a sectioned family's streamed calls into OpenAI `tool_calls` delta entries.
#[derive(Debug)]
pub struct SectionStream {
    family: ToolFamily,
    syntax: &'static SectionSyntax,
    phase: Phase,
    /// The last characters seen while looking for a call's opening or the section's end,
    /// never longer than the longer of the two.
    pending: String,
    /// Calls announced so far; the current one is `count - 1`.
    count: usize,
}

impl SectionStream {
    /// A parser for `family`'s calls written in `syntax`.
    pub fn new(family: ToolFamily, syntax: &'static SectionSyntax) -> Self {
        Self {
            family,
            syntax,
            phase: Phase::SeekCall,
            pending: String::new(),
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
                let (opening, closing) = (
                    self.syntax.marker(Marker::CallBegin),
                    self.syntax.marker(Marker::SectionEnd),
                );
                push_bounded(&mut self.pending, c, opening.len().max(closing.len()));
                if self.pending.ends_with(opening) {
                    self.pending.clear();
                    self.phase = Phase::Header(String::new());
                } else if self.pending.ends_with(closing) {
                    self.pending.clear();
                    self.phase = Phase::Closed;
                }
            }
            Phase::Header(header) => {
                header.push(c);
                let arguments_begin = self.syntax.marker(Marker::ArgumentsBegin);
                if let Some(header) = header.strip_suffix(arguments_begin).map(str::to_owned) {
                    let opening = self.opening_delta(&header);
                    deltas.push(opening);
                    self.count += 1;
                    self.phase = Phase::Arguments(JsonValueEnd::default());
                }
            }
            Phase::Arguments(value) => {
                arguments.push(c);
                if value.closes_at(c) {
                    self.flush_arguments(arguments, deltas);
                    self.phase = Phase::SeekCall;
                }
            }
            Phase::Closed => {}
        }
    }

    /// The entry that opens a call: Kimi's header is its id, other families get a fresh one.
    fn opening_delta(&self, header: &str) -> Value {
        let (name, id) = self.syntax.read_header(header).unwrap_or((header, None));
        let id = id.map_or_else(|| call_id(self.family), str::to_owned);
        json!({"index": self.count, "id": id, "type": "function",
               "function": {"name": name, "arguments": ""}})
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

#[cfg(test)]
#[path = "section_stream_tests.rs"]
pub(crate) mod tests;
