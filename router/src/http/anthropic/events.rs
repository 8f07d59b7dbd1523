//! Anthropic's stream events for one message: `message_start`, then each content block as
//! `content_block_start`, `content_block_delta`s (`thinking_delta`, `text_delta` or
//! `input_json_delta`) and `content_block_stop`, then `message_delta` (stop reason and usage)
//! and `message_stop`. A reasoning model's thinking is split off first; the answer text is
//! routed through the tool-call scanner (`crate::tools`) when tools may be called.

use serde_json::{json, Value};

use super::response::{stop_reason, tool_use_id, MessageUsage};
use crate::reasoning::{ReasoningSplitter, Split};
use crate::stream::Finish;
use crate::tools::{route_text, ChoiceOutput, ToolFamily, ToolPlan};

/// The block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Thinking,
    Text,
    ToolUse,
}

/// Renders one message's events; every method returns the events to send, in order.
#[derive(Debug)]
pub struct MessageEvents {
    /// Present when tools may be called: decides between text and calls.
    tool_output: Option<ChoiceOutput>,
    open: Option<OpenBlock>,
    /// Index of the open block, or of the next one when none is open.
    index: usize,
    called_tools: bool,
    /// Present for a reasoning model: splits its thinking off before tool-call routing.
    reasoning: Option<ReasoningSplitter>,
}

impl MessageEvents {
    /// `call_required`: the output is a calls document from its first character.
    pub fn new(tools_callable: bool, call_required: bool) -> Self {
        Self {
            tool_output: tools_callable
                .then(|| ChoiceOutput::new(ToolFamily::Tandem, call_required)),
            open: None,
            index: 0,
            called_tools: false,
            reasoning: None,
        }
    }

    /// Reads calls in `family`'s syntax (Tandem's unless set).
    #[must_use]
    pub fn with_tool_family(mut self, family: ToolFamily) -> Self {
        self.tool_output = self.tool_output.map(|output| output.in_family(family));
        self
    }

    /// Reads call parameter values back by `plan`'s tool schemas (the XML-style families).
    #[must_use]
    pub fn with_tools(mut self, plan: Option<&ToolPlan>) -> Self {
        if let Some(plan) = plan {
            self.tool_output = self.tool_output.map(|output| output.with_tools(plan));
        }
        self
    }

    /// Streams the thinking `splitter` splits off as a `thinking` block.
    #[must_use]
    pub fn with_reasoning(mut self, splitter: Option<ReasoningSplitter>) -> Self {
        self.reasoning = splitter;
        self
    }

    /// `message_start`, carrying the message with no content yet.
    pub fn start(id: &str, model: &str, input_tokens: usize) -> Value {
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": MessageUsage::new(input_tokens, 0, 0),
        }})
    }

    /// The events one piece of generated text releases.
    pub fn text(&mut self, text: String) -> Vec<Value> {
        let split = match self.reasoning.as_mut() {
            Some(splitter) => splitter.push(&text),
            None => Split {
                reasoning: String::new(),
                answer: text,
            },
        };
        self.split_events(split)
    }

    /// A thinking delta for the reasoning, then the answer's events.
    fn split_events(&mut self, split: Split) -> Vec<Value> {
        let mut events = Vec::new();
        if !split.reasoning.is_empty() {
            if self.open != Some(OpenBlock::Thinking) {
                self.close(&mut events);
                let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                self.open(OpenBlock::Thinking, block, &mut events);
            }
            let delta = json!({"type": "thinking_delta", "thinking": split.reasoning});
            events.push(self.delta(delta));
        }
        events.extend(self.answer_events(split.answer));
        events
    }

    /// The events a piece of answer text releases.
    fn answer_events(&mut self, text: String) -> Vec<Value> {
        let mut events = Vec::new();
        let (content, calls) = route_text(self.tool_output.as_mut(), text).into_parts();
        self.release(content, calls, &mut events);
        events
    }

    /// Events for `text`, then for the `calls` delta entries.
    fn release(&mut self, text: String, calls: Vec<Value>, events: &mut Vec<Value>) {
        if !text.is_empty() {
            if self.open != Some(OpenBlock::Text) {
                self.close(events);
                self.open(OpenBlock::Text, json!({"type": "text", "text": ""}), events);
            }
            events.push(self.delta(json!({"type": "text_delta", "text": text})));
        }
        for call in calls {
            self.call_delta(&call, events);
        }
    }

    /// One entry of the scanner's OpenAI-shaped `tool_calls` deltas: an entry with an `id`
    /// opens a call, the others carry argument fragments.
    fn call_delta(&mut self, call: &Value, events: &mut Vec<Value>) {
        if call.get("id").is_some() {
            self.close(events);
            let name = call.pointer("/function/name").cloned().unwrap_or_default();
            let block = json!({"type": "tool_use", "id": tool_use_id(), "name": name, "input": {}});
            self.open(OpenBlock::ToolUse, block, events);
            self.called_tools = true;
        } else if let Some(fragment) = call.pointer("/function/arguments") {
            let delta = json!({"type": "input_json_delta", "partial_json": fragment});
            events.push(self.delta(delta));
        }
    }

    /// Closes the open block and ends the message.
    pub fn finish(
        &mut self,
        finish: Finish,
        stop_sequence: Option<String>,
        usage: MessageUsage,
    ) -> Vec<Value> {
        // The splitter's held-back text first (its answer part goes through the calls parser),
        // then what the calls parser still holds.
        let held = self.reasoning.as_mut().map(ReasoningSplitter::finish);
        let mut events = held
            .map(|split| self.split_events(split))
            .unwrap_or_default();
        if let Some(held) = self.tool_output.as_mut().map(ChoiceOutput::finish) {
            let (text, calls) = held.into_parts();
            self.release(text, calls, &mut events);
        }
        self.close(&mut events);
        let stop_sequence = stop_sequence.filter(|_| finish == Finish::StopSequence);
        events.push(json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(finish, self.called_tools), "stop_sequence": stop_sequence},
            "usage": usage}));
        events.push(json!({"type": "message_stop"}));
        events
    }

    fn open(&mut self, kind: OpenBlock, block: Value, events: &mut Vec<Value>) {
        events.push(
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        );
        self.open = Some(kind);
    }

    fn delta(&self, delta: Value) -> Value {
        json!({"type": "content_block_delta", "index": self.index, "delta": delta})
    }

    fn close(&mut self, events: &mut Vec<Value>) {
        if self.open.take().is_some() {
            events.push(json!({"type": "content_block_stop", "index": self.index}));
            self.index += 1;
        }
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
