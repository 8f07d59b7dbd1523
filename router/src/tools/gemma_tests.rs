use serde_json::json;

use super::*;
use crate::reasoning::ReasoningParser;
use crate::tools::format::{ToolCallParser, ToolFamily, ToolFormat};
use crate::tools::plan::plan;
use crate::validation::testing::{self, EOS_ID};
use crate::validation::GrammarCompiler;

fn planned(choice: Value, parallel: bool) -> ToolPlan {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["days", "city"], "properties": {
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "where": {"type": "object", "required": ["lat"], "properties": {
                "lat": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}}},
            "extra": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}}},
        {"type": "function", "function": {"name": "now"}}]);
    plan(Some(tools), Some(choice), Some(json!(parallel)))
        .expect("valid tools")
        .expect("tools given")
        .with_format(ToolFormat::text(ToolFamily::Gemma4))
}

fn accepts_tokens(plan: &ToolPlan, special: &[&str], tokens: &[u32]) -> bool {
    let grammar = plan.grammar().expect("a grammar").grammar;
    let json = testing::tokenizer_json_with_special_tokens(special);
    let compiler = GrammarCompiler::from_tokenizer_json(&json, &[EOS_ID]).expect("test vocabulary");
    compiler.accepts(&grammar, tokens)
}

fn accepts(plan: &ToolPlan, text: &str) -> bool {
    accepts_tokens(plan, &[], &testing::encode(text))
}

/// A call to `name` with `arguments` written in Gemma's syntax (`'` stands for the quote).
fn call(name: &str, arguments: &str) -> String {
    format!(
        "<|tool_call>call:{name}{{{}}}<tool_call|>",
        arguments.replace('\'', QUOTE)
    )
}

#[test]
fn required_calls_name_declared_tools_in_sorted_keys_and_hold_each_value_to_its_schema() {
    let required = planned(json!("required"), true);
    let paris = call("get_weather", "city:'Paris',days:3");
    assert!(accepts(&required, &paris));
    for arguments in [
        "city:'a \"b\" {c},<|',days:14,unit:'celsius'",
        "city:'',days:1,where:{lat:-1.5,tags:['x','y']}",
        "city:'P',days:2,extra:{any:[1,'z',true,null]},where:{lat:0}",
    ] {
        assert!(
            accepts(&required, &call("get_weather", arguments)),
            "{arguments}"
        );
    }
    assert!(accepts(&required, &format!("{paris}{}", call("now", ""))));
    for (why, text) in [
        ("undeclared tool", call("get_time", "")),
        (
            "keys out of order",
            call("get_weather", "days:3,city:'Paris'"),
        ),
        ("missing required days", call("get_weather", "city:'Paris'")),
        (
            "days above its maximum",
            call("get_weather", "city:'P',days:15"),
        ),
        ("days a string", call("get_weather", "city:'P',days:'3'")),
        ("city unquoted", call("get_weather", "city:Paris,days:3")),
        (
            "city too long",
            call("get_weather", "city:'Llanfairpwllgwyngyll',days:3"),
        ),
        (
            "city holding a quote",
            call("get_weather", "city:'a'b',days:3"),
        ),
        (
            "unit outside its enumeration",
            call("get_weather", "city:'P',days:3,unit:'kelvin'"),
        ),
        (
            "nested required lat missing",
            call("get_weather", "city:'P',days:3,where:{}"),
        ),
        (
            "undeclared parameter",
            call("get_weather", "city:'P',days:3,tz:'x'"),
        ),
        ("trailing comma", call("get_weather", "city:'P',days:3,")),
        ("plain text", "Sunny.".to_owned()),
    ] {
        assert!(!accepts(&required, &text), "{why}");
    }
    let serial = planned(json!("required"), false);
    assert!(!accepts(&serial, &format!("{paris}{}", call("now", ""))));
    let named = planned(
        json!({"type": "function", "function": {"name": "now"}}),
        true,
    );
    assert!(accepts(&named, &call("now", "")));
    assert!(!accepts(&named, &paris));
}

#[test]
fn auto_is_free_text_until_the_call_opening_then_calls() {
    let auto = planned(json!("auto"), true);
    assert!(accepts(&auto, "Sunny, with <b>tags</b> and <|tool_ca"));
    assert!(accepts(
        &auto,
        &format!("Let me check.\n{}", call("now", ""))
    ));
    assert!(!accepts(
        &auto,
        &format!("Let me check.{}", call("get_time", ""))
    ));
}

#[test]
fn the_markers_and_the_quote_are_taken_as_their_visible_tokens() {
    let special = [CALL_OPEN, CALL_CLOSE, QUOTE];
    let tokenizer = testing::tokenizer_with_special_tokens(&special);
    let format = ToolFormat::choose(Some(ToolCallParser::Gemma4), None, &tokenizer);
    let [open, close, quote] = special.map(|marker| tokenizer.token_to_id(marker).expect("added"));
    assert_eq!(
        (
            format.trigger_token,
            format.closing_token,
            format.quote_token
        ),
        (Some(open), Some(close), Some(quote))
    );
    let required = planned(json!("required"), true).with_format(format);
    let mut tokens = vec![open];
    tokens.extend(testing::encode("call:get_weather{city:"));
    tokens.push(quote);
    tokens.extend(testing::encode("Paris <|\""));
    tokens.push(quote);
    tokens.extend(testing::encode(",days:3}"));
    tokens.push(close);
    assert!(accepts_tokens(&required, &special, &tokens));
    let auto = planned(json!("auto"), true).with_format(format);
    let mut tokens = testing::encode("Checking.");
    tokens.extend([open]);
    tokens.extend(testing::encode("call:now{}"));
    tokens.push(close);
    assert!(accepts_tokens(&auto, &special, &tokens));
}

#[test]
fn the_published_gemma4_template_is_detected_by_its_call_opening_and_thought_channel() {
    let template = include_str!("../../python/tests/chat_templates/gemma-4.jinja");
    assert_eq!(ToolFamily::of_template(template), ToolFamily::Gemma4);
    assert_eq!(
        ReasoningParser::detect(Some(template), Some("gemma4")),
        Some(ReasoningParser::Gemma4)
    );
    assert_eq!(ToolFamily::Gemma4.parser_name(), "gemma4");
    assert_eq!(ToolFamily::from(ToolCallParser::Gemma4), ToolFamily::Gemma4);
    assert!(ToolFamily::Gemma4.chat_markers().contains(&QUOTE));
    assert!(!ToolFamily::Gemma4.arguments_as_text());
}
