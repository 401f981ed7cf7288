//! A linear-attention (gated delta rule) layer's weights: Qwen3-Next's and Qwen3.5's.
//! The rule itself, and what each tensor does in it, is [`strata_backend::delta`].

use strata_backend::Backend;
use strata_backend::delta::{DeltaShape, DeltaWeights};

/// A linear-attention layer's weights: the projections and the small per-channel and
/// per-head tensors, in the backend's form.
pub struct LinearWeights<B: Backend> {
    /// `(2 key_dim + 2 value_dim, hidden)`: queries, keys, values and `z`.
    pub qkvz: B::Weight,
    /// `(2 n_v_heads, hidden)`: `b` and `a`.
    pub ba: B::Weight,
    /// `(hidden, value_dim)`.
    pub out: B::Weight,
    pub small: DeltaWeights<B::Buf>,
    pub shape: DeltaShape,
}
