//! A small byte-level BPE tokenizer built in code, so tests never download a model.
//!
//! Ids 0..=255 are the bytes, 256 is `<s>` (BOS, added by the post-processor), 257 is
//! `</s>` (EOS), 258.. are a few merges. Multi-byte characters split into one token per byte.

use serde_json::{json, Map, Value};
use tokenizers::Tokenizer;

pub const BOS_ID: u32 = 256;
pub const EOS_ID: u32 = 257;

/// GPT-2's reversible byte → printable character map.
fn byte_to_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&b| !printable(b)).count();
    char::from_u32(256 + u32::try_from(rank).unwrap()).unwrap()
}

pub fn tokenizer_json() -> Value {
    tokenizer_json_with_special_tokens(&[])
}

/// The test tokenizer's JSON with `special` added as special tokens, numbered after the merges.
pub fn tokenizer_json_with_special_tokens(special: &[&str]) -> Value {
    let mut vocab = Map::new();
    for byte in 0..=255u8 {
        vocab.insert(byte_to_char(byte).to_string(), json!(u32::from(byte)));
    }
    vocab.insert("<s>".to_owned(), json!(BOS_ID));
    vocab.insert("</s>".to_owned(), json!(EOS_ID));
    let merges = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("Ġ", "w"),
    ];
    for (id, (left, right)) in (258u32..).zip(merges) {
        vocab.insert(format!("{left}{right}"), json!(id));
    }
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let first_special = 258 + u32::try_from(merges.len()).unwrap();
    let mut added_tokens = vec![added(BOS_ID, "<s>"), added(EOS_ID, "</s>")];
    for (id, content) in (first_special..).zip(special) {
        vocab.insert((*content).to_owned(), json!(id));
        added_tokens.push(added(id, content));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [BOS_ID], "tokens": ["<s>"]}}
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|(l, r)| format!("{l} {r}")).collect::<Vec<_>>()
        }
    })
}

/// The test tokenizer.
pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_bytes(tokenizer_json().to_string().as_bytes()).unwrap()
}

/// The test tokenizer knowing `special` as special tokens.
pub fn tokenizer_with_special_tokens(special: &[&str]) -> Tokenizer {
    let json = tokenizer_json_with_special_tokens(special).to_string();
    Tokenizer::from_bytes(json.as_bytes()).unwrap()
}
