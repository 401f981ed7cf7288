//! `strata export` (issue 22): every committed fixture of a family llama.cpp runs exports
//! to a GGUF that reads back as the same model: the same config, the same tensor values,
//! the same tokenization, and, run by Strata, the same logits. What llama.cpp itself does
//! with the exports (it needs llama-cpp-python, which CI does not build) is measured by
//! `tools/export_vs_llamacpp.py` and recorded in docs/parity.md.

use crate::support;

use strata::engine::export::export;
use strata::engine::session::{Engine, RunOptions};
use strata::engine::tokenizer::TextTokenizer;
use strata::model::ModelSource;
use strata::model::decoder::SeqStep;
use strata::quant::ReadF32;
use strata::tensor::DType;
use support::TempDir;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every position's logits of `ids` through a model loaded from `path`.
fn logits(path: &str, ids: &[u32]) -> Vec<f32> {
    let e = Engine::load(path, &RunOptions { threads: 2, ..Default::default() })
        .unwrap_or_else(|e| panic!("{path}: {e:#}"));
    let mut cache = e.model.new_cache(ids.len() + 1).unwrap();
    e.model
        .forward(&mut [SeqStep { tokens: ids, cache: &mut cache, all_logits: true, verify: false }])
        .unwrap()
        .remove(0)
}

/// A source and its export: tensors equal value for value (llama.cpp's Q/K order and
/// Gemma's `1 + w` undone on reading), logits within `tol`.
fn round_trip(rel: &str, quant: Option<DType>, tol: f32) {
    let dir = TempDir::new("export");
    let src_path = root().join("tests/fixtures").join(rel);
    let src = ModelSource::from_path(src_path.to_str().unwrap()).unwrap();
    let out = dir.path("out.gguf");
    let report = export(&src, &out, quant, 2).unwrap_or_else(|e| panic!("{rel}: {e:#}"));
    let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    // A hybrid's linear-attention tensors come back in llama.cpp's layout, under its names.
    if quant.is_none() && src.config.linear_attn.is_none() {
        for (name, t) in &src.tensors {
            // Multi-token-prediction layers are not exported.
            let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
            if layer.is_some_and(|l| l >= src.config.n_layers) {
                continue;
            }
            // Latent attention's up-projection comes back split and transposed as
            // llama.cpp's converter leaves it; the logits below check it.
            if name.ends_with("self_attn.kv_b_proj.weight") {
                assert!(back.tensors.contains_key(&name.replace("kv_b_proj", "k_b_proj")), "{rel}: `{name}`");
                continue;
            }
            let b = back.tensors.get(name).unwrap_or_else(|| panic!("{rel}: `{name}` missing from the export"));
            assert_eq!(b.shape, t.shape, "{rel}: `{name}` shape");
            let (x, y) = (t.to_f32_vec(), b.to_f32_vec());
            let worst = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            // Gemma's norms go through `1 + w` and back in f32.
            assert!(worst <= 1e-6, "{rel}: `{name}` differs by {worst}");
        }
    }
    let vocab = src.config.vocab_size as u32;
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let (a, b) = (logits(src_path.to_str().unwrap(), &ids), logits(out.to_str().unwrap(), &ids));
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    eprintln!(
        "{rel} ({:?}): {} tensors, tokenizer {}, max |Δ logit| {worst:.2e}",
        quant, report.tensors, report.tokenizer
    );
    assert!(worst <= tol, "{rel}: the export's logits differ by {worst}");
}

#[test]
fn hugging_face_fixtures_export_to_gguf_that_reads_back_the_same() {
    for rel in [
        "hf/llama3",
        "hf/qwen2",
        "hf/qwen3",
        "hf/gemma",
        "hf/gemma2",
        "hf/gemma3",
        "hf/phi3",
        "hf/olmo2",
        "hf/granite",
        "hf/smollm3",
        "hf/mixtral",
        "hf/qwen2_moe",
        "hf/qwen3_moe",
        "hf/llama_bf16_256",
        "hf/llama_spm",
        "hf/deepseek_v3",
        "hf/deepseek_v3_noq",
        "hf/glm4_moe",
        "hf/gpt_oss",
    ] {
        round_trip(rel, None, 1e-5);
    }
}

