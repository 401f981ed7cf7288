//! The file parsers against hostile input, on stable Rust.
//!
//! `tools/fuzz.sh` runs the cargo-fuzz targets of `fuzz/` (nightly, libFuzzer) and moves
//! every input that made one crash, leak, time out or run out of memory into
//! `tests/fixtures/fuzz/<target>/`. The `replay_*` tests feed each such file through the
//! same calls as its target and check that none panics: an `Err` is the expected answer
//! to a hostile file. The `mutants_*` tests run a few hundred seeded random mutations of
//! the fixtures through each parser (bytes for the binary formats, values for GGUF
//! metadata and JSON headers), so CI, which has no nightly, exercises the parsers too.
//!
//! The `.cawsf` and flat-directory cases need a model in those formats: they convert
//! `tests/fixtures/gguf/llama3.q4_0.gguf` with `strata convert`, as `tools/fuzz.sh` does
//! for the fuzzers' seeds (a flat reproducer is a manifest that only means something
//! next to the `.bin` files of that conversion).

use crate::support;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use strata::format::gguf::{GgufFile, GgufValue};
use strata::format::{cawsf, checksum, flat, safetensors};
use strata::model::gguf_source::source_from_gguf;
use strata::quant::ReadF32;
use strata::tensor::{AlignedBytes, ByteSource, HostTensor};
use support::gguf::GgufParts;

/// Tensors with more values than this are checked for their byte range only.
const MAX_DEQUANT_VALUES: usize = 1 << 14;
/// The fixture `strata convert` turns into the `.cawsf` and flat models.
const CONVERT_SOURCE: &str = "tests/fixtures/gguf/llama3.q4_0.gguf";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(rel: &str) -> Vec<u8> {
    let path = root().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------
// The fuzz targets' calls

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Gguf,
    GgufSource,
    Safetensors,
    Cawsf,
    FlatManifest,
}

impl Target {
    /// The cargo-fuzz target's name (`fuzz/fuzz_targets/<name>.rs`).
    fn name(self) -> &'static str {
        match self {
            Target::Gguf => "gguf",
            Target::GgufSource => "gguf_source",
            Target::Safetensors => "safetensors",
            Target::Cawsf => "cawsf",
            Target::FlatManifest => "flat_manifest",
        }
    }
}

/// A directory of its own under the system temp directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("strata-fuzz-regressions-{}-{what}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs inputs through one target's calls, as `fuzz/fuzz_targets/<target>.rs` does.
struct Runner {
    target: Target,
    scratch: Scratch,
}

impl Runner {
    fn new(target: Target) -> Runner {
        let scratch = Scratch::new(target.name());
        match target {
            Target::Cawsf => convert("cawsf", &scratch.0.join("model.cawsf")),
            Target::FlatManifest => {
                let model = scratch.0.join("model");
                convert("flat", &model);
                // Every file of the converted model but the manifest, which is the input.
                let dir = scratch.0.join("flat");
                std::fs::create_dir(&dir).expect("scratch flat directory");
                for entry in std::fs::read_dir(&model).expect("converted flat model") {
                    let entry = entry.expect("converted flat model entry");
                    if entry.file_name() != flat::MANIFEST {
                        std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copying the flat model");
                    }
                }
            }
            Target::Gguf | Target::GgufSource | Target::Safetensors => {}
        }
        Runner { target, scratch }
    }

    /// The converted model the `.cawsf` and flat inputs derive from.
    fn model(&self) -> PathBuf {
        match self.target {
            Target::Cawsf => self.scratch.0.join("model.cawsf"),
            _ => self.scratch.0.join("model"),
        }
    }

