//! AVX-512 (F, BW, VL, VNNI, VBMI: Ice Lake, Zen 4 and later) dot products. 32-value formats take two blocks per
//! register: weights become unsigned bytes `u` (nibbles, plus the fifth bit, or
//! `q ^ 0x80` for Q8_0) so `vpdpbusd` can multiply them with the signed activations;
//! the offset (8, 16 or 128) is taken off exactly with a second `vpdpbusd` against the
//! activations. MXFP4's nibbles index its doubled E2M1 values plus 12 (`vpshufb`), and
//! the 12 comes off the same way; its scale is a power of two looked up by exponent. K-quants multiply pairs with `vpmaddubsw` and apply the sub-block scales
//! with `vpdpwssd`, all in i32; Q6_K's −32 comes off via the activations' `bsums`.
//! Unavailable off x86-64.

use super::DotFn;
use strata_tensor::tensor::DType;

pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        crate::isa::avx512()
            && has!("avx512f")
            && has!("avx512bw")
            && has!("avx512vl")
            && has!("avx512vnni")
            && has!("avx512vbmi")
            && has!("avx2")
            && has!("fma")
            && has!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
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

super::tile_tables!();

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, reason = "the sub-block index drives several offsets")]
mod imp {
    use std::arch::x86_64::*;

    use crate::QK_K;
    use crate::simd::{e8m0x4, f16x4};

    /// Bytes ahead of the current weight block to prefetch (the decode path streams).
    const PREFETCH: usize = 2048;

    pub const Q4_0: u8 = 0;
    pub const Q5_0: u8 = 1;
    pub const Q8_0: u8 = 2;
    pub const Q4_1: u8 = 3;
    pub const Q5_1: u8 = 4;
    pub const MXFP4: u8 = 5;

    /// Per 32-value format: weight block bytes, offset of `qs`, offset of `qh` (0: none),
    /// the value subtracted from the unsigned level, whether it has a min (`m`, at byte 2,
    /// against Q8_1 activations).
    const fn layout(f: u8) -> (usize, usize, usize, i8, bool) {
        match f {
            Q4_0 => (18, 2, 0, 8, false),
            MXFP4 => (17, 1, 0, 12, false),
            Q5_0 => (22, 6, 2, 16, false),
            Q8_0 => (34, 2, 0, -128, false),
            Q4_1 => (20, 4, 0, 0, true),
            _ => (24, 8, 4, 0, true),
        }
    }

    #[inline]
    unsafe fn f16_at(p: *const u8) -> i16 {
        // SAFETY: the caller passes a readable 2-byte location.
        unsafe { p.cast::<i16>().read_unaligned() }
    }

    /// The f16 at `p` (and with `two`, the one at `p + stride`) as f32 lanes, the others 0.
    ///
    /// # Safety
    /// The one or two 2-byte locations are readable.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    #[inline]
    unsafe fn f16x2(p: *const u8, stride: usize, two: bool) -> __m128 {
        // SAFETY: the caller's contract.
        unsafe {
            let h1 = if two { f16_at(p.add(stride)) as u16 as i32 } else { 0 };
            _mm_cvtph_ps(_mm_cvtsi32_si128(f16_at(p) as u16 as i32 | h1 << 16))
        }
    }

    /// MXFP4's [`KVALUES`](crate::mxfp4::KVALUES) plus 12, as unsigned levels.
    static MXFP4_U: [u8; 16] = {
        let (k, mut t, mut n) = (crate::mxfp4::KVALUES, [0u8; 16], 0);
        while n < 16 {
            t[n] = (k[n] + 12) as u8;
            n += 1;
        }
        t
    };

