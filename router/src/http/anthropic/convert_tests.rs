use serde_json::json;

use super::*;
use crate::scheduler::Grammar;
use crate::validation::ContentPart;

fn config() -> HandlerConfig {
    crate::http::tests::handler_config(8)
}

fn request(body: Value) -> MessagesRequest {
    serde_json::from_value(body).expect("a well-formed body")
}

fn converted(body: Value) -> Generation {
    generation(request(body), &config()).expect("valid")
}

fn refused(body: Value) -> ValidationError {
    generation(request(body), &config()).expect_err("invalid")
}

fn chat(generation: &Generation) -> (&[ChatMessage], ChatEnding) {
    match &generation.prompt {
        Prompt::Chat(messages, ending, _) => (messages, *ending),
        other => panic!("expected a chat prompt, got {other:?}"),
    }
}

const WEATHER: &str = "get_weather";

fn weather_tool() -> Value {
    json!({"name": WEATHER, "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

#[test]
fn system_blocks_turns_and_sampling_fields_become_a_chat_generation() {
    let generation = converted(json!({
        "model": "any", "max_tokens": 12, "temperature": 0.5, "top_p": 0.9, "top_k": 7,
        "stop_sequences": ["END"], "metadata": {"user_id": "u1"}, "stream": true,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
    }));
    let (messages, ending) = chat(&generation);
    let turns: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    assert_eq!(
        turns,
        [
            ("system", "Be brief.\nBe kind."),
            ("user", "Hi"),
            ("assistant", "Hello"),
            ("user", "a\nb")
        ]
    );
    assert_eq!(ending, ChatEnding::GenerationPrompt);
    let params = &generation.params;
    assert_eq!(params.max_new_tokens, Some(12));
    assert_eq!(params.max_new_tokens_param, "max_tokens");
    assert_eq!(
        (params.temperature, params.top_p, params.top_k),
        (Some(0.5), Some(0.9), Some(7))
    );
    assert_eq!(params.stop, ["END"]);
    assert!(generation.stream && generation.tools.is_none() && params.grammar.is_none());
}

#[test]
fn a_final_assistant_turn_is_continued() {
    let generation = converted(json!({"max_tokens": 5, "messages": [
        {"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]}));
    assert_eq!(chat(&generation).1, ChatEnding::ContinueFinal);
}

#[test]
fn tool_turns_render_as_calls_and_tool_messages_and_tools_get_the_grammar() {
    let generation = converted(json!({"max_tokens": 30, "tools": [weather_tool()],
    "tool_choice": {"type": "any"},
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking.", "citations": null},
            {"type": "tool_use", "id": "toolu_1", "name": WEATHER, "input": {"city": "Paris"}, "caller": null}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
            {"type": "text", "text": "And tomorrow?"}]},
    ]}));
    let (messages, _) = chat(&generation);
    assert_eq!(messages[0].role, "system");
    assert!(
        messages[0].content.contains(WEATHER),
        "the preamble lists the tool"
    );
    assert_eq!(
        messages[2].content,
        "Checking.\n{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}]}"
    );
    assert_eq!(
        (messages[3].role.as_str(), messages[3].content.as_str()),
        ("tool", "Sunny")
    );
    assert_eq!(messages[3].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(messages[4].content, "Error: boom");
    assert_eq!(
        (messages[5].role.as_str(), messages[5].content.as_str()),
        ("user", "And tomorrow?")
    );
    let plan = generation.tools.expect("tools may be called");
    assert_eq!(plan.choice, tools::ToolChoice::Required);
    assert!(matches!(
        generation.params.grammar.map(|g| g.grammar),
        Some(Grammar::JsonSchema(_))
    ));
}

#[test]
fn tool_choices_map_onto_the_chat_plan() {
    let with_choice = |choice: Value| {
        converted(
            json!({"max_tokens": 5, "tools": [weather_tool()], "tool_choice": choice,
            "messages": [{"role": "user", "content": "Hi"}]}),
        )
    };
    assert_eq!(
        with_choice(json!({"type": "auto"})).tools.map(|p| p.choice),
        Some(tools::ToolChoice::Auto)
    );
    let named =
        with_choice(json!({"type": "tool", "name": WEATHER, "disable_parallel_tool_use": true}));
    let plan = named.tools.expect("a named tool");
    assert_eq!(plan.choice, tools::ToolChoice::Named(WEATHER.into()));
    assert!(!plan.parallel);
    let none = with_choice(json!({"type": "none"}));
    assert!(none.tools.is_none() && none.params.grammar.is_none());
    assert!(!chat(&none).0[0].content.contains(WEATHER));
}

#[test]
fn invalid_requests_name_their_parameter() {
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let param = |body: Value| refused(body).param().map(str::to_owned);
    assert_eq!(param(json!({"messages": hi})), Some("max_tokens".into()));
    assert_eq!(param(json!({"max_tokens": 5})), Some("messages".into()));
    for small in [0, 1023] {
        let budget = json!({"type": "enabled", "budget_tokens": small});
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": hi, "thinking": budget})),
            Some("thinking.budget_tokens".into())
        );
    }
    let thinking_from_user = json!([{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]);
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": thinking_from_user})),
        Some("messages[0].content[0]".into())
    );
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})),
        Some("messages[0].role".into())
    );
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]})),
        Some("messages[0].content".into())
    );
    let document = json!([{"role": "user", "content": [{"type": "text", "text": "see"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": ""}}]}]);
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": document})),
        Some("messages[0].content[1]".into())
    );
    let misplaced = json!([{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": WEATHER, "input": {}}]}]);
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": misplaced})),
        Some("messages[0].content[0]".into())
    );
    let server_tool =
        json!([{"type": "web_search_20250305", "name": "web_search", "input_schema": {}}]);
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": hi, "tools": server_tool})),
        Some("tools[0].type".into())
    );
    let bad_name = json!([{"name": "a b", "input_schema": {"type": "object"}}]);
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": hi, "tools": bad_name})),
        Some("tools[0].name".into())
    );
    let missing = json!({"type": "tool", "name": "nowhere"});
    assert_eq!(
        param(
            json!({"max_tokens": 5, "messages": hi, "tools": [weather_tool()], "tool_choice": missing})
        ),
        Some("tool_choice".into())
    );
    let too_many: Vec<Value> = (0..=config().request_limits.max_tools)
        .map(|i| json!({"name": format!("t{i}"), "input_schema": {"type": "object"}}))
        .collect();
    assert_eq!(
        param(json!({"max_tokens": 5, "messages": hi, "tools": too_many})),
        Some("tools".into())
    );
}

#[test]
fn counted_prompts_include_the_tool_preamble_and_refuse_generation_fields() {
    let body = json!({"model": "m", "tools": [weather_tool()], "messages": [{"role": "user", "content": "Hi"}]});
    let request: CountTokensRequest = serde_json::from_value(body).unwrap();
    match counted_prompt(request, &config()).expect("valid") {
        Prompt::Chat(messages, ..) => assert!(messages[0].content.contains(WEATHER)),
        other => panic!("expected a chat prompt, got {other:?}"),
    }
    let body = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]});
    let request: CountTokensRequest = serde_json::from_value(body).unwrap();
    let error = counted_prompt(request, &config()).expect_err("max_tokens is not counted");
    assert_eq!(error.param(), Some("max_tokens"));
}

