//! AVX2 activation quantizers for CPUs without AVX-512 (Zen 2 and 3, most desktop Intel
//! parts): the same results, bit for bit, as the scalar `quantize_row_q8_0_ref`,
//! `quantize_row_q8_1_ref` and `quantize_row_q8_K_ref` ports, as [`super::act512`]'s
//! are. Unavailable off x86-64.

use crate::q8_0::BlockQ8_0;
use crate::q8_1::BlockQ8_1;
use crate::q8_k::BlockQ8K;

/// Whether this CPU runs the quantizers here (AVX2, and not capped below it by
/// `STRATA_CPU_ISA`).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::avx2() && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

super::activation_quantizers!();

#[cfg(target_arch = "x86_64")]
pub mod imp {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{BlockQ8_0, BlockQ8_1, BlockQ8K};

    /// Every lane's magnitude (the sign bit cleared).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn abs(v: __m256) -> __m256 {
        _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX)))
    }

    /// The largest lane (of lanes that are not NaN; also the CPU backend's AVX2 kernels').
    #[target_feature(enable = "avx2")]
    #[inline]
    pub fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)))
    }

    /// The sum of the lanes.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
    }

    /// `roundf` of each lane (ties away from zero): truncate, then step away from zero
    /// where the dropped fraction is at least one half (`v − trunc(v)` is exact).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn round_away(v: __m256) -> __m256 {
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(abs(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5));
        // ±1 with the sign of `v`, where the fraction rounds up.
        let sign = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)));
        _mm256_add_ps(t, _mm256_and_ps(_mm256_or_ps(sign, _mm256_set1_ps(1.0)), up))
    }

    /// Four vectors of eight i32 levels (each within i8) as 32 bytes, in order, at `qs`.
    ///
    /// # Safety
    /// AVX2; 32 writable bytes at `qs`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn store_levels(q: [__m256i; 4], qs: *mut i8) {
        // The packs work within 128-bit halves: dwords come out as q0 q1 q2 q3 (lows),
        // then q0 q1 q2 q3 (highs); the permutation puts each vector's two back together.
        let b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: the caller's 32 bytes.
        unsafe { _mm256_storeu_si256(qs.cast(), b) };
    }

    /// One 32-value block of `quantize_row_q8_0_ref`: the levels into `qs`, the
    /// unrounded `d` returned, and `Σ qs`.
    ///
    /// # Safety
    /// AVX2; 32 readable floats at `x`, 32 writable bytes at `qs`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn block32(x: *const f32, qs: *mut i8) -> (f32, i32) {
        // SAFETY: the caller's bounds.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.add(8 * i)));
            let amax = hmax(_mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3]))));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let q = v.map(|v| _mm256_cvtps_epi32(round_away(_mm256_mul_ps(v, id))));
            store_levels(q, qs);
            (d, hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]))))
        }
    }

    super::super::block_quantizers!("avx2");

    /// # Safety
    /// AVX2; `x.len() == 256 · out.len()`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn q8_k(x: &[f32], out: &mut [BlockQ8K]) {
        for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
            let p = xb.as_ptr();
            // SAFETY: 256 readable floats at `p`.
            let v: [__m256; 32] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(p.add(8 * i)) });
            let amax = hmax(v.iter().fold(_mm256_setzero_ps(), |m, x| _mm256_max_ps(m, abs(*x))));
            if amax == 0.0 {
                b.d = 0.0;
                b.qs = [0; 256];
                b.bsums = [0; 16];
                continue;
            }
            // The value the reference keeps: the first of largest magnitude.
            let first = v
                .iter()
                .enumerate()
                .find_map(|(i, x)| {
                    let k = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(*x), _mm256_set1_ps(amax)));
                    (k != 0).then(|| 8 * i + k.trailing_zeros() as usize)
                })
                .expect("amax is some lane's magnitude");
            let iscale = -127.0 / xb[first];
            let is = _mm256_set1_ps(iscale);
            for (i, x) in v.chunks_exact(4).enumerate() {
                // `nearest_int` is round-to-nearest-even, the default conversion mode.
                let q: [__m256i; 4] = std::array::from_fn(|j| {
                    _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x[j], is)), _mm256_set1_epi32(127))
                });
                // SAFETY: 32 bytes of `qs` at 32·i.
                unsafe { store_levels(q, b.qs.as_mut_ptr().add(32 * i)) };
                b.bsums[2 * i] = hsum_epi32(_mm256_add_epi32(q[0], q[1])) as i16;
                b.bsums[2 * i + 1] = hsum_epi32(_mm256_add_epi32(q[2], q[3])) as i16;
            }
            b.d = 1.0 / iscale;
        }
    }
}
