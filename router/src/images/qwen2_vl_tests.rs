//! Reading Qwen2.5-VL's image tokens as `Qwen2VLImageProcessor` reads its configuration: the
//! pixel keys, else `size`'s edges, else its defaults; settings it cannot work with refused at
//! start-up with the file and key named.

use serde_json::json;

use super::*;
use crate::images::testing::{model_dir, qwen2_5_vl, QWEN2_5_VL_RESIZE, QWEN2_5_VL_SPECIAL_TOKENS};
use crate::test_tokenizer::tokenizer_with_special_tokens;

fn tokenizer() -> Tokenizer {
    tokenizer_with_special_tokens(&QWEN2_5_VL_SPECIAL_TOKENS)
}

fn config() -> Value {
    let pad = tokenizer()
        .token_to_id("<|image_pad|>")
        .expect("a special token");
    json!({"model_type": "qwen2_5_vl", "image_token_id": pad, "vision_config": {}})
}

fn rule_for(processor: &Value) -> Result<SmartResize, ImageTokensError> {
    let dir = model_dir(&config(), Some(processor));
    let tokens = ImageTokens::from_model_dir(dir.path(), &tokenizer())?;
    match tokens.map(|tokens| tokens.span) {
        Some(SpanLength::Resized(rule)) => Ok(rule),
        other => panic!("a size-dependent span, not {other:?}"),
    }
}

fn reason_for(processor: &Value) -> String {
    match rule_for(processor) {
        Err(ImageTokensError::Config { path, reason }) => {
            assert!(path.ends_with("preprocessor_config.json"), "{path:?}");
            reason
        }
        other => panic!("a configuration error, not {other:?}"),
    }
}

#[test]
fn a_published_checkpoint_widens_its_image_pad_by_the_images_size() {
    let (tokenizer, tokens) = qwen2_5_vl();
    assert_eq!(
        tokens,
        ImageTokens {
            image_token_id: tokenizer.token_to_id("<|image_pad|>").unwrap(),
            span: SpanLength::Resized(QWEN2_5_VL_RESIZE),
            marks: ImageMarks::Token,
        }
    );
}

#[test]
fn the_pixel_bounds_are_read_as_the_processor_reads_them() {
    let bounds = |rule: SmartResize| (rule.min_pixels(), rule.max_pixels());
    let defaults = rule_for(&json!({})).unwrap();
    assert_eq!(SmartResize::new(14, 2, 3136, 1_003_520), Some(defaults));
    let edges = json!({"size": {"shortest_edge": 1000, "longest_edge": 200_000}});
    assert_eq!(bounds(rule_for(&edges).unwrap()), (1000, 200_000));
    let both = json!({
        "size": {"shortest_edge": 1000, "longest_edge": 200_000},
        "min_pixels": 5000,
        "max_pixels": 300_000
    });
    assert_eq!(
        bounds(rule_for(&both).unwrap()),
        (5000, 300_000),
        "the pixel keys win"
    );
    let only_max = json!({"max_pixels": 300_000, "min_pixels": null});
    assert_eq!(bounds(rule_for(&only_max).unwrap()), (3136, 300_000));
    let patch16 = rule_for(&json!({"patch_size": 16, "merge_size": 2})).unwrap();
    assert_eq!(SmartResize::new(16, 2, 3136, 1_003_520), Some(patch16));
}

#[test]
fn settings_the_processor_cannot_work_with_are_refused_by_name() {
    let half_size = json!({"size": {"shortest_edge": 1000}});
    assert_eq!(
        reason_for(&half_size),
        "no `max_pixels`, and `size` has no `longest_edge`"
    );
    let old_keys = json!({"size": {"min_pixels": 1000, "max_pixels": 200_000}});
    assert_eq!(
        reason_for(&old_keys),
        "no `min_pixels`, and `size` has no `shortest_edge`"
    );
    assert_eq!(
        reason_for(&json!({"patch_size": 0})),
        "`patch_size` is 0, not a positive integer"
    );
    assert_eq!(
        reason_for(&json!({"size": {"shortest_edge": 1.5, "longest_edge": 9}})),
        "`size`: `shortest_edge` is 1.5, not a positive integer"
    );
    let misordered = reason_for(&json!({"min_pixels": 10_000, "max_pixels": 9_999}));
    assert!(
        misordered.starts_with("the least pixels (10000) must be at most the most (9999)"),
        "{misordered}"
    );
    let huge = reason_for(&json!({"patch_size": 1000, "merge_size": 100}));
    assert!(huge.contains("(1000 × 100) at most 65535"), "{huge}");
    assert!(reason_for(&json!({"do_resize": false})).contains("`do_resize` is false"));
    assert_eq!(
        reason_for(&json!({"size": 3136})),
        "`size` is 3136, not an object"
    );
}

#[test]
fn a_missing_file_or_image_token_is_named() {
    let no_processor = model_dir(&config(), None);
    let error = ImageTokens::from_model_dir(no_processor.path(), &tokenizer()).unwrap_err();
    assert!(
        matches!(&error, ImageTokensError::Read { path, .. } if path.ends_with("preprocessor_config.json")),
        "{error}"
    );
    let processor = json!({});
    let no_token = model_dir(
        &json!({"model_type": "qwen2_5_vl", "vision_config": {}}),
        Some(&processor),
    );
    let message = ImageTokens::from_model_dir(no_token.path(), &tokenizer())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("config.json") && message.contains("no `image_token_id`"),
        "{message}"
    );
    let unknown =
        json!({"model_type": "qwen2_5_vl", "image_token_id": 151_655, "vision_config": {}});
    let dir = model_dir(&unknown, Some(&processor));
    let message = ImageTokens::from_model_dir(dir.path(), &tokenizer())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("`image_token_id` is 151655, a token the tokenizer does not have"),
        "{message}"
    );
}
