use super::*;

const DOCUMENT: &str = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\"ris}", "days": [1, 2]}}, {"name": "add", "arguments": {}}]}"#;

#[test]
fn a_finished_document_parses_into_calls_with_json_arguments() {
    let calls = parse(DOCUMENT).expect("a calls document");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].function.name, "get_weather");
    let arguments: Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
    assert_eq!(arguments, json!({"city": "Pa\"ris}", "days": [1, 2]}));
    assert_eq!(calls[1].function.arguments, "{}");
    assert!(calls[0].id.starts_with("call_") && calls[0].id != calls[1].id);
}

#[test]
fn plain_text_and_broken_documents_are_not_calls() {
    assert_eq!(parse("Sunny in Paris."), None);
    assert_eq!(parse("{\"tool_calls\": [{\"name\": \"f\""), None);
    assert_eq!(parse("{\"answer\": 1}"), None);
}

fn streamed_in(pieces: usize) -> (Vec<Value>, usize) {
    let chars: Vec<char> = DOCUMENT.chars().collect();
    let mut stream = ToolCallStream::default();
    let deltas = chars
        .chunks(chars.len().div_ceil(pieces))
        .flat_map(|piece| stream.push(&piece.iter().collect::<String>()))
        .collect();
    (deltas, stream.count())
}

#[test]
fn streamed_deltas_announce_each_call_once_then_rebuild_its_arguments_exactly() {
    for pieces in [1, 3, 17, DOCUMENT.len()] {
        let (deltas, count) = streamed_in(pieces);
        assert_eq!(count, 2);
        let openings: Vec<&Value> = deltas.iter().filter(|d| d.get("id").is_some()).collect();
        assert_eq!(openings.len(), 2);
        assert_eq!(openings[0]["function"]["name"], "get_weather");
        assert_eq!(openings[1]["index"], 1);
        for (index, expected) in [(0, r#"{"city": "Pa\"ris}", "days": [1, 2]}"#), (1, "{}")] {
            let rebuilt: String = deltas
                .iter()
                .filter(|d| d["index"] == index && d.get("id").is_none())
                .filter_map(|d| d["function"]["arguments"].as_str())
                .collect();
            assert_eq!(rebuilt, expected, "{pieces} pieces");
        }
    }
}

#[test]
fn auto_output_decides_on_its_first_character() {
    let mut text = ChoiceOutput::new(false);
    assert_eq!(text.push(String::new()), DeltaBody::Nothing);
    assert_eq!(text.push("Hi {".into()), DeltaBody::Content("Hi {".into()));
    assert_eq!(text.finish_reason("stop"), "stop");
    let mut calls = ChoiceOutput::new(false);
    assert!(
        matches!(calls.push(DOCUMENT.into()), DeltaBody::ToolCalls(deltas) if deltas.len() == 4)
    );
    assert_eq!(calls.finish_reason("stop"), "tool_calls");
    assert_eq!(calls.finish_reason("length"), "length");
}

#[test]
fn arguments_stream_in_several_fragments_when_text_arrives_token_by_token() {
    let (deltas, _) = streamed_in(DOCUMENT.len());
    let fragments = deltas
        .iter()
        .filter(|d| d["index"] == 0 && d.get("id").is_none())
        .count();
    assert!(fragments > 10, "{fragments}");
}
