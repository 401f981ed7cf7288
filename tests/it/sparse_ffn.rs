//! Gate-predicted sparse FFN: `convert --sparse-ffn` stores neuron-group bundles; the
//! dense run of a bundled model matches the original, `topk=1` is bit-identical to it,
//! streaming reads only the kept groups (and gives the resident run's logits), the kept
//! fraction is counted, and bad settings are refused with the field or architecture
//! named. (Random-weight fixtures: mechanics only. Quality on a real model is in
//! docs/benchmarks.md, "Sparse FFN".)

use crate::support;

use std::process::Command;

use strata::engine::session::{Engine, RunOptions};
use strata::format::cawsf::Compression;
use strata::model::ModelSource;
use strata::model::convert::{ConvertOptions, Target, convert};
use strata::model::sparse::SparseFfn;
use strata::sched::experts::CacheSize;
use support::TempDir;
use support::decode::{decode_window, logit_bits};

fn fixture(rel: &str) -> String {
    format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// The llama3 fixture (FFN width 160, F32) with its FFNs as bundles of `group` neurons.
fn bundled(dir: &TempDir, target: Target, group: usize) -> String {
    let name = match target {
        Target::Flat => format!("llama3-sparse{group}.flat"),
        Target::Cawsf(_) => format!("llama3-sparse{group}.cawsf"),
    };
    let out = dir.path(&name);
    let opts = ConvertOptions { target, quant: None, threads: 2, ndsq: None, sparse_ffn: Some(group) };
    convert(ModelSource::from_path(&fixture("hf/llama3")).unwrap(), &out, &opts, &mut |_| {}).unwrap();
    out.to_str().unwrap().to_string()
}

fn load(spec: &str, sparse: &str, budget: Option<u64>) -> Engine {
    let opts = RunOptions {
        threads: 2,
        memory_budget: budget,
        expert_cache: budget.map(|_| CacheSize::Bytes(0)),
        sparse_ffn: SparseFfn::parse(sparse).unwrap(),
        ..Default::default()
    };
    Engine::load(spec, &opts).unwrap()
}

fn floats(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|&b| f32::from_bits(b)).collect()
}

#[test]
fn a_bundled_model_runs_dense_as_the_original_and_topk_one_is_identical() {
    let dir = TempDir::new("sparse-dense");
    let original = floats(&logit_bits(&*load(&fixture("hf/llama3"), "off", None).model));
    for target in [Target::Flat, Target::Cawsf(Compression::None)] {
        let spec = bundled(&dir, target, 32);
        let source = ModelSource::from_path(&spec).unwrap();
        assert_eq!(source.config.neuron_group, Some(32), "{spec}");
        assert!(source.tensors.contains_key("model.layers.1.mlp.neurons.4.down_proj.weight"));
        assert!(!source.tensors.contains_key("model.layers.1.mlp.up_proj.weight"));
        let dense = logit_bits(&*load(&spec, "off", None).model);
        // The same products, summed group by group: float rounding apart.
        let err = floats(&dense).iter().zip(&original).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 1e-4, "{spec}: the dense run of the bundles is {err} from the original");
        for setting in ["topk=1", "topk=1,per=sequence", "threshold=0"] {
            let got = logit_bits(&*load(&spec, setting, None).model);
            assert!(got == dense, "{spec}: {setting} differs from the dense run of the same model");
        }
        // Fewer groups change the result (the mechanics are live), and stay finite.
        let half = logit_bits(&*load(&spec, "topk=0.4", None).model);
        assert!(half != dense && floats(&half).iter().all(|v| v.is_finite()), "{spec}");
    }
}

