//! A forward pass's parts (the rows that compute together) and the activation buffers
//! it reuses.

use super::*;

/// Rows of a pass that compute together: a sequence's new tokens, or one row of a
/// verifying sequence (each of its rows alone).
#[derive(Clone, Copy, Debug)]
pub(super) struct Part {
    /// The sequence's index in the batch.
    pub(super) seq: usize,
    /// Its first row in the pass.
    pub(super) row0: usize,
    pub(super) n: usize,
    /// The position of its first row.
    pub(super) start_pos: usize,
}

impl Part {
    /// The parts of `batch`, in row order (sequences without new tokens have none).
    pub(super) fn of(batch: &[SeqStep<'_>]) -> Vec<Part> {
        let mut parts = Vec::with_capacity(batch.len());
        let mut row0 = 0;
        for (seq, s) in batch.iter().enumerate() {
            let (n, at) = (s.tokens.len(), s.cache.len);
            match s.verify {
                true => parts.extend((0..n).map(|j| Part { seq, row0: row0 + j, n: 1, start_pos: at + j })),
                false if n > 0 => parts.push(Part { seq, row0, n, start_pos: at }),
                false => {}
            }
            row0 += n;
        }
        parts
    }
}

/// Activation buffers reused across forward passes (no allocation per token): sized
/// for `rows` token rows and `out_rows` rows of logits, grown when a pass needs more.
pub(super) struct Workspace<B: Backend> {
    pub(super) rows: usize,
    pub(super) out_rows: usize,
    pub(super) x: B::Buf,      // residual stream (rows, hidden)
    pub(super) normed: B::Buf, // (rows, hidden)
    pub(super) q: B::Buf,      // (rows, n_heads * head_dim)
    pub(super) k: B::Buf,      // (rows, n_kv_heads * head_dim)
    pub(super) v: B::Buf,      // (rows, n_kv_heads * head_dim)
    pub(super) attn: B::Buf,   // (rows, n_heads * head_dim)
    pub(super) proj: B::Buf,   // (rows, hidden)
    pub(super) gate: B::Buf,   // (rows, widest MLP: intermediate, expert or shared expert)
    pub(super) up: B::Buf,     // (rows, widest MLP)
    pub(super) moe: Option<MoeBufs<B>>,
    pub(super) scratch: B::Buf, // (rows, max(q_dim, kv_dim))
    /// The attention output gate (rows, q_dim) when the model has one.
    pub(super) attn_gate: Option<B::Buf>,
    /// A linear-attention layer's projections: (rows, 2 key_dim + 2 value_dim) and
    /// (rows, 2 n_v_heads), when the model has such layers.
    pub(super) lin: Option<(B::Buf, B::Buf, B::Buf)>,
    /// A latent-attention layer's own buffers, when the model has such layers.
    pub(super) mla: Option<MlaBufs<B>>,
    pub(super) picked: B::Buf,  // (out_rows, hidden): the rows whose logits are wanted
    pub(super) head_in: B::Buf, // (out_rows, hidden): those rows after the final norm
    pub(super) logits: B::Buf,  // (out_rows, vocab)
}

impl<B: Backend> Workspace<B> {
    pub(super) fn new(be: &B, c: &ModelConfig, rows: usize, out_rows: usize) -> Result<Self, BackendError> {
        let (h, q_dim, kv_dim) = (c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let (rows, out_rows) = (rows.max(1), out_rows.max(1));
        Ok(Workspace {
            rows,
            out_rows,
            x: be.alloc(rows * h)?,
            normed: be.alloc(rows * h)?,
            q: be.alloc(rows * q_dim)?,
            k: be.alloc(rows * kv_dim)?,
            v: be.alloc(rows * kv_dim)?,
            attn: be.alloc(rows * q_dim)?,
            proj: be.alloc(rows * h)?,
            gate: be.alloc(rows * ffn_width(c))?,
            up: be.alloc(rows * ffn_width(c))?,
            moe: MoeBufs::new(be, c, rows)?,
            scratch: be.alloc(rows * q_dim.max(kv_dim))?,
            attn_gate: if c.attn_output_gate { Some(be.alloc(rows * q_dim)?) } else { None },
            lin: match &c.linear_attn {
                Some(la) => Some((
                    be.alloc(rows * (2 * la.key_dim() + 2 * la.value_dim()))?,
                    be.alloc(rows * 2 * la.n_v_heads)?,
                    be.alloc(rows * la.value_dim())?,
                )),
                None => None,
            },
            mla: MlaBufs::new(be, c, rows)?,
            picked: be.alloc(out_rows * h)?,
            head_in: be.alloc(out_rows * h)?,
            logits: be.alloc(out_rows * c.vocab_size)?,
        })
    }
}

/// The widest MLP any layer runs (dense, routed expert or shared expert).
fn ffn_width(c: &ModelConfig) -> usize {
    let m = c.moe.map_or(0, |m| m.expert_size.max(m.shared_expert_size.unwrap_or(0)));
    c.intermediate_size.max(m)
}