    /// Runs `data` through the target; `Err` is the panic message.
    fn run(&self, data: &[u8]) -> Result<(), String> {
        let dir = &self.scratch.0;
        catch_unwind(AssertUnwindSafe(|| match self.target {
            Target::Gguf => {
                let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(data));
                if let Ok(f) = GgufFile::parse(src, Path::new("fuzz.gguf")) {
                    f.infos.iter().for_each(|i| drop(i.shape()));
                    touch_tensors(f.tensors.values());
                }
            }
            Target::GgufSource => {
                let path = dir.join("fuzz.gguf");
                std::fs::write(&path, data).expect("writing the scratch file");
                if let Ok(src) = source_from_gguf(&path) {
                    touch_tensors(src.tensors.values());
                }
            }
            Target::Safetensors => {
                let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(data));
                if let Ok(tensors) = safetensors::parse(src, Path::new("fuzz.safetensors")) {
                    touch_tensors(tensors.values());
                }
            }
            Target::Cawsf => {
                let path = dir.join("fuzz.cawsf");
                std::fs::write(&path, data).expect("writing the scratch file");
                if let Ok(src) = cawsf::open(&path) {
                    touch_tensors(src.tensors.values());
                }
                let _ = cawsf::verify(&path);
                let _ = cawsf::inspect(&path);
                let _ = cawsf::layer_ranges(&path);
            }
            Target::FlatManifest => {
                let flat_dir = dir.join("flat");
                std::fs::write(flat_dir.join(flat::MANIFEST), data).expect("writing the scratch manifest");
                if let Ok(src) = flat::open(&flat_dir) {
                    touch_tensors(src.tensors.values());
                }
                let _ = flat::verify(&flat_dir);
                let _ = flat::inspect(&flat_dir);
                let _ = flat::layer_ranges(&flat_dir);
            }
        }))
        .map_err(|payload| {
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(non-string panic payload)".into())
        })
    }
}

/// Reads every tensor's bytes and dequantizes the small ones, as a loader would.
fn touch_tensors<'a>(tensors: impl IntoIterator<Item = &'a HostTensor>) {
    for t in tensors {
        let bytes = t.bytes();
        assert_eq!(t.dtype.bytes_for(t.numel()), Some(bytes.len()), "{t:?}: byte length does not match the shape");
        if t.numel() <= MAX_DEQUANT_VALUES {
            std::hint::black_box(t.to_f32_vec());
        }
    }
}

/// `CONVERT_SOURCE` converted by `strata convert --format <format>` into `out`.
fn convert(format: &str, out: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("convert")
        .arg(root().join(CONVERT_SOURCE))
        .arg(out)
        .args(["--format", format])
        .output()
        .expect("running strata convert");
    assert!(o.status.success(), "strata convert --format {format}: {}", String::from_utf8_lossy(&o.stderr));
}

// ---------------------------------------------------------------------------------------
// Replaying what the fuzzers found

/// Every file in `tests/fixtures/fuzz/<target>/` through the target, none may panic.
fn replay(target: Target) {
    let dir = root().join("tests/fixtures/fuzz").join(target.name());
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| e.expect("reproducer entry").path()).collect(),
        Err(_) => return, // nothing found yet
    };
    files.retain(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')));
    files.sort();
    if files.is_empty() {
        return;
    }
    let runner = Runner::new(target);
    let failures: Vec<String> = files
        .iter()
        .filter_map(|p| {
            runner.run(&std::fs::read(p).expect("reproducer")).err().map(|e| format!("{}: {e}", p.display()))
        })
        .collect();
    assert!(failures.is_empty(), "{} of {} reproducers panic:\n{}", failures.len(), files.len(), failures.join("\n"));
}

#[test]
fn replay_gguf() {
    replay(Target::Gguf);
}

#[test]
fn replay_gguf_source() {
    replay(Target::GgufSource);
}

#[test]
fn replay_safetensors() {
    replay(Target::Safetensors);
}

#[test]
fn replay_cawsf() {
    replay(Target::Cawsf);
}

#[test]
fn replay_flat_manifest() {
    replay(Target::FlatManifest);
}

// ---------------------------------------------------------------------------------------
// Seeded random mutations

/// xorshift64*: deterministic, so a failure names a seed and iteration that reproduce it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integers that sit on the edges parsers check: zero, small counts, block sizes,
/// alignments, the 32- and 64-bit limits.
const EDGES: [u64; 20] = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    31,
    32,
    255,
    256,
    4096,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 62,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
];

