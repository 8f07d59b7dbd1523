//! Reasoning output kept apart from the answer: which markers a model's family uses
//! (`parser.rs`), where a generation starts relative to them (`ReasoningStart`), the streaming
//! splitter that turns text deltas into reasoning and answer deltas (`splitter.rs`), what a
//! request asks of the reasoning (`request.rs`), and the grammar that bounds it and exempts it
//! from the answer's grammar (`grammar.rs`).
//!
//! The splitter sits in front of tool-call parsing: reasoning is split off first, and only the
//! answer text goes on to `tools`.

mod grammar;
mod parser;
mod request;
mod splitter;

pub use grammar::{answer_rule, reasoning_grammar, MarkerTokens};
pub use parser::{ReasoningParser, ReasoningParserFlag, ReasoningStart};
pub use request::{ReasoningEffort, ReasoningRequest};
pub use splitter::{ReasoningSplitter, Split};
