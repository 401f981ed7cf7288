//! GGML Q4_0: 32 values as `(nibble − 8) · d` (`block_q4_0` in ggml-common.h). Byte `j`
//! holds value `j` in its low nibble and value `j + 16` in its high nibble.

use half::f16;

use super::q8_0::BlockQ8_0;
use super::{Block, QK};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_0>() == 2 + QK / 2);

// SAFETY: repr(C), f16 + u8 array, no padding (asserted above).
unsafe impl Block for BlockQ4_0 {
    const DTYPE: DType = DType::Q4_0;
}

/// `dequantize_row_q4_0`.
pub fn dequantize(blocks: &[BlockQ4_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// `quantize_row_q4_0_ref`: d = (the value of largest magnitude) / −8,
/// q = min(15, trunc(x / d + 8.5)).
pub fn quantize(x: &[f32], out: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        for j in 0..QK / 2 {
            // C: MIN(15, (int8_t)(x0 + 8.5f)); the sum lies in [0.5, 16.5].
            let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// `ggml_vec_dot_q4_0_q8_0` (scalar).
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let v0 = (x.qs[j] & 0x0F) as i32 - 8;
            let v1 = (x.qs[j] >> 4) as i32 - 8;
            sumi0 += v0 * y.qs[j] as i32;
            sumi1 += v1 * y.qs[j + QK / 2] as i32;
        }
        sumf += (sumi0 + sumi1) as f32 * x.d.to_f32() * y.d.to_f32();
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};
    use crate::{q8_0, zeroed_blocks};

    fn roundtrip(x: &[f32]) -> Vec<f32> {
        quantize_roundtrip(x, quantize, dequantize).1
    }

    #[test]
    fn roundtrip_error_is_within_half_a_step() {
        let mut rng = Rng::new(3);
        let x = rng.vec(QK * 64, 1.0);
        let y = roundtrip(&x);
        let mut worst = 0.0f32;
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let step = amax / 8.0;
            // The value opposite the max sits at +8 steps but q tops out at +7: that side
            // can be off by a whole step. Everything else is within half a step (+ f16 slop).
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= step * 1.0 + amax * 2f32.powi(-10), "{a} vs {b}");
                worst = worst.max((a - b).abs() / amax);
            }
        }
        assert!(worst > 0.01, "the bound is tight enough to mean something: {worst}");
    }

    #[test]
    fn zeros_and_huge_values() {
        assert!(roundtrip(&[0.0; QK]).iter().all(|v| *v == 0.0));
        let mut x = vec![1.0f32; QK];
        x[0] = -4.0e5; // d = 5e4 is still a finite f16
        let y = roundtrip(&x);
        assert!((y[0] + 4.0e5).abs() <= 4.0e5 * 2f32.powi(-10), "{}", y[0]);
        assert!(y[1..].iter().all(|v| *v == 0.0));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(4);
        let (w, a) = (rng.vec(QK * 16, 0.5), rng.vec(QK * 16, 3.0));
        let (mut qw, mut qa) = (zeroed_blocks(16), zeroed_blocks(16));
        quantize(&w, &mut qw);
        q8_0::quantize(&a, &mut qa);
        let (mut dw, mut da) = (vec![0.0; w.len()], vec![0.0; a.len()]);
        dequantize(&qw, &mut dw);
        q8_0::dequantize(&qa, &mut da);
        let got = vec_dot_q4_0_q8_0(&qw, &qa);
        assert!((got - dot(&dw, &da)).abs() <= 1e-5 * abs_dot(&dw, &da), "{got} vs {}", dot(&dw, &da));
    }
}
