//! A user or assistant turn's text and images, gathered block by block into chat messages.

use super::request::{ImageBlock, ImageSource};
use crate::images;
use crate::validation::{request_rules, ChatMessage, ContentPart, ImageData, ValidationError};

/// The text and images of a turn gathered since its last tool result.
#[derive(Default)]
pub(super) struct TurnContent {
    texts: Vec<String>,
    /// Every text and image in order, kept for the template once an image arrived.
    parts: Vec<ContentPart>,
    has_image: bool,
}

impl TurnContent {
    pub fn push_text(&mut self, text: String) {
        self.parts.push(ContentPart::Text(text.clone()));
        self.texts.push(text);
    }

    pub fn push_image(&mut self, image: ImageData) {
        self.parts.push(ContentPart::Image(image));
        self.has_image = true;
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The gathered content as one message of `role`, leaving none gathered.
    pub fn take_message(&mut self, role: &str) -> ChatMessage {
        let content = std::mem::take(self);
        ChatMessage {
            parts: content.has_image.then_some(content.parts),
            ..ChatMessage::new(role, content.texts.join("\n"))
        }
    }
}

/// An image block's image (at `at`): inline base64 of at most `max_bytes`, or a URL to fetch.
pub(super) fn block_image(
    block: ImageBlock,
    at: String,
    max_bytes: usize,
) -> Result<ImageData, ValidationError> {
    let image = match block.source {
        ImageSource::Base64 { data, .. } => {
            images::base64_image(&data, max_bytes).map(ImageData::Inline)
        }
        ImageSource::Url { url } => request_rules::image_by_url(url, max_bytes),
    };
    image.map_err(|source| ValidationError::ImagePart {
        param: format!("{at}.source"),
        source,
    })
}
