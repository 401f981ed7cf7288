//! One log line for every request that fails: method, path, status, the error message and
//! a request id, at `warn` for client errors and `error` for server errors, so that an
//! operator whose frontend shows an error finds it at the default level. Every response
//! carries its id in `x-request-id` (the client's own, when it sends a usable one).
//! `/health`'s 503 while a model loads is its answer, not a failure: probes poll it.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// The message of an error response, left on it for the log line.
#[derive(Clone, Debug)]
pub struct ErrorNote(pub String);

/// The header that carries a request's id, both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// A client's request id is kept when it is short printable ASCII; else one is made.
fn request_id(req: &Request) -> String {
    let given = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok());
    match given.filter(|s| !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic())) {
        Some(id) => id.to_string(),
        None => super::new_id("req_"),
    }
}

pub async fn log_failures(req: Request, next: Next) -> Response {
    let id = request_id(&req);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let mut resp = next.run(req).await;
    let status = resp.status();
    if (status.is_client_error() || status.is_server_error()) && path != "/health" {
        let message = resp.extensions().get::<ErrorNote>().map_or("", |n| n.0.as_str());
        let status = status.as_u16();
        match status >= 500 {
            true => tracing::error!(request_id = %id, %method, path, status, error = message, "request failed"),
            false => tracing::warn!(request_id = %id, %method, path, status, error = message, "request refused"),
        }
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}
