//! The `.cawsf` byte layout: header and TOC, shard headers, the tensor description
//! record, the META JSON schema and the codecs. `docs/formats.md` (`.cawsf` container) describes the same
//! layout in prose; the two change together.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::ModelMeta;
use strata_tensor::tensor::DType;

/// `"CAWSF"` padded with three zero bytes to 8.
pub const MAGIC: [u8; 8] = *b"CAWSF\0\0\0";
pub const VERSION: u32 = 1;
/// Sections, raw tensor payloads and layer ranges start at multiples of this.
pub const ALIGN: u64 = 4096;
/// Fixed header: magic, version, section count, header checksum.
pub const HEADER_BYTES: u64 = 24;
pub const TOC_RECORD_BYTES: u64 = 40;
/// Header and TOC live in the first 4 KiB; the first section starts at or after it.
pub const HEADER_BLOCK: u64 = ALIGN;
/// As many TOC records as fit in the header block.
pub const MAX_SECTIONS: u64 = (HEADER_BLOCK - HEADER_BYTES) / TOC_RECORD_BYTES;
pub const SHARD_HEADER_BYTES: u64 = 12;
/// The shard scope of global tensors (embeddings, final norm, output head).
pub const GLOBAL_SCOPE: u16 = 0xFFFF;
/// Layers are scopes `0..MAX_LAYERS`.
pub const MAX_LAYERS: usize = GLOBAL_SCOPE as usize;
/// Largest payload of one shard that a writer produces: `u32::MAX` rounded down to the
/// alignment, so a raw chunk of a split tensor ends on a page boundary.
pub const MAX_CHUNK: u64 = (u32::MAX as u64) / ALIGN * ALIGN;
/// Longest tensor name accepted.
pub const MAX_NAME_BYTES: usize = 1024;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 8;
/// Largest META section accepted, after decompression.
pub const MAX_META_BYTES: u64 = 256 << 20;
/// Largest decompressed size accepted per compressed byte: the most each codec can
/// expand (zstd RLE blocks: 128 KiB from 4 bytes; LZ4: about 255×), with headroom.
pub const ZSTD_MAX_RATIO: u64 = 1 << 16;
pub const LZ4_MAX_RATIO: u64 = 512;

pub const SECTION_META: u32 = 1;
pub const SECTION_CODEBOOKS: u32 = 2;
pub const SECTION_SHARD_BANK: u32 = 3;
pub const SECTION_ROUTING: u32 = 4;

pub const FLAG_ZSTD: u32 = 1 << 0;
pub const FLAG_LZ4: u32 = 1 << 1;

/// Shard types: the seed's NDSQ components (0..=3), then Strata's tensor shards.
pub const SHARD_NDSQ_L: u8 = 0;
pub const SHARD_NDSQ_R: u8 = 1;
pub const SHARD_NDSQ_S: u8 = 2;
pub const SHARD_NDSQ_D: u8 = 3;
pub const SHARD_TENSOR_DESC: u8 = 0x10;
pub const SHARD_TENSOR_DATA: u8 = 0x11;
pub const SHARD_PAD: u8 = 0xFF;

/// Name of a section type, for messages and the META `checksum_index`.
pub fn section_name(kind: u32) -> String {
    match kind {
        SECTION_META => "META".into(),
        SECTION_CODEBOOKS => "CODEBOOKS".into(),
        SECTION_SHARD_BANK => "SHARD_BANK".into(),
        SECTION_ROUTING => "ROUTING".into(),
        other => format!("type {other}"),
    }
}

/// Name of a shard type, for messages.
pub fn shard_type_name(kind: u8) -> String {
    match kind {
        0 => "NDSQ L".into(),
        1 => "NDSQ R".into(),
        2 => "NDSQ S".into(),
        3 => "NDSQ D".into(),
        SHARD_TENSOR_DESC => "TENSOR_DESC".into(),
        SHARD_TENSOR_DATA => "TENSOR_DATA".into(),
        SHARD_PAD => "PAD".into(),
        other => format!("type {other:#04x}"),
    }
}

/// How a `.cawsf` file's tensor data (and its META section) is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Raw shards: memory-mapped on open, no copy.
    None,
    /// Zstandard frames (RFC 8878).
    Zstd,
    /// LZ4 blocks (the block format, no frame and no size prefix).
    Lz4,
}

