//! Flat layer directory: round trips from Hugging Face and GGUF fixtures with
//! bit-identical logits, the write-then-rename contract, 4 KiB alignment, `verify`
//! localizing flipped bytes, and hostile directories giving named errors.
//!
//! Fixtures: `tests/fixtures/hf/*` (`tools/make_fixtures.py`) and
//! `tests/fixtures/gguf/*.gguf` (`tools/make_gguf_fixtures.py`).

use std::path::{Path, PathBuf};

use crate::support;

use support::{TempDir, groups};

use serde_json::{Value, json};
use strata::engine::session::{Engine, RunOptions};
use strata::format::flat::{self, ALIGN};
use strata::format::{Group, ModelWriter};
use strata::model::ModelSource;
use strata::model::convert::meta_of;
use strata::model::decoder::SeqStep;

const HF_MODELS: [&str; 6] = ["llama3", "qwen2", "llama_bf16_256", "llama_f16", "mistral", "qwen3"];
const GGUF_MODELS: [&str; 4] = ["llama3.q4_0", "llama256.q4_k_m", "qwen2.q8_0", "llama256.q6_k"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn hf(name: &str) -> String {
    root().join("tests/fixtures/hf").join(name).to_string_lossy().into_owned()
}

fn gguf(name: &str) -> String {
    root().join(format!("tests/fixtures/gguf/{name}.gguf")).to_string_lossy().into_owned()
}

/// Writes `s` as a flat directory at `out`, global group first, then layers in order.
fn write_flat(s: &ModelSource, out: &Path) {
    let groups = groups(s);
    let layers = groups.keys().filter(|g| matches!(g, Group::Layer(_))).count();
    let mut w: Box<dyn ModelWriter> = Box::new(flat::create(out, &meta_of(s), layers).unwrap());
    w.write_group(Group::Global, groups.get(&Group::Global).map_or(&[][..], |v| v)).unwrap();
    for i in 0..layers {
        w.write_group(Group::Layer(i), &groups[&Group::Layer(i)]).unwrap();
    }
    w.finish().unwrap();
}

/// Logits at every position of a few tokens spread over the vocabulary.
fn logits(source: ModelSource) -> Vec<f32> {
    let e = Engine::from_source(source, &RunOptions { threads: 2, ..Default::default() }).unwrap();
    let vocab = e.model.config().vocab_size as u32;
    let ids: Vec<u32> = (0..7u32).map(|i| (i * 37 + 1) % vocab).collect();
    let mut cache = e.model.new_cache(16).unwrap();
    let mut got =
        e.model.forward(&mut [SeqStep { tokens: &ids, cache: &mut cache, all_logits: true, verify: false }]).unwrap();
    let out = got.remove(0);
    assert_eq!(out.len(), ids.len() * vocab as usize);
    out
}

/// Writes `spec` as a flat directory, reopens it, and checks meta, tensors and logits.
fn round_trip(spec: &str, tag: &str) {
    let tmp = TempDir::new(tag);
    let out = tmp.0.join("model");
    let src = ModelSource::from_path(spec).unwrap();
    write_flat(&src, &out);
    let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    assert_eq!(meta_of(&back), meta_of(&src), "{tag}: meta");
    let mut names: Vec<&String> = back.tensors.keys().collect();
    let mut want: Vec<&String> = src.tensors.keys().collect();
    names.sort();
    want.sort();
    assert_eq!(names, want, "{tag}: tensor names");
    for (name, t) in &src.tensors {
        let b = &back.tensors[name];
        assert_eq!((b.dtype, &b.shape), (t.dtype, &t.shape), "{tag} {name}");
        assert!(b.bytes() == t.bytes(), "{tag} {name}: bytes differ");
    }
    let (a, b) = (logits(src), logits(back));
    assert!(a == b, "{tag}: logits differ between the source and its flat copy");
    assert!(flat::verify(&out).is_ok(), "{tag}: verify");
}

#[test]
fn hugging_face_fixtures_round_trip_with_identical_logits() {
    for name in HF_MODELS {
        round_trip(&hf(name), name);
    }
}

#[test]
fn gguf_fixtures_round_trip_with_identical_logits() {
    for name in GGUF_MODELS {
        round_trip(&gguf(name), name);
    }
}

/// The directory appears only when `finish` returns; an unfinished writer leaves
/// nothing behind; an existing output is never overwritten; groups come in order.
#[test]
fn output_appears_only_at_finish() {
    let tmp = TempDir::new("finish");
    let out = tmp.0.join("model");
    let src = ModelSource::from_path(&hf("llama3")).unwrap();
    let g = groups(&src);
    let meta = meta_of(&src);

    let mut w = flat::create(&out, &meta, 2).unwrap();
    w.write_group(Group::Global, &g[&Group::Global]).unwrap();
    w.write_group(Group::Layer(0), &g[&Group::Layer(0)]).unwrap();
    assert!(!out.exists());
    let err = w.write_group(Group::Layer(0), &g[&Group::Layer(0)]).unwrap_err().to_string();
    assert!(err.contains("expected"), "{err}");
    let err = w.write_group(Group::Layer(1), &g[&Group::Layer(0)]).unwrap_err().to_string();
    assert!(err.contains("model.layers.0."), "{err}");
    drop(w);
    assert!(!out.exists());
    let leftovers: Vec<_> = std::fs::read_dir(&tmp.0).unwrap().collect();
    assert!(leftovers.is_empty(), "a dropped writer left {leftovers:?}");

    let mut w = Box::new(flat::create(&out, &meta, 2).unwrap());
    w.write_group(Group::Global, &g[&Group::Global]).unwrap();
    w.write_group(Group::Layer(0), &g[&Group::Layer(0)]).unwrap();
    let err = w.finish().unwrap_err().to_string();
    assert!(err.contains("1 of 2 layers"), "{err}");
    assert!(!out.exists());

    write_flat(&src, &out);
    assert!(out.join("manifest.json").is_file());
    let err = flat::create(&out, &meta, 2).err().expect("overwrote an existing directory").to_string();
    assert!(err.contains("already exists"), "{err}");
    let names: Vec<String> =
        std::fs::read_dir(&tmp.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["model"], "only the output is left");
}

/// Every tensor offset, layer range and `.bin` length is a multiple of 4096, padding
/// is zero, and each layer's range covers exactly its tensors' file.
#[test]
fn tensors_and_files_are_4k_aligned() {
    let tmp = TempDir::new("align");
    let out = tmp.0.join("model");
    write_flat(&ModelSource::from_path(&gguf("llama256.q4_k_m")).unwrap(), &out);
    let m: Value = serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!((m["format"].as_str(), m["version"].as_u64()), (Some("strata-flat"), Some(1)));
    for f in m["files"].as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        let len = std::fs::metadata(out.join(name)).unwrap().len();
        assert_eq!(len, f["size"].as_u64().unwrap(), "{name}");
        if name.ends_with(".bin") {
            assert_eq!(len % ALIGN, 0, "{name}: length {len}");
        }
    }
    let mut unaligned_sizes = 0;
    for t in m["tensors"].as_array().unwrap() {
        let (offset, size) = (t["offset"].as_u64().unwrap(), t["size"].as_u64().unwrap());
        assert_eq!(offset % ALIGN, 0, "{}", t["name"]);
        unaligned_sizes += usize::from(size % ALIGN != 0);
        let bytes = std::fs::read(out.join(t["file"].as_str().unwrap())).unwrap();
        let next = (offset + size).next_multiple_of(ALIGN);
        assert!(bytes[(offset + size) as usize..next as usize].iter().all(|&b| b == 0), "{}: padding", t["name"]);
    }
    assert!(unaligned_sizes > 0, "the fixture should exercise padding");
    let ranges = flat::layer_ranges(&out).unwrap();
    let n_layers = m["num_layers"].as_u64().unwrap() as usize;
    assert!(n_layers > 0);
    assert_eq!(ranges.len(), n_layers);
    for (i, r) in ranges.iter().enumerate() {
        assert_eq!(r.index, i);
        assert_eq!(r.path, out.join(format!("layer_{i:03}.bin")));
        assert_eq!((r.offset, r.len), (0, std::fs::metadata(&r.path).unwrap().len()));
        assert!(r.len > 0 && r.len % ALIGN == 0);
        let prefix = format!("model.layers.{i}.");
        let mine: Vec<&Value> = m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["name"].as_str().unwrap().starts_with(&prefix))
            .collect();
        assert!(!mine.is_empty());
        for t in mine {
            assert_eq!(t["file"].as_str().unwrap(), format!("layer_{i:03}.bin"), "{}", t["name"]);
            assert!(t["offset"].as_u64().unwrap() + t["size"].as_u64().unwrap() <= r.offset + r.len);
        }
    }
    let info = flat::inspect(&out).unwrap();
    assert_eq!(info["architecture"], "llama");
    assert_eq!(info["num_layers"], json!(n_layers));
    assert_eq!(info["hyperparameters"]["num_hidden_layers"], json!(n_layers));
    assert_eq!(info["tensors"].as_array().unwrap().len(), m["tensors"].as_array().unwrap().len());
    assert!(info["dtypes"]["Q4_K"]["tensors"].as_u64().unwrap() > 0, "{}", info["dtypes"]);
}

