//! The HTTP server: OpenAI (`/v1/*`) and Ollama (`/api/*`) APIs over the inference queue.
//!
//! Requests are parsed and validated into native types in the handlers
//! ([`openai`], [`ollama`]); nothing past a handler sees JSON. Errors are shaped per route
//! family in [`error`]; auth, CORS, body limits and metrics are layers here.

pub mod anthropic;
pub mod error;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod request_log;
pub mod speculative;
pub mod sse;
pub mod status;
pub mod systemd;
pub mod tools;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::de::DeserializeOwned;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

use crate::queue::QueueHandle;
use crate::queue::models::{ModelInfo, Registry, RegistryError};
use crate::queue::worker::{WorkerConfig, WorkerStatus};
use anyhow::Context;
use error::{ApiError, ErrorKind, Family};
use metrics::Metrics;

/// Settings of the HTTP layer.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Accepted bearer keys; empty: no authentication.
    pub api_keys: Vec<String>,
    /// Extra CORS origins (`*` allows every origin).
    pub allowed_origins: Vec<String>,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// How long SSE/NDJSON streams may stay silent before a keep-alive.
    pub keep_alive_interval: Duration,
    /// `$STRATA_HOME` of the model store whose models are offered too (read at each
    /// request); `None`: only the models the server is started with.
    pub store: Option<PathBuf>,
    /// What `--sparse-ffn` runs models stored with neuron-group bundles with, unless a
    /// request says otherwise (`/api/show` reports it).
    pub sparse_ffn: strata_model::sparse::SparseFfn,
    /// Cut prompts longer than the context on `/v1` (`--truncate-prompts`); the Ollama
    /// routes always do, unless a request says `truncate: false`.
    pub truncate_prompts: bool,
}

impl ServerConfig {
    /// How `/v1` requests treat a prompt longer than the context.
    pub fn v1_truncation(&self) -> Option<crate::queue::Truncation> {
        self.truncate_prompts.then(Default::default)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_keys: Vec::new(),
            allowed_origins: Vec::new(),
            body_limit: 16 << 20,
            keep_alive_interval: Duration::from_secs(15),
            store: None,
            sparse_ffn: Default::default(),
            truncate_prompts: false,
        }
    }
}

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub queue: QueueHandle,
    pub registry: Registry,
    pub status: WorkerStatus,
    pub metrics: Arc<Metrics>,
    pub config: Arc<ServerConfig>,
    /// Keys and origins, which SIGHUP may replace while serving.
    pub access: Arc<RwLock<Access>>,
}

/// Who may call the API: the settings a config reload can change without a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Accepted bearer keys; empty: no authentication.
    pub api_keys: Vec<String>,
    /// Extra CORS origins (`*` allows every origin).
    pub allowed_origins: Vec<String>,
}

impl AppState {
    /// Replaces the accepted keys and origins; requests after this see the new ones.
    pub fn set_access(&self, access: Access) {
        *self.access.write().unwrap_or_else(|e| e.into_inner()) = access;
    }

    fn access(&self) -> std::sync::RwLockReadGuard<'_, Access> {
        self.access.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The model a request names, or 404 `model_not_found`.
    pub fn model(&self, name: &str) -> Result<Arc<ModelInfo>, ApiError> {
        Ok(self.registry.find(name)?)
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::NotFound(name) => ApiError::model_not_found(&name),
            RegistryError::Invalid { param, message } => ApiError::invalid(param, message),
            failed @ RegistryError::Failed { .. } => ApiError::new(ErrorKind::Internal, failed.to_string()),
        }
    }
}

/// Everything needed to start serving.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// (name, spec) pairs; the first is loaded at start and is the default.
    pub models: Vec<(String, String)>,
    pub worker: WorkerConfig,
    pub server: ServerConfig,
    pub queue_depth: usize,
    /// Load the first model before answering `/health` with 200.
    pub preload: bool,
}

