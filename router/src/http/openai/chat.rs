//! `POST /v1/chat/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::chunks::{chat_chunk, ChatChunk, ChatChunkChoice, ChatDelta};
use super::logprobs::chat_logprobs;
use super::tool_calls::{self, ChoiceOutput, DeltaBody, ToolCall};
use super::{
    finish_reason, stream_chunks, ChunkBuilder, ResponseMeta, StopSpec, StreamOptions, Usage,
};
use crate::error::{ApiError, OpenAi, OpenAiErrorResponses};
use crate::http::generation::{collect_siblings, AdmittedRequest};
use crate::http::json::ApiJson;
use crate::http::state::{AppState, HandlerConfig};
use crate::scheduler::LogprobOptions;
use crate::stream::{TokenDecoding, TokenText};
use crate::validation::response_format;
use crate::validation::tools::{self, ToolChoice, ToolPlan};
use crate::validation::{
    check_choices, check_count, reject_unsupported, ChatEnding, ChatMessage, GenerationParams,
    Prompt, ValidationError,
};

/// Most alternatives per token OpenAI's chat route returns.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// The request body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatRequest {
    /// The conversation; required and non-empty.
    messages: Option<Vec<RequestMessage>>,
    /// Accepted and ignored: the served model answers.
    #[allow(dead_code)]
    model: Option<String>,
    /// Accepted and ignored: an opaque end-user id.
    #[allow(dead_code)]
    user: Option<String>,
    #[schema(minimum = 1)]
    max_tokens: Option<i64>,
    /// Takes precedence over `max_tokens`.
    #[schema(minimum = 1)]
    max_completion_tokens: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    #[schema(minimum = 1, maximum = 16)]
    n: Option<i64>,
    logprobs: Option<bool>,
    #[schema(minimum = 0, maximum = 20)]
    top_logprobs: Option<i64>,
    #[schema(minimum = 0.0, maximum = 100.0)]
    temperature: Option<f64>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    #[schema(minimum = 0)]
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<StopSpec>,
    #[schema(minimum = 0)]
    min_tokens: Option<i64>,
    ignore_eos: Option<bool>,
    stop_token_ids: Option<Vec<u32>>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    min_p: Option<f64>,
    #[schema(exclusive_minimum = 0.0)]
    repetition_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    presence_penalty: Option<f64>,
    /// Token id (decimal string) → bias in -100..100.
    logit_bias: Option<BTreeMap<String, f64>>,
    /// Follow the conversation with the assistant's generation prompt (default `true`).
    add_generation_prompt: Option<bool>,
    /// Continue the last message, an assistant's, instead of starting a new one.
    continue_final_message: Option<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Map<String, Value>,
}

/// One chat message.
#[derive(Debug, Deserialize, ToSchema)]
struct RequestMessage {
    #[schema(value_type = ChatRole)]
    role: String,
    content: Option<MessageContent>,
    name: Option<String>,
    tool_call_id: Option<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Map<String, Value>,
}

/// The roles a chat message may have.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
enum ChatRole {
    System,
    User,
    Assistant,
    Tool,
}

/// A message's text, or a list of text parts joined by newlines.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part; only `text` parts are supported.
#[derive(Debug, Deserialize, ToSchema)]
struct ContentPart {
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    kind: String,
    text: Option<String>,
}

impl RequestMessage {
    /// Flattens text parts (joined by newlines); other part types are not supported yet.
    fn into_chat_message(mut self, index: usize) -> Result<ChatMessage, ValidationError> {
        let calls = self
            .extra
            .remove("tool_calls")
            .filter(|calls| !calls.is_null());
        reject_unsupported(&self.extra, &[]).map_err(|error| match error {
            ValidationError::Unsupported { param, detail } => ValidationError::Unsupported {
                param: format!("messages[{index}].{param}"),
                detail,
            },
            other => other,
        })?;
        let content = match self.content {
            None => String::new(),
            Some(MessageContent::Text(text)) => text,
            Some(MessageContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (part_index, part) in parts.into_iter().enumerate() {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(text)) => texts.push(text),
                        _ => {
                            return Err(ValidationError::Unsupported {
                                param: format!("messages[{index}].content[{part_index}]"),
                                detail: format!(": content of type `{}`", part.kind),
                            })
                        }
                    }
                }
                texts.join("\n")
            }
        };
        // Assistant calls are shown to the model in the format it is asked to call in.
        let content = match calls {
            Some(calls) if content.is_empty() => {
                tools::history_calls(calls, &format!("messages[{index}].tool_calls"))?
            }
            _ => content,
        };
        Ok(ChatMessage {
            role: self.role,
            content,
            name: self.name,
            tool_call_id: self.tool_call_id,
        })
    }
}

super::impl_sampling_fields!(ChatRequest);

