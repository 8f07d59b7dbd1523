//! A messages request turned into what every route generates from: the conversation as chat
//! messages (tool calls and results written as the chat route writes them), the sampling
//! parameters, and the tool plan of the shared grammar-constrained tool path.

use serde_json::{json, Map, Value};

use super::request::{
    ContentBlock, CountTokensRequest, InputMessage, MessagesRequest, SystemPrompt, ThinkingConfig,
    ToolChoiceSpec, ToolDefinition, ToolResultContent, TypedTextBlock,
};
use super::turn_content::{block_image, TurnContent};
use crate::http::openai::{SamplingFields, StopSpec};
use crate::http::state::HandlerConfig;
use crate::limits::RequestLimits;
use crate::reasoning::ReasoningRequest;
use crate::scheduler::LogprobOptions;
use crate::tools::{self, HistoryCalls, ToolFormat, ToolPlan};
use crate::validation::cache_hints::CacheHint;
use crate::validation::{
    reject_unsupported, ChatEnding, ChatMessage, GenerationParams, Prompt, TemplateExtras,
    ValidationError,
};
use crate::validation::{request_rules, serde_wording, AdapterChoice};

/// The conversation part shared by both routes' bodies.
#[derive(Debug)]
pub struct Conversation {
    pub messages: Option<Vec<InputMessage>>,
    pub system: Option<SystemPrompt>,
    pub tools: Option<Vec<ToolDefinition>>,
    pub tool_choice: Option<ToolChoiceSpec>,
}

/// What a messages request generates from.
#[derive(Debug)]
pub struct Generation {
    pub prompt: Prompt,
    pub params: GenerationParams,
    /// Present when the model may call tools.
    pub tools: Option<ToolPlan>,
    pub stream: bool,
}

/// Validates a `/v1/messages` body into a generation.
pub fn generation(
    mut request: MessagesRequest,
    config: &HandlerConfig,
) -> Result<Generation, ValidationError> {
    reject_unsupported(&request.extra, &[])?;
    let max_tokens = request_rules::required("max_tokens", request.max_tokens)?;
    // Anthropic's range, narrower than the sampler's.
    if let Some(temperature) = request.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return request_rules::refuse_value(
            "temperature",
            "between 0 and 1",
            temperature.to_string(),
        );
    }
    let cache_retention = super::cache_hints::cache_retention(&request)?;
    let conversation = Conversation {
        messages: request.messages.take(),
        system: request.system.take(),
        tools: request.tools.take(),
        tool_choice: request.tool_choice.take(),
    };
    let (prompt, plan) = prompt(conversation, &config.request_limits, config.tool_format)?;
    let sampling = SamplingFields {
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        stop: request.stop_sequences.take().map(StopSpec::Many),
        cache_hint: cache_retention.map_or(CacheHint::None, CacheHint::Retention),
        ..SamplingFields::default()
    };
    let no_logprobs = LogprobOptions {
        top_logprobs: 0,
        prompt_logprobs: false,
    };
    let mut params = sampling
        .or_defaults(&config.default_sampling)
        .into_params((Some(max_tokens), "max_tokens"), no_logprobs);
    let plan = plan.filter(ToolPlan::may_call);
    params.grammar = plan.as_ref().and_then(ToolPlan::grammar);
    params.adapter = request.model.take().map(AdapterChoice::ModelIfAdapter);
    params.reasoning = reasoning_request(request.thinking)?;
    Ok(Generation {
        prompt,
        params,
        tools: plan,
        stream: request.stream == Some(true),
    })
}

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u32 = 1024;

/// The reasoning `thinking` asks for: on with its budget (at least 1,024 tokens, as Anthropic
/// requires), or off.
fn reasoning_request(
    thinking: Option<ThinkingConfig>,
) -> Result<ReasoningRequest, ValidationError> {
    let (enabled, budget_tokens) = match thinking {
        None => return Ok(ReasoningRequest::default()),
        Some(ThinkingConfig::Disabled) => (false, None),
        Some(ThinkingConfig::Enabled { budget_tokens }) => {
            let budget = u32::try_from(budget_tokens)
                .ok()
                .filter(|&budget| budget >= MIN_THINKING_BUDGET);
            match budget {
                Some(budget) => (true, Some(budget)),
                None => {
                    return request_rules::refuse_value(
                        "thinking.budget_tokens",
                        "an integer of at least 1024",
                        budget_tokens.to_string(),
                    )
                }
            }
        }
    };
    Ok(ReasoningRequest {
        enabled: Some(enabled),
        budget_tokens,
        effort: None,
        param: "thinking",
    })
}

