use super::*;

const CALL_HEADER: &str = "<|channel|>commentary to=functions.get_weather<|message|>";

/// Pushes `pieces` one after another, then finishes: all reasoning and all answer.
fn split(pieces: &[&str]) -> (String, String) {
    let mut channels = HarmonyChannels::new();
    let (mut reasoning, mut answer) = (String::new(), String::new());
    for piece in pieces {
        let (r, a) = channels.push(piece);
        reasoning.push_str(&r);
        answer.push_str(&a);
    }
    let (r, a) = channels.finish();
    reasoning.push_str(&r);
    answer.push_str(&a);
    (reasoning, answer)
}

/// `text` cut into pieces of `size` characters.
fn pieces(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

#[test]
fn analysis_is_reasoning_and_final_is_the_answer() {
    let output = "<|channel|>analysis<|message|>Think <b>.<|end|><|start|>assistant<|channel|>final<|message|>Hi < there<|return|>";
    assert_eq!(
        split(&[output]),
        ("Think <b>.".to_owned(), "Hi < there".to_owned())
    );
}

#[test]
fn a_marker_split_across_deltas_is_held_back_until_it_is_decided() {
    let output = "<|channel|>analysis<|message|>a <|e|b<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>";
    for size in 1..8 {
        let cut = pieces(output, size);
        let refs: Vec<&str> = cut.iter().map(String::as_str).collect();
        assert_eq!(
            split(&refs),
            ("a <|e|b".to_owned(), "ok".to_owned()),
            "pieces of {size}"
        );
    }
    let mut channels = HarmonyChannels::new();
    assert_eq!(
        channels.push("<|channel|>analysis<|message|>x<|en"),
        ("x".to_owned(), String::new())
    );
    assert_eq!(channels.push("d|>"), (String::new(), String::new()));
}

#[test]
fn a_call_right_after_analysis_keeps_a_normalized_header_in_the_answer() {
    let output = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let expected = format!("{CALL_HEADER}{{\"city\": \"Paris\"}}<|call|>");
    assert_eq!(split(&[output]), ("Need weather.".to_owned(), expected));
}

#[test]
fn a_recipient_in_the_role_part_and_parallel_calls_each_become_a_call() {
    let output = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\": \"UTC\"}<|call|>";
    let expected = format!(
        "{CALL_HEADER}{{}}<|call|><|channel|>commentary to=functions.get_time<|message|>{{\"tz\": \"UTC\"}}<|call|>"
    );
    for size in [1, 3, 1000] {
        let cut = pieces(output, size);
        let refs: Vec<&str> = cut.iter().map(String::as_str).collect();
        assert_eq!(split(&refs), (String::new(), expected.clone()));
    }
}

#[test]
fn final_text_after_a_call_is_answer_and_a_call_cut_short_keeps_its_text() {
    let output = "<|channel|>commentary to=functions.get_weather<|message|>{}<|call|><|start|>assistant<|channel|>final<|message|>Done.<|return|>";
    assert_eq!(
        split(&[output]),
        (String::new(), format!("{CALL_HEADER}{{}}<|call|>Done."))
    );
    let cut = "<|channel|>commentary to=functions.get_weather<|message|>{\"ci";
    assert_eq!(
        split(&[cut]),
        (String::new(), format!("{CALL_HEADER}{{\"ci"))
    );
}

#[test]
fn reasoning_cut_short_is_released_and_text_without_headers_is_the_answer() {
    assert_eq!(
        split(&["<|channel|>analysis<|message|>half <|"]),
        ("half <|".to_owned(), String::new())
    );
    assert_eq!(
        split(&["plain ", "text"]),
        (String::new(), "plain text".to_owned())
    );
    let long = "x".repeat(MAX_HEADER_BYTES + 10);
    assert_eq!(split(&[&long]), (String::new(), long.clone()));
}

#[test]
fn reasoning_tokens_count_the_pushes_of_the_analysis_message() {
    let mut channels = HarmonyChannels::new();
    for piece in [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "a",
        "b",
        "<|end|>",
    ] {
        channels.push(piece);
    }
    channels.push("<|start|>");
    channels.push("assistant<|channel|>final<|message|>");
    channels.push("answer");
    assert_eq!(channels.reasoning_tokens(), 4);
}
