//! Splits harmony output into reasoning (the `analysis` channel) and an answer stream: the
//! `final` channel's text as it is, and each call as `<|channel|>commentary
//! to=functions.NAME<|message|>ARGUMENTS<|call|>` whatever header spelling the model chose
//! (`answer.rs` reads that stream).
//!
//! Each delta is scanned once together with at most a marker's length of held-back text, so
//! the work is linear in the output however it is cut into deltas; a header is held whole
//! until its `<|message|>`, and is bounded.

use super::{
    first_marker, partial_marker_len, CALL, CHANNEL, END, FUNCTIONS, MESSAGE, RETURN, START,
};

/// A header longer than this without `<|message|>` is not a header: its text is the answer.
const MAX_HEADER_BYTES: usize = 256;

/// Markers that end a body: the end markers, and the openings of a next header the model
/// wrote without ending the body.
const BODY_ENDS: [&str; 5] = [END, CALL, RETURN, START, CHANNEL];

/// What a message's body is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Answer,
    /// A call of the function `name`; its body is the arguments.
    Call,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Collecting a header (role, channel, recipient) until `<|message|>`.
    Header(String),
    /// In a body; `held` is a tail that may begin a marker.
    Body { body: Body, held: String },
}

/// One choice's harmony splitter.
#[derive(Debug, Clone)]
pub struct HarmonyChannels {
    phase: Phase,
    reasoning_tokens: usize,
}

impl Default for HarmonyChannels {
    fn default() -> Self {
        Self::new()
    }
}

impl HarmonyChannels {
    /// A splitter for output that follows the generation prompt's `<|start|>assistant`.
    pub fn new() -> Self {
        Self {
            phase: Phase::Header(String::new()),
            reasoning_tokens: 0,
        }
    }

    /// Tokens pushed while the output was reasoning (or a header that turned out to open it).
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// Splits one token's text (or several tokens' at once) into (reasoning, answer).
    pub fn push(&mut self, text: &str) -> (String, String) {
        let was_reasoning = self.in_reasoning();
        let mut reasoning = String::new();
        let mut answer = String::new();
        let mut rest = text.to_owned();
        while let Some(next) = self.step(rest, &mut reasoning, &mut answer) {
            rest = next;
        }
        if was_reasoning || self.in_reasoning() || !reasoning.is_empty() {
            self.reasoning_tokens += 1;
        }
        (reasoning, answer)
    }

    /// Releases what was held back once the output has ended: a body's tail, or text that
    /// never became a header.
    pub fn finish(&mut self) -> (String, String) {
        let phase = std::mem::replace(&mut self.phase, Phase::Header(String::new()));
        match phase {
            Phase::Header(text) if text.contains("<|") => (String::new(), String::new()),
            Phase::Header(text) => (String::new(), text),
            Phase::Body {
                body: Body::Reasoning,
                held,
            } => (held, String::new()),
            Phase::Body { held, .. } => (String::new(), held),
        }
    }

    fn in_reasoning(&self) -> bool {
        matches!(
            self.phase,
            Phase::Body {
                body: Body::Reasoning,
                ..
            }
        )
    }

    /// Consumes `text` in the current phase; returns what is left for the next phase.
    fn step(
        &mut self,
        text: String,
        reasoning: &mut String,
        answer: &mut String,
    ) -> Option<String> {
        match &mut self.phase {
            Phase::Header(header) => {
                header.push_str(&text);
                if let Some(at) = header.find(MESSAGE) {
                    let rest = header.split_off(at + MESSAGE.len());
                    let (body, opening) = read_header(&header[..at]);
                    answer.push_str(&opening);
                    self.phase = Phase::Body {
                        body,
                        held: String::new(),
                    };
                    return Some(rest).filter(|rest| !rest.is_empty());
                }
                if header.len() > MAX_HEADER_BYTES {
                    let text = std::mem::take(header);
                    self.phase = Phase::Body {
                        body: Body::Answer,
                        held: String::new(),
                    };
                    return Some(text);
                }
                None
            }
            Phase::Body { body, held } => {
                let mut text = std::mem::take(held) + &text;
                let out = match body {
                    Body::Reasoning => reasoning,
                    Body::Answer | Body::Call => answer,
                };
                match first_marker(&text, &BODY_ENDS) {
                    Some((at, marker)) => {
                        out.push_str(&text[..at]);
                        if *body == Body::Call {
                            out.push_str(CALL);
                        }
                        let next = match marker {
                            START | CHANNEL => text.split_off(at),
                            _ => text.split_off(at + marker.len()),
                        };
                        self.phase = Phase::Header(String::new());
                        Some(next).filter(|next| !next.is_empty())
                    }
                    None => {
                        let keep = partial_marker_len(&text, &BODY_ENDS);
                        *held = text.split_off(text.len() - keep);
                        out.push_str(&text);
                        None
                    }
                }
            }
        }
    }
}

/// What a header opens, and the text it puts in the answer stream (a call's normalized
/// header). The channel is the word after `<|channel|>`; a `to=functions.NAME` anywhere in
/// the header makes the message a call (the role part and the channel part may carry it).
fn read_header(header: &str) -> (Body, String) {
    let recipient = header
        .split("to=")
        .nth(1)
        .map(word)
        .and_then(|to| to.strip_prefix(FUNCTIONS));
    if let Some(name) = recipient {
        return (
            Body::Call,
            format!("{CHANNEL}commentary to={FUNCTIONS}{name}{MESSAGE}"),
        );
    }
    let channel = header.split(CHANNEL).nth(1).map(word);
    match channel {
        Some("analysis") => (Body::Reasoning, String::new()),
        _ => (Body::Answer, String::new()),
    }
}

/// The leading word of `text`: up to a blank or the next marker.
fn word(text: &str) -> &str {
    let end = text
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(text.len());
    &text[..end]
}

#[cfg(test)]
#[path = "channels_tests.rs"]
mod tests;
