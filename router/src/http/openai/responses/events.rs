//! The Responses API's stream events for one response, each with its `type` and
//! `sequence_number`: `response.created` and `response.in_progress`, then per output item
//! `response.output_item.added`, its content (`response.content_part.added`,
//! `response.output_text.delta`s, `response.output_text.done`, `response.content_part.done`
//! for a message; `response.function_call_arguments.delta`s and `.done` for a call) and
//! `response.output_item.done`, then `response.completed` (or `response.incomplete`).
//! A reasoning model's reasoning is split off first, as a `reasoning` item
//! (`response.reasoning_text.delta`s and `.done` inside its content part); the answer text is
//! routed through the tool-call scanner (`crate::tools`) when tools may be called.

use serde_json::{json, Value};

use super::output::{
    function_call_id, message_id, reasoning_id, OutputItem, OutputText, ReasoningText,
    ResponseObject,
};
use crate::error::{error_body, Api, AppError};
use crate::reasoning::{ReasoningSplitter, Split};
use crate::stream::Finish;
use crate::tools::{route_text, ChoiceOutput, ToolFamily, ToolPlan};

/// Renders one response's events; every method returns the events to send, in order.
#[derive(Debug)]
pub struct ResponseEvents {
    sequence: u64,
    /// Present when tools may be called: decides between text and calls.
    tool_output: Option<ChoiceOutput>,
    items: Vec<OutputItem>,
    /// Whether the last item is still being written.
    open: bool,
    /// Present for a reasoning model's stream: splits its reasoning off before tool routing.
    reasoning: Option<ReasoningSplitter>,
}

