//! Host-side tensors: typed views into bytes that outlive them (a memory map or an
//! owned, aligned buffer). Weights stay in their stored dtype; nothing here converts a
//! whole model to f32.

use std::path::Path;
use std::sync::{Arc, OnceLock};

/// Element types Strata reads from weight files: plain floats, and GGML's block-quantized
/// formats (a block of `block_size()` values packed into `block_bytes()` bytes).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    /// OCP microscaling FP4 (GGML type 39, `quant::mxfp4`): 32 E2M1 values sharing one
    /// E8M0 exponent byte; gpt-oss ships its MoE experts in it.
    Mxfp4,
    /// Strata's affine 4-bit format (`quant::affine_q4`): 128 values per block.
    AffineQ4,
    /// Strata's per-channel int8 format (`quant::int8`): 32 values per block.
    I8,
}

impl DType {
    /// Values per block (1 for plain floats).
    pub fn block_size(self) -> usize {
        use DType::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Mxfp4 => 32,
            Q4_K | Q5_K | Q6_K | Q8_K => 256,
            AffineQ4 => 128,
            I8 => 32,
        }
    }

    /// Bytes per block (the element size for plain floats).
    pub fn block_bytes(self) -> usize {
        use DType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            Mxfp4 => 17,
            AffineQ4 => 68,
            I8 => 36,
        }
    }

    /// Bytes holding `numel` values, or `None` when `numel` is not a whole number of
    /// blocks (or overflows).
    pub fn bytes_for(self, numel: usize) -> Option<usize> {
        if !numel.is_multiple_of(self.block_size()) {
            return None;
        }
        (numel / self.block_size()).checked_mul(self.block_bytes())
    }

    /// Alignment a view of this type needs (every block format but MXFP4 starts with f16
    /// or f32 fields; this is the smallest alignment they share; MXFP4 is all bytes).
    pub fn align(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Q8_K | DType::I8 => 4,
            DType::Mxfp4 => 1,
            _ => 2,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            Mxfp4 => "MXFP4",
            AffineQ4 => "AFFINE_Q4",
            I8 => "I8",
        }
    }
}

/// Anything that owns bytes and can be shared between threads: `memmap2::Mmap`,
/// [`MappedFile`](crate::mapped::MappedFile), [`AlignedBytes`], ...
pub trait ByteSource: Send + Sync {
    fn bytes(&self) -> &[u8];

    /// The file these bytes are a copy or map of, and the file offset of `bytes()[0]`:
    /// what the layer streamer reads instead of touching the bytes.
    fn file(&self) -> Option<(&Arc<Path>, u64)> {
        None
    }

    /// A copy of these bytes in device memory, already uploaded (or being uploaded, in
    /// order with the compute) by the streamer: the backend's weights view it instead of
    /// copying again. Only the backend that staged it knows its type.
    fn device_copy(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        None
    }

    /// How these bytes are stored encoded in a file, when they are computed from such
    /// pieces (an NDSQ tensor): what the layer streamer reads and decodes instead.
    fn encoded(&self) -> Option<&Arc<Encoded>> {
        None
    }

    /// Says `bytes()[range]` will not be read again soon: a mapped file's whole pages in
    /// it leave this process's memory (reading them again faults them back in from the
    /// file). Nothing happens for other sources.
    fn release(&self, _range: std::ops::Range<usize>) {}

    /// For bytes computed on first use and not computed yet: a fresh computation of all
    /// of them, which this source does not keep (so that a caller who needs them once,
    /// to repack them, does not leave a second copy behind). `None` otherwise.
    fn compute_unkept(&self) -> Option<AlignedBytes> {
        None
    }
}

/// A tensor stored as encoded pieces of a file (NDSQ shards) that `decode` turns into its
/// `len` bytes: the layer streamer reads the pieces, not the decoded size.
pub struct Encoded {
    pub path: Arc<Path>,
    /// File offset and length of each piece, in the order `decode` takes them.
    pub pieces: Vec<(u64, usize)>,
    /// The decoded bytes.
    pub len: usize,
    #[allow(clippy::type_complexity)]
    pub decode: Box<dyn Fn(&[&[u8]], &mut [u8]) -> Result<(), String> + Send + Sync>,
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Encoded({}, {:?} -> {} bytes)", self.path.display(), self.pieces, self.len)
    }
}

