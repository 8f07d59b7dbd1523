//! One choice's output when tools may be called, split into content and `tool_calls` deltas
//! as it streams, or whole at the end (the same machine run over the finished text).
//!
//! Where calls start depends on the family. Tandem, Llama and Mistral calls open the output
//! (the grammar keeps plain text from starting with `{`, `[` or a blank, and Mistral's
//! `[TOOL_CALLS]` token decodes to no text), so the first character decides. Hermes calls
//! follow free text at the first `<tool_call>`: text that may be the start of the trigger is
//! held back until the next text decides it, so a trigger split across tokens is never shown
//! as content. Work is constant per character, however the text is cut into deltas.

use serde_json::Value;

use super::calls::{FunctionCall, ToolCall, ToolCallStream};
use super::format::{ToolFamily, HERMES_TRIGGER};
use super::plan::{ToolChoice, ToolPlan};
use crate::harmony::HarmonyAnswer;

/// What one piece of streamed text becomes in a chunk's `delta`.
#[derive(Debug, PartialEq)]
pub enum DeltaBody {
    Nothing,
    Content(String),
    ToolCalls(Vec<Value>),
    /// Text before a Hermes trigger, then the calls it opened (one multi-token delta).
    ContentThenCalls(String, Vec<Value>),
}

impl DeltaBody {
    /// This body and then `next` as one delta. `next` is what `ChoiceOutput::finish`
    /// releases: held text, which only follows content, never calls.
    pub fn followed_by(self, next: DeltaBody) -> DeltaBody {
        let (mut content, mut calls) = self.into_parts();
        let (more_content, more_calls) = next.into_parts();
        content.push_str(&more_content);
        calls.extend(more_calls);
        content_and_calls(content, calls)
    }

    /// The content, then the `tool_calls` delta entries.
    pub fn into_parts(self) -> (String, Vec<Value>) {
        match self {
            Self::Nothing => (String::new(), Vec::new()),
            Self::Content(text) => (text, Vec::new()),
            Self::ToolCalls(calls) => (String::new(), calls),
            Self::ContentThenCalls(text, calls) => (text, calls),
        }
    }
}

#[derive(Debug)]
enum State {
    /// Nothing but blanks seen yet (families whose calls open the output).
    Undecided,
    Content,
    /// Hermes content; `held` is a tail that may begin the trigger.
    BeforeTrigger {
        held: String,
    },
    Calls(ToolCallStream),
    /// Harmony's answer stream (`crate::harmony`): content and calls in any order.
    Harmony(HarmonyAnswer),
}

/// Routes one choice's text to content or to call deltas.
#[derive(Debug)]
pub struct ChoiceOutput {
    family: ToolFamily,
    state: State,
    /// Whether a call is required.
    required: bool,
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
    /// The output of one choice in `family`'s syntax: calls from the start when a call is
    /// required.
    pub fn new(family: ToolFamily, call_required: bool) -> Self {
        let state = match (call_required, family) {
            (_, ToolFamily::Harmony) => State::Harmony(HarmonyAnswer::new()),
            (true, _) => State::Calls(ToolCallStream::new(family)),
            (false, ToolFamily::Hermes) => State::BeforeTrigger {
                held: String::new(),
            },
            (false, _) => State::Undecided,
        };
        Self {
            family,
            state,
            required: call_required,
        }
    }

    /// The output of one choice under `plan`.
    pub fn for_plan(plan: &ToolPlan) -> Self {
        Self::new(plan.format.family, plan.choice != ToolChoice::Auto)
    }

    /// This output, before any text, in `family`'s syntax.
    #[must_use]
    pub fn in_family(self, family: ToolFamily) -> Self {
        Self::new(family, self.required)
    }

    /// Routes `text` to content or to call deltas.
    pub fn push(&mut self, text: String) -> DeltaBody {
        match &mut self.state {
            State::Undecided => match text.chars().next() {
                None => DeltaBody::Nothing,
                Some(first) if opens_calls(self.family, first) => {
                    self.state = State::Calls(ToolCallStream::new(self.family));
                    self.push(text)
                }
                Some(_) => {
                    self.state = State::Content;
                    DeltaBody::Content(text)
                }
            },
            State::Content if text.is_empty() => DeltaBody::Nothing,
            State::Content => DeltaBody::Content(text),
            State::BeforeTrigger { held } => {
                let mut text = std::mem::take(held) + &text;
                match text.find(HERMES_TRIGGER) {
                    Some(start) => {
                        let calls = text.split_off(start);
                        let mut stream = ToolCallStream::new(self.family);
                        let deltas = stream.push(&calls);
                        self.state = State::Calls(stream);
                        content_and_calls(text, deltas)
                    }
                    None => {
                        *held = text.split_off(text.len() - trigger_prefix_len(&text));
                        content_and_calls(text, Vec::new())
                    }
                }
            }
            State::Calls(stream) => content_and_calls(String::new(), stream.push(&text)),
            State::Harmony(answer) => {
                let (content, calls) = answer.push(&text);
                content_and_calls(content, calls)
            }
        }
    }

