use super::*;
use crate::scheduler::Grammar;
use crate::validation::RequestedGrammar;

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}])
}

fn planned(choice: Value, parallel: Option<Value>) -> ToolPlan {
    plan(Some(weather()), Some(choice), parallel)
        .expect("valid tools")
        .expect("tools given")
}

fn param_of(tools: Value, choice: Option<Value>) -> String {
    let error = plan(Some(tools), choice, None).expect_err("invalid");
    error.param().expect("names its parameter").to_owned()
}

#[test]
fn tool_choice_defaults_to_auto_and_none_means_no_grammar_or_preamble() {
    let auto = plan(Some(weather()), None, None).unwrap().unwrap();
    assert_eq!(auto.choice, ToolChoice::Auto);
    assert!(matches!(
        auto.grammar(),
        Some(RequestedGrammar {
            grammar: Grammar::Lark(_),
            ..
        })
    ));
    let none = planned(json!("none"), None);
    assert!(none.grammar().is_none() && none.preamble().is_none());
    assert_eq!(plan(None, None, None), Ok(None));
}

#[test]
fn required_allows_parallel_calls_and_named_or_serial_allow_one() {
    let schema_of = |plan: &ToolPlan| match plan.grammar() {
        Some(RequestedGrammar {
            grammar: Grammar::JsonSchema(text),
            ..
        }) => serde_json::from_str::<Value>(&text).unwrap(),
        other => panic!("expected a JSON schema, got {other:?}"),
    };
    let parallel = schema_of(&planned(json!("required"), None));
    assert!(parallel
        .pointer("/properties/tool_calls/maxItems")
        .is_none());
    assert_eq!(
        parallel
            .pointer("/properties/tool_calls/items/anyOf")
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let serial = schema_of(&planned(json!("required"), Some(json!(false))));
    assert_eq!(
        serial.pointer("/properties/tool_calls/maxItems"),
        Some(&json!(1))
    );
    let named = schema_of(&planned(
        json!({"type": "function", "function": {"name": "now"}}),
        None,
    ));
    let variants = named.pointer("/properties/tool_calls/items/anyOf").unwrap();
    assert_eq!(variants.as_array().unwrap().len(), 1);
    assert_eq!(
        variants[0].pointer("/properties/name/const"),
        Some(&json!("now"))
    );
}

#[test]
fn malformed_tools_and_choices_name_their_parameter() {
    let named = |name: &str| Some(json!({"type": "function", "function": {"name": name}}));
    assert_eq!(param_of(weather(), named("missing")), "tool_choice");
    assert_eq!(param_of(weather(), Some(json!("sometimes"))), "tool_choice");
    assert_eq!(param_of(json!([]), Some(json!("required"))), "tool_choice");
    assert_eq!(param_of(json!({"type": "function"}), None), "tools");
    assert_eq!(
        param_of(
            json!([{"type": "retrieval", "function": {"name": "f"}}]),
            None
        ),
        "tools[0].type"
    );
    assert_eq!(
        param_of(
            json!([{"type": "function", "function": {"name": "a b"}}]),
            None
        ),
        "tools[0].function.name"
    );
    assert_eq!(param_of(json!([{"type": "function"}]), None), "tools[0]");
    let parameters = json!([{"type": "function", "function": {"name": "f", "parameters": []}}]);
    assert_eq!(param_of(parameters, None), "tools[0].function.parameters");
    let twice = json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]);
    assert_eq!(param_of(twice, None), "tools[1].function.name");
    let error = plan(Some(weather()), None, Some(json!("yes"))).expect_err("invalid");
    assert_eq!(error.param(), Some("parallel_tool_calls"));
}
