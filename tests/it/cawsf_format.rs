//! The `.cawsf` container: round trips from the Hugging Face and GGUF fixtures (made by
//! `tools/make_fixtures.py` and `tools/make_gguf_fixtures.py`) with identical tensors and
//! bit-identical logits, atomic output, layer layout, `verify` naming every corrupted
//! region, and hostile files failing cleanly without panics or giant allocations.
//!
//! The helpers that edit the header and TOC below are written from `docs/formats.md` (`.cawsf` container)
//! alone, as an independent reader would.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::support;

use support::{TempDir, groups};

use serde_json::Value;
use strata::engine::session::{Engine, RunOptions};
use strata::format::cawsf::{self, CawsfWriter, Compression};
use strata::format::{Group, ModelWriter};
use strata::model::ModelSource;
use strata::model::convert::meta_of;
use strata::model::decoder::SeqStep;
use strata::tensor::HostTensor;

/// Records the largest single allocation, so hostile files can be shown not to make the
/// reader allocate what they claim.
struct Watch;

static LARGEST_ALLOC: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Watch = Watch;

/// No allocation in this test binary may exceed this (the fixtures are a few MiB).
const ALLOC_CAP: usize = 64 << 20;

const SOURCES: [&str; 5] =
    ["hf/llama3", "hf/qwen2", "hf/llama_bf16_256", "gguf/llama3.q4_0.gguf", "gguf/llama256.q4_k_m.gguf"];
const COMPRESSIONS: [Compression; 3] = [Compression::None, Compression::Zstd, Compression::Lz4];

