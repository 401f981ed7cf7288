//! GGML Q4_1: 32 values as `nibble · d + m` (`block_q4_1` in ggml-common.h). Byte `j`
//! holds value `j` (low nibble) and value `j + 16` (high nibble). Dotted against Q8_1.

use half::f16;

use super::q8_1::BlockQ8_1;
use super::{Block, QK};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ4_1>() == 4 + QK / 2);

// SAFETY: repr(C), f16s + u8 array, no padding (asserted above).
unsafe impl Block for BlockQ4_1 {
    const DTYPE: DType = DType::Q4_1;
}

/// `dequantize_row_q4_1`.
pub fn dequantize(blocks: &[BlockQ4_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = (q & 0x0F) as f32 * d + m;
            y[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

/// `ggml_vec_dot_q4_1_q8_1` (scalar): d_x·d_y·Σ q_x·q_y + m_x·s_y per block.
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            sumi0 += (x.qs[j] & 0x0F) as i32 * y.qs[j] as i32;
            sumi1 += (x.qs[j] >> 4) as i32 * y.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sumf
}

#[cfg(test)]
pub fn random_blocks(rng: &mut crate::testutil::Rng, n: usize) -> Vec<BlockQ4_1> {
    (0..n)
        .map(|_| {
            let mut qs = [0u8; QK / 2];
            qs.copy_from_slice(&rng.bytes(QK / 2));
            BlockQ4_1 { d: f16::from_f32(rng.uniform().abs() * 0.1), m: f16::from_f32(rng.uniform() * 0.5), qs }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot};
    use crate::{q8_1, zeroed_blocks};

    #[test]
    fn dequantize_known_block() {
        let mut qs = [0u8; QK / 2];
        qs[0] = 0xF3;
        let b = BlockQ4_1 { d: f16::from_f32(0.5), m: f16::from_f32(-1.0), qs };
        let mut y = [0.0; QK];
        dequantize(&[b], &mut y);
        assert_eq!((y[0], y[16], y[1]), (0.5, 6.5, -1.0));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(5);
        let qw = random_blocks(&mut rng, 16);
        let a = rng.vec(QK * 16, 2.0);
        let mut qa = zeroed_blocks::<BlockQ8_1>(16);
        q8_1::quantize(&a, &mut qa);
        let (mut dw, mut da) = (vec![0.0; a.len()], vec![0.0; a.len()]);
        dequantize(&qw, &mut dw);
        q8_1::dequantize(&qa, &mut da);
        let s_slop = crate::testutil::q8_1_s_slop(qw.iter().map(|w| w.m.to_f32()), &qa);
        let got = vec_dot_q4_1_q8_1(&qw, &qa);
        let want = dot(&dw, &da);
        assert!((got - want).abs() <= 1e-5 * abs_dot(&dw, &da) + s_slop, "{got} vs {want} (slop {s_slop})");
    }
}