#[test]
fn thinking_sets_the_reasoning_budget_or_switches_it_off() {
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let enabled = json!({"type": "enabled", "budget_tokens": 1024});
    let on = converted(json!({"max_tokens": 2000, "messages": hi, "thinking": enabled}));
    assert_eq!(
        (
            on.params.reasoning.enabled,
            on.params.reasoning.budget_tokens
        ),
        (Some(true), Some(1024))
    );
    let off = converted(json!({"max_tokens": 9, "messages": hi, "thinking": {"type": "disabled"}}));
    assert_eq!(off.params.reasoning.enabled, Some(false));
    let plain = converted(json!({"max_tokens": 9, "messages": hi}));
    assert_eq!(plain.params.reasoning, ReasoningRequest::default());
}

#[test]
fn thinking_blocks_passed_back_in_assistant_turns_are_dropped() {
    let past = json!([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "They greet me.", "signature": ""},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "Bye"},
    ]);
    let generation = converted(json!({"max_tokens": 5, "messages": past}));
    let (messages, _) = chat(&generation);
    assert_eq!(messages[1], ChatMessage::new("assistant", "Hello!"));
}

#[test]
fn image_blocks_of_a_user_turn_reach_the_template_in_order() {
    let generation = converted(json!({
        "model": "any", "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Compare"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AQID"}},
            {"type": "text", "text": "please"},
        ]}],
    }));
    let (messages, _) = chat(&generation);
    assert_eq!(messages[0].content, "Compare\nplease");
    assert_eq!(
        messages[0].parts,
        Some(vec![
            ContentPart::Text("Compare".to_owned()),
            ContentPart::Image(crate::validation::ImageData::Inline(
                bytes::Bytes::from_static(&[1, 2, 3])
            )),
            ContentPart::Text("please".to_owned()),
        ])
    );
}

#[test]
fn image_blocks_by_file_url_or_in_assistant_turns_are_refused_by_position() {
    let by_url = refused(json!({
        "model": "any", "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}},
        ]}],
    }));
    assert!(
        by_url
            .to_string()
            .starts_with("`messages[0].content[0].source`: only `data:` image URLs"),
        "{by_url}"
    );
    let from_assistant = refused(json!({
        "model": "any", "max_tokens": 4,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [
                {"type": "image", "source": {"type": "base64", "data": "AQID"}},
            ]},
        ],
    }));
    assert!(
        from_assistant
            .to_string()
            .contains("`image` only in user turns"),
        "{from_assistant}"
    );
}
