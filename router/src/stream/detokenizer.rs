//! Incremental detokenization that only releases complete UTF-8 characters.

use std::sync::Arc;

use tokenizers::Tokenizer;

/// Prompt tokens kept as decoding context, so the first generated token decodes with
/// the spacing it has in context (SentencePiece-style decoders strip a leading space).
const CONTEXT_TOKENS: usize = 5;

/// Decodes one request's tokens as they arrive.
///
/// Invariant: `ids[prefix_offset..read_offset]` decodes to exactly the text already
/// released after `ids[..prefix_offset]`'s text; every token after `read_offset` has not
/// produced text yet (it may be an incomplete character).
#[derive(Debug)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder whose context is the tail of `prompt_ids`.
    pub fn new(tokenizer: Arc<Tokenizer>, prompt_ids: &[u32]) -> Self {
        let ids = prompt_ids[prompt_ids.len().saturating_sub(CONTEXT_TOKENS)..].to_vec();
        let read_offset = ids.len();
        Self {
            tokenizer,
            ids,
            prefix_offset: 0,
            read_offset,
        }
    }

    /// Adds one token; returns the text it completes (empty while a character is split
    /// across tokens, and for special tokens).
    pub fn push(&mut self, id: u32) -> Result<String, tokenizers::Error> {
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
        let mut decoder = IncrementalDecoder::new(tokenizer, &prompt_ids);
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
        let mut decoder = IncrementalDecoder::new(tokenizer, &[]);
        assert_eq!(decoder.push(testing::encode("a")[0]).unwrap(), "a");
        assert_eq!(decoder.push(EOS_ID).unwrap(), "");
    }

    #[test]
    fn context_buffer_stays_bounded() {
        let tokenizer = Arc::new(testing::tokenizer());
        let mut decoder =
            IncrementalDecoder::new(tokenizer, &testing::encode("a long prompt here"));
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
