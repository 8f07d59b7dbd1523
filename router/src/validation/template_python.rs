//! What `transformers`' chat-template environment adds to Jinja, beyond `tojson`
//! (`template_json.rs`): `strftime_now`, the `{% generation %}` block (a marker for
//! assistant masks that renders its body unchanged), and Python's `str()` for the `string`
//! filter, so `tool | string` writes a tool as Python's `repr` of its dict, as SmolLM3's
//! template shows its tools.

use std::time::{SystemTime, UNIX_EPOCH};

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

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `strftime_now(format)`: the current UTC time in Python's `strftime` directives
/// (`%d %m %Y %y %B %b %A %a %H %M %S %j %%`; others are kept as written).
pub fn strftime_now(format: String) -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    strftime(&format, seconds)
}

/// `format` for the UTC time `seconds` after the Unix epoch.
fn strftime(format: &str, seconds: u64) -> String {
    let days = seconds / 86_400;
    let (year, month, day) = civil_date(days);
    let second_of_day = seconds % 86_400;
    let weekday = WEEKDAYS[usize::try_from((days + 3) % 7).unwrap_or(0)];
    let month_name = MONTHS[usize::try_from(month - 1).unwrap_or(0)];
    let day_of_year = days - days_before_year(year) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{:02}", second_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", second_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", second_of_day % 60)),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn is_leap(year: u64) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

/// Days from 1970-01-01 to January 1st of `year`.
fn days_before_year(year: u64) -> u64 {
    (1970..year)
        .map(|y| if is_leap(y) { 366 } else { 365 })
        .sum()
}

/// The (year, month, day) of the `days`-th day after 1970-01-01.
fn civil_date(days: u64) -> (u64, u64, u64) {
    let mut year = 1970;
    let mut left = days;
    loop {
        let length = if is_leap(year) { 366 } else { 365 };
        if left < length {
            break;
        }
        left -= length;
        year += 1;
    }
    let february = if is_leap(year) { 29 } else { 28 };
    let mut month = 1;
    for length in [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31] {
        if left < length {
            break;
        }
        left -= length;
        month += 1;
    }
    (year, month, left + 1)
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
    fn dates_follow_pythons_strftime_directives() {
        // 2025-07-08 13:05:09 UTC, a Tuesday.
        let seconds = 1_751_979_909;
        assert_eq!(strftime("%d %B %Y", seconds), "08 July 2025");
        assert_eq!(
            strftime("%a %b %j %H:%M:%S %y %m %%", seconds),
            "Tue Jul 189 13:05:09 25 07 %"
        );
        assert_eq!(strftime("%d %B %Y", 951_782_400), "29 February 2000");
    }

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