/// A SentencePiece `tokenizer.json` (`hf/llama_spm`: transformers' conversion of
/// `gguf/spm.gguf`) exports as llama.cpp's `llama` vocabulary, scores from the merges;
/// the report says where llama.cpp tokenizes otherwise (text after a special token).
#[test]
fn a_sentencepiece_tokenizer_json_exports_as_a_llama_vocabulary() {
    let dir = TempDir::new("export-spm");
    let src = ModelSource::from_path(root().join("tests/fixtures/hf/llama_spm").to_str().unwrap()).unwrap();
    let out = dir.path("spm.gguf");
    let report = export(&src, &out, None, 2).unwrap();
    assert_eq!(report.tokenizer, "llama");
    assert!(report.note.as_deref().is_some_and(|n| n.contains("special token")), "{report:?}");
    // Read back, the vocabulary splits plain text as the source's tokenizer does.
    let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    let (a, b) = (TextTokenizer::for_model(&src).unwrap(), TextTokenizer::for_model(&back).unwrap());
    assert!(report.note.as_deref().is_some_and(|n| n.contains("starts with spaces")), "{report:?}");
    for text in ["Hello world, it's 2026!", "two  spaces\n\ttab", "naïve café 日本語 🙂"] {
        assert_eq!(a.encode(text, true).unwrap(), b.encode(text, true).unwrap(), "{text:?}");
    }
}

/// Qwen3-Next and Qwen3.5 (dense and MoE) export in the layout llama.cpp's converter
/// writes (`in_proj_qkvz` split, `-exp(A_log)`, Qwen3.5's value heads tiled), which
/// Strata reads back to the same logits; the convolution stays F32 whatever `--quant`
/// says (llama.cpp's kernel takes nothing else). llama.cpp's own log-probs on these
/// exports are in docs/parity.md.
#[test]
fn hybrid_fixtures_export_in_llama_cpp_layout_and_compute_the_same() {
    for rel in ["hf/qwen3_next", "hf/qwen3_5", "hf/qwen3_5_moe"] {
        // The output projection's columns move with the value heads, so its sums add in
        // another order (float rounding, not a different computation: 0 for Qwen3-Next).
        round_trip(rel, None, 1e-4);
        let dir = TempDir::new("export-hybrid");
        let src = ModelSource::from_path(root().join("tests/fixtures").join(rel).to_str().unwrap()).unwrap();
        let out = dir.path("q.gguf");
        export(&src, &out, Some(DType::F16), 2).unwrap();
        let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
        let la = back.config.linear_attn.expect("a hybrid");
        assert!(la.gguf_layout);
        assert_eq!(la.v_tiled, rel != "hf/qwen3_next", "{rel}");
        let conv: Vec<_> = back.tensors.iter().filter(|(n, _)| n.ends_with("linear_attn.conv1d.weight")).collect();
        assert!(!conv.is_empty() && conv.iter().all(|(_, t)| t.dtype == DType::F32), "{rel}");
        assert!(back.tensors.keys().any(|n| n.ends_with("linear_attn.ssm_a")), "{rel}");
        assert!(!back.tensors.keys().any(|n| n.ends_with("A_log") || n.ends_with("in_proj_qkvz.weight")), "{rel}");
    }
}

#[test]
fn gguf_fixtures_export_as_stored() {
    for rel in [
        "gguf/llama3.q4_0.gguf",
        "gguf/spm.gguf",
        "gguf/mixtral.q8_0.gguf",
        "gguf/llama256.q4_k_m.gguf",
        "gguf/gpt_oss.f32.gguf",
    ] {
        round_trip(rel, None, 0.0);
    }
}

