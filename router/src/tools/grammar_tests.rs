use super::*;
use crate::tools::format::ToolCallParser;
use crate::tools::plan::plan;
use crate::validation::testing::{self, EOS_ID};
use crate::validation::GrammarCompiler;

const PARIS: &str = r#"{"city": "Paris"}"#;

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}])
}

fn planned(family: ToolFamily, choice: Value, parallel: bool) -> ToolPlan {
    plan(Some(weather_tools()), Some(choice), Some(json!(parallel)))
        .expect("valid tools")
        .expect("tools given")
        .with_format(ToolFormat::text(family))
}

fn compiler(special: &[&str]) -> GrammarCompiler {
    let json = testing::tokenizer_json_with_special_tokens(special);
    GrammarCompiler::from_tokenizer_json(&json, &[EOS_ID]).expect("test vocabulary")
}

fn accepts(plan: &ToolPlan, text: &str) -> bool {
    let grammar = plan.grammar().expect("a grammar").grammar;
    compiler(&[]).accepts(&grammar, &testing::encode(text))
}

fn hermes(name: &str, arguments: &str) -> String {
    format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n</tool_call>")
}

#[test]
fn hermes_required_calls_name_declared_tools_with_schema_valid_arguments() {
    let required = planned(ToolFamily::Hermes, json!("required"), true);
    assert!(accepts(&required, &hermes("get_weather", PARIS)));
    let two = format!("{}\n{}", hermes("get_weather", PARIS), hermes("now", "{}"));
    assert!(accepts(&required, &two));
    assert!(
        !accepts(&required, &hermes("get_time", "{}")),
        "undeclared name"
    );
    assert!(
        !accepts(&required, &hermes("get_weather", "{}")),
        "missing city"
    );
    assert!(!accepts(&required, "Sunny."), "a call is required");
    let serial = planned(ToolFamily::Hermes, json!("required"), false);
    assert!(!accepts(&serial, &two));
    let named = planned(
        ToolFamily::Hermes,
        json!({"type": "function", "function": {"name": "now"}}),
        true,
    );
    assert!(accepts(&named, &hermes("now", "{}")));
    assert!(!accepts(&named, &hermes("get_weather", PARIS)));
}

#[test]
fn hermes_auto_is_free_text_until_the_trigger_then_a_forced_call() {
    let auto = planned(ToolFamily::Hermes, json!("auto"), true);
    assert!(accepts(&auto, "Sunny, with <b>tags</b> and <tool_ca"));
    assert!(accepts(
        &auto,
        &format!("Let me check.\n{}", hermes("get_weather", PARIS))
    ));
    assert!(accepts(&auto, &hermes("now", "{}")));
    assert!(
        !accepts(&auto, &format!("Let me check.{}", hermes("rm", "{}"))),
        "undeclared name"
    );
    assert!(!accepts(
        &auto,
        &format!("{} and more text", hermes("now", "{}"))
    ));
}

#[test]
fn llama_calls_open_the_output_and_take_parameters() {
    let call = format!("{{\"name\": \"get_weather\", \"parameters\": {PARIS}}}");
    let required = planned(ToolFamily::Llama3Json, json!("required"), true);
    assert!(accepts(&required, &call));
    assert!(accepts(
        &required,
        &format!("{call}; {{\"name\": \"now\", \"parameters\": {{}}}}")
    ));
    assert!(!accepts(
        &required,
        &call.replace("parameters", "arguments")
    ));
    let auto = planned(ToolFamily::Llama3Json, json!("auto"), true);
    assert!(accepts(&auto, "Sunny."));
    assert!(accepts(&auto, &call));
    assert!(!accepts(&auto, "{\"answer\": 1}"));
}

#[test]
fn mistral_calls_follow_its_trigger_token_or_text() {
    let list = format!(" [{{\"name\": \"get_weather\", \"arguments\": {PARIS}}}]");
    let as_text = planned(ToolFamily::Mistral, json!("required"), true);
    assert!(accepts(&as_text, &format!("[TOOL_CALLS]{list}")));
    assert!(!accepts(&as_text, &list));
    let with_token = compiler(&["[TOOL_CALLS]"]);
    let tokenizer = testing::tokenizer_with_special_tokens(&["[TOOL_CALLS]"]);
    let format = ToolFormat::choose(Some(ToolCallParser::Mistral), None, &tokenizer);
    let trigger = format
        .trigger_token
        .expect("the tokenizer holds the trigger");
    let auto = planned(ToolFamily::Mistral, json!("auto"), true).with_format(format);
    let grammar = auto.grammar().expect("a grammar").grammar;
    let mut call = vec![trigger];
    call.extend(testing::encode(&list));
    assert!(with_token.accepts(&grammar, &call));
    assert!(with_token.accepts(&grammar, &testing::encode("Sunny.")));
    assert!(!with_token.accepts(&grammar, &testing::encode(&list)));
}

#[test]
fn tool_choice_none_has_no_grammar() {
    assert!(planned(ToolFamily::Hermes, json!("none"), true)
        .grammar()
        .is_none());
}

#[test]
fn hermes_calls_take_the_tokenizers_added_marker_tokens() {
    // Qwen's tokenizers hold `<tool_call>` and `</tool_call>` as added tokens, which a grammar
    // refuses as text: the model writes them as those tokens.
    let markers = ["<tool_call>", "</tool_call>"];
    let with_tokens = compiler(&markers);
    let tokenizer = testing::tokenizer_with_special_tokens(&markers);
    let format = ToolFormat::choose(Some(ToolCallParser::Hermes), None, &tokenizer);
    let (open, close) = (
        format
            .trigger_token
            .expect("the tokenizer holds <tool_call>"),
        format
            .closing_token
            .expect("the tokenizer holds </tool_call>"),
    );
    let call_tokens = |prefix: &str| {
        let mut ids = testing::encode(prefix);
        ids.push(open);
        ids.extend(testing::encode(&format!(
            "\n{{\"name\": \"get_weather\", \"arguments\": {PARIS}}}\n"
        )));
        ids.push(close);
        ids
    };
    for choice in [json!("auto"), json!("required")] {
        let tools = planned(ToolFamily::Hermes, choice.clone(), false).with_format(format);
        let grammar = tools.grammar().expect("a grammar").grammar;
        assert!(with_tokens.accepts(&grammar, &call_tokens("")), "{choice}");
    }
    let auto = planned(ToolFamily::Hermes, json!("auto"), false).with_format(format);
    let grammar = auto.grammar().expect("a grammar").grammar;
    assert!(with_tokens.accepts(&grammar, &call_tokens("Let me look. ")));
    assert!(with_tokens.accepts(&grammar, &testing::encode("Sunny.")));
    let mut undeclared = testing::encode("Hi");
    undeclared.push(open);
    undeclared.extend(testing::encode(
        "\n{\"name\": \"get_time\", \"arguments\": {}}\n",
    ));
    undeclared.push(close);
    assert!(
        !with_tokens.accepts(&grammar, &undeclared),
        "undeclared name"
    );
}
