//! `chat_template_kwargs`: template switches a client may set, held to an allow-list so a
//! request can neither overwrite the template's own variables (`messages`, `tools`,
//! `bos_token`, …) nor hand it arbitrary data.

use serde_json::{Map, Value};

use super::error::ValidationError;

/// The switches a request may set, each a boolean.
pub const ALLOWED_TEMPLATE_KWARGS: [&str; 3] =
    ["enable_thinking", "thinking", "tools_in_user_message"];

const PARAM: &str = "chat_template_kwargs";

/// The validated `chat_template_kwargs` (empty when absent).
pub fn template_kwargs(value: Option<Value>) -> Result<Map<String, Value>, ValidationError> {
    let fields = match value {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(fields)) => fields,
        Some(other) => {
            return Err(ValidationError::OutOfRange {
                param: PARAM.to_owned(),
                expected: "an object of template switches",
                value: other.to_string(),
            })
        }
    };
    for (key, value) in &fields {
        if !ALLOWED_TEMPLATE_KWARGS.contains(&key.as_str()) {
            return Err(ValidationError::OutOfRange {
                param: format!("{PARAM}.{key}"),
                expected: "one of enable_thinking, thinking, tools_in_user_message",
                value: format!("{key:?}"),
            });
        }
        if !value.is_boolean() {
            return Err(ValidationError::OutOfRange {
                param: format!("{PARAM}.{key}"),
                expected: "a boolean",
                value: value.to_string(),
            });
        }
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn allowed_switches_pass_and_anything_else_names_its_key() {
        let kwargs = template_kwargs(Some(json!({"enable_thinking": false}))).unwrap();
        assert_eq!(kwargs.get("enable_thinking"), Some(&json!(false)));
        assert!(template_kwargs(None).unwrap().is_empty());
        let unknown = template_kwargs(Some(json!({"messages": []}))).unwrap_err();
        assert_eq!(unknown.param(), Some("chat_template_kwargs.messages"));
        let text = template_kwargs(Some(json!({"enable_thinking": "yes"}))).unwrap_err();
        assert_eq!(text.param(), Some("chat_template_kwargs.enable_thinking"));
        let list = template_kwargs(Some(json!([1]))).unwrap_err();
        assert_eq!(list.param(), Some("chat_template_kwargs"));
    }
}
