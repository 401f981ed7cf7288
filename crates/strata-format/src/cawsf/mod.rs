//! `.cawsf`: the CAWSF container of seed 000, holding whole tensors in any Strata dtype.
//!
//! ```text
//! 0     header block (4096 bytes): "CAWSF\0\0\0" | u32 version | u32 section count |
//!       u64 header checksum | section count × 40-byte TOC records | zeros
//! 4096  SHARD_BANK (type 3): shards, each a 12-byte header {u8 type, u16 scope, u8 comp,
//!       u32 usize, u32 csize} + payload; per tensor a TENSOR_DESC shard then its
//!       TENSOR_DATA shard(s); PAD shards keep raw payloads and groups 4 KiB-aligned;
//!       the global group (scope 0xFFFF) first, then layer 0, 1, ... each contiguous
//! ...   META (type 1): JSON (maybe zstd/lz4), with the tensor index, the per-layer
//!       byte ranges and `checksum_index` (XXH3-64 per section and per shard)
//! ```
//!
//! Everything is little-endian; `docs/formats.md` (`.cawsf` container) has the byte layout in full. A reader
//! that meets an unknown section type warns and skips it. `open` memory-maps the file
//! and checks everything against its size before allocating; it hashes only the header
//! block and META. [`verify`] hashes everything.

mod layout;
mod read;
mod routing_table;
mod write;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

pub use layout::{Compression, GLOBAL_SCOPE};
pub use routing_table::{RoutingTable, normalise};
pub use write::CawsfWriter;

use crate::FormatError;
use crate::checksum::{Piece, StoredSums, SummedFile};
use crate::ndsq::payload::Codebook;
use crate::{Checkpoint, ConfigOrigin};
use layout::*;
use read::{Bank, Mapped};

/// The parts of a file that `open`, `inspect` and `layer_ranges` share, fully checked.
struct Parsed {
    file: Mapped,
    toc: Vec<TocEntry>,
    meta_at: u64,
    meta: Meta,
    bank: Bank,
    codebooks: Arc<Vec<Codebook>>,
    routing: Option<RoutingTable>,
}

fn parse(path: &Path) -> Result<Parsed, FormatError> {
    let file = Mapped::open(path)?;
    let b = file.bytes();
    let toc = read::parse_header(b, path)?;
    read::check_header_checksum(b, path)?;
    let s = read::check_sections(b, path, &toc)?;
    let meta = read::read_meta(b, path, &toc[s.meta])?;
    let bank = read::walk_bank(b, path, &toc[s.bank], meta.n_layers)?;
    let meta_at = toc[s.meta].offset;
    read::cross_check(path, meta_at, &meta, &bank)?;
    let codebooks = Arc::new(read::read_codebooks(b, path, s.codebooks.map(|i| &toc[i]))?);
    let routing = read::read_routing(b, path, s.routing.map(|i| &toc[i]), &bank)?;
    Ok(Parsed { file, toc, meta_at, meta, bank, codebooks, routing })
}

/// Opens a `.cawsf` model: raw tensors are zero-copy views of the memory map,
/// compressed ones are decompressed into aligned buffers.
pub fn open(path: &Path) -> anyhow::Result<Checkpoint> {
    let p = parse(path)?;
    let tensors = read::build_tensors(&p.file, &p.bank, &p.codebooks, &HashSet::new())?;
    let sums = stored_sums(&p, path);
    let m = p.meta.model;
    let routing = p.routing.map(|table| Arc::new(Routing::new(p.file, p.bank, p.codebooks, table)));
    let name = path.file_stem().map_or_else(|| m.name.clone(), |s| s.to_string_lossy().into_owned());
    Ok(Checkpoint {
        name,
        config_json: m.config_json,
        config_origin: ConfigOrigin::Context(format!("{}: META config", path.display())),
        tokenizer_json: m.tokenizer_json,
        tokenizer_config_json: m.tokenizer_config_json,
        generation_config_json: m.generation_config_json,
        chat_template: m.chat_template,
        tensors,
        routing,
        sums,
    })
}