impl Compression {
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
        }
    }

    /// The shard header `comp` byte.
    pub fn shard_code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zstd => 1,
            Compression::Lz4 => 2,
        }
    }

    pub fn from_shard_code(code: u8) -> Option<Compression> {
        Some(match code {
            0 => Compression::None,
            1 => Compression::Zstd,
            2 => Compression::Lz4,
            _ => return None,
        })
    }

    /// The TOC `flags` bits.
    pub fn section_flags(self) -> u32 {
        match self {
            Compression::None => 0,
            Compression::Zstd => FLAG_ZSTD,
            Compression::Lz4 => FLAG_LZ4,
        }
    }

    /// The compression named by TOC `flags`, or `None` for unknown or conflicting bits.
    pub fn from_section_flags(flags: u32) -> Option<Compression> {
        Some(match flags {
            0 => Compression::None,
            FLAG_ZSTD => Compression::Zstd,
            FLAG_LZ4 => Compression::Lz4,
            _ => return None,
        })
    }

    /// `data` compressed, or `None` when compressing does not make it smaller (or this
    /// is [`Compression::None`]).
    pub fn compress(self, data: &[u8]) -> Option<Vec<u8>> {
        let out = match self {
            Compression::None => return None,
            Compression::Zstd => ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest),
            Compression::Lz4 => lz4_flex::block::compress(data),
        };
        (out.len() < data.len()).then_some(out)
    }

    /// The largest decompressed size `csize` stored bytes may claim.
    pub fn max_decompressed(self, csize: u64) -> u64 {
        match self {
            Compression::None => csize,
            Compression::Zstd => csize.saturating_mul(ZSTD_MAX_RATIO),
            Compression::Lz4 => csize.saturating_mul(LZ4_MAX_RATIO),
        }
    }

    /// Decompresses `input` into exactly `out` (whose length is the recorded
    /// uncompressed size).
    pub fn decompress_into(self, input: &[u8], out: &mut [u8]) -> Result<(), String> {
        let n = match self {
            Compression::None if input.len() == out.len() => {
                out.copy_from_slice(input);
                input.len()
            }
            Compression::None => return Err(format!("{} raw bytes for {} expected", input.len(), out.len())),
            Compression::Zstd => {
                ruzstd::decoding::FrameDecoder::new().decode_all(input, out).map_err(|e| format!("zstd: {e}"))?
            }
            Compression::Lz4 => lz4_flex::block::decompress_into(input, out).map_err(|e| format!("lz4: {e}"))?,
        };
        match n == out.len() {
            true => Ok(()),
            false => Err(format!("decompressed to {n} bytes, {} expected", out.len())),
        }
    }
}

/// One TOC record, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TocEntry {
    pub kind: u32,
    pub flags: u32,
    /// Absolute file offset of the section's stored bytes.
    pub offset: u64,
    /// Stored (possibly compressed) bytes.
    pub size: u64,
    /// Bytes after decompression (`size` when uncompressed).
    pub raw_size: u64,
    /// XXH3-64 of the stored bytes.
    pub checksum: u64,
}

impl TocEntry {
    pub fn encode(&self) -> [u8; TOC_RECORD_BYTES as usize] {
        let mut b = [0u8; TOC_RECORD_BYTES as usize];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.raw_size.to_le_bytes());
        b[32..40].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; TOC_RECORD_BYTES as usize]) -> TocEntry {
        TocEntry {
            kind: le_u32(&b[0..4]),
            flags: le_u32(&b[4..8]),
            offset: le_u64(&b[8..16]),
            size: le_u64(&b[16..24]),
            raw_size: le_u64(&b[24..32]),
            checksum: le_u64(&b[32..40]),
        }
    }
}

/// The header block (4096 bytes) for `toc`, its checksum filled in.
pub fn encode_header_block(toc: &[TocEntry]) -> Vec<u8> {
    assert!(toc.len() as u64 <= MAX_SECTIONS, "at most {MAX_SECTIONS} sections");
    let mut b = vec![0u8; HEADER_BLOCK as usize];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(toc.len() as u32).to_le_bytes());
    for (i, e) in toc.iter().enumerate() {
        let at = HEADER_BYTES as usize + i * TOC_RECORD_BYTES as usize;
        b[at..at + TOC_RECORD_BYTES as usize].copy_from_slice(&e.encode());
    }
    let sum = header_checksum(&b);
    b[16..24].copy_from_slice(&sum.to_le_bytes());
    b
}

/// XXH3-64 of the header block without its checksum field: bytes `0..16` followed by
/// bytes `24..4096`. `block` is at least [`HEADER_BLOCK`] bytes.
pub fn header_checksum(block: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(&block[0..16]);
    h.update(&block[HEADER_BYTES as usize..HEADER_BLOCK as usize]);
    h.digest()
}

/// XXH3-64 (seed 0) as stored in the TOC.
pub fn xxh3(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// The 12-byte header in front of every shard payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardHeader {
    pub kind: u8,
    pub scope: u16,
    pub comp: u8,
    /// Uncompressed payload bytes.
    pub usize: u32,
    /// Stored payload bytes (equal to `usize` when raw).
    pub csize: u32,
}

