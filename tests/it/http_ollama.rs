//! The Ollama API (`/api/*`) end to end on the fixture models: NDJSON streams and their
//! final counters, options, keep-alive load/unload, the model routes and the errors, in
//! the shapes the ollama Python/JS libraries and Open WebUI read.

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::{app, app_with, get, json, post_json, send};
use serde_json::{Value, json};
use strata::server::ServerConfig;

/// Every line of an NDJSON body, parsed (each must be one JSON object).
fn lines(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    assert!(text.ends_with('\n'), "NDJSON ends with a newline: {text:?}");
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("line is not JSON ({e}): {l:?}")))
        .inspect(|v| assert!(v.is_object(), "{v}"))
        .collect()
}

fn content_type(headers: &axum::http::HeaderMap) -> &str {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn assert_rfc3339_nanos(v: &Value) -> jiff::Timestamp {
    let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    assert!(s.ends_with('Z'), "UTC: {s}");
    assert_eq!(s.rsplit('.').next().map(str::len), Some(10), "nanoseconds: {s}");
    s.parse().unwrap_or_else(|e| panic!("not RFC 3339 ({e}): {s}"))
}

fn assert_final_counters(last: &Value) {
    assert_eq!(last["done"], true, "{last}");
    for key in
        ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"]
    {
        assert!(last[key].is_u64(), "`{key}` is a count: {last}");
    }
    assert!(last["prompt_eval_count"].as_u64() > Some(0), "{last}");
    assert!(last["total_duration"].as_u64() >= last["eval_duration"].as_u64(), "{last}");
}

/// The streamed text of a generate or chat response.
fn text_of(lines: &[Value]) -> String {
    lines.iter().map(|l| l["response"].as_str().or_else(|| l["message"]["content"].as_str()).unwrap_or("")).collect()
}

async fn generate(app: &axum::Router, body: Value) -> (StatusCode, Vec<Value>) {
    let (status, headers, body) = send(app, post_json("/api/generate", body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    match content_type(&headers) {
        "application/x-ndjson" => (status, lines(&body)),
        _ => (status, vec![json(&body)]),
    }
}

async fn ps_names(app: &axum::Router) -> Vec<String> {
    let (status, _, body) = send(app, get("/api/ps")).await;
    assert_eq!(status, StatusCode::OK);
    json(&body)["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn generate_streams_ndjson_with_final_counters_and_context() {
    let (app, state) = app();
    let req = json!({"model": "llama3", "prompt": "Hello there", "options": {"temperature": 0, "num_predict": 12}});
    let (status, headers, body) = send(&app, post_json("/api/generate", req)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "application/x-ndjson");
    let lines = lines(&body);
    assert!(lines.len() >= 2, "chunks then a final line: {lines:?}");
    let (last, chunks) = lines.split_last().unwrap();
    for c in chunks {
        assert_eq!(c["model"], "llama3");
        assert_eq!(c["done"], false);
        assert!(c["response"].is_string(), "{c}");
        assert_rfc3339_nanos(&c["created_at"]);
        assert!(c.get("context").is_none() && c.get("eval_count").is_none(), "{c}");
    }
    assert_final_counters(last);
    assert_rfc3339_nanos(&last["created_at"]);
    assert_eq!(last["response"], "");
    assert!(["stop", "length"].contains(&last["done_reason"].as_str().unwrap()), "{last}");
    let context = last["context"].as_array().expect("context on the final line");
    let (prompt, eval) = (last["prompt_eval_count"].as_u64().unwrap(), last["eval_count"].as_u64().unwrap());
    assert_eq!(context.len() as u64, prompt + eval, "context = prompt + generated ids");
    assert!((1..=12).contains(&eval));

    // The same request without streaming answers one object with the same text.
    let req = json!({"model": "llama3", "prompt": "Hello there", "stream": false,
        "options": {"temperature": 0, "num_predict": 12}});
    let (status, headers, body) = send(&app, post_json("/api/generate", req)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "application/json");
    let whole = json(&body);
    assert_eq!(whole["response"].as_str().unwrap(), text_of(chunks));
    assert_eq!(whole["context"], last["context"]);
    assert_final_counters(&whole);

    // Every generation counts in /metrics.
    let (_, _, metrics) = send(&app, get("/metrics")).await;
    let metrics = String::from_utf8(metrics).unwrap();
    let generated = metrics.lines().find(|l| l.starts_with("strata_generated_tokens_total ")).unwrap();
    assert_eq!(generated, format!("strata_generated_tokens_total {}", 2 * eval));
    // ... and in the layer scheduler's counters (the fixture has 2 layers, resident).
    let value = |name: &str| -> f64 {
        let prefix = format!("{name}{{model=\"llama3:latest\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("{name}")).parse().unwrap()
    };
    assert!(value("strata_layer_requests_total") >= 2.0 * eval as f64);
    assert_eq!(value("strata_layer_hits_total"), value("strata_layer_requests_total"));
    assert_eq!(value("strata_layers_resident"), 2.0);
    assert_eq!(value("strata_storage_read_bytes_total"), 0.0);
    // Where the model runs: the CPU on a machine without a GPU (as CI is).
    if !std::path::Path::new("/dev/nvidiactl").exists() {
        assert_eq!(value("strata_model_vram_bytes"), 0.0);
        let device = metrics.lines().find(|l| l.starts_with("strata_model_device{")).expect("strata_model_device");
        assert!(device.contains("model=\"llama3:latest\",device=\"cpu\",name=\"") && device.ends_with("} 1"));
        let (_, _, health) = send(&app, get("/health")).await;
        assert_eq!(json(&health)["device"], "cpu");
        let (_, _, ps) = send(&app, get("/api/ps")).await;
        let m = &json(&ps)["models"][0];
        assert_eq!((m["size_vram"].as_u64(), m["device"]["device"].as_str()), (Some(0), Some("cpu")), "{m}");
    }
    drop(state);
}

#[tokio::test]
async fn chat_streams_a_message_on_every_line() {
    let (app, _) = app();
    let req = json!({"model": "llama3", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "How are you?"}],
        "options": {"temperature": 0, "num_predict": 10}, "think": false});
    let (status, headers, body) = send(&app, post_json("/api/chat", req.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "application/x-ndjson");
    let lines = lines(&body);
    for l in &lines {
        assert_eq!(l["message"]["role"], "assistant", "{l}");
        assert!(l["message"]["content"].is_string(), "{l}");
        assert!(l.get("response").is_none() && l.get("context").is_none(), "{l}");
    }
    let (last, chunks) = lines.split_last().unwrap();
    assert_eq!(last["message"]["content"], "");
    assert_final_counters(last);
    assert!(chunks.iter().all(|c| c["done"] == false));

    let mut req = req;
    req["stream"] = json!(false);
    let (status, _, body) = send(&app, post_json("/api/chat", req)).await;
    assert_eq!(status, StatusCode::OK);
    let whole = json(&body);
    assert_eq!(whole["message"]["content"].as_str().unwrap(), text_of(chunks));
    assert_eq!(whole["done"], true);
}

#[tokio::test]
async fn num_predict_limits_the_tokens() {
    let (app, _) = app();
    let (_, lines) = generate(
        &app,
        json!({"model": "llama3", "prompt": "Once upon a time", "raw": true,
            "options": {"temperature": 0, "num_predict": 4}}),
    )
    .await;
    let last = lines.last().unwrap();
    assert_eq!(last["done_reason"], "length", "{last}");
    assert_eq!(last["eval_count"], 4);
}

#[tokio::test]
async fn a_seed_makes_sampling_reproducible() {
    let (app, _) = app();
    let req = json!({"model": "llama3", "prompt": "Tell me a story", "stream": false,
        "options": {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "seed": 42, "num_predict": 16}});
    let (_, a) = generate(&app, req.clone()).await;
    let (_, b) = generate(&app, req).await;
    assert_eq!(a[0]["response"], b[0]["response"]);
    assert_eq!(a[0]["context"], b[0]["context"]);
}

#[tokio::test]
async fn context_continues_an_exchange() {
    let (app, _) = app();
    let first = json!({"model": "llama3", "prompt": "Hi", "stream": false,
        "options": {"temperature": 0, "num_predict": 3}});
    let (_, a) = generate(&app, first).await;
    let context = a[0]["context"].as_array().unwrap().clone();
    let next = json!({"model": "llama3", "prompt": "And then?", "context": context, "stream": false,
        "options": {"temperature": 0, "num_predict": 3}});
    let (_, b) = generate(&app, next).await;
    let b_context = b[0]["context"].as_array().unwrap();
    assert_eq!(&b_context[..context.len()], &context[..], "the new context extends the old one");
    assert!(b[0]["prompt_eval_count"].as_u64().unwrap() > context.len() as u64);
}

#[tokio::test]
async fn stop_strings_end_the_answer() {
    let (app, _) = app();
    let base = json!({"model": "llama3", "prompt": "Once upon a time", "stream": false,
        "options": {"temperature": 0, "num_predict": 24}});
    let (_, full) = generate(&app, base.clone()).await;
    let full = full[0]["response"].as_str().unwrap().to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "a long enough answer to cut: {full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];

    let mut req = base;
    req["options"]["stop"] = json!([stop]);
    let (_, cut) = generate(&app, req).await;
    assert_eq!(cut[0]["response"], expected, "stop {stop:?} in {full:?}");
    assert_eq!(cut[0]["done_reason"], "stop");
}

#[tokio::test]
async fn an_empty_prompt_loads_and_keep_alive_zero_unloads() {
    let (app, _) = app();
    assert!(ps_names(&app).await.is_empty());

    let (_, lines) = generate(&app, json!({"model": "llama3", "prompt": "", "keep_alive": "10m"})).await;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["done"], true);
    assert_eq!(lines[0]["done_reason"], "load");
    assert_eq!(lines[0]["response"], "");

    let (_, _, body) = send(&app, get("/api/ps")).await;
    let ps = json(&body);
    let m = &ps["models"][0];
    assert_eq!(m["name"], "llama3:latest");
    assert_eq!(m["model"], "llama3:latest");
    assert_eq!(m["size_vram"], 0);
    assert!(m["size"].as_u64() > Some(0) && m["context_length"].as_u64() > Some(0), "{m}");
    assert_eq!(m["details"]["format"], "safetensors");
    let r = &m["residency"];
    assert_eq!(
        (r["mode"].as_str(), r["layers"].as_u64(), r["resident_layers"].as_str()),
        (Some("resident"), Some(2), Some("0-1")),
        "{r}"
    );
    // Nothing runs or waits now.
    let b = &m["batching"];
    assert_eq!((b["running"].as_u64(), b["waiting"].as_u64()), (Some(0), Some(0)), "{b}");
    assert!((1..=8).contains(&b["parallel"].as_u64().unwrap()), "{b}");
    assert!(b["kv_cache_limit_bytes"].as_u64().unwrap() > 0, "{b}");
    let expires = assert_rfc3339_nanos(&m["expires_at"]);
    let ahead = expires.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((500..=600).contains(&ahead), "expires in about 10 minutes, not {ahead}s");

    let (_, lines) = generate(&app, json!({"model": "llama3", "keep_alive": 0})).await;
    assert_eq!(lines[0]["done_reason"], "unload");
    assert!(ps_names(&app).await.is_empty(), "unloaded");

    // Chat: no messages loads; keep_alive "0s" unloads.
    let (status, _, body) = send(&app, post_json("/api/chat", json!({"model": "llama3", "messages": []}))).await;
    assert_eq!(status, StatusCode::OK);
    let v = json(&body);
    assert_eq!((v["done_reason"].as_str(), v["message"]["content"].as_str()), (Some("load"), Some("")));
    assert_eq!(ps_names(&app).await, ["llama3:latest"]);
    let (_, _, body) = send(&app, post_json("/api/chat", json!({"model": "llama3", "keep_alive": "0s"}))).await;
    assert_eq!(json(&body)["done_reason"], "unload");
    assert!(ps_names(&app).await.is_empty());

    // A generation with keep_alive 0 unloads when it ends.
    let (_, lines) = generate(
        &app,
        json!({"model": "llama3", "prompt": "Hi", "keep_alive": 0, "options": {"temperature": 0, "num_predict": 2}}),
    )
    .await;
    assert_eq!(lines.last().unwrap()["done"], true);
    assert!(ps_names(&app).await.is_empty(), "unloaded after the request");

    // Forever: expires far ahead.
    generate(&app, json!({"model": "llama3", "keep_alive": -1})).await;
    let (_, _, body) = send(&app, get("/api/ps")).await;
    let expires = assert_rfc3339_nanos(&json(&body)["models"][0]["expires_at"]);
    assert!(expires.duration_since(jiff::Timestamp::now()).as_secs() > 10 * 365 * 86400);
}

#[tokio::test]
async fn model_routes_have_ollama_shapes() {
    let (app, _) = app();
    let (status, _, body) = send(&app, get("/api/tags")).await;
    assert_eq!(status, StatusCode::OK);
    let tags = json(&body);
    let models = tags["models"].as_array().unwrap();
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["llama3:latest", "qwen3:latest", "strata-demo:latest"]);
    let llama = &models[0];
    assert_eq!(llama["model"], "llama3:latest");
    assert_rfc3339_nanos(&llama["modified_at"]);
    assert!(llama["size"].as_u64() > Some(0));
    assert!(llama["digest"].as_str().is_some_and(|d| d.len() >= 12 && d.chars().all(|c| c.is_ascii_hexdigit())));
    assert_eq!(
        llama["details"],
        json!({"parent_model": "", "format": "safetensors", "family": "llama", "families": ["llama"],
            "parameter_size": llama["details"]["parameter_size"], "quantization_level": "F32"})
    );
    assert!(llama["details"]["parameter_size"].as_str().is_some_and(|s| s.ends_with('K') || s.ends_with('M')));

    // `name` is an alias of `model`.
    for body in [json!({"model": "llama3"}), json!({"name": "llama3:latest"})] {
        let (status, _, body) = send(&app, post_json("/api/show", body)).await;
        assert_eq!(status, StatusCode::OK);
        let show = json(&body);
        assert_eq!(show["license"], "");
        assert!(show["template"].as_str().is_some_and(|t| t.contains("messages")), "the chat template");
        assert!(show["modelfile"].as_str().is_some_and(|m| m.contains("FROM ")));
        assert!(show["parameters"].is_string());
        assert_eq!(show["details"]["family"], "llama");
        assert_eq!(show["capabilities"], json!(["completion", "tools", "embedding"]));
        let info = &show["model_info"];
        assert_eq!(info["general.architecture"], "llama");
        assert!(info["general.parameter_count"].as_u64() > Some(0));
        assert_eq!(info["llama.context_length"], 512);
        assert_eq!(info["llama.embedding_length"], 64);
        assert_eq!(info["llama.block_count"], 2);
        assert_eq!(info["llama.attention.head_count"], 4);
        assert_eq!(info["llama.attention.head_count_kv"], 2);
        assert_eq!(info["llama.vocab_size"], 496);
    }

    let (status, _, body) = send(&app, get("/api/version")).await;
    assert_eq!(status, StatusCode::OK);
    let version = json(&body)["version"].as_str().unwrap().to_string();
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "dotted numeric: {version}");
    assert!(parts >= vec![0, 6, 4], "new enough for clients that check: {version}");

    let (status, _, body) = send(&app, get("/api/ps")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body), json!({"models": []}));

    let (_, _, body) = send(&app, get("/openapi.json")).await;
    let doc = json(&body);
    for path in ["/api/generate", "/api/chat", "/api/embed", "/api/tags", "/api/show", "/api/delete"] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
}

