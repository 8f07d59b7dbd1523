//! Pieces of Lark grammar text (llguidance's dialect) the families' grammars are written with.

use serde_json::json;

/// `item`, or `item (separator item)*` when several are allowed.
pub fn repeated(item: &str, separator: &str, several: bool) -> String {
    if several {
        format!("{item} ({separator} {item})*")
    } else {
        item.to_owned()
    }
}

/// `text` as a Lark string literal.
pub fn lark_string(text: &str) -> String {
    json!(text).to_string()
}

/// `text` with regex metacharacters escaped (for a Lark `/.../` token).
pub fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '\\' | '/' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^'
            | '$' => vec!['\\', c],
            _ => vec![c],
        })
        .collect()
}
