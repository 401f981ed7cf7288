//! The Llama family (llama, mistral, qwen2, qwen3): pre-norm decoder blocks with
//! grouped-query attention, rotary embeddings and a SwiGLU MLP, written against the
//! backend ops. Layer weights come from the scheduler, one layer at a time.

use std::sync::Arc;

use super::ModelSource;
use super::config::ModelConfig;
use crate::backend::{AttnParams, Backend, RopeFreqs};
use crate::sched::{LayerTensors, Reservation, SchedError, SchedOptions, Scheduler};
use crate::tensor::HostTensor;

/// One decoder block's weights, in the backend's form.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Weight,             // (hidden)
    pub wq: B::Weight,                    // (n_heads * head_dim, hidden)
    pub wk: B::Weight,                    // (n_kv_heads * head_dim, hidden)
    pub wv: B::Weight,                    // (n_kv_heads * head_dim, hidden)
    pub bias_qkv: Option<[B::Weight; 3]>, // (n_heads * head_dim), (n_kv * head_dim) x2
    pub qk_norm: Option<[B::Weight; 2]>,  // (head_dim) each
    pub wo: B::Weight,                    // (hidden, n_heads * head_dim)
    pub ffn_norm: B::Weight,              // (hidden)
    pub w_gate: B::Weight,                // (intermediate, hidden)
    pub w_up: B::Weight,                  // (intermediate, hidden)
    pub w_down: B::Weight,                // (hidden, intermediate)
}

/// Keys and values of one sequence, per layer: `[capacity, n_kv_heads * head_dim]`.
pub struct KvCache<B: Backend> {
    k: Vec<B::Buf>,
    v: Vec<B::Buf>,
    len: usize,
    capacity: usize,
    /// Its bytes, held against the scheduler's memory budget.
    _memory: Reservation,
}

impl<B: Backend> KvCache<B> {
    /// Positions already cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets everything after the first `len` positions (for reusing a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// One sequence's part of a batched forward pass.
pub struct SeqStep<'a, B: Backend> {
    /// New tokens, appended after what the cache holds.
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache<B>,
    /// Logits for every new token (true) or only the last (false).
    pub all_logits: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error("tensor `{name}`: expected shape {want:?}, found {got:?}")]
    Shape { name: String, want: Vec<usize>, got: Vec<usize> },
    #[error("missing tensor `{0}`")]
    Missing(String),
    #[error("context full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("cancelled")]
    Cancelled,
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    BadToken { id: u32, vocab: usize },
}

pub struct LlamaModel<B: Backend> {
    pub config: ModelConfig,
    backend: Arc<B>,
    embed: B::Weight,   // (vocab, hidden)
    norm: B::Weight,    // (hidden)
    lm_head: B::Weight, // (vocab, hidden), the embedding when tied
    layers: Scheduler<LayerWeights<B>>,
    rope: RopeFreqs,
    /// Bytes of all weights (layers, embeddings, head, norms).
    pub weights_bytes: usize,
    lm_head_bytes: usize,
}

fn checked<'a>(t: &'a HostTensor, name: &str, want: &[usize]) -> Result<&'a HostTensor, ModelError> {
    if t.shape != want {
        return Err(ModelError::Shape { name: name.to_string(), want: want.to_vec(), got: t.shape.clone() });
    }
    Ok(t)
}

impl<B: Backend> LlamaModel<B> {
    /// Builds the model with every layer resident.
    pub fn new(config: ModelConfig, source: &ModelSource, backend: Arc<B>) -> Result<Self, ModelError> {
        Self::with_options(config, source, backend, &SchedOptions::default())
    }

