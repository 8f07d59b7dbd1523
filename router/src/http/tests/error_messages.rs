//! Every refusal the validation layer and the body parsers give, one bad request each: the
//! status, the offending field and the client's own value are in the message, and nothing
//! of the engine's internals (grammar engine identifiers, Rust type names, clamped numbers).

use axum::http::header;
use serde_json::json;

use super::*;
use image::ImageFormat;

use crate::images::testing::{data_url, encoded};
use crate::images::{ImageTokens, ImageTokensError};
use crate::validation::{
    tokenization_peak_bytes, ChatUnavailable, GrammarCompiler, ValidationError,
};

/// The text part of the test server's bodies; text beyond twice this is refused.
const TEXT_LIMIT: usize = PAYLOAD_LIMIT / 4;

/// A template that refuses a system message anywhere but first, as many models' do.
const STRICT_TEMPLATE: &str = "{% for message in messages %}{% if message.role == 'system' and not loop.first %}{{ raise_exception('System message must be first') }}{% endif %}<|{{ message.role }}|>{{ message.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// The test server with a grammar engine, `template` as its chat template, and images placed
/// as `images`' tokens say in steps of at most its step tokens (`None`: a text-only model).
fn app_with_template(template: Option<&str>, images: Option<(ImageTokens, usize)>) -> axum::Router {
    let config = json!({"bos_token": "<s>", "eos_token": "</s>"});
    let dir = testing::write_model_dir(&config, template);
    let files = ModelFiles::load(dir.path()).unwrap();
    let template = files
        .chat_template
        .map(|source| ChatTemplate::new(source, files.bos_token, files.eos_token).unwrap())
        .ok_or(ChatUnavailable::NoTemplate);
    let tokenizer = Arc::new(files.tokenizer);
    let limits = Limits {
        max_input_tokens: MAX_INPUT_TOKENS,
        max_total_tokens: MAX_TOTAL_TOKENS,
        max_stop_sequences: 4,
    };
    let grammars =
        GrammarCompiler::from_tokenizer_json(&testing::tokenizer_json(), &[testing::EOS_ID])
            .unwrap();
    // Tokenization budgeted for bodies of a quarter of the payload limit, as a server whose
    // limit grew to carry an image budgets it for the text part alone.
    let validator = Validator::new(Arc::clone(&tokenizer), template, limits)
        .with_tokenization_budget(2 * tokenization_peak_bytes(TEXT_LIMIT))
        .with_grammars(Arc::new(grammars))
        .with_image_tokens(
            images.as_ref().map(|(tokens, _)| tokens.clone()),
            images.map_or(0, |(_, max_step_tokens)| max_step_tokens),
        );
    let config = handler_config(4);
    let info = server_info_for(&config);
    app(AppState::new(
        ok_backend(),
        Arc::new(validator),
        Arc::new(TokenDecoding::new(tokenizer)),
        config,
        info,
        crate::metrics::detached_handle(),
    ))
}

/// Which refusal a case provokes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Refusal {
    Validation(&'static str),
    InvalidBody,
    PayloadTooLarge,
    NotJson,
}

/// Each `ValidationError` variant by name. No wildcard: a new variant does not compile until
/// it is named here, and `every_variant_has_a_case` then asks for a case that provokes it.
fn variant(error: &ValidationError) -> &'static str {
    match error {
        ValidationError::OutOfRange { .. } => "OutOfRange",
        ValidationError::CountOutOfRange { .. } => "CountOutOfRange",
        ValidationError::UnknownToken { .. } => "UnknownToken",
        ValidationError::Missing(_) => "Missing",
        ValidationError::Empty(_) => "Empty",
        ValidationError::Unsupported { .. } => "Unsupported",
        ValidationError::InvalidRole { .. } => "InvalidRole",
        ValidationError::TooManyStops { .. } => "TooManyStops",
        ValidationError::TooMany { .. } => "TooMany",
        ValidationError::TooLong { .. } => "TooLong",
        ValidationError::InputTooLong { .. } => "InputTooLong",
        ValidationError::TotalTooLong { .. } => "TotalTooLong",
        ValidationError::NoChat(_) => "NoChat",
        ValidationError::TooManyPrompts { .. } => "TooManyPrompts",
        ValidationError::Template(_) => "Template",
        ValidationError::Tokenizer(_) => "Tokenizer",
        ValidationError::InvalidGrammar { .. } => "InvalidGrammar",
        ValidationError::UnknownAdapter { .. } => "UnknownAdapter",
        ValidationError::ImagePart { .. } => "ImagePart",
        ValidationError::Image { .. } => "Image",
        ValidationError::TextOnlyModel => "TextOnlyModel",
        ValidationError::ImagePlacement(_) => "ImagePlacement",
        ValidationError::ImageSpanTooLong { .. } => "ImageSpanTooLong",
        ValidationError::TextTooLarge(_) => "TextTooLarge",
    }
}

