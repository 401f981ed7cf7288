//! Mixture-of-experts models under a memory budget: resident, streamed at budget 0 with
//! no expert cache, with caches of half and of a quarter of the experts under each
//! policy, and with every expert loaded with its layer all give bit-identical logits, for
//! GGUF, safetensors, flat and `.cawsf` sources; at budget 0 and no cache, the bytes read per decoded token are the layer
//! cores plus exactly the experts transformers' routers chose (tools/make_moe_fixtures.py
//! records that routing).

use crate::support;

use std::time::Duration;

use serde::Deserialize;
use strata::engine::session::{Engine, RunOptions};
use strata::format::cawsf::Compression;
use strata::model::LanguageModel;
use strata::model::ModelSource;
use strata::model::convert::{ConvertOptions, Target, convert};
use strata::model::decoder::SeqStep;
use strata::model::spec::Arch;
use strata::sched::ExpertLoading;
use strata::sched::expert_policy::CachePolicy;
use strata::sched::experts::CacheSize;
use support::TempDir;
use support::decode::{PROMPT, logit_bits_for};

fn fixture(rel: &str) -> String {
    format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// Greedy decode steps after the prompt in each logits comparison.
const DECODE_STEPS: usize = 6;

fn run(model: &dyn LanguageModel) -> Vec<u32> {
    logit_bits_for(model, DECODE_STEPS)
}

/// `rel` (a fixture) converted to `target` as `dir/name`.
fn converted(dir: &TempDir, rel: &str, target: Target, name: &str) -> std::path::PathBuf {
    let out = dir.path(name);
    let source = ModelSource::from_path(&fixture(rel)).unwrap();
    convert(
        source,
        &out,
        &ConvertOptions { target, quant: None, threads: 2, ndsq: None, sparse_ffn: None },
        &mut |_| {},
    )
    .unwrap();
    out
}

fn load(spec: &str, budget: Option<u64>, cache: Option<CacheSize>, policy: CachePolicy, all: bool) -> Engine {
    let opts = RunOptions {
        threads: 2,
        memory_budget: budget,
        expert_cache: cache,
        expert_policy: policy,
        expert_loading: if all { ExpertLoading::All } else { ExpertLoading::Routed },
        ..Default::default()
    };
    Engine::load(spec, &opts).unwrap()
}

fn check_bit_identical(spec: &str) {
    let resident = load(spec, None, None, CachePolicy::default(), false);
    let want = run(&*resident.model);
    let e = resident.model.scheduler().summary().experts.expect("a MoE model has an expert cache");
    assert_eq!(e.mode, "resident", "{spec}");
    // A cache of half the experts: hits, and evictions; a quarter of them: more evictions.
    let small = CacheSize::Bytes(e.expert_bytes / 2);
    let quarter = CacheSize::Bytes(e.expert_bytes / 4);
    let mut small_cache_hits = 0;
    let mut cases = vec![(Some(CacheSize::Bytes(0)), CachePolicy::Lru, false)];
    for policy in [CachePolicy::Lru, CachePolicy::Lfu, CachePolicy::Freq] {
        cases.push((Some(small), policy, false));
        cases.push((Some(quarter), policy, false));
    }
    cases.push((None, CachePolicy::default(), true));
    for (cache, policy, all) in cases {
        let streamed = load(spec, Some(0), cache, policy, all);
        let s = streamed.model.scheduler().summary();
        assert_eq!(s.mode, "streaming", "{spec}");
        let what = format!("{spec}: cache {cache:?} {policy:?}, all experts {all}");
        match all {
            false => assert_eq!(s.experts.as_ref().map(|e| e.mode), Some("on_demand"), "{what}"),
            true => assert!(s.experts.is_none(), "{what}: the layers carry their experts"),
        }
        assert!(run(&*streamed.model) == want, "{what}: logits differ from the resident run");
        if let (Some(e), Some(CacheSize::Bytes(b))) = (&s.experts, cache) {
            let after = streamed.model.scheduler().summary().experts.unwrap();
            assert!(after.cached_bytes <= b, "{what}: {} cached over a budget of {b}", after.cached_bytes);
            let hits: u64 = after.layers.iter().map(|l| l.hits).sum();
            assert!(b > 0 || hits == 0, "{what}: {hits} hits without a cache ({} layers)", e.moe_layers);
            small_cache_hits += if cache == Some(small) { hits } else { 0 };
        }
    }
    assert!(small_cache_hits > 0, "{spec}: a cache of half the experts never hit");
}

#[test]
fn gguf_moe_models_stream_bit_identically() {
    for f in [
        "gguf/mixtral.f32.gguf",
        "gguf/qwen2_moe.q8_0.gguf",
        "gguf/qwen3_moe.f32.gguf",
        "gguf/qwen3_next.f32.gguf",
        "gguf/qwen3_5_moe.f32.gguf",
        // latent attention from llama.cpp's split up-projections; GLM's MTP block skipped
        "gguf/deepseek_v3.f32.gguf",
        "gguf/glm4_moe.f32.gguf",
        // K-quant blocks, each expert one aligned range
        "gguf/deepseek_v3_k256.q4_k_m.gguf",
        // gpt-oss: each expert's biases travel with it
        "gguf/gpt_oss.f32.gguf",
        "gguf/gpt_oss.q8_0.gguf",
        // MXFP4 experts, as llama.cpp converts OpenAI's checkpoints
        "gguf/gpt_oss_mxfp4.mxfp4.gguf",
    ] {
        check_bit_identical(&fixture(f));
    }
}

#[test]
fn safetensors_moe_models_stream_bit_identically() {
    // qwen3_moe_mixed: dense layers (decoder_sparse_step, mlp_only_layers) beside a MoE one;
    // qwen3_next: linear-attention layers (their state in the cache) beside attention.
    // deepseek_v3, glm4_moe: grouped sigmoid routing with a bias, shared experts, a dense
    // first layer, and a multi-token-prediction layer in the checkpoint; deepseek_v2:
    // DeepSeek-V2's softmax routing.
    for f in [
        "hf/qwen2_moe",
        "hf/qwen3_moe_mixed",
        "hf/qwen3_next",
        "hf/qwen3_5_moe",
        "hf/deepseek_v3",
        "hf/deepseek_v3_noq",
        "hf/glm4_moe",
        // softmax routing over groups ranked by their best expert
        "hf/deepseek_v2",
    ] {
        check_bit_identical(&fixture(f));
    }
}

#[test]
fn converted_moe_models_stream_bit_identically() {
    let dir = TempDir::new("moe-convert");
    for (src, target, name) in [
        ("hf/mixtral", Target::Flat, "mixtral-flat"),
        ("gguf/qwen2_moe.q8_0.gguf", Target::Cawsf(Compression::None), "qwen2_moe.cawsf"),
        ("hf/qwen3_next", Target::Flat, "qwen3_next-flat"),
        // llama.cpp's layout of the linear-attention tensors, kept through the conversion.
        ("gguf/qwen3_next.f32.gguf", Target::Cawsf(Compression::None), "qwen3_next-gguf.cawsf"),
        ("hf/deepseek_v3", Target::Flat, "deepseek_v3-flat"),
        ("gguf/deepseek_v3.f32.gguf", Target::Cawsf(Compression::None), "deepseek_v3-gguf.cawsf"),
        ("hf/glm4_moe", Target::Cawsf(Compression::None), "glm4_moe.cawsf"),
        // gpt-oss's checkpoint stacks its experts (computed per expert as it is read):
        // converted, each expert and its biases are one range.
        ("hf/gpt_oss", Target::Flat, "gpt_oss-flat"),
        ("hf/gpt_oss", Target::Cawsf(Compression::None), "gpt_oss.cawsf"),
    ] {
        let out = converted(&dir, src, target, name);
        check_bit_identical(out.to_str().unwrap());
    }
}

#[derive(Deserialize)]
struct Reference {
    prompts: Vec<RefPrompt>,
    /// Per prompt, per layer, per position: the experts transformers' router chose
    /// (`None` for a dense layer).
    routing: Vec<Vec<Option<Vec<Vec<usize>>>>>,
}

#[derive(Deserialize)]
struct RefPrompt {
    ids: Vec<u32>,
}

#[test]
fn bytes_read_per_token_are_the_cores_and_the_routed_experts() {
    // qwen3_next: its linear-attention layers are cores like any other.
    // gpt_oss: each expert's biases are part of its range.
    for name in ["qwen3_moe", "qwen3_next", "qwen3_5_moe", "deepseek_v3", "glm4_moe", "gpt_oss"] {
        bytes_read_per_token(name);
    }
}

fn bytes_read_per_token(name: &str) {
    // A flat conversion: each expert is one aligned range of its three tensors
    // (16 x 64 f32 = 4 KiB each, so no padding), read whole; gpt-oss's three biases
    // follow, each padded to the 4 KiB every flat tensor starts at.
    let dir = TempDir::new("moe-bytes");
    let out = converted(&dir, &format!("hf/{name}"), Target::Flat, &format!("{name}-flat"));
    let e = load(out.to_str().unwrap(), Some(0), Some(CacheSize::Bytes(0)), CachePolicy::Lru, false);
    let c = e.model.config().clone();
    let m = c.moe.unwrap();
    let biases = if c.arch == Arch::GptOss { 3 * strata::format::flat::ALIGN as usize } else { 0 };
    let expert_bytes = (3 * m.expert_size * c.hidden_size * 4 + biases) as u64;
    let s = e.model.scheduler();
    let core_bytes = s.summary().plan.streamable_bytes;
    let json = std::fs::read_to_string(fixture(&format!("ref/{name}.json"))).unwrap();
    let r: Reference = serde_json::from_str(&json).unwrap();
    let settle = || std::thread::sleep(Duration::from_millis(100));
    for (p, routing) in r.prompts.iter().zip(&r.routing) {
        let mut cache = e.model.new_cache(64).unwrap();
        // The first token alone, then each next one as a decode step (teacher forcing).
        e.model
            .forward(&mut [SeqStep { tokens: &p.ids[..1], cache: &mut cache, all_logits: false, verify: false }])
            .unwrap();
        settle();
        let before = s.stats().snapshot();
        for t in &p.ids[1..] {
            e.model
                .forward(&mut [SeqStep {
                    tokens: std::slice::from_ref(t),
                    cache: &mut cache,
                    all_logits: false,
                    verify: false,
                }])
                .unwrap();
        }
        settle();
        let w = s.stats().snapshot() - before;
        let steps = (p.ids.len() - 1) as u64;
        // What transformers routed at positions 1.. (each row's experts are distinct).
        let routed: u64 =
            routing.iter().flatten().map(|layer| layer[1..].iter().map(|e| e.len() as u64).sum::<u64>()).sum();
        assert_eq!(w.expert_requests, routed, "{name}: the experts asked for are the ones transformers routed");
        assert_eq!(w.expert_hits, 0, "no cache, no hits");
        let expected = (steps * core_bytes + routed * expert_bytes) as f64;
        let got = w.bytes_read as f64;
        assert!(
            (got - expected).abs() <= 0.1 * expected,
            "{name}: {got} bytes read over {steps} tokens; cores + routed experts are {expected}"
        );
        assert_eq!(w.expert_bytes_read, routed * expert_bytes, "each routed expert is read once, whole");
    }
}

#[test]
fn an_expert_that_cannot_be_read_is_an_error_naming_its_file_and_layer() {
    let dir = TempDir::new("moe-bad");
    let out = converted(&dir, "hf/qwen3_moe", Target::Flat, "qwen3_moe-flat");
    let e = load(out.to_str().unwrap(), Some(0), Some(CacheSize::Bytes(0)), CachePolicy::Lru, false);
    // Cut layer 1's file where its experts begin: its core still reads, its experts not.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let first_expert = manifest["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "model.layers.1.mlp.experts.0.gate_proj.weight")
        .and_then(|t| t["offset"].as_u64())
        .unwrap();
    let file = out.join("layer_001.bin");
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(first_expert).unwrap();
    let mut cache = e.model.new_cache(16).unwrap();
    let err = e
        .model
        .forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }])
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("layer_001.bin") && msg.contains("layer 1") && msg.contains("experts"), "{msg}");
    // The model keeps answering what it can: layer 0's experts still read.
    assert!(e.model.scheduler().summary().experts.unwrap().layers[0].misses > 0);
}

