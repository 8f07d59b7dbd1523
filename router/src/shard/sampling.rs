//! What a request asks of the shards' sampler: its sampling and stopping parameters, the
//! log-probabilities it wants back and the grammar its output must match. Validation builds
//! them, the scheduler carries them, every Step that admits the request sends them.

/// Sampling parameters, already validated (see `validation`). The defaults disable
/// every processor.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means disabled.
    pub top_k: u32,
    /// 1.0 means disabled.
    pub top_p: f32,
    /// 0 means disabled.
    pub min_p: f32,
    /// 1.0 means disabled.
    pub typical_p: f32,
    /// 1.0 means disabled; over prompt and output tokens.
    pub repetition_penalty: f32,
    /// 0 means disabled; over generated tokens.
    pub frequency_penalty: f32,
    /// 0 means disabled; over generated tokens.
    pub presence_penalty: f32,
    /// Added to the logits of these tokens, sorted by token id.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

/// Token-level stop conditions the shard enforces. Stop *strings* stay in the router.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoppingParams {
    pub max_new_tokens: u32,
    /// Stop tokens are masked until this many tokens were generated.
    pub min_new_tokens: u32,
    /// Every token that ends the request: the client's, plus the model's EOS ids unless it
    /// asked to ignore them (validation decides).
    pub stop_token_ids: Vec<u32>,
}

/// Which log-probabilities the shard returns besides the chosen token's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogprobOptions {
    /// Alternatives per generated token (and per prompt position); 0 means none.
    pub top_logprobs: u32,
    /// Log-probabilities of the prompt tokens (positions 1..).
    pub prompt_logprobs: bool,
}

/// A grammar the generated text must match; compiled and bounded by `validation` before
/// admission, so the shard never sees one it cannot compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grammar {
    /// A serialized JSON Schema.
    JsonSchema(String),
    Regex(String),
    /// llguidance's Lark dialect (tool calls).
    Lark(String),
}
