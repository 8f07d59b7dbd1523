//! How a model's prompts hold images: the chat template writes one placeholder token per
//! image, which becomes a span of as many copies as the image has embeddings.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::{CheckedImage, PromptImage};

/// Why a model's image tokens cannot be known, or a prompt's images not placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageTokensError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("the router cannot place images in `{model_type}` prompts (it knows `llava`)")]
    UnknownFamily { model_type: String },
    #[error("the shards run a vision encoder ({encoder}), but {path} has no `vision_config`")]
    NoVisionConfig { encoder: String, path: PathBuf },
    #[error("the chat template wrote {found} image placeholders, but the request carries {images} images")]
    PlaceholderCount { found: usize, images: usize },
}

/// The token each image's span repeats and the span's length, for models whose images all
/// take the same number of embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTokens {
    pub image_token_id: u32,
    pub tokens_per_image: usize,
}

#[derive(Debug, Deserialize)]
struct LlavaConfig {
    model_type: Option<String>,
    #[serde(alias = "image_token_id")]
    image_token_index: Option<u32>,
    vision_feature_select_strategy: Option<String>,
    vision_config: Option<VisionConfig>,
}

#[derive(Debug, Deserialize)]
struct VisionConfig {
    image_size: Option<u32>,
    patch_size: Option<u32>,
}

impl ImageTokens {
    /// The image tokens of the model in `dir` when the shards run a vision `encoder`; `None`
    /// (every image refused) when they run none.
    pub fn for_encoder(
        dir: &Path,
        encoder: Option<&str>,
    ) -> Result<Option<Self>, ImageTokensError> {
        let Some(encoder) = encoder else {
            return Ok(None);
        };
        let tokens =
            Self::from_model_dir(dir)?.ok_or_else(|| ImageTokensError::NoVisionConfig {
                encoder: encoder.to_owned(),
                path: dir.join("config.json"),
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
    /// in `dir`; `None` for a model without a `vision_config`.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, ImageTokensError> {
        let config_path = dir.join("config.json");
        let config: LlavaConfig = read_json(&config_path)?;
        let Some(vision) = config.vision_config else {
            return Ok(None);
        };
        let model_type = config.model_type.unwrap_or_default();
        if model_type != "llava" {
            return Err(ImageTokensError::UnknownFamily { model_type });
        }
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
        let class_token =
            usize::from(config.vision_feature_select_strategy.as_deref() == Some("full"));
        let patches = (height / patch) as usize * (width / patch) as usize;
        Ok(Some(Self {
            image_token_id,
            tokens_per_image: patches + class_token,
        }))
    }
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

/// `ids` with each image placeholder widened into its image's span, and the images placed at
/// their spans; the template must have written exactly one placeholder per image.
pub fn expand_placeholders(
    ids: &[u32],
    images: Vec<CheckedImage>,
    tokens: ImageTokens,
) -> Result<(Vec<u32>, Vec<PromptImage>), ImageTokensError> {
    let found = ids
        .iter()
        .filter(|&&id| id == tokens.image_token_id)
        .count();
    if found != images.len() {
        return Err(ImageTokensError::PlaceholderCount {
            found,
            images: images.len(),
        });
    }
    let span = tokens.tokens_per_image;
    let mut expanded = Vec::with_capacity(ids.len() + found * span.saturating_sub(1));
    let mut images = images.into_iter();
    let mut placed = Vec::with_capacity(found);
    for &id in ids {
        if id != tokens.image_token_id {
            expanded.push(id);
            continue;
        }
        let image = images
            .next()
            .expect("invariant: one image per placeholder, counted above");
        placed.push(PromptImage {
            data: image.data,
            digest: image.digest,
            offset: expanded.len(),
            num_tokens: span,
        });
        expanded.extend(std::iter::repeat_n(id, span));
    }
    Ok((expanded, placed))
}

/// Tokens `ids` take once each of its image placeholders is widened.
pub fn image_count_tokens(ids: &[u32], tokens: Option<ImageTokens>) -> usize {
    tokens.map_or(ids.len(), |tokens| {
        let placeholders = ids
            .iter()
            .filter(|&&id| id == tokens.image_token_id)
            .count();
        ids.len() + placeholders * tokens.tokens_per_image.saturating_sub(1)
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::json;

    use super::*;

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
        let tokens = ImageTokens::from_model_dir(dir.path()).unwrap();
        assert_eq!(
            tokens,
            Some(ImageTokens {
                image_token_id: 32000,
                tokens_per_image: 16
            })
        );
        let full = model_dir(&llava("full"), None);
        let tokens = ImageTokens::from_model_dir(full.path()).unwrap().unwrap();
        assert_eq!(
            tokens.tokens_per_image,
            24 * 24 + 1,
            "vision_config's size, and the class token"
        );
    }

    #[test]
    fn a_text_model_takes_no_images_and_an_unknown_vision_family_is_named() {
        let text = model_dir(&json!({"model_type": "llama"}), None);
        assert_eq!(ImageTokens::from_model_dir(text.path()), Ok(None));
        let other = model_dir(
            &json!({"model_type": "idefics9", "vision_config": {}}),
            None,
        );
        assert_eq!(
            ImageTokens::from_model_dir(other.path()),
            Err(ImageTokensError::UnknownFamily {
                model_type: "idefics9".to_owned()
            })
        );
        let error = ImageTokens::for_encoder(text.path(), Some("CLIPVisionModel, 2 layers"));
        assert!(matches!(
            error,
            Err(ImageTokensError::NoVisionConfig { .. })
        ));
        assert_eq!(ImageTokens::for_encoder(text.path(), None), Ok(None));
    }

    fn checked(byte: u8) -> CheckedImage {
        let data = crate::images::testing::encoded(image::ImageFormat::Png, 2, 2);
        let header =
            crate::images::ImageHeader::read(&data, &crate::images::ImageLimits::default())
                .expect("a small PNG");
        let mut image = crate::images::check_image(Bytes::from(data), header).expect("decodes");
        image.digest = [byte; 32];
        image
    }

    #[test]
    fn each_placeholder_becomes_its_images_span() {
        let tokens = ImageTokens {
            image_token_id: 9,
            tokens_per_image: 3,
        };
        let (ids, images) =
            expand_placeholders(&[1, 9, 2, 9], vec![checked(1), checked(2)], tokens).unwrap();
        assert_eq!(ids, [1, 9, 9, 9, 2, 9, 9, 9]);
        let spans: Vec<_> = images
            .iter()
            .map(|image| (image.digest[0], image.offset, image.num_tokens))
            .collect();
        assert_eq!(spans, [(1, 1, 3), (2, 5, 3)]);
        assert_eq!(image_count_tokens(&[1, 9, 2, 9], Some(tokens)), 8);
    }

    #[test]
    fn placeholders_must_match_the_images_one_for_one() {
        let tokens = ImageTokens {
            image_token_id: 9,
            tokens_per_image: 3,
        };
        assert_eq!(
            expand_placeholders(&[1, 2], vec![checked(1)], tokens).unwrap_err(),
            ImageTokensError::PlaceholderCount {
                found: 0,
                images: 1
            }
        );
    }
}
