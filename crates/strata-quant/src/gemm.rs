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

pub mod kernel;
pub use kernel::{GemmFormat, GemmKernel, MicroFn, MicroTile, PANEL, UnpackFn, block32};

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
