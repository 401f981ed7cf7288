//! MXFP4 (GGML type 39, `block_mxfp4` in ggml-common.h): 32 FP4 (E2M1) values sharing
//! one E8M0 exponent byte `e`. Stored as GGML does: the E2M1 values doubled to the
//! integers [`KVALUES`], so value `j` is `KVALUES[nibble_j] · 2^(e − 128)`
//! ([`e8m0_half`]). Byte `j` of `qs` holds value `j` in its low nibble and value `j + 16`
//! in its high nibble. OpenAI's checkpoints (gpt-oss) hold the same numbers with another
//! nibble order: [`from_openai`] converts one of their groups.

use super::q8_0::BlockQ8_0;
use super::{Block, QK};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockMxfp4 {
    /// The shared exponent (E8M0: 2^(e − 127) for the undoubled values).
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMxfp4>() == 17);
const _: () = assert!(size_of::<BlockMxfp4>() == 1 + QK / 2);

// SAFETY: repr(C), u8 + u8 array, no padding (asserted above).
unsafe impl Block for BlockMxfp4 {
    const DTYPE: DType = DType::Mxfp4;
}

/// The E2M1 values doubled (`kvalues_mxfp4`): nibble `n` stands for `KVALUES[n] / 2`.
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `ggml_e8m0_to_fp32_half`: 2^(e − 128), exactly (denormal for e < 2), the scale of the
/// doubled [`KVALUES`].
#[inline]
pub const fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// [`e8m0_half`] of every exponent byte (what the SIMD kernels look scales up in).
pub static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = e8m0_half(e as u8);
        e += 1;
    }
    t
};

/// `dequantize_row_mxfp4`.
pub fn dequantize(blocks: &[BlockMxfp4], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = e8m0_half(b.e);
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = KVALUES[(q & 0x0F) as usize] as f32 * d;
            y[j + QK / 2] = KVALUES[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// `quantize_row_mxfp4_ref`: e = floor(log2(max|x|)) − 2 + 127 (0 for an all-zero
/// block; saturated to 0..=255 where C's cast would be undefined), and each value the
/// nearest `KVALUES[n] · 2^(e − 128)` (the first `n` on ties). Values beyond 12 steps
/// (up to 16 can occur) clip to ±12.
pub fn quantize(x: &[f32], out: &mut [BlockMxfp4]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| if a < v.abs() { v.abs() } else { a });
        b.e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
        let d = e8m0_half(b.e);
        for j in 0..QK / 2 {
            b.qs[j] = best_index(xb[j], d) | (best_index(xb[j + QK / 2], d) << 4);
        }
    }
}

/// `best_index_mxfp4`: the first nibble whose value `KVALUES[n] · d` is nearest `x`.
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = (0u8, (KVALUES[0] as f32 * d - x).abs());
    for (n, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best.1 {
            best = (n as u8, err);
        }
    }
    best.0
}

/// `ggml_vec_dot_mxfp4_q8_0` (scalar): Σ_blocks 2^(e − 128) · d_y · Σ KVALUES[q]·y_q.
pub fn vec_dot_mxfp4_q8_0(x: &[BlockMxfp4], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (mut sumi0, mut sumi1) = (0i32, 0i32);
        for j in 0..QK / 2 {
            sumi0 += KVALUES[(x.qs[j] & 0x0F) as usize] as i32 * y.qs[j] as i32;
            sumi1 += KVALUES[(x.qs[j] >> 4) as usize] as i32 * y.qs[j + QK / 2] as i32;
        }
        sumf += e8m0_half(x.e) * y.d.to_f32() * (sumi0 + sumi1) as f32;
    }
    sumf
}

