//! GGML Q4_K: a 256-value super-block of eight 32-value sub-blocks, each
//! `q · (d · sc) − dmin · m` with 6-bit `sc`/`m` packed into 12 bytes (`block_q4_K` in
//! ggml-common.h). Each 64 values use 32 bytes of `qs`: values 0..32 in the low nibbles,
//! 32..64 in the high nibbles.

use half::f16;

use super::q8_k::BlockQ8K;
use super::{Block, QK_K, nearest_int};
use strata_tensor::tensor::DType;

/// `K_SCALE_SIZE` in ggml.
pub const K_SCALE_SIZE: usize = 12;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Scale of the sub-block scales.
    pub d: f16,
    /// Scale of the sub-block mins.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit mins; see [`get_scale_min_k4`].
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ4K>() == 2 * 2 + K_SCALE_SIZE + QK_K / 2);

// SAFETY: repr(C), f16s + u8 arrays, no padding (asserted above).
unsafe impl Block for BlockQ4K {
    const DTYPE: DType = DType::Q4_K;
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8).
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `dequantize_row_q4_K`.
pub fn dequantize(blocks: &[BlockQ4K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        for (n, (q, y)) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc, m) = get_scale_min_k4(2 * n, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * n + 1, &b.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// ggml's `make_qkx2_quants`: a weighted (scale, −min) fit of `x` to levels 0..=nmax,
/// searching `nstep + 1` candidate scales. Returns the scale; `the_min` is −min ≥ 0.
#[allow(clippy::too_many_arguments)] // mirrors the ggml reference one-to-one
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    the_min: &mut f32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> f32 {
    let n = x.len();
    let mut laux = [0u8; 32];
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        *the_min = -min;
        return 0.0;
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_mad += weights[i] * (diff * diff);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                mad += weights[i] * (diff * diff);
            }
            if mad < best_mad {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    scale
}

/// `quantize_row_q4_K_ref`.
pub fn quantize(x: &[f32], out: &mut [BlockQ4K]) {
    assert_eq!(x.len(), out.len() * QK_K);
    for (x, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut l = [0u8; QK_K];
        let mut weights = [0.0f32; 32];
        let mut mins = [0.0f32; QK_K / 32];
        let mut scales = [0.0f32; QK_K / 32];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..QK_K / 32 {
            let xs = &x[32 * j..32 * j + 32];
            let mut sum_x2 = 0.0f32;
            for v in xs {
                sum_x2 += v * v;
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = av_x + v.abs();
            }
            scales[j] = make_qkx2_quants(15, xs, &weights, &mut l[32 * j..32 * j + 32], &mut mins[j], -1.0, 0.1, 20);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        y.scales = [0; K_SCALE_SIZE];
        for j in 0..QK_K / 32 {
            // C: `uint8_t ls = nearest_int(...)` truncates to 8 bits before the MIN.
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                y.scales[j] = ls;
                y.scales[j + 4] = lm;
            } else {
                y.scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                y.scales[j - 4] |= (ls >> 4) << 6;
                y.scales[j] |= (lm >> 4) << 6;
            }
        }
        y.d = f16::from_f32(max_scale / 63.0);
        y.dmin = f16::from_f32(max_min / 63.0);
        for j in 0..QK_K / 32 {
            let (sc, m) = get_scale_min_k4(j, &y.scales);
            let d = y.d.to_f32() * sc as f32;
            if d == 0.0 {
                continue;
            }
            let dm = y.dmin.to_f32() * m as f32;
            for ii in 0..32 {
                l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, 15) as u8;
            }
        }
        for (n, q) in y.qs.chunks_exact_mut(32).enumerate() {
            for i in 0..32 {
                q[i] = l[64 * n + i] | (l[64 * n + i + 32] << 4);
            }
        }
    }
}

/// The 4-bit levels of one block in value order.
fn unpack(b: &BlockQ4K) -> [u8; QK_K] {
    let mut a = [0u8; QK_K];
    for (n, q) in b.qs.chunks_exact(32).enumerate() {
        for l in 0..32 {
            a[64 * n + l] = q[l] & 0xF;
            a[64 * n + l + 32] = q[l] >> 4;
        }
    }
    a
}

/// `ggml_vec_dot_q4_K_q8_K` (generic): per block d_x·d_y·Σ_sub sc·Σ q_x·q_y
/// − dmin_x·d_y·Σ_sub m·Σ q_y (the last sum from `bsums`).
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let a = unpack(x);
        let (mut isum, mut summs) = (0i32, 0i32);
        for j in 0..QK_K / 32 {
            let (sc, m) = get_scale_min_k4(j, &x.scales);
            summs += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
            let s: i32 = (32 * j..32 * j + 32).map(|i| a[i] as i32 * y.qs[i] as i32).sum();
            isum += sc as i32 * s;
        }
        let d = x.d.to_f32() * y.d;
        let dmin = x.dmin.to_f32() * y.d;
        sumf += d * isum as f32 - dmin * summs as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};
    use crate::{q8_k, zeroed_blocks};

    fn roundtrip(x: &[f32]) -> (Vec<BlockQ4K>, Vec<f32>) {
        quantize_roundtrip(x, quantize, dequantize)
    }

    #[test]
    fn scale_min_packing_roundtrips() {
        let mut b: BlockQ4K = zeroed_blocks(1)[0];
        let want: Vec<(u8, u8)> = (0..8).map(|j| ((j * 7 + 5) as u8 % 64, (j * 13 + 60) as u8 % 64)).collect();
        for (j, &(ls, lm)) in want.iter().enumerate() {
            if j < 4 {
                b.scales[j] = ls;
                b.scales[j + 4] = lm;
            } else {
                b.scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                b.scales[j - 4] |= (ls >> 4) << 6;
                b.scales[j] |= (lm >> 4) << 6;
            }
        }
        let got: Vec<(u8, u8)> = (0..8).map(|j| get_scale_min_k4(j, &b.scales)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn roundtrip_rmse_is_small() {
        let mut rng = Rng::new(10);
        let x = rng.vec(QK_K * 16, 1.0);
        let (_, y) = roundtrip(&x);
        let err2: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let sig2: f32 = x.iter().map(|a| a * a).sum();
        let nrmse = (err2 / sig2).sqrt();
        // 4 bits with a fitted min: ggml's Q4_K lands near 0.09 on Gaussian data.
        assert!(nrmse < 0.12, "normalized rmse {nrmse}");
        // and no value is off by more than ~one sub-block step
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let range = xb.iter().cloned().fold(f32::MIN, f32::max) - xb.iter().cloned().fold(0.0, f32::min);
            assert!(xb.iter().zip(yb).all(|(a, b)| (a - b).abs() <= range / 15.0 * 1.5), "range {range}");
        }
    }

    #[test]
    fn zeros_and_huge_values() {
        let (b, y) = roundtrip(&[0.0; QK_K]);
        assert_eq!((b[0].d.to_f32(), b[0].dmin.to_f32()), (0.0, 0.0));
        assert!(y.iter().all(|v| *v == 0.0));
        let mut rng = Rng::new(11);
        let x = rng.vec(QK_K, 1000.0); // sub-block scales ~1e2·63 stay finite f16
        let (_, y) = roundtrip(&x);
        let err2: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let sig2: f32 = x.iter().map(|a| a * a).sum();
        assert!((err2 / sig2).sqrt() < 0.12);
        assert!(y.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(12);
        let (w, a) = (rng.vec(QK_K * 4, 0.3), rng.vec(QK_K * 4, 2.0));
        let (qw, dw) = roundtrip(&w);
        let mut qa = zeroed_blocks(4);
        q8_k::quantize(&a, &mut qa);
        let mut da = vec![0.0; a.len()];
        q8_k::dequantize(&qa, &mut da);
        let got = vec_dot_q4_k_q8_k(&qw, &qa);
        let want = dot(&dw, &da);
        assert!((got - want).abs() <= 1e-5 * abs_dot(&dw, &da), "{got} vs {want}");
    }
}
