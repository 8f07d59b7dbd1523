//! The tool plan of a request: its tools and choice validated, the prompt preamble that
//! describes them, and the grammar that makes every call well-formed.

use serde::Deserialize;
use serde_json::{json, Value};

use super::format::ToolFormat;
use crate::validation::{serde_wording, ChatMessage, ValidationError};

/// One `{"type": "function", "function": {...}}` entry of `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema for the arguments object.
    pub parameters: Value,
    /// The entry as the client wrote it, for the chat template's `tools`.
    pub definition: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolEntry {
    #[serde(rename = "type")]
    kind: String,
    function: FunctionEntry,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionEntry {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
    /// Calls always follow the schema, so `strict` changes nothing.
    #[serde(default, rename = "strict")]
    _strict: Option<bool>,
}

/// What the model may or must do with the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The validated tool request of one chat completion.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub tools: Vec<FunctionTool>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// The syntax calls are rendered, constrained and parsed in (Tandem's own by default).
    pub format: ToolFormat,
}

fn invalid(param: String, expected: &'static str, value: impl ToString) -> ValidationError {
    ValidationError::OutOfRange {
        param,
        expected,
        value: value.to_string(),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Validates `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no tools are given.
pub fn plan(
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel: Option<Value>,
) -> Result<Option<ToolPlan>, ValidationError> {
    let entries = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(entries)) => entries,
        Some(other) => return Err(invalid("tools".into(), "an array of function tools", other)),
    };
    let mut tools = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let param = format!("tools[{index}]");
        let definition = entry.clone();
        let entry: ToolEntry = serde_json::from_value(entry).map_err(|e| {
            invalid(param.clone(), "`{\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}`", serde_wording::error_text(&e))
        })?;
        if entry.kind != "function" {
            return Err(invalid(format!("{param}.type"), "\"function\"", entry.kind));
        }
        let name = entry.function.name;
        if !valid_name(&name) || tools.iter().any(|t: &FunctionTool| t.name == name) {
            return Err(invalid(
                format!("{param}.function.name"),
                "a unique name of 1 to 64 characters from a-z, A-Z, 0-9, _ and -",
                format!("{name:?}"),
            ));
        }
        let parameters = entry
            .function
            .parameters
            .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        if !parameters.is_object() {
            return Err(invalid(
                format!("{param}.function.parameters"),
                "a JSON Schema object",
                parameters,
            ));
        }
        tools.push(FunctionTool {
            name,
            description: entry.function.description,
            parameters,
            definition,
        });
    }
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(flag)) => flag,
        Some(other) => return Err(invalid("parallel_tool_calls".into(), "a boolean", other)),
    };
    let choice = choice(tool_choice, &tools)?;
    Ok((!tools.is_empty()).then_some(ToolPlan {
        tools,
        choice,
        parallel,
        format: ToolFormat::default(),
    }))
}

fn choice(value: Option<Value>, tools: &[FunctionTool]) -> Result<ToolChoice, ValidationError> {
    let param = || "tool_choice".to_owned();
    let expected = "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}} naming a tool in `tools`";
    let choice = match value {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            })
        }
        Some(Value::String(text)) => match text.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(invalid(param(), expected, format!("{text:?}"))),
        },
        Some(object) => {
            let name = object
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| object.get("type") == Some(&json!("function")))
                .ok_or_else(|| invalid(param(), expected, &object))?;
            if !tools.iter().any(|tool| tool.name == name) {
                return Err(invalid(param(), expected, format!("{name:?}")));
            }
            ToolChoice::Named(name.to_owned())
        }
    };
    if tools.is_empty() && choice != ToolChoice::None {
        return Err(invalid(
            param(),
            "\"none\" or absent when `tools` is empty",
            format!("{choice:?}"),
        ));
    }
    Ok(choice)
}

impl ToolPlan {
    /// Whether the output may be a call document (false for `tool_choice: "none"`).
    pub fn may_call(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The plan with calls in `format`.
    #[must_use]
    pub fn with_format(mut self, format: ToolFormat) -> Self {
        self.format = format;
        self
    }

    /// The tools the model may call: all of them, or the one a named choice names.
    pub fn callable(&self) -> impl Iterator<Item = &FunctionTool> {
        self.tools.iter().filter(|tool| match &self.choice {
            ToolChoice::Named(name) => &tool.name == name,
            _ => true,
        })
    }

    /// The grammar's choice of one callable tool's call rule: `(call_0 | call_1 | ...)`.
    pub(super) fn call_alternatives(&self) -> String {
        let names: Vec<String> = (0..self.callable().count())
            .map(|index| format!("call_{index}"))
            .collect();
        format!("({})", names.join(" | "))
    }

    /// Whether one output may hold several calls (not for a named choice).
    pub fn allows_several(&self) -> bool {
        self.parallel && !matches!(self.choice, ToolChoice::Named(_))
    }

    /// The chat template's `tools`: the declared entries, when the family renders them
    /// itself and the model may call them.
    pub fn template_tools(&self) -> Option<Value> {
        let shown = self.format.family.is_native() && self.may_call();
        shown.then(|| Value::Array(self.tools.iter().map(|t| t.definition.clone()).collect()))
    }

    /// A system message describing the tools and Tandem's call format; `None` for `"none"`
    /// and for families whose template shows the tools itself.
    pub fn preamble(&self) -> Option<ChatMessage> {
        if !self.may_call() || self.format.family.is_native() {
            return None;
        }
        let listing: Vec<String> = self
            .tools
            .iter()
            .map(|tool| json!({"name": tool.name, "description": tool.description, "parameters": tool.parameters}).to_string())
            .collect();
        let format =
            "{\"tool_calls\": [{\"name\": <function name>, \"arguments\": <arguments object>}]}";
        let rule = match &self.choice {
            ToolChoice::Auto => {
                "To call functions, reply with only this JSON; otherwise answer in plain text."
                    .to_owned()
            }
            ToolChoice::Named(name) => {
                format!("Call the function `{name}` now by replying with only this JSON.")
            }
            _ => "Call one or more functions now by replying with only this JSON.".to_owned(),
        };
        Some(ChatMessage::new(
            "system",
            format!(
                "You can call these functions:\n{}\nCall format: {format}\n{rule}",
                listing.join("\n")
            ),
        ))
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
