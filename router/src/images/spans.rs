//! How a model's prompts hold images: each image takes a span of copies of one image token, as
//! long as the model's processor makes it (the same for every image, or set by the image's
//! size), and the chat template marks where each image goes, either with that token (LLaVA,
//! Qwen2.5-VL: widened after tokenizing) or with a text mark (Gemma 3: expanded before
//! tokenizing, as its processor does).

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::families::{gemma3, llava};
use super::model_config::{read_json, ModelConfig};
use super::qwen2_vl::qwen2_5_vl;
use super::{ImageError, SmartResize};

/// Why a model's image tokens cannot be known, or a prompt's images not placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageTokensError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error(
        "the router cannot place images in `{model_type}` prompts (it knows `llava`, `gemma3` \
         and `qwen2_5_vl`)"
    )]
    UnknownFamily { model_type: String },
    #[error("the shards run a vision encoder ({encoder}), but {path} has no `vision_config`")]
    NoVisionConfig { encoder: String, path: PathBuf },
    #[error("the chat template wrote {found} image placeholders, but the request carries {images} images")]
    PlaceholderCount { found: usize, images: usize },
    #[error(
        "the prompt holds a run of {found} image tokens at position {offset}, but its image takes \
         {expected}: image tokens may appear only where the chat template places an image"
    )]
    StrayImageTokens {
        offset: usize,
        found: usize,
        expected: usize,
    },
}

/// How a model's prompts hold images: every image takes a span of copies of `image_token_id`,
/// as many as `span` says for it, placed where the chat template marks the image as `marks`
/// says. Invariant: text marks go with a fixed span (their expansion holds the span).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageTokens {
    pub image_token_id: u32,
    pub span: SpanLength,
    pub marks: ImageMarks,
}

/// How many image tokens an image's span takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanLength {
    /// The same for every image (LLaVA, Gemma 3).
    Fixed(usize),
    /// Set by the size the processor resizes the image to (Qwen2.5-VL).
    Resized(SmartResize),
}

impl SpanLength {
    /// Tokens the span of a `width` x `height` image takes; refused when the model's processor
    /// refuses the image.
    pub fn tokens(&self, width: u32, height: u32) -> Result<usize, ImageError> {
        match self {
            Self::Fixed(tokens) => Ok(*tokens),
            Self::Resized(rule) => rule.tokens(width, height),
        }
    }

    /// The fewest and the most tokens a span takes (see `SmartResize::token_bounds`).
    pub fn token_bounds(&self) -> (usize, usize) {
        match self {
            Self::Fixed(tokens) => (*tokens, *tokens),
            Self::Resized(rule) => rule.token_bounds(),
        }
    }
}

/// How the chat template marks where an image goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageMarks {
    /// One `image_token_id` per image, widened into the image's span after tokenizing (LLaVA).
    Token,
    /// One `mark` per image in the rendered text, each replaced by `expansion` before
    /// tokenizing; `expansion` tokenizes to the image's span among other tokens (Gemma 3: blank
    /// lines, begin-of-image, the span, end-of-image, blank lines).
    Text { mark: String, expansion: String },
}

impl ImageTokens {
    /// LLaVA's image tokens: the template writes `image_token_id` once per image, widened into
    /// `tokens_per_image` copies.
    pub fn widened(image_token_id: u32, tokens_per_image: usize) -> Self {
        Self {
            image_token_id,
            span: SpanLength::Fixed(tokens_per_image),
            marks: ImageMarks::Token,
        }
    }

