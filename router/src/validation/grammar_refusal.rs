//! Why a grammar was refused, said in terms of what the client sent: the grammar engine's
//! stop reasons, markup and wrapper grammar never reach a response.

use std::fmt;

use super::serde_wording;

/// What kind of grammar source was refused, for the wording of its refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrammarSource {
    JsonSchema,
    Regex,
    Lark,
}

impl fmt::Display for GrammarSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::JsonSchema => "JSON schema",
            Self::Regex => "regex",
            Self::Lark => "grammar",
        })
    }
}

/// Why a grammar, a regex or a JSON schema cannot constrain the output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarRefusal {
    #[error("the {kind} has {got} bytes, at most {max} are allowed")]
    TooLarge {
        kind: GrammarSource,
        got: usize,
        max: usize,
    },
    #[error("the {kind} did not compile within {ms} ms")]
    TimedOut { kind: GrammarSource, ms: u128 },
    #[error("the JSON schema is not valid JSON: {0}")]
    NotJson(String),
    #[error("a JSON schema is an object or a boolean")]
    NotASchema,
    #[error("the JSON schema uses keywords the grammar engine does not support: {}", quoted(.0))]
    UnsupportedKeywords(Vec<String>),
    #[error("a recursive `$ref` that never reaches a concrete schema (such as `{{\"$ref\": \"#\"}}`, or `$defs` entries that only refer to each other) is not supported: no finite JSON value satisfies it")]
    EndlessRecursion,
    #[error("the {0} matches no text the model can write")]
    MatchesNothing(GrammarSource),
    #[error("{} is not a valid regex: {reason}", match .in_schema { true => "a `pattern` in the JSON schema", false => "it" })]
    InvalidRegex { in_schema: bool, reason: String },
    #[error("no JSON value satisfies the JSON schema: {0}")]
    Unsatisfiable(String),
    #[error("the JSON schema refers to `{0}`, which it does not contain; only references inside the schema are supported")]
    UnresolvedRef(String),
    #[error("the {0} is too complex for the grammar engine's limits")]
    TooComplex(GrammarSource),
    #[error("the grammar engine failed on the {0}")]
    Failed(GrammarSource),
    #[error("a `$ref` back to an enclosing schema (`{0}`) beside other keywords in the same schema object is not supported; move those keywords into the referenced schema")]
    RecursiveRefWithSiblings(String),
    #[error("the grammar engine cannot compile the {kind}: {detail}")]
    Rejected { kind: GrammarSource, detail: String },
}

fn quoted(names: &[String]) -> String {
    let names: Vec<String> = names.iter().map(|name| format!("`{name}`")).collect();
    names.join(", ")
}

/// The grammar engine's stop reasons: identifiers, never a message for a client.
const STOP_REASONS: [&str; 9] = [
    "NotStopped",
    "MaxTokensTotal",
    "MaxTokensParser",
    "NoExtension",
    "NoExtensionBias",
    "EndOfSentence",
    "InternalError",
    "LexerTooComplex",
    "ParserTooComplex",
];

impl GrammarRefusal {
    /// The refusal behind the grammar engine's error text for a `source` grammar.
    pub fn from_engine(source: GrammarSource, engine: &str) -> Self {
        let text = strip_engine_markup(engine);
        let from_schema = source != GrammarSource::Regex;
        if let Some(reason) = STOP_REASONS.iter().find(|reason| text == **reason) {
            return match *reason {
                "LexerTooComplex" | "ParserTooComplex" | "MaxTokensTotal" => {
                    Self::TooComplex(source)
                }
                _ if source == GrammarSource::JsonSchema => Self::EndlessRecursion,
                _ => Self::MatchesNothing(source),
            };
        }
        if let Some(keys) = text.strip_prefix("Unimplemented keys: ") {
            let keys = serde_json::from_str::<Vec<String>>(keys)
                .unwrap_or_else(|_| vec![keys.trim_matches(['[', ']']).to_owned()]);
            return Self::UnsupportedKeywords(keys);
        }
        if let Some(reason) = regex_error(&text) {
            return Self::InvalidRegex {
                in_schema: from_schema,
                reason,
            };
        }
        if let Some(reason) = text.strip_prefix("Unsatisfiable schema: ") {
            return Self::Unsatisfiable(reason.to_owned());
        }
        if let Some(pointer) = between(&text, "Pointer '", "' does not exist") {
            return Self::UnresolvedRef(format!("#{pointer}"));
        }
        if let Some(resource) = between(&text, "Resource '", "' is not present") {
            return Self::UnresolvedRef(resource.to_owned());
        }
        if text.contains("too complex") {
            return Self::TooComplex(source);
        }
        let text = text.replace("json-schema:///", "");
        if let Some(target) =
            text.strip_prefix("circular references with sibling keys are not supported: ")
        {
            return Self::RecursiveRefWithSiblings(target.to_owned());
        }
        Self::Rejected {
            kind: source,
            detail: serde_wording::plain(&text),
        }
    }
}

