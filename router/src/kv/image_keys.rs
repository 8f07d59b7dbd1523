//! The prefix cache's view of a prompt with images: every position of an image's span is keyed
//! by the image's digest instead of the placeholder token, so blocks computed over one image are
//! never found by a prompt holding another, and the same image finds them again.

use std::borrow::Cow;

use crate::images::PromptImage;

/// Set on every image key and on no token id (vocabularies stay far below 2^31).
const IMAGE_KEY_BIT: u32 = 1 << 31;

/// Whether a cache key stands for an image position rather than a token.
pub fn is_image_key(key: u32) -> bool {
    key & IMAGE_KEY_BIT != 0
}

/// `tokens` as the prefix cache keys them: each image span's positions replaced by keys drawn
/// from its digest and the position within the span. Borrowed when there is no image.
///
/// Two different images collide at one position with probability 2^-31; a block that covers two
/// or more of an image's positions needs all of them to collide.
pub fn cache_keys<'a>(tokens: &'a [u32], images: &[PromptImage]) -> Cow<'a, [u32]> {
    if images.is_empty() {
        return Cow::Borrowed(tokens);
    }
    let mut keys = tokens.to_vec();
    for image in images {
        let end = (image.offset + image.num_tokens).min(keys.len());
        for (index, key) in keys[image.offset.min(end)..end].iter_mut().enumerate() {
            *key = image_key(&image.digest, index);
        }
    }
    Cow::Owned(keys)
}

/// The key of position `index` within the span of the image with `digest`.
fn image_key(digest: &[u8; 32], index: usize) -> u32 {
    let word = index % 8;
    let chunk: [u8; 4] = digest[word * 4..word * 4 + 4]
        .try_into()
        .expect("invariant: a 4-byte window of a 32-byte digest");
    let position = u32::try_from(index).unwrap_or(u32::MAX);
    let mixed = u32::from_le_bytes(chunk) ^ position.wrapping_mul(0x9E37_79B9);
    IMAGE_KEY_BIT | mixed
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn image(byte: u8, offset: usize, num_tokens: usize) -> PromptImage {
        PromptImage {
            data: Bytes::new(),
            digest: [byte; 32],
            offset,
            num_tokens,
        }
    }

    #[test]
    fn a_prompt_without_images_is_its_own_key() {
        let tokens = [1, 2, 3];
        assert!(matches!(cache_keys(&tokens, &[]), Cow::Borrowed(_)));
    }

    #[test]
    fn only_the_span_is_keyed_by_the_image() {
        let tokens = [5, 9, 9, 9, 6];
        let keys = cache_keys(&tokens, &[image(1, 1, 3)]);
        assert_eq!((keys[0], keys[4]), (5, 6));
        assert!(keys[1..4].iter().all(|&key| is_image_key(key)));
        assert!(!tokens.iter().any(|&token| is_image_key(token)));
    }

    #[test]
    fn the_same_image_keys_the_same_and_another_image_differently() {
        let tokens = vec![9; 20];
        let first = cache_keys(&tokens, &[image(1, 0, 20)]).into_owned();
        let again = cache_keys(&tokens, &[image(1, 0, 20)]).into_owned();
        let other = cache_keys(&tokens, &[image(2, 0, 20)]).into_owned();
        assert_eq!(first, again);
        assert!(first.iter().zip(&other).all(|(a, b)| a != b));
    }

    #[test]
    fn positions_within_a_span_key_differently() {
        let tokens = vec![9; 20];
        let keys = cache_keys(&tokens, &[image(3, 0, 20)]);
        assert_ne!(keys[0], keys[8], "the same digest word in the next round");
        assert_ne!(keys[0], keys[1]);
    }
}
