//! Prefill (many activation rows) quantized matmul as a packed integer GEMM.
//!
//! Every weight format reduces, per group of `G` values (32, or 16 for Q6_K), to
//! unsigned levels `u` with `w = dw · u − mw`, where `dw` and `mw` are per row and group
//! (Q4_0: `dw = d`, `mw = 8d`; Q4_K: `dw = d · sc_j`, `mw = dmin · m_j`; ...). The
//! activations are quantized as llama.cpp quantizes them for the format (Q8_0, Q8_1 or
//! Q8_K, see [`super::activation_dtype`]), giving levels `q` with a scale `da` per group.
//! Then
//!
//! ```text
//! Σ w·x = Σ_groups da · (dw · Σ u·q − off · Σ q)      formats with an integer offset
//!       = Σ_groups da · dw · Σ u·q − mw · (da · Σ q)     formats with a min
//! ```
//!
//! A panel of 16 weight rows is unpacked once into `u8` levels interleaved four values
//! per row (one 64-byte register holds 4 values of each of the 16 rows), and each
//! activation row meets it as broadcast 4-byte words in `vpdpbusd`: 16 outputs per
//! instruction, no horizontal sums, and the weights are unpacked once per call however
//! many activation rows there are. The integer sums are exact; only the per-group float
//! scaling differs in rounding from the single-row dot products.

use rayon::ThreadPool;
use rayon::prelude::*;

use super::{QK, QK_K, q8_0, q8_1, q8_k, zeroed_blocks};
use strata_tensor::tensor::DType;

/// Weight rows per panel: one 512-bit register of i32 lanes.
pub const PANEL: usize = 16;

/// How a weight format maps onto the GEMM (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmFormat {
    /// Values per scale group: 32, or 16 (Q6_K).
    pub group: usize,
    /// Whether the weights carry a min (`mw`, against the activations' `da · Σ q`) rather
    /// than an integer offset subtracted from the levels.
    pub has_min: bool,
    /// The integer offset of the levels (8, 16, 32 or 128; 0 for formats with a min).
    pub offset: i32,
}

impl GemmFormat {
    pub fn of(dtype: DType) -> Option<GemmFormat> {
        let (group, has_min, offset) = match dtype {
            DType::Q4_0 => (32, false, 8),
            DType::Q5_0 => (32, false, 16),
            DType::Q8_0 => (32, false, 128),
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => (32, true, 0),
            DType::Q6_K => (16, false, 32),
            _ => return None,
        };
        Some(GemmFormat { group, has_min, offset })
    }
}

/// `unsafe fn(w, row_bytes, lanes, nb, levels, dw, mw)`: unpacks `nb` blocks of the
/// `lanes` (1..=16) weight rows at `w`, `w + row_bytes`, ... into `levels`
/// (`group / 4` 64-byte lines per group, lane `i` of a line holding 4 consecutive values
/// of row `i`), `dw` and `mw` (16 f32 per group). Lanes past `lanes` are zero.
///
/// # Safety
/// `w + i·row_bytes` must point at `nb` readable weight blocks for `i < lanes`;
/// `levels`, `dw` and `mw` must be 64-byte aligned and hold every group of `nb` blocks;
/// the CPU must have the kernel's features.
pub type UnpackFn =
    unsafe fn(w: *const u8, row_bytes: usize, lanes: usize, nb: usize, levels: *mut u8, dw: *mut f32, mw: *mut f32);

/// What one micro-kernel call reads and writes: an unpacked panel (as [`UnpackFn`]
/// wrote it, `groups` groups) against activation rows `r` = 0.. whose levels start at
/// `qs + r·qs_stride` and whose per-group `da`, `ioff` and `ms` start at `r·g_stride`;
/// writes `out[r·os + i]` for the lanes set in `mask`.
pub struct MicroTile {
    pub levels: *const u8,
    pub dw: *const f32,
    pub mw: *const f32,
    pub groups: usize,
    pub qs: *const i8,
    pub qs_stride: usize,
    pub da: *const f32,
    pub ioff: *const i32,
    pub ms: *const f32,
    pub g_stride: usize,
    /// Consecutive groups that share one activation scale `da` (8 or 16 in a Q8_K block,
    /// else 1); divides `groups`.
    pub per: usize,
    pub out: *mut f32,
    pub os: usize,
    pub mask: u16,
}

/// # Safety
/// Every pointer of the [`MicroTile`] must be valid for the rows, groups and lanes it
/// describes; `levels`, `dw` and `mw` 64-byte aligned; the CPU must have the features.
pub type MicroFn = unsafe fn(&MicroTile);

/// The unpacker and the micro-kernels (index: activation rows − 1; as many as the
/// instruction set has registers for) of one format and instruction set.
#[derive(Clone, Copy)]
pub struct GemmKernel {
    pub fmt: GemmFormat,
    pub unpack: UnpackFn,
    pub micro: &'static [MicroFn],
}

/// The 32-value block formats, which the unpackers take as a const parameter.
pub mod block32 {
    pub const Q4_0: u8 = 0;
    pub const Q5_0: u8 = 1;
    pub const Q8_0: u8 = 2;
    pub const Q4_1: u8 = 3;
    pub const Q5_1: u8 = 4;