/// One byte-level mutation of `data`, at an offset below `hot` nine times out of ten
/// (the header, where the structure is).
fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, hot: usize) {
    if data.is_empty() {
        data.push(0);
    }
    let len = data.len();
    let at = if rng.below(10) < 9 { rng.below(hot.min(len)) } else { rng.below(len) };
    match rng.below(7) {
        0 => data[at] ^= 1 << rng.below(8),
        1 => data[at] = *rng.pick(&[0, 1, 0x7f, 0x80, 0xff, b'"', b'{', b'0']),
        2 | 3 => {
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            let v = if rng.below(4) == 0 { len as u64 } else { *rng.pick(&EDGES) };
            let end = (at + width).min(len);
            data[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
        }
        4 => data.truncate(at),
        5 => {
            let (from, n) = (rng.below(len), rng.below(64));
            let chunk: Vec<u8> = data[from..(from + n).min(len)].to_vec();
            let end = (at + chunk.len()).min(len);
            data[at..end].copy_from_slice(&chunk[..end - at]);
        }
        _ => {
            let n = rng.below(16).min(len - at);
            data.drain(at..at + n);
        }
    }
}

/// Runs `iterations` inputs made by `mutate` (from a fresh copy of a random seed each
/// time) through `runner`; fails with the seed and iteration of every panic.
fn mutants<S>(runner: &Runner, seeds: &[S], iterations: usize, mut mutate: impl FnMut(&mut Rng, &S) -> Vec<u8>) {
    let target = runner.target;
    let mut rng = Rng(0x5eed_0000 + target as u64);
    let mut failures = Vec::new();
    for i in 0..iterations {
        let seed = rng.below(seeds.len());
        let input = mutate(&mut rng, &seeds[seed]);
        if let Err(e) = runner.run(&input) {
            failures.push(format!("iteration {i} (seed {seed}, {} bytes): {e}", input.len()));
        }
    }
    assert!(failures.is_empty(), "{}: {} of {iterations} mutants panic:\n{}", target.name(), failures.len(), {
        failures.truncate(20);
        failures.join("\n")
    });
}

/// A fixture and the length of its header (where byte mutations concentrate).
struct Seed {
    bytes: Vec<u8>,
    hot: usize,
}

fn gguf_seed(rel: &str) -> Seed {
    let bytes = fixture(rel);
    let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(&bytes));
    let f = GgufFile::parse(src, Path::new(rel)).expect("fixture parses");
    Seed { hot: f.data_start as usize, bytes }
}

#[test]
fn mutants_gguf() {
    let seeds = ["llama3.q4_0", "qwen2.q8_0", "spm"].map(|n| gguf_seed(&format!("tests/fixtures/gguf/{n}.gguf")));
    mutants(&Runner::new(Target::Gguf), &seeds, 3000, |rng, s| {
        let mut data = s.bytes.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_bytes(rng, &mut data, s.hot);
        }
        data
    });
}

/// A value of a random type from the edges: counts, ids, floats, names the GGUF reader
/// branches on, small arrays.
fn edge_value(rng: &mut Rng) -> GgufValue {
    let n = *rng.pick(&EDGES);
    match rng.below(9) {
        0 => GgufValue::U32(n as u32),
        1 => GgufValue::U64(n),
        2 => GgufValue::I32(*rng.pick(&[-1, i32::MIN, 0, 1])),
        3 => GgufValue::F32(*rng.pick(&[0.0, -1.0, 1e-6, 4.0, 1e30, f32::NAN, f32::INFINITY])),
        4 => GgufValue::Bool(rng.below(2) == 0),
        5 | 6 => GgufValue::String(
            rng.pick(&[
                "",
                "llama",
                "mistral",
                "qwen2",
                "qwen3",
                "gpt2",
                "gpt-2",
                "llama-bpe",
                "qwen2",
                "none",
                "linear",
                "llama3",
                "yarn",
                "a b",
                "a",
                "\u{2581}",
                "{{ x }}",
            ])
            .to_string(),
        ),
        7 => GgufValue::Array((0..rng.below(4)).map(|i| GgufValue::String(["a", "b", "a b", ""][i].into())).collect()),
        _ => GgufValue::Array((0..rng.below(4)).map(|_| GgufValue::U32(n as u32)).collect()),
    }
}

