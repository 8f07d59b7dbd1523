//! A responses request turned into what every route generates from: the conversation (the
//! stored one it continues, then its own input) as chat messages, the sampling parameters,
//! the grammar of `text.format`, and the tool plan of the chat route's tool path.

use serde_json::{json, Map, Value};

use super::input;
use super::output::Echo;
use super::request::{FunctionToolSpec, ResponsesRequest, TextFormat};
use super::store::ResponseStore;
use crate::error::AppError;
use crate::http::middleware::api_keys::KeyId;
use crate::http::openai::{reasoning_effort, SamplingFields};
use crate::http::state::HandlerConfig;
use crate::scheduler::LogprobOptions;
use crate::tools::{self, ToolPlan};
use crate::validation::cache_hints::CacheHint;
use crate::validation::{
    reject_unsupported, response_format, ChatEnding, ChatMessage, GenerationParams, Prompt,
    RequestedGrammar, TemplateExtras, ValidationError,
};
use crate::validation::{serde_wording, AdapterChoice};

/// What a responses request generates from.
#[derive(Debug)]
pub struct Generation {
    pub prompt: Prompt,
    pub params: GenerationParams,
    /// Present when the model may call tools.
    pub tools: Option<ToolPlan>,
    pub stream: bool,
    /// The stored conversation continued, then this request's input (no instructions).
    pub conversation: Vec<ChatMessage>,
    pub echo: Echo,
}

/// Why a refused field is not served, for the fields clients commonly send.
fn refusal_detail(param: &str) -> &'static str {
    match param {
        "background" => ": responses run while the request is open",
        "conversation" => ": continue a conversation with `previous_response_id`",
        "include" => ": responses carry no extra output data",
        "prompt" => ": no prompt templates are stored",
        "top_logprobs" => " on /v1/responses (use /v1/chat/completions)",
        _ => "",
    }
}

/// Fields Tandem does not serve are refused by name.
fn refuse_unsupported(request: &ResponsesRequest) -> Result<(), ValidationError> {
    reject_unsupported(&request.extra, &[]).map_err(|error| match error {
        ValidationError::Unsupported { param, .. } => ValidationError::Unsupported {
            detail: refusal_detail(&param).to_owned(),
            param,
        },
        other => other,
    })?;
    if let Some(truncation) = request.truncation.as_deref().filter(|t| *t != "disabled") {
        return Err(ValidationError::Unsupported {
            param: "truncation".to_owned(),
            detail: format!(
                ": `{truncation}` (a prompt over `max_input_tokens` is refused, never cut)"
            ),
        });
    }
    let verbosity = request
        .text
        .as_ref()
        .and_then(|text| text.verbosity.as_deref());
    if let Some(verbosity) = verbosity.filter(|v| *v != "medium") {
        return Err(ValidationError::Unsupported {
            param: "text.verbosity".to_owned(),
            detail: format!(": `{verbosity}` (the output's length follows the model)"),
        });
    }
    Ok(())
}

