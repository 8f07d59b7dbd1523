//! Turns a request's token events into text: incremental detokenization plus stop strings.
//!
//! Dropping a `TextStream` drops its `GenerationStream`, which cancels the request in the
//! scheduler; a stop-string match drops it at once.

mod detokenizer;
mod stop;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use tokenizers::Tokenizer;

pub use detokenizer::{IncrementalDecoder, MarkerTexts};
pub use stop::{StopMatcher, StopOutcome};

use crate::scheduler::{
    FinishReason, GeneratedToken, GenerationEvent, GenerationStream, PromptLogprobs,
    SchedulerError, TokenLogprob,
};

/// Why a request finished, as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `max_new_tokens` reached.
    Length,
    /// The model emitted an end-of-sequence or stop token.
    EosToken,
    /// A stop string matched.
    StopSequence,
}

impl Finish {
    /// The `finish_reason` metrics label: the native API's names.
    pub fn label(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::EosToken => "eos_token",
            Self::StopSequence => "stop_sequence",
        }
    }
}

impl From<FinishReason> for Finish {
    fn from(reason: FinishReason) -> Self {
        match reason {
            FinishReason::Length => Self::Length,
            FinishReason::Eos | FinishReason::StopToken => Self::EosToken,
        }
    }
}

/// One generated token and the text it releases (possibly empty).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenText {
    pub id: u32,
    pub logprob: f32,
    pub special: bool,
    pub text: String,
    /// The most likely alternatives, most likely first; empty unless asked for.
    pub top_logprobs: Vec<TokenLogprob>,
}

/// A token event; `finish` is set on the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct TextDelta {
    pub token: TokenText,
    pub finish: Option<Finish>,
    /// With `Finish::StopSequence`: the stop string that matched.
    pub stop_sequence: Option<String>,
    /// Prompt tokens taken from the prefix cache when the request was first admitted.
    pub cached_tokens: usize,
}

/// A generation that ended without its last token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("detokenization failed: {0}")]
    Detokenize(String),
    #[error("the generation ended before its last token")]
    Incomplete,
}

/// The tokenizer plus which of its ids are special (shown, never decoded into text), and
/// which special ids the chat format's parsers read as text.
#[derive(Debug)]
pub struct TokenDecoding {
    pub tokenizer: Arc<Tokenizer>,
    special_ids: HashSet<u32>,
    chat_markers: MarkerTexts,
}

impl TokenDecoding {
    /// Indexes the tokenizer's special tokens.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let special_ids = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        Self {
            tokenizer,
            special_ids,
            chat_markers: MarkerTexts::default(),
        }
    }

    /// Chat output releases these special tokens as their text (markers that are not special
    /// tokens of this tokenizer decode as text anyway and are ignored here).
    pub fn with_chat_markers<'a>(mut self, markers: impl IntoIterator<Item = &'a str>) -> Self {
        let texts: HashMap<u32, String> = markers
            .into_iter()
            .filter_map(|marker| Some((self.tokenizer.token_to_id(marker)?, marker.to_owned())))
            .filter(|(id, _)| self.special_ids.contains(id))
            .collect();
        self.chat_markers = Arc::new(texts);
        self
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The text of one token on its own (special tokens included), for logprob listings.
    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}

/// One request's text as it is generated.
#[derive(Debug)]
pub struct TextStream {
    events: Option<GenerationStream>,
    decoding: Arc<TokenDecoding>,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    prompt_logprobs: PromptLogprobs,
    admitted_at: Option<Instant>,
    /// Prompt tokens the first admission took from the prefix cache (0 until it happened).
    cached_tokens: usize,
}

impl TextStream {
    /// Wraps `events`; `prompt_ids` give the detokenizer its context. A chat request's text
    /// keeps the chat format's marker tokens, which its parsers read.
    pub fn new(
        events: GenerationStream,
        decoding: Arc<TokenDecoding>,
        prompt_ids: &[u32],
        stop: Vec<String>,
        is_chat: bool,
    ) -> Self {
        let markers = if is_chat {
            Arc::clone(&decoding.chat_markers)
        } else {
            MarkerTexts::default()
        };
        let decoder = IncrementalDecoder::new(Arc::clone(&decoding.tokenizer), prompt_ids, markers);
        Self {
            events: Some(events),
            decoding,
            decoder,
            stops: StopMatcher::new(stop),
            prompt_logprobs: PromptLogprobs {
                first_position: 1,
                logprobs: Vec::new(),
                top: Vec::new(),
            },
            admitted_at: None,
            cached_tokens: 0,
        }
    }

    /// When the scheduler first admitted the request (read once its `Started` event arrived).
    pub fn admitted_at(&self) -> Option<Instant> {
        self.admitted_at
    }

    /// Prompt log-probabilities received so far, from position 1 on, each position once.
    pub fn prompt_logprobs(&self) -> &PromptLogprobs {
        &self.prompt_logprobs
    }

    /// Appends the positions of `chunk` not received yet (recompute repeats some).
    fn on_prompt_logprobs(&mut self, chunk: PromptLogprobs) {
        let received = &mut self.prompt_logprobs;
        let next = received.first_position + received.logprobs.len();
        let end = chunk.first_position + chunk.logprobs.len();
        if chunk.first_position > next || end <= next {
            return;
        }
        let skip = next - chunk.first_position;
        received.logprobs.extend_from_slice(&chunk.logprobs[skip..]);
        received.top.extend(chunk.top.into_iter().skip(skip));
    }

    /// The next token, `None` after the last one or after an error.
    pub async fn next(&mut self) -> Option<Result<TextDelta, StreamError>> {
        loop {
            let event = self.events.as_mut()?.events.recv().await;
            match event {
                Some(GenerationEvent::Started { cached_tokens }) => {
                    if self.admitted_at.is_none() {
                        self.admitted_at = Some(Instant::now());
                        self.cached_tokens = cached_tokens;
                    }
                }
                Some(GenerationEvent::PromptLogprobs(chunk)) => self.on_prompt_logprobs(chunk),
                Some(GenerationEvent::Token(token)) => {
                    let delta = self.on_token(token);
                    if !matches!(delta, Ok(TextDelta { finish: None, .. })) {
                        self.events = None;
                    }
                    return Some(delta);
                }
                Some(GenerationEvent::Error(error)) => {
                    self.events = None;
                    return Some(Err(error.into()));
                }
                None => {
                    self.events = None;
                    return Some(Err(StreamError::Incomplete));
                }
            }
        }
    }

    fn on_token(&mut self, generated: GeneratedToken) -> Result<TextDelta, StreamError> {
        let GeneratedToken {
            id,
            logprob,
            top_logprobs,
            finish,
        } = generated;
        let decoded = self
            .decoder
            .push(id)
            .map_err(|e| StreamError::Detokenize(e.to_string()))?;
        let (text, finish) = match self.stops.push(&decoded) {
            StopOutcome::Stopped(text) => (text, Some(Finish::StopSequence)),
            StopOutcome::Continue(mut text) => {
                if finish.is_some() {
                    text.push_str(&self.stops.flush());
                }
                (text, finish.map(Finish::from))
            }
        };
        let token = TokenText {
            id,
            logprob,
            special: self.decoding.is_special(id),
            text,
            top_logprobs,
        };
        let stop_sequence = self.stops.matched().map(str::to_owned);
        Ok(TextDelta {
            token,
            finish,
            stop_sequence,
            cached_tokens: self.cached_tokens,
        })
    }
}

#[cfg(test)]
mod tests;