    /// The text held back at the end of the output: it never became a trigger.
    pub fn finish(&mut self) -> DeltaBody {
        match &mut self.state {
            State::BeforeTrigger { held } => content_and_calls(std::mem::take(held), Vec::new()),
            State::Harmony(answer) => content_and_calls(answer.finish(), Vec::new()),
            _ => DeltaBody::Nothing,
        }
    }

    /// `tool_calls` when the output ended normally with calls.
    pub fn finish_reason(&self, finish: &'static str) -> &'static str {
        match &self.state {
            State::Calls(stream) if finish == "stop" && stream.count() > 0 => "tool_calls",
            State::Harmony(answer) if finish == "stop" && answer.count() > 0 => "tool_calls",
            _ => finish,
        }
    }
}

/// Whether an output whose first character is `first` is calls: `{` opens Tandem's document
/// and Llama's calls; Mistral's list follows its trigger, which decodes to nothing or to
/// `[TOOL_CALLS]`, so `[` or a blank (plain text starts with neither).
fn opens_calls(family: ToolFamily, first: char) -> bool {
    match family {
        ToolFamily::Mistral => first == '[' || first.is_whitespace(),
        _ => first == '{',
    }
}

fn content_and_calls(content: String, calls: Vec<Value>) -> DeltaBody {
    match (content.is_empty(), calls.is_empty()) {
        (true, true) => DeltaBody::Nothing,
        (false, true) => DeltaBody::Content(content),
        (true, false) => DeltaBody::ToolCalls(calls),
        (false, false) => DeltaBody::ContentThenCalls(content, calls),
    }
}

/// Bytes at the end of `text` that are a proper prefix of the trigger (on a char boundary,
/// as the trigger is ASCII).
fn trigger_prefix_len(text: &str) -> usize {
    (1..HERMES_TRIGGER.len())
        .rev()
        .find(|&len| text.ends_with(&HERMES_TRIGGER[..len]))
        .unwrap_or(0)
}

/// A finished output: its content (`None` when only blanks precede the calls) and calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedOutput {
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

/// Splits a finished output under `plan` into content and calls.
pub fn parse_output(plan: &ToolPlan, text: &str) -> ParsedOutput {
    let mut output = ChoiceOutput::for_plan(plan);
    let body = output.push(text.to_owned()).followed_by(output.finish());
    let (content, deltas) = body.into_parts();
    let mut calls: Vec<ToolCall> = Vec::new();
    for delta in deltas {
        merge_delta(&mut calls, &delta);
    }
    let complete = calls.iter().all(|call| {
        serde_json::from_str::<Value>(&call.function.arguments).is_ok_and(|a| a.is_object())
    });
    if calls.is_empty() || !complete {
        // Not calls, or calls cut short (by `max_tokens`): the text is the answer.
        return ParsedOutput {
            content: Some(text.to_owned()),
            calls: Vec::new(),
        };
    }
    let content = Some(content).filter(|text| !text.trim().is_empty());
    ParsedOutput { content, calls }
}

/// Adds one `tool_calls` delta entry: an opening entry starts a call, others extend its
/// arguments.
fn merge_delta(calls: &mut Vec<ToolCall>, delta: &Value) {
    let text = |pointer: &str| delta.pointer(pointer).and_then(Value::as_str);
    match (text("/id"), text("/function/name")) {
        (Some(id), Some(name)) => calls.push(ToolCall {
            id: id.to_owned(),
            kind: "function",
            function: FunctionCall {
                name: name.to_owned(),
                arguments: String::new(),
            },
        }),
        _ => {
            if let (Some(call), Some(fragment)) = (calls.last_mut(), text("/function/arguments")) {
                call.function.arguments.push_str(fragment);
            }
        }
    }
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;
