use clap::ValueEnum;

use super::*;
use crate::validation::testing::tokenizer_with_special_tokens;

#[test]
fn the_template_decides_the_family_and_the_flag_overrides_it() {
    let hermes = "{{- '<tool_call>\\n' }}{{ tools | tojson }}";
    let mistral = "{{- \"[TOOL_CALLS] [\" }}";
    let llama = "{{- \"<|python_tag|>\" + tool_call.name }}";
    let plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
    let harmony = "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content }}";
    assert_eq!(ToolFamily::of_template(hermes), ToolFamily::Hermes);
    assert_eq!(ToolFamily::of_template(mistral), ToolFamily::Mistral);
    assert_eq!(ToolFamily::of_template(llama), ToolFamily::Llama3Json);
    assert_eq!(ToolFamily::of_template(plain), ToolFamily::Tandem);
    assert_eq!(ToolFamily::of_template(harmony), ToolFamily::Harmony);
    let dsml = "{{- '<｜DSML｜invoke name=\"' + call.name + '\">' }}";
    assert_eq!(ToolFamily::of_template(dsml), ToolFamily::DeepseekV32);
    assert_eq!(
        ToolFamily::from(ToolCallParser::Openai).parser_name(),
        "openai"
    );
    let tokenizer = tokenizer_with_special_tokens(&[]);
    let forced = ToolFormat::choose(Some(ToolCallParser::Hermes), Some(plain), &tokenizer);
    assert_eq!(forced.family, ToolFamily::Hermes);
    let own = ToolFormat::choose(Some(ToolCallParser::Tandem), Some(hermes), &tokenizer);
    assert_eq!(own.family, ToolFamily::Tandem);
    assert_eq!(
        ToolFormat::choose(None, None, &tokenizer),
        ToolFormat::default()
    );
}

#[test]
fn the_xml_families_are_told_apart_from_hermes_by_their_real_templates() {
    let templates = [
        (
            include_str!("../../python/tests/chat_templates/qwen3-coder.jinja"),
            ToolFamily::Qwen3Coder,
        ),
        (
            include_str!("../../python/tests/chat_templates/qwen3.5.jinja"),
            ToolFamily::Qwen3Coder,
        ),
        (
            include_str!("../../python/tests/chat_templates/glm-4.6.jinja"),
            ToolFamily::Glm45,
        ),
        (
            include_str!("../../python/tests/chat_templates/qwen3.jinja"),
            ToolFamily::Hermes,
        ),
        (
            include_str!("../../python/tests/chat_templates/qwen2.5.jinja"),
            ToolFamily::Hermes,
        ),
    ];
    for (template, family) in templates {
        assert_eq!(ToolFamily::of_template(template), family);
    }
    let tokenizer = tokenizer_with_special_tokens(&[]);
    for parser in [
        ToolCallParser::Qwen3Coder,
        ToolCallParser::Glm45,
        ToolCallParser::DeepseekV32,
    ] {
        let family = ToolFormat::choose(Some(parser), None, &tokenizer).family;
        assert_eq!(
            ToolCallParser::from_str(family.parser_name(), false),
            Ok(parser)
        );
    }
}

#[test]
fn added_markers_are_offered_as_tokens_and_special_ones_stay_in_chat_text() {
    let json = crate::validation::testing::tokenizer_json_with_special_tokens(&[
        HERMES_TRIGGER,
        "<arg_key>",
    ]);
    let mut tokenizer = Tokenizer::from_bytes(json.to_string()).expect("test vocabulary");
    tokenizer
        .add_tokens([tokenizers::AddedToken::from("<arg_value>", false)])
        .expect("a plain added token");
    let glm = ToolFormat::choose(Some(ToolCallParser::Glm45), None, &tokenizer);
    assert_eq!(glm.trigger_token, tokenizer.token_to_id(HERMES_TRIGGER));
    assert_eq!(glm.marker_tokens[0], tokenizer.token_to_id("<arg_key>"));
    assert_eq!(glm.marker_tokens[2], tokenizer.token_to_id("<arg_value>"));
    assert_eq!(
        glm.marker_tokens[1], None,
        "not one token of this vocabulary"
    );
    assert!(glm.trigger_token.is_some() && glm.marker_tokens[0].is_some());
    let kept = ToolFamily::Glm45.chat_markers();
    for marker in [HERMES_TRIGGER, "<arg_key>", "<arg_value>"] {
        assert!(
            kept.contains(&marker),
            "{marker} reaches the parser as text"
        );
    }
}

#[test]
fn mistral_asks_for_its_trigger_token_when_the_tokenizer_has_one() {
    let with = tokenizer_with_special_tokens(&[MISTRAL_TRIGGER]);
    let format = ToolFormat::choose(None, Some("[TOOL_CALLS]"), &with);
    assert_eq!(format.trigger_token, with.token_to_id(MISTRAL_TRIGGER));
    assert!(format.trigger_token.is_some());
    let without = tokenizer_with_special_tokens(&[]);
    let format = ToolFormat::choose(None, Some("[TOOL_CALLS]"), &without);
    assert_eq!(format, ToolFormat::text(ToolFamily::Mistral));
}