/// The metadata keys `source_from_gguf` reads (`{arch}` for the architecture).
const SOURCE_KEYS: [&str; 35] = [
    "general.architecture",
    "general.alignment",
    "{arch}.embedding_length",
    "{arch}.feed_forward_length",
    "{arch}.block_count",
    "{arch}.context_length",
    "{arch}.attention.head_count",
    "{arch}.attention.head_count_kv",
    "{arch}.attention.key_length",
    "{arch}.attention.value_length",
    "{arch}.attention.layer_norm_rms_epsilon",
    "{arch}.attention.sliding_window",
    "{arch}.rope.freq_base",
    "{arch}.rope.dimension_count",
    "{arch}.rope.scaling.type",
    "{arch}.rope.scaling.factor",
    "{arch}.rope.scaling.original_context_length",
    "{arch}.expert_count",
    "{arch}.expert_used_count",
    "{arch}.expert_feed_forward_length",
    "{arch}.expert_shared_feed_forward_length",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
];

/// One value-level mutation: a metadata value replaced, removed or cut short, or a
/// tensor's dimensions, type, offset or name changed.
fn mutate_gguf(rng: &mut Rng, p: &mut GgufParts) {
    let arch = p.arch().unwrap_or("llama").to_owned();
    match rng.below(8) {
        0 | 1 => {
            let key = rng.pick(&SOURCE_KEYS).replace("{arch}", &arch);
            let value = edge_value(rng);
            p.set_meta(key, value);
        }
        2 if !p.metadata.is_empty() => {
            let i = rng.below(p.metadata.len());
            p.metadata.remove(i);
        }
        3 if !p.metadata.is_empty() => {
            let i = rng.below(p.metadata.len());
            if let GgufValue::Array(items) = &mut p.metadata[i].1 {
                let keep = rng.below(items.len() + 1);
                items.truncate(keep);
            } else {
                p.metadata[i].1 = edge_value(rng);
            }
        }
        4 if !p.infos.is_empty() => {
            let t = rng.below(p.infos.len());
            let d = rng.below(p.infos[t].ne.len());
            let old = p.infos[t].ne[d];
            p.infos[t].ne[d] = *rng.pick(&[0, 1, 2, 32, 256, old / 2, old.saturating_mul(2)]);
        }
        5 if !p.infos.is_empty() => {
            let t = rng.below(p.infos.len());
            p.infos[t].ggml_type = *rng.pick(&[0, 1, 2, 8, 12, 14, 30, 10, 99]);
        }
        6 if !p.infos.is_empty() => {
            let (a, b) = (rng.below(p.infos.len()), rng.below(p.infos.len()));
            match rng.below(3) {
                0 => p.infos[a].name = p.infos[b].name.clone(),
                1 => drop(p.infos.remove(a)),
                _ => p.infos[a].offset = p.infos[b].offset,
            }
        }
        _ => {
            if let Some(i) = (!p.metadata.is_empty()).then(|| rng.below(p.metadata.len())) {
                p.metadata[i].1 = edge_value(rng);
            }
        }
    }
}

#[test]
fn mutants_gguf_source() {
    let seeds = ["llama3.q4_0", "qwen2.q4_0", "mistral.f16", "qwen3.f16", "spm"]
        .map(|n| GgufParts::read(&format!("tests/fixtures/gguf/{n}.gguf")));
    gguf_source_mutants(&seeds, mutate_gguf);
}

/// The mixture-of-experts GGUF fixtures (`tools/make_moe_fixtures.py`; 8 experts each).
const MOE_GGUF: [&str; 3] = ["mixtral.q8_0", "qwen2_moe.q8_0", "qwen3_moe.q8_0"];

/// The metadata keys that size a MoE model's experts (Mixtral's width is
/// `feed_forward_length`).
const EXPERT_KEYS: [&str; 5] = [
    "{arch}.expert_count",
    "{arch}.expert_used_count",
    "{arch}.expert_feed_forward_length",
    "{arch}.expert_shared_feed_forward_length",
    "{arch}.feed_forward_length",
];

