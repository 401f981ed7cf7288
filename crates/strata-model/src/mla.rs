//! Multi-head latent attention (DeepSeek-V3, Kimi-K2), computed in the latent space.
//!
//! Every head's key is `k_nope_h = W_k,h · c` plus the RoPE key `k_pe` all heads share,
//! and its value `v_h = W_v,h · c`, where `c` is the token's normed latent
//! (`kv_lora_rank` values). So `q_nope_h · k_nope_h = (W_k,hᵀ q_nope_h) · c`: each
//! head's query is folded into the latent (`q_lat_h`) once per query row, and attention
//! runs as multi-query attention over keys `[c; k_pe]`, the only thing the cache keeps
//! (`kv_lora_rank + qk_rope_head_dim` values a token and layer). Its output per head is a
//! weighted sum of latents, `Σ p · c`, which `W_v,h` then takes to the head's value
//! width. The attention op's values are the keys themselves (each cached row read as
//! both): the RoPE part of its output is left unused.

use super::config::{MlaConfig, ModelConfig};
use super::decoder::build::concat_rows;
use super::error::ModelError;
use super::spec::Role;
use strata_backend::{AttnParams, Backend, BackendError, Cols, KvType, RopeFreqs, Rows};
use strata_quant::ReadF32;
use strata_sched::SchedError;
use strata_tensor::tensor::HostTensor;

/// One latent-attention layer's weights, in the forms the latent-space product needs.
pub struct MlaWeights<B: Backend> {
    /// The query's bottleneck and its norm, `(q_lora_rank, hidden)` and
    /// `(q_lora_rank)`, when it has one.
    pub q_a: Option<(B::Weight, B::Weight)>,
    /// Every head's query without RoPE (`(n_heads * qk_nope, q_in)`) and its RoPE part
    /// (`(n_heads * qk_rope, q_in)`), `q_in` the bottleneck's rank or `hidden`.
    pub q_nope: B::Weight,
    pub q_rope: B::Weight,
    /// The latent (`(kv_lora_rank, hidden)`), its norm, and the shared RoPE key
    /// (`(qk_rope, hidden)`).
    pub latent: B::Weight,
    pub latent_norm: B::Weight,
    pub k_rope: B::Weight,
    /// Per head: the key up-projection transposed (`(kv_lora_rank, qk_nope)`), which
    /// folds a query into the latent, and the value up-projection (`(v_head_dim,
    /// kv_lora_rank)`).
    pub k_up_t: Vec<B::Weight>,
    pub v_up: Vec<B::Weight>,
    pub wo: B::Weight, // (hidden, n_heads * v_head_dim)
}

/// The buffers a latent-attention layer needs beside the workspace's (`rows` rows).
pub struct MlaBufs<B: Backend> {
    qa: B::Buf,     // (rows, q_lora_rank): the bottleneck, then normed
    qa_n: B::Buf,   // (rows, q_lora_rank)
    q_nope: B::Buf, // (rows, n_heads * qk_nope)
    q_pe: B::Buf,   // (rows, n_heads * qk_rope)
    lat: B::Buf,    // (rows, kv_lora_rank)
    lat_n: B::Buf,  // (rows, kv_lora_rank)
    k_pe: B::Buf,   // (rows, qk_rope)
    head: B::Buf,   // (rows, max(qk_nope, kv_lora_rank)): one head's part
    folded: B::Buf, // (rows, max(kv_lora_rank, v_head_dim)): that part projected
    o_in: B::Buf,   // (rows, n_heads * v_head_dim)
}

