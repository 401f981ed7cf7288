//! GGML Q6_K: 256 values as `(q − 32) · d · sc` with 6-bit q and an i8 scale per 16
//! values (`block_q6_K` in ggml-common.h). Per 128 values: 64 bytes of `ql` (low
//! nibbles) and 32 bytes of `qh` (2 high bits each); see [`unpack`].

use half::f16;

use super::q8_k::BlockQ8K;
use super::{Block, QK_K, nearest_int};
use strata_tensor::tensor::DType;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ6K>() == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2);

// SAFETY: repr(C), u8/i8 arrays + f16 (at an even offset), no padding (asserted above).
unsafe impl Block for BlockQ6K {
    const DTYPE: DType = DType::Q6_K;
}

/// The signed levels −32..32 of one block in value order.
pub fn unpack(b: &BlockQ6K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for n in 0..2 {
        let (ql, qh) = (&b.ql[64 * n..], &b.qh[32 * n..]);
        let a = &mut a[128 * n..];
        for l in 0..32 {
            a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    a
}

/// `dequantize_row_q6_K`: y = d · sc · q, evaluated left to right as in ggml.
pub fn dequantize(blocks: &[BlockQ6K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let q = unpack(b);
        for (i, y) in y.iter_mut().enumerate() {
            *y = d * b.scales[i / 16] as f32 * q[i] as f32;
        }
    }
}

/// GGML's `GROUP_MAX_EPS`.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (w = x²):
/// levels in `l_out` are biased by `nmax`. Returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l_out[i] = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `quantize_row_q6_K_ref`.
pub fn quantize(x: &[f32], out: &mut [BlockQ6K]) {
    assert_eq!(x.len(), out.len() * QK_K);
    for (x, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            // SAFETY: all-zero bytes are a valid block (see `Block`).
            *y = unsafe { std::mem::zeroed() };
            continue;
        }
        let iscale = -128.0 / max_scale;
        y.d = f16::from_f32(1.0 / iscale);
        for (s, &scale) in y.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * scale).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = y.d.to_f32() * y.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        for n in 0..2 {
            let (ql, qh) = (&mut y.ql[64 * n..64 * n + 64], &mut y.qh[32 * n..32 * n + 32]);
            let l = &l[128 * n..];
            for i in 0..32 {
                let (q1, q2, q3, q4) = (l[i] as u8, l[i + 32] as u8, l[i + 64] as u8, l[i + 96] as u8);
                ql[i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                ql[i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

/// `ggml_vec_dot_q6_K_q8_K` (generic): per block d_x·d_y·Σ_16 sc·Σ q_x·q_y.
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let a = unpack(x);
        let mut isum = 0i32;
        for j in 0..QK_K / 16 {
            let s: i32 = (16 * j..16 * j + 16).map(|i| a[i] as i32 * y.qs[i] as i32).sum();
            isum += x.scales[j] as i32 * s;
        }
        sumf += x.d.to_f32() * y.d * isum as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{Rng, abs_dot, dot, quantize_roundtrip};
    use crate::{q8_k, zeroed_blocks};

    fn roundtrip(x: &[f32]) -> (Vec<BlockQ6K>, Vec<f32>) {
        quantize_roundtrip(x, quantize, dequantize)
    }

    #[test]
    fn roundtrip_error_is_small() {
        let mut rng = Rng::new(14);
        let x = rng.vec(QK_K * 16, 1.0);
        let (_, y) = roundtrip(&x);
        let err2: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let sig2: f32 = x.iter().map(|a| a * a).sum();
        let nrmse = (err2 / sig2).sqrt();
        assert!(nrmse < 0.03, "normalized rmse {nrmse}");
        for (xb, yb) in x.chunks(16).zip(y.chunks(16)) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            // ~one 6-bit step of the sub-block (its scale is rounded to 8 bits, then f16)
            assert!(xb.iter().zip(yb).all(|(a, b)| (a - b).abs() <= amax / 31.0 * 1.2), "amax {amax}");
        }
    }

    #[test]
    fn zeros_and_huge_values() {
        let (b, y) = roundtrip(&[0.0; QK_K]);
        assert_eq!(b[0].d.to_f32(), 0.0);
        assert!(y.iter().all(|v| *v == 0.0));
        let mut rng = Rng::new(15);
        let x = rng.vec(QK_K, 5000.0); // d ≈ amax/32/128 fits an f16 comfortably
        let (_, y) = roundtrip(&x);
        let err2: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let sig2: f32 = x.iter().map(|a| a * a).sum();
        assert!((err2 / sig2).sqrt() < 0.03);
    }

    #[test]
    fn integer_dot_matches_dequantized_dot() {
        let mut rng = Rng::new(16);
        let (w, a) = (rng.vec(QK_K * 4, 0.3), rng.vec(QK_K * 4, 2.0));
        let (qw, dw) = roundtrip(&w);
        let mut qa = zeroed_blocks(4);
        q8_k::quantize(&a, &mut qa);
        let mut da = vec![0.0; a.len()];
        q8_k::dequantize(&qa, &mut da);
        let got = vec_dot_q6_k_q8_k(&qw, &qa);
        let want = dot(&dw, &da);
        assert!((got - want).abs() <= 1e-5 * abs_dot(&dw, &da), "{got} vs {want}");
    }
}
