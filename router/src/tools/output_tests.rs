use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::tools::format::ToolFormat;
use crate::tools::plan::plan;

fn planned(family: ToolFamily, choice: &str) -> ToolPlan {
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}},
                       {"type": "function", "function": {"name": "now"}}]);
    plan(Some(tools), Some(json!(choice)), None)
        .expect("valid tools")
        .expect("tools given")
        .with_format(ToolFormat::text(family))
}

/// Streams `text` cut after every `step` characters; returns the content and the calls as
/// `(name, arguments)`, rebuilt from the deltas.
fn streamed(plan: &ToolPlan, text: &str, step: usize) -> (String, Vec<(String, String)>) {
    let chars: Vec<char> = text.chars().collect();
    let mut output = ChoiceOutput::for_plan(plan);
    let mut bodies: Vec<DeltaBody> = chars
        .chunks(step)
        .map(|piece| output.push(piece.iter().collect()))
        .collect();
    bodies.push(output.finish());
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for body in bodies {
        let (text, deltas) = body.into_parts();
        content.push_str(&text);
        deltas
            .iter()
            .for_each(|delta| merge_delta(&mut calls, delta));
    }
    let calls = calls
        .into_iter()
        .map(|c| (c.function.name, c.function.arguments))
        .collect();
    (content, calls)
}

fn call(name: &str, arguments: &str) -> (String, String) {
    (name.to_owned(), arguments.to_owned())
}

const HERMES_TWO: &str = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris <tool_call>\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";

#[test]
fn hermes_content_then_parallel_calls_are_the_same_however_the_text_is_cut() {
    let auto = planned(ToolFamily::Hermes, "auto");
    for step in [1, 2, 5, 11, HERMES_TWO.len()] {
        let (content, calls) = streamed(&auto, HERMES_TWO, step);
        assert_eq!(content, "Checking.\n", "cut every {step}");
        assert_eq!(
            calls,
            [
                call("get_weather", r#"{"city": "Paris <tool_call>"}"#),
                call("now", "{}")
            ],
            "cut every {step}"
        );
    }
}

#[test]
fn a_partial_trigger_is_held_until_decided_and_released_as_content_if_it_was_not_one() {
    let mut output = ChoiceOutput::for_plan(&planned(ToolFamily::Hermes, "auto"));
    assert_eq!(
        output.push("a <tool".into()),
        DeltaBody::Content("a ".into())
    );
    assert_eq!(output.push("_ca".into()), DeltaBody::Nothing);
    assert_eq!(
        output.push("t!".into()),
        DeltaBody::Content("<tool_cat!".into())
    );
    assert_eq!(output.push(" <".into()), DeltaBody::Content(" ".into()));
    assert_eq!(output.finish(), DeltaBody::Content("<".into()));
    assert_eq!(output.finish_reason("stop"), "stop");
}

#[test]
fn a_multi_token_delta_can_carry_content_and_the_first_call_together() {
    let mut output = ChoiceOutput::for_plan(&planned(ToolFamily::Hermes, "auto"));
    let body = output.push(HERMES_TWO[..60].to_owned());
    match body {
        DeltaBody::ContentThenCalls(content, deltas) => {
            assert_eq!(content, "Checking.\n");
            assert_eq!(deltas[0]["function"]["name"], "get_weather");
        }
        other => panic!("expected content then calls, got {other:?}"),
    }
    assert_eq!(output.finish_reason("stop"), "tool_calls");
    assert_eq!(output.finish_reason("length"), "length");
}

#[test]
fn llama_and_mistral_calls_open_the_output_and_plain_answers_stay_content() {
    let llama = planned(ToolFamily::Llama3Json, "auto");
    let text = r#"{"name": "now", "parameters": {"tz": "UTC"}}"#;
    assert_eq!(
        streamed(&llama, text, 3),
        (String::new(), vec![call("now", r#"{"tz": "UTC"}"#)])
    );
    assert_eq!(
        streamed(&llama, "It is [noon].", 1),
        ("It is [noon].".to_owned(), vec![])
    );
    let mistral = planned(ToolFamily::Mistral, "auto");
    let list = r#" [{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]"#;
    let expected = vec![
        call("now", "{}"),
        call("get_weather", r#"{"city": "Oslo"}"#),
    ];
    assert_eq!(
        streamed(&mistral, list, 1),
        (String::new(), expected.clone())
    );
    let spelled = format!("[TOOL_CALLS]{list}");
    assert_eq!(streamed(&mistral, &spelled, 4), (String::new(), expected));
    assert_eq!(
        streamed(&mistral, "Oslo {is} cold.", 2).0,
        "Oslo {is} cold."
    );
}

#[test]
fn a_finished_output_splits_into_content_and_calls_and_cut_calls_stay_text() {
    let hermes = planned(ToolFamily::Hermes, "auto");
    let parsed = parse_output(&hermes, HERMES_TWO);
    assert_eq!(parsed.content.as_deref(), Some("Checking.\n"));
    assert_eq!(parsed.calls.len(), 2);
    assert!(parsed.calls[0].id.starts_with("call_") && parsed.calls[0].id != parsed.calls[1].id);
    let only_calls = parse_output(&hermes, &HERMES_TWO["Checking.\n".len()..]);
    assert_eq!((only_calls.content, only_calls.calls.len()), (None, 2));
    let cut = &HERMES_TWO[..80];
    assert_eq!(
        parse_output(&hermes, cut),
        ParsedOutput {
            content: Some(cut.to_owned()),
            calls: vec![]
        }
    );
    let tandem = planned(ToolFamily::Tandem, "required");
    let document = r#"{"tool_calls": [{"name": "now", "arguments": {}}]}"#;
    assert_eq!(
        parse_output(&tandem, document).calls[0].function.name,
        "now"
    );
    assert_eq!(
        parse_output(&tandem, "Sunny.").content.as_deref(),
        Some("Sunny.")
    );
}

#[test]
fn parsing_is_linear_in_the_output_even_one_character_at_a_time() {
    let auto = planned(ToolFamily::Hermes, "auto");
    let text = "<tool_ca".repeat(50_000);
    let started = Instant::now();
    let (content, calls) = streamed(&auto, &text, 1);
    assert_eq!((content.len(), calls.len()), (text.len(), 0));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn harmony_calls_and_final_text_come_apart_however_the_answer_stream_is_cut() {
    let plan = planned(ToolFamily::Harmony, "auto");
    let text = "Sure.<|channel|>commentary to=functions.now<|message|>{\"tz\": \"UTC\"}<|call|>";
    for step in [1, 2, 5, 100] {
        let (content, calls) = streamed(&plan, text, step);
        assert_eq!(content, "Sure.", "step {step}");
        assert_eq!(
            calls,
            vec![("now".to_owned(), "{\"tz\": \"UTC\"}".to_owned())]
        );
    }
    let parsed = parse_output(&plan, text);
    assert_eq!(parsed.content.as_deref(), Some("Sure."));
    assert_eq!(parsed.calls[0].function.name, "now");
    let mut output = ChoiceOutput::for_plan(&planned(ToolFamily::Harmony, "required"));
    output.push(text.to_owned());
    assert_eq!(output.finish_reason("stop"), "tool_calls");
    assert_eq!(output.finish_reason("length"), "length");
    let mut answer_only = ChoiceOutput::for_plan(&plan);
    assert_eq!(
        answer_only.push("Hi <b>".to_owned()),
        DeltaBody::Content("Hi <b>".into())
    );
    assert_eq!(answer_only.finish_reason("stop"), "stop");
}
