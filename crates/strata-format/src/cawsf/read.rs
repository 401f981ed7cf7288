//! Reading a `.cawsf` file: the header and TOC, the META section and a walk over the
//! shard bank. Every count, size and offset is checked against the file (with checked
//! arithmetic) before it is used or anything is allocated; errors name the byte offset.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;

use super::RoutingTable;
use super::layout::*;
use crate::FormatError;
use crate::ndsq::Ndsq;
use crate::ndsq::payload::{self, Codebook};
use strata_tensor::mapped::MappedFile;
use strata_tensor::tensor::{AlignedBytes, ByteSource, DType, Encoded, HostTensor, LazyBytes};

/// A memory-mapped `.cawsf` file.
pub(super) struct Mapped {
    pub map: Arc<MappedFile>,
    pub path: PathBuf,
}

impl Mapped {
    pub fn open(path: &Path) -> Result<Mapped, FormatError> {
        let io = |source| FormatError::Io { path: path.to_owned(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < HEADER_BLOCK {
            return Err(corrupt(
                path,
                0,
                format!("header: the file is {len} bytes, shorter than the {HEADER_BLOCK}-byte header block"),
            ));
        }
        let map = MappedFile::map(&file, path).map_err(io)?;
        Ok(Mapped { map: Arc::new(map), path: path.to_owned() })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }
}

pub(super) fn corrupt(path: &Path, offset: u64, msg: String) -> FormatError {
    FormatError::Corrupt { path: path.to_owned(), offset, msg }
}

/// File offset of TOC record `i`.
pub(super) fn toc_record_at(i: usize) -> u64 {
    HEADER_BYTES + i as u64 * TOC_RECORD_BYTES
}

/// Magic, version and section count, then the TOC records (not yet checked).
pub(super) fn parse_header(b: &[u8], path: &Path) -> Result<Vec<TocEntry>, FormatError> {
    if b.len() < HEADER_BLOCK as usize {
        let msg = format!("header: the file is {} bytes, shorter than the {HEADER_BLOCK}-byte header block", b.len());
        return Err(corrupt(path, 0, msg));
    }
    if b[0..8] != MAGIC {
        return Err(corrupt(path, 0, format!("header: magic is {:02x?}, not \"CAWSF\\0\\0\\0\"", &b[0..8])));
    }
    let version = le_u32(&b[8..12]);
    if version != VERSION {
        return Err(corrupt(
            path,
            8,
            format!("header: version {version} is not supported (this build reads {VERSION})"),
        ));
    }
    let count = u64::from(le_u32(&b[12..16]));
    if count > MAX_SECTIONS {
        let msg = format!("header: {count} sections; at most {MAX_SECTIONS} TOC records fit in the header block");
        return Err(corrupt(path, 12, msg));
    }
    Ok((0..count as usize)
        .map(|i| {
            let at = toc_record_at(i) as usize;
            TocEntry::decode(b[at..at + TOC_RECORD_BYTES as usize].try_into().expect("40 bytes"))
        })
        .collect())
}

/// The header block's checksum against the one stored at byte 16.
pub(super) fn check_header_checksum(b: &[u8], path: &Path) -> Result<(), FormatError> {
    let (stored, computed) = (le_u64(&b[16..24]), header_checksum(b));
    if stored != computed {
        let msg = format!("header/TOC checksum mismatch (stored {stored:016x}, computed {computed:016x})");
        return Err(corrupt(path, 16, msg));
    }
    Ok(())
}

/// Where the two required sections, and the optional ones, are in the TOC.
pub(super) struct Sections {
    pub meta: usize,
    pub bank: usize,
    pub codebooks: Option<usize>,
    pub routing: Option<usize>,
}

/// Checks every TOC record against the file (bounds, alignment, overlap, flags) and
/// finds META and SHARD_BANK. Unknown section types are skipped with a warning.
pub(super) fn check_sections(b: &[u8], path: &Path, toc: &[TocEntry]) -> Result<Sections, FormatError> {
    let file_len = b.len() as u64;
    let (mut meta, mut bank, mut codebooks, mut routing) = (None, None, None, None);
    let mut spans = Vec::with_capacity(toc.len());
    for (i, e) in toc.iter().enumerate() {
        let at = toc_record_at(i);
        let name = section_name(e.kind);
        let end = e.offset.checked_add(e.size).filter(|&end| end <= file_len);
        let Some(end) = end else {
            let msg = format!(
                "section {name} (TOC record {i}): {} bytes at {} lie past the end of the {file_len}-byte file",
                e.size, e.offset
            );
            return Err(corrupt(path, at, msg));
        };
        if e.offset < HEADER_BLOCK || !e.offset.is_multiple_of(ALIGN) {
            let msg = format!(
                "section {name} (TOC record {i}): offset {} is not a multiple of {ALIGN} after the header block",
                e.offset
            );
            return Err(corrupt(path, at, msg));
        }
        spans.push((e.offset, end, i));
        let slot = match e.kind {
            SECTION_META => &mut meta,
            SECTION_SHARD_BANK => &mut bank,
            SECTION_CODEBOOKS => &mut codebooks,
            SECTION_ROUTING => &mut routing,
            other => {
                tracing::warn!(
                    path = %path.display(),
                    section_type = other,
                    offset = e.offset,
                    "skipping a .cawsf section of unknown type"
                );
                continue;
            }
        };
        if slot.replace(i).is_some() {
            return Err(corrupt(path, at, format!("section {name} appears twice in the TOC")));
        }
        match Compression::from_section_flags(e.flags) {
            None => return Err(corrupt(path, at, format!("section {name}: unknown flags {:#x}", e.flags))),
            Some(Compression::None) if e.raw_size != e.size => {
                let msg =
                    format!("section {name}: uncompressed, but raw_size {} differs from size {}", e.raw_size, e.size);
                return Err(corrupt(path, at, msg));
            }
            Some(c) if c != Compression::None && e.kind == SECTION_SHARD_BANK => {
                let msg = format!(
                    "section {name} is {}-compressed as a whole; this build reads per-shard compression only",
                    c.name()
                );
                return Err(FormatError::Invalid { path: path.to_owned(), msg });
            }
            Some(_) => {}
        }
    }
    spans.retain(|&(start, end, _)| end > start);
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            let (a, b2) = (section_name(toc[w[0].2].kind), section_name(toc[w[1].2].kind));
            return Err(corrupt(path, toc_record_at(w[1].2), format!("sections {a} and {b2} overlap")));
        }
    }
    let missing = |what: &str| corrupt(path, 12, format!("header: the TOC has no {what} section"));
    Ok(Sections {
        meta: meta.ok_or_else(|| missing("META"))?,
        bank: bank.ok_or_else(|| missing("SHARD_BANK"))?,
        codebooks,
        routing,
    })
}

