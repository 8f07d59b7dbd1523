//! Incremental detokenization that only releases complete UTF-8 characters.

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::Tokenizer;

/// Prompt tokens kept as decoding context, so the first generated token decodes with
/// the spacing it has in context (SentencePiece-style decoders strip a leading space).
const CONTEXT_TOKENS: usize = 5;

/// Special tokens released as their text: the markers a chat format's parser reads (harmony
/// channels, call sections), by id.
pub type MarkerTexts = Arc<HashMap<u32, String>>;

/// Decodes one request's tokens as they arrive.
///
/// Invariant: `ids[prefix_offset..read_offset]` decodes to exactly the text already
/// released after `ids[..prefix_offset]`'s text; every token after `read_offset` has not
/// produced text yet (it may be an incomplete character). Decoding skips special tokens, so
/// a marker in `ids` adds nothing to either side of that comparison.
#[derive(Debug)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    markers: MarkerTexts,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder whose context is the tail of `prompt_ids`; `markers` are released as text.
    pub fn new(tokenizer: Arc<Tokenizer>, prompt_ids: &[u32], markers: MarkerTexts) -> Self {
        let ids = prompt_ids[prompt_ids.len().saturating_sub(CONTEXT_TOKENS)..].to_vec();
        let read_offset = ids.len();
        Self {
            tokenizer,
            markers,
            ids,
            prefix_offset: 0,
            read_offset,
        }
    }

    /// Adds one token; returns the text it completes (empty while a character is split
    /// across tokens, and for special tokens other than markers).
    pub fn push(&mut self, id: u32) -> Result<String, tokenizers::Error> {
        if let Some(marker) = self.markers.get(&id).cloned() {
            // Text still pending before the marker is released first, so order holds.
            let pending = self.release_pending()?;
            self.ids.push(id);
            self.read_offset = self.ids.len();
            return Ok(pending + &marker);
        }
        self.ids.push(id);
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let full_text = self.decode(self.prefix_offset, self.ids.len())?;
        if full_text.len() <= prefix_text.len() || full_text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new_text = match full_text.strip_prefix(prefix_text.as_str()) {
            Some(rest) => rest.to_owned(),
            None => after_common_prefix(&prefix_text, &full_text).to_owned(),
        };
        self.ids.drain(..self.read_offset);
        self.prefix_offset = 0;
        self.read_offset = self.ids.len();
        Ok(new_text)
    }

    /// The text of tokens after `read_offset`, even an incomplete character (lossily).
    fn release_pending(&self) -> Result<String, tokenizers::Error> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let full_text = self.decode(self.prefix_offset, self.ids.len())?;
        Ok(after_common_prefix(&prefix_text, &full_text).to_owned())
    }

    fn decode(&self, start: usize, end: usize) -> Result<String, tokenizers::Error> {
        self.tokenizer.decode(&self.ids[start..end], true)
    }
}

/// The part of `text` after the longest prefix it shares with `prefix`, cut on a character.
fn after_common_prefix<'a>(prefix: &str, text: &'a str) -> &'a str {
    let shared: usize = prefix
        .chars()
        .zip(text.chars())
        .take_while(|(a, b)| a == b)
        .map(|(c, _)| c.len_utf8())
        .sum();
    &text[shared..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testing::{self, EOS_ID};

    fn decode_all(prompt: &str, generated: &str) -> Vec<String> {
        let tokenizer = Arc::new(testing::tokenizer());
        let prompt_ids = tokenizer.encode(prompt, true).unwrap().get_ids().to_vec();
        let mut decoder = IncrementalDecoder::new(tokenizer, &prompt_ids, MarkerTexts::default());
        testing::encode(generated)
            .into_iter()
            .map(|id| decoder.push(id).unwrap())
            .collect()
    }

    #[test]
    fn multi_byte_characters_split_across_tokens_are_released_whole() {
        let pieces = decode_all("say", "é😀!");
        assert_eq!(pieces.len(), 7, "é is 2 bytes, 😀 is 4, ! is 1");
        assert_eq!(pieces, ["", "é", "", "", "", "😀", "!"]);
    }

    #[test]
    fn concatenated_pieces_equal_the_full_decode() {
        let text = " hello wörld — ünïcödé 日本語 ok";
        assert_eq!(decode_all("prompt", text).concat(), text);
    }

    #[test]
    fn special_tokens_produce_no_text() {
        let tokenizer = Arc::new(testing::tokenizer());
        let mut decoder = IncrementalDecoder::new(tokenizer, &[], MarkerTexts::default());
        assert_eq!(decoder.push(testing::encode("a")[0]).unwrap(), "a");
        assert_eq!(decoder.push(EOS_ID).unwrap(), "");
    }

    #[test]
    fn markers_are_released_as_text_in_order() {
        let tokenizer = Arc::new(testing::tokenizer_with_special_tokens(&["<|channel|>"]));
        let channel = tokenizer.token_to_id("<|channel|>").unwrap();
        let markers = MarkerTexts::new([(channel, "<|channel|>".to_owned())].into());
        let mut decoder = IncrementalDecoder::new(Arc::clone(&tokenizer), &[], markers);
        let mut ids = testing::encode("é");
        ids.push(channel);
        ids.extend(testing::encode("final ok"));
        let pieces: Vec<String> = ids.iter().map(|&id| decoder.push(id).unwrap()).collect();
        assert_eq!(pieces.concat(), "é<|channel|>final ok");
        assert_eq!(pieces[..3], ["", "é", "<|channel|>"]);
        let mut plain = IncrementalDecoder::new(tokenizer, &[], MarkerTexts::default());
        let text: String = ids.iter().map(|&id| plain.push(id).unwrap()).collect();
        assert_eq!(
            text, "éfinal ok",
            "special tokens that are not markers stay hidden"
        );
    }

    #[test]
    fn a_marker_releases_a_split_character_before_it() {
        let tokenizer = Arc::new(testing::tokenizer_with_special_tokens(&["<|call|>"]));
        let call = tokenizer.token_to_id("<|call|>").unwrap();
        let markers = MarkerTexts::new([(call, "<|call|>".to_owned())].into());
        let mut decoder = IncrementalDecoder::new(Arc::clone(&tokenizer), &[], markers);
        let first_byte = testing::encode("é")[0];
        assert_eq!(decoder.push(first_byte).unwrap(), "");
        let released = decoder.push(call).unwrap();
        assert!(released.ends_with("<|call|>"), "{released:?}");
        assert_eq!(decoder.push(testing::encode("x")[0]).unwrap(), "x");
    }

    #[test]
    fn context_buffer_stays_bounded() {
        let tokenizer = Arc::new(testing::tokenizer());
        let mut decoder = IncrementalDecoder::new(
            tokenizer,
            &testing::encode("a long prompt here"),
            MarkerTexts::default(),
        );
        for id in testing::encode(&"xyz ".repeat(100)) {
            decoder.push(id).unwrap();
        }
        assert!(decoder.ids.len() <= CONTEXT_TOKENS + 1);
    }

    #[test]
    fn common_prefix_fallback_cuts_on_characters() {
        assert_eq!(after_common_prefix("aé", "aèb"), "èb");
    }
}
