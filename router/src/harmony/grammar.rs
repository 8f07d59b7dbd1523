//! The grammar that holds a generation to harmony: an optional `analysis` message (free
//! text, bounded by a token budget when one is asked), then what the request allows after
//! it: a `final` message (free, or under the request's `response_format`), a call, or either.
//!
//! The markers are named as special tokens (`<|channel|>`), which the grammar engine resolves
//! in the vocabulary: gpt-oss's tokenizer holds each as one added token, and llguidance
//! matches added tokens only by name or id, never by their text. The analysis text is never
//! constrained by the request's grammar. The grammar ends where the end token (`<|return|>`,
//! `<|call|>`, which are EOS tokens) would come, so the engine's EOS handling ends it.

/// The `analysis` message a generation may write first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Analysis {
    /// Free reasoning, as long as the model likes.
    Free,
    /// At most this many tokens of reasoning (0: no analysis message at all).
    Budget(u32),
}

/// What follows the analysis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// A `final` message whose text follows `answer`, a Lark rule named `answer` (free text
    /// when `None`).
    Final(Option<String>),
    /// A complete Lark grammar written from the `final` channel header on (`tool_tail`).
    Grammar(String),
}

/// A function the model may call: its name and its arguments' JSON Schema as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallTool {
    pub name: String,
    pub schema: String,
}

/// The whole grammar: the analysis, then the tail.
pub fn harmony_grammar(analysis: Analysis, tail: &Tail) -> String {
    let start = match analysis {
        Analysis::Budget(0) => "start: tail",
        _ => "start: analysis? tail",
    };
    let tail_rules = match tail {
        Tail::Final(answer) => format!(
            "tail: <|channel|> \"final\" <|message|> answer\n{}\n",
            answer.as_deref().unwrap_or(FREE_ANSWER)
        ),
        Tail::Grammar(lark) => format!("tail: %lark {{\n{lark}\n}}\n"),
    };
    let reasoning = match analysis {
        Analysis::Free => "reasoning: REASONING?\nREASONING: /(?s:.+)/\n".to_owned(),
        // llguidance lets a `max_tokens=k` subgrammar after `<|message|>` take k - 1 tokens.
        Analysis::Budget(tokens) => format!(
            "reasoning[max_tokens={}]: %lark {{\n  start: TEXT?\n  TEXT: /(?s:.+)/\n}}\n",
            tokens.saturating_add(1)
        ),
    };
    format!(
        "{start}\nanalysis: <|channel|> \"analysis\" <|message|> reasoning <|end|> <|start|> \"assistant\"\n{reasoning}{tail_rules}"
    )
}

/// Free final text.
const FREE_ANSWER: &str = "answer: ANSWER?\nANSWER: /(?s:.+)/";

/// The calls part of a harmony generation, as a grammar of its own: one call of a declared
/// function with schema-valid arguments, or (when `auto`) a free `final` message instead.
/// A call ends the generation (`<|call|>` is an end token), so one output holds one call.
pub fn tool_tail(tools: &[CallTool], auto: bool) -> String {
    let names: Vec<String> = (0..tools.len())
        .map(|index| format!("call_{index}"))
        .collect();
    let start = if auto {
        "start: call | final\nfinal: <|channel|> \"final\" <|message|> ANSWER?\nANSWER: /(?s:.+)/\n"
            .to_owned()
    } else {
        "start: call\n".to_owned()
    };
    let mut lark = format!(
        "{start}call: <|channel|> \"commentary to=functions.\" ({})\n",
        names.join(" | ")
    );
    for (index, tool) in tools.iter().enumerate() {
        let name = serde_json::Value::String(format!("{} ", tool.name));
        lark.push_str(&format!(
            "call_{index}: {name} <|constrain|> \"json\" <|message|> %json {}\n",
            tool.schema
        ));
    }
    lark
}

#[cfg(test)]
#[path = "grammar_tests.rs"]
mod tests;
