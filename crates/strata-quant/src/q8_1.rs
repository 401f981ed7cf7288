//! GGML Q8_1: like Q8_0 plus `s = d · Σ q` (`block_q8_1` in ggml-common.h). The format
//! activations are quantized to for the dot products of Q4_1 and Q5_1, whose offset `m`
//! multiplies `s`.

use half::f16;

use super::{Block, QK, q8_0};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    /// d · Σ qs
    pub s: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ8_1>() == 4 + QK);

// SAFETY: repr(C), f16s + i8 array, no padding (asserted above).
unsafe impl Block for BlockQ8_1 {
    const DTYPE: DType = DType::Q8_1;
}

/// `d · q` (ggml has no `dequantize_row_q8_1`; `s` is redundant and ignored).
pub fn dequantize(blocks: &[BlockQ8_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        q8_0::dequantize_levels(b.d.to_f32(), &b.qs, y);
    }
}

/// `quantize_row_q8_1_ref`.
pub fn quantize(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let d = q8_0::quantize_levels(xb, &mut b.qs);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = f16::from_f32(d);
        b.s = f16::from_f32(sum as f32 * d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;
    use crate::zeroed_blocks;

    #[test]
    fn roundtrip_and_sum() {
        let mut rng = Rng::new(11);
        let x = rng.vec(QK * 32, 2.0);
        let mut b = zeroed_blocks::<BlockQ8_1>(32);
        quantize(&x, &mut b);
        let mut y = vec![0.0; x.len()];
        dequantize(&b, &mut y);
        for ((xb, yb), blk) in x.chunks(QK).zip(y.chunks(QK)).zip(&b) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let bound = amax / 127.0 * 0.5 + amax * 2f32.powi(-11) * 1.01;
            assert!(xb.iter().zip(yb).all(|(a, b)| (a - b).abs() <= bound));
            let s: f32 = yb.iter().sum();
            assert!(
                (blk.s.to_f32() - s).abs() <= s.abs() * 2f32.powi(-10) + 32.0 * amax * 2f32.powi(-11) * 1.01 + 1e-6,
                "{} vs {s}",
                blk.s
            );
        }
    }

    #[test]
    fn zeros() {
        let mut b = zeroed_blocks::<BlockQ8_1>(1);
        quantize(&[0.0; QK], &mut b);
        assert_eq!((b[0].d.to_f32(), b[0].s.to_f32()), (0.0, 0.0));
        assert!(b[0].qs.iter().all(|q| *q == 0));
    }
}
