//! Malformed and hostile requests against both APIs: each gets the exact status and
//! error body of its route family, and the server keeps answering good requests.
//! Also bursts of concurrent requests: a deep queue serves them all, a shallow one
//! sheds load with 429 (OpenAI) / 503 (Ollama) and `Retry-After`, never a 500.

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use strata::server::ServerConfig;

use common::{app, app_with, json, post_json, send};

/// How a row checks the error message.
#[derive(Clone, Copy, Debug)]
enum Msg {
    Exact(&'static str),
    /// A stable part of it (serde's wording after it may change).
    Contains(&'static str),
}

/// The error body a row expects.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// `{"error":{"message","type","param","code"}}`
    OpenAi { r#type: &'static str, param: Option<&'static str>, code: Option<&'static str>, msg: Msg },
    /// `{"error":"..."}`
    Ollama(Msg),
}

struct Row {
    name: &'static str,
    method: &'static str,
    uri: &'static str,
    body: Vec<u8>,
    status: StatusCode,
    want: Want,
}

const INVALID: &str = "invalid_request_error";

fn oa(param: Option<&'static str>, msg: Msg) -> Want {
    Want::OpenAi { r#type: INVALID, param, code: None, msg }
}

fn row(name: &'static str, uri: &'static str, body: impl Into<Vec<u8>>, status: u16, want: Want) -> Row {
    Row { name, method: "POST", uri, body: body.into(), status: StatusCode::from_u16(status).unwrap(), want }
}

fn js(v: Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// A chat request with `extra` merged in.
fn chat(extra: Value) -> Vec<u8> {
    let mut v = json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    js(v)
}

/// An Ollama generate request with `options` set.
fn generate_with(options: Value) -> Vec<u8> {
    js(json!({"model": "llama3", "prompt": "hi", "stream": false, "options": options}))
}

/// `{"model": "llama3", "prompt": "aaaa…"}` of about `len` bytes.
fn huge(len: usize) -> Vec<u8> {
    let mut body = br#"{"model":"llama3","prompt":""#.to_vec();
    body.resize(len, b'a');
    body.extend_from_slice(br#""}"#);
    body
}

#[rustfmt::skip]
fn rows() -> Vec<Row> {
    use Msg::{Contains, Exact};
    let not_json = Contains("the request body is not valid JSON");
    let empty = Exact("the request body is empty; expected a JSON object");
    let too_large = Exact("the request body is too large");
    let forty_mib = huge(40 << 20);
    let deep = "[".repeat(100_000).into_bytes();
    // Closed, in a field: skipped (unknown) or refused (known), without a stack overflow.
    let deep_in = |field: &str| format!(r#"{{"model": "llama3", "{field}": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
    let bad_utf8 = b"{\"model\": \"llama3\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec();
    vec![
        // ---- OpenAI: syntax and shape -------------------------------------------------
        // A syntax error is the body's, wherever the parser stopped.
        row("oa bad json", "/v1/chat/completions", r#"{"model": "llama3", "messages": ["#, 400, oa(Some("body"), not_json)),
        row("oa bad json at the top", "/v1/completions", "{model: llama3}", 400, oa(Some("body"), not_json)),
        row("oa empty body", "/v1/chat/completions", "", 400, oa(Some("body"), empty)),
        row("oa whitespace body", "/v1/completions", " \n\t ", 400, oa(Some("body"), empty)),
        // serde reads a struct from an array too (positionally); a body must be an object.
        row("oa array body", "/v1/chat/completions", "[]", 400, oa(Some("body"), Contains("JSON object"))),
        row("oa positional array body", "/v1/embeddings", r#"["llama3", "hi"]"#, 400, oa(Some("body"), Contains("JSON object"))),
        row("oa string body", "/v1/embeddings", r#""hello""#, 400, oa(Some("body"), Contains("JSON object"))),
        row("oa null body", "/v1/completions", "null", 400, oa(Some("body"), Contains("JSON object"))),
        row("oa deep nesting", "/v1/chat/completions", deep.clone(), 400, oa(Some("body"), Contains("JSON object"))),
        row("oa deep nesting, unknown field", "/v1/chat/completions", deep_in("x"), 400, oa(Some("messages"), Exact("`messages` is required"))),
        row("oa deep nesting, known field", "/v1/chat/completions", deep_in("messages"), 400, oa(Some("messages[0][0]"), Contains("invalid type: sequence"))),
        row("oa invalid utf-8", "/v1/chat/completions", bad_utf8.clone(), 400, oa(Some("body"), Contains("invalid unicode code point"))),
        row("oa trailing garbage", "/v1/completions", r#"{"model": "llama3", "prompt": "hi", "max_tokens": 1} x"#, 400, oa(Some("body"), Contains("the request body is not valid JSON: trailing characters"))),
        row("oa two objects", "/v1/embeddings", r#"{"model": "llama3", "input": "hi"}{"model": "nope"}"#, 400, oa(Some("body"), Contains("the request body is not valid JSON: trailing characters"))),
        // ---- OpenAI: missing fields and wrong types -----------------------------------
        row("oa missing messages", "/v1/chat/completions", js(json!({"model": "llama3"})), 400, oa(Some("messages"), Exact("`messages` is required"))),
        row("oa messages not a list", "/v1/chat/completions", chat(json!({"messages": "hi"})), 400, oa(Some("messages"), Contains("invalid value for `messages`: invalid type: string"))),
        row("oa empty messages", "/v1/chat/completions", chat(json!({"messages": []})), 400, oa(Some("messages"), Exact("`messages` must hold at least one message"))),
        row("oa message without role", "/v1/chat/completions", chat(json!({"messages": [{"content": "hi"}]})), 400, oa(Some("messages[0]"), Contains("invalid value for `messages[0]`: missing field `role`"))),
        row("oa unknown role", "/v1/chat/completions", chat(json!({"messages": [{"role": "wizard", "content": "hi"}]})), 400, oa(Some("messages[0].role"), Exact("`messages[0].role`: unknown role `wizard`; expected system, developer, user, assistant, tool or ipython"))),
        row("oa temperature as string", "/v1/chat/completions", chat(json!({"temperature": "hot"})), 400, oa(Some("temperature"), Contains("invalid value for `temperature`: invalid type: string"))),
        row("oa max_tokens negative", "/v1/chat/completions", chat(json!({"max_tokens": -5})), 400, oa(Some("max_tokens"), Exact("`max_tokens` must be at least 1"))),
        row("oa stream as string", "/v1/chat/completions", chat(json!({"stream": "yes"})), 400, oa(Some("stream"), Contains("invalid value for `stream`: invalid type: string"))),
        row("oa stop as number", "/v1/chat/completions", chat(json!({"stop": 7})), 400, oa(Some("stop"), Contains("invalid value for `stop`"))),
        row("oa missing prompt", "/v1/completions", js(json!({"model": "llama3"})), 400, oa(Some("prompt"), Exact("`prompt` is required"))),
        row("oa prompt as object", "/v1/completions", js(json!({"model": "llama3", "prompt": {"text": "hi"}})), 400, oa(Some("prompt"), Contains("invalid value for `prompt`"))),
        row("oa missing input", "/v1/embeddings", js(json!({"model": "llama3"})), 400, oa(Some("input"), Exact("`input` is required"))),
        // ---- OpenAI: out of range ------------------------------------------------------
        row("oa temperature -1", "/v1/chat/completions", chat(json!({"temperature": -1})), 400, oa(Some("temperature"), Exact("`temperature` must be in [0, 2]"))),
        row("oa top_p 0", "/v1/chat/completions", chat(json!({"top_p": 0})), 400, oa(Some("top_p"), Exact("`top_p` must be in (0, 1]"))),
        row("oa top_p 5", "/v1/completions", js(json!({"model": "llama3", "prompt": "hi", "top_p": 5})), 400, oa(Some("top_p"), Exact("`top_p` must be in (0, 1]"))),
        row("oa max_tokens 0", "/v1/chat/completions", chat(json!({"max_tokens": 0})), 400, oa(Some("max_tokens"), Exact("`max_tokens` must be at least 1"))),
        row("oa top_logprobs 21", "/v1/chat/completions", chat(json!({"logprobs": true, "top_logprobs": 21})), 400, oa(Some("top_logprobs"), Exact("`top_logprobs` must be in [0, 20]"))),
        row("oa n 17", "/v1/chat/completions", chat(json!({"n": 17})), 400, oa(Some("n"), Exact("`n` must be at least 1, and at most 16 choices in all"))),
        row("oa n 9 over 2 prompts", "/v1/completions", js(json!({"model": "llama3", "prompt": ["a", "b"], "n": 9})), 400, oa(Some("n"), Exact("`n` must be at least 1, and at most 16 choices in all over 2 prompts"))),
        row("oa presence_penalty 3", "/v1/chat/completions", chat(json!({"presence_penalty": 3})), 400, oa(Some("presence_penalty"), Exact("`presence_penalty` must be in [-2, 2]"))),
        row("oa embeddings empty input", "/v1/embeddings", js(json!({"model": "llama3", "input": []})), 400, oa(Some("input"), Exact("`input` is empty"))),
        row("oa encoding_format hex", "/v1/embeddings", js(json!({"model": "llama3", "input": "hi", "encoding_format": "hex"})), 400, oa(Some("encoding_format"), Exact("unknown `encoding_format` `hex`; expected float or base64"))),
        // ---- OpenAI: routing, size, models -------------------------------------------
        row(
            "oa unknown model",
            "/v1/chat/completions",
            chat(json!({"model": "nope"})),
            404,
            Want::OpenAi { r#type: INVALID, param: Some("model"), code: Some("model_not_found"), msg: Exact("model 'nope' not found") },
        ),
        row(
            "oa unknown model (embeddings)",
            "/v1/embeddings",
            js(json!({"model": "nope", "input": "hi"})),
            404,
            Want::OpenAi { r#type: INVALID, param: Some("model"), code: Some("model_not_found"), msg: Exact("model 'nope' not found") },
        ),
        Row {
            name: "oa unknown model id",
            method: "GET",
            uri: "/v1/models/nope",
            body: Vec::new(),
            status: StatusCode::NOT_FOUND,
            want: Want::OpenAi { r#type: INVALID, param: Some("id"), code: Some("model_not_found"), msg: Exact("model 'nope' not found") },
        },
        row(
            "oa 40 MiB body",
            "/v1/completions",
            forty_mib.clone(),
            413,
            Want::OpenAi { r#type: INVALID, param: None, code: Some("request_too_large"), msg: too_large },
        ),
        Row {
            name: "oa wrong method",
            method: "GET",
            uri: "/v1/chat/completions",
            body: Vec::new(),
            status: StatusCode::METHOD_NOT_ALLOWED,
            want: Want::OpenAi {
                r#type: INVALID,
                param: None,
                code: Some("method_not_allowed"),
                msg: Exact("method GET is not allowed on /v1/chat/completions"),
            },
        },
        Row {
            name: "oa wrong method (delete models)",
            method: "DELETE",
            uri: "/v1/models",
            body: Vec::new(),
            status: StatusCode::METHOD_NOT_ALLOWED,
            want: Want::OpenAi {
                r#type: INVALID,
                param: None,
                code: Some("method_not_allowed"),
                msg: Exact("method DELETE is not allowed on /v1/models"),
            },
        },
        row(
            "oa unknown route",
            "/v1/chat/complete",
            chat(json!({})),
            404,
            Want::OpenAi { r#type: INVALID, param: None, code: Some("not_found"), msg: Exact("no route for POST /v1/chat/complete") },
        ),
        // ---- Ollama -------------------------------------------------------------------
        row("ol bad json", "/api/generate", r#"{"model": "llama3", "prompt": "#, 400, Want::Ollama(not_json)),
        row("ol empty body", "/api/chat", "", 400, Want::Ollama(empty)),
        row("ol array body", "/api/chat", "[1, 2]", 400, Want::Ollama(Contains("JSON object"))),
        row("ol positional array body", "/api/show", r#"["llama3", null, null]"#, 400, Want::Ollama(Contains("JSON object"))),
        row("ol deep nesting", "/api/generate", deep, 400, Want::Ollama(Contains("JSON object"))),
        row("ol deep nesting, known field", "/api/chat", deep_in("messages"), 400, Want::Ollama(Contains("invalid value for `messages[0][0]`"))),
        row("ol trailing garbage", "/api/show", r#"{"model": "llama3"} x"#, 400, Want::Ollama(Contains("the request body is not valid JSON: trailing characters"))),
        row("ol invalid utf-8", "/api/chat", bad_utf8, 400, Want::Ollama(Contains("invalid unicode code point"))),
        row("ol missing model", "/api/generate", js(json!({"prompt": "hi"})), 400, Want::Ollama(Contains("missing field `model`"))),
        row("ol messages not a list", "/api/chat", js(json!({"model": "llama3", "messages": {"role": "user"}})), 400, Want::Ollama(Contains("invalid value for `messages`: invalid type: map"))),
        row("ol num_predict as string", "/api/generate", generate_with(json!({"num_predict": "five"})), 400, Want::Ollama(Contains("invalid value for `options.num_predict`: invalid type: string"))),
        // Ollama takes temperature <= 0 as greedy (llama.cpp's rule), so only its type is checked.
        row("ol temperature as string", "/api/generate", generate_with(json!({"temperature": "hot"})), 400, Want::Ollama(Contains("invalid value for `options.temperature`"))),
        row("ol top_p 0", "/api/generate", generate_with(json!({"top_p": 0})), 400, Want::Ollama(Exact("`options.top_p` must be in (0, 1]"))),
        row("ol num_ctx 0", "/api/generate", generate_with(json!({"num_ctx": 0})), 400, Want::Ollama(Exact("`options.num_ctx` must be at least 1"))),
        row("ol options not an object", "/api/generate", generate_with(json!([1])), 400, Want::Ollama(Contains("invalid value for `options`"))),
        row("ol keep_alive as bool", "/api/generate", js(json!({"model": "llama3", "prompt": "hi", "keep_alive": true})), 400, Want::Ollama(Exact("invalid `keep_alive`: must be a duration string such as \"5m\" or a number of seconds"))),
        // A missing `input` loads the model (Ollama's preload), so only a wrong one is an error.
        row("ol embed input as number", "/api/embed", js(json!({"model": "llama3", "input": 5})), 400, Want::Ollama(Contains("invalid value for `input`"))),
        row("ol copy missing destination", "/api/copy", js(json!({"source": "llama3"})), 400, Want::Ollama(Contains("missing field `destination`"))),
        row("ol unknown model (chat)", "/api/chat", js(json!({"model": "nope", "messages": []})), 404, Want::Ollama(Exact("model 'nope' not found"))),
        row("ol unknown model (generate)", "/api/generate", js(json!({"model": "nope", "prompt": "hi"})), 404, Want::Ollama(Exact("model 'nope' not found"))),
        row("ol unknown model (show)", "/api/show", js(json!({"model": "nope"})), 404, Want::Ollama(Exact("model 'nope' not found"))),
        Row {
            name: "ol unknown model (delete)",
            method: "DELETE",
            uri: "/api/delete",
            body: js(json!({"model": "nope"})),
            status: StatusCode::NOT_FOUND,
            want: Want::Ollama(Exact("model 'nope' not found")),
        },
        row("ol 40 MiB body", "/api/generate", forty_mib, 413, Want::Ollama(too_large)),
        row("ol wrong method", "/api/tags", "", 405, Want::Ollama(Exact("method POST is not allowed on /api/tags"))),
        Row {
            name: "ol wrong method (get generate)",
            method: "GET",
            uri: "/api/generate",
            body: Vec::new(),
            status: StatusCode::METHOD_NOT_ALLOWED,
            want: Want::Ollama(Exact("method GET is not allowed on /api/generate")),
        },
        Row {
            name: "ol unknown route",
            method: "GET",
            uri: "/api/nope",
            body: Vec::new(),
            status: StatusCode::NOT_FOUND,
            want: Want::Ollama(Exact("no route for GET /api/nope")),
        },
    ]
}

fn request(r: &Row) -> Request<Body> {
    let mut b = Request::builder().method(r.method).uri(r.uri);
    if !r.body.is_empty() {
        b = b.header("content-type", "application/json");
    }
    b.body(Body::from(r.body.clone())).unwrap()
}

/// `Err` naming the row and the field when `got != want`.
fn same(row: &str, what: &str, got: &Value, want: Value, body: &Value) -> Result<(), String> {
    match *got == want {
        true => Ok(()),
        false => Err(format!("{row}: {what} is {got}, want {want} — body {body}")),
    }
}

fn check(r: &Row, status: StatusCode, body: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(body);
    if status != r.status {
        return Err(format!("{}: status {status}, want {} — body {text}", r.name, r.status));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("{}: body is not JSON ({e}): {text}", r.name))?;
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    let (message, msg) = match r.want {
        Want::OpenAi { r#type, param, code, msg } => {
            let e = &v["error"];
            same(r.name, "the error's fields", &json!(keys(e)), json!(["message", "type", "param", "code"]), &v)?;
            same(r.name, "type", &e["type"], json!(r#type), &v)?;
            same(r.name, "param", &e["param"], json!(param), &v)?;
            same(r.name, "code", &e["code"], json!(code), &v)?;
            (e["message"].as_str(), msg)
        }
        Want::Ollama(msg) => {
            same(r.name, "the body's fields", &json!(keys(&v)), json!(["error"]), &v)?;
            (v["error"].as_str(), msg)
        }
    };
    let message = message.ok_or_else(|| format!("{}: the message is not a string: {v}", r.name))?;
    match msg {
        Msg::Exact(want) if message != want => Err(format!("{}: message {message:?}, want {want:?}", r.name)),
        Msg::Contains(part) if !message.contains(part) => {
            Err(format!("{}: message {message:?} lacks {part:?}", r.name))
        }
        _ => Ok(()),
    }
}

#[tokio::test]
async fn malformed_requests_get_exact_errors_and_the_server_keeps_serving() {
    let (router, _state) = app();
    let rows = rows();
    assert!(rows.len() >= 30);
    let mut failures = Vec::new();
    for r in &rows {
        let (status, _, body) = send(&router, request(r)).await;
        if let Err(e) = check(r, status, &body) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), rows.len(), failures.join("\n"));

    // Still serving, on both APIs.
    let (status, _, body) = send(&router, chat_request()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["object"], "chat.completion");
    let (status, _, body) = send(&router, generate_request()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["done"], true);
}

/// `n` requests at once (released together by a barrier); returns (status, Retry-After,
/// body) of each.
async fn burst(
    router: &axum::Router,
    n: usize,
    make: fn() -> Request<Body>,
) -> Vec<(StatusCode, Option<String>, Vec<u8>)> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (router, barrier) = (router.clone(), barrier.clone());
            tokio::spawn(async move {
                let req = make();
                barrier.wait().await;
                let (status, headers, body) = send(&router, req).await;
                let retry = headers.get("retry-after").map(|v| v.to_str().unwrap_or("?").to_string());
                (status, retry, body)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("the request task panicked"));
    }
    out
}

fn chat_request() -> Request<Body> {
    post_json(
        "/v1/chat/completions",
        json!({
            "model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4
        }),
    )
}

fn generate_request() -> Request<Body> {
    post_json(
        "/api/generate",
        json!({"model": "llama3", "prompt": "hi", "stream": false, "options": {"num_predict": 4}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deep_queue_serves_a_burst() {
    let (router, _state) = app_with(ServerConfig::default(), 64);
    let results = burst(&router, 16, chat_request).await;
    for (status, _, body) in &results {
        assert_eq!(*status, StatusCode::OK, "{}", String::from_utf8_lossy(body));
        let v = json(body);
        assert!(v["usage"]["completion_tokens"].as_u64().is_some_and(|n| (1..=4).contains(&n)), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shallow_queue_sheds_a_burst_with_retry_after() {
    let (router, _state) = app_with(ServerConfig::default(), 2);

    let results = burst(&router, 32, chat_request).await;
    let mut shed = 0;
    for (status, retry, body) in &results {
        assert!(!status.is_server_error(), "{status}: {}", String::from_utf8_lossy(body));
        match *status {
            StatusCode::OK => assert_eq!(json(body)["object"], "chat.completion"),
            StatusCode::TOO_MANY_REQUESTS => {
                shed += 1;
                assert_eq!(retry.as_deref(), Some("1"));
                assert_eq!(
                    json(body),
                    json!({"error": {
                        "message": "the request queue is full; retry shortly",
                        "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"
                    }})
                );
            }
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(body)),
        }
    }
    eprintln!("queue of 2: {shed} of 32 chat requests refused");
    assert!(shed > 0, "32 requests at once against a queue of 2: some must be refused");
    assert!(shed < 32, "the first requests are served");

    // Ollama answers a full queue with 503 (what its clients retry on), also with Retry-After.
    let results = burst(&router, 32, generate_request).await;
    let mut shed = 0;
    for (status, retry, body) in &results {
        match *status {
            StatusCode::OK => assert_eq!(json(body)["done"], true),
            StatusCode::SERVICE_UNAVAILABLE => {
                shed += 1;
                assert_eq!(retry.as_deref(), Some("1"));
                assert_eq!(json(body), json!({"error": "the request queue is full; retry shortly"}));
            }
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(body)),
        }
    }
    assert!(shed > 0 && shed < 32, "{shed} of 32 shed");

    // Once the burst is over, the server serves again.
    let (status, _, body) = send(&router, chat_request()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
}

/// A request a browser sends from a page of another site is refused (403) before it
/// runs, whatever its content type; allowed origins, the server's own page named by its
/// address, and clients that send no `Origin` are served; preflights stay CORS's.
#[tokio::test]
async fn pages_of_other_sites_cannot_use_the_api() {
    let home = std::env::temp_dir().join(format!("strata-http-origin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let config = ServerConfig {
        store: Some(home.clone()),
        allowed_origins: vec!["https://chat.example".into()],
        ..ServerConfig::default()
    };
    let (app, _) = app_with(config, 64);
    let create = r#"{"model": "evil", "from": "llama3", "stream": false}"#;
    let request = |origin: Option<&str>, host: &str, uri: &str, body: &str| {
        let mut r =
            Request::builder().method("POST").uri(uri).header("content-type", "text/plain").header("host", host);
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        r.body(Body::from(body.to_string())).unwrap()
    };
    // DNS rebinding: the page's own name, pointed at this machine, is still another site.
    for (origin, host) in [
        ("http://evil.example", "127.0.0.1:11434"),
        ("http://evil.example:11434", "evil.example:11434"),
        ("null", "127.0.0.1:11434"),
    ] {
        let (status, _, out) = send(&app, request(Some(origin), host, "/api/create", create)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{origin}");
        assert!(json(&out)["error"].as_str().unwrap().contains("--allow-origin"), "{origin}");
        let chat = r#"{"model": "llama3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}"#;
        let (status, _, out) = send(&app, request(Some(origin), host, "/v1/chat/completions", chat)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{origin}");
        assert_eq!(json(&out)["error"]["code"], "origin_not_allowed");
    }
    let (status, _, out) = send(&app, post_json("/api/show", json!({"model": "evil"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created: {}", String::from_utf8_lossy(&out));

    let served = [
        (None, "127.0.0.1:11434"),
        (Some("http://localhost:3000"), "127.0.0.1:11434"),
        (Some("https://chat.example"), "strata.example"),
        (Some("http://192.168.1.5:11434"), "192.168.1.5:11434"),
    ];
    for (origin, host) in served {
        let (status, _, out) = send(&app, request(origin, host, "/api/create", create)).await;
        assert_eq!(status, StatusCode::OK, "{origin:?}: {}", String::from_utf8_lossy(&out));
    }
    let preflight = Request::builder()
        .method("OPTIONS")
        .uri("/api/create")
        .header("origin", "http://evil.example")
        .header("access-control-request-method", "POST")
        .body(Body::empty())
        .unwrap();
    let (status, headers, _) = send(&app, preflight).await;
    assert!(status.is_success(), "{status}");
    assert!(headers.get("access-control-allow-origin").is_none());
    let _ = std::fs::remove_dir_all(&home);
}

/// With keys set, the bearer scheme may come in any case (RFC 7235); `/`, `/health` and
/// the status page `/ui` need no key, and `/metrics`, `/docs` and `/openapi.json` do.
#[tokio::test]
async fn the_key_is_checked_on_every_route_but_the_exempt_ones_whatever_the_scheme_case() {
    let (app, _) = app_with(ServerConfig { api_keys: vec!["sk-1".into()], ..ServerConfig::default() }, 8);
    let get = |uri: &str, auth: Option<&str>| {
        let mut r = Request::builder().uri(uri);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.body(Body::empty()).unwrap()
    };
    for auth in ["Bearer sk-1", "bearer sk-1", "BEARER sk-1", "bEaReR   sk-1"] {
        assert_eq!(send(&app, get("/v1/models", Some(auth))).await.0, StatusCode::OK, "{auth}");
    }
    for auth in [None, Some("Bearer sk-2"), Some("Basic sk-1"), Some("sk-1")] {
        assert_eq!(send(&app, get("/v1/models", auth)).await.0, StatusCode::UNAUTHORIZED, "{auth:?}");
    }
    for exempt in ["/", "/health", "/ui"] {
        assert_ne!(send(&app, get(exempt, None)).await.0, StatusCode::UNAUTHORIZED, "{exempt}");
    }
    for guarded in ["/metrics", "/docs/", "/openapi.json", "/api/tags", "/api/strata/status"] {
        assert_eq!(send(&app, get(guarded, None)).await.0, StatusCode::UNAUTHORIZED, "{guarded}");
        assert_ne!(send(&app, get(guarded, Some("BEARER sk-1"))).await.0, StatusCode::UNAUTHORIZED, "{guarded}");
    }
}

/// Two models started under one name (`a` and `a:latest` are one) are refused: the second
/// would replace the first, which stayed the default loaded at start.
#[test]
fn two_models_under_one_name_are_refused_at_start() {
    let opts = |second: &str| {
        common::serve_options(&[("m", common::fixture("llama3")), (second, common::fixture("qwen3"))], 256)
    };
    for second in ["m", "m:latest"] {
        let err = strata::server::start(opts(second)).err().expect("refused");
        let msg = format!("{err:#}");
        assert!(msg.contains("two models are named") && msg.contains("qwen3"), "{msg}");
        assert!(strata::cli::refused_in_chain(&err), "a usage error: {msg}");
    }
    assert!(strata::server::start(opts("n")).is_ok());
}

/// A raw HTTP/1.1 response on `s`: its status code, once its head and `Content-Length`
/// body have arrived; 0 if the connection closed (or stayed silent for 10 s) first.
fn read_response(s: &mut std::net::TcpStream) -> u16 {
    use std::io::Read;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return 0,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Whether the server has closed `s` (EOF or a reset), without waiting.
fn closed(s: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
        }
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// Whether the server closes `s` within `within`.
fn closed_within(s: &mut std::net::TcpStream, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if closed(s) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    closed(s)
}

/// `router` served on a local port within `limits`; the sender stops it.
async fn listen(
    router: axum::Router,
    limits: strata::server::listen::ConnLimits,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    (addr, stop, tokio::spawn(strata::server::listen::serve(listener, router, limits, shutdown)))
}

/// Idle connections beyond `--max-connections` make room for new ones (the one waiting
/// longest goes), so 200 idle sockets against a cap of 64 leave `/health` answering;
/// a shutdown with idle connections open returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_over_the_cap_cannot_keep_health_out() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::Duration;
    let (app, _) = common::app();
    let hour = Some(Duration::from_secs(3600));
    let limits = strata::server::listen::ConnLimits { header_timeout: hour, idle_timeout: hour, max_connections: 64 };
    let (addr, stop, server) = listen(app, limits).await;
    let (code, closed_count) = tokio::task::spawn_blocking(move || {
        let mut idle: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut health = TcpStream::connect(addr).unwrap();
        health.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let code = read_response(&mut health);
        std::thread::sleep(Duration::from_millis(300));
        (code, idle.iter_mut().map(closed).filter(|c| *c).count())
    })
    .await
    .unwrap();
    assert!(matches!(code, 200 | 503), "/health: {code}");
    // 137 made room for the 64 that followed them and for /health's connection.
    assert_eq!(closed_count, 137, "of 200 idle connections over a cap of 64");
    let _ = stop.send(());
    let stopped = tokio::time::timeout(Duration::from_secs(5), server).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
}

/// A connection that sends no request, or its head too slowly, is closed after the header
/// timeout; a kept-alive connection after the idle timeout; a request being answered
/// (here, one whose body comes late) is never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_time_out_but_requests_in_progress_do_not() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::Duration;
    let (app, _) = common::app();
    let short = Some(Duration::from_millis(400));
    let limits = strata::server::listen::ConnLimits { header_timeout: short, idle_timeout: short, max_connections: 64 };
    let (addr, stop, _server) = listen(app, limits).await;
    tokio::task::spawn_blocking(move || {
        let long = Duration::from_secs(5);
        let mut silent = TcpStream::connect(addr).unwrap();
        assert!(closed_within(&mut silent, long), "a connection that sends nothing stays open");

        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
        for i in 0..40 {
            std::thread::sleep(Duration::from_millis(100));
            if closed(&mut slow) || slow.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes()).is_err() {
                break;
            }
        }
        assert!(closed(&mut slow), "a head sent a line at a time stays open");

        let mut kept = TcpStream::connect(addr).unwrap();
        kept.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(matches!(read_response(&mut kept), 200 | 503));
        assert!(closed_within(&mut kept, long), "an idle kept-alive connection stays open");

        let body = r#"{"model": "llama3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}"#;
        let mut late = TcpStream::connect(addr).unwrap();
        let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len());
        late.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        late.write_all(body.as_bytes()).unwrap();
        assert_eq!(read_response(&mut late), 200, "a request whose body took longer than both timeouts");
    })
    .await
    .unwrap();
    let _ = stop.send(());
}
