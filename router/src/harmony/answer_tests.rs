use serde_json::Value;

use super::*;

const CALL_TEXT: &str =
    "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Paris\"}<|call|>";

/// Content, and each call's (name, arguments) as the deltas assemble them.
fn read(pieces: &[&str]) -> (String, Vec<(String, String)>) {
    let mut answer = HarmonyAnswer::new();
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for piece in pieces {
        let (text, deltas) = answer.push(piece);
        content.push_str(&text);
        for delta in deltas {
            let index = delta["index"].as_u64().unwrap() as usize;
            if let Some(name) = delta.pointer("/function/name").and_then(Value::as_str) {
                assert_eq!(index, calls.len());
                assert!(delta["id"].as_str().unwrap().starts_with("call_"));
                calls.push((name.to_owned(), String::new()));
            } else {
                let fragment = delta.pointer("/function/arguments").and_then(Value::as_str);
                calls[index].1.push_str(fragment.unwrap());
            }
        }
    }
    content.push_str(&answer.finish());
    assert_eq!(answer.count(), calls.len());
    (content, calls)
}

fn weather() -> (String, String) {
    ("get_weather".to_owned(), "{\"city\": \"Paris\"}".to_owned())
}

#[test]
fn content_is_text_and_a_call_header_announces_a_call_with_its_arguments() {
    assert_eq!(
        read(&["Hello ", "<b>"]),
        ("Hello <b>".to_owned(), Vec::new())
    );
    assert_eq!(read(&[CALL_TEXT]), (String::new(), vec![weather()]));
}

#[test]
fn every_cut_of_the_stream_reads_the_same() {
    let text = format!(
        "Sure.{CALL_TEXT}{}",
        CALL_TEXT.replace("get_weather", "get_time")
    );
    let chars: Vec<char> = text.chars().collect();
    for size in 1..12 {
        let cut: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
        let refs: Vec<&str> = cut.iter().map(String::as_str).collect();
        let (content, calls) = read(&refs);
        assert_eq!(content, "Sure.", "pieces of {size}");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0], weather());
        assert_eq!(calls[1].0, "get_time");
    }
}

#[test]
fn content_after_a_call_is_content_and_a_partial_header_is_held_then_released() {
    let (content, calls) = read(&[CALL_TEXT, "Done."]);
    assert_eq!((content.as_str(), calls), ("Done.", vec![weather()]));
    let mut answer = HarmonyAnswer::new();
    assert_eq!(answer.push("a <|chan"), ("a ".to_owned(), Vec::new()));
    assert_eq!(answer.finish(), "<|chan");
}