impl ResponseEvents {
    /// `call_required`: the output is a calls document from its first character.
    pub fn new(tools_callable: bool, call_required: bool) -> Self {
        Self {
            sequence: 0,
            tool_output: tools_callable
                .then(|| ChoiceOutput::new(ToolFamily::Tandem, call_required)),
            items: Vec::new(),
            open: false,
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

    /// Streams what `splitter` splits off as a `reasoning` item.
    #[must_use]
    pub fn with_reasoning(mut self, splitter: Option<ReasoningSplitter>) -> Self {
        self.reasoning = splitter;
        self
    }

    /// Output tokens the splitter counted as reasoning.
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning
            .as_ref()
            .map_or(0, ReasoningSplitter::reasoning_tokens)
    }

    /// `payload` numbered as the next event.
    fn event(&mut self, mut payload: Value) -> Value {
        payload["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        payload
    }

    /// `response.created` and `response.in_progress`, carrying the response with no output.
    pub fn start(&mut self, response: &ResponseObject) -> Vec<Value> {
        ["response.created", "response.in_progress"]
            .into_iter()
            .map(|kind| self.event(json!({"type": kind, "response": response})))
            .collect()
    }

    /// The events one piece of generated text releases.
    pub fn text(&mut self, text: String) -> Vec<Value> {
        match self.reasoning.as_mut() {
            Some(splitter) => {
                let split = splitter.push(&text);
                self.split_events(split)
            }
            None => self.answer(text),
        }
    }

    fn split_events(&mut self, split: Split) -> Vec<Value> {
        let mut events = self.reasoning_text(&split.reasoning);
        events.extend(self.answer(split.answer));
        events
    }

    /// The events a piece of reasoning releases: it goes to the open reasoning item, or a new one.
    pub fn reasoning_text(&mut self, text: &str) -> Vec<Value> {
        let mut events = Vec::new();
        if text.is_empty() {
            return events;
        }
        if !matches!(self.open_item(), Some(OutputItem::Reasoning { .. })) {
            self.close("completed", &mut events);
            self.open_reasoning(&mut events);
        }
        let output_index = self.items.len() - 1;
        if let Some(OutputItem::Reasoning { id, content, .. }) = self.open_item() {
            if let Some(part) = content.last_mut() {
                part.text.push_str(text);
            }
            let id = id.clone();
            events.push(self.event(json!({"type": "response.reasoning_text.delta",
                "item_id": id, "output_index": output_index, "content_index": 0, "delta": text})));
        }
        events
    }

    fn open_reasoning(&mut self, events: &mut Vec<Value>) {
        let id = reasoning_id();
        let item = OutputItem::Reasoning {
            id: id.clone(),
            summary: Vec::new(),
            content: Vec::new(),
            status: "in_progress",
        };
        self.added(item, events);
        let part = ReasoningText::new(String::new());
        let output_index = self.items.len() - 1;
        events.push(
            self.event(json!({"type": "response.content_part.added", "item_id": id,
            "output_index": output_index, "content_index": 0, "part": part})),
        );
        if let Some(OutputItem::Reasoning { content, .. }) = self.items.last_mut() {
            content.push(part);
        }
    }

    /// The events a piece of answer text releases.
    pub fn answer(&mut self, text: String) -> Vec<Value> {
        let mut events = Vec::new();
        let (content, calls) = route_text(self.tool_output.as_mut(), text).into_parts();
        self.release(&content, calls, &mut events);
        events
    }

    /// Events for `text`, then for the `calls` delta entries.
    fn release(&mut self, text: &str, calls: Vec<Value>, events: &mut Vec<Value>) {
        if !text.is_empty() {
            if !matches!(self.open_item(), Some(OutputItem::Message { .. })) {
                self.close("completed", events);
                self.open_message(events);
            }
            if let Some((item_id, output_index)) = self.push_text(text) {
                events.push(self.event(json!({"type": "response.output_text.delta",
                    "item_id": item_id, "output_index": output_index, "content_index": 0,
                    "delta": text, "logprobs": []})));
            }
        }
        for call in calls {
            self.call_delta(&call, events);
        }
    }

    fn open_item(&mut self) -> Option<&mut OutputItem> {
        if self.open {
            self.items.last_mut()
        } else {
            None
        }
    }

    fn open_message(&mut self, events: &mut Vec<Value>) {
        let id = message_id();
        let item = OutputItem::Message {
            id: id.clone(),
            role: "assistant",
            status: "in_progress",
            content: Vec::new(),
        };
        self.added(item, events);
        let part = OutputText::new(String::new());
        let output_index = self.items.len() - 1;
        events.push(
            self.event(json!({"type": "response.content_part.added", "item_id": id,
            "output_index": output_index, "content_index": 0, "part": part})),
        );
        if let Some(OutputItem::Message { content, .. }) = self.items.last_mut() {
            content.push(part);
        }
    }

    fn added(&mut self, item: OutputItem, events: &mut Vec<Value>) {
        let output_index = self.items.len();
        events.push(self.event(json!({"type": "response.output_item.added",
            "output_index": output_index, "item": item})));
        self.items.push(item);
        self.open = true;
    }

    /// Appends to the open message's text; its id and output index (`None` when no message
    /// is open, which `text` rules out).
    fn push_text(&mut self, text: &str) -> Option<(String, usize)> {
        let output_index = self.items.len().checked_sub(1)?;
        match self.open_item()? {
            OutputItem::Message { id, content, .. } => {
                content.last_mut()?.text.push_str(text);
                Some((id.clone(), output_index))
            }
            OutputItem::FunctionCall { .. } | OutputItem::Reasoning { .. } => None,
        }
    }

    /// One entry of the scanner's chat-shaped `tool_calls` deltas: an entry with an `id`
    /// opens a call, the others carry argument fragments.
    fn call_delta(&mut self, call: &Value, events: &mut Vec<Value>) {
        if let Some(call_id) = call.get("id").and_then(Value::as_str) {
            self.close("completed", events);
            let name = call.pointer("/function/name").and_then(Value::as_str);
            let item = OutputItem::FunctionCall {
                id: function_call_id(),
                call_id: call_id.to_owned(),
                name: name.unwrap_or_default().to_owned(),
                arguments: String::new(),
                status: "in_progress",
            };
            self.added(item, events);
            return;
        }
        let fragment = call.pointer("/function/arguments").and_then(Value::as_str);
        let output_index = self.items.len().saturating_sub(1);
        if let (Some(fragment), Some(OutputItem::FunctionCall { id, arguments, .. })) =
            (fragment, self.open_item())
        {
            arguments.push_str(fragment);
            let id = id.clone();
            events.push(
                self.event(json!({"type": "response.function_call_arguments.delta",
                "item_id": id, "output_index": output_index, "delta": fragment})),
            );
        }
    }

    /// Closes the open item with `status`.
    fn close(&mut self, status: &'static str, events: &mut Vec<Value>) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let output_index = self.items.len() - 1;
        let Some(item) = self.items.last_mut() else {
            return;
        };
        let closing = match item {
            OutputItem::Message {
                id,
                content,
                status: item_status,
                ..
            } => {
                *item_status = status;
                let part = content
                    .last()
                    .cloned()
                    .unwrap_or_else(|| OutputText::new(String::new()));
                vec![
                    json!({"type": "response.output_text.done", "item_id": id, "output_index": output_index,
                        "content_index": 0, "text": part.text, "logprobs": []}),
                    json!({"type": "response.content_part.done", "item_id": id, "output_index": output_index,
                        "content_index": 0, "part": part}),
                ]
            }
            OutputItem::FunctionCall {
                id,
                name,
                arguments,
                status: item_status,
                ..
            } => {
                *item_status = status;
                vec![
                    json!({"type": "response.function_call_arguments.done", "item_id": id,
                    "output_index": output_index, "name": name, "arguments": arguments}),
                ]
            }
            OutputItem::Reasoning {
                id,
                content,
                status: item_status,
                ..
            } => {
                *item_status = status;
                let part = content
                    .last()
                    .cloned()
                    .unwrap_or_else(|| ReasoningText::new(String::new()));
                vec![
                    json!({"type": "response.reasoning_text.done", "item_id": id, "output_index": output_index,
                        "content_index": 0, "text": part.text}),
                    json!({"type": "response.content_part.done", "item_id": id, "output_index": output_index,
                        "content_index": 0, "part": part}),
                ]
            }
        };
        let done = json!({"type": "response.output_item.done", "output_index": output_index,
            "item": item});
        for payload in closing.into_iter().chain([done]) {
            events.push(self.event(payload));
        }
    }

    /// Closes the open item (an empty message when nothing was written) and hands back the
    /// output; items are `incomplete` when the length limit ended the response.
    pub fn finish(&mut self, finish: Finish) -> (Vec<Value>, Vec<OutputItem>) {
        // The splitter's held-back text first (its answer part goes through the calls parser),
        // then what the calls parser still holds.
        let held = self.reasoning.as_mut().map(ReasoningSplitter::finish);
        let mut events = held
            .map(|split| self.split_events(split))
            .unwrap_or_default();
        if let Some(held) = self.tool_output.as_mut().map(ChoiceOutput::finish) {
            let (text, calls) = held.into_parts();
            self.release(&text, calls, &mut events);
        }
        let status = if finish == Finish::Length {
            "incomplete"
        } else {
            "completed"
        };
        if !self
            .items
            .iter()
            .any(|item| !matches!(item, OutputItem::Reasoning { .. }))
        {
            self.close(status, &mut events);
            self.open_message(&mut events);
        }
        self.close(status, &mut events);
        (events, self.items.clone())
    }

    /// `response.completed`, or `response.incomplete`, carrying the finished response.
    pub fn end(&mut self, response: &ResponseObject) -> Value {
        let kind = if response.status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(json!({"type": kind, "response": response}))
    }

    /// The `error` event that ends a failed stream.
    pub fn error(&mut self, error: &AppError) -> Value {
        let body = error_body(Api::OpenAi, error);
        let inner = &body["error"];
        let code = match &inner["code"] {
            Value::Null => inner["type"].clone(),
            code => code.clone(),
        };
        self.event(
            json!({"type": "error", "code": code, "message": inner["message"],
            "param": inner["param"]}),
        )
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