/// One value of each variant, in `variant`'s order (the fields do not matter).
fn one_of_each() -> Vec<ValidationError> {
    let grammar = ValidationError::InvalidGrammar {
        param: "tools",
        refusal: crate::validation::GrammarRefusal::NotASchema,
    };
    vec![
        ValidationError::out_of_range("top_p", "in (0, 1]", 2),
        ValidationError::CountOutOfRange {
            param: "n",
            max: 1,
            value: 2,
        },
        ValidationError::UnknownToken {
            param: "prompt",
            id: 1,
            vocab_size: 1,
        },
        ValidationError::Missing("messages"),
        ValidationError::Empty("prompt"),
        ValidationError::Unsupported {
            param: "suffix".into(),
            detail: String::new(),
        },
        ValidationError::InvalidRole {
            index: 0,
            role: "x".into(),
        },
        ValidationError::TooManyStops { max: 1, got: 2 },
        ValidationError::TooMany {
            param: "logit_bias",
            max: 1,
            got: 2,
        },
        ValidationError::TooLong {
            param: "stop",
            max: 1,
            got: 2,
        },
        ValidationError::InputTooLong {
            input_tokens: 2,
            max_input_tokens: 1,
        },
        ValidationError::TotalTooLong {
            param: "max_tokens",
            input_tokens: 1,
            max_new_tokens: 2,
            max_total_tokens: 2,
        },
        ValidationError::NoChat(ChatUnavailable::NoTemplate),
        ValidationError::TooManyPrompts { max: 1, got: 2 },
        ValidationError::Template(String::new()),
        ValidationError::Tokenizer(String::new()),
        grammar,
        ValidationError::UnknownAdapter {
            param: "model",
            name: String::new(),
            served: String::new(),
        },
        ValidationError::ImagePart {
            param: String::new(),
            source: crate::images::ImageError::UnknownFormat,
        },
        ValidationError::Image {
            number: 1,
            source: crate::images::ImageError::UnknownFormat,
        },
        ValidationError::TextOnlyModel,
        ValidationError::ImagePlacement(ImageTokensError::PlaceholderCount {
            found: 0,
            images: 1,
        }),
        ValidationError::ImageSpanTooLong {
            number: 1,
            tokens: 2,
            max_step_tokens: 1,
        },
        ValidationError::TextTooLarge(crate::validation::TextTooLarge { bytes: 2, max: 1 }),
    ]
}

/// Variants no request can provoke, and why.
const UNREACHABLE: [(&str, &str); 1] = [(
    "Tokenizer",
    "the tokenizer has no truncation or padding to fail, and UTF-8 text always encodes",
)];

/// A bad request and what its refusal must say.
struct Case {
    path: &'static str,
    body: String,
    refusal: Refusal,
    /// The offending field, as the message quotes it in backticks.
    field: Option<&'static str>,
    /// The client's value (or another fact), as the message must quote it.
    quotes: &'static [&'static str],
    /// A server without a chat template.
    no_template: bool,
    /// A server whose model takes images.
    vision: bool,
    /// A vision server whose steps are shorter than an image's span.
    narrow_steps: bool,
}

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
const GENERATE: &str = "/generate";
const MESSAGES: &str = "/v1/messages";
const TOKENIZE: &str = "/tokenize";

fn chat(extra: &str) -> String {
    format!(r#"{{"messages": [{{"role": "user", "content": "a"}}]{extra}}}"#)
}

fn anthropic(extra: &str) -> String {
    format!(
        r#"{{"model": "m", "max_tokens": 5, "messages": [{{"role": "user", "content": "a"}}]{extra}}}"#
    )
}

fn json_schema(schema: &serde_json::Value) -> String {
    chat(&format!(
        r#", "response_format": {{"type": "json_schema", "json_schema": {{"name": "s", "schema": {schema}}}}}"#
    ))
}

fn case(
    path: &'static str,
    body: String,
    refusal: Refusal,
    field: Option<&'static str>,
    quotes: &'static [&'static str],
) -> Case {
    Case {
        path,
        body,
        refusal,
        field,
        quotes,
        no_template: false,
        vision: false,
        narrow_steps: false,
    }
}

