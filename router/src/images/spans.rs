//! How a model's prompts hold images: each image takes a span of copies of one image token, and
//! the chat template marks where each image goes, either with that token (LLaVA: widened after
//! tokenizing) or with a text mark (Gemma 3: expanded before tokenizing, as its processor does).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use tokenizers::Tokenizer;

/// Why a model's image tokens cannot be known, or a prompt's images not placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageTokensError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error(
        "the router cannot place images in `{model_type}` prompts (it knows `llava` and `gemma3`)"
    )]
    UnknownFamily { model_type: String },
    #[error("the shards run a vision encoder ({encoder}), but {path} has no `vision_config`")]
    NoVisionConfig { encoder: String, path: PathBuf },
    #[error("the chat template wrote {found} image placeholders, but the request carries {images} images")]
    PlaceholderCount { found: usize, images: usize },
    #[error(
        "the prompt holds a run of {found} image tokens at position {offset}, but an image takes \
         {expected}: image tokens may appear only where the chat template places an image"
    )]
    StrayImageTokens {
        offset: usize,
        found: usize,
        expected: usize,
    },
}

/// How a model's prompts hold images: every image takes a span of `tokens_per_image` copies of
/// `image_token_id`, placed where the chat template marks the image as `marks` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageTokens {
    pub image_token_id: u32,
    pub tokens_per_image: usize,
    pub marks: ImageMarks,
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