/// Validates a `/v1/messages/count_tokens` body into the prompt a generation would see.
pub fn counted_prompt(
    request: CountTokensRequest,
    config: &HandlerConfig,
) -> Result<Prompt, ValidationError> {
    reject_unsupported(&request.extra, &[])?;
    let conversation = Conversation {
        messages: request.messages,
        system: request.system,
        tools: request.tools,
        tool_choice: request.tool_choice,
    };
    Ok(prompt(conversation, &config.request_limits, config.tool_format)?.0)
}

/// The chat prompt (the tool preamble joined to the system prompt, or the tools in the
/// template's `tools`) and the tool plan, with calls in `format`. A conversation ending with
/// an assistant turn is continued (a prefilled answer).
pub fn prompt(
    conversation: Conversation,
    limits: &RequestLimits,
    format: ToolFormat,
) -> Result<(Prompt, Option<ToolPlan>), ValidationError> {
    let plan = tool_plan(
        conversation.tools,
        conversation.tool_choice,
        limits.max_tools,
    )?
    .map(|plan| plan.with_format(format));
    let turns = request_rules::required("messages", conversation.messages)?;
    let mut messages = Vec::with_capacity(turns.len() + 1);
    let system = match conversation.system {
        None => None,
        Some(SystemPrompt::Text(text)) => Some(text),
        Some(SystemPrompt::Blocks(blocks)) => Some(join_texts(blocks)),
    };
    let preamble = plan.as_ref().and_then(ToolPlan::preamble);
    match (system, preamble) {
        (Some(system), Some(preamble)) => messages.push(ChatMessage::new(
            "system",
            format!("{system}\n\n{}", preamble.content),
        )),
        (Some(system), None) => messages.push(ChatMessage::new("system", system)),
        (None, Some(preamble)) => messages.push(preamble),
        (None, None) => {}
    }
    let max_image_bytes = limits.images.max_image_bytes;
    for (index, turn) in turns.into_iter().enumerate() {
        turn_messages(turn, (index, max_image_bytes), format, &mut messages)?;
    }
    let ending = match messages.last() {
        Some(last) if last.role == "assistant" => ChatEnding::ContinueFinal,
        _ => ChatEnding::GenerationPrompt,
    };
    let extras = TemplateExtras {
        tools: plan.as_ref().and_then(ToolPlan::template_tools),
        ..TemplateExtras::default()
    };
    Ok((Prompt::Chat(messages, ending, extras), plan))
}

fn join_texts(blocks: Vec<TypedTextBlock>) -> String {
    let texts: Vec<String> = blocks.into_iter().map(TypedTextBlock::text).collect();
    texts.join("\n")
}

/// A turn is the user's or the assistant's.
fn check_role(role: &str, index: usize) -> Result<(), ValidationError> {
    if role == "user" || role == "assistant" {
        return Ok(());
    }
    let param = format!("messages[{index}].role");
    request_rules::refuse_value(&param, "\"user\" or \"assistant\"", format!("{role:?}"))
}

