//! Clients' prompt-cache hints, read as how long a request's cached prefix should stay ahead
//! of LRU eviction once the request ends: OpenAI's `prompt_cache_key` and
//! `prompt_cache_retention`, and Anthropic's `cache_control` blocks. A hint biases eviction
//! and never locks memory (see `kv::radix::retention`).

use std::time::Duration;

use serde_json::{Map, Value};

use super::ValidationError;

/// OpenAI's `in_memory` retention, which it describes as five to ten minutes of inactivity.
pub const IN_MEMORY_RETENTION: Duration = Duration::from_secs(10 * 60);
/// OpenAI's extended retention (`24h`).
pub const EXTENDED_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// `prompt_cache_options.ttl`'s default and shorter value (`30m`).
pub const OPTIONS_TTL: Duration = Duration::from_secs(30 * 60);
/// `prompt_cache_options.ttl`'s longer value (`12h`).
pub const LONG_OPTIONS_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// Anthropic's default `cache_control` TTL (`5m`).
pub const EPHEMERAL_TTL: Duration = Duration::from_secs(5 * 60);
/// Anthropic's longer `cache_control` TTL (`1h`).
pub const LONG_EPHEMERAL_TTL: Duration = Duration::from_secs(60 * 60);
/// The longest `prompt_cache_key` accepted, in bytes.
pub const MAX_PROMPT_CACHE_KEY_BYTES: usize = 1024;
/// How much of a refused value an error message quotes.
const QUOTED_CHARS: usize = 40;

/// A request's prompt-cache hints as its route carries them.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum CacheHint {
    #[default]
    None,
    /// OpenAI's fields as sent, checked by `retention`.
    OpenAi {
        key: Option<String>,
        retention: Option<String>,
        options: Option<Map<String, Value>>,
    },
    /// A retention the route already checked (Anthropic's `cache_control` TTLs).
    Retention(Duration),
}

impl CacheHint {
    /// How long the prompt's cached prefix should stay ahead of LRU eviction after the
    /// request; `None` without a hint.
    pub fn retention(&self) -> Result<Option<Duration>, ValidationError> {
        match self {
            Self::None => Ok(None),
            Self::OpenAi {
                key,
                retention,
                options,
            } => {
                let retention = openai_retention(key.as_deref(), retention.as_deref())?;
                let minimum = options.as_ref().map(options_ttl).transpose()?;
                Ok(retention.max(minimum))
            }
            Self::Retention(retention) => Ok(Some(*retention)),
        }
    }
}

/// The retention OpenAI's fields ask for: `prompt_cache_retention` (`in_memory` or `24h`), or
/// `in_memory` when only a `prompt_cache_key` is sent; `None` without either.
pub fn openai_retention(
    key: Option<&str>,
    retention: Option<&str>,
) -> Result<Option<Duration>, ValidationError> {
    if let Some(key) = key {
        if key.len() > MAX_PROMPT_CACHE_KEY_BYTES {
            return Err(ValidationError::TooLong {
                param: "prompt_cache_key",
                max: MAX_PROMPT_CACHE_KEY_BYTES,
                got: key.len(),
            });
        }
    }
    match retention {
        None => Ok(key.map(|_| IN_MEMORY_RETENTION)),
        Some("in_memory" | "in-memory") => Ok(Some(IN_MEMORY_RETENTION)),
        Some("24h") => Ok(Some(EXTENDED_RETENTION)),
        Some(other) => Err(ValidationError::OutOfRange {
            param: "prompt_cache_retention".to_owned(),
            expected: "`in_memory` or `24h`",
            value: quoted(other),
        }),
    }
}