/// A chat request whose one message holds an image at `url` and a question.
fn image_chat(url: &str) -> String {
    format!(
        r#"{{"messages": [{{"role": "user", "content": [{{"type": "image_url", "image_url": {{"url": "{url}"}}}}, {{"type": "text", "text": "what is it?"}}]}}]}}"#
    )
}

fn cases() -> Vec<Case> {
    use Refusal::{InvalidBody, NotJson, PayloadTooLarge, Validation};
    let recursive = json!({"$ref": "#"});
    let tool_lookahead = r##", "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "a(?=b)"}}}}}]"##;
    let tool_if_auto = r##", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}]"##;
    let png = encoded(ImageFormat::Png, 8, 8);
    let truncated_png = data_url(&png[..png.len() / 2]);
    let png = data_url(&png);
    vec![
        case(CHAT, image_chat("file:///etc/passwd"), Validation("ImagePart"), Some("messages[0].content[0].image_url"), &["`file:` URLs", "data:"]),
        Case { vision: true, ..case(CHAT, image_chat("http://169.254.169.254/a.png"), Validation("Image"), None, &["image 1 of the request", "`169.254.169.254`", "--allowed-media-domains"]) },
        Case { vision: true, ..case(CHAT, image_chat(&truncated_png), Validation("Image"), None, &["image 1 of the request", "cannot be decoded"]) },
        case(CHAT, image_chat(&png), Validation("TextOnlyModel"), None, &["text only"]),
        Case { vision: true, ..case(CHAT, image_chat(&png), Validation("ImagePlacement"), None, &["0 image placeholders", "1 images"]) },
        Case { vision: true, narrow_steps: true, ..case(CHAT, image_chat(&png), Validation("ImageSpanTooLong"), None, &["image 1 of the request takes 4 prompt tokens", "the 3 one step computes", "--max-batch-prefill-tokens"]) },
        case(CHAT, chat(r#", "temperature": 101"#), Validation("OutOfRange"), Some("temperature"), &["101", "100"]),
        case(GENERATE, r#"{"inputs": "a", "parameters": {"top_p": 1.5}}"#.into(), Validation("OutOfRange"), Some("top_p"), &["1.5", "(0, 1]"]),
        case(CHAT, chat(r#", "logprobs": true, "top_logprobs": 10000000000"#), Validation("CountOutOfRange"), Some("top_logprobs"), &["10000000000", "20"]),
        case(CHAT, chat(r#", "stop_token_ids": [99999]"#), Validation("UnknownToken"), Some("stop_token_ids"), &["99999"]),
        case(CHAT, r#"{"model": "m"}"#.into(), Validation("Missing"), Some("messages"), &[]),
        case(MESSAGES, r#"{"model": "m", "messages": [{"role": "user", "content": "a"}]}"#.into(), Validation("Missing"), Some("max_tokens"), &[]),
        case(CHAT, r#"{"messages": []}"#.into(), Validation("Empty"), Some("messages"), &[]),
        case(COMPLETIONS, r#"{"prompt": "a", "suffix": "x"}"#.into(), Validation("Unsupported"), Some("suffix"), &[]),
        case(GENERATE, r#"{"inputs": "a", "parameters": {"adapter_id": "sql-lora"}}"#.into(), Validation("UnknownAdapter"), Some("adapter_id"), &["sql-lora", "no LoRA adapters are loaded"]),
        case(CHAT, r#"{"messages": [{"role": "robot", "content": "a"}]}"#.into(), Validation("InvalidRole"), Some("messages[0].role"), &["robot"]),
        case(CHAT, chat(r#", "stop": ["a", "b", "c", "d", "e"]"#), Validation("TooManyStops"), Some("stop"), &["5", "4"]),
        case(CHAT, chat(&format!(r#", "stop_token_ids": {:?}"#, vec![1; 65])), Validation("TooMany"), Some("stop_token_ids"), &["65", "64"]),
        case(CHAT, chat(&format!(r#", "stop": ["{}"]"#, "s".repeat(513))), Validation("TooLong"), Some("stop"), &["513", "512"]),
        case(COMPLETIONS, format!(r#"{{"prompt": "{}"}}"#, "x".repeat(80)), Validation("InputTooLong"), Some("max_input_tokens"), &["81", "64"]),
        case(CHAT, chat(r#", "max_tokens": 1000000000000"#), Validation("TotalTooLong"), Some("max_tokens"), &["1000000000000", "105"]),
        case(CHAT, chat(r#", "max_completion_tokens": 5000000000"#), Validation("TotalTooLong"), Some("max_completion_tokens"), &["5000000000", "105"]),
        case(GENERATE, r#"{"inputs": "a", "parameters": {"max_new_tokens": 1000000000000}}"#.into(), Validation("TotalTooLong"), Some("max_new_tokens"), &["1000000000000", "126"]),
        case(MESSAGES, r#"{"model": "m", "max_tokens": 1000000000000, "messages": [{"role": "user", "content": "a"}]}"#.into(), Validation("TotalTooLong"), Some("max_tokens"), &["1000000000000", "105"]),
        Case { no_template: true, ..case(CHAT, chat(""), Validation("NoChat"), None, &["--chat-template", "/v1/completions"]) },
        case(COMPLETIONS, r#"{"prompt": ["a", "b", "c", "d"]}"#.into(), Validation("TooManyPrompts"), Some("prompt"), &["4", "3"]),
        case(CHAT, r#"{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}"#.into(), Validation("Template"), Some("messages"), &["System message must be first"]),
        case(CHAT, json_schema(&recursive), Validation("InvalidGrammar"), Some("response_format.json_schema.schema"), &["recursive `$ref`"]),
        case(CHAT, json_schema(&json!({"type": "object", "if": {}, "then": {}})), Validation("InvalidGrammar"), Some("response_format.json_schema.schema"), &["`if`, `then`"]),
        case(CHAT, json_schema(&json!({"type": "string", "pattern": "a(?=b)"})), Validation("InvalidGrammar"), Some("response_format.json_schema.schema"), &["`pattern`", "(?="]),
        case(CHAT, json_schema(&json!({"$ref": "#/$defs/missing"})), Validation("InvalidGrammar"), Some("response_format.json_schema.schema"), &["#/$defs/missing"]),
        case(CHAT, chat(tool_lookahead), Validation("InvalidGrammar"), Some("tools"), &["`pattern`", "(?="]),
        case(CHAT, chat(tool_if_auto), Validation("InvalidGrammar"), Some("tools"), &["`if`"]),
        case(GENERATE, r#"{"inputs": "a", "parameters": {"grammar": {"type": "regex", "value": "(unclosed"}}}"#.into(), Validation("InvalidGrammar"), Some("parameters.grammar.value"), &["unclosed group"]),
        case(GENERATE, r##"{"inputs": "a", "parameters": {"grammar": {"type": "json", "value": {"$ref": "#"}}}}"##.into(), Validation("InvalidGrammar"), Some("parameters.grammar.value"), &["recursive `$ref`"]),
        case(CHAT, chat(r#", "max_tokens": 1e12"#), InvalidBody, Some("max_tokens"), &["1e12", "an integer"]),
        case(COMPLETIONS, r#"{"prompt": "a", "seed": -1}"#.into(), InvalidBody, Some("seed"), &["-1", "a non-negative integer"]),
        case(CHAT, chat(r#", "stop": 5"#), InvalidBody, Some("stop"), &["a string or an array of strings"]),
        case(CHAT, chat(r#", "stream_options": 5"#), InvalidBody, Some("stream_options"), &["5", "an object"]),
        case(GENERATE, r#"{"inputs": "a", "parameters": {"max_new_tokens": 1e12}}"#.into(), InvalidBody, Some("parameters.max_new_tokens"), &["1e12", "an integer"]),
        case(MESSAGES, r#"{"model": "m", "max_tokens": 1e12, "messages": []}"#.into(), InvalidBody, Some("max_tokens"), &["1e12", "an integer"]),
        case(MESSAGES, anthropic(r#", "system": 5"#), InvalidBody, Some("system"), &["a string or an array"]),
        case(CHAT, chat(r#", "reasoning_effort": "max""#), Validation("OutOfRange"), Some("reasoning_effort"), &["max", "minimal"]),
        case(MESSAGES, anthropic(r#", "thinking": {"type": "enabled", "budget_tokens": 0}"#), Validation("OutOfRange"), Some("thinking.budget_tokens"), &["0", "at least 1"]),
        case(MESSAGES, anthropic(r#", "thinking": {"type": "enabled"}"#), InvalidBody, Some("thinking"), &["budget_tokens"]),
        case(CHAT, "x".repeat(PAYLOAD_LIMIT + 1), PayloadTooLarge, None, &["65536"]),
        case(CHAT, format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "x".repeat(2 * TEXT_LIMIT + 1)), Validation("TextTooLarge"), None, &["32769 bytes of text", "32768", "--payload-limit"]),
        case(TOKENIZE, format!(r#"{{"inputs": "{}"}}"#, "x".repeat(2 * TEXT_LIMIT + 1)), Validation("TextTooLarge"), None, &["32769 bytes of text", "32768"]),
        case(GENERATE, "inputs=a".into(), NotJson, None, &["Content-Type: application/json"]),
    ]
}

/// What no refusal may show: the grammar engine's identifiers and markup, Rust's names for
/// types, or a number clamped to 32 bits.
const INTERNAL_MARKERS: [&str; 13] = [
    "NoExtensionBias",
    "<non-verbose",
    "llguidance",
    "u32::MAX",
    "4294967295",
    "Option<",
    "serde",
    "untagged enum",
    "struct ",
    "WordUnicode",
    "json-schema://",
    "start: ",
    "TopLevelGrammar",
];
const RUST_TYPES: [&str; 12] = [
    "i8", "i16", "i32", "i64", "isize", "u8", "u16", "u32", "u64", "usize", "f32", "f64",
];

fn status_of(refusal: Refusal, path: &str) -> StatusCode {
    match refusal {
        Refusal::PayloadTooLarge | Refusal::Validation("TextTooLarge") => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        Refusal::Validation(_) | Refusal::InvalidBody if path == GENERATE => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        Refusal::Validation(_) | Refusal::InvalidBody => StatusCode::BAD_REQUEST,
        Refusal::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
    }
}

fn message_of(reply: &Reply) -> String {
    let body = reply.json();
    let message = match body["error"].as_str() {
        Some(native) => native,
        None => body["error"]["message"].as_str().unwrap_or_default(),
    };
    message.to_owned()
}

fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

#[test]
fn every_variant_has_a_case() {
    let named: Vec<&str> = one_of_each().iter().map(variant).collect();
    let mut distinct = named.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        named.len(),
        "one value per variant: {named:?}"
    );
    let covered: Vec<Refusal> = cases().iter().map(|case| case.refusal).collect();
    for name in named {
        let unreachable = UNREACHABLE.iter().any(|(variant, _)| *variant == name);
        assert!(
            unreachable || covered.contains(&Refusal::Validation(name)),
            "no case provokes ValidationError::{name}"
        );
    }
}

#[tokio::test]
async fn every_refusal_names_the_field_and_the_value_and_no_internals() {
    let app = app_with_template(Some(STRICT_TEMPLATE), None);
    let without_template = app_with_template(None, None);
    let image_tokens = ImageTokens::widened(testing::EOS_ID, 4);
    let vision = app_with_template(Some(STRICT_TEMPLATE), Some((image_tokens.clone(), 4)));
    let narrow = app_with_template(Some(STRICT_TEMPLATE), Some((image_tokens, 3)));
    let mut failures = Vec::new();
    for case in cases() {
        let server = match (case.no_template, case.vision, case.narrow_steps) {
            (true, ..) => &without_template,
            (false, true, true) => &narrow,
            (false, true, false) => &vision,
            (false, false, _) => &app,
        };
        let reply = send(server, request(&case)).await;
        let label = format!("{} {:?}", case.path, case.refusal);
        failures.extend(
            problems(&case, &reply)
                .into_iter()
                .map(|p| format!("{label}: {p}")),
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn request(case: &Case) -> Request<Body> {
    let content_type = match case.refusal {
        Refusal::NotJson => "application/x-www-form-urlencoded",
        _ => "application/json",
    };
    Request::post(case.path)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(case.body.clone()))
        .unwrap()
}

/// What is wrong with `reply` as the refusal of `case`.
fn problems(case: &Case, reply: &Reply) -> Vec<String> {
    let mut problems = Vec::new();
    let expected = status_of(case.refusal, case.path);
    if reply.status != expected {
        problems.push(format!(
            "status {} instead of {expected}: {}",
            reply.status, reply.body
        ));
        return problems;
    }
    let message = message_of(reply);
    if let Some(field) = case
        .field
        .filter(|field| !message.contains(&format!("`{field}`")))
    {
        problems.push(format!("no `{field}` in {message}"));
    }
    for quote in case.quotes.iter().filter(|quote| !message.contains(*quote)) {
        problems.push(format!("no {quote:?} in {message}"));
    }
    for marker in INTERNAL_MARKERS {
        if !case.body.contains(marker) && reply.body.contains(marker) {
            problems.push(format!("{marker:?} in {message}"));
        }
    }
    for rust_type in RUST_TYPES.iter().filter(|word| has_word(&message, word)) {
        problems.push(format!("{rust_type} in {message}"));
    }
    problems
}
