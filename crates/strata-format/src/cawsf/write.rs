//! Writing a `.cawsf` file one group at a time: the shard bank streams out behind a
//! zeroed header block, META follows the bank, and the header and TOC are written last,
//! before the file is renamed into place.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rayon::prelude::*;
use xxhash_rust::xxh3::Xxh3;

use super::layout::*;
use std::sync::Arc;

use super::RoutingTable;
use crate::ndsq::{Ndsq, NdsqParams, payload};
use crate::units::layer_units;
use crate::{Group, ModelMeta, ModelWriter, layer_tensor};
use strata_quant::ReadF32;
use strata_tensor::tensor::{DType, HostTensor};

/// PAD payloads are at most `ALIGN + 11 - 12` bytes.
static ZEROS: [u8; 2 * ALIGN as usize] = [0; 2 * ALIGN as usize];

/// A streaming `.cawsf` writer (see [`ModelWriter`]): memory is one group's tensors
/// (compressed, when compressing) plus the index.
pub struct CawsfWriter {
    out: PathBuf,
    tmp: PathBuf,
    file: Option<BufWriter<File>>,
    /// Bytes written so far (the next shard's offset).
    pos: u64,
    model: ModelMeta,
    n_layers: usize,
    compression: Compression,
    /// Largest payload per data shard; tensors beyond it are split.
    max_chunk: u64,
    started: bool,
    next_layer: usize,
    bank_hash: Xxh3,
    sums: Vec<ShardSum>,
    tensors: Vec<TensorEntry>,
    names: HashSet<String>,
    global: Range,
    layers: Vec<Range>,
    done: bool,
    /// Decompose eligible weight matrices with NDSQ ([`CawsfWriter::with_ndsq`]).
    ndsq: Option<(NdsqParams, Arc<rayon::ThreadPool>)>,
    /// The R shards' codebooks (the CODEBOOKS section).
    codebooks: Vec<payload::Codebook>,
    /// The NDSQ shards' keys and costs (the ROUTING section; `dim` is the hidden size).
    routing: RoutingTable,
}

impl CawsfWriter {
    /// Starts writing `out` (which must not exist) under a temporary sibling name.
    pub fn create(out: &Path, meta: &ModelMeta, layers: usize, compression: Compression) -> anyhow::Result<Self> {
        if out.symlink_metadata().is_ok() {
            bail!("{}: already exists; choose another output or remove it first", out.display());
        }
        if layers > MAX_LAYERS {
            bail!("{}: {layers} layers; a .cawsf file holds at most {MAX_LAYERS}", out.display());
        }
        crate::temp::remove_stale(out)?;
        let tmp = crate::temp::sibling(out)?;
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = CawsfWriter {
            out: out.to_owned(),
            tmp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            pos: 0,
            model: meta.clone(),
            n_layers: layers,
            compression,
            max_chunk: MAX_CHUNK,
            started: false,
            next_layer: 0,
            bank_hash: Xxh3::new(),
            sums: Vec::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            global: Range { offset: HEADER_BLOCK, len: 0 },
            layers: vec![Range::default(); layers],
            done: false,
            ndsq: None,
            codebooks: Vec::new(),
            routing: RoutingTable { dim: 0, shards: Vec::new(), costs: Vec::new(), keys: Vec::new() },
        };
        w.write_raw(&ZEROS[..HEADER_BLOCK as usize])?;
        Ok(w)
    }

    /// Writes each decoder layer's weight matrices (2-D, whole PQ vectors per row; not
    /// the MoE routers) as NDSQ shards (`format::ndsq`) instead of their bytes, with
    /// ROUTING keys of `hidden_size` values (the model's, from its parsed config).
    pub fn with_ndsq(
        mut self,
        params: NdsqParams,
        pool: Arc<rayon::ThreadPool>,
        hidden_size: usize,
    ) -> anyhow::Result<Self> {
        if hidden_size == 0 || hidden_size > usize::from(u16::MAX) {
            bail!("{}: hidden size {hidden_size} does not fit a ROUTING key", self.out.display());
        }
        self.routing.dim = hidden_size;
        self.ndsq = Some((params, pool));
        Ok(self)
    }

    /// Splits tensors into data shards of at most `bytes` (tests exercise splitting
    /// without writing 4 GiB).
    #[cfg(test)]
    pub(super) fn with_chunk_limit(mut self, bytes: u64) -> Self {
        self.max_chunk = bytes;
        self
    }

