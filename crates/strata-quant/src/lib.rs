//! Block-quantized weight formats: GGML's Q4_0 ... Q8_K and MXFP4 (layouts exactly as
//! `ggml-common.h`) and Strata's own `AffineQ4` and `I8`. One file per format with its
//! `#[repr(C)]` block, a size assertion, a scalar reference `dequantize`, a quantizer
//! where one is needed, and the integer dot product llama.cpp uses for matmul (weights
//! against Q8_0/Q8_1/Q8_K-quantized activations). SIMD/CUDA paths are tested against
//! these references; the references are tested against gguf-py in
//! `tests/it/quant_golden.rs` (fixtures from `tools/make_quant_fixtures.py`).
//!
//! Blocks are read straight out of little-endian files, so this module only builds on
//! little-endian targets.

use rayon::ThreadPool;
use rayon::prelude::*;

use strata_tensor::tensor::{DType, HostTensor};

pub mod affine_q4;
pub mod gemm;
pub mod int8;
pub mod isa;
pub mod mxfp4;
pub mod panels;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub mod simd;
#[doc(hidden)]
pub mod testing;

pub use simd::QuantKernel;

#[cfg(not(target_endian = "little"))]
compile_error!("quant blocks are cast from little-endian bytes");

/// Values per block of the 32-value formats (`QK4_0`, `QK8_0`, ...).
pub const QK: usize = 32;
/// Values per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// A quantized block that can be viewed in place in a file's bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have no padding (their size assertion equals the sum
/// of their fields) and only hold fields valid for every bit pattern (`u8`, `i8`, `i16`,
/// `f16`, `f32` and arrays of them), so any `size_of::<Self>()` bytes are a valid block.
pub unsafe trait Block: Copy + Send + Sync + 'static {
    /// The [`DType`] whose `block_bytes()` this block's size equals.
    const DTYPE: DType;
}

/// Why bytes could not be viewed as blocks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CastError {
    #[error("{dtype:?}: {len} bytes is not a whole number of {block}-byte blocks")]
    Length { dtype: DType, len: usize, block: usize },
    #[error("{dtype:?}: address {addr:#x} is not aligned to {align}")]
    Align { dtype: DType, addr: usize, align: usize },
}

/// Why a Strata-format quantizer refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error("value {value} at index {index} is not finite")]
    NotFinite { index: usize, value: f32 },
    #[error("value {value} at index {index} is outside the f16 range the format stores")]
    OutOfRange { index: usize, value: f32 },
}

/// Views `bytes` as blocks: the length must be a whole number of blocks and the start
/// aligned for `B`.
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Result<&[B], CastError> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(CastError::Length { dtype: B::DTYPE, len: bytes.len(), block: size });
    }
    let addr = bytes.as_ptr() as usize;
    if !addr.is_multiple_of(align_of::<B>()) {
        return Err(CastError::Align { dtype: B::DTYPE, addr, align: align_of::<B>() });
    }
    // SAFETY: length and alignment checked above; `Block` guarantees every bit pattern is
    // a valid `B` and there is no padding; the borrow keeps the bytes alive.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// The raw bytes of `blocks` (what a file holds).
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: `Block` types have no padding, so every byte is initialised; u8 has no
    // alignment needs and the borrow keeps the blocks alive.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), size_of_val(blocks)) }
}

/// `n` all-zero blocks (a valid value of every `Block`), for quantizers to fill.
pub fn zeroed_blocks<B: Block>(n: usize) -> Vec<B> {
    (0..n)
        .map(|_| {
            // SAFETY: `Block` types are valid for every bit pattern, all-zero included.
            unsafe { std::mem::zeroed::<B>() }
        })
        .collect()
}

/// Calls `f` with the first `n` blocks of `bytes`, in place when aligned and from an
/// aligned copy otherwise. Panics when `bytes` holds fewer than `n` blocks.
fn with_blocks<B: Block, R>(bytes: &[u8], n: usize, f: impl FnOnce(&[B]) -> R) -> R {
    let need = n * size_of::<B>();
    assert!(bytes.len() >= need, "{:?}: {} bytes hold fewer than {n} blocks", B::DTYPE, bytes.len());
    let bytes = &bytes[..need];
    match cast_blocks::<B>(bytes) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let mut copy = zeroed_blocks::<B>(n);
            // SAFETY: `copy` holds exactly `need` bytes of plain-old-data blocks, and the
            // source and destination do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), copy.as_mut_ptr().cast::<u8>(), need) };
            f(&copy)
        }
    }
}

