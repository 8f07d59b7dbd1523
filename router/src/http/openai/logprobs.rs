//! Log-probabilities in OpenAI's shapes: chat `logprobs.content[]` and completions' parallel lists.

use serde_json::{json, Map, Value};

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
#[derive(Debug, Default)]
pub struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<Map<String, Value>>,
    text_offset: Vec<usize>,
    next_offset: usize,
}

impl CompletionLogprobs {
    /// Appends one generated token.
    pub fn push(&mut self, token: &TokenText, decoding: &TokenDecoding) {
        let text = decoding.token_text(token.id);
        self.text_offset.push(self.next_offset);
        self.next_offset += text.chars().count();
        self.tokens.push(text);
        self.token_logprobs.push(token.logprob);
        self.top_logprobs.push(
            token
                .top_logprobs
                .iter()
                .map(|alt| (decoding.token_text(alt.id), json!(alt.logprob)))
                .collect(),
        );
    }

    /// The JSON object, leaving this builder empty but keeping the running offset.
    pub fn take(&mut self) -> Value {
        let value = json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top_logprobs),
            "text_offset": std::mem::take(&mut self.text_offset),
        });
        value
    }
}