/// One mutation aimed at the experts: an expert count, top-k or width set to a value on
/// an edge of its check (0, one either side of the fixtures' 8 and of `MAX_EXPERTS`,
/// beyond the 2^40 size cap), or a router, stacked expert or shared expert tensor given
/// another size, one dimension fewer or one more; else any `mutate_gguf` mutation.
fn mutate_experts(rng: &mut Rng, p: &mut GgufParts) {
    let arch = p.arch().unwrap_or("llama").to_owned();
    let experts: Vec<usize> = (0..p.infos.len()).filter(|&i| p.infos[i].name.contains("_exps.")).collect();
    let others: Vec<usize> = (0..p.infos.len())
        .filter(|&i| p.infos[i].name.contains("_gate_inp") || p.infos[i].name.contains("_shexp"))
        .collect();
    match rng.below(4) {
        0 | 1 => {
            let key = rng.pick(&EXPERT_KEYS).replace("{arch}", &arch);
            let max = strata::model::config::MAX_EXPERTS as u64;
            let n = *rng.pick(&[0, 1, 2, 4, 7, 8, 9, 16, max - 1, max, max + 1, 1 << 40, (1 << 40) + 1, u64::MAX]);
            let value = match rng.below(3) {
                0 => GgufValue::U64(n),
                1 => GgufValue::U32(n as u32),
                _ => edge_value(rng),
            };
            p.set_meta(key, value);
        }
        2 if !experts.is_empty() || !others.is_empty() => {
            let pool = if others.is_empty() || (!experts.is_empty() && rng.below(3) > 0) { &experts } else { &others };
            let ne = &mut p.infos[*rng.pick(pool)].ne;
            match rng.below(4) {
                0 if ne.len() > 1 => {
                    let last = ne.pop().expect("two dimensions");
                    *ne.last_mut().expect("one dimension") *= last;
                }
                1 => ne.push(*rng.pick(&[1, 2, 8])),
                _ => {
                    let d = rng.below(ne.len());
                    let old = ne[d];
                    ne[d] = *rng.pick(&[0, 1, 2, 6, 9, 32, old / 2, old + 1, old.saturating_mul(2), 1 << 40]);
                }
            }
        }
        _ => mutate_gguf(rng, p),
    }
}

/// The expert metadata and stacked expert tensors of the MoE fixtures, mutated: a file
/// whose experts disagree is refused with an error, never a panic or a read past a
/// tensor (`tests/it/moe_bad_files.rs` checks what those errors say).
#[test]
fn mutants_gguf_source_experts() {
    let seeds = MOE_GGUF.map(|n| GgufParts::read(&format!("tests/fixtures/gguf/{n}.gguf")));
    gguf_source_mutants(&seeds, mutate_experts);
}

/// 600 inputs through `source_from_gguf`, each a seed with its metadata and tensor
/// table changed by one to three rounds of `mutate` over the seed's data section.
fn gguf_source_mutants(seeds: &[GgufParts], mutate: fn(&mut Rng, &mut GgufParts)) {
    mutants(&Runner::new(Target::GgufSource), seeds, 600, |rng, s| {
        let mut p = GgufParts {
            version: s.version,
            alignment: s.alignment,
            metadata: s.metadata.clone(),
            infos: s.infos.clone(),
            data: Vec::new(),
        };
        for _ in 0..1 + rng.below(3) {
            mutate(rng, &mut p);
        }
        p.data = s.data.clone();
        p.write()
    });
}

