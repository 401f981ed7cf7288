//! Shared helpers for the HTTP integration tests: a server on fixture models, driven
//! with tower's `oneshot` (no socket).
#![allow(dead_code)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use strata::queue::KeepAlive;
use strata::queue::worker::WorkerConfig;
use strata::server::{AppState, ServeOptions, ServerConfig};
use tower::ServiceExt;

pub fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/hf/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A server offering `llama3` (the default, with a chat template and several eos ids),
/// `qwen3` and the demo model.
pub fn app() -> (Router, AppState) {
    app_with(ServerConfig::default(), 64)
}

pub fn app_with(server: ServerConfig, queue_depth: usize) -> (Router, AppState) {
    app_full(server, queue_depth, 256)
}

/// [`app`] with a longer context (prompts with tool definitions).
pub fn app_with_context(context: usize) -> (Router, AppState) {
    app_full(ServerConfig::default(), 64, context)
}

fn app_full(server: ServerConfig, queue_depth: usize, context: usize) -> (Router, AppState) {
    let models = [("llama3", fixture("llama3")), ("qwen3", fixture("qwen3")), ("strata-demo", "strata-demo".into())];
    let opts = ServeOptions { server, queue_depth, ..serve_options(&models, context) };
    let (router, state, _worker) = strata::server::start(opts).expect("starting the server");
    (router, state)
}

/// A server's options for `models` (name, spec) on one thread with a `context`-token
/// context: two models loaded at once, a queue of 64, the default server settings.
#[allow(dead_code)] // Not every test binary starts its own.
pub fn serve_options(models: &[(&str, String)], context: usize) -> ServeOptions {
    ServeOptions {
        models: models.iter().map(|(n, s)| (n.to_string(), s.clone())).collect(),
        worker: WorkerConfig {
            run: strata::engine::session::RunOptions { threads: 1, context, ..Default::default() },
            keep_alive: KeepAlive::For(Duration::from_secs(300)),
            max_loaded: 2,
            parallel: None,
            prefill_chunk: strata::engine::session::PREFILL_CHUNK,
            kv_memory: None,
            drafts: Default::default(),
        },
        server: ServerConfig::default(),
        queue_depth: 64,
        preload: false,
    }
}

/// Sends one request; returns status, headers and the whole body.
pub async fn send(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes().to_vec();
    (status, headers, body)
}

pub fn post_json(uri: &str, body: serde_json::Value) -> Request<Body> {
    Request::post(uri).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap()
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

pub fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

/// The value of the `/metrics` line that starts with `line` (name, labels and a space).
pub fn metric(metrics: &str, line: &str) -> u64 {
    metrics.lines().find_map(|l| l.strip_prefix(line)).unwrap_or_else(|| panic!("{line}\n{metrics}")).parse().unwrap()
}

/// A streamed body's named events (`event:` and `data:` lines): (name, payload), in order.
pub fn named_events(body: &[u8]) -> Vec<(String, serde_json::Value)> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).expect("an event name").to_string();
            let data: String = e.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            (name, serde_json::from_str(&data).unwrap())
        })
        .collect()
}

/// POSTs `body` to `uri`, asserts a 200, and returns the JSON answer.
pub async fn ok_json(app: &Router, uri: &str, body: serde_json::Value) -> serde_json::Value {
    let (status, _, out) = send(app, post_json(uri, body)).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// POSTs `body` with `"stream": true` to `uri`, asserts a 200 event stream, and returns
/// its named events.
pub async fn ok_events(app: &Router, uri: &str, mut body: serde_json::Value) -> Vec<(String, serde_json::Value)> {
    body["stream"] = serde_json::json!(true);
    let (status, headers, out) = send(app, post_json(uri, body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    named_events(&out)
}

/// `base` with `extra`'s fields added (or replaced).
pub fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    base.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    base
}

/// A greedy `/v1/chat/completions` body of at most 8 tokens, with `extra` fields.
pub fn greedy_chat(model: &str, messages: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    merged(serde_json::json!({"model": model, "messages": messages, "temperature": 0, "max_tokens": 8}), extra)
}
