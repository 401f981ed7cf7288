//! Memory that the forward pass needs besides weights (KV cache and activations), and
//! the default budget that leaves for layer weights.

use serde::Serialize;

/// The shape a runtime-memory estimate needs: the model's dimensions and how it is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeShape {
    pub hidden: u64,
    /// FFN width (`intermediate_size`).
    pub intermediate: u64,
    /// Rows of `n_kv_heads · head_dim` values the KV cache keeps per token over every
    /// layer: 2 (keys and values) per attention layer, 1 per latent-attention layer (the
    /// latent and RoPE key, read as both), none for a linear-attention layer.
    pub kv_rows: u64,
    pub n_heads: u64,
    pub n_kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    /// Tokens of context each KV cache holds.
    pub context: u64,
    /// Sequences whose KV caches are held at once.
    pub sequences: u64,
    /// Token rows in one forward pass (1 per sequence while decoding, up to the prefill
    /// chunk while prefilling).
    pub rows: u64,
    /// Bytes per KV cache element (4 for f32, 2 for f16).
    pub kv_dtype_bytes: u64,
}

/// Memory that the forward pass needs besides weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RuntimeBytes {
    pub kv_cache: u64,
    pub activations: u64,
}

impl RuntimeBytes {
    pub fn total(&self) -> u64 {
        self.kv_cache.saturating_add(self.activations)
    }
}

/// Bytes of activation buffers are f32.
const ACT_BYTES: u64 = 4;

/// KV cache and peak activation bytes for `shape`.
///
/// Follows seed 001's `estimate_activation_vram(config, seq_len)` (the Python
/// `CachedScheduler`, which reserves this much before caching layers): activations grow
/// O(S²) in prefill through the attention scores and O(S) in decode beside a KV cache of
/// shape `[num_layers, batch, num_kv_heads, max_seq_len, head_dim]`. The seed states only
/// those orders, so the terms are spelled out here from the buffers a llama-style layer
/// holds at once:
///
/// ```text
/// kv_cache    = kv_rows · sequences · n_kv_heads · context · head_dim · kv_dtype_bytes
/// activations = 4 (f32) · rows · ( 2 · hidden                   residual and normed input
///                                + 2 · n_heads · head_dim        q and attention output
///                                + 2 · n_kv_heads · head_dim     new k and v
///                                + n_heads · context             attention scores
///                                + 2 · intermediate              gate and up (silu_mul in place)
///                                + vocab )                       logits
/// ```
///
/// Every buffer is counted as live at once, so this is an upper bound; with `rows` equal
/// to a whole prompt of `context` tokens the scores term is the seed's O(S²).
/// Saturates rather than overflowing on absurd shapes.
pub fn estimate_runtime_bytes(shape: &RuntimeShape) -> RuntimeBytes {
    let mul = |xs: &[u64]| xs.iter().fold(1u64, |acc, &x| acc.saturating_mul(x));
    let kv_cache =
        mul(&[shape.kv_rows, shape.sequences, shape.n_kv_heads, shape.context, shape.head_dim, shape.kv_dtype_bytes]);
    let per_row = [
        mul(&[2, shape.hidden]),
        mul(&[2, shape.n_heads, shape.head_dim]),
        mul(&[2, shape.n_kv_heads, shape.head_dim]),
        mul(&[shape.n_heads, shape.context]),
        mul(&[2, shape.intermediate]),
        shape.vocab,
    ]
    .iter()
    .fold(0u64, |acc, &x| acc.saturating_add(x));
    let activations = mul(&[ACT_BYTES, shape.rows, per_row]);
    RuntimeBytes { kv_cache, activations }
}

/// The default `--memory-budget`: what is left for layer weights once the KV cache,
/// activations and the always-resident weights (embeddings, output head, norms) have
/// theirs, keeping `headroom` (a fraction of `free_memory`, clamped to [0, 1]; NaN counts
/// as 0) unused for the allocator and everything else. Saturates at 0.
pub fn default_budget(free_memory: u64, runtime: &RuntimeBytes, always_resident: u64, headroom: f64) -> u64 {
    let headroom = if headroom.is_nan() { 0.0 } else { headroom.clamp(0.0, 1.0) };
    // f64 → u64 casts saturate; the product is at most free_memory.
    let reserve = (free_memory as f64 * headroom) as u64;
    free_memory.saturating_sub(reserve).saturating_sub(runtime.total()).saturating_sub(always_resident)
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- runtime estimate -------------------------------------------------------------

    fn tinyllama(rows: u64) -> RuntimeShape {
        RuntimeShape {
            hidden: 2048,
            intermediate: 5632,
            kv_rows: 2 * 22,
            n_heads: 32,
            n_kv_heads: 4,
            head_dim: 64,
            vocab: 32000,
            context: 2048,
            sequences: 1,
            rows,
            kv_dtype_bytes: 4,
        }
    }

    #[test]
    fn runtime_estimate_for_tinyllama_shape() {
        // KV: 2 · 22 layers · 1 seq · 4 kv heads · 2048 ctx · 64 head_dim · 4 bytes
        //   = 44 · 4 · 2048 · 64 · 4 = 44 · 2_097_152 = 92_274_688 (88 MiB).
        // Per row (f32 elements): 2·2048 + 2·32·64 + 2·4·64 + 32·2048 + 2·5632 + 32000
        //   = 4096 + 4096 + 512 + 65536 + 11264 + 32000 = 117_504 → 470_016 bytes.
        let decode = estimate_runtime_bytes(&tinyllama(1));
        assert_eq!(decode, RuntimeBytes { kv_cache: 92_274_688, activations: 470_016 });
        // A 512-row prefill chunk: 512 · 470_016 = 240_648_192.
        let prefill = estimate_runtime_bytes(&tinyllama(512));
        assert_eq!(prefill, RuntimeBytes { kv_cache: 92_274_688, activations: 240_648_192 });
        assert_eq!(prefill.total(), 332_922_880);
        // f16 KV halves the cache; two sequences double it.
        let f16 = estimate_runtime_bytes(&RuntimeShape { kv_dtype_bytes: 2, sequences: 2, ..tinyllama(1) });
        assert_eq!(f16.kv_cache, 92_274_688);
    }

    #[test]
    fn runtime_estimate_saturates() {
        let huge = RuntimeShape { context: u64::MAX, rows: u64::MAX, ..tinyllama(1) };
        let r = estimate_runtime_bytes(&huge);
        assert_eq!((r.kv_cache, r.activations, r.total()), (u64::MAX, u64::MAX, u64::MAX));
    }

    #[test]
    fn default_budget_subtracts_runtime_resident_and_headroom() {
        let rt = RuntimeBytes { kv_cache: 100, activations: 50 };
        assert_eq!(default_budget(1000, &rt, 200, 0.0), 650);
        // 10% of 1000 kept free.
        assert_eq!(default_budget(1000, &rt, 200, 0.1), 550);
        assert_eq!(default_budget(1000, &rt, 200, 1.0), 0);
        assert_eq!(default_budget(1000, &rt, 200, 7.0), 0);
        assert_eq!(default_budget(1000, &rt, 200, -1.0), 650);
        assert_eq!(default_budget(1000, &rt, 200, f64::NAN), 650);
        assert_eq!(default_budget(100, &rt, 200, 0.0), 0);
        assert_eq!(default_budget(u64::MAX, &RuntimeBytes::default(), 0, 0.0), u64::MAX);
    }

    // --- plan -------------------------------------------------------------------------
}
