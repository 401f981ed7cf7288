//! (being written)

use axum::Router;
use utoipa::OpenApi;

use super::AppState;

#[derive(OpenApi)]
#[openapi()]
pub struct Doc;

pub fn routes() -> Router<AppState> {
    Router::new()
}
