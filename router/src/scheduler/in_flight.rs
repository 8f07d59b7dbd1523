//! A Step sent to the shards whose answer the step loop has not taken yet.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::recovery;
use crate::shard::{ShardGroup, Step, StepAnswer};

/// Timings of one step as the step loop measures them.
pub(crate) struct StepTimings {
    /// Planning the step (applying its answer is added by the loop).
    pub planning: Duration,
    /// From sending the step to its answer, including time queued behind earlier steps.
    pub round_trip: Duration,
    /// Sent while the loop had work, so the shards' gap before its forward pass is the
    /// serving path's rather than idle time.
    pub back_to_back: bool,
    /// Requests in the step.
    pub requests: usize,
    /// Tokens the step fed the model: prefill chunks plus one per decoding request.
    pub tokens: usize,
}

type StepOutcome = Result<Result<StepAnswer, String>, tokio::task::JoinError>;

pub(crate) struct InFlightStep {
    call: JoinHandle<Result<StepAnswer, String>>,
    /// The call's outcome once `settle` saw it end; the call is never polled again after.
    outcome: Option<StepOutcome>,
    /// On tokio's clock, which the step loop's pacing runs on.
    pub sent: Instant,
    planning: Duration,
    back_to_back: bool,
    requests: usize,
    tokens: usize,
}

impl InFlightStep {
    /// Starts the Step on every rank now; its answer is taken with `answer`.
    pub fn send(
        shards: Arc<dyn ShardGroup>,
        step: Step,
        timeout: Duration,
        planning: Duration,
        back_to_back: bool,
    ) -> Self {
        let requests = step.scheduled.len();
        let tokens = step
            .scheduled
            .iter()
            .map(|scheduled| scheduled.num_tokens)
            .sum();
        let call =
            tokio::spawn(async move { recovery::within(timeout, "Step", shards.step(step)).await });
        Self {
            call,
            outcome: None,
            sent: Instant::now(),
            planning,
            back_to_back,
            requests,
            tokens,
        }
    }

    /// Waits until the shards answered (or the call failed), keeping the outcome for
    /// `answer`. Cancel-safe: dropped before the end, it leaves the call as it was.
    pub async fn settle(&mut self) {
        if self.outcome.is_none() {
            self.outcome = Some((&mut self.call).await);
        }
    }

    /// Whether the answer is there to take without waiting.
    pub fn is_settled(&self) -> bool {
        self.outcome.is_some() || self.call.is_finished()
    }

    /// The shards' answer, or why there is none (an error, the step timeout, a lost task).
    pub async fn answer(self) -> Result<(StepAnswer, StepTimings), String> {
        let outcome = match self.outcome {
            Some(outcome) => outcome,
            None => self.call.await,
        };
        let response = match outcome {
            Ok(answer) => answer?,
            Err(error) => return Err(format!("the Step call ended abnormally: {error}")),
        };
        let timings = StepTimings {
            planning: self.planning,
            round_trip: self.sent.elapsed(),
            back_to_back: self.back_to_back,
            requests: self.requests,
            tokens: self.tokens,
        };
        Ok((response, timings))
    }
}
