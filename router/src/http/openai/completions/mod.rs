//! `POST /v1/completions`.

mod request;

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

pub use request::CompletionRequest;
use request::{Choices, Echo};

use super::chunks::{completion_chunk, CompletionChunk, CompletionChunkChoice};
use super::logprobs::CompletionLogprobs;
use super::{
    finish_reason, stream_chunks, ChunkBuilder, PromptUsage, ResponseMeta, StreamOptions, Usage,
};
use crate::error::{ApiError, OpenAi, OpenAiErrorResponses};
use crate::generation::{collect_siblings, AdmittedRequest, Completed};
use crate::http::middleware::caller::Caller;
use crate::http::state::AppState;
use crate::http::transport::json::ApiJson;
use crate::scheduler::PromptLogprobs;
use crate::stream::{Finish, TokenDecoding, TokenText};
use crate::validation::request_rules;

/// A text completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct Completion {
    id: String,
    /// Always `text_completion`.
    object: &'static str,
    created: u64,
    model: String,
    /// Prompt *p*'s choice *i* has index *p* × `n` + *i*.
    choices: Vec<CompletionChoice>,
    usage: Usage,
}

/// One choice of a text completion.
#[derive(Debug, Serialize, ToSchema)]
struct CompletionChoice {
    index: usize,
    text: String,
    /// With `logprobs`: `{tokens, token_logprobs, top_logprobs, text_offset}`.
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
    /// `stop` or `length`.
    finish_reason: &'static str,
}

/// Chunks of `object: "text_completion"`; with logprobs, one per token.
struct CompletionChunks {
    meta: ResponseMeta,
    /// The token decoding and one logprobs builder per choice.
    logprobs: Option<(Arc<TokenDecoding>, Vec<CompletionLogprobs>)>,
    /// With `echo`: each prompt's text and token ids, sent first in each of its choices.
    echoes: Option<Vec<(String, Vec<u32>)>>,
    echo: Echo,
    /// Choices per prompt.
    n: usize,
}

impl CompletionChunks {
    fn echo_chunk(&self, index: usize, logprobs: Option<Value>) -> Option<Value> {
        let (text, _) = self.echoes.as_ref()?.get(index / self.n)?;
        let choice = CompletionChunkChoice {
            index,
            text: text.clone(),
            logprobs,
            finish_reason: None,
        };
        Some(completion_chunk(&self.meta, vec![choice], None))
    }
}

impl ChunkBuilder for CompletionChunks {
    /// The echo, unless it waits for the prompt logprobs.
    fn opening(&self, index: usize) -> Option<Value> {
        if self.echo.prompt_logprobs {
            return None;
        }
        self.echo_chunk(index, None)
    }

    fn prompt(&mut self, index: usize, prompt: &PromptLogprobs) -> Option<Value> {
        if !self.echo.prompt_logprobs {
            return None;
        }
        let (_, input_ids) = self.echoes.as_ref()?.get(index / self.n)?;
        let (decoding, per_choice) = self.logprobs.as_mut()?;
        let logprobs = per_choice.get_mut(index)?;
        logprobs.push_prompt(input_ids, prompt, decoding);
        let logprobs = Some(logprobs.take());
        self.echo_chunk(index, logprobs)
    }

    fn token(
        &mut self,
        index: usize,
        token: TokenText,
        finish: Option<&'static str>,
    ) -> Option<Value> {
        if self.echo.prompt_only {
            let logprobs = self
                .logprobs
                .as_mut()
                .map(|(_, per_choice)| per_choice.get_mut(index).map(CompletionLogprobs::take));
            let choice = CompletionChunkChoice {
                index,
                text: String::new(),
                logprobs: logprobs.flatten(),
                finish_reason: finish.map(|_| "length"),
            };
            return finish.map(|_| completion_chunk(&self.meta, vec![choice], None));
        }
        let logprobs = match &mut self.logprobs {
            Some((decoding, per_choice)) => {
                let logprobs = per_choice.get_mut(index)?;
                logprobs.push(&token, decoding);
                Some(logprobs.take())
            }
            None if token.text.is_empty() && finish.is_none() => return None,
            None => None,
        };
        let choice = CompletionChunkChoice {
            index,
            text: token.text,
            logprobs,
            finish_reason: finish,
        };
        Some(completion_chunk(&self.meta, vec![choice], None))
    }

    /// A prompt-only request generated nothing it returns.
    fn usage(&self, usage: Usage) -> Value {
        let completion_tokens = if self.echo.prompt_only {
            0
        } else {
            usage.completion_tokens
        };
        let usage = Usage {
            completion_tokens,
            total_tokens: usage.prompt_tokens + completion_tokens,
            ..usage
        };
        completion_chunk(&self.meta, Vec::new(), Some(usage))
    }
}

/// `POST /v1/completions`.
#[utoipa::path(post, path = "/v1/completions", tag = "OpenAI", request_body = CompletionRequest, responses(
    (status = 200, description = "The completion, or with `stream: true` server-sent events of \
        `text_completion` objects ending with `data: [DONE]`",
        content(
            (Completion = "application/json"),
            (CompletionChunk = "text/event-stream"))),
    OpenAiErrorResponses))]
