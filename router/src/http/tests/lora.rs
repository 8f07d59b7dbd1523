//! LoRA adapters over HTTP: `/v1/models` lists them, OpenAI's `model` and TGI's `adapter_id`
//! select one, and a name that is not served is refused before anything reaches the engine.

use axum::http::StatusCode;
use serde_json::Value;

use super::*;
use crate::validation::LoraAdapters;

fn app_with_adapters(backend: Arc<FakeBackend>) -> axum::Router {
    let config = handler_config(4);
    let adapters = LoraAdapters::new(&config.model_id, ["sql".to_owned(), "chat".to_owned()]);
    app(test_state_adapted(backend, config, |validator| {
        validator.with_lora_adapters(adapters)
    }))
}

fn selected(backend: &FakeBackend) -> Vec<Option<String>> {
    let requests = backend.requests.lock().unwrap();
    requests
        .iter()
        .map(|request| request.adapter.as_ref().map(|key| key.name.to_string()))
        .collect()
}

#[tokio::test]
async fn models_lists_the_served_model_then_each_adapter_with_its_parent() {
    let reply = get(&app_with_adapters(ok_backend()), "/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK);
    let data = reply.json()["data"].as_array().cloned().unwrap_or_default();
    let listed: Vec<(Value, Value)> = data
        .iter()
        .map(|model| (model["id"].clone(), model["parent"].clone()))
        .collect();
    assert_eq!(
        listed,
        [
            (Value::from(MODEL_ID), Value::Null),
            (Value::from("sql"), Value::from(MODEL_ID)),
            (Value::from("chat"), Value::from(MODEL_ID)),
        ]
    );
}

#[tokio::test]
async fn model_and_adapter_id_select_the_adapter_and_answers_name_it() {
    let backend = ok_backend();
    let app = app_with_adapters(Arc::clone(&backend));
    let chat =
        r#"{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let reply = post(&app, "/v1/chat/completions", chat).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["model"], "chat");
    let completion = format!(r#"{{"model": "{MODEL_ID}", "prompt": "hi", "max_tokens": 2}}"#);
    let reply = post(&app, "/v1/completions", &completion).await;
    assert_eq!(reply.json()["model"], MODEL_ID);
    let generate = r#"{"inputs": "hi", "parameters": {"adapter_id": "sql", "max_new_tokens": 2}}"#;
    assert_eq!(
        post(&app, "/generate", generate).await.status,
        StatusCode::OK
    );
    assert_eq!(
        selected(&backend),
        [Some("chat".to_owned()), None, Some("sql".to_owned())]
    );
}

#[tokio::test]
async fn a_name_that_is_not_served_is_refused_naming_what_is() {
    let backend = ok_backend();
    let app = app_with_adapters(Arc::clone(&backend));
    let chat = r#"{"model": "sq1", "messages": [{"role": "user", "content": "hi"}]}"#;
    let reply = post(&app, "/v1/chat/completions", chat).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("`model` is `sq1`"), "{message}");
    assert!(
        message.contains(&format!("{MODEL_ID}, sql, chat")),
        "{message}"
    );
    assert_eq!(reply.json()["error"]["param"], "model");
    let generate = r#"{"inputs": "hi", "parameters": {"adapter_id": "nope"}}"#;
    let reply = post(&app, "/generate", generate).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(reply.json()["error"]
        .as_str()
        .is_some_and(|message| message.contains("it serves sql, chat")));
    assert!(selected(&backend).is_empty(), "nothing reached the engine");
}

fn load_body(name: &str, path: &str) -> String {
    format!(r#"{{"lora_name": "{name}", "lora_path": "{path}"}}"#)
}

async fn model_ids(app: &axum::Router) -> Vec<String> {
    let reply = get(app, "/v1/models").await;
    let data = reply.json()["data"].as_array().cloned().unwrap_or_default();
    data.iter()
        .filter_map(|model| model["id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn an_adapter_loaded_at_run_time_serves_and_unloading_it_stops_new_requests() {
    let backend = ok_backend();
    let app = app_with_adapters(Arc::clone(&backend));
    let reply = post(
        &app,
        "/v1/load_lora_adapter",
        &load_body("summaries", "/adapters/s"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.body,
        "Success: LoRA adapter 'summaries' added successfully."
    );
    assert_eq!(
        model_ids(&app).await,
        [MODEL_ID, "sql", "chat", "summaries"]
    );
    let chat = r#"{"model": "summaries", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    assert_eq!(
        post(&app, "/v1/chat/completions", chat).await.status,
        StatusCode::OK
    );
    let reply = post(
        &app,
        "/v1/unload_lora_adapter",
        r#"{"lora_name": "summaries"}"#,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(model_ids(&app).await, [MODEL_ID, "sql", "chat"]);
    assert_eq!(
        post(&app, "/v1/chat/completions", chat).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        *backend.lora_updates.lock().unwrap(),
        ["load summaries", "unload summaries"]
    );
    assert_eq!(selected(&backend), [Some("summaries".to_owned())]);
}

#[tokio::test]
async fn refused_loads_and_unloads_change_nothing() {
    let backend = ok_backend();
    let app = app_with_adapters(Arc::clone(&backend));
    let taken = post(
        &app,
        "/v1/load_lora_adapter",
        &load_body("sql", "/adapters/sql"),
    )
    .await;
    assert_eq!(taken.status, StatusCode::BAD_REQUEST);
    assert!(
        taken.body.contains("LoRA adapter 'sql' is already loaded"),
        "{}",
        taken.body
    );
    let bad = post(&app, "/v1/load_lora_adapter", &load_body("broken", "/bad")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        bad.body.contains("lora_B of q_proj has shape"),
        "{}",
        bad.body
    );
    let base = post(
        &app,
        "/v1/load_lora_adapter",
        &load_body(MODEL_ID, "/adapters/x"),
    )
    .await;
    assert_eq!(base.status, StatusCode::BAD_REQUEST);
    let unknown = post(&app, "/v1/unload_lora_adapter", r#"{"lora_name": "nope"}"#).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    backend
        .requests_under_adapter
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let busy = post(&app, "/v1/unload_lora_adapter", r#"{"lora_name": "chat"}"#).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert!(
        busy.body
            .contains("'chat' has 2 requests waiting or running"),
        "{}",
        busy.body
    );
    assert_eq!(model_ids(&app).await, [MODEL_ID, "sql", "chat"]);
    assert!(backend.lora_updates.lock().unwrap().is_empty());
}

#[tokio::test]
async fn without_runtime_updates_the_routes_are_not_served() {
    let config = HandlerConfig {
        runtime_lora_updates: false,
        ..handler_config(4)
    };
    let app = app(test_state(ok_backend(), config));
    let reply = post(
        &app,
        "/v1/load_lora_adapter",
        &load_body("x", "/adapters/x"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn anthropic_and_responses_models_select_an_adapter_only_when_they_name_one() {
    let backend = ok_backend();
    let app = app_with_adapters(Arc::clone(&backend));
    let message = |model: &str| {
        format!(
            r#"{{"model": "{model}", "max_tokens": 2, "messages": [{{"role": "user", "content": "hi"}}]}}"#
        )
    };
    let reply = post(&app, "/v1/messages", &message("chat")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["model"], "chat");
    let reply = post(&app, "/v1/messages", &message("claude-sonnet-4")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["model"], MODEL_ID);
    let response = r#"{"model": "sql", "input": "hi", "max_output_tokens": 2}"#;
    let reply = post(&app, "/v1/responses", response).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["model"], "sql");
    assert_eq!(
        selected(&backend),
        [Some("chat".to_owned()), None, Some("sql".to_owned())]
    );
}
