//! A mixture-of-experts model served with its experts streamed: `/api/ps` shows the
//! expert cache with hits and misses by layer, and `/metrics` counts expert requests,
//! hits and bytes.

use crate::common;

use std::time::Duration;

use axum::http::StatusCode;
use common::{get, json, post_json, send};
use serde_json::json;
use strata::queue::KeepAlive;
use strata::queue::worker::WorkerConfig;
use strata::sched::experts::CacheSize;
use strata::server::{ServeOptions, ServerConfig};

#[tokio::test]
async fn the_expert_cache_is_shown_in_ps_and_metrics() {
    let model = format!("{}/tests/fixtures/gguf/qwen3_moe.f32.gguf", env!("CARGO_MANIFEST_DIR"));
    let run = strata::engine::session::RunOptions {
        threads: 1,
        context: 256,
        memory_budget: Some(0),
        expert_cache: Some(CacheSize::Fraction(0.25)),
        ..Default::default()
    };
    let opts = ServeOptions {
        models: vec![("moe".into(), model)],
        worker: WorkerConfig {
            run,
            keep_alive: KeepAlive::For(Duration::from_secs(300)),
            max_loaded: 1,
            parallel: None,
            prefill_chunk: strata::engine::session::PREFILL_CHUNK,
            kv_memory: None,
            drafts: Default::default(),
        },
        server: ServerConfig::default(),
        queue_depth: 8,
        preload: false,
    };
    let (app, _state, _worker) = strata::server::start(opts).expect("starting the server");
    let req = json!({"model": "moe", "prompt": "Hello there", "stream": false,
        "options": {"temperature": 0, "num_predict": 6}});
    let (status, _, body) = send(&app, post_json("/api/generate", req)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));

    let (status, _, body) = send(&app, get("/api/ps")).await;
    assert_eq!(status, StatusCode::OK);
    let ps = json(&body);
    let experts = &ps["models"][0]["residency"]["experts"];
    assert_eq!(experts["mode"], "on_demand", "{ps}");
    assert_eq!(experts["policy"], "freq");
    assert_eq!(experts["experts_per_layer"], 8);
    let layers = experts["layers"].as_array().expect("per-layer counters");
    assert_eq!(layers.len(), 2);
    let (hits, misses): (u64, u64) = layers
        .iter()
        .map(|l| (l["hits"].as_u64().unwrap(), l["misses"].as_u64().unwrap()))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert!(misses > 0, "{experts}");
    let budget = experts["cache_budget_bytes"].as_u64().unwrap();
    assert!(experts["cached_bytes"].as_u64().unwrap() <= budget && budget > 0, "{experts}");

    let (_, _, metrics) = send(&app, get("/metrics")).await;
    let metrics = String::from_utf8(metrics).unwrap();
    let value = |line: &str| common::metric(&metrics, line);
    let requests = value("strata_expert_requests_total{model=\"moe:latest\"} ");
    assert_eq!(requests, hits + misses);
    assert_eq!(value("strata_expert_hits_total{model=\"moe:latest\"} "), hits);
    assert!(value("strata_expert_read_bytes_total{model=\"moe:latest\"} ") > 0);
    let layer0 = value("strata_expert_layer_misses_total{model=\"moe:latest\",moe_layer=\"0\"} ");
    assert_eq!(layer0, layers[0]["misses"].as_u64().unwrap());
    // Storage reads are the cores' plus the experts'.
    assert!(
        value("strata_storage_read_bytes_total{model=\"moe:latest\"} ")
            > value("strata_expert_read_bytes_total{model=\"moe:latest\"} ")
    );
}