/// Reads the models' metadata, starts the worker and builds the router.
pub fn start(opts: ServeOptions) -> anyhow::Result<(Router, AppState, std::thread::JoinHandle<()>)> {
    let registry = match &opts.server.store {
        Some(home) => {
            let store = crate::store::Store::open(home);
            tidy_store(&store);
            Registry::with_store(store)
        }
        None => Registry::default(),
    };
    // One name, one model: a second would replace the first in the registry while the
    // first stayed the default that loads at start.
    let mut named = std::collections::HashMap::new();
    for (name, spec) in &opts.models {
        if let Some(first) = named.insert(crate::queue::models::canonical(name), spec) {
            return Err(strata_model::sparse::Refused(format!(
                "two models are named `{name}` ({first} and {spec}); name one with --model NAME=PATH"
            ))
            .into());
        }
    }
    for (name, spec) in &opts.models {
        let info = ModelInfo::read(name, spec).with_context(|| format!("model `{name}` ({spec})"))?;
        registry.insert(info);
    }
    let status = WorkerStatus::default();
    let preload = opts.preload.then(|| opts.models.first().map(|(n, _)| n.clone())).flatten();
    let (queue, worker) =
        crate::queue::worker::spawn(registry.clone(), opts.worker, status.clone(), opts.queue_depth, preload);
    let access =
        Access { api_keys: opts.server.api_keys.clone(), allowed_origins: opts.server.allowed_origins.clone() };
    let state = AppState {
        queue,
        registry,
        status,
        metrics: Arc::default(),
        config: Arc::new(opts.server),
        access: Arc::new(RwLock::new(access)),
    };
    Ok((router(state.clone()), state, worker))
}

/// Removes what killed writers left in the store and the blobs no model uses (see
/// [`Store::tidy`](crate::store::Store::tidy)); a failure is logged, not fatal.
fn tidy_store(store: &crate::store::Store) {
    match store.tidy(std::time::SystemTime::now()) {
        Ok(t) if t.partials.is_empty() && t.blobs.is_empty() => {}
        Ok(t) => tracing::info!(
            partial_uploads = t.partials.len(),
            unused_blobs = t.blobs.len(),
            blob_bytes = t.blob_bytes,
            "removed from the store: uploads killed mid-way, blobs no model uses"
        ),
        Err(e) => tracing::warn!(error = %e, "tidying the model store failed"),
    }
}

/// Parses a JSON body whatever its Content-Type; errors are 400s naming the field.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid("body", "the request body is empty; expected a JSON object"));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        let what = match std::str::from_utf8(body).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        {
            Some(_) => "the request body must be a JSON object",
            None => "the request body is not valid JSON; expected a JSON object",
        };
        return Err(ApiError::invalid("body", what));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let syntax =
        |inner: serde_json::Error| ApiError::invalid("body", format!("the request body is not valid JSON: {inner}"));
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => syntax(inner),
            _ if path == "." => ApiError::invalid("body", format!("invalid request: {inner}")),
            _ => ApiError::invalid(&path, format!("invalid value for `{path}`: {inner}")),
        }
    })?;
    de.end().map_err(syntax)?;
    Ok(value)
}

/// A response id, `PREFIX…` (`chatcmpl-`, `cmpl-`, `resp_`, `msg_`): microseconds since
/// the epoch and a process-wide counter, in hex.
pub(crate) fn new_id(prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
    let micros = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    format!("{prefix}{micros:x}{n:06x}")
}

/// The family of a path: `/v1/messages...` answers in the Anthropic shape, the rest of
/// `/v1/...` in the OpenAI shape, everything else in Ollama's.
pub fn family_of(path: &str) -> Family {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Family::Anthropic
    } else if path.starts_with("/v1") {
        Family::OpenAi
    } else {
        Family::Ollama
    }
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.body_limit;
    let api = Router::new()
        .route("/", get(root).head(root))
        .route("/health", get(health))
        .route("/metrics", get(metrics::render))
        .merge(openai::routes())
        .merge(anthropic::routes())
        .merge(ollama::routes())
        .merge(status::routes())
        .merge(openapi::routes())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), shape_errors))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), refuse_other_sites))
        .layer(middleware::from_fn_with_state(state.clone(), metrics::record))
        .layer(cors(state.access.clone()))
        .layer(middleware::from_fn(request_log::log_failures))
        .layer(
            // Failed requests have their line from `request_log`; tower's own are debug.
            tower_http::trace::TraceLayer::new_for_http()
                .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        );
    api.with_state(state)
}

/// Liveness for Ollama clients.
#[utoipa::path(get, path = "/", tag = "server", responses((status = 200, description = "Strata is running", body = String)))]

pub(crate) async fn root() -> &'static str {
    "Strata is running"
}

/// Readiness: 200 once the startup model is loaded, 503 before. `device` is where the
/// most recently loaded model runs (`cpu` or `cuda:N`), `device_name` the processor or
/// GPU; both are absent until a model has loaded.
#[utoipa::path(get, path = "/health", tag = "server", responses(
    (status = 200, description = "ready", body = serde_json::Value,
        example = json!({"status": "ok", "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"})),
    (status = 503, description = "loading", body = serde_json::Value, example = json!({"status": "loading"}))))]

