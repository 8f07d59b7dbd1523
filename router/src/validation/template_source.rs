//! Which chat template the router serves with, decided once at start-up.

use std::path::{Path, PathBuf};

use super::family_templates::{family_template, FamilyTemplate};
use super::model_files::ModelFiles;

/// Why the `--chat-template` file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateSourceError {
    #[error("cannot read the chat template {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why the router serves no chat; chat requests are refused with this reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChatUnavailable {
    #[error("chat is disabled on this server (--disable-chat-completions); use /v1/completions or /generate")]
    Disabled,
    #[error("the model has no chat template and none is known for its family: start the router with --chat-template FILE to serve chat, or use /v1/completions or /generate")]
    NoTemplate,
}

/// Where the served chat template comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSource {
    /// The `--chat-template` file's, else the model's own.
    Given(String),
    /// The model ships none; its family's known template stands in.
    Fallback(FamilyTemplate),
    /// No template: chat is refused.
    Unavailable(ChatUnavailable),
}

impl TemplateSource {
    /// The `override_file` (`--chat-template`), else the model's own template, else its
    /// family's known one; none when chat is disabled or the family is unknown, so that a
    /// model without a template still serves completions.
    pub fn choose(
        files: &ModelFiles,
        override_file: Option<&Path>,
        chat_enabled: bool,
    ) -> Result<Self, TemplateSourceError> {
        if !chat_enabled {
            return Ok(Self::Unavailable(ChatUnavailable::Disabled));
        }
        if let Some(path) = override_file {
            let source =
                std::fs::read_to_string(path).map_err(|source| TemplateSourceError::Read {
                    path: path.to_owned(),
                    source,
                })?;
            return Ok(Self::Given(source));
        }
        if let Some(source) = &files.chat_template {
            return Ok(Self::Given(source.clone()));
        }
        let known = files
            .model_type
            .as_deref()
            .and_then(|model_type| family_template(model_type, &files.tokenizer));
        Ok(known.map_or(
            Self::Unavailable(ChatUnavailable::NoTemplate),
            Self::Fallback,
        ))
    }

    /// The Jinja source to compile, or why chat is refused.
    pub fn into_text(self) -> Result<String, ChatUnavailable> {
        match self {
            Self::Given(source) => Ok(source),
            Self::Fallback(known) => Ok(known.source.to_owned()),
            Self::Unavailable(reason) => Err(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testing::{templateless_model_dir, write_model_dir};

    fn files(dir: &tempfile::TempDir) -> ModelFiles {
        ModelFiles::load(dir.path()).unwrap()
    }

    fn own_template_dir() -> tempfile::TempDir {
        write_model_dir(&serde_json::json!({"chat_template": "own"}), None)
    }

    #[test]
    fn the_override_file_wins_and_must_be_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jinja");
        std::fs::write(&path, "override").unwrap();
        let model = files(&own_template_dir());
        let source = TemplateSource::choose(&model, Some(&path), true).unwrap();
        assert_eq!(source, TemplateSource::Given("override".into()));
        let missing = dir.path().join("missing.jinja");
        let error = TemplateSource::choose(&model, Some(&missing), true).unwrap_err();
        assert!(error.to_string().contains("missing.jinja"), "{error}");
    }

    #[test]
    fn the_models_own_template_comes_before_its_familys() {
        let model = files(&own_template_dir());
        let source = TemplateSource::choose(&model, None, true).unwrap();
        assert_eq!(source.into_text().unwrap(), "own");
    }

    #[test]
    fn a_model_without_a_template_falls_back_to_its_familys_known_one() {
        let dir = templateless_model_dir("gemma3_text", &["<start_of_turn>", "<end_of_turn>"]);
        match TemplateSource::choose(&files(&dir), None, true).unwrap() {
            TemplateSource::Fallback(known) => assert_eq!(known.family, "Gemma"),
            other => panic!("expected Gemma's template, got {other:?}"),
        }
    }

    #[test]
    fn an_unknown_family_without_a_template_serves_no_chat_and_says_why() {
        let dir = templateless_model_dir("mistral", &[]);
        let source = TemplateSource::choose(&files(&dir), None, true).unwrap();
        let reason = source.into_text().unwrap_err();
        assert_eq!(reason, ChatUnavailable::NoTemplate);
        assert!(reason.to_string().contains("--chat-template"), "{reason}");
    }

    #[test]
    fn disabled_chat_serves_no_template_even_when_the_model_has_one() {
        let source = TemplateSource::choose(&files(&own_template_dir()), None, false).unwrap();
        assert_eq!(
            source,
            TemplateSource::Unavailable(ChatUnavailable::Disabled)
        );
    }
}
