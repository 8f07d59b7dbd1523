//! The grammar of the XML-style call syntaxes: each call names a declared tool and writes its
//! parameters in the schema's property order (every required one, optional ones at will),
//! each value held to its parameter's schema: raw strings by length and enumeration, other
//! values as JSON under the parameter's schema.
//!
//! llguidance lexes greedily with one byte of look-ahead, so a free raw string is lexed
//! together with its closing marker as one token that holds the marker exactly once, at its
//! end: the value can then always be closed, and never closed early.

use serde_json::Value;

use super::lark::{lark_string, marker, regex_escape, repeated, text_then};
use super::plan::{FunctionTool, ToolChoice, ToolPlan};
use super::xml_syntax::{properties, MarkerTokens, ValueKind, XmlSyntax};
use crate::scheduler::Grammar;
use crate::validation::{with_json_layout, RequestedGrammar};

/// The grammar `plan`'s output follows in `syntax`.
pub fn xml_grammar(plan: &ToolPlan, syntax: &XmlSyntax) -> RequestedGrammar {
    let writer = Writer {
        syntax,
        tokens: plan.format.marker_tokens,
        closing: plan.format.closing_token,
    };
    let bodies: Vec<String> = plan
        .callable()
        .enumerate()
        .map(|(index, tool)| writer.body_rule(index, tool))
        .collect();
    let alternatives = (0..bodies.len())
        .map(|index| format!("body_{index}"))
        .collect::<Vec<_>>()
        .join(" | ");
    let trigger = marker(syntax.opening, plan.format.trigger_token);
    let calls = repeated("call", "\"\\n\"", plan.allows_several());
    let (before, after) = match syntax.block {
        Some([open, close]) => (
            newlines_apart(open) + " ",
            format!(" {}", newlines_apart(close)),
        ),
        None => (String::new(), String::new()),
    };
    let start = match plan.choice {
        ToolChoice::Auto => auto_start(plan, syntax, &alternatives, &after),
        _ => format!("start: {before}{calls}{after}\n"),
    };
    let lark = format!(
        "{start}call: {trigger} ({alternatives})\n{}",
        bodies.concat()
    );
    RequestedGrammar {
        grammar: Grammar::Lark(lark),
        param: "tools",
    }
}

/// Free text without the trigger, or text up to the first trigger, the rest of that call (or
/// of the block's opening) and any further calls, then the block's end (`after`).
fn auto_start(plan: &ToolPlan, syntax: &XmlSyntax, alternatives: &str, after: &str) -> String {
    let several = plan.allows_several();
    let trigger = syntax.trigger();
    let (rest, token) = match syntax.block {
        Some([open, _]) => {
            let calls = repeated("call", "\"\\n\"", several);
            let opened = newlines_apart(&open[trigger.len()..]);
            (format!("{opened} {calls}{after}"), None)
        }
        None => {
            let more = if several { " (\"\\n\" call)*" } else { "" };
            (format!("({alternatives}){more}"), plan.format.trigger_token)
        }
    };
    text_then(trigger, token, &rest)
}

/// Writes one syntax's rules, its inner markers as text or as their tokens.
struct Writer<'a> {
    syntax: &'a XmlSyntax,
    tokens: MarkerTokens,
    /// `</tool_call>`'s token, when the tokenizer holds it as a visible one.
    closing: Option<u32>,
}

