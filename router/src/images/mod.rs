//! Images in prompts: where their bytes come from, the limits each one is held to, and the span
//! of image tokens each one takes in a prompt.

mod check;
mod families;
mod fetch;
mod model_config;
mod placement;
mod qwen2_vl;
mod smart_resize;
mod source;
mod spans;
#[cfg(test)]
pub(crate) mod testing;

pub use check::{check_image, CheckedImage, ImageHeader};
pub use fetch::{is_public, refuse_url, FetcherSetupError, MediaFetchConfig, MediaFetcher};
pub use smart_resize::SmartResize;
pub use source::{base64_image, inline_image};
pub use spans::{ImageMarks, ImageTokens, ImageTokensError, SpanLength};

use bytes::Bytes;
use serde::Serialize;
use utoipa::ToSchema;

/// The digest an image is known by: SHA-256 of its encoded bytes.
pub type ImageDigest = [u8; 32];

/// An image placed in a prompt: its encoded bytes, its digest and the span of prompt positions
/// its embeddings take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptImage {
    pub data: Bytes,
    pub digest: ImageDigest,
    /// The span is positions `offset..offset + num_tokens`; spans of one prompt never overlap.
    pub offset: usize,
    pub num_tokens: usize,
}

/// A checked image and the number of prompt tokens its span takes (see `SpanLength::tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizedImage {
    pub image: CheckedImage,
    pub num_tokens: usize,
}

/// Bounds on the images one request may carry; each also bounds the work of decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args, Serialize, ToSchema)]
pub struct ImageLimits {
    /// Most images one request may carry (a model that takes no images refuses every one).
    #[arg(long, env = "MAX_IMAGES_PER_REQUEST", default_value_t = 8)]
    pub max_images_per_request: usize,
    /// Largest encoded image, in bytes (after base64 decoding).
    #[arg(long, env = "MAX_IMAGE_BYTES", default_value_t = 20 * 1024 * 1024)]
    pub max_image_bytes: usize,
    /// Most pixels (width times height) of one image; a larger one is refused before it is
    /// decoded.
    #[arg(long, env = "MAX_IMAGE_PIXELS", default_value_t = 4096 * 4096)]
    pub max_image_pixels: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_images_per_request: 8,
            max_image_bytes: 20 * 1024 * 1024,
            max_image_pixels: 4096 * 4096,
        }
    }
}

/// Why an image is refused; each is the client's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error(
        "only `data:` image URLs (`data:image/png;base64,...`) and `http(s)` URLs are accepted, not `{scheme}:` URLs"
    )]
    NotInline { scheme: String },
    #[error("its host `{host}` is not in --allowed-media-domains: send the image inline as a base64 `data:` URL")]
    HostNotAllowed { host: String },
    #[error("its host `{host}` is a private address, which images are not fetched from")]
    PrivateAddress { host: String },
    #[error("it could not be fetched: {reason}")]
    Fetch { reason: String },
    #[error("its URL is not a base64 `data:` URL: {reason}")]
    BadDataUrl { reason: String },
    #[error("it takes {bytes} bytes, more than the {max} this server accepts (--max-image-bytes)")]
    TooLarge { bytes: usize, max: usize },
    #[error("it is {width}x{height} pixels, more than the {max} this server accepts (--max-image-pixels)")]
    TooManyPixels { width: u32, height: u32, max: u64 },
    #[error(
        "it is {width}x{height} pixels, one side more than 200 times the other, which this \
         model's image processor refuses"
    )]
    AspectRatio { width: u32, height: u32 },
    #[error("it is not a PNG, JPEG, WebP or GIF file")]
    UnknownFormat,
    #[error("it cannot be decoded: {reason}")]
    Corrupt { reason: String },
}