impl ByteSource for memmap2::Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Where a tensor's bytes are stored: `len` bytes (the tensor's) at `offset` in `path`,
/// to be transformed by `fixup` after reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorOrigin {
    pub path: Arc<Path>,
    pub offset: u64,
    pub fixup: Option<Fixup>,
}

/// A transformation applied to a tensor's stored bytes to get the bytes the model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fixup {
    /// Undo `convert_hf_to_gguf.py`'s llama Q/K permutation: within each of `n_heads`
    /// heads, stored row `2i + j` is row `j * head_dim / 2 + i` (whole rows move).
    UnpermuteRows { n_heads: usize },
    /// Subtract 1 from every element of an F32 tensor (Gemma's norm weights, which GGUF
    /// stores as `1 + w` and Hugging Face as `w`).
    MinusOneF32,
}

impl Fixup {
    /// Applies the fixup to `bytes`, `rows` rows of equal length, in place. The caller has
    /// checked the shape (`rows` divides into `n_heads` heads of even size).
    pub fn apply_in_place(&self, bytes: &mut [u8], rows: usize) {
        match *self {
            Fixup::UnpermuteRows { n_heads } => {
                let row_bytes = bytes.len() / rows;
                let head = rows / n_heads * row_bytes;
                let mut tmp = vec![0u8; head];
                for h in bytes.chunks_exact_mut(head) {
                    tmp.copy_from_slice(h);
                    unpermute_head(&tmp, h, row_bytes);
                }
            }
            Fixup::MinusOneF32 => {
                for v in bytes.chunks_exact_mut(4) {
                    let x = f32::from_le_bytes([v[0], v[1], v[2], v[3]]) - 1.0;
                    v.copy_from_slice(&x.to_le_bytes());
                }
            }
        }
    }

    /// Applies the fixup from `src` into `dst` (same length).
    pub fn apply(&self, src: &[u8], dst: &mut [u8], rows: usize) {
        match *self {
            Fixup::UnpermuteRows { n_heads } => {
                let row_bytes = src.len() / rows;
                let head = rows / n_heads * row_bytes;
                for (s, d) in src.chunks_exact(head).zip(dst.chunks_exact_mut(head)) {
                    unpermute_head(s, d, row_bytes);
                }
            }
            Fixup::MinusOneF32 => {
                dst.copy_from_slice(src);
                self.apply_in_place(dst, rows);
            }
        }
    }
}

/// One head of [`Fixup::UnpermuteRows`]: `dst` row `j * half + i` = `src` row `2i + j`.
fn unpermute_head(src: &[u8], dst: &mut [u8], row_bytes: usize) {
    let half = src.len() / row_bytes / 2;
    for i in 0..half {
        for j in 0..2 {
            let (from, to) = (2 * i + j, j * half + i);
            dst[to * row_bytes..(to + 1) * row_bytes].copy_from_slice(&src[from * row_bytes..(from + 1) * row_bytes]);
        }
    }
}

