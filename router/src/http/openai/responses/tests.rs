//! `/v1/responses` through `app()` with the scripted fake backend.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::store::ResponseStoreLimits;
use crate::http::tests::{
    get, handler_config, ids, last_prompt, ok_backend, post, send, test_app, test_state,
    FakeBackend, Reply, Script,
};
use crate::http::{app, ApiKeys};
use crate::scheduler::FinishReason;

const RESPONSES: &str = "/v1/responses";

fn answering(text: &str) -> std::sync::Arc<FakeBackend> {
    FakeBackend::new(Script::Tokens(ids(text), FinishReason::Eos))
}

async fn delete(app: &axum::Router, path: &str) -> Reply {
    send(app, Request::delete(path).body(Body::empty()).unwrap()).await
}

fn assert_openai_error(body: &Value, param: Option<&str>) {
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(
        body["error"]["param"],
        param.map_or(Value::Null, Value::from),
        "{body}"
    );
}

#[tokio::test]
async fn a_response_answers_with_its_output_text_usage_and_status() {
    let backend = answering("Hello!");
    let app = test_app(backend.clone(), 4);
    let body =
        json!({"model": "m", "input": "Hi", "instructions": "Be brief.", "metadata": {"k": "v"}});
    let reply = post(&app, RESPONSES, &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert!(body["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(
        (&body["object"], &body["status"]),
        (&json!("response"), &json!("completed"))
    );
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["output"][0]["type"], "message");
    assert_eq!(body["output"][0]["role"], "assistant");
    assert_eq!(
        body["output"][0]["content"][0],
        json!({"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []})
    );
    let input_tokens = backend.requests.lock().unwrap()[0].input_ids.len();
    let output_tokens = ids("Hello!").len();
    assert_eq!(body["usage"]["input_tokens"], input_tokens);
    assert_eq!(body["usage"]["output_tokens"], output_tokens);
    assert_eq!(body["usage"]["total_tokens"], input_tokens + output_tokens);
    assert_eq!(
        (&body["instructions"], &body["metadata"]),
        (&json!("Be brief."), &json!({"k": "v"}))
    );
    assert_eq!(body["store"], true);
    assert_eq!(
        last_prompt(&backend),
        "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    );
}

#[tokio::test]
async fn the_length_limit_makes_the_response_incomplete() {
    let app = test_app(ok_backend(), 4);
    let reply = post(
        &app,
        RESPONSES,
        r#"{"input": "Hi", "max_output_tokens": 1}"#,
    )
    .await;
    let body = reply.json();
    assert_eq!(body["status"], "incomplete");
    assert_eq!(
        body["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(body["max_output_tokens"], 1);
}

#[tokio::test]
async fn a_stream_sends_named_numbered_events_ending_with_the_stored_response() {
    let app = test_app(answering("Hey"), 4);
    let reply = post(&app, RESPONSES, r#"{"input": "Hi", "stream": true}"#).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.content_type.starts_with("text/event-stream"));
    let names: Vec<&str> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    let events = reply.json_events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(names, kinds);
    assert_eq!(
        kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert!(events
        .iter()
        .enumerate()
        .all(|(n, e)| e["sequence_number"] == n));
    assert!(!reply.body.contains("[DONE]"));
    let completed = &events.last().unwrap()["response"];
    assert_eq!(completed["output"][0]["content"][0]["text"], "Hey");
    let id = completed["id"].as_str().unwrap();
    let stored = get(&app, &format!("{RESPONSES}/{id}")).await;
    assert_eq!(stored.json(), *completed);
}

#[tokio::test]
async fn a_stored_response_is_retrieved_then_deleted_then_not_found() {
    let app = test_app(answering("Hello!"), 4);
    let created = post(&app, RESPONSES, r#"{"input": "Hi"}"#).await.json();
    let path = format!("{RESPONSES}/{}", created["id"].as_str().unwrap());
    assert_eq!(get(&app, &path).await.json(), created);
    let deleted = delete(&app, &path).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(
        deleted.json(),
        json!({"id": created["id"], "object": "response", "deleted": true})
    );
    for reply in [get(&app, &path).await, delete(&app, &path).await] {
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        assert_openai_error(&reply.json(), None);
    }
    let unstored = post(&app, RESPONSES, r#"{"input": "Hi", "store": false}"#)
        .await
        .json();
    assert_eq!(unstored["store"], false);
    let path = format!("{RESPONSES}/{}", unstored["id"].as_str().unwrap());
    assert_eq!(get(&app, &path).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_continued_conversation_extends_the_stored_prompt() {
    let backend = answering("Hello!");
    let app = test_app(backend.clone(), 4);
    let first = post(&app, RESPONSES, r#"{"input": "Hi"}"#).await.json();
    let first_prompt = last_prompt(&backend);
    let body = json!({"input": "And you?", "previous_response_id": first["id"]});
    let second = post(&app, RESPONSES, &body.to_string()).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(second.json()["previous_response_id"], first["id"]);
    let second_prompt = last_prompt(&backend);
    assert!(second_prompt.starts_with(&first_prompt), "{second_prompt}");
    assert_eq!(
        second_prompt,
        "<|user|>Hi\n<|assistant|>Hello!\n<|user|>And you?\n<|assistant|>"
    );
    let unknown = post(
        &app,
        RESPONSES,
        r#"{"input": "Hi", "previous_response_id": "resp_nope"}"#,
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_openai_error(&unknown.json(), Some("previous_response_id"));
}

#[tokio::test]
async fn a_tiny_store_evicts_the_oldest_response() {
    let limits = ResponseStoreLimits {
        max_entries: 2,
        max_bytes: 1 << 20,
    };
    let state = test_state(answering("Hello!"), handler_config(4)).with_responses_store(limits);
    let app = app(state);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let body = post(&app, RESPONSES, r#"{"input": "Hi"}"#).await.json();
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    let status = |id: &str| {
        let app = app.clone();
        let path = format!("{RESPONSES}/{id}");
        async move { get(&app, &path).await.status }
    };
    assert_eq!(status(&ids[0]).await, StatusCode::NOT_FOUND);
    assert_eq!(status(&ids[1]).await, StatusCode::OK);
    assert_eq!(status(&ids[2]).await, StatusCode::OK);
}

#[tokio::test]
async fn function_tools_reach_the_grammar_path_and_are_echoed() {
    let app = test_app(answering("Sunny."), 4);
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    // The test model has no grammar engine, so a callable tool is refused where chat refuses it.
    let body = json!({"input": "Weather?", "tool_choice": "required", "tools": tools});
    let refused = post(&app, RESPONSES, &body.to_string()).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_openai_error(&refused.json(), Some("tools"));
    let body = json!({"input": "Weather?", "tool_choice": "none", "tools": tools});
    let reply = post(&app, RESPONSES, &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = reply.json();
    assert_eq!(reply["output"][0]["content"][0]["text"], "Sunny.");
    assert_eq!(reply["tool_choice"], "none");
    assert_eq!(reply["tools"][0]["name"], "get_weather");
}

#[tokio::test]
async fn unsupported_fields_and_query_parameters_are_400_naming_them() {
    let app = test_app(ok_backend(), 4);
    let reply = post(&app, RESPONSES, r#"{"input": "Hi", "background": true}"#).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_openai_error(&reply.json(), Some("background"));
    assert!(reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`background`"));
    let query = get(&app, &format!("{RESPONSES}/resp_x?stream=true")).await;
    assert_eq!(query.status, StatusCode::BAD_REQUEST);
    assert_openai_error(&query.json(), Some("stream"));
    let missing = post(&app, RESPONSES, r#"{"model": "m"}"#).await;
    assert_openai_error(&missing.json(), Some("input"));
}

const OWNER_KEY: &str = "sk-owner";
const OTHER_KEY: &str = "sk-other";

async fn send_as(app: &axum::Router, key: &str, method: &str, path: &str, body: &str) -> Reply {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Body::from(body.to_owned()))
        .unwrap();
    send(app, request).await
}

#[tokio::test]
async fn a_stored_response_is_unknown_to_every_key_but_the_one_that_created_it() {
    let keys = ApiKeys::load(&[OWNER_KEY.into(), OTHER_KEY.into()], &[]).unwrap();
    let state = test_state(answering("Hello!"), handler_config(4)).with_api_keys(keys);
    let app = app(state);
    let created = send_as(&app, OWNER_KEY, "POST", RESPONSES, r#"{"input": "Hi"}"#).await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    let created = created.json();
    let path = format!("{RESPONSES}/{}", created["id"].as_str().unwrap());
    let continuation = json!({"input": "And you?", "previous_response_id": created["id"]});
    let continuation = continuation.to_string();

    let read = send_as(&app, OTHER_KEY, "GET", &path, "").await;
    let deleted = send_as(&app, OTHER_KEY, "DELETE", &path, "").await;
    for reply in [&read, &deleted] {
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
        assert_openai_error(&reply.json(), None);
    }
    let continued = send_as(&app, OTHER_KEY, "POST", RESPONSES, &continuation).await;
    assert_eq!(
        continued.status,
        StatusCode::NOT_FOUND,
        "{}",
        continued.body
    );
    assert_openai_error(&continued.json(), Some("previous_response_id"));

    let read_by_owner = send_as(&app, OWNER_KEY, "GET", &path, "").await;
    assert_eq!(
        read_by_owner.status,
        StatusCode::OK,
        "another key's DELETE kept it"
    );
    assert_eq!(read_by_owner.json(), created);
    let continued = send_as(&app, OWNER_KEY, "POST", RESPONSES, &continuation).await;
    assert_eq!(continued.status, StatusCode::OK, "{}", continued.body);
    let deleted_by_owner = send_as(&app, OWNER_KEY, "DELETE", &path, "").await;
    assert_eq!(deleted_by_owner.status, StatusCode::OK);
    let gone = send_as(&app, OWNER_KEY, "GET", &path, "").await;
    assert_eq!(
        (gone.status, gone.json()),
        (read.status, read.json()),
        "another key's answer is exactly the answer for an unknown id"
    );
}
