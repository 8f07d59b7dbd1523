use super::*;

const DOCUMENT: &str = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\"ris}", "days": [1, 2]}}, {"name": "add", "arguments": {}}]}"#;

fn streamed_in(text: &str, family: ToolFamily, pieces: usize) -> (Vec<Value>, usize) {
    let chars: Vec<char> = text.chars().collect();
    let mut stream = ToolCallStream::new(family);
    let deltas = chars
        .chunks(chars.len().div_ceil(pieces))
        .flat_map(|piece| stream.push(&piece.iter().collect::<String>()))
        .collect();
    (deltas, stream.count())
}

fn rebuilt_arguments(deltas: &[Value], index: usize) -> String {
    deltas
        .iter()
        .filter(|d| d["index"] == index && d.get("id").is_none())
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect()
}

#[test]
fn streamed_deltas_announce_each_call_once_then_rebuild_its_arguments_exactly() {
    for pieces in [1, 3, 17, DOCUMENT.len()] {
        let (deltas, count) = streamed_in(DOCUMENT, ToolFamily::Tandem, pieces);
        assert_eq!(count, 2);
        let openings: Vec<&Value> = deltas.iter().filter(|d| d.get("id").is_some()).collect();
        assert_eq!(openings.len(), 2);
        assert_eq!(openings[0]["function"]["name"], "get_weather");
        assert_eq!(openings[1]["index"], 1);
        assert_eq!(
            rebuilt_arguments(&deltas, 0),
            r#"{"city": "Pa\"ris}", "days": [1, 2]}"#,
            "{pieces} pieces"
        );
        assert_eq!(rebuilt_arguments(&deltas, 1), "{}");
    }
}

#[test]
fn llama_calls_carry_their_arguments_under_parameters() {
    let text = r#"{"name": "now", "parameters": {"tz": "UTC"}}; {"name": "now", "parameters": {}}"#;
    let (deltas, count) = streamed_in(text, ToolFamily::Llama3Json, text.len());
    assert_eq!(count, 2);
    assert_eq!(rebuilt_arguments(&deltas, 0), r#"{"tz": "UTC"}"#);
    assert_eq!(rebuilt_arguments(&deltas, 1), "{}");
}

#[test]
fn arguments_stream_in_several_fragments_when_text_arrives_token_by_token() {
    let (deltas, _) = streamed_in(DOCUMENT, ToolFamily::Tandem, DOCUMENT.len());
    let fragments = deltas
        .iter()
        .filter(|d| d["index"] == 0 && d.get("id").is_none())
        .count();
    assert!(fragments > 10, "{fragments}");
}

#[test]
fn mistral_call_ids_are_nine_letters_and_digits() {
    let id = call_id(ToolFamily::Mistral);
    assert_eq!(id.len(), 9);
    assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
    assert!(call_id(ToolFamily::Hermes).starts_with("call_"));
}
