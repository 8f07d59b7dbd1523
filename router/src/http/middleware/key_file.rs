//! The API key file format: one key per line, optionally followed by its fair-scheduling
//! weight and its name for metrics (`KEY weight=4 name=team-a`); blank lines and lines
//! starting with `#` are skipped. Errors name the file and line, never the key.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::path::Path;

use crate::tenant::KeyName;

/// Why the configured keys cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("cannot read the API key file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{origin}: an API key must be printable ASCII without spaces, optionally followed by \
         `weight=N`"
    )]
    Malformed { origin: String },
    #[error("{origin}: a key's weight must be one `weight=N` with N a whole number from 1 to 4294967295")]
    Weight { origin: String },
    #[error(
        "{origin}: a key's name must be one `name=NAME` of 1 to {MAX_NAME_BYTES} letters, digits, \
         `_`, `.` or `-`"
    )]
    Name { origin: String },
    #[error("the API key files hold no key ({paths})")]
    Empty { paths: String },
}

/// Every key name the router has read, interned for its lifetime (see `KeyName`).
pub(super) type Names = HashSet<&'static str>;

/// The longest key name, in bytes: names label per-key metrics.
pub const MAX_NAME_BYTES: usize = 64;

/// An accepted key, its weight (1 unless its line says otherwise) and its name, if its line
/// gives one.
#[derive(Clone)]
pub(super) struct WeightedKey {
    pub key: Vec<u8>,
    pub weight: NonZeroU32,
    pub name: Option<KeyName>,
}

/// Checks one key as given (inline or on a key file line named by `origin`).
pub(super) fn checked(key: &str, origin: &str) -> Result<Vec<u8>, ApiKeyError> {
    if key.is_empty() || !key.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(ApiKeyError::Malformed {
            origin: origin.to_owned(),
        });
    }
    Ok(key.as_bytes().to_vec())
}

/// The keys of the file at `path`, in file order.
pub(super) fn read_key_file(
    path: &Path,
    names: &mut Names,
) -> Result<Vec<WeightedKey>, ApiKeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| ApiKeyError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_key_file(&text, &path.display().to_string(), names)
}

