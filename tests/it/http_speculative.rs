//! Speculative decoding as a client of the server sees it: a model served with a draft
//! model (`--draft`) or n-gram drafts answers greedy requests exactly as it does without
//! them, on the OpenAI and Ollama routes, streamed and whole; the final usage says what
//! was drafted and kept (llama-server's `timings.draft_n`, `draft_n_accepted`), and so
//! do `/metrics`, `/api/ps` and `/api/strata/status`; a request's own settings are
//! checked, naming the field; a draft of another vocabulary fails the model's load.

use crate::common::{self, get, json, post_json, send};

use axum::Router;
use axum::http::StatusCode;
use serde_json::{Value, json};
use strata::draft::Drafts;
use strata::engine::speculative::SpecSettings;

fn gguf(name: &str) -> String {
    format!("{}/tests/fixtures/gguf/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// One fixture under four names: `drafted` with the safetensors form of the same model
/// as its draft, `ngram` drafting from the context, `plain` without a draft, and
/// `mismatched`, whose draft (gemma) has another vocabulary. Drafts are proposed
/// whatever their probability (`p_min` 0: the fixture's weights are random).
fn app() -> Router {
    let model = gguf("llama3.q4_0.gguf");
    let models =
        [("drafted", model.clone()), ("ngram", model.clone()), ("plain", model.clone()), ("mismatched", model)];
    let mut opts = common::serve_options(&models, 256);
    let entries = [
        format!("drafted={}", common::fixture("llama3")),
        "ngram=ngram".to_string(),
        format!("mismatched={}", common::fixture("gemma")),
    ];
    let settings = SpecSettings { p_min: Some(0.0), ..SpecSettings::default() };
    opts.worker.drafts = Drafts::parse(&entries, "drafted", settings).unwrap();
    opts.worker.max_loaded = 4;
    strata::server::start(opts).expect("starting the server").0
}

/// A prompt that says the same thing twice, so that the n-gram draft finds matches.
const PROMPT: &str = "one two three four five six seven; one two three four five six seven; one two";

fn completion(model: &str, extra: Value) -> Value {
    common::merged(json!({"model": model, "prompt": PROMPT, "temperature": 0, "max_tokens": 24}), extra)
}

async fn ok(app: &Router, uri: &str, body: Value) -> Value {
    common::ok_json(app, uri, body).await
}

/// The `data:` payloads of an SSE body that are JSON.
fn sse_json(body: &[u8]) -> Vec<Value> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// `timings`' drafted and kept tokens, checked to be consistent.
fn drafted(timings: &Value) -> (u64, u64) {
    let (n, kept) = (timings["draft_n"].as_u64().unwrap(), timings["draft_n_accepted"].as_u64().unwrap());
    assert!(kept <= n, "{timings}");
    assert!(timings["predicted_n"].as_u64().unwrap() > 0, "{timings}");
    (n, kept)
}

#[tokio::test]
async fn greedy_replies_are_the_same_with_and_without_speculation() {
    let app = app();
    let off = json!({"speculative": {"type": "off"}});
    for model in ["drafted", "ngram"] {
        // Completions, whole.
        let with = ok(&app, "/v1/completions", completion(model, json!({}))).await;
        let without = ok(&app, "/v1/completions", completion(model, off.clone())).await;
        assert_eq!(with["choices"][0]["text"], without["choices"][0]["text"], "{model}");
        assert_eq!(with["usage"]["completion_tokens"], 24, "{model}: {with}");
        let (n, _) = drafted(&with["timings"]);
        assert!(n > 0, "{model}: nothing was drafted: {with}");
        assert_eq!(drafted(&without["timings"]), (0, 0), "{model}: `off` drafted");
        // Chat, with llama-server's flat keys.
        let chat = |extra: Value| {
            let messages = json!([{"role": "user", "content": PROMPT}]);
            common::merged(json!({"model": model, "messages": messages, "temperature": 0, "max_tokens": 16}), extra)
        };
        let with = ok(&app, "/v1/chat/completions", chat(json!({"speculative.n_max": 4}))).await;
        let without = ok(&app, "/v1/chat/completions", chat(off.clone())).await;
        assert_eq!(with["choices"][0]["message"], without["choices"][0]["message"], "{model}");
        drafted(&with["timings"]);
        // Ollama, with the model's settings and with `off`.
        let generate = |extra: Value| {
            let body = json!({"model": model, "prompt": PROMPT, "raw": true, "stream": false,
                "options": {"temperature": 0, "num_predict": 16}});
            common::merged(body, extra)
        };
        let with = ok(&app, "/api/generate", generate(json!({}))).await;
        let without = ok(&app, "/api/generate", generate(off.clone())).await;
        assert_eq!(with["response"], without["response"], "{model}");
        assert!(with["draft_n"].as_u64().unwrap() > 0, "{model}: {with}");
        assert!(with["draft_n_accepted"].as_u64().unwrap() <= with["draft_n"].as_u64().unwrap());
        assert_eq!((without["draft_n"].as_u64(), without["draft_n_accepted"].as_u64()), (Some(0), Some(0)));
    }
}

#[tokio::test]
async fn a_stream_ends_with_the_timings_of_what_was_drafted() {
    let app = app();
    let whole = ok(&app, "/v1/completions", completion("drafted", json!({}))).await;
    let (status, _, body) =
        send(&app, post_json("/v1/completions", completion("drafted", json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_json(&body);
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    let last = chunks.iter().find(|c| c["choices"][0]["finish_reason"].is_string()).expect("a finish chunk");
    let (n, kept) = drafted(&last["timings"]);
    assert!(n > 0, "{last}");
    assert_eq!((n, kept), drafted(&whole["timings"]), "the same drafts streamed and whole");
    assert_eq!(chunks.iter().filter(|c| c.get("timings").is_some()).count(), 1, "timings once, at the end");

    // Chat, streamed with the usage chunk: the finish chunk has the timings.
    let messages = json!([{"role": "user", "content": PROMPT}]);
    let body = json!({"model": "ngram", "messages": messages, "temperature": 0, "max_tokens": 12,
        "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, body) = send(&app, post_json("/v1/chat/completions", body)).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_json(&body);
    let last = chunks.iter().find(|c| c["choices"][0]["finish_reason"].is_string()).expect("a finish chunk");
    drafted(&last["timings"]);
    assert!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64() == Some(12));
}

#[tokio::test]
async fn metrics_and_the_status_routes_show_the_draft_and_what_it_kept() {
    let app = app();
    let metrics = || async {
        let (_, _, body) = send(&app, get("/metrics")).await;
        String::from_utf8(body).unwrap()
    };
    let reply = ok(&app, "/v1/completions", completion("drafted", json!({}))).await;
    let (n, kept) = drafted(&reply["timings"]);
    let m = metrics().await;
    let value = |m: &str, name: &str| common::metric(m, &format!("{name}{{model=\"drafted:latest\"}} "));
    assert_eq!(value(&m, "strata_speculative_drafted_tokens_total"), n, "{m}");
    assert_eq!(value(&m, "strata_speculative_accepted_tokens_total"), kept);
    assert!(value(&m, "strata_speculative_steps_total") > 0);
    assert!(m.contains("strata_speculative_info{model=\"drafted:latest\",kind=\"draft\",draft=\"llama3\"} 1"), "{m}");
    assert!(m.lines().any(|l| l.starts_with("strata_speculative_draft_seconds_total{model=\"drafted:latest\"} ")));
    assert!(m.lines().any(|l| l.starts_with("strata_speculative_acceptance_rate{model=\"drafted:latest\"} ")));
    // Another request: the counters grow by what it drafted.
    let again = ok(&app, "/v1/completions", completion("drafted", json!({"prompt": "seven six five four"}))).await;
    let (n2, kept2) = drafted(&again["timings"]);
    let m = metrics().await;
    assert_eq!(value(&m, "strata_speculative_drafted_tokens_total"), n + n2);
    assert_eq!(value(&m, "strata_speculative_accepted_tokens_total"), kept + kept2);

    ok(&app, "/v1/completions", completion("ngram", json!({}))).await;
    let (_, _, ps) = send(&app, get("/api/ps")).await;
    let ps = json(&ps);
    let model = |name: &str| ps["models"].as_array().unwrap().iter().find(|m| m["name"] == name).cloned().unwrap();
    let s = &model("drafted:latest")["speculative"];
    assert_eq!((s["kind"].as_str(), s["draft"].as_str()), (Some("draft"), Some("llama3")), "{s}");
    assert_eq!((s["n_max"].as_u64(), s["n_min"].as_u64(), s["p_min"].as_f64()), (Some(16), Some(0), Some(0.0)));
    assert_eq!(s["drafted"].as_u64(), Some(n + n2));
    assert!(s["acceptance_rate"].as_f64().unwrap() <= 1.0);
    let s = &model("ngram:latest")["speculative"];
    assert_eq!((s["kind"].as_str(), s["draft"].as_str()), (Some("ngram"), None), "{s}");
    assert!(s["drafted"].as_u64().unwrap() > 0);
    let (_, _, status) = send(&app, get("/api/strata/status")).await;
    let status = json(&status);
    let drafted_status = status["models"].as_array().unwrap().iter().find(|m| m["name"] == "drafted:latest").unwrap();
    assert_eq!(drafted_status["speculative"]["draft"], "llama3");
    assert_eq!(drafted_status["speculative"]["accepted"].as_u64(), Some(kept + kept2));
}

/// A 400 naming `param`, whose message contains `says`, in the route family's shape.
async fn refused(app: &Router, uri: &str, body: Value, param: &str, says: &str) {
    let (status, _, out) = send(app, post_json(uri, body.clone())).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
    // OpenAI's shape names the field in `param`; Ollama's and Anthropic's, in the message.
    let message = match (&v["error"], uri) {
        (Value::String(m), _) => m.clone(),
        (e, "/v1/messages") => e["message"].as_str().unwrap().to_string(),
        (e, _) => {
            assert_eq!(e["param"], param, "{body}: {v}");
            e["message"].as_str().unwrap().to_string()
        }
    };
    assert!(message.contains(says), "{body}: {message}");
}

#[tokio::test]
async fn bad_speculative_settings_are_refused_naming_the_field() {
    let app = app();
    let cases = [
        (json!({"speculative": {"n_max": 65}}), "speculative.n_max", "`speculative.n_max` must be at most 64"),
        (json!({"speculative.n_max": -1}), "speculative.n_max", "at least 0"),
        (json!({"speculative": {"n_min": 4, "n_max": 2}}), "speculative.n_min", "not be more than"),
        (json!({"speculative.p_min": 1.5}), "speculative.p_min", "`speculative.p_min` must be in [0, 1]"),
        (json!({"speculative": {"type": "eagle"}}), "speculative.type", "draft, ngram or off"),
        (json!({"speculative": {"n_max": 4}, "speculative.n_max": 4}), "speculative.n_max", "given twice"),
        (json!({"speculative": {"n_max": "lots"}}), "speculative.n_max", "speculative.n_max"),
        // The model's own n_max is 16: a request's n_min above it is refused where it runs.
        (json!({"speculative": {"n_min": 20}}), "speculative.n_min", "`speculative.n_min` must not be more than"),
    ];
    for (extra, param, says) in cases {
        refused(&app, "/v1/completions", completion("drafted", extra.clone()), param, says).await;
    }
    let chat = json!({"model": "drafted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "speculative": {"p_min": -0.5}});
    refused(&app, "/v1/chat/completions", chat, "speculative.p_min", "must be in [0, 1]").await;
    let generate = json!({"model": "drafted", "prompt": "hi", "stream": false, "speculative": {"n_max": 100}});
    refused(&app, "/api/generate", generate, "", "`speculative.n_max` must be at most 64").await;
    let chat = json!({"model": "drafted", "messages": [{"role": "user", "content": "hi"}], "stream": false,
        "speculative": {"type": "sometimes"}});
    refused(&app, "/api/chat", chat, "", "`speculative.type`").await;
    let input = json!({"model": "drafted", "input": "hi", "speculative": {"n_max": 65}});
    refused(&app, "/v1/responses", input, "speculative.n_max", "at most 64").await;
    let messages = json!({"model": "drafted", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
        "speculative": {"p_min": 2}});
    refused(&app, "/v1/messages", messages, "", "`speculative.p_min`").await;
}

#[tokio::test]
async fn a_draft_is_refused_where_the_model_has_none() {
    let app = app();
    let says = "loaded without a draft model";
    let body = completion("plain", json!({"speculative": {"type": "draft"}}));
    refused(&app, "/v1/completions", body, "speculative.type", says).await;
    let body = json!({"model": "ngram", "prompt": "hi", "stream": false, "speculative": {"type": "draft"}});
    refused(&app, "/api/generate", body, "", says).await;
    // Any model drafts from its context when a request asks.
    let reply = ok(&app, "/v1/completions", completion("plain", json!({"speculative": {"type": "ngram"}}))).await;
    assert!(drafted(&reply["timings"]).0 > 0, "{reply}");
}

#[tokio::test]
async fn a_draft_of_another_vocabulary_fails_the_load() {
    let app = app();
    let (status, _, body) = send(&app, post_json("/v1/completions", completion("mismatched", json!({})))).await;
    let v = json(&body);
    assert!(status.is_server_error(), "{status}: {v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("loading `mismatched`"), "{message}");
    assert!(message.contains("draft model `gemma` cannot draft for"), "{message}");
    assert!(message.contains("in the draft's vocabulary"), "{message}");
    // Nothing of it stays loaded; the other models still serve.
    let (_, _, ps) = send(&app, get("/api/ps")).await;
    assert!(!json(&ps)["models"].as_array().unwrap().iter().any(|m| m["name"] == "mismatched:latest"));
    ok(&app, "/v1/completions", completion("plain", json!({"max_tokens": 2}))).await;
}