/// GGML's `nearest_int`: rounds to nearest (ties to even) via the 1.5·2²³ trick, valid
/// for |f| ≤ 4194303.
#[inline]
pub fn nearest_int(f: f32) -> i32 {
    debug_assert!(f.abs() <= 4_194_303.0, "nearest_int({f})");
    let v = f + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Dequantizes the leading blocks of `blocks` (format `dtype`) into `out`, whose length
/// is a whole number of blocks.
pub fn dequantize(dtype: DType, blocks: &[u8], out: &mut [f32]) {
    assert!(out.len().is_multiple_of(dtype.block_size()), "{dtype:?}: {} values is not whole blocks", out.len());
    let n = out.len() / dtype.block_size();
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => unreachable!("plain floats are read directly"),
        DType::Q4_0 => with_blocks(blocks, n, |b| q4_0::dequantize(b, out)),
        DType::Q4_1 => with_blocks(blocks, n, |b| q4_1::dequantize(b, out)),
        DType::Q5_0 => with_blocks(blocks, n, |b| q5_0::dequantize(b, out)),
        DType::Q5_1 => with_blocks(blocks, n, |b| q5_1::dequantize(b, out)),
        DType::Q8_0 => with_blocks(blocks, n, |b| q8_0::dequantize(b, out)),
        DType::Q8_1 => with_blocks(blocks, n, |b| q8_1::dequantize(b, out)),
        DType::Q4_K => with_blocks(blocks, n, |b| q4_k::dequantize(b, out)),
        DType::Q5_K => with_blocks(blocks, n, |b| q5_k::dequantize(b, out)),
        DType::Q6_K => with_blocks(blocks, n, |b| q6_k::dequantize(b, out)),
        DType::Q8_K => with_blocks(blocks, n, |b| q8_k::dequantize(b, out)),
        DType::Mxfp4 => with_blocks(blocks, n, |b| mxfp4::dequantize(b, out)),
        DType::AffineQ4 => with_blocks(blocks, n, |b| affine_q4::dequantize(b, out)),
        DType::I8 => with_blocks(blocks, n, |b| int8::dequantize(b, out)),
    }
}

/// A tensor of any format read as f32: float formats widen, block formats dequantize
/// (16-row panels put back as stored first). A trait here, beside the formats, because
/// the tensor type sits below them.
pub trait ReadF32 {
    /// Element `i` converted to f32.
    fn get_f32(&self, i: usize) -> f32;
    /// Elements `start..start + out.len()` converted to f32 into `out`. For block formats
    /// `start` and `out.len()` are whole blocks.
    fn read_f32(&self, start: usize, out: &mut [f32]);
    /// The whole tensor as f32 (copies; for small tensors such as norms and biases).
    fn to_f32_vec(&self) -> Vec<f32>;
}

impl ReadF32 for HostTensor {
    fn get_f32(&self, i: usize) -> f32 {
        let bs = self.dtype.block_size();
        let mut block = vec![0.0; bs];
        self.read_f32(i / bs * bs, &mut block);
        block[i % bs]
    }

    fn read_f32(&self, start: usize, out: &mut [f32]) {
        match self.dtype {
            DType::F32 => out.copy_from_slice(&self.as_f32()[start..start + out.len()]),
            DType::F16 => {
                for (o, &b) in out.iter_mut().zip(&self.as_u16()[start..]) {
                    *o = half::f16::from_bits(b).to_f32();
                }
            }
            DType::BF16 => {
                for (o, &b) in out.iter_mut().zip(&self.as_u16()[start..]) {
                    *o = half::bf16::from_bits(b).to_f32();
                }
            }
            block if self.is_panels() => {
                // Row by row, each put back as stored first.
                let k = self.shape[1];
                let mut row = vec![0u8; block.bytes_for(k).expect("a panel row is whole blocks")];
                let (mut at, mut done) = (start, 0);
                while done < out.len() {
                    let (r, c) = (at / k, at % k);
                    let n = (k - c).min(out.len() - done);
                    panels::row(block, self.bytes(), k, r, &mut row);
                    let mut vals = vec![0.0; k];
                    dequantize(block, &row, &mut vals);
                    out[done..done + n].copy_from_slice(&vals[c..c + n]);
                    (at, done) = (at + n, done + n);
                }
            }
            block => {
                let bs = block.block_size();
                assert!(start.is_multiple_of(bs), "{block:?}: reads start on a block boundary");
                let from = start / bs * block.block_bytes();
                dequantize(block, &self.bytes()[from..], out);
            }
        }
    }

    fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.numel()];
        self.read_f32(0, &mut out);
        out
    }
}

/// Parts of a weight row range the one-row kernels read side by side: their four-row
/// forms ([`simd::StreamsFn`]) and the panels' decode walk.
pub const STREAMS: usize = 4;

