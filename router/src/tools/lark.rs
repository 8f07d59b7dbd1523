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

/// A marker as text, or as the choice of its text and its token where the tokenizer holds one
/// (grammars treat added tokens as special, so the text alone would refuse the model's token).
pub fn marker(text: &str, token: Option<u32>) -> String {
    match token {
        Some(id) => format!("({} | <[{id}]>)", lark_string(text)),
        None => lark_string(text),
    }
}

/// `start`: free text without `trigger`, or text ending at the first `trigger` (written as
/// text, or as its `token` after text that holds no trigger) followed by `rest`.
pub fn text_then(trigger: &str, token: Option<u32>, rest: &str) -> String {
    let escaped = regex_escape(trigger);
    let by_token = match token {
        Some(id) => format!(" | TEXT? <[{id}]> {rest}"),
        None => String::new(),
    };
    format!(
        "start: TEXT | PREFIX {rest}{by_token}\n\
         TEXT: /[\\s\\S]*/ & ~/[\\s\\S]*{escaped}[\\s\\S]*/\n\
         PREFIX: /[\\s\\S]*{escaped}/ & ~/[\\s\\S]*{escaped}[\\s\\S]+/\n"
    )
}