/// Flips one byte at `offset` of `path`, runs `f`, and flips it back.
fn with_flipped<T>(path: &Path, offset: u64, f: impl FnOnce() -> T) -> T {
    let original = std::fs::read(path).unwrap();
    let mut bytes = original.clone();
    bytes[offset as usize] ^= 0x20;
    std::fs::write(path, &bytes).unwrap();
    let out = f();
    std::fs::write(path, &original).unwrap();
    out
}

/// `verify` passes on a good directory and names the file (and tensor) of any flipped
/// byte; `open` does not read checksums, so it still opens such a directory.
#[test]
fn verify_localizes_flipped_bytes() {
    let tmp = TempDir::new("verify");
    let out = tmp.0.join("model");
    write_flat(&ModelSource::from_path(&hf("qwen2")).unwrap(), &out);
    let m: Value = serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let report = flat::verify(&out).unwrap();
    let files = m["files"].as_array().unwrap();
    assert_eq!(report.files, files.len());
    assert_eq!(report.bytes, files.iter().map(|f| f["size"].as_u64().unwrap()).sum::<u64>());
    assert_eq!(report.tensors, m["tensors"].as_array().unwrap().len());

    for t in m["tensors"].as_array().unwrap() {
        let (name, file) = (t["name"].as_str().unwrap(), t["file"].as_str().unwrap());
        let offset = t["offset"].as_u64().unwrap() + t["size"].as_u64().unwrap() / 2;
        let err = with_flipped(&out.join(file), offset, || {
            assert!(flat::open(&out).is_ok(), "open must not read checksums");
            flat::verify(&out).unwrap_err().to_string()
        });
        assert!(err.contains(file) && err.contains(&format!("`{name}`")), "{name}: {err}");
    }
    // A padding byte: the one after a tensor whose size is not a page multiple.
    let t = m["tensors"].as_array().unwrap().iter().find(|t| t["size"].as_u64().unwrap() % ALIGN != 0).unwrap();
    let file = t["file"].as_str().unwrap();
    let at = t["offset"].as_u64().unwrap() + t["size"].as_u64().unwrap();
    let err = with_flipped(&out.join(file), at, || flat::verify(&out).unwrap_err().to_string());
    assert!(err.contains(file) && err.contains("padding") && err.contains(&format!("byte {at}")), "{err}");
    for f in files.iter().filter(|f| !f["name"].as_str().unwrap().ends_with(".bin")) {
        let name = f["name"].as_str().unwrap();
        let err = with_flipped(&out.join(name), f["size"].as_u64().unwrap() / 2, || {
            flat::verify(&out).unwrap_err().to_string()
        });
        assert!(err.contains(name) && err.contains("checksum"), "{name}: {err}");
    }
    assert!(flat::verify(&out).is_ok(), "restored");
}

