//! Log-probabilities in OpenAI's shapes: chat `logprobs.content[]` and completions' parallel lists.

use serde_json::{json, Map, Value};

use crate::scheduler::{PromptLogprobs, TokenLogprob};
use crate::stream::{TokenDecoding, TokenText};

/// One chat `ChatCompletionTokenLogprob`: the token, its logprob, its bytes and alternatives.
fn chat_entry(token: &TokenText, decoding: &TokenDecoding) -> Value {
    let text = decoding.token_text(token.id);
    let top: Vec<Value> = token
        .top_logprobs
        .iter()
        .map(|alt| {
            let alt_text = decoding.token_text(alt.id);
            json!({"token": alt_text, "logprob": alt.logprob, "bytes": alt_text.as_bytes()})
        })
        .collect();
    json!({"token": text, "logprob": token.logprob, "bytes": text.as_bytes(), "top_logprobs": top})
}

/// A chat choice's `logprobs` object over `tokens`.
pub fn chat_logprobs(tokens: &[TokenText], decoding: &TokenDecoding) -> Value {
    let content: Vec<Value> = tokens.iter().map(|t| chat_entry(t, decoding)).collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `logprobs` object; `text_offset` counts characters from `first_offset`.
/// The prompt's first token has no logprob: its `token_logprobs` and `top_logprobs` are `null`.
#[derive(Debug, Default)]
pub struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<Option<f32>>,
    top_logprobs: Vec<Option<Map<String, Value>>>,
    text_offset: Vec<usize>,
    next_offset: usize,
}

impl CompletionLogprobs {
    /// Appends one generated token.
    pub fn push(&mut self, token: &TokenText, decoding: &TokenDecoding) {
        self.push_entry(
            token.id,
            Some((token.logprob, &token.top_logprobs)),
            decoding,
        );
    }

    /// Appends the prompt's tokens with their logprobs (`prompt` starts at position 1 or later;
    /// a position it does not cover gets `null`).
    pub fn push_prompt(
        &mut self,
        input_ids: &[u32],
        prompt: &PromptLogprobs,
        decoding: &TokenDecoding,
    ) {
        for (position, &id) in input_ids.iter().enumerate() {
            let scored = position
                .checked_sub(prompt.first_position)
                .and_then(|index| {
                    let logprob = *prompt.logprobs.get(index)?;
                    let top = prompt.top.get(index).map_or(&[][..], Vec::as_slice);
                    Some((logprob, top))
                });
            self.push_entry(id, scored, decoding);
        }
    }

    fn push_entry(
        &mut self,
        id: u32,
        scored: Option<(f32, &[TokenLogprob])>,
        decoding: &TokenDecoding,
    ) {
        let text = decoding.token_text(id);
        self.text_offset.push(self.next_offset);
        self.next_offset += text.chars().count();
        self.tokens.push(text);
        self.token_logprobs.push(scored.map(|(logprob, _)| logprob));
        self.top_logprobs.push(scored.map(|(_, top)| {
            top.iter()
                .map(|alt| (decoding.token_text(alt.id), json!(alt.logprob)))
                .collect()
        }));
    }

    /// The JSON object, leaving this builder empty but keeping the running offset.
    pub fn take(&mut self) -> Value {
        json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top_logprobs),
            "text_offset": std::mem::take(&mut self.text_offset),
        })
    }
}
