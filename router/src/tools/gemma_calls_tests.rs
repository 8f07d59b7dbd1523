use serde_json::json;

use super::*;
use crate::reasoning::{ReasoningParser, ReasoningSplitter, ReasoningStart};
use crate::tools::format::ToolFormat;
use crate::tools::output::{parse_output, ChoiceOutput};
use crate::tools::plan::{plan, ToolPlan};
use crate::tools::section_stream::tests::{rebuilt, streamed, Call};

fn planned(choice: &str) -> ToolPlan {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "now"}}]);
    plan(Some(tools), Some(json!(choice)), Some(json!(true)))
        .expect("valid tools")
        .expect("tools given")
        .with_format(ToolFormat::text(ToolFamily::Gemma4))
}

/// A call whose string holds JSON's special characters, a split quote's first half, braces
/// and commas, beside nested values of every kind.
const WEATHER: &str =
    "<|tool_call>call:get_weather{city:<|\"|>New \"York\" <|\\\n{a,b}: ü<|\"|>,days:3,\
    flags:[true,false,null],opts:{deep:{n:-1.5e2},tags:[<|\"|>x<|\"|>]}}<tool_call|>";

fn weather_arguments() -> Value {
    json!({"city": "New \"York\" <|\\\n{a,b}: ü", "days": 3, "flags": [true, false, null],
           "opts": {"deep": {"n": -150.0}, "tags": ["x"]}})
}

fn arguments(call: &Call) -> Value {
    serde_json::from_str(&call.2).unwrap_or_else(|e| panic!("{:?}: {e}", call.2))
}

/// Cut points of `text` drawn from a fixed seed, so the cuts vary but the test does not.
fn seeded_pieces(text: &str, seed: u64) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut state = seed;
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let len = 1 + (state >> 33) as usize % 9;
        let end = (at + len).min(chars.len());
        pieces.push(chars[at..end].iter().collect());
        at = end;
    }
    pieces
}

#[test]
fn calls_read_back_as_json_however_the_text_is_cut() {
    let text = format!("{WEATHER}<|tool_call>call:now{{}}<tool_call|>");
    let required = planned("required");
    for step in [1, 2, 3, 7, text.chars().count()] {
        let (content, calls) = streamed(&required, &text, step);
        assert_eq!(content, "", "cut every {step}");
        assert_eq!(calls.len(), 2, "cut every {step}");
        assert_eq!(calls[0].1, "get_weather");
        assert_eq!(
            arguments(&calls[0]),
            weather_arguments(),
            "cut every {step}"
        );
        assert_eq!((calls[1].1.as_str(), calls[1].2.as_str()), ("now", "{}"));
    }
    for seed in 0..20 {
        let mut output = ChoiceOutput::for_plan(&required);
        let mut bodies: Vec<_> = seeded_pieces(&text, seed)
            .into_iter()
            .map(|piece| output.push(piece))
            .collect();
        bodies.push(output.finish());
        let (_, calls) = rebuilt(bodies);
        assert_eq!(arguments(&calls[0]), weather_arguments(), "seed {seed}");
        assert_eq!(output.finish_reason("stop"), "tool_calls");
    }
}

#[test]
fn text_before_the_first_call_is_content_and_a_split_opening_is_held_back() {
    let auto = planned("auto");
    let text = format!("Checking <|tool the weather. {WEATHER}");
    for step in [1, 4, text.chars().count()] {
        let (content, calls) = streamed(&auto, &text, step);
        assert_eq!(content, "Checking <|tool the weather. ", "cut every {step}");
        assert_eq!(calls.len(), 1, "cut every {step}");
        assert_eq!(arguments(&calls[0]), weather_arguments());
    }
    let (content, calls) = streamed(&auto, "An answer ending in <|tool_ca", 1);
    assert_eq!(content, "An answer ending in <|tool_ca");
    assert!(calls.is_empty());
}

#[test]
fn a_string_streams_before_it_closes_and_a_split_quote_never_reaches_the_arguments() {
    let mut stream = GemmaCallStream::new(ToolFamily::Gemma4);
    let opening = stream.push("<|tool_call>call:get_weather{city:<|\"|>Par");
    assert_eq!(opening[0]["function"]["name"], "get_weather");
    assert_eq!(opening[1]["function"]["arguments"], "{\"city\": \"Par");
    let held = stream.push("is<|\"");
    assert_eq!(held[0]["function"]["arguments"], "is");
    let closed = stream.push("|>}<tool_call|>");
    assert_eq!(closed[0]["function"]["arguments"], "\"}");
    assert_eq!(stream.count(), 1);
}

#[test]
fn a_call_after_the_thought_channel_is_read_from_the_answer() {
    let text = format!("<|channel>thought\nLook it up.<channel|>{WEATHER}");
    let auto = planned("auto");
    for step in [1, 5, text.chars().count()] {
        let mut splitter = ReasoningSplitter::new(
            ReasoningParser::Gemma4,
            ReasoningStart::Undecided {
                reasoning_by_default: false,
            },
        );
        let mut output = ChoiceOutput::for_plan(&auto);
        let (mut reasoning, mut bodies) = (String::new(), Vec::new());
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
        assert_eq!(
            arguments(&calls[0]),
            weather_arguments(),
            "cut every {step}"
        );
    }
}

#[test]
fn a_whole_output_splits_into_content_and_calls_and_malformed_calls_stay_text() {
    let auto = planned("auto");
    let text = format!("Sure. {WEATHER}");
    let parsed = parse_output(&auto, &text);
    assert_eq!(parsed.content.as_deref(), Some("Sure. "));
    assert_eq!(parsed.calls.len(), 1);
    assert!(parsed.calls[0].id.starts_with("call_"));
    let cut = &text[..text.find("days").expect("in the text")];
    for malformed in [
        cut,
        "<|tool_call>call:now{tz:UTC}<tool_call|>",
        "<|tool_call>call:now{tz:<|\"|>UTC}<tool_call|>",
        "No tools needed.",
    ] {
        let parsed = parse_output(&auto, malformed);
        assert_eq!(parsed.content.as_deref(), Some(malformed));
        assert!(parsed.calls.is_empty(), "{malformed}");
    }
}