/// Edits `manifest.json` with `edit`, returns `open`'s error (`{:#}`), restores it.
fn open_err_with(dir: &Path, edit: impl FnOnce(&mut Value)) -> String {
    let path = dir.join("manifest.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let mut m: Value = serde_json::from_str(&original).unwrap();
    edit(&mut m);
    std::fs::write(&path, serde_json::to_string(&m).unwrap()).unwrap();
    let err = flat::open(dir).err().map(|e| format!("{e:#}"));
    std::fs::write(&path, original).unwrap();
    err.expect("a broken manifest opened")
}

fn tensor_index(m: &Value, name: &str) -> usize {
    m["tensors"].as_array().unwrap().iter().position(|t| t["name"] == name).unwrap()
}

/// Hostile or damaged directories are errors naming the file, never panics or giant
/// allocations.
#[test]
fn broken_directories_are_named_errors() {
    let tmp = TempDir::new("broken");
    let out = tmp.0.join("model");
    write_flat(&ModelSource::from_path(&hf("llama3")).unwrap(), &out);
    const Q: &str = "model.layers.1.self_attn.q_proj.weight";

    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        ("wrong format", Box::new(|m| m["format"] = json!("gguf")), &["manifest.json", "strata-flat"]),
        ("wrong version", Box::new(|m| m["version"] = json!(2)), &["manifest.json", "version"]),
        (
            "offset past the end",
            Box::new(|m| {
                let i = tensor_index(m, Q);
                m["tensors"][i]["offset"] = json!(1u64 << 40);
            }),
            &["layer_001.bin", Q, "past the end"],
        ),
        (
            "offset overflows",
            Box::new(|m| {
                let i = tensor_index(m, Q);
                m["tensors"][i]["offset"] = json!(u64::MAX - 4095);
            }),
            &["layer_001.bin", "past the end"],
        ),
        (
            "huge shape",
            Box::new(|m| {
                let i = tensor_index(m, Q);
                m["tensors"][i]["shape"] = json!([1u64 << 62, 4]);
            }),
            &["layer_001.bin", Q, "shape"],
        ),
        (
            "too many dimensions",
            Box::new(|m| {
                let i = tensor_index(m, Q);
                m["tensors"][i]["shape"] = json!(vec![1; 1000]);
            }),
            &["layer_001.bin", "dimensions"],
        ),
        (
            "unknown dtype",
            Box::new(|m| {
                let i = tensor_index(m, Q);
                m["tensors"][i]["dtype"] = json!("Q9_9");
            }),
            &["layer_001.bin", "dtype"],
        ),
        (
            "unaligned offset",
            Box::new(|m| {
                let i = tensor_index(m, Q);
                m["tensors"][i]["offset"] = json!(8);
            }),
            &["layer_001.bin", "multiple of 4096"],
        ),
        (
            "tensor in another layer's file",
            Box::new(|m| {
                let i = tensor_index(m, Q);
                m["tensors"][i]["file"] = json!("layer_000.bin");
            }),
            &["layer_000.bin", Q, "layer 1"],
        ),
        (
            "overlapping tensors",
            Box::new(|m| {
                let i = tensor_index(m, "model.layers.1.self_attn.k_proj.weight");
                let j = tensor_index(m, "model.layers.1.self_attn.v_proj.weight");
                m["tensors"][j]["offset"] = m["tensors"][i]["offset"].clone();
            }),
            &["layer_001.bin", "overlap"],
        ),
        (
            "file outside the directory",
            Box::new(|m| m["files"][0]["name"] = json!("../config.json")),
            &["manifest.json", "plain file name"],
        ),
        ("unknown field", Box::new(|m| m["tensors"][0]["extra"] = json!(1)), &["manifest.json", "extra"]),
        ("negative size", Box::new(|m| m["tensors"][0]["size"] = json!(-1)), &["manifest.json", "tensors[0].size"]),
        ("layer count", Box::new(|m| m["num_layers"] = json!(1u64 << 60)), &["manifest.json", "num_layers"]),
    ];
    for (what, edit, want) in cases {
        let err = open_err_with(&out, edit);
        eprintln!("{what}: {err}");
        for w in want {
            assert!(err.contains(w), "{what}: `{w}` not in: {err}");
        }
    }

    // Damaged files next to a good manifest.
    let layer = out.join("layer_001.bin");
    let bytes = std::fs::read(&layer).unwrap();
    std::fs::write(&layer, &bytes[..bytes.len() / 2]).unwrap();
    let err = format!("{:#}", flat::open(&out).err().expect("a truncated layer opened"));
    assert!(err.contains("layer_001.bin") && err.contains("truncated"), "{err}");
    std::fs::write(&layer, &bytes).unwrap();
    for missing in ["norm.bin", "tokenizer.json", "manifest.json"] {
        let path = out.join(missing);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let err = format!("{:#}", flat::open(&out).err().expect("a directory with a missing file opened"));
        assert!(err.contains(missing), "{missing}: {err}");
        std::fs::write(&path, bytes).unwrap();
    }
    let manifest = out.join("manifest.json");
    let text = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, &text[..text.len() / 2]).unwrap();
    let err = format!("{:#}", flat::open(&out).err().expect("a truncated manifest opened"));
    assert!(err.contains("manifest.json") && err.contains("JSON"), "{err}");
    std::fs::write(&manifest, &text).unwrap();
    assert!(flat::open(&out).is_ok() && flat::verify(&out).is_ok(), "restored");
}

/// Random byte edits of the manifest give an error or a model, never a panic.
#[test]
fn random_manifest_mutations_never_panic() {
    let tmp = TempDir::new("fuzz");
    let out = tmp.0.join("model");
    write_flat(&ModelSource::from_path(&gguf("llama3.q4_0")).unwrap(), &out);
    let path = out.join("manifest.json");
    let original = std::fs::read(&path).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let digits = b"0123456789-e.\"[]{},:";
    for _ in 0..300 {
        let mut bytes = original.clone();
        for _ in 0..1 + next() % 3 {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = digits[(next() % digits.len() as u64) as usize];
        }
        std::fs::write(&path, &bytes).unwrap();
        let _ = flat::open(&out).map(|s| s.tensors.len());
        let _ = flat::inspect(&out);
    }
    std::fs::write(&path, &original).unwrap();
    assert!(flat::open(&out).is_ok());
}
