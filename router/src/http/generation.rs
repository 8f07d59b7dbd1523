//! One generation as every route runs it: admit, validate, submit, then read text deltas.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::AppState;
use crate::error::AppError;
use crate::metrics::RequestMetrics;
use crate::scheduler::PromptLogprobs;
use crate::stream::{Finish, StreamError, TextDelta, TextStream, TokenText};
use crate::validation::{GenerationParams, Prompt};

/// A request admitted and queued in the scheduler. Dropping it cancels the request,
/// releases its admission permit and records it as cancelled.
#[derive(Debug)]
pub struct Generation {
    text: TextStream,
    metrics: RequestMetrics,
    pub input_tokens: usize,
    pub seed: u64,
    pub input_ids: Vec<u32>,
    _permit: OwnedSemaphorePermit,
}

/// A generation read to its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Completed {
    pub text: String,
    pub tokens: Vec<TokenText>,
    pub finish: Finish,
    pub input_tokens: usize,
    pub seed: u64,
    pub input_ids: Vec<u32>,
    /// From prompt position 1 on; empty unless prompt logprobs were asked for.
    pub prompt_logprobs: PromptLogprobs,
}

impl Generation {
    /// Admits the request (429 when the server is full), validates it and submits it.
    pub async fn start(
        state: &AppState,
        route: &'static str,
        prompt: Prompt,
        params: &GenerationParams,
    ) -> Result<Self, AppError> {
        let metrics = RequestMetrics::start(route);
        match Self::submit(state, prompt, params).await {
            Ok((text, input_ids, seed, permit)) => {
                metrics.input_tokens(input_ids.len());
                Ok(Self {
                    text,
                    metrics,
                    input_tokens: input_ids.len(),
                    seed,
                    input_ids,
                    _permit: permit,
                })
            }
            Err(error) => {
                metrics.fail(error.metric_reason());
                Err(error)
            }
        }
    }

    async fn submit(
        state: &AppState,
        prompt: Prompt,
        params: &GenerationParams,
    ) -> Result<(TextStream, Vec<u32>, u64, OwnedSemaphorePermit), AppError> {
        let permit = Arc::clone(&state.admission)
            .try_acquire_owned()
            .map_err(|_| AppError::Overloaded(state.info.max_concurrent_requests))?;
        let valid = state.validator.validate(prompt, params).await?;
        let input_ids = valid.request.input_ids.clone();
        let seed = valid.request.sampling.seed;
        let events = state.backend.submit(valid.request)?;
        let text = TextStream::new(events, Arc::clone(&state.decoding), &input_ids, valid.stop);
        Ok((text, input_ids, seed, permit))
    }

    /// The next token, `None` after the last one.
    pub async fn next(&mut self) -> Option<Result<TextDelta, AppError>> {
        let delta = self.text.next().await?;
        if let Ok(delta) = &delta {
            self.metrics.token(self.text.admitted_at(), delta.finish);
        }
        Some(delta.map_err(AppError::from))
    }

    /// Prompt log-probabilities received so far.
    pub fn prompt_logprobs(&self) -> &PromptLogprobs {
        self.text.prompt_logprobs()
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.metrics.generated_tokens()
    }

    /// Records the request as complete.
    pub fn succeed(self) {
        self.metrics.succeed();
    }

    /// Records the request as failed with `error`.
    pub fn fail(self, error: &AppError) {
        self.metrics.fail(error.metric_reason());
    }

    /// Reads the generation to its end.
    pub async fn collect(mut self) -> Result<Completed, AppError> {
        let mut text = String::new();
        let mut tokens = Vec::new();
        loop {
            match self.next().await {
                Some(Ok(delta)) => {
                    text.push_str(&delta.token.text);
                    tokens.push(delta.token);
                    if let Some(finish) = delta.finish {
                        let completed = Completed {
                            text,
                            tokens,
                            finish,
                            input_tokens: self.input_tokens,
                            seed: self.seed,
                            input_ids: std::mem::take(&mut self.input_ids),
                            prompt_logprobs: self.prompt_logprobs().clone(),
                        };
                        self.succeed();
                        return Ok(completed);
                    }
                }
                Some(Err(error)) => {
                    self.fail(&error);
                    return Err(error);
                }
                None => {
                    let error = AppError::Stream(StreamError::Incomplete);
                    self.fail(&error);
                    return Err(error);
                }
            }
        }
    }
}