fn fixture(rel: &str) -> String {
    format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn write(src: &ModelSource, out: &Path, c: Compression) {
    let g = groups(src);
    let layers = g.keys().filter(|k| matches!(k, Group::Layer(_))).count();
    let mut w: Box<dyn ModelWriter> = Box::new(CawsfWriter::create(out, &meta_of(src), layers, c).unwrap());
    for (group, tensors) in &g {
        w.write_group(*group, tensors).unwrap();
    }
    w.finish().unwrap();
}

/// Logits at every position of a few tokens.
fn logits(src: ModelSource) -> Vec<f32> {
    let e = Engine::from_source(src, &RunOptions { threads: 2, ..Default::default() }).unwrap();
    let tokens: Vec<u32> = [1u32, 7, 42, 300, 5, 99].iter().map(|t| t % e.model.config().vocab_size as u32).collect();
    let mut cache = e.model.new_cache(16).unwrap();
    e.model
        .forward(&mut [SeqStep { tokens: &tokens, cache: &mut cache, all_logits: true, verify: false }])
        .unwrap()
        .remove(0)
}

/// A model written from `rel` into a fresh temp dir, named as the source.
fn written(rel: &str, c: Compression) -> (TempDir, PathBuf) {
    let src = ModelSource::from_path(&fixture(rel)).unwrap();
    let dir = TempDir::new(c.name());
    let out = dir.path(&format!("{}.cawsf", src.name));
    write(&src, &out, c);
    (dir, out)
}

#[test]
fn round_trips_every_fixture_with_identical_tensors_and_logits() {
    for rel in SOURCES {
        let want = logits(ModelSource::from_path(&fixture(rel)).unwrap());
        for c in COMPRESSIONS {
            let src = ModelSource::from_path(&fixture(rel)).unwrap();
            let dir = TempDir::new("roundtrip");
            let out = dir.path(&format!("{}.cawsf", src.name));
            write(&src, &out, c);
            let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
            let what = format!("{rel} {c:?}");
            assert_eq!(meta_of(&back), meta_of(&src), "{what}: meta");
            let mut names: Vec<&String> = src.tensors.keys().collect();
            names.sort();
            let mut back_names: Vec<&String> = back.tensors.keys().collect();
            back_names.sort();
            assert_eq!(names, back_names, "{what}: tensor names");
            for name in names {
                let (a, b) = (&src.tensors[name], &back.tensors[name]);
                assert_eq!((a.dtype, &a.shape), (b.dtype, &b.shape), "{what}: {name}");
                assert!(a.bytes() == b.bytes(), "{what}: {name}: bytes differ");
                if c == Compression::None {
                    let addr = b.bytes().as_ptr() as usize;
                    assert_eq!(addr % 4096, 0, "{what}: {name} is not a page-aligned view of the map");
                }
            }
            let got = logits(back);
            assert!(got == want, "{what}: logits differ from the source's");
            let report = cawsf::verify(&out).unwrap();
            assert_eq!(report.tensors, src.tensors.len(), "{what}");
            let info = cawsf::inspect(&out).unwrap();
            let meta_flags =
                info["sections"].as_array().unwrap().iter().find(|s| s["name"] == "META").unwrap()["flags"]
                    .as_u64()
                    .unwrap();
            let want_flags = match c {
                Compression::None => 0,
                Compression::Zstd => 1,
                Compression::Lz4 => 2,
            };
            assert_eq!(meta_flags, want_flags, "{what}: the META section is compressed as asked");
        }
    }
}

#[test]
fn compressible_tensors_are_stored_compressed() {
    let mut src = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    let zeros = HostTensor::from_f32(&vec![0.0; 64 * 64], vec![64, 64]);
    src.tensors.insert("model.layers.0.self_attn.q_proj.weight".into(), zeros.clone());
    for c in [Compression::Zstd, Compression::Lz4] {
        let dir = TempDir::new("compressible");
        let out = dir.path("m.cawsf");
        write(&src, &out, c);
        let info = cawsf::inspect(&out).unwrap();
        let t =
            info["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "model.layers.0.self_attn.q_proj.weight");
        let t = t.unwrap();
        assert_eq!(t["compression"][0], c.name(), "{c:?}");
        assert!(t["stored_bytes"].as_u64().unwrap() < 1000, "{c:?}: {t}");
        let back = cawsf::open(&out).unwrap();
        assert!(back.tensors["model.layers.0.self_attn.q_proj.weight"].bytes() == zeros.bytes());
    }
}

#[test]
fn output_appears_only_at_finish_and_is_never_overwritten() {
    let src = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    let dir = TempDir::new("atomic");
    let out = dir.path("m.cawsf");
    let g = groups(&src);
    {
        let mut w = CawsfWriter::create(&out, &meta_of(&src), 2, Compression::None).unwrap();
        w.write_group(Group::Global, &g[&Group::Global]).unwrap();
        w.write_group(Group::Layer(0), &g[&Group::Layer(0)]).unwrap();
        assert!(!out.exists(), "output visible before finish");
        let entries: Vec<_> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries.len(), 1, "one temporary file: {entries:?}");
        assert!(entries[0].to_string_lossy().starts_with(".m.cawsf.tmp-"), "{entries:?}");
    }
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0, "a dropped writer leaves nothing behind");
    write(&src, &out, Compression::None);
    assert!(out.is_file());
    let before = std::fs::read(&out).unwrap();
    let err = CawsfWriter::create(&out, &meta_of(&src), 2, Compression::None).err().unwrap();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
}

#[test]
fn layers_are_contiguous_aligned_ranges_and_raw_payloads_are_aligned() {
    let src = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    for c in COMPRESSIONS {
        let (_dir, out) = written("hf/llama3", c);
        let file = std::fs::read(&out).unwrap();
        let ranges = cawsf::layer_ranges(&out).unwrap();
        assert_eq!(ranges.len(), 2);
        let info = cawsf::inspect(&out).unwrap();
        let global = &info["layer_ranges"]["global"];
        let mut end = global["offset"].as_u64().unwrap() + global["len"].as_u64().unwrap();
        assert_eq!(global["offset"], 4096, "the bank starts with the global group");
        for (i, r) in ranges.iter().enumerate() {
            assert_eq!(r.layer, i);
            assert_eq!((r.offset % 4096, r.len % 4096), (0, 0), "{c:?} layer {i}: {r:?}");
            assert_eq!(r.offset, end, "{c:?}: layer {i} follows the previous group directly");
            end = r.offset + r.len;
            // One read of the layer's range holds every tensor of the layer.
            let read = &file[r.offset as usize..end as usize];
            for t in info["tensors"].as_array().unwrap().iter().filter(|t| t["layer"] == i) {
                let at = t["offset"].as_u64().unwrap();
                assert!(at > r.offset && at + t["stored_bytes"].as_u64().unwrap() <= end, "{c:?}: {t}");
                if t["compression"][0] == "none" {
                    assert_eq!(at % 4096, 0, "{c:?}: raw payload of {} is not aligned", t["name"]);
                    let n = t["bytes"].as_u64().unwrap() as usize;
                    let off = (at - r.offset) as usize;
                    assert!(read[off..off + n] == *src.tensors[t["name"].as_str().unwrap()].bytes());
                }
            }
        }
    }
}

