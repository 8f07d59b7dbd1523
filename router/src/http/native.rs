//! TGI-compatible routes: `POST /generate` and `POST /generate_stream`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::generation::{collect_siblings, Completed, Generation};
use super::json::ApiJson;
use super::sse::{json_event, sse_response};
use super::AppState;
use crate::error::{error_event, Api, ApiError, AppError, Native};
use crate::scheduler::{LogprobOptions, PromptLogprobs, TokenLogprob};
use crate::stream::{Finish, TokenDecoding, TokenText};
use crate::validation::{
    check_choices, check_count, reject_unsupported, GenerationParams, ProcessorParams, Prompt,
    RequestedGrammar, ValidationError,
};

/// Most alternatives per token `top_n_tokens` may ask for (TGI's default limit).
pub const MAX_TOP_N_TOKENS: u32 = 5;

/// `POST /generate` and `/generate_stream` body.
#[derive(Debug, Deserialize)]
pub struct GenerateRequest {
    inputs: String,
    parameters: Option<GenerateParameters>,
    stream: Option<bool>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
struct GenerateParameters {
    best_of: Option<i64>,
    details: Option<bool>,
    do_sample: Option<bool>,
    max_new_tokens: Option<i64>,
    return_full_text: Option<bool>,
    seed: Option<u64>,
    stop: Option<Vec<String>>,
    temperature: Option<f64>,
    top_k: Option<i64>,
    top_p: Option<f64>,
    top_n_tokens: Option<i64>,
    decoder_input_details: Option<bool>,
    typical_p: Option<f64>,
    repetition_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// How the response is shaped, beyond what the scheduler needs.
struct ResponseOptions {
    /// Candidates generated; the most likely one (highest cumulative logprob) is returned.
    best_of: usize,
    details: bool,
    decoder_input_details: bool,
    full_text_prefix: Option<String>,
}

impl GenerateRequest {
    fn into_parts(self) -> Result<(Prompt, GenerationParams, ResponseOptions), ValidationError> {
        reject_unsupported(&self.extra, &[])?;
        let mut p = self.parameters.unwrap_or_default();
        let grammar = RequestedGrammar::from_tgi(p.extra.remove("grammar"))?;
        reject_unsupported(&p.extra, &[])?;
        let best_of = check_choices("best_of", p.best_of)?;
        let sampling_requested = p.do_sample == Some(true)
            || p.temperature.is_some_and(|t| t != 1.0)
            || p.top_k.is_some_and(|k| k != 0)
            || p.top_p.is_some_and(|t| t != 1.0)
            || p.typical_p.is_some_and(|t| t != 1.0);
        // Greedy candidates would all be the same sequence.
        if best_of > 1 && !sampling_requested {
            return Err(ValidationError::OutOfRange {
                param: "best_of".to_owned(),
                expected: "1 unless sampling (`do_sample` or a sampling parameter)",
                value: best_of.to_string(),
            });
        }
        let params = GenerationParams {
            temperature: if sampling_requested {
                p.temperature
            } else {
                Some(0.0)
            },
            top_p: p.top_p,
            top_k: p.top_k,
            max_new_tokens: p.max_new_tokens,
            max_new_tokens_param: "max_new_tokens",
            seed: p.seed,
            stop: p.stop.unwrap_or_default(),
            processors: ProcessorParams {
                typical_p: p.typical_p,
                repetition_penalty: p.repetition_penalty,
                frequency_penalty: p.frequency_penalty,
                ..ProcessorParams::default()
            },
            min_new_tokens: None,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            logprobs: LogprobOptions {
                top_logprobs: check_count("top_n_tokens", p.top_n_tokens, MAX_TOP_N_TOKENS)?,
                prompt_logprobs: p.decoder_input_details == Some(true),
            },
            grammar,
        };
        let options = ResponseOptions {
            best_of,
            details: p.details == Some(true),
            decoder_input_details: p.decoder_input_details == Some(true),
            full_text_prefix: (p.return_full_text == Some(true)).then(|| self.inputs.clone()),
        };
        Ok((Prompt::Text(self.inputs), params, options))
    }
}

#[derive(Debug, Serialize)]
struct GenerateResponse {
    generated_text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
}

#[derive(Debug, Serialize)]
struct Details {
    finish_reason: &'static str,
    generated_tokens: usize,
    seed: u64,
    prefill: Vec<PrefillToken>,
    tokens: Vec<Token>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    top_tokens: Vec<Vec<Token>>,
    /// The candidates not chosen, when `best_of` > 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    best_of_sequences: Option<Vec<BestOfSequence>>,
}

#[derive(Debug, Serialize)]
struct BestOfSequence {
    generated_text: String,
    #[serde(flatten)]
    details: Details,
}

#[derive(Debug, Serialize)]
struct Token {
    id: u32,
    text: String,
    logprob: f32,
    special: bool,
}

impl From<TokenText> for Token {
    fn from(token: TokenText) -> Self {
        Self {
            id: token.id,
            text: token.text,
            logprob: token.logprob,
            special: token.special,
        }
    }
}

/// A prompt token; the first one has no logprob (nothing precedes it).
#[derive(Debug, Serialize)]
struct PrefillToken {
    id: u32,
    text: String,
    logprob: Option<f32>,
}

fn prefill(
    input_ids: &[u32],
    logprobs: &PromptLogprobs,
    decoding: &TokenDecoding,
) -> Vec<PrefillToken> {
    input_ids
        .iter()
        .enumerate()
        .map(|(position, &id)| PrefillToken {
            id,
            text: decoding.token_text(id),
            logprob: position
                .checked_sub(logprobs.first_position)
                .and_then(|index| logprobs.logprobs.get(index).copied()),
        })
        .collect()
}

/// Alternatives of one generated token as TGI `Token`s.
fn top_tokens(alternatives: &[TokenLogprob], decoding: &TokenDecoding) -> Vec<Token> {
    alternatives
        .iter()
        .map(|alt| Token {
            id: alt.id,
            text: decoding.token_text(alt.id),
            logprob: alt.logprob,
            special: decoding.is_special(alt.id),
        })
        .collect()
}

#[derive(Debug, Serialize)]
struct StreamResponse {
    index: usize,
    token: Token,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    top_tokens: Vec<Token>,
    generated_text: Option<String>,
    details: Option<StreamDetails>,
}

#[derive(Debug, Serialize)]
struct StreamDetails {
    finish_reason: &'static str,
    generated_tokens: usize,
    seed: u64,
    input_length: usize,
}

fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "length",
        Finish::EosToken => "eos_token",
        Finish::StopSequence => "stop_sequence",
    }
}

