//! Qwen2.5-VL: the template writes one `<|image_pad|>` per image (between `<|vision_start|>` and
//! `<|vision_end|>`), widened into a span whose length follows the image's size, as
//! `Qwen2VLImageProcessor` resizes it (see `SmartResize`).

use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use super::model_config::{read_json, ModelConfig};
use super::{ImageMarks, ImageTokens, ImageTokensError, SmartResize, SpanLength};

/// What `Qwen2VLImageProcessor` takes for a key its configuration leaves out (its class
/// attributes: `patch_size`, `merge_size`, and `size`'s `shortest_edge` and `longest_edge`).
const DEFAULT_PATCH_SIZE: u64 = 14;
const DEFAULT_MERGE_SIZE: u64 = 2;
const DEFAULT_MIN_PIXELS: u64 = 56 * 56;
const DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;

/// Qwen2.5-VL's image tokens: `image_token_id` from `config.json` (a token the tokenizer has),
/// the resize rule from `preprocessor_config.json`.
pub(super) fn qwen2_5_vl(
    dir: &Path,
    config: &ModelConfig,
    tokenizer: &Tokenizer,
) -> Result<ImageTokens, ImageTokensError> {
    let config_path = dir.join("config.json");
    let invalid = |reason: String| ImageTokensError::Config {
        path: config_path.clone(),
        reason,
    };
    let image_token_id = config
        .image_token_index
        .ok_or_else(|| invalid("no `image_token_id`".to_owned()))?;
    if tokenizer.id_to_token(image_token_id).is_none() {
        return Err(invalid(format!(
            "`image_token_id` is {image_token_id}, a token the tokenizer does not have"
        )));
    }
    let rule = resize_rule(&dir.join("preprocessor_config.json"))?;
    Ok(ImageTokens {
        image_token_id,
        span: SpanLength::Resized(rule),
        marks: ImageMarks::Token,
    })
}

/// The resize rule `Qwen2VLImageProcessor` builds from its configuration at `path`: the pixel
/// bounds are `min_pixels` and `max_pixels` when given, else `size`'s `shortest_edge` and
/// `longest_edge` (both required when `size` is given), else the defaults.
fn resize_rule(path: &Path) -> Result<SmartResize, ImageTokensError> {
    let processor: Value = read_json(path)?;
    let invalid = |reason: String| ImageTokensError::Config {
        path: path.to_owned(),
        reason,
    };
    if processor.get("do_resize").and_then(Value::as_bool) == Some(false) {
        return Err(invalid(
            "`do_resize` is false: the router counts image tokens only for resized images"
                .to_owned(),
        ));
    }
    let size = match present(&processor, "size") {
        None => None,
        Some(size) if size.is_object() => Some(size),
        Some(size) => return Err(invalid(format!("`size` is {size}, not an object"))),
    };
    let bound = |key: &str, edge: &str, default: u64| {
        if let Some(pixels) = positive(&processor, key).map_err(&invalid)? {
            return Ok(pixels);
        }
        let Some(size) = size else {
            return Ok(default);
        };
        positive(size, edge)
            .map_err(|reason| invalid(format!("`size`: {reason}")))?
            .ok_or_else(|| invalid(format!("no `{key}`, and `size` has no `{edge}`")))
    };
    let min_pixels = bound("min_pixels", "shortest_edge", DEFAULT_MIN_PIXELS)?;
    let max_pixels = bound("max_pixels", "longest_edge", DEFAULT_MAX_PIXELS)?;
    let side = |key: &str, default: u64| {
        let value = positive(&processor, key).map_err(&invalid)?;
        u32::try_from(value.unwrap_or(default))
            .map_err(|_| invalid(format!("`{key}` is too large")))
    };
    let (patch_size, merge_size) = (
        side("patch_size", DEFAULT_PATCH_SIZE)?,
        side("merge_size", DEFAULT_MERGE_SIZE)?,
    );
    // Every setting is positive here: what `new` refuses is an order or a factor.
    SmartResize::new(patch_size, merge_size, min_pixels, max_pixels).ok_or_else(|| {
        invalid(format!(
            "the least pixels ({min_pixels}) must be at most the most ({max_pixels}), and \
             `patch_size` × `merge_size` ({patch_size} × {merge_size}) at most 65535"
        ))
    })
}

/// `object[key]` unless it is missing or `null` (which the processor reads as missing).
fn present<'a>(object: &'a Value, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

/// `object[key]` as a positive integer, `None` when missing; the reason it is not one.
fn positive(object: &Value, key: &str) -> Result<Option<u64>, String> {
    let Some(value) = present(object, key) else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(number) if number > 0 => Ok(Some(number)),
        _ => Err(format!("`{key}` is {value}, not a positive integer")),
    }
}

#[cfg(test)]
#[path = "qwen2_vl_tests.rs"]
mod tests;
