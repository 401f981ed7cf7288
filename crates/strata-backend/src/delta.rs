//! The gated delta rule: the linear attention of Qwen3-Next and Qwen3.5, as a backend op
//! ([`Backend::delta_rule`](super::Backend::delta_rule)). A layer of this kind keeps, per
//! sequence, a fixed-size state instead of a KV cache: the last `conv_kernel - 1` inputs
//! of its causal convolution and, per value head, a `k_head_dim x v_head_dim` matrix `S`.
//! Each token
//!
//! 1. comes in projected to queries, keys, values and an output gate `z`, and to `beta`
//!    and `a` per value head (Qwen3-Next's checkpoints group both by key head; Qwen3.5's
//!    and the GGUF files hold each part whole: [`DeltaShape`]);
//! 2. runs queries, keys and values through the depthwise causal convolution and SiLU;
//! 3. L2-normalizes each query and key head, scales queries by `k_head_dim^-1/2`;
//! 4. per value head `h` (key head `h / (n_v / n_k)`, or `h % n_k` when tiled), with
//!    `decay = exp(g)`, `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)`:
//!    `S = decay * S`, `S += k (beta * (v - S^T k))^T`, `o = S^T q`;
//! 5. normalizes each head's `o` (RMS, `eps`), scales it by the norm weight and by
//!    `silu(z)`: the output, which the model projects back (`out_proj`).
//!
//! Token by token, in order, whatever the prefill chunks: a prompt fed in one pass, in
//! chunks or one token at a time gives the same numbers. [`mix`] is the host form (the CPU
//! backend's, in f32 as transformers' recurrent form; its chunked form for prefill is the
//! same function in another order); `kernels/deltanet.cu` is the CUDA form.

use rayon::prelude::*;

/// The sizes and layouts of a linear-attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaShape {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    pub conv_kernel: usize,
    /// The queries, keys, values and `z` come grouped by key head (Qwen3-Next's
    /// checkpoints: `[q, k, v.., z..]` per key head) rather than each whole in head order
    /// (Qwen3.5, and a GGUF Qwen3-Next: `[q, k, v, z]`).
    pub qkvz_grouped: bool,
    /// `b` and `a` likewise (`[b.., a..]` per key head, or `[b, a]`).
    pub ba_grouped: bool,
    /// Value head `h` reads key head `h % n_k_heads` (tiled) rather than
    /// `h / (n_v / n_k)`.
    pub v_tiled: bool,
    /// The gated norm's epsilon.
    pub eps: f32,
}

impl DeltaShape {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.k_head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.v_head_dim
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Values of one token's `qkvz` row.
    pub fn qkvz_len(&self) -> usize {
        2 * self.key_dim() + 2 * self.value_dim()
    }

    /// Floats of a sequence's state: the convolution's last inputs, then `S` per head.
    pub fn state_len(&self) -> usize {
        self.conv_dim() * (self.conv_kernel - 1) + self.n_v_heads * self.k_head_dim * self.v_head_dim
    }

    /// The key head value head `h` reads.
    fn key_head(&self, h: usize) -> usize {
        match self.v_tiled {
            true => h % self.n_k_heads,
            false => h / (self.n_v_heads / self.n_k_heads),
        }
    }
}

/// A linear-attention layer's small tensors, in f32 buffers of the backend.
pub struct DeltaWeights<Buf> {
    /// `[conv_dim, conv_kernel]`.
    pub conv: Buf,
    /// `-exp(A_log)` per value head.
    pub neg_a: Buf,
    pub dt_bias: Buf,
    /// `v_head_dim` weights of the gated norm.
    pub norm: Buf,
}

/// One sequence's part of [`Backend::delta_rule`](super::Backend::delta_rule): rows
/// `row0..row0 + n` of the projections `qkvz` (`rows x shape.qkvz_len()`) and `ba`
/// (`rows x 2 n_v_heads`).
pub struct DeltaRule<'a, Buf> {
    pub shape: DeltaShape,
    pub weights: &'a DeltaWeights<Buf>,
    pub qkvz: &'a Buf,
    pub ba: &'a Buf,
    pub row0: usize,
    pub n: usize,
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

