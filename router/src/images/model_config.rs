//! The parts of a vision-language model's configuration files that place its images.

use std::path::Path;

use serde::Deserialize;

use super::ImageTokensError;

/// The keys of a vision-language model's `config.json` that place its images.
#[derive(Debug, Deserialize)]
pub(super) struct ModelConfig {
    pub model_type: Option<String>,
    #[serde(alias = "image_token_id")]
    pub image_token_index: Option<u32>,
    pub vision_feature_select_strategy: Option<String>,
    pub vision_config: Option<VisionConfig>,
    pub mm_tokens_per_image: Option<usize>,
    pub boi_token_index: Option<u32>,
    pub eoi_token_index: Option<u32>,
}

/// The keys of `vision_config` that size a fixed span.
#[derive(Debug, Deserialize)]
pub(super) struct VisionConfig {
    pub image_size: Option<u32>,
    pub patch_size: Option<u32>,
}

/// The JSON file at `path`, read as `T`; the error names the file.
pub(super) fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> Result<T, ImageTokensError> {
    let text = std::fs::read_to_string(path).map_err(|error| ImageTokensError::Read {
        path: path.to_owned(),
        reason: error.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|error| ImageTokensError::Config {
        path: path.to_owned(),
        reason: error.to_string(),
    })
}
