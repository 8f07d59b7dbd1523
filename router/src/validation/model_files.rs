//! Reads what the router needs from a model directory: tokenizer, chat template, special tokens
//! and the model's family.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use tokenizers::Tokenizer;

use super::sampling_defaults::SamplingDefaults;

/// Why a model directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelFilesError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot load the tokenizer from {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("{path}: `chat_template` must be a string or a list of {{name, template}}")]
    ChatTemplateShape { path: PathBuf },
}

/// Tokenizer-side facts of one model.
#[derive(Debug)]
pub struct ModelFiles {
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// The sampling values `generation_config.json` recommends.
    pub sampling_defaults: SamplingDefaults,
    /// `config.json`'s `model_type` (`llama`, `gemma3_text`, ...): the model's family.
    pub model_type: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    chat_template: Option<Value>,
    bos_token: Option<Value>,
    eos_token: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct ModelConfig {
    model_type: Option<String>,
}

impl ModelFiles {
    /// Loads `tokenizer.json` (required), `tokenizer_config.json`, `chat_template.jinja`,
    /// `generation_config.json` and `config.json` (all optional) from `dir`.
    pub fn load(dir: &Path) -> Result<Self, ModelFilesError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| ModelFilesError::Tokenizer {
                path: tokenizer_path.clone(),
                message: e.to_string(),
            })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = read_optional_json(&config_path)?.unwrap_or_default();
        let template_path = dir.join("chat_template.jinja");
        let chat_template = match read_optional(&template_path)? {
            Some(text) => Some(text),
            None => config
                .chat_template
                .as_ref()
                .map(|value| select_template(value, &config_path))
                .transpose()?
                .flatten(),
        };
        let generation: Value =
            read_optional_json(&dir.join("generation_config.json"))?.unwrap_or_default();
        let model: ModelConfig = read_optional_json(&dir.join("config.json"))?.unwrap_or_default();
        Ok(Self {
            tokenizer,
            chat_template,
            bos_token: config.bos_token.as_ref().and_then(token_content),
            eos_token: config.eos_token.as_ref().and_then(token_content),
            sampling_defaults: SamplingDefaults::from_generation_config(&generation),
            model_type: model.model_type,
        })
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, ModelFilesError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModelFilesError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn read_optional_json<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> Result<Option<T>, ModelFilesError> {
    read_optional(path)?
        .map(|text| {
            serde_json::from_str(&text).map_err(|source| ModelFilesError::Json {
                path: path.to_owned(),
                source,
            })
        })
        .transpose()
}

/// A string template, or from a list of named templates the one named "default".
fn select_template(value: &Value, path: &Path) -> Result<Option<String>, ModelFilesError> {
    let shape_error = || ModelFilesError::ChatTemplateShape {
        path: path.to_owned(),
    };
    match value {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        Value::Array(entries) => {
            for entry in entries {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(template)) => return Ok(Some(template.to_owned())),
                    (Some(_), Some(_)) => {}
                    _ => return Err(shape_error()),
                }
            }
            Ok(None)
        }
        _ => Err(shape_error()),
    }
}

/// Special tokens appear either as plain strings or as `{"content": ...}` objects.
fn token_content(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Object(fields) => fields.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testing::write_model_dir;
    use serde_json::json;

    #[test]
    fn loads_tokenizer_and_config_tokens() {
        let dir = write_model_dir(
            &json!({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": "T"}),
            None,
        );
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [257, 3], "do_sample": true, "temperature": 0.6}"#,
        )
        .unwrap();
        let files = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(files.bos_token.as_deref(), Some("<s>"));
        assert_eq!(files.eos_token.as_deref(), Some("</s>"));
        assert_eq!(files.chat_template.as_deref(), Some("T"));
        assert_eq!(files.sampling_defaults.temperature, Some(0.6));
        assert_eq!(files.model_type, None);
    }

    #[test]
    fn the_model_type_comes_from_config_json() {
        let dir = write_model_dir(&json!({}), None);
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}"#,
        )
        .unwrap();
        let files = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(files.model_type.as_deref(), Some("gemma3_text"));
    }

    #[test]
    fn chat_template_file_takes_precedence() {
        let dir = write_model_dir(&json!({"chat_template": "from config"}), Some("from file"));
        let files = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(files.chat_template.as_deref(), Some("from file"));
        assert!(files.sampling_defaults.is_empty());
    }

    #[test]
    fn named_templates_pick_default() {
        let config = json!({"chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "plain"}
        ]});
        let dir = write_model_dir(&config, None);
        let files = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(files.chat_template.as_deref(), Some("plain"));
    }

    #[test]
    fn missing_tokenizer_is_a_clear_error() {
        let dir = write_model_dir(&json!({}), None);
        std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
        let error = ModelFiles::load(dir.path()).unwrap_err();
        assert!(error.to_string().contains("tokenizer.json"), "{error}");
    }
}
