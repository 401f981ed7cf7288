//! AVX-512 VBMI decode (one activation row) dot products for Q4_0 and Q8_0, the
//! formats whose weight blocks (18 and 34 bytes) are not register-aligned. One
//! `vpermt2b` gathers the levels of 4 Q4_0 (or 2 Q8_0) blocks into a register and one
//! `vpermb` their f16 scales; the activation row is packed once per call to match, so
//! each block's integer offset (−8 or −128 times the activation sum) starts the
//! `vpdpbusd` accumulator and its scale multiplies the block's lanes. About 3 vector
//! instructions per Q4_0 block instead of 10, which is what single-row decode needs to
//! keep up with memory. Unavailable off x86-64.

use crate::quant::QK;
use crate::quant::q8_0::BlockQ8_0;
use crate::tensor::DType;

/// Whether this CPU runs the kernels here (the AVX-512 tier, which includes VBMI).
pub(crate) fn available() -> bool {
    super::avx512::available()
}

/// Weight blocks per packed activation group, and the group's packed bytes.
fn geometry(dtype: DType) -> Option<(usize, usize)> {
    match dtype {
        DType::Q4_0 => Some((4, 256)),
        DType::Q8_0 => Some((2, 192)),
        _ => None,
    }
}

/// The packed activation row for `dtype` weights from its Q8_0 blocks: whole groups
/// packed (see the module docs), then the leftover blocks as Q8_0 for the tail.
/// `None` when `dtype` has no kernel here.
pub(crate) fn pack(dtype: DType, blocks: &[BlockQ8_0]) -> Option<Vec<u32>> {
    let (per, bytes) = geometry(dtype)?;
    let groups = blocks.len() / per;
    let tail = &blocks[groups * per..];
    let mut out = vec![0u32; (groups * bytes + size_of_val(tail)).div_ceil(4)];
    // SAFETY: `out` holds at least that many initialised bytes; u8 needs no alignment.
    let buf = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 4) };
    let sum = |b: &BlockQ8_0| b.qs.iter().map(|&q| q as i32).sum::<i32>();
    for (g, blks) in blocks.chunks_exact(per).enumerate() {
        let p = &mut buf[g * bytes..(g + 1) * bytes];
        let (y, rest) = p.split_at_mut(if per == 4 { 128 } else { 64 });
        let (corr, da) = rest.split_at_mut(64);
        let lanes = 16 / per;
        for (j, b) in blks.iter().enumerate() {
            if per == 4 {
                // Low halves of the 4 blocks, then high halves (the nibble order).
                for t in 0..QK / 2 {
                    y[16 * j + t] = b.qs[t] as u8;
                    y[64 + 16 * j + t] = b.qs[16 + t] as u8;
                }
            } else {
                for t in 0..QK {
                    y[32 * j + t] = b.qs[t] as u8;
                }
            }
            let off = if per == 4 { 8 } else { 128 };
            corr[4 * lanes * j..4 * lanes * j + 4].copy_from_slice(&(-off * sum(b)).to_le_bytes());
            for l in 0..lanes {
                da[4 * (lanes * j + l)..4 * (lanes * j + l + 1)].copy_from_slice(&b.d.to_f32().to_le_bytes());
            }
        }
    }
    let at = groups * bytes;
    buf[at..at + size_of_val(tail)].copy_from_slice(crate::quant::blocks_as_bytes(tail));
    Some(out)
}

