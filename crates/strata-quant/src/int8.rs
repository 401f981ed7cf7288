//! Strata's per-channel int8 format (`DType::I8`, written by `strata convert --quant`).
//!
//! Block layout (36 bytes, align 4, little-endian): 32 values as `q · scale`.
//!
//! | offset | field   | type      | meaning                        |
//! |--------|---------|-----------|--------------------------------|
//! | 0      | `scale` | f32       | the channel's scale            |
//! | 4      | `qs`    | [i8; 32]  | values                         |
//!
//! "Per channel" is a property of the quantizer, not of the layout: [`quantize_rows`]
//! takes one scale per output row (`max|row| / 127`) and repeats it in every block of
//! that row, so a row of `k` values is `k / 32` blocks that all carry the same scale.
//! Repeating the scale keeps the format a plain block type (any whole-block range can
//! be dequantized alone) for 4 bytes per 32 values. The scale is an f32 so rows of any
//! finite magnitude quantize without overflow.

use super::q8_0::BlockQ8_0;
use super::{Block, QK, QuantError};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockI8 {
    pub scale: f32,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockI8>() == 36);
const _: () = assert!(size_of::<BlockI8>() == 4 + QK);
const _: () = assert!(align_of::<BlockI8>() == 4);

// SAFETY: repr(C), f32 + i8 array, no padding (asserted above).
unsafe impl Block for BlockI8 {
    const DTYPE: DType = DType::I8;
}

pub fn dequantize(blocks: &[BlockI8], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        for (y, &q) in y.iter_mut().zip(&b.qs) {
            *y = q as f32 * b.scale;
        }
    }
}

/// Quantizes a row-major `[rows, cols]` matrix (`cols` a multiple of 32) with one scale
/// per row: `scale = max|row| / 127`, `q = round(x / scale)` (ties away from zero).
pub fn quantize_rows(x: &[f32], cols: usize, out: &mut [BlockI8]) -> Result<(), QuantError> {
    assert!(cols.is_multiple_of(QK) && cols > 0, "{cols} columns is not whole blocks");
    assert_eq!(x.len(), out.len() * QK);
    if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(QuantError::NotFinite { index, value });
    }
    for (row, blocks) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols / QK)) {
        let amax = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        for (xb, b) in row.chunks_exact(QK).zip(blocks) {
            b.scale = scale;
            for (q, &v) in b.qs.iter_mut().zip(xb) {
                *q = if scale > 0.0 { (v / scale).round().clamp(-127.0, 127.0) as i8 } else { 0 };
            }
        }
    }
    Ok(())
}

/// Σ w·a against Q8_0 activations: per block `(Σ q_w·q_a) · (scale · d_a)`.
pub fn vec_dot_i8_q8_0(x: &[BlockI8], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&a, &b)| a as i32 * b as i32).sum();
        sumf += sumi as f32 * (x.scale * y.d.to_f32());
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};
    use crate::{q8_0, zeroed_blocks};

    fn roundtrip(x: &[f32], cols: usize) -> (Vec<BlockI8>, Vec<f32>) {
        quantize_roundtrip(x, |x, b| quantize_rows(x, cols, b).unwrap(), dequantize)
    }

    #[test]
    fn roundtrip_error_is_within_half_a_step_of_the_row_scale() {
        let mut rng = Rng::new(30);
        let (rows, cols) = (8, 96);
        let mut x = rng.vec(rows * cols, 1.0);
        for v in &mut x[2 * cols..3 * cols] {
            *v *= 100.0; // rows with very different magnitudes get their own scale
        }
        let (b, y) = roundtrip(&x, cols);
        let mut worst = 0.0f32;
        for ((xr, yr), br) in x.chunks(cols).zip(y.chunks(cols)).zip(b.chunks(cols / QK)) {
            let amax = xr.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            assert!(br.iter().all(|b| b.scale == amax / 127.0), "one scale per row");
            let bound = amax / 127.0 * 0.5 * (1.0 + 1e-5);
            for (a, b) in xr.iter().zip(yr) {
                assert!((a - b).abs() <= bound, "{a} vs {b}");
                worst = worst.max((a - b).abs() / bound);
            }
        }
        assert!(worst > 0.9, "the bound is tight: {worst}");
    }

    #[test]
    fn zeros_huge_and_non_finite() {
        let (b, y) = roundtrip(&[0.0; 64], 64);
        assert_eq!(b[0].scale, 0.0);
        assert!(y.iter().all(|v| *v == 0.0));
        let mut x = vec![1.0f32; 64];
        x[40] = -3.0e37;
        let (_, y) = roundtrip(&x, 64);
        assert!((y[40] + 3.0e37).abs() <= 3.0e37 * 1e-6, "{}", y[40]);
        x[3] = f32::INFINITY;
        let mut b = zeroed_blocks(2);
        assert!(matches!(quantize_rows(&x, 64, &mut b), Err(QuantError::NotFinite { index: 3, .. })));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(31);
        let (w, a) = (rng.vec(QK * 16, 0.3), rng.vec(QK * 16, 2.0));
        let (qw, dw) = roundtrip(&w, QK * 16);
        let mut qa = zeroed_blocks(16);
        q8_0::quantize(&a, &mut qa);
        let mut da = vec![0.0; a.len()];
        q8_0::dequantize(&qa, &mut da);
        let got = vec_dot_i8_q8_0(&qw, &qa);
        assert!((got - dot(&dw, &da)).abs() <= 1e-5 * abs_dot(&dw, &da));
    }
}