/// `POST /generate`: the whole generation as one JSON object.
pub async fn generate(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<GenerateRequest, Native>,
) -> Result<Response, ApiError<Native>> {
    if request.stream == Some(true) {
        return Err(ValidationError::Unsupported {
            param: "stream".to_owned(),
            detail: " on /generate: use /generate_stream".to_owned(),
        }
        .into());
    }
    let (prompt, params, options) = request.into_parts()?;
    let generations =
        Generation::start_siblings(&state, "generate", prompt, &params, options.best_of).await?;
    let mut candidates = collect_siblings(generations).await?;
    let best = candidates
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| a.cumulative_logprob().total_cmp(&b.cumulative_logprob()))
        .map_or(0, |(index, _)| index);
    let chosen = candidates.swap_remove(best);
    let others = (options.best_of > 1).then(|| {
        candidates
            .into_iter()
            .map(|candidate| {
                let (generated_text, details) = answer(candidate, &options, &state.decoding);
                BestOfSequence {
                    generated_text,
                    details,
                }
            })
            .collect()
    });
    let (generated_text, mut details) = answer(chosen, &options, &state.decoding);
    details.best_of_sequences = others;
    let body = GenerateResponse {
        generated_text,
        details: options.details.then_some(details),
    };
    Ok(Json(body).into_response())
}

/// A finished generation's text (with the prompt when `return_full_text`) and details.
fn answer(
    completed: Completed,
    options: &ResponseOptions,
    decoding: &TokenDecoding,
) -> (String, Details) {
    let details = Details {
        finish_reason: finish_reason(completed.finish),
        generated_tokens: completed.tokens.len(),
        seed: completed.seed,
        prefill: if options.decoder_input_details {
            prefill(&completed.input_ids, &completed.prompt_logprobs, decoding)
        } else {
            Vec::new()
        },
        top_tokens: if completed.tokens.iter().any(|t| !t.top_logprobs.is_empty()) {
            completed
                .tokens
                .iter()
                .map(|t| top_tokens(&t.top_logprobs, decoding))
                .collect()
        } else {
            Vec::new()
        },
        tokens: completed.tokens.into_iter().map(Token::from).collect(),
        best_of_sequences: None,
    };
    let generated_text = match &options.full_text_prefix {
        Some(prefix) => format!("{prefix}{}", completed.text),
        None => completed.text,
    };
    (generated_text, details)
}

/// `POST /generate_stream`: one event per token; the last carries the full text and details.
pub async fn generate_stream(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<GenerateRequest, Native>,
) -> Result<Response, ApiError<Native>> {
    let (prompt, params, options) = request.into_parts()?;
    if options.best_of > 1 {
        return Err(ValidationError::Unsupported {
            param: "best_of".to_owned(),
            detail: " on /generate_stream: use /generate".to_owned(),
        }
        .into());
    }
    let mut generation = Generation::start(&state, "generate_stream", prompt, &params).await?;
    let events = async_stream::stream! {
        let mut text = options.full_text_prefix.unwrap_or_default();
        loop {
            let error = match generation.next().await {
                Some(Ok(delta)) => {
                    text.push_str(&delta.token.text);
                    let index = generation.generated_tokens();
                    let details = delta.finish.map(|finish| StreamDetails {
                        finish_reason: finish_reason(finish),
                        generated_tokens: index,
                        seed: generation.seed,
                        input_length: generation.input_tokens,
                    });
                    let last = details.is_some();
                    let generated_text = last.then(|| std::mem::take(&mut text));
                    let top_tokens = top_tokens(&delta.token.top_logprobs, &state.decoding);
                    let token = delta.token.into();
                    yield json_event(&StreamResponse { index, token, top_tokens, generated_text, details });
                    if last {
                        generation.succeed();
                        return;
                    }
                    continue;
                }
                Some(Err(error)) => error,
                None => AppError::Stream(crate::stream::StreamError::Incomplete),
            };
            yield error_event(Api::Native, &error);
            generation.fail(&error);
            return;
        }
    };
    Ok(sse_response(events))
}
