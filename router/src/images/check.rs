//! An image's checks: a format Tandem decodes, a size within the limits, and a file that
//! decodes to the end (a truncated or corrupt file is refused here, never at the shards).

use std::io::Cursor;

use bytes::Bytes;
use image::{ImageFormat, ImageReader, Limits};
use sha2::{Digest, Sha256};

use super::{ImageDigest, ImageError, ImageLimits};

/// The formats images may come in; GIFs serve their first frame.
const FORMATS: [ImageFormat; 4] = [
    ImageFormat::Png,
    ImageFormat::Jpeg,
    ImageFormat::WebP,
    ImageFormat::Gif,
];

/// An image whose header was read: its format and size, within the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    format: ImageFormat,
    pub width: u32,
    pub height: u32,
}

impl ImageHeader {
    /// The format and size `data` declares, refused when the format is not served or the
    /// size is over `limits`; reads only the header.
    pub fn read(data: &[u8], limits: &ImageLimits) -> Result<Self, ImageError> {
        let format = image::guess_format(data)
            .ok()
            .filter(|format| FORMATS.contains(format))
            .ok_or(ImageError::UnknownFormat)?;
        let (width, height) = ImageReader::with_format(Cursor::new(data), format)
            .into_dimensions()
            .map_err(|error| ImageError::Corrupt {
                reason: error.to_string(),
            })?;
        if u64::from(width) * u64::from(height) > limits.max_image_pixels {
            return Err(ImageError::TooManyPixels {
                width,
                height,
                max: limits.max_image_pixels,
            });
        }
        Ok(Self {
            format,
            width,
            height,
        })
    }

    /// Bytes its decoding holds at most: four per pixel, whatever the format.
    pub fn decoded_bytes(&self) -> usize {
        decoded_bytes(self.width, self.height)
    }
}

/// Bytes of a `width` x `height` image decoded to 8-bit RGBA.
pub fn decoded_bytes(width: u32, height: u32) -> usize {
    let pixels = u64::from(width) * u64::from(height);
    usize::try_from(pixels.saturating_mul(4)).unwrap_or(usize::MAX)
}

/// An image that decoded to the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedImage {
    pub data: Bytes,
    pub digest: ImageDigest,
    pub header: ImageHeader,
}

/// Decodes `data` (whose header is `header`) to its end, so a corrupt file is refused, and
/// digests it. Runs on a blocking thread: decoding takes milliseconds per megapixel.
pub fn check_image(data: Bytes, header: ImageHeader) -> Result<CheckedImage, ImageError> {
    let mut reader = ImageReader::with_format(Cursor::new(&data[..]), header.format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(header.width);
    limits.max_image_height = Some(header.height);
    limits.max_alloc =
        Some(u64::try_from(header.decoded_bytes()).unwrap_or(u64::MAX) * 2 + (1 << 20));
    reader.limits(limits);
    reader.decode().map_err(|error| ImageError::Corrupt {
        reason: error.to_string(),
    })?;
    let digest = Sha256::digest(&data).into();
    Ok(CheckedImage {
        data,
        digest,
        header,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::testing::encoded;

    fn checked(data: Vec<u8>, limits: &ImageLimits) -> Result<CheckedImage, ImageError> {
        let header = ImageHeader::read(&data, limits)?;
        check_image(Bytes::from(data), header)
    }

    #[test]
    fn every_served_format_decodes_with_its_size_and_digest() {
        for format in FORMATS {
            let data = encoded(format, 12, 9);
            let image = checked(data.clone(), &ImageLimits::default()).expect("decodes");
            assert_eq!(
                (image.header.width, image.header.height),
                (12, 9),
                "{format:?}"
            );
            assert_eq!(image.digest, <[u8; 32]>::from(Sha256::digest(&data)));
        }
    }

    #[test]
    fn a_truncated_png_is_refused_as_corrupt() {
        let mut data = encoded(ImageFormat::Png, 64, 64);
        data.truncate(data.len() / 2);
        assert!(matches!(
            checked(data, &ImageLimits::default()),
            Err(ImageError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_file_of_another_kind_is_refused() {
        let data = b"%PDF-1.7 not an image".to_vec();
        assert_eq!(
            checked(data, &ImageLimits::default()),
            Err(ImageError::UnknownFormat)
        );
    }

    #[test]
    fn an_image_over_the_pixel_limit_is_refused_from_its_header() {
        let limits = ImageLimits {
            max_image_pixels: 100,
            ..ImageLimits::default()
        };
        assert_eq!(
            ImageHeader::read(&encoded(ImageFormat::Png, 11, 10), &limits),
            Err(ImageError::TooManyPixels {
                width: 11,
                height: 10,
                max: 100
            })
        );
        assert!(ImageHeader::read(&encoded(ImageFormat::Png, 10, 10), &limits).is_ok());
    }
}
