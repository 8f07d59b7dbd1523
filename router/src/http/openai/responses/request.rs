//! The request body of `POST /v1/responses`, as OpenAI's Responses API defines it. Fields
//! outside what Tandem serves land in `extra` and are refused by name; input items and their
//! content parts are parsed one by one, so a refused one is named by its position.

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::validation::request_rules::SentPart;

/// `POST /v1/responses` body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    /// Accepted and ignored: the served model answers.
    #[allow(dead_code)]
    pub model: Option<String>,
    /// Text (one user message) or a list of input items; required.
    #[schema(value_type = ResponseInput, required = true)]
    pub input: Option<Value>,
    /// A system message put first; not carried over to responses that continue this one.
    pub instructions: Option<String>,
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<i64>,
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: Option<f64>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Tandem's extension, as on the chat route.
    #[schema(minimum = 0)]
    pub top_k: Option<i64>,
    /// Tandem's extension, as on the chat route: the same seed samples the same output.
    pub seed: Option<u64>,
    pub stream: Option<bool>,
    /// Keep the response for `previous_response_id`, `GET` and `DELETE` (default `true`).
    pub store: Option<bool>,
    /// Continue the conversation a stored response ends.
    pub previous_response_id: Option<String>,
    pub text: Option<TextConfig>,
    /// A reasoning model's reasoning: `effort` maps as on the chat route's `reasoning_effort`.
    pub reasoning: Option<ReasoningConfig>,
    /// Function tools; built-in tools are refused.
    #[schema(value_type = Option<Vec<FunctionToolSpec>>)]
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "name": ...}`.
    #[schema(value_type = Option<Value>)]
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Echoed in the response.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    /// Accepted and ignored: an opaque end-user id.
    pub user: Option<String>,
    /// Names the prompt's shared prefix; alone it asks for `in_memory` retention.
    #[schema(max_length = 1024)]
    pub prompt_cache_key: Option<String>,
    /// `in_memory` (10 minutes) or `24h`: the cached prompt stays ahead of LRU eviction for
    /// that long after the request, as a bias, never a lock.
    #[schema(pattern = "^(in_memory|24h)$")]
    pub prompt_cache_retention: Option<String>,
    /// `{"ttl": "30m" | "12h"}`: the cached prompt's minimum lifetime ahead of LRU eviction
    /// (`mode` `implicit` only).
    #[schema(value_type = Option<Object>)]
    pub prompt_cache_options: Option<Map<String, Value>>,
    /// Only `disabled`: a prompt over the limits is refused, never cut.
    #[schema(pattern = "^disabled$")]
    pub truncation: Option<String>,
    /// Accepted and ignored (`include_obfuscation`: events carry no padding).
    #[allow(dead_code)]
    #[schema(value_type = Option<Object>)]
    pub stream_options: Option<Map<String, Value>>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Map<String, Value>,
}

/// `input`: text, or a list of items.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // documents `ResponsesRequest::input`, which is parsed item by item
pub enum ResponseInput {
    Text(String),
    Items(Vec<InputItem>),
}

/// One input item; a message's `type` may be left out.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItem {
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    Reasoning(ReasoningItem),
}

/// A prior turn's reasoning, as a `reasoning` output item carries it: the template sees its
/// text as the next assistant turn's reasoning.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningItem {
    /// `reasoning_text` parts.
    #[serde(default)]
    pub content: Vec<ReasoningText>,
    /// Accepted and ignored: summaries are not the reasoning the model wrote.
    #[allow(dead_code)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub summary: Option<Value>,
    #[allow(dead_code)]
    pub id: Option<String>,
    #[allow(dead_code)]
    pub status: Option<String>,
}

/// One `{"type": "reasoning_text", "text"}` part.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningText {
    /// `reasoning_text`.
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    #[allow(dead_code)]
    pub kind: String,
    pub text: String,
}

/// A message of the conversation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageItem {
    /// `user`, `assistant`, `system` or `developer` (a system message).
    #[schema(pattern = "^(user|assistant|system|developer)$")]
    pub role: String,
    /// Text, or `input_text` / `output_text` parts; parsed part by part.
    #[schema(value_type = MessageContent)]
    pub content: Value,
    /// Accepted and ignored: sent back with output messages.
    #[allow(dead_code)]
    pub id: Option<String>,
    #[allow(dead_code)]
    pub status: Option<String>,
    #[allow(dead_code)]
    pub phase: Option<String>,
}

/// A message's text, or its parts.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // documents `MessageItem::content`, which is parsed part by part
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A text or image part of a message; files and audio are not served.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContentPart {
    InputText {
        text: String,
    },
    /// An image by a base64 `data:` URL; by `file_id` it is refused (Tandem keeps no files).
    InputImage {
        image_url: Option<String>,
        file_id: Option<String>,
        /// Accepted and ignored.
        #[allow(dead_code)]
        detail: Option<String>,
    },
    OutputText {
        text: String,
        /// Accepted and ignored: sent back with output messages.
        #[allow(dead_code)]
        #[schema(value_type = Option<Vec<Object>>)]
        annotations: Option<Vec<Value>>,
        #[allow(dead_code)]
        #[schema(value_type = Option<Vec<Object>>)]
        logprobs: Option<Vec<Value>>,
    },
}

impl ContentPart {
    pub fn is_image(&self) -> bool {
        matches!(self, Self::InputImage { .. })
    }

    /// The part as the chat route reads parts: an image by file is a part of type `input_file`.
    pub fn sent(self) -> SentPart {
        let (kind, text, image_url) = match self {
            Self::InputText { text } | Self::OutputText { text, .. } => ("text", Some(text), None),
            Self::InputImage {
                image_url: Some(url),
                file_id: None,
                ..
            } => ("image_url", None, Some(url)),
            Self::InputImage { .. } => ("input_image without a data: `image_url`", None, None),
        };
        SentPart {
            kind: kind.to_owned(),
            text,
            image_url,
        }
    }
}

/// An earlier call of a function by the model.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallItem {
    pub call_id: String,
    pub name: String,
    /// The arguments object as JSON text.
    pub arguments: String,
    #[allow(dead_code)]
    pub id: Option<String>,
    #[allow(dead_code)]
    pub status: Option<String>,
}

/// The result of a function call, answering the call with the same `call_id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallOutputItem {
    pub call_id: String,
    /// Text, or `input_text` parts.
    #[schema(value_type = MessageContent)]
    pub output: Value,
    #[allow(dead_code)]
    pub id: Option<String>,
    #[allow(dead_code)]
    pub status: Option<String>,
}