    fn write_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let f = self.file.as_mut().expect("the file is open until finish");
        f.write_all(bytes).with_context(|| format!("writing {}", self.tmp.display()))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Writes one shard (header + payload) and records its checksum; returns its offset.
    fn write_shard(&mut self, h: ShardHeader, payload: &[u8]) -> anyhow::Result<u64> {
        let offset = self.pos;
        let head = h.encode();
        let mut sum = Xxh3::new();
        sum.update(&head);
        sum.update(payload);
        self.bank_hash.update(&head);
        self.bank_hash.update(payload);
        self.write_raw(&head)?;
        self.write_raw(payload)?;
        let len = SHARD_HEADER_BYTES + payload.len() as u64;
        self.sums.push(ShardSum { offset, len, xxh3: format!("{:016x}", sum.digest()) });
        Ok(offset)
    }

    /// A PAD shard of `gap` bytes in all (at least its 12-byte header).
    fn pad(&mut self, scope: u16, gap: u64) -> anyhow::Result<()> {
        let n = (gap - SHARD_HEADER_BYTES) as u32;
        self.write_shard(ShardHeader { kind: SHARD_PAD, scope, comp: 0, usize: n, csize: n }, &ZEROS[..n as usize])?;
        Ok(())
    }

    /// Pads so that the position becomes `≡ -skip (mod ALIGN)`: with `skip = 12` the next
    /// shard's payload is aligned, with `skip = 0` the next shard itself.
    fn align(&mut self, scope: u16, skip: u64) -> anyhow::Result<()> {
        let mut gap = (ALIGN - (self.pos + skip) % ALIGN) % ALIGN;
        if gap == 0 {
            return Ok(());
        }
        if gap < SHARD_HEADER_BYTES {
            gap += ALIGN;
        }
        self.pad(scope, gap)
    }

    fn check_tensor(&self, name: &str, t: &HostTensor) -> anyhow::Result<()> {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            bail!("tensor name `{name}` is empty or longer than {MAX_NAME_BYTES} bytes");
        }
        if t.shape.len() > MAX_DIMS {
            bail!("tensor `{name}` has {} dimensions (at most {MAX_DIMS})", t.shape.len());
        }
        if self.names.contains(name) {
            bail!("tensor `{name}` is written twice");
        }
        if t.dtype.bytes_for(t.numel()) != Some(t.bytes().len()) {
            bail!("tensor `{name}`: {} bytes do not hold {} {:?}", t.bytes().len(), t.dtype.name(), t.shape);
        }
        Ok(())
    }

    fn write_tensor(
        &mut self,
        scope: u16,
        name: &str,
        t: &HostTensor,
        packed: Vec<Option<Vec<u8>>>,
    ) -> anyhow::Result<()> {
        let bytes = t.bytes();
        let desc = TensorDesc {
            name: name.to_owned(),
            dtype: t.dtype,
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            bytes: bytes.len() as u64,
            chunks: packed.len() as u32,
        };
        let desc_at = self.write_desc(scope, &desc)?;
        let mut chunks = Vec::with_capacity(packed.len());
        for (raw, z) in bytes.chunks(self.max_chunk as usize).zip(packed) {
            let usize = raw.len() as u32;
            let (comp, payload) = match &z {
                Some(z) => (self.compression, &z[..]),
                None => {
                    self.align(scope, SHARD_HEADER_BYTES)?;
                    (Compression::None, raw)
                }
            };
            let h = ShardHeader {
                kind: SHARD_TENSOR_DATA,
                scope,
                comp: comp.shard_code(),
                usize,
                csize: payload.len() as u32,
            };
            let offset = self.write_shard(h, payload)?;
            chunks.push(ChunkEntry { offset, comp, usize, csize: h.csize });
        }
        self.record(scope, desc, desc_at, chunks);
        Ok(())
    }
}

