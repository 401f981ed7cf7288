//! Layer streaming: a model run under a memory budget gives log-probs bit-identical to
//! the fully resident run, for flat, `.cawsf`, GGUF and safetensors sources, at budgets of
//! 100%, 50%, 25% and 0 of the layer weights; reads per decoded token match what the plan
//! leaves streamed; resident bytes stay within the budget; KV-cache pressure evicts and
//! re-admits pinned layers; the LRU and reload baselines agree too; a file that goes bad
//! under a running model is an error naming it.

use crate::support;

use std::path::Path;
use std::sync::Arc;

use strata::backend::cpu::CpuBackend;
use strata::engine::session::{Engine, RunOptions};
use strata::format::cawsf::Compression;
use strata::model::ModelSource;
use strata::model::config::ModelConfig;
use strata::model::convert::{ConvertOptions, Target, convert};
use strata::model::decoder::{DecoderModel, SeqStep};
use strata::model::demo::demo_source;
use strata::sched::{Policy, SchedOptions};
use support::TempDir;
use support::decode::{PROMPT, decode_window, logit_bits as run};

fn fixture(rel: &str) -> String {
    format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// The demo model (4 layers) written to `out` as a flat directory or `.cawsf` file.
fn demo_as(out: &Path, target: Target) {
    let opts = ConvertOptions { target, quant: None, threads: 2, ndsq: None, sparse_ffn: None };
    convert(demo_source().unwrap(), out, &opts, &mut |_| {}).unwrap();
}

fn load(spec: &str, budget: Option<u64>, policy: Policy) -> Engine {
    let opts = RunOptions { threads: 2, memory_budget: budget, policy, ..Default::default() };
    Engine::load(spec, &opts).unwrap()
}

/// Layer bytes a streaming scheduler governs for `spec` (read-buffer sizes, which include
/// the alignment of each read).
fn streamable(spec: &str) -> u64 {
    load(spec, Some(0), Policy::Pinned).model.scheduler().streamable_bytes() as u64
}

/// Every source at every budget (and every policy) gives the resident run's logits.
fn check_bit_identical(spec: &str) {
    let resident = load(spec, None, Policy::Pinned);
    assert!(!resident.model.scheduler().is_streaming());
    let want = run(&*resident.model);
    let total = streamable(spec);
    for (pct, policy) in [
        (100, Policy::Pinned),
        (50, Policy::Pinned),
        (25, Policy::Pinned),
        (0, Policy::Pinned),
        (50, Policy::Lru),
        (0, Policy::Reload),
    ] {
        let budget = total * pct / 100;
        let e = load(spec, Some(budget), policy);
        let s = e.model.scheduler();
        assert_eq!(s.is_streaming(), pct < 100, "{spec} at {pct}%");
        let got = run(&*e.model);
        assert!(got == want, "{spec}: logits differ at a budget of {pct}% ({policy:?})");
        if pct < 100 {
            assert!(s.resident_bytes() as u64 <= budget, "{spec} at {pct}%: resident above the budget");
            let summary = s.summary();
            assert_eq!(summary.mode, "streaming");
            assert_eq!(summary.plan.resident_count + summary.plan.streamed_count, e.model.config().n_layers);
        }
    }
}

#[test]
fn flat_directory_streams_bit_identically() {
    let dir = TempDir::new("stream-flat");
    let out = dir.path("demo-flat");
    demo_as(&out, Target::Flat);
    check_bit_identical(out.to_str().unwrap());
}

#[test]
fn cawsf_file_streams_bit_identically() {
    let dir = TempDir::new("stream-cawsf");
    let out = dir.path("demo.cawsf");
    demo_as(&out, Target::Cawsf(Compression::None));
    check_bit_identical(out.to_str().unwrap());
}

#[test]
fn gguf_files_stream_bit_identically() {
    // llama (Q/K rows un-permuted after each read) and qwen2 (biases), block-quantized;
    // gemma2 (norms stored `1 + w`, fixed up after each read) and phi3 (fused projections
    // split by rows of the read buffer).
    for f in [
        "gguf/llama3.q4_0.gguf",
        "gguf/qwen2.q8_0.gguf",
        "gguf/llama256.q4_k_m.gguf",
        "gguf/gemma2.f32.gguf",
        "gguf/phi3.f32.gguf",
    ] {
        check_bit_identical(&fixture(f));
    }
}

#[test]
fn safetensors_directories_stream_bit_identically() {
    for f in ["hf/qwen2", "hf/llama_bf16_256", "hf/gemma3", "hf/phi3_partial"] {
        check_bit_identical(&fixture(f));
    }
}

#[test]
fn bytes_read_per_token_are_the_streamed_layers() {
    let dir = TempDir::new("stream-bytes");
    let out = dir.path("demo-flat");
    demo_as(&out, Target::Flat);
    let spec = out.to_str().unwrap();
    let total = streamable(spec);
    let steps = 40;
    for pct in [0, 25, 50, 75] {
        let e = load(spec, Some(total * pct / 100), Policy::Pinned);
        let s = e.model.scheduler();
        let expected = (s.streamable_bytes() - s.resident_bytes()) as f64;
        let w = decode_window(&*e.model, steps);
        let per_token = w.bytes_read as f64 / steps as f64;
        assert!(
            (per_token - expected).abs() <= 0.1 * expected.max(1.0),
            "{pct}%: {per_token} bytes read per token, expected {expected}"
        );
        let n = e.model.config().n_layers as u64;
        assert_eq!(w.layer_requests, n * steps as u64);
        let resident = s.summary().plan.resident_count as u64;
        assert_eq!(w.layer_hits, resident * steps as u64, "{pct}%: hits are the resident layers");
        assert_eq!(w.seeks, 0, "{pct}%: cyclic access never redirects the prefetch");
    }

    // The baselines: plain LRU over half the layers gets no hits on cyclic access and
    // reads everything; reload reads everything.
    for policy in [Policy::Lru, Policy::Reload] {
        let e = load(spec, Some(total / 2), policy);
        let w = decode_window(&*e.model, steps);
        assert_eq!(w.layer_hits, 0, "{policy:?}");
        let per_token = w.bytes_read as f64 / steps as f64;
        assert!((per_token - total as f64).abs() <= 0.1 * total as f64, "{policy:?}: {per_token} of {total}");
    }
}

#[test]
fn buffered_reads_match_direct_ones() {
    let dir = TempDir::new("stream-buffered");
    let out = dir.path("demo-flat");
    demo_as(&out, Target::Flat);
    let source = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    let config = ModelConfig::from_json(&source.config_json).unwrap();
    let backend = Arc::new(CpuBackend::new(2));
    let resident = DecoderModel::new(config.clone(), &source, backend.clone()).unwrap();
    let opts = SchedOptions { budget: Some(0), buffered: true, ..Default::default() };
    let streamed = DecoderModel::with_options(config, &source, backend, &opts).unwrap();
    assert_eq!(streamed.scheduler().summary().direct_io, Some(false));
    assert!(run(&streamed) == run(&resident));
}

#[test]
fn kv_cache_pressure_evicts_pinned_layers_and_memory_back_readmits_them() {
    let dir = TempDir::new("stream-pressure");
    let out = dir.path("demo-flat");
    demo_as(&out, Target::Flat);
    let source = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    let config = ModelConfig::from_json(&source.config_json).unwrap();
    let backend = Arc::new(CpuBackend::new(2));
    let want = run(&DecoderModel::new(config.clone(), &source, backend.clone()).unwrap());

    let total = streamable(out.to_str().unwrap());
    let per_layer = total / config.n_layers as u64;
    // Three layers' worth, and room for a 64-position cache (what `run` makes) only.
    let kv_per_position = (2 * config.n_layers * config.n_kv_heads * config.head_dim * 4) as u64;
    let opts =
        SchedOptions { budget: Some(3 * per_layer), runtime_allowance: 64 * kv_per_position, ..Default::default() };
    let model = DecoderModel::with_options(config, &source, backend, &opts).unwrap();
    let s = model.scheduler();
    assert_eq!(s.summary().plan.resident_layers, "0-1,3");
    assert!(run(&model) == want);

    // A cache two layers' bytes beyond the allowance presses the budget down to one
    // layer: the middle layer goes first, then the least recently used edge.
    let over = (2 * per_layer).div_ceil(kv_per_position);
    // (Caches grow by need: this one is grown to its capacity at once.)
    let mut big = model.new_cache(64 + over as usize).unwrap();
    model.reserve_cache(&mut big, 64 + over as usize).unwrap();
    let summary = s.summary().plan;
    assert_eq!(summary.resident_layers, "3", "{summary:?}");
    assert_eq!(summary.budget_bytes, 3 * per_layer - over * kv_per_position);
    assert!(s.resident_bytes() as u64 <= summary.budget_bytes);
    assert!(run(&model) == want, "logits change under pressure");

    // Freed: the plan re-admits them, and they become resident as they next stream by,
    // without another read.
    drop(big);
    assert_eq!(s.summary().plan.resident_layers, "0-1,3");
    assert!(run(&model) == want);
    let w = decode_window(&model, 20);
    assert_eq!(w.bytes_read, 20 * per_layer, "after re-admission only layer 2 streams");
}

#[test]
fn a_layer_file_that_goes_bad_is_an_error_naming_it() {
    let dir = TempDir::new("stream-bad");
    let out = dir.path("demo-flat");
    demo_as(&out, Target::Flat);
    let e = load(out.to_str().unwrap(), Some(0), Policy::Pinned);
    let layer = out.join("layer_002.bin");
    std::fs::OpenOptions::new().write(true).open(&layer).unwrap().set_len(4096).unwrap();
    let mut cache = e.model.new_cache(16).unwrap();
    let err = e
        .model
        .forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }])
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("layer_002.bin") && msg.contains("layer 2"), "{msg}");
}