/// One group of an OpenAI MXFP4 checkpoint (`*_blocks` row of 16 bytes, byte `i` holding
/// values `2i` (low nibble) and `2i + 1` (high nibble); its `*_scales` byte) as a GGML
/// block. The scale byte is GGML's `e` unchanged and the nibble codes are the same
/// (OpenAI's FP4 table is [`KVALUES`] halved); only their order moves.
pub fn from_openai(blocks: &[u8; QK / 2], scale: u8) -> BlockMxfp4 {
    let nibble = |v: usize| (blocks[v / 2] >> (4 * (v % 2))) & 0x0F;
    BlockMxfp4 { e: scale, qs: std::array::from_fn(|j| nibble(j) | (nibble(j + QK / 2) << 4)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};
    use crate::{q8_0, zeroed_blocks};

    /// transformers' `convert_moe_packed_tensors` lookup table (gpt-oss): the FP4 values.
    const OPENAI_FP4: [f32; 16] =
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

    /// transformers' dequantisation of one group, written from its semantics: byte `i`'s
    /// low nibble is value `2i`, its high nibble value `2i + 1`, each
    /// `FP4[nibble] · 2^(scale − 127)` (`torch.ldexp` with the scale less 127).
    fn openai_dequantize(blocks: &[u8; 16], scale: u8) -> [f32; 32] {
        let mut out = [0.0f32; 32];
        for (i, &b) in blocks.iter().enumerate() {
            let exp = scale as i32 - 127;
            out[2 * i] = OPENAI_FP4[(b & 0x0F) as usize] * 2f64.powi(exp) as f32;
            out[2 * i + 1] = OPENAI_FP4[(b >> 4) as usize] * 2f64.powi(exp) as f32;
        }
        out
    }

    #[test]
    fn e8m0_half_is_two_to_the_e_less_128() {
        for e in 0..=255u8 {
            assert_eq!(e8m0_half(e) as f64, 2f64.powi(e as i32 - 128), "e = {e}");
            assert_eq!(E8M0_HALF[e as usize], e8m0_half(e));
        }
        assert_eq!(e8m0_half(0).to_bits(), 0x0020_0000);
        assert_eq!(e8m0_half(1).to_bits(), 0x0040_0000);
        assert_eq!(e8m0_half(2).to_bits(), 1 << 23);
    }

    #[test]
    fn dequantize_reads_low_then_high_nibbles() {
        let mut b = BlockMxfp4 { e: 128, qs: [0; 16] };
        for j in 0..16 {
            b.qs[j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0.0f32; 32];
        dequantize(&[b], &mut y);
        for j in 0..16 {
            assert_eq!(y[j], KVALUES[j] as f32);
            assert_eq!(y[j + 16], KVALUES[15 - j] as f32);
        }
    }

    #[test]
    fn values_on_the_grid_quantize_exactly() {
        // Every representable value of one exponent, in a block whose max is 12 steps.
        let d = e8m0_half(130); // amax = 12·4 = 48: floor(log2 48) = 5 → e = 130
        let x: Vec<f32> = (0..32).map(|j| KVALUES[j % 16] as f32 * d).collect();
        let (b, y) = quantize_roundtrip(&x, quantize, dequantize);
        assert_eq!(b[0].e, 130);
        assert_eq!(y, x);
    }

    #[test]
    fn roundtrip_error_is_within_half_a_step_of_the_grid() {
        let mut rng = Rng::new(5);
        let x = rng.vec(QK * 64, 1.0);
        let (blocks, y) = quantize_roundtrip(&x, quantize, dequantize);
        for ((xb, yb), b) in x.chunks(QK).zip(y.chunks(QK)).zip(&blocks) {
            let d = e8m0_half(b.e);
            for (a, v) in xb.iter().zip(yb) {
                // The grid's gaps are 1, 2 and 4 steps; beyond 12 steps values clip.
                let gap = match (a.abs() / d) as u32 {
                    0..4 => 1.0,
                    4..8 => 2.0,
                    _ => 4.0,
                };
                let clip = (a.abs() - 12.0 * d).max(0.0);
                assert!((a - v).abs() <= gap * d / 2.0 + clip, "{a} vs {v} (d {d})");
            }
        }
    }

    #[test]
    fn zeros_and_extremes() {
        let (b, y) = quantize_roundtrip(&[0.0; QK], quantize, dequantize);
        assert_eq!(b[0].e, 0);
        assert!(y.iter().all(|v| *v == 0.0));
        let mut x = [0.0f32; QK];
        x[5] = -3.0e38;
        let (b, y) = quantize_roundtrip(&x, quantize, dequantize);
        assert_eq!(b[0].e, 127 + 127 - 2);
        assert_eq!(y[5], -12.0 * 2f32.powi(124)); // 3e38 is beyond 12 steps: clipped
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(6);
        let (w, a) = (rng.vec(QK * 16, 0.5), rng.vec(QK * 16, 3.0));
        let (mut qw, mut qa) = (zeroed_blocks(16), zeroed_blocks(16));
        quantize(&w, &mut qw);
        q8_0::quantize(&a, &mut qa);
        let (mut dw, mut da) = (vec![0.0; w.len()], vec![0.0; a.len()]);
        dequantize(&qw, &mut dw);
        q8_0::dequantize(&qa, &mut da);
        let got = vec_dot_mxfp4_q8_0(&qw, &qa);
        assert!((got - dot(&dw, &da)).abs() <= 1e-5 * abs_dot(&dw, &da), "{got} vs {}", dot(&dw, &da));
    }

    /// `rows` random weight rows of `nb` blocks (every nibble; exponents around 127, with
    /// the edge exponents 0, 1 and 2 among them) and `acts` Q8_0 activation rows.
    fn random_rows(rng: &mut Rng, rows: usize, acts: usize, nb: usize) -> (Vec<u8>, Vec<BlockQ8_0>) {
        let mut w = rng.bytes(rows * nb * 17);
        for (i, b) in w.chunks_exact_mut(17).enumerate() {
            b[0] = match i % 11 {
                0 => 0,
                1 => 1,
                2 => 2,
                _ => 110 + (rng.next_u64() % 30) as u8,
            };
        }
        let mut a = zeroed_blocks(acts * nb);
        q8_0::quantize(&rng.vec(acts * nb * QK, 2.0), &mut a);
        (w, a)
    }

    /// Every SIMD kernel this CPU runs (AVX-512 and AVX2 here: `STRATA_CPU_ISA` caps
    /// them) against the scalar reference, with 1 to 9 and 22 blocks (every tail after
    /// the groups of four) and weights at odd addresses; its several-row and four-row
    /// forms bit-identical to its one-row dot.
    #[test]
    fn simd_kernels_match_the_scalar_reference() {
        use crate::simd::QuantKernel;
        let mut rng = Rng::new(9);
        let kernels: Vec<_> =
            [QuantKernel::Avx512, QuantKernel::Avx2].into_iter().filter(|k| k.is_available()).collect();
        for &kernel in &kernels {
            assert!(kernel.has_simd(DType::Mxfp4), "{kernel:?}");
        }
        for nb in (1..=9).chain([22]) {
            let (w, a) = random_rows(&mut rng, 4, 8, nb);
            // One byte in: every weight row at an odd address.
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(&w);
            let wrow = |j: usize| &w[j * nb * 17..(j + 1) * nb * 17];
            let arow = |r: usize| &a[r * nb..(r + 1) * nb];
            let (aptr, stride) = (a.as_ptr().cast::<u8>(), nb * size_of::<BlockQ8_0>());
            for &kernel in &kernels {
                let dot = kernel.dot_fn(DType::Mxfp4).unwrap();
                let mut one = [[0f32; 8]; 4];
                for (j, row) in one.iter_mut().enumerate() {
                    for (r, out) in row.iter_mut().enumerate() {
                        let blocks: Vec<BlockMxfp4> = crate::cast_blocks(wrow(j)).unwrap().to_vec();
                        let want = vec_dot_mxfp4_q8_0(&blocks, arow(r));
                        // SAFETY: `nb` weight blocks at an odd address, `nb` Q8_0 blocks.
                        let got = unsafe { dot(shifted[1 + j * nb * 17..].as_ptr(), arow(r).as_ptr().cast(), nb) };
                        let mut dw = vec![0.0; nb * QK];
                        let mut da = vec![0.0; nb * QK];
                        dequantize(&blocks, &mut dw);
                        q8_0::dequantize(arow(r), &mut da);
                        let bound = 1e-6 * abs_dot(&dw, &da);
                        assert!((got - want).abs() <= bound, "{kernel:?} nb {nb} ({j}, {r}): {got} vs {want}");
                        // SAFETY: as above, the row at its aligned address.
                        *out = unsafe { dot(wrow(j).as_ptr(), arow(r).as_ptr().cast(), nb) };
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let (rows, _) = kernel.rows_fn(DType::Mxfp4).unwrap();
                // SAFETY (each call): the weight rows and 8 activation rows `stride` apart.
                unsafe {
                    assert_eq!(bits(&(rows.r8)(w.as_ptr(), aptr, stride, nb)), bits(&one[0]), "{kernel:?} r8");
                    assert_eq!(bits(&(rows.r4)(w.as_ptr(), aptr, stride, nb)), bits(&one[0][..4]), "{kernel:?} r4");
                    assert_eq!(bits(&(rows.r2)(w.as_ptr(), aptr, stride, nb)), bits(&one[0][..2]), "{kernel:?} r2");
                    let pairs = rows.pairs.unwrap();
                    let [p0, p1] = (pairs.p8)(w.as_ptr(), nb * 17, aptr, stride, nb);
                    assert_eq!((bits(&p0), bits(&p1)), (bits(&one[0]), bits(&one[1])), "{kernel:?} pairs");
                    let streams = kernel.streams_fn(DType::Mxfp4).unwrap();
                    let got = streams(w.as_ptr(), nb * 17, aptr, nb);
                    assert_eq!(bits(&got), bits(&one.map(|r| r[0])), "{kernel:?} streams");
                }
            }
        }
    }

    #[test]
    fn openai_groups_convert_to_the_same_values() {
        let mut rng = Rng::new(8);
        for scale in [0u8, 1, 2, 100, 127, 128, 200, 254] {
            let raw = rng.bytes(16);
            let blocks: [u8; 16] = raw.as_slice().try_into().unwrap();
            let b = from_openai(&blocks, scale);
            let mut ours = [0.0f32; 32];
            dequantize(&[b], &mut ours);
            let theirs = openai_dequantize(&blocks, scale);
            // −0 in their table is 0 in ours: compare values, not bits.
            assert_eq!(ours, theirs, "scale {scale}");
        }
        // The nibble order spelled out: OpenAI byte 0 = values 0 and 1, byte 8 = 16, 17.
        let mut blocks = [0u8; 16];
        blocks[0] = 0x21; // value 0: code 1, value 1: code 2
        blocks[8] = 0x43; // value 16: code 3, value 17: code 4
        let b = from_openai(&blocks, 127);
        assert_eq!(b.qs[0], 0x31);
        assert_eq!(b.qs[1], 0x42);
        assert!(b.qs[2..].iter().all(|&q| q == 0));
    }
}