/// Each tensor's shards (its descriptor and data) with the checksums META records for
/// them (`parse` has checked that they list the bank's shards).
fn stored_sums(p: &Parsed, path: &Path) -> StoredSums {
    let mut sums = StoredSums::default();
    let file = sums.add_file(SummedFile { path: path.to_owned(), bytes: p.file.map.clone(), index: "META" });
    let by_offset: HashMap<u64, &ShardSum> = p.meta.checksum_index.shards.iter().map(|s| (s.offset, s)).collect();
    for t in &p.meta.tensors {
        for at in std::iter::once(t.desc).chain(t.chunks.iter().map(|c| c.offset)) {
            if let Some(s) = by_offset.get(&at) {
                sums.add(&t.name, file, Piece { offset: s.offset, len: s.len, xxh3: s.xxh3.clone() });
            }
        }
    }
    sums
}

/// One ROUTING entry, described.
#[derive(Clone, Debug, Serialize)]
pub struct RouteEntry {
    /// The shard's number in the bank.
    pub shard: u32,
    /// `L`, `S`, `D` or `R`.
    pub component: &'static str,
    pub layer: usize,
    pub tensor: String,
    /// Stored bytes (header included).
    pub cost: u64,
}

/// An NDSQ file's ROUTING section with what rebuilding its tensors needs.
pub struct Routing {
    file: Mapped,
    bank: Bank,
    codebooks: Arc<Vec<Codebook>>,
    pub table: RoutingTable,
    /// Per table entry.
    pub entries: Vec<RouteEntry>,
}

impl Routing {
    fn new(file: Mapped, bank: Bank, codebooks: Arc<Vec<Codebook>>, table: RoutingTable) -> Routing {
        let owner: HashMap<usize, &read::Walked> =
            bank.tensors.iter().flat_map(|t| t.chunks.iter().map(move |&c| (c, t))).collect();
        let entries = table
            .shards
            .iter()
            .zip(&table.costs)
            .map(|(&s, &cost)| {
                let rec = &bank.shards[s as usize];
                let tensor = owner.get(&(s as usize)).map_or_else(String::new, |t| t.desc.name.clone());
                let component = ["L", "R", "S", "D"][usize::from(rec.h.kind)];
                RouteEntry { shard: s, component, layer: usize::from(rec.h.scope), tensor, cost: cost as u64 }
            })
            .collect();
        Routing { file, bank, codebooks, table, entries }
    }

    /// Replaces `source`'s NDSQ tensors that own a shard in `drop` (bank numbers) by
    /// ones that leave those components out.
    pub fn drop_shards(&self, source: &mut Checkpoint, drop: &HashSet<u32>) -> anyhow::Result<()> {
        for t in self.bank.tensors.iter().filter(|t| t.ndsq && t.chunks.iter().any(|&c| drop.contains(&(c as u32)))) {
            let shape = t.desc.shape.iter().map(|&x| x as usize).collect();
            let rebuilt = read::ndsq_tensor(&self.file, &self.bank, t, shape, &self.codebooks, drop)?;
            source.tensors.insert(t.desc.name.clone(), rebuilt);
        }
        Ok(())
    }
}

/// What [`verify`] checked.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    pub sections: usize,
    pub shards: usize,
    pub tensors: usize,
    /// Bytes hashed (the whole file but zero padding).
    pub bytes_hashed: u64,
}

