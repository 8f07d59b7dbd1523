//! The grammar of a reasoning generation: the reasoning is free text (never constrained by the
//! request's `response_format` or tool grammar), at most `budget` tokens long, and the end
//! marker follows it; the request's grammar applies to the answer after the marker.
//!
//! llguidance lexes greedily with one byte of look-ahead, so the reasoning is lexed as runs
//! without `<` and short `<…` pieces that stop where they leave the end marker: the marker
//! itself is then always lexed as the marker. A `max_tokens` bound on the reasoning
//! subgrammar ends it after its tokens, and the grammar then allows only the marker.

use super::parser::{ReasoningParser, ReasoningStart};
use crate::scheduler::Grammar;

/// Blanks the model may put between the end marker and a constrained answer.
const MAX_BLANKS: usize = 4;

/// The ids of the markers that are one token of the vocabulary (of the start marker, its first
/// token: `ReasoningParser::start_token`). Such a token must be named
/// by id: llguidance treats a vocabulary's added tokens as special, so their text alone
/// never matches them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MarkerTokens {
    pub start: Option<u32>,
    pub end: Option<u32>,
}

/// The grammar a generation runs under, given where it starts, its reasoning `budget` and
/// the `answer` grammar it asked for; `None` when neither constrains anything.
pub fn reasoning_grammar(
    parser: ReasoningParser,
    start: ReasoningStart,
    budget: Option<u32>,
    answer: Option<&Grammar>,
    tokens: MarkerTokens,
) -> Option<Grammar> {
    if start == ReasoningStart::Closed || (budget.is_none() && answer.is_none()) {
        return answer.cloned();
    }
    let body = if budget == Some(0) { "" } else { "reasoning " };
    // A free answer takes blanks itself; a constrained one may not start with them.
    let blanks = if answer.is_some() { " BLANKS?" } else { "" };
    let thought = format!("{body}think_end{blanks}");
    let first = match start {
        ReasoningStart::Inside => format!("start: {thought} answer"),
        ReasoningStart::Undecided {
            reasoning_by_default: true,
        } => format!("start: think_open? {thought} answer"),
        // Asking for a budget asks for reasoning, so the model opens it.
        ReasoningStart::Undecided { .. } if budget.is_some() => {
            format!("start: think_open {thought} answer")
        }
        ReasoningStart::Undecided { .. } => {
            format!("start: think_open {thought} answer | answer")
        }
        ReasoningStart::Closed => unreachable!("handled above"),
    };
    let mut lark = [
        first,
        marker_rule(
            "think_open",
            parser.start_marker(),
            tokens.start,
            parser.start_token(),
        ),
        marker_rule(
            "think_end",
            parser.end_marker(),
            tokens.end,
            parser.end_marker(),
        ),
        format!("BLANKS: /[ \\t\\r\\n]{{1,{MAX_BLANKS}}}/"),
        answer_rule(answer),
    ]
    .join("\n");
    lark.push('\n');
    if budget != Some(0) {
        // llguidance lets a `max_tokens=k` subgrammar that the output may start with take
        // k + 1 tokens, and one that follows another lexeme k.
        let may_start_output = match start {
            ReasoningStart::Inside => true,
            ReasoningStart::Undecided {
                reasoning_by_default,
            } => reasoning_by_default,
            ReasoningStart::Closed => false,
        };
        let max_tokens = budget.map(|tokens| tokens - u32::from(may_start_output));
        lark.push_str(&reasoning_rule(parser.end_marker(), max_tokens));
    }
    Some(Grammar::Lark(lark))
}

/// A marker: its text, or its first token (whose text is `token_text`) and the rest of the text.
fn marker_rule(name: &str, marker: &str, token: Option<u32>, token_text: &str) -> String {
    match (token, marker.strip_prefix(token_text)) {
        (Some(id), Some("") | None) => format!("{name}: {marker:?} | <[{id}]>"),
        (Some(id), Some(rest)) => format!("{name}: {marker:?} | <[{id}]> {rest:?}"),
        (None, _) => format!("{name}: {marker:?}"),
    }
}

/// `answer`: the requested grammar nested as it is, or free text.
pub fn answer_rule(answer: Option<&Grammar>) -> String {
    match answer {
        None => "answer: /(?s:.*)/".to_owned(),
        Some(Grammar::JsonSchema(schema)) => format!("answer: %json {schema}"),
        Some(Grammar::Regex(regex)) => format!("answer: /{}/", escape_slashes(regex)),
        Some(Grammar::Lark(lark)) => format!("answer: %lark {{\n{lark}\n}}"),
    }
}

/// The reasoning subgrammar: text without the end marker, bounded by llguidance's
/// `max_tokens` when given.
fn reasoning_rule(end_marker: &str, max_tokens: Option<u32>) -> String {
    let bound = max_tokens.map_or(String::new(), |tokens| format!("[max_tokens={tokens}]"));
    format!(
        "reasoning{bound}: %lark {{\n  start: (TEXT | LT)*\n  TEXT: /[^<]+/\n  LT: /{}/\n}}\n",
        near_marker_regex(end_marker)
    )
}

/// Pieces that start with the marker's first character (`<`) and are not the marker: a proper
/// prefix of it, possibly followed by one character that leaves it (other than another `<`,
/// which starts the next piece).
fn near_marker_regex(marker: &str) -> String {
    let chars: Vec<char> = marker.chars().collect();
    let mut alternatives = Vec::new();
    for len in 1..chars.len() {
        let prefix: String = escape_regex(&chars[..len].iter().collect::<String>());
        let next = escape_regex(&chars[len].to_string());
        let first = escape_regex(&chars[0].to_string());
        alternatives.push(prefix.clone());
        alternatives.push(format!("{prefix}[^{next}{first}]"));
    }
    alternatives.join("|")
}

/// `text` as a regex matching itself, inside a Lark `/…/` literal.
fn escape_regex(text: &str) -> String {
    let mut escaped = String::new();
    for c in text.chars() {
        if "\\/.^$|?*+()[]{}-".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// `regex` inside a Lark `/…/` literal: its unescaped slashes escaped.
fn escape_slashes(regex: &str) -> String {
    let mut escaped = String::new();
    let mut after_backslash = false;
    for c in regex.chars() {
        if c == '/' && !after_backslash {
            escaped.push('\\');
        }
        after_backslash = c == '\\' && !after_backslash;
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
#[path = "grammar_tests.rs"]
mod tests;
