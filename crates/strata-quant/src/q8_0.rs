//! GGML Q8_0: 32 values as `i8 · d` with one f16 scale (`block_q8_0` in ggml-common.h).
//! Also the format activations are quantized to for the dot products of Q4_0, Q5_0,
//! Q8_0 and Strata's `AffineQ4` and `I8`.

use half::f16;

use super::{Block, QK};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_0>() == 2 + QK);

// SAFETY: repr(C), f16 + i8 array, no padding (asserted above).
unsafe impl Block for BlockQ8_0 {
    const DTYPE: DType = DType::Q8_0;
}

/// `dequantize_row_q8_0`.
pub fn dequantize(blocks: &[BlockQ8_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        dequantize_levels(b.d.to_f32(), &b.qs, y);
    }
}

/// `q · d` for one block's levels (shared with Q8_1).
pub(super) fn dequantize_levels(d: f32, qs: &[i8; QK], y: &mut [f32]) {
    for (y, &q) in y.iter_mut().zip(qs) {
        *y = q as f32 * d;
    }
}

/// `quantize_row_q8_0_ref`: d = max|x| / 127, q = roundf(x / d) (ties away from zero).
pub fn quantize(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        b.d = f16::from_f32(quantize_levels(xb, &mut b.qs));
    }
}

/// One block of `quantize_row_q8_0_ref` (shared with Q8_1): fills `qs` and returns the
/// unrounded scale `d = max|x| / 127`.
pub(super) fn quantize_levels(xb: &[f32], qs: &mut [i8; QK]) -> f32 {
    let amax = xb.iter().fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = (v * id).round() as i8;
    }
    d
}

/// `ggml_vec_dot_q8_0_q8_0` (scalar): Σ_blocks (Σ x_q·y_q) · d_x · d_y.
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&a, &b)| a as i32 * b as i32).sum();
        sumf += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};
    use crate::zeroed_blocks;

    fn roundtrip(x: &[f32]) -> Vec<f32> {
        quantize_roundtrip(x, quantize, dequantize).1
    }

    #[test]
    fn roundtrip_error_is_within_half_a_step() {
        let mut rng = Rng::new(1);
        let x = rng.vec(QK * 64, 1.0);
        let y = roundtrip(&x);
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            // half a step, plus the f16 rounding of d carried to 127 steps
            let bound = amax / 127.0 * 0.5 + amax * 2f32.powi(-11) * 1.01;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{a} vs {b} (bound {bound})");
            }
        }
    }

    #[test]
    fn zeros_and_huge_values() {
        assert!(roundtrip(&[0.0; QK]).iter().all(|v| *v == 0.0));
        let mut x = vec![0.0f32; QK];
        x[3] = 60000.0;
        x[7] = -30000.0;
        let y = roundtrip(&x);
        assert!((y[3] - 60000.0).abs() <= 60000.0 * 2f32.powi(-10));
        assert!((y[7] + 30000.0).abs() <= 60000.0 / 127.0);
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(2);
        let (a, b) = (rng.vec(QK * 16, 1.0), rng.vec(QK * 16, 3.0));
        let (mut qa, mut qb) = (zeroed_blocks(16), zeroed_blocks(16));
        quantize(&a, &mut qa);
        quantize(&b, &mut qb);
        let (mut da, mut db) = (vec![0.0; a.len()], vec![0.0; b.len()]);
        dequantize(&qa, &mut da);
        dequantize(&qb, &mut db);
        let got = vec_dot_q8_0_q8_0(&qa, &qb);
        // same products, different float summation order: relative 1e-5 of Σ|a·b|
        assert!((got - dot(&da, &db)).abs() <= 1e-5 * abs_dot(&da, &db), "{got} vs {}", dot(&da, &db));
        // and close to the unquantized dot
        assert!((got - dot(&a, &b)).abs() <= 0.02 * abs_dot(&a, &b));
    }
}
