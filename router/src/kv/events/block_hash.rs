//! Block hashes exactly as vLLM's `sha256_cbor` prefix-caching hash computes them, so that
//! consumers of the KV events (llm-d's precise prefix-cache scorer, Dynamo's KV router) can
//! recompute them from token ids:
//!
//! - root: `sha256(cbor(seed))`, the seed being the text vLLM reads from `PYTHONHASHSEED`;
//! - block: `sha256(cbor([parent_hash_bytes, [token ids...], extra_keys]))`, the parent being
//!   the previous block's 32-byte hash or the root for a sequence's first block; the extra keys
//!   are `[lora_name]` for a block computed under a LoRA adapter, else `null` (Tandem has no
//!   multimodal input or cache salt);
//! - on the wire: the digest's last 8 bytes as a big-endian `u64` (vLLM's integer block hashes).
//!
//! CBOR here is canonical (RFC 8949 preferred serialization): every length and integer in its
//! shortest form, which is what `cbor2.dumps(..., canonical=True)` writes.

use sha2::{Digest, Sha256};

/// A block's full 32-byte digest; the chain continues from it.
pub(crate) type BlockDigest = [u8; 32];

const MAJOR_UNSIGNED: u8 = 0;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const CBOR_NULL: u8 = 0xf6;

/// Chains block digests from a seed-derived root.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    root: BlockDigest,
}

impl BlockHasher {
    /// A hasher whose root digest comes from `seed` (vLLM's `PYTHONHASHSEED` value).
    pub fn new(seed: &str) -> Self {
        let mut encoded = Vec::with_capacity(seed.len() + 9);
        write_head(&mut encoded, MAJOR_TEXT, seed.len() as u64);
        encoded.extend_from_slice(seed.as_bytes());
        Self {
            root: Sha256::digest(&encoded).into(),
        }
    }

    /// The digest of the block holding `tokens` after the prefix ending in `parent`
    /// (`None`: the first block of a sequence), computed under the LoRA adapter `lora`.
    pub(crate) fn block(
        &self,
        parent: Option<&BlockDigest>,
        tokens: &[u32],
        lora: Option<&str>,
    ) -> BlockDigest {
        let parent = parent.unwrap_or(&self.root);
        let mut encoded = Vec::with_capacity(40 + tokens.len() * 5);
        write_head(&mut encoded, MAJOR_ARRAY, 3);
        write_head(&mut encoded, MAJOR_BYTES, parent.len() as u64);
        encoded.extend_from_slice(parent);
        write_head(&mut encoded, MAJOR_ARRAY, tokens.len() as u64);
        for &token in tokens {
            write_head(&mut encoded, MAJOR_UNSIGNED, u64::from(token));
        }
        match lora {
            Some(name) => {
                write_head(&mut encoded, MAJOR_ARRAY, 1);
                write_head(&mut encoded, MAJOR_TEXT, name.len() as u64);
                encoded.extend_from_slice(name.as_bytes());
            }
            None => encoded.push(CBOR_NULL),
        }
        Sha256::digest(&encoded).into()
    }
}

/// The block hash consumers see: the digest's last 8 bytes, big-endian.
pub(crate) fn external(digest: &BlockDigest) -> u64 {
    let mut tail = [0; 8];
    tail.copy_from_slice(&digest[24..]);
    u64::from_be_bytes(tail)
}

/// A CBOR item head in its shortest form.
fn write_head(out: &mut Vec<u8>, major: u8, value: u64) {
    let major = major << 5;
    if value < 24 {
        out.push(major | value as u8);
    } else if let Ok(byte) = u8::try_from(value) {
        out.extend_from_slice(&[major | 24, byte]);
    } else if let Ok(short) = u16::try_from(value) {
        out.push(major | 25);
        out.extend_from_slice(&short.to_be_bytes());
    } else if let Ok(word) = u32::try_from(value) {
        out.push(major | 26);
        out.extend_from_slice(&word.to_be_bytes());
    } else {
        out.push(major | 27);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    #[test]
    fn cbor_heads_use_the_shortest_form() {
        let mut out = Vec::new();
        for value in [0, 23, 24, 255, 256, 65_535, 65_536, u64::from(u32::MAX) + 1] {
            write_head(&mut out, MAJOR_UNSIGNED, value);
        }
        assert_eq!(
            hex(&out),
            "00171818\
             18ff190100\
             19ffff1a00010000\
             1b0000000100000000"
        );
    }

    #[test]
    fn root_digest_is_sha256_of_the_cbor_text_seed() {
        // sha256(b"\x61" b"0"): cbor2.dumps("0") is 0x61 0x30.
        let expected = Sha256::digest([0x61, b'0']);
        assert_eq!(BlockHasher::new("0").root, <[u8; 32]>::from(expected));
    }

    #[test]
    fn block_digest_hashes_parent_tokens_and_null_as_a_cbor_array() {
        let hasher = BlockHasher::new("0");
        let tokens = [1, 24, 300];
        let mut expected = vec![0x83, 0x58, 0x20];
        expected.extend_from_slice(&hasher.root);
        expected.extend_from_slice(&[0x83, 0x01, 0x18, 24, 0x19, 0x01, 0x2c, 0xf6]);
        let first = hasher.block(None, &tokens, None);
        assert_eq!(first, <[u8; 32]>::from(Sha256::digest(&expected)));
        let second = hasher.block(Some(&first), &tokens, None);
        assert_ne!(second, first, "a block's hash depends on its prefix");
        assert_eq!(second, hasher.block(Some(&first), &tokens, None));
    }

    /// A block computed under a LoRA adapter carries `(lora_name,)` as its extra keys, as
    /// vLLM's `_gen_lora_extra_hash_keys` makes them; reference values from Python's
    /// `sha256(cbor2.dumps((parent, (1, 2, 3, 4), ("sql-expert",)), canonical=True))`.
    #[test]
    fn a_lora_blocks_hash_carries_the_adapter_name_as_its_extra_key() {
        let hasher = BlockHasher::new("42");
        let first = hasher.block(None, &[1, 2, 3, 4], Some("sql-expert"));
        let second = hasher.block(Some(&first), &[5, 6, 7, 8], Some("sql-expert"));
        assert_eq!(external(&first), 1_019_035_049_252_241_792);
        assert_eq!(external(&second), 7_648_855_173_845_807_848);
        assert_ne!(first, hasher.block(None, &[1, 2, 3, 4], None));
    }

    /// Reference values from the published algorithm in Python:
    /// `sha256(cbor2.dumps((parent, tuple(tokens), None), canonical=True))`, root
    /// `sha256(cbor2.dumps("42", canonical=True))`, last 8 bytes big-endian.
    #[test]
    fn known_sequences_hash_to_vllms_sha256_cbor_reference_values() {
        let hasher = BlockHasher::new("42");
        let tokens: Vec<u32> = (1..=32).collect();
        let first = hasher.block(None, &tokens[..16], None);
        let second = hasher.block(Some(&first), &tokens[16..], None);
        assert_eq!(external(&first), 0xe235_fcc8_4bc5_706d);
        assert_eq!(external(&second), 0x7856_ae50_e4ba_5af8);
        let widths = [0, 23, 24, 255, 256, 65_535, 65_536, u32::MAX];
        assert_eq!(
            external(&hasher.block(None, &widths, None)),
            0xf4d4_c217_6844_8575
        );
    }

    #[test]
    fn external_hash_is_the_last_eight_bytes_big_endian() {
        let mut digest = [0; 32];
        digest[24..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(external(&digest), 0x0102_0304_0506_0708);
    }
}