/// Runs the tokens of one sequence through the layer's mixer on the host, from their
/// projections `qkvz` (`n x s.qkvz_len()`) and `ba` (`n x 2 n_v_heads`), updating `state`
/// (`s.state_len()` floats, zero for a new sequence) and writing each token's gated,
/// normalized output (`n x value_dim`) into `out`. `w` holds the host form of
/// [`DeltaWeights`].
pub fn mix(s: &DeltaShape, w: &DeltaWeights<&[f32]>, qkvz: &[f32], ba: &[f32], state: &mut [f32], out: &mut [f32]) {
    let (nk, nv, dk, dv) = (s.n_k_heads, s.n_v_heads, s.k_head_dim, s.v_head_dim);
    let r = nv / nk;
    let (key_dim, value_dim, conv_dim, taps) = (s.key_dim(), s.value_dim(), s.conv_dim(), s.conv_kernel);
    let row_len = s.qkvz_len();
    let group = 2 * dk + 2 * r * dv;
    let (conv_state, s_all) = state.split_at_mut(conv_dim * (taps - 1));
    let mut mixed = vec![0.0f32; conv_dim];
    let mut z = vec![0.0f32; value_dim];
    let mut conv_out = vec![0.0f32; conv_dim];
    let scale = (dk as f32).powf(-0.5);
    for t in 0..out.len() / value_dim {
        let row = &qkvz[t * row_len..(t + 1) * row_len];
        // Queries, keys and values head by head into one row; `z` by value head.
        match s.qkvz_grouped {
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
        let head = |delta: &mut Vec<f32>, (h, (sh, oh)): (usize, (&mut [f32], &mut [f32]))| {
            let g = s.key_head(h);
            let (b, a) = match s.ba_grouped {
                true => (ba_row[g * 2 * r + h % r], ba_row[g * 2 * r + r + h % r]),
                false => (ba_row[h], ba_row[nv + h]),
            };
            let beta = 1.0 / (1.0 + (-b).exp());
            let decay = (w.neg_a[h] * softplus(a + w.dt_bias[h])).exp();
            let (qh, kh, vh) = (&q[g * dk..(g + 1) * dk], &k[g * dk..(g + 1) * dk], &v[h * dv..(h + 1) * dv]);
            // delta = beta * (v - (decay S)^T k), with decay applied to each element as read.
            delta.fill(0.0);
            for (i, &ki) in kh.iter().enumerate() {
                delta.iter_mut().zip(&sh[i * dv..(i + 1) * dv]).for_each(|(m, &sij)| *m += (sij * decay) * ki);
            }
            delta.iter_mut().zip(vh).for_each(|(m, &vj)| *m = (vj - *m) * beta);
            // S = decay S + k delta^T, and o = S^T q, in one pass over S.
            oh.fill(0.0);
            for (i, (&ki, &qi)) in kh.iter().zip(qh).enumerate() {
                for ((sij, &d), o) in sh[i * dv..(i + 1) * dv].iter_mut().zip(delta.iter()).zip(oh.iter_mut()) {
                    *sij = *sij * decay + ki * d;
                    *o += *sij * qi;
                }
            }
            // The gated RMS norm.
            let inv = 1.0 / (oh.iter().map(|x| x * x).sum::<f32>() / dv as f32 + s.eps).sqrt();
            for ((o, &nw), &zj) in oh.iter_mut().zip(w.norm).zip(&z[h * dv..(h + 1) * dv]) {
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
pub(crate) mod tests {
    use super::*;

    pub fn values(n: usize, seed: u32) -> Vec<f32> {
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

    pub fn shape() -> DeltaShape {
        DeltaShape {
            n_k_heads: 2,
            n_v_heads: 4,
            k_head_dim: 8,
            v_head_dim: 4,
            conv_kernel: 4,
            qkvz_grouped: true,
            ba_grouped: true,
            v_tiled: false,
            eps: 1e-6,
        }
    }

    /// Fed in one call, in chunks or token by token, the rows and the final state are
    /// the same bit for bit (the state carries everything between calls).
    #[test]
    fn chunks_give_what_one_pass_gives() {
        let s = shape();
        let conv = values(s.conv_dim() * 4, 1);
        let neg_a: Vec<f32> = values(4, 2).iter().map(|a| -a.exp()).collect();
        let (dt_bias, norm) = (values(4, 3), values(4, 4));
        let w = DeltaWeights { conv: &conv[..], neg_a: &neg_a[..], dt_bias: &dt_bias[..], norm: &norm[..] };
        let n = 11;
        let qkvz = values(n * s.qkvz_len(), 5);
        let ba = values(n * 2 * s.n_v_heads, 6);
        let run = |cuts: &[usize]| {
            let mut state = vec![0.0; s.state_len()];
            let mut out = vec![0.0; n * s.value_dim()];
            let (qw, bw, vw) = (s.qkvz_len(), 2 * s.n_v_heads, s.value_dim());
            let mut at = 0;
            for &len in cuts {
                let (q, b) = (&qkvz[at * qw..(at + len) * qw], &ba[at * bw..(at + len) * bw]);
                mix(&s, &w, q, b, &mut state, &mut out[at * vw..(at + len) * vw]);
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
