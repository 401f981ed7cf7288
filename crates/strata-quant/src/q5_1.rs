//! GGML Q5_1: 32 values as `q · d + m` with 5-bit q (`block_q5_1` in ggml-common.h),
//! bits packed as in Q5_0. Dotted against Q8_1.

use half::f16;

use super::q5_0::q5;
use super::q8_1::BlockQ8_1;
use super::{Block, QK};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ5_1>() == 4 + 4 + QK / 2);

// SAFETY: repr(C), f16s + u8 arrays, no padding (asserted above).
unsafe impl Block for BlockQ5_1 {
    const DTYPE: DType = DType::Q5_1;
}

/// `dequantize_row_q5_1`.
pub fn dequantize(blocks: &[BlockQ5_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for j in 0..QK / 2 {
            let (x0, x1) = q5(&b.qs, b.qh, j);
            y[j] = x0 as f32 * d + m;
            y[j + QK / 2] = x1 as f32 * d + m;
        }
    }
}

/// `ggml_vec_dot_q5_1_q8_1` (scalar).
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let (x0, x1) = q5(&x.qs, x.qh, j);
            sumi0 += x0 * y.qs[j] as i32;
            sumi1 += x1 * y.qs[j + QK / 2] as i32;
        }
        sumf += (x.d.to_f32() * y.d.to_f32()) * (sumi0 + sumi1) as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot};
    use crate::{q8_1, zeroed_blocks};

    #[test]
    fn dequantize_known_block() {
        let mut b = BlockQ5_1 { d: f16::from_f32(0.25), m: f16::from_f32(1.0), qh: [0; 4], qs: [0; QK / 2] };
        b.qs[0] = 0x21;
        b.qh = (1u32 << 16 | 1).to_le_bytes();
        let mut y = [0.0; QK];
        dequantize(&[b], &mut y);
        assert_eq!((y[0], y[16], y[1]), (1.0 + 17.0 * 0.25, 1.0 + 18.0 * 0.25, 1.0));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(7);
        let qw: Vec<BlockQ5_1> = (0..16)
            .map(|_| {
                let mut b = BlockQ5_1 {
                    d: f16::from_f32(rng.uniform().abs() * 0.05),
                    m: f16::from_f32(rng.uniform() * 0.5),
                    qh: [0; 4],
                    qs: [0; QK / 2],
                };
                b.qh.copy_from_slice(&rng.bytes(4));
                b.qs.copy_from_slice(&rng.bytes(QK / 2));
                b
            })
            .collect();
        let a = rng.vec(QK * 16, 2.0);
        let mut qa = zeroed_blocks::<BlockQ8_1>(16);
        q8_1::quantize(&a, &mut qa);
        let (mut dw, mut da) = (vec![0.0; a.len()], vec![0.0; a.len()]);
        dequantize(&qw, &mut dw);
        q8_1::dequantize(&qa, &mut da);
        let s_slop = crate::testutil::q8_1_s_slop(qw.iter().map(|w| w.m.to_f32()), &qa);
        let got = vec_dot_q5_1_q8_1(&qw, &qa);
        let want = dot(&dw, &da);
        assert!((got - want).abs() <= 1e-5 * abs_dot(&dw, &da) + s_slop, "{got} vs {want}");
    }
}
