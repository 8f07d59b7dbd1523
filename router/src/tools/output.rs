//! One choice's output when tools may be called, split into content and `tool_calls` deltas
//! as it streams, or whole at the end (the same machine run over the finished text).
//!
//! Where calls start depends on the family. Tandem, Llama and Mistral calls open the output
//! (the grammar keeps plain text from starting with `{`, `[` or a blank, and Mistral's
//! `[TOOL_CALLS]` token decodes to no text), so the first character decides. Hermes,
//! Qwen3-Coder and GLM-4.5 calls follow free text at the first `<tool_call>`: text that may be
//! the start of the trigger is held back until the next text decides it, so a trigger split
//! across tokens is never shown as content. DeepSeek-V3.1's and Kimi K2's calls follow free
//! text the same way at their section's opening marker, DeepSeek-V3.2's at its DSML block's
//! opening and Gemma 4's at `<|tool_call>`. Work is constant per character, however the text is
//! cut into deltas.

use serde_json::Value;

use super::calls::{trigger_prefix_len, FunctionCall, ToolCall, ToolCallStream};
use super::format::{ToolFamily, HERMES_TRIGGER};
use super::gemma::CALL_OPEN;
use super::gemma_calls::GemmaCallStream;
use super::plan::{ToolChoice, ToolPlan};
use super::section::Marker;
use super::section_stream::SectionStream;
use super::xml_calls::XmlCallStream;
use super::xml_syntax::{ValueKinds, XmlSyntax};
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
    /// Content before a trigger (Hermes's, a section's opening); `held` is a tail that may
    /// begin the trigger.
    BeforeTrigger {
        trigger: &'static str,
        held: String,
    },
    Calls(CallStream),
    /// Harmony's answer stream (`crate::harmony`): content and calls in any order.
    Harmony(HarmonyAnswer),
}

/// The parser of the calls themselves: JSON call objects, a sectioned family's markers, or
/// XML-style calls.
#[derive(Debug)]
enum CallStream {
    Objects(ToolCallStream),
    Section(SectionStream),
    Xml(XmlCallStream),
    Gemma(GemmaCallStream),
}

impl CallStream {
    fn new(family: ToolFamily, kinds: &ValueKinds) -> Self {
        match (family.section(), family.xml_syntax()) {
            _ if family == ToolFamily::Gemma4 => Self::Gemma(GemmaCallStream::new(family)),
            (Some(syntax), _) => Self::Section(SectionStream::new(family, syntax)),
            (None, Some(syntax)) => Self::Xml(XmlCallStream::new(family, syntax, kinds.clone())),
            (None, None) => Self::Objects(ToolCallStream::new(family)),
        }
    }

    fn push(&mut self, text: &str) -> Vec<Value> {
        match self {
            Self::Objects(stream) => stream.push(text),
            Self::Section(stream) => stream.push(text),
            Self::Xml(stream) => stream.push(text),
            Self::Gemma(stream) => stream.push(text),
        }
    }

    fn count(&self) -> usize {
        match self {
            Self::Objects(stream) => stream.count(),
            Self::Section(stream) => stream.count(),
            Self::Xml(stream) => stream.count(),
            Self::Gemma(stream) => stream.count(),
        }
    }
}

/// The text that starts calls after free text, for families that allow text first.
fn text_trigger(family: ToolFamily) -> Option<&'static str> {
    match family.section() {
        Some(syntax) => Some(syntax.marker(Marker::SectionBegin)),
        None if family == ToolFamily::Gemma4 => Some(CALL_OPEN),
        None if family == ToolFamily::Hermes => Some(HERMES_TRIGGER),
        None => family.xml_syntax().map(XmlSyntax::trigger),
    }
}

/// Routes one choice's text to content or to call deltas.
#[derive(Debug)]
pub struct ChoiceOutput {
    family: ToolFamily,
    state: State,
    /// How the XML families' parameter values read back into JSON.
    kinds: ValueKinds,
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
        let kinds = ValueKinds::default();
        let state = match (call_required, text_trigger(family)) {
            _ if family == ToolFamily::Harmony => State::Harmony(HarmonyAnswer::new()),
            (true, _) => State::Calls(CallStream::new(family, &kinds)),
            (false, Some(trigger)) => State::BeforeTrigger {
                trigger,
                held: String::new(),
            },
            (false, None) => State::Undecided,
        };
        Self {
            family,
            state,
            kinds,
            required: call_required,
        }
    }

    /// The output of one choice under `plan`.
    pub fn for_plan(plan: &ToolPlan) -> Self {
        Self::new(plan.format.family, plan.choice != ToolChoice::Auto).with_tools(plan)
    }

    /// This output, before any text, in `family`'s syntax.
    #[must_use]
    pub fn in_family(self, family: ToolFamily) -> Self {
        let kinds = self.kinds;
        let mut output = Self::new(family, self.required);
        output.kinds = kinds;
        output.restart_calls();
        output
    }

    /// This output, before any text, reading parameter values by `plan`'s tool schemas.
    #[must_use]
    pub fn with_tools(mut self, plan: &ToolPlan) -> Self {
        self.kinds = ValueKinds::of_tools(
            plan.tools
                .iter()
                .map(|tool| (tool.name.as_str(), &tool.parameters)),
        );
        self.restart_calls();
        self
    }

    /// A fresh call scanner, with the current kinds, when calls start at once.
    fn restart_calls(&mut self) {
        if let State::Calls(_) = self.state {
            self.state = State::Calls(CallStream::new(self.family, &self.kinds));
        }
    }

    /// Routes `text` to content or to call deltas.
    pub fn push(&mut self, text: String) -> DeltaBody {
        match &mut self.state {
            State::Undecided => match text.chars().next() {
                None => DeltaBody::Nothing,
                Some(first) if opens_calls(self.family, first) => {
                    self.state = State::Calls(CallStream::new(self.family, &self.kinds));
                    self.push(text)
                }
                Some(_) => {
                    self.state = State::Content;
                    DeltaBody::Content(text)
                }
            },
            State::Content if text.is_empty() => DeltaBody::Nothing,
            State::Content => DeltaBody::Content(text),
            State::BeforeTrigger { trigger, held } => {
                let mut text = std::mem::take(held) + &text;
                match text.find(*trigger) {
                    Some(start) => {
                        let calls = text.split_off(start);
                        let mut stream = CallStream::new(self.family, &self.kinds);
                        let deltas = stream.push(&calls);
                        self.state = State::Calls(stream);
                        content_and_calls(text, deltas)
                    }
                    None => {
                        *held = text.split_off(text.len() - trigger_prefix_len(&text, trigger));
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
            State::BeforeTrigger { held, .. } => {
                content_and_calls(std::mem::take(held), Vec::new())
            }
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
