//! Images for tests: small encoded files and the `data:` URLs that carry them.

use std::io::Cursor;

use base64::Engine;
use image::{DynamicImage, ImageFormat, RgbImage};

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
