//! Splits a generation's text deltas into reasoning and answer, incrementally.
//!
//! Each delta is looked at once, together with at most one marker's length of held-back
//! text, so the work is linear in the output however the deltas are cut (one token, several
//! accepted drafts, a marker split over tokens).

use super::parser::{ReasoningParser, ReasoningStart};
use crate::harmony::HarmonyChannels;

/// What one delta (or the end of the output) releases.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub answer: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before anything but blanks: waiting to see whether the output opens reasoning.
    Opening {
        reasoning_by_default: bool,
    },
    /// Reasoning whose leading blanks are still dropped.
    ReasoningBlanks,
    Reasoning,
    /// Answer whose leading blanks are still dropped (the blanks after the end marker).
    AnswerBlanks,
    Answer,
}

/// One choice's splitter. Invariant: `held` is only ever a proper prefix of the opening marker
/// (while `Opening`) or of the end marker (while `Reasoning`); it is empty in every other phase.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    parser: ReasoningParser,
    phase: Phase,
    held: String,
    reasoning_tokens: usize,
    /// Harmony's channels, which replace the marker phases for that format.
    harmony: Option<HarmonyChannels>,
}

impl ReasoningSplitter {
    pub fn new(parser: ReasoningParser, start: ReasoningStart) -> Self {
        let phase = match start {
            ReasoningStart::Inside => Phase::ReasoningBlanks,
            ReasoningStart::Closed => Phase::Answer,
            ReasoningStart::Undecided {
                reasoning_by_default,
            } => Phase::Opening {
                reasoning_by_default,
            },
        };
        Self {
            parser,
            phase,
            held: String::new(),
            reasoning_tokens: 0,
            harmony: (parser == ReasoningParser::Harmony).then(HarmonyChannels::new),
        }
    }

    /// Tokens pushed while the output was (or might still be) reasoning, markers included.
    pub fn reasoning_tokens(&self) -> usize {
        if let Some(harmony) = &self.harmony {
            return harmony.reasoning_tokens();
        }
        self.reasoning_tokens
    }

    /// Whether the reasoning is over (or never started): what follows is all answer.
    fn answering(&self) -> bool {
        matches!(self.phase, Phase::Answer | Phase::AnswerBlanks)
    }

    /// Splits one token's text (or several tokens' at once).
    pub fn push(&mut self, text: &str) -> Split {
        if let Some(harmony) = &mut self.harmony {
            let (reasoning, answer) = harmony.push(text);
            return Split { reasoning, answer };
        }
        if !self.answering() && !self.opens_as_answer(text) {
            self.reasoning_tokens += 1;
        }
        let mut split = Split::default();
        let mut text = std::mem::take(&mut self.held) + text;
        loop {
            match self.step(&text, &mut split) {
                Some(rest) => text = rest,
                None => return split,
            }
        }
    }

    /// Releases what was held back once the output has ended.
    pub fn finish(&mut self) -> Split {
        if let Some(harmony) = &mut self.harmony {
            let (reasoning, answer) = harmony.finish();
            return Split { reasoning, answer };
        }
        let held = std::mem::take(&mut self.held);
        let mut split = Split::default();
        match self.phase {
            Phase::Opening {
                reasoning_by_default: true,
            }
            | Phase::ReasoningBlanks
            | Phase::Reasoning => split.reasoning = held.trim_start().to_owned(),
            Phase::Opening { .. } | Phase::AnswerBlanks | Phase::Answer => {
                split.answer = held.trim_start().to_owned();
            }
        }
        split
    }

    /// Whether `text`, the first non-blank text of an `Opening` output, decides for the answer.
    fn opens_as_answer(&self, text: &str) -> bool {
        let Phase::Opening {
            reasoning_by_default: false,
        } = self.phase
        else {
            return false;
        };
        let seen = format!("{}{text}", self.held);
        let seen = seen.trim_start();
        let marker = self.parser.start_marker();
        !seen.is_empty() && !seen.starts_with(marker) && !marker.starts_with(seen)
    }

    /// Consumes `text` in the current phase; returns the part left for the next phase.
    fn step(&mut self, text: &str, split: &mut Split) -> Option<String> {
        match self.phase {
            Phase::Opening {
                reasoning_by_default,
            } => {
                let marker = self.parser.start_marker();
                let seen = text.trim_start();
                if let Some(rest) = seen.strip_prefix(marker) {
                    self.phase = Phase::ReasoningBlanks;
                    return Some(rest.to_owned());
                }
                if seen.is_empty() || marker.starts_with(seen) {
                    // Leading blanks are dropped either way, so only the marker's prefix is held.
                    self.held = seen.to_owned();
                    return None;
                }
                self.phase = match reasoning_by_default {
                    true => Phase::ReasoningBlanks,
                    false => Phase::AnswerBlanks,
                };
                Some(text.to_owned())
            }
            Phase::ReasoningBlanks | Phase::AnswerBlanks => {
                let rest = text.trim_start();
                if rest.is_empty() {
                    return None;
                }
                self.phase = match self.phase {
                    Phase::ReasoningBlanks => Phase::Reasoning,
                    _ => Phase::Answer,
                };
                Some(rest.to_owned())
            }
            Phase::Reasoning => {
                let marker = self.parser.end_marker();
                if let Some(at) = text.find(marker) {
                    split.reasoning.push_str(&text[..at]);
                    self.phase = Phase::AnswerBlanks;
                    return Some(text[at + marker.len()..].to_owned());
                }
                let keep = partial_marker_len(text, marker);
                split.reasoning.push_str(&text[..text.len() - keep]);
                self.held = text[text.len() - keep..].to_owned();
                None
            }
            Phase::Answer => {
                split.answer.push_str(text);
                None
            }
        }
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `marker` (the part that
/// may still become the marker).
fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&len| text.is_char_boundary(text.len() - len) && text.ends_with(&marker[..len]))
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "splitter_tests.rs"]
mod tests;