#[derive(Debug, Deserialize)]
struct ModelConfig {
    model_type: Option<String>,
    #[serde(alias = "image_token_id")]
    image_token_index: Option<u32>,
    vision_feature_select_strategy: Option<String>,
    vision_config: Option<VisionConfig>,
    mm_tokens_per_image: Option<usize>,
    boi_token_index: Option<u32>,
    eoi_token_index: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct VisionConfig {
    image_size: Option<u32>,
    patch_size: Option<u32>,
}

/// Gemma 3's defaults for what its `config.json` may leave out (`Gemma3Config`).
const GEMMA3_IMAGE_TOKEN: u32 = 262_144;
const GEMMA3_BOI_TOKEN: u32 = 255_999;
const GEMMA3_EOI_TOKEN: u32 = 256_000;
const GEMMA3_TOKENS_PER_IMAGE: usize = 256;

impl ImageTokens {
    /// LLaVA's image tokens: the template writes `image_token_id` once per image, widened into
    /// `tokens_per_image` copies.
    pub fn widened(image_token_id: u32, tokens_per_image: usize) -> Self {
        Self {
            image_token_id,
            tokens_per_image,
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
        tracing::info!(
            encoder,
            image_token_id = tokens.image_token_id,
            tokens_per_image = tokens.tokens_per_image,
            "images are served: each takes {} prompt tokens",
            tokens.tokens_per_image
        );
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
            other => Err(ImageTokensError::UnknownFamily {
                model_type: other.to_owned(),
            }),
        }
    }
}

/// LLaVA: one token per patch of the processed image (plus the class token under the `full`
/// feature strategy).
fn llava(
    dir: &Path,
    config: &ModelConfig,
    vision: &VisionConfig,
) -> Result<ImageTokens, ImageTokensError> {
    let config_path = dir.join("config.json");
    let missing = |reason: &str| ImageTokensError::Config {
        path: config_path.clone(),
        reason: reason.to_owned(),
    };
    let image_token_id = config
        .image_token_index
        .ok_or_else(|| missing("no `image_token_index`"))?;
    let patch = vision
        .patch_size
        .filter(|&size| size > 0)
        .ok_or_else(|| missing("no `vision_config.patch_size`"))?;
    let processor_path = dir.join("preprocessor_config.json");
    let (height, width) = match std::fs::metadata(&processor_path) {
        Ok(_) => processed_size(&processor_path)?,
        Err(_) => {
            let side = vision
                .image_size
                .ok_or_else(|| missing("no `vision_config.image_size`"))?;
            (side, side)
        }
    };
    // The class embedding stays under the `full` strategy; `default` drops it.
    let class_token = usize::from(config.vision_feature_select_strategy.as_deref() == Some("full"));
    let patches = (height / patch) as usize * (width / patch) as usize;
    Ok(ImageTokens::widened(image_token_id, patches + class_token))
}

/// Gemma 3: `mm_tokens_per_image` soft tokens per image, between its begin- and end-of-image
/// tokens and blank lines, written in place of each begin-of-image mark (`Gemma3Processor`).
fn gemma3(
    config_path: &Path,
    config: &ModelConfig,
    tokenizer: &Tokenizer,
) -> Result<ImageTokens, ImageTokensError> {
    let token = |id: u32, key: &str| {
        tokenizer
            .id_to_token(id)
            .ok_or_else(|| ImageTokensError::Config {
                path: config_path.to_owned(),
                reason: format!("`{key}` is {id}, a token the tokenizer does not have"),
            })
    };
    let image_token_id = config.image_token_index.unwrap_or(GEMMA3_IMAGE_TOKEN);
    let tokens_per_image = config
        .mm_tokens_per_image
        .unwrap_or(GEMMA3_TOKENS_PER_IMAGE);
    let soft = token(image_token_id, "image_token_index")?;
    let boi = token(
        config.boi_token_index.unwrap_or(GEMMA3_BOI_TOKEN),
        "boi_token_index",
    )?;
    let eoi = token(
        config.eoi_token_index.unwrap_or(GEMMA3_EOI_TOKEN),
        "eoi_token_index",
    )?;
    let expansion = format!("\n\n{boi}{}{eoi}\n\n", soft.repeat(tokens_per_image));
    Ok(ImageTokens {
        image_token_id,
        tokens_per_image,
        marks: ImageMarks::Text {
            mark: boi,
            expansion,
        },
    })
}

/// The height and width a CLIP-style image processor gives every image: its crop when it
/// crops, else its resize.
fn processed_size(path: &Path) -> Result<(u32, u32), ImageTokensError> {
    let config: Value = read_json(path)?;
    let crops = config.get("do_center_crop").and_then(Value::as_bool) != Some(false);
    let size = match config.get("crop_size") {
        Some(crop) if crops => crop,
        _ => config.get("size").unwrap_or(&Value::Null),
    };
    let side = |key: &str| size.get(key).and_then(Value::as_u64);
    let dims = match (
        size.as_u64(),
        side("height"),
        side("width"),
        side("shortest_edge"),
    ) {
        (Some(edge), ..) | (None, None, None, Some(edge)) => Some((edge, edge)),
        (None, Some(height), Some(width), _) => Some((height, width)),
        _ => None,
    };
    dims.and_then(|(h, w)| Some((u32::try_from(h).ok()?, u32::try_from(w).ok()?)))
        .ok_or_else(|| ImageTokensError::Config {
            path: path.to_owned(),
            reason: "no `crop_size` or `size` with a height and width".to_owned(),
        })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ImageTokensError> {
    let text = std::fs::read_to_string(path).map_err(|error| ImageTokensError::Read {
        path: path.to_owned(),
        reason: error.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|error| ImageTokensError::Config {
        path: path.to_owned(),
        reason: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::images::testing::gemma3;
    use crate::test_tokenizer::tokenizer;

    fn model_dir(config: &Value, processor: Option<&Value>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let write = |name: &str, value: &Value| {
            std::fs::write(dir.path().join(name), value.to_string()).expect("writes");
        };
        write("config.json", config);
        if let Some(processor) = processor {
            write("preprocessor_config.json", processor);
        }
        dir
    }

    fn llava(strategy: &str) -> Value {
        json!({
            "model_type": "llava",
            "image_token_index": 32000,
            "vision_feature_select_strategy": strategy,
            "vision_config": {"image_size": 336, "patch_size": 14}
        })
    }

    #[test]
    fn a_llava_image_takes_one_token_per_patch_of_its_processed_size() {
        let processor =
            json!({"crop_size": {"height": 56, "width": 56}, "size": {"shortest_edge": 56}});
        let dir = model_dir(&llava("default"), Some(&processor));
        let tokens = ImageTokens::from_model_dir(dir.path(), &tokenizer()).unwrap();
        assert_eq!(tokens, Some(ImageTokens::widened(32000, 16)));
        let full = model_dir(&llava("full"), None);
        let tokens = ImageTokens::from_model_dir(full.path(), &tokenizer())
            .unwrap()
            .unwrap();
        assert_eq!(
            tokens.tokens_per_image,
            24 * 24 + 1,
            "vision_config's size, and the class token"
        );
    }

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
        assert!(message.contains("`llava` and `gemma3`"), "{message}");
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
    fn a_gemma3_image_expands_its_begin_of_image_mark_as_the_processor_does() {
        let (tokenizer, tokens) = gemma3(3);
        let expansion = "\n\n<start_of_image><image_soft_token><image_soft_token>\
                         <image_soft_token><end_of_image>\n\n";
        assert_eq!(
            tokens,
            ImageTokens {
                image_token_id: tokenizer.token_to_id("<image_soft_token>").unwrap(),
                tokens_per_image: 3,
                marks: ImageMarks::Text {
                    mark: "<start_of_image>".to_owned(),
                    expansion: expansion.to_owned()
                }
            }
        );
    }

    #[test]
    fn gemma3_defaults_name_the_token_a_tokenizer_lacks() {
        let config = json!({"model_type": "gemma3", "vision_config": {}});
        let dir = model_dir(&config, None);
        let error = ImageTokens::from_model_dir(dir.path(), &tokenizer()).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("`image_token_index` is 262144"),
            "{message}"
        );
    }
}