/// Checks every checksum (header block, each section, each shard), that the padding
/// between sections is zero, and the whole structure. The first mismatch is an error
/// naming the section or shard (index, type, scope, tensor) and its byte offset.
pub fn verify(path: &Path) -> Result<VerifyReport, FormatError> {
    let file = Mapped::open(path)?;
    let b = file.bytes();
    let toc = read::parse_header(b, path)?;
    read::check_header_checksum(b, path)?;
    let s = read::check_sections(b, path, &toc)?;
    let meta_entry = &toc[s.meta];
    let meta = read::read_meta(b, path, meta_entry)?;
    let bank_entry = &toc[s.bank];
    let mut hashed = HEADER_BLOCK + meta_entry.size;

    let mut owner: HashMap<u64, &str> = HashMap::new();
    for t in &meta.tensors {
        owner.insert(t.desc, &t.name);
        owner.extend(t.chunks.iter().map(|c| (c.offset, t.name.as_str())));
    }
    let bank_end = bank_entry.offset + bank_entry.size;
    for (i, sum) in meta.checksum_index.shards.iter().enumerate() {
        let end = sum.offset.checked_add(sum.len).filter(|&e| e <= bank_end);
        let Some(end) = end.filter(|_| sum.offset >= bank_entry.offset && sum.len >= SHARD_HEADER_BYTES) else {
            let msg =
                format!("META: checksum_index shard {i} ({} bytes at {}) is not inside the bank", sum.len, sum.offset);
            return Err(read::corrupt(path, meta_entry.offset, msg));
        };
        let region = &b[sum.offset as usize..end as usize];
        let computed = format!("{:016x}", xxh3(region));
        if computed != sum.xxh3 {
            let h = ShardHeader::decode(region);
            let tensor = owner.get(&sum.offset).map_or(String::new(), |n| format!(", tensor `{n}`"));
            let msg = format!(
                "shard {i} ({}, scope {}{tensor}): checksum mismatch (META records {}, computed {computed})",
                shard_type_name(h.kind),
                h.scope,
                sum.xxh3
            );
            return Err(read::corrupt(path, sum.offset, msg));
        }
    }
    for (i, e) in toc.iter().enumerate() {
        if i == s.meta {
            continue;
        }
        let name = section_name(e.kind);
        let computed = xxh3(read::section_bytes(b, e));
        hashed += e.size;
        if computed != e.checksum {
            let msg = format!(
                "section {name}: checksum mismatch (TOC records {:016x}, computed {computed:016x})",
                e.checksum
            );
            return Err(read::corrupt(path, e.offset, msg));
        }
        let listed = meta.checksum_index.sections.get(&name);
        if listed.is_some_and(|h| *h != format!("{computed:016x}")) || (i == s.bank && listed.is_none()) {
            let msg = format!("META: checksum_index does not record section {name}'s checksum {computed:016x}");
            return Err(read::corrupt(path, meta_entry.offset, msg));
        }
    }
    check_padding(b, path, &toc)?;
    let bank = read::walk_bank(b, path, bank_entry, meta.n_layers)?;
    read::cross_check(path, meta_entry.offset, &meta, &bank)?;
    read::read_codebooks(b, path, s.codebooks.map(|i| &toc[i]))?;
    read::read_routing(b, path, s.routing.map(|i| &toc[i]), &bank)?;
    Ok(VerifyReport {
        sections: toc.len(),
        shards: bank.shards.len(),
        tensors: bank.tensors.len(),
        bytes_hashed: hashed,
    })
}

/// Bytes after the header block that no section covers must be zero.
fn check_padding(b: &[u8], path: &Path, toc: &[TocEntry]) -> Result<(), FormatError> {
    let mut spans: Vec<(u64, u64)> = toc.iter().map(|e| (e.offset, e.offset + e.size)).collect();
    spans.sort_unstable();
    let mut pos = HEADER_BLOCK;
    for (start, end) in spans.into_iter().chain([(b.len() as u64, b.len() as u64)]) {
        if let Some(k) = b[pos as usize..start.max(pos) as usize].iter().position(|&x| x != 0) {
            let at = pos + k as u64;
            return Err(read::corrupt(path, at, format!("padding byte at {at} outside every section is not zero")));
        }
        pos = pos.max(end);
    }
    Ok(())
}

/// Where one layer's shards lie in the file: one contiguous range, 4 KiB-aligned in
/// offset and length in files Strata writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LayerRange {
    pub layer: usize,
    pub offset: u64,
    pub len: u64,
}

/// The byte range of each layer, in layer order (for layer streaming).
pub fn layer_ranges(path: &Path) -> anyhow::Result<Vec<LayerRange>> {
    let p = parse(path)?;
    Ok(p.meta.layers.iter().enumerate().map(|(layer, r)| LayerRange { layer, offset: r.offset, len: r.len }).collect())
}