/// The stored bytes of a checked section.
pub(super) fn section_bytes<'a>(b: &'a [u8], e: &TocEntry) -> &'a [u8] {
    &b[e.offset as usize..(e.offset + e.size) as usize]
}

/// A section's bytes after checking its checksum (from its TOC record) and
/// decompressing it (to at most `max` bytes).
pub(super) fn read_section<'a>(
    b: &'a [u8],
    path: &Path,
    e: &TocEntry,
    max: u64,
) -> Result<std::borrow::Cow<'a, [u8]>, FormatError> {
    let name = section_name(e.kind);
    let stored = section_bytes(b, e);
    let computed = xxh3(stored);
    if computed != e.checksum {
        let msg =
            format!("section {name}: checksum mismatch (TOC records {:016x}, computed {computed:016x})", e.checksum);
        return Err(corrupt(path, e.offset, msg));
    }
    match Compression::from_section_flags(e.flags).expect("flags checked") {
        Compression::None => Ok(stored.into()),
        c => {
            if e.raw_size > max || e.raw_size > c.max_decompressed(e.size) {
                let msg = format!("section {name} claims {} bytes from {} compressed bytes", e.raw_size, e.size);
                return Err(corrupt(path, e.offset, msg));
            }
            let mut out = vec![0u8; e.raw_size as usize];
            c.decompress_into(stored, &mut out).map_err(|m| corrupt(path, e.offset, format!("section {name}: {m}")))?;
            Ok(out.into())
        }
    }
}