/// The minimum lifetime `prompt_cache_options` asks for: its `ttl` (`30m`, the default, or
/// `12h`). Implicit breakpoints are the only mode served: Tandem caches every prefix.
fn options_ttl(options: &Map<String, Value>) -> Result<Duration, ValidationError> {
    for (field, value) in options {
        let served = match (field.as_str(), value) {
            ("ttl", _) | (_, Value::Null) => true,
            ("mode", Value::String(mode)) => mode == "implicit",
            ("prewarm", Value::Bool(prewarm)) => !prewarm,
            _ => false,
        };
        if !served {
            return Err(ValidationError::Unsupported {
                param: format!("prompt_cache_options.{field}"),
                detail: format!(" with the value {}", shown(value)),
            });
        }
    }
    match options.get("ttl") {
        None | Some(Value::Null) => Ok(OPTIONS_TTL),
        Some(Value::String(ttl)) if ttl == "30m" => Ok(OPTIONS_TTL),
        Some(Value::String(ttl)) if ttl == "12h" => Ok(LONG_OPTIONS_TTL),
        Some(other) => Err(ValidationError::OutOfRange {
            param: "prompt_cache_options.ttl".to_owned(),
            expected: "`30m` or `12h`",
            value: shown(other),
        }),
    }
}

/// The longest TTL among Anthropic `cache_control` blocks (`{"type": "ephemeral"}` with an
/// optional `ttl` of `5m` or `1h`); `None` without any. `controls` pairs each block with the
/// request path naming it, for error messages.
pub fn anthropic_retention<'a>(
    controls: impl IntoIterator<Item = (String, &'a Map<String, Value>)>,
) -> Result<Option<Duration>, ValidationError> {
    let mut longest = None;
    for (path, control) in controls {
        let ttl = cache_control_ttl(&path, control)?;
        longest = longest.max(Some(ttl));
    }
    Ok(longest)
}

fn cache_control_ttl(
    path: &str,
    control: &Map<String, Value>,
) -> Result<Duration, ValidationError> {
    let kind = control.get("type");
    if kind.and_then(Value::as_str) != Some("ephemeral") {
        return Err(ValidationError::OutOfRange {
            param: format!("{path}.type"),
            expected: "`ephemeral`",
            value: kind.map_or_else(|| "nothing".to_owned(), shown),
        });
    }
    if let Some(field) = control
        .keys()
        .find(|field| !matches!(field.as_str(), "type" | "ttl"))
    {
        return Err(ValidationError::Unsupported {
            param: format!("{path}.{field}"),
            detail: String::new(),
        });
    }
    match control.get("ttl") {
        None | Some(Value::Null) => Ok(EPHEMERAL_TTL),
        Some(Value::String(ttl)) if ttl == "5m" => Ok(EPHEMERAL_TTL),
        Some(Value::String(ttl)) if ttl == "1h" => Ok(LONG_EPHEMERAL_TTL),
        Some(other) => Err(ValidationError::OutOfRange {
            param: format!("{path}.ttl"),
            expected: "`5m` or `1h`",
            value: shown(other),
        }),
    }
}

fn shown(value: &Value) -> String {
    match value {
        Value::String(text) => quoted(text),
        other => {
            let text = other.to_string();
            text.chars().take(QUOTED_CHARS).collect()
        }
    }
}

