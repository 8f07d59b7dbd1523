use serde_json::json;

use super::*;
use crate::tools::output::{parse_output, ChoiceOutput, DeltaBody};
use crate::tools::plan::plan;
use crate::tools::plan::ToolPlan;
use crate::tools::xml_syntax::{DEEPSEEK_V32, GLM45, QWEN3_CODER};

fn kinds() -> ValueKinds {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"enum": ["celsius", "fahrenheit"]}, "where": {"type": "object"}}}}}]);
    let plan = plan(Some(tools), None, None).unwrap().unwrap();
    ValueKinds::of_tools(
        plan.tools
            .iter()
            .map(|tool| (tool.name.as_str(), &tool.parameters)),
    )
}

/// Streams `text` cut after every `step` characters; returns each call's name and arguments.
fn calls(
    family: ToolFamily,
    syntax: &'static XmlSyntax,
    text: &str,
    step: usize,
) -> Vec<(String, String)> {
    let mut stream = XmlCallStream::new(family, syntax, kinds());
    let chars: Vec<char> = text.chars().collect();
    let mut calls: Vec<(String, String)> = Vec::new();
    for piece in chars.chunks(step) {
        for delta in stream.push(&piece.iter().collect::<String>()) {
            if let Some(name) = delta.pointer("/function/name").and_then(Value::as_str) {
                assert!(delta["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("call_")));
                calls.push((name.to_owned(), String::new()));
            }
            let fragment = delta
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap();
            calls.last_mut().unwrap().1.push_str(fragment);
        }
    }
    assert_eq!(stream.count(), calls.len());
    calls
}

fn parsed(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{arguments:?}: {e}"))
}

const QWEN_CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n\"quoted\" </param\n</parameter>\n\
    <parameter=days>\n3\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n\
    <parameter=where>\n{\"a\": \"x\\n</parameter>\\n\"}\n</parameter>\n</function>\n</tool_call>";

#[test]
fn qwen3_coder_values_read_back_as_strings_or_json_by_their_schema_however_the_text_is_cut() {
    for step in [1, 2, 3, 7, 1000] {
        let calls = calls(ToolFamily::Qwen3Coder, &QWEN3_CODER, QWEN_CALL, step);
        assert_eq!(calls.len(), 1, "step {step}");
        assert_eq!(calls[0].0, "get_weather");
        assert_eq!(
            parsed(&calls[0].1),
            json!({"city": "New York\n\"quoted\" </param", "days": 3, "unit": "celsius",
                   "where": {"a": "x\n</parameter>\n"}}),
            "step {step}"
        );
    }
}

#[test]
fn parallel_calls_and_calls_without_parameters_each_get_their_own_index() {
    let text = format!("{QWEN_CALL}\n<tool_call>\n<function=now>\n</function>\n</tool_call>");
    for step in [1, 5, 1000] {
        let calls = calls(ToolFamily::Qwen3Coder, &QWEN3_CODER, &text, step);
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["get_weather", "now"]
        );
        assert_eq!(parsed(&calls[1].1), json!({}));
    }
}

#[test]
fn glm45_calls_read_back_the_same_way() {
    let text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich </arg</arg_value>\n\
        <arg_key>days</arg_key>\n<arg_value>14</arg_value>\n</tool_call>\n<tool_call>now\n</tool_call>";
    for step in [1, 4, 1000] {
        let calls = calls(ToolFamily::Glm45, &GLM45, text, step);
        assert_eq!(calls.len(), 2);
        assert_eq!(
            parsed(&calls[0].1),
            json!({"city": "Zürich </arg", "days": 14})
        );
        assert_eq!(
            (calls[1].0.as_str(), parsed(&calls[1].1)),
            ("now", json!({}))
        );
    }
}

#[test]
fn a_value_streams_before_its_call_ends_and_a_split_closing_marker_is_held_back() {
    let mut stream = XmlCallStream::new(ToolFamily::Qwen3Coder, &QWEN3_CODER, kinds());
    let opening = stream.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar");
    assert_eq!(opening[0]["function"]["name"], "get_weather");
    assert_eq!(opening[1]["function"]["arguments"], "{\"city\": \"Par");
    let held = stream.push("is\n</para");
    assert_eq!(held[0]["function"]["arguments"], "is");
    let closed = stream.push("meter>\n</function>\n</tool_call>");
    assert_eq!(closed[0]["function"]["arguments"], "\"}");
    let not_a_close = XmlCallStream::new(ToolFamily::Qwen3Coder, &QWEN3_CODER, kinds()).push(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\na\n</par b\n</parameter>\n</function>\n</tool_call>",
    );
    let arguments: String = not_a_close[1..]
        .iter()
        .map(|d| d["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(parsed(&arguments), json!({"city": "a\n</par b"}));
}

fn weather_plan(family: ToolFamily, choice: &str) -> ToolPlan {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "now"}}]);
    plan(Some(tools), Some(json!(choice)), None)
        .unwrap()
        .unwrap()
        .with_format(crate::tools::ToolFormat::text(family))
}

