//! Test model directories and prompts over the code-built test tokenizer
//! (`crate::test_tokenizer`, re-exported here).

use std::path::Path;

use serde_json::{json, Value};

pub use crate::test_tokenizer::*;

/// The chat template the test model directory ships (ChatML, like many small models).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|{{ message.role }}|>{{ message.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// Token ids of `text` without special tokens.
pub fn encode(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).unwrap().get_ids().to_vec()
}

/// Writes a model directory with `tokenizer.json`, the given `tokenizer_config.json` and
/// optionally a `chat_template.jinja`.
pub fn write_model_dir(tokenizer_config: &Value, template_file: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "tokenizer.json", &tokenizer_json().to_string());
    write_file(
        dir.path(),
        "tokenizer_config.json",
        &tokenizer_config.to_string(),
    );
    if let Some(template) = template_file {
        write_file(dir.path(), "chat_template.jinja", template);
    }
    dir
}

/// A model directory like a real instruct model's: ChatML template, `<s>`/`</s>`.
pub fn chat_model_dir() -> tempfile::TempDir {
    write_model_dir(
        &json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHATML_TEMPLATE}),
        None,
    )
}

/// A model directory without a chat template, like a base model's: a `config.json` naming
/// `model_type`, and a tokenizer that knows `special` as special tokens.
pub fn templateless_model_dir(model_type: &str, special: &[&str]) -> tempfile::TempDir {
    let dir = write_model_dir(&json!({"bos_token": "<s>", "eos_token": "</s>"}), None);
    let tokenizer = tokenizer_json_with_special_tokens(special);
    write_file(dir.path(), "tokenizer.json", &tokenizer.to_string());
    let config = json!({"model_type": model_type});
    write_file(dir.path(), "config.json", &config.to_string());
    dir
}

fn write_file(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn test_tokenizer_round_trips_bytes_and_adds_bos() {
    let tokenizer = tokenizer();
    let encoding = tokenizer.encode("hello wörld", true).unwrap();
    assert_eq!(encoding.get_ids()[0], BOS_ID);
    assert!(
        encoding.get_ids().contains(&261),
        "merges apply: {:?}",
        encoding.get_ids()
    );
    let text = tokenizer.decode(encoding.get_ids(), true).unwrap();
    assert_eq!(text, "hello wörld");
}
