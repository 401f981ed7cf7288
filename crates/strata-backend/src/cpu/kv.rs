//! KV cache rows stored as f16 or Q8_0 in the CPU backend's f32 buffers: an f16 row packs
//! two values per f32 slot; a Q8_0 row holds, per 32 values, an f32 scale and 32 signed
//! bytes (9 slots), with the values rounded to the nearest of 255 levels of the block's
//! largest magnitude.

use crate::{KvType, Q8_BLOCK};

/// Slots per Q8_0 block: the scale and 32 bytes.
const Q8_SLOTS: usize = Q8_BLOCK / 4 + 1;

/// Stores `values` (one row) into `row` (its [`KvType::row_len`] slots) as `ty`.
pub fn encode(ty: KvType, values: &[f32], row: &mut [f32]) {
    match ty {
        KvType::F32 => row[..values.len()].copy_from_slice(values),
        KvType::F16 => simd::to_f16(values, &mut as_u16(row)[..values.len()]),
        KvType::Q8_0 => {
            for (block, slots) in values.chunks(Q8_BLOCK).zip(row.chunks_exact_mut(Q8_SLOTS)) {
                let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                slots[0] = d;
                let qs = as_i8(&mut slots[1..]);
                qs.fill(0);
                for (q, &v) in qs.iter_mut().zip(block) {
                    *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                }
            }
        }
    }
}

/// Values `off..off + out.len()` of a stored row, decoded into `out`.
pub fn decode(ty: KvType, row: &[f32], off: usize, out: &mut [f32]) {
    match ty {
        KvType::F32 => out.copy_from_slice(&row[off..off + out.len()]),
        KvType::F16 => simd::from_f16(&as_u16_ref(row)[off..off + out.len()], out),
        KvType::Q8_0 => {
            // Block by block: the part of each block inside `off..off + out.len()`.
            let mut done = 0;
            while done < out.len() {
                let at = off + done;
                let (block, inner) = (at / Q8_BLOCK, at % Q8_BLOCK);
                let n = (Q8_BLOCK - inner).min(out.len() - done);
                let slots = &row[block * Q8_SLOTS..][..Q8_SLOTS];
                simd::from_i8(&as_i8_ref(&slots[1..])[inner..inner + n], slots[0], &mut out[done..done + n]);
                done += n;
            }
        }
    }
}

/// The conversions, with F16C / AVX-512 where the CPU has them (attention decodes a Q8_0
/// cache's positions once per call; it reads an f16 cache as it is, widening in the
/// score and value loops).
mod simd {
    /// `out[i] = f16(values[i])`, rounded to nearest even.
    pub fn to_f16(values: &[f32], out: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the features were just detected.
            return unsafe { x86::to_f16(values, out) };
        }
        for (o, &v) in out.iter_mut().zip(values) {
            *o = half::f16::from_f32(v).to_bits();
        }
    }

    /// `out[i] = f32(halves[i])`.
    pub fn from_f16(halves: &[u16], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the features were just detected.
            return unsafe { x86::from_f16(halves, out) };
        }
        for (o, &h) in out.iter_mut().zip(halves) {
            *o = half::f16::from_bits(h).to_f32();
        }
    }

    /// `out[i] = d · q[i]`.
    pub fn from_i8(q: &[i8], d: f32, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was just detected.
            return unsafe { x86::from_i8(q, d, out) };
        }
        for (o, &v) in out.iter_mut().zip(q) {
            *o = d * v as f32;
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[target_feature(enable = "avx,f16c")]
        pub unsafe fn to_f16(values: &[f32], out: &mut [u16]) {
            let n = values.len().min(out.len());
            let mut i = 0;
            // SAFETY: 8 values are read and 8 halves written at `i` only while `i + 8 ≤ n`.
            unsafe {
                while i + 8 <= n {
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(values.as_ptr().add(i)));
                    _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), h);
                    i += 8;
                }
            }
            for j in i..n {
                out[j] = half::f16::from_f32(values[j]).to_bits();
            }
        }

        #[target_feature(enable = "avx,f16c")]
        pub unsafe fn from_f16(halves: &[u16], out: &mut [f32]) {
            let n = halves.len().min(out.len());
            let mut i = 0;
            // SAFETY: as in `to_f16`.
            unsafe {
                while i + 8 <= n {
                    let v = _mm256_cvtph_ps(_mm_loadu_si128(halves.as_ptr().add(i).cast()));
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
                    i += 8;
                }
            }
            for j in i..n {
                out[j] = half::f16::from_bits(halves[j]).to_f32();
            }
        }

        #[target_feature(enable = "avx2")]
        pub unsafe fn from_i8(q: &[i8], d: f32, out: &mut [f32]) {
            let n = q.len().min(out.len());
            let dv = _mm256_set1_ps(d);
            let mut i = 0;
            // SAFETY: 8 bytes are read and 8 values written at `i` only while `i + 8 ≤ n`.
            unsafe {
                while i + 8 <= n {
                    let b = _mm_loadl_epi64(q.as_ptr().add(i).cast());
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(dv, v));
                    i += 8;
                }
            }
            for j in i..n {
                out[j] = d * q[j] as f32;
            }
        }
    }
}

fn as_u16(slots: &mut [f32]) -> &mut [u16] {
    // SAFETY: f32 is 4-aligned and 4 bytes, so the slots are twice as many aligned u16s,
    // every bit pattern of which is valid; the exclusive borrow carries over.
    unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<u16>(), slots.len() * 2) }
}

pub(super) fn as_u16_ref(slots: &[f32]) -> &[u16] {
    // SAFETY: as for `as_u16`, shared.
    unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<u16>(), slots.len() * 2) }
}

fn as_i8(slots: &mut [f32]) -> &mut [i8] {
    // SAFETY: as for `as_u16`, four bytes per slot.
    unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<i8>(), slots.len() * 4) }
}

fn as_i8_ref(slots: &[f32]) -> &[i8] {
    // SAFETY: as for `as_i8`, shared.
    unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<i8>(), slots.len() * 4) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_their_precision() {
        let values: Vec<f32> = (0..80).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let mut row = vec![0.0f32; ty.row_len(values.len())];
            encode(ty, &values, &mut row);
            let mut back = vec![0.0f32; 70];
            decode(ty, &row, 5, &mut back);
            for (i, (&b, &v)) in back.iter().zip(&values[5..]).enumerate() {
                let amax = values[(5 + i) / 32 * 32..].iter().take(32).fold(0.0f32, |m, v| m.max(v.abs()));
                let tol = match ty {
                    KvType::F32 => 0.0,
                    KvType::F16 => v.abs() / 1024.0,
                    KvType::Q8_0 => amax / 127.0 / 2.0 + 1e-6,
                };
                assert!((b - v).abs() <= tol, "{ty:?} value {}: {b} vs {v}", 5 + i);
            }
        }
        assert_eq!(KvType::Q8_0.row_len(64), 18);
        assert_eq!(KvType::F16.row_len(64), 32);
    }
}
