//! Strata's affine 4-bit format (`DType::AffineQ4`, written by `strata convert --quant`):
//! groups of 128 values, each `value = nibble · scale + bias`.
//!
//! Block layout (68 bytes, align 2, little-endian):
//!
//! | offset | field   | type      | meaning                                         |
//! |--------|---------|-----------|-------------------------------------------------|
//! | 0      | `scale` | f16       | step between levels                             |
//! | 2      | `bias`  | f16       | the value of level 0 (the group minimum)        |
//! | 4      | `qs`    | [u8; 64]  | byte `j`: value `j` low nibble, `j + 64` high   |
//!
//! The quantizer is per-group min/max: `scale = (max − min) / 15`, `bias = min`, both
//! rounded to f16 first and the levels chosen against the rounded pair,
//! `q = clamp(round((x − bias) / scale), 0, 15)`. It refuses non-finite inputs and
//! values outside ±65504 (the f16 range `bias` must fit in).

use half::f16;

use super::q8_0::BlockQ8_0;
use super::{Block, QK, QuantError};
use strata_tensor::tensor::DType;

/// Values per group.
pub const GROUP: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockAffineQ4 {
    pub scale: f16,
    pub bias: f16,
    pub qs: [u8; GROUP / 2],
}
const _: () = assert!(size_of::<BlockAffineQ4>() == 68);
const _: () = assert!(size_of::<BlockAffineQ4>() == 2 + 2 + GROUP / 2);

// SAFETY: repr(C), f16s + u8 array, no padding (asserted above).
unsafe impl Block for BlockAffineQ4 {
    const DTYPE: DType = DType::AffineQ4;
}

#[inline]
fn level(b: &BlockAffineQ4, i: usize) -> u8 {
    if i < GROUP / 2 { b.qs[i] & 0xF } else { b.qs[i - GROUP / 2] >> 4 }
}

pub fn dequantize(blocks: &[BlockAffineQ4], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * GROUP);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(GROUP)) {
        let (scale, bias) = (b.scale.to_f32(), b.bias.to_f32());
        for (i, y) in y.iter_mut().enumerate() {
            *y = level(b, i) as f32 * scale + bias;
        }
    }
}

/// Per-group min/max quantization (see the module header).
pub fn quantize(x: &[f32], out: &mut [BlockAffineQ4]) -> Result<(), QuantError> {
    assert_eq!(x.len(), out.len() * GROUP);
    for (index, &value) in x.iter().enumerate() {
        if !value.is_finite() {
            return Err(QuantError::NotFinite { index, value });
        }
        if value.abs() > f16::MAX.to_f32() {
            return Err(QuantError::OutOfRange { index, value });
        }
    }
    for (xb, b) in x.chunks_exact(GROUP).zip(out.iter_mut()) {
        let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
        let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        b.scale = f16::from_f32((max - min) / 15.0);
        b.bias = f16::from_f32(min);
        let (scale, bias) = (b.scale.to_f32(), b.bias.to_f32());
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut lv = [0u8; GROUP];
        for (l, &v) in lv.iter_mut().zip(xb) {
            *l = ((v - bias) * inv).round().clamp(0.0, 15.0) as u8;
        }
        for j in 0..GROUP / 2 {
            b.qs[j] = lv[j] | (lv[j + GROUP / 2] << 4);
        }
    }
    Ok(())
}

