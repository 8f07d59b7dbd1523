//! The grammar that holds a model to its family's call syntax: names only from the declared
//! tools, arguments valid under each tool's schema, and (with `auto`) free text until the
//! family's trigger.
//!
//! Every call object is written `{"name": "<name>", "<arguments key>": <arguments>}` with
//! the router's JSON layout (`", "` and `": "`), which is the layout each family's template
//! renders history in, so the parsers (`output.rs`) can rely on it.

use serde_json::{json, Value};

use super::format::{ToolFamily, ToolFormat, HERMES_CLOSING, HERMES_TRIGGER, MISTRAL_TRIGGER};
use super::gemma::gemma_grammar;
use super::lark::{lark_string, marker, repeated, text_then};
use super::plan::{ToolChoice, ToolPlan};
use super::xml_grammar::xml_grammar;
use crate::harmony::{tool_tail, CallTool};
use crate::scheduler::Grammar;
use crate::validation::{with_json_layout, RequestedGrammar, TOOLS_PARAM};

/// Plain text that cannot start with `{`, `[` or a blank, so the first character decides
/// between an answer and calls (families whose calls open the output).
const OPENING_TEXT: &str = "TEXT: /[^{\\[\\s][\\s\\S]*/";

impl ToolPlan {
    /// The grammar the output must follow; `None` when the model may not call tools.
    pub fn grammar(&self) -> Option<RequestedGrammar> {
        match (&self.choice, self.format.family) {
            (ToolChoice::None, _) => None,
            (_, ToolFamily::Tandem) => Some(tandem_grammar(self)),
            (_, ToolFamily::Harmony) => Some(harmony_grammar(self)),
            (_, ToolFamily::Gemma4) => Some(gemma_grammar(self)),
            (_, family) => Some(match (family.section(), family.xml_syntax()) {
                (Some(syntax), _) => syntax.grammar(self, self.format.section_tokens),
                (None, Some(syntax)) => xml_grammar(self, syntax),
                (None, None) => native_grammar(self),
            }),
        }
    }
}

/// Tandem's calls document, `{"tool_calls": [...]}`: one call, or several when parallel
/// calls are allowed.
fn calls_schema(plan: &ToolPlan) -> Value {
    let variants: Vec<Value> = plan
        .callable()
        .map(|tool| {
            json!({
                "type": "object",
                "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut calls = json!({"type": "array", "items": {"anyOf": variants}, "minItems": 1});
    if !plan.allows_several() {
        calls["maxItems"] = json!(1);
    }
    json!({"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"], "additionalProperties": false})
}

/// The calls document, or with `auto` plain text not starting with `{` or a blank (so the
/// first character decides).
fn tandem_grammar(plan: &ToolPlan) -> RequestedGrammar {
    if plan.choice != ToolChoice::Auto {
        return RequestedGrammar::json_schema(calls_schema(plan), TOOLS_PARAM);
    }
    let schema = with_json_layout(calls_schema(plan));
    let lark = format!(
        "start: calls | text\ncalls: %json {schema}\ntext: TEXT\nTEXT: /[^{{\\s][\\s\\S]*/\n"
    );
    RequestedGrammar {
        grammar: Grammar::Lark(lark),
        param: TOOLS_PARAM,
    }
}

/// Harmony's calls, from the channel header on: the validator puts the analysis message in
/// front of it (`crate::harmony::harmony_grammar`).
fn harmony_grammar(plan: &ToolPlan) -> RequestedGrammar {
    let tools: Vec<CallTool> = plan
        .callable()
        .map(|tool| CallTool {
            name: tool.name.clone(),
            schema: with_json_layout(object_schema(&tool.parameters)).to_string(),
        })
        .collect();
    RequestedGrammar {
        grammar: Grammar::Lark(tool_tail(&tools, plan.choice == ToolChoice::Auto)),
        param: TOOLS_PARAM,
    }
}

/// The grammar a native family's calls follow.
fn native_grammar(plan: &ToolPlan) -> RequestedGrammar {
    let one = plan.call_alternatives();
    let start = match (&plan.choice, plan.format.family) {
        (ToolChoice::Auto, ToolFamily::Hermes) => hermes_auto(plan, &one),
        (_, ToolFamily::Hermes) => format!("start: {}\n", hermes_calls(plan, &one)),
        (ToolChoice::Auto, _) => format!(
            "start: calls | TEXT\n{OPENING_TEXT}\ncalls: {}\n",
            opening_calls(plan, plan.format, &one)
        ),
        _ => format!("start: {}\n", opening_calls(plan, plan.format, &one)),
    };
    let rules = call_rules(plan, plan.format.family);
    RequestedGrammar {
        grammar: Grammar::Lark(format!("{start}{rules}")),
        param: TOOLS_PARAM,
    }
}

/// Calls that open the output: Llama's objects separated by `"; "`, or Mistral's trigger
/// and a JSON list of them.
fn opening_calls(plan: &ToolPlan, format: ToolFormat, one: &str) -> String {
    let several = plan.allows_several();
    if format.family == ToolFamily::Llama3Json {
        return repeated(one, "\"; \"", several);
    }
    let trigger = match format.trigger_token {
        // Mistral's trigger token decodes to no text: the token alone stands for it.
        Some(id) => format!("<[{id}]>"),
        None => lark_string(MISTRAL_TRIGGER),
    };
    let list = repeated(one, "\", \"", several);
    format!("{trigger} \" [\" {list} \"]\"")
}

/// One rule per callable tool: its fixed name and its schema's arguments.
fn call_rules(plan: &ToolPlan, family: ToolFamily) -> String {
    let key = family.arguments_key();
    plan.callable()
        .enumerate()
        .map(|(index, tool)| {
            let opening = lark_string(&format!("{{\"name\": {}, \"{key}\": ", json!(tool.name)));
            let schema = with_json_layout(object_schema(&tool.parameters));
            format!("call_{index}: {opening} %json {schema} \"}}\"\n")
        })
        .collect()
}

/// The arguments schema, held to an object as every family's calls carry one.
pub(super) fn object_schema(parameters: &Value) -> Value {
    let mut schema = parameters.clone();
    if let Value::Object(fields) = &mut schema {
        fields.entry("type").or_insert_with(|| json!("object"));
    }
    schema
}

/// `<tool_call>\n{...}\n</tool_call>`, one per call, separated by a newline.
fn hermes_calls(plan: &ToolPlan, one: &str) -> String {
    let wrapped = format!(
        "{} {}",
        marker(HERMES_TRIGGER, plan.format.trigger_token),
        hermes_rest(plan, one)
    );
    repeated(&wrapped, "\"\\n\"", plan.allows_several())
}

/// What follows a call's opening: `\n{...}\n</tool_call>`.
fn hermes_rest(plan: &ToolPlan, one: &str) -> String {
    let closing = marker(HERMES_CLOSING, plan.format.closing_token);
    format!("\"\\n\" {one} \"\\n\" {closing}")
}

/// Free text without the trigger, or text up to the first trigger followed by the rest of the
/// first call and any further calls.
fn hermes_auto(plan: &ToolPlan, one: &str) -> String {
    let more = match plan.allows_several() {
        true => format!(" (\"\\n\" {})*", hermes_calls(plan, one)),
        false => String::new(),
    };
    let rest = format!("{}{more}", hermes_rest(plan, one));
    text_then(HERMES_TRIGGER, plan.format.trigger_token, &rest)
}

#[cfg(test)]
#[path = "grammar_tests.rs"]
mod tests;