/// One value-level mutation of a JSON document: a random leaf (or container) replaced
/// by an edge value, removed, or an array element duplicated.
fn mutate_json(rng: &mut Rng, v: &mut Value) {
    let mut at = v;
    // Walk down a random path, stopping at a random depth.
    loop {
        let children = match &*at {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if children == 0 || rng.below(4) == 0 {
            break;
        }
        let i = rng.below(children);
        if rng.below(6) == 0 {
            match at {
                Value::Object(m) => {
                    let key = m.keys().nth(i).cloned().expect("in range");
                    m.remove(&key);
                }
                Value::Array(a) => {
                    let dup = a[i].clone();
                    if rng.below(2) == 0 { a.push(dup) } else { drop(a.remove(i)) }
                }
                _ => unreachable!("has children"),
            }
            return;
        }
        at = match at {
            Value::Object(m) => m.values_mut().nth(i).expect("in range"),
            Value::Array(a) => &mut a[i],
            _ => unreachable!("has children"),
        };
    }
    let n = *rng.pick(&EDGES);
    *at = match rng.below(8) {
        0 => Value::from(n),
        1 => Value::from(n.wrapping_add(1)),
        2 => Value::from(-1),
        3 => Value::from(0.5),
        4 => Value::Null,
        5 => Value::from(*rng.pick(&["", "F32", "Q4_0", "Q8_K", "I8", "embed.bin", "layer_000.bin", "../x", "layer"])),
        6 => Value::Array(vec![Value::from(n), Value::from(0)]),
        _ => Value::from(*rng.pick(&["0000000000000000", "model.layers.0.x", "model.layers.99.x", "lm_head.weight"])),
    };
}

#[test]
fn mutants_safetensors() {
    let seeds: Vec<Seed> = ["llama3/model.safetensors", "qwen3/model.safetensors", "llama_f16/model.safetensors"]
        .iter()
        .map(|rel| {
            let bytes = fixture(&format!("tests/fixtures/hf/{rel}"));
            let header = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
            Seed { hot: 8 + header, bytes }
        })
        .collect();
    mutants(&Runner::new(Target::Safetensors), &seeds, 3000, |rng, s| {
        if rng.below(2) == 0 {
            let mut data = s.bytes.clone();
            for _ in 0..1 + rng.below(3) {
                mutate_bytes(rng, &mut data, s.hot);
            }
            return data;
        }
        let mut header: Value = serde_json::from_slice(&s.bytes[8..s.hot]).expect("fixture header");
        for _ in 0..1 + rng.below(3) {
            mutate_json(rng, &mut header);
        }
        let text = header.to_string();
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text.as_bytes());
        out.extend(&s.bytes[s.hot..]);
        out
    });
}

/// The manifest `strata convert` wrote for the flat runner's model.
fn converted_manifest(runner: &Runner) -> Value {
    let text = std::fs::read(runner.model().join(flat::MANIFEST)).expect("the converted manifest");
    serde_json::from_slice(&text).expect("the converted manifest is JSON")
}

#[test]
fn mutants_flat_manifest() {
    let runner = Runner::new(Target::FlatManifest);
    let manifest = converted_manifest(&runner);
    mutants(&runner, &[manifest], 1500, |rng, m| {
        let mut m = m.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_json(rng, &mut m);
        }
        serde_json::to_vec_pretty(&m).expect("serializable")
    });
}

#[test]
fn mutants_cawsf() {
    let runner = Runner::new(Target::Cawsf);
    let bytes = std::fs::read(runner.model()).expect("the converted .cawsf");
    // The header block and TOC lead the file; most structure is in its first pages.
    let seed = Seed { hot: bytes.len().min(16 << 10), bytes };
    mutants(&runner, &[seed], 1500, |rng, s| {
        let mut data = s.bytes.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_bytes(rng, &mut data, s.hot);
        }
        data
    });
}

/// The same for a `.cawsf` file whose layer matrices are NDSQ shards (`convert --ndsq`):
/// mutated shard payloads reach the NDSQ parsers and the reconstruction.
#[test]
fn mutants_cawsf_ndsq() {
    let runner = Runner::new(Target::Cawsf);
    let model = runner.scratch.0.join("ndsq.cawsf");
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("convert")
        .arg(root().join(CONVERT_SOURCE))
        .arg(&model)
        .args(["--format", "cawsf", "--ndsq", "--rank", "4", "--pq-k", "16"])
        .output()
        .expect("running strata convert --ndsq");
    assert!(o.status.success(), "strata convert --ndsq: {}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&model).expect("the NDSQ .cawsf");
    let seed = Seed { hot: bytes.len(), bytes };
    mutants(&runner, &[seed], 600, |rng, s| {
        let mut data = s.bytes.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_bytes(rng, &mut data, s.hot);
        }
        data
    });
}

