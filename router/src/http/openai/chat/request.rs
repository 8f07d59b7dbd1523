//! The `/v1/chat/completions` request body and its translation into a prompt and parameters.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::http::openai::fields::{
    impl_sampling_fields, reasoning_effort, StopSpec, StreamOptions,
};
use crate::limits::RequestLimits;
use crate::scheduler::LogprobOptions;
use crate::tools::{self, HistoryCalls, ToolFormat, ToolPlan};
use crate::validation::request_rules::SentPart;
use crate::validation::{
    check_choices, check_count, reject_unsupported, template_kwargs, ChatEnding, ChatMessage,
    GenerationParams, Prompt, SamplingDefaults, TemplateExtras, ValidationError,
};
use crate::validation::{request_rules, response_format, AdapterChoice};

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
    pub(super) stream: Option<bool>,
    pub(super) stream_options: Option<StreamOptions>,
    #[schema(minimum = 1, maximum = 16)]
    n: Option<i64>,
    pub(super) logprobs: Option<bool>,
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
    /// Tandem extension: at most this many draft tokens per decode step for this request, from 0
    /// (no speculative decoding) to the server's `--speculate` (the default).
    #[schema(minimum = 0)]
    speculate: Option<i64>,
    /// vLLM's extension: lower runs earlier; only 0 unless the server runs
    /// `--scheduling-policy priority`.
    priority: Option<i64>,
    /// Names the prompt's shared prefix; alone it asks for `in_memory` retention.
    #[schema(max_length = 1024)]
    prompt_cache_key: Option<String>,
    /// `in_memory` (10 minutes) or `24h`: the cached prompt stays ahead of LRU eviction for
    /// that long after the request, as a bias, never a lock.
    #[schema(pattern = "^(in_memory|24h)$")]
    prompt_cache_retention: Option<String>,
    /// `{"ttl": "30m" | "12h"}`: the cached prompt's minimum lifetime ahead of LRU eviction
    /// (`mode` `implicit` only).
    #[schema(value_type = Option<Object>)]
    prompt_cache_options: Option<Map<String, Value>>,
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
    /// A reasoning model's effort: `none` switches reasoning off, `minimal`, `low` and
    /// `medium` bound it to 256, 1024 and 4096 tokens, `high` leaves it unbounded. Other
    /// models ignore it.
    reasoning_effort: Option<String>,
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

/// A message's text, or a list of text and image parts; the text parts join by newlines.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "expected a string or an array of `{\"type\": \"text\", \"text\": ...}` and `{\"type\": \"image_url\", \"image_url\": {\"url\": ...}}` parts"
)]
enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part: `text`, or `image_url` with a base64 `data:` URL.
#[derive(Debug, Deserialize, ToSchema)]
struct ContentPart {
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    kind: String,
    text: Option<String>,
    image_url: Option<ImageUrl>,
}

/// An image's URL, as OpenAI sends it (`{"url": ...}`, with a `detail` Tandem does not use) or
/// as a bare string.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
enum ImageUrl {
    Object {
        url: String,
        #[allow(dead_code)]
        detail: Option<String>,
    },
    Bare(String),
}

impl ContentPart {
    fn sent(self) -> SentPart {
        SentPart {
            kind: self.kind,
            text: self.text,
            image_url: self.image_url.map(|url| match url {
                ImageUrl::Object { url, .. } | ImageUrl::Bare(url) => url,
            }),
        }
    }
}

/// What a chat request asks the generation for.
pub struct ChatPlan {
    pub prompt: Prompt,
    pub params: GenerationParams,
    /// Choices to generate.
    pub n: usize,
    pub tool_plan: Option<ToolPlan>,
}

impl RequestMessage {
    /// Flattens text parts (joined by newlines), keeping the part list of a message with images
    /// (at most `max_image_bytes` each). Assistant calls are shown to the model in the format it
    /// is asked to call in.
    fn into_chat_message(
        mut self,
        index: usize,
        format: ToolFormat,
        max_image_bytes: usize,
    ) -> Result<ChatMessage, ValidationError> {
        let calls = self
            .extra
            .remove("tool_calls")
            .filter(|calls| !calls.is_null());
        let reasoning = match self.extra.remove("reasoning_content") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) if self.role == "assistant" => Some(text),
            Some(other) => {
                return Err(ValidationError::OutOfRange {
                    param: format!("messages[{index}].reasoning_content"),
                    expected: "a string, on an assistant message",
                    value: other.to_string(),
                })
            }
        };
        reject_unsupported(&self.extra, &[])
            .map_err(|error| request_rules::in_message(index, error))?;
        let (content, parts) = match self.content {
            None => (String::new(), None),
            Some(MessageContent::Text(text)) => (text, None),
            Some(MessageContent::Parts(parts)) => request_rules::message_content(
                &format!("messages[{index}].content"),
                parts.into_iter().map(ContentPart::sent),
                max_image_bytes,
            )?,
        };
        let param = format!("messages[{index}].tool_calls");
        let history = calls
            .map(|calls| tools::history(format.family, calls, &param))
            .transpose()?;
        let (content, tool_calls) = match history {
            Some(HistoryCalls::Text(text)) if content.is_empty() => (text, None),
            Some(HistoryCalls::Native(calls)) => (content, Some(calls)),
            _ => (content, None),
        };
        Ok(ChatMessage {
            role: self.role,
            content,
            name: self.name,
            tool_call_id: self.tool_call_id,
            tool_calls,
            reasoning_content: reasoning.clone(),
            thinking: reasoning,
            parts,
        })
    }
}