/// The format activations are quantized to for the integer dot products with `dtype`
/// weights (llama.cpp's `vec_dot_type`), or `None` for formats without one here.
pub fn activation_dtype(dtype: DType) -> Option<DType> {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::Mxfp4 => Some(DType::Q8_0),
        DType::Q4_1 | DType::Q5_1 => Some(DType::Q8_1),
        DType::Q4_K | DType::Q5_K | DType::Q6_K => Some(DType::Q8_K),
        _ => None,
    }
}

/// Views `n` blocks at the start of `bytes` mutably; panics when misaligned or short.
fn cast_blocks_mut<B: Block>(bytes: &mut [u8], n: usize) -> &mut [B] {
    let need = n * size_of::<B>();
    assert!(bytes.len() >= need && (bytes.as_ptr() as usize).is_multiple_of(align_of::<B>()));
    // SAFETY: length and alignment checked; every bit pattern is a valid `B` (`Block`),
    // and the exclusive borrow carries over.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) }
}

/// Formats `strata convert --quant` can produce, by the names it accepts.
pub const CONVERT_TARGETS: [(&str, DType); 10] = [
    ("f32", DType::F32),
    ("f16", DType::F16),
    ("bf16", DType::BF16),
    ("q8_0", DType::Q8_0),
    ("q4_0", DType::Q4_0),
    ("q4_k", DType::Q4_K),
    ("q6_k", DType::Q6_K),
    ("mxfp4", DType::Mxfp4),
    ("affine_q4", DType::AffineQ4),
    ("int8", DType::I8),
];

/// The conversion target called `name` (case-insensitive), or an error listing them.
pub fn convert_target(name: &str) -> Result<DType, String> {
    CONVERT_TARGETS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, d)| *d).ok_or_else(|| {
        let names: Vec<_> = CONVERT_TARGETS.iter().map(|(n, _)| *n).collect();
        format!("unknown quantization `{name}`; choose one of {}", names.join(", "))
    })
}

/// The bytes of a row-major `[rows, cols]` matrix `x` in `dtype` (one of
/// [`CONVERT_TARGETS`]); `cols` must be whole blocks of `dtype`. Rows are quantized in
/// parallel on `pool`; the results do not depend on the split.
pub fn quantize_matrix(
    pool: &ThreadPool,
    dtype: DType,
    x: &[f32],
    rows: usize,
    cols: usize,
) -> Result<strata_tensor::tensor::AlignedBytes, QuantError> {
    assert_eq!(x.len(), rows * cols, "quantize_matrix: {} values for {rows} x {cols}", x.len());
    let row_bytes = dtype.bytes_for(cols).unwrap_or_else(|| panic!("{cols} columns is not whole {dtype:?} blocks"));
    let mut out = strata_tensor::tensor::AlignedBytes::zeroed(rows * row_bytes);
    let nb = cols / dtype.block_size();
    let one = |(xr, br): (&[f32], &mut [u8])| -> Result<(), QuantError> {
        match dtype {
            DType::F32 => br.copy_from_slice(f32_bytes(xr)),
            DType::F16 => br
                .chunks_exact_mut(2)
                .zip(xr)
                .for_each(|(b, v)| b.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes())),
            DType::BF16 => br
                .chunks_exact_mut(2)
                .zip(xr)
                .for_each(|(b, v)| b.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes())),
            DType::Q8_0 => q8_0::quantize(xr, cast_blocks_mut(br, nb)),
            DType::Q4_0 => q4_0::quantize(xr, cast_blocks_mut(br, nb)),
            DType::Q4_K => q4_k::quantize(xr, cast_blocks_mut(br, nb)),
            DType::Q6_K => q6_k::quantize(xr, cast_blocks_mut(br, nb)),
            DType::Mxfp4 => mxfp4::quantize(xr, cast_blocks_mut(br, nb)),
            DType::AffineQ4 => affine_q4::quantize(xr, cast_blocks_mut(br, nb))?,
            DType::I8 => int8::quantize_rows(xr, cols, cast_blocks_mut(br, nb))?,
            other => panic!("{other:?} is not a conversion target"),
        }
        Ok(())
    };
    let bytes = out.bytes_mut();
    let result: Result<(), QuantError> = pool.install(|| {
        x.par_chunks(cols).zip(bytes.par_chunks_mut(row_bytes)).enumerate().try_for_each(|(r, pair)| {
            one(pair).map_err(|e| match e {
                QuantError::NotFinite { index, value } => QuantError::NotFinite { index: r * cols + index, value },
                QuantError::OutOfRange { index, value } => QuantError::OutOfRange { index: r * cols + index, value },
            })
        })
    });
    result.map(|()| out)
}

