//! The resize rule against transformers' own `smart_resize`: every expected value below was
//! computed with `transformers.models.qwen2_vl.image_processing_pil_qwen2_vl.smart_resize`
//! (transformers 5.24), tokens as `(h // patch_size) * (w // patch_size) // merge_size**2`.

use super::*;
use crate::images::testing::QWEN2_5_VL_RESIZE as PUBLISHED;

/// The processor's defaults when its configuration names no pixel bounds.
const DEFAULTS: SmartResize = SmartResize {
    max_pixels: 1_003_520,
    ..PUBLISHED
};

/// (width, height, resized height, resized width, tokens).
type Case = (u32, u32, u64, u64, usize);

fn assert_cases(rule: &SmartResize, cases: &[Case]) {
    for &(width, height, h_bar, w_bar, tokens) in cases {
        assert_eq!(
            rule.resized(width, height),
            Ok((h_bar, w_bar)),
            "{width}x{height}"
        );
        assert_eq!(rule.tokens(width, height), Ok(tokens), "{width}x{height}");
    }
}

#[test]
fn published_checkpoints_count_as_transformers_does() {
    assert_cases(
        &PUBLISHED,
        &[
            (1000, 1000, 1008, 1008, 1296),
            (1920, 1080, 1092, 1932, 2691),
            (640, 480, 476, 644, 391),
            (98, 42, 56, 112, 8),
            (56, 56, 56, 56, 4),
            (57, 55, 56, 56, 4),
        ],
    );
}

#[test]
fn ties_round_to_the_even_multiple_as_pythons_round_does() {
    // 70 / 28 = 2.5 rounds to 2 (56 pixels), not 3 (84 pixels: 9 tokens).
    assert_cases(&PUBLISHED, &[(70, 70, 56, 56, 4), (70, 42, 56, 56, 4)]);
}

#[test]
fn tiny_images_are_scaled_up_to_the_least_pixels() {
    assert_cases(
        &PUBLISHED,
        &[
            (1, 1, 56, 56, 4),
            (10, 10, 56, 56, 4),
            (28, 28, 56, 56, 4),
            (1, 57, 448, 28, 16),
        ],
    );
}

#[test]
fn huge_images_are_scaled_down_to_the_most_pixels() {
    assert_cases(
        &PUBLISHED,
        &[
            (3584, 3584, 3584, 3584, 16384),
            (4096, 4096, 3584, 3584, 16384),
            (16384, 16384, 3584, 3584, 16384),
            (u32::MAX, u32::MAX, 3584, 3584, 16384),
            (u32::MAX, 21_474_837, 252, 50680, 16290),
        ],
    );
    assert_cases(
        &DEFAULTS,
        &[
            (1000, 1000, 980, 980, 1225),
            (1920, 1080, 728, 1316, 1222),
            (4096, 4096, 980, 980, 1225),
            (u32::MAX, u32::MAX, 980, 980, 1225),
        ],
    );
}

#[test]
fn extreme_aspect_ratios_up_to_200_are_resized_and_wider_ones_refused() {
    assert_cases(
        &PUBLISHED,
        &[
            (200, 1, 28, 812, 29),
            (1, 200, 812, 28, 29),
            (400, 2, 28, 812, 29),
            (20000, 100, 112, 19992, 2856),
            (65535, 328, 252, 50652, 16281),
        ],
    );
    for (width, height) in [(201, 1), (601, 3), (40, 8192), (5, 0)] {
        assert_eq!(
            PUBLISHED.tokens(width, height),
            Err(ImageError::AspectRatio { width, height })
        );
    }
    let message = ImageError::AspectRatio {
        width: 201,
        height: 1,
    }
    .to_string();
    assert!(
        message.contains("201x1") && message.contains("200"),
        "{message}"
    );
}