/// Validates a `/v1/responses` body into a generation; a `previous_response_id` that is
/// unknown, or not `owner`'s to continue, is not found.
pub fn generation(
    mut request: ResponsesRequest,
    config: &HandlerConfig,
    store: &ResponseStore,
    owner: Option<KeyId>,
) -> Result<Generation, AppError> {
    refuse_unsupported(&request)?;
    let (plan, tools_echo, choice_echo) = tool_plan(&mut request, config.request_limits.max_tools)?;
    let plan = plan.map(|plan| plan.with_format(config.tool_format));
    let format = request.text.take().and_then(|text| text.format);
    let text_echo = json!({"format": format_echo(format.as_ref())});
    let mut params = sampling(&request, config);
    params.grammar = format.map(grammar).transpose()?.flatten();
    let effort = request
        .reasoning
        .take()
        .and_then(|reasoning| reasoning.effort);
    params.reasoning = reasoning_effort(effort.as_deref(), "reasoning.effort")?;
    let plan = plan.filter(ToolPlan::may_call);
    if let Some(plan) = &plan {
        if params.grammar.is_some() {
            return Err(ValidationError::Unsupported {
                param: "text.format".to_owned(),
                detail: " together with `tools` the model may call".to_owned(),
            }
            .into());
        }
        params.grammar = plan.grammar();
    }
    let mut conversation = match &request.previous_response_id {
        None => Vec::new(),
        Some(id) => match store.get(id, owner) {
            Some(stored) => stored.conversation.clone(),
            None => {
                return Err(AppError::NotFound {
                    what: "Previous response",
                    id: id.clone(),
                    param: Some("previous_response_id"),
                })
            }
        },
    };
    let input = request
        .input
        .take()
        .ok_or(ValidationError::Missing("input"))?;
    conversation.extend(input::messages(
        input,
        config.tool_format.family,
        config.request_limits.images.max_image_bytes,
    )?);
    let prompt = prompt(
        request.instructions.as_deref(),
        plan.as_ref(),
        &conversation,
    );
    let echo = Echo {
        instructions: request.instructions.take(),
        max_output_tokens: request.max_output_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        tools: tools_echo,
        tool_choice: choice_echo,
        parallel_tool_calls: request.parallel_tool_calls != Some(false),
        text: text_echo,
        metadata: request.metadata.take().unwrap_or_default(),
        previous_response_id: request.previous_response_id.take(),
        store: request.store != Some(false),
        user: request.user.take(),
    };
    Ok(Generation {
        prompt,
        params,
        tools: plan,
        stream: request.stream == Some(true),
        conversation,
        echo,
    })
}

fn sampling(request: &ResponsesRequest, config: &HandlerConfig) -> GenerationParams {
    let sampling = SamplingFields {
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        seed: request.seed,
        cache_hint: CacheHint::OpenAi {
            key: request.prompt_cache_key.clone(),
            retention: request.prompt_cache_retention.clone(),
            options: request.prompt_cache_options.clone(),
        },
        ..SamplingFields::default()
    };
    let no_logprobs = LogprobOptions {
        top_logprobs: 0,
        prompt_logprobs: false,
    };
    let mut params = sampling.or_defaults(&config.default_sampling).into_params(
        (request.max_output_tokens, "max_output_tokens"),
        no_logprobs,
    );
    params.adapter = request.model.clone().map(AdapterChoice::ModelIfAdapter);
    params
}

/// The chat prompt: instructions and the tool preamble as one system message first, then the
/// conversation, then the assistant's generation prompt.
fn prompt(
    instructions: Option<&str>,
    plan: Option<&ToolPlan>,
    conversation: &[ChatMessage],
) -> Prompt {
    let preamble = plan
        .and_then(ToolPlan::preamble)
        .map(|message| message.content);
    let system: Vec<String> = instructions
        .map(str::to_owned)
        .into_iter()
        .chain(preamble)
        .collect();
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if !system.is_empty() {
        messages.push(ChatMessage::new("system", system.join("\n\n")));
    }
    messages.extend_from_slice(conversation);
    let extras = TemplateExtras {
        tools: plan.and_then(ToolPlan::template_tools),
        ..TemplateExtras::default()
    };
    Prompt::Chat(messages, ChatEnding::GenerationPrompt, extras)
}

/// `text.format` as the chat route's `response_format`, its errors named as this body names
/// them.
fn grammar(format: TextFormat) -> Result<Option<RequestedGrammar>, ValidationError> {
    let response_format = match format {
        TextFormat::Text => json!({"type": "text"}),
        TextFormat::JsonObject => json!({"type": "json_object"}),
        TextFormat::JsonSchema { name, schema, .. } => {
            json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
        }
    };
    let renamed = |param: &str| {
        param
            .replace("response_format.json_schema", "text.format")
            .replace("response_format", "text.format")
    };
    let mut grammar =
        response_format::grammar(Some(response_format)).map_err(|error| match error {
            ValidationError::OutOfRange {
                param,
                expected,
                value,
            } => ValidationError::OutOfRange {
                param: renamed(&param),
                expected,
                value,
            },
            ValidationError::InvalidGrammar { refusal, .. } => ValidationError::InvalidGrammar {
                param: "text.format.schema",
                refusal,
            },
            other => other,
        })?;
    if let Some(grammar) = grammar.as_mut() {
        grammar.param = if grammar.param == "response_format" {
            "text.format"
        } else {
            "text.format.schema"
        };
    }
    Ok(grammar)
}

