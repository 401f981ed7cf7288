//! AVX2 (+FMA, F16C) dot products, one 32-value block per register. Signed levels use
//! llama.cpp's `vpsignb` trick (|x| times y with x's sign) so `vpmaddubsw` sees an
//! unsigned first operand; K-quants apply sub-block scales with `vpmaddwd`. Integer sums
//! are exact. Unavailable off x86-64.

use super::DotFn;
use crate::tensor::DType;

pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        crate::backend::cpu::isa::avx2() && has!("avx2") && has!("fma") && has!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`dot_fn`] over four weight rows at once, read side by side.
pub(super) fn streams_fn(dtype: DType) -> Option<super::StreamsFn> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        // SAFETY (each): the `StreamsFn` contract is the tile's, for four weight rows.
        Some(match dtype {
            DType::Q4_0 => |w, ws, a, nb| unsafe { dot32_tile::<Q4_0, 4>(w, ws, a, nb) },
            DType::Q5_0 => |w, ws, a, nb| unsafe { dot32_tile::<Q5_0, 4>(w, ws, a, nb) },
            DType::Q8_0 => |w, ws, a, nb| unsafe { dot32_tile::<Q8_0, 4>(w, ws, a, nb) },
            DType::Q4_1 => |w, ws, a, nb| unsafe { dot32_tile::<Q4_1, 4>(w, ws, a, nb) },
            DType::Q5_1 => |w, ws, a, nb| unsafe { dot32_tile::<Q5_1, 4>(w, ws, a, nb) },
            DType::Q4_K => |w, ws, a, nb| unsafe { q4k_tile::<false, 4>(w, ws, a, nb) },
            DType::Q5_K => |w, ws, a, nb| unsafe { q4k_tile::<true, 4>(w, ws, a, nb) },
            DType::Q6_K => |w, ws, a, nb| unsafe { q6k_tile::<4>(w, ws, a, nb) },
            _ => return None,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        None
    }
}

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

    use super::super::{f16x4, k_min_sum, scales_mins_k4};
    use crate::quant::QK_K;

    const PREFETCH: usize = 1024;

    pub const Q4_0: u8 = 0;
    pub const Q5_0: u8 = 1;
    pub const Q8_0: u8 = 2;
    pub const Q4_1: u8 = 3;
    pub const Q5_1: u8 = 4;

    /// (block bytes, `qs` offset, `qh` offset or 0, offset subtracted, has a min).
    const fn layout(f: u8) -> (usize, usize, usize, i8, bool) {
        match f {
            Q4_0 => (18, 2, 0, 8, false),
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

    /// 0xFF in byte i where bit i of `x` is set (llama.cpp's `bytes_from_bits_32`).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn bytes_from_bits(x: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }

    /// Σ over 8 i32 lanes of the 32 products of the block at `wp` with `y`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn block_sum<const F: u8>(wp: *const u8, y: __m256i) -> __m256i {
        let (_, qs, qh, off, _) = layout(F);
        let ones = _mm256_set1_epi16(1);
        // SAFETY: one whole weight block is readable at `wp` (the caller's contract).
        unsafe {
            let x = if F == Q8_0 {
                _mm256_loadu_si256(wp.add(qs).cast())
            } else {
                let t = _mm_loadu_si128(wp.add(qs).cast());
                let mut u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(t), t), _mm256_set1_epi8(0x0F));
                if qh != 0 {
                    let bits = bytes_from_bits(wp.add(qh).cast::<u32>().read_unaligned());
                    u = _mm256_or_si256(u, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
                }
                if off == 0 {
                    // unsigned levels times signed activations: no sign trick needed
                    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), ones);
                }
                _mm256_sub_epi8(u, _mm256_set1_epi8(off))
            };
            let ax = _mm256_sign_epi8(x, x);
            let sy = _mm256_sign_epi8(y, x);
            _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones)
        }
    }

    /// 32-value formats against Q8_0 (or Q8_1 for formats with a min).
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot32<const F: u8>(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { dot32_tile::<F, 1>(w, 0, a, nb)[0] }
    }

    /// [`dot32`] for `W` weight rows `w_stride` bytes apart, read side by side four
    /// blocks at a time (several memory streams at once); each row takes exactly
    /// `dot32`'s operations.
    ///
    /// # Safety
    /// As for [`dot32`], for every weight row.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot32_tile<const F: u8, const W: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        nb: usize,
    ) -> [f32; W] {
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let (wb, _, _, _, has_min) = layout(F);
        let (ab, aqs) = if has_min { (36, 4) } else { (34, 2) };
        let mut acc = [[_mm256_setzero_ps(); 2]; W];
        let mut accm = [0.0f32; W];
        // Four blocks at a time: a whole group's scale products (and min terms) in one
        // conversion and one multiply, the last blocks' one by one: the same IEEE
        // products either way.
        // SAFETY: pointers stay inside the caller's `nb` blocks (prefetches excepted).
        unsafe {
            for i in (0..nb).step_by(4) {
                for j in 0..W {
                    let (wp, ap) = (w[j].add(i * wb), a.add(i * ab));
                    let n = (nb - i).min(4);
                    let (mut d, mut m) = ([0.0f32; 4], [0.0f32; 4]);
                    if n == 4 {
                        _mm_storeu_ps(d.as_mut_ptr(), _mm_mul_ps(f16x4(wp, wb), f16x4(ap, ab)));
                        if has_min {
                            _mm_storeu_ps(m.as_mut_ptr(), _mm_mul_ps(f16x4(wp.add(2), wb), f16x4(ap.add(2), ab)));
                        }
                    } else {
                        for k in 0..n {
                            let (wp, ap) = (wp.add(k * wb), ap.add(k * ab));
                            d[k] = f16_at(wp) * f16_at(ap);
                            m[k] = if has_min { f16_at(wp.add(2)) * f16_at(ap.add(2)) } else { 0.0 };
                        }
                    }
                    for k in 0..n {
                        let (wp, ap) = (wp.add(k * wb), ap.add(k * ab));
                        if (i + k) % 2 == 0 {
                            _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                        }
                        let s = block_sum::<F>(wp, _mm256_loadu_si256(ap.add(aqs).cast()));
                        let acc = &mut acc[j][(i + k) % 2];
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d[k]), *acc);
                        if has_min {
                            accm[j] += m[k];
                        }
                    }
                }
            }
        }
        std::array::from_fn(|j| hsum(_mm256_add_ps(acc[j][0], acc[j][1])) + accm[j])
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
        unsafe { q4k_tile::<Q5, 1>(w, 0, a, nb)[0] }
    }

    /// [`dot_q4k`] for `W` weight rows `w_stride` bytes apart, read side by side block
    /// by block; each row takes exactly `dot_q4k`'s operations.
    ///
    /// # Safety
    /// As for [`dot_q4k`], for every weight row.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn q4k_tile<const Q5: bool, const W: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        nb: usize,
    ) -> [f32; W] {
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let (wb, qs) = if Q5 { (176, 48) } else { (144, 16) };
        const AB: usize = 292;
        let nib = _mm256_set1_epi8(0x0F);
        let mut accf = [_mm256_setzero_ps(); W];
        let mut acc_min = [0.0f32; W];
        // SAFETY: pointers stay inside the caller's `nb` blocks (prefetches excepted).
        unsafe {
            for i in 0..nb {
                for j in 0..W {
                    let (wp, ap) = (w[j].add(i * wb), a.add(i * AB));
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 128).cast());
                    let (sc, mn) = scales_mins_k4(&*wp.add(4).cast::<[u8; 12]>());
                    let qh = if Q5 { _mm256_loadu_si256(wp.add(16).cast()) } else { _mm256_setzero_si256() };
                    let mut isum = _mm256_setzero_si256();
                    for n in 0..4 {
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
                        let y0 = _mm256_loadu_si256(ap.add(4 + 64 * n).cast());
                        let y1 = _mm256_loadu_si256(ap.add(4 + 64 * n + 32).cast());
                        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * n] as i16));
                        let p1 =
                            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(sc[2 * n + 1] as i16));
                        isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
                    }
                    let dy = ap.cast::<f32>().read();
                    accf[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(f16_at(wp) * dy), accf[j]);
                    let bsums = &*ap.add(4 + QK_K).cast::<[i16; QK_K / 16]>();
                    acc_min[j] += f16_at(wp.add(2)) * dy * k_min_sum(&mn, bsums) as f32;
                }
            }
        }
        std::array::from_fn(|j| hsum(accf[j]) - acc_min[j])
    }

    /// Q6_K against Q8_K.
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q6k(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { q6k_tile::<1>(w, 0, a, nb)[0] }
    }

    /// [`dot_q6k`] for `W` weight rows `w_stride` bytes apart, read side by side block
    /// by block; each row takes exactly `dot_q6k`'s operations.
    ///
    /// # Safety
    /// As for [`dot_q6k`], for every weight row.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn q6k_tile<const W: usize>(w: *const u8, w_stride: usize, a: *const u8, nb: usize) -> [f32; W] {
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        const WB: usize = 210;
        const AB: usize = 292;
        let nib = _mm256_set1_epi8(0x0F);
        let hb = _mm256_set1_epi8(0x30);
        let mut accf = [_mm256_setzero_ps(); W];
        // SAFETY: pointers stay inside the caller's `nb` blocks (prefetches excepted).
        unsafe {
            for i in 0..nb {
                for j in 0..W {
                    let (wp, ap) = (w[j].add(i * WB), a.add(i * AB));
                    for p in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * p).cast());
                    }
                    let sc = &*wp.add(192).cast::<[i8; 16]>();
                    let mut isum = _mm256_setzero_si256();
                    for n in 0..2 {
                        let qla = _mm256_loadu_si256(wp.add(64 * n).cast());
                        let qlb = _mm256_loadu_si256(wp.add(64 * n + 32).cast());
                        let qh = _mm256_loadu_si256(wp.add(128 + 32 * n).cast());
                        let u = [
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
                        for (c, u) in u.into_iter().enumerate() {
                            let g = 8 * n + 2 * c;
                            let y = _mm256_loadu_si256(ap.add(4 + 128 * n + 32 * c).cast());
                            let scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1] as i16), _mm_set1_epi16(sc[g] as i16));
                            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), scv));
                        }
                    }
                    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast()));
                    let bsums = _mm256_loadu_si256(ap.add(4 + QK_K).cast());
                    isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16)));
                    let dy = ap.cast::<f32>().read();
                    accf[j] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(f16_at(wp.add(208)) * dy), accf[j]);
                }
            }
        }
        std::array::from_fn(|j| hsum(accf[j]))
    }
}