impl ChatRequest {
    /// How the rendered conversation ends: `continue_final_message` needs a last assistant
    /// message and excludes an explicit `add_generation_prompt: true`.
    fn ending(&self, messages: &[ChatMessage]) -> Result<ChatEnding, ValidationError> {
        if self.continue_final_message != Some(true) {
            return Ok(match self.add_generation_prompt {
                Some(false) => ChatEnding::Closed,
                _ => ChatEnding::GenerationPrompt,
            });
        }
        if self.add_generation_prompt == Some(true) {
            return Err(ValidationError::OutOfRange {
                param: "continue_final_message".to_owned(),
                expected: "false when `add_generation_prompt` is true",
                value: "true".to_owned(),
            });
        }
        match messages.last() {
            Some(last) if last.role == "assistant" => Ok(ChatEnding::ContinueFinal),
            _ => Err(ValidationError::OutOfRange {
                param: "continue_final_message".to_owned(),
                expected: "true only when the last message is the assistant's",
                value: "true".to_owned(),
            }),
        }
    }

    /// The prompt, the parameters and the number of choices.
    fn into_parts(
        mut self,
        config: &HandlerConfig,
    ) -> Result<(Prompt, GenerationParams, usize, Option<ToolPlan>), ValidationError> {
        let response_format = self.extra.remove("response_format");
        let tools = self.extra.remove("tools");
        let max_tools = config.request_limits.max_tools;
        if let Some(Value::Array(entries)) = &tools {
            if entries.len() > max_tools {
                return Err(ValidationError::TooMany {
                    param: "tools",
                    max: max_tools,
                    got: entries.len(),
                });
            }
        }
        let tool_plan = tools::plan(
            tools,
            self.extra.remove("tool_choice"),
            self.extra.remove("parallel_tool_calls"),
        )?;
        reject_unsupported(&self.extra, &[])?;
        let n = check_choices("n", self.n, config.request_limits.max_choices)?;
        let mut messages = self
            .messages
            .take()
            .ok_or(ValidationError::Missing("messages"))?
            .into_iter()
            .enumerate()
            .map(|(index, message)| message.into_chat_message(index))
            .collect::<Result<Vec<_>, _>>()?;
        let ending = self.ending(&messages)?;
        let (max_new_tokens, max_new_tokens_param) = match self.max_completion_tokens {
            Some(n) => (Some(n), "max_completion_tokens"),
            None => (self.max_tokens, "max_tokens"),
        };
        let top_logprobs = check_count("top_logprobs", self.top_logprobs, MAX_TOP_LOGPROBS)?;
        if top_logprobs > 0 && self.logprobs != Some(true) {
            return Err(ValidationError::OutOfRange {
                param: "logprobs".to_owned(),
                expected: "true when `top_logprobs` is set",
                value: format!("{:?}", self.logprobs),
            });
        }
        let logprobs = LogprobOptions {
            top_logprobs,
            prompt_logprobs: false,
        };
        let mut params = self
            .sampling_fields()
            .or_defaults(&config.default_sampling)
            .into_params((max_new_tokens, max_new_tokens_param), logprobs);
        params.grammar = response_format::grammar(response_format)?;
        if let Some(plan) = tool_plan.as_ref().filter(|plan| plan.may_call()) {
            if params.grammar.is_some() {
                return Err(ValidationError::Unsupported {
                    param: "response_format".to_owned(),
                    detail: " together with `tools` the model may call".to_owned(),
                });
            }
            params.grammar = plan.grammar();
            if let Some(preamble) = plan.preamble() {
                match messages.first_mut().filter(|first| first.role == "system") {
                    Some(system) => {
                        system.content = format!("{}\n\n{}", system.content, preamble.content)
                    }
                    None => messages.insert(0, preamble),
                }
            }
        }
        Ok((Prompt::Chat(messages, ending), params, n, tool_plan))
    }
}

/// A chat completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<ChatChoice>,
    usage: Usage,
}

/// One choice of a chat completion.
#[derive(Debug, Serialize, ToSchema)]
struct ChatChoice {
    index: usize,
    message: AssistantMessage,
    /// With `logprobs: true`: `{content: [{token, logprob, bytes, top_logprobs}], refusal: null}`.
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
    /// `stop` or `length`.
    finish_reason: &'static str,
}

/// The generated message.
#[derive(Debug, Serialize, ToSchema)]
struct AssistantMessage {
    role: &'static str,
    /// `null` when the model called tools.
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCall>>,
    /// Always `null`: the model never refuses through a separate channel.
    refusal: Option<String>,
}

/// Chunks of `object: "chat.completion.chunk"`; the first one announces the role.
/// With `logprobs`, every token gets a chunk, even one that releases no text.
struct ChatChunks {
    meta: ResponseMeta,
    logprobs: Option<Arc<TokenDecoding>>,
    /// Per choice, when the model may call tools.
    tool_outputs: Option<Vec<ChoiceOutput>>,
}

