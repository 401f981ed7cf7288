//! A model converted with `--sparse-ffn`, served: `/api/show` says how it runs, a
//! request's `sparse_ffn` (Ollama's `options.sparse_ffn`, OpenAI's `sparse_ffn`) chooses
//! per sequence, a bad setting or one the model cannot take is a 400 naming the field,
//! and `/metrics` counts the groups kept and the neuron-group cache.

use crate::common;
use crate::support;

use std::time::Duration;

use axum::http::StatusCode;
use common::{fixture, get, json, post_json, send};
use serde_json::json;
use strata::model::ModelSource;
use strata::model::convert::{ConvertOptions, Target, convert};
use strata::model::sparse::SparseFfn;
use strata::queue::KeepAlive;
use strata::queue::worker::WorkerConfig;
use strata::server::{ServeOptions, ServerConfig};
use support::TempDir;

#[tokio::test]
async fn a_sparse_model_is_served_and_bad_settings_are_400s() {
    let dir = TempDir::new("http-sparse");
    let spec = dir.path("llama3-sparse.flat");
    let opts = ConvertOptions { target: Target::Flat, quant: None, threads: 1, ndsq: None, sparse_ffn: Some(32) };
    convert(ModelSource::from_path(&fixture("llama3")).unwrap(), &spec, &opts, &mut |_| {}).unwrap();
    let setting = SparseFfn::parse("topk=0.6").unwrap();
    let run = strata::engine::session::RunOptions {
        threads: 1,
        context: 128,
        memory_budget: Some(0),
        sparse_ffn: setting,
        ..Default::default()
    };
    let serve = ServeOptions {
        models: vec![("sparse".into(), spec.to_str().unwrap().into()), ("dense".into(), fixture("llama3"))],
        worker: WorkerConfig {
            run,
            keep_alive: KeepAlive::For(Duration::from_secs(300)),
            max_loaded: 2,
            parallel: None,
            prefill_chunk: strata::engine::session::PREFILL_CHUNK,
            kv_memory: None,
            drafts: Default::default(),
        },
        server: ServerConfig { sparse_ffn: setting, ..ServerConfig::default() },
        queue_depth: 8,
        preload: false,
    };
    let (app, _state, _worker) = strata::server::start(serve).expect("starting the server");

    let (status, _, body) = send(&app, post_json("/api/show", json!({"model": "sparse"}))).await;
    assert_eq!(status, StatusCode::OK);
    let info = &json(&body)["model_info"];
    assert_eq!(info["strata.sparse_ffn"], "topk=0.6", "{info}");
    assert_eq!(info["strata.sparse_ffn.group_size"], 32);
    assert_eq!(info["strata.sparse_ffn.groups_per_layer"], 5);
    let (_, _, body) = send(&app, post_json("/api/show", json!({"model": "dense"}))).await;
    assert!(json(&body)["model_info"].get("strata.sparse_ffn").is_none(), "a dense model says nothing of it");

    let generate = |model: &str, options: serde_json::Value| {
        post_json("/api/generate", json!({"model": model, "prompt": "Hello", "stream": false, "options": options}))
    };
    // The server's setting, then the request's own.
    for options in [json!({"temperature": 0, "num_predict": 3}), json!({"num_predict": 3, "sparse_ffn": "topk=1"})] {
        let (status, _, body) = send(&app, generate("sparse", options)).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    // The dense model runs dense under the server's setting.
    let (status, _, _) = send(&app, generate("dense", json!({"num_predict": 2}))).await;
    assert_eq!(status, StatusCode::OK);

    // Bad settings, and a sparse setting for a model without bundles, name the field.
    for (model, options, field) in [
        ("sparse", json!({"sparse_ffn": "topk=1.5"}), "options.sparse_ffn"),
        ("sparse", json!({"sparse_ffn": "threshold=-2"}), "options.sparse_ffn"),
        ("sparse", json!({"sparse_ffn": "sparse"}), "options.sparse_ffn"),
        ("dense", json!({"sparse_ffn": "topk=0.5"}), "options.sparse_ffn"),
    ] {
        let (status, _, body) = send(&app, generate(model, options.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{options}: {}", String::from_utf8_lossy(&body));
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(field), "{options}: {text}");
    }
    let chat = |model: &str, sparse: &str| {
        post_json(
            "/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "sparse_ffn": sparse}),
        )
    };
    let (status, _, body) = send(&app, chat("sparse", "topk=0.4")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    for (model, sparse) in [("sparse", "topk=0"), ("dense", "auto")] {
        let (status, _, body) = send(&app, chat(model, sparse)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{model} {sparse}");
        assert_eq!(json(&body)["error"]["param"], "sparse_ffn", "{}", String::from_utf8_lossy(&body));
    }

    let (_, _, metrics) = send(&app, get("/metrics")).await;
    let metrics = String::from_utf8(metrics).unwrap();
    let value = |line: &str| common::metric(&metrics, line);
    let (kept, total) = (
        value("strata_sparse_ffn_groups_kept_total{model=\"sparse:latest\"} "),
        value("strata_sparse_ffn_groups_total{model=\"sparse:latest\"} "),
    );
    assert!(kept > 0 && kept < total, "{kept} of {total}");
    assert!(value("strata_neuron_group_requests_total{model=\"sparse:latest\"} ") > 0);
    assert!(value("strata_neuron_group_read_bytes_total{model=\"sparse:latest\"} ") > 0);
    assert!(!metrics.contains("strata_expert_requests_total"), "no routed experts here");
}