#[test]
fn streaming_reads_only_the_kept_groups_and_keeps_the_resident_logits() {
    let dir = TempDir::new("sparse-stream");
    let spec = bundled(&dir, Target::Flat, 16); // 10 groups of 16 neurons a layer
    let steps = 20;
    let dense = load(&spec, "off", Some(0));
    assert!(dense.model.scheduler().is_streaming());
    let w_dense = decode_window(&*dense.model, steps);
    // Keeping every group, they are read with their layers through the prefetch ring,
    // as a dense model's layers are: no group is asked of the cache.
    assert_eq!(w_dense.expert_requests, 0);
    assert!(w_dense.neuron_groups_total > 0 && w_dense.neuron_groups_kept == w_dense.neuron_groups_total);
    for (setting, kept) in [("topk=0.5", 0.5), ("topk=0.3", 0.3)] {
        let e = load(&spec, setting, Some(0));
        let w = decode_window(&*e.model, steps);
        let per_token = |w: &strata::sched::StatsSnapshot| w.bytes_read as f64 / steps as f64;
        assert_eq!(w.neuron_groups_total, w_dense.neuron_groups_total);
        let fraction = w.neuron_groups_kept as f64 / w.neuron_groups_total as f64;
        assert!((fraction - kept).abs() < 1e-9, "{setting}: kept {fraction}");
        // With no neuron cache every kept group is one read, and nothing else of the FFN.
        assert_eq!(w.expert_requests, w.neuron_groups_kept, "{setting}");
        assert_eq!(w.expert_hits, 0);
        assert!(
            per_token(&w) <= 0.85 * per_token(&w_dense),
            "{setting}: {} bytes a token against {} dense",
            per_token(&w),
            per_token(&w_dense)
        );
        // Streamed, the kept groups give the resident run's logits.
        let resident = logit_bits(&*load(&spec, setting, None).model);
        assert!(logit_bits(&*e.model) == resident, "{setting}: streaming changed the logits");
    }
    // A cache as large as the groups serves them all from memory after the first pass.
    let opts = RunOptions {
        threads: 2,
        memory_budget: Some(0),
        expert_cache: Some(CacheSize::Fraction(1.0)),
        sparse_ffn: SparseFfn::parse("topk=0.5").unwrap(),
        ..Default::default()
    };
    let e = Engine::load(&spec, &opts).unwrap();
    decode_window(&*e.model, 2);
    let w = decode_window(&*e.model, steps);
    assert!(w.expert_hits == w.expert_requests && w.expert_requests > 0 && w.expert_bytes_read == 0, "{w:?}");
    let summary = e.model.scheduler().summary().experts.expect("a neuron-group cache");
    assert_eq!((summary.unit, summary.experts_per_layer), ("neuron_group", 10));
}

