//! GGML Q8_K: 256 values as `q · d` with an f32 scale and per-16 sums of q
//! (`block_q8_K` in ggml-common.h). The format activations are quantized to for the
//! K-quant dot products; `bsums` lets them fold in the weights' mins cheaply.

use super::{Block, QK_K, nearest_int};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    /// Σ qs over each group of 16.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);
const _: () = assert!(size_of::<BlockQ8K>() == 4 + QK_K + 2 * QK_K / 16);
const _: () = assert!(align_of::<BlockQ8K>() == 4);

// SAFETY: repr(C), f32 + i8/i16 arrays, no padding (asserted above).
unsafe impl Block for BlockQ8K {
    const DTYPE: DType = DType::Q8_K;
}

/// `dequantize_row_q8_K`.
pub fn dequantize(blocks: &[BlockQ8K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = b.d * q as f32;
        }
    }
}

/// `quantize_row_q8_K_ref`: iscale = −127 / (the value of largest magnitude),
/// q = min(127, nearest_int(iscale · x)), d = 1 / iscale.
pub fn quantize(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * QK_K);
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; QK_K];
            b.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, qs) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

/// Σ x·y for two Q8_K rows (ggml has no such kernel; handy for tests and Q8_K weights).
pub fn vec_dot_q8_k_q8_k(x: &[BlockQ8K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&a, &b)| a as i32 * b as i32).sum();
        sumf += x.d * y.d * sumi as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};

    fn roundtrip(x: &[f32]) -> (Vec<BlockQ8K>, Vec<f32>) {
        quantize_roundtrip(x, quantize, dequantize)
    }

    #[test]
    fn roundtrip_error_and_bsums() {
        let mut rng = Rng::new(8);
        let x = rng.vec(QK_K * 8, 1.0);
        let (b, y) = roundtrip(&x);
        for ((xb, yb), blk) in x.chunks(QK_K).zip(y.chunks(QK_K)).zip(&b) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let bound = amax / 127.0 * 0.5 * 1.0001;
            assert!(xb.iter().zip(yb).all(|(a, b)| (a - b).abs() <= bound));
            for (j, s) in blk.bsums.iter().enumerate() {
                assert_eq!(*s as i32, blk.qs[j * 16..][..16].iter().map(|&q| q as i32).sum::<i32>());
            }
        }
    }

    #[test]
    fn zeros_and_huge_values() {
        let (b, y) = roundtrip(&[0.0; QK_K]);
        assert_eq!(b[0].d, 0.0);
        assert!(y.iter().all(|v| *v == 0.0));
        let mut x = vec![0.5f32; QK_K];
        x[9] = -1.0e30; // f32 scale: no f16 overflow
        let (_, y) = roundtrip(&x);
        assert!((y[9] + 1.0e30).abs() <= 1.0e30 * 1e-6, "{}", y[9]);
        assert_eq!(y[0], 0.0);
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(9);
        let (a, c) = (rng.vec(QK_K * 4, 1.0), rng.vec(QK_K * 4, 1.0));
        let ((qa, da), (qc, dc)) = (roundtrip(&a), roundtrip(&c));
        let got = vec_dot_q8_k_q8_k(&qa, &qc);
        assert!((got - dot(&da, &dc)).abs() <= 1e-5 * abs_dot(&da, &dc));
    }
}
