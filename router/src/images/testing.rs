//! Images for tests: small encoded files and the `data:` URLs that carry them.

use std::io::Cursor;

use base64::Engine;
use image::{DynamicImage, ImageFormat, RgbImage};
use tokenizers::Tokenizer;

use super::ImageTokens;

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
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("writes");
    let tokens = ImageTokens::from_model_dir(dir.path(), &tokenizer)
        .expect("a Gemma 3 config")
        .expect("with a vision config");
    (tokenizer, tokens)
}
