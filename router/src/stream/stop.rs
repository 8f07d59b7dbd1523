//! Stop strings: matched on text, across token boundaries, never emitted. Matching is
//! incremental: each stop string keeps a Knuth–Morris–Pratt state across pushes, so a push
//! costs its own bytes times the number of stop strings, however long the text grows.

/// What the matcher lets through after a piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text safe to emit; the rest is held back because it may begin a stop string.
    Continue(String),
    /// A stop string matched: this is the text before it, and generation must end.
    Stopped(String),
}

/// One stop string and how much of it the text seen so far ends with.
#[derive(Debug)]
struct StopString {
    bytes: Vec<u8>,
    /// `fallback[i]`: the longest proper prefix of `bytes[..=i]` that is also its suffix.
    fallback: Vec<usize>,
    /// Bytes of `bytes` the text pushed so far ends with (always less than its length).
    matched: usize,
}

impl StopString {
    fn new(stop: &str) -> Self {
        let bytes = stop.as_bytes().to_vec();
        let mut fallback = vec![0; bytes.len()];
        let mut length = 0;
        for index in 1..bytes.len() {
            while length > 0 && bytes[index] != bytes[length] {
                length = fallback[length - 1];
            }
            if bytes[index] == bytes[length] {
                length += 1;
            }
            fallback[index] = length;
        }
        Self {
            bytes,
            fallback,
            matched: 0,
        }
    }

    /// Advances over `byte`; true when the whole stop string has just been seen.
    fn advance(&mut self, byte: u8) -> bool {
        while self.matched > 0 && self.bytes[self.matched] != byte {
            self.matched = self.fallback[self.matched - 1];
        }
        if self.bytes[self.matched] == byte {
            self.matched += 1;
        }
        if self.matched == self.bytes.len() {
            self.matched = self.fallback[self.matched - 1];
            return true;
        }
        false
    }
}

/// Holds back text that could still turn into a stop string.
///
/// Invariant: `pending` never contains a whole stop string, and it is exactly the longest
/// suffix of the text seen so far that some stop string begins with: every byte released
/// cannot be part of a future match. A stop string starts with a UTF-8 lead byte, so the
/// held-back suffix starts on a character boundary.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<StopString>,
    pending: String,
    /// The stop string that ended the text, once one has.
    matched: Option<String>,
}