impl ShardHeader {
    pub fn encode(&self) -> [u8; SHARD_HEADER_BYTES as usize] {
        let mut b = [0u8; SHARD_HEADER_BYTES as usize];
        b[0] = self.kind;
        b[1..3].copy_from_slice(&self.scope.to_le_bytes());
        b[3] = self.comp;
        b[4..8].copy_from_slice(&self.usize.to_le_bytes());
        b[8..12].copy_from_slice(&self.csize.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> ShardHeader {
        ShardHeader {
            kind: b[0],
            scope: u16::from_le_bytes([b[1], b[2]]),
            comp: b[3],
            usize: le_u32(&b[4..8]),
            csize: le_u32(&b[8..12]),
        }
    }
}

/// The payload of a `TENSOR_DESC` shard: which tensor the following `TENSOR_DATA`
/// shards hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    pub name: String,
    pub dtype: DType,
    /// Row-major, outermost dimension first.
    pub shape: Vec<u64>,
    /// Total bytes of the tensor (the sum of its data shards' `usize`).
    pub bytes: u64,
    /// Number of `TENSOR_DATA` shards that follow.
    pub chunks: u32,
}

impl TensorDesc {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(18 + self.name.len() + 8 * self.shape.len());
        b.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b.extend_from_slice(&dtype_code(self.dtype).to_le_bytes());
        b.extend_from_slice(&(self.shape.len() as u16).to_le_bytes());
        for d in &self.shape {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&self.bytes.to_le_bytes());
        b.extend_from_slice(&self.chunks.to_le_bytes());
        b
    }

    /// Parses and checks a record: name length and UTF-8, a known dtype, at most
    /// [`MAX_DIMS`] dimensions, and `bytes` equal to what dtype and shape need.
    pub fn decode(p: &[u8]) -> Result<TensorDesc, String> {
        let short = || format!("the {}-byte record is truncated", p.len());
        let name_len = usize::from(u16::from_le_bytes(p.get(0..2).ok_or_else(short)?.try_into().expect("2")));
        if name_len == 0 || name_len > MAX_NAME_BYTES {
            return Err(format!("name length {name_len} is outside 1..={MAX_NAME_BYTES}"));
        }
        let name = p.get(2..2 + name_len).ok_or_else(short)?;
        let name = std::str::from_utf8(name).map_err(|_| "the name is not UTF-8".to_string())?.to_owned();
        let mut at = 2 + name_len;
        let code = u16::from_le_bytes(p.get(at..at + 2).ok_or_else(short)?.try_into().expect("2"));
        let dtype = dtype_from_code(code).ok_or_else(|| format!("tensor `{name}`: unknown dtype code {code}"))?;
        let n_dims = usize::from(u16::from_le_bytes(p.get(at + 2..at + 4).ok_or_else(short)?.try_into().expect("2")));
        if n_dims > MAX_DIMS {
            return Err(format!("tensor `{name}`: {n_dims} dimensions (at most {MAX_DIMS})"));
        }
        at += 4;
        let want = at + 8 * n_dims + 12;
        if p.len() != want {
            return Err(format!("tensor `{name}`: record is {} bytes, {want} expected", p.len()));
        }
        let shape: Vec<u64> = (0..n_dims).map(|i| le_u64(&p[at + 8 * i..at + 8 * i + 8])).collect();
        at += 8 * n_dims;
        let bytes = le_u64(&p[at..at + 8]);
        let chunks = le_u32(&p[at + 8..at + 12]);
        let desc = TensorDesc { name, dtype, shape, bytes, chunks };
        match desc.expected_bytes() {
            Some(b) if b == bytes => Ok(desc),
            _ => Err(format!("tensor `{}`: {} {:?} does not take {bytes} bytes", desc.name, dtype.name(), desc.shape)),
        }
    }

    /// Bytes that dtype and shape need, or `None` on overflow or a partial block.
    pub fn expected_bytes(&self) -> Option<u64> {
        let numel = self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        let bytes = self.dtype.bytes_for(usize::try_from(numel).ok()?)?;
        u64::try_from(bytes).ok()
    }
}

/// Every dtype, for code lookups.
const DTYPES: [DType; 16] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q8_1,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::Q8_K,
    DType::Mxfp4,
    DType::AffineQ4,
    DType::I8,
];

/// The dtype code of a `TENSOR_DESC` record: the GGML type id, and 128+ for Strata's
/// own block formats.
pub fn dtype_code(d: DType) -> u16 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q5_0 => 6,
        DType::Q5_1 => 7,
        DType::Q8_0 => 8,
        DType::Q8_1 => 9,
        DType::Q4_K => 12,
        DType::Q5_K => 13,
        DType::Q6_K => 14,
        DType::Q8_K => 15,
        DType::BF16 => 30,
        DType::Mxfp4 => 39,
        DType::AffineQ4 => 128,
        DType::I8 => 129,
    }
}

