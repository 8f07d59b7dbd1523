use serde_json::json;

use super::*;
use crate::tools::format::{ToolFamily, ToolFormat};
use crate::tools::plan::plan;
use crate::validation::testing::{self, EOS_ID};
use crate::validation::GrammarCompiler;

fn planned(family: ToolFamily, choice: Value, parallel: bool) -> ToolPlan {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city", "days"], "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
        {"type": "function", "function": {"name": "now"}}]);
    plan(Some(tools), Some(choice), Some(json!(parallel)))
        .expect("valid tools")
        .expect("tools given")
        .with_format(ToolFormat::text(family))
}

fn accepts_with(plan: &ToolPlan, special: &[&str], tokens: &[u32]) -> bool {
    let grammar = plan.grammar().expect("a grammar").grammar;
    let json = testing::tokenizer_json_with_special_tokens(special);
    let compiler = GrammarCompiler::from_tokenizer_json(&json, &[EOS_ID]).expect("test vocabulary");
    compiler.accepts(&grammar, tokens)
}

fn accepts(plan: &ToolPlan, text: &str) -> bool {
    accepts_with(plan, &[], &testing::encode(text))
}

fn qwen(name: &str, parameters: &[(&str, &str)]) -> String {
    let parameters: String = parameters
        .iter()
        .map(|(key, value)| format!("<parameter={key}>\n{value}\n</parameter>\n"))
        .collect();
    format!("<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>")
}

fn glm(name: &str, parameters: &[(&str, &str)]) -> String {
    let parameters: String = parameters
        .iter()
        .map(|(key, value)| format!("<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n"))
        .collect();
    format!("<tool_call>{name}\n{parameters}</tool_call>")
}

#[test]
fn qwen3_coder_required_calls_name_declared_tools_and_hold_each_value_to_its_schema() {
    let required = planned(ToolFamily::Qwen3Coder, json!("required"), true);
    let paris = qwen("get_weather", &[("city", "Paris"), ("days", "3")]);
    assert!(accepts(&required, &paris));
    assert!(accepts(
        &required,
        &qwen(
            "get_weather",
            &[("city", "a\n</par b"), ("days", "14"), ("unit", "celsius")]
        )
    ));
    assert!(accepts(
        &required,
        &format!("{paris}\n{}", qwen("now", &[]))
    ));
    for (why, text) in [
        ("undeclared tool", qwen("get_time", &[])),
        (
            "undeclared parameter",
            qwen(
                "get_weather",
                &[("city", "Paris"), ("days", "3"), ("tz", "x")],
            ),
        ),
        (
            "missing required days",
            qwen("get_weather", &[("city", "Paris")]),
        ),
        (
            "days above its maximum",
            qwen("get_weather", &[("city", "Paris"), ("days", "15")]),
        ),
        (
            "days not an integer",
            qwen("get_weather", &[("city", "Paris"), ("days", "\"3\"")]),
        ),
        (
            "city longer than 12",
            qwen(
                "get_weather",
                &[("city", "Llanfairpwllgwyngyll"), ("days", "3")],
            ),
        ),
        (
            "city holding the closing tag",
            qwen("get_weather", &[("city", "a</parameter>"), ("days", "3")]),
        ),
        (
            "unit outside its enumeration",
            qwen(
                "get_weather",
                &[("city", "P"), ("days", "3"), ("unit", "kelvin")],
            ),
        ),
        ("plain text", "Sunny.".to_owned()),
    ] {
        assert!(!accepts(&required, &text), "{why}");
    }
    let serial = planned(ToolFamily::Qwen3Coder, json!("required"), false);
    assert!(!accepts(&serial, &format!("{paris}\n{}", qwen("now", &[]))));
    let named = planned(
        ToolFamily::Qwen3Coder,
        json!({"type": "function", "function": {"name": "now"}}),
        true,
    );
    assert!(accepts(&named, &qwen("now", &[])));
    assert!(!accepts(&named, &paris));
}

