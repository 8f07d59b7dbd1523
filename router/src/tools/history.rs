//! An assistant history message's `tool_calls`, shown to the model the way it calls: as
//! Tandem's calls document in the message's text, or through the chat template's own
//! `tool_calls` for families whose template renders them.

use serde_json::{json, Value};

use super::format::ToolFamily;
use crate::validation::ValidationError;

/// What an assistant message's calls become.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryCalls {
    /// Tandem's calls document, the message's text.
    Text(String),
    /// `[{id, type, function: {name, arguments}}]` with `arguments` an object, as templates
    /// read it.
    Native(Value),
}

const EXPECTED: &str = "an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}} with `arguments` a JSON object as a string";

/// Validates `tool_calls` (reported as `param`) and writes them for `family`.
pub fn history(
    family: ToolFamily,
    tool_calls: Value,
    param: &str,
) -> Result<HistoryCalls, ValidationError> {
    let invalid = |value: &Value| ValidationError::OutOfRange {
        param: param.to_owned(),
        expected: EXPECTED,
        value: value.to_string(),
    };
    let Value::Array(entries) = tool_calls else {
        return Err(invalid(&tool_calls));
    };
    let mut calls = Vec::with_capacity(entries.len());
    for entry in entries {
        let name = entry.pointer("/function/name").and_then(Value::as_str);
        let text = entry.pointer("/function/arguments").and_then(Value::as_str);
        let arguments = text
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .filter(Value::is_object);
        match (name, arguments, text) {
            (Some(name), Some(_), Some(text)) if family.arguments_as_text() => calls.push((
                entry.get("id").cloned(),
                name.to_owned(),
                Value::String(text.to_owned()),
            )),
            (Some(name), Some(arguments), _) => {
                calls.push((entry.get("id").cloned(), name.to_owned(), arguments))
            }
            _ => return Err(invalid(&entry)),
        }
    }
    if family.is_native() {
        let native = calls.into_iter().map(|(id, name, arguments)| {
            let mut call =
                json!({"type": "function", "function": {"name": name, "arguments": arguments}});
            if let Some(id) = id {
                call["id"] = id;
            }
            call
        });
        return Ok(HistoryCalls::Native(Value::Array(native.collect())));
    }
    let written: Vec<String> = calls
        .into_iter()
        .map(|(_, name, arguments)| {
            format!("{{\"name\": {}, \"arguments\": {arguments}}}", json!(name))
        })
        .collect();
    Ok(HistoryCalls::Text(format!(
        "{{\"tool_calls\": [{}]}}",
        written.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(arguments: &str) -> Value {
        json!([{"id": "call_1", "type": "function", "function": {"name": "now", "arguments": arguments}}])
    }

    #[test]
    fn tandem_writes_its_calls_document_and_native_families_keep_the_calls_with_object_arguments() {
        assert_eq!(
            history(ToolFamily::Tandem, call("{}"), "m").unwrap(),
            HistoryCalls::Text(r#"{"tool_calls": [{"name": "now", "arguments": {}}]}"#.to_owned())
        );
        let native = history(ToolFamily::Hermes, call(r#"{"tz": "UTC"}"#), "m").unwrap();
        assert_eq!(
            native,
            HistoryCalls::Native(json!([{"id": "call_1", "type": "function",
                "function": {"name": "now", "arguments": {"tz": "UTC"}}}]))
        );
    }

    #[test]
    fn sectioned_families_keep_the_arguments_text_their_templates_concatenate() {
        let text = r#"{"tz":"UTC"}"#;
        for family in [ToolFamily::DeepseekV31, ToolFamily::KimiK2] {
            assert_eq!(
                history(family, call(text), "m").unwrap(),
                HistoryCalls::Native(json!([{"id": "call_1", "type": "function",
                    "function": {"name": "now", "arguments": text}}]))
            );
            assert!(history(family, call("[1]"), "m").is_err());
        }
    }

    #[test]
    fn broken_or_non_object_arguments_name_the_parameter() {
        for family in [ToolFamily::Tandem, ToolFamily::Mistral] {
            for broken in ["{", "[1]"] {
                let error = history(family, call(broken), "messages[1].tool_calls").unwrap_err();
                assert_eq!(error.param(), Some("messages[1].tool_calls"));
            }
        }
    }
}
