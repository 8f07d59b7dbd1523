//! `/openapi.json` documents every route, and `/docs` shows it.

use std::collections::BTreeSet;

use super::*;

fn app() -> axum::Router {
    test_app(
        FakeBackend::new(Script::Tokens(ids("ok"), FinishReason::Length)),
        4,
    )
}

/// Every route the router serves besides the document and its page.
const ROUTES: [(&str, &str); 18] = [
    ("post", "/"),
    ("post", "/v1/chat/completions"),
    ("post", "/v1/completions"),
    ("post", "/v1/messages"),
    ("post", "/v1/messages/count_tokens"),
    ("post", "/v1/responses"),
    ("get", "/v1/responses/{response_id}"),
    ("delete", "/v1/responses/{response_id}"),
    ("get", "/v1/models"),
    ("post", "/v1/load_lora_adapter"),
    ("post", "/v1/unload_lora_adapter"),
    ("post", "/generate"),
    ("post", "/generate_stream"),
    ("post", "/tokenize"),
    ("get", "/info"),
    ("get", "/health"),
    ("get", "/ready"),
    ("get", "/metrics"),
];

#[tokio::test]
async fn the_spec_lists_every_route_and_every_listed_route_is_served() {
    let app = app();
    let reply = get(&app, "/openapi.json").await;
    assert_eq!(reply.status, StatusCode::OK);
    let spec = reply.json();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3."));
    let listed: BTreeSet<(String, String)> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(|method| (method.clone(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(method, path)| ((*method).to_owned(), (*path).to_owned()))
        .collect();
    assert_eq!(listed, expected);
    for (method, path) in &listed {
        let request = Request::builder()
            .method(method.to_uppercase().as_str())
            .uri(path.as_str())
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let reply = send(&app, request).await;
        // A route of stored objects answers an unknown id with its own JSON 404.
        let unknown_id = reply.status == StatusCode::NOT_FOUND && reply.body.contains("not found");
        assert!(
            reply.status != StatusCode::NOT_FOUND || unknown_id,
            "{method} {path}"
        );
        assert_ne!(
            reply.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
    }
}

#[tokio::test]
async fn the_spec_names_request_and_error_schemas() {
    let spec = get(&app(), "/openapi.json").await.json();
    let schemas = spec["components"]["schemas"].as_object().unwrap();
    for name in [
        "ChatRequest",
        "CompletionRequest",
        "GenerateRequest",
        "GenerateResponse",
        "StreamResponse",
        "SimpleToken",
        "ServerInfo",
        "OpenAiErrorBody",
        "NativeErrorBody",
    ] {
        assert!(schemas.contains_key(name), "missing schema {name}");
    }
    let generate = &spec["paths"]["/generate"]["post"]["responses"];
    assert!(generate.get("422").is_some() && generate.get("413").is_some());
}

#[tokio::test]
async fn the_docs_page_is_served_from_the_binary() {
    let app = app();
    let page = get(&app, "/docs/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("swagger"), "{}", page.body);
    let script = get(&app, "/docs/swagger-ui-bundle.js").await;
    assert_eq!(script.status, StatusCode::OK);
    let config = get(&app, "/docs/swagger-initializer.js").await;
    assert!(config.body.contains("/openapi.json"), "{}", config.body);
}

#[tokio::test]
async fn streams_are_documented_as_events_carrying_json_chunks() {
    let spec = get(&app(), "/openapi.json").await.json();
    let event = |path: &str| {
        spec["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
            ["properties"]["data"]
            .clone()
    };
    let native = event("/generate_stream");
    assert_eq!(native["contentMediaType"], "application/json");
    assert_eq!(
        native["contentSchema"]["$ref"],
        "#/components/schemas/StreamResponse"
    );
    let echo = &spec["components"]["schemas"]["Echo"]["properties"];
    assert!(
        echo["tool_choice"].get("type").is_none(),
        "a string or an object: {echo}"
    );
    let responses = event("/v1/responses");
    assert_eq!(responses["contentMediaType"], "application/json");
    assert!(responses.get("if").is_none(), "{responses}");
    let chat = event("/v1/chat/completions");
    assert_eq!(chat["if"]["const"], "[DONE]");
    assert_eq!(
        chat["else"]["contentSchema"]["$ref"],
        "#/components/schemas/ChatChunk"
    );
}

/// Every `$ref` below `value`, in document order.
fn references(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                match (key.as_str(), child.as_str()) {
                    ("$ref", Some(target)) => found.push(target.to_owned()),
                    _ => references(child, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| references(item, found)),
        _ => {}
    }
}

#[tokio::test]
async fn every_schema_the_spec_refers_to_is_defined_in_it() {
    let spec = get(&app(), "/openapi.json").await.json();
    let mut found = Vec::new();
    references(&spec, &mut found);
    assert!(!found.is_empty());
    let undefined: BTreeSet<&String> = found
        .iter()
        .filter(|target| {
            let pointer = target.trim_start_matches('#');
            spec.pointer(pointer).is_none()
        })
        .collect();
    assert!(undefined.is_empty(), "undefined references: {undefined:?}");
}

#[tokio::test]
async fn the_speculate_extension_is_documented_on_every_generation_body() {
    let spec = get(&app(), "/openapi.json").await.json();
    let schemas = &spec["components"]["schemas"];
    for name in ["ChatRequest", "CompletionRequest", "GenerateParameters"] {
        let speculate = &schemas[name]["properties"]["speculate"];
        assert_eq!(speculate["minimum"], 0, "{name}: {speculate}");
        let description = speculate["description"].as_str().unwrap_or_default();
        assert!(description.contains("--speculate"), "{name}: {speculate}");
    }
}
