//! The OpenAPI document (`/openapi.json`) and its browsable page (`/docs`).

use axum::Router;
use utoipa::openapi::OpenApi;
use utoipa_swagger_ui::SwaggerUi;

use super::AppState;

/// Where the document is served.
pub const SPEC_PATH: &str = "/openapi.json";
/// Where Swagger UI, bundled in the binary, shows it.
pub const DOCS_PATH: &str = "/docs";

/// The document's title, version and tags; the routes add their operations and schemas.
pub fn base() -> OpenApi {
    #[derive(utoipa::OpenApi)]
    #[openapi(
        info(
            title = "Tandem",
            description = "OpenAI-compatible (`/v1/*`) and TGI-compatible (`/generate`, `/generate_stream`, \\
                `/tokenize`, `/info`) routes of the Tandem LLM server.",
            license(name = "Apache-2.0")
        ),
        tags(
            (name = "OpenAI", description = "OpenAI-compatible routes"),
            (name = "TGI", description = "Text-generation-inference-compatible routes"),
            (name = "Operations", description = "Health, readiness and metrics")
        )
    )]
    struct Document;
    let mut document = <Document as utoipa::OpenApi>::openapi();
    document.info.version = env!("CARGO_PKG_VERSION").to_owned();
    document
}

/// Serves `spec` at `/openapi.json` and Swagger UI at `/docs`.
pub fn docs(spec: OpenApi) -> Router<AppState> {
    SwaggerUi::new(DOCS_PATH).url(SPEC_PATH, spec).into()
}