#[test]
fn qwen3_coder_auto_is_free_text_until_the_trigger_then_a_forced_call() {
    let auto = planned(ToolFamily::Qwen3Coder, json!("auto"), true);
    assert!(accepts(&auto, "Sunny, with <b>tags</b> and <tool_ca"));
    assert!(accepts(
        &auto,
        &format!("Let me check.\n\n{}", qwen("now", &[]))
    ));
    assert!(!accepts(
        &auto,
        "Let me check. <tool_call>\n<function=get_time>\n</function>\n</tool_call>"
    ));
}

#[test]
fn glm45_calls_follow_the_same_rules_in_its_markers() {
    let required = planned(ToolFamily::Glm45, json!("required"), true);
    let paris = glm("get_weather", &[("city", "Paris"), ("days", "3")]);
    assert!(accepts(&required, &paris));
    assert!(accepts(&required, &format!("{paris}\n{}", glm("now", &[]))));
    assert!(!accepts(
        &required,
        &glm("get_weather", &[("city", "Paris"), ("days", "x")])
    ));
    assert!(!accepts(
        &required,
        &glm("get_weather", &[("city", "a</arg_value>"), ("days", "3")])
    ));
    let auto = planned(ToolFamily::Glm45, json!("auto"), false);
    assert!(accepts(&auto, &format!("Checking.{paris}")));
}

#[test]
fn the_call_markers_may_be_written_as_their_visible_tokens() {
    let special = ["<tool_call>", "</tool_call>"];
    let json = testing::tokenizer_json_with_special_tokens(&special);
    let tokenizer = tokenizers::Tokenizer::from_bytes(json.to_string()).expect("test vocabulary");
    let [open, close] = special.map(|marker| tokenizer.token_to_id(marker).expect("added"));
    let required =
        planned(ToolFamily::Qwen3Coder, json!("required"), true).with_format(ToolFormat {
            trigger_token: Some(open),
            closing_token: Some(close),
            ..ToolFormat::text(ToolFamily::Qwen3Coder)
        });
    let mut tokens = vec![open];
    tokens.extend(testing::encode("\n<function=now>\n</function>\n"));
    tokens.push(close);
    assert!(accepts_with(&required, &special, &tokens));
}

fn dsml(name: &str, parameters: &[(&str, &str, &str)]) -> String {
    let parameters: String = parameters
        .iter()
        .map(|(key, kind, value)| {
            format!(
                "<｜DSML｜parameter name=\"{key}\" string=\"{kind}\">{value}</｜DSML｜parameter>\n"
            )
        })
        .collect();
    format!("<｜DSML｜invoke name=\"{name}\">\n{parameters}</｜DSML｜invoke>")
}

fn dsml_block(calls: &[String]) -> String {
    format!(
        "<｜DSML｜function_calls>\n{}\n</｜DSML｜function_calls>",
        calls.join("\n")
    )
}

#[test]
fn deepseek_v32_calls_sit_in_one_block_and_each_tag_says_how_its_value_is_written() {
    let required = planned(ToolFamily::DeepseekV32, json!("required"), true);
    let paris = dsml(
        "get_weather",
        &[("city", "true", "Paris"), ("days", "false", "3")],
    );
    assert!(accepts(
        &required,
        &dsml_block(std::slice::from_ref(&paris))
    ));
    assert!(accepts(
        &required,
        &dsml_block(&[paris.clone(), dsml("now", &[])])
    ));
    for (why, text) in [
        (
            "a string tagged as JSON",
            dsml_block(&[dsml(
                "get_weather",
                &[("city", "false", "\"Paris\""), ("days", "false", "3")],
            )]),
        ),
        (
            "days tagged as a string",
            dsml_block(&[dsml(
                "get_weather",
                &[("city", "true", "Paris"), ("days", "true", "3")],
            )]),
        ),
        ("a call outside the block", paris.clone()),
        ("undeclared tool", dsml_block(&[dsml("get_time", &[])])),
    ] {
        assert!(!accepts(&required, &text), "{why}");
    }
    let auto = planned(ToolFamily::DeepseekV32, json!("auto"), false);
    assert!(accepts(&auto, "Sunny, with <｜DSML｜invoke in the text"));
    assert!(accepts(
        &auto,
        &format!("Checking.\n\n{}", dsml_block(&[paris]))
    ));
}