/// Deriving SentencePiece merges hashes every prefix of every piece, so a file with one
/// long piece took time quadratic in its length (a 60 KB piece: 2 s; 1 MB: minutes); such
/// a vocabulary is now refused.
#[test]
fn spm_vocabulary_with_a_huge_piece_is_refused() {
    let runner = Runner::new(Target::GgufSource);
    let mut p = GgufParts::read("tests/fixtures/gguf/spm.gguf");
    let (_, tokens) = p.metadata.iter_mut().find(|(k, _)| k == "tokenizer.ggml.tokens").expect("tokens");
    let GgufValue::Array(tokens) = tokens else { panic!("tokens are an array") };
    tokens[300] = GgufValue::String("a".repeat(40_000));
    let input = p.write();
    runner.run(&input).expect("no panic");
    let path = runner.scratch.0.join("fuzz.gguf");
    let err = source_from_gguf(&path).err().expect("a 40 KB piece is refused");
    assert!(format!("{err:#}").contains("too long to derive merges"), "{err:#}");
}

/// Found by reading `flat::verify` while writing its fuzz target: a zero-size tensor at
/// the offset of the tensor before it in a `.bin` file passes the manifest checks (zero
/// bytes overlap nothing), and when that file's checksum differs, `verify` looked for
/// non-zero padding between the end of the first tensor and the start of the second,
/// a backwards range.
#[test]
fn flat_verify_survives_a_zero_size_tensor_at_another_tensors_offset() {
    let runner = Runner::new(Target::FlatManifest);
    let mut m = converted_manifest(&runner);
    let tensors = m["tensors"].as_array_mut().expect("tensors");
    let i = tensors.iter().position(|t| t["size"].as_u64() > Some(0)).expect("a non-empty tensor");
    let (file, offset) = (tensors[i]["file"].clone(), tensors[i]["offset"].clone());
    let zero = serde_json::json!({"name": "model.zero", "dtype": "F32", "shape": [0], "file": file,
        "offset": offset, "size": 0, "xxh3": checksum::hex(&[])});
    tensors.insert(i + 1, zero);
    let files = m["files"].as_array_mut().expect("files");
    let entry = files.iter_mut().find(|f| f["name"] == file).expect("the tensor's file is listed");
    entry["xxh3"] = Value::from("0000000000000000");
    let input = serde_json::to_vec_pretty(&m).expect("serializable");
    runner.run(&input).unwrap_or_else(|e| panic!("flat::verify panics: {e}"));
    let dir = runner.scratch.0.join("flat");
    let err = flat::verify(&dir).expect_err("the file checksum differs").to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
}

/// The mutation helpers themselves: the GGUF writer round-trips a fixture byte for byte
/// in everything the reader keeps.
#[test]
fn gguf_writer_round_trips() {
    let rel = "tests/fixtures/gguf/qwen2.q4_0.gguf";
    let p = GgufParts::read(rel);
    let bytes = p.write();
    let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(&bytes));
    let f = GgufFile::parse(src, Path::new(rel)).expect("rewritten fixture parses");
    let orig: BTreeMap<String, GgufValue> = p.metadata.into_iter().collect();
    assert_eq!(f.metadata, orig);
    assert_eq!(f.infos.len(), p.infos.len());
    for (a, b) in f.infos.iter().zip(&p.infos) {
        assert_eq!((&a.name, &a.ne, a.ggml_type, a.offset), (&b.name, &b.ne, b.ggml_type, b.offset));
    }
    let t = &f.tensors["token_embd.weight"];
    let original = GgufParts::read(rel);
    let start = original.infos.iter().find(|i| i.name == "token_embd.weight").unwrap().offset as usize;
    assert_eq!(t.bytes(), &original.data[start..start + t.bytes().len()]);
}
