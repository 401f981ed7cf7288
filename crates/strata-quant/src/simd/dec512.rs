//! AVX-512 VBMI decode (one activation row) dot products for Q4_0, Q4_1 and Q8_0, the
//! formats whose weight blocks (18, 20 and 34 bytes) are not register-aligned. One
//! `vpermt2b` gathers the levels of 4 Q4_0 or Q4_1 blocks into a register (two those of
//! 4 Q8_0 blocks) and one `vpermb` their f16 scales (a second their Q4_1 mins), so every
//! block takes 4 lanes of an accumulator; the activation row is
//! packed once per call to match, so each block's integer offset (−8 or −128 times the
//! activation sum) starts the `vpdpbusd` accumulator, its scale multiplies the block's
//! lanes, and a Q4_1 block's min meets the activation block's `s` in one lane. About 3
//! vector instructions per Q4_0 block instead of 10, which is what single-row decode
//! needs to keep up with memory. Unavailable off x86-64.

use crate::QK;
use crate::q8_0::BlockQ8_0;
use crate::q8_1::BlockQ8_1;
use strata_tensor::tensor::DType;

/// Whether this CPU runs the kernels here (the AVX-512 tier, which includes VBMI).
pub fn available() -> bool {
    super::avx512::available()
}

/// Weight blocks per packed activation group, and the group's packed bytes: 4 blocks'
/// levels (128 bytes), their first lanes (64) and their scales (64).
const PER: usize = 4;
const GROUP_BYTES: usize = 256;

/// The packed activation row for `dtype` weights from its activation blocks (`act`, the
/// row's Q8_0 blocks, or Q8_1 for Q4_1), in groups of 4 (see the module docs); a last
/// group of fewer blocks is padded with zero blocks, which add nothing. `None` when
/// `dtype` has no kernel here or `act` is not whole aligned blocks of its activation
/// format.
pub fn pack(dtype: DType, act: &[u8]) -> Option<Vec<u32>> {
    let offset = match dtype {
        // Q4_1 levels are unsigned already: no offset, and each block's `s` (for its
        // min) in its first lane.
        DType::Q4_1 => {
            let blocks = crate::cast_blocks::<BlockQ8_1>(act).ok()?;
            return Some(pack_blocks(blocks, |b| (b.d.to_f32(), &b.qs, b.s.to_f32().to_le_bytes())));
        }
        DType::Q4_0 => 8,
        DType::Q8_0 => 128,
        _ => return None,
    };
    let blocks = crate::cast_blocks::<BlockQ8_0>(act).ok()?;
    let corr = |b: &BlockQ8_0| (-offset * b.qs.iter().map(|&q| q as i32).sum::<i32>()).to_le_bytes();
    Some(pack_blocks(blocks, |b| (b.d.to_f32(), &b.qs, corr(b))))
}

/// [`pack`] over blocks `view` gives as (scale, levels, first lane's bytes).
fn pack_blocks<B: crate::Block>(blocks: &[B], view: impl Fn(&B) -> (f32, &[i8; QK], [u8; 4])) -> Vec<u32> {
    let mut out = vec![0u32; blocks.len().div_ceil(PER) * GROUP_BYTES / 4];
    // SAFETY: `out` holds at least that many initialised bytes; u8 needs no alignment.
    let buf = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 4) };
    for (g, blks) in blocks.chunks(PER).enumerate() {
        let p = &mut buf[g * GROUP_BYTES..(g + 1) * GROUP_BYTES];
        let (y, rest) = p.split_at_mut(128);
        let (corr, da) = rest.split_at_mut(64);
        for (j, b) in blks.iter().enumerate() {
            let (d, qs, first) = view(b);
            // The first halves of the 4 blocks, then the second halves (a Q4 block's low
            // and high nibbles; a Q8_0 block's first and last 16 levels).
            for t in 0..QK / 2 {
                y[16 * j + t] = qs[t] as u8;
                y[64 + 16 * j + t] = qs[16 + t] as u8;
            }
            corr[16 * j..16 * j + 4].copy_from_slice(&first);
            for l in 0..4 {
                da[16 * j + 4 * l..16 * j + 4 * l + 4].copy_from_slice(&d.to_le_bytes());
            }
        }
    }
    out
}

/// The decode dot product over a [`pack`]ed activation row, as a
/// [`DotFn`](super::DotFn) (`a` is the packed row).
pub fn dot_fn(dtype: DType) -> Option<super::DotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        match dtype {
            DType::Q4_0 => Some(imp::dot::<{ imp::Q4_0 }> as super::DotFn),
            DType::Q4_1 => Some(imp::dot::<{ imp::Q4_1 }> as super::DotFn),
            DType::Q8_0 => Some(imp::dot::<{ imp::Q8_0 }> as super::DotFn),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        None
    }
}

