//! Parity with llama.cpp (llama-cpp-python, CPU, F32 KV cache) on tiny GGUF models of
//! each architecture, F32, F16 and quantized by llama.cpp's own quantizer: per-token
//! log-probs of every prompt, top-1 agreement, and tokenization of tricky strings.
//!
//! Fixtures: `tests/fixtures/gguf/<variant>.gguf` and `<variant>.llamacpp.json`, made by
//! `tools/make_llamacpp_fixtures.py` (the F32 `llama3`/`qwen2` files are the ones
//! `tools/make_gguf_fixtures.py` writes). The JSON holds llama.cpp's token ids per prompt,
//! the log-prob of each next token, the argmax at each position, the GGML type of every
//! tensor in the file and llama.cpp's tokenization of the reference's tricky strings.

use crate::support;

use std::path::PathBuf;

use serde::Deserialize;
use strata::engine::session::{Engine, RunOptions};
use strata::format::gguf::GgufFile;
use strata::model::decoder::SeqStep;
use support::{argmax, log_softmax};

/// Every fixture variant: `<model>` is the F32 file, `<model>.<type>` a llama.cpp
/// quantization of it (`f16` or a quantized type).
const VARIANTS: [&str; 42] = [
    "llama3",
    "llama3.f16",
    "llama3.q8_0",
    "llama3.q4_0",
    "qwen2",
    "qwen2.f16",
    "qwen2.q8_0",
    "qwen2.q4_0",
    "mistral.f16",
    "qwen3.f16",
    "llama256.q4_k_s",
    "llama256.q6_k",
    "llama256.q4_k_m",
    // tools/make_arch_fixtures.py: converted by llama.cpp's convert_hf_to_gguf.py
    "gemma2.f32",
    "gemma3.f32",
    "phi3.f32",
    "phi3_partial.f32",
    "olmo2.f32",
    "granite.f32",
    "smollm3.f32",
    "gemma.f32",
    // tools/make_moe_fixtures.py
    "mixtral.f32",
    "mixtral.q8_0",
    "qwen2_moe.f32",
    "qwen2_moe.q8_0",
    "qwen3_moe.f32",
    "qwen3_moe.q8_0",
    // tools/make_hybrid_fixtures.py (converted with --no-mtp)
    "qwen3_next.f32",
    "qwen3_5.f32",
    "qwen3_5_moe.f32",
    // tools/make_mla_fixtures.py (its Q8_0 DeepSeek files route differently from llama.cpp,
    // whose activations are rounded to 8 bits: top-1 0.90-0.94, so they are not kept)
    "deepseek_v3.f32",
    "deepseek_v3_noq.f32",
    "glm4_moe.f32",
    "glm4_moe.q8_0",
    // DeepSeek-V2 routes by softmax; llama.cpp ranks its expert groups by their two best
    // experts (transformers by the best), as Strata does reading a GGUF. (V2's Q8_0 file
    // routes apart as the V3 ones do, top-1 0.90: not kept.)
    "deepseek_v2_lite.f32",
    "deepseek_v2_lite.q8_0",
    "deepseek_v2.f32",
    // DeepSeek-V3 at widths K-quants fit (rows of 256), by llama.cpp's Q4_K_M
    "deepseek_v3_k256.q4_k_m",
    // tools/make_gpt_oss_fixtures.py
    "gpt_oss.f32",
    "gpt_oss.q8_0",
    // llama.cpp's converter keeps the checkpoint's MXFP4 experts
    "gpt_oss_mxfp4.mxfp4",
    // llama.cpp's `llama-quantize … MXFP4_MOE` of that: experts MXFP4, the rest Q8_0
    "gpt_oss_mxfp4.mxfp4_moe",
];

/// F32 weights: only summation order (and llama.cpp's own kernels) differ.
const F32_MAX_DELTA: f64 = 1e-3;
/// F16 weights: llama.cpp also rounds activations to F16 for F16 matmuls.
const F16_MAX_DELTA: f64 = 2e-2;
/// Quantized weights: llama.cpp quantizes activations to Q8 for its dot products.
const QUANT_MIN_TOP1: f64 = 0.95;
const QUANT_MEAN_DELTA: f64 = 0.1;

