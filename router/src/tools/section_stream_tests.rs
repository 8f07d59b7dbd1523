use serde_json::json;

use super::*;
use crate::reasoning::{ReasoningParser, ReasoningSplitter, ReasoningStart};
use crate::tools::format::ToolFormat;
use crate::tools::output::{parse_output, ChoiceOutput, DeltaBody};
use crate::tools::plan::{plan, ToolPlan};
use crate::tools::section::{DEEPSEEK_V31, KIMI_K2};

fn planned(family: ToolFamily, choice: &str) -> ToolPlan {
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}},
                       {"type": "function", "function": {"name": "now"}}]);
    plan(Some(tools), Some(json!(choice)), None)
        .expect("valid tools")
        .expect("tools given")
        .with_format(ToolFormat::text(family))
}

/// A call `(id, name, arguments)` rebuilt from the deltas.
pub(crate) type Call = (String, String, String);

/// Content and calls rebuilt from the bodies of one streamed output.
pub(crate) fn rebuilt(bodies: Vec<DeltaBody>) -> (String, Vec<Call>) {
    let mut content = String::new();
    let mut calls: Vec<Call> = Vec::new();
    for body in bodies {
        let (text, deltas) = body.into_parts();
        content.push_str(&text);
        for delta in deltas {
            let index = delta["index"].as_u64().expect("an index") as usize;
            if let Some(id) = delta["id"].as_str() {
                assert_eq!(index, calls.len(), "calls are announced in order");
                let name = delta["function"]["name"].as_str().expect("a name");
                calls.push((id.to_owned(), name.to_owned(), String::new()));
            } else {
                let fragment = delta["function"]["arguments"].as_str().expect("arguments");
                calls[index].2.push_str(fragment);
            }
        }
    }
    (content, calls)
}

/// Streams `text` cut every `step` characters through a choice's output.
pub(crate) fn streamed(plan: &ToolPlan, text: &str, step: usize) -> (String, Vec<Call>) {
    let chars: Vec<char> = text.chars().collect();
    let mut output = ChoiceOutput::for_plan(plan);
    let mut bodies: Vec<DeltaBody> = chars
        .chunks(step)
        .map(|piece| output.push(piece.iter().collect()))
        .collect();
    bodies.push(output.finish());
    rebuilt(bodies)
}

fn deepseek(name: &str, arguments: &str) -> String {
    format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>")
}

fn kimi(id: &str, arguments: &str) -> String {
    format!("<|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>")
}

const PARIS: &str = r#"{"city": "Paris }<｜tool▁call▁end｜>", "days": [1, {"n": 2}]}"#;

#[test]
fn deepseek_content_then_parallel_calls_are_the_same_however_the_text_is_cut() {
    let text = format!(
        "Checking.<｜tool▁calls▁begin｜>{}{}<｜tool▁calls▁end｜>",
        deepseek("get_weather", PARIS),
        deepseek("now", "{}")
    );
    let auto = planned(ToolFamily::DeepseekV31, "auto");
    for step in [1, 2, 3, 7, 19, text.chars().count()] {
        let (content, calls) = streamed(&auto, &text, step);
        assert_eq!(content, "Checking.", "cut every {step}");
        let named: Vec<(&str, &str)> = calls.iter().map(|c| (c.1.as_str(), c.2.as_str())).collect();
        assert_eq!(
            named,
            [("get_weather", PARIS), ("now", "{}")],
            "cut every {step}"
        );
        assert!(calls.iter().all(|call| call.0.starts_with("call_")));
    }
}