#[tokio::test]
async fn embed_and_legacy_embeddings() {
    let (app, _) = app();
    let (status, _, body) =
        send(&app, post_json("/api/embed", json!({"model": "llama3", "input": ["Hello", "world, again"]}))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v = json(&body);
    assert_eq!(v["model"], "llama3");
    let vectors = v["embeddings"].as_array().unwrap();
    assert_eq!(vectors.len(), 2);
    for e in vectors {
        let e: Vec<f64> = e.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(e.len(), 64);
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "normalized: {norm}");
    }
    assert!(v["prompt_eval_count"].as_u64() > Some(2));
    assert!(v["total_duration"].is_u64() && v["load_duration"].is_u64());

    let (_, _, body) = send(&app, post_json("/api/embed", json!({"model": "llama3", "input": "Hello"}))).await;
    let one = json(&body);
    assert_eq!(one["embeddings"][0], vectors[0], "a string is a list of one");

    let (status, _, body) =
        send(&app, post_json("/api/embeddings", json!({"model": "llama3", "prompt": "Hello"}))).await;
    assert_eq!(status, StatusCode::OK);
    let legacy = json(&body);
    assert_eq!(legacy["embedding"], vectors[0]);
    assert_eq!(legacy.as_object().unwrap().len(), 1);

    let (_, _, body) =
        send(&app, post_json("/api/embed", json!({"model": "llama3", "input": "Hello", "dimensions": 8}))).await;
    assert_eq!(json(&body)["embeddings"][0].as_array().unwrap().len(), 8);

    let (status, _, body) = send(&app, post_json("/api/embed", json!({"model": "llama3", "input": []}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["embeddings"], json!([]));
    // `""` alone loads the model, as Ollama takes it; in a list it is an input like
    // any other (this model's BOS token alone), embedded as in `["Hello", ""]`.
    let (status, _, body) = send(&app, post_json("/api/embed", json!({"model": "llama3", "input": ""}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["embeddings"], json!([]));
    let (status, _, body) = send(&app, post_json("/api/embed", json!({"model": "llama3", "input": [""]}))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let alone = json(&body);
    let (_, _, body) = send(&app, post_json("/api/embed", json!({"model": "llama3", "input": ["Hello", ""]}))).await;
    assert_eq!(alone["embeddings"].as_array().unwrap().len(), 1);
    assert_eq!(alone["embeddings"][0], json(&body)["embeddings"][1]);

    // `options.num_ctx` is the context an input must fit: longer is a 400 without
    // `truncate`, and cut to its first num_ctx tokens with it (the default).
    let long = "one two three four five six seven eight";
    let embed = |input: &str, extra: Value| {
        let mut body = json!({"model": "llama3", "input": input});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post_json("/api/embed", body)
    };
    let (status, _, body) = send(&app, embed(long, json!({"truncate": false, "options": {"num_ctx": 2}}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&body));
    assert!(json(&body)["error"].as_str().unwrap().contains("context holds 2"), "{}", json(&body));
    let (status, _, body) = send(&app, embed(long, json!({"options": {"num_ctx": 2}}))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let cut = json(&body);
    assert_eq!(cut["prompt_eval_count"], 2);
    // The same two tokens as a shorter input that starts alike, cut alike.
    let (_, _, body) = send(&app, embed("one two", json!({"options": {"num_ctx": 2}}))).await;
    assert_eq!(json(&body)["embeddings"], cut["embeddings"]);
    let (_, _, body) = send(&app, embed(long, json!({"truncate": false, "options": {"num_ctx": 64}}))).await;
    let whole = json(&body);
    assert!(whole["prompt_eval_count"].as_u64().unwrap() > 2, "{whole}");
    assert_ne!(whole["embeddings"], cut["embeddings"]);
    // The legacy route takes `options` too (it always truncates).
    let (status, _, body) =
        send(&app, post_json("/api/embeddings", json!({"model": "llama3", "prompt": long, "options": {"num_ctx": 2}})))
            .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["embedding"], cut["embeddings"][0]);
    // `options` are checked as the generate routes check them.
    for (options, field) in [
        (json!({"num_ctx": 0}), "options.num_ctx"),
        (json!({"num_ctx": -4}), "options.num_ctx"),
        (json!({"top_p": 0}), "options.top_p"),
    ] {
        for req in [
            embed(long, json!({"options": options})),
            post_json("/api/embeddings", json!({"model": "llama3", "prompt": long, "options": options})),
        ] {
            let (status, _, body) = send(&app, req).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{options}");
            assert!(json(&body)["error"].as_str().unwrap().contains(field), "{options}: {}", json(&body));
        }
    }
}

#[tokio::test]
async fn copy_then_show_and_delete_then_404() {
    let (app, _) = app();
    let (status, _, body) =
        send(&app, post_json("/api/copy", json!({"source": "llama3", "destination": "mine:v1"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.is_empty());
    let (status, _, body) = send(&app, post_json("/api/show", json!({"model": "mine:v1"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["model_info"]["llama.block_count"], 2);
    let (_, lines) =
        generate(&app, json!({"model": "mine:v1", "prompt": "Hi", "options": {"temperature": 0, "num_predict": 2}}))
            .await;
    assert_eq!(lines.last().unwrap()["model"], "mine:v1");

    let (status, _, _) = send(&app, post_json("/api/copy", json!({"source": "missing", "destination": "x"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let delete = |body: Value| {
        Request::delete("/api/delete").header("content-type", "application/json").body(Body::from(body.to_string()))
    };
    let (status, _, body) = send(&app, delete(json!({"model": "mine:v1"})).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(!ps_names(&app).await.contains(&"mine:v1".to_string()), "a deleted model is unloaded");
    let (status, _, body) = send(&app, post_json("/api/show", json!({"model": "mine:v1"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(json(&body)["error"].as_str().unwrap().contains("mine:v1"));
    let (status, _, _) = send(&app, delete(json!({"name": "mine:v1"})).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, body) = send(&app, get("/api/tags")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["models"].as_array().unwrap().len(), 3);
}

/// Sends `body` to `uri` and expects `status` with an Ollama error body mentioning `needle`.
async fn expect_error(app: &axum::Router, uri: &str, body: Value, status: StatusCode, needle: &str) {
    let (got, headers, bytes) = send(app, post_json(uri, body.clone())).await;
    assert_eq!(got, status, "{uri} {body}: {}", String::from_utf8_lossy(&bytes));
    assert!(content_type(&headers).starts_with("application/json"));
    let v = json(&bytes);
    let msg = v["error"].as_str().unwrap_or_else(|| panic!("{{\"error\": ...}}: {v}"));
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    assert!(msg.contains(needle), "{msg:?} mentions {needle:?}");
}

#[tokio::test]
async fn errors_have_the_right_status_and_shape() {
    let (app, _) = app();
    let bad = StatusCode::BAD_REQUEST;
    let g = |extra: Value| {
        let mut req = json!({"model": "llama3", "prompt": "Hi"});
        req.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        req
    };
    expect_error(&app, "/api/generate", json!({"model": "nope", "prompt": "Hi"}), StatusCode::NOT_FOUND, "nope").await;
    expect_error(&app, "/api/chat", json!({"model": "nope", "messages": []}), StatusCode::NOT_FOUND, "nope").await;
    expect_error(&app, "/api/show", json!({"model": "nope"}), StatusCode::NOT_FOUND, "nope").await;
    expect_error(&app, "/api/embed", json!({"model": "nope", "input": "x"}), StatusCode::NOT_FOUND, "nope").await;
    expect_error(&app, "/api/generate", g(json!({"format": 7})), bad, "format").await;
    let schema = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}});
    expect_error(
        &app,
        "/api/chat",
        json!({"model": "llama3", "messages": [{"role": "user", "content": "x"}],
        "format": schema}),
        bad,
        "format",
    )
    .await;
    expect_error(&app, "/api/generate", g(json!({"keep_alive": "5 minutes"})), bad, "keep_alive").await;
    expect_error(&app, "/api/generate", g(json!({"keep_alive": true})), bad, "keep_alive").await;
    expect_error(&app, "/api/generate", g(json!({"options": {"temperature": "hot"}})), bad, "options.temperature")
        .await;
    expect_error(&app, "/api/generate", g(json!({"options": {"top_p": 2.0}})), bad, "options.top_p").await;
    expect_error(&app, "/api/generate", g(json!({"options": {"num_predict": 1.5}})), bad, "options.num_predict").await;
    expect_error(&app, "/api/generate", g(json!({"suffix": "end"})), bad, "suffix").await;
    expect_error(&app, "/api/generate", g(json!({"template": "{{ .Prompt }}"})), bad, "template").await;
    expect_error(&app, "/api/generate", g(json!({"images": ["aGk="]})), bad, "images").await;
    expect_error(&app, "/api/generate", g(json!({"think": true})), bad, "thinking").await;
    expect_error(
        &app,
        "/api/chat",
        json!({"model": "llama3", "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"description": "no name"}}]}),
        bad,
        "tools[0].function.name",
    )
    .await;
    expect_error(
        &app,
        "/api/chat",
        json!({"model": "llama3", "messages": [{"role": "wizard", "content": "x"}]}),
        bad,
        "wizard",
    )
    .await;
    expect_error(
        &app,
        "/api/chat",
        json!({"model": "llama3", "messages": [{"role": "user", "content": "x"}], "format": "yaml"}),
        bad,
        "format",
    )
    .await;
    expect_error(
        &app,
        "/api/chat",
        json!({"model": "llama3",
        "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
        bad,
        "images",
    )
    .await;
    expect_error(&app, "/api/generate", json!({"prompt": "Hi"}), bad, "model").await;
    expect_error(&app, "/api/copy", json!({"source": "llama3", "destination": ""}), bad, "destination").await;
    // An alias of a started-with model is named as a store model is.
    for dst in ["a\u{0}b", "a\nb", "../../evil", "/tmp/evil", "x:y:z", &"a".repeat(200)] {
        expect_error(&app, "/api/copy", json!({"source": "llama3", "destination": dst}), bad, "invalid model name")
            .await;
    }

    // A prompt longer than the context, with `truncate: false`, is a 400 even on the
    // (default) streaming path; without it, it is cut and answered (Ollama's way).
    let long = "hello world ".repeat(400);
    let body = json!({"model": "llama3", "prompt": long, "raw": true, "truncate": false});
    expect_error(&app, "/api/generate", body, bad, "maximum context length").await;
    let chat = json!({"model": "llama3", "messages": [{"role": "user", "content": long}], "truncate": false});
    expect_error(&app, "/api/chat", chat, bad, "maximum context length").await;
    let keep_all = json!({"model": "llama3", "prompt": long, "raw": true, "options": {"num_keep": -1}});
    expect_error(&app, "/api/generate", keep_all, bad, "maximum context length").await;
    let body = json!({"model": "llama3", "prompt": long, "raw": true, "stream": false, "options": {"num_predict": 2}});
    let (status, _, bytes) = send(&app, post_json("/api/generate", body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    let v = json(&bytes);
    let ctx = v["prompt_eval_count"].as_u64().unwrap();
    assert!(ctx > 4 && ctx < 256, "cut below the context: {v}");

    // The body is JSON whatever the Content-Type says.
    let req = Request::post("/api/generate")
        .header("content-type", "text/plain")
        .body(Body::from(
            json!({"model": "llama3", "prompt": "Hi", "stream": false,
            "options": {"temperature": 0, "num_predict": 2}})
            .to_string(),
        ))
        .unwrap();
    let (status, _, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["done"], true);
    let req = Request::post("/api/show").body(Body::from(r#"{"name": "llama3"}"#)).unwrap();
    assert_eq!(send(&app, req).await.0, StatusCode::OK);
    let req = Request::post("/api/generate").body(Body::from("{not json")).unwrap();
    let (status, _, body) = send(&app, req).await;
    assert_eq!(status, bad);
    assert!(json(&body)["error"].is_string());
}

#[tokio::test]
async fn a_full_queue_answers_503_with_retry_after() {
    let (app, _) = app_with(ServerConfig::default(), 0);
    for (uri, body) in [
        ("/api/generate", json!({"model": "llama3", "prompt": "Hi"})),
        ("/api/generate", json!({"model": "llama3", "prompt": "Hi", "stream": false})),
        ("/api/chat", json!({"model": "llama3", "messages": [{"role": "user", "content": "Hi"}]})),
        ("/api/embed", json!({"model": "llama3", "input": "Hi"})),
    ] {
        let (status, headers, bytes) = send(&app, post_json(uri, body)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert_eq!(headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
        assert!(json(&bytes)["error"].as_str().unwrap().contains("queue"));
    }
}

/// A `STRATA_HOME` for one test, removed when it ends.
struct TempHome(std::path::PathBuf);

impl Drop for TempHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The server offers the store's models next to its own, reads the store at each request,
/// copies and deletes within it, and keeps the models it was started with.
#[tokio::test]
async fn store_models_are_listed_served_copied_and_deleted() {
    let home = TempHome(std::env::temp_dir().join(format!("strata-http-store-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&home.0);
    let store = strata::store::Store::open(&home.0);
    let gguf = format!("{}/tests/fixtures/gguf/llama3.q4_0.gguf", env!("CARGO_MANIFEST_DIR"));
    store.import(std::path::Path::new(&gguf), "tiny:q4", false).unwrap();
    let (app, _) = app_with(ServerConfig { store: Some(home.0.clone()), ..ServerConfig::default() }, 64);
    let delete = |model: &str| {
        Request::delete("/api/delete")
            .header("content-type", "application/json")
            .body(Body::from(json!({"model": model}).to_string()))
            .unwrap()
    };
    let tags = |body: &[u8]| -> Vec<Value> { json(body)["models"].as_array().unwrap().clone() };

    let (status, _, body) = send(&app, get("/api/tags")).await;
    assert_eq!(status, StatusCode::OK);
    let models = tags(&body);
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["llama3:latest", "qwen3:latest", "strata-demo:latest", "tiny:q4"]);
    let tiny = &models[3];
    assert_eq!(tiny["model"], "tiny:q4");
    assert_eq!(tiny["size"], std::fs::metadata(&gguf).unwrap().len());
    assert_rfc3339_nanos(&tiny["modified_at"]);
    assert!(tiny["digest"].as_str().is_some_and(|d| d.len() >= 12 && d.chars().all(|c| c.is_ascii_hexdigit())));
    assert_eq!(
        tiny["details"],
        json!({"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
            "parameter_size": "150K", "quantization_level": "Q4_0"})
    );
    let (_, _, body) = send(&app, get("/v1/models")).await;
    let ids: Vec<String> =
        json(&body)["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    assert!(ids.contains(&"tiny:q4".to_string()), "{ids:?}");

    let (status, _, body) = send(&app, post_json("/api/show", json!({"model": "tiny:q4"}))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let show = json(&body);
    assert_eq!(show["details"]["format"], "gguf");
    assert_eq!(show["model_info"]["llama.block_count"], 2);
    assert_eq!(show["modified_at"], tiny["modified_at"]);
    let (_, lines) =
        generate(&app, json!({"model": "tiny:q4", "prompt": "Hi", "options": {"temperature": 0, "num_predict": 2}}))
            .await;
    assert_eq!(lines.last().unwrap()["model"], "tiny:q4");
    assert_final_counters(lines.last().unwrap());
    let (status, _, body) = send(
        &app,
        post_json(
            "/v1/chat/completions",
            json!({"model": "tiny:q4", "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}]}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));

    // Imported while the server runs: offered at the next request.
    store.import(std::path::Path::new(&common::fixture("llama3")), "later/hf", false).unwrap();
    let (_, _, body) = send(&app, get("/api/tags")).await;
    let later = tags(&body).into_iter().find(|m| m["name"] == "later/hf:latest").expect("listed");
    assert_eq!(later["details"]["format"], "safetensors");

    // Copies stay in the store; the copy outlives its source.
    let (status, _, body) =
        send(&app, post_json("/api/copy", json!({"source": "tiny:q4", "destination": "tiny:copy"}))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(store.get("tiny:copy").is_ok(), "the copy is in the store");
    let (status, _, body) = send(&app, delete("tiny:q4")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(!ps_names(&app).await.contains(&"tiny:q4".to_string()), "a deleted model is unloaded");
    assert!(store.get("tiny:q4").is_err(), "deleted from disk");
    let (status, _, body) = send(&app, delete("tiny:q4")).await;
    assert_eq!((status, json(&body)), (StatusCode::NOT_FOUND, json!({"error": "model 'tiny:q4' not found"})));
    let (status, _, body) = send(&app, post_json("/api/show", json!({"model": "tiny:q4"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{}", String::from_utf8_lossy(&body));
    let (_, lines) = generate(&app, json!({"model": "tiny:copy", "prompt": "Hi", "options": {"num_predict": 1}})).await;
    assert_eq!(lines.last().unwrap()["done"], true);

    // Removed behind the server's back (`strata rm`): gone at the next request.
    store.remove("later/hf").unwrap();
    let (status, _, _) = send(&app, post_json("/api/show", json!({"model": "later/hf"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // What cannot be done says why.
    let bad = StatusCode::BAD_REQUEST;
    for model in ["llama3", "strata-demo:latest"] {
        let (status, _, body) = send(&app, delete(model)).await;
        assert_eq!(status, bad, "{model}");
        assert!(json(&body)["error"].as_str().unwrap().contains("strata serve"), "{}", json(&body));
    }
    let (_, _, body) = send(&app, get("/api/tags")).await;
    assert_eq!(tags(&body).len(), 4, "llama3, qwen3, the demo and tiny:copy");
    let copy = |src: &str, dst: &str| post_json("/api/copy", json!({"source": src, "destination": dst}));
    expect_error(
        &app,
        "/api/copy",
        json!({"source": "tiny:copy", "destination": "../../x"}),
        bad,
        "invalid model name",
    )
    .await;
    expect_error(&app, "/api/copy", json!({"source": "tiny:copy", "destination": "llama3"}), bad, "strata serve").await;
    expect_error(&app, "/api/copy", json!({"source": "llama3", "destination": "tiny:copy"}), bad, "in the store").await;
    expect_error(&app, "/api/copy", json!({"source": "../etc", "destination": "x"}), StatusCode::NOT_FOUND, "../etc")
        .await;
    // A started-with model is still copied under a name kept in memory, as without a store.
    assert_eq!(send(&app, copy("llama3", "alias:v1")).await.0, StatusCode::OK);
    assert!(store.get("alias:v1").is_err(), "not written to the store");
    assert_eq!(send(&app, delete("alias:v1")).await.0, StatusCode::OK);
    assert!(std::fs::read_dir(home.0.join("models/.tmp")).unwrap().next().is_none(), "nothing left in .tmp");
}