    /// Per format: block bytes, offset of `qs`, offset of `qh` (0: none), whether the
    /// second f16 of the block is a min `m` (`w = d·u + m`).
    pub const fn layout(f: u8) -> (usize, usize, usize, bool) {
        match f {
            Q4_0 => (18, 2, 0, false),
            Q5_0 => (22, 6, 2, false),
            Q8_0 => (34, 2, 0, false),
            Q4_1 => (20, 4, 0, true),
            _ => (24, 8, 4, true),
        }
    }
}

/// Quantized activation rows laid out for the GEMM: the levels of each row contiguous,
/// and per row and group the scale `da` and the correction: `ioff = −off · Σ q` for
/// offset formats, and for formats with a min `ms`, the f32 that `mw · ms · da` is the
/// min term with (`Σ q`; for Q8_1 `s / d`, so the product is the block's own `s`).
pub struct PackedActs {
    pub groups: usize,
    /// Consecutive groups that share one `da` (a Q8_K block's groups, else 1).
    pub per: usize,
    pub qs: Vec<i8>,
    pub da: Vec<f32>,
    pub ioff: Vec<i32>,
    pub ms: Vec<f32>,
}

impl PackedActs {
    pub const fn empty() -> PackedActs {
        PackedActs { groups: 0, per: 1, qs: Vec::new(), da: Vec::new(), ioff: Vec::new(), ms: Vec::new() }
    }

    /// Quantizes `rows` rows of `x` (each `k` values) the way the single-row dot
    /// products do for `dtype` weights, reusing this value's buffers.
    pub fn fill(&mut self, pool: &ThreadPool, dtype: DType, fmt: GemmFormat, x: &[f32], rows: usize, k: usize) {
        let act = super::activation_dtype(dtype).expect("GEMM formats have an activation format");
        let g = fmt.group;
        let groups = k / g;
        let per = if act == DType::Q8_K { QK_K / g } else { 1 };
        // The AVX-512 or AVX2 quantizers where the CPU has them, else the scalar
        // references (bit for bit the same).
        // Every element is written below; the resizes only allocate when growing.
        let p = self;
        (p.groups, p.per) = (groups, per);
        p.qs.resize(rows * k, 0);
        p.da.resize(rows * groups, 0.0);
        p.ioff.resize(rows * groups, 0);
        p.ms.resize(rows * groups, 0.0);
        type RowParts<'a> = ((((&'a [f32], &'a mut [i8]), &'a mut [f32]), &'a mut [i32]), &'a mut [f32]);
        let one = |((((xr, qs), da), ioff), ms): RowParts<'_>| {
            match act {
                DType::Q8_0 => {
                    let mut b = zeroed_blocks::<q8_0::BlockQ8_0>(k / QK);
                    super::simd::act_q8_0(xr, &mut b);
                    for (j, blk) in b.iter().enumerate() {
                        qs[j * QK..(j + 1) * QK].copy_from_slice(&blk.qs);
                        let sum: i32 = blk.qs.iter().map(|&q| q as i32).sum();
                        da[j] = blk.d.to_f32();
                        ioff[j] = -fmt.offset * sum;
                    }
                }
                DType::Q8_1 => {
                    let mut b = zeroed_blocks::<q8_1::BlockQ8_1>(k / QK);
                    super::simd::act_q8_1(xr, &mut b);
                    for (j, blk) in b.iter().enumerate() {
                        qs[j * QK..(j + 1) * QK].copy_from_slice(&blk.qs);
                        da[j] = blk.d.to_f32();
                        // The reference dot products take the min term from the block's
                        // `s` (`d · Σ q` rounded to f16); `ms · da` gives it back.
                        ms[j] = if da[j] == 0.0 { 0.0 } else { blk.s.to_f32() / da[j] };
                    }
                }
                DType::Q8_K => {
                    let mut b = zeroed_blocks::<q8_k::BlockQ8K>(k / QK_K);
                    super::simd::act_q8_k(xr, &mut b);
                    let per = QK_K / g;
                    for (j, blk) in b.iter().enumerate() {
                        qs[j * QK_K..(j + 1) * QK_K].copy_from_slice(&blk.qs);
                        for s in 0..per {
                            let sums = &blk.bsums[s * g / 16..(s + 1) * g / 16];
                            let sum: i32 = sums.iter().map(|&v| v as i32).sum();
                            da[j * per + s] = blk.d;
                            ioff[j * per + s] = -fmt.offset * sum;
                            ms[j * per + s] = sum as f32;
                        }
                    }
                }
                other => unreachable!("{other:?} is not an activation format"),
            }
        };
        let x = &x[..rows * k];
        if rows > 1 {
            pool.install(|| {
                x.par_chunks(k)
                    .zip(p.qs.par_chunks_mut(k))
                    .zip(p.da.par_chunks_mut(groups))
                    .zip(p.ioff.par_chunks_mut(groups))
                    .zip(p.ms.par_chunks_mut(groups))
                    .for_each(one)
            });
        } else {
            x.chunks(k)
                .zip(p.qs.chunks_mut(k))
                .zip(p.da.chunks_mut(groups))
                .zip(p.ioff.chunks_mut(groups))
                .zip(p.ms.chunks_mut(groups))
                .for_each(one);
        }
    }
}