/// The little-endian bytes of `x`.
fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte is initialised; u8 needs no alignment;
    // the crate only builds on little-endian targets.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), size_of_val(x)) }
}

/// Helpers shared by the per-format unit tests.
#[cfg(test)]
pub mod testutil {
    /// The error a Q4_1/Q5_1 × Q8_1 integer dot may carry beyond float rounding: each
    /// weight block's offset `m` multiplies the activation's `s`, which is `d·Σq` rounded
    /// to f16 with an unrounded `d` (`ms` holds the weight blocks' `m`).
    pub fn q8_1_s_slop(ms: impl Iterator<Item = f32>, acts: &[super::q8_1::BlockQ8_1]) -> f32 {
        let ulp = 2f32.powi(-10);
        ms.zip(acts).map(|(m, a)| m.abs() * (a.s.to_f32().abs() * ulp + 32.0 * 127.0 * a.d.to_f32() * ulp)).sum()
    }

    /// Quantizes `x` with `quantize` into whole `B` blocks and dequantizes them back:
    /// the blocks and the values they stand for.
    pub fn quantize_roundtrip<B: super::Block>(
        x: &[f32],
        quantize: impl FnOnce(&[f32], &mut [B]),
        dequantize: fn(&[B], &mut [f32]),
    ) -> (Vec<B>, Vec<f32>) {
        let mut b = super::zeroed_blocks(x.len() / B::DTYPE.block_size());
        quantize(x, &mut b);
        let mut y = vec![0.0; x.len()];
        dequantize(&b, &mut y);
        (b, y)
    }

    pub use strata_tensor::rng::Rng;

    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (*x as f64) * (*y as f64)).sum::<f64>() as f32
    }

    /// Σ|a_i·b_i|: the scale the float error of a dot product is relative to.
    pub fn abs_dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(31.49), 31);
    }

    #[test]
    fn cast_checks_length_and_alignment() {
        let buf = strata_tensor::tensor::AlignedBytes::from_slice(&[0u8; 300]);
        use strata_tensor::tensor::ByteSource;
        let bytes = buf.bytes();
        assert_eq!(cast_blocks::<q8_0::BlockQ8_0>(&bytes[..68]).map(|b| b.len()), Ok(2));
        assert!(matches!(cast_blocks::<q8_0::BlockQ8_0>(&bytes[..67]), Err(CastError::Length { .. })));
        assert!(matches!(cast_blocks::<q8_0::BlockQ8_0>(&bytes[1..69]), Err(CastError::Align { .. })));
        assert!(matches!(cast_blocks::<int8::BlockI8>(&bytes[2..38]), Err(CastError::Align { .. })));
        assert!(matches!(cast_blocks::<q8_k::BlockQ8K>(&bytes[..146]), Err(CastError::Length { .. })));
        assert_eq!(cast_blocks::<q8_k::BlockQ8K>(&bytes[..292]).map(|b| b.len()), Ok(1));
    }

    #[test]
    fn misaligned_bytes_dequantize_like_aligned_ones() {
        let mut rng = testutil::Rng::new(7);
        let x = rng.vec(64, 1.0);
        let mut blocks = zeroed_blocks::<q8_0::BlockQ8_0>(2);
        q8_0::quantize(&x, &mut blocks);
        let mut raw = vec![0u8; 1];
        raw.extend_from_slice(blocks_as_bytes(&blocks));
        // AlignedBytes starts 64-aligned, so offset 1 is misaligned for f16.
        let shifted = strata_tensor::tensor::AlignedBytes::from_slice(&raw);
        use strata_tensor::tensor::ByteSource;
        assert!(cast_blocks::<q8_0::BlockQ8_0>(&shifted.bytes()[1..]).is_err());
        let (mut a, mut b) = (vec![0.0; 64], vec![0.0; 64]);
        dequantize(DType::Q8_0, blocks_as_bytes(&blocks), &mut a);
        dequantize(DType::Q8_0, &shifted.bytes()[1..], &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn dispatch_covers_every_block_dtype() {
        use DType::*;
        for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K, Mxfp4, AffineQ4, I8] {
            let buf = strata_tensor::tensor::AlignedBytes::zeroed(dtype.block_bytes() * 2);
            use strata_tensor::tensor::ByteSource;
            let mut out = vec![1.0f32; dtype.block_size() * 2];
            dequantize(dtype, buf.bytes(), &mut out);
            assert!(out.iter().all(|v| *v == 0.0), "{dtype:?}: zero blocks are zeros");
        }
    }
}
