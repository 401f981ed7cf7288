//! `strata convert` (library and CLI): every source format into flat and `.cawsf`, kept
//! as stored (identical tensors and logits) or requantized (the tensors equal Strata's
//! quantizers applied to the source, whose bytes are checked against gguf-py and
//! llama.cpp in `tests/it/quant_golden.rs`; the model still runs and stays close to its
//! source), and `inspect` / `verify` on the results.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;

use support::TempDir;

use strata::engine::session::{Engine, RunOptions};
use strata::format::cawsf::Compression;
use strata::model::ModelSource;
use strata::model::convert::{ConvertOptions, Target, convert};
use strata::model::decoder::SeqStep;
use strata::quant::ReadF32;
use strata::tensor::DType;

fn fixture(rel: &str) -> String {
    format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn logits(src: ModelSource) -> Vec<Vec<f32>> {
    let e = Engine::from_source(src, &RunOptions { threads: 2, ..Default::default() }).expect("load");
    let tokens = [1u32, 7, 42, 99, 3, 250, 17, 8];
    let mut cache = e.model.new_cache(16).unwrap();
    e.model
        .forward(&mut [SeqStep { tokens: &tokens, cache: &mut cache, all_logits: true, verify: false }])
        .expect("forward")
        .remove(0)
        .chunks(e.model.config().vocab_size)
        .map(<[f32]>::to_vec)
        .collect()
}

fn out_path(s: &TempDir, target: Target) -> PathBuf {
    match target {
        Target::Flat => s.0.join("model"),
        Target::Cawsf(_) => s.0.join("model.cawsf"),
    }
}

const TARGETS: [Target; 3] = [Target::Flat, Target::Cawsf(Compression::None), Target::Cawsf(Compression::Lz4)];

#[test]
fn unquantized_conversions_are_identical_models() {
    // Gemma's GGUF norms (stored `1 + w`), Phi-3's fused projections and the per-layer
    // settings of Gemma 3 and SmolLM3 go through the written config.json.
    for src in [
        "hf/llama3",
        "gguf/llama3.q4_0.gguf",
        "gguf/llama256.q4_k_m.gguf",
        "gguf/gemma2.f32.gguf",
        "gguf/gemma3.f32.gguf",
        "gguf/phi3_partial.f32.gguf",
        "gguf/smollm3.f32.gguf",
        "gguf/granite.f32.gguf",
    ] {
        for target in TARGETS {
            let s = TempDir::new("same");
            let out = out_path(&s, target);
            let source = ModelSource::from_path(&fixture(src)).unwrap();
            let mut groups = 0;
            let report = convert(
                ModelSource::from_path(&fixture(src)).unwrap(),
                &out,
                &ConvertOptions { target, quant: None, threads: 2, ndsq: None, sparse_ffn: None },
                &mut |_| groups += 1,
            )
            .unwrap();
            assert_eq!(report.converted, 0);
            assert_eq!(groups, report.layers + 1, "{src} {target:?}: one progress call per group");
            let copy = ModelSource::from_path(out.to_str().unwrap()).unwrap();
            assert_eq!(copy.config, source.config, "{src} {target:?}");
            assert_eq!(copy.tensors.len(), source.tensors.len());
            for (name, t) in &source.tensors {
                let c = &copy.tensors[name];
                assert_eq!((c.dtype, &c.shape), (t.dtype, &t.shape), "{src} {target:?} {name}");
                assert_eq!(c.bytes(), t.bytes(), "{src} {target:?} {name}");
            }
            assert!(logits(copy) == logits(ModelSource::from_path(&fixture(src)).unwrap()), "{src} {target:?}");
        }
    }
}

#[test]
fn quantized_conversions_use_strata_quantizers_and_stay_close() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    // Bounds on the worst |Δ log-prob| over 8 positions of a random 256-wide model, set
    // at about twice what was measured (0.30, 0.74, 2.0, 4.6, 3e-6): random weights have no
    // structure for quantization to keep, so only the ordering by bit width is telling.
    for (quant, tol) in
        [(DType::Q8_0, 0.6f32), (DType::Q6_K, 1.5), (DType::Q4_K, 4.0), (DType::Mxfp4, 9.0), (DType::F16, 1e-4)]
    {
        for target in [Target::Flat, Target::Cawsf(Compression::Zstd)] {
            let s = TempDir::new("quant");
            let out = out_path(&s, target);
            let source = ModelSource::from_path(&fixture("hf/llama_bf16_256")).unwrap();
            let report = convert(
                ModelSource::from_path(&fixture("hf/llama_bf16_256")).unwrap(),
                &out,
                &ConvertOptions { target, quant: Some(quant), threads: 2, ndsq: None, sparse_ffn: None },
                &mut |_| {},
            )
            .unwrap();
            assert!(report.converted > 0);
            let copy = ModelSource::from_path(out.to_str().unwrap()).unwrap();
            for (name, t) in &source.tensors {
                let c = &copy.tensors[name];
                let matrix = t.shape.len() == 2;
                if matrix || quant.is_float() {
                    assert_eq!(c.dtype, quant, "{name}");
                    let x = t.to_f32_vec();
                    let cols = *t.shape.last().unwrap();
                    let want = strata::quant::quantize_matrix(&pool, quant, &x, x.len() / cols, cols).unwrap();
                    assert_eq!(c.bytes(), strata::tensor::ByteSource::bytes(&want), "{quant:?} {name}");
                } else {
                    assert_eq!((c.dtype, c.bytes()), (t.dtype, t.bytes()), "{quant:?} {name}: kept as stored");
                }
            }
            // The requantized model runs and its log-probs stay near the source's.
            let (a, b) = (logits(copy), logits(ModelSource::from_path(&fixture("hf/llama_bf16_256")).unwrap()));
            for (ra, rb) in a.iter().zip(&b) {
                let (la, lb) = (log_softmax(ra), log_softmax(rb));
                let worst = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                eprintln!("{quant:?} {target:?}: max |Δ log-prob| {worst}");
                assert!(worst < tol, "{quant:?}: max |Δ log-prob| {worst}");
            }
        }
    }
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + x.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    x.iter().map(|v| v - lse).collect()
}

