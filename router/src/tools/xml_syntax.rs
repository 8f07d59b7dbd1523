//! The XML-style call syntaxes: Qwen3-Coder's (also Qwen3.5's and Qwen3.6's)
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`,
//! GLM-4.5's `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>`
//! and DeepSeek-V3.2's DSML block of `<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="KEY"
//! string="true">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>` calls.
//!
//! All write one parameter per tag pair and each value raw when its schema only admits
//! strings, as JSON otherwise (DSML says which in the tag), so a call is the same sequence of
//! landmarks in every family:
//! the grammar (`xml_grammar.rs`) writes them, the scanner (`xml_calls.rs`) reads them.

use std::collections::HashMap;

use serde_json::Value;

/// Where a call opens: Hermes's `<tool_call>`, which both families share.
pub const XML_TRIGGER: &str = "<tool_call>";
/// Where a call closes.
pub const XML_CLOSING: &str = "</tool_call>";

/// The landmarks of one XML family's calls, in the order a call writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XmlSyntax {
    /// The block that holds all the calls (DSML's `<｜DSML｜function_calls>\n` and
    /// `\n</｜DSML｜function_calls>`), for families that wrap them.
    pub block: Option<[&'static str; 2]>,
    /// Where each call opens (`<tool_call>`).
    pub opening: &'static str,
    /// Where each call closes (`</tool_call>`).
    pub closing: &'static str,
    /// What follows the opening before the function's name.
    pub name_open: &'static str,
    /// Ends the name.
    pub name_close: &'static str,
    /// Opens a parameter's name.
    pub key_open: &'static str,
    /// Ends the parameter's name; its value follows.
    pub key_close: &'static str,
    /// For families whose tag says how the value is written: the ends of a parameter's name
    /// before a raw value and before a JSON one, which replace `key_close`.
    pub kind_closes: Option<[&'static str; 2]>,
    /// Ends a value.
    pub value_close: &'static str,
    /// What precedes `</tool_call>` at the end of a call.
    pub call_close: &'static str,
    /// The markers a tokenizer may hold as single added tokens, for `MarkerTokens`.
    pub token_markers: [&'static str; MARKERS],
}

/// How many inner markers a syntax may have as single tokens.
const MARKERS: usize = 4;

/// Ids of a syntax's `token_markers` that the tokenizer holds as visible added tokens.
pub type MarkerTokens = [Option<u32>; MARKERS];

/// Qwen3-Coder's syntax (Qwen3.5's and Qwen3.6's templates write the same).
pub const QWEN3_CODER: XmlSyntax = XmlSyntax {
    block: None,
    opening: XML_TRIGGER,
    closing: XML_CLOSING,
    name_open: "\n<function=",
    name_close: ">\n",
    key_open: "<parameter=",
    key_close: ">\n",
    kind_closes: None,
    value_close: "\n</parameter>\n",
    call_close: "</function>\n",
    token_markers: ["", "", "", ""],
};

/// GLM-4.5's and GLM-4.6's syntax.
pub const GLM45: XmlSyntax = XmlSyntax {
    block: None,
    opening: XML_TRIGGER,
    closing: XML_CLOSING,
    name_open: "",
    name_close: "\n",
    key_open: "<arg_key>",
    key_close: "</arg_key>\n<arg_value>",
    kind_closes: None,
    value_close: "</arg_value>\n",
    call_close: "",
    token_markers: ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
};

/// DeepSeek-V3.2's DSML calls (the `deepseek_v32` parser).
pub const DEEPSEEK_V32: XmlSyntax = XmlSyntax {
    block: Some(["<｜DSML｜function_calls>\n", "\n</｜DSML｜function_calls>"]),
    opening: "<｜DSML｜invoke name=\"",
    closing: "</｜DSML｜invoke>",
    name_open: "",
    name_close: "\">\n",
    key_open: "<｜DSML｜parameter name=\"",
    key_close: "\" string=\"",
    kind_closes: Some(["\" string=\"true\">", "\" string=\"false\">"]),
    value_close: "</｜DSML｜parameter>\n",
    call_close: "",
    token_markers: ["", "", "", ""],
};

impl XmlSyntax {
    /// Where a call starts in text: its opening and the name's.
    pub fn call_open(&self) -> String {
        format!("{}{}", self.opening, self.name_open)
    }

    /// Where a call ends in text.
    pub fn call_end(&self) -> String {
        format!("{}{}", self.call_close, self.closing)
    }

    /// The text that starts the calls after free text: the block's opening, or a call's.
    pub fn trigger(&self) -> &'static str {
        self.block.map_or(self.opening, |[open, _]| open.trim_end())
    }

    /// The end of a parameter's name that `key` (the text after the name's opening) ends
    /// with, the key it closes and, where the tag says it, how the value is written.
    pub fn close_key<'a>(&self, key: &'a str) -> Option<(&'a str, Option<ValueKind>)> {
        match self.kind_closes {
            Some([raw, json]) => [(raw, ValueKind::Raw), (json, ValueKind::Json)]
                .into_iter()
                .find_map(|(close, kind)| key.strip_suffix(close).map(|key| (key, Some(kind)))),
            None => key.strip_suffix(self.key_close).map(|key| (key, None)),
        }
    }

    /// The end of a parameter's name before a value written as `kind`.
    pub fn key_close_for(&self, kind: ValueKind) -> &'static str {
        match (self.kind_closes, kind) {
            (Some([raw, _]), ValueKind::Raw) => raw,
            (Some([_, json]), ValueKind::Json) => json,
            (None, _) => self.key_close,
        }
    }

    /// The ids `token` gives each of this syntax's inner markers.
    pub fn marker_tokens(&self, token: impl Fn(&str) -> Option<u32>) -> MarkerTokens {
        self.token_markers
            .map(|marker| (!marker.is_empty()).then(|| token(marker)).flatten())
    }

    /// The inner markers with their token ids, for the grammar's alternatives.
    pub fn token_markers_with(
        &self,
        tokens: MarkerTokens,
    ) -> impl Iterator<Item = (&'static str, u32)> {
        self.token_markers
            .into_iter()
            .zip(tokens)
            .filter_map(|(marker, id)| id.map(|id| (marker, id)))
    }
}

