//! GGML Q5_K: Q4_K plus a fifth bit per value (`block_q5_K` in ggml-common.h): value
//! `64n + l` (l < 32) has its high bit in bit `2n` of `qh[l]`, value `64n + 32 + l` in
//! bit `2n + 1`. Scales and mins are packed as in Q4_K.

use half::f16;

use super::q4_k::{K_SCALE_SIZE, get_scale_min_k4};
use super::q8_k::BlockQ8K;
use super::{Block, QK_K};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ5K>() == 2 * 2 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2);

// SAFETY: repr(C), f16s + u8 arrays, no padding (asserted above).
unsafe impl Block for BlockQ5K {
    const DTYPE: DType = DType::Q5_K;
}

/// The 5-bit levels of one block in value order.
fn unpack(b: &BlockQ5K) -> [u8; QK_K] {
    let mut a = [0u8; QK_K];
    for (n, ql) in b.qs.chunks_exact(32).enumerate() {
        let (u1, u2) = (1u8 << (2 * n), 2u8 << (2 * n));
        for l in 0..32 {
            a[64 * n + l] = (ql[l] & 0xF) + if b.qh[l] & u1 != 0 { 16 } else { 0 };
            a[64 * n + l + 32] = (ql[l] >> 4) + if b.qh[l] & u2 != 0 { 16 } else { 0 };
        }
    }
    a
}

/// `dequantize_row_q5_K`.
pub fn dequantize(blocks: &[BlockQ5K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        let q = unpack(b);
        for (j, (q, y)) in q.chunks_exact(32).zip(y.chunks_exact_mut(32)).enumerate() {
            let (sc, m) = get_scale_min_k4(j, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            for (y, &q) in y.iter_mut().zip(q) {
                *y = d1 * q as f32 - m1;
            }
        }
    }
}

/// `ggml_vec_dot_q5_K_q8_K` (generic), the same shape as Q4_K's.
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let a = unpack(x);
        let (mut isum, mut summs) = (0i32, 0i32);
        for j in 0..QK_K / 32 {
            let (sc, m) = get_scale_min_k4(j, &x.scales);
            summs += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
            let s: i32 = (32 * j..32 * j + 32).map(|i| a[i] as i32 * y.qs[i] as i32).sum();
            isum += sc as i32 * s;
        }
        sumf += x.d.to_f32() * y.d * isum as f32 - x.dmin.to_f32() * y.d * summs as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot};
    use crate::{q8_k, zeroed_blocks};

    fn random_blocks(rng: &mut Rng, n: usize) -> Vec<BlockQ5K> {
        (0..n)
            .map(|_| {
                let mut b: BlockQ5K = zeroed_blocks(1)[0];
                b.d = f16::from_f32(rng.uniform().abs() * 0.01);
                b.dmin = f16::from_f32(rng.uniform().abs() * 0.01);
                b.scales.copy_from_slice(&rng.bytes(K_SCALE_SIZE));
                b.qh.copy_from_slice(&rng.bytes(QK_K / 8));
                b.qs.copy_from_slice(&rng.bytes(QK_K / 2));
                b
            })
            .collect()
    }

    #[test]
    fn high_bits_land_where_ggml_puts_them() {
        let mut b: BlockQ5K = zeroed_blocks(1)[0];
        b.d = f16::from_f32(1.0);
        b.scales[0] = 1; // sub-block 0: sc 1
        b.scales[1] = 1; // sub-block 1: sc 1
        b.scales[2] = 2; // sub-block 2: sc 2
        b.qh[5] = 0b0000_0111; // values 5 (bit 0), 37 (bit 1), 69 (bit 2)
        b.qs[5] = 0x21; // value 5 low nibble 1, value 37 low nibble 2
        let mut y = [0.0; QK_K];
        dequantize(&[b], &mut y);
        assert_eq!((y[5], y[37], y[69], y[6]), (17.0, 18.0, 32.0, 0.0));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(13);
        let qw = random_blocks(&mut rng, 4);
        let a = rng.vec(QK_K * 4, 2.0);
        let mut qa = zeroed_blocks(4);
        q8_k::quantize(&a, &mut qa);
        let (mut dw, mut da) = (vec![0.0; a.len()], vec![0.0; a.len()]);
        dequantize(&qw, &mut dw);
        q8_k::dequantize(&qa, &mut da);
        let got = vec_dot_q5_k_q8_k(&qw, &qa);
        let want = dot(&dw, &da);
        assert!((got - want).abs() <= 1e-5 * abs_dot(&dw, &da), "{got} vs {want}");
    }
}