// --- Header and TOC, as docs/formats.md describes them. ---

#[derive(Clone, Copy, Debug)]
struct Rec {
    kind: u32,
    flags: u32,
    offset: u64,
    size: u64,
    raw_size: u64,
    checksum: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn read_toc(b: &[u8]) -> Vec<Rec> {
    (0..u32_at(b, 12) as usize)
        .map(|i| {
            let at = 24 + 40 * i;
            Rec {
                kind: u32_at(b, at),
                flags: u32_at(b, at + 4),
                offset: u64_at(b, at + 8),
                size: u64_at(b, at + 16),
                raw_size: u64_at(b, at + 24),
                checksum: u64_at(b, at + 32),
            }
        })
        .collect()
}

/// Rewrites the TOC and the header checksum (count and records as given).
fn write_toc(b: &mut [u8], recs: &[Rec]) {
    b[12..16].copy_from_slice(&(recs.len() as u32).to_le_bytes());
    for (i, r) in recs.iter().enumerate() {
        let at = 24 + 40 * i;
        b[at..at + 4].copy_from_slice(&r.kind.to_le_bytes());
        b[at + 4..at + 8].copy_from_slice(&r.flags.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&r.offset.to_le_bytes());
        b[at + 16..at + 24].copy_from_slice(&r.size.to_le_bytes());
        b[at + 24..at + 32].copy_from_slice(&r.raw_size.to_le_bytes());
        b[at + 32..at + 40].copy_from_slice(&r.checksum.to_le_bytes());
    }
    fix_header_checksum(b);
}

fn fix_header_checksum(b: &mut [u8]) {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&b[0..16]);
    h.update(&b[24..4096]);
    let sum = h.digest();
    b[16..24].copy_from_slice(&sum.to_le_bytes());
}

/// Appends a section of `kind` holding `data` at the next 4 KiB boundary.
fn append_section(b: &mut Vec<u8>, kind: u32, data: &[u8]) -> u64 {
    let offset = (b.len() as u64).next_multiple_of(4096);
    b.resize(offset as usize, 0);
    b.extend_from_slice(data);
    let mut toc = read_toc(b);
    let checksum = xxhash_rust::xxh3::xxh3_64(data);
    toc.push(Rec { kind, flags: 0, offset, size: data.len() as u64, raw_size: data.len() as u64, checksum });
    write_toc(b, &toc);
    offset
}

/// The META JSON of an uncompressed file.
fn meta_json(b: &[u8]) -> Value {
    let m = read_toc(b).into_iter().find(|r| r.kind == 1).unwrap();
    assert_eq!(m.flags, 0);
    serde_json::from_slice(&b[m.offset as usize..(m.offset + m.size) as usize]).unwrap()
}

fn save(dir: &TempDir, name: &str, b: &[u8]) -> PathBuf {
    let p = dir.path(name);
    std::fs::File::create(&p).unwrap().write_all(b).unwrap();
    p
}