/// How a parameter's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// The string itself, unquoted: the schema only admits strings.
    Raw,
    /// JSON text.
    Json,
}

impl ValueKind {
    /// Raw for a schema that only admits strings (`"type": "string"`, or an `enum`/`const` of
    /// strings only); JSON for everything else.
    pub fn of_schema(schema: &Value) -> Self {
        let strings_only =
            |values: &[Value]| !values.is_empty() && values.iter().all(Value::is_string);
        let raw = match (schema.get("type"), schema.get("enum"), schema.get("const")) {
            (Some(Value::String(kind)), _, _) => kind == "string",
            (None, Some(Value::Array(values)), _) => strings_only(values),
            (None, None, Some(value)) => value.is_string(),
            _ => false,
        };
        if raw {
            Self::Raw
        } else {
            Self::Json
        }
    }
}

/// Each callable tool's parameters' value kinds, for reading values back into JSON.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueKinds(HashMap<String, HashMap<String, ValueKind>>);

impl ValueKinds {
    /// The kinds of every declared parameter of `tools`, given as (name, parameters schema).
    pub fn of_tools<'a>(tools: impl Iterator<Item = (&'a str, &'a Value)>) -> Self {
        let tools = tools.map(|(name, parameters)| {
            let kinds = properties(parameters)
                .map(|(key, schema)| (key.clone(), ValueKind::of_schema(schema)))
                .collect();
            (name.to_owned(), kinds)
        });
        Self(tools.collect())
    }

    /// The kind of `tool`'s parameter `key`: raw, as the templates write unknown values, when
    /// the schema does not say.
    pub fn kind(&self, tool: &str, key: &str) -> ValueKind {
        self.0
            .get(tool)
            .and_then(|keys| keys.get(key))
            .copied()
            .unwrap_or(ValueKind::Raw)
    }
}

/// A schema's `properties`, in the order the schema holds them.
pub fn properties(schema: &Value) -> impl Iterator<Item = (&String, &Value)> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_schemas_that_admit_nothing_but_strings_are_written_raw() {
        let raw = [
            json!({"type": "string", "maxLength": 3}),
            json!({"enum": ["celsius", "fahrenheit"]}),
            json!({"const": "x"}),
        ];
        let typed = [
            json!({"type": "integer"}),
            json!({"type": ["string", "null"]}),
            json!({"enum": ["a", 1]}),
            json!({"type": "object"}),
            json!({}),
        ];
        assert!(raw
            .iter()
            .all(|s| ValueKind::of_schema(s) == ValueKind::Raw));
        assert!(typed
            .iter()
            .all(|s| ValueKind::of_schema(s) == ValueKind::Json));
    }

    #[test]
    fn only_glm_names_inner_markers_that_may_be_tokens() {
        let tokens = GLM45.marker_tokens(|marker| (marker == "<arg_value>").then_some(7));
        assert_eq!(tokens, [None, None, Some(7), None]);
        assert_eq!(QWEN3_CODER.marker_tokens(|_| Some(1)), [None; MARKERS]);
    }
}
