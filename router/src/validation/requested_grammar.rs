//! The grammar a request asks for, from OpenAI's `response_format` schemas or TGI's grammar
//! objects, in the form the grammar compiler and the shard take.

use serde_json::{json, Value};

use super::error::ValidationError;
use super::grammar_refusal::GrammarRefusal;
use super::serde_wording;
use crate::scheduler::Grammar;

/// JSON output format the router asks of every schema unless the client set its own
/// `x-guidance`: no free whitespace, so a small model cannot wander in blanks forever.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with the router's output layout unless it sets its own `x-guidance`.
pub fn with_json_layout(mut schema: Value) -> Value {
    if let Value::Object(fields) = &mut schema {
        fields.entry("x-guidance").or_insert_with(json_layout);
    }
    schema
}

/// The parameter a tool grammar reports as its source.
pub const TOOLS_PARAM: &str = "tools";

/// A grammar and the request parameter it came from (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedGrammar {
    pub grammar: Grammar,
    pub param: &'static str,
}

impl RequestedGrammar {
    /// A JSON Schema grammar with the router's output layout unless the schema sets one.
    pub fn json_schema(schema: Value, param: &'static str) -> Self {
        Self {
            grammar: Grammar::JsonSchema(with_json_layout(schema).to_string()),
            param,
        }
    }
}

/// TGI's grammar object: `{"type": "json" | "json_object", "value": <schema>}`,
/// `{"type": "json_schema", "value": {"name": ..., "schema": <schema>}}` or
/// `{"type": "regex", "value": "<regex>"}`.
#[derive(Debug, serde::Deserialize)]
#[serde(
    tag = "type",
    content = "value",
    rename_all = "snake_case",
    deny_unknown_fields
)]
enum TgiGrammar {
    #[serde(alias = "json_object")]
    Json(Value),
    JsonSchema(TgiJsonSchema),
    Regex(String),
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TgiJsonSchema {
    /// OpenAI's `json_schema` fields besides `schema` label the schema or ask for strictness
    /// (output always follows the schema), so none changes the grammar.
    #[serde(default, rename = "name")]
    _name: Option<String>,
    #[serde(default, rename = "description")]
    _description: Option<String>,
    #[serde(default, rename = "strict")]
    _strict: Option<bool>,
    schema: Value,
}

/// The request parameters a TGI grammar object is reported under in errors.
#[derive(Debug, Clone, Copy)]
pub struct TgiGrammarSite {
    /// The grammar object itself.
    pub object: &'static str,
    /// Its `value`, the schema or regex.
    pub value: &'static str,
}

impl TgiGrammarSite {
    /// `/generate`'s `parameters.grammar`.
    pub const PARAMETERS: Self = Self {
        object: "parameters.grammar",
        value: "parameters.grammar.value",
    };
    /// A chat or completions `response_format` written in TGI's form.
    pub const RESPONSE_FORMAT: Self = Self {
        object: "response_format",
        value: "response_format.value",
    };
}

/// What a malformed TGI grammar object is told it should look like.
const TGI_GRAMMAR_FORMS: &str = "`{\"type\": \"json\" or \"json_object\", \"value\": <JSON Schema>}`, `{\"type\": \"json_schema\", \"value\": {\"name\", \"schema\"}}` or `{\"type\": \"regex\", \"value\": \"<regex>\"}`";

impl RequestedGrammar {
    /// The grammar of TGI's `parameters.grammar`; `None` when absent or null.
    pub fn from_tgi(value: Option<Value>) -> Result<Option<Self>, ValidationError> {
        value
            .filter(|value| !value.is_null())
            .map(|value| Self::from_tgi_object(value, TgiGrammarSite::PARAMETERS))
            .transpose()
    }

    /// The grammar of one TGI grammar object, with errors reported under `site`.
    pub fn from_tgi_object(value: Value, site: TgiGrammarSite) -> Result<Self, ValidationError> {
        let grammar: TgiGrammar =
            serde_json::from_value(value).map_err(|error| ValidationError::OutOfRange {
                param: site.object.to_owned(),
                expected: TGI_GRAMMAR_FORMS,
                value: serde_wording::error_text(&error),
            })?;
        let schema = match grammar {
            TgiGrammar::Regex(regex) => {
                return Ok(Self {
                    grammar: Grammar::Regex(regex),
                    param: site.value,
                })
            }
            // TGI accepts the schema serialized as a string too.
            TgiGrammar::Json(Value::String(text)) => {
                serde_json::from_str(&text).map_err(|error| ValidationError::InvalidGrammar {
                    param: site.value,
                    refusal: GrammarRefusal::NotJson(error.to_string()),
                })?
            }
            TgiGrammar::Json(schema) | TgiGrammar::JsonSchema(TgiJsonSchema { schema, .. }) => {
                schema
            }
        };
        Ok(Self::json_schema(schema, site.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tgi_grammars_parse_json_schemas_given_as_objects_or_strings_and_regexes() {
        let from_object =
            RequestedGrammar::from_tgi(Some(json!({"type": "json", "value": {"type": "object"}})));
        let from_string = RequestedGrammar::from_tgi(Some(
            json!({"type": "json", "value": "{\"type\": \"object\"}"}),
        ));
        let from_alias = RequestedGrammar::from_tgi(Some(
            json!({"type": "json_object", "value": {"type": "object"}}),
        ));
        let from_json_schema = RequestedGrammar::from_tgi(Some(json!({
            "type": "json_schema", "value": {"name": "thing", "schema": {"type": "object"}}
        })));
        let unnamed_json_schema = RequestedGrammar::from_tgi(Some(
            json!({"type": "json_schema", "value": {"schema": {"type": "object"}, "strict": true}}),
        ));
        assert!(matches!(&from_object, Ok(Some(g)) if g.param == "parameters.grammar.value"));
        for other in [
            from_string,
            from_alias,
            from_json_schema,
            unnamed_json_schema,
        ] {
            assert_eq!(other, from_object);
        }
        assert!(matches!(
            RequestedGrammar::from_tgi(Some(json!({"type": "regex", "value": "[a-z]+"}))),
            Ok(Some(RequestedGrammar {
                grammar: Grammar::Regex(_),
                ..
            }))
        ));
        assert_eq!(RequestedGrammar::from_tgi(None), Ok(None));
        for bad in [
            json!({"type": "xml", "value": "x"}),
            json!({"type": "regex"}),
            json!({"type": "json", "value": "{"}),
            json!({"type": "json_schema", "value": {"name": "no schema"}}),
            json!({"type": "json_schema", "value": {"schema": {}, "format": "yaml"}}),
        ] {
            let error = RequestedGrammar::from_tgi(Some(bad)).expect_err("malformed");
            assert!(
                error
                    .param()
                    .is_some_and(|p| p.starts_with("parameters.grammar")),
                "{error}"
            );
        }
    }
}