/// An owned byte buffer aligned to 64 bytes (enough for any element type and for
/// AVX-512 loads).
pub struct AlignedBytes {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes { words: vec![[0u64; 8]; len.div_ceil(64)], len }
    }

    pub fn from_slice(src: &[u8]) -> Self {
        let mut out = Self::zeroed(src.len());
        out.bytes_mut().copy_from_slice(src);
        out
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl ByteSource for AlignedBytes {
    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `bytes_mut`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

/// Bytes computed on first use and kept: for weights derived from a file (llama's
/// un-permuted Q/K rows in a GGUF), so that opening a model reads nothing, and a
/// conversion that drops each layer after writing it holds one layer, not the model.
pub struct LazyBytes {
    len: usize,
    make: Box<dyn Fn() -> AlignedBytes + Send + Sync>,
    done: OnceLock<AlignedBytes>,
    origin: Option<TensorOrigin>,
    encoded: Option<Arc<Encoded>>,
    /// The stored tensor `make` reads, where it reads one (a fixup's): released with
    /// these bytes.
    under: Option<Box<HostTensor>>,
}

impl LazyBytes {
    /// `make` must return exactly `len` bytes.
    pub fn new(len: usize, make: impl Fn() -> AlignedBytes + Send + Sync + 'static) -> Self {
        LazyBytes { len, make: Box::new(make), done: OnceLock::new(), origin: None, encoded: None, under: None }
    }

    /// Bytes decoded from pieces of a file, the same way on first use as the streamer
    /// does after reading them.
    pub fn encoded(encoded: Encoded, map: Arc<dyn ByteSource>, base: u64) -> Self {
        let e = Arc::new(encoded);
        let (len, dec) = (e.len, e.clone());
        let make = move || {
            let b = map.bytes();
            let pieces: Vec<&[u8]> =
                dec.pieces.iter().map(|&(at, n)| &b[(at - base) as usize..(at - base) as usize + n]).collect();
            let mut out = AlignedBytes::zeroed(dec.len);
            if let Err(m) = (dec.decode)(&pieces, out.bytes_mut()) {
                panic!("{}: decoding a tensor checked when the file was opened: {m}", dec.path.display());
            }
            out
        };
        LazyBytes { len, make: Box::new(make), done: OnceLock::new(), origin: None, encoded: Some(e), under: None }
    }

    /// Records where the bytes `make` computes can be read from (and how to fix them up).
    pub fn with_origin(mut self, origin: Option<TensorOrigin>) -> Self {
        self.origin = origin;
        self
    }

    /// Whether the bytes have been computed.
    pub fn is_computed(&self) -> bool {
        self.done.get().is_some()
    }
}

impl ByteSource for LazyBytes {
    fn bytes(&self) -> &[u8] {
        let b = self.done.get_or_init(|| (self.make)()).bytes();
        assert_eq!(b.len(), self.len, "a lazy tensor computed the wrong number of bytes");
        b
    }

    fn encoded(&self) -> Option<&Arc<Encoded>> {
        self.encoded.as_ref()
    }

    /// Releases what the stored tensor under these bytes maps (the computed bytes, if
    /// kept, stay: others may hold views of them).
    fn release(&self, _range: std::ops::Range<usize>) {
        if let Some(t) = &self.under {
            t.src.release(t.offset..t.offset + t.len);
        }
    }

    fn compute_unkept(&self) -> Option<AlignedBytes> {
        (!self.is_computed()).then(|| (self.make)())
    }
}

/// Weight rows per CPU panel (`strata::quant::panels`): a panel tensor's bytes are its
/// panels one after another, each the same length as its rows stored.
pub const PANEL_ROWS: usize = 16;

/// A typed, row-major view of `shape` elements of `dtype` at `offset` in `src`.
/// Always aligned for its dtype (constructors copy when the file is not).
#[derive(Clone)]
pub struct HostTensor {
    src: Arc<dyn ByteSource>,
    offset: usize,
    len: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    origin: Option<TensorOrigin>,
    /// Whether the bytes are the CPU's 16-row panels (`strata::quant::panels`) rather
    /// than rows as stored.
    panels: bool,
}

impl std::fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let panels = if self.panels { ", panels" } else { "" };
        write!(f, "HostTensor({:?}, {:?}{panels})", self.dtype, self.shape)
    }
}

impl HostTensor {
    /// A view of `src[offset..offset + len]`. The caller has checked that the range lies
    /// inside `src` and that `len == dtype.bytes_for(numel(shape))`. Copies into an
    /// aligned buffer when the range is not aligned for `dtype`.
    pub fn new(src: Arc<dyn ByteSource>, offset: usize, len: usize, dtype: DType, shape: Vec<usize>) -> Self {
        debug_assert_eq!(Some(len), dtype.bytes_for(shape.iter().product::<usize>()));
        let origin = src.file().map(|(path, base)| TensorOrigin {
            path: path.clone(),
            offset: base + offset as u64,
            fixup: None,
        });
        let ptr = src.bytes()[offset..].as_ptr() as usize;
        if ptr.is_multiple_of(dtype.align()) {
            return HostTensor { src, offset, len, dtype, shape, origin, panels: false };
        }
        let copy = AlignedBytes::from_slice(&src.bytes()[offset..offset + len]);
        HostTensor { src: Arc::new(copy), offset: 0, len, dtype, shape, origin, panels: false }
    }

