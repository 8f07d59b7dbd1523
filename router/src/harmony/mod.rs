//! gpt-oss's harmony format: every message of the output is a header naming its channel
//! (and, for a call, its recipient), `<|message|>`, its body, and an end marker. The
//! `analysis` channel is reasoning, `final` is the answer, and a `commentary` message to
//! `functions.NAME` calls a tool with JSON arguments.
//!
//! `channels.rs` splits streamed output into reasoning and an answer stream in which each call
//! keeps a normalized header; `answer.rs` reads that stream into content and `tool_calls`
//! deltas; `grammar.rs` writes the grammar that holds the output to the format.

mod answer;
mod channels;
mod grammar;

pub use answer::HarmonyAnswer;
pub use channels::HarmonyChannels;
pub use grammar::{harmony_grammar, tool_tail, Analysis, CallTool, Tail};

/// Opens a message; the role (and possibly the recipient) follows.
pub const START: &str = "<|start|>";
/// Names the channel in a header.
pub const CHANNEL: &str = "<|channel|>";
/// Ends a header; the body follows.
pub const MESSAGE: &str = "<|message|>";
/// Ends a message the conversation goes on after.
pub const END: &str = "<|end|>";
/// Ends a call message; generation stops for the call's result.
pub const CALL: &str = "<|call|>";
/// Ends the final message and the generation.
pub const RETURN: &str = "<|return|>";
/// Announces the content type of a call's arguments (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";

/// The special tokens the harmony parsers read as text.
pub const MARKERS: [&str; 7] = [START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN];

/// The recipient prefix of a function call.
pub const FUNCTIONS: &str = "functions.";

/// Length of the longest suffix of `text` that is a proper prefix of one of `markers` (the
/// part that may still become a marker once more text comes).
pub(crate) fn partial_marker_len(text: &str, markers: &[&str]) -> usize {
    let Some(open) = text.rfind('<') else {
        return 0;
    };
    let tail = &text[open..];
    let partial = markers
        .iter()
        .any(|marker| marker.len() > tail.len() && marker.starts_with(tail));
    if partial {
        tail.len()
    } else {
        0
    }
}

/// The earliest of `markers` in `text`: its byte offset and the marker.
pub(crate) fn first_marker<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|marker| text.find(marker).map(|at| (at, *marker)))
        .min_by_key(|(at, _)| *at)
}
