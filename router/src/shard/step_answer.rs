//! What a Step answers: per request, its generated tokens (with log-probabilities and the
//! finish reason the shard decided), its prompt log-probabilities, or its own failure; and
//! the shard's timings.

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
    /// The request's LoRA adapter could not be read again into memory (not the client's doing).
    AdapterUnavailable,
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
            Self::AdapterUnavailable => "adapter_unavailable",
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

/// A Step's answer (rank 0's): every request's outcome and how long the shard took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepAnswer {
    /// One per request whose span reached the end of its sequence; a drafted request has
    /// several, in order.
    pub generations: Vec<Generation>,
    /// One per request asking for prompt logprobs whose span covered prompt positions.
    pub prompt_logprobs: Vec<PromptLogprobsChunk>,
    /// Requests that failed on their own; none of them is in `generations`.
    pub failures: Vec<FailedRequest>,
    pub timings: ShardTimings,
    /// What the shards' `--torch-compile` has compiled when the step ends.
    pub compilation: Compilation,
    /// Positions in the step's `kv_transfers` of disk reads that found nothing usable.
    pub failed_kv_transfers: Vec<usize>,
}

/// Decode steps of up to `decode_rows` rows run a compiled graph (0: none does); `compiling`:
/// graphs for more still compile in the background.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compilation {
    pub decode_rows: u32,
    pub compiling: bool,
}

/// A token the step generated for request `id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub id: u64,
    pub token: GeneratedToken,
}

/// Prompt log-probabilities the step computed for request `id`.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobsChunk {
    pub id: u64,
    pub logprobs: PromptLogprobs,
}

/// Request `id`, which the shards ended without a token (and already forgot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRequest {
    pub id: u64,
    pub failure: RequestFailure,
}

/// The shard's own timings of one step, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ShardTimings {
    /// Applying the step to request state and building the input tensors.
    pub prepare_ms: f32,
    /// The model alone: embeddings through logits (and prompt logprobs when asked).
    pub forward_ms: f32,
    pub sampling_ms: f32,
    /// The shard's whole handling of the step.
    pub total_ms: f32,
    /// How long the model sat idle before this step's forward pass; 0 for the first step
    /// after Warmup.
    pub forward_gap_ms: f32,
}