/// Appends one turn (the `index`th, whose images take at most `max_image_bytes` each): a user
/// turn's tool results become `tool` messages, in order; an assistant turn's tool calls are
/// written in the call format the model is shown.
fn turn_messages(
    turn: InputMessage,
    (index, max_image_bytes): (usize, usize),
    format: ToolFormat,
    messages: &mut Vec<ChatMessage>,
) -> Result<(), ValidationError> {
    let role = turn.role.as_str();
    check_role(role, index)?;
    let blocks = match turn.content {
        Value::String(text) => {
            messages.push(ChatMessage::new(role, text));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        other => {
            let param = format!("messages[{index}].content");
            let expected = "a string or an array of content blocks";
            return request_rules::refuse_value(&param, expected, other.to_string());
        }
    };
    let first = messages.len();
    let mut content = TurnContent::default();
    let mut calls = Vec::new();
    for (position, block) in blocks.into_iter().enumerate() {
        let param = || format!("messages[{index}].content[{position}]");
        let expected =
            "a `text`, `image`, `tool_use`, `tool_result`, `thinking` or `redacted_thinking` block";
        let block: ContentBlock = serde_json::from_value(block).map_err(|error| {
            request_rules::out_of_range(&param(), expected, serde_wording::error_text(&error))
        })?;
        match (block, role) {
            (ContentBlock::Text(block), _) => content.push_text(block.text),
            (ContentBlock::Image(block), "user") => {
                content.push_image(block_image(block, param(), max_image_bytes)?);
            }
            (ContentBlock::ToolUse(call), "assistant") => calls.push(json!({
                "type": "function",
                "function": {"name": call.name, "arguments": Value::Object(call.input).to_string()},
            })),
            (ContentBlock::ToolResult(result), "user") => {
                if !content.is_empty() {
                    messages.push(content.take_message(role));
                }
                messages.push(tool_message(
                    result.tool_use_id,
                    result.content,
                    result.is_error,
                ));
            }
            (ContentBlock::Thinking(_) | ContentBlock::RedactedThinking(_), "assistant") => {}
            (
                ContentBlock::ToolUse(_)
                | ContentBlock::ToolResult(_)
                | ContentBlock::Image(_)
                | ContentBlock::Thinking(_)
                | ContentBlock::RedactedThinking(_),
                _,
            ) => {
                let expected = "`tool_use` and thinking blocks only in assistant turns and \
                     `tool_result` and `image` only in user turns";
                return request_rules::refuse_value(
                    &param(),
                    expected,
                    format!("a block in a {role} turn"),
                );
            }
        }
    }
    let mut tool_calls = None;
    if !calls.is_empty() {
        let param = format!("messages[{index}].content");
        match tools::history(format.family, Value::Array(calls), &param)? {
            HistoryCalls::Text(text) => content.push_text(text),
            HistoryCalls::Native(calls) => tool_calls = Some(calls),
        }
    }
    if !content.is_empty() || tool_calls.is_some() || messages.len() == first {
        messages.push(ChatMessage {
            tool_calls,
            ..content.take_message(role)
        });
    }
    Ok(())
}

fn tool_message(
    tool_use_id: String,
    content: Option<ToolResultContent>,
    is_error: Option<bool>,
) -> ChatMessage {
    let text = match content {
        None => String::new(),
        Some(ToolResultContent::Text(text)) => text,
        Some(ToolResultContent::Blocks(blocks)) => join_texts(blocks),
    };
    let text = if is_error == Some(true) {
        format!("Error: {text}")
    } else {
        text
    };
    ChatMessage {
        tool_call_id: Some(tool_use_id),
        ..ChatMessage::new("tool", text)
    }
}

/// Anthropic's tools and tool choice through the chat route's validation and grammar.
fn tool_plan(
    definitions: Option<Vec<ToolDefinition>>,
    choice: Option<ToolChoiceSpec>,
    max_tools: usize,
) -> Result<Option<ToolPlan>, ValidationError> {
    let definitions = definitions.unwrap_or_default();
    request_rules::check_list_len("tools", definitions.len(), max_tools)?;
    let mut functions = Vec::with_capacity(definitions.len());
    for (index, tool) in definitions.into_iter().enumerate() {
        if let Some(kind) = tool.kind.as_deref().filter(|&kind| kind != "custom") {
            let detail = format!(": server tools such as `{kind}`");
            request_rules::refuse_feature(true, &format!("tools[{index}].type"), &detail)?;
        }
        let mut function = Map::new();
        function.insert("name".into(), json!(tool.name));
        if let Some(description) = tool.description {
            function.insert("description".into(), json!(description));
        }
        function.insert("parameters".into(), Value::Object(tool.input_schema));
        functions.push(json!({"type": "function", "function": function}));
    }
    let (choice, parallel) = match choice {
        None => (None, None),
        Some(ToolChoiceSpec::None) => (Some(json!("none")), None),
        Some(ToolChoiceSpec::Auto {
            disable_parallel_tool_use,
        }) => (Some(json!("auto")), disable_parallel_tool_use),
        Some(ToolChoiceSpec::Any {
            disable_parallel_tool_use,
        }) => (Some(json!("required")), disable_parallel_tool_use),
        Some(ToolChoiceSpec::Tool {
            name,
            disable_parallel_tool_use,
        }) => (
            Some(json!({"type": "function", "function": {"name": name}})),
            disable_parallel_tool_use,
        ),
    };
    let parallel = parallel.map(|disabled| Value::Bool(!disabled));
    tools::plan(Some(Value::Array(functions)), choice, parallel).map_err(anthropic_names)
}

/// Names a tool error's parameter as the Anthropic body spells it.
fn anthropic_names(error: ValidationError) -> ValidationError {
    request_rules::rename_out_of_range(error, |param| {
        param
            .replace(".function.parameters", ".input_schema")
            .replace(".function.name", ".name")
            .replace(
                "parallel_tool_calls",
                "tool_choice.disable_parallel_tool_use",
            )
    })
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