/// Σ w·a for a row of groups against Q8_0 activations (four Q8_0 blocks per group):
/// per Q8_0 block `d_a · (scale · Σ q·a_q + bias · Σ a_q)`, both sums in integers.
pub fn vec_dot_affine_q4_q8_0(x: &[BlockAffineQ4], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len() * (GROUP / QK), y.len());
    let mut sumf = 0.0f32;
    for (w, ys) in x.iter().zip(y.chunks_exact(GROUP / QK)) {
        let (scale, bias) = (w.scale.to_f32(), w.bias.to_f32());
        for (k, a) in ys.iter().enumerate() {
            let (mut sumqa, mut suma) = (0i32, 0i32);
            for (l, &q) in a.qs.iter().enumerate() {
                sumqa += level(w, k * QK + l) as i32 * q as i32;
                suma += q as i32;
            }
            sumf += a.d.to_f32() * (scale * sumqa as f32 + bias * suma as f32);
        }
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};
    use crate::{q8_0, zeroed_blocks};

    fn roundtrip(x: &[f32]) -> (Vec<BlockAffineQ4>, Vec<f32>) {
        quantize_roundtrip(x, |x, b| quantize(x, b).unwrap(), dequantize)
    }

    /// Half a step, the f16 rounding of scale carried over 15 levels, the f16 rounding
    /// of bias, and float slop.
    fn bound(xb: &[f32]) -> f32 {
        let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
        let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let step = (max - min) / 15.0;
        0.5 * step + 15.0 * step * 2f32.powi(-11) + min.abs() * 2f32.powi(-11) + max.abs() * 1e-6
    }

    #[test]
    fn roundtrip_error_is_within_half_a_step() {
        let mut rng = Rng::new(20);
        let mut x = rng.vec(GROUP * 32, 1.0);
        for v in &mut x[GROUP..2 * GROUP] {
            *v += 3.0; // a group away from zero: bias matters
        }
        let (_, y) = roundtrip(&x);
        let mut worst = 0.0f32;
        for (xb, yb) in x.chunks(GROUP).zip(y.chunks(GROUP)) {
            let bound = bound(xb);
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{a} vs {b} (bound {bound})");
                worst = worst.max((a - b).abs() / bound);
            }
        }
        assert!(worst > 0.8, "the bound is tight: worst/bound = {worst}");
    }

    #[test]
    fn nibble_layout() {
        let mut x = [0.0f32; GROUP];
        x[0] = 15.0;
        x[64] = 1.0;
        x[1] = 2.0;
        let (b, _) = roundtrip(&x);
        assert_eq!((b[0].scale.to_f32(), b[0].bias.to_f32()), (1.0, 0.0));
        assert_eq!((b[0].qs[0], b[0].qs[1]), (0x1F, 0x02));
    }

    #[test]
    fn constant_zero_and_huge_groups() {
        let (b, y) = roundtrip(&[0.0; GROUP]);
        assert_eq!(b[0].scale.to_f32(), 0.0);
        assert!(y.iter().all(|v| *v == 0.0));
        let (_, y) = roundtrip(&[-7.25; GROUP]);
        assert!(y.iter().all(|v| *v == -7.25));
        let mut rng = Rng::new(21);
        let x: Vec<f32> = rng.vec(GROUP, 1.0).iter().map(|v| (v * 30000.0).clamp(-65504.0, 65504.0)).collect();
        let (_, y) = roundtrip(&x);
        let bound = bound(&x);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= bound));
    }

    #[test]
    fn refuses_what_f16_cannot_hold() {
        let mut b = zeroed_blocks(1);
        let mut x = [0.0f32; GROUP];
        x[5] = 1.0e6;
        assert_eq!(quantize(&x, &mut b), Err(QuantError::OutOfRange { index: 5, value: 1.0e6 }));
        x[5] = f32::NAN;
        assert!(matches!(quantize(&x, &mut b), Err(QuantError::NotFinite { index: 5, .. })));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(22);
        let w: Vec<f32> = rng.vec(GROUP * 8, 0.3).iter().map(|v| v + 0.2).collect();
        let a = rng.vec(GROUP * 8, 2.0);
        let (qw, dw) = roundtrip(&w);
        let mut qa = zeroed_blocks(a.len() / QK);
        q8_0::quantize(&a, &mut qa);
        let mut da = vec![0.0; a.len()];
        q8_0::dequantize(&qa, &mut da);
        let got = vec_dot_affine_q4_q8_0(&qw, &qa);
        let want = dot(&dw, &da);
        // scale·Σqa and bias·Σa are summed separately: allow 1e-5 of both magnitudes
        let parts: f32 = qw
            .iter()
            .zip(da.chunks(GROUP))
            .map(|(b, a)| {
                (b.scale.to_f32().abs() * 15.0 + b.bias.to_f32().abs()) * a.iter().map(|v| v.abs()).sum::<f32>()
            })
            .sum();
        assert!((got - want).abs() <= 1e-5 * (abs_dot(&dw, &da) + parts), "{got} vs {want}");
    }
}
