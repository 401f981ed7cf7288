//! AVX-512 activation quantizers: the same results, bit for bit, as the scalar
//! `quantize_row_q8_0_ref`, `quantize_row_q8_1_ref` and `quantize_row_q8_K_ref` ports
//! (the products `x · id` are the same IEEE multiplies; `roundf`'s ties away from zero
//! and `nearest_int`'s ties to even are reproduced exactly). Unavailable off x86-64.

use crate::q8_0::BlockQ8_0;
use crate::q8_1::BlockQ8_1;
use crate::q8_k::BlockQ8K;

/// Whether this CPU runs the quantizers here (AVX-512 F and BW).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        crate::isa::avx512() && has!("avx512f") && has!("avx512bw") && has!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

super::activation_quantizers!();

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{BlockQ8_0, BlockQ8_1, BlockQ8K};

    /// `roundf` of each lane (ties away from zero): truncate, then step away from zero
    /// where the dropped fraction is at least one half (`v − trunc(v)` is exact).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn round_away(v: __m512) -> __m512 {
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        let frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
        let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
        // ±1 with the sign of `v`.
        let sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN));
        let one = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(1.0))));
        _mm512_mask_add_ps(t, up, t, one)
    }

    /// One 32-value block of `quantize_row_q8_0_ref`: the levels into `qs`, the
    /// unrounded `d` returned, and `Σ qs`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn block32(x: *const f32, qs: *mut i8) -> (f32, i32) {
        // SAFETY: 32 readable floats at `x`, 32 writable bytes at `qs` (the callers').
        unsafe {
            let (a, b) = (_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(16)));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            let d = amax / 127.0;
            let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let qa = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(a, id)));
            let qb = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(b, id)));
            _mm_storeu_si128(qs.cast(), _mm512_cvtepi32_epi8(qa));
            _mm_storeu_si128(qs.add(16).cast(), _mm512_cvtepi32_epi8(qb));
            (d, _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)))
        }
    }

    super::super::block_quantizers!("avx512f,avx512bw,avx512vl");

    /// # Safety
    /// AVX-512 F/BW/VL; `x.len() == 256 · out.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn q8_k(x: &[f32], out: &mut [BlockQ8K]) {
        for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
            let p = xb.as_ptr();
            // SAFETY: 256 readable floats at `p`.
            let v: [__m512; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(p.add(16 * i)) });
            let amax =
                _mm512_reduce_max_ps(v.iter().fold(_mm512_setzero_ps(), |m, x| _mm512_max_ps(m, _mm512_abs_ps(*x))));
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
                    let k = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(*x), _mm512_set1_ps(amax));
                    (k != 0).then(|| 16 * i + k.trailing_zeros() as usize)
                })
                .expect("amax is some lane's magnitude");
            let iscale = -127.0 / xb[first];
            let is = _mm512_set1_ps(iscale);
            for (i, x) in v.iter().enumerate() {
                // `nearest_int` is round-to-nearest-even, the default conversion mode.
                let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(*x, is)), _mm512_set1_epi32(127));
                // SAFETY: 16 bytes of `qs` at 16·i.
                unsafe { _mm_storeu_si128(b.qs.as_mut_ptr().add(16 * i).cast(), _mm512_cvtepi32_epi8(q)) };
                b.bsums[i] = _mm512_reduce_add_epi32(q) as i16;
            }
            b.d = 1.0 / iscale;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::simd::act256;
    use crate::testutil::Rng;
    use crate::{q8_0, q8_1, q8_k, zeroed_blocks};

    /// Inputs with halves, zeros, one block of all zeros, a repeated largest magnitude of
    /// both signs, and a block whose scale is exactly 1 so the rounding meets ties.
    fn inputs(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        let mut x = rng.vec(n, 1.0);
        for (i, v) in x.iter_mut().enumerate() {
            match i % 7 {
                0 => *v = (*v * 8.0).round() / 2.0,
                1 => *v = 0.0,
                _ => {}
            }
        }
        x[256..512].fill(0.0);
        x[600] = 3.0;
        x[601] = -3.0;
        // A block scaled by exactly 1 (largest magnitude 127), so `x · id` hits ties.
        x[768] = -127.0;
        for (i, v) in x[769..1024].iter_mut().enumerate() {
            *v = (i as f32 - 128.0) / 2.0;
        }
        x
    }

    /// The AVX-512 quantizers here and the AVX2 ones of `act256`, each where the CPU has
    /// it.
    #[test]
    fn simd_activation_quantizers_match_the_references_bit_for_bit() {
        type Set =
            (fn(&[f32], &mut [q8_0::BlockQ8_0]), fn(&[f32], &mut [q8_1::BlockQ8_1]), fn(&[f32], &mut [q8_k::BlockQ8K]));
        let sets: [(&str, bool, Set); 2] = [
            ("AVX-512", super::available(), (super::q8_0, super::q8_1, super::q8_k)),
            ("AVX2", act256::available(), (act256::q8_0, act256::q8_1, act256::q8_k)),
        ];
        for (name, _, (q80, q81, q8k)) in sets.into_iter().filter(|s| s.1) {
            for seed in 0..20 {
                let x = inputs(1024, seed);
                let (mut a, mut b) = (zeroed_blocks::<q8_0::BlockQ8_0>(32), zeroed_blocks::<q8_0::BlockQ8_0>(32));
                q8_0::quantize(&x, &mut a);
                q80(&x, &mut b);
                assert_eq!(a, b, "{name} q8_0, seed {seed}");
                let (mut a, mut b) = (zeroed_blocks::<q8_1::BlockQ8_1>(32), zeroed_blocks::<q8_1::BlockQ8_1>(32));
                q8_1::quantize(&x, &mut a);
                q81(&x, &mut b);
                assert_eq!(a, b, "{name} q8_1, seed {seed}");
                let (mut a, mut b) = (zeroed_blocks::<q8_k::BlockQ8K>(4), zeroed_blocks::<q8_k::BlockQ8K>(4));
                q8_k::quantize(&x, &mut a);
                q8k(&x, &mut b);
                assert_eq!(a, b, "{name} q8_k, seed {seed}");
            }
        }
    }
}