/// Header, TOC, META summary, tensors and per-layer bytes, as JSON (for `strata inspect`).
pub fn inspect(path: &Path) -> anyhow::Result<Value> {
    let p = parse(path)?;
    let m = &p.meta;
    let sections: Vec<Value> = p
        .toc
        .iter()
        .map(|e| {
            json!({
                "type": e.kind, "name": section_name(e.kind), "offset": e.offset, "size": e.size,
                "raw_size": e.raw_size, "flags": e.flags, "checksum": format!("{:016x}", e.checksum),
            })
        })
        .collect();
    let mut layer_bytes = vec![0u64; m.n_layers];
    let mut global_bytes = 0u64;
    // NDSQ components' stored bytes (headers included), per tensor and in all: L, S, D, R.
    let kind_at: HashMap<u64, u8> = p.bank.shards.iter().map(|s| (s.offset, s.h.kind)).collect();
    let mut ndsq_total = [0u64; 4];
    let mut ndsq_tensors = 0usize;
    let tensors: Vec<Value> = m
        .tensors
        .iter()
        .map(|t| {
            *t.layer.map_or(&mut global_bytes, |i| &mut layer_bytes[i]) += t.bytes;
            let stored: u64 = t.chunks.iter().map(|c| u64::from(c.csize)).sum();
            let comps: Vec<&str> = t.chunks.iter().map(|c| c.comp.name()).collect();
            let mut v = json!({
                "name": t.name, "dtype": t.dtype, "shape": t.shape, "layer": t.layer, "bytes": t.bytes,
                "stored_bytes": stored, "shards": t.chunks.len(), "compression": comps,
                "offset": t.chunks.first().map(|c| c.offset + SHARD_HEADER_BYTES),
            });
            let kinds: Vec<u8> = t.chunks.iter().filter_map(|c| kind_at.get(&c.offset).copied()).collect();
            if kinds.iter().any(|&k| k <= SHARD_NDSQ_D) {
                let mut parts = [0u64; 4];
                for (c, &k) in t.chunks.iter().zip(&kinds) {
                    let slot = [0, 3, 1, 2][usize::from(k.min(3))]; // L, R, S, D -> L, S, D, R
                    parts[slot] += SHARD_HEADER_BYTES + u64::from(c.csize);
                }
                ndsq_total.iter_mut().zip(parts).for_each(|(t, p)| *t += p);
                ndsq_tensors += 1;
                v["ndsq"] = json!({"l_bytes": parts[0], "s_bytes": parts[1], "d_bytes": parts[2], "r_bytes": parts[3]});
            }
            v
        })
        .collect();
    let config: Value = serde_json::from_str(&m.model.config_json).unwrap_or_else(|_| json!(m.model.config_json));
    Ok(json!({
        "format": "cawsf",
        "path": path.display().to_string(),
        "file_bytes": p.file.bytes().len(),
        "version": VERSION,
        "sections": sections,
        "meta": {
            "offset": p.meta_at, "name": m.model.name, "compression": m.compression.name(), "n_layers": m.n_layers,
            "shards": p.bank.shards.len(), "has_chat_template": m.model.chat_template.is_some(),
        },
        "config": config,
        "tensors": tensors,
        "layer_bytes": { "global": global_bytes, "layers": layer_bytes },
        "ndsq": (ndsq_tensors > 0).then(|| json!({
            "tensors": ndsq_tensors, "l_bytes": ndsq_total[0], "s_bytes": ndsq_total[1], "d_bytes": ndsq_total[2],
            "r_bytes": ndsq_total[3],
        })),
        "layer_ranges": { "global": m.global, "layers": m.layers },
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Group, ModelMeta, ModelWriter};
    use strata_tensor::tensor::{AlignedBytes, DType, HostTensor};

    fn meta() -> ModelMeta {
        ModelMeta {
            name: "tiny".into(),
            config_json: r#"{"model_type":"llama","hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
                "num_attention_heads":2,"vocab_size":4}"#
                .into(),
            tokenizer_json: "{}".into(),
            tokenizer_config_json: None,
            generation_config_json: Some("{\"a\":1}".into()),
            chat_template: None,
        }
    }

    fn tensor(len: usize, seed: u8) -> HostTensor {
        let bytes: Vec<u8> = (0..len).map(|i| ((i / 7) as u8).wrapping_mul(seed)).collect();
        HostTensor::new(Arc::new(AlignedBytes::from_slice(&bytes)), 0, len, DType::F16, vec![len / 2])
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("strata-cawsf-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("m.cawsf")
    }

    #[test]
    fn tensors_split_into_chunks_round_trip() {
        for comp in [Compression::None, Compression::Zstd, Compression::Lz4] {
            let out = temp(&format!("chunks-{}", comp.name()));
            let big = tensor(40_000, 3);
            let mut w = CawsfWriter::create(&out, &meta(), 1, comp).unwrap().with_chunk_limit(8192);
            w.write_group(Group::Global, &[("g".into(), tensor(10, 5))]).unwrap();
            w.write_group(Group::Layer(0), &[("model.layers.0.w".into(), big.clone())]).unwrap();
            Box::new(w).finish().unwrap();
            let p = parse(&out).unwrap();
            assert_eq!(p.meta.tensors[1].chunks.len(), 5, "{comp:?}");
            let src = open(&out).unwrap();
            assert_eq!(src.tensors["model.layers.0.w"].bytes(), big.bytes());
            assert_eq!(src.tensors["g"].bytes(), tensor(10, 5).bytes());
            verify(&out).unwrap();
            std::fs::remove_dir_all(out.parent().unwrap()).unwrap();
        }
    }

    #[test]
    fn each_expert_is_one_aligned_range_after_the_core() {
        use crate::units::testing::{EXPERTS, assert_unit_layout, moe_layer, tiny_meta};
        for comp in [Compression::None, Compression::Zstd] {
            for mixtral in [false, true] {
                let out = temp(&format!("moe-{}-{mixtral}", comp.name()));
                let layer = moe_layer(mixtral);
                let mut w = Box::new(CawsfWriter::create(&out, &tiny_meta(), 1, comp).unwrap());
                w.write_group(Group::Global, &[("g".into(), tensor(10, 5))]).unwrap();
                w.write_group(Group::Layer(0), &layer).unwrap();
                w.finish().unwrap();
                let p = parse(&out).unwrap();
                // A tensor's span: its TENSOR_DESC shard to the end of its last data shard.
                let spans: Vec<(String, u64, u64)> = p
                    .meta
                    .tensors
                    .iter()
                    .filter(|t| t.layer == Some(0))
                    .map(|t| {
                        let end =
                            t.chunks.last().map_or(t.desc, |c| c.offset + SHARD_HEADER_BYTES + u64::from(c.csize));
                        (t.name.clone(), t.desc, end)
                    })
                    .collect();
                assert_eq!(spans.len(), layer.len());
                assert_unit_layout(&spans, p.meta.layers[0].offset, EXPERTS);
                if comp == Compression::Zstd {
                    let compressed = p.meta.tensors.iter().flat_map(|t| &t.chunks).any(|c| c.comp == comp);
                    assert!(compressed, "the test should exercise unaligned compressed shards");
                }
                let src = open(&out).unwrap();
                for (name, t) in &layer {
                    let r = &src.tensors[name];
                    assert_eq!((r.dtype, &r.shape, r.bytes()), (t.dtype, &t.shape, t.bytes()), "{name} {comp:?}");
                }
                verify(&out).unwrap();
                std::fs::remove_dir_all(out.parent().unwrap()).unwrap();
            }
        }
    }

    #[test]
    fn groups_out_of_order_and_missing_layers_are_refused() {
        let out = temp("order");
        let mut w = Box::new(CawsfWriter::create(&out, &meta(), 2, Compression::None).unwrap());
        assert!(w.write_group(Group::Layer(1), &[]).is_err());
        w.write_group(Group::Layer(0), &[("model.layers.0.w".into(), tensor(8, 1))]).unwrap();
        assert!(w.write_group(Group::Global, &[]).is_err());
        assert!(w.write_group(Group::Layer(1), &[("model.layers.0.w".into(), tensor(8, 1))]).is_err());
        assert!(w.finish().unwrap_err().to_string().contains("1 of 2 layers"));
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(out.parent().unwrap()).unwrap().count(), 0, "temporary file left behind");
        std::fs::remove_dir_all(out.parent().unwrap()).unwrap();
    }
}