#[test]
fn other_processor_settings_follow_the_same_rule() {
    let narrow = SmartResize {
        min_pixels: 1000,
        max_pixels: 200_000,
        ..PUBLISHED
    };
    assert_cases(
        &narrow,
        &[
            (1000, 1000, 420, 420, 225),
            (1920, 1080, 308, 588, 231),
            (640, 480, 364, 504, 234),
            (200, 1, 28, 448, 16),
            (20000, 100, 28, 6300, 225),
        ],
    );
    let patch16 = SmartResize {
        patch_size: 16,
        ..DEFAULTS
    };
    assert_cases(
        &patch16,
        &[
            (70, 42, 64, 96, 6),
            (1000, 1000, 992, 992, 961),
            (640, 480, 480, 640, 300),
            (1920, 1080, 736, 1312, 943),
        ],
    );
    // A ceiling below 200 factor²: the longer side keeps a floor of the factor's multiples.
    let one_token = SmartResize {
        min_pixels: 784,
        max_pixels: 784,
        ..PUBLISHED
    };
    assert_cases(
        &one_token,
        &[
            (1000, 1000, 28, 28, 1),
            (20000, 100, 28, 392, 14),
            (200, 1, 28, 420, 15),
        ],
    );
}

#[test]
fn the_logged_bounds_are_the_counts_at_the_pixel_clamps() {
    assert_eq!(PUBLISHED.token_bounds(), (4, 16384));
    assert_eq!(DEFAULTS.token_bounds(), (4, 1280));
    let sizes = (1..=4096).step_by(97);
    for width in sizes.clone() {
        for height in sizes.clone() {
            let tokens = PUBLISHED.tokens(width, height);
            if let Ok(tokens) = tokens {
                assert!((4..=16384).contains(&tokens), "{width}x{height}: {tokens}");
            }
        }
    }
}

#[test]
fn true_division_is_correctly_rounded_beyond_53_bits_as_pythons_is() {
    // (numerator, denominator, bits of Python's `numerator / denominator`).
    let cases: [(u128, u128, u64); 9] = [
        (
            18_446_744_065_119_617_025,
            12_845_056,
            0x4274_e5e0_a705_3978,
        ),
        (3136, 18_446_744_065_119_617_025, 0x3ca8_8000_0031_0000),
        (9_007_199_254_740_993, 1, 0x4340_0000_0000_0000),
        (9_007_199_254_740_995, 2, 0x4330_0000_0000_0002),
        (1_152_921_504_606_847_104, 129, 0x433f_c07f_01fc_07f1),
        (18_446_744_073_709_551_615, 3, 0x43d5_5555_5555_5555),
        (12_845_056_000_000_007, 12_845_056, 0x41cd_cd65_0000_0005),
        (
            18_446_744_073_709_551_615,
            9_223_372_036_854_775_809,
            0x4000_0000_0000_0000,
        ),
        (5, 1_152_921_504_606_859_321, 0x3c53_ffff_ffff_ffc4),
    ];
    for (numerator, denominator, bits) in cases {
        assert_eq!(
            true_div(numerator, denominator).to_bits(),
            bits,
            "{numerator} / {denominator}"
        );
    }
}

#[test]
fn a_rule_needs_positive_settings_ordered_bounds_and_a_modest_factor() {
    assert!(SmartResize::new(14, 2, 3136, 3136).is_some());
    assert_eq!(SmartResize::new(0, 2, 3136, 12_845_056), None);
    assert_eq!(SmartResize::new(14, 0, 3136, 12_845_056), None);
    assert_eq!(SmartResize::new(14, 2, 0, 12_845_056), None);
    assert_eq!(SmartResize::new(14, 2, 3137, 3136), None);
    assert_eq!(SmartResize::new(65_535, 2, 3136, 12_845_056), None);
    // The largest factor and the widest bounds stay exact at the largest sides.
    let widest = SmartResize::new(65_535, 1, 1, u64::MAX).expect("the largest factor");
    assert_cases(
        &widest,
        &[
            (
                u32::MAX,
                u32::MAX,
                4_294_967_295,
                4_294_967_295,
                4_295_098_369,
            ),
            (u32::MAX, 21_474_837, 21_495_480, 4_294_967_295, 21_496_136),
            (1, 200, 65535, 65535, 1),
        ],
    );
}
