//! Mixture-of-experts files whose expert metadata and expert tensors disagree.
//!
//! Each case rewrites one of the MoE fixtures (`tests/fixtures/gguf/*_moe.q8_0.gguf`,
//! `tests/fixtures/gguf/mixtral.q8_0.gguf` and `tests/fixtures/hf/{mixtral,qwen2_moe,
//! qwen3_moe}/`, made by `tools/make_moe_fixtures.py`) so that its expert count, top-k
//! or an expert tensor's shape no longer agree, loads it, and checks that the answer is
//! an error naming the key or tensor and the numbers involved, never a panic, an
//! out-of-bounds read or an allocation sized from the file's claim.

use crate::support;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use serde_json::Value;
use strata::backend::device::DeviceSpec;
use strata::engine::session::{Engine, RunOptions};
use strata::format::gguf::GgufValue;
use strata::model::ModelSource;
use strata::model::gguf_source::source_from_gguf;
use support::TempDir;
use support::gguf::GgufParts;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `load` and returns its error in full (`{:#}`); fails the test when it succeeds
/// or panics.
fn load_error<T>(what: &str, load: impl FnOnce() -> anyhow::Result<T>) -> String {
    match catch_unwind(AssertUnwindSafe(load)) {
        Ok(Ok(_)) => panic!("{what}: loaded without an error"),
        Ok(Err(e)) => {
            // Shown with `--nocapture`: the messages a user of such a file would read.
            println!("{what}: {e:#}");
            format!("{e:#}")
        }
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{what}: loading panicked: {msg}")
        }
    }
}

/// Fails unless `err` contains every one of `parts`.
#[track_caller]
fn assert_names(err: &str, parts: &[&str]) {
    let missing: Vec<&&str> = parts.iter().filter(|p| !err.contains(**p)).collect();
    assert!(missing.is_empty(), "error lacks {missing:?}:\n{err}");
}

/// The engine on the CPU (the fixtures are tiny).
fn cpu() -> RunOptions {
    RunOptions { threads: 1, device: DeviceSpec::Cpu, ..Default::default() }
}

// ---------------------------------------------------------------------------------------
// GGUF

/// A GGUF fixture as values: metadata and tensor table to edit, written back over the
/// original data section (tensor infos keep pointing at the original bytes).
struct Gguf(GgufParts);

impl Gguf {
    fn fixture(name: &str) -> Gguf {
        Gguf(GgufParts::read(&format!("tests/fixtures/gguf/{name}.gguf")))
    }

    /// `{arch}.<key>` for this file's architecture.
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.0.arch().expect("general.architecture"))
    }

    fn set(&mut self, key: &str, value: GgufValue) -> &mut Self {
        let key = self.key(key);
        self.0.set_meta(key, value);
        self
    }

    /// Sets a tensor's GGML dimensions (`ne[0]` is the row length; a stacked expert
    /// tensor is `[cols, rows, experts]`).
    fn set_ne(&mut self, tensor: &str, ne: &[u64]) -> &mut Self {
        let t = self.0.infos.iter_mut().find(|t| t.name == tensor).unwrap_or_else(|| panic!("no tensor {tensor}"));
        t.ne = ne.to_vec();
        self
    }

    fn ne(&self, tensor: &str) -> Vec<u64> {
        self.0.infos.iter().find(|t| t.name == tensor).unwrap_or_else(|| panic!("no tensor {tensor}")).ne.clone()
    }

    /// Writes the file into `dir` and opens it as a model source.
    fn source(&self, dir: &TempDir) -> anyhow::Result<ModelSource> {
        let path = dir.0.join("bad.gguf");
        std::fs::write(&path, self.0.write()).expect("writing the scratch file");
        source_from_gguf(&path)
    }

    /// The error opening this file gives (it must not open, nor panic).
    fn error(&self) -> String {
        let dir = TempDir::new("gguf");
        load_error("the rewritten GGUF", || self.source(&dir))
    }
}

/// The three MoE families' GGUF fixtures (8 experts each).
const GGUF_MOE: [&str; 3] = ["mixtral.q8_0", "qwen2_moe.q8_0", "qwen3_moe.q8_0"];