/// `text`: the output's format.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
    /// Only `medium` or absent: the output's length follows the model.
    #[schema(pattern = "^medium$")]
    pub verbosity: Option<String>,
}

/// Plain text, any JSON object, or JSON following a schema (grammar-constrained).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        #[schema(value_type = Object)]
        schema: Value,
        description: Option<String>,
        /// Output always follows the schema, so `strict` changes nothing.
        strict: Option<bool>,
    },
}

/// A function the model may call.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionToolSpec {
    /// `function`; built-in tools (`web_search`, `file_search`, ...) are refused before
    /// the tool is parsed.
    #[allow(dead_code)]
    #[serde(rename = "type")]
    #[schema(pattern = "^function$")]
    pub kind: String,
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema for the arguments object.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// Calls always follow the schema, so `strict` changes nothing.
    pub strict: Option<bool>,
}

/// `reasoning`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningConfig {
    /// `none`, `minimal`, `low`, `medium` or `high`.
    pub effort: Option<String>,
    /// Accepted and ignored: reasoning items carry the whole reasoning, never a summary.
    #[allow(dead_code)]
    #[schema(value_type = Option<String>)]
    pub summary: Option<Value>,
    /// Accepted and ignored, as `summary`.
    #[allow(dead_code)]
    #[schema(value_type = Option<String>)]
    pub generate_summary: Option<Value>,
}
