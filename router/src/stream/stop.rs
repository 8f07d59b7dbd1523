//! Stop strings: matched on text, across token boundaries, never emitted.

/// What the matcher lets through after a piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text safe to emit; the rest is held back because it may begin a stop string.
    Continue(String),
    /// A stop string matched: this is the text before it, and generation must end.
    Stopped(String),
}

/// Holds back text that could still turn into a stop string.
///
/// Invariant: `pending` never contains a whole stop string, and every byte released
/// so far cannot be part of a future match (a match may only start inside `pending`).
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    /// A matcher for `stops` (all non-empty).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            pending: String::new(),
        }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.pending.push_str(text);
        let earliest_match = self
            .stops
            .iter()
            .filter_map(|stop| self.pending.find(stop.as_str()))
            .min();
        if let Some(start) = earliest_match {
            let before = self.pending[..start].to_owned();
            self.pending.clear();
            return StopOutcome::Stopped(before);
        }
        let held = self
            .stops
            .iter()
            .map(|stop| longest_suffix_prefix(&self.pending, stop))
            .max()
            .unwrap_or(0);
        let released = self.pending[..self.pending.len() - held].to_owned();
        self.pending.drain(..self.pending.len() - held);
        StopOutcome::Continue(released)
    }

    /// Releases held-back text once generation ended for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Length in bytes of the longest proper prefix of `stop` that `text` ends with.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    stop.char_indices()
        .map(|(index, _)| index)
        .skip(1)
        .filter(|&len| text.ends_with(&stop[..len]))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| (*s).to_owned()).collect())
    }

    fn cont(text: &str) -> StopOutcome {
        StopOutcome::Continue(text.to_owned())
    }

    #[test]
    fn without_stop_strings_text_passes_through() {
        assert_eq!(matcher(&[]).push("abc"), cont("abc"));
    }

    #[test]
    fn stop_string_split_across_tokens_is_cut_and_not_emitted() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("done E"), cont("done "));
        assert_eq!(m.push("N"), cont(""));
        assert_eq!(m.push("D and more"), StopOutcome::Stopped(String::new()));
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("E"), cont(""));
        assert_eq!(m.push("NX"), cont("ENX"));
    }

    #[test]
    fn text_before_a_match_inside_one_token_is_emitted() {
        let mut m = matcher(&["\n\n"]);
        assert_eq!(
            m.push("line\n\nnext"),
            StopOutcome::Stopped("line".to_owned())
        );
    }

    #[test]
    fn earliest_of_several_stop_strings_wins() {
        let mut m = matcher(&["world", "o w"]);
        assert_eq!(
            m.push("hello world"),
            StopOutcome::Stopped("hell".to_owned())
        );
    }

    #[test]
    fn flush_returns_held_back_text() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("go ST"), cont("go "));
        assert_eq!(m.flush(), "ST");
    }

    #[test]
    fn multi_byte_stop_strings_hold_back_on_character_boundaries() {
        let mut m = matcher(&["éé"]);
        assert_eq!(m.push("aé"), cont("a"));
        assert_eq!(m.push("é"), StopOutcome::Stopped(String::new()));
    }
}
