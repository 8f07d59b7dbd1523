//! The shards' step outputs as the scheduler's per-request events.

use crate::pb;
use crate::shard::{
    FinishReason, PromptLogprobs, RequestFailure, RequestFailureKind, TokenLogprob,
};

pub(super) fn token_logprobs(tokens: Vec<pb::TokenLogprob>) -> Vec<TokenLogprob> {
    tokens
        .into_iter()
        .map(|t| TokenLogprob {
            id: t.token_id,
            logprob: t.logprob,
        })
        .collect()
}

pub(super) fn prompt_logprobs(chunk: pb::PromptLogprobs) -> PromptLogprobs {
    PromptLogprobs {
        first_position: chunk.first_position as usize,
        logprobs: chunk.logprobs,
        top: chunk
            .top
            .into_iter()
            .map(|t| token_logprobs(t.tokens))
            .collect(),
    }
}

pub(super) fn finish_reason(code: i32) -> Option<FinishReason> {
    match pb::FinishReason::try_from(code) {
        Ok(pb::FinishReason::Length) => Some(FinishReason::Length),
        Ok(pb::FinishReason::Eos) => Some(FinishReason::Eos),
        Ok(pb::FinishReason::StopToken) => Some(FinishReason::StopToken),
        Ok(pb::FinishReason::Unspecified) | Err(_) => None,
    }
}

pub(super) fn request_failure(failure: pb::RequestFailure) -> RequestFailure {
    let kind = match pb::FailureKind::try_from(failure.kind) {
        Ok(pb::FailureKind::TokenOutOfRange) => RequestFailureKind::TokenOutOfRange,
        Ok(pb::FailureKind::InvalidParameters) => RequestFailureKind::InvalidParameters,
        Ok(pb::FailureKind::Grammar) => RequestFailureKind::Grammar,
        Ok(pb::FailureKind::NoValidToken) => RequestFailureKind::NoValidToken,
        Ok(pb::FailureKind::NonFiniteLogits) | Ok(pb::FailureKind::Unspecified) | Err(_) => {
            RequestFailureKind::Model
        }
    };
    RequestFailure {
        kind,
        message: failure.message,
    }
}
