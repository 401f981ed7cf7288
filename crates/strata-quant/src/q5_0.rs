//! GGML Q5_0: 32 values as `(q − 16) · d` with 5-bit q (`block_q5_0` in ggml-common.h):
//! low nibbles as in Q4_0, bit 4 of value `j` in bit `j` of the little-endian u32 `qh`.

use half::f16;

use super::q8_0::BlockQ8_0;
use super::{Block, QK};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_0>() == 2 + 4 + QK / 2);

// SAFETY: repr(C), f16 + u8 arrays, no padding (asserted above).
unsafe impl Block for BlockQ5_0 {
    const DTYPE: DType = DType::Q5_0;
}

/// The 5-bit values 0..32 of value `j` and `j + 16`.
#[inline]
pub fn q5(qs: &[u8; QK / 2], qh: [u8; 4], j: usize) -> (i32, i32) {
    let qh = u32::from_le_bytes(qh);
    let xh0 = ((qh >> j) << 4) & 0x10;
    let xh1 = (qh >> (j + 12)) & 0x10;
    (((qs[j] & 0x0F) as u32 | xh0) as i32, ((qs[j] >> 4) as u32 | xh1) as i32)
}

/// `dequantize_row_q5_0`.
pub fn dequantize(blocks: &[BlockQ5_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = b.d.to_f32();
        for j in 0..QK / 2 {
            let (x0, x1) = q5(&b.qs, b.qh, j);
            y[j] = (x0 - 16) as f32 * d;
            y[j + QK / 2] = (x1 - 16) as f32 * d;
        }
    }
}

/// `ggml_vec_dot_q5_0_q8_0` (scalar).
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let (x0, x1) = q5(&x.qs, x.qh, j);
            sumi0 += (x0 - 16) * y.qs[j] as i32;
            sumi1 += (x1 - 16) * y.qs[j + QK / 2] as i32;
        }
        sumf += (x.d.to_f32() * y.d.to_f32()) * (sumi0 + sumi1) as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot};
    use crate::{q8_0, zeroed_blocks};

    fn random_blocks(rng: &mut Rng, n: usize) -> Vec<BlockQ5_0> {
        (0..n)
            .map(|_| {
                let mut b = BlockQ5_0 { d: f16::from_f32(rng.uniform() * 0.1), qh: [0; 4], qs: [0; QK / 2] };
                b.qh.copy_from_slice(&rng.bytes(4));
                b.qs.copy_from_slice(&rng.bytes(QK / 2));
                b
            })
            .collect()
    }

    #[test]
    fn dequantize_known_block() {
        let mut b = BlockQ5_0 { d: f16::from_f32(2.0), qh: [0; 4], qs: [0; QK / 2] };
        b.qs[1] = 0x0F; // value 1: low nibble 15, bit 4 clear -> 15 - 16 = -1
        b.qh = (1u32 << 17).to_le_bytes(); // value 17: 0 | 16 -> 0
        b.qs[2] = 0xF0;
        b.qh[0] |= 1 << 2; // value 2: 0 | 16 -> 0; value 18: 15 -> -1
        let mut y = [0.0; QK];
        dequantize(&[b], &mut y);
        assert_eq!((y[1], y[17], y[2], y[18], y[0]), (-2.0, 0.0, 0.0, -2.0, -32.0));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(6);
        let qw = random_blocks(&mut rng, 16);
        let a = rng.vec(QK * 16, 2.0);
        let mut qa = zeroed_blocks(16);
        q8_0::quantize(&a, &mut qa);
        let (mut dw, mut da) = (vec![0.0; a.len()], vec![0.0; a.len()]);
        dequantize(&qw, &mut dw);
        q8_0::dequantize(&qa, &mut da);
        let got = vec_dot_q5_0_q8_0(&qw, &qa);
        assert!((got - dot(&dw, &da)).abs() <= 1e-5 * abs_dot(&dw, &da), "{got} vs {}", dot(&dw, &da));
    }
}