/// Checks META's checksum (from its TOC record), decompresses and parses it.
pub(super) fn read_meta(b: &[u8], path: &Path, e: &TocEntry) -> Result<Meta, FormatError> {
    let json = read_section(b, path, e, MAX_META_BYTES)?;
    let meta: Meta = serde_json::from_slice(&json)
        .map_err(|err| corrupt(path, e.offset, format!("section META is not valid META JSON: {err}")))?;
    if meta.format != "cawsf" || meta.version != VERSION || meta.alignment != ALIGN {
        let msg = format!(
            "section META describes format `{}` version {} alignment {} (expected `cawsf` {VERSION}, {ALIGN})",
            meta.format, meta.version, meta.alignment
        );
        return Err(corrupt(path, e.offset, msg));
    }
    if meta.n_layers > MAX_LAYERS {
        return Err(corrupt(path, e.offset, format!("META: {} layers (at most {MAX_LAYERS})", meta.n_layers)));
    }
    Ok(meta)
}

/// The CODEBOOKS section, parsed (empty without one).
pub(super) fn read_codebooks(b: &[u8], path: &Path, e: Option<&TocEntry>) -> Result<Vec<Codebook>, FormatError> {
    let Some(e) = e else { return Ok(Vec::new()) };
    let bytes = read_section(b, path, e, b.len() as u64 * 2)?;
    payload::parse_codebooks(&bytes).map_err(|m| corrupt(path, e.offset, format!("section CODEBOOKS: {m:#}")))
}

/// The ROUTING section, parsed and checked against the bank: every entry names an NDSQ
/// shard.
pub(super) fn read_routing(
    b: &[u8],
    path: &Path,
    e: Option<&TocEntry>,
    bank: &Bank,
) -> Result<Option<RoutingTable>, FormatError> {
    let Some(e) = e else { return Ok(None) };
    let bytes = read_section(b, path, e, b.len() as u64 * 2)?;
    let err = |m: String| corrupt(path, e.offset, format!("section ROUTING: {m}"));
    let table = RoutingTable::parse(&bytes).map_err(|m| err(format!("{m:#}")))?;
    for &s in &table.shards {
        let kind = bank.shards.get(s as usize).map(|r| r.h.kind);
        if !kind.is_some_and(|k| (SHARD_NDSQ_L..=SHARD_NDSQ_D).contains(&k)) {
            return Err(err(format!("entry for shard {s}, which is not an NDSQ shard of the bank")));
        }
    }
    Ok(Some(table))
}

/// One shard found by the walk.
#[derive(Clone, Copy, Debug)]
pub(super) struct ShardRec {
    /// Absolute offset of the shard header.
    pub offset: u64,
    pub h: ShardHeader,
}

impl ShardRec {
    pub fn payload(&self) -> u64 {
        self.offset + SHARD_HEADER_BYTES
    }
}

/// A tensor found by the walk: its description and the indices of its data shards.
#[derive(Clone, Debug)]
pub(super) struct Walked {
    pub desc: TensorDesc,
    pub scope: u16,
    pub desc_shard: usize,
    pub chunks: Vec<usize>,
    /// Sum of the data shards' `usize` so far.
    got: u64,
    /// Its shards are NDSQ components (L, L, S, D, R), not its bytes.
    pub ndsq: bool,
}

/// The shard bank as found on disk.
pub(super) struct Bank {
    pub shards: Vec<ShardRec>,
    pub tensors: Vec<Walked>,
    pub global: Range,
    pub layers: Vec<Range>,
}