impl CawsfWriter {
    /// Writes `name` as NDSQ shards: L's two factors, S, D and R (`docs/formats.md`),
    /// R's codebooks into CODEBOOKS and each shard's key and cost into ROUTING.
    fn write_ndsq(&mut self, scope: u16, name: &str, shape: &[usize], n: &Ndsq) -> anyhow::Result<()> {
        // Codebook numbers are u16; past them, codebooks stay in their shards.
        let r = match u16::try_from(self.codebooks.len()) {
            Ok(id) if id < u16::MAX => {
                let q = &n.pq;
                self.codebooks.push(payload::Codebook { d: q.d, m: q.m, k: q.k, values: q.codebooks.clone() });
                payload::pq_shared(n, id)
            }
            _ => payload::pq(n),
        };
        let payloads = [
            (SHARD_NDSQ_L, payload::fp16(n.rows, n.rank, &n.u)),
            (SHARD_NDSQ_L, payload::fp16(n.rank, n.cols, &n.v)),
            (SHARD_NDSQ_S, payload::sparse(n)),
            (SHARD_NDSQ_D, payload::fp16(n.diag.len(), 1, &n.diag)),
            (SHARD_NDSQ_R, r),
        ];
        let keys = n.component_keys(self.routing.dim).map(|[l, s, d, r]| [l.clone(), l, s, d, r]);
        let desc = TensorDesc {
            name: name.to_owned(),
            dtype: DType::F32,
            shape: shape.iter().map(|&d| d as u64).collect(),
            bytes: (n.rows * n.cols * 4) as u64,
            chunks: payloads.len() as u32,
        };
        let desc_at = self.write_desc(scope, &desc)?;
        let mut chunks = Vec::with_capacity(payloads.len());
        for (j, (kind, raw)) in payloads.into_iter().enumerate() {
            let number = self.sums.len() as u32;
            let z = self.compression.compress(&raw);
            let (comp, bytes) = match &z {
                Some(z) => (self.compression, &z[..]),
                None => (Compression::None, &raw[..]),
            };
            let usize = u32::try_from(raw.len()).context("an NDSQ shard over 4 GiB")?;
            let h = ShardHeader { kind, scope, comp: comp.shard_code(), usize, csize: bytes.len() as u32 };
            let offset = self.write_shard(h, bytes)?;
            chunks.push(ChunkEntry { offset, comp, usize, csize: h.csize });
            if let Some(keys) = &keys {
                self.routing.shards.push(number);
                self.routing.costs.push((SHARD_HEADER_BYTES + u64::from(h.csize)) as f32);
                self.routing.keys.extend_from_slice(&keys[j]);
            }
        }
        self.record(scope, desc, desc_at, chunks);
        Ok(())
    }

    /// Writes a tensor's TENSOR_DESC shard; returns its offset.
    fn write_desc(&mut self, scope: u16, desc: &TensorDesc) -> anyhow::Result<u64> {
        let record = desc.encode();
        let n = record.len() as u32;
        self.write_shard(ShardHeader { kind: SHARD_TENSOR_DESC, scope, comp: 0, usize: n, csize: n }, &record)
    }

    /// Adds a written tensor to META's index.
    fn record(&mut self, scope: u16, desc: TensorDesc, desc_at: u64, chunks: Vec<ChunkEntry>) {
        self.names.insert(desc.name.clone());
        self.tensors.push(TensorEntry {
            name: desc.name,
            dtype: desc.dtype.name().to_owned(),
            shape: desc.shape,
            layer: (scope != GLOBAL_SCOPE).then_some(usize::from(scope)),
            bytes: desc.bytes,
            desc: desc_at,
            chunks,
        });
    }
}

/// Whether NDSQ decomposes this tensor of a layer: a weight matrix of whole PQ vectors
/// per row, not a MoE router (a small error there changes which experts run).
fn ndsq_eligible(name: &str, t: &HostTensor, p: &NdsqParams) -> bool {
    let routing = layer_tensor(name).is_some_and(|(_, local)| crate::requant::ROUTING_TENSORS.contains(&local));
    t.shape.len() == 2 && t.shape[0] >= 2 && t.shape[1].is_multiple_of(p.pq_d) && !routing
}

impl CawsfWriter {
    /// Writes a section at the next page boundary (compressed as the file is, when that
    /// saves bytes) and returns its TOC record.
    fn write_section(&mut self, kind: u32, raw: Vec<u8>) -> anyhow::Result<TocEntry> {
        let gap = (ALIGN - self.pos % ALIGN) % ALIGN;
        self.write_raw(&ZEROS[..gap as usize])?;
        let raw_size = raw.len() as u64;
        let (stored, flags) = match self.compression.compress(&raw) {
            Some(z) => (z, self.compression.section_flags()),
            None => (raw, 0),
        };
        let entry =
            TocEntry { kind, flags, offset: self.pos, size: stored.len() as u64, raw_size, checksum: xxh3(&stored) };
        self.write_raw(&stored)?;
        Ok(entry)
    }
}

