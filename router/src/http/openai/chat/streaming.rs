//! The streamed `/v1/chat/completions` response: one `chat.completion.chunk` per text delta.

use std::sync::Arc;

use serde_json::Value;

use crate::http::openai::chunks::{chat_chunk, ChatChunkChoice, ChatDelta};
use crate::http::openai::envelope::{ChunkBuilder, ResponseMeta, Usage};
use crate::http::openai::logprobs::chat_logprobs;
use crate::reasoning::{ReasoningSplitter, Split};
use crate::stream::{TokenDecoding, TokenText};
use crate::tools::{ChoiceOutput, DeltaBody, ToolPlan};

/// Chunks of `object: "chat.completion.chunk"`; the first one announces the role.
/// With `logprobs`, every token gets a chunk, even one that releases no text.
pub struct ChatChunks {
    meta: ResponseMeta,
    logprobs: Option<Arc<TokenDecoding>>,
    /// Per choice, when the model may call tools.
    tool_outputs: Option<Vec<ChoiceOutput>>,
    /// Per choice, when a reasoning model's output is split; in front of `tool_outputs`.
    reasoning: Option<Vec<ReasoningSplitter>>,
    choices: usize,
}

impl ChatChunks {
    /// Chunks for `n` choices; a plan the model may call turns calls documents into tool-call deltas.
    pub fn new(
        meta: ResponseMeta,
        logprobs: Option<Arc<TokenDecoding>>,
        tool_plan: Option<&ToolPlan>,
        n: usize,
    ) -> Self {
        let tool_outputs = tool_plan
            .filter(|plan| plan.may_call())
            .map(|plan| (0..n).map(|_| ChoiceOutput::for_plan(plan)).collect());
        ChatChunks {
            meta,
            logprobs,
            tool_outputs,
            reasoning: None,
            choices: n,
        }
    }

    /// Splits each choice's output with a copy of `splitter` before anything else reads it.
    #[must_use]
    pub fn with_reasoning(mut self, splitter: Option<&ReasoningSplitter>) -> Self {
        self.reasoning = splitter.map(|splitter| vec![splitter.clone(); self.choices]);
        self
    }

    /// `text` split into reasoning and answer (all answer without a splitter); the output's
    /// last piece also releases what the splitter held back.
    fn split(&mut self, index: usize, text: &str, last: bool) -> Split {
        let Some(splitter) = self.reasoning.as_mut().and_then(|all| all.get_mut(index)) else {
            return Split {
                reasoning: String::new(),
                answer: text.to_owned(),
            };
        };
        let mut split = splitter.push(text);
        if last {
            let rest = splitter.finish();
            split.reasoning.push_str(&rest.reasoning);
            split.answer.push_str(&rest.answer);
        }
        split
    }
}

impl ChunkBuilder for ChatChunks {
    fn opening(&self, index: usize) -> Option<Value> {
        let delta = ChatDelta {
            role: Some("assistant"),
            content: Some(String::new()),
            reasoning_content: None,
            tool_calls: None,
        };
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
        };
        Some(chat_chunk(&self.meta, vec![choice], None))
    }

    fn token(
        &mut self,
        index: usize,
        token: TokenText,
        finish: Option<&'static str>,
    ) -> Option<Value> {
        let Split { reasoning, answer } = self.split(index, &token.text, finish.is_some());
        let (body, finish) = match self
            .tool_outputs
            .as_mut()
            .and_then(|outputs| outputs.get_mut(index))
        {
            Some(output) => {
                // On the last token the splitter has released everything it held back.
                let mut body = output.push(answer);
                if finish.is_some() {
                    body = body.followed_by(output.finish());
                }
                (body, finish.map(|finish| output.finish_reason(finish)))
            }
            None if answer.is_empty() => (DeltaBody::Nothing, finish),
            None => (DeltaBody::Content(answer), finish),
        };
        let reasoning_content = Some(reasoning).filter(|text| !text.is_empty());
        let nothing = body == DeltaBody::Nothing && reasoning_content.is_none();
        if nothing && finish.is_none() && self.logprobs.is_none() {
            return None;
        }
        let logprobs = self
            .logprobs
            .as_ref()
            .map(|decoding| chat_logprobs(std::slice::from_ref(&token), decoding));
        let mut delta = match body {
            DeltaBody::Nothing => ChatDelta::default(),
            DeltaBody::Content(text) => ChatDelta {
                content: Some(text),
                ..ChatDelta::default()
            },
            DeltaBody::ToolCalls(calls) => ChatDelta {
                tool_calls: Some(calls),
                ..ChatDelta::default()
            },
            DeltaBody::ContentThenCalls(text, calls) => ChatDelta {
                content: Some(text),
                tool_calls: Some(calls),
                ..ChatDelta::default()
            },
        };
        delta.reasoning_content = reasoning_content;
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: finish,
        };
        Some(chat_chunk(&self.meta, vec![choice], None))
    }

    fn usage(&self, usage: Usage) -> Value {
        let usage = match &self.reasoning {
            Some(splitters) => usage.with_reasoning_tokens(
                splitters
                    .iter()
                    .map(ReasoningSplitter::reasoning_tokens)
                    .sum(),
            ),
            None => usage,
        };
        chat_chunk(&self.meta, Vec::new(), Some(usage))
    }
}
