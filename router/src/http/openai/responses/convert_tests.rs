use serde_json::json;

use super::*;
use crate::http::openai::responses::store::{ResponseStoreLimits, StoredResponse};
use crate::scheduler::Grammar;

fn config() -> HandlerConfig {
    crate::http::tests::handler_config(8)
}

fn empty_store() -> ResponseStore {
    ResponseStore::new(ResponseStoreLimits::default())
}

fn request(body: Value) -> ResponsesRequest {
    serde_json::from_value(body).expect("a well-formed body")
}

fn converted_with(body: Value, store: &ResponseStore) -> Generation {
    generation(request(body), &config(), store, None).expect("valid")
}

fn converted(body: Value) -> Generation {
    converted_with(body, &empty_store())
}

/// The parameter a refused body is refused for.
fn refused_param(body: Value) -> String {
    match generation(request(body), &config(), &empty_store(), None).expect_err("refused") {
        AppError::Validation(error) => error.param().expect("names a parameter").to_owned(),
        other => panic!("expected a validation error, got {other:?}"),
    }
}

fn messages(generation: &Generation) -> &[ChatMessage] {
    match &generation.prompt {
        Prompt::Chat(messages, ChatEnding::GenerationPrompt, _) => messages,
        other => panic!("expected a chat prompt asking for a new turn, got {other:?}"),
    }
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

#[test]
fn text_input_and_instructions_become_a_system_and_a_user_message() {
    let generation = converted(
        json!({"model": "m", "input": "Hi", "instructions": "Be brief.",
        "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.9, "seed": 7, "stream": true}),
    );
    assert_eq!(
        messages(&generation),
        [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi")
        ]
    );
    assert_eq!(generation.conversation, [ChatMessage::new("user", "Hi")]);
    let params = &generation.params;
    assert_eq!(
        (params.max_new_tokens, params.max_new_tokens_param),
        (Some(9), "max_output_tokens")
    );
    assert_eq!(
        (params.temperature, params.top_p, params.seed),
        (Some(0.5), Some(0.9), Some(7))
    );
    assert!(generation.stream && generation.echo.store && generation.tools.is_none());
    assert_eq!(generation.echo.instructions.as_deref(), Some("Be brief."));
    assert_eq!(generation.echo.text, json!({"format": {"type": "text"}}));
}

#[test]
fn items_become_chat_messages_with_calls_in_the_call_format_and_outputs_as_tool_messages() {
    let generation = converted(json!({"input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather in"}, {"type": "input_text", "text": "Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": "It is sunny.", "annotations": [], "logprobs": []}]},
    ]}));
    let expected = [
        ChatMessage::new("system", "Use tools."),
        ChatMessage::new("user", "Weather in\nParis?"),
        ChatMessage::new(
            "assistant",
            r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city":"Paris"}}, {"name": "get_weather", "arguments": {}}]}"#,
        ),
        ChatMessage {
            tool_call_id: Some("call_1".into()),
            ..ChatMessage::new("tool", "Sunny")
        },
        ChatMessage::new("assistant", "It is sunny."),
    ];
    assert_eq!(messages(&generation), expected);
}

#[test]
fn a_previous_response_conversation_comes_before_the_new_input() {
    let store = empty_store();
    let earlier = vec![
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello!"),
    ];
    let stored = StoredResponse {
        body: json!({}),
        conversation: earlier.clone(),
        owner: None,
    };
    store.insert("resp_1".into(), stored).unwrap();
    let body =
        json!({"input": "And you?", "previous_response_id": "resp_1", "instructions": "Be kind."});
    let generation = converted_with(body, &store);
    let mut expected = vec![ChatMessage::new("system", "Be kind.")];
    expected.extend(earlier.iter().cloned());
    expected.push(ChatMessage::new("user", "And you?"));
    assert_eq!(messages(&generation), expected);
    assert_eq!(generation.conversation, expected[1..]);
    assert_eq!(
        generation.echo.previous_response_id.as_deref(),
        Some("resp_1")
    );
}

#[test]
fn an_unknown_previous_response_is_not_found() {
    let body = request(json!({"input": "Hi", "previous_response_id": "resp_gone"}));
    match generation(body, &config(), &empty_store(), None) {
        Err(AppError::NotFound { id, param, .. }) => {
            assert_eq!(
                (id.as_str(), param),
                ("resp_gone", Some("previous_response_id"))
            );
        }
        other => panic!("expected not found, got {other:?}"),
    }
}

#[test]
fn text_formats_become_grammars_named_as_this_body_names_them() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let format = json!({"type": "json_schema", "name": "thing", "schema": schema, "strict": true});
    let generation = converted(json!({"input": "Hi", "text": {"format": format}}));
    let grammar = generation.params.grammar.expect("a grammar");
    assert_eq!(grammar.param, "text.format.schema");
    assert!(matches!(grammar.grammar, Grammar::JsonSchema(text) if text.contains("integer")));
    assert_eq!(generation.echo.text["format"]["name"], "thing");
    let object = converted(json!({"input": "Hi", "text": {"format": {"type": "json_object"}}}));
    assert_eq!(
        object.params.grammar.expect("a grammar").param,
        "text.format"
    );
    let plain = converted(json!({"input": "Hi", "text": {"format": {"type": "text"}}}));
    assert!(plain.params.grammar.is_none());
    let bad_name = json!({"type": "json_schema", "name": "a b", "schema": {}});
    assert_eq!(
        refused_param(json!({"input": "Hi", "text": {"format": bad_name}})),
        "text.format.name"
    );
}