impl ModelWriter for CawsfWriter {
    fn write_group(&mut self, group: Group, tensors: &[(String, HostTensor)]) -> anyhow::Result<()> {
        let out = self.out.display().to_string();
        let scope = match group {
            Group::Global if self.started => bail!("{out}: the global tensors must be written first, and once"),
            Group::Global => GLOBAL_SCOPE,
            Group::Layer(i) if i != self.next_layer || i >= self.n_layers => {
                bail!("{out}: layer {i} written out of order (expected layer {} of {})", self.next_layer, self.n_layers)
            }
            Group::Layer(i) => i as u16,
        };
        self.started = true;
        for (name, t) in tensors {
            self.check_tensor(name, t).with_context(|| format!("{out}: {group:?}"))?;
        }
        // NDSQ: each eligible matrix of a layer decomposed (the work is inside each).
        let mut ndsq: Vec<Option<Ndsq>> = vec![None; tensors.len()];
        if let (Some((p, pool)), Group::Layer(_)) = (&self.ndsq, group) {
            for (slot, (name, t)) in ndsq.iter_mut().zip(tensors) {
                if ndsq_eligible(name, t, p) {
                    let w = t.to_f32_vec();
                    let n = Ndsq::encode(pool, &w, t.shape[0], t.shape[1], p)
                        .with_context(|| format!("{out}: NDSQ of `{name}`"))?;
                    *slot = Some(n);
                }
            }
        }
        let (comp, chunk) = (self.compression, self.max_chunk as usize);
        let mut packed: Vec<Vec<Option<Vec<u8>>>> =
            tensors.par_iter().map(|(_, t)| t.bytes().chunks(chunk).map(|c| comp.compress(c)).collect()).collect();
        let start = self.pos;
        for unit in layer_units(tensors) {
            // Each unit (the core, each expert) starts on a page of its own; the group
            // starts on one already, so a dense layer gains no padding.
            self.align(scope, 0)?;
            for i in unit.tensors {
                let (name, t) = &tensors[i];
                match ndsq[i].take() {
                    Some(n) => self.write_ndsq(scope, name, &t.shape, &n)?,
                    None => self.write_tensor(scope, name, t, std::mem::take(&mut packed[i]))?,
                }
            }
        }
        self.align(scope, 0)?;
        let range = Range { offset: start, len: self.pos - start };
        match group {
            Group::Global => self.global = range,
            Group::Layer(i) => {
                self.layers[i] = range;
                self.next_layer += 1;
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> anyhow::Result<()> {
        let out = self.out.display().to_string();
        if self.next_layer != self.n_layers {
            bail!("{out}: finished after {} of {} layers", self.next_layer, self.n_layers);
        }
        let bank_size = self.pos - HEADER_BLOCK;
        let bank_sum = self.bank_hash.digest();
        // CODEBOOKS and ROUTING, when there are NDSQ shards, each on a page of its own.
        let mut extra = Vec::new();
        let mut extra_sums = Vec::new();
        let sections = [
            (SECTION_CODEBOOKS, (!self.codebooks.is_empty()).then(|| payload::codebooks(&self.codebooks))),
            (SECTION_ROUTING, (!self.routing.shards.is_empty()).then(|| self.routing.encode())),
        ];
        for (kind, bytes) in sections {
            let Some(bytes) = bytes else { continue };
            let entry = self.write_section(kind, bytes)?;
            extra_sums.push((section_name(kind), format!("{:016x}", entry.checksum)));
            extra.push(entry);
        }
        let bank = TocEntry {
            kind: SECTION_SHARD_BANK,
            flags: 0,
            offset: HEADER_BLOCK,
            size: bank_size,
            raw_size: bank_size,
            checksum: bank_sum,
        };
        let meta = Meta {
            format: "cawsf".into(),
            version: VERSION,
            model: self.model.clone(),
            compression: self.compression,
            alignment: ALIGN,
            n_layers: self.n_layers,
            global: self.global,
            layers: std::mem::take(&mut self.layers),
            tensors: std::mem::take(&mut self.tensors),
            checksum_index: ChecksumIndex {
                algorithm: "xxh3-64".into(),
                sections: [("SHARD_BANK".to_owned(), format!("{bank_sum:016x}"))]
                    .into_iter()
                    .chain(extra_sums)
                    .collect(),
                shards: std::mem::take(&mut self.sums),
            },
        };
        let json = serde_json::to_vec(&meta).context("serializing META")?;
        let meta_entry = self.write_section(SECTION_META, json)?;
        let header = encode_header_block(&[[meta_entry, bank].as_slice(), &extra].concat());
        let tmp = self.tmp.clone();
        let io = |what: &str| format!("{what} {}", tmp.display());
        let mut file = self
            .file
            .take()
            .expect("open until finish")
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| io("flushing"))?;
        file.seek(SeekFrom::Start(0)).with_context(|| io("seeking in"))?;
        file.write_all(&header).with_context(|| io("writing the header of"))?;
        file.sync_all().with_context(|| io("syncing"))?;
        drop(file);
        if self.out.symlink_metadata().is_ok() {
            bail!("{out}: appeared while converting; not overwriting it");
        }
        std::fs::rename(&self.tmp, &self.out).with_context(|| format!("renaming {} to {out}", self.tmp.display()))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for CawsfWriter {
    /// An unfinished writer leaves nothing behind.
    fn drop(&mut self) {
        if !self.done {
            drop(self.file.take());
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