/// Walks the bank shard by shard, checking every header, and assembles the tensors.
pub(super) fn walk_bank(b: &[u8], path: &Path, e: &TocEntry, n_layers: usize) -> Result<Bank, FormatError> {
    let end = e.offset + e.size; // checked by `check_sections`
    let mut bank = Bank { shards: Vec::new(), tensors: Vec::new(), global: Range::default(), layers: Vec::new() };
    bank.layers.resize(n_layers, Range::default());
    let mut open: Option<Walked> = None;
    let mut last_key = i64::MIN;
    let mut pos = e.offset;
    while pos < end {
        let i = bank.shards.len();
        let err = |msg: String| corrupt(path, pos, format!("shard {i}: {msg}"));
        if end - pos < SHARD_HEADER_BYTES {
            return Err(err(format!("its 12-byte header would run past the end of the bank at {end}")));
        }
        let h = ShardHeader::decode(&b[pos as usize..]);
        let what = format!("{} scope {}", shard_type_name(h.kind), h.scope);
        let payload = pos + SHARD_HEADER_BYTES;
        let pend = payload + u64::from(h.csize);
        if pend > end {
            return Err(err(format!("({what}) its {}-byte payload runs past the end of the bank at {end}", h.csize)));
        }
        let comp = Compression::from_shard_code(h.comp)
            .ok_or_else(|| err(format!("({what}) unknown compression code {}", h.comp)))?;
        if comp == Compression::None && h.usize != h.csize {
            return Err(err(format!("({what}) raw, but usize {} differs from csize {}", h.usize, h.csize)));
        }
        if u64::from(h.usize) > comp.max_decompressed(u64::from(h.csize)) {
            let msg = format!("({what}) claims {} bytes from {} {}-compressed bytes", h.usize, h.csize, comp.name());
            return Err(err(msg));
        }
        let key = match h.scope {
            GLOBAL_SCOPE => -1,
            s if usize::from(s) < n_layers => i64::from(s),
            s => return Err(err(format!("({what}) scope {s}, but the model has {n_layers} layers"))),
        };
        if key < last_key {
            return Err(err(format!(
                "({what}) follows a shard of a later group: a group's shards must be contiguous, global first, then layers in order"
            )));
        }
        last_key = key;
        let data = &b[payload as usize..pend as usize];
        match h.kind {
            SHARD_PAD if comp != Compression::None => return Err(err("a PAD shard must be raw".into())),
            SHARD_PAD => {}
            SHARD_TENSOR_DESC => {
                if let Some(t) = &open {
                    let msg =
                        format!("tensor `{}` has {} of its {} data shards", t.desc.name, t.chunks.len(), t.desc.chunks);
                    return Err(err(msg));
                }
                if comp != Compression::None {
                    return Err(err("a TENSOR_DESC shard must be raw".into()));
                }
                let desc = TensorDesc::decode(data).map_err(|m| corrupt(path, payload, format!("shard {i}: {m}")))?;
                if desc.chunks == 0 && desc.bytes != 0 {
                    return Err(err(format!("tensor `{}` has {} bytes in no data shards", desc.name, desc.bytes)));
                }
                let t = Walked { desc, scope: h.scope, desc_shard: i, chunks: Vec::new(), got: 0, ndsq: false };
                match t.desc.chunks {
                    0 => bank.tensors.push(t),
                    _ => open = Some(t),
                }
            }
            SHARD_TENSOR_DATA | SHARD_NDSQ_L..=SHARD_NDSQ_D => {
                let Some(t) = open.as_mut().filter(|t| t.scope == h.scope) else {
                    return Err(err(format!(
                        "({what}) a data shard without a TENSOR_DESC of the same scope before it"
                    )));
                };
                let ndsq = h.kind != SHARD_TENSOR_DATA;
                if !t.chunks.is_empty() && t.ndsq != ndsq {
                    return Err(err(format!("({what}) tensor `{}` mixes NDSQ and data shards", t.desc.name)));
                }
                t.ndsq = ndsq;
                t.chunks.push(i);
                t.got += u64::from(h.usize);
                if t.chunks.len() == t.desc.chunks as usize {
                    if t.ndsq && (t.desc.dtype != DType::F32 || t.desc.shape.len() != 2 || t.desc.chunks != 5) {
                        let msg = format!(
                            "tensor `{}`: NDSQ shards describe an F32 matrix in 5 shards, not {} {:?} in {}",
                            t.desc.name,
                            t.desc.dtype.name(),
                            t.desc.shape,
                            t.desc.chunks
                        );
                        return Err(err(msg));
                    }
                    if !t.ndsq && t.got != t.desc.bytes {
                        let msg = format!(
                            "tensor `{}`: its data shards hold {} bytes, not {}",
                            t.desc.name, t.got, t.desc.bytes
                        );
                        return Err(err(msg));
                    }
                    bank.tensors.extend(open.take());
                }
            }
            other => return Err(err(format!("unknown shard type {other:#04x}"))),
        }
        let range = match h.scope {
            GLOBAL_SCOPE => &mut bank.global,
            s => &mut bank.layers[usize::from(s)],
        };
        if range.len == 0 {
            range.offset = pos;
        }
        range.len = pend - range.offset;
        bank.shards.push(ShardRec { offset: pos, h });
        pos = pend;
    }
    if let Some(t) = open {
        let msg = format!(
            "the bank ends inside tensor `{}` ({} of {} data shards)",
            t.desc.name,
            t.chunks.len(),
            t.desc.chunks
        );
        return Err(corrupt(path, end, msg));
    }
    Ok(bank)
}