/// `--quant` to a block format: the export holds the blocks `strata convert` would make
/// (norms, biases and routers as they were), so it computes what the converted model
/// computes. (A float `--quant` differs from `convert`'s there: GGUF keeps norms F32.)
#[test]
fn quantized_exports_compute_what_the_converted_model_does() {
    let dir = TempDir::new("export-quant");
    for (rel, q) in [
        ("hf/llama3", DType::Q8_0),
        ("hf/llama_bf16_256", DType::Q4_K),
        ("hf/qwen2_moe", DType::Q8_0),
        ("hf/gemma2", DType::Q4_0),
        ("hf/qwen2_moe", DType::Mxfp4),
        ("hf/gpt_oss", DType::Q8_0),
    ] {
        let src_path = root().join("tests/fixtures").join(rel);
        let src = ModelSource::from_path(src_path.to_str().unwrap()).unwrap();
        let tag = rel.trim_start_matches("hf/");
        let flat = dir.path(&format!("{tag}.{}.flat", q.name()));
        let opts = strata::model::convert::ConvertOptions {
            target: strata::model::convert::Target::Flat,
            quant: Some(q),
            threads: 2,
            ndsq: None,
            sparse_ffn: None,
        };
        strata::model::convert::convert(src, &flat, &opts, &mut |_| {}).unwrap();
        let src = ModelSource::from_path(src_path.to_str().unwrap()).unwrap();
        let out = dir.path(&format!("{tag}.{}.gguf", q.name()));
        export(&src, &out, Some(q), 2).unwrap();
        let ids: Vec<u32> = (0..24u32).map(|i| (i * 31 + 5) % src.config.vocab_size as u32).collect();
        let (a, b) = (logits(flat.to_str().unwrap(), &ids), logits(out.to_str().unwrap(), &ids));
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        eprintln!("{rel} --quant {}: max |Δ logit| against `convert --quant` {worst:.2e}", q.name());
        assert!(worst <= 1e-5, "{rel} {q:?}: {worst}");
    }
}

#[test]
fn what_gguf_cannot_hold_is_refused_and_nothing_is_left() {
    let dir = TempDir::new("export-refused");
    let out = dir.path("h.gguf");
    // Mistral runs in llama.cpp as `llama`, without its sliding window: exported, and said.
    let mistral = ModelSource::from_path(root().join("tests/fixtures/hf/mistral").to_str().unwrap()).unwrap();
    let report = export(&mistral, &dir.path("mistral.gguf"), None, 2).unwrap();
    assert_eq!(report.architecture, "llama");
    assert!(report.note.as_deref().is_some_and(|n| n.contains("sliding window")), "{report:?}");
    std::fs::remove_file(dir.path("mistral.gguf")).unwrap();
    // An existing output is never overwritten.
    let src = ModelSource::from_path(root().join("tests/fixtures/hf/llama3").to_str().unwrap()).unwrap();
    std::fs::write(&out, b"keep").unwrap();
    let err = format!("{:#}", export(&src, &out, None, 2).unwrap_err());
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");
    // A model whose config GGUF cannot carry for its family (Qwen2-MoE's top-k weights are
    // never renormalised in llama.cpp): refused after reading back, the file removed.
    let mut moe = ModelSource::from_path(root().join("tests/fixtures/hf/qwen2_moe").to_str().unwrap()).unwrap();
    if let Some(m) = moe.config.moe.as_mut() {
        m.norm_topk_prob = !m.norm_topk_prob;
    }
    let out = dir.path("moe.gguf");
    let err = format!("{:#}", export(&moe, &out, None, 2).unwrap_err());
    assert!(err.contains("norm_topk_prob") && err.contains("does not read back"), "{err}");
    assert!(!out.exists() && std::fs::read_dir(&dir.0).unwrap().count() == 1, "nothing else left behind");
}