#[test]
fn models_that_cannot_be_sparse_are_refused_naming_why() {
    let dir = TempDir::new("sparse-refused");
    // Not SwiGLU, experts instead of one FFN, gate and up fused: refused at conversion.
    for (rel, want) in [("hf/gemma", "gemma"), ("hf/qwen3_moe", "mixture-of-experts"), ("hf/phi3", "fused")] {
        let out = dir.path(&format!("{}.flat", rel.replace('/', "-")));
        let opts = ConvertOptions { target: Target::Flat, quant: None, threads: 1, ndsq: None, sparse_ffn: Some(0) };
        let err = convert(ModelSource::from_path(&fixture(rel)).unwrap(), &out, &opts, &mut |_| {}).unwrap_err();
        assert!(strata::cli::refused_in_chain(&err), "{rel}: {err:#}");
        assert!(format!("{err:#}").contains(want), "{rel}: {err:#}");
        assert!(!out.exists(), "{rel}: nothing is written");
    }
    // A group that does not divide the width.
    let out = dir.path("bad-group.flat");
    let opts = ConvertOptions { target: Target::Flat, quant: None, threads: 1, ndsq: None, sparse_ffn: Some(48) };
    let err = convert(ModelSource::from_path(&fixture("hf/llama3")).unwrap(), &out, &opts, &mut |_| {}).unwrap_err();
    assert!(format!("{err:#}").contains("divide the FFN width 160"), "{err:#}");
    // A bundled model has no GGUF layout: export refuses it and writes nothing.
    let spec = bundled(&dir, Target::Flat, 32);
    let gguf = dir.path("bundled.gguf");
    let err = strata::engine::export::export(&ModelSource::from_path(&spec).unwrap(), &gguf, None, 1).unwrap_err();
    assert!(format!("{err:#}").contains("neuron-group bundles") && !gguf.exists(), "{err:#}");
    // Converted again without --sparse-ffn, the bundles stay (and run as before).
    let again = dir.path("again.flat");
    let opts = ConvertOptions { target: Target::Flat, quant: None, threads: 1, ndsq: None, sparse_ffn: None };
    convert(ModelSource::from_path(&spec).unwrap(), &again, &opts, &mut |_| {}).unwrap();
    let again = again.to_str().unwrap();
    assert!(logit_bits(&*load(again, "off", None).model) == logit_bits(&*load(&spec, "off", None).model));
    // A model without bundles: sparse settings are refused when it loads; `off` runs.
    let opts = RunOptions { sparse_ffn: SparseFfn::parse("topk=0.5").unwrap(), ..Default::default() };
    let err = Engine::load(&fixture("hf/llama3"), &opts).err().expect("refused");
    assert!(strata::cli::refused_in_chain(&err), "{err:#}");
    assert!(format!("{err:#}").contains("without neuron-group bundles"), "{err:#}");
}

fn strata(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("running strata")
}

#[test]
fn the_cli_exits_with_2_on_bad_settings() {
    let dir = TempDir::new("sparse-cli");
    let text = dir.path("text.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog.").unwrap();
    let llama = fixture("hf/llama3");
    let text = text.to_str().unwrap();
    let zero = dir.path("zero.flat");
    let zero = zero.to_str().unwrap();
    for (args, want) in [
        (vec!["perplexity", &llama, "--file", text, "--sparse-ffn", "topk=1.5"], "(0, 1]"),
        (vec!["perplexity", &llama, "--file", text, "--sparse-ffn", "threshold=-1"], "at least 0"),
        (vec!["perplexity", &llama, "--file", text, "--sparse-ffn", "topk=0.5"], "without neuron-group bundles"),
        (vec!["run", &llama, "-p", "hi", "-n", "2", "--sparse-ffn", "topk=0.5"], "without neuron-group bundles"),
        // 0 is refused, not taken for the default size.
        (
            vec!["convert", &llama, zero, "--sparse-ffn", "--sparse-group", "0"],
            "'--sparse-group <NEURONS>': a group holds from 1 neuron up to the FFN width",
        ),
    ] {
        let out = strata(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    let out = dir.path("gemma.flat");
    let convert = strata(&["convert", &fixture("hf/gemma"), out.to_str().unwrap(), "--sparse-ffn"]);
    assert_eq!(convert.status.code(), Some(2), "{}", String::from_utf8_lossy(&convert.stderr));

    // A bundled model: perplexity reports the kept fraction and compares with itself.
    let spec = bundled(&dir, Target::Flat, 32);
    let out =
        strata(&["perplexity", &spec, "--file", text, "--sparse-ffn", "topk=0.6", "--reference", &spec, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["sparse_ffn"]["setting"], "topk=0.6");
    assert!((j["sparse_ffn"]["kept_fraction"].as_f64().unwrap() - 0.6).abs() < 1e-9, "{j}");
    let kl = j["against"]["kl_mean"].as_f64().unwrap();
    assert!(kl > 0.0 && kl.is_finite(), "{j}");
    let out = strata(&["perplexity", &spec, "--file", text, "--sparse-ffn", "topk=1", "--reference", &spec, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["against"]["kl_mean"].as_f64(), Some(0.0), "{j}");
    assert_eq!(j["against"]["top1_agreement"].as_f64(), Some(1.0), "{j}");
}