pub(crate) async fn health(State(state): State<AppState>) -> Response {
    let (code, status) = match state.status.ready.load(Ordering::SeqCst) {
        true => (StatusCode::OK, "ok"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
    };
    let mut body = serde_json::json!({ "status": status });
    if let Some(d) = state.status.device.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        body["device"] = d.device.into();
        body["device_name"] = d.name.into();
    }
    (code, axum::Json(body)).into_response()
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(ErrorKind::NotFound, format!("no route for {} {path}", req.method()))
        .into_response_for(family_of(&path))
}

/// Rewrites the plain-text errors axum and tower produce (405, 413, 415, ...) into the
/// JSON shape of the route's family.
async fn shape_errors(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let kind = match status {
        StatusCode::METHOD_NOT_ALLOWED => ErrorKind::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::PayloadTooLarge,
        StatusCode::NOT_FOUND => ErrorKind::NotFound,
        s if s.is_client_error() => ErrorKind::InvalidRequest,
        _ => ErrorKind::Internal,
    };
    let message = match kind {
        ErrorKind::MethodNotAllowed => format!("method {method} is not allowed on {path}"),
        ErrorKind::PayloadTooLarge => "the request body is too large".to_string(),
        _ => {
            let bytes = axum::body::to_bytes(resp.into_body(), 64 << 10).await.unwrap_or_else(|_| Bytes::new());
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
    };
    let mut out = ApiError::new(kind, message).into_response_for(family_of(&path));
    *out.status_mut() = status;
    out
}

/// Bearer-key authentication when keys are configured; `/`, `/health` and CORS
/// preflights are exempt. Keys are compared in constant time.
async fn authenticate(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // The status page itself asks for the key its data needs.
    let exempt = path == "/" || path == "/health" || path == "/ui" || req.method() == Method::OPTIONS;
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        // Anthropic's SDK sends its key as `x-api-key`.
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    let allowed = {
        let keys = &state.access().api_keys;
        exempt
            || keys.is_empty()
            || given.is_some_and(|given| {
                use subtle::ConstantTimeEq;
                // Every key is compared, so the time taken does not reveal which one matched.
                let ok = keys.iter().fold(subtle::Choice::from(0), |acc, k| acc | k.as_bytes().ct_eq(given.as_bytes()));
                bool::from(ok)
            })
    };
    if allowed {
        return next.run(req).await;
    }
    let family = family_of(path);
    let mut resp = ApiError::new(
        ErrorKind::Authentication,
        "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)",
    )
    .into_response_for(family);
    resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// The credentials of an `Authorization: Bearer KEY` header; the scheme's case does not
/// matter (RFC 7235), and spaces or tabs may separate it from the key.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once([' ', '\t'])?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Refuses what a browser sends from a page of another site. CORS only keeps such a page
/// from reading the answer: the request itself still runs, and a POST with a plain-text
/// body needs no preflight, so any web page could create, pull or delete models, or keep
/// the model busy. A request with an `Origin` is let through when [`origin_allowed`]
/// allows it, or when it is this server's own page ([`own_page`]); preflights are the
/// CORS layer's. Clients that are not browsers send no `Origin`.
async fn refuse_other_sites(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(origin) = req.headers().get(header::ORIGIN).filter(|_| req.method() != Method::OPTIONS) else {
        return next.run(req).await;
    };
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    let allowed = origin
        .to_str()
        .is_ok_and(|o| origin_allowed(o, &state.access().allowed_origins) || host.is_some_and(|h| own_page(o, h)));
    if allowed {
        return next.run(req).await;
    }
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    ApiError::new(
        ErrorKind::Forbidden,
        format!(
            "requests from web pages at {origin} are not allowed (start the server with `--allow-origin {origin}` to \
             allow them)"
        ),
    )
    .into_response_for(family_of(req.uri().path()))
}

/// Whether `origin` is a page this server served: the address the request was sent to
/// (`host`, its `Host` header), when that names the machine by an IP address, as
/// `localhost` or by its host name. Never another DNS name, which a page of another
/// site could point at this machine (DNS rebinding) to pass as same-origin.
fn own_page(origin: &str, host: &str) -> bool {
    let Some(authority) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
        return false;
    };
    if !authority.eq_ignore_ascii_case(host) {
        return false;
    }
    let name = match host.strip_prefix('[') {
        Some(v6) => return v6.split_once(']').is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name).to_ascii_lowercase(),
    };
    static MACHINE: std::sync::LazyLock<Option<String>> = std::sync::LazyLock::new(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_ascii_lowercase())
    });
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || MACHINE.as_deref().is_some_and(|m| !m.is_empty() && (name == m || name == format!("{m}.local")))
}

