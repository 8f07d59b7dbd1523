//! One generation as every API surface runs it: validate, admit (`admission.rs`), submit,
//! then read text deltas. Nothing here knows HTTP; the surfaces map requests into a prompt and
//! parameters and map the deltas into their responses.

mod admission;

use std::sync::Arc;

use futures::Stream;

pub use admission::{AdmissionTicket, LoadShedder};

use crate::error::AppError;
use crate::metrics::RequestMetrics;
use crate::reasoning::ReasoningSplitter;
use crate::scheduler::{Backend, PromptLogprobs};
use crate::stream::{Finish, StreamError, TextDelta, TextStream, TokenDecoding, TokenText};
use crate::telemetry::{traced_validation, GenerationTrace};
use crate::tenant::Tenant;
use crate::validation::{GenerationParams, Prompt, Validator};

/// What starting a generation needs: who it is for, the validator, the admission limits, the
/// scheduler and the token decoding.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    /// The API key the request came with (`None`: no keys configured); fair scheduling shares
    /// the engine between keys.
    pub tenant: Option<Tenant>,
    pub validator: &'a Validator,
    pub admission: &'a LoadShedder,
    pub backend: &'a dyn Backend,
    pub decoding: &'a Arc<TokenDecoding>,
}

/// A request validated, admitted and queued in the scheduler; reading it yields its text.
/// Dropping it cancels the request, releases what its admission holds and records it as
/// cancelled.
#[derive(Debug)]
pub struct AdmittedRequest {
    text: TextStream,
    /// Splits this generation's output into reasoning and answer; `None` for other models.
    pub reasoning: Option<ReasoningSplitter>,
    metrics: RequestMetrics,
    trace: GenerationTrace,
    pub input_tokens: usize,
    pub seed: u64,
    pub input_ids: Vec<u32>,
    ticket: AdmissionTicket,
}

/// A generation read to its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Completed {
    /// The answer: with a reasoning model, the output after its reasoning.
    pub text: String,
    /// A reasoning model's reasoning, split off the output.
    pub reasoning: Option<CompletedReasoning>,
    pub tokens: Vec<TokenText>,
    pub finish: Finish,
    pub input_tokens: usize,
    /// Prompt tokens the prefix cache served when the request was first admitted.
    pub cached_tokens: usize,
    pub seed: u64,
    pub input_ids: Vec<u32>,
    /// From prompt position 1 on; empty unless prompt logprobs were asked for.
    pub prompt_logprobs: PromptLogprobs,
}

impl Completed {
    /// The sum of the generated tokens' log-probabilities: how likely the whole output is.
    pub fn cumulative_logprob(&self) -> f32 {
        self.tokens.iter().map(|token| token.logprob).sum()
    }
}

/// The reasoning of a finished generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompletedReasoning {
    pub text: String,
    /// Tokens the reasoning took, its markers included.
    pub tokens: usize,
}

/// One sibling's next token (or error), tagged with the sibling's index.
#[derive(Debug)]
pub struct SiblingDelta {
    pub index: usize,
    pub delta: Result<TextDelta, AppError>,
    /// Tokens this sibling generated so far.
    pub generated_tokens: usize,
    /// On the sibling's first delta only: its prompt logprobs, all of them (the prompt's
    /// forward pass precedes the first token), empty unless asked for.
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// Reads every sibling to its end; the first error cancels the others.
pub async fn collect_siblings(
    generations: Vec<AdmittedRequest>,
) -> Result<Vec<Completed>, AppError> {
    futures::future::try_join_all(generations.into_iter().map(AdmittedRequest::collect)).await
}

/// What a successful submission hands back: one text stream and admission ticket per sibling.
struct Submitted {
    texts: Vec<TextStream>,
    reasoning: Option<ReasoningSplitter>,
    input_ids: Vec<u32>,
    /// Images the prompt carries.
    images: usize,
    seed: u64,
    tickets: Vec<AdmissionTicket>,
    traces: Vec<GenerationTrace>,
}

impl AdmittedRequest {
    /// Validates the request, admits it (429 when the server is full) and submits it.
    pub async fn start(
        engine: Engine<'_>,
        route: &'static str,
        prompt: Prompt,
        params: &GenerationParams,
    ) -> Result<Self, AppError> {
        let mut generations = Self::start_siblings(engine, route, prompt, params, 1).await?;
        Ok(generations
            .pop()
            .expect("invariant: one generation per requested sibling"))
    }