impl StopMatcher {
    /// A matcher for `stops` (all non-empty).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.iter().map(|stop| StopString::new(stop)).collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// Feeds newly decoded text. When stop strings match inside it, the earliest-starting
    /// match wins.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        let offset = self.pending.len();
        self.pending.push_str(text);
        let mut earliest_match: Option<(usize, usize)> = None;
        for (index, &byte) in text.as_bytes().iter().enumerate() {
            for (stop_index, stop) in self.stops.iter_mut().enumerate() {
                if stop.advance(byte) {
                    let start = offset + index + 1 - stop.bytes.len();
                    if earliest_match.is_none_or(|(earliest, _)| start < earliest) {
                        earliest_match = Some((start, stop_index));
                    }
                }
            }
        }
        if let Some((start, stop_index)) = earliest_match {
            let before = self.pending[..start].to_owned();
            self.pending.clear();
            let stop = &self.stops[stop_index].bytes;
            self.matched = Some(String::from_utf8_lossy(stop).into_owned());
            return StopOutcome::Stopped(before);
        }
        let held = self
            .stops
            .iter()
            .map(|stop| stop.matched)
            .max()
            .unwrap_or(0);
        let released = self.pending[..self.pending.len() - held].to_owned();
        self.pending.drain(..self.pending.len() - held);
        StopOutcome::Continue(released)
    }

    /// The stop string that ended the text, once `push` returned `Stopped`.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Releases held-back text once generation ended for another reason.
    pub fn flush(&mut self) -> String {
        for stop in &mut self.stops {
            stop.matched = 0;
        }
        std::mem::take(&mut self.pending)
    }
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
    fn earliest_of_several_stop_strings_wins_and_is_reported() {
        let mut m = matcher(&["world", "o w"]);
        assert_eq!(m.matched(), None);
        assert_eq!(
            m.push("hello world"),
            StopOutcome::Stopped("hell".to_owned())
        );
        assert_eq!(m.matched(), Some("o w"));
    }

    #[test]
    fn flush_returns_held_back_text() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("go ST"), cont("go "));
        assert_eq!(m.flush(), "ST");
    }

    #[test]
    fn a_match_starting_in_held_back_text_cuts_there() {
        let mut m = matcher(&["abcd", "bc"]);
        assert_eq!(m.push("xa"), cont("x"));
        assert_eq!(m.push("bcd"), StopOutcome::Stopped(String::new()));
        assert_eq!(m.matched(), Some("abcd"));
    }

    #[test]
    fn overlapping_prefixes_are_held_and_matched() {
        let mut m = matcher(&["aab"]);
        assert_eq!(m.push("a"), cont(""));
        assert_eq!(m.push("a"), cont(""));
        assert_eq!(m.push("a"), cont("a"));
        assert_eq!(m.push("b!"), StopOutcome::Stopped(String::new()));
    }

    #[test]
    fn a_flushed_matcher_starts_matching_afresh() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("EN"), cont(""));
        assert_eq!(m.flush(), "EN");
        assert_eq!(m.push("D"), cont("D"));
    }

    /// Each push costs its own bytes: a long stop string that keeps almost matching, fed a
    /// byte at a time, is matched in linear time (a rescan of the held-back text per push
    /// would take minutes here).
    #[test]
    fn a_long_almost_matching_stop_string_is_matched_in_linear_time() {
        let stop = format!("{}b", "a".repeat(20_000));
        let mut m = StopMatcher::new(vec![stop.clone(), stop.replace('b', "c")]);
        let started = std::time::Instant::now();
        for pushed in 0..40_000 {
            let released = if pushed < 20_000 { "" } else { "a" };
            assert_eq!(m.push("a"), cont(released));
        }
        assert_eq!(m.push("b"), StopOutcome::Stopped(String::new()));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    proptest::proptest! {
        /// Pushing text in any pieces stops in the first piece that completes a stop string, at
        /// the earliest start among the matches seen so far, and emits everything before it.
        #[test]
        fn pieces_stop_where_the_whole_text_does(
            text in "[ab\\n]{0,40}",
            stops in proptest::collection::vec("[ab\\n]{1,4}", 1..3),
            cuts in proptest::collection::vec(0usize..40, 0..8),
        ) {
            let mut m = StopMatcher::new(stops.clone());
            let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| c < text.len()).collect();
            bounds.extend([0, text.len()]);
            bounds.sort_unstable();
            bounds.dedup();
            let mut emitted = String::new();
            let mut stopped = None;
            for piece in bounds.windows(2).map(|w| &text[w[0]..w[1]]) {
                match m.push(piece) {
                    StopOutcome::Continue(out) => emitted.push_str(&out),
                    StopOutcome::Stopped(out) => {
                        emitted.push_str(&out);
                        stopped = Some(emitted.clone());
                        break;
                    }
                }
            }
            let expected = bounds[1..].iter().find_map(|&end| {
                let seen = &text[..end];
                let start = stops.iter().filter_map(|stop| seen.find(stop.as_str())).min()?;
                Some(text[..start].to_owned())
            });
            if expected.is_none() {
                emitted.push_str(&m.flush());
                proptest::prop_assert_eq!(&emitted, &text);
            }
            proptest::prop_assert_eq!(stopped, expected);
        }
    }

    #[test]
    fn multi_byte_stop_strings_hold_back_on_character_boundaries() {
        let mut m = matcher(&["éé"]);
        assert_eq!(m.push("aé"), cont("a"));
        assert_eq!(m.push("é"), StopOutcome::Stopped(String::new()));
    }
}
