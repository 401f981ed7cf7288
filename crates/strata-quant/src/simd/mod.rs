//! Integer dot products of one weight row against one quantized activation row, per
//! instruction set: AVX-512 (BW + VNNI), AVX2 (+FMA, F16C) and the scalar `vec_dot_*`
//! references, picked once at run time ([`QuantKernel::best`]).
//!
//! Every kernel is a [`DotFn`]: `w` points at `nb` weight blocks (any alignment), `a` at
//! the `nb` matching activation blocks (`Q8_0`, `Q8_1` or `Q8_K`, see
//! [`super::activation_dtype`]). Integer sums are exact in every path, so SIMD results
//! differ from the scalar reference only by float summation order. Formats without a
//! SIMD kernel fall back to the scalar reference inside a SIMD table.

/// The safe entry points of an activation-quantizer module (`act512`, `act256`): each
/// checks the module's `available()` and the lengths, then calls its `imp`.
macro_rules! activation_quantizers {
    () => {
        /// `x` (a whole number of 32-value blocks) as Q8_0 blocks.
        pub fn q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
            assert!(available() && x.len() == out.len() * 32);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: features checked above; lengths match.
            unsafe {
                imp::q8_0(x, out)
            }
        }

        /// `x` as Q8_1 blocks (Q8_0 levels plus `s = d · Σq`).
        pub fn q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
            assert!(available() && x.len() == out.len() * 32);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: features checked above; lengths match.
            unsafe {
                imp::q8_1(x, out)
            }
        }

        /// `x` (a whole number of 256-value blocks) as Q8_K blocks.
        pub fn q8_k(x: &[f32], out: &mut [BlockQ8K]) {
            assert!(available() && x.len() == out.len() * 256);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: features checked above; lengths match.
            unsafe {
                imp::q8_k(x, out)
            }
        }
    };
}
use activation_quantizers;

/// An activation-quantizer module's `imp::q8_0` and `imp::q8_1` for the target features
/// named: each block through the module's `block32` (its levels, unrounded `d` and
/// `Σ q`).
macro_rules! block_quantizers {
    ($features:literal) => {
        /// # Safety
        /// The features named; `x.len() == 32 · out.len()`.
        #[target_feature(enable = $features)]
        pub unsafe fn q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
            for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
                // SAFETY: a whole block of input and of output.
                let (d, _) = unsafe { block32(xb.as_ptr(), b.qs.as_mut_ptr()) };
                b.d = f16::from_f32(d);
            }
        }

        /// # Safety
        /// The features named; `x.len() == 32 · out.len()`.
        #[target_feature(enable = $features)]
        pub unsafe fn q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
            for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
                // SAFETY: a whole block of input and of output.
                let (d, sum) = unsafe { block32(xb.as_ptr(), b.qs.as_mut_ptr()) };
                b.d = f16::from_f32(d);
                b.s = f16::from_f32(sum as f32 * d);
            }
        }
    };
}
use block_quantizers;

pub mod act256;
pub mod act512;
mod avx2;
mod avx512;
pub mod dec512;
pub mod gemm256;
pub mod gemm512;

use std::sync::OnceLock;

use super::gemm::kernel::GemmKernel;
use super::{QK_K, mxfp4, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, q8_1, q8_k, with_blocks};
use strata_tensor::tensor::DType;

/// `unsafe fn(w, a, nb) -> Σ w·a` over `nb` weight blocks.
///
/// # Safety
/// `w` must point at `nb · block_bytes` readable bytes of the weight format; `a` at `nb`
/// activation blocks of the matching activation format, aligned for that block type;
/// the CPU must have the kernel's features.
pub type DotFn = unsafe fn(w: *const u8, a: *const u8, nb: usize) -> f32;

/// Four weight rows `w_stride` bytes apart against one activation row, the rows read side
/// by side (four memory streams at once): each result bit-identical to the format's
/// one-row [`DotFn`] (the decode kernel's, with a packed row, where it has one).
///
/// # Safety
/// As for [`DotFn`], for each of the four weight rows.
pub type StreamsFn = unsafe fn(w: *const u8, w_stride: usize, a: *const u8, nb: usize) -> [f32; 4];

/// A weight row's dot products with several activation rows at once (8, 4 or 2; the
/// rows `stride` bytes apart), each bit-identical to the one-row [`DotFn`]'s for that
/// row: the weights are unpacked once for all of them (decode batches). Safety as for
/// [`DotFn`], for every row.
#[derive(Clone, Copy)]
pub struct RowsFn {
    pub r8: unsafe fn(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; 8],
    pub r4: unsafe fn(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; 4],
    pub r2: unsafe fn(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; 2],
    /// Two weight rows (`w_stride` bytes apart) against 8, 4 or 2 activation rows, where
    /// the format has them: each activation group is loaded once for both.
    pub pairs: Option<PairFns>,
}