impl_sampling_fields!(ChatRequest);

impl ChatRequest {
    /// The tool plan from `tools`, `tool_choice` and `parallel_tool_calls`, within `max_tools`.
    fn tool_plan(
        &mut self,
        max_tools: usize,
        format: ToolFormat,
    ) -> Result<Option<ToolPlan>, ValidationError> {
        let tools = self.extra.remove("tools");
        if let Some(Value::Array(entries)) = &tools {
            request_rules::check_list_len("tools", entries.len(), max_tools)?;
        }
        let plan = tools::plan(
            tools,
            self.extra.remove("tool_choice"),
            self.extra.remove("parallel_tool_calls"),
        )?;
        Ok(plan.map(|plan| plan.with_format(format)))
    }

    /// The conversation as chat messages; `messages` is required.
    fn chat_messages(
        &mut self,
        format: ToolFormat,
        max_image_bytes: usize,
    ) -> Result<Vec<ChatMessage>, ValidationError> {
        request_rules::required("messages", self.messages.take())?
            .into_iter()
            .enumerate()
            .map(|(index, message)| message.into_chat_message(index, format, max_image_bytes))
            .collect()
    }

    /// The prompt, the parameters, the number of choices and the tool plan, with tool calls
    /// in `format`.
    pub fn into_plan(
        mut self,
        limits: &RequestLimits,
        defaults: &SamplingDefaults,
        format: ToolFormat,
    ) -> Result<ChatPlan, ValidationError> {
        let response_format = self.extra.remove("response_format");
        let tool_plan = self.tool_plan(limits.max_tools, format)?;
        let kwargs = template_kwargs(self.extra.remove("chat_template_kwargs"))?;
        reject_unsupported(&self.extra, &[])?;
        let n = check_choices("n", self.n, limits.max_choices)?;
        let mut messages = self.chat_messages(format, limits.images.max_image_bytes)?;
        let ending = ChatEnding::from_flags(
            self.add_generation_prompt,
            self.continue_final_message,
            &messages,
        )?;
        let (max_new_tokens, max_new_tokens_param) = match self.max_completion_tokens {
            Some(n) => (Some(n), "max_completion_tokens"),
            None => (self.max_tokens, "max_tokens"),
        };
        let top_logprobs = check_count("top_logprobs", self.top_logprobs, MAX_TOP_LOGPROBS)?;
        request_rules::check_logprobs_flag(top_logprobs, self.logprobs)?;
        let logprobs = LogprobOptions {
            top_logprobs,
            prompt_logprobs: false,
        };
        let mut params = self
            .sampling_fields()
            .or_defaults(defaults)
            .into_params((max_new_tokens, max_new_tokens_param), logprobs);
        params.grammar = response_format::grammar(response_format)?;
        params.adapter = self.model.take().map(AdapterChoice::Model);
        params.reasoning = reasoning_effort(self.reasoning_effort.as_deref(), "reasoning_effort")?;
        if let Some(plan) = tool_plan.as_ref().filter(|plan| plan.may_call()) {
            apply_tool_plan(plan, &mut params, &mut messages)?;
        }
        let extras = TemplateExtras {
            tools: tool_plan.as_ref().and_then(ToolPlan::template_tools),
            kwargs,
        };
        Ok(ChatPlan {
            prompt: Prompt::Chat(messages, ending, extras),
            params,
            n,
            tool_plan,
        })
    }
}

/// Constrains the generation to the plan's calls and describes the tools in the system message.
fn apply_tool_plan(
    plan: &ToolPlan,
    params: &mut GenerationParams,
    messages: &mut Vec<ChatMessage>,
) -> Result<(), ValidationError> {
    request_rules::check_grammar_free_for_tools(params)?;
    params.grammar = plan.grammar();
    if let Some(preamble) = plan.preamble() {
        match messages.first_mut().filter(|first| first.role == "system") {
            Some(system) => system.content = format!("{}\n\n{}", system.content, preamble.content),
            None => messages.insert(0, preamble),
        }
    }
    Ok(())
}