#[test]
fn kimi_calls_keep_the_ids_kimi_writes_and_the_name_inside_them() {
    let text = format!(
        "<|tool_calls_section_begin|>{}{}<|tool_calls_section_end|>",
        kimi("functions.get_weather:0", r#"{"city": "Paris"}"#),
        kimi("functions.now:1", "{}")
    );
    let required = planned(ToolFamily::KimiK2, "required");
    for step in [1, 4, 11, text.chars().count()] {
        let (content, calls) = streamed(&required, &text, step);
        assert_eq!(content, "");
        assert_eq!(
            calls,
            [
                (
                    "functions.get_weather:0".into(),
                    "get_weather".into(),
                    r#"{"city": "Paris"}"#.into()
                ),
                ("functions.now:1".into(), "now".into(), "{}".into())
            ],
            "cut every {step}"
        );
    }
    assert_eq!(
        KIMI_K2.read_header("functions.a:b:12"),
        Some(("a:b", Some("functions.a:b:12")))
    );
    assert_eq!(KIMI_K2.read_header("functions.now"), None);
    assert_eq!(DEEPSEEK_V31.read_header("now"), Some(("now", None)));
}

#[test]
fn a_split_section_opening_is_held_back_and_released_as_content_when_it_was_not_one() {
    let mut output = ChoiceOutput::for_plan(&planned(ToolFamily::KimiK2, "auto"));
    assert_eq!(
        output.push("a <|tool_ca".into()),
        DeltaBody::Content("a ".into())
    );
    assert_eq!(output.push("lls_sect".into()), DeltaBody::Nothing);
    assert_eq!(
        output.push("or".into()),
        DeltaBody::Content("<|tool_calls_sector".into())
    );
    assert_eq!(
        output.push(" <｜tool".into()),
        DeltaBody::Content(" <｜tool".into())
    );
    assert_eq!(output.push(" <|".into()), DeltaBody::Content(" ".into()));
    assert_eq!(output.finish(), DeltaBody::Content("<|".into()));
    let mut deepseek = ChoiceOutput::for_plan(&planned(ToolFamily::DeepseekV31, "auto"));
    assert_eq!(
        deepseek.push("x<｜tool▁".into()),
        DeltaBody::Content("x".into())
    );
    assert_eq!(
        deepseek.push("calls▁begin｜><｜tool▁call▁begin｜>now".into()),
        DeltaBody::Nothing
    );
    let DeltaBody::ToolCalls(opening) = deepseek.push("<｜tool▁sep｜>{".into()) else {
        panic!("the header's end announces the call");
    };
    assert_eq!(opening[0]["function"]["name"], "now");
    assert_eq!(opening[1]["function"]["arguments"], "{");
}

#[test]
fn a_call_right_after_the_reasoning_end_is_parsed_from_the_answer() {
    let text = format!(
        "Look it up.</think><｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
        deepseek("now", r#"{"tz": "UTC"}"#)
    );
    let auto = planned(ToolFamily::DeepseekV31, "auto");
    for step in [1, 5, text.chars().count()] {
        let mut splitter =
            ReasoningSplitter::new(ReasoningParser::DeepseekV3, ReasoningStart::Inside);
        let mut output = ChoiceOutput::for_plan(&auto);
        let mut reasoning = String::new();
        let mut bodies = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            let split = splitter.push(&piece.iter().collect::<String>());
            reasoning.push_str(&split.reasoning);
            bodies.push(output.push(split.answer));
        }
        let split = splitter.finish();
        reasoning.push_str(&split.reasoning);
        bodies.push(output.push(split.answer));
        bodies.push(output.finish());
        let (content, calls) = rebuilt(bodies);
        assert_eq!(reasoning, "Look it up.", "cut every {step}");
        assert_eq!(content, "", "cut every {step}");
        assert_eq!(calls.len(), 1, "cut every {step}");
        assert_eq!(
            (calls[0].1.as_str(), calls[0].2.as_str()),
            ("now", r#"{"tz": "UTC"}"#)
        );
        assert_eq!(output.finish_reason("stop"), "tool_calls");
    }
}

#[test]
fn a_whole_output_splits_into_content_and_calls_and_a_cut_call_stays_text() {
    let text = format!(
        "Sure.<|tool_calls_section_begin|>{}<|tool_calls_section_end|>",
        kimi("functions.now:3", r#"{"tz": "UTC"}"#)
    );
    let parsed = parse_output(&planned(ToolFamily::KimiK2, "auto"), &text);
    assert_eq!(parsed.content.as_deref(), Some("Sure."));
    assert_eq!(parsed.calls.len(), 1);
    assert_eq!(parsed.calls[0].id, "functions.now:3");
    assert_eq!(parsed.calls[0].function.arguments, r#"{"tz": "UTC"}"#);
    let cut = &text[..text.find("UTC").expect("in the text")];
    let parsed = parse_output(&planned(ToolFamily::KimiK2, "auto"), cut);
    assert_eq!(parsed.content.as_deref(), Some(cut));
    assert!(parsed.calls.is_empty());
    let plain = parse_output(
        &planned(ToolFamily::DeepseekV31, "auto"),
        "No tools needed.",
    );
    assert_eq!(plain.content.as_deref(), Some("No tools needed."));
}

#[test]
fn nothing_after_the_section_end_is_a_call() {
    let mut stream = SectionStream::new(ToolFamily::DeepseekV31, &DEEPSEEK_V31);
    let text = format!(
        "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>{}",
        deepseek("now", "{}"),
        deepseek("now", "{}")
    );
    let deltas = stream.push(&text);
    assert_eq!(stream.count(), 1);
    assert_eq!(deltas.len(), 2);
}