/// Two weight rows (`w_stride` bytes apart) against `N` activation rows (`stride`
/// apart), each result bit-identical to its one-row dot.
pub type PairFn<const N: usize> =
    unsafe fn(w: *const u8, w_stride: usize, a: *const u8, stride: usize, nb: usize) -> [[f32; N]; 2];

#[derive(Clone, Copy)]
pub struct PairFns {
    pub p8: PairFn<8>,
    pub p4: PairFn<4>,
    pub p2: PairFn<2>,
}

/// The [`PairFns`] of a kernel generic over its weight and activation row counts.
macro_rules! pair_fns {
    ($f:ident) => {
        Some($crate::simd::PairFns { p8: $f::<2, 8>, p4: $f::<2, 4>, p2: $f::<2, 2> })
    };
    ($f:ident, $fmt:expr) => {
        Some($crate::simd::PairFns { p8: $f::<{ $fmt }, 2, 8>, p4: $f::<{ $fmt }, 2, 4>, p2: $f::<{ $fmt }, 2, 2> })
    };
}
pub(crate) use pair_fns;

/// A [`RowsFn`] from a kernel generic over its row count.
/// `rows_fn` (several activation rows at once, and two weight rows at once) and
/// `streams_fn` (four weight rows side by side) of an instruction-set module whose `imp`
/// has the tiles `dot32_tile`/`dot32_rows`, `q4k_tile`/`dot_q4k_rows` and
/// `q6k_tile_rows`/`q6k_rows`.
macro_rules! tile_tables {
    () => {
        /// [`dot_fn`] over several activation rows at once, and two weight rows at once.
        pub(super) fn rows_fn(dtype: DType) -> Option<super::RowsFn> {
            #[cfg(target_arch = "x86_64")]
            {
                use super::{RowsFn, pair_fns, rows_fn};
                use imp::*;
                Some(match dtype {
                    DType::Q4_0 => RowsFn { pairs: pair_fns!(dot32_tile, Q4_0), ..rows_fn!(dot32_rows, Q4_0) },
                    DType::Q5_0 => RowsFn { pairs: pair_fns!(dot32_tile, Q5_0), ..rows_fn!(dot32_rows, Q5_0) },
                    DType::Q8_0 => RowsFn { pairs: pair_fns!(dot32_tile, Q8_0), ..rows_fn!(dot32_rows, Q8_0) },
                    DType::Q4_1 => RowsFn { pairs: pair_fns!(dot32_tile, Q4_1), ..rows_fn!(dot32_rows, Q4_1) },
                    DType::Q5_1 => RowsFn { pairs: pair_fns!(dot32_tile, Q5_1), ..rows_fn!(dot32_rows, Q5_1) },
                    DType::Mxfp4 => RowsFn { pairs: pair_fns!(dot32_tile, MXFP4), ..rows_fn!(dot32_rows, MXFP4) },
                    DType::Q4_K => RowsFn { pairs: pair_fns!(q4k_tile, false), ..rows_fn!(dot_q4k_rows, false) },
                    DType::Q5_K => RowsFn { pairs: pair_fns!(q4k_tile, true), ..rows_fn!(dot_q4k_rows, true) },
                    DType::Q6_K => RowsFn { pairs: pair_fns!(q6k_tile_rows), ..rows_fn!(q6k_rows) },
                    _ => return None,
                })
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = dtype;
                None
            }
        }

        /// [`dot_fn`] over four weight rows at once, read side by side.
        pub(super) fn streams_fn(dtype: DType) -> Option<super::StreamsFn> {
            #[cfg(target_arch = "x86_64")]
            {
                use imp::*;
                // SAFETY (each): the `StreamsFn` contract is the tile's, for four weight
                // rows and one activation row.
                Some(match dtype {
                    DType::Q4_0 => |w, ws, a, nb| unsafe { dot32_tile::<Q4_0, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Q5_0 => |w, ws, a, nb| unsafe { dot32_tile::<Q5_0, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Q8_0 => |w, ws, a, nb| unsafe { dot32_tile::<Q8_0, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Q4_1 => |w, ws, a, nb| unsafe { dot32_tile::<Q4_1, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Q5_1 => |w, ws, a, nb| unsafe { dot32_tile::<Q5_1, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Mxfp4 => |w, ws, a, nb| unsafe { dot32_tile::<MXFP4, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Q4_K => |w, ws, a, nb| unsafe { q4k_tile::<false, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Q5_K => |w, ws, a, nb| unsafe { q4k_tile::<true, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    DType::Q6_K => |w, ws, a, nb| unsafe { q6k_tile_rows::<4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
                    _ => return None,
                })
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = dtype;
                None
            }
        }
    };
}
pub(crate) use tile_tables;

macro_rules! rows_fn {
    ($f:ident) => {
        $crate::simd::RowsFn { r8: $f::<8>, r4: $f::<4>, r2: $f::<2>, pairs: None }
    };
    ($f:ident, $fmt:expr) => {
        $crate::simd::RowsFn { r8: $f::<{ $fmt }, 8>, r4: $f::<{ $fmt }, 4>, r2: $f::<{ $fmt }, 2>, pairs: None }
    };
}
pub(crate) use rows_fn;

/// The quantized-matmul kernel variants. Public so tests and benchmarks can run each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantKernel {
    /// The scalar `vec_dot_*` references; always available.
    Scalar,
    /// AVX2 + FMA + F16C (`vpmaddubsw`).
    Avx2,
    /// AVX-512 F/BW/VL + VNNI + VBMI (`vpdpbusd`, `vpdpwssd`, `vpermt2b`): Ice Lake,
    /// Sapphire Rapids, Zen 4 and later.
    Avx512,
}

impl QuantKernel {
    pub const ALL: [QuantKernel; 3] = [QuantKernel::Scalar, QuantKernel::Avx2, QuantKernel::Avx512];

    /// The fastest variant this CPU supports (detected once).
    pub fn best() -> QuantKernel {
        static BEST: OnceLock<QuantKernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            [QuantKernel::Avx512, QuantKernel::Avx2]
                .into_iter()
                .find(|k| k.is_available())
                .unwrap_or(QuantKernel::Scalar)
        })
    }

    /// Whether this CPU has the features the variant needs.
    pub fn is_available(self) -> bool {
        match self {
            QuantKernel::Scalar => true,
            QuantKernel::Avx2 => avx2::available(),
            QuantKernel::Avx512 => avx512::available(),
        }
    }

    /// Whether this variant has its own kernel for weights of `dtype` (otherwise it runs
    /// the scalar reference for them).
    pub fn has_simd(self, dtype: DType) -> bool {
        match self {
            QuantKernel::Scalar => false,
            QuantKernel::Avx2 => avx2::dot_fn(dtype).is_some(),
            QuantKernel::Avx512 => avx512::dot_fn(dtype).is_some(),
        }
    }

    /// The dot product for `dtype` weights, or `None` when `dtype` has no integer dot
    /// (it goes through the dequantizing path). Panics if the CPU lacks the features.
    pub fn dot_fn(self, dtype: DType) -> Option<DotFn> {
        assert!(self.is_available(), "the {self:?} quant kernel needs CPU features this machine lacks");
        let simd = match self {
            QuantKernel::Scalar => None,
            QuantKernel::Avx2 => avx2::dot_fn(dtype),
            QuantKernel::Avx512 => avx512::dot_fn(dtype),
        };
        simd.or_else(|| scalar_dot_fn(dtype))
    }

    /// The single-row (decode) dot product for `dtype` weights that takes a
    /// [`dec512::pack`]ed activation row, where this variant has one. Panics if the CPU
    /// lacks the features.
    pub fn decode_fn(self, dtype: DType) -> Option<DotFn> {
        assert!(self.is_available(), "the {self:?} quant kernel needs CPU features this machine lacks");
        match self {
            QuantKernel::Avx512 if dec512::available() => dec512::dot_fn(dtype),
            _ => None,
        }
    }

    /// The four-weight-row form of the one-row kernel ([`Self::decode_fn`] where that
    /// exists, else [`Self::dot_fn`]), where it has one.
    pub fn streams_fn(self, dtype: DType) -> Option<StreamsFn> {
        assert!(self.is_available(), "the {self:?} quant kernel needs CPU features this machine lacks");
        match self {
            QuantKernel::Avx512 if dec512::available() && dec512::streams_fn(dtype).is_some() => {
                dec512::streams_fn(dtype)
            }
            QuantKernel::Avx512 => avx512::streams_fn(dtype),
            QuantKernel::Avx2 => avx2::streams_fn(dtype),
            QuantKernel::Scalar => None,
        }
    }

    /// The several-row form of [`decode_fn`](Self::decode_fn) (with `true`: it takes
    /// packed rows) or else of [`dot_fn`](Self::dot_fn), where this variant has one.
    pub fn rows_fn(self, dtype: DType) -> Option<(RowsFn, bool)> {
        assert!(self.is_available(), "the {self:?} quant kernel needs CPU features this machine lacks");
        match self {
            QuantKernel::Avx512 if dec512::available() && dec512::rows_fn(dtype).is_some() => {
                dec512::rows_fn(dtype).map(|f| (f, true))
            }
            QuantKernel::Avx512 => avx512::rows_fn(dtype).map(|f| (f, false)),
            QuantKernel::Avx2 => avx2::rows_fn(dtype).map(|f| (f, false)),
            QuantKernel::Scalar => None,
        }
    }

    /// The packed-GEMM kernels for `dtype` weights, where this variant has them.
    /// Panics if the CPU lacks the features.
    pub fn gemm(self, dtype: DType) -> Option<GemmKernel> {
        assert!(self.is_available(), "the {self:?} quant kernel needs CPU features this machine lacks");
        match self {
            QuantKernel::Avx512 => gemm512::kernel(dtype),
            QuantKernel::Avx2 => gemm256::kernel(dtype),
            QuantKernel::Scalar => None,
        }
    }
}

/// The scalar references behind the [`DotFn`] signature.
fn scalar_dot_fn(dtype: DType) -> Option<DotFn> {
    /// # Safety
    /// As for [`DotFn`].
    unsafe fn dot<W: super::Block, A: super::Block>(
        w: *const u8,
        a: *const u8,
        nb: usize,
        f: fn(&[W], &[A]) -> f32,
    ) -> f32 {
        // SAFETY: the caller guarantees `nb` weight blocks at `w` and `nb` aligned
        // activation blocks at `a`; `with_blocks` copies the weights if misaligned.
        let (wb, ab) = unsafe {
            (std::slice::from_raw_parts(w, nb * size_of::<W>()), std::slice::from_raw_parts(a.cast::<A>(), nb))
        };
        with_blocks::<W, f32>(wb, nb, |wb| f(wb, ab))
    }
    macro_rules! scalar {
        ($w:ty, $a:ty, $f:path) => {{
            unsafe fn k(w: *const u8, a: *const u8, nb: usize) -> f32 {
                // SAFETY: forwarded from the caller of this `DotFn`.
                unsafe { dot::<$w, $a>(w, a, nb, $f) }
            }
            Some(k as DotFn)
        }};
    }
    match dtype {
        DType::Q4_0 => scalar!(q4_0::BlockQ4_0, q8_0::BlockQ8_0, q4_0::vec_dot_q4_0_q8_0),
        DType::Q4_1 => scalar!(q4_1::BlockQ4_1, q8_1::BlockQ8_1, q4_1::vec_dot_q4_1_q8_1),
        DType::Q5_0 => scalar!(q5_0::BlockQ5_0, q8_0::BlockQ8_0, q5_0::vec_dot_q5_0_q8_0),
        DType::Q5_1 => scalar!(q5_1::BlockQ5_1, q8_1::BlockQ8_1, q5_1::vec_dot_q5_1_q8_1),
        DType::Q8_0 => scalar!(q8_0::BlockQ8_0, q8_0::BlockQ8_0, q8_0::vec_dot_q8_0_q8_0),
        DType::Q4_K => scalar!(q4_k::BlockQ4K, q8_k::BlockQ8K, q4_k::vec_dot_q4_k_q8_k),
        DType::Q5_K => scalar!(q5_k::BlockQ5K, q8_k::BlockQ8K, q5_k::vec_dot_q5_k_q8_k),
        DType::Q6_K => scalar!(q6_k::BlockQ6K, q8_k::BlockQ8K, q6_k::vec_dot_q6_k_q8_k),
        DType::Mxfp4 => scalar!(mxfp4::BlockMxfp4, q8_0::BlockQ8_0, mxfp4::vec_dot_mxfp4_q8_0),
        _ => None,
    }
}

/// Quantizes activation rows `x` to `act` (Q8_0, Q8_1 or Q8_K) blocks in `out`, with
/// AVX-512 or AVX2 where the CPU has it; the results equal the scalar references bit for
/// bit.
pub fn quantize_activations(act: DType, x: &[f32], out: &mut [u8]) {
    let n = x.len() / act.block_size();
    match act {
        DType::Q8_0 => act_q8_0(x, super::cast_blocks_mut::<q8_0::BlockQ8_0>(out, n)),
        DType::Q8_1 => act_q8_1(x, super::cast_blocks_mut::<q8_1::BlockQ8_1>(out, n)),
        DType::Q8_K => act_q8_k(x, super::cast_blocks_mut::<q8_k::BlockQ8K>(out, n)),
        other => unreachable!("{other:?} is not an activation format"),
    }
}

/// `q8_0::quantize` with the widest quantizer this CPU runs (the same bits).
pub fn act_q8_0(x: &[f32], b: &mut [q8_0::BlockQ8_0]) {
    match (act512::available(), act256::available()) {
        (true, _) => act512::q8_0(x, b),
        (_, true) => act256::q8_0(x, b),
        _ => q8_0::quantize(x, b),
    }
}

/// `q8_1::quantize` with the widest quantizer this CPU runs (the same bits).
pub fn act_q8_1(x: &[f32], b: &mut [q8_1::BlockQ8_1]) {
    match (act512::available(), act256::available()) {
        (true, _) => act512::q8_1(x, b),
        (_, true) => act256::q8_1(x, b),
        _ => q8_1::quantize(x, b),
    }
}

/// `q8_k::quantize` with the widest quantizer this CPU runs (the same bits).
pub fn act_q8_k(x: &[f32], b: &mut [q8_k::BlockQ8K]) {
    match (act512::available(), act256::available()) {
        (true, _) => act512::q8_k(x, b),
        (_, true) => act256::q8_k(x, b),
        _ => q8_k::quantize(x, b),
    }
}

/// The f16s at `p`, `p + stride`, `p + 2·stride` and `p + 3·stride` as four f32 lanes
/// (the scales, or mins, of four consecutive blocks in one conversion).
///
/// # Safety
/// The four 2-byte locations are readable; the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
#[inline]
pub unsafe fn f16x4(p: *const u8, stride: usize) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::{_mm_cvtph_ps, _mm_cvtsi64_si128};
    // SAFETY: the caller's contract.
    unsafe {
        let h = |k: usize| p.add(k * stride).cast::<u16>().read_unaligned() as u64;
        _mm_cvtph_ps(_mm_cvtsi64_si128((h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48) as i64))
    }
}

/// The scales 2^(e − 128) of the MXFP4 blocks at `p`, `p + stride`, `p + 2·stride` and
/// `p + 3·stride` (their exponent bytes `e`) as four f32 lanes.
///
/// # Safety
/// The four bytes are readable.
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn e8m0x4(p: *const u8, stride: usize) -> std::arch::x86_64::__m128 {
    // SAFETY: the caller's contract.
    let s = |k: usize| mxfp4::E8M0_HALF[unsafe { *p.add(k * stride) } as usize];
    // SAFETY: SSE is part of x86-64.
    unsafe { std::arch::x86_64::_mm_setr_ps(s(0), s(1), s(2), s(3)) }
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K block, unpacked with
/// ggml's `utmp` word trick (equal to [`q4_k::get_scale_min_k4`] for j = 0..8).
#[inline]
pub fn scales_mins_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let mut u = [word(0), word(1), word(2), 0];
    u[3] = ((u[2] >> 4) & K2) | (((u[1] >> 6) & K3) << 4);
    let uaux = u[1] & K1;
    u[1] = (u[2] & K2) | (((u[0] >> 6) & K3) << 4);
    u[2] = uaux;
    u[0] &= K1;
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    sc[..4].copy_from_slice(&u[0].to_le_bytes());
    sc[4..].copy_from_slice(&u[1].to_le_bytes());
    m[..4].copy_from_slice(&u[2].to_le_bytes());
    m[4..].copy_from_slice(&u[3].to_le_bytes());
    (sc, m)
}

/// Σ_j m_j · (bsums[2j] + bsums[2j+1]) for a K-quant with per-32 mins.
#[inline]
pub fn k_min_sum(mins: &[u8; 8], bsums: &[i16; QK_K / 16]) -> i32 {
    (0..8).map(|j| mins[j] as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn scales_mins_match_get_scale_min_k4() {
        let mut rng = Rng::new(21);
        for _ in 0..200 {
            let mut s = [0u8; 12];
            s.copy_from_slice(&rng.bytes(12));
            let (sc, m) = scales_mins_k4(&s);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), q4_k::get_scale_min_k4(j, &s), "j = {j}, {s:?}");
            }
        }
    }

    #[test]
    fn best_is_available_and_scalar_always_is() {
        assert!(QuantKernel::Scalar.is_available());
        assert!(QuantKernel::best().is_available());
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let cap = crate::isa::avx2();
            assert_eq!(QuantKernel::Avx2.is_available(), cap && has!("avx2") && has!("fma") && has!("f16c"));
        }
    }
}
