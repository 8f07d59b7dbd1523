//! `response_format`: OpenAI's `text`, `json_object` (any JSON object) and `json_schema`, or
//! TGI's grammar object, recognised by its `value` field.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{serde_wording, GrammarRefusal, RequestedGrammar, TgiGrammarSite, ValidationError};

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSchemaFormat {
    name: String,
    #[serde(default, rename = "description")]
    _description: Option<String>,
    /// Absent means any JSON value.
    #[serde(default)]
    schema: Option<Value>,
    /// Output always follows the schema, so `strict` changes nothing.
    #[serde(default, rename = "strict")]
    _strict: Option<bool>,
}

const OPENAI_OR_TGI_FORMS: &str = "`{\"type\": \"text\"}`, `{\"type\": \"json_object\"}`, `{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\", \"strict\"}}`, or TGI's `{\"type\": \"json\" | \"json_object\" | \"json_schema\" | \"regex\", \"value\": ...}`";

/// The grammar `response_format` asks for; `None` for `text` or an absent field.
pub fn grammar(value: Option<Value>) -> Result<Option<RequestedGrammar>, ValidationError> {
    let Some(value) = value.filter(|value| !value.is_null()) else {
        return Ok(None);
    };
    if value.get("value").is_some() {
        return RequestedGrammar::from_tgi_object(value, TgiGrammarSite::RESPONSE_FORMAT).map(Some);
    }
    let format: ResponseFormat =
        serde_json::from_value(value).map_err(|error| ValidationError::OutOfRange {
            param: "response_format".to_owned(),
            expected: OPENAI_OR_TGI_FORMS,
            value: serde_wording::error_text(&error),
        })?;
    match format {
        ResponseFormat::Text => Ok(None),
        ResponseFormat::JsonObject => Ok(Some(RequestedGrammar::json_schema(
            json!({"type": "object"}),
            "response_format",
        ))),
        ResponseFormat::JsonSchema { json_schema } => {
            let JsonSchemaFormat { name, schema, .. } = json_schema;
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(ValidationError::OutOfRange {
                    param: "response_format.json_schema.name".to_owned(),
                    expected: "1 to 64 characters from a-z, A-Z, 0-9, _ and -",
                    value: format!("{name:?}"),
                });
            }
            let schema = schema.unwrap_or_else(|| json!({}));
            if !schema.is_object() && !schema.is_boolean() {
                return Err(ValidationError::InvalidGrammar {
                    param: "response_format.json_schema.schema",
                    refusal: GrammarRefusal::NotASchema,
                });
            }
            Ok(Some(RequestedGrammar::json_schema(
                schema,
                "response_format.json_schema.schema",
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Grammar;

    fn schema_of(value: Value) -> Value {
        match grammar(Some(value)) {
            Ok(Some(RequestedGrammar {
                grammar: Grammar::JsonSchema(text),
                ..
            })) => serde_json::from_str(&text).expect("the router writes valid JSON"),
            other => panic!("expected a JSON schema grammar, got {other:?}"),
        }
    }

    #[test]
    fn text_and_absent_formats_are_unconstrained() {
        assert_eq!(grammar(None), Ok(None));
        assert_eq!(grammar(Some(Value::Null)), Ok(None));
        assert_eq!(grammar(Some(json!({"type": "text"}))), Ok(None));
    }

    #[test]
    fn json_object_is_any_object_in_the_compact_layout() {
        let schema = schema_of(json!({"type": "json_object"}));
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["x-guidance"]["whitespace_flexible"], false);
    }

    #[test]
    fn json_schema_keeps_the_clients_schema_and_its_own_layout() {
        let own = json!({"whitespace_flexible": true});
        let schema = schema_of(json!({"type": "json_schema", "json_schema": {
            "name": "person", "strict": true,
            "schema": {"type": "object", "x-guidance": own}}}));
        assert_eq!(schema["x-guidance"], own);
    }

    #[test]
    fn tgi_grammar_objects_are_read_by_their_value() {
        let person = json!({"type": "object", "properties": {"name": {"type": "string"}}});
        // TGI's `json_object` with a `value` is that schema, not OpenAI's "any object".
        for format in [
            json!({"type": "json_object", "value": person}),
            json!({"type": "json", "value": person}),
            json!({"type": "json_schema", "value": {"name": "person", "schema": person}}),
        ] {
            assert_eq!(schema_of(format)["properties"], person["properties"]);
        }
        let regex = grammar(Some(json!({"type": "regex", "value": "[0-9]+"})));
        assert!(
            matches!(&regex, Ok(Some(RequestedGrammar { grammar: Grammar::Regex(r), param }))
                if r == "[0-9]+" && *param == "response_format.value"),
            "{regex:?}"
        );
    }

    #[test]
    fn malformed_formats_name_their_parameter() {
        for (value, param) in [
            (json!({"type": "yaml"}), "response_format"),
            (json!({"type": "json_schema"}), "response_format"),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a b"}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
                "response_format.json_schema.schema",
            ),
            (json!({"type": "yaml", "value": "a: 1"}), "response_format"),
            (
                json!({"type": "json_schema", "value": {"name": "x"}}),
                "response_format",
            ),
            (
                json!({"type": "json", "value": "{not json"}),
                "response_format.value",
            ),
        ] {
            let error = grammar(Some(value)).expect_err("malformed");
            assert_eq!(error.param(), Some(param), "{error}");
        }
    }
}