#[test]
fn existing_outputs_are_refused() {
    let s = TempDir::new("exists");
    let out = s.0.join("model");
    std::fs::create_dir(&out).unwrap();
    let source = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    let err = convert(
        source,
        &out,
        &ConvertOptions { target: Target::Flat, quant: None, threads: 1, ndsq: None, sparse_ffn: None },
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
}

fn strata(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

#[test]
fn cli_convert_inspect_verify() {
    let s = TempDir::new("cli");
    let gguf = fixture("gguf/llama3.q4_0.gguf");
    for (format, out) in [("flat", s.0.join("flat")), ("cawsf", s.0.join("m.cawsf"))] {
        let out_s = out.to_str().unwrap();
        let o = strata(&["convert", &gguf, out_s, "--format", format, "--quant", "q8_0", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(report["converted"].as_u64().unwrap() > 0);
        let o = strata(&["verify", out_s]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = strata(&["inspect", out_s, "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v.is_object());
        let o = strata(&["inspect", out_s]);
        assert!(o.status.success());
        // A flipped byte in the weights: verify fails, naming where.
        let victim = if out.is_dir() { out.join("layer_000.bin") } else { out.clone() };
        flip_last_nonzero(&victim);
        let o = strata(&["verify", out_s]);
        assert!(!o.status.success(), "{format}: verify passed a corrupted model");
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(err.contains(if out.is_dir() { "layer_000.bin" } else { "m.cawsf" }), "{err}");
    }
    for args in [
        &["inspect", gguf.as_str(), "--json"][..],
        &["inspect", fixture("hf/llama3").as_str()][..],
        &["convert", gguf.as_str(), s.0.join("x").to_str().unwrap(), "--quant", "q3_z"][..],
        &["convert", gguf.as_str(), s.0.join("y").to_str().unwrap(), "--compress", "zstd"][..],
        &["verify", gguf.as_str()][..],
    ] {
        let o = strata(args);
        let ok = args[0] == "inspect";
        assert_eq!(o.status.success(), ok, "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = strata(&["inspect", fixture("gguf/llama3.q4_0.gguf").as_str(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["layer_bytes"]["layers"].as_array().unwrap().len(), 2);
}

/// Flips a byte of `path` inside its data (the last non-zero byte before the end).
fn flip_last_nonzero(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[i] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn flat_and_cawsf_models_import_into_the_store_and_load_by_name() {
    let s = TempDir::new("store");
    let store = strata::store::Store::open(s.0.join("home"));
    for (target, name) in [(Target::Flat, "conv/flat:q8"), (Target::Cawsf(Compression::Lz4), "conv/cawsf:q8")] {
        let out = out_path(&s, target);
        let src = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
        convert(
            src,
            &out,
            &ConvertOptions { target, quant: Some(DType::Q8_0), threads: 2, ndsq: None, sparse_ffn: None },
            &mut |_| {},
        )
        .unwrap();
        let imported = store.import(&out, name, false).unwrap();
        assert_eq!(imported.name.to_string(), name);
        let listed = store.list().unwrap();
        assert!(listed.iter().any(|m| m.name.to_string() == name), "{name} not listed");
        let path = store.resolve(name).unwrap();
        let by_name = ModelSource::from_path(path.to_str().unwrap()).unwrap();
        let original = ModelSource::from_path(out.to_str().unwrap()).unwrap();
        assert!(logits(by_name) == logits(original), "{name}: the stored model differs from the converted one");
        store.remove(name).unwrap();
        assert!(store.resolve(name).is_err());
    }
}

/// A PID no process has: a child's, once it has exited and been reaped.
fn gone_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// Temporaries that a killed `convert` left beside OUT (`.OUT.tmp-PID-N`; a flat
/// directory or a `.cawsf` file) are removed by the next convert to that OUT when their
/// process is gone, and kept while it runs; other outputs' are not touched.
#[test]
fn leftover_temporaries_of_gone_processes_are_removed() {
    let s = TempDir::new("stale");
    let gguf = fixture("gguf/llama3.q4_0.gguf");
    let mut live = Command::new("sleep").arg("60").spawn().unwrap();
    let dead = gone_pid();
    for (format, out) in [("flat", s.0.join("m")), ("cawsf", s.0.join("m.cawsf"))] {
        let name = out.file_name().unwrap().to_str().unwrap().to_owned();
        let stale_dir = s.0.join(format!(".{name}.tmp-{dead}-0"));
        std::fs::create_dir(&stale_dir).unwrap();
        std::fs::write(stale_dir.join("layer_000.bin"), [1u8; 100]).unwrap();
        let stale_file = s.0.join(format!(".{name}.tmp-{dead}"));
        std::fs::write(&stale_file, [1u8; 100]).unwrap();
        let running = s.0.join(format!(".{name}.tmp-{}-0", live.id()));
        let other = s.0.join(format!(".other.tmp-{dead}-0"));
        for keep in [&running, &other] {
            std::fs::write(keep, [1u8; 100]).unwrap();
        }
        let o = strata(&["convert", &gguf, out.to_str().unwrap(), "--format", format]);
        assert!(o.status.success(), "{format}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(out.exists(), "{format}");
        assert!(!stale_dir.exists() && !stale_file.exists(), "{format}: a dead process's temporary is still there");
        assert!(running.exists(), "{format}: removed the temporary of a running process");
        assert!(other.exists(), "{format}: removed another output's temporary");
    }
    live.kill().unwrap();
    live.wait().unwrap();
}

/// Where a `.cawsf` file (uncompressed) keeps the data of one of layer 0's tensors.
fn layer0_tensor_offset(path: &Path) -> u64 {
    let o = strata(&["inspect", path.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let t = v["tensors"].as_array().unwrap().iter().find(|t| t["layer"] == 0 && t["bytes"].as_u64() > Some(64));
    let t = t.expect("a layer-0 tensor");
    t["offset"].as_u64().unwrap() + t["bytes"].as_u64().unwrap() / 2
}

/// A byte flipped in a flat directory's or `.cawsf` file's tensor data (which `open`
/// does not hash) fails `convert` and `export` from it, naming the file and the tensor,
/// and leaves no output behind.
#[test]
fn corrupt_sources_fail_conversion_naming_the_file() {
    let s = TempDir::new("corrupt");
    let gguf = fixture("gguf/llama3.q4_0.gguf");
    for (target, src) in [(Target::Flat, s.0.join("src")), (Target::Cawsf(Compression::None), s.0.join("src.cawsf"))] {
        let opts = ConvertOptions { target, quant: None, threads: 1, ndsq: None, sparse_ffn: None };
        convert(ModelSource::from_path(&gguf).unwrap(), &src, &opts, &mut |_| {}).unwrap();
        let victim = match target {
            Target::Flat => {
                let bin = src.join("layer_000.bin");
                flip_last_nonzero(&bin);
                bin
            }
            Target::Cawsf(_) => {
                let mut bytes = std::fs::read(&src).unwrap();
                bytes[layer0_tensor_offset(&src) as usize] ^= 0x40;
                std::fs::write(&src, bytes).unwrap();
                src.clone()
            }
        };
        let victim = victim.file_name().unwrap().to_str().unwrap().to_owned();
        let src_s = src.to_str().unwrap();
        for args in [
            vec!["convert", src_s, s.0.join("cv.cawsf").to_str().unwrap(), "--format", "cawsf"],
            vec!["convert", src_s, s.0.join("cv").to_str().unwrap(), "--quant", "q8_0"],
            vec!["export", src_s, s.0.join("e.gguf").to_str().unwrap()],
        ] {
            let o = strata(&args);
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            assert!(!o.status.success(), "{args:?}: passed a corrupted source");
            assert!(err.contains(&victim) && err.contains("checksum mismatch in tensor `"), "{args:?}: {err}");
            assert!(!Path::new(args[2]).exists(), "{args:?}: wrote its output");
        }
        let left: Vec<_> = std::fs::read_dir(&s.0).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.iter().all(|n| !n.to_string_lossy().contains(".tmp")), "temporaries left: {left:?}");
        std::fs::remove_dir_all(&src).or_else(|_| std::fs::remove_file(&src)).unwrap();
    }
}

/// `--format cawsf` to a name without `.cawsf` (which no reader would recognize) is a
/// usage error: exit status 2, nothing written.
#[test]
fn cawsf_outputs_must_end_in_cawsf() {
    let s = TempDir::new("cawsf-name");
    let out = s.0.join("out2");
    let o = strata(&["convert", &fixture("gguf/llama3.q4_0.gguf"), out.to_str().unwrap(), "--format", "cawsf"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("must end in `.cawsf`"), "{err}");
    assert_eq!(std::fs::read_dir(&s.0).unwrap().count(), 0, "wrote something");
}

/// `--quant q4_k` / `q6_k` on matrices whose rows are not whole 256-value blocks (every
/// matrix of `hf/llama3`: rows of 64 and 160) stores them in llama.cpp's 32-value
/// fallback (Q4_0, Q8_0) and says so on stderr and in the report.
#[test]
fn k_quants_fall_back_to_32_value_blocks_and_say_so() {
    let s = TempDir::new("kfallback");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let source = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    let matrices = source.tensors.values().filter(|t| t.shape.len() == 2).count();
    for (quant, fallback) in [("q4_k", DType::Q4_0), ("q6_k", DType::Q8_0)] {
        let out = s.0.join(quant);
        let o = strata(&["convert", &fixture("hf/llama3"), out.to_str().unwrap(), "--quant", quant, "--json"]);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["shortfall"]["fallback"][fallback.name()], matrices as u64, "{report}");
        assert_eq!(report["converted"], matrices as u64, "{report}");
        let want = format!("warning: --quant {}: {matrices} weight matrices", quant.to_uppercase());
        assert!(err.contains(&want) && err.contains(&format!("{matrices} as {}", fallback.name())), "{err}");
        assert!(err.contains("256-value blocks"), "{err}");
        let copy = ModelSource::from_path(out.to_str().unwrap()).unwrap();
        for (name, t) in &source.tensors {
            let c = &copy.tensors[name];
            if t.shape.len() == 2 {
                let (x, cols) = (t.to_f32_vec(), t.shape[1]);
                let want = strata::quant::quantize_matrix(&pool, fallback, &x, x.len() / cols, cols).unwrap();
                assert_eq!((c.dtype, c.bytes()), (fallback, strata::tensor::ByteSource::bytes(&want)), "{name}");
            } else {
                assert_eq!(c.dtype, t.dtype, "{name}");
            }
        }
    }
}