    /// Starts `count` generations of one prompt (`n` choices, `best_of` candidates). Each
    /// counts as a request against the admission limit; sibling `i` samples with seed
    /// `seed + i`, so a seeded request is reproducible choice by choice.
    pub async fn start_siblings(
        engine: Engine<'_>,
        route: &'static str,
        prompt: Prompt,
        params: &GenerationParams,
        count: usize,
    ) -> Result<Vec<Self>, AppError> {
        let metrics: Vec<RequestMetrics> = (0..count)
            .map(|_| RequestMetrics::start(route, engine.tenant))
            .collect();
        match Self::submit(engine, prompt, params, count).await {
            Ok(submitted) => {
                let Submitted {
                    texts,
                    reasoning,
                    input_ids,
                    images,
                    seed,
                    tickets,
                    traces,
                } = submitted;
                Ok(texts
                    .into_iter()
                    .zip(tickets)
                    .zip(metrics.into_iter().zip(traces))
                    .zip(0u64..)
                    .map(|(((text, ticket), (metrics, trace)), index)| {
                        metrics.input_tokens(input_ids.len());
                        metrics.images(images);
                        Self {
                            text,
                            reasoning: reasoning.clone(),
                            metrics,
                            trace,
                            input_tokens: input_ids.len(),
                            seed: seed.wrapping_add(index),
                            input_ids: input_ids.clone(),
                            ticket,
                        }
                    })
                    .collect())
            }
            Err(error) => {
                for metrics in metrics {
                    metrics.fail(error.metric_reason());
                }
                Err(error)
            }
        }
    }

    async fn submit(
        engine: Engine<'_>,
        prompt: Prompt,
        params: &GenerationParams,
        count: usize,
    ) -> Result<Submitted, AppError> {
        let is_chat = matches!(prompt, Prompt::Chat(..));
        let valid = traced_validation(engine.validator.validate(prompt, params)).await?;
        let queued_tokens =
            valid.request.input_ids.len() + valid.request.stopping.max_new_tokens as usize;
        let tickets = engine.admission.admit(count, queued_tokens)?;
        let input_ids = valid.request.input_ids.clone();
        let images = valid.request.images.len();
        let seed = valid.request.sampling.seed;
        let traces: Vec<GenerationTrace> = (0..count)
            .map(|choice| GenerationTrace::start(choice, input_ids.len()))
            .collect();
        let requests = (0u64..)
            .zip(&traces)
            .map(|(index, trace)| {
                let mut request = valid.request.clone();
                request.sampling.seed = seed.wrapping_add(index);
                request.tenant = engine.tenant;
                request.trace = trace.request_trace();
                request
            })
            .collect();
        let texts = engine
            .backend
            .submit_siblings(requests)?
            .into_iter()
            .map(|events| {
                TextStream::new(
                    events,
                    Arc::clone(engine.decoding),
                    &input_ids,
                    valid.stop.clone(),
                    is_chat,
                )
            })
            .collect();
        Ok(Submitted {
            texts,
            reasoning: valid.reasoning,
            input_ids,
            images,
            seed,
            tickets,
            traces,
        })
    }

    /// The next token, `None` after the last one.
    pub async fn next(&mut self) -> Option<Result<TextDelta, AppError>> {
        let delta = self.text.next().await?;
        // A token or an error: either way the request no longer waits in the queue.
        self.ticket.leave_queue();
        if let Ok(delta) = &delta {
            let finish = delta.finish.map(Finish::label);
            self.metrics.token(self.text.admitted_at(), finish);
            self.trace.token(self.text.admitted_at(), finish);
        }
        Some(delta.map_err(AppError::from))
    }

