//! Families whose calls sit in a section of marker tokens, each call a header then a JSON
//! arguments object: DeepSeek-V3.1 (`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>
//! {...}<｜tool▁call▁end｜><｜tool▁calls▁end｜>`) and Kimi K2 (`<|tool_calls_section_begin|>
//! <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>
//! <|tool_calls_section_end|>`), and the grammar that holds a model to that syntax.
//!
//! With `auto` the answer is free text until the section opens; the section then holds one
//! call, or several when parallel calls are allowed, and ends the output.

use tokenizers::Tokenizer;

use super::grammar::object_schema;
use super::lark::{lark_string, marker as lark_marker, text_then};
use super::plan::{ToolChoice, ToolPlan};
use crate::scheduler::Grammar;
use crate::validation::{with_json_layout, RequestedGrammar};

/// A sectioned family's markers, in the order they are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    SectionBegin,
    CallBegin,
    ArgumentsBegin,
    CallEnd,
    SectionEnd,
}

/// The markers and call header of one sectioned family.
#[derive(Debug, PartialEq, Eq)]
pub struct SectionSyntax {
    /// The markers, indexed by `Marker`.
    pub markers: [&'static str; 5],
    /// Text before the name in a call's header.
    pub name_prefix: &'static str,
    /// Whether the header ends with `:IDX`, the call's number in the conversation (Kimi's id).
    pub numbered: bool,
}

/// DeepSeek-V3.1's calls (the `deepseek_v31` parser).
pub const DEEPSEEK_V31: SectionSyntax = SectionSyntax {
    markers: [
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
    ],
    name_prefix: "",
    numbered: false,
};

/// Kimi K2's calls (the `kimi_k2` parser); the header `functions.NAME:IDX` is the call's id.
pub const KIMI_K2: SectionSyntax = SectionSyntax {
    markers: [
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
    ],
    name_prefix: "functions.",
    numbered: true,
};

/// The ids of a sectioned family's markers that the tokenizer holds as single tokens, indexed
/// by `Marker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SectionTokens(pub [Option<u32>; 5]);

impl SectionSyntax {
    /// The text of `marker`.
    pub fn marker(&self, marker: Marker) -> &'static str {
        self.markers[marker as usize]
    }

    /// The ids `tokenizer` holds for the markers.
    pub fn tokens(&self, tokenizer: &Tokenizer) -> SectionTokens {
        SectionTokens(self.markers.map(|marker| tokenizer.token_to_id(marker)))
    }

    /// A call header's function name and, for numbered families, the header as the call's id.
    /// `None` when the header is not in this family's shape.
    pub fn read_header<'a>(&self, header: &'a str) -> Option<(&'a str, Option<&'a str>)> {
        let named = header.strip_prefix(self.name_prefix)?;
        if !self.numbered {
            return Some((named, None));
        }
        let (name, index) = named.rsplit_once(':')?;
        let numbered = !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit());
        numbered.then_some((name, Some(header)))
    }

    /// The grammar `plan`'s output follows in this syntax.
    pub fn grammar(&self, plan: &ToolPlan, tokens: SectionTokens) -> RequestedGrammar {
        let marker = |marker: Marker| lark_marker(self.marker(marker), tokens.0[marker as usize]);
        let one = plan.call_alternatives();
        let calls = if plan.allows_several() {
            format!("{one}+")
        } else {
            one
        };
        let rest = format!("{calls} {}", marker(Marker::SectionEnd));
        let start = match plan.choice {
            ToolChoice::Auto => text_then(
                self.marker(Marker::SectionBegin),
                tokens.0[Marker::SectionBegin as usize],
                &rest,
            ),
            _ => format!("start: {} {rest}\n", marker(Marker::SectionBegin)),
        };
        let rules = self.call_rules(plan, tokens);
        RequestedGrammar {
            grammar: Grammar::Lark(format!("{start}{rules}")),
            param: "tools",
        }
    }

    /// One rule per callable tool: the call's markers, its fixed name (and Kimi's number) and
    /// its schema's arguments.
    fn call_rules(&self, plan: &ToolPlan, tokens: SectionTokens) -> String {
        let marker = |marker: Marker| lark_marker(self.marker(marker), tokens.0[marker as usize]);
        let number = if self.numbered {
            " \":\" /[0-9]{1,4}/"
        } else {
            ""
        };
        plan.callable()
            .enumerate()
            .map(|(index, tool)| {
                let header = lark_string(&format!("{}{}", self.name_prefix, tool.name));
                let schema = with_json_layout(object_schema(&tool.parameters));
                format!(
                    "call_{index}: {} {header}{number} {} %json {schema} {}\n",
                    marker(Marker::CallBegin),
                    marker(Marker::ArgumentsBegin),
                    marker(Marker::CallEnd)
                )
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "section_tests.rs"]
mod tests;