/// The engine's own message without its markup (`<non-verbose/>`, dumped state), the
/// location in and excerpt of the wrapper grammar it was compiled in, or wrapper prefixes.
fn strip_engine_markup(engine: &str) -> String {
    let text = engine.split("\n<").next().unwrap_or_default();
    let text = match text.strip_prefix("at ") {
        Some(rest) => rest.split_once("): ").map_or(rest, |(_, message)| message),
        None => text,
    };
    let mut lines: Vec<&str> = text
        .lines()
        .take_while(|line| !is_grammar_excerpt(line))
        .collect();
    if let Some(first) = lines.first_mut() {
        *first = first
            .strip_prefix("failed to compile JSON schema: ")
            .unwrap_or(first);
        if first.starts_with("invalid regex ") {
            *first = first
                .split_once(" (in regex): ")
                .map_or(*first, |(_, rest)| rest);
        }
    }
    lines.join("\n").trim().to_owned()
}

/// The first line of the wrapper grammar's excerpt: `   1 | start: ...`.
fn is_grammar_excerpt(line: &str) -> bool {
    line.trim_start()
        .split_once(" | ")
        .is_some_and(|(number, _)| number.chars().all(|c| c.is_ascii_digit()))
}

/// The reason of a regex parse error, with the part of the pattern it points at.
fn regex_error(text: &str) -> Option<String> {
    if text.starts_with("lookarounds not supported") {
        return Some(
            "look-arounds, including `\\b`, `\\B`, and `^` or `$` inside the pattern, are not supported"
                .to_owned(),
        );
    }
    let rest = text.strip_prefix("regex parse error:")?;
    let lines: Vec<&str> = rest.lines().collect();
    let reason = lines
        .iter()
        .find_map(|line| line.strip_prefix("error: "))
        .unwrap_or("invalid syntax");
    let pointed = match (lines.get(1), lines.get(2)) {
        (Some(pattern), Some(carets)) if carets.trim().chars().all(|c| c == '^') => {
            let start = carets.len() - carets.trim_start().len();
            let end = carets.trim_end().len();
            pattern.get(start..end)
        }
        _ => None,
    };
    Some(match pointed {
        Some(fragment) if !fragment.is_empty() => format!("{reason} (at `{fragment}`)"),
        _ => reason.to_owned(),
    })
}

fn between<'a>(text: &'a str, before: &str, after: &str) -> Option<&'a str> {
    let rest = text.strip_prefix(before)?;
    rest.find(after).map(|end| &rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(source: GrammarSource, engine: &str) -> String {
        GrammarRefusal::from_engine(source, engine).to_string()
    }

    #[test]
    fn stop_reasons_become_what_they_mean_for_the_source() {
        let json = refusal(GrammarSource::JsonSchema, "NoExtensionBias\n<non-verbose/>");
        assert!(json.contains("recursive `$ref`"), "{json}");
        let regex = refusal(GrammarSource::Regex, "NoExtensionBias\n<non-verbose/>");
        assert_eq!(regex, "the regex matches no text the model can write");
        let complex = refusal(GrammarSource::Lark, "ParserTooComplex");
        assert!(complex.contains("too complex"), "{complex}");
    }

    #[test]
    fn wrapper_grammar_locations_and_excerpts_are_dropped() {
        let engine = "at 1(8): failed to compile JSON schema: Unimplemented keys: [\"if\", \"then\"]\n   1 | start: %json {\"if\": {}}\n              ^\n";
        assert_eq!(
            refusal(GrammarSource::Lark, engine),
            "the JSON schema uses keywords the grammar engine does not support: `if`, `then`"
        );
        let regex = "at 1(8): invalid regex \"a(?=b)\" (in regex): regex parse error:\n    a(?=b)\n     ^^^\nerror: look-around, including look-ahead and look-behind, is not supported\n   1 | start: /a(?=b)/\n              ^\n";
        assert_eq!(
            refusal(GrammarSource::Regex, regex),
            "it is not a valid regex: look-around, including look-ahead and look-behind, is not supported (at `(?=`)"
        );
    }

    #[test]
    fn schema_errors_name_the_schema_part_at_fault() {
        for (engine, expected) in [
            ("Pointer '/$defs/missing' does not exist", "refers to `#/$defs/missing`"),
            ("Resource 'http://x/s.json' is not present in a registry and retrieving it failed: Default retriever does not fetch resources", "refers to `http://x/s.json`"),
            ("Unsatisfiable schema: minimum (5) is greater than maximum (1)", "no JSON value satisfies the JSON schema: minimum (5)"),
            ("lookarounds not supported yet; WordUnicode in regex /\\bfoo/", "a `pattern` in the JSON schema is not a valid regex: look-arounds"),
            ("Expected f64 for 'minimum', got \"5\"", "Expected a number for 'minimum'"),
            ("circular references with sibling keys are not supported: json-schema:///#", "a `$ref` back to an enclosing schema (`#`)"),
        ] {
            let message = refusal(GrammarSource::JsonSchema, engine);
            assert!(message.contains(expected), "{message}");
            for marker in ["WordUnicode", "f64", "json-schema:", "Default retriever"] {
                assert!(!message.contains(marker), "{message}");
            }
        }
    }
}
