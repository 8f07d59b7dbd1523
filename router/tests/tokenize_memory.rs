//! `/tokenize`'s memory: the tokenization budget reserves an upper bound on everything one
//! answer allocates (the encoding, the ids and offsets kept, the JSON answer), measured by a
//! counting allocator over a 2 MB input. `TANDEM_TOKENIZER_JSON` adds a real model's
//! tokenizer to the measurement.

use std::sync::Arc;

use peak_alloc::PeakAlloc;
use serde_json::{json, Map, Value};
use tandem_router::http::tokenize_answer;
use tandem_router::validation::{
    tokenization_peak_bytes, ChatUnavailable, Limits, Prompt, Validator,
};
use tokenizers::Tokenizer;

#[global_allocator]
static ALLOCATED: PeakAlloc = PeakAlloc;

const INPUT_BYTES: usize = 2_000_000;

/// A byte-level BPE tokenizer without merges: one token per byte, the most tokens, and so the
/// most per-token memory, any input can give.
fn one_token_per_byte() -> Tokenizer {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut vocab = Map::new();
    let mut unprintable = 0u32;
    for byte in 0..=255u8 {
        let symbol = if printable(byte) {
            char::from(byte)
        } else {
            unprintable += 1;
            char::from_u32(255 + unprintable).expect("invariant: below 512")
        };
        vocab.insert(symbol.to_string(), json!(byte));
    }
    let config = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": Value::Object(vocab), "merges": []}
    });
    Tokenizer::from_bytes(config.to_string()).expect("a valid tokenizer")
}

/// English prose with some accents, emoji and code: 2 MB of it.
fn input() -> String {
    let sample = "The quick brown fox jumps over the lazy dog; café, naïve, 😀 {\"k\": [1, 2.5]}\n";
    sample.repeat(INPUT_BYTES / sample.len() + 1)[..INPUT_BYTES]
        .trim_end_matches(|c: char| !c.is_ascii())
        .to_owned()
}

fn validator(tokenizer: Tokenizer) -> Validator {
    let limits = Limits {
        max_input_tokens: usize::MAX,
        max_total_tokens: usize::MAX,
        max_stop_sequences: 4,
    };
    Validator::new(
        Arc::new(tokenizer),
        Err(ChatUnavailable::NoTemplate),
        limits,
    )
}

/// Peak bytes allocated while answering `/tokenize` for `text`, and the answer's size.
async fn measured_peak(validator: &Validator, text: String) -> (usize, usize) {
    let before = ALLOCATED.current_usage();
    ALLOCATED.reset_peak_usage();
    let answer = tokenize_answer(validator, text).await.expect("tokenizes");
    let answer_bytes = answer.json.len();
    drop(answer);
    (ALLOCATED.peak_usage().saturating_sub(before), answer_bytes)
}

/// Peak bytes allocated while a generation's prompt `text` is tokenized.
async fn measured_count(validator: &Validator, text: String) -> (usize, usize) {
    let before = ALLOCATED.current_usage();
    ALLOCATED.reset_peak_usage();
    let tokens = validator
        .count_tokens(Prompt::Text(text))
        .await
        .expect("tokenizes");
    (ALLOCATED.peak_usage().saturating_sub(before), tokens)
}

#[tokio::test(flavor = "current_thread")]
async fn the_reservation_bounds_what_a_two_megabyte_tokenize_allocates() {
    let mut tokenizers = vec![("one token per byte".to_owned(), one_token_per_byte())];
    if let Ok(path) = std::env::var("TANDEM_TOKENIZER_JSON") {
        tokenizers.push((
            path.clone(),
            Tokenizer::from_file(&path).expect("tokenizer.json"),
        ));
    }
    for (name, tokenizer) in tokenizers {
        let validator = validator(tokenizer);
        let text = input();
        let bytes = text.len();
        let reserved = tokenization_peak_bytes(bytes);
        let (peak, answer_bytes) = measured_peak(&validator, text).await;
        println!(
            "{name}: {bytes} input bytes, answer {answer_bytes} bytes, peak {peak} bytes \
             ({:.1} per input byte), reserved {reserved}",
            peak as f64 / bytes as f64
        );
        assert!(
            peak <= reserved,
            "{name}: peak {peak} over the reservation {reserved}"
        );
        let (peak, _) = measured_count(&validator, input()).await;
        let reserved = tokenization_peak_bytes(bytes);
        println!("{name}: ids only, peak {peak} bytes, reserved {reserved}");
        assert!(peak <= reserved, "{name}: ids peak {peak} over {reserved}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_answer_holds_its_reservation_until_it_is_dropped() {
    let text = "hello world".to_owned();
    let validator =
        validator(one_token_per_byte()).with_tokenization_budget(tokenization_peak_bytes(11));
    let first = tokenize_answer(&validator, text.clone())
        .await
        .expect("tokenizes");
    let waiting = std::time::Duration::from_millis(100);
    let second = tokio::time::timeout(waiting, tokenize_answer(&validator, text.clone())).await;
    assert!(
        second.is_err(),
        "a second answer waits while the first is held"
    );
    drop(first);
    assert!(tokenize_answer(&validator, text).await.is_ok());
}