fn verify_err(dir: &TempDir, b: &[u8]) -> String {
    let p = save(dir, "v.cawsf", b);
    match cawsf::verify(&p) {
        Ok(r) => panic!("verify passed a corrupted file: {r:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn verify_names_the_region_of_every_flipped_byte() {
    let (dir, out) = written("hf/llama3", Compression::None);
    let mut good = std::fs::read(&out).unwrap();
    let unknown_at = append_section(&mut good, 99, &[7u8; 1000]);
    let p = save(&dir, "good.cawsf", &good);
    let report = cawsf::verify(&p).unwrap();
    assert_eq!(report.sections, 3);
    let flipped = |at: usize| {
        let mut b = good.clone();
        b[at] ^= 0x10;
        b
    };

    let n_sections = read_toc(&good).len();
    let mut header_bytes: Vec<usize> = (0..24 + 40 * n_sections).collect();
    header_bytes.extend([200, 2048, 4095]);
    for at in header_bytes {
        let e = verify_err(&dir, &flipped(at));
        assert!(e.contains("header"), "flip at {at}: {e}");
    }

    let toc = read_toc(&good);
    let meta = toc.iter().find(|r| r.kind == 1).unwrap();
    for at in [meta.offset, meta.offset + meta.size / 2, meta.offset + meta.size - 1] {
        let e = verify_err(&dir, &flipped(at as usize));
        assert!(e.contains(&format!("at byte {}: section META: checksum mismatch", meta.offset)), "{e}");
    }

    let m = meta_json(&good);
    let shards = m["checksum_index"]["shards"].as_array().unwrap();
    assert!(shards.len() > 40, "{}", shards.len());
    let names: BTreeMap<u64, &str> = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| {
            let name = t["name"].as_str().unwrap();
            let chunks = t["chunks"].as_array().unwrap().iter().map(move |c| (c["offset"].as_u64().unwrap(), name));
            std::iter::once((t["desc"].as_u64().unwrap(), name)).chain(chunks)
        })
        .collect();
    for (i, s) in shards.iter().enumerate() {
        let (offset, len) = (s["offset"].as_u64().unwrap(), s["len"].as_u64().unwrap());
        for at in [0, 3, 11, len / 2, len - 1].map(|k| offset + k) {
            let e = verify_err(&dir, &flipped(at as usize));
            assert!(e.contains(&format!("at byte {offset}: shard {i} (")), "flip at {at}: {e}");
            if let Some(name) = names.get(&offset) {
                assert!(e.contains(&format!("tensor `{name}`")), "{e}");
            }
        }
    }

    let e = verify_err(&dir, &flipped(unknown_at as usize + 500));
    assert!(e.contains(&format!("at byte {unknown_at}: section type 99: checksum mismatch")), "{e}");
    let gap = (meta.offset + meta.size + 10) as usize;
    assert!(gap < unknown_at as usize);
    let e = verify_err(&dir, &flipped(gap));
    assert!(e.contains(&format!("at byte {gap}: padding")), "{e}");
}

#[test]
fn verify_names_flips_in_compressed_files() {
    let (dir, out) = written("hf/llama3", Compression::Zstd);
    let good = std::fs::read(&out).unwrap();
    cawsf::verify(&out).unwrap();
    let meta = read_toc(&good).into_iter().find(|r| r.kind == 1).unwrap();
    assert_eq!(meta.flags, 1);
    let mut b = good.clone();
    b[(meta.offset + meta.size / 2) as usize] ^= 1;
    assert!(verify_err(&dir, &b).contains("section META: checksum mismatch"));
    let info = cawsf::inspect(&out).unwrap();
    for t in info["tensors"].as_array().unwrap() {
        let payload = t["offset"].as_u64().unwrap();
        let mut b = good.clone();
        b[payload as usize + 1] ^= 0x80;
        let e = verify_err(&dir, &b);
        assert!(e.contains(&format!("at byte {}: shard", payload - 12)), "{e}");
        assert!(e.contains(&format!("tensor `{}`", t["name"].as_str().unwrap())), "{e}");
    }
}

/// `open` on `b` must fail with a message containing `want`.
fn open_err(dir: &TempDir, b: &[u8], want: &str) {
    let p = save(dir, "bad.cawsf", b);
    match cawsf::open(&p) {
        Ok(_) => panic!("opened a bad file (wanted an error containing `{want}`)"),
        Err(e) => {
            let e = format!("{e:#}");
            assert!(e.contains(want) && e.contains("bad.cawsf"), "wanted `{want}`, got: {e}");
        }
    }
    assert!(cawsf::verify(&p).is_err(), "verify passed a file open refuses ({want})");
}

/// Offsets of the first raw TENSOR_DATA shard and of a TENSOR_DESC shard.
fn shard_offsets(b: &[u8]) -> (u64, u64) {
    let m = meta_json(b);
    let t = &m["tensors"][0];
    (t["chunks"][0]["offset"].as_u64().unwrap(), t["desc"].as_u64().unwrap())
}

#[test]
fn hostile_files_fail_cleanly() {
    let (dir, out) = written("gguf/llama3.q4_0.gguf", Compression::None);
    let good = std::fs::read(&out).unwrap();
    let toc = read_toc(&good);
    let (meta_i, bank_i) =
        (toc.iter().position(|r| r.kind == 1).unwrap(), toc.iter().position(|r| r.kind == 3).unwrap());

    let mut cuts: Vec<usize> = vec![0, 1, 7, 8, 15, 23, 24, 63, 64, 103, 104, 4095, 4096, 4097, 4108, 5000];
    cuts.extend((4096..good.len()).step_by(good.len() / 40));
    cuts.extend([good.len() - 4096, good.len() - 100, good.len() - 1]);
    for cut in cuts {
        let p = save(&dir, "bad.cawsf", &good[..cut]);
        let e = cawsf::open(&p).err().unwrap_or_else(|| panic!("opened a file cut at {cut}"));
        assert!(format!("{e:#}").contains("bad.cawsf"), "{e:#}");
        assert!(cawsf::verify(&p).is_err(), "cut at {cut}");
    }

    let mut b = good.clone();
    b[0] = b'X';
    open_err(&dir, &b, "magic");
    let mut b = good.clone();
    b[8] = 2;
    open_err(&dir, &b, "version 2 is not supported");
    let mut b = good.clone();
    b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    open_err(&dir, &b, "4294967295 sections");
    let mut b = good.clone();
    b[100] ^= 1;
    open_err(&dir, &b, "header/TOC checksum mismatch");

    let edit = |f: &dyn Fn(&mut Vec<Rec>)| {
        let mut b = good.clone();
        let mut t = read_toc(&b);
        f(&mut t);
        write_toc(&mut b, &t);
        b
    };
    let len = good.len() as u64;
    open_err(&dir, &edit(&|t| t[meta_i].offset = len.next_multiple_of(4096) + 4096), "past the end");
    open_err(&dir, &edit(&|t| t[bank_i].offset = u64::MAX - 4095), "past the end");
    open_err(&dir, &edit(&|t| t[bank_i].size = u64::MAX), "past the end");
    open_err(&dir, &edit(&|t| t[meta_i].size = len), "past the end");
    open_err(&dir, &edit(&|t| t[bank_i].offset = 4096 + 12), "not a multiple of 4096");
    open_err(&dir, &edit(&|t| t[meta_i].offset = 0), "not a multiple of 4096");
    open_err(&dir, &edit(&|t| t[meta_i].offset = t[bank_i].offset), "overlap");
    open_err(&dir, &edit(&|t| t[meta_i].flags = 4), "unknown flags");
    open_err(&dir, &edit(&|t| t[meta_i].raw_size += 1), "raw_size");
    open_err(&dir, &edit(&|t| t[bank_i].flags = 1), "compressed as a whole");
    open_err(&dir, &edit(&|t| t.retain(|r| r.kind != 3)), "no SHARD_BANK");
    open_err(&dir, &edit(&|t| t.push(t[meta_i])), "appears twice");
    open_err(&dir, &edit(&|t| t.extend([t[meta_i]; 100])), "102 sections");
    open_err(&dir, &edit(&|t| t[meta_i].checksum ^= 1), "section META: checksum mismatch");

    // Shard headers, with the bank's own checksums left stale: `open` hashes only the
    // header block and META, so these reach the structural checks.
    let (data, desc) = shard_offsets(&good);
    let shard = |at: u64, f: &dyn Fn(&mut [u8])| {
        let mut b = good.clone();
        f(&mut b[at as usize..at as usize + 12]);
        b
    };
    open_err(&dir, &shard(data, &|h| h[8..12].copy_from_slice(&u32::MAX.to_le_bytes())), "past the end of the bank");
    open_err(&dir, &shard(data, &|h| h[4..8].copy_from_slice(&u32::MAX.to_le_bytes())), "differs from csize");
    open_err(&dir, &shard(data, &|h| h[0] = 0x42), "unknown shard type");
    // An NDSQ shard where a TENSOR_DESC belongs: no tensor for it to belong to.
    open_err(&dir, &shard(desc, &|h| h[0] = 0), "(NDSQ L scope 65535) a data shard without a TENSOR_DESC");
    // An NDSQ shard among a tensor's data shards: the tensor cannot mix the two.
    open_err(&dir, &shard(data, &|h| h[0] = 1), "NDSQ");
    open_err(&dir, &shard(data, &|h| h[3] = 9), "unknown compression code");
    open_err(&dir, &shard(data, &|h| h[1] = 200), "layers");
    open_err(&dir, &shard(desc, &|h| h[1..3].copy_from_slice(&0u16.to_le_bytes())), "contiguous");
    let mut b = good.clone();
    let dims_at =
        desc as usize + 12 + 2 + u16::from_le_bytes([b[desc as usize + 12], b[desc as usize + 13]]) as usize + 4;
    b[dims_at..dims_at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    open_err(&dir, &b, "does not take");

    // META that disagrees with the bank.
    let with_meta = |f: &dyn Fn(&mut Value)| {
        let mut m = meta_json(&good);
        f(&mut m);
        let mut b = good[..toc[meta_i].offset as usize].to_vec();
        let json = serde_json::to_vec(&m).unwrap();
        b.extend_from_slice(&json);
        let mut t = read_toc(&b);
        t[meta_i].size = json.len() as u64;
        t[meta_i].raw_size = json.len() as u64;
        t[meta_i].checksum = xxhash_rust::xxh3::xxh3_64(&json);
        write_toc(&mut b, &t);
        b
    };
    open_err(&dir, &with_meta(&|m| m["tensors"][0]["shape"][0] = 4.into()), "does not match the bank");
    open_err(&dir, &with_meta(&|m| m["tensors"].as_array_mut().unwrap().truncate(3)), "tensors");
    open_err(&dir, &with_meta(&|m| m["n_layers"] = 1_000_000.into()), "layers");
    open_err(&dir, &with_meta(&|m| m["n_layers"] = 1.into()), "layers");
    open_err(&dir, &with_meta(&|m| m["layers"][1]["len"] = 4096.into()), "layer 1");
    open_err(
        &dir,
        &with_meta(&|m| m["checksum_index"]["shards"].as_array_mut().unwrap().pop().map(drop).unwrap()),
        "shards",
    );
    open_err(&dir, &with_meta(&|m| m["format"] = "gguf".into()), "format `gguf`");
    open_err(&dir, &with_meta(&|m| *m = Value::Null), "not valid META JSON");

    // A compressed file claiming a huge uncompressed size.
    let mut src = ModelSource::from_path(&fixture("gguf/llama3.q4_0.gguf")).unwrap();
    src.tensors.insert("model.layers.0.zeros".into(), HostTensor::from_f32(&[0.0; 4096], vec![4096]));
    let zout = dir.path("z.cawsf");
    write(&src, &zout, Compression::Zstd);
    let zgood = std::fs::read(&zout).unwrap();
    let zm = read_toc(&zgood).into_iter().position(|r| r.kind == 1).unwrap();
    let mut b = zgood.clone();
    let mut t = read_toc(&b);
    t[zm].raw_size = u64::MAX;
    write_toc(&mut b, &t);
    open_err(&dir, &b, "claims");
    let info = cawsf::inspect(&zout).unwrap();
    let z = info["tensors"].as_array().unwrap().iter().find(|t| t["compression"][0] == "zstd").expect("a zstd shard");
    let at = z["offset"].as_u64().unwrap() as usize - 12;
    let mut b = zgood.clone();
    b[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut b2 = b.clone();
    open_err(&dir, &b, "claims 4294967295 bytes");
    b2[at + 8..at + 12].copy_from_slice(&(u32::MAX / 1000).to_le_bytes());
    open_err(&dir, &b2, "past the end of the bank");

    let largest = LARGEST_ALLOC.load(Ordering::Relaxed);
    eprintln!("largest allocation so far: {largest} bytes");
    assert!(largest < ALLOC_CAP, "an allocation of {largest} bytes");
}

#[test]
fn random_byte_flips_never_panic() {
    let (dir, out) = written("gguf/llama3.q4_0.gguf", Compression::Lz4);
    let good = std::fs::read(&out).unwrap();
    let toc = read_toc(&good);
    let meta = toc.iter().position(|r| r.kind == 1).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut opened = 0;
    for round in 0..400 {
        let mut b = good.clone();
        let at = match round % 4 {
            0 => (next() % 4096) as usize,
            1 => (toc[meta].offset + next() % toc[meta].size) as usize,
            _ => (next() % b.len() as u64) as usize,
        };
        b[at] ^= 1 << (next() % 8);
        if (round / 4) % 2 == 0 && u32_at(&b, 12) <= 101 {
            // Make the checksums `open` checks agree, so the flip reaches the parsers.
            let mut t = read_toc(&b);
            if let Some(m) = t.iter_mut().find(|r| r.kind == 1)
                && m.offset.checked_add(m.size).is_some_and(|e| e <= b.len() as u64)
            {
                m.checksum = xxhash_rust::xxh3::xxh3_64(&b[m.offset as usize..(m.offset + m.size) as usize]);
            }
            write_toc(&mut b, &t);
        }
        let p = save(&dir, "flip.cawsf", &b);
        let r = std::panic::catch_unwind(|| cawsf::open(&p).map(|_| ()));
        assert!(r.is_ok(), "open panicked on a flip at byte {at} (round {round})");
        opened += r.unwrap().is_ok() as usize;
        assert!(std::panic::catch_unwind(|| cawsf::verify(&p).map(|_| ())).is_ok(), "verify panicked at {at}");
    }
    eprintln!("{opened} of 400 flipped files still opened");
    let largest = LARGEST_ALLOC.load(Ordering::Relaxed);
    assert!(largest < ALLOC_CAP, "an allocation of {largest} bytes");
}

/// Collects what the `tracing` subscriber prints.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn unknown_sections_are_skipped_with_a_warning() {
    let (dir, out) = written("hf/llama3", Compression::Lz4);
    let clean = std::fs::read(&out).unwrap();
    // A ROUTING section is known (and checked): garbage in one is an error naming it.
    let mut bad = clean.clone();
    append_section(&mut bad, 4, &[1u8; 10]);
    let err = cawsf::open(&save(&dir, "garbage-routing.cawsf", &bad)).err().unwrap().to_string();
    assert!(err.contains("section ROUTING"), "{err}");
    let mut b = clean;
    // An empty routing table (64-value keys, no entries) is well formed.
    let routing_at = append_section(&mut b, 4, &[64, 0, 0, 0, 0, 0]);
    let unknown_at = append_section(&mut b, 0x5eed, b"a future section");
    let p = save(&dir, "llama3.cawsf", &b);
    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let back = tracing::subscriber::with_default(subscriber, || cawsf::open(&p)).unwrap();
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("WARN") && log.contains("unknown type") && log.contains("section_type=24301"), "{log}");
    assert!(log.contains(&format!("offset={unknown_at}")), "{log}");
    assert!(!log.contains(&format!("offset={routing_at}")), "ROUTING is a known section: {log}");
    let src = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    assert_eq!(back.tensors.len(), src.tensors.len());
    assert!(logits(ModelSource::from_checkpoint(back).unwrap()) == logits(src));
    assert_eq!(cawsf::verify(&p).unwrap().sections, 4);
}
