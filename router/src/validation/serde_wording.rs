//! serde's refusals in the API's words: what a field expects and what it got, never a Rust
//! type name (`u32`, `struct StopSpec`, `untagged enum PromptSpec`).

/// `message` (serde's text) with every Rust type name replaced by the JSON it stands for, and
/// "invalid type: X, expected Y" turned into "must be Y, got X".
pub fn plain(message: &str) -> String {
    let words = without_type_names(message);
    let (words, position) = match words.rfind(" at line ") {
        Some(at) => words.split_at(at),
        None => (words.as_str(), ""),
    };
    let plain = match mismatch(words) {
        Some((got, expected)) => format!("must be {expected}, got {got}"),
        // An `expecting` attribute's text ("expected a ...") stands alone; syntax errors
        // ("expected value", "expected `,` or `}`") stay as they are.
        None => match words.strip_prefix("expected ") {
            Some(expected) if expected.starts_with("a ") || expected.starts_with("an ") => {
                format!("must be {expected}")
            }
            _ => words.to_owned(),
        },
    };
    format!("{plain}{position}")
}

/// The same, quoting a floating-point value as `literal` (the client's own spelling, such as
/// `1e12`) rather than serde's rendering of the parsed float.
pub fn plain_with_literal(message: &str, literal: Option<&str>) -> String {
    let plain = plain(message);
    match (literal, float_shown(&plain)) {
        (Some(literal), Some(shown)) => plain.replacen(&shown, literal, 1),
        _ => plain,
    }
}

/// `message` (serde's text) with every Rust type name replaced by the JSON it stands for.
pub fn without_type_names(message: &str) -> String {
    let message = untagged(message).unwrap_or_else(|| message.to_owned());
    replace_type_names(&message)
}

/// A `serde_json::Error`'s text without Rust type names, to quote after "got".
pub fn error_text(error: &serde_json::Error) -> String {
    without_type_names(&error.to_string())
}

/// serde's "data did not match any variant of untagged enum X" names no accepted form.
fn untagged(message: &str) -> Option<String> {
    let (_, rest) = message.split_once("data did not match any variant of untagged enum ")?;
    let after = rest.split_once(' ').map_or("", |(_, after)| after);
    Some(
        format!("matches none of the accepted forms {after}")
            .trim_end()
            .to_owned(),
    )
}

/// Words that follow "expected" in serde's messages, and what they mean in JSON.
fn json_name(rust: &str) -> Option<&'static str> {
    Some(match rust {
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer",
        "u8" => "an integer from 0 to 255",
        "u16" => "an integer from 0 to 65535",
        "u32" | "u64" | "u128" | "usize" => "a non-negative integer",
        "f32" | "f64" => "a number",
        "char" | "a character" => "a one-character string",
        "a borrowed string" | "a string" => "a string",
        "a sequence" | "a tuple" => "an array",
        "a map" => "an object",
        "unit" | "a unit" => "null",
        "a boolean" => "a boolean",
        _ => return None,
    })
}

/// Replaces the type after each "expected"/"Expected": primitives by their JSON name, structs
/// by "an object", enums by "one of the accepted values".
fn replace_type_names(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = find_expected(rest) {
        let (head, tail) = rest.split_at(at + "expected ".len());
        out.push_str(head);
        let (replacement, consumed) = expectation(tail);
        out.push_str(&replacement);
        rest = &tail[consumed..];
    }
    out.push_str(rest);
    out
}

