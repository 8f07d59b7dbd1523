//! Which chat template the router serves with, decided once at start-up.

use std::path::{Path, PathBuf};

/// Why no usable chat template source was found.
#[derive(Debug, thiserror::Error)]
pub enum TemplateSourceError {
    #[error("cannot read the chat template {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the model has no chat template: pass --chat-template FILE, or --disable-chat-completions to serve it without /v1/chat/completions")]
    Missing,
}

/// The template source: the `override_file` (`--chat-template`), else the model's own; none
/// when chat completions are disabled. Chat enabled without any template is an error, so a
/// model that cannot chat fails at start-up instead of on every chat request.
pub fn chat_template_source(
    model_template: Option<String>,
    override_file: Option<&Path>,
    chat_enabled: bool,
) -> Result<Option<String>, TemplateSourceError> {
    if !chat_enabled {
        return Ok(None);
    }
    let source = match override_file {
        Some(path) => {
            Some(
                std::fs::read_to_string(path).map_err(|source| TemplateSourceError::Read {
                    path: path.to_owned(),
                    source,
                })?,
            )
        }
        None => model_template,
    };
    source.map(Some).ok_or(TemplateSourceError::Missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_without_a_chat_template_fails_unless_chat_is_disabled() {
        let error = chat_template_source(None, None, true).unwrap_err();
        assert!(matches!(error, TemplateSourceError::Missing));
        assert!(error.to_string().contains("--chat-template"), "{error}");
        assert_eq!(chat_template_source(None, None, false).unwrap(), None);
        let own = chat_template_source(Some("T".into()), None, true).unwrap();
        assert_eq!(own.as_deref(), Some("T"));
    }

    #[test]
    fn the_override_file_wins_and_must_be_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jinja");
        std::fs::write(&path, "override").unwrap();
        let source = chat_template_source(Some("own".into()), Some(&path), true).unwrap();
        assert_eq!(source.as_deref(), Some("override"));
        let missing = dir.path().join("missing.jinja");
        let error = chat_template_source(None, Some(&missing), true).unwrap_err();
        assert!(error.to_string().contains("missing.jinja"), "{error}");
    }
}
