//! What the HTTP layer hands the scheduler, and what flows back per token.

use tokio::sync::mpsc;

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

/// A validated, tokenized request ready for scheduling.
#[derive(Debug, Clone, Default)]
pub struct GenerationRequest {
    pub input_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stopping: StoppingParams,
    pub logprobs: LogprobOptions,
    /// `None` means unconstrained.
    pub grammar: Option<Grammar>,
    /// Most draft tokens per step for this request (`speculate`); `None` leaves the server's
    /// `--speculate`, which also bounds any value here.
    pub max_drafts: Option<usize>,
}

/// A token with its log-probability under the raw model distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// Log-probabilities of prompt positions `first_position..`, as one step computed them.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobs {
    pub first_position: usize,
    pub logprobs: Vec<f32>,
    /// Parallel to `logprobs` when alternatives were asked for, else empty.
    pub top: Vec<Vec<TokenLogprob>>,
}

/// Why the shard stopped a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Length,
    Eos,
    StopToken,
}

/// Why the shards ended one request on its own; the other requests of its step went on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFailureKind {
    /// A token id (prompt, logit bias, stop token) outside the model's vocabulary.
    TokenOutOfRange,
    /// A sampling parameter no processor can use.
    InvalidParameters,
    /// The grammar did not compile, its engine stopped, or a token broke it.
    Grammar,
    /// The request's own constraints left no token it may sample.
    NoValidToken,
    /// The model produced non-finite logits for the request (not the client's doing).
    Model,
}

impl RequestFailureKind {
    /// The `reason` label of `tandem_request_step_failures_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::TokenOutOfRange => "token_out_of_range",
            Self::InvalidParameters => "invalid_parameters",
            Self::Grammar => "grammar",
            Self::NoValidToken => "no_valid_token",
            Self::Model => "non_finite_logits",
        }
    }
}

/// A request the shards ended without a token, with a message safe to show its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFailure {
    pub kind: RequestFailureKind,
    pub message: String,
}

/// One generated token; `finish` is set on the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    pub id: u32,
    pub logprob: f32,
    /// The most likely alternatives, most likely first; empty unless asked for.
    pub top_logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
}

/// Events delivered to the HTTP layer for one request, in order.
/// After a `Token` with `finish` set, or an `Error`, nothing more arrives.
#[derive(Debug, Clone)]
pub enum GenerationEvent {
    /// The request left the queue and its first step was scheduled.
    Started,
    /// Prompt log-probabilities of one prefill chunk; a recomputed request may repeat
    /// positions it delivered before.
    PromptLogprobs(PromptLogprobs),
    Token(GeneratedToken),
    Error(super::SchedulerError),
}

/// The receiving half of a request. Dropping it cancels the request: the scheduler
/// notices the closed channel at its next step, tells the shards to forget the request
/// and frees its KV blocks. This is how both client disconnects and stop strings end a
/// request early.
#[derive(Debug)]
pub struct GenerationStream {
    pub events: mpsc::UnboundedReceiver<GenerationEvent>,
}