/// Each forward pass is a step of the expert cache's clock: `freq`'s counts decay with
/// it, so on real text it keeps other experts than LFU (were the clock stuck, the two
/// would keep the same ones and tie to the last hit).
#[test]
fn the_freq_policy_decays_with_each_forward_pass() {
    let tokens: Vec<u32> =
        serde_json::from_str(&std::fs::read_to_string(fixture("ref/qwen3_moe_zipf.tokens.json")).unwrap()).unwrap();
    let hits = |policy: CachePolicy| -> u64 {
        let e = load(&fixture("hf/qwen3_moe_zipf"), Some(0), Some(CacheSize::Fraction(0.25)), policy, false);
        let mut cache = e.model.new_cache(1024).unwrap();
        for t in &tokens[..1024] {
            e.model
                .forward(&mut [SeqStep {
                    tokens: std::slice::from_ref(t),
                    cache: &mut cache,
                    all_logits: false,
                    verify: false,
                }])
                .unwrap();
        }
        e.model.scheduler().summary().experts.unwrap().layers.iter().map(|l| l.hits).sum()
    };
    let (lfu, freq) = (hits(CachePolicy::Lfu), hits(CachePolicy::Freq));
    eprintln!("hits over 1024 tokens at 25%: lfu {lfu}, freq {freq}");
    assert_ne!(lfu, freq);
}
