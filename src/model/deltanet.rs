//! The gated delta rule: the linear attention of Qwen3-Next and Qwen3.5. A layer of this
//! kind keeps, per
//! sequence, a fixed-size state instead of a KV cache: the last `conv_kernel - 1` inputs
//! of its causal convolution and, per value head, a `k_head_dim x v_head_dim` matrix `S`.
//! Each token
//!
//! 1. projects to queries, keys, values and an output gate `z`, and to `beta` and `a` per
//!    value head (Qwen3-Next's checkpoints group both by key head; Qwen3.5's and the GGUF
//!    files hold each part whole: [`LinearHost`]);
//! 2. runs queries, keys and values through the depthwise causal convolution and SiLU;
//! 3. L2-normalizes each query and key head, scales queries by `k_head_dim^-1/2`;
//! 4. per value head `h` (key head `h / (n_v / n_k)`), with `decay = exp(g)`,
//!    `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)`:
//!    `S = decay * S`, `S += k (beta * (v - S^T k))^T`, `o = S^T q`;
//! 5. normalizes each head's `o` (RMS, `eps`), scales by the norm weight and by
//!    `silu(z)`, and projects back (`out_proj`).
//!
//! Token by token, in order, whatever the prefill chunks: a prompt fed in one pass, in
//! chunks or one token at a time gives the same numbers. The arithmetic runs on the host
//! in f32, as transformers' recurrent form does (its chunked form for prefill is the same
//! function in another order).

use rayon::prelude::*;

use super::config::LinearAttnConfig;
use crate::backend::Backend;

/// A linear-attention layer's weights: the projections in the backend's form, the small
/// per-channel and per-head tensors on the host.
pub struct LinearWeights<B: Backend> {
    /// `(2 key_dim + 2 value_dim, hidden)`.
    pub qkvz: B::Weight,
    /// `(2 n_v_heads, hidden)`.
    pub ba: B::Weight,
    /// `(hidden, value_dim)`.
    pub out: B::Weight,
    pub host: LinearHost,
}

/// The host-side tensors of a linear-attention layer, as f32.
pub struct LinearHost {
    /// `[conv_dim, conv_kernel]`.
    pub conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `v_head_dim` weights of the gated norm.
    pub norm: Vec<f32>,
    /// The queries, keys, values and `z` come grouped by key head (Qwen3-Next's
    /// checkpoints: `[q, k, v.., z..]` per key head) rather than each whole in head order
    /// (Qwen3.5, and a GGUF Qwen3-Next: `[q, k, v, z]`).
    pub qkvz_grouped: bool,
    /// `b` and `a` likewise (`[b.., a..]` per key head, or `[b, a]`).
    pub ba_grouped: bool,
    /// Value head `h` reads key head `h % n_k_heads` (tiled) rather than
    /// `h / (n_v / n_k)` ([`LinearAttnConfig::v_tiled`]).
    pub v_tiled: bool,
}