impl Bank {
    /// The META index entry this bank implies for tensor `t`.
    pub fn entry(&self, t: &Walked) -> TensorEntry {
        TensorEntry {
            name: t.desc.name.clone(),
            dtype: t.desc.dtype.name().to_owned(),
            shape: t.desc.shape.clone(),
            layer: (t.scope != GLOBAL_SCOPE).then_some(usize::from(t.scope)),
            bytes: t.desc.bytes,
            desc: self.shards[t.desc_shard].offset,
            chunks: t
                .chunks
                .iter()
                .map(|&i| {
                    let s = &self.shards[i];
                    let comp = Compression::from_shard_code(s.h.comp).expect("checked in the walk");
                    ChunkEntry { offset: s.offset, comp, usize: s.h.usize, csize: s.h.csize }
                })
                .collect(),
        }
    }
}

/// Checks that META's index (tensors, layer ranges, shard list) describes this bank.
pub(super) fn cross_check(path: &Path, meta_at: u64, meta: &Meta, bank: &Bank) -> Result<(), FormatError> {
    let err = |msg: String| corrupt(path, meta_at, format!("META: {msg}"));
    if meta.tensors.len() != bank.tensors.len() {
        return Err(err(format!("lists {} tensors, the bank holds {}", meta.tensors.len(), bank.tensors.len())));
    }
    let mut names = HashSet::with_capacity(bank.tensors.len());
    for (m, t) in meta.tensors.iter().zip(&bank.tensors) {
        if *m != bank.entry(t) {
            let at = bank.shards[t.desc_shard].offset;
            return Err(err(format!("the entry for `{}` does not match the bank's tensor at byte {at}", m.name)));
        }
        if !names.insert(m.name.as_str()) {
            return Err(err(format!("tensor `{}` appears twice", m.name)));
        }
    }
    let sums = &meta.checksum_index.shards;
    let same =
        |(s, r): (&ShardSum, &ShardRec)| s.offset == r.offset && s.len == SHARD_HEADER_BYTES + u64::from(r.h.csize);
    if sums.len() != bank.shards.len() || !sums.iter().zip(&bank.shards).all(same) {
        return Err(err(format!(
            "checksum_index lists {} shards that do not match the bank's {}",
            sums.len(),
            bank.shards.len()
        )));
    }
    if meta.checksum_index.algorithm != "xxh3-64" {
        return Err(err(format!("checksum algorithm `{}` (expected xxh3-64)", meta.checksum_index.algorithm)));
    }
    let range_ok = |m: &Range, w: &Range| m == w || (w.len == 0 && m.len == 0);
    if meta.layers.len() != meta.n_layers || !range_ok(&meta.global, &bank.global) {
        return Err(err("the global range or the number of layer ranges does not match the bank".into()));
    }
    if let Some(i) = (0..meta.n_layers).find(|&i| !range_ok(&meta.layers[i], &bank.layers[i])) {
        return Err(err(format!(
            "layer {i}'s range {:?} does not match the bank's {:?}",
            meta.layers[i], bank.layers[i]
        )));
    }
    Ok(())
}