fn quoted(text: &str) -> String {
    let clipped: String = text.chars().take(QUOTED_CHARS).collect();
    let ellipsis = if clipped.len() < text.len() {
        "…"
    } else {
        ""
    };
    format!("`{clipped}{ellipsis}`")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn control(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn openai_fields_map_to_their_retention_and_a_key_alone_means_in_memory() {
        assert_eq!(openai_retention(None, None).ok(), Some(None));
        let key = Some("tenant-7/session-3");
        assert_eq!(
            openai_retention(key, None).ok(),
            Some(Some(IN_MEMORY_RETENTION))
        );
        assert_eq!(
            openai_retention(None, Some("in_memory")).ok(),
            Some(Some(IN_MEMORY_RETENTION))
        );
        assert_eq!(
            openai_retention(key, Some("24h")).ok(),
            Some(Some(EXTENDED_RETENTION))
        );
    }

    #[test]
    fn an_unknown_retention_or_an_oversized_key_is_refused_naming_the_field() {
        let refused = openai_retention(None, Some("forever"))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some("`prompt_cache_retention` must be `in_memory` or `24h`, got `forever`")
        );
        let long_key = "k".repeat(MAX_PROMPT_CACHE_KEY_BYTES + 1);
        let refused = openai_retention(Some(&long_key), None)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some("`prompt_cache_key` holds a string of 1025 bytes, at most 1024 are allowed")
        );
    }

    fn options(value: Value) -> CacheHint {
        CacheHint::OpenAi {
            key: None,
            retention: None,
            options: Some(control(value)),
        }
    }

    #[test]
    fn prompt_cache_options_ask_for_their_ttl_at_least() {
        assert_eq!(options(json!({})).retention().ok(), Some(Some(OPTIONS_TTL)));
        let long = options(json!({"ttl": "12h", "mode": "implicit", "prewarm": false}));
        assert_eq!(long.retention().ok(), Some(Some(LONG_OPTIONS_TTL)));
        let with_retention = CacheHint::OpenAi {
            key: None,
            retention: Some("24h".to_owned()),
            options: Some(control(json!({"ttl": "30m"}))),
        };
        assert_eq!(
            with_retention.retention().ok(),
            Some(Some(EXTENDED_RETENTION))
        );
    }

    #[test]
    fn prompt_cache_options_tandem_does_not_serve_are_refused_naming_them() {
        let cases = [
            (
                json!({"ttl": "1d"}),
                "`prompt_cache_options.ttl` must be `30m` or `12h`, got `1d`",
            ),
            (
                json!({"mode": "explicit"}),
                "`prompt_cache_options.mode` is not supported yet with the value `explicit`",
            ),
            (
                json!({"prewarm": true}),
                "`prompt_cache_options.prewarm` is not supported yet with the value true",
            ),
        ];
        for (value, message) in cases {
            let refused = options(value).retention().err().map(|e| e.to_string());
            assert_eq!(refused.as_deref(), Some(message));
        }
    }

    #[test]
    fn anthropic_blocks_give_their_longest_ttl() {
        let short = control(json!({"type": "ephemeral"}));
        let long = control(json!({"type": "ephemeral", "ttl": "1h"}));
        let none: [(String, &Map<String, Value>); 0] = [];
        assert_eq!(anthropic_retention(none).ok(), Some(None));
        let both = [
            ("system[0].cache_control".to_owned(), &short),
            ("tools[1].cache_control".to_owned(), &long),
        ];
        assert_eq!(
            anthropic_retention(both).ok(),
            Some(Some(LONG_EPHEMERAL_TTL))
        );
        let one = [("messages[0].content[0].cache_control".to_owned(), &short)];
        assert_eq!(anthropic_retention(one).ok(), Some(Some(EPHEMERAL_TTL)));
    }

    #[test]
    fn anthropic_blocks_of_another_type_ttl_or_field_are_refused_naming_the_path() {
        let cases = [
            (
                json!({"type": "persistent"}),
                "`system[0].cache_control.type` must be `ephemeral`, got `persistent`",
            ),
            (
                json!({}),
                "`system[0].cache_control.type` must be `ephemeral`, got nothing",
            ),
            (
                json!({"type": "ephemeral", "ttl": "2h"}),
                "`system[0].cache_control.ttl` must be `5m` or `1h`, got `2h`",
            ),
            (
                json!({"type": "ephemeral", "ttl": 300}),
                "`system[0].cache_control.ttl` must be `5m` or `1h`, got 300",
            ),
            (
                json!({"type": "ephemeral", "scope": "org"}),
                "`system[0].cache_control.scope` is not supported yet",
            ),
        ];
        for (value, message) in cases {
            let block = control(value);
            let refused = anthropic_retention([("system[0].cache_control".to_owned(), &block)]);
            assert_eq!(
                refused.err().map(|e| e.to_string()).as_deref(),
                Some(message)
            );
        }
    }
}
