//! The OpenAPI document (`/openapi.json`) and its browsable page (`/docs`).

use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use utoipa::openapi::OpenApi;
use utoipa_swagger_ui::{Config, SwaggerUi};

use crate::error::Api;
use crate::http::state::AppState;

/// Where the document is served.
pub const SPEC_PATH: &str = "/openapi.json";
/// Where Swagger UI, bundled in the binary, shows it.
pub const DOCS_PATH: &str = "/docs";
const SSE_MEDIA_TYPE: &str = "text/event-stream";
/// The last event of every OpenAI stream but the Responses API's.
const OPENAI_STREAM_END: &str = "[DONE]";
/// The Responses API, whose streams end with `response.completed` and no `[DONE]`.
const RESPONSES_PATH: &str = "/v1/responses";

/// The document's title, version and tags; the routes add their operations and schemas, except
/// those only shared response sets (`IntoResponses`) name, which are listed here.
pub fn base() -> OpenApi {
    #[derive(utoipa::OpenApi)]
    #[openapi(
        info(
            title = "Tandem",
            description = "OpenAI-compatible (`/v1/*`), Anthropic-compatible (`/v1/messages`) and TGI-compatible (`/generate`, `/generate_stream`, \
                `/tokenize`, `/info`) routes of the Tandem LLM server.",
            license(name = "Apache-2.0")
        ),
        tags(
            (name = "OpenAI", description = "OpenAI-compatible routes"),
            (name = "Anthropic", description = "Anthropic Messages-compatible routes"),
            (name = "TGI", description = "Text-generation-inference-compatible routes"),
            (name = "Operations", description = "Health, readiness and metrics")
        ),
        components(schemas(
            crate::error::OpenAiErrorBody,
            crate::error::OpenAiError,
            crate::error::AnthropicErrorBody,
            crate::error::AnthropicError
        ))
    )]
    struct Document;
    let mut document = <Document as utoipa::OpenApi>::openapi();
    document.info.version = env!("CARGO_PKG_VERSION").to_owned();
    document
}

/// The document as served: each `text/event-stream` body, declared with its event's schema,
/// becomes the schema of one server-sent event whose `data` is that JSON (or, on `/v1/*`
/// routes but the Anthropic and Responses ones, the final `[DONE]`), as OpenAPI 3.1 describes
/// streams.
pub fn served_document(spec: &OpenApi) -> Value {
    let mut document = serde_json::to_value(spec).expect("invariant: the document is plain JSON");
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return document;
    };
    for (path, item) in paths.iter_mut() {
        let ends_with_done = Api::for_path(path) == Api::OpenAi && path != RESPONSES_PATH;
        let terminator = ends_with_done.then_some(OPENAI_STREAM_END);
        let operations = item
            .as_object_mut()
            .into_iter()
            .flat_map(|ops| ops.values_mut());
        for operation in operations {
            let responses = operation
                .get_mut("responses")
                .and_then(Value::as_object_mut);
            for response in responses.into_iter().flat_map(|r| r.values_mut()) {
                let stream = response
                    .pointer_mut(&format!("/content/{}", SSE_MEDIA_TYPE.replace('/', "~1")));
                if let Some(schema) = stream.and_then(|media| media.get_mut("schema")) {
                    *schema = sse_event(schema.take(), terminator);
                }
            }
        }
    }
    document
}

/// One server-sent event whose `data` is JSON of `payload` (or the literal `terminator`).
fn sse_event(payload: Value, terminator: Option<&str>) -> Value {
    let json_data = json!({
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": payload,
    });
    let data = match terminator {
        None => json_data,
        Some(end) => json!({"type": "string", "if": {"const": end}, "else": json_data}),
    };
    json!({"type": "object", "required": ["data"], "properties": {"data": data}})
}

/// Serves the document at `/openapi.json` and Swagger UI at `/docs`.
pub fn docs(spec: &OpenApi) -> Router<AppState> {
    let document = Arc::new(served_document(spec));
    let ui: Router<AppState> = SwaggerUi::new(DOCS_PATH)
        .config(Config::from(SPEC_PATH))
        .into();
    ui.route(
        SPEC_PATH,
        get(move || {
            let document = Arc::clone(&document);
            async move { Json(document.as_ref().clone()) }
        }),
    )
}