/// gpt-oss's experts go out stacked as llama.cpp's converter writes them, biases
/// included (`[experts, width]`, F32, beside the `[experts, rows, cols]` matrices), and
/// its sinks as `attn_sinks.weight`. Its YaRN without rounding (`truncate: false`), which
/// GGUF cannot say (llama.cpp always rounds), is exported as llama.cpp runs it: with the
/// fixture's widths rounding moves no frequency and nothing is said; with a longer
/// original context it moves some and the report says so. (Fixture:
/// tools/make_gpt_oss_fixtures.py.)
#[test]
fn gpt_oss_exports_its_stacked_experts_and_says_where_llama_cpp_rounds_yarn() {
    let dir = TempDir::new("export-gpt-oss");
    let path = root().join("tests/fixtures/hf/gpt_oss");
    let src = ModelSource::from_path(path.to_str().unwrap()).unwrap();
    assert!(matches!(src.config.rope_scaling, strata::model::config::RopeScaling::Yarn { truncate: false, .. }));
    let out = dir.path("g.gguf");
    let report = export(&src, &out, None, 2).unwrap();
    assert_eq!(report.architecture, "gpt-oss");
    assert!(report.note.is_none(), "{report:?}");
    let f = strata::format::gguf::GgufFile::open(&out).unwrap();
    let (n, w, h) = (16, 16, 64);
    for (name, shape) in [
        ("blk.1.ffn_gate_exps.weight", vec![n, w, h]),
        ("blk.1.ffn_down_exps.weight", vec![n, h, w]),
        ("blk.1.ffn_gate_exps.bias", vec![n, w]),
        ("blk.1.ffn_up_exps.bias", vec![n, w]),
        ("blk.1.ffn_down_exps.bias", vec![n, h]),
        ("blk.1.attn_sinks.weight", vec![4]),
        ("blk.1.ffn_gate_inp.bias", vec![n]),
        ("blk.1.attn_output.bias", vec![h]),
    ] {
        let t = f.tensor(name).unwrap_or_else(|| panic!("no `{name}`"));
        assert_eq!((t.shape.clone(), t.dtype), (shape, DType::F32), "{name}");
    }
    assert_eq!(f.get("gpt-oss.attention.sliding_window").and_then(|v| v.as_u64()), Some(8));
    assert_eq!(f.get("gpt-oss.expert_feed_forward_length").and_then(|v| v.as_u64()), Some(16));
    assert_eq!(f.get_str("gpt-oss.rope.scaling.type"), Some("yarn"));
    // A longer original context: rounding moves frequencies, exported and said.
    let mut long = ModelSource::from_path(path.to_str().unwrap()).unwrap();
    if let strata::model::config::RopeScaling::Yarn { original_max_position, .. } = &mut long.config.rope_scaling {
        *original_max_position = 4096.0;
    }
    let out = dir.path("long.gguf");
    let report = export(&long, &out, None, 2).unwrap();
    assert!(report.note.as_deref().is_some_and(|n| n.contains("truncate")), "{report:?}");
    let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    assert!(matches!(back.config.rope_scaling, strata::model::config::RopeScaling::Yarn { truncate: true, .. }));
}

/// An export removes the temporaries a killed export of the same OUT left beside it
/// (`.OUT.tmp-PID-N`, process gone) and leaves only OUT.
#[test]
fn exports_remove_the_temporaries_of_killed_runs() {
    let dir = TempDir::new("export-stale");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = [dir.path(&format!(".e.gguf.tmp-{dead}-0")), dir.path(&format!(".e.gguf.tmp-{dead}-3"))];
    for p in &stale {
        std::fs::write(p, [7u8; 64]).unwrap();
    }
    let src = ModelSource::from_path(root().join("tests/fixtures/hf/llama3").to_str().unwrap()).unwrap();
    export(&src, &dir.path("e.gguf"), None, 1).unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["e.gguf"], "a dead export's temporary is still there");
}

/// `--quant q4_k` on rows that are not whole 256-value blocks (all of `hf/llama3`'s: 64
/// and 160) stores llama.cpp's 32-value fallback, Q4_0, and reports it.
#[test]
fn k_quant_exports_fall_back_to_q4_0_and_report_it() {
    let dir = TempDir::new("export-kfallback");
    let src = ModelSource::from_path(root().join("tests/fixtures/hf/llama3").to_str().unwrap()).unwrap();
    let out = dir.path("e.gguf");
    let report = export(&src, &out, Some(DType::Q4_K), 1).unwrap();
    let matrices = src.tensors.values().filter(|t| t.shape.len() == 2).count();
    assert_eq!(report.shortfall.fallback.get("Q4_0"), Some(&matrices), "{:?}", report.shortfall);
    assert!(report.shortfall.kept.is_empty(), "{:?}", report.shortfall);
    let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    for (name, t) in back.tensors.iter().filter(|(_, t)| t.shape.len() == 2) {
        assert_eq!(t.dtype, DType::Q4_0, "{name}");
    }
}