const PARIS: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
    <parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";

/// The content and the calls' `(name, arguments)` of `pieces` streamed through `output`.
fn routed(mut output: ChoiceOutput, pieces: &[&str]) -> (String, Vec<(String, Value)>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let bodies: Vec<DeltaBody> = pieces
        .iter()
        .map(|piece| output.push((*piece).to_owned()))
        .collect();
    for body in bodies.into_iter().chain([output.finish()]) {
        let (text, deltas) = body.into_parts();
        content.push_str(&text);
        for delta in deltas {
            if let Some(name) = delta.pointer("/function/name").and_then(Value::as_str) {
                calls.push((name.to_owned(), String::new()));
            }
            let fragment = delta
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap();
            calls.last_mut().unwrap().1.push_str(fragment);
        }
    }
    assert_eq!(
        output.finish_reason("stop"),
        if calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        }
    );
    (
        content,
        calls
            .into_iter()
            .map(|(name, arguments)| (name, parsed(&arguments)))
            .collect(),
    )
}

#[test]
fn text_before_a_trigger_split_across_tokens_is_content_and_the_call_is_read_by_the_schema() {
    let plan = weather_plan(ToolFamily::Qwen3Coder, "auto");
    let (opening, tail) = PARIS.split_at(6);
    assert_eq!(opening, "<tool_");
    let pieces = ["Let me check. <", "tool", "_", tail];
    let (content, calls) = routed(ChoiceOutput::for_plan(&plan), &pieces);
    assert_eq!(content, "Let me check. ");
    assert_eq!(
        calls,
        [(
            "get_weather".to_owned(),
            json!({"city": "Paris", "days": 2})
        )]
    );
    let (content, calls) = routed(
        ChoiceOutput::for_plan(&plan),
        &["a <tool_", "ca is not a call"],
    );
    assert_eq!(
        (content.as_str(), calls.len()),
        ("a <tool_ca is not a call", 0)
    );
}

#[test]
fn the_anthropic_and_responses_renderers_read_values_by_the_schema_they_are_given() {
    let plan = weather_plan(ToolFamily::Qwen3Coder, "required");
    let output = ChoiceOutput::new(ToolFamily::Tandem, true)
        .in_family(ToolFamily::Qwen3Coder)
        .with_tools(&plan);
    let (_, calls) = routed(output, &[PARIS]);
    assert_eq!(calls[0].1, json!({"city": "Paris", "days": 2}));
}