/// The tensors as host tensors: zero-copy views of the map for single raw shards, an
/// aligned copy (decompressed) otherwise.
/// NDSQ shards (bank numbers) in `drop` decode as zero (`--route-budget`).
pub(super) fn build_tensors(
    f: &Mapped,
    bank: &Bank,
    codebooks: &Arc<Vec<Codebook>>,
    drop: &HashSet<u32>,
) -> Result<HashMap<String, HostTensor>, FormatError> {
    let src: Arc<dyn ByteSource> = f.map.clone();
    let b = f.bytes();
    let one = |t: &Walked| -> Result<(String, HostTensor), FormatError> {
        let d = &t.desc;
        let at = bank.shards[t.desc_shard].offset;
        let shape: Vec<usize> =
            d.shape.iter().map(|&x| usize::try_from(x)).collect::<Result<_, _>>().map_err(|_| {
                corrupt(&f.path, at, format!("tensor `{}`: shape {:?} does not fit this machine", d.name, d.shape))
            })?;
        let len = d.bytes as usize; // ≤ the bank, or checked against the codecs' ratio
        if t.ndsq {
            return ndsq_tensor(f, bank, t, shape, codebooks, drop).map(|x| (d.name.clone(), x));
        }
        if let [i] = t.chunks[..]
            && bank.shards[i].h.comp == Compression::None.shard_code()
        {
            let tensor = HostTensor::new(src.clone(), bank.shards[i].payload() as usize, len, d.dtype, shape);
            return Ok((d.name.clone(), tensor));
        }
        let mut buf = AlignedBytes::zeroed(len);
        let mut filled = 0usize;
        for &i in &t.chunks {
            let s = &bank.shards[i];
            let input = &b[s.payload() as usize..(s.payload() + u64::from(s.h.csize)) as usize];
            let out = &mut buf.bytes_mut()[filled..filled + s.h.usize as usize];
            let comp = Compression::from_shard_code(s.h.comp).expect("checked in the walk");
            comp.decompress_into(input, out)
                .map_err(|m| corrupt(&f.path, s.offset, format!("shard {i} (tensor `{}`): {m}", d.name)))?;
            filled += s.h.usize as usize;
        }
        Ok((d.name.clone(), HostTensor::new(Arc::new(buf), 0, len, d.dtype, shape)))
    };
    bank.tensors.par_iter().map(one).collect()
}

/// How one NDSQ tensor's five shards decode: what the open-time check, the first use
/// and the layer streamer share.
struct NdsqShards {
    rows: usize,
    cols: usize,
    comp: [Compression; 5],
    usize: [usize; 5],
    codebooks: Arc<Vec<Codebook>>,
    /// Shards left out (`--route-budget`): L as a whole when either factor is.
    dropped: [bool; 5],
}

