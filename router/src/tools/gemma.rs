//! Gemma 4's calls, `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, several in a row, and
//! the grammar that holds a model to them.
//!
//! A value is written as the template's `format_argument` writes it: a string between two
//! `<|"|>` quote tokens, raw; an object as `{key:value,...}` with bare keys; numbers, booleans
//! and `null` as JSON. The template writes keys in sorted order, so the grammar does too.
//! Scalars, objects with `properties` and arrays follow their schema; other schemas (`anyOf`,
//! type lists, objects without `properties`) admit any value in the syntax.

use serde_json::Value;

use super::lark::{lark_string, marker, regex_escape, text_then};
use super::plan::{ToolChoice, ToolPlan};
use super::xml_syntax::{properties, ValueKind};
use crate::scheduler::Grammar;
use crate::validation::RequestedGrammar;

/// Opens a call.
pub const CALL_OPEN: &str = "<|tool_call>";
/// Closes a call.
pub const CALL_CLOSE: &str = "<tool_call|>";
/// Opens and closes a string value.
pub const QUOTE: &str = "<|\"|>";
/// What follows `CALL_OPEN` before the function's name.
pub const NAME_PREFIX: &str = "call:";
/// The markers chat output keeps as text, for the parser.
pub const MARKERS: [&str; 3] = [CALL_OPEN, CALL_CLOSE, QUOTE];

/// Any value in Gemma's syntax, for schemas the grammar does not follow.
const ANY_VALUE: &str = "\
any_value: any_string | NUMBER | \"true\" | \"false\" | \"null\" | any_object | any_array
any_object: \"{\" (KEY \":\" any_value (\",\" KEY \":\" any_value)*)? \"}\"
any_array: \"[\" (any_value (\",\" any_value)*)? \"]\"
KEY: /[A-Za-z_][A-Za-z0-9_]*/
NUMBER: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/
";

/// The grammar `plan`'s output follows in Gemma 4's syntax.
pub fn gemma_grammar(plan: &ToolPlan) -> RequestedGrammar {
    let mut writer = Writer {
        quote: plan.format.quote_token,
        rules: String::new(),
        strings: 0,
    };
    let mut bodies = String::new();
    for (index, tool) in plan.callable().enumerate() {
        let arguments = writer.object(&tool.parameters, &format!("args_{index}"));
        let name = lark_string(&format!("{NAME_PREFIX}{}", tool.name));
        let close = marker(CALL_CLOSE, plan.format.closing_token);
        bodies.push_str(&format!("call_{index}: {name} {arguments} {close}\n"));
    }
    let one = plan.call_alternatives();
    let more = if plan.allows_several() { " call*" } else { "" };
    let start = match plan.choice {
        ToolChoice::Auto => text_then(
            CALL_OPEN,
            plan.format.trigger_token,
            &format!("{one}{more}"),
        ),
        _ => format!("start: call{}\n", if more.is_empty() { "" } else { "+" }),
    };
    let open = marker(CALL_OPEN, plan.format.trigger_token);
    let any_string = writer.free_string("ANY_STRING", None, None);
    let lark = format!(
        "{start}call: {open} {one}\n{bodies}{}{ANY_VALUE}any_string: {any_string}\n",
        writer.rules
    );
    RequestedGrammar {
        grammar: Grammar::Lark(lark),
        param: "tools",
    }
}

/// Writes the value rules of one grammar.
struct Writer {
    /// `<|"|>`'s token, when the tokenizer holds it as a visible one.
    quote: Option<u32>,
    rules: String,
    /// String terminals written so far, for their names.
    strings: usize,
}

impl Writer {
    /// A value under `schema`; `name` names the rules it needs.
    fn value(&mut self, schema: &Value, name: &str) -> String {
        let kind = schema.get("type").and_then(Value::as_str);
        if ValueKind::of_schema(schema) == ValueKind::Raw {
            return self.string(schema);
        }
        match kind {
            Some("object") if schema.get("properties").is_some_and(Value::is_object) => {
                self.object(schema, name)
            }
            Some("array") => self.array(schema, name),
            Some("integer" | "number" | "boolean" | "null") => format!("%json {schema}"),
            _ => "any_value".to_owned(),
        }
    }

