//! The compute backend: a small trait of the operations the forward passes need.
//!
//! Activations are row-major f32 matrices in backend buffers (`Buf`); weights are
//! uploaded once into the backend's own form (`Weight`) and keep their stored dtype.
//! New ops land on the CPU first; other backends are checked against it.

pub mod cpu;

use crate::tensor::HostTensor;

/// Parameters of causal attention over a KV cache for one sequence.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Position of the first query row; query row `r` sits at `start_pos + r` and sees
    /// cache rows `0..=start_pos + r`.
    pub start_pos: usize,
    /// Multiplier applied to q·k (usually `head_dim^-0.5`).
    pub scale: f32,
    /// A query at position `p` sees only keys at positions `> p - window`.
    pub sliding_window: Option<usize>,
}

/// Rotary embedding frequencies, one per pair of dimensions (`head_dim / 2` values),
/// already adjusted for any RoPE scaling. The rotation pairs dimension `i` with
/// `i + head_dim / 2` (the "NEOX"/rotate-half layout Hugging Face checkpoints use).
#[derive(Clone, Debug)]
pub struct RopeFreqs {
    pub inv_freq: Vec<f32>,
    /// Multiplier on cos and sin (1.0 except for scalings such as YaRN).
    pub attention_factor: f32,
}

/// The operations a forward pass is written against.
pub trait Backend: Send + Sync + 'static {
    /// A row-major f32 activation buffer.
    type Buf: Send;
    /// A weight tensor in the backend's own form (any stored dtype).
    type Weight: Send + Sync;

    fn name(&self) -> String;

    /// A zeroed buffer of `len` f32 values.
    fn alloc(&self, len: usize) -> Self::Buf;
    /// Copies host values into a new buffer.
    fn upload(&self, data: &[f32]) -> Self::Buf;
    /// Copies the first `len` values of a buffer back to the host.
    fn download(&self, buf: &Self::Buf, len: usize) -> Vec<f32>;
    /// Makes a weight usable by the ops (on the CPU a zero-copy view).
    fn weight(&self, t: &HostTensor) -> Self::Weight;

    /// `out[r] = table[ids[r]]` for a table of shape `[vocab, dim]`.
    fn embedding(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf);
    /// `out[r, o] = Σ_k x[r, k] · w[o, k]`: `x` is `[rows, in]`, `w` is `[out, in]`,
    /// `out` is `[rows, out]`.
    fn matmul(&self, x: &Self::Buf, rows: usize, w: &Self::Weight, out: &mut Self::Buf);
    /// `x[r] += bias` for each of `rows` rows of `bias.len()` values.
    fn add_bias(&self, x: &mut Self::Buf, rows: usize, bias: &Self::Weight);
    /// RMS norm of each `w.len()`-wide row of `x` (`rows` rows), scaled by `w`, into `out`.
    fn rms_norm(&self, x: &Self::Buf, rows: usize, w: &Self::Weight, eps: f32, out: &mut Self::Buf);
    /// Rotates `n_heads` heads of `head_dim` in each of `positions.len()` rows of `x`.
    fn rope(&self, x: &mut Self::Buf, n_heads: usize, head_dim: usize, positions: &[u32], freqs: &RopeFreqs);
    /// Copies rows `src_row..src_row + rows` (each `row_len` values) of `src` into `dst`
    /// at rows `dst_row..`.
    fn copy_rows(
        &self,
        src: &Self::Buf,
        src_row: usize,
        rows: usize,
        row_len: usize,
        dst: &mut Self::Buf,
        dst_row: usize,
    );
    /// Causal attention of query rows `row0..row0 + rows` of `q` (`n_heads * head_dim`
    /// wide) over cached keys and values (`n_kv_heads * head_dim` wide, already holding
    /// the new rows) into the same rows of `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf,
        row0: usize,
        rows: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        p: &AttnParams,
        out: &mut Self::Buf,
    );
    /// `gate = silu(gate) * up`, elementwise over `len` values.
    fn silu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize);
    /// `x += y` elementwise over `len` values.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
}