#[derive(Deserialize)]
struct View {
    llama_cpp_python: String,
    variant: String,
    n_vocab: usize,
    /// `tokenizer.ggml.add_bos_token`: llama.cpp put BOS before each prompt.
    add_bos: bool,
    tensor_types: std::collections::BTreeMap<String, String>,
    prompts: Vec<Prompt>,
    tokenization: Vec<Tokenization>,
}

#[derive(Deserialize)]
struct Prompt {
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<f64>,
    argmax: Vec<u32>,
}

#[derive(Deserialize)]
struct Tokenization {
    text: String,
    /// `llama.tokenize(text, add_bos=False, special=True)`: special tokens parsed, as
    /// Strata's tokenizer always does.
    special: Vec<u32>,
}

/// The fixtures: where this was built, or under the working directory (a copy elsewhere,
/// as on the GPU machine `tools/gpu_check.sh run` uses, where the engines run on cuda:0).
fn dir() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf");
    match built.exists() {
        true => built,
        false => std::env::current_dir().unwrap().join("tests/fixtures/gguf"),
    }
}

fn view(variant: &str) -> View {
    let path = dir().join(format!("{variant}.llamacpp.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn engine(variant: &str) -> Engine {
    let path = dir().join(format!("{variant}.gguf"));
    Engine::load(path.to_str().unwrap(), &RunOptions { threads: 2, ..Default::default() })
        .unwrap_or_else(|e| panic!("{variant}: {e:#}"))
}

/// Measured agreement of one variant with llama.cpp over all prompts.
struct Figures {
    max_delta: f64,
    mean_delta: f64,
    top1: f64,
    n_logprobs: usize,
}

fn measure(variant: &str, v: &View) -> Figures {
    let e = engine(variant);
    assert_eq!(e.model.config().vocab_size, v.n_vocab, "{variant}: vocabulary size");
    let (mut deltas, mut agree, mut positions) = (Vec::new(), 0usize, 0usize);
    for (pi, p) in v.prompts.iter().enumerate() {
        let mut cache = e.model.new_cache(64).unwrap();
        let got = e
            .model
            .forward(&mut [SeqStep { tokens: &p.ids, cache: &mut cache, all_logits: true, verify: false }])
            .unwrap();
        let rows: Vec<&[f32]> = got[0].chunks_exact(v.n_vocab).collect();
        assert_eq!(rows.len(), p.ids.len(), "{variant} prompt {pi}: positions");
        assert_eq!(p.logprobs.len() + 1, p.ids.len(), "{variant} prompt {pi}: fixture log-probs");
        for (i, row) in rows.iter().enumerate() {
            if let Some(&want) = p.logprobs.get(i) {
                deltas.push((log_softmax(row)[p.ids[i + 1] as usize] - want).abs());
            }
            agree += usize::from(argmax(row) == p.argmax[i]);
            positions += 1;
        }
    }
    Figures {
        max_delta: deltas.iter().copied().fold(0.0, f64::max),
        mean_delta: deltas.iter().sum::<f64>() / deltas.len() as f64,
        top1: agree as f64 / positions as f64,
        n_logprobs: deltas.len(),
    }
}

#[test]
fn logprobs_match_llama_cpp() {
    let mut failures = Vec::new();
    for variant in VARIANTS {
        let v = view(variant);
        let f = measure(variant, &v);
        eprintln!(
            "{variant:<16} ({}, llama-cpp-python {}): max |Δ log-prob| {:.2e}, mean {:.2e}, top-1 {:.3} over {} tokens",
            v.variant, v.llama_cpp_python, f.max_delta, f.mean_delta, f.top1, f.n_logprobs
        );
        let ok = match v.variant.as_str() {
            "f32" => f.max_delta <= F32_MAX_DELTA,
            "f16" => f.max_delta <= F16_MAX_DELTA,
            _ => f.top1 >= QUANT_MIN_TOP1 && f.mean_delta <= QUANT_MEAN_DELTA,
        };
        if !ok {
            failures.push(format!(
                "{variant} ({}): max {:.3e} mean {:.3e} top-1 {:.3}",
                v.variant, f.max_delta, f.mean_delta, f.top1
            ));
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:#?}");
}

/// Strata's tokenizer of each GGUF against llama.cpp's on the reference's tricky strings
/// and on the prompts. llama.cpp does not Unicode-normalize byte-level BPE input (not even
/// for `tokenizer.ggml.pre = qwen2`, where transformers applies NFC).
#[test]
fn tokenization_matches_llama_cpp() {
    let mut failures = Vec::new();
    // The tokenizer depends only on the model, not on the weight type: one file per model.
    for variant in [
        "llama3",
        "qwen2",
        "mistral.f16",
        "qwen3.f16",
        "llama256.q4_k_s",
        "gemma2.f32",
        "gemma3.f32",
        "phi3.f32",
        "olmo2.f32",
        "granite.f32",
        "smollm3.f32",
        "gemma.f32",
    ] {
        let v = view(variant);
        let e = engine(variant);
        for t in &v.tokenization {
            let got = e.tokenizer.encode(&t.text, false).unwrap();
            if got != t.special {
                failures.push(format!("{variant} {:?}:\n  strata    {got:?}\n  llama.cpp {:?}", t.text, t.special));
            }
        }
        for p in &v.prompts {
            let got = e.tokenizer.encode(&p.text, v.add_bos).unwrap();
            if got != p.ids {
                failures.push(format!("{variant} prompt {:?}:\n  strata    {got:?}\n  llama.cpp {:?}", p.text, p.ids));
            }
        }
    }
    assert!(failures.is_empty(), "{} strings tokenized differently:\n{}", failures.len(), failures.join("\n"));
}

/// The files hold the GGML types they are named for (llama.cpp falls back to other types
/// for K-quants on rows that are not a multiple of 256), and Strata reads the same types.
#[test]
fn fixtures_hold_the_types_they_claim() {
    for variant in VARIANTS {
        let v = view(variant);
        let f = GgufFile::open(&dir().join(format!("{variant}.gguf"))).unwrap();
        for info in &f.infos {
            let want = v.tensor_types.get(&info.name).unwrap_or_else(|| panic!("{variant}: no {}", info.name));
            assert_eq!(ggml_name(info.ggml_type), want, "{variant} {}", info.name);
        }
        let count = |ty: &str| v.tensor_types.values().filter(|t| *t == ty).count();
        let main = match v.variant.as_str() {
            "f32" => "F32",
            "f16" => "F16",
            "q8_0" => "Q8_0",
            "q4_0" => "Q4_0",
            "q4_k_s" | "q4_k_m" => "Q4_K",
            "q6_k" => "Q6_K",
            "mxfp4" | "mxfp4_moe" => "MXFP4",
            other => panic!("{variant}: unknown variant {other}"),
        };
        assert!(count(main) > 0, "{variant}: no {main} tensor in {:?}", v.tensor_types);
    }
}

fn ggml_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        30 => "BF16",
        39 => "MXFP4",
        _ => "other",
    }
}

/// llama.cpp's converter keeps what the forward pass needs: the config read from each
/// converted GGUF's metadata equals the one read from the checkpoint's config.json,
/// and the GGUF model gives the checkpoint's logits.
#[test]
fn gguf_metadata_gives_the_checkpoint_config() {
    use strata::model::ModelSource;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for name in ["gemma", "gemma2", "gemma3", "phi3", "phi3_partial", "olmo2", "granite", "smollm3"] {
        let gguf = ModelSource::from_path(root.join(format!("gguf/{name}.f32.gguf")).to_str().unwrap()).unwrap();
        let hf = ModelSource::from_path(root.join(format!("hf/{name}")).to_str().unwrap()).unwrap();
        let (mut a, b) = (gguf.config.clone(), hf.config.clone());
        // Not in the GGUF, and not used by these models' layers: the local RoPE base of
        // families without local layers.
        if !b.layers.iter().any(|l| l.rope == strata::model::config::LayerRope::Local) {
            a.rope_local_theta = b.rope_local_theta;
        }
        assert_eq!(a, b, "{name}");
    }
}