impl<B: Backend> MlaBufs<B> {
    pub fn new(be: &B, c: &ModelConfig, rows: usize) -> Result<Option<Self>, BackendError> {
        let Some(a) = c.mla else { return Ok(None) };
        let nh = c.n_heads;
        let q_rank = a.q_lora_rank.unwrap_or(1);
        Ok(Some(MlaBufs {
            qa: be.alloc(rows * q_rank)?,
            qa_n: be.alloc(rows * q_rank)?,
            q_nope: be.alloc(rows * nh * a.qk_nope_head_dim)?,
            q_pe: be.alloc(rows * nh * a.qk_rope_head_dim)?,
            lat: be.alloc(rows * a.kv_lora_rank)?,
            lat_n: be.alloc(rows * a.kv_lora_rank)?,
            k_pe: be.alloc(rows * a.qk_rope_head_dim)?,
            head: be.alloc(rows * a.qk_nope_head_dim.max(a.kv_lora_rank))?,
            folded: be.alloc(rows * a.kv_lora_rank.max(a.v_head_dim))?,
            o_in: be.alloc(rows * nh * a.v_head_dim)?,
        }))
    }
}

/// A latent-attention layer's weights from its host tensors (`host(role)` gives a
/// tensor checked against its shape, or `None` when the layer does not hold it).
pub fn build<B: Backend>(
    c: &ModelConfig,
    be: &B,
    layer: usize,
    host: &dyn Fn(Role) -> Result<Option<HostTensor>, SchedError>,
) -> Result<MlaWeights<B>, SchedError> {
    let err = |msg: String| SchedError::Build { layer, msg };
    let a = c.mla.ok_or_else(|| err("latent attention without its sizes".into()))?;
    let need = |role: Role| host(role)?.ok_or_else(|| err(format!("no {role:?} tensor")));
    let upload = |t: &HostTensor| be.weight(t).map_err(|source| SchedError::Backend { layer, source });
    let (nh, nope, rope) = (c.n_heads, a.qk_nope_head_dim, a.qk_rope_head_dim);
    let qk = a.qk_head_dim();
    let (q_a, q) = match a.q_lora_rank {
        Some(_) => {
            let norm = upload(&need(Role::MlaQANorm)?)?;
            (Some((upload(&need(Role::MlaQA)?)?, norm)), need(Role::MlaQB)?)
        }
        None => (None, need(Role::Q)?),
    };
    let q = splittable(q, &[nope, rope]);
    // Each head's rows of the query: its `nope` rows, then its `rope` rows.
    let part = |offset: usize, n: usize| {
        let parts: Vec<_> = (0..nh).map(|h| (&q, h * qk + offset, n)).collect();
        concat_rows(&parts).ok_or_else(|| err(format!("cannot split the heads of {q:?}")))
    };
    let (q_nope, q_rope) = (part(0, nope)?, part(nope, rope)?);
    let kv_a = splittable(need(Role::MlaKvA)?, &[a.kv_lora_rank, rope]);
    let rows = |t: &HostTensor, start: usize, n: usize| {
        t.rows(start, n).ok_or_else(|| err(format!("cannot split rows {start}..{} of {t:?}", start + n)))
    };
    let (latent, k_rope) = (rows(&kv_a, 0, a.kv_lora_rank)?, rows(&kv_a, a.kv_lora_rank, rope)?);
    let (k_up_t, v_up) = up_projections(&a, nh, host, &err)?;
    Ok(MlaWeights {
        q_a,
        q_nope: upload(&q_nope)?,
        q_rope: upload(&q_rope)?,
        latent: upload(&latent)?,
        latent_norm: upload(&need(Role::MlaKvANorm)?)?,
        k_rope: upload(&k_rope)?,
        k_up_t: k_up_t.iter().map(upload).collect::<Result<_, _>>()?,
        v_up: v_up.iter().map(upload).collect::<Result<_, _>>()?,
        wo: upload(&need(Role::O)?)?,
    })
}

/// `t`, as stored where it is panels (what the streamer delivers) and some of the row
/// counts it is split into (`parts`, repeated) would cut a panel: whole panels are split
/// as views.
fn splittable(t: HostTensor, parts: &[usize]) -> HostTensor {
    match t.is_panels() && parts.iter().any(|p| !p.is_multiple_of(strata_tensor::tensor::PANEL_ROWS)) {
        true => strata_quant::panels::row_major(&t),
        false => t,
    }
}

