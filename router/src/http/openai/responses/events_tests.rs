use serde_json::json;

use super::*;
use crate::http::openai::responses::output::{Draft, Echo, ResponseUsage};
use crate::http::openai::responses::store::{ResponseStore, ResponseStoreLimits};
use crate::scheduler::SchedulerError;

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn draft() -> Draft {
    let echo = Echo {
        instructions: None,
        max_output_tokens: None,
        temperature: None,
        top_p: None,
        tools: Vec::new(),
        tool_choice: json!("auto"),
        parallel_tool_calls: true,
        text: json!({"format": {"type": "text"}}),
        metadata: serde_json::Map::new(),
        previous_response_id: None,
        store: false,
        user: None,
    };
    Draft::new("m".into(), echo, Vec::new(), None)
}

/// Every event of one response streamed as `pieces`, ended by `finish`.
fn streamed(renderer: &mut ResponseEvents, pieces: &[&str], finish: Finish) -> Vec<Value> {
    let draft = draft();
    let mut events = renderer.start(&draft.in_progress());
    for piece in pieces {
        events.extend(renderer.text((*piece).to_owned()));
    }
    let (closing, output) = renderer.finish(finish);
    events.extend(closing);
    let store = ResponseStore::new(ResponseStoreLimits::default());
    let usage = ResponseUsage::new(3, pieces.len());
    let body = draft.finish(output, finish, usage, pieces.concat(), &store);
    events.push(renderer.end(&body));
    events
}

#[test]
fn text_streams_as_one_message_with_numbered_events_in_order() {
    let events = streamed(
        &mut ResponseEvents::new(false, false),
        &["Hel", "", "lo"],
        Finish::EosToken,
    );
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let numbers: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..10).collect::<Vec<u64>>());
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert_eq!(events[2]["item"]["status"], "in_progress");
    let item_id = &events[2]["item"]["id"];
    assert!(item_id.as_str().unwrap().starts_with("msg_"));
    assert!(events[3..9]
        .iter()
        .all(|e| &e["item_id"] == item_id || e.get("item").is_some()));
    assert_eq!(events[6]["text"], "Hello");
    assert_eq!(events[7]["part"]["text"], "Hello");
    assert_eq!(events[8]["item"]["status"], "completed");
    let done = &events[9]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(done["output"][0]["id"], *item_id);
    assert_eq!(done["usage"]["total_tokens"], 6);
}

#[test]
fn the_length_limit_leaves_items_incomplete_and_ends_with_response_incomplete() {
    let events = streamed(
        &mut ResponseEvents::new(false, false),
        &["Hi"],
        Finish::Length,
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(last["response"]["status"], "incomplete");
    assert_eq!(
        last["response"]["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");
}

#[test]
fn an_empty_output_is_one_empty_message() {
    let mut renderer = ResponseEvents::new(false, false);
    let (events, output) = renderer.finish(Finish::EosToken);
    assert_eq!(
        kinds(&events),
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
    );
    assert!(
        matches!(&output[..], [OutputItem::Message { content, .. }] if content[0].text.is_empty())
    );
}

#[test]
fn calls_stream_as_function_call_items_with_argument_deltas() {
    let document = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]}"#;
    let pieces: Vec<String> = document.chars().map(String::from).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let events = streamed(
        &mut ResponseEvents::new(true, false),
        &pieces,
        Finish::EosToken,
    );
    let kinds = kinds(&events);
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "response.output_item.added")
            .count(),
        2
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "response.function_call_arguments.done")
            .count(),
        2
    );
    assert!(!kinds.contains(&"response.output_text.delta"));
    let first = events
        .iter()
        .find(|e| e["type"] == "response.output_item.added")
        .unwrap();
    assert_eq!(first["item"]["type"], "function_call");
    assert_eq!(first["item"]["name"], "get_weather");
    assert!(first["item"]["call_id"]
        .as_str()
        .unwrap()
        .starts_with("call_"));
    let rebuilt: String = events
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta" && e["output_index"] == 0)
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(rebuilt, r#"{"city": "Paris"}"#);
    let output = &events.last().unwrap()["response"]["output"];
    assert_eq!(output[0]["arguments"], r#"{"city": "Paris"}"#);
    assert_eq!(
        (&output[1]["name"], &output[1]["arguments"]),
        (&json!("now"), &json!("{}"))
    );
    assert_eq!(output[1]["status"], "completed");
}

#[test]
fn plain_text_with_tools_callable_stays_a_message() {
    let events = streamed(
        &mut ResponseEvents::new(true, false),
        &["Sunny", "."],
        Finish::EosToken,
    );
    let output = &events.last().unwrap()["response"]["output"];
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["content"][0]["text"], "Sunny.");
}

#[test]
fn an_error_event_carries_the_openai_error_and_the_next_number() {
    let mut renderer = ResponseEvents::new(false, false);
    renderer.start(&draft().in_progress());
    let error = AppError::Scheduler(SchedulerError::ShardFailed("boom".into()));
    let event = renderer.error(&error);
    assert_eq!(event["type"], "error");
    assert_eq!(event["sequence_number"], 2);
    assert_eq!(event["code"], "server_error");
    assert!(event["message"].as_str().unwrap().contains("boom"));
}

#[test]
fn a_hermes_call_after_text_is_a_message_then_a_function_call_item() {
    let pieces = [
        "Checking.<tool_c",
        "all>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
    ];
    let mut renderer = ResponseEvents::new(true, false).with_tool_family(ToolFamily::Hermes);
    let events = streamed(&mut renderer, &pieces, Finish::EosToken);
    let done: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .collect();
    assert_eq!(done.len(), 2);
    assert_eq!(done[0]["item"]["type"], "message");
    assert_eq!(done[0]["item"]["content"][0]["text"], "Checking.");
    assert_eq!(done[1]["item"]["type"], "function_call");
    assert_eq!(done[1]["item"]["name"], "now");
    assert_eq!(done[1]["item"]["arguments"], "{}");
}
