//! Images for tests: small encoded files and the `data:` URLs that carry them.

use std::io::Cursor;

use base64::Engine;
use image::{DynamicImage, ImageFormat, RgbImage};
use serde_json::Value;
use tokenizers::Tokenizer;

use super::{ImageTokens, SmartResize, SpanLength};

/// A `width` x `height` gradient encoded as `format`.
pub fn encoded(format: ImageFormat, width: u32, height: u32) -> Vec<u8> {
    let image = DynamicImage::ImageRgb8(RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x % 256) as u8, (y % 256) as u8, 7])
    }));
    let mut bytes = Cursor::new(Vec::new());
    image
        .write_to(&mut bytes, format)
        .expect("an in-memory image encodes");
    bytes.into_inner()
}

/// `data` as a base64 `data:` URL.
pub fn data_url(data: &[u8]) -> String {
    let payload = base64::engine::general_purpose::STANDARD.encode(data);
    format!("data:image/png;base64,{payload}")
}

/// Gemma 3's begin-of-image, end-of-image and soft image tokens, as the test tokenizer is given
/// them.
pub const GEMMA3_SPECIAL_TOKENS: [&str; 3] =
    ["<start_of_image>", "<end_of_image>", "<image_soft_token>"];

/// The test tokenizer knowing Gemma 3's image tokens, and Gemma 3's image tokens over it with
/// `tokens_per_image` soft tokens per image, read from a model directory as the router reads it.
pub fn gemma3(tokens_per_image: usize) -> (Tokenizer, ImageTokens) {
    let tokenizer = crate::test_tokenizer::tokenizer_with_special_tokens(&GEMMA3_SPECIAL_TOKENS);
    let id = |token: &str| tokenizer.token_to_id(token).expect("a special token");
    let config = serde_json::json!({
        "model_type": "gemma3",
        "boi_token_index": id("<start_of_image>"),
        "eoi_token_index": id("<end_of_image>"),
        "image_token_index": id("<image_soft_token>"),
        "mm_tokens_per_image": tokens_per_image,
        "vision_config": {"model_type": "siglip_vision_model"}
    });
    let dir = model_dir(&config, None);
    let tokens = ImageTokens::from_model_dir(dir.path(), &tokenizer)
        .expect("a Gemma 3 config")
        .expect("with a vision config");
    (tokenizer, tokens)
}

/// A model directory holding `config` as `config.json` and `processor`, if any, as
/// `preprocessor_config.json`.
pub fn model_dir(config: &Value, processor: Option<&Value>) -> tempfile::TempDir {
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

/// Qwen2.5-VL's vision marks and image pad, as the test tokenizer is given them.
pub const QWEN2_5_VL_SPECIAL_TOKENS: [&str; 3] =
    ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"];

/// The resize rule of Qwen2.5-VL's published `preprocessor_config.json`.
pub const QWEN2_5_VL_RESIZE: SmartResize = match SmartResize::new(14, 2, 3136, 12_845_056) {
    Some(rule) => rule,
    None => panic!("published settings are valid"),
};

/// The test tokenizer knowing Qwen2.5-VL's image tokens, and Qwen2.5-VL's image tokens over it
/// with the published processor configuration, read from a model directory as the router reads
/// it.
pub fn qwen2_5_vl() -> (Tokenizer, ImageTokens) {
    let tokenizer =
        crate::test_tokenizer::tokenizer_with_special_tokens(&QWEN2_5_VL_SPECIAL_TOKENS);
    let pad = tokenizer
        .token_to_id("<|image_pad|>")
        .expect("a special token");
    let config = serde_json::json!({
        "model_type": "qwen2_5_vl",
        "image_token_id": pad,
        "vision_config": {"model_type": "qwen2_5_vl", "patch_size": 14, "spatial_merge_size": 2}
    });
    let processor = serde_json::json!({
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": QWEN2_5_VL_RESIZE.min_pixels(),
        "max_pixels": QWEN2_5_VL_RESIZE.max_pixels(),
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2
    });
    let dir = model_dir(&config, Some(&processor));
    let tokens = ImageTokens::from_model_dir(dir.path(), &tokenizer)
        .expect("a Qwen2.5-VL config")
        .expect("with a vision config");
    assert_eq!(tokens.span, SpanLength::Resized(QWEN2_5_VL_RESIZE));
    (tokenizer, tokens)
}