    /// [`MXFP4_U`] in each 128-bit lane.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn mxfp4_levels() -> __m512i {
        // SAFETY: 16 readable bytes.
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(MXFP4_U.as_ptr().cast()) })
    }

    /// The scales of the four blocks at `p`, `p + stride`, ...: f16s, or for MXFP4 the
    /// powers of two their exponent bytes stand for.
    ///
    /// # Safety
    /// The four blocks' first bytes (two for f16) are readable.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    #[inline]
    unsafe fn scales4<const F: u8>(p: *const u8, stride: usize) -> __m128 {
        // SAFETY: the caller's contract.
        unsafe { if F == MXFP4 { e8m0x4(p, stride) } else { f16x4(p, stride) } }
    }

    /// [`scales4`] of the block at `p` (and with `two`, the one at `p + stride`), the
    /// other lanes 0.
    ///
    /// # Safety
    /// As for [`f16x2`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    #[inline]
    unsafe fn scales2<const F: u8>(p: *const u8, stride: usize, two: bool) -> __m128 {
        // SAFETY: the caller's contract.
        unsafe {
            if F == MXFP4 {
                let s = |k: usize| crate::mxfp4::E8M0_HALF[*p.add(k * stride) as usize];
                return _mm_setr_ps(s(0), if two { s(1) } else { 0.0 }, 0.0, 0.0);
            }
            f16x2(p, stride, two)
        }
    }

    /// The unsigned levels of weight blocks `wp` and `wp + WB` as 64 bytes, in value order.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    #[inline]
    unsafe fn levels_pair<const F: u8>(wp: *const u8) -> __m512i {
        let (wb, qs, qh, _, _) = layout(F);
        // SAFETY: two whole weight blocks are readable at `wp` (the caller's contract).
        unsafe {
            if F == Q8_0 {
                let lo = _mm256_loadu_si256(wp.add(qs).cast());
                let hi = _mm256_loadu_si256(wp.add(wb + qs).cast());
                let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                return _mm512_xor_si512(v, _mm512_set1_epi8(-128));
            }
            let t0 = _mm_loadu_si128(wp.add(qs).cast());
            let t1 = _mm_loadu_si128(wp.add(wb + qs).cast());
            let v = _mm512_castsi256_si512(_mm256_set_m128i(t1, t0));
            let v = _mm512_shuffle_i64x2::<0x50>(v, v); // [t0, t0, t1, t1]
            let u =
                _mm512_and_si512(_mm512_mask_blend_epi64(0xCC, v, _mm512_srli_epi16::<4>(v)), _mm512_set1_epi8(0x0F));
            if F == MXFP4 {
                return _mm512_shuffle_epi8(mxfp4_levels(), u);
            }
            if qh == 0 {
                return u;
            }
            let h0 = wp.add(qh).cast::<u32>().read_unaligned() as u64;
            let h1 = wp.add(wb + qh).cast::<u32>().read_unaligned() as u64;
            _mm512_mask_add_epi8(u, h0 | (h1 << 32), u, _mm512_set1_epi8(16))
        }
    }

    /// The unsigned levels of the one weight block at `wp` in the low 32 bytes, zeros above
    /// (a row's last block when it has an odd count: [`levels_pair`] would read past it).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    #[inline]
    unsafe fn levels_one<const F: u8>(wp: *const u8) -> __m512i {
        let (_, qs, qh, _, _) = layout(F);
        // SAFETY: one whole weight block is readable at `wp` (the caller's contract).
        unsafe {
            if F == Q8_0 {
                let lo = _mm256_loadu_si256(wp.add(qs).cast());
                return _mm512_zextsi256_si512(_mm256_xor_si256(lo, _mm256_set1_epi8(-128)));
            }
            let t0 = _mm_loadu_si128(wp.add(qs).cast());
            let v = _mm512_zextsi128_si512(t0);
            let v = _mm512_shuffle_i64x2::<0x50>(v, v); // [t0, t0, 0, 0]
            let u = _mm512_maskz_and_epi64(
                0x0F,
                _mm512_mask_blend_epi64(0xCC, v, _mm512_srli_epi16::<4>(v)),
                _mm512_set1_epi8(0x0F),
            );
            if F == MXFP4 {
                return _mm512_maskz_shuffle_epi8(0xFFFF_FFFF, mxfp4_levels(), u);
            }
            if qh == 0 {
                return u;
            }
            let h0 = wp.add(qh).cast::<u32>().read_unaligned() as u64;
            _mm512_mask_add_epi8(u, h0, u, _mm512_set1_epi8(16))
        }
    }

    /// 32-value formats against Q8_0 (or Q8_1 for formats with a min).
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn dot32<const F: u8>(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { dot32_rows::<F, 1>(w, a, 0, nb)[0] }
    }

    /// [`dot32`] against `R` activation rows at once: each weight block's levels are
    /// unpacked once, and each row takes exactly the operations `dot32` (`R = 1`) takes,
    /// so each result is bit-identical to that row's one-row dot.
    ///
    /// # Safety
    /// As for [`dot32`], for every row in `a`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot32_rows<const F: u8, const R: usize>(
        w: *const u8,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { dot32_tile::<F, 1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`dot32_rows`] for `W` weight rows `w_stride` bytes apart, read side by side
    /// block group by block group (several memory streams at once); each (weight row,
    /// activation row) pair takes exactly [`dot32`]'s operations.
    ///
    /// # Safety
    /// As for [`dot32`], for every weight row and every activation row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot32_tile<const F: u8, const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let a: [*const u8; R] = std::array::from_fn(|r| a.wrapping_add(r * stride));
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let (wb, _, _, off, has_min) = layout(F);
        let (ab, aqs) = if has_min { (36, 4) } else { (34, 2) };
        let offv = _mm512_set1_epi8(off.wrapping_abs()); // 8, 16 or 128 (as unsigned)
        let idx01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let idx23 = _mm512_add_epi32(idx01, _mm512_set1_epi32(2));
        let (mut acc0, mut acc1) = ([[_mm512_setzero_ps(); R]; W], [[_mm512_setzero_ps(); R]; W]);
        let mut accm = [[_mm_setzero_ps(); R]; W];
        let mut i = 0;
        // SAFETY: every pointer below stays inside the `nb` blocks the caller vouches for
        // (prefetches may point past them; they never fault).
        unsafe {
            while i + 4 <= nb {
                for j in 0..W {
                    let wp = w[j].add(i * wb);
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64).cast());
                    let u = [levels_pair::<F>(wp), levels_pair::<F>(wp.add(2 * wb))];
                    // The four blocks' scales (and mins), converted once for every row.
                    let wd = scales4::<F>(wp, wb);
                    let wm = if has_min { f16x4(wp.add(2), wb) } else { _mm_setzero_ps() };
                    for r in 0..R {
                        let ap = a[r].add(i * ab);
                        let d = _mm_mul_ps(wd, f16x4(ap, ab));
                        if has_min {
                            accm[j][r] = _mm_fmadd_ps(wm, f16x4(ap.add(2), ab), accm[j][r]);
                        }
                        let dz = _mm512_castps128_ps512(d);
                        for (half, idx) in [(0, idx01), (2, idx23)] {
                            let yp = ap.add(half * ab + aqs);
                            let y = _mm512_inserti64x4::<1>(
                                _mm512_castsi256_si512(_mm256_loadu_si256(yp.cast())),
                                _mm256_loadu_si256(yp.add(ab).cast()),
                            );
                            let mut s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[half / 2], y);
                            if off != 0 {
                                s = _mm512_sub_epi32(s, _mm512_dpbusd_epi32(_mm512_setzero_si512(), offv, y));
                            }
                            let acc = if half == 0 { &mut acc0[j][r] } else { &mut acc1[j][r] };
                            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(idx, dz), *acc);
                        }
                    }
                }
                i += 4;
            }
        }
        // The last one to three blocks, two at a time and then one (rows of 18 blocks,
        // as a 576-wide model has, spent most of their time here in scalar code).
        // SAFETY: as above; a pair is read only where two blocks remain.
        unsafe {
            while i < nb {
                let two = i + 2 <= nb;
                for j in 0..W {
                    let wp = w[j].add(i * wb);
                    let u = if two { levels_pair::<F>(wp) } else { levels_one::<F>(wp) };
                    // The one or two blocks' scales (and mins), zero in the other lanes.
                    let wd = scales2::<F>(wp, wb, two);
                    let wm = if has_min { f16x2(wp.add(2), wb, two) } else { _mm_setzero_ps() };
                    for r in 0..R {
                        let ap = a[r].add(i * ab);
                        let d = _mm_mul_ps(wd, f16x2(ap, ab, two));
                        if has_min {
                            accm[j][r] = _mm_fmadd_ps(wm, f16x2(ap.add(2), ab, two), accm[j][r]);
                        }
                        let yp = ap.add(aqs);
                        let y = if two {
                            _mm512_inserti64x4::<1>(
                                _mm512_castsi256_si512(_mm256_loadu_si256(yp.cast())),
                                _mm256_loadu_si256(yp.add(ab).cast()),
                            )
                        } else {
                            _mm512_zextsi256_si512(_mm256_loadu_si256(yp.cast()))
                        };
                        let mut s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y);
                        if off != 0 {
                            s = _mm512_sub_epi32(s, _mm512_dpbusd_epi32(_mm512_setzero_si512(), offv, y));
                        }
                        let dz = _mm512_castps128_ps512(d);
                        acc0[j][r] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(idx01, dz), acc0[j][r]);
                    }
                }
                i += if two { 2 } else { 1 };
            }
        }
        let mut out = [[0f32; R]; W];
        for j in 0..W {
            for r in 0..R {
                let mut sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j][r], acc1[j][r]));
                if has_min {
                    let m2 = _mm_add_ps(accm[j][r], _mm_movehl_ps(accm[j][r], accm[j][r]));
                    sum += _mm_cvtss_f32(_mm_add_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
                }
                out[j][r] = sum;
            }
        }
        out
    }

    /// i16 lane indices: lane l of register `r` picks scale `per * r + l / (32 / per)`.
    const fn scale_idx<const PER: usize>() -> [[i16; 32]; 4] {
        let mut t = [[0i16; 32]; 4];
        let mut r = 0;
        while r < 4 {
            let mut l = 0;
            while l < 32 {
                t[r][l] = (PER * r + l / (32 / PER)) as i16;
                l += 1;
            }
            r += 1;
        }
        t
    }
    static IDX_K4: [[i16; 32]; 4] = scale_idx::<2>();
    static IDX_K6: [[i16; 32]; 4] = scale_idx::<4>();

    /// The f16 at `p` as f32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    #[inline]
    unsafe fn f16_f32(p: *const u8) -> f32 {
        // SAFETY: the caller passes a readable 2-byte location.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(f16_at(p) as u16 as i32))) }
    }

    /// i16 lane indices for Q4_K/Q5_K mins: lane l picks lane 8 + l / 2 (min l / 2).
    static IDX_MIN: [i16; 16] = [8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15];

    /// The scales (i16 lanes 0..8) and mins (lanes 8..16) of a Q4_K/Q5_K block whose
    /// 12 packed scale bytes are at `s` (16 bytes readable), with ggml's `utmp` word
    /// trick done in one register (see [`scales_mins_k4`](super::super::scales_mins_k4)).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    #[inline]
    unsafe fn scales_mins_k4_v(s: *const u8) -> __m256i {
        const K1: i32 = 0x3f3f_3f3f;
        const K2: i32 = 0x0f0f_0f0f;
        // SAFETY: 16 readable bytes at `s` (the caller's block).
        let u = unsafe { _mm_loadu_si128(s.cast()) };
        // [u0 & K1, u2 & K2, u1 & K1, (u2 >> 4) & K2] ...
        let a = _mm_srlv_epi32(_mm_shuffle_epi32::<0b10_01_10_00>(u), _mm_setr_epi32(0, 0, 0, 4));
        let lo = _mm_and_si128(a, _mm_setr_epi32(K1, K2, K1, K2));
        // ... | [0, ((u0 >> 6) & 3s) << 4, 0, ((u1 >> 6) & 3s) << 4]
        let b = _mm_srli_epi32::<2>(_mm_shuffle_epi32::<0b01_00_00_00>(u));
        let hi = _mm_and_si128(b, _mm_setr_epi32(0, 0x3030_3030, 0, 0x3030_3030));
        _mm256_cvtepu8_epi16(_mm_or_si128(lo, hi))
    }

    /// Q4_K (`Q5 = false`) and Q5_K against Q8_K. Scales and mins are unpacked in
    /// vector registers; the mins meet the activations' `bsums` in one `vpmaddwd`.
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    pub unsafe fn dot_q4k<const Q5: bool>(w: *const u8, a: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { dot_q4k_rows::<Q5, 1>(w, a, 0, nb)[0] }
    }

    /// [`dot_q4k`] against `R` activation rows `stride` bytes apart: each block's levels
    /// and scales are unpacked once, and each row takes exactly the operations `dot_q4k`
    /// (`R = 1`) takes, so each result is bit-identical to that row's one-row dot.
    ///
    /// # Safety
    /// As for [`dot_q4k`], for every row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot_q4k_rows<const Q5: bool, const R: usize>(
        w: *const u8,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { q4k_tile::<Q5, 1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`dot_q4k_rows`] for `W` weight rows `w_stride` bytes apart, read side by side
    /// block by block (several memory streams at once); each (weight row, activation
    /// row) pair takes exactly [`dot_q4k`]'s operations.
    ///
    /// # Safety
    /// As for [`dot_q4k`], for every weight row and every activation row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn q4k_tile<const Q5: bool, const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let w: [*const u8; W] = std::array::from_fn(|j| w.wrapping_add(j * w_stride));
        let (wb, qs) = if Q5 { (176, 48) } else { (144, 16) };
        const AB: usize = 292;
        let nib = _mm512_set1_epi8(0x0F);
        let mut accf = [[_mm512_setzero_ps(); R]; W];
        let mut accm = [[_mm256_setzero_ps(); R]; W];
        // SAFETY: pointers stay inside the caller's `nb` blocks (prefetches excepted:
        // they never fault).
        unsafe {
            let idx = IDX_K4.map(|r| _mm512_loadu_si512(r.as_ptr().cast()));
            let idx_min = _mm256_loadu_si256(IDX_MIN.as_ptr().cast());
            // `vpmultishiftqb` bit offsets: byte j of each qword from bit 8j (lower four
            // qwords) or 8j + 4 (upper four).
            let nibble_shifts = _mm512_set_epi64(
                0x3c34_2c24_1c14_0c04,
                0x3c34_2c24_1c14_0c04,
                0x3c34_2c24_1c14_0c04,
                0x3c34_2c24_1c14_0c04,
                0x3830_2820_1810_0800,
                0x3830_2820_1810_0800,
                0x3830_2820_1810_0800,
                0x3830_2820_1810_0800,
            );
            for i in 0..nb {
                for j in 0..W {
                    let wp = w[j].add(i * wb);
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 128).cast());
                    let sm = scales_mins_k4_v(wp.add(4));
                    let scz = _mm512_castsi256_si512(sm);
                    let qhz = if Q5 {
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(wp.add(16).cast()))
                    } else {
                        _mm512_setzero_si512()
                    };
                    let mut u = [_mm512_setzero_si512(); 4];
                    let mut sc = [_mm512_setzero_si512(); 4];
                    for n in 0..4 {
                        let qz = _mm512_broadcast_i64x4(_mm256_loadu_si256(wp.add(qs + 32 * n).cast()));
                        // Low nibbles in the lower half, high nibbles in the upper half.
                        u[n] = _mm512_and_si512(_mm512_multishift_epi64_epi8(nibble_shifts, qz), nib);
                        if Q5 {
                            let bits = _mm512_mask_blend_epi64(
                                0xF0,
                                _mm512_set1_epi8(1 << (2 * n)),
                                _mm512_set1_epi8((2u8 << (2 * n)) as i8),
                            );
                            let k = _mm512_test_epi8_mask(qhz, bits);
                            u[n] = _mm512_mask_add_epi8(u[n], k, u[n], _mm512_set1_epi8(16));
                        }
                        sc[n] = _mm512_permutexvar_epi16(idx[n], scz);
                    }
                    let dm = _mm512_cvtph_ps(_mm256_set1_epi32(wp.cast::<i32>().read_unaligned()));
                    let mins = _mm256_permutexvar_epi16(idx_min, sm);
                    for r in 0..R {
                        let ap = a.wrapping_add(r * stride).add(i * AB);
                        let mut isum = _mm512_setzero_si512();
                        for n in 0..4 {
                            let y = _mm512_loadu_si512(ap.add(4 + 64 * n).cast());
                            let p = _mm512_maddubs_epi16(u[n], y);
                            isum = _mm512_dpwssd_epi32(isum, p, sc[n]);
                        }
                        let dy = _mm512_set1_ps(ap.cast::<f32>().read());
                        // lanes: even = d·dy, odd = dmin·dy
                        let dd = _mm512_mul_ps(dm, dy);
                        accf[j][r] = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(isum),
                            _mm512_permutexvar_ps(_mm512_setzero_si512(), dd),
                            accf[j][r],
                        );
                        let bsums = _mm256_loadu_si256(ap.add(4 + QK_K).cast());
                        let mv = _mm256_madd_epi16(bsums, mins);
                        let dmin = _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_set1_epi32(1), dd));
                        accm[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mv), dmin, accm[j][r]);
                    }
                }
            }
        }
        let mut out = [[0f32; R]; W];
        for j in 0..W {
            for r in 0..R {
                let (accm, accf) = (accm[j][r], accf[j][r]);
                let m = _mm256_add_ps(accm, _mm256_permute2f128_ps::<1>(accm, accm));
                let m = _mm_add_ps(
                    _mm256_castps256_ps128(m),
                    _mm_movehl_ps(_mm256_castps256_ps128(m), _mm256_castps256_ps128(m)),
                );
                let m = _mm_add_ss(m, _mm_shuffle_ps::<1>(m, m));
                out[j][r] = _mm512_reduce_add_ps(accf) - _mm_cvtss_f32(m);
            }
        }
        out
    }

    /// Q6_K against `R` activation rows `stride` bytes apart ([`tile_q6k`] as 1 × `R`):
    /// each result bit-identical to that row's [`dot_q6k`].
    ///
    /// # Safety
    /// As for [`dot_q6k`], for every row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn q6k_rows<const R: usize>(w: *const u8, a: *const u8, stride: usize, nb: usize) -> [f32; R] {
        // SAFETY: forwarded contract.
        unsafe { q6k_tile_rows::<1, R>(w, 0, a, stride, nb)[0] }
    }

    /// [`tile_q6k`] as `W` weight rows `w_stride` bytes apart × `R` activation rows,
    /// results by weight row.
    ///
    /// # Safety
    /// As for [`dot_q6k`], for every weight row and every activation row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn q6k_tile_rows<const W: usize, const R: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        stride: usize,
        nb: usize,
    ) -> [[f32; R]; W] {
        let mut t = [[0f32; W]; R];
        // SAFETY: forwarded contract; `t` holds `R` rows of `W` results.
        unsafe { tile_q6k::<W, R>(w, w_stride, a, stride, nb, t.as_mut_ptr().cast(), W) };
        std::array::from_fn(|i| std::array::from_fn(|r| t[r][i]))
    }

    /// Q6_K against Q8_K.
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), on a CPU with the features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn dot_q6k(w: *const u8, a: *const u8, nb: usize) -> f32 {
        let mut out = 0.0f32;
        // SAFETY: one weight row and one activation row, as the caller vouches.
        unsafe { tile_q6k::<1, 1>(w, 0, a, 0, nb, &mut out, 0) };
        out
    }

    /// Q6_K against Q8_K, `WR` weight rows × `AR` activation rows (weight row `i` at
    /// `w + i·ws`, activation row `j` at `a + j·as_`, `out[j·os + i]`): each weight block
    /// is unpacked once for all `AR` rows. [`dot_q6k`] runs it as 1 × 1.
    ///
    /// # Safety
    /// As for [`DotFn`](super::DotFn), for every row; `out[j·os + i]` must be writable;
    /// a CPU with the features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tile_q6k<const WR: usize, const AR: usize>(
        w: *const u8,
        ws: usize,
        a: *const u8,
        as_: usize,
        nb: usize,
        out: *mut f32,
        os: usize,
    ) {
        const WB: usize = 210;
        const AB: usize = 292;
        let nib = _mm512_set1_epi8(0x0F);
        let hb = _mm512_set1_epi8(0x30);
        let shl = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);
        let shr = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
        let mut accf = [[_mm512_setzero_ps(); AR]; WR];
        // SAFETY: pointers stay inside the caller's `WR` weight rows and `AR` activation
        // rows of `nb` blocks each (prefetches excepted: they never fault).
        unsafe {
            let idx = IDX_K6.map(|r| _mm512_loadu_si512(r.as_ptr().cast()));
            for i in 0..nb {
                let mut sc16 = [_mm256_setzero_si256(); WR];
                let mut dx = [0.0f32; WR];
                for wi in 0..WR {
                    let wp = w.add(wi * ws + i * WB);
                    for p in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * p).cast());
                    }
                    sc16[wi] = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp.add(192).cast()));
                    dx[wi] = f16_f32(wp.add(208));
                }
                let mut isum = [[_mm512_setzero_si512(); AR]; WR];
                for n in 0..2 {
                    for half in 0..2 {
                        let mut u = [_mm512_setzero_si512(); WR];
                        let mut s = [_mm512_setzero_si512(); WR];
                        for wi in 0..WR {
                            let wp = w.add(wi * ws + i * WB);
                            let ql = _mm512_loadu_si512(wp.add(64 * n).cast());
                            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(wp.add(128 + 32 * n).cast()));
                            u[wi] = if half == 0 {
                                _mm512_or_si512(
                                    _mm512_and_si512(ql, nib),
                                    _mm512_and_si512(_mm512_sllv_epi64(qh, shl), hb),
                                )
                            } else {
                                _mm512_or_si512(
                                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), nib),
                                    _mm512_and_si512(_mm512_srlv_epi64(qh, shr), hb),
                                )
                            };
                            s[wi] = _mm512_permutexvar_epi16(idx[2 * n + half], _mm512_castsi256_si512(sc16[wi]));
                        }
                        for r in 0..AR {
                            let y = _mm512_loadu_si512(a.add(r * as_ + i * AB + 4 + 128 * n + 64 * half).cast());
                            for wi in 0..WR {
                                isum[wi][r] = _mm512_dpwssd_epi32(isum[wi][r], _mm512_maddubs_epi16(u[wi], y), s[wi]);
                            }
                        }
                    }
                }
                for r in 0..AR {
                    let ap = a.add(r * as_ + i * AB);
                    let dy = ap.cast::<f32>().read();
                    let bsums = _mm256_loadu_si256(ap.add(4 + QK_K).cast());
                    for wi in 0..WR {
                        let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16[wi]));
                        let is = _mm512_sub_epi32(isum[wi][r], _mm512_zextsi256_si512(corr));
                        accf[wi][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(dx[wi] * dy), accf[wi][r]);
                    }
                }
            }
            for r in 0..AR {
                for wi in 0..WR {
                    out.add(r * os + wi).write(_mm512_reduce_add_ps(accf[wi][r]));
                }
            }
        }
    }
}
