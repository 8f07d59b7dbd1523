use super::*;

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["type"].as_str().expect("typed"))
        .collect()
}

fn render(mut events: MessageEvents, pieces: &[&str], finish: Finish) -> Vec<Value> {
    let mut out: Vec<Value> = pieces
        .iter()
        .flat_map(|piece| events.text((*piece).to_owned()))
        .collect();
    out.extend(events.finish(finish, Some("END".into()), MessageUsage::new(9, 0, 4)));
    out
}

#[test]
fn text_streams_as_one_text_block_then_the_message_delta_and_stop() {
    let events = render(
        MessageEvents::new(false, false),
        &["Hel", "", "lo"],
        Finish::EosToken,
    );
    assert_eq!(
        types(&events),
        [
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        events[0]["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(
        events[2]["delta"],
        json!({"type": "text_delta", "text": "lo"})
    );
    assert_eq!(
        events[4]["delta"],
        json!({"stop_reason": "end_turn", "stop_sequence": null})
    );
    assert_eq!(
        events[4]["usage"],
        json!({"input_tokens": 9, "output_tokens": 4, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})
    );
}

#[test]
fn a_stop_sequence_is_named_only_when_it_ended_the_message() {
    let stopped = render(
        MessageEvents::new(false, false),
        &["a"],
        Finish::StopSequence,
    );
    assert_eq!(
        stopped[3]["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
    );
    let long = render(MessageEvents::new(false, false), &[], Finish::Length);
    assert_eq!(types(&long), ["message_delta", "message_stop"]);
    assert_eq!(
        long[0]["delta"],
        json!({"stop_reason": "max_tokens", "stop_sequence": null})
    );
}

#[test]
fn calls_stream_as_tool_use_blocks_with_input_json_deltas() {
    let document =
        r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}"#;
    let pieces: Vec<String> = document.chars().map(String::from).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let events = render(MessageEvents::new(true, false), &pieces, Finish::EosToken);
    let starts: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["index"], 0);
    assert_eq!(starts[1]["index"], 1);
    assert_eq!(starts[0]["content_block"]["type"], "tool_use");
    assert_eq!(starts[0]["content_block"]["name"], "a");
    assert!(starts[0]["content_block"]["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("toolu_")));
    for (index, expected) in [(0, r#"{"x": 1}"#), (1, "{}")] {
        let rebuilt: String = events
            .iter()
            .filter(|e| e["type"] == "content_block_delta" && e["index"] == index)
            .map(|e| {
                assert_eq!(e["delta"]["type"], "input_json_delta");
                e["delta"]["partial_json"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(rebuilt, expected);
    }
    let stops = events
        .iter()
        .filter(|e| e["type"] == "content_block_stop")
        .count();
    assert_eq!(stops, 2);
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
}

#[test]
fn with_auto_tools_plain_text_is_a_text_block() {
    let events = render(
        MessageEvents::new(true, false),
        &["Sunny", "."],
        Finish::EosToken,
    );
    assert_eq!(events[0]["content_block"]["type"], "text");
    assert_eq!(events[4]["delta"]["stop_reason"], "end_turn");
}

#[test]
fn message_start_carries_an_empty_assistant_message_and_input_usage() {
    let start = MessageEvents::start("msg_1", "m", 9);
    assert_eq!(start["type"], "message_start");
    assert_eq!(start["message"]["content"], json!([]));
    assert_eq!(
        start["message"]["usage"],
        json!({"input_tokens": 9, "output_tokens": 0, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})
    );
}

#[test]
fn hermes_text_then_a_call_split_across_pieces_becomes_a_text_block_then_a_tool_use_block() {
    let pieces = [
        "Let me check.<tool",
        "_call>\n{\"name\": \"a\", \"arguments\": ",
        "{\"x\": 1}}\n</tool_call>",
    ];
    let renderer = MessageEvents::new(true, false).with_tool_family(ToolFamily::Hermes);
    let events = render(renderer, &pieces, Finish::EosToken);
    let text: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Let me check.");
    let starts: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[1]["content_block"]["name"], "a");
    let input: String = events
        .iter()
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(input, r#"{"x": 1}"#);
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
}

#[test]
fn a_held_back_partial_trigger_is_released_as_text_when_the_message_ends() {
    let renderer = MessageEvents::new(true, false).with_tool_family(ToolFamily::Hermes);
    let events = render(renderer, &["a <tool_c"], Finish::EosToken);
    let text: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "a <tool_c");
}