/// `log(1 + e^x)`, linear above 20 as PyTorch's `softplus`.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `x / sqrt(sum(x^2) + 1e-6)`, in place (transformers' `l2norm`).
fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Runs `n` consecutive tokens of one sequence through the layer's mixer, from their
/// projections `qkvz` (`n x (2 key_dim + 2 value_dim)`) and `ba` (`n x 2 n_v_heads`),
/// laid out as `w.qkvz_grouped` and `w.ba_grouped` say,
/// updating `state` (`la.state_len()` floats, zero for a new sequence) and writing each
/// token's gated, normalized output (`n x value_dim`) into `out`.
pub fn mix(
    la: &LinearAttnConfig,
    w: &LinearHost,
    eps: f32,
    qkvz: &[f32],
    ba: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let (nk, nv, dk, dv) = (la.n_k_heads, la.n_v_heads, la.k_head_dim, la.v_head_dim);
    let r = nv / nk;
    let (key_dim, value_dim, conv_dim, taps) = (la.key_dim(), la.value_dim(), la.conv_dim(), la.conv_kernel);
    let row_len = 2 * key_dim + 2 * value_dim;
    let group = 2 * dk + 2 * r * dv;
    let (conv_state, s_all) = state.split_at_mut(conv_dim * (taps - 1));
    let mut mixed = vec![0.0f32; conv_dim];
    let mut z = vec![0.0f32; value_dim];
    let mut conv_out = vec![0.0f32; conv_dim];
    let scale = (dk as f32).powf(-0.5);
    for t in 0..out.len() / value_dim {
        let row = &qkvz[t * row_len..(t + 1) * row_len];
        // Queries, keys and values head by head into one row; `z` by value head.
        match w.qkvz_grouped {
            true => {
                for g in 0..nk {
                    let src = &row[g * group..(g + 1) * group];
                    mixed[g * dk..(g + 1) * dk].copy_from_slice(&src[..dk]);
                    mixed[key_dim + g * dk..key_dim + (g + 1) * dk].copy_from_slice(&src[dk..2 * dk]);
                    let v0 = 2 * key_dim + g * r * dv;
                    mixed[v0..v0 + r * dv].copy_from_slice(&src[2 * dk..2 * dk + r * dv]);
                    z[g * r * dv..(g + 1) * r * dv].copy_from_slice(&src[2 * dk + r * dv..]);
                }
            }
            false => {
                mixed.copy_from_slice(&row[..conv_dim]);
                z.copy_from_slice(&row[conv_dim..]);
            }
        }
        // The causal convolution over the previous `taps - 1` rows and this one, then SiLU.
        for (c, o) in conv_out.iter_mut().enumerate() {
            let wc = &w.conv[c * taps..(c + 1) * taps];
            let mut acc = 0.0f32;
            for (j, &wj) in wc[..taps - 1].iter().enumerate() {
                acc += wj * conv_state[j * conv_dim + c];
            }
            acc += wc[taps - 1] * mixed[c];
            *o = silu(acc);
        }
        conv_state.copy_within(conv_dim.., 0);
        conv_state[(taps - 2) * conv_dim..].copy_from_slice(&mixed);

        let (q, rest) = conv_out.split_at_mut(key_dim);
        let (k, v) = rest.split_at_mut(key_dim);
        for g in 0..nk {
            l2norm(&mut q[g * dk..(g + 1) * dk]);
            l2norm(&mut k[g * dk..(g + 1) * dk]);
        }
        q.iter_mut().for_each(|x| *x *= scale);
        let ba_row = &ba[t * 2 * nv..(t + 1) * 2 * nv];
        let o_row = &mut out[t * value_dim..(t + 1) * value_dim];
        let (q, k, v, z) = (&*q, &*k, &*v, &z);
        // Each value head on its own (the heads share nothing but q and k), on the pool
        // the forward pass runs on.
        // `delta`: one scratch row per rayon task, not per head.
        let head = |delta: &mut Vec<f32>, (h, (s, oh)): (usize, (&mut [f32], &mut [f32]))| {
            let g = if w.v_tiled { h % nk } else { h / r };
            let (b, a) = match w.ba_grouped {
                true => (ba_row[g * 2 * r + h % r], ba_row[g * 2 * r + r + h % r]),
                false => (ba_row[h], ba_row[nv + h]),
            };
            let beta = 1.0 / (1.0 + (-b).exp());
            let decay = (w.neg_a[h] * softplus(a + w.dt_bias[h])).exp();
            let (qh, kh, vh) = (&q[g * dk..(g + 1) * dk], &k[g * dk..(g + 1) * dk], &v[h * dv..(h + 1) * dv]);
            // delta = beta * (v - (decay S)^T k), with decay applied to each element as read.
            delta.fill(0.0);
            for (i, &ki) in kh.iter().enumerate() {
                delta.iter_mut().zip(&s[i * dv..(i + 1) * dv]).for_each(|(m, &sij)| *m += (sij * decay) * ki);
            }
            delta.iter_mut().zip(vh).for_each(|(m, &vj)| *m = (vj - *m) * beta);
            // S = decay S + k delta^T, and o = S^T q, in one pass over S.
            oh.fill(0.0);
            for (i, (&ki, &qi)) in kh.iter().zip(qh).enumerate() {
                for ((sij, &d), o) in s[i * dv..(i + 1) * dv].iter_mut().zip(delta.iter()).zip(oh.iter_mut()) {
                    *sij = *sij * decay + ki * d;
                    *o += *sij * qi;
                }
            }
            // The gated RMS norm.
            let inv = 1.0 / (oh.iter().map(|x| x * x).sum::<f32>() / dv as f32 + eps).sqrt();
            for ((o, &nw), &zj) in oh.iter_mut().zip(&w.norm).zip(&z[h * dv..(h + 1) * dv]) {
                *o = nw * (*o * inv) * silu(zj);
            }
        };
        s_all
            .par_chunks_mut(dk * dv)
            .zip(o_row.par_chunks_mut(dv))
            .enumerate()
            .for_each_init(|| vec![0.0f32; dv], head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Fed in one call, in chunks or token by token, the rows and the final state are
    /// the same bit for bit (the state carries everything between calls).
    #[test]
    fn chunks_give_what_one_pass_gives() {
        let la = LinearAttnConfig {
            n_k_heads: 2,
            n_v_heads: 4,
            k_head_dim: 8,
            v_head_dim: 4,
            conv_kernel: 4,
            gguf_layout: false,
            v_tiled: false,
        };
        let w = LinearHost {
            conv: values(la.conv_dim() * 4, 1),
            neg_a: values(4, 2).iter().map(|a| -a.exp()).collect(),
            dt_bias: values(4, 3),
            norm: values(4, 4),
            qkvz_grouped: true,
            ba_grouped: true,
            v_tiled: false,
        };
        let n = 11;
        let qkvz = values(n * (2 * la.key_dim() + 2 * la.value_dim()), 5);
        let ba = values(n * 2 * la.n_v_heads, 6);
        let run = |cuts: &[usize]| {
            let mut state = vec![0.0; la.state_len()];
            let mut out = vec![0.0; n * la.value_dim()];
            let (qw, bw, vw) = (2 * la.key_dim() + 2 * la.value_dim(), 2 * la.n_v_heads, la.value_dim());
            let mut at = 0;
            for &len in cuts {
                let (q, b) = (&qkvz[at * qw..(at + len) * qw], &ba[at * bw..(at + len) * bw]);
                mix(&la, &w, 1e-6, q, b, &mut state, &mut out[at * vw..(at + len) * vw]);
                at += len;
            }
            (out, state)
        };
        let whole = run(&[n]);
        assert!(whole.0.iter().all(|x| x.is_finite()) && whole.0.iter().any(|&x| x != 0.0));
        assert_eq!(run(&[4, 7]), whole);
        assert_eq!(run(&[1; 11]), whole);
    }
}