pub async fn completions(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request, _): ApiJson<CompletionRequest, OpenAi>,
) -> Result<Response, ApiError<OpenAi>> {
    let stream = request.stream == Some(true);
    let include_usage =
        StreamOptions::usage_wanted(request.stream_options, state.config.always_include_usage);
    let with_logprobs = request.logprobs.is_some();
    let plan = request.into_plan(&state.config)?;
    for prompt in &plan.prompts {
        state.validator.check_prompt(prompt)?;
    }
    let echo_texts = if plan.echo.prompt_text {
        let tokenizer = &state.decoding.tokenizer;
        let texts = (plan.prompts.iter()).map(|p| request_rules::prompt_text(p, tokenizer));
        Some(texts.collect::<Result<Vec<_>, _>>()?)
    } else {
        None
    };
    let (n, best_of) = (plan.choices.n, plan.choices.best_of);
    let mut per_prompt = Vec::with_capacity(plan.prompts.len());
    for prompt in plan.prompts {
        let generations = AdmittedRequest::start_siblings(
            state.engine(caller),
            "completions",
            prompt,
            &plan.params,
            best_of,
        )
        .await?;
        per_prompt.push(generations);
    }
    let prompt_tokens = prompt_tokens(&per_prompt);
    let meta = ResponseMeta::new("cmpl", &state.answering_model(&plan.params));
    let decoding = with_logprobs.then(|| Arc::clone(&state.decoding));
    if stream {
        let echoes = echo_texts.map(|texts| {
            let ids = per_prompt.iter().map(|siblings| {
                siblings
                    .first()
                    .map(|g| g.input_ids.clone())
                    .unwrap_or_default()
            });
            texts.into_iter().zip(ids).collect()
        });
        let generations: Vec<AdmittedRequest> = per_prompt.into_iter().flatten().collect();
        let chunks = CompletionChunks {
            meta,
            logprobs: decoding.map(|decoding| {
                let per_choice = (0..generations.len()).map(|_| CompletionLogprobs::default());
                (decoding, per_choice.collect())
            }),
            echoes,
            echo: plan.echo,
            n,
        };
        let usage = include_usage.then_some(PromptUsage {
            tokens: prompt_tokens,
            choices_per_prompt: best_of,
        });
        return Ok(stream_chunks(generations, chunks, usage));
    }
    let collected =
        futures::future::try_join_all(per_prompt.into_iter().map(collect_siblings)).await?;
    let cached_tokens = cached_prompt_tokens(&collected);
    let echoed = EchoedPrompts {
        texts: echo_texts.as_deref(),
        echo: plan.echo,
    };
    let (choices, completion_tokens) =
        ranked_choices(collected, plan.choices, &echoed, decoding.as_deref());
    let body = Completion {
        id: meta.id,
        object: "text_completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage: Usage::new(prompt_tokens, completion_tokens).with_cached_tokens(cached_tokens),
    };
    Ok(Json(body).into_response())
}

/// The prompts' tokens, each prompt counted once however many choices share it.
fn prompt_tokens(per_prompt: &[Vec<AdmittedRequest>]) -> usize {
    per_prompt
        .iter()
        .map(|siblings| siblings.first().map_or(0, |g| g.input_tokens))
        .sum()
}

/// The prompt tokens the prefix cache served, each prompt counted once, as its first choice
/// found it.
fn cached_prompt_tokens(per_prompt: &[Vec<Completed>]) -> usize {
    per_prompt
        .iter()
        .map(|siblings| siblings.first().map_or(0, |choice| choice.cached_tokens))
        .sum()
}

/// What the choices of each prompt start with.
struct EchoedPrompts<'a> {
    texts: Option<&'a [String]>,
    echo: Echo,
}

/// Each prompt's `n` most likely candidates as numbered choices, and the tokens all candidates generated.
fn ranked_choices(
    collected: Vec<Vec<Completed>>,
    choices: Choices,
    echoed: &EchoedPrompts<'_>,
    decoding: Option<&TokenDecoding>,
) -> (Vec<CompletionChoice>, usize) {
    let Choices { n, best_of } = choices;
    let mut ranked = Vec::new();
    let mut completion_tokens = 0;
    for (prompt_index, mut completed) in collected.into_iter().enumerate() {
        // Every candidate counts, returned or not; a prompt-only choice generated nothing it returns.
        if !echoed.echo.prompt_only {
            completion_tokens += completed.iter().map(|c| c.tokens.len()).sum::<usize>();
        }
        if best_of > n {
            completed.sort_by(|a, b| b.cumulative_logprob().total_cmp(&a.cumulative_logprob()));
            completed.truncate(n);
        }
        let echo_text = echoed.texts.and_then(|texts| texts.get(prompt_index));
        for (choice_index, mut choice) in completed.into_iter().enumerate() {
            if echoed.echo.prompt_only {
                choice.tokens.clear();
                choice.text.clear();
                choice.finish = Finish::Length;
            }
            let index = prompt_index * n + choice_index;
            ranked.push(completion_choice(
                index,
                choice,
                decoding,
                echoed.echo,
                echo_text,
            ));
        }
    }
    (ranked, completion_tokens)
}

fn completion_choice(
    index: usize,
    completed: Completed,
    decoding: Option<&TokenDecoding>,
    echo: Echo,
    echo_text: Option<&String>,
) -> CompletionChoice {
    CompletionChoice {
        index,
        logprobs: decoding.map(|decoding| {
            let mut logprobs = CompletionLogprobs::default();
            if echo.prompt_logprobs {
                logprobs.push_prompt(&completed.input_ids, &completed.prompt_logprobs, decoding);
            }
            for token in &completed.tokens {
                logprobs.push(token, decoding);
            }
            logprobs.take()
        }),
        finish_reason: finish_reason(completed.finish),
        text: match echo_text {
            Some(prompt) => format!("{prompt}{}", completed.text),
            None => completed.text,
        },
    }
}