/// The keys in `text`, a key file's contents; `file` names it in errors.
pub(super) fn parse_key_file(
    text: &str,
    file: &str,
    names: &mut Names,
) -> Result<Vec<WeightedKey>, ApiKeyError> {
    text.lines()
        .enumerate()
        .map(|(index, line)| (index, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(index, line)| parse_key_line(line, &format!("{file} line {}", index + 1), names))
        .collect()
}

/// `KEY`, optionally followed by `weight=N` (N a whole number from 1 to 2^32 - 1) and
/// `name=NAME`, in either order.
fn parse_key_line(line: &str, origin: &str, names: &mut Names) -> Result<WeightedKey, ApiKeyError> {
    let mut words = line.split_whitespace();
    let key = checked(words.next().unwrap_or_default(), origin)?;
    let mut weight = None;
    let mut name = None;
    for word in words {
        if let Some(value) = word.strip_prefix("weight=") {
            if weight.replace(parse_weight(value, origin)?).is_some() {
                return Err(ApiKeyError::Weight {
                    origin: origin.to_owned(),
                });
            }
        } else if let Some(value) = word.strip_prefix("name=") {
            if name.replace(parse_name(value, origin, names)?).is_some() {
                return Err(ApiKeyError::Name {
                    origin: origin.to_owned(),
                });
            }
        } else {
            // The word may be part of a key with a space in it: it is not echoed.
            return Err(ApiKeyError::Malformed {
                origin: origin.to_owned(),
            });
        }
    }
    Ok(WeightedKey {
        key,
        weight: weight.unwrap_or(NonZeroU32::MIN),
        name,
    })
}

fn parse_name(value: &str, origin: &str, names: &mut Names) -> Result<KeyName, ApiKeyError> {
    let valid = (1..=MAX_NAME_BYTES).contains(&value.len())
        && value
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-'));
    valid
        .then(|| KeyName::intern(value, names))
        .ok_or_else(|| ApiKeyError::Name {
            origin: origin.to_owned(),
        })
}

fn parse_weight(value: &str, origin: &str) -> Result<NonZeroU32, ApiKeyError> {
    let is_decimal = !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_digit());
    is_decimal
        .then(|| value.parse::<NonZeroU32>().ok())
        .flatten()
        .ok_or_else(|| ApiKeyError::Weight {
            origin: origin.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(text: &str) -> Result<Vec<(String, u32)>, ApiKeyError> {
        Ok(parse_key_file(text, "keys.txt", &mut Names::new())?
            .into_iter()
            .map(|key| (String::from_utf8(key.key).unwrap(), key.weight.get()))
            .collect())
    }

    #[test]
    fn a_key_line_may_carry_a_name_for_metrics_in_either_order() {
        let parsed = parse_key_file(
            "sk-a name=team-a\nsk-b weight=3 name=b.ops_2\nsk-c name=c weight=2\nsk-d\n",
            "keys.txt",
            &mut Names::new(),
        )
        .unwrap();
        let names: Vec<_> = parsed
            .iter()
            .map(|key| (key.name.map(KeyName::as_str), key.weight.get()))
            .collect();
        assert_eq!(
            names,
            [
                (Some("team-a"), 1),
                (Some("b.ops_2"), 3),
                (Some("c"), 2),
                (None, 1)
            ]
        );
    }

    #[test]
    fn malformed_names_name_the_file_and_line_without_echoing_the_key() {
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        for line in [
            "sk-secret name=".to_owned(),
            "sk-secret name=a/b".to_owned(),
            "sk-secret name=team\"a".to_owned(),
            format!("sk-secret name={long}"),
            "sk-secret name=a name=b".to_owned(),
        ] {
            let error = match parse_key_file(
                &format!("sk-fine\n{line}\n"),
                "keys.txt",
                &mut Names::new(),
            ) {
                Err(error) => error,
                Ok(_) => panic!("{line} was accepted"),
            };
            assert!(matches!(error, ApiKeyError::Name { .. }), "{line}: {error}");
            let message = error.to_string();
            assert!(message.contains("keys.txt line 2"), "{message}");
            assert!(!message.contains("sk-secret"), "{message}");
        }
    }

    #[test]
    fn a_key_line_may_carry_a_weight_and_a_plain_key_weighs_one() {
        let parsed = weights("# tenants\nsk-plain\n  sk-heavy   weight=4 \n\nsk-one weight=1\n");
        assert_eq!(
            parsed.unwrap(),
            [
                ("sk-plain".to_owned(), 1),
                ("sk-heavy".to_owned(), 4),
                ("sk-one".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn malformed_weights_name_the_file_and_line_without_echoing_the_key() {
        for line in [
            "sk-secret weight=0",
            "sk-secret weight=-2",
            "sk-secret weight=four",
            "sk-secret weight=1.5",
            "sk-secret weight=",
            "sk-secret weight=+3",
            "sk-secret weight=4294967296",
            "sk-secret weight=2 weight=3",
        ] {
            let error = weights(&format!("sk-fine\n{line}\n")).unwrap_err();
            assert!(
                matches!(error, ApiKeyError::Weight { .. }),
                "{line}: {error}"
            );
            let message = error.to_string();
            assert!(message.contains("keys.txt line 2"), "{message}");
            assert!(!message.contains("sk-secret"), "{message}");
        }
    }

    #[test]
    fn a_second_word_that_is_not_a_weight_is_refused_without_echoing_it() {
        let error = weights("sk-half other-half\n").unwrap_err();
        assert!(matches!(error, ApiKeyError::Malformed { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("keys.txt line 1"), "{message}");
        assert!(!message.contains("half"), "{message}");
    }
}