/// Four weight rows `w_stride` bytes apart against one [`pack`]ed row, read side by side
/// (four memory streams), each result bit-identical to [`dot_fn`]'s.
pub fn streams_fn(dtype: DType) -> Option<super::StreamsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        // SAFETY (each): the `StreamsFn` contract is the tile's, for four weight rows and
        // one packed activation row.
        let f: super::StreamsFn = match dtype {
            DType::Q4_0 => |w, ws, a, nb| unsafe { tile::<Q4_0, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
            DType::Q4_1 => |w, ws, a, nb| unsafe { tile::<Q4_1, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
            DType::Q8_0 => |w, ws, a, nb| unsafe { tile::<Q8_0, 4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
            _ => return None,
        };
        Some(f)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        None
    }
}

/// The decode dot product over `R` [`pack`]ed rows at once (see
/// [`RowsFn`](super::RowsFn)), each bit-identical to [`dot_fn`]'s.
pub fn rows_fn(dtype: DType) -> Option<super::RowsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        match dtype {
            DType::Q4_0 => Some(super::RowsFn { pairs: super::pair_fns!(tile, Q4_0), ..super::rows_fn!(rows, Q4_0) }),
            DType::Q4_1 => Some(super::RowsFn { pairs: super::pair_fns!(tile, Q4_1), ..super::rows_fn!(rows, Q4_1) }),
            DType::Q8_0 => Some(super::RowsFn { pairs: super::pair_fns!(tile, Q8_0), ..super::rows_fn!(rows, Q8_0) }),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    /// Bytes ahead of the current weight group to prefetch.
    const PREFETCH: usize = 2048;

    /// The formats of [`tile`].
    pub const Q4_0: u8 = 0;
    pub const Q4_1: u8 = 1;
    pub const Q8_0: u8 = 2;

    /// `vpermt2b` indices gathering 16 bytes at byte `at` of each of 4 blocks of `bb`
    /// bytes into one register, and indices putting block `j`'s f16 at byte 0 (its scale)
    /// and at byte 2 (a Q4_1 min) in word lanes `4j ..`.
    const fn indices(bb: usize, at: usize) -> ([u8; 64], [u8; 64], [u8; 64]) {
        let (mut qs, mut d, mut m) = ([0u8; 64], [0u8; 64], [0u8; 64]);
        let mut i = 0;
        while i < 64 {
            qs[i] = ((i / 16) * bb + at + i % 16) as u8;
            i += 1;
        }
        let mut w = 0;
        while w < 16 {
            let j = w / 4;
            d[2 * w] = (j * bb) as u8;
            d[2 * w + 1] = (j * bb + 1) as u8;
            m[2 * w] = (j * bb + 2) as u8;
            m[2 * w + 1] = (j * bb + 3) as u8;
            w += 1;
        }
        (qs, d, m)
    }
    static Q4_0_IDX: ([u8; 64], [u8; 64], [u8; 64]) = indices(18, 2);
    static Q4_1_IDX: ([u8; 64], [u8; 64], [u8; 64]) = indices(20, 4);
    /// Q8_0: the first 16 levels of 4 blocks from the group's first 128 bytes, with the
    /// scales; then the last 16 from its bytes 8..136 (levels at byte 18 of a block are at
    /// byte 10 counted from 8).
    static Q8_0_IDX: ([u8; 64], [u8; 64], [u8; 64]) = indices(34, 2);
    static Q8_0_HI: ([u8; 64], [u8; 64], [u8; 64]) = indices(34, 10);

    /// A format `F` weight row against a packed row: Q4_0 against Q8_0 activations, Q4_1
    /// against Q8_1, Q8_0 against Q8_0.
    ///
    /// # Safety
    /// As for [`DotFn`](crate::simd::DotFn) with `a` a packed row; a CPU with the
    /// features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    pub unsafe fn dot<const F: u8>(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { rows::<F, 1>(w, a, 0, nb)[0] }
    }

    /// Each accumulator's sum (in loops: closures here would not share the target
    /// features, and a map over the accumulators slowed every tile by a quarter).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn sums<const W: usize, const R: usize>(acc: [[__m512; R]; W]) -> [[f32; R]; W] {
        let mut out = [[0f32; R]; W];
        for j in 0..W {
            for r in 0..R {
                out[j][r] = _mm512_reduce_add_ps(acc[j][r]);
            }
        }
        out
    }

    /// Load masks for `n` bytes of a group: its first 64 and the rest.
    #[inline(always)]
    fn masks(n: usize) -> (u64, u64) {
        let m = |b: usize| if b >= 64 { u64::MAX } else { (1u64 << b) - 1 };
        (m(n), m(n.saturating_sub(64)))
    }

    /// [`dot`] against `R` packed rows at once: each weight group is unpacked once, and
    /// each row takes exactly the operations [`dot`] (`R = 1`) takes, so each result is
    /// bit-identical to that row's one-row dot.
    ///
    /// # Safety
    /// As for [`dot`], for every row in `a`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    #[inline]
    pub unsafe fn rows<const F: u8, const R: usize>(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { tile::<F, 1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`rows`] for `W` weight rows `w_stride` bytes apart: each activation group is loaded
    /// once for all of them, and each (weight row, activation row) pair still takes
    /// exactly [`dot`]'s operations.
    ///
    /// A group is 4 blocks, each taking 4 lanes of an accumulator: two registers of
    /// levels (a Q4 group's low and high nibbles, gathered by one `vpermt2b` from its
    /// first 128 bytes; a Q8_0 group's first and last 16 levels of each block, gathered
    /// from bytes 0..128 and 8..136 and moved to unsigned by adding 128) meet the packed
    /// row's two level registers in `vpdpbusd`, started from the row's offsets (−8 or
    /// −128 times each block's activation sum, in its first lane).
    ///
    /// A Q4_1 block is `d·q + m`, so against an activation block (scale `da`, levels `y`,
    /// `s = da·Σy`) it gives `d·da·Σ q·y + m·s`: its levels need no offset, and the packed
    /// row's first lane of each block holds `s` (the others 0) for the min.
    ///
    /// # Safety
    /// As for [`dot`], for every weight row and every activation row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    #[inline]
    pub unsafe fn tile<const F: u8, const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let a: [*const u8; R] = std::array::from_fn(|r| a.wrapping_add(r * stride));
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let min = F == Q4_1;
        // Block bytes, index tables and the mask of a whole group's bytes past the first 64.
        let (bb, idx, rest) = match F {
            Q4_0 => (18, &Q4_0_IDX, 0xFF),
            Q4_1 => (20, &Q4_1_IDX, 0xFFFF),
            _ => (34, &Q8_0_IDX, u64::MAX),
        };
        // Whole groups, then a last one of fewer blocks with its loads masked to them (as
        // counted from byte 0 and from byte 8).
        let (full, groups) = (nb / 4, nb.div_ceil(4));
        let n = (nb - 4 * full) * bb;
        let (last, last8) = (masks(n), masks(n.saturating_sub(8)));
        let (nib, flip) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(-128));
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        // SAFETY: loads stay inside the caller's `nb` weight blocks of each weight row (a
        // whole group's bytes; a last group's masked to its blocks) and the packed rows
        // (padded to whole groups); prefetches never fault.
        unsafe {
            let qidx = _mm512_loadu_si512(idx.0.as_ptr().cast());
            let didx = _mm512_loadu_si512(idx.1.as_ptr().cast());
            let midx = _mm512_loadu_si512(idx.2.as_ptr().cast());
            let hidx = _mm512_loadu_si512(Q8_0_HI.0.as_ptr().cast());
            for g in 0..groups {
                let mut lo = [_mm512_setzero_si512(); W];
                let mut hi = [_mm512_setzero_si512(); W];
                let mut dw = [_mm512_setzero_ps(); W];
                let mut mw = [_mm512_setzero_ps(); W];
                for j in 0..W {
                    let wp = w[j].add(4 * bb * g);
                    // A group's 72, 80 or 136 bytes: two lines or three.
                    for line in 0..if F == Q8_0 { 3 } else { 2 } {
                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * line).cast());
                    }
                    let (v0, v1) = match g < full {
                        true => (_mm512_loadu_si512(wp.cast()), _mm512_maskz_loadu_epi8(rest, wp.add(64).cast())),
                        false => (
                            _mm512_maskz_loadu_epi8(last.0, wp.cast()),
                            _mm512_maskz_loadu_epi8(last.1, wp.add(64).cast()),
                        ),
                    };
                    if F == Q8_0 {
                        let (v2, v3) = match g < full {
                            true => (_mm512_loadu_si512(wp.add(8).cast()), _mm512_loadu_si512(wp.add(72).cast())),
                            false => (
                                _mm512_maskz_loadu_epi8(last8.0, wp.add(8).cast()),
                                _mm512_maskz_loadu_epi8(last8.1, wp.add(72).cast()),
                            ),
                        };
                        lo[j] = _mm512_xor_si512(_mm512_permutex2var_epi8(v0, qidx, v1), flip);
                        hi[j] = _mm512_xor_si512(_mm512_permutex2var_epi8(v2, hidx, v3), flip);
                    } else {
                        let q = _mm512_permutex2var_epi8(v0, qidx, v1);
                        lo[j] = _mm512_and_si512(q, nib);
                        hi[j] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib);
                    }
                    dw[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(v0, didx, v1)));
                    if min {
                        mw[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(midx, v0)));
                    }
                }
                for r in 0..R {
                    let ap = a[r].add(super::GROUP_BYTES * g);
                    let (y0, y1) = (_mm512_loadu_si512(ap.cast()), _mm512_loadu_si512(ap.add(64).cast()));
                    // The offsets (Q4_0, Q8_0) or the activation blocks' `s` (Q4_1).
                    let first = _mm512_loadu_si512(ap.add(128).cast());
                    let da = _mm512_loadu_ps(ap.add(192).cast());
                    for j in 0..W {
                        let mut i = if min { _mm512_setzero_si512() } else { first };
                        i = _mm512_dpbusd_epi32(i, lo[j], y0);
                        i = _mm512_dpbusd_epi32(i, hi[j], y1);
                        let s = _mm512_mul_ps(dw[j], da);
                        acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[j][r]);
                        if min {
                            acc[j][r] = _mm512_fmadd_ps(mw[j], _mm512_castsi512_ps(first), acc[j][r]);
                        }
                    }
                }
            }
            sums(acc)
        }
    }
}
