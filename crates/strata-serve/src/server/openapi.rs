//! The OpenAPI document (generated from the handlers' annotations), served at
//! `/openapi.json` with Swagger UI at `/docs`, and written to `openapi.yaml`.

use axum::Router;
use utoipa::OpenApi;
use utoipa_swagger_ui::SwaggerUi;

use super::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Strata",
        description = "OpenAI- and Ollama-compatible inference server. \
        [The status page](/ui): where each model's weights are, what the server is doing, and a chat box."
    ),
    paths(super::root, super::health, super::metrics::render)
)]
struct Base;

/// The whole API: server routes, OpenAI and Ollama.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = Base::openapi();
    doc.merge(super::openai::Doc::openapi());
    doc.merge(super::ollama::Doc::openapi());
    doc.merge(super::anthropic::Doc::openapi());
    doc.merge(super::status::Doc::openapi());
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// `openapi.yaml` as the code defines it.
pub fn yaml() -> String {
    document().to_yaml().expect("the OpenAPI document serializes")
}

pub fn routes() -> Router<AppState> {
    Router::new().merge(SwaggerUi::new("/docs").url("/openapi.json", document()))
}