    /// `{key:value,...}`: each property in sorted order, every required one, optional ones at
    /// will, commas between those written.
    fn object(&mut self, schema: &Value, name: &str) -> String {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut fields: Vec<(&String, &Value)> = properties(schema).collect();
        fields.sort_by(|a, b| a.0.cmp(b.0));
        // `first_k`: at least one of the fields from k on, none written before; `rest_k`: the
        // fields from k on after one was written, each behind a comma.
        let mut first: Option<String> = None;
        let mut rest = String::new();
        let mut all_optional = true;
        for (position, (key, field)) in fields.iter().enumerate().rev() {
            let value = self.value(field, &format!("{name}_{position}"));
            let item = format!("{} {value}", lark_string(&format!("{key}:")));
            let is_required = required.contains(&key.as_str());
            let first_body = match (&first, is_required) {
                (Some(next), false) => format!("{item} {rest} | {next}"),
                _ => format!("{item} {rest}"),
            };
            let rest_body = match is_required {
                true => format!("\",\" {item} {rest}"),
                false => format!("(\",\" {item})? {rest}"),
            };
            let (first_rule, rest_rule) = (
                format!("{name}_first_{position}"),
                format!("{name}_rest_{position}"),
            );
            self.rules.push_str(&format!(
                "{first_rule}: {}\n{rest_rule}: {}\n",
                first_body.trim_end(),
                rest_body.trim_end()
            ));
            all_optional &= !is_required;
            first = Some(first_rule);
            rest = rest_rule;
        }
        match first {
            None => "\"{\" \"}\"".to_owned(),
            Some(first) if all_optional => format!("\"{{\" {first}? \"}}\""),
            Some(first) => format!("\"{{\" {first} \"}}\""),
        }
    }

    /// `[value,...]` of the `items` schema, non-empty when `minItems` asks for an item.
    fn array(&mut self, schema: &Value, name: &str) -> String {
        let items = schema.get("items").cloned().unwrap_or(Value::Null);
        let item = match items {
            Value::Object(_) => self.value(&items, &format!("{name}_item")),
            _ => "any_value".to_owned(),
        };
        let listed = format!("{item} (\",\" {item})*");
        match schema.get("minItems").and_then(Value::as_u64) {
            Some(min) if min > 0 => format!("\"[\" {listed} \"]\""),
            _ => format!("\"[\" ({listed})? \"]\""),
        }
    }

    /// A string: one of an `enum`'s or a `const`'s, or free within the length bounds.
    fn string(&mut self, schema: &Value) -> String {
        let choices: Vec<String> = match (schema.get("enum"), schema.get("const")) {
            (Some(Value::Array(values)), _) => values
                .iter()
                .filter_map(Value::as_str)
                .map(lark_string)
                .collect(),
            (_, Some(Value::String(value))) => vec![lark_string(value)],
            _ => Vec::new(),
        };
        let quote = self.quote_rule();
        if !choices.is_empty() {
            return format!("{quote} ({}) {quote}", choices.join(" | "));
        }
        let bound = |key: &str| schema.get(key).and_then(Value::as_u64);
        self.strings += 1;
        let terminal = format!("STRING_{}", self.strings);
        self.free_string(&terminal, bound("minLength"), bound("maxLength"))
    }

    /// A free string and its quotes; its token rule `terminal` joins the rules. As text, the
    /// closing quote is lexed with the string (llguidance lexes greedily), which holds it
    /// exactly once, at its end; as a token, the string is text without the quote's text.
    fn free_string(&mut self, terminal: &str, min: Option<u64>, max: Option<u64>) -> String {
        let length = match (min, max) {
            (None, None) => "*".to_owned(),
            (min, None) => format!("{{{},}}", min.unwrap_or(0)),
            (min, Some(max)) => format!("{{{},{max}}}", min.unwrap_or(0)),
        };
        let quote = regex_escape(QUOTE);
        let (rule, value) = match self.quote {
            Some(id) => (
                format!("{terminal}: /[\\s\\S]{length}/ & ~/[\\s\\S]*{quote}[\\s\\S]*/\n"),
                format!("<[{id}]> {terminal} <[{id}]>"),
            ),
            None => (
                format!(
                    "{terminal}: /[\\s\\S]{length}{quote}/ & ~/[\\s\\S]*{quote}[\\s\\S]*{quote}[\\s\\S]*/\n"
                ),
                format!("{} {terminal}", lark_string(QUOTE)),
            ),
        };
        self.rules.push_str(&rule);
        value
    }

    /// The quote as a grammar piece: its token, or its text.
    fn quote_rule(&self) -> String {
        match self.quote {
            Some(id) => format!("<[{id}]>"),
            None => lark_string(QUOTE),
        }
    }
}

#[cfg(test)]
#[path = "gemma_tests.rs"]
mod tests;
