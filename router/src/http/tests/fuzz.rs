//! Property test over request parsing and validation: generated JSON values, mutated valid
//! requests and raw bytes go through the real app on every POST route; none may panic or
//! get a 5xx, and afterwards no admission slot is held and valid requests still succeed.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::*;

/// Bodies per strategy; each is sent to all four POST routes.
const CASES: u32 = 768;

const ROUTES: [&str; 4] = [
    "/generate",
    "/generate_stream",
    "/v1/chat/completions",
    "/v1/completions",
];

/// Field names the routes know, so generated objects reach validation, not only parsing.
const FIELDS: [&str; 34] = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "best_of",
    "stream",
    "stop",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "seed",
    "inputs",
    "parameters",
    "max_new_tokens",
    "role",
    "content",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stream_options",
    "include_usage",
    "echo",
    "response_format",
    "tools",
    "tool_choice",
    "details",
    "do_sample",
    "return_full_text",
    "typical_p",
    "min_p",
];

const VALID: [&str; 4] = [
    r#"{"inputs": "a", "parameters": {"max_new_tokens": 3, "temperature": 0.5, "stop": ["x"]}}"#,
    r#"{"inputs": "a", "parameters": {"details": true, "top_n_tokens": 2}}"#,
    r#"{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 2}"#,
    r#"{"prompt": "a", "max_tokens": 3, "n": 2, "stop": ["b"], "logit_bias": {"5": 1}, "stream": true}"#,
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(&FIELDS[..]).prop_map(str::to_owned),
        1 => "[a-z_]{1,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        (-3i64..20).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::String),
        proptest::sample::select(&["user", "assistant", "system", "tool", "a"][..])
            .prop_map(|role| Value::String(role.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// A valid body with one field (top level or one level down) replaced.
fn mutated_valid() -> impl Strategy<Value = Vec<u8>> {
    (0..VALID.len(), key(), json_value(), any::<bool>()).prop_map(|(index, field, value, deep)| {
        let mut body: Value = serde_json::from_str(VALID[index]).expect("valid JSON");
        let target = if deep {
            body.as_object_mut()
                .and_then(|object| object.values_mut().find(|v| v.is_object()))
                .and_then(Value::as_object_mut)
        } else {
            body.as_object_mut()
        };
        if let Some(object) = target {
            object.insert(field, value);
        }
        serde_json::to_vec(&body).expect("serializable")
    })
}

/// A valid body's text with bytes overwritten or cut.
fn corrupted_text() -> impl Strategy<Value = Vec<u8>> {
    (
        0..VALID.len(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(index, edits, cut, truncate)| {
            let mut bytes = VALID[index].as_bytes().to_vec();
            for (position, byte) in edits {
                let at = position.index(bytes.len());
                bytes[at] = byte;
            }
            if truncate {
                bytes.truncate(cut.index(bytes.len()));
            }
            bytes
        })
}

fn bodies() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        json_value().prop_map(|value| serde_json::to_vec(&value).expect("serializable")),
        mutated_valid(),
        corrupted_text(),
        proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

#[test]
fn no_generated_body_panics_or_gets_a_5xx() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length));
    let state = test_state(backend, handler_config(64));
    let app = app(state.clone());
    let config = Config {
        cases: CASES * 4,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let sent = std::cell::Cell::new(0usize);
    let outcome = runner.run(&bodies(), |body| {
        for route in ROUTES {
            let request = Request::post(route)
                .header("content-type", "application/json")
                .body(Body::from(body.clone()))
                .unwrap();
            let reply = runtime.block_on(send(&app, request));
            sent.set(sent.get() + 1);
            prop_assert!(
                !reply.status.is_server_error(),
                "{route} {:?} -> {} {}",
                String::from_utf8_lossy(&body),
                reply.status,
                reply.body
            );
        }
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    assert_eq!(sent.get(), ROUTES.len() * (CASES * 4) as usize);
    assert_eq!(
        state.in_flight(),
        0,
        "a fuzzed request leaked its admission slot"
    );
    for (route, body) in ROUTES.iter().zip(VALID) {
        let request = post_request(route, body);
        let reply = runtime.block_on(send(&app, request));
        assert_eq!(reply.status, StatusCode::OK, "{route}: {}", reply.body);
    }
}
