//! The families whose every image takes the same span: LLaVA (one token per patch of its
//! processed size) and Gemma 3 (a fixed number of soft tokens between its image marks).

use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use super::model_config::{read_json, ModelConfig, VisionConfig};
use super::{ImageMarks, ImageTokens, ImageTokensError, SpanLength};

/// Gemma 3's defaults for what its `config.json` may leave out (`Gemma3Config`).
const GEMMA3_IMAGE_TOKEN: u32 = 262_144;
const GEMMA3_BOI_TOKEN: u32 = 255_999;
const GEMMA3_EOI_TOKEN: u32 = 256_000;
const GEMMA3_TOKENS_PER_IMAGE: usize = 256;

/// LLaVA: one token per patch of the processed image (plus the class token under the `full`
/// feature strategy).
pub(super) fn llava(
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
pub(super) fn gemma3(
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
        span: SpanLength::Fixed(tokens_per_image),
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::images::testing::{gemma3, model_dir};
    use crate::test_tokenizer::tokenizer;

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
            tokens.span,
            SpanLength::Fixed(24 * 24 + 1),
            "vision_config's size, and the class token"
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
                span: SpanLength::Fixed(3),
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