fn find_expected(text: &str) -> Option<usize> {
    match (text.find("expected "), text.find("Expected ")) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What follows "expected " in plain words, and how many bytes of `tail` it replaces.
fn expectation(tail: &str) -> (String, usize) {
    for prefix in [
        "struct variant ",
        "tuple struct ",
        "struct ",
        "internally tagged enum ",
        "adjacently tagged enum ",
        "enum ",
        "tuple variant ",
        "unit struct ",
    ] {
        if let Some(name) = tail.strip_prefix(prefix) {
            let name_len = name
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(name.len());
            let plain = match prefix {
                "tuple struct " | "tuple variant " => "an array",
                "enum " => "one of the accepted values",
                "unit struct " => "null",
                _ => "an object",
            };
            return (plain.to_owned(), prefix.len() + name_len);
        }
    }
    for phrase in [
        "a borrowed string",
        "a character",
        "a sequence",
        "a tuple",
        "a string",
        "a map",
        "a unit",
        "a boolean",
    ] {
        if tail.starts_with(phrase) {
            let plain = json_name(phrase).unwrap_or(phrase);
            return (plain.to_owned(), phrase.len());
        }
    }
    let word_len = tail
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(tail.len());
    match json_name(&tail[..word_len]) {
        Some(plain) => (plain.to_owned(), word_len),
        None => (String::new(), 0),
    }
}

/// `(got, expected)` of "invalid type: X, expected Y" or "invalid value: X, expected Y",
/// with `got` as JSON shows it.
fn mismatch(message: &str) -> Option<(String, String)> {
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))?;
    let (got, expected) = rest.split_once(", expected ")?;
    let got = match got.split_once(' ') {
        Some(("integer" | "boolean", value)) => value.trim_matches('`').to_owned(),
        Some(("floating", value)) => value
            .strip_prefix("point ")
            .unwrap_or(value)
            .trim_matches('`')
            .to_owned(),
        Some(("string", value)) => value.to_owned(),
        _ => match got {
            "sequence" => "an array".to_owned(),
            "map" => "an object".to_owned(),
            "unit value" | "null" => "null".to_owned(),
            other => other.to_owned(),
        },
    };
    Some((got, expected.to_owned()))
}

/// The float serde rendered in a "got X" clause, if the value was one.
fn float_shown(plain: &str) -> Option<String> {
    let (_, got) = plain.split_once(", got ")?;
    let value = got.split(' ').next()?;
    let numeric = !value.is_empty()
        && value.parse::<f64>().is_ok()
        && value.contains(['.', 'e', 'E', 'i', 'N']);
    numeric.then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_mismatches_say_what_is_expected_and_what_came() {
        for (serde, plain_text) in [
            (
                "invalid type: floating point `1000000000000.0`, expected i64 at line 1 column 67",
                "must be an integer, got 1000000000000.0 at line 1 column 67",
            ),
            (
                "invalid value: integer `-1`, expected u64",
                "must be a non-negative integer, got -1",
            ),
            (
                "invalid type: string \"hot\", expected f64",
                "must be a number, got \"hot\"",
            ),
            (
                "invalid type: integer `5`, expected struct StreamOptions at line 1 column 68",
                "must be an object, got 5 at line 1 column 68",
            ),
            (
                "invalid type: integer `5`, expected a sequence",
                "must be an array, got 5",
            ),
            (
                "invalid type: map, expected a string",
                "must be a string, got an object",
            ),
            (
                "data did not match any variant of untagged enum StopSpec at line 1 column 59",
                "matches none of the accepted forms at line 1 column 59",
            ),
            ("missing field `role`", "missing field `role`"),
            (
                "expected value at line 1 column 32",
                "expected value at line 1 column 32",
            ),
            (
                "expected a string or an array of strings at line 1 column 9",
                "must be a string or an array of strings at line 1 column 9",
            ),
        ] {
            assert_eq!(plain(serde), plain_text);
        }
    }

    #[test]
    fn the_clients_spelling_of_a_float_is_quoted() {
        let message = "invalid type: floating point `1000000000000.0`, expected i64";
        assert_eq!(
            plain_with_literal(message, Some("1e12")),
            "must be an integer, got 1e12"
        );
        let integer = "invalid value: integer `-1`, expected u32";
        assert_eq!(
            plain_with_literal(integer, Some("-1")),
            "must be a non-negative integer, got -1"
        );
    }
}