    /// The image tokens of the model in `dir`, whose token strings `tokenizer` knows, when the
    /// shards run a vision `encoder`; `None` (every image refused) when they run none.
    pub fn for_encoder(
        dir: &Path,
        encoder: Option<&str>,
        tokenizer: &Tokenizer,
    ) -> Result<Option<Self>, ImageTokensError> {
        let Some(encoder) = encoder else {
            return Ok(None);
        };
        let tokens = Self::from_model_dir(dir, tokenizer)?.ok_or_else(|| {
            ImageTokensError::NoVisionConfig {
                encoder: encoder.to_owned(),
                path: dir.join("config.json"),
            }
        })?;
        match tokens.span {
            SpanLength::Fixed(tokens_per_image) => tracing::info!(
                encoder,
                image_token_id = tokens.image_token_id,
                tokens_per_image,
                "images are served: each takes {tokens_per_image} prompt tokens"
            ),
            SpanLength::Resized(rule) => {
                let (least, most) = rule.token_bounds();
                tracing::info!(
                    encoder,
                    image_token_id = tokens.image_token_id,
                    min_pixels = rule.min_pixels(),
                    max_pixels = rule.max_pixels(),
                    "images are served: tokens per image depend on its size, from {least} (at \
                     most {} pixels) to {most} (at least {} pixels)",
                    rule.min_pixels(),
                    rule.max_pixels()
                );
            }
        }
        Ok(Some(tokens))
    }

    /// A vision-language model's image tokens, from `config.json` and `preprocessor_config.json`
    /// in `dir` and the token strings of `tokenizer`; `None` for a model without a
    /// `vision_config`.
    pub fn from_model_dir(
        dir: &Path,
        tokenizer: &Tokenizer,
    ) -> Result<Option<Self>, ImageTokensError> {
        let config_path = dir.join("config.json");
        let config: ModelConfig = read_json(&config_path)?;
        let Some(vision) = &config.vision_config else {
            return Ok(None);
        };
        match config.model_type.as_deref().unwrap_or_default() {
            "llava" => llava(dir, &config, vision).map(Some),
            "gemma3" => gemma3(&config_path, &config, tokenizer).map(Some),
            "qwen2_5_vl" => qwen2_5_vl(dir, &config, tokenizer).map(Some),
            other => Err(ImageTokensError::UnknownFamily {
                model_type: other.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::images::testing::{model_dir, QWEN2_5_VL_RESIZE};
    use crate::test_tokenizer::tokenizer;

    #[test]
    fn a_text_model_takes_no_images_and_an_unknown_vision_family_is_named() {
        let text = model_dir(&json!({"model_type": "llama"}), None);
        assert_eq!(
            ImageTokens::from_model_dir(text.path(), &tokenizer()),
            Ok(None)
        );
        let other = model_dir(
            &json!({"model_type": "idefics9", "vision_config": {}}),
            None,
        );
        let error = ImageTokens::from_model_dir(other.path(), &tokenizer()).unwrap_err();
        assert_eq!(
            error,
            ImageTokensError::UnknownFamily {
                model_type: "idefics9".to_owned()
            }
        );
        let message = error.to_string();
        assert!(
            message.contains("`llava`, `gemma3` and `qwen2_5_vl`"),
            "{message}"
        );
        let error =
            ImageTokens::for_encoder(text.path(), Some("CLIPVisionModel, 2 layers"), &tokenizer());
        assert!(matches!(
            error,
            Err(ImageTokensError::NoVisionConfig { .. })
        ));
        assert_eq!(
            ImageTokens::for_encoder(text.path(), None, &tokenizer()),
            Ok(None)
        );
    }

    #[test]
    fn a_fixed_span_ignores_the_size_and_a_resized_one_follows_it_within_its_bounds() {
        assert_eq!(SpanLength::Fixed(7).tokens(1, 5000), Ok(7));
        let span = SpanLength::Resized(QWEN2_5_VL_RESIZE);
        assert_eq!(span.tokens(1000, 1000), Ok(1296));
        assert_eq!(span.tokens(640, 480), Ok(391));
        assert_eq!(
            span.tokens(1, 5000),
            Err(ImageError::AspectRatio {
                width: 1,
                height: 5000
            })
        );
        assert_eq!(SpanLength::Fixed(7).token_bounds(), (7, 7));
        assert_eq!(span.token_bounds(), (4, 16384));
    }
}
