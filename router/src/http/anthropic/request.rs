//! The request bodies of `/v1/messages` and `/v1/messages/count_tokens`, as Anthropic's
//! Messages API defines them. Fields outside what Tandem serves land in `extra` and are
//! refused by name; unknown content block types are refused by the parser.

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// `POST /v1/messages` body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct MessagesRequest {
    /// A LoRA adapter's name selects it (`/v1/models` lists them); any other name, the served model.
    pub model: Option<String>,
    /// The conversation; required and non-empty.
    pub messages: Option<Vec<InputMessage>>,
    pub system: Option<SystemPrompt>,
    /// Required, as in Anthropic's API.
    #[schema(minimum = 1)]
    pub max_tokens: Option<i64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub temperature: Option<f64>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    #[schema(minimum = 0)]
    pub top_k: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    /// Accepted and ignored (`user_id`).
    #[allow(dead_code)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    pub tools: Option<Vec<ToolDefinition>>,
    pub tool_choice: Option<ToolChoiceSpec>,
    /// A reasoning model's thinking: `enabled` with a `budget_tokens` bound, or `disabled`.
    /// Other models ignore it.
    pub thinking: Option<ThinkingConfig>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Map<String, Value>,
}

/// The `thinking` setting.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ThinkingConfig {
    /// Thinking on, at most `budget_tokens` tokens (at least 1,024).
    Enabled {
        budget_tokens: i64,
    },
    Disabled,
}

/// `POST /v1/messages/count_tokens` body: the conversation part of a messages request.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CountTokensRequest {
    /// Accepted and ignored: the served model's tokenizer counts.
    #[allow(dead_code)]
    pub model: Option<String>,
    /// Accepted as `/v1/messages` takes it; the count is the prompt's either way.
    #[allow(dead_code)]
    pub thinking: Option<ThinkingConfig>,
    pub messages: Option<Vec<InputMessage>>,
    pub system: Option<SystemPrompt>,
    pub tools: Option<Vec<ToolDefinition>>,
    pub tool_choice: Option<ToolChoiceSpec>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Map<String, Value>,
}

/// One turn of the conversation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// Parsed block by block, so a refused block is named by its position.
    #[schema(value_type = MessageContent)]
    pub content: Value,
}

/// A turn's text, or its content blocks.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // documents `InputMessage::content`, which is parsed block by block
pub enum MessageContent {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

/// A content block of a turn; document blocks are not served.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text(TextBlock),
    Image(ImageBlock),
    ToolUse(ToolUseBlock),
    ToolResult(ToolResultBlock),
    /// An earlier answer's thinking, passed back: dropped, as chat templates drop past reasoning.
    #[allow(dead_code)] // read to check its shape, then dropped
    Thinking(PastThinking),
    #[allow(dead_code)] // read to check its shape, then dropped
    RedactedThinking(PastRedactedThinking),
}

/// A `thinking` block of an earlier assistant turn.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read to check its shape, then dropped
pub struct PastThinking {
    pub thinking: String,
    pub signature: Option<String>,
}

/// A `redacted_thinking` block of an earlier assistant turn.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read to check its shape, then dropped
pub struct PastRedactedThinking {
    pub data: String,
}

/// `{"type": "image", "source": ...}` in a user turn.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageBlock {
    pub source: ImageSource,
    /// `{"type": "ephemeral", "ttl": "5m" | "1h"}`: the prompt's cached prefix stays ahead of
    /// LRU eviction for the longest TTL in the request (`cache_hints`).
    /// Read from the turn's raw blocks, before they are parsed into this type.
    #[allow(dead_code)]
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<Map<String, Value>>,
}

/// Where an image block's file is: inline base64 (served), or a URL (refused).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 {
        /// Accepted and not trusted: the file's own header decides its format.
        #[allow(dead_code)]
        media_type: Option<String>,
        data: String,
    },
    Url {
        url: String,
    },
}

/// `{"type": "text", "text": ...}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextBlock {
    pub text: String,
    /// Accepted and ignored: answers carry no citations, but clients send them back as `null`.
    #[allow(dead_code)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub citations: Option<Vec<Value>>,
    /// `{"type": "ephemeral", "ttl": "5m" | "1h"}`: the prompt's cached prefix stays ahead of
    /// LRU eviction for the longest TTL in the request (`cache_hints`).
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<Map<String, Value>>,
}

/// An assistant's earlier call of a tool.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolUseBlock {
    #[allow(dead_code)]
    pub id: String,
    pub name: String,
    #[schema(value_type = Object)]
    pub input: Map<String, Value>,
    /// Accepted and ignored: the SDKs send a returned block's `caller` back with it.
    #[allow(dead_code)]
    #[schema(value_type = Option<Object>)]
    pub caller: Option<Map<String, Value>>,
    /// `{"type": "ephemeral", "ttl": "5m" | "1h"}`: the prompt's cached prefix stays ahead of
    /// LRU eviction for the longest TTL in the request (`cache_hints`).
    /// Read from the turn's raw blocks, before they are parsed into this type.
    #[allow(dead_code)]
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<Map<String, Value>>,
}

/// The user's answer to a tool call.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolResultBlock {
    pub tool_use_id: String,
    pub content: Option<ToolResultContent>,
    /// Shown to the model as a prefix of the result.
    pub is_error: Option<bool>,
    /// `{"type": "ephemeral", "ttl": "5m" | "1h"}`: the prompt's cached prefix stays ahead of
    /// LRU eviction for the longest TTL in the request (`cache_hints`).
    /// Read from the turn's raw blocks, before they are parsed into this type.
    #[allow(dead_code)]
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<Map<String, Value>>,
}

/// A tool result's text, or its text blocks.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "expected a string or an array of `{\"type\": \"text\", \"text\": ...}` blocks"
)]
pub enum ToolResultContent {
    Text(String),
    Blocks(Vec<TypedTextBlock>),
}

/// The system prompt: text, or text blocks.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "expected a string or an array of `{\"type\": \"text\", \"text\": ...}` blocks"
)]
pub enum SystemPrompt {
    Text(String),
    Blocks(Vec<TypedTextBlock>),
}

/// A block that may only be text: `{"type": "text", "text": ...}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TypedTextBlock {
    Text(TextBlock),
}

impl TypedTextBlock {
    pub fn text(self) -> String {
        match self {
            Self::Text(block) => block.text,
        }
    }
}

/// A client tool: its name, description and the JSON Schema of its input.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolDefinition {
    /// Absent or `custom`; Anthropic's server tools are not served.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub description: Option<String>,
    #[schema(value_type = Object)]
    pub input_schema: Map<String, Value>,
    /// `{"type": "ephemeral", "ttl": "5m" | "1h"}`: the prompt's cached prefix stays ahead of
    /// LRU eviction for the longest TTL in the request (`cache_hints`).
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<Map<String, Value>>,
}

/// What the model may or must do with the tools.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolChoiceSpec {
    /// The model decides whether to call tools.
    Auto {
        disable_parallel_tool_use: Option<bool>,
    },
    /// The model must call one or more tools.
    Any {
        disable_parallel_tool_use: Option<bool>,
    },
    /// The model must call this tool.
    Tool {
        name: String,
        disable_parallel_tool_use: Option<bool>,
    },
    /// The model may not call tools.
    None,
}