impl Writer<'_> {
    /// `body_<index>`: everything of a call to `tool` after the trigger, and its parameters' rules.
    fn body_rule(&self, index: usize, tool: &FunctionTool) -> String {
        let syntax = self.syntax;
        let required: Vec<&str> = tool
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut parameters = Vec::new();
        let mut rules = String::new();
        for (position, (key, schema)) in properties(&tool.parameters).enumerate() {
            let rule = format!("param_{index}_{position}");
            let optional = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            parameters.push(format!("{rule}{optional}"));
            let close = syntax.key_close_for(ValueKind::of_schema(schema));
            let name = self.text(&format!("{}{key}{close}", syntax.key_open));
            let value = self.value(&rule.to_uppercase(), schema, &mut rules);
            rules.push_str(&format!("{rule}: {name} {value}\n"));
        }
        let pieces = [
            self.text(syntax.name_open),
            self.text(&format!("{}{}", tool.name, syntax.name_close)),
            parameters.join(" "),
            self.text(syntax.call_close),
            marker(syntax.closing, self.closing),
        ];
        let body = pieces
            .into_iter()
            .filter(|piece| !piece.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        format!("body_{index}: {body}\n{rules}")
    }

    /// A value under `schema` and its closing marker; a free raw string adds its token rule
    /// `terminal` to `rules`.
    fn value(&self, terminal: &str, schema: &Value, rules: &mut String) -> String {
        let close = self.text(self.syntax.value_close);
        if ValueKind::of_schema(schema) == ValueKind::Json {
            let schema = with_json_layout(schema.clone());
            return format!("%json {schema} {close}");
        }
        let choices: Vec<String> = match (schema.get("enum"), schema.get("const")) {
            (Some(Value::Array(values)), _) => values
                .iter()
                .filter_map(Value::as_str)
                .map(lark_string)
                .collect(),
            (_, Some(Value::String(value))) => vec![lark_string(value)],
            _ => Vec::new(),
        };
        if !choices.is_empty() {
            return format!("({}) {close}", choices.join(" | "));
        }
        rules.push_str(&self.raw_string_terminal(terminal, schema));
        terminal.to_owned()
    }

    /// `TERMINAL`: a raw string within the schema's length bounds and its closing marker, which
    /// the token holds exactly once.
    fn raw_string_terminal(&self, terminal: &str, schema: &Value) -> String {
        let bound = |key: &str| schema.get(key).and_then(Value::as_u64);
        let length = match (bound("minLength"), bound("maxLength")) {
            (None, None) => "*".to_owned(),
            (min, None) => format!("{{{},}}", min.unwrap_or(0)),
            (min, Some(max)) => format!("{{{},{max}}}", min.unwrap_or(0)),
        };
        let close = regex_text(self.syntax.value_close);
        let tag = regex_text(self.syntax.value_close.trim());
        format!(
            "{terminal}: /[\\s\\S]{length}{close}/ & ~/[\\s\\S]*{tag}[\\s\\S]*{tag}[\\s\\S]*/\n"
        )
    }

    /// `text` as Lark: literal runs, and each inner marker the tokenizer holds as a token as
    /// the choice of its text or its token.
    fn text(&self, text: &str) -> String {
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let next = self
                .syntax
                .token_markers_with(self.tokens)
                .filter_map(|(marker, id)| rest.find(marker).map(|at| (at, marker, id)))
                .min_by_key(|(at, _, _)| *at);
            match next {
                Some((at, found, id)) => {
                    if at > 0 {
                        pieces.push(lark_string(&rest[..at]));
                    }
                    pieces.push(marker(found, Some(id)));
                    rest = &rest[at + found.len()..];
                }
                None => {
                    pieces.push(lark_string(rest));
                    rest = "";
                }
            }
        }
        pieces.join(" ")
    }
}

/// `text` as Lark literals with each newline its own: the calls' `"\n"` separator then never
/// starts a longer literal (the block's `\n</｜DSML｜function_calls>`), which greedy lexing
/// would hold to.
fn newlines_apart(text: &str) -> String {
    text.split_inclusive('\n')
        .flat_map(|line| match line.strip_suffix('\n') {
            Some(rest) => [rest, "\n"],
            None => [line, ""],
        })
        .filter(|piece| !piece.is_empty())
        .map(lark_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` as the inside of a Lark `/.../` token, newlines escaped.
fn regex_text(text: &str) -> String {
    regex_escape(text).replace('\n', "\\n")
}

#[cfg(test)]
#[path = "xml_grammar_tests.rs"]
mod tests;