/// The decode dot product over a [`pack`]ed activation row, as a
/// [`DotFn`](super::DotFn) (`a` is the packed row).
pub(crate) fn dot_fn(dtype: DType) -> Option<super::DotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        match dtype {
            DType::Q4_0 => Some(imp::dot_q4_0 as super::DotFn),
            DType::Q8_0 => Some(imp::dot_q8_0 as super::DotFn),
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
pub(crate) fn streams_fn(dtype: DType) -> Option<super::StreamsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        // SAFETY (both): the `StreamsFn` contract is the tile's, for four weight rows and
        // one packed activation row.
        let f: super::StreamsFn = match dtype {
            DType::Q4_0 => |w, ws, a, nb| unsafe { q4_0_tile::<4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
            DType::Q8_0 => |w, ws, a, nb| unsafe { q8_0_tile::<4, 1>(w, ws, a, 0, nb) }.map(|r| r[0]),
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
pub(crate) fn rows_fn(dtype: DType) -> Option<super::RowsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        match dtype {
            DType::Q4_0 => Some(super::RowsFn { pairs: super::pair_fns!(q4_0_tile), ..super::rows_fn!(q4_0_rows) }),
            DType::Q8_0 => Some(super::RowsFn { pairs: super::pair_fns!(q8_0_tile), ..super::rows_fn!(q8_0_rows) }),
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

    use crate::tensor::DType;

    /// Bytes ahead of the current weight group to prefetch.
    const PREFETCH: usize = 2048;

    /// `vpermt2b` indices gathering the `qs` of `per` blocks of `bb` bytes (levels at
    /// byte 2 of each) into one register, and `vpermb` indices putting block `j`'s f16
    /// scale (bytes 0 and 1) in word lanes `j·16/per ..`.
    const fn indices(per: usize, bb: usize) -> ([u8; 64], [u8; 64]) {
        let (mut qs, mut d) = ([0u8; 64], [0u8; 64]);
        let n = 64 / per;
        let mut i = 0;
        while i < 64 {
            qs[i] = ((i / n) * bb + 2 + i % n) as u8;
            i += 1;
        }
        let mut w = 0;
        while w < 16 {
            let j = w / (16 / per);
            d[2 * w] = (j * bb) as u8;
            d[2 * w + 1] = (j * bb + 1) as u8;
            w += 1;
        }
        (qs, d)
    }
    static Q4_0_IDX: ([u8; 64], [u8; 64]) = indices(4, 18);
    static Q8_0_IDX: ([u8; 64], [u8; 64]) = indices(2, 34);

    /// Q4_0 against a packed Q8_0 row.
    ///
    /// # Safety
    /// As for [`DotFn`](crate::quant::simd::DotFn) with `a` a packed row; a CPU with the
    /// features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    pub unsafe fn dot_q4_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { q4_0_rows::<1>(w, a, 0, nb)[0] }
    }

    /// Each accumulator's sum, plus the dot of the blocks left after the whole groups
    /// (`tail` blocks, at byte `at.0` of each weight row and `at.1` of each packed row).
    ///
    /// # Safety
    /// The tail blocks are readable; a CPU with the features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    #[inline]
    unsafe fn finish<const W: usize, const R: usize>(
        acc: [[__m512; R]; W],
        dtype: DType,
        w: [*const u8; W],
        a: [*const u8; R],
        at: (usize, usize),
        tail: usize,
    ) -> [[f32; R]; W] {
        let mut out = [[0f32; R]; W];
        for j in 0..W {
            for r in 0..R {
                out[j][r] = _mm512_reduce_add_ps(acc[j][r]);
                if tail > 0 {
                    // SAFETY: the caller's contract.
                    out[j][r] += unsafe { super::super::avx512::dot_tail(dtype, w[j].add(at.0), a[r].add(at.1), tail) };
                }
            }
        }
        out
    }

    /// Q4_0 against `R` packed rows at once: each weight group is unpacked once, and
    /// each row takes exactly the operations [`dot_q4_0`] (`R = 1`) takes, so each
    /// result is bit-identical to that row's one-row dot.
    ///
    /// # Safety
    /// As for [`dot_q4_0`], for every row in `a`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    #[inline]
    pub unsafe fn q4_0_rows<const R: usize>(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { q4_0_tile::<1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`q4_0_rows`] for `W` weight rows `w_stride` bytes apart: each activation group is
    /// loaded once for all of them, and each (weight row, activation row) pair still
    /// takes exactly [`dot_q4_0`]'s operations.
    ///
    /// # Safety
    /// As for [`dot_q4_0`], for every weight row and every activation row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    #[inline]
    pub unsafe fn q4_0_tile<const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let a: [*const u8; R] = std::array::from_fn(|r| a.wrapping_add(r * stride));
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        const BB: usize = 18;
        let groups = nb / 4;
        let nib = _mm512_set1_epi8(0x0F);
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        // SAFETY: loads stay inside the caller's `nb` weight blocks of each weight row (the
        // second one is masked to the group's last 8 bytes) and packed rows; prefetches
        // never fault.
        unsafe {
            let qidx = _mm512_loadu_si512(Q4_0_IDX.0.as_ptr().cast());
            let didx = _mm512_loadu_si512(Q4_0_IDX.1.as_ptr().cast());
            for g in 0..groups {
                let mut lo = [_mm512_setzero_si512(); W];
                let mut hi = [_mm512_setzero_si512(); W];
                let mut dw = [_mm512_setzero_ps(); W];
                for j in 0..W {
                    let wp = w[j].add(4 * BB * g);
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64).cast());
                    let v0 = _mm512_loadu_si512(wp.cast());
                    let v1 = _mm512_maskz_loadu_epi8(0xFF, wp.add(64).cast());
                    let q = _mm512_permutex2var_epi8(v0, qidx, v1);
                    lo[j] = _mm512_and_si512(q, nib);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib);
                    dw[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(didx, v0)));
                }
                for r in 0..R {
                    let ap = a[r].add(256 * g);
                    let (corr, y0, y1) = (
                        _mm512_loadu_si512(ap.add(128).cast()),
                        _mm512_loadu_si512(ap.cast()),
                        _mm512_loadu_si512(ap.add(64).cast()),
                    );
                    let da = _mm512_loadu_ps(ap.add(192).cast());
                    for j in 0..W {
                        let mut i = corr;
                        i = _mm512_dpbusd_epi32(i, lo[j], y0);
                        i = _mm512_dpbusd_epi32(i, hi[j], y1);
                        let s = _mm512_mul_ps(dw[j], da);
                        acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[j][r]);
                    }
                }
            }
            // The packed row keeps its last blocks as plain Q8_0 after the groups.
            finish(acc, DType::Q4_0, w, a, (4 * BB * groups, 256 * groups), nb - 4 * groups)
        }
    }

    /// Q8_0 against a packed Q8_0 row.
    ///
    /// # Safety
    /// As for [`dot_q4_0`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    pub unsafe fn dot_q8_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { q8_0_rows::<1>(w, a, 0, nb)[0] }
    }

    /// Q8_0 against `R` packed rows at once, as [`q4_0_rows`] does for Q4_0.
    ///
    /// # Safety
    /// As for [`dot_q8_0`], for every row in `a`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    #[inline]
    pub unsafe fn q8_0_rows<const R: usize>(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { q8_0_tile::<1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`q8_0_rows`] for `W` weight rows `w_stride` bytes apart, as [`q4_0_tile`] is for
    /// Q4_0.
    ///
    /// # Safety
    /// As for [`dot_q8_0`], for every weight row and every activation row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,f16c")]
    #[inline]
    pub unsafe fn q8_0_tile<const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let a: [*const u8; R] = std::array::from_fn(|r| a.wrapping_add(r * stride));
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        const BB: usize = 34;
        let groups = nb / 2;
        let flip = _mm512_set1_epi8(-128);
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        // SAFETY: as in `q4_0_tile` (the masked load covers the pair's last 4 bytes).
        unsafe {
            let qidx = _mm512_loadu_si512(Q8_0_IDX.0.as_ptr().cast());
            let didx = _mm512_loadu_si512(Q8_0_IDX.1.as_ptr().cast());
            for g in 0..groups {
                let mut u = [_mm512_setzero_si512(); W];
                let mut dw = [_mm512_setzero_ps(); W];
                for j in 0..W {
                    let wp = w[j].add(2 * BB * g);
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64).cast());
                    let v0 = _mm512_loadu_si512(wp.cast());
                    let v1 = _mm512_maskz_loadu_epi8(0x0F, wp.add(64).cast());
                    u[j] = _mm512_xor_si512(_mm512_permutex2var_epi8(v0, qidx, v1), flip);
                    dw[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(didx, v0)));
                }
                for r in 0..R {
                    let ap = a[r].add(192 * g);
                    let (corr, y, da) = (
                        _mm512_loadu_si512(ap.add(64).cast()),
                        _mm512_loadu_si512(ap.cast()),
                        _mm512_loadu_ps(ap.add(128).cast()),
                    );
                    for j in 0..W {
                        let i = _mm512_dpbusd_epi32(corr, u[j], y);
                        let s = _mm512_mul_ps(dw[j], da);
                        acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[j][r]);
                    }
                }
            }
            finish(acc, DType::Q8_0, w, a, (2 * BB * groups, 192 * groups), nb - 2 * groups)
        }
    }
}