    /// Prompt log-probabilities received so far.
    pub fn prompt_logprobs(&self) -> &PromptLogprobs {
        self.text.prompt_logprobs()
    }

    /// The prompt logprobs received, on the first call only (`first` tracks it).
    fn prompt_logprobs_once(&self, first: &mut bool) -> Option<PromptLogprobs> {
        std::mem::take(first).then(|| self.prompt_logprobs().clone())
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.metrics.generated_tokens()
    }

    /// Records the request as complete.
    pub fn succeed(mut self) {
        self.trace.succeed();
        self.metrics.succeed();
    }

    /// Records the request as failed with `error`.
    pub fn fail(mut self, error: &AppError) {
        self.trace.fail(error.metric_reason());
        self.metrics.fail(error.metric_reason());
    }

    /// This generation's deltas tagged with `index`, ending after the last token or an error
    /// (a generation that ends early yields an incomplete-stream error).
    pub fn into_deltas(mut self, index: usize) -> impl Stream<Item = SiblingDelta> + Send {
        async_stream::stream! {
            let mut first = true;
            let delta = loop {
                match self.next().await {
                    Some(Ok(delta)) if delta.finish.is_none() => {
                        let generated_tokens = self.generated_tokens();
                        let prompt_logprobs = self.prompt_logprobs_once(&mut first);
                        yield SiblingDelta { index, delta: Ok(delta), generated_tokens, prompt_logprobs };
                    }
                    Some(delta) => break delta,
                    None => break Err(AppError::Stream(StreamError::Incomplete)),
                }
            };
            let generated_tokens = self.generated_tokens();
            let prompt_logprobs = self.prompt_logprobs_once(&mut first);
            match &delta {
                Ok(_) => self.succeed(),
                Err(error) => self.fail(error),
            }
            yield SiblingDelta { index, delta, generated_tokens, prompt_logprobs };
        }
    }

    /// Reads the generation to its end.
    pub async fn collect(mut self) -> Result<Completed, AppError> {
        let mut output = CompletedOutput::new(self.reasoning.take());
        let mut tokens = Vec::new();
        loop {
            match self.next().await {
                Some(Ok(delta)) => {
                    output.push(&delta.token.text);
                    tokens.push(delta.token);
                    if let Some(finish) = delta.finish {
                        let (text, reasoning) = output.finish();
                        let completed = Completed {
                            text,
                            reasoning,
                            tokens,
                            finish,
                            input_tokens: self.input_tokens,
                            cached_tokens: delta.cached_tokens,
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

/// A generation's text as it is read: all answer, or split by a reasoning splitter.
pub struct CompletedOutput {
    splitter: Option<ReasoningSplitter>,
    answer: String,
    reasoning: String,
}

impl CompletedOutput {
    pub fn new(splitter: Option<ReasoningSplitter>) -> Self {
        Self {
            splitter,
            answer: String::new(),
            reasoning: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) {
        match &mut self.splitter {
            Some(splitter) => {
                let split = splitter.push(text);
                self.reasoning.push_str(&split.reasoning);
                self.answer.push_str(&split.answer);
            }
            None => self.answer.push_str(text),
        }
    }

    /// The answer, and the reasoning when the output was split.
    pub fn finish(mut self) -> (String, Option<CompletedReasoning>) {
        let Some(mut splitter) = self.splitter.take() else {
            return (self.answer, None);
        };
        let rest = splitter.finish();
        self.reasoning.push_str(&rest.reasoning);
        self.answer.push_str(&rest.answer);
        let reasoning = CompletedReasoning {
            text: self.reasoning,
            tokens: splitter.reasoning_tokens(),
        };
        (self.answer, Some(reasoning))
    }
}
