//! AVX2 (+FMA, F16C) dot products, one 32-value block per register. Signed levels use
//! llama.cpp's `vpsignb` trick (|x| times y with x's sign) so `vpmaddubsw` sees an
//! unsigned first operand (MXFP4's levels are its signed doubled E2M1 values, looked up
//! by nibble with `vpshufb`); K-quants apply sub-block scales with `vpmaddwd`. Integer sums
//! are exact. Unavailable off x86-64.

use super::DotFn;
use strata_tensor::tensor::DType;

pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        crate::isa::avx2() && has!("avx2") && has!("fma") && has!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

super::tile_tables!();

pub(super) fn dot_fn(dtype: DType) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        let f: DotFn = match dtype {
            DType::Q4_0 => dot32::<Q4_0>,
            DType::Q5_0 => dot32::<Q5_0>,
            DType::Q8_0 => dot32::<Q8_0>,
            DType::Q4_1 => dot32::<Q4_1>,
            DType::Q5_1 => dot32::<Q5_1>,
            DType::Mxfp4 => dot32::<MXFP4>,
            DType::Q4_K => dot_q4k::<false>,
            DType::Q5_K => dot_q4k::<true>,
            DType::Q6_K => dot_q6k,
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

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::super::{e8m0x4, f16x4, k_min_sum, scales_mins_k4};
    use crate::QK_K;

    const PREFETCH: usize = 1024;

    pub const Q4_0: u8 = 0;
    pub const Q5_0: u8 = 1;
    pub const Q8_0: u8 = 2;
    pub const Q4_1: u8 = 3;
    pub const Q5_1: u8 = 4;
    pub const MXFP4: u8 = 5;

    /// (block bytes, `qs` offset, `qh` offset or 0, offset subtracted, has a min).
    /// MXFP4's levels are signed already (its "offset" only marks them so).
    const fn layout(f: u8) -> (usize, usize, usize, i8, bool) {
        match f {
            Q4_0 => (18, 2, 0, 8, false),
            MXFP4 => (17, 1, 0, 12, false),
            Q5_0 => (22, 6, 2, 16, false),
            Q8_0 => (34, 2, 0, 0, false),
            Q4_1 => (20, 4, 0, 0, true),
            _ => (24, 8, 4, 0, true),
        }
    }

    #[inline]
    unsafe fn f16_at(p: *const u8) -> f32 {
        // SAFETY: the caller passes a readable 2-byte location; F16C is enabled in every
        // caller.
        unsafe {
            let h = p.cast::<u16>().read_unaligned();
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
        }
    }

    /// The scale of the block at `p`: its f16 `d`, or for MXFP4 the power of two its
    /// exponent byte stands for.
    ///
    /// # Safety
    /// The block's first byte (two for f16) is readable; F16C is enabled in every caller.
    #[inline]
    unsafe fn scale1<const F: u8>(p: *const u8) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { if F == MXFP4 { crate::mxfp4::E8M0_HALF[*p as usize] } else { f16_at(p) } }
    }

    /// [`scale1`] of the blocks at `p`, `p + stride`, `p + 2·stride`, `p + 3·stride`.
    ///
    /// # Safety
    /// As for [`scale1`], for each of the four blocks.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn scales4<const F: u8>(p: *const u8, stride: usize) -> __m128 {
        // SAFETY: the caller's contract.
        unsafe { if F == MXFP4 { e8m0x4(p, stride) } else { f16x4(p, stride) } }
    }

    /// 0xFF in byte i where bit i of `x` is set (llama.cpp's `bytes_from_bits_32`).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn bytes_from_bits(x: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }

    /// The levels of the block at `wp` as `vpmaddubsw`'s unsigned operand, and the signs
    /// the activations take (for formats with an offset or signed levels: |x| and x;
    /// otherwise the unsigned levels twice).
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn levels<const F: u8>(wp: *const u8) -> (__m256i, __m256i) {
        let (_, qs, qh, off, _) = layout(F);
        // SAFETY: one whole weight block is readable at `wp` (the caller's contract).
        unsafe {
            let x = if F == Q8_0 {
                _mm256_loadu_si256(wp.add(qs).cast())
            } else {
                let t = _mm_loadu_si128(wp.add(qs).cast());
                let mut u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(t), t), _mm256_set1_epi8(0x0F));
                if F == MXFP4 {
                    let k = _mm_loadu_si128(crate::mxfp4::KVALUES.as_ptr().cast());
                    let x = _mm256_shuffle_epi8(_mm256_set_m128i(k, k), u);
                    return (_mm256_sign_epi8(x, x), x);
                }
                if qh != 0 {
                    let bits = bytes_from_bits(wp.add(qh).cast::<u32>().read_unaligned());
                    u = _mm256_or_si256(u, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
                }
                if off == 0 {
                    return (u, u);
                }
                _mm256_sub_epi8(u, _mm256_set1_epi8(off))
            };
            (_mm256_sign_epi8(x, x), x)
        }
    }

    /// Σ over 8 i32 lanes of the 32 products of a block's [`levels`] with `y`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn levels_dot<const F: u8>((u, x): (__m256i, __m256i), y: __m256i) -> __m256i {
        let (_, _, _, off, _) = layout(F);
        let ones = _mm256_set1_epi16(1);
        if F != Q8_0 && off == 0 {
            // unsigned levels times signed activations: no sign trick needed
            return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), ones);
        }
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(y, x)), ones)
    }

    /// 32-value formats against Q8_0 (or Q8_1 for formats with a min).
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot32<const F: u8>(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { dot32_tile::<F, 1, 1>(w, 0, a, 0, nb)[0][0] }
    }

    /// [`dot32`] against `R` activation rows `stride` bytes apart.
    ///
    /// # Safety
    /// As for [`dot32`], for every row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot32_rows<const F: u8, const R: usize>(
        w: *const u8,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { dot32_tile::<F, 1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`dot32`] for `W` weight rows `w_stride` bytes apart (read side by side four
    /// blocks at a time) × `R` activation rows `stride` bytes apart: each weight block is
    /// unpacked once for all rows, and each (weight row, activation row) pair takes
    /// exactly `dot32`'s operations, so its result is that one-row dot's bits.
    ///
    /// # Safety
    /// As for [`dot32`], for every weight row and every activation row.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot32_tile<const F: u8, const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let a: [*const u8; R] = std::array::from_fn(|r| a.wrapping_add(r * stride));
        let (wb, _, _, _, has_min) = layout(F);
        let (ab, aqs) = if has_min { (36, 4) } else { (34, 2) };
        let mut acc = [[[_mm256_setzero_ps(); 2]; R]; W];
        let mut accm = [[0.0f32; R]; W];
        // Whole groups of four blocks: the group's scale products (and min terms) in one
        // conversion and one multiply; then the last blocks one by one: the same IEEE
        // products either way. Block `b` adds into accumulator `b % 2`.
        let full = nb / 4 * 4;
        // SAFETY: pointers stay inside the caller's `nb` blocks (prefetches excepted).
        unsafe {
            for i in (0..full).step_by(4) {
                for j in 0..W {
                    let wp = w[j].add(i * wb);
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(2 * wb + PREFETCH).cast());
                    let lv: [_; 4] = std::array::from_fn(|k| levels::<F>(wp.add(k * wb)));
                    let wd = scales4::<F>(wp, wb);
                    let wm = if has_min { f16x4(wp.add(2), wb) } else { _mm_setzero_ps() };
                    for r in 0..R {
                        let ap = a[r].add(i * ab);
                        let (mut d, mut m) = ([0.0f32; 4], [0.0f32; 4]);
                        _mm_storeu_ps(d.as_mut_ptr(), _mm_mul_ps(wd, f16x4(ap, ab)));
                        if has_min {
                            _mm_storeu_ps(m.as_mut_ptr(), _mm_mul_ps(wm, f16x4(ap.add(2), ab)));
                        }
                        for k in 0..4 {
                            let s = levels_dot::<F>(lv[k], _mm256_loadu_si256(ap.add(k * ab + aqs).cast()));
                            let acc = &mut acc[j][r][k % 2];
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d[k]), *acc);
                            if has_min {
                                accm[j][r] += m[k];
                            }
                        }
                    }
                }
            }
            for i in full..nb {
                for j in 0..W {
                    let wp = w[j].add(i * wb);
                    if i % 2 == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    }
                    let lv = levels::<F>(wp);
                    for r in 0..R {
                        let ap = a[r].add(i * ab);
                        let d = scale1::<F>(wp) * f16_at(ap);
                        let s = levels_dot::<F>(lv, _mm256_loadu_si256(ap.add(aqs).cast()));
                        let acc = &mut acc[j][r][i % 2];
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), *acc);
                        if has_min {
                            accm[j][r] += f16_at(wp.add(2)) * f16_at(ap.add(2));
                        }
                    }
                }
            }
        }
        std::array::from_fn(|j| std::array::from_fn(|r| hsum(_mm256_add_ps(acc[j][r][0], acc[j][r][1])) + accm[j][r]))
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }

    /// Q4_K (`Q5 = false`) and Q5_K against Q8_K.
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4k<const Q5: bool>(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { q4k_tile::<Q5, 1, 1>(w, 0, a, 0, nb)[0][0] }
    }

    /// [`dot_q4k`] against `R` activation rows `stride` bytes apart.
    ///
    /// # Safety
    /// As for [`dot_q4k`], for every row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4k_rows<const Q5: bool, const R: usize>(
        w: *const u8,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { q4k_tile::<Q5, 1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`dot_q4k`] for `W` weight rows `w_stride` bytes apart (read side by side block
    /// by block) × `R` activation rows `stride` bytes apart: each block unpacked once, and
    /// each pair takes exactly `dot_q4k`'s operations.
    ///
    /// # Safety
    /// As for [`dot_q4k`], for every weight row and every activation row.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn q4k_tile<const Q5: bool, const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let a: [*const u8; R] = std::array::from_fn(|r| a.wrapping_add(r * stride));
        let (wb, qs) = if Q5 { (176, 48) } else { (144, 16) };
        const AB: usize = 292;
        let nib = _mm256_set1_epi8(0x0F);
        let mut accf = [[_mm256_setzero_ps(); R]; W];
        let mut acc_min = [[0.0f32; R]; W];
        // SAFETY: pointers stay inside the caller's `nb` blocks (prefetches excepted).
        unsafe {
            for i in 0..nb {
                for j in 0..W {
                    let wp = w[j].add(i * wb);
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 128).cast());
                    let (sc, mn) = scales_mins_k4(&*wp.add(4).cast::<[u8; 12]>());
                    let qh = if Q5 { _mm256_loadu_si256(wp.add(16).cast()) } else { _mm256_setzero_si256() };
                    let mut lohi = [[_mm256_setzero_si256(); 2]; 4];
                    for (n, lohi) in lohi.iter_mut().enumerate() {
                        let q = _mm256_loadu_si256(wp.add(qs + 32 * n).cast());
                        let mut lo = _mm256_and_si256(q, nib);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nib);
                        if Q5 {
                            let b0 = _mm256_set1_epi8(1 << (2 * n));
                            let b1 = _mm256_set1_epi8((2u8 << (2 * n)) as i8);
                            let sixteen = _mm256_set1_epi8(16);
                            lo = _mm256_or_si256(
                                lo,
                                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen),
                            );
                            hi = _mm256_or_si256(
                                hi,
                                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen),
                            );
                        }
                        *lohi = [lo, hi];
                    }
                    let (d, dmin) = (f16_at(wp), f16_at(wp.add(2)));
                    for r in 0..R {
                        let ap = a[r].add(i * AB);
                        let mut isum = _mm256_setzero_si256();
                        for (n, [lo, hi]) in lohi.into_iter().enumerate() {
                            let y0 = _mm256_loadu_si256(ap.add(4 + 64 * n).cast());
                            let y1 = _mm256_loadu_si256(ap.add(4 + 64 * n + 32).cast());
                            let p0 =
                                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * n] as i16));
                            let p1 = _mm256_madd_epi16(
                                _mm256_maddubs_epi16(hi, y1),
                                _mm256_set1_epi16(sc[2 * n + 1] as i16),
                            );
                            isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
                        }
                        let dy = ap.cast::<f32>().read();
                        accf[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dy), accf[j][r]);
                        let bsums = &*ap.add(4 + QK_K).cast::<[i16; QK_K / 16]>();
                        acc_min[j][r] += dmin * dy * k_min_sum(&mn, bsums) as f32;
                    }
                }
            }
        }
        std::array::from_fn(|j| std::array::from_fn(|r| hsum(accf[j][r]) - acc_min[j][r]))
    }

    /// Q6_K against Q8_K.
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q6k(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { q6k_tile_rows::<1, 1>(w, 0, a, 0, nb)[0][0] }
    }

    /// [`dot_q6k`] against `R` activation rows `stride` bytes apart.
    ///
    /// # Safety
    /// As for [`dot_q6k`], for every row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q6k_rows<const R: usize>(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { q6k_tile_rows::<1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`dot_q6k`] for `W` weight rows `w_stride` bytes apart (read side by side block
    /// by block) × `R` activation rows `stride` bytes apart: each block unpacked once, and
    /// each pair takes exactly `dot_q6k`'s operations.
    ///
    /// # Safety
    /// As for [`dot_q6k`], for every weight row and every activation row.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn q6k_tile_rows<const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let a: [*const u8; R] = std::array::from_fn(|r| a.wrapping_add(r * stride));
        const WB: usize = 210;
        const AB: usize = 292;
        let nib = _mm256_set1_epi8(0x0F);
        let hb = _mm256_set1_epi8(0x30);
        let mut accf = [[_mm256_setzero_ps(); R]; W];
        // SAFETY: pointers stay inside the caller's `nb` blocks (prefetches excepted).
        unsafe {
            for i in 0..nb {
                for j in 0..W {
                    let wp = w[j].add(i * WB);
                    for p in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * p).cast());
                    }
                    let sc = &*wp.add(192).cast::<[i8; 16]>();
                    let mut us = [[_mm256_setzero_si256(); 4]; 2];
                    for (n, u) in us.iter_mut().enumerate() {
                        let qla = _mm256_loadu_si256(wp.add(64 * n).cast());
                        let qlb = _mm256_loadu_si256(wp.add(64 * n + 32).cast());
                        let qh = _mm256_loadu_si256(wp.add(128 + 32 * n).cast());
                        *u = [
                            _mm256_or_si256(
                                _mm256_and_si256(qla, nib),
                                _mm256_and_si256(_mm256_slli_epi16::<4>(qh), hb),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(qlb, nib),
                                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), hb),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16::<4>(qla), nib),
                                _mm256_and_si256(qh, hb),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16::<4>(qlb), nib),
                                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), hb),
                            ),
                        ];
                    }
                    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast()));
                    let dx = f16_at(wp.add(208));
                    for r in 0..R {
                        let ap = a[r].add(i * AB);
                        let mut isum = _mm256_setzero_si256();
                        for (n, u) in us.iter().enumerate() {
                            for (c, &u) in u.iter().enumerate() {
                                let g = 8 * n + 2 * c;
                                let y = _mm256_loadu_si256(ap.add(4 + 128 * n + 32 * c).cast());
                                let scv =
                                    _mm256_set_m128i(_mm_set1_epi16(sc[g + 1] as i16), _mm_set1_epi16(sc[g] as i16));
                                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), scv));
                            }
                        }
                        let bsums = _mm256_loadu_si256(ap.add(4 + QK_K).cast());
                        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16)));
                        let dy = ap.cast::<f32>().read();
                        accf[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dx * dy), accf[j][r]);
                    }
                }
            }
        }
        std::array::from_fn(|j| std::array::from_fn(|r| hsum(accf[j][r])))
    }
}
