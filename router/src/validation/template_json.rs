//! The `tojson` filter as `transformers` defines it for chat templates (Python's
//! `json.dumps` with `ensure_ascii=False`): `", "` and `": "` between items, keys in the
//! order given, `indent` for a multi-line layout, `ensure_ascii=True` for `\uXXXX` escapes of
//! every non-ASCII character. Templates write tool schemas and call
//! arguments with it, so the model sees exactly the text it was tuned on.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::Value as Json;

/// `value | tojson`, `value | tojson(indent=N)` or `value | tojson(ensure_ascii=B)`.
pub fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write(&json, indent, 0, &mut out);
    if ensure_ascii {
        out = ascii_escaped(&out);
    }
    Ok(Value::from_safe_string(out))
}

/// `text` with every non-ASCII character as Python's `\uXXXX` escapes (UTF-16 units). Only
/// JSON strings hold such characters, so escaping the whole text escapes exactly them.
fn ascii_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
            continue;
        }
        let mut units = [0u16; 2];
        for unit in c.encode_utf16(&mut units) {
            out.push_str(&format!("\\u{unit:04x}"));
        }
    }
    out
}

fn write(value: &Json, indent: Option<usize>, depth: usize, out: &mut String) {
    match value {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                separate(index, indent, depth + 1, out);
                write(item, indent, depth + 1, out);
            }
            close(indent, depth, ']', out);
        }
        Json::Object(fields) if !fields.is_empty() => {
            out.push('{');
            for (index, (key, item)) in fields.iter().enumerate() {
                separate(index, indent, depth + 1, out);
                out.push_str(&Json::from(key.as_str()).to_string());
                out.push_str(": ");
                write(item, indent, depth + 1, out);
            }
            close(indent, depth, '}', out);
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// What goes before item `index`: `", "` inline, a comma and a new indented line otherwise.
fn separate(index: usize, indent: Option<usize>, depth: usize, out: &mut String) {
    match indent {
        None if index > 0 => out.push_str(", "),
        None => {}
        Some(width) => {
            if index > 0 {
                out.push(',');
            }
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    }
}

fn close(indent: Option<usize>, depth: usize, bracket: char, out: &mut String) {
    if let Some(width) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(width * depth));
    }
    out.push(bracket);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_ascii_escapes_every_non_ascii_character_as_python_does() {
        assert_eq!(
            ascii_escaped(r#"{"city": "Zürich 🌧"}"#),
            r#"{"city": "Z\u00fcrich \ud83c\udf27"}"#
        );
    }

    fn dumps(value: serde_json::Value, indent: Option<usize>) -> String {
        let mut out = String::new();
        write(&value, indent, 0, &mut out);
        out
    }

    #[test]
    fn layout_and_key_order_follow_python_json_dumps() {
        let value = serde_json::json!({"z": [1, 2.5, "é\n"], "a": {}, "m": {"k": null}});
        assert_eq!(
            dumps(value.clone(), None),
            r#"{"z": [1, 2.5, "é\n"], "a": {}, "m": {"k": null}}"#
        );
        assert_eq!(
            dumps(value, Some(2)),
            "{\n  \"z\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"a\": {},\n  \"m\": {\n    \"k\": null\n  }\n}"
        );
    }
}
