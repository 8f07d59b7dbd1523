//! Qwen2-VL's image resize (`smart_resize` in transformers' `image_processing_qwen2_vl`) and the
//! number of tokens an image takes after it. The shards count each image again with the
//! processor itself and fail a request whose count differs, so every step here reproduces
//! Python's arithmetic: true division correctly rounded, `round` to the even integer on ties,
//! `math.floor`, `math.ceil` and `math.sqrt` on `f64`.

use super::ImageError;

/// Widest aspect ratio (longer side over shorter) the processor resizes; it refuses wider ones.
const MAX_ASPECT_RATIO: f64 = 200.0;

/// Largest `patch_size * merge_size` a rule takes: resized sides then stay far within `u64`.
const MAX_FACTOR: u64 = u16::MAX as u64;

/// The resize rule of one model's image processor: both sides become multiples of
/// `patch_size * merge_size` (the factor) and the area lands within `min_pixels..=max_pixels`,
/// keeping the aspect ratio as well as it can. Invariant (kept by `new`): every field is
/// positive, the factor is at most `MAX_FACTOR` and `min_pixels <= max_pixels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmartResize {
    patch_size: u32,
    merge_size: u32,
    min_pixels: u64,
    max_pixels: u64,
}

impl SmartResize {
    /// The rule for these settings; `None` unless each is positive, `patch_size * merge_size`
    /// is at most 65,535 and `min_pixels <= max_pixels`.
    pub const fn new(
        patch_size: u32,
        merge_size: u32,
        min_pixels: u64,
        max_pixels: u64,
    ) -> Option<Self> {
        let factor = patch_size as u64 * merge_size as u64;
        if factor == 0 || factor > MAX_FACTOR || min_pixels == 0 || min_pixels > max_pixels {
            return None;
        }
        Some(Self {
            patch_size,
            merge_size,
            min_pixels,
            max_pixels,
        })
    }

    /// Fewest pixels an image is resized to (`min_pixels`).
    pub fn min_pixels(&self) -> u64 {
        self.min_pixels
    }

    /// Most pixels an image is resized to (`max_pixels`), save that no side goes below the
    /// factor.
    pub fn max_pixels(&self) -> u64 {
        self.max_pixels
    }

    /// Side of the square of pixels one image token covers.
    fn factor(&self) -> u64 {
        u64::from(self.patch_size) * u64::from(self.merge_size)
    }

    /// The (height, width) a `width` x `height` image is resized to, as `smart_resize` returns
    /// it; refused when one side is more than 200 times the other (or zero), as the processor
    /// refuses it.
    pub fn resized(&self, width: u32, height: u32) -> Result<(u64, u64), ImageError> {
        let refused = ImageError::AspectRatio { width, height };
        let (long, short) = (width.max(height), width.min(height));
        if short == 0 || f64::from(long) / f64::from(short) > MAX_ASPECT_RATIO {
            return Err(refused);
        }
        let factor = self.factor();
        let factor_f = factor as f64;
        let (h, w) = (u64::from(height), u64::from(width));
        let (h_f, w_f) = (f64::from(height), f64::from(width));
        let pixels = u128::from(h) * u128::from(w);
        let mut h_bar = to_int((h_f / factor_f).round_ties_even()) * factor;
        let mut w_bar = to_int((w_f / factor_f).round_ties_even()) * factor;
        let area = u128::from(h_bar) * u128::from(w_bar);
        if area > u128::from(self.max_pixels) {
            let beta = true_div(pixels, u128::from(self.max_pixels)).sqrt();
            h_bar = factor.max(to_int((h_f / beta / factor_f).floor()) * factor);
            w_bar = factor.max(to_int((w_f / beta / factor_f).floor()) * factor);
        } else if area < u128::from(self.min_pixels) {
            let beta = true_div(u128::from(self.min_pixels), pixels).sqrt();
            h_bar = to_int((h_f * beta / factor_f).ceil()) * factor;
            w_bar = to_int((w_f * beta / factor_f).ceil()) * factor;
        }
        Ok((h_bar, w_bar))
    }

    /// Tokens a `width` x `height` image takes: one per `merge_size` x `merge_size` patches of
    /// its resized size (`grid_h * grid_w / merge_size²`, each grid side a multiple of
    /// `merge_size`). Saturates rather than overflows; such a count is refused as too long.
    pub fn tokens(&self, width: u32, height: u32) -> Result<usize, ImageError> {
        let (h_bar, w_bar) = self.resized(width, height)?;
        let factor = self.factor();
        let tokens = u128::from(h_bar / factor) * u128::from(w_bar / factor);
        Ok(usize::try_from(tokens).unwrap_or(usize::MAX))
    }

    /// The counts at the pixel clamps: an image resized up to `min_pixels` takes the first, one
    /// resized down to `max_pixels` at most the second. Every image within 200:1 takes a count
    /// between them when `max_pixels` is at least 200 factor² and 4 `min_pixels` (so no side
    /// floors to nothing and flooring both sides at most quarters the area), as in every
    /// published checkpoint.
    pub fn token_bounds(&self) -> (usize, usize) {
        let unit = u128::from(self.factor()).pow(2);
        let saturate = |tokens: u128| usize::try_from(tokens).unwrap_or(usize::MAX);
        let least = u128::from(self.min_pixels).div_ceil(unit).max(1);
        let most = (u128::from(self.max_pixels) / unit).max(1);
        (saturate(least), saturate(most))
    }
}

/// A non-negative whole `f64` (a result of `floor`, `ceil` or `round`) as an integer; the
/// values here are below 2^40, far within `u64`.
fn to_int(value: f64) -> u64 {
    value as u64
}

/// `numerator / denominator` correctly rounded to the nearest `f64` (ties to even), as
/// Python's `int / int` gives it even when an operand has more than 53 bits.
/// Invariant: both are positive and below 2^72.
fn true_div(numerator: u128, denominator: u128) -> f64 {
    const EXACT: u128 = 1 << f64::MANTISSA_DIGITS;
    if numerator <= EXACT && denominator <= EXACT {
        return numerator as f64 / denominator as f64;
    }
    let bits = |value: u128| (u128::BITS - value.leading_zeros()).cast_signed();
    // Scale so the integer quotient has 55 or 56 bits: two or three beyond the mantissa.
    let shift = 55 + bits(denominator) - bits(numerator);
    let (scaled, divisor) = if shift >= 0 {
        (numerator << shift, denominator)
    } else {
        (numerator, denominator << -shift)
    };
    let quotient = scaled / divisor;
    let inexact = scaled % divisor != 0;
    let extra = bits(quotient) - 53;
    let mut mantissa = quotient >> extra;
    let dropped = quotient & ((1 << extra) - 1);
    let half = 1 << (extra - 1);
    if dropped > half || (dropped == half && (inexact || mantissa & 1 == 1)) {
        mantissa += 1;
    }
    mantissa as f64 * 2f64.powi(extra - shift)
}

#[cfg(test)]
#[path = "smart_resize_tests.rs"]
mod tests;