#[test]
fn a_call_right_after_the_reasoning_end_is_never_lost() {
    use crate::reasoning::{ReasoningParser, ReasoningSplitter, ReasoningStart};
    let plan = weather_plan(ToolFamily::Qwen3Coder, "auto");
    let generated = format!("Paris, two days.\n</think>\n\n{PARIS}");
    for step in [1, 3, 11, 1000] {
        let mut splitter = ReasoningSplitter::new(ReasoningParser::Qwen3, ReasoningStart::Inside);
        let chars: Vec<char> = generated.chars().collect();
        let mut reasoning = String::new();
        let mut answer = Vec::new();
        for piece in chars.chunks(step) {
            let split = splitter.push(&piece.iter().collect::<String>());
            reasoning.push_str(&split.reasoning);
            answer.push(split.answer);
        }
        let last = splitter.finish();
        reasoning.push_str(&last.reasoning);
        answer.push(last.answer);
        let pieces: Vec<&str> = answer.iter().map(String::as_str).collect();
        let (content, calls) = routed(ChoiceOutput::for_plan(&plan), &pieces);
        assert_eq!(reasoning.trim(), "Paris, two days.", "step {step}");
        assert_eq!(content, "", "step {step}");
        assert_eq!(
            calls,
            [(
                "get_weather".to_owned(),
                json!({"city": "Paris", "days": 2})
            )]
        );
    }
}

#[test]
fn a_finished_output_splits_into_content_and_calls_and_a_cut_call_stays_text() {
    let plan = weather_plan(ToolFamily::Glm45, "auto");
    let glm =
        "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
    let parsed_output = parse_output(
        &plan,
        &format!("Checking.\n{glm}\n<tool_call>now\n</tool_call>"),
    );
    assert_eq!(parsed_output.content.as_deref(), Some("Checking.\n"));
    let calls: Vec<(&str, &str)> = parsed_output
        .calls
        .iter()
        .map(|call| {
            (
                call.function.name.as_str(),
                call.function.arguments.as_str(),
            )
        })
        .collect();
    assert_eq!(calls, [("get_weather", "{\"days\": 3}"), ("now", "{}")]);
    let cut = &glm[..glm.len() - 5];
    let parsed_output = parse_output(&plan, cut);
    assert_eq!(
        (parsed_output.content.as_deref(), parsed_output.calls.len()),
        (Some(cut), 0)
    );
}

/// DeepSeek-V3.2's block: a raw string holding a split closing tag and quotes, a JSON number
/// and a JSON object holding the closing tag in a string, then a call without parameters.
const DSML_CALLS: &str = "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
    <｜DSML｜parameter name=\"city\" string=\"true\">New \"York\" </｜DSML｜para</｜DSML｜parameter>\n\
    <｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
    <｜DSML｜parameter name=\"where\" string=\"false\">{\"a\": \"</｜DSML｜parameter>\"}</｜DSML｜parameter>\n\
    </｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";

#[test]
fn dsml_values_read_back_by_their_tags_string_attribute_however_the_text_is_cut() {
    for step in [1, 2, 3, 7, 1000] {
        let calls = calls(ToolFamily::DeepseekV32, &DEEPSEEK_V32, DSML_CALLS, step);
        assert_eq!(calls.len(), 2, "step {step}");
        assert_eq!(calls[0].0, "get_weather");
        assert_eq!(
            parsed(&calls[0].1),
            json!({"city": "New \"York\" </｜DSML｜para", "days": 3,
                   "where": {"a": "</｜DSML｜parameter>"}}),
            "step {step}"
        );
        assert_eq!((calls[1].0.as_str(), calls[1].1.as_str()), ("now", "{}"));
    }
}

#[test]
fn text_before_the_dsml_block_is_content_and_its_split_opening_is_held_back() {
    let plan = weather_plan(ToolFamily::DeepseekV32, "auto");
    let (opening, tail) = DSML_CALLS.split_at("<｜DSML".len());
    let pieces = ["Checking <｜DS is not a block. ", opening, tail];
    let (content, calls) = routed(ChoiceOutput::for_plan(&plan), &pieces);
    assert_eq!(content, "Checking <｜DS is not a block. ");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].1["days"], json!(3));
    let cut = &DSML_CALLS[..DSML_CALLS.find("York").expect("in the text")];
    let whole = parse_output(&plan, cut);
    assert_eq!(whole.content.as_deref(), Some(cut));
    assert!(whole.calls.is_empty());
}
