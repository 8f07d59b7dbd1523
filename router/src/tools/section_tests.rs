use serde_json::{json, Value};

use super::*;
use crate::tools::format::{ToolCallParser, ToolFamily, ToolFormat};
use crate::tools::plan::plan;
use crate::validation::testing::{self, EOS_ID};
use crate::validation::GrammarCompiler;

const PARIS: &str = r#"{"city": "Paris"}"#;

fn planned(family: ToolFamily, choice: Value, parallel: bool) -> ToolPlan {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}]);
    plan(Some(tools), Some(choice), Some(json!(parallel)))
        .expect("valid tools")
        .expect("tools given")
        .with_format(ToolFormat::text(family))
}

fn accepts(plan: &ToolPlan, text: &str) -> bool {
    let grammar = plan.grammar().expect("a grammar").grammar;
    let json = testing::tokenizer_json_with_special_tokens(&[]);
    let compiler = GrammarCompiler::from_tokenizer_json(&json, &[EOS_ID]).expect("test vocabulary");
    compiler.accepts(&grammar, &testing::encode(text))
}

fn deepseek(calls: &[(&str, &str)]) -> String {
    let written: String = calls
        .iter()
        .map(|(name, arguments)| {
            format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>")
        })
        .collect();
    format!("<｜tool▁calls▁begin｜>{written}<｜tool▁calls▁end｜>")
}

fn kimi(calls: &[(&str, &str)]) -> String {
    let written: String = calls
        .iter()
        .map(|(id, arguments)| {
            format!(
                "<|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
            )
        })
        .collect();
    format!("<|tool_calls_section_begin|>{written}<|tool_calls_section_end|>")
}

#[test]
fn the_real_templates_pick_their_families_and_the_parser_names_are_vllms() {
    let v31 = "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}";
    let v3 = "{{'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' }}";
    let kimi_thinking =
        "<|tool_calls_section_begin|>{%- for tool_call in message['tool_calls'] -%}";
    let kimi_instruct = "{% if tools -%}{{ '<|im_system|>tool_declare<|im_middle|>' -}}";
    assert_eq!(ToolFamily::of_template(v31), ToolFamily::DeepseekV31);
    assert_ne!(ToolFamily::of_template(v3), ToolFamily::DeepseekV31);
    assert_eq!(ToolFamily::of_template(kimi_thinking), ToolFamily::KimiK2);
    assert_eq!(ToolFamily::of_template(kimi_instruct), ToolFamily::KimiK2);
    for (parser, name) in [
        (ToolCallParser::DeepseekV31, "deepseek_v31"),
        (ToolCallParser::KimiK2, "kimi_k2"),
    ] {
        assert_eq!(ToolFamily::from(parser).parser_name(), name);
        assert_eq!(
            clap::ValueEnum::to_possible_value(&parser)
                .expect("named")
                .get_name(),
            name
        );
    }
}

#[test]
fn required_calls_name_declared_tools_with_schema_valid_arguments() {
    let required = planned(ToolFamily::DeepseekV31, json!("required"), true);
    assert!(accepts(&required, &deepseek(&[("get_weather", PARIS)])));
    assert!(accepts(
        &required,
        &deepseek(&[("get_weather", PARIS), ("now", "{}")])
    ));
    assert!(
        !accepts(&required, &deepseek(&[("get_time", "{}")])),
        "undeclared name"
    );
    assert!(
        !accepts(&required, &deepseek(&[("get_weather", "{}")])),
        "missing city"
    );
    assert!(!accepts(&required, "Sunny."), "a call is required");
    let serial = planned(ToolFamily::DeepseekV31, json!("required"), false);
    assert!(!accepts(
        &serial,
        &deepseek(&[("now", "{}"), ("now", "{}")])
    ));
    let named = planned(
        ToolFamily::KimiK2,
        json!({"type": "function", "function": {"name": "now"}}),
        true,
    );
    assert!(accepts(&named, &kimi(&[("functions.now:0", "{}")])));
    assert!(!accepts(
        &named,
        &kimi(&[("functions.get_weather:0", PARIS)])
    ));
    assert!(
        !accepts(&named, &kimi(&[("functions.now", "{}")])),
        "Kimi numbers its calls"
    );
    assert!(!accepts(&named, &kimi(&[("now:0", "{}")])));
}

#[test]
fn auto_is_free_text_until_the_section_opens_then_calls_end_the_output() {
    let auto = planned(ToolFamily::KimiK2, json!("auto"), true);
    assert!(accepts(
        &auto,
        "Sunny, with <b>tags</b> and <|tool_calls_sec"
    ));
    let call = kimi(&[("functions.get_weather:7", PARIS)]);
    assert!(accepts(&auto, &format!("Let me check.\n{call}")));
    assert!(accepts(&auto, &call));
    assert!(!accepts(&auto, &format!("{call} and more text")));
    assert!(!accepts(
        &auto,
        &format!("Hm.{}", kimi(&[("functions.rm:0", "{}")]))
    ));
    let deepseek_auto = planned(ToolFamily::DeepseekV31, json!("auto"), false);
    assert!(accepts(
        &deepseek_auto,
        &format!("Ok.{}", deepseek(&[("now", "{}")]))
    ));
    assert!(!accepts(
        &deepseek_auto,
        &deepseek(&[("now", "{}"), ("now", "{}")])
    ));
}

#[test]
fn markers_the_tokenizer_holds_are_written_as_their_tokens() {
    let markers = KIMI_K2.markers;
    let json = testing::tokenizer_json_with_special_tokens(&markers);
    let compiler = GrammarCompiler::from_tokenizer_json(&json, &[EOS_ID]).expect("test vocabulary");
    let tokenizer = testing::tokenizer_with_special_tokens(&markers);
    let format = ToolFormat::choose(Some(ToolCallParser::KimiK2), None, &tokenizer);
    let ids = format
        .section_tokens
        .0
        .map(|id| id.expect("the tokenizer holds every marker"));
    let mut call = testing::encode("Checking. ");
    call.extend([
        ids[Marker::SectionBegin as usize],
        ids[Marker::CallBegin as usize],
    ]);
    call.extend(testing::encode("functions.get_weather:0"));
    call.push(ids[Marker::ArgumentsBegin as usize]);
    call.extend(testing::encode(PARIS));
    call.extend([
        ids[Marker::CallEnd as usize],
        ids[Marker::SectionEnd as usize],
    ]);
    let auto = planned(ToolFamily::KimiK2, json!("auto"), true).with_format(format);
    let grammar = auto.grammar().expect("a grammar").grammar;
    assert!(compiler.accepts(&grammar, &call));
    assert!(compiler.accepts(&grammar, &testing::encode("Sunny.")));
    let required = planned(ToolFamily::KimiK2, json!("required"), true).with_format(format);
    let grammar = required.grammar().expect("a grammar").grammar;
    assert!(compiler.accepts(&grammar, &call[testing::encode("Checking. ").len()..]));
    assert_eq!(ToolFamily::KimiK2.chat_markers(), markers);
}