    /// Builds the model with its layers held as `sched` says (a memory budget, streaming).
    pub fn with_options(
        config: ModelConfig,
        source: &ModelSource,
        backend: Arc<B>,
        sched: &SchedOptions,
    ) -> Result<Self, ModelError> {
        let c = &config;
        let (h, q_dim, kv_dim) = (c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let global = |name: &str, want: &[usize]| -> Result<B::Weight, ModelError> {
            let t = source.tensors.get(name).ok_or_else(|| ModelError::Missing(name.to_string()))?;
            Ok(backend.weight(checked(t, name, want)?))
        };
        let embed = global("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let norm = global("model.norm.weight", &[h])?;
        let head_name = if c.tie_word_embeddings { "model.embed_tokens.weight" } else { "lm_head.weight" };
        let lm_head_bytes = source.tensors.get(head_name).map_or(0, |t| t.bytes().len());
        let lm_head = match c.tie_word_embeddings {
            true => global("model.embed_tokens.weight", &[c.vocab_size, h])?,
            false => global("lm_head.weight", &[c.vocab_size, h])?,
        };

        let mut layer_sources: Vec<LayerTensors> =
            (0..c.n_layers).map(|index| LayerTensors { index, ..Default::default() }).collect();
        for (name, t) in &source.tensors {
            let Some(rest) = name.strip_prefix("model.layers.") else { continue };
            let Some((idx, local)) = rest.split_once('.') else { continue };
            if let Some(layer) = idx.parse::<usize>().ok().and_then(|i| layer_sources.get_mut(i)) {
                layer.tensors.insert(local.to_string(), t.clone());
            }
        }
        let weights_bytes = source.tensors.values().map(|t| t.bytes().len()).sum();

        let (be, c) = (backend.clone(), config.clone());
        let build = move |lt: &LayerTensors| -> Result<LayerWeights<B>, SchedError> {
            let (c, backend) = (&c, &be);
            let get = |name: &str, want: &[usize]| -> Result<B::Weight, SchedError> {
                let t = lt.get(name)?;
                if t.shape != want {
                    return Err(SchedError::Build {
                        layer: lt.index,
                        msg: format!("tensor `{name}`: expected shape {want:?}, found {:?}", t.shape),
                    });
                }
                Ok(backend.weight(t))
            };
            let i = c.intermediate_size;
            Ok(LayerWeights {
                attn_norm: get("input_layernorm.weight", &[h])?,
                wq: get("self_attn.q_proj.weight", &[q_dim, h])?,
                wk: get("self_attn.k_proj.weight", &[kv_dim, h])?,
                wv: get("self_attn.v_proj.weight", &[kv_dim, h])?,
                bias_qkv: match c.attention_bias {
                    true => Some([
                        get("self_attn.q_proj.bias", &[q_dim])?,
                        get("self_attn.k_proj.bias", &[kv_dim])?,
                        get("self_attn.v_proj.bias", &[kv_dim])?,
                    ]),
                    false => None,
                },
                qk_norm: match c.qk_norm {
                    true => Some([
                        get("self_attn.q_norm.weight", &[c.head_dim])?,
                        get("self_attn.k_norm.weight", &[c.head_dim])?,
                    ]),
                    false => None,
                },
                wo: get("self_attn.o_proj.weight", &[h, q_dim])?,
                ffn_norm: get("post_attention_layernorm.weight", &[h])?,
                w_gate: get("mlp.gate_proj.weight", &[i, h])?,
                w_up: get("mlp.up_proj.weight", &[i, h])?,
                w_down: get("mlp.down_proj.weight", &[h, i])?,
            })
        };
        let layers = Scheduler::new(layer_sources, build, sched)?;
        let rope = config.rope_freqs();
        Ok(LlamaModel { config, backend, embed, norm, lm_head, layers, rope, weights_bytes, lm_head_bytes })
    }

    /// Bytes of the output head (read in full every decode step).
    pub fn lm_head_bytes(&self) -> usize {
        self.lm_head_bytes
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    pub fn scheduler(&self) -> &Scheduler<LayerWeights<B>> {
        &self.layers
    }

    /// An empty KV cache for up to `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> KvCache<B> {
        let width = self.config.n_kv_heads * self.config.head_dim;
        let n = self.config.n_layers;
        let bytes = (2 * n * capacity * width * std::mem::size_of::<f32>()) as u64;
        KvCache {
            _memory: self.layers.reserve(bytes),
            k: (0..n).map(|_| self.backend.alloc(capacity * width)).collect(),
            v: (0..n).map(|_| self.backend.alloc(capacity * width)).collect(),
            len: 0,
            capacity,
        }
    }

    /// Runs the new tokens of every sequence in `batch` through the model, appending to
    /// their caches. Returns, per sequence, the logits (`[n, vocab]` row-major) of every
    /// new token or of the last one.
    pub fn forward(&self, batch: &mut [SeqStep<'_, B>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_until(batch, &|| false)
    }

    /// [`forward`](Self::forward) that checks `cancelled` before every layer and gives
    /// up with [`ModelError::Cancelled`] (the caches are left as they were).
    pub fn forward_until(
        &self,
        batch: &mut [SeqStep<'_, B>],
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let be = &*self.backend;
        let h = c.hidden_size;
        let x = self.run_layers(batch, cancelled)?;

        // Gather the rows whose logits are wanted, then the final norm and the head.
        let rows: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let mut picked = be.alloc(rows * h);
        let mut counts = Vec::with_capacity(batch.len());
        let (mut row0, mut out_rows) = (0, 0);
        for s in batch.iter_mut() {
            let n = s.tokens.len();
            let (src, take) = match (s.all_logits, n) {
                (_, 0) => (row0, 0),
                (true, _) => (row0, n),
                (false, _) => (row0 + n - 1, 1),
            };
            be.copy_rows(&x, src, take, h, &mut picked, out_rows);
            counts.push(take);
            out_rows += take;
            row0 += n;
            s.cache.len += n;
        }
        let mut normed = be.alloc(out_rows * h);
        be.rms_norm(&picked, out_rows, &self.norm, c.rms_norm_eps, &mut normed);
        let mut logits = be.alloc(out_rows * c.vocab_size);
        be.matmul(&normed, out_rows, &self.lm_head, &mut logits);
        let logits = be.download(&logits, out_rows * c.vocab_size);
        let mut out = Vec::with_capacity(batch.len());
        let mut at = 0;
        for take in counts {
            out.push(logits[at * c.vocab_size..(at + take) * c.vocab_size].to_vec());
            at += take;
        }
        Ok(out)
    }

    /// A sentence embedding: the mean over positions of the final-norm hidden states,
    /// L2-normalized (`hidden` values).
    pub fn embed(&self, tokens: &[u32], cancelled: &dyn Fn() -> bool) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let be = &*self.backend;
        let h = c.hidden_size;
        let mut cache = self.new_cache(tokens.len());
        let x = self.run_layers(&mut [SeqStep { tokens, cache: &mut cache, all_logits: true }], cancelled)?;
        let mut normed = be.alloc(tokens.len() * h);
        be.rms_norm(&x, tokens.len(), &self.norm, c.rms_norm_eps, &mut normed);
        let hidden = be.download(&normed, tokens.len() * h);
        let mut mean = vec![0.0f64; h];
        for row in hidden.chunks_exact(h) {
            mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v as f64);
        }
        let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
        Ok(mean.iter().map(|v| (v / norm) as f32).collect())
    }

    /// Embeds the new tokens of every sequence and runs every layer over them, writing
    /// keys and values into the caches (without advancing them). Returns the residual
    /// stream `(rows, hidden)`.
    fn run_layers(&self, batch: &mut [SeqStep<'_, B>], cancelled: &dyn Fn() -> bool) -> Result<B::Buf, ModelError> {
        let c = &self.config;
        let be = &*self.backend;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);

        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for s in batch.iter() {
            let needed = s.cache.len + s.tokens.len();
            if needed > s.cache.capacity {
                return Err(ModelError::ContextFull { needed, capacity: s.cache.capacity });
            }
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(ModelError::BadToken { id, vocab: c.vocab_size });
            }
            ids.extend_from_slice(s.tokens);
            positions.extend((s.cache.len..needed).map(|p| p as u32));
        }
        let rows = ids.len();

        let mut x = be.alloc(rows * h); // residual stream (rows, hidden)
        be.embedding(&self.embed, &ids, &mut x);
        let mut normed = be.alloc(rows * h); // (rows, hidden)
        let mut q = be.alloc(rows * q_dim); // (rows, n_heads * head_dim)
        let mut k = be.alloc(rows * kv_dim); // (rows, n_kv_heads * head_dim)
        let mut v = be.alloc(rows * kv_dim);
        let mut attn = be.alloc(rows * q_dim);
        let mut proj = be.alloc(rows * h);
        let mut gate = be.alloc(rows * c.intermediate_size); // (rows, intermediate)
        let mut up = be.alloc(rows * c.intermediate_size);
        let mut scratch = be.alloc(rows * q_dim.max(kv_dim));

        for l in 0..c.n_layers {
            if cancelled() {
                return Err(ModelError::Cancelled);
            }
            let w = self.layers.layer(l)?;
            be.rms_norm(&x, rows, &w.attn_norm, c.rms_norm_eps, &mut normed);
            be.matmul(&normed, rows, &w.wq, &mut q);
            be.matmul(&normed, rows, &w.wk, &mut k);
            be.matmul(&normed, rows, &w.wv, &mut v);
            if let Some([bq, bk, bv]) = &w.bias_qkv {
                be.add_bias(&mut q, rows, bq);
                be.add_bias(&mut k, rows, bk);
                be.add_bias(&mut v, rows, bv);
            }
            if let Some([qn, kn]) = &w.qk_norm {
                be.rms_norm(&q, rows * c.n_heads, qn, c.rms_norm_eps, &mut scratch);
                be.copy_rows(&scratch, 0, rows, q_dim, &mut q, 0);
                be.rms_norm(&k, rows * c.n_kv_heads, kn, c.rms_norm_eps, &mut scratch);
                be.copy_rows(&scratch, 0, rows, kv_dim, &mut k, 0);
            }
            be.rope(&mut q, c.n_heads, hd, &positions, &self.rope);
            be.rope(&mut k, c.n_kv_heads, hd, &positions, &self.rope);

            let mut row0 = 0;
            for s in batch.iter_mut() {
                let n = s.tokens.len();
                let cache = &mut *s.cache;
                be.copy_rows(&k, row0, n, kv_dim, &mut cache.k[l], cache.len);
                be.copy_rows(&v, row0, n, kv_dim, &mut cache.v[l], cache.len);
                let p = AttnParams {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: hd,
                    start_pos: cache.len,
                    scale: (hd as f32).powf(-0.5),
                    sliding_window: c.sliding_window,
                };
                be.attention(&q, row0, n, &cache.k[l], &cache.v[l], &p, &mut attn);
                row0 += n;
            }
            be.matmul(&attn, rows, &w.wo, &mut proj);
            be.add(&mut x, &proj, rows * h);

            be.rms_norm(&x, rows, &w.ffn_norm, c.rms_norm_eps, &mut normed);
            be.matmul(&normed, rows, &w.w_gate, &mut gate);
            be.matmul(&normed, rows, &w.w_up, &mut up);
            be.silu_mul(&mut gate, &up, rows * c.intermediate_size);
            be.matmul(&gate, rows, &w.w_down, &mut proj);
            be.add(&mut x, &proj, rows * h);
        }

        Ok(x)
    }
}