/// The helpers themselves: every fixture, rewritten unchanged, opens and loads.
#[test]
fn rewritten_fixtures_still_load() {
    for name in GGUF_MOE {
        let dir = TempDir::new("ok");
        let src = Gguf::fixture(name).source(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(src.config.moe.map(|m| m.n_experts), Some(8), "{name}");
        Engine::from_source(src, &cpu()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
}

#[test]
fn gguf_expert_count_other_than_the_stacked_tensors_is_named() {
    for name in GGUF_MOE {
        for claimed in [6u32, 12] {
            let err = Gguf::fixture(name).set("expert_count", GgufValue::U32(claimed)).error();
            assert_names(&err, &["_exps.weight`", "holds 8 experts", &format!("`expert_count` is {claimed}")]);
        }
    }
}

#[test]
fn gguf_stacked_tensor_with_fewer_experts_than_the_metadata_is_named() {
    let mut g = Gguf::fixture("qwen3_moe.q8_0");
    let mut ne = g.ne("blk.1.ffn_up_exps.weight");
    ne[2] = 6;
    let err = g.set_ne("blk.1.ffn_up_exps.weight", &ne).error();
    assert_names(&err, &["`blk.1.ffn_up_exps.weight`", "holds 6 experts", "`expert_count` is 8"]);
}

#[test]
fn gguf_top_k_outside_one_to_the_expert_count_is_named() {
    for name in GGUF_MOE {
        for used in [0u32, 9, u32::MAX] {
            let mut g = Gguf::fixture(name);
            let (used_key, count_key) = (g.key("expert_used_count"), g.key("expert_count"));
            let err = g.set("expert_used_count", GgufValue::U32(used)).error();
            assert_names(&err, &[&format!("`{used_key}` {used}"), &format!("`{count_key}` 8")]);
        }
    }
}

#[test]
fn gguf_down_experts_of_the_wrong_shape_are_named() {
    // qwen2_moe: hidden 64, expert width 8; each expert of `ffn_down_exps` is 64x8.
    let mut g = Gguf::fixture("qwen2_moe.q8_0");
    assert_eq!(g.ne("blk.0.ffn_down_exps.weight"), [8, 64, 8]);
    let err = g.set_ne("blk.0.ffn_down_exps.weight", &[4, 64, 8]).error();
    assert_names(&err, &["`blk.0.ffn_down_exps.weight`", "each expert is 64x4", "hidden size 64", "64x8"]);
    // Rows and columns swapped (the layout of `ffn_up_exps`).
    let mut g = Gguf::fixture("mixtral.q8_0");
    assert_eq!(g.ne("blk.1.ffn_down_exps.weight"), [16, 64, 8]);
    let err = g.set_ne("blk.1.ffn_down_exps.weight", &[64, 16, 8]).error();
    assert_names(&err, &["`blk.1.ffn_down_exps.weight`", "each expert is 16x64", "64x16"]);
    // The expert width in the metadata disagrees with every expert tensor.
    let err = Gguf::fixture("qwen3_moe.q8_0").set("expert_feed_forward_length", GgufValue::U32(24)).error();
    assert_names(&err, &["_exps.weight`", "each expert is", "expert width 24"]);
}

#[test]
fn gguf_stacked_expert_tensor_without_three_dimensions_is_named() {
    let mut g = Gguf::fixture("qwen2_moe.q8_0");
    assert_eq!(g.ne("blk.0.ffn_gate_exps.weight"), [64, 8, 8]);
    let err = g.set_ne("blk.0.ffn_gate_exps.weight", &[64, 64]).error();
    assert_names(&err, &["`blk.0.ffn_gate_exps.weight`", "[64, 64]", "[experts, rows, columns]"]);
    let mut g = Gguf::fixture("qwen2_moe.q8_0");
    let err = g.set_ne("blk.0.ffn_gate_exps.weight", &[64, 8, 8, 1]).error();
    assert_names(&err, &["`blk.0.ffn_gate_exps.weight`", "[1, 8, 8, 64]", "[experts, rows, columns]"]);
}

#[test]
fn gguf_absurd_expert_counts_are_capped_before_anything_is_sized() {
    for name in GGUF_MOE {
        for n in [1u64 << 40, 1 << 41, u64::MAX] {
            let mut g = Gguf::fixture(name);
            let key = g.key("expert_count");
            let err = g.set("expert_count", GgufValue::U64(n)).error();
            assert_names(&err, &[&format!("`{key}` {n}")]);
        }
        let mut g = Gguf::fixture(name);
        let key = g.key("expert_count");
        let err = g.set("expert_count", GgufValue::U32(5000)).error();
        assert_names(&err, &[&format!("`{key}` 5000"), "4096"]);
    }
}

/// A stacked tensor that claims more experts than the file holds bytes for is refused
/// by the GGUF reader, naming the tensor, before any expert view is cut from it.
#[test]
fn gguf_stacked_tensor_past_the_end_of_the_file_is_refused() {
    for experts in [1u64 << 20, 1 << 40, u64::MAX / 64] {
        let mut g = Gguf::fixture("mixtral.q8_0");
        let err = g.set_ne("blk.1.ffn_up_exps.weight", &[64, 16, experts]).error();
        assert_names(&err, &["blk.1.ffn_up_exps.weight"]);
    }
}

/// The router's rows are the expert count too; the engine's tensor check names it.
#[test]
fn gguf_router_with_other_than_expert_count_rows_is_named() {
    let mut g = Gguf::fixture("qwen2_moe.q8_0");
    assert_eq!(g.ne("blk.1.ffn_gate_inp.weight"), [64, 8]);
    g.set_ne("blk.1.ffn_gate_inp.weight", &[64, 6]);
    let dir = TempDir::new("router");
    let err = load_error("router of 6 rows", || Engine::from_source(g.source(&dir)?, &cpu()));
    assert_names(&err, &["`model.layers.1.mlp.gate.weight`", "[8, 64]", "[6, 64]"]);
}

// ---------------------------------------------------------------------------------------
// Hugging Face checkpoints

/// A copy of `tests/fixtures/hf/<name>` to edit.
struct HfDir {
    dir: TempDir,
}

impl HfDir {
    fn fixture(name: &str) -> HfDir {
        let dir = TempDir::new(name);
        let from = root().join("tests/fixtures/hf").join(name);
        for entry in std::fs::read_dir(&from).expect("fixture directory") {
            let entry = entry.expect("fixture entry");
            std::fs::copy(entry.path(), dir.0.join(entry.file_name())).expect("copying the fixture");
        }
        HfDir { dir }
    }

    fn path(&self) -> &Path {
        &self.dir.0
    }

    fn edit_config(&self, edit: impl FnOnce(&mut Value)) -> &Self {
        let path = self.path().join("config.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&path).expect("config.json")).expect("JSON");
        edit(&mut v);
        std::fs::write(&path, v.to_string()).expect("writing config.json");
        self
    }

    /// Rewrites the safetensors header (the data section stays as it is).
    fn edit_header(&self, edit: impl FnOnce(&mut BTreeMap<String, Value>)) -> &Self {
        let path = self.path().join("model.safetensors");
        let bytes = std::fs::read(&path).expect("model.safetensors");
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let mut header: BTreeMap<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
        edit(&mut header);
        let mut text = serde_json::to_vec(&header).expect("serializable");
        // Keep the data section 8-aligned, as the writers do (trailing spaces are allowed).
        text.resize(text.len().next_multiple_of(8), b' ');
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text);
        out.extend(&bytes[8 + n..]);
        std::fs::write(&path, out).expect("writing model.safetensors");
        self
    }

    /// The error loading this directory into the engine gives.
    fn error(&self) -> String {
        let dir = self.path().to_str().expect("UTF-8 temp path").to_string();
        load_error("the rewritten checkpoint", || Engine::load(&dir, &cpu()))
    }
}

#[test]
fn hf_fixtures_load_from_their_copies() {
    for name in ["mixtral", "qwen2_moe", "qwen3_moe"] {
        let hf = HfDir::fixture(name);
        let dir = hf.path().to_str().expect("UTF-8 temp path");
        Engine::load(dir, &cpu()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
}

#[test]
fn hf_top_k_outside_one_to_the_expert_count_is_named() {
    for (name, experts_key) in
        [("mixtral", "num_local_experts"), ("qwen2_moe", "num_experts"), ("qwen3_moe", "num_local_experts")]
    {
        for k in [0u64, 9] {
            let err = HfDir::fixture(name).edit_config(|c| c["num_experts_per_tok"] = k.into()).error();
            assert_names(&err, &[&format!("`num_experts_per_tok` {k}"), &format!("`{experts_key}` 8")]);
        }
    }
}

#[test]
fn hf_absurd_expert_count_is_capped() {
    for n in [5000u64, 1 << 40, u64::MAX] {
        let err = HfDir::fixture("qwen2_moe").edit_config(|c| c["num_experts"] = n.into()).error();
        assert_names(&err, &[&format!("`num_experts` {n}"), "4096"]);
    }
}

#[test]
fn hf_missing_expert_tensor_is_named() {
    for (name, tensor) in [
        ("qwen3_moe", "model.layers.1.mlp.experts.5.down_proj.weight"),
        ("qwen2_moe", "model.layers.0.mlp.experts.7.gate_proj.weight"),
        ("mixtral", "model.layers.1.block_sparse_moe.experts.5.w2.weight"),
    ] {
        let err = HfDir::fixture(name)
            .edit_header(|h| {
                h.remove(tensor).unwrap_or_else(|| panic!("{name} has {tensor}"));
            })
            .error();
        assert_names(&err, &[&format!("missing tensor `{tensor}`")]);
    }
}

#[test]
fn hf_expert_tensor_of_the_wrong_shape_is_named() {
    for (name, tensor, want, got) in [
        ("qwen3_moe", "model.layers.0.mlp.experts.2.up_proj.weight", [16, 64], [8, 64]),
        ("qwen2_moe", "model.layers.1.mlp.experts.0.down_proj.weight", [64, 8], [8, 64]),
        ("mixtral", "model.layers.0.block_sparse_moe.experts.3.w1.weight", [16, 64], [16, 32]),
    ] {
        let err = HfDir::fixture(name)
            .edit_header(|h| {
                let e = h.get_mut(tensor).unwrap_or_else(|| panic!("{name} has {tensor}"));
                let begin = e["data_offsets"][0].as_u64().expect("offset");
                e["shape"] = serde_json::json!(got);
                e["data_offsets"][1] = (begin + 4 * (got[0] * got[1]) as u64).into();
            })
            .error();
        assert_names(&err, &[&format!("`{tensor}`"), &format!("{want:?}"), &format!("{got:?}")]);
    }
}