    /// A tensor over `src` computed on first use ([`LazyBytes`], 64-byte aligned, so
    /// no check or copy is needed here and nothing is computed yet).
    pub fn lazy(src: Arc<LazyBytes>, dtype: DType, shape: Vec<usize>) -> Self {
        let len = src.len;
        debug_assert_eq!(Some(len), dtype.bytes_for(shape.iter().product::<usize>()));
        let origin = src.origin.clone();
        HostTensor { src, offset: 0, len, dtype, shape, origin, panels: false }
    }

    /// An owned f32 tensor (for small things such as the demo model or tests).
    pub fn from_f32(data: &[f32], shape: Vec<usize>) -> Self {
        let mut buf = AlignedBytes::zeroed(data.len() * 4);
        for (dst, v) in buf.bytes_mut().chunks_exact_mut(4).zip(data) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
        let len = data.len() * 4;
        HostTensor { src: Arc::new(buf), offset: 0, len, dtype: DType::F32, shape, origin: None, panels: false }
    }

    /// Where the bytes are stored in a file, when they are (memory-mapped sources, and
    /// tensors derived from them by a [`Fixup`]); `None` for computed or decompressed
    /// tensors, which cannot be streamed.
    pub fn origin(&self) -> Option<&TensorOrigin> {
        self.origin.as_ref()
    }

    /// How the whole tensor is stored encoded (see [`Encoded`]), when it is.
    pub fn encoded(&self) -> Option<&Arc<Encoded>> {
        self.src.encoded().filter(|e| self.offset == 0 && self.len == e.len)
    }

    /// The device copy of the bytes this tensor views (see [`ByteSource::device_copy`]),
    /// and the tensor's byte offset in it.
    pub fn device_copy(&self) -> Option<(Arc<dyn std::any::Any + Send + Sync>, usize)> {
        self.src.device_copy().map(|d| (d, self.offset))
    }

    /// Bytes of the tensor (`bytes().len()` without touching them).
    pub fn byte_len(&self) -> usize {
        self.len
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.src.bytes()[self.offset..self.offset + self.len]
    }

    /// The elements as f32 values; panics if the dtype is not F32.
    pub fn as_f32(&self) -> &[f32] {
        assert_eq!(self.dtype, DType::F32);
        cast_slice(self.bytes())
    }

    /// The raw 16-bit elements (F16 or BF16 bit patterns); panics for F32.
    pub fn as_u16(&self) -> &[u16] {
        assert!(matches!(self.dtype, DType::F16 | DType::BF16));
        cast_slice(self.bytes())
    }

    /// Rows `start..start + n` of a 2-D tensor, sharing its bytes (whole rows, so any
    /// block type): how a fused projection (Phi-3's QKV) is split. Panels split at whole
    /// panels ([`PANEL_ROWS`]: each panel holds its rows' bytes, no other's) and stay
    /// panels. `None` when the rows are out of range, cut a panel, or the stored bytes
    /// need a fixup that moves rows.
    pub fn rows(&self, start: usize, n: usize) -> Option<HostTensor> {
        let [total, cols] = self.shape[..] else { return None };
        let cuts_panel = self.panels && !(start.is_multiple_of(PANEL_ROWS) && n.is_multiple_of(PANEL_ROWS));
        let moved = cuts_panel || self.origin.as_ref().is_some_and(|o| o.fixup.is_some());
        if start.checked_add(n)? > total || total == 0 || moved {
            return None;
        }
        let row_bytes = self.len / total;
        let view = if self.panels { HostTensor::new_panels } else { HostTensor::new };
        let mut t = view(self.src.clone(), self.offset + start * row_bytes, n * row_bytes, self.dtype, vec![n, cols]);
        t.origin = self
            .origin
            .as_ref()
            .filter(|_| !self.panels)
            .map(|o| TensorOrigin { offset: o.offset + (start * row_bytes) as u64, ..o.clone() });
        Some(t)
    }