#[test]
fn function_tools_take_the_chat_routes_tool_path() {
    let generation = converted(json!({"input": "Weather?", "tools": [weather_tool()],
        "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false}));
    let plan = generation.tools.as_ref().expect("a tool plan");
    assert_eq!(plan.choice, tools::ToolChoice::Named("get_weather".into()));
    assert!(!plan.parallel && generation.params.grammar.is_some());
    let system = &messages(&generation)[0];
    assert!(system.role == "system" && system.content.contains("get_weather"));
    assert_eq!(generation.echo.tools[0]["name"], "get_weather");
    assert_eq!(generation.echo.tool_choice["name"], "get_weather");
    let none = converted(json!({"input": "Hi", "tools": [weather_tool()], "tool_choice": "none"}));
    assert!(none.tools.is_none() && none.params.grammar.is_none());
}

#[test]
fn unsupported_fields_and_items_are_refused_by_name() {
    let hi = |field: &str, value: Value| {
        let mut body = json!({"input": "Hi"});
        body[field] = value;
        refused_param(body)
    };
    assert_eq!(hi("background", json!(true)), "background");
    assert_eq!(
        hi("reasoning", json!({"effort": "max"})),
        "reasoning.effort"
    );
    assert_eq!(
        hi("include", json!(["reasoning.encrypted_content"])),
        "include"
    );
    assert_eq!(hi("conversation", json!("conv_1")), "conversation");
    assert_eq!(hi("truncation", json!("auto")), "truncation");
    assert_eq!(
        hi("tools", json!([{"type": "web_search"}])),
        "tools[0].type"
    );
    assert_eq!(
        hi("tool_choice", json!({"type": "file_search"})),
        "tool_choice.type"
    );
    assert_eq!(hi("text", json!({"verbosity": "high"})), "text.verbosity");
    let format = json!({"type": "json_object"});
    let both = json!({"input": "Hi", "tools": [weather_tool()], "text": {"format": format}});
    assert_eq!(refused_param(both), "text.format");
    let file = json!([{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]);
    assert_eq!(hi("input", file), "input[0].content[0].type");
    let image = json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]);
    assert_eq!(hi("input", image), "input[0].content[0].image_url");
    assert_eq!(
        hi("input", json!([{"type": "web_search_call", "id": "ws_1"}])),
        "input[0].type"
    );
    assert_eq!(
        hi(
            "input",
            json!([{"type": "reasoning", "content": [{"type": "reasoning_text"}]}])
        ),
        "input[0]"
    );
    assert_eq!(
        hi("input", json!([{"role": "tool", "content": "x"}])),
        "input[0].role"
    );
    assert_eq!(hi("input", json!(5)), "input");
    let broken_call =
        json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]);
    assert_eq!(hi("input", broken_call), "input[0].arguments");
    assert_eq!(refused_param(json!({"model": "m"})), "input");
}

#[test]
fn reasoning_effort_maps_onto_the_reasoning_request() {
    let low = converted(json!({"input": "Hi", "reasoning": {"effort": "low", "summary": "auto"}}));
    assert_eq!(
        (
            low.params.reasoning.enabled,
            low.params.reasoning.budget_tokens
        ),
        (Some(true), Some(1024))
    );
    let none = converted(json!({"input": "Hi", "reasoning": {"effort": "none"}}));
    assert_eq!(none.params.reasoning.enabled, Some(false));
}

#[test]
fn a_reasoning_item_is_the_next_assistant_turns_reasoning() {
    let generation = converted(json!({"input": [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [
            {"type": "reasoning_text", "text": "Call the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Answer now."}]},
        {"role": "assistant", "content": "It is sunny."},
    ]}));
    let reasoning: Vec<Option<&str>> = messages(&generation)
        .iter()
        .map(|message| message.thinking.as_deref())
        .collect();
    assert_eq!(
        reasoning,
        [None, Some("Call the tool."), None, Some("Answer now.")]
    );
    assert_eq!(
        messages(&generation)[1].reasoning_content.as_deref(),
        Some("Call the tool.")
    );
}

#[test]
fn input_images_reach_the_template_with_the_text_in_order() {
    let generation = converted(json!({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AQID", "detail": "auto"},
        {"type": "input_text", "text": "What is this?"},
    ]}]}));
    let message = &messages(&generation)[0];
    assert_eq!(message.content, "What is this?");
    assert_eq!(
        message.parts,
        Some(vec![
            crate::validation::ContentPart::Image(crate::validation::ImageData::Inline(
                bytes::Bytes::from_static(&[1, 2, 3])
            )),
            crate::validation::ContentPart::Text("What is this?".to_owned()),
        ])
    );
    let by_file = json!([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]);
    assert_eq!(
        refused_param(json!({"input": by_file})),
        "input[0].content[0]"
    );
}
