//! Rendering and tokenizing prompts on the blocking pool, within the tokenization budget; a
//! prompt with images is tokenized from the text the model's processor would tokenize.

use std::sync::Arc;

use super::prompt_images::image_spans;
use super::{tokenization_peak_bytes, OffsetTokens, Prompt, ValidationError, Validator};

impl Validator {
    /// The prompt's tokens with byte offsets into `text`, as `/tokenize` reports them, `text`
    /// back, and the reservation of the memory the answer takes: the caller holds it until the
    /// answer written from them is sent. Only the ids and offsets outlive the tokenizer's work.
    pub async fn tokenize_with_offsets(
        &self,
        text: String,
    ) -> Result<OffsetTokens, ValidationError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        self.tokenizing.check_text(text.len())?;
        let peak = tokenization_peak_bytes(text.len());
        let reservation = self.tokenizing.reserve(peak).await;
        let job = move || {
            let tokens = tokenizer
                .encode(text.as_str(), true)
                .map(|encoding| {
                    let offsets = encoding.get_offsets().iter().copied();
                    encoding.get_ids().iter().copied().zip(offsets).collect()
                })
                .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
            Ok(OffsetTokens {
                text,
                tokens,
                reservation,
            })
        };
        tokio::task::spawn_blocking(job)
            .await
            .map_err(|e| ValidationError::Tokenizer(e.to_string()))?
    }

    /// How many tokens `prompt` takes once rendered and tokenized, as a generation sees it: its
    /// images' spans included, each read from the image's header; an image a generation would
    /// refuse before decoding it is refused here too.
    pub async fn count_tokens(&self, prompt: Prompt) -> Result<usize, ValidationError> {
        self.check_prompt(&prompt)?;
        let spans = image_spans(prompt.images(), self.image_intake()).await?;
        let ids = self.tokenize(prompt, Vec::new(), spans.len()).await?;
        match self.image_tokens.as_deref().filter(|_| !spans.is_empty()) {
            Some(tokens) => tokens
                .count_tokens(&ids, &spans)
                .map_err(ValidationError::ImagePlacement),
            None => Ok(ids.len()),
        }
    }

    /// Renders (with the template variables the reasoning setting implies, `switches`) and
    /// tokenizes on the blocking pool: both can take milliseconds on long prompts. The rendered
    /// text of a prompt carrying `images` images has its image marks expanded first (see
    /// `ImageTokens::expand_text`).
    pub(super) async fn tokenize(
        &self,
        prompt: Prompt,
        switches: Vec<(&'static str, serde_json::Value)>,
        images: usize,
    ) -> Result<Vec<u32>, ValidationError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        let template = self.chat_template.clone();
        let image_tokens = self.image_tokens.clone().filter(|_| images > 0);
        let prompt = match prompt {
            Prompt::Tokens(ids) => return Ok(ids),
            other => other,
        };
        let text_bytes = match &prompt {
            Prompt::Tokens(ids) => ids.len(),
            Prompt::Text(text) => text.len(),
            Prompt::Chat(messages, ..) => messages.iter().map(|m| m.content.len()).sum(),
        };
        let expanded_bytes = image_tokens
            .as_deref()
            .map_or(0, |tokens| images * tokens.expanded_bytes_per_image());
        let tokenized_bytes = text_bytes.saturating_add(expanded_bytes);
        self.tokenizing.check_text(tokenized_bytes)?;
        let peak = tokenization_peak_bytes(tokenized_bytes);
        let reserved = self.tokenizing.reserve(peak).await;
        let job = move || {
            let _reserved = reserved;
            let (text, add_special_tokens) = match prompt {
                Prompt::Text(text) => (text, true),
                Prompt::Tokens(ids) => return Ok(ids),
                Prompt::Chat(messages, ending, mut extras) => {
                    let template = template.map_err(ValidationError::NoChat)?;
                    // The request's own `chat_template_kwargs` win over the switches its
                    // reasoning setting implies.
                    for (name, value) in switches {
                        extras.kwargs.entry(name).or_insert(value);
                    }
                    (template.render(&messages, ending, &extras)?, false)
                }
            };
            let text = match image_tokens {
                Some(tokens) => tokens
                    .expand_text(text, images)
                    .map_err(ValidationError::ImagePlacement)?,
                None => text,
            };
            tokenizer
                .encode_fast(text, add_special_tokens)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|e| ValidationError::Tokenizer(e.to_string()))
        };
        tokio::task::spawn_blocking(job)
            .await
            .map_err(|e| ValidationError::Tokenizer(e.to_string()))?
    }
}