    /// A tensor whose stored bytes are transformed by `fixup` on first use (and by the
    /// streamer after each read), keeping where they are stored.
    pub fn with_fixup(&self, fixup: Fixup) -> HostTensor {
        assert!(!self.panels, "fixups apply to tensors as stored, not to panels");
        let (len, rows) = (self.len, self.shape.first().copied().unwrap_or(1));
        let origin = self.origin.as_ref().map(|o| TensorOrigin { fixup: Some(fixup), ..o.clone() });
        let stored = self.clone();
        let mut lazy = LazyBytes::new(len, move || {
            let mut buf = AlignedBytes::zeroed(len);
            fixup.apply(stored.bytes(), buf.bytes_mut(), rows);
            buf
        })
        .with_origin(origin);
        lazy.under = Some(Box::new(self.clone()));
        HostTensor::lazy(Arc::new(lazy), self.dtype, self.shape.clone())
    }

    /// A view of `src[offset..offset + len]` that holds `shape` as 16-row panels
    /// (`strata::quant::panels`): what the streamer repacked in place. As [`Self::new`]
    /// otherwise.
    pub fn new_panels(src: Arc<dyn ByteSource>, offset: usize, len: usize, dtype: DType, shape: Vec<usize>) -> Self {
        HostTensor { panels: true, origin: None, ..HostTensor::new(src, offset, len, dtype, shape) }
    }

    /// Whether the bytes are 16-row panels (`strata::quant::panels`).
    pub fn is_panels(&self) -> bool {
        self.panels
    }

    /// This weight with its bytes rearranged by `repack(stored, out)` into a buffer of
    /// the same length, marked as 16-row panels (what `strata::quant::panels::to_panels`
    /// builds). The copy keeps no file origin (the streamer reads the stored tensor, and
    /// the backend repacks what it read).
    pub fn repacked(&self, repack: impl FnOnce(&[u8], &mut [u8])) -> HostTensor {
        let mut buf = AlignedBytes::zeroed(self.len);
        // Bytes computed on first use (llama's un-permuted Q/K rows) are computed once
        // for the repack and not kept beside the panels.
        let fresh = (self.offset == 0).then(|| self.src.compute_unkept()).flatten().filter(|b| b.len == self.len);
        let stored = fresh.as_ref().map_or_else(|| self.bytes(), |b| b.bytes());
        repack(stored, buf.bytes_mut());
        // The stored bytes are not read again for the matmul: a mapped file's pages go.
        self.src.release(self.offset..self.offset + self.len);
        let (len, dtype, shape) = (self.len, self.dtype, self.shape.clone());
        HostTensor { src: Arc::new(buf), offset: 0, len, dtype, shape, origin: None, panels: true }
    }
}

/// Reinterprets aligned little-endian bytes as a slice of `T` (f32, u16).
fn cast_slice<T: Copy>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size) && (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()));
    // SAFETY: length and alignment checked above; T is a plain number type valid for
    // every bit pattern, and the bytes outlive the returned borrow.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misaligned_views_are_copied() {
        let raw: Vec<u8> = (0u8..16).collect();
        let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(&raw));
        let t = HostTensor::new(src, 1, 8, DType::F32, vec![2]);
        assert_eq!(t.bytes(), &raw[1..9]);
        assert_eq!(t.as_f32()[0], f32::from_le_bytes([1, 2, 3, 4]));
    }

    /// A weight computed on first use (llama's un-permuted Q/K rows) is computed for its
    /// repack without being kept, and the repacked bytes come from the computed rows.
    #[test]
    fn repacking_a_lazy_weight_keeps_no_copy() {
        let (m, k) = (32, 64);
        let raw: Vec<u8> = (0..m * k / 32 * 18).map(|i| (i * 7 % 251) as u8).collect();
        let stored = HostTensor::new(Arc::new(AlignedBytes::from_slice(&raw)), 0, raw.len(), DType::Q4_0, vec![m, k]);
        let lazy = stored.with_fixup(Fixup::UnpermuteRows { n_heads: 2 });
        let p = lazy.repacked(|from, to| to.copy_from_slice(from));
        assert!(p.is_panels());
        let computed = lazy.src.compute_unkept().expect("the lazy bytes were not kept");
        assert_eq!(p.bytes(), computed.bytes());
        assert_ne!(p.bytes(), stored.bytes(), "the fixup moved rows");
    }
}