#[test]
fn bench_reports_the_plan_and_storage_counters() {
    let dir = TempDir::new("stream-bench");
    let out = dir.path("demo-flat");
    demo_as(&out, Target::Flat);
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["bench", out.to_str().unwrap(), "--json", "--memory-budget", "0", "--prompt-tokens", "4"])
        .args(["--gen-tokens", "16", "--runs", "2", "--threads", "2"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let r: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    for key in [
        "prefill_tok_s",
        "decode_tok_s",
        "weights_bytes",
        "peak_rss_bytes",
        "storage_roofline_tok_s",
        "storage_bandwidth_small_buffer_bytes_s",
    ] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {r}");
    }
    // The memory probe reads a buffer the size of a decode step's weights (whole MiB per
    // thread, at least one each), not a fixed 1 GiB.
    let (buffer, weights) =
        (r["mem_bandwidth_buffer_bytes"].as_u64().unwrap(), r["weight_bytes_per_token"].as_u64().unwrap());
    assert!(buffer % (2 << 20) == 0 && buffer <= weights.max(2 << 20), "{buffer} for {weights}");
    let streamable = r["streamable_bytes"].as_f64().unwrap();
    let per_token = r["bytes_read_per_token"].as_f64().unwrap();
    assert!((per_token - streamable).abs() <= 0.1 * streamable, "{per_token} of {streamable}");
    assert_eq!(r["resident_bytes"], 0);
    assert_eq!(r["cache_hit_rate"], 0.0);
    assert!((0.0..=1.0).contains(&r["io_stall_fraction"].as_f64().unwrap()));
    assert_eq!(r["plan"]["mode"], "streaming");
    assert_eq!(r["plan"]["streamed_count"], 4);

    // A size that is not one is a usage error, not a panic.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["bench", "strata-demo", "--memory-budget", "lots"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
}