/// Each head's transposed key up-projection `(kv_lora, qk_nope)` and value
/// up-projection `(v, kv_lora)`: from `kv_b_proj` (a head's key rows transposed here, in
/// f32), or from llama.cpp's `k_b` and `v_b` (already in that form, any block type).
#[allow(clippy::type_complexity)]
fn up_projections(
    a: &MlaConfig,
    nh: usize,
    host: &dyn Fn(Role) -> Result<Option<HostTensor>, SchedError>,
    err: &dyn Fn(String) -> SchedError,
) -> Result<(Vec<HostTensor>, Vec<HostTensor>), SchedError> {
    let (nope, v, r) = (a.qk_nope_head_dim, a.v_head_dim, a.kv_lora_rank);
    let need = |role: Role| host(role)?.ok_or_else(|| err(format!("no {role:?} tensor")));
    if a.split_kv_b {
        // `(n_heads, rows, cols)` as `(n_heads * rows, cols)`, one head's rows apiece.
        let heads = |t: HostTensor, per: usize| -> Result<Vec<HostTensor>, SchedError> {
            let mut flat = t.clone();
            flat.shape = vec![nh * per, t.shape.get(2).copied().unwrap_or(0)];
            (0..nh)
                .map(|h| flat.rows(h * per, per).ok_or_else(|| err(format!("cannot split the heads of {t:?}"))))
                .collect()
        };
        return Ok((heads(need(Role::MlaKB)?, r)?, heads(need(Role::MlaVB)?, v)?));
    }
    let kv_b = splittable(need(Role::MlaKvB)?, &[nope, v]);
    let all = kv_b.to_f32_vec();
    let mut k_up_t = Vec::with_capacity(nh);
    let mut v_up = Vec::with_capacity(nh);
    for h in 0..nh {
        let first = h * (nope + v);
        // Row `i` of the transpose is column `i` of the head's `nope` key rows.
        let mut t = vec![0.0f32; r * nope];
        for j in 0..nope {
            for (i, x) in all[(first + j) * r..][..r].iter().enumerate() {
                t[i * nope + j] = *x;
            }
        }
        k_up_t.push(HostTensor::from_f32(&t, vec![r, nope]));
        v_up.push(kv_b.rows(first + nope, v).ok_or_else(|| err(format!("cannot split the heads of {kv_b:?}")))?);
    }
    Ok((k_up_t, v_up))
}

/// The layer's inputs and where its cache is: `input` (`rows` rows, normed), the
/// positions of those rows, and the pass's parts (rows that compute together):
/// `seq_rows[i]` rows each, part `i` of sequence `at[i].0` from position `at[i].1`.
pub struct MlaStep<'a, B: Backend> {
    pub input: &'a B::Buf,
    pub positions: &'a [u32],
    pub seq_rows: &'a [usize],
    pub at: &'a [(usize, usize)],
    pub rope: &'a RopeFreqs,
    pub kv: KvType,
}

/// The workspace buffers a latent layer writes: `q` (rows, n_heads * cache_width),
/// `kv` (rows, cache_width), `attn` (rows, n_heads * cache_width) and the output `proj`
/// (rows, hidden).
pub struct MlaOut<'a, B: Backend> {
    pub q: &'a mut B::Buf,
    pub kv: &'a mut B::Buf,
    pub attn: &'a mut B::Buf,
    pub proj: &'a mut B::Buf,
}