impl NdsqShards {
    /// Decompresses and parses the stored payloads; an error names the shard (0..5).
    fn parse(&self, stored: &[&[u8]]) -> Result<Ndsq, (usize, String)> {
        let (rows, cols) = (self.rows, self.cols);
        let mut parts: Vec<Vec<u8>> = Vec::with_capacity(5);
        for (n, input) in stored.iter().enumerate() {
            let mut out = vec![0u8; self.usize[n]];
            self.comp[n].decompress_into(input, &mut out).map_err(|m| (n, m))?;
            parts.push(out);
        }
        let fp16 = |n: usize| payload::parse_fp16(&parts[n]).map_err(|e| (n, format!("{e:#}")));
        let (u_rows, rank, u) = fp16(0)?;
        let (v_rank, v_cols, v) = fp16(1)?;
        let (d_len, d_cols, diag) = fp16(3)?;
        if (u_rows, v_rank, v_cols, d_len, d_cols) != (rows, rank, cols, rows.min(cols), 1) {
            let msg = format!(
                "factors {u_rows}x{rank} and {v_rank}x{v_cols}, diagonal {d_len}x{d_cols} do not make a {rows}x{cols} matrix"
            );
            return Err((0, msg));
        }
        let sparse = payload::parse_sparse(&parts[2], rows, cols).map_err(|e| (2, format!("{e:#}")))?;
        let pq = payload::parse_pq(&parts[4], rows, cols, &self.codebooks).map_err(|e| (4, format!("{e:#}")))?;
        let mut n = Ndsq { rows, cols, u, v, rank, diag, sparse, pq };
        let dropped = self.dropped;
        if dropped[0] || dropped[1] {
            (n.rank, n.u, n.v) = (0, Vec::new(), Vec::new());
        }
        if dropped[2] {
            n.sparse.clear();
        }
        if dropped[3] {
            n.diag.iter_mut().for_each(|x| *x = 0);
        }
        if dropped[4] {
            n.pq.codebooks.iter_mut().for_each(|x| *x = 0.0);
        }
        Ok(n)
    }

    /// The reconstructed matrix, f32 little-endian, into `out`.
    fn decode(&self, stored: &[&[u8]], out: &mut [u8]) -> Result<(), String> {
        let n = self.parse(stored).map_err(|(i, m)| format!("NDSQ shard {} of 5: {m}", i + 1))?;
        let w = n.reconstruct();
        out.chunks_exact_mut(4).zip(&w).for_each(|(o, x)| o.copy_from_slice(&x.to_le_bytes()));
        Ok(())
    }
}

/// An NDSQ tensor (L's two factors, S, D, R shards), checked now (each shard
/// decompressed and parsed) and reconstructed to F32 when first used, from the map, or
/// by the layer streamer from the shards it reads. Shards in `drop` are left out.
pub(super) fn ndsq_tensor(
    f: &Mapped,
    bank: &Bank,
    t: &Walked,
    shape: Vec<usize>,
    codebooks: &Arc<Vec<Codebook>>,
    drop: &HashSet<u32>,
) -> Result<HostTensor, FormatError> {
    let bad = |n: usize, m: String| {
        let i = t.chunks[n];
        corrupt(&f.path, bank.shards[i].offset, format!("shard {i} (NDSQ of `{}`): {m}", t.desc.name))
    };
    let shards: Vec<&ShardRec> = t.chunks.iter().map(|&i| &bank.shards[i]).collect();
    for (n, s) in shards.iter().enumerate() {
        let want = [SHARD_NDSQ_L, SHARD_NDSQ_L, SHARD_NDSQ_S, SHARD_NDSQ_D, SHARD_NDSQ_R][n];
        if s.h.kind != want {
            let msg = format!("a {} shard where {} belongs", shard_type_name(s.h.kind), shard_type_name(want));
            return Err(bad(n, msg));
        }
    }
    let spec = NdsqShards {
        rows: shape[0],
        cols: shape[1],
        comp: std::array::from_fn(|n| Compression::from_shard_code(shards[n].h.comp).expect("checked in the walk")),
        usize: std::array::from_fn(|n| shards[n].h.usize as usize),
        codebooks: codebooks.clone(),
        dropped: std::array::from_fn(|n| drop.contains(&(t.chunks[n] as u32))),
    };
    let pieces: Vec<(u64, usize)> = shards.iter().map(|s| (s.payload(), s.h.csize as usize)).collect();
    let b = f.bytes();
    let stored: Vec<&[u8]> = pieces.iter().map(|&(at, n)| &b[at as usize..at as usize + n]).collect();
    spec.parse(&stored).map_err(|(n, m)| bad(n, m))?;
    let len = spec.rows * spec.cols * 4;
    let path: Arc<Path> = Arc::from(f.path.as_path());
    let encoded = Encoded { path, pieces, len, decode: Box::new(move |p, out| spec.decode(p, out)) };
    let lazy = LazyBytes::encoded(encoded, f.map.clone(), 0);
    Ok(HostTensor::lazy(Arc::new(lazy), DType::F32, shape))
}
