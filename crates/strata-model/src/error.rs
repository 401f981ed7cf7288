//! What a forward pass can fail with.

use super::shapes;
use strata_backend::BackendError;
use strata_sched::SchedError;

/// A model's forward pass, or building it, failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error(transparent)]
    Tensors(#[from] shapes::TensorError),
    #[error("context full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("cancelled")]
    Cancelled,
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("a KV cache was passed to a model other than the one that made it")]
    ForeignCache,
    #[error("{0} KV caches are not supported on this device (--kv-type f32 is)")]
    UnsupportedKv(&'static str),
    /// `--sparse-ffn` on a model that cannot run it.
    #[error("--sparse-ffn {setting}: {why}")]
    Sparse { setting: String, why: String },
    /// A pass gave NaN or infinite logits (NaN or infinite weights, or an overflow):
    /// nothing can be sampled from them.
    #[error("the model produced non-finite logits (NaN or infinity); its weights may hold NaN or infinite values")]
    NonFiniteLogits,
}
