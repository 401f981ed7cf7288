//! A mixture-of-experts model served with its experts streamed: `/api/ps` shows the
//! expert cache with hits and misses by layer, and `/metrics` counts expert requests,
//! hits and bytes; a model whose CPU computes routed experts beside the GPU shows its
//! split in `/api/ps`, `/api/strata/status` and `/metrics`.

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

/// A split as a MoE model on a GPU reports it: layer 1's experts on the CPU (one on
/// storage), layer 3's in VRAM and uploaded.
struct FixedSplit;

impl strata::sched::placement::split::SplitInfo for FixedSplit {
    fn summary(&self) -> strata::sched::placement::split::SplitSummary {
        use strata::sched::placement::split::{RatesSummary, SplitSteps, SplitSummary};
        use strata::sched::placement::{DecodeTime, LayerSummary, Mode, PlacementSummary};
        let layer = |layer, in_vram, on_cpu, streamed, from_storage| LayerSummary {
            layer,
            experts: 8,
            in_vram,
            on_cpu,
            streamed,
            from_storage,
            seconds: 0.001,
        };
        SplitSummary {
            mode: Mode::NCpuMoe(1),
            replan_every: 128,
            rates: RatesSummary { h2d_bytes_s: Some(2.5e10), ..Default::default() },
            plan: PlacementSummary {
                mode: Mode::NCpuMoe(1),
                // A plan through a rate not measured.
                decode: DecodeTime { total_s: f64::INFINITY, ..Default::default() },
                layers: vec![layer(1, 0, 7, 0, 1), layer(3, 5, 0, 3, 0)],
                ..Default::default()
            },
            steps: SplitSteps {
                gpu_experts: 40,
                cpu_experts: 24,
                bytes_down: 4096,
                bytes_up: 2048,
                crossings: 12,
                cpu_s: 1.5,
                gpu_wait_s: 0.25,
                uploaded_layers: 1,
                replans: 2,
                moved: 5,
            },
        }
    }
}

/// Only a GPU gets a split (see `session::split`), so the model here is a scheduler
/// with one attached, published as the worker publishes a loaded model: `/api/ps`, the
/// status JSON and `/metrics` show it as they show any model's.
#[tokio::test]
async fn an_expert_split_is_shown_in_ps_status_and_metrics() {
    use strata::engine::speculative::{SpecKind, SpecSettings};
    let (app, state, _worker) =
        strata::server::start(common::serve_options(&[("strata-demo", "strata-demo".into())], 64)).unwrap();
    let (_, _, body) = send(&app, get("/api/ps")).await;
    assert_eq!(json(&body)["models"], json!([]), "nothing loaded yet");
    let mut sched = strata::sched::Scheduler::<()>::resident(Vec::new(), |_| Ok(())).unwrap();
    sched.attach_split(std::sync::Arc::new(FixedSplit));
    let model = strata::queue::worker::LoadedModel {
        name: "moe:latest".into(),
        size_bytes: 1,
        context_length: 64,
        expires_at: None,
        sched: sched.monitor(),
        device: strata::backend::device::DeviceInfo { device: "cuda:0".into(), name: "a GPU".into() },
        size_vram: 1,
        batching: Default::default(),
        speculation: strata::draft::SpeculationView {
            kind: SpecKind::Off,
            draft: None,
            settings: SpecSettings::default(),
            stats: Default::default(),
        },
    };
    state.status.loaded.lock().unwrap().push(model);

    let (status, _, body) = send(&app, get("/api/ps")).await;
    assert_eq!(status, StatusCode::OK);
    let split = json(&body)["models"][0]["residency"]["split"].clone();
    assert_eq!(split["mode"], json!({"n_cpu_moe": 1}), "{split}");
    assert_eq!(split["plan"]["layers"][0]["on_cpu"], 7, "{split}");
    assert_eq!(split["plan"]["layers"][1]["streamed"], 3, "{split}");
    assert_eq!(split["steps"]["cpu_experts"], 24, "{split}");
    assert_eq!(split["rates"]["h2d_bytes_s"], 2.5e10, "{split}");
    assert_eq!(split["rates"]["storage_bytes_s"], serde_json::Value::Null, "not measured: null");
    assert_eq!(split["plan"]["decode"]["total_s"], serde_json::Value::Null, "infinite: null");

    let (_, _, body) = send(&app, get("/api/strata/status")).await;
    let status = json(&body);
    assert_eq!(status["models"][0]["residency"]["split"], split, "the status page's JSON has the same split");

    let (_, _, metrics) = send(&app, get("/metrics")).await;
    let metrics = String::from_utf8(metrics).unwrap();
    for line in [
        "strata_split_info{model=\"moe:latest\",mode=\"n_cpu_moe=1\"} 1",
        "strata_split_experts_total{model=\"moe:latest\",side=\"gpu\"} 40",
        "strata_split_experts_total{model=\"moe:latest\",side=\"cpu\"} 24",
        "strata_split_bytes_total{model=\"moe:latest\",direction=\"down\"} 4096",
        "strata_split_bytes_total{model=\"moe:latest\",direction=\"up\"} 2048",
        "strata_split_crossings_total{model=\"moe:latest\"} 12",
        "strata_split_cpu_seconds_total{model=\"moe:latest\"} 1.5",
        "strata_split_gpu_wait_seconds_total{model=\"moe:latest\"} 0.25",
        "strata_split_uploaded_layers_total{model=\"moe:latest\"} 1",
        "strata_split_replans_total{model=\"moe:latest\"} 2",
        "strata_split_moved_experts_total{model=\"moe:latest\"} 5",
        "strata_split_predicted_seconds_per_token{model=\"moe:latest\"} +Inf",
        "strata_split_layer_experts{model=\"moe:latest\",layer=\"1\",place=\"cpu\"} 7",
        "strata_split_layer_experts{model=\"moe:latest\",layer=\"1\",place=\"storage\"} 1",
        "strata_split_layer_experts{model=\"moe:latest\",layer=\"3\",place=\"vram\"} 5",
        "strata_split_layer_experts{model=\"moe:latest\",layer=\"3\",place=\"streamed\"} 3",
        "# TYPE strata_split_experts_total counter",
        "# TYPE strata_split_layer_experts gauge",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}` in:\n{metrics}");
    }
    // Without a model that has a split, no split metrics.
    state.status.loaded.lock().unwrap().clear();
    let (_, _, metrics) = send(&app, get("/metrics")).await;
    assert!(!String::from_utf8(metrics).unwrap().contains("strata_split_"), "no split, no split metrics");
    drop(sched);
}