/// `text.format` as the response repeats it.
fn format_echo(format: Option<&TextFormat>) -> Value {
    match format {
        None | Some(TextFormat::Text) => json!({"type": "text"}),
        Some(TextFormat::JsonObject) => json!({"type": "json_object"}),
        Some(TextFormat::JsonSchema {
            name,
            schema,
            description,
            strict,
        }) => json!({"type": "json_schema", "name": name, "schema": schema,
                     "description": description, "strict": strict}),
    }
}

/// The function tools and tool choice through the chat route's validation and grammar; the
/// plan, and the tools and choice as the response repeats them.
fn tool_plan(
    request: &mut ResponsesRequest,
    max_tools: usize,
) -> Result<(Option<ToolPlan>, Vec<Value>, Value), ValidationError> {
    let entries = request.tools.take().unwrap_or_default();
    if entries.len() > max_tools {
        return Err(ValidationError::TooMany {
            param: "tools",
            max: max_tools,
            got: entries.len(),
        });
    }
    let mut functions = Vec::with_capacity(entries.len());
    let mut echoed = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let (function, echo) = function_tool(entry, index)?;
        functions.push(function);
        echoed.push(echo);
    }
    let choice = request
        .tool_choice
        .take()
        .filter(|choice| !choice.is_null());
    let choice_echo = choice.clone().unwrap_or_else(|| json!("auto"));
    let chat_choice = choice.map(chat_tool_choice).transpose()?;
    let parallel = request.parallel_tool_calls.map(Value::Bool);
    let plan = tools::plan(Some(Value::Array(functions)), chat_choice, parallel)
        .map_err(responses_names)?;
    Ok((plan, echoed, choice_echo))
}

/// One function tool in the chat route's shape, and as the response repeats it.
fn function_tool(entry: Value, index: usize) -> Result<(Value, Value), ValidationError> {
    let kind = entry
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "function" {
        return Err(ValidationError::Unsupported {
            param: format!("tools[{index}].type"),
            detail: format!(": built-in tools such as `{kind}` (only `function` tools)"),
        });
    }
    let tool: FunctionToolSpec =
        serde_json::from_value(entry).map_err(|error| ValidationError::OutOfRange {
            param: format!("tools[{index}]"),
            expected:
                "`{\"type\": \"function\", \"name\", \"description\", \"parameters\", \"strict\"}`",
            value: serde_wording::error_text(&error),
        })?;
    let mut function = Map::new();
    function.insert("name".into(), json!(tool.name));
    if let Some(description) = &tool.description {
        function.insert("description".into(), json!(description));
    }
    if let Some(parameters) = &tool.parameters {
        function.insert("parameters".into(), parameters.clone());
    }
    let echo = json!({"type": "function", "name": tool.name, "description": tool.description,
        "parameters": tool.parameters, "strict": tool.strict.unwrap_or(true)});
    Ok((json!({"type": "function", "function": function}), echo))
}

/// `tool_choice` in the chat route's shape: the modes as they are, a named function moved
/// under `function`; hosted tool choices are refused.
fn chat_tool_choice(choice: Value) -> Result<Value, ValidationError> {
    let Value::Object(fields) = &choice else {
        return Ok(choice);
    };
    match fields.get("type").and_then(Value::as_str) {
        Some("function") => {
            Ok(json!({"type": "function", "function": {"name": fields.get("name")}}))
        }
        Some(other) => Err(ValidationError::Unsupported {
            param: "tool_choice.type".to_owned(),
            detail: format!(": `{other}` (only `function`, or \"none\", \"auto\", \"required\")"),
        }),
        None => Ok(choice),
    }
}

/// Names a tool error's parameter as this body spells it.
fn responses_names(error: ValidationError) -> ValidationError {
    match error {
        ValidationError::OutOfRange {
            param,
            expected,
            value,
        } => ValidationError::OutOfRange {
            param: param.replace(".function.", "."),
            expected,
            value,
        },
        other => other,
    }
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