/// One latent-attention layer over every sequence of the pass: `caches[i]` is sequence
/// `i`'s cache buffer for this layer.
pub fn forward<B: Backend>(
    be: &B,
    c: &ModelConfig,
    w: &MlaWeights<B>,
    step: MlaStep<'_, B>,
    bufs: &mut MlaBufs<B>,
    out: MlaOut<'_, B>,
    caches: &mut [&mut B::Buf],
) -> Result<(), ModelError> {
    let Some(a) = c.mla else { return Ok(()) };
    let MlaStep { input, positions, seq_rows, at, rope, kv } = step;
    let MlaOut { q, kv: kv_rows, attn, proj } = out;
    let rows: usize = seq_rows.iter().sum();
    let (nh, nope, rope_dim, lat, vd) =
        (c.n_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.kv_lora_rank, a.v_head_dim);
    let width = a.cache_width();
    let eps = c.rms_norm_eps;

    // Queries: through the bottleneck (normed) when there is one.
    let q_in: &B::Buf = match &w.q_a {
        Some((wa, norm)) => {
            be.matmul_seqs(input, seq_rows, wa, &mut bufs.qa)?;
            be.rms_norm(&bufs.qa, rows, norm, eps, &mut bufs.qa_n)?;
            &bufs.qa_n
        }
        None => input,
    };
    be.matmul_seqs_each(q_in, seq_rows, &mut [(&w.q_nope, &mut bufs.q_nope), (&w.q_rope, &mut bufs.q_pe)])?;
    // The latent (normed) and the shared RoPE key.
    be.matmul_seqs_each(input, seq_rows, &mut [(&w.latent, &mut bufs.lat), (&w.k_rope, &mut bufs.k_pe)])?;
    be.rms_norm(&bufs.lat, rows, &w.latent_norm, eps, &mut bufs.lat_n)?;
    be.rope(&mut bufs.q_pe, nh, rope_dim, positions, rope)?;
    be.rope(&mut bufs.k_pe, 1, rope_dim, positions, rope)?;

    // The cached row: `[latent; RoPE key]`.
    be.copy_cols(&bufs.lat_n, Cols::new(lat, 0), kv_rows, Cols::new(width, 0), rows, lat)?;
    be.copy_cols(&bufs.k_pe, Cols::new(rope_dim, 0), kv_rows, Cols::new(width, lat), rows, rope_dim)?;
    // Each head's query `[W_kᵀ q_nope; q_pe]`, as wide as a cached row.
    for h in 0..nh {
        be.copy_cols(&bufs.q_nope, Cols::new(nh * nope, h * nope), &mut bufs.head, Cols::new(nope, 0), rows, nope)?;
        be.matmul_seqs(&bufs.head, seq_rows, &w.k_up_t[h], &mut bufs.folded)?;
        be.copy_cols(&bufs.folded, Cols::new(lat, 0), q, Cols::new(nh * width, h * width), rows, lat)?;
        let pe = Cols::new(nh * rope_dim, h * rope_dim);
        be.copy_cols(&bufs.q_pe, pe, q, Cols::new(nh * width, h * width + lat), rows, rope_dim)?;
    }

    let mut row0 = 0;
    for (&n, &(seq, start_pos)) in seq_rows.iter().zip(at) {
        let cache = &mut *caches[seq];
        be.kv_store(kv_rows, Rows::Range { start: row0, n }, width, cache, start_pos, kv)?;
        let p = AttnParams {
            n_heads: nh,
            n_kv_heads: 1,
            head_dim: width,
            start_pos,
            scale: c.attn_scale,
            sliding_window: None,
            softcap: None,
            kv,
            sinks: None,
        };
        be.attention(q, row0, n, cache, cache, &p, attn)?;
        row0 += n;
    }

    // Each head's weighted latent to its value width, then the output projection.
    for h in 0..nh {
        be.copy_cols(attn, Cols::new(nh * width, h * width), &mut bufs.head, Cols::new(lat, 0), rows, lat)?;
        be.matmul_seqs(&bufs.head, seq_rows, &w.v_up[h], &mut bufs.folded)?;
        be.copy_cols(&bufs.folded, Cols::new(vd, 0), &mut bufs.o_in, Cols::new(nh * vd, h * vd), rows, vd)?;
    }
    be.matmul_seqs(&bufs.o_in, seq_rows, &w.wo, proj)?;
    Ok(())
}
