//! What `transformers`' chat-template environment adds to Jinja, beyond `tojson`
//! (`template_json.rs`) and `strftime_now` (`template_clock.rs`): the `{% generation %}` block (a marker for
//! assistant masks that renders its body unchanged), and Python's `str()` for the `string`
//! filter, so `tool | string` writes a tool as Python's `repr` of its dict, as SmolLM3's
//! template shows its tools.

use minijinja::value::{Value, ValueKind};

/// `source` with each `{% generation %}` block as an `{% if true %}` block: the same body,
/// the same whitespace control.
pub fn without_generation_blocks(source: &str) -> String {
    let mut out = source.to_owned();
    for (open, close) in [("{%", "%}"), ("{%-", "%}"), ("{%", "-%}"), ("{%-", "-%}")] {
        out = out
            .replace(
                &format!("{open} generation {close}"),
                &format!("{open} if true {close}"),
            )
            .replace(
                &format!("{open} endgeneration {close}"),
                &format!("{open} endif {close}"),
            );
    }
    out
}

/// The `string` filter as Python's `str()`: strings unchanged, `True`/`False`/`None`, and
/// lists and dicts as their `repr`.
pub fn python_string(value: &Value) -> Value {
    match value.kind() {
        ValueKind::String => value.clone(),
        ValueKind::Undefined => Value::from(""),
        _ => Value::from(python_repr(value)),
    }
}

/// The `iterable` test as Python's `iter()` sees it: strings, lists and dicts are; `None`,
/// numbers and booleans are not.
pub fn is_python_iterable(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
    )
}

/// Python's `repr` of a JSON-like value.
fn python_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => "None".to_owned(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_owned(),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = value
                .try_iter()
                .into_iter()
                .flatten()
                .map(|item| python_repr(&item))
                .collect();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = value
                .try_iter()
                .into_iter()
                .flatten()
                .map(|key| {
                    let item = value.get_item(&key).unwrap_or_default();
                    format!("{}: {}", python_repr(&key), python_repr(&item))
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    }
}

/// Python's `repr` of a string: single quotes unless it holds `'` and no `"`.
fn string_repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_filter_writes_dicts_and_lists_as_python_does() {
        let value = Value::from_serialize(serde_json::json!(
            {"a": "f", "b": true, "c": null, "d": [1, 2.5], "e's": "say \"hi\"\n"}));
        assert_eq!(
            python_string(&value).to_string(),
            r#"{'a': 'f', 'b': True, 'c': None, 'd': [1, 2.5], "e's": 'say "hi"\n'}"#
        );
        assert_eq!(python_string(&Value::from("plain")).to_string(), "plain");
    }

    #[test]
    fn none_and_numbers_are_not_iterable_as_in_python() {
        let iterable = [
            Value::from("ab"),
            Value::from(vec![1]),
            Value::from_serialize(serde_json::json!({})),
        ];
        assert!(iterable.iter().all(is_python_iterable));
        let not = [
            Value::from(()),
            Value::UNDEFINED,
            Value::from(3),
            Value::from(true),
        ];
        assert!(!not.iter().any(is_python_iterable));
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let source = "{%- if a -%}{% generation %}x{%- endgeneration -%}{%- endif -%}";
        assert_eq!(
            without_generation_blocks(source),
            "{%- if a -%}{% if true %}x{%- endif -%}{%- endif -%}"
        );
    }
}