pub fn dtype_from_code(code: u16) -> Option<DType> {
    DTYPES.into_iter().find(|&d| dtype_code(d) == code)
}

/// A byte range of the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub offset: u64,
    pub len: u64,
}

/// One data shard of a tensor, as the META index records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkEntry {
    /// Absolute offset of the shard header; the payload follows 12 bytes later.
    pub offset: u64,
    pub comp: Compression,
    pub usize: u32,
    pub csize: u32,
}

/// One tensor in the META index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Layer index, or `null` for a global tensor.
    pub layer: Option<usize>,
    pub bytes: u64,
    /// Absolute offset of the tensor's `TENSOR_DESC` shard header.
    pub desc: u64,
    pub chunks: Vec<ChunkEntry>,
}

/// The XXH3-64 of one shard (its 12-byte header and stored payload).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSum {
    /// Absolute offset of the shard header.
    pub offset: u64,
    /// 12 + the shard's `csize`.
    pub len: u64,
    pub xxh3: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChecksumIndex {
    /// Always `xxh3-64`.
    pub algorithm: String,
    /// Section name (`SHARD_BANK`, ...) → XXH3-64 hex of its stored bytes. META is not
    /// listed: its checksum is in its TOC record.
    pub sections: BTreeMap<String, String>,
    /// Every shard of the bank, in bank order.
    pub shards: Vec<ShardSum>,
}

/// The META section's JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    /// Always `cawsf`.
    pub format: String,
    pub version: u32,
    #[serde(flatten)]
    pub model: ModelMeta,
    pub compression: Compression,
    pub alignment: u64,
    pub n_layers: usize,
    /// Byte range of the global tensors' shards in the bank.
    pub global: Range,
    /// Byte range of each layer's shards, layer `i` at index `i`.
    pub layers: Vec<Range>,
    /// Every tensor, in bank order.
    pub tensors: Vec<TensorEntry>,
    pub checksum_index: ChecksumIndex,
}

pub fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

pub fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let e = TocEntry { kind: 3, flags: 1, offset: 4096, size: 10, raw_size: 20, checksum: 0xdead_beef };
        assert_eq!(TocEntry::decode(&e.encode()), e);
        let h = ShardHeader { kind: SHARD_TENSOR_DATA, scope: 7, comp: 2, usize: 1 << 31, csize: 5 };
        assert_eq!(ShardHeader::decode(&h.encode()), h);
        let d = TensorDesc { name: "a.b".into(), dtype: DType::Q4_K, shape: vec![2, 256], bytes: 288, chunks: 1 };
        assert_eq!(TensorDesc::decode(&d.encode()), Ok(d));
        for dt in DTYPES {
            assert_eq!(dtype_from_code(dtype_code(dt)), Some(dt));
        }
    }

    #[test]
    fn hostile_descriptions_are_refused() {
        let good = TensorDesc { name: "w".into(), dtype: DType::F32, shape: vec![3], bytes: 12, chunks: 1 };
        let enc = good.encode();
        for cut in 0..enc.len() {
            assert!(TensorDesc::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let wrong_bytes = TensorDesc { bytes: 16, ..good.clone() };
        assert!(TensorDesc::decode(&wrong_bytes.encode()).unwrap_err().contains("does not take"));
        let huge = TensorDesc { shape: vec![u64::MAX, 4], ..good.clone() };
        assert!(TensorDesc::decode(&huge.encode()).is_err());
        let mut many_dims = good.encode();
        many_dims[2 + 1 + 2] = 200; // n_dims low byte
        assert!(TensorDesc::decode(&many_dims).unwrap_err().contains("dimensions"));
    }

    #[test]
    fn codecs_round_trip_and_refuse_garbage() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8 / 3).collect();
        for c in [Compression::Zstd, Compression::Lz4] {
            let z = c.compress(&data).expect("compressible");
            let mut out = vec![0u8; data.len()];
            c.decompress_into(&z, &mut out).unwrap();
            assert_eq!(out, data);
            let mut short = vec![0u8; data.len() - 1];
            assert!(c.decompress_into(&z, &mut short).is_err());
            let mut long = vec![0u8; data.len() + 1];
            assert!(c.decompress_into(&z, &mut long).is_err());
            assert!(c.decompress_into(&[0xAB; 64], &mut out).is_err());
        }
        assert_eq!(Compression::Zstd.compress(&[1, 2, 3]), None);
    }
}