/// Origins that may call the API from a browser by default: local pages and desktop
/// app shells.
pub fn origin_allowed(origin: &str, extra: &[String]) -> bool {
    if extra.iter().any(|o| o == "*" || o == origin) {
        return true;
    }
    for scheme in ["app://", "file://", "tauri://", "vscode-webview://"] {
        if origin.starts_with(scheme) {
            return true;
        }
    }
    let Some(rest) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
        return false;
    };
    let (host, port) = match rest.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, after)) => (format!("[{h}]"), after),
            None => return false,
        },
        None => match rest.split_once(':') {
            Some((h, _)) => (h.to_string(), &rest[h.len()..]),
            None => (rest.to_string(), ""),
        },
    };
    let port_ok = port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok());
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]") && port_ok
}

fn cors(access: Arc<RwLock<Access>>) -> CorsLayer {
    let mut headers: Vec<header::HeaderName> = vec![header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT];
    for h in [
        "x-stainless-arch",
        "x-stainless-async",
        "x-stainless-custom-poll-interval",
        "x-stainless-helper-method",
        "x-stainless-lang",
        "x-stainless-os",
        "x-stainless-package-version",
        "x-stainless-poll-helper",
        "x-stainless-retry-count",
        "x-stainless-runtime",
        "x-stainless-runtime-version",
        "x-stainless-timeout",
        "x-stainless-read-timeout",
        "openai-organization",
        "openai-project",
        "x-api-key",
        "anthropic-version",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "user-agent",
    ] {
        headers.push(header::HeaderName::from_static(h));
    }
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, _| {
            let access = access.read().unwrap_or_else(|e| e.into_inner());
            origin.to_str().is_ok_and(|o| origin_allowed(o, &access.allowed_origins))
        }))
        .allow_methods(AllowMethods::list([Method::GET, Method::POST, Method::DELETE, Method::HEAD, Method::OPTIONS]))
        .allow_headers(AllowHeaders::list(headers))
        .max_age(Duration::from_secs(3600))
}

/// A response body that streams `lines` (already framed) and keeps the job's receiver
/// alive only as long as the client reads.
pub fn streaming_body<S>(stream: S) -> Body
where
    S: futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
{
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_origins() {
        let ok = |o: &str| origin_allowed(o, &[]);
        assert!(ok("http://localhost"));
        assert!(ok("http://localhost:3000"));
        assert!(ok("https://127.0.0.1:8080"));
        assert!(ok("http://[::1]:5173"));
        assert!(ok("app://obsidian.md"));
        assert!(ok("vscode-webview://abc"));
        assert!(!ok("http://localhost.evil.com"));
        assert!(!ok("http://evil.com"));
        assert!(!ok("http://127.0.0.1.evil.com:80"));
        assert!(!ok("null"));
        assert!(origin_allowed("https://chat.example", &["https://chat.example".into()]));
        assert!(origin_allowed("https://any.example", &["*".into()]));
    }

    #[test]
    fn a_page_of_this_server_is_its_own_origin_when_named_by_address() {
        assert!(own_page("http://192.168.1.5:11434", "192.168.1.5:11434"));
        assert!(own_page("http://[fe80::1]:8000", "[fe80::1]:8000"));
        assert!(own_page("https://box.localhost", "box.localhost"));
        // A DNS name may be anyone's (rebinding), another port is another origin.
        assert!(!own_page("http://evil.example:11434", "evil.example:11434"));
        assert!(!own_page("http://192.168.1.5:8080", "192.168.1.5:11434"));
        assert!(!own_page("null", "127.0.0.1:11434"));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for header in ["Bearer k1", "bearer k1", "BEARER k1", "BeArEr  k1", "Bearer\tk1"] {
            assert_eq!(bearer_token(header).map(str::trim), Some("k1"), "{header:?}");
        }
        for header in ["Basic k1", "Bearerk1", "Bearer", "k1", "Bear k1"] {
            assert_eq!(bearer_token(header), None, "{header:?}");
        }
    }

    #[test]
    fn json_errors_name_the_field() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct R {
            model: String,
            n: Option<u32>,
        }
        let e = parse_json::<R>(br#"{"model": "x", "n": "two"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = parse_json::<R>(br#"{"n": 1}"#).unwrap_err();
        assert!(e.message.contains("model"), "{}", e.message);
        let e = parse_json::<R>(b"{\"model\": \"\xff\"}").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(parse_json::<R>(b"").is_err());
        let deep = "[".repeat(100_000);
        assert!(parse_json::<serde_json::Value>(deep.as_bytes()).is_err());
    }
}
