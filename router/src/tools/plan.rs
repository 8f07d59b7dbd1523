//! The tool plan of a request: its tools and choice validated, the prompt preamble that
//! describes them, and the grammar that makes every call well-formed.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::scheduler::Grammar;
use crate::validation::{
    serde_wording, with_json_layout, ChatMessage, RequestedGrammar, ValidationError,
};

/// One `{"type": "function", "function": {...}}` entry of `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema for the arguments object.
    pub parameters: Value,
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

    /// The calls document's schema: one call, or several when parallel calls are allowed.
    fn calls_schema(&self) -> Value {
        let callable = self.tools.iter().filter(|tool| match &self.choice {
            ToolChoice::Named(name) => &tool.name == name,
            _ => true,
        });
        let variants: Vec<Value> = callable
            .map(|tool| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let single = !self.parallel || matches!(self.choice, ToolChoice::Named(_));
        let mut calls = json!({"type": "array", "items": {"anyOf": variants}, "minItems": 1});
        if single {
            calls["maxItems"] = json!(1);
        }
        json!({"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"], "additionalProperties": false})
    }

    /// The grammar the output must follow; `None` when the model may not call tools.
    pub fn grammar(&self) -> Option<RequestedGrammar> {
        match self.choice {
            ToolChoice::None => None,
            ToolChoice::Required | ToolChoice::Named(_) => {
                Some(RequestedGrammar::json_schema(self.calls_schema(), "tools"))
            }
            ToolChoice::Auto => {
                let schema = with_json_layout(self.calls_schema());
                // Plain text must not start with `{` or a blank, so the first character decides.
                let lark = format!("start: calls | text\ncalls: %json {schema}\ntext: TEXT\nTEXT: /[^{{\\s][\\s\\S]*/\n");
                Some(RequestedGrammar {
                    grammar: Grammar::Lark(lark),
                    param: "tools",
                })
            }
        }
    }

    /// A system message describing the tools and the call format; `None` for `"none"`.
    pub fn preamble(&self) -> Option<ChatMessage> {
        if !self.may_call() {
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

/// An assistant history message's `tool_calls`, written in the call format the model is
/// shown, so the conversation renders through any chat template.
pub fn history_calls(tool_calls: Value, param: &str) -> Result<String, ValidationError> {
    let expected = "an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}} with `arguments` a JSON object as a string";
    let Value::Array(entries) = tool_calls else {
        return Err(invalid(param.to_owned(), expected, tool_calls));
    };
    let mut calls = Vec::with_capacity(entries.len());
    for entry in entries {
        let name = entry.pointer("/function/name").and_then(Value::as_str);
        let arguments = entry
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .and_then(|text| serde_json::from_str::<Value>(text).ok());
        match (name, arguments) {
            (Some(name), Some(arguments)) => calls.push(format!(
                "{{\"name\": {}, \"arguments\": {arguments}}}",
                json!(name)
            )),
            _ => return Err(invalid(param.to_owned(), expected, entry)),
        }
    }
    Ok(format!("{{\"tool_calls\": [{}]}}", calls.join(", ")))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
