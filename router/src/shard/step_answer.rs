//! What a Step answers for one request: its generated token (with log-probabilities and the
//! finish reason the shard decided), its prompt log-probabilities, or its own failure.

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