impl ChunkBuilder for ChatChunks {
    fn opening(&self, index: usize) -> Option<Value> {
        let delta = ChatDelta {
            role: Some("assistant"),
            content: Some(String::new()),
            tool_calls: None,
        };
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
        };
        Some(chat_chunk(&self.meta, vec![choice], None))
    }

    fn token(
        &mut self,
        index: usize,
        token: TokenText,
        finish: Option<&'static str>,
    ) -> Option<Value> {
        let (body, finish) = match self
            .tool_outputs
            .as_mut()
            .and_then(|outputs| outputs.get_mut(index))
        {
            Some(output) => {
                let body = output.push(token.text.clone());
                (body, finish.map(|finish| output.finish_reason(finish)))
            }
            None if token.text.is_empty() => (DeltaBody::Nothing, finish),
            None => (DeltaBody::Content(token.text.clone()), finish),
        };
        if body == DeltaBody::Nothing && finish.is_none() && self.logprobs.is_none() {
            return None;
        }
        let logprobs = self
            .logprobs
            .as_ref()
            .map(|decoding| chat_logprobs(std::slice::from_ref(&token), decoding));
        let delta = match body {
            DeltaBody::Nothing => ChatDelta::default(),
            DeltaBody::Content(text) => ChatDelta {
                content: Some(text),
                ..ChatDelta::default()
            },
            DeltaBody::ToolCalls(calls) => ChatDelta {
                tool_calls: Some(calls),
                ..ChatDelta::default()
            },
        };
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: finish,
        };
        Some(chat_chunk(&self.meta, vec![choice], None))
    }

    fn usage(&self, usage: Usage) -> Value {
        chat_chunk(&self.meta, Vec::new(), Some(usage))
    }
}

/// `POST /v1/chat/completions`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "OpenAI", request_body = ChatRequest, responses(
    (status = 200, description = "The completion, or with `stream: true` server-sent events of \
        `chat.completion.chunk` objects ending with `data: [DONE]`",
        content(
            (ChatCompletion = "application/json"),
            (ChatChunk = "text/event-stream"))),
    OpenAiErrorResponses))]
pub async fn completions(
    State(state): State<AppState>,
    ApiJson(request, _): ApiJson<ChatRequest, OpenAi>,
) -> Result<Response, ApiError<OpenAi>> {
    let stream = request.stream == Some(true);
    let include_usage =
        StreamOptions::usage_wanted(request.stream_options, state.config.always_include_usage);
    let with_logprobs = request.logprobs == Some(true);
    let (prompt, params, n, tool_plan) = request.into_parts(&state.config)?;
    let generations =
        AdmittedRequest::start_siblings(&state, "chat_completions", prompt, &params, n).await?;
    let meta = ResponseMeta::new("chatcmpl", &state.config.model_id);
    let decoding = with_logprobs.then(|| Arc::clone(&state.decoding));
    if stream {
        let tool_outputs = tool_plan
            .as_ref()
            .filter(|plan| plan.may_call())
            .map(|plan| {
                let required = plan.choice != ToolChoice::Auto;
                (0..n).map(|_| ChoiceOutput::new(required)).collect()
            });
        let chunks = ChatChunks {
            meta,
            logprobs: decoding,
            tool_outputs,
        };
        let prompt_tokens = generations.first().map_or(0, |g| g.input_tokens);
        return Ok(stream_chunks(
            generations,
            chunks,
            include_usage.then_some(prompt_tokens),
        ));
    }
    let completed = collect_siblings(generations).await?;
    let prompt_tokens = completed.first().map_or(0, |choice| choice.input_tokens);
    let completion_tokens = completed.iter().map(|choice| choice.tokens.len()).sum();
    let choices: Vec<ChatChoice> = completed
        .into_iter()
        .enumerate()
        .map(|(index, choice)| ChatChoice {
            index,
            logprobs: decoding
                .as_ref()
                .map(|decoding| chat_logprobs(&choice.tokens, decoding)),
            finish_reason: finish_reason(choice.finish),
            message: AssistantMessage {
                role: "assistant",
                content: Some(choice.text),
                tool_calls: None,
                refusal: None,
            },
        })
        .collect();
    let choices = match tool_plan.filter(ToolPlan::may_call) {
        Some(_) => choices.into_iter().map(with_tool_calls).collect(),
        None => choices,
    };
    let body = ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage: Usage::new(prompt_tokens, completion_tokens),
    };
    Ok(Json(body).into_response())
}

/// Moves a calls document out of `content` into `tool_calls` (finish reason `tool_calls`).
fn with_tool_calls(mut choice: ChatChoice) -> ChatChoice {
    let parsed = choice
        .message
        .content
        .as_deref()
        .and_then(tool_calls::parse);
    if let Some(calls) = parsed.filter(|calls| !calls.is_empty()) {
        if choice.finish_reason == "stop" {
            choice.finish_reason = "tool_calls";
        }
        choice.message.content = None;
        choice.message.tool_calls = Some(calls);
    }
    choice
}
