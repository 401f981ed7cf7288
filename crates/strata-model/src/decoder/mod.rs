//! The decoder: grouped-query attention with rotary embeddings (or, in the hybrid
//! families, the gated delta rule of [`super::deltanet`] on most layers) and a gated MLP
//! or routed experts, written against the backend ops, for every family its spec
//! ([`super::spec`]) describes (Llama, Mistral, Qwen 2/3, Gemma 2/3, Phi-3, OLMo 2,
//! Granite, SmolLM3, the MoE and the hybrid families). Layer weights come from the
//! scheduler, one layer at a time.

use std::any::Any;
use std::sync::{Arc, Mutex};

pub(crate) mod build;
mod kv_cache;
mod language_model;
mod layers;
mod pass;
mod workspace;

use build::*;
use kv_cache::*;
pub use kv_cache::{KV_BLOCK, KvCache, LastOutput};
use workspace::*;

use super::config::{Ffn, Mixer, ModelConfig};
use super::deltanet::LinearWeights;
pub use super::error::ModelError;
use super::mla::{self, MlaBufs, MlaOut, MlaStep, MlaWeights};
use super::moe::{self, EachUnit, Mlp, MlpBufs, MoeBlock, MoeBufs, MoeWeights, UnitSource};
use super::shapes;
use super::sparse::{self, Bundle, NeuronWeights, SparseBlock, SparseFfn};
use super::spec::{self, QkNorm, Role};
use super::{ModelSource, PassRows, Readback};
use strata_backend::delta::{DeltaRule, DeltaShape, DeltaWeights};
use strata_backend::{
    Activation, AttnParams, Backend, BackendError, BackendResult, Fused, HostCopy, KvType, RopeFreqs, RopeHeads, Rows,
    TopK, Unary,
};
use strata_quant::ReadF32;
use strata_sched::expert_policy::ExpertId;
use strata_sched::experts::{ExpertCache, ExpertOptions, ExpertUnit};
use strata_sched::{ExpertLoading, LayerTensors, Reservation, SchedError, SchedInfo, SchedOptions, Scheduler};
use strata_tensor::tensor::{AlignedBytes, HostTensor};

/// One decoder block's weights, in the backend's form. The norms a family does not
/// have are `None` (see [`spec::NormPlacement`]).
pub struct LayerWeights<B: Backend> {
    pub attn_norm: Option<B::Weight>, // (hidden)
    pub mixer: MixerWeights<B>,
    pub attn_post_norm: Option<B::Weight>, // (hidden)
    pub ffn_norm: Option<B::Weight>,       // (hidden)
    pub ffn: FfnWeights<B>,
    pub ffn_post_norm: Option<B::Weight>, // (hidden)
}

/// How a layer mixes tokens ([`Mixer`]).
pub enum MixerWeights<B: Backend> {
    Attention(AttnWeights<B>),
    /// The gated delta rule (Qwen3-Next's and Qwen3.5's linear layers).
    Linear(LinearWeights<B>),
    /// Multi-head latent attention (DeepSeek-V3).
    Latent(MlaWeights<B>),
}

/// Grouped-query attention.
pub struct AttnWeights<B: Backend> {
    pub wq: B::Weight,                    // (n_heads * head_dim, hidden)
    pub wk: B::Weight,                    // (n_kv_heads * head_dim, hidden)
    pub wv: B::Weight,                    // (n_kv_heads * head_dim, hidden)
    pub bias_qkv: Option<[B::Weight; 3]>, // (n_heads * head_dim), (n_kv * head_dim) x2
    pub qk_norm: Option<[B::Weight; 2]>,  // (head_dim) each, or (q width), (kv width) when whole
    /// The output gate's rows of `q_proj` (`attn_output_gate`), (n_heads * head_dim, hidden).
    pub gate: Option<B::Weight>,
    pub wo: B::Weight,             // (hidden, n_heads * head_dim)
    pub bias_o: Option<B::Weight>, // (hidden)
    /// Each query head's sink logit (gpt-oss).
    pub sinks: Option<Vec<f32>>,
}

/// A layer's feed-forward block.
pub enum FfnWeights<B: Backend> {
    /// The gated MLP, `(intermediate, hidden)` gate and up, `(hidden, intermediate)` down.
    Dense(Mlp<B>),
    /// The router and shared expert; the routed experts come from the expert cache.
    Moe(MoeWeights<B>),
    /// The gate in full; `up` and `down` as neuron groups (a sparse FFN).
    Neurons(NeuronWeights<B>),
}

/// One sequence's part of a batched forward pass.
pub struct SeqStep<'a> {
    /// New tokens, appended after what the cache holds.
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    /// Logits for every new token (true) or only the last (false).
    pub all_logits: bool,
    /// Speculative verification: every new token's row is computed exactly as a step
    /// of that token alone would compute it (the one-row kernels, a recurrent state
    /// advanced row by row and saved after each row, so that
    /// [`KvCache::truncate`] can go back to any of them), and every row's output comes
    /// back (as with `all_logits`). The rows still share one read of the weights.
    pub verify: bool,
}

impl SeqStep<'_> {
    /// Whether every new token's output comes back.
    fn every_row(&self) -> bool {
        self.all_logits || self.verify
    }
}

/// A pass's logits (`Readback::Full`) or top entries (`Readback::Top`) of the selected
/// rows, and how many rows each sequence got.
type PassOutput = (Vec<f32>, Vec<usize>, Vec<TopK>);

pub struct DecoderModel<B: Backend> {
    pub config: ModelConfig,
    backend: Arc<B>,
    embed: B::Weight,   // (vocab, hidden)
    norm: B::Weight,    // (hidden)
    lm_head: B::Weight, // (vocab, hidden), the embedding when tied
    layers: Scheduler<LayerWeights<B>>,
    /// The routed experts of a MoE model (`None` when dense, or when each layer is
    /// loaded with all of its experts).
    experts: Option<Arc<ExpertCache<Mlp<B>>>>,
    /// The routed experts the CPU computes beside the device (`--cpu-moe`,
    /// `--n-cpu-moe`, auto), when it computes some.
    cpu_side: Option<Arc<super::split::CpuSide>>,
    /// Score a speculative guess of each MoE layer's experts (`--expert-guess`).
    guess_experts: bool,
    /// The neuron groups of a sparse FFN model held apart from the layer cores
    /// (`None` when dense, or when each layer is loaded with all of its groups).
    neurons: Option<Arc<ExpertCache<Bundle<B>>>>,
    /// How a model stored with neuron-group bundles chooses its groups.
    sparse: SparseFfn,
    /// Each layer's RoPE (`None`: the layer has none).
    rope: Vec<Option<RopeFreqs>>,
    /// Bytes of all weights (layers, embeddings, head, norms).
    pub weights_bytes: usize,
    lm_head_bytes: usize,
    workspace: Mutex<Option<Workspace<B>>>,
    /// How its KV caches store keys and values.
    kv_type: KvType,
}

impl<B: Backend> DecoderModel<B> {
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
        shapes::check_tensors(c, &source.tensors)?;
        // Present and shaped as the spec says (checked above).
        let global = |name: &str| -> Result<&HostTensor, ModelError> {
            source.tensors.get(name).ok_or_else(|| shapes::TensorError::Missing(name.to_string()).into())
        };
        let (embed_name, norm_name, head_name) = (spec::EMBED.0, spec::OUTPUT_NORM.0, spec::OUTPUT.0);
        let embed = backend.weight(global(embed_name)?)?;
        let norm = backend.weight(&norm_weight(global(norm_name)?, c.spec().hf_norm_offset))?;
        let head_name = if c.tie_word_embeddings { embed_name } else { head_name };
        let head = global(head_name)?;
        let lm_head = match c.tie_word_embeddings {
            true => backend.weight_again(&embed, head)?,
            false => backend.weight(head)?,
        };
        let lm_head_bytes = head.byte_len();

        let mut layer_sources: Vec<LayerTensors> =
            (0..c.n_layers).map(|index| LayerTensors { index, ..Default::default() }).collect();
        // A MoE layer's routed experts (a sparse FFN's neuron groups) are units of their
        // own, unless loaded whole. A sparse FFN that keeps every group reads them with
        // their layer, through the prefetch ring, as a dense layer is read (a request
        // that asks for fewer then saves compute, not reads).
        let sparse = sched.sparse_ffn;
        let whole_groups = c.neuron_group.is_some() && sparse.keeps_all();
        let split_experts = sched.expert_loading == ExpertLoading::Routed && !whole_groups;
        let n_experts = c.moe.map_or(0, |m| m.n_experts);
        let n_groups = c.neuron_group.map_or(0, |g| c.intermediate_size / g.max(1));
        if !sparse.is_off() && c.neuron_group.is_none() {
            let why = sparse::without_bundles(c, &source.name);
            return Err(ModelError::Sparse { setting: sparse.to_string(), why });
        }
        let mut expert_tensors: Vec<Vec<LayerTensors>> = Vec::new();
        for (l, layer) in c.layers.iter().enumerate() {
            let n = match layer.ffn {
                Ffn::Moe => n_experts,
                Ffn::Dense => n_groups,
            };
            let units = match split_experts {
                true => (0..n).map(|_| LayerTensors { index: l, ..Default::default() }).collect(),
                false => Vec::new(),
            };
            expert_tensors.push(units);
        }
        for (name, t) in &source.tensors {
            if let Some((i, local)) = strata_format::layer_tensor(name)
                && let Some(layer) = layer_sources.get_mut(i)
            {
                let unit = strata_format::unit_tensor(local).and_then(|(e, _)| expert_tensors[i].get_mut(e));
                match unit {
                    Some(unit) => unit.tensors.insert(local.to_string(), t.clone()),
                    None => layer.tensors.insert(local.to_string(), t.clone()),
                };
            }
        }
        let weights_bytes = source.tensors.values().map(HostTensor::byte_len).sum();
        let units: Vec<ExpertUnit> = expert_tensors
            .into_iter()
            .enumerate()
            .flat_map(|(l, units)| {
                units
                    .into_iter()
                    .enumerate()
                    .map(move |(e, tensors)| ExpertUnit { id: ExpertId { layer: l as u32, expert: e as u32 }, tensors })
            })
            .collect();
        let expert_bytes: u64 = units.iter().map(|u| u.tensors.bytes() as u64).sum();
        let cores: Vec<u64> = layer_sources.iter().map(|l| l.bytes() as u64).collect();
        let core_bytes: u64 = cores.iter().sum();

        let (be, c) = (backend.clone(), config.clone());
        let build = move |lt: &LayerTensors| build_layer(&c, &*be, lt);
        // Streamed weights come out of each read as the backend keeps resident ones.
        let sched = &SchedOptions { repack: backend.repacks_weights(), ..sched.clone() };
        // On the backend's threads: a streamer repacks the layers its plan pins as it
        // starts, and that work belongs on `--threads`, not on rayon's global pool.
        let mut layers = backend.on_workers(|| Scheduler::new(layer_sources, build, sched))?;
        // The cache gets what the budget leaves after the cores, unless told.
        let opts = ExpertOptions {
            budget: match sched.expert_cache {
                Some(size) => Some(size.bytes(expert_bytes)),
                None => sched.budget.map(|b| b.saturating_sub(core_bytes)),
            },
            policy: sched.expert_policy,
            buffered: sched.buffered,
            stage: sched.stage.clone(),
            repack: sched.repack,
            host_budget: 0,
        };
        let (mut experts, mut neurons, mut cpu_side) = (None, None, None);
        // Some routed experts computed by the CPU beside the device, as planned: the
        // device's cache then holds what the plan gives VRAM.
        let mut opts = opts;
        if let (Some(split), Some(_), false) = (&sched.split, config.moe, units.is_empty()) {
            // `--expert-cache` caps the VRAM the plan gives experts.
            let mut split = split.clone();
            if let Some(size) = sched.expert_cache {
                let cap = core_bytes.saturating_add(size.bytes(expert_bytes));
                split.budgets.vram_free = split.budgets.vram_free.min(cap);
            }
            // The page-locked memory the layer cores' host tier takes is not the experts'.
            if sched.stage.is_some() {
                let streamed_cores = core_bytes.saturating_sub(sched.budget.unwrap_or(u64::MAX));
                let left = sched.host_budget.saturating_sub(streamed_cores);
                split.budgets.pinned_max = split.budgets.pinned_max.min(left);
            }
            let side = super::split::CpuSide::new(super::split::SideBuild {
                config: &config,
                device: &*backend,
                units: &units,
                cores: &cores,
                opts: &split,
                stats: layers.stats(),
                policy: sched.expert_policy,
                buffered: sched.buffered,
            })?;
            opts.budget = Some(side.device_expert_bytes());
            opts.host_budget = side.device_host_bytes();
            let side = Arc::new(side);
            layers.attach_split(side.clone());
            cpu_side = Some(side);
        }
        if !units.is_empty() {
            let (be, cfg, stats) = (backend.clone(), config.clone(), layers.stats_arc());
            match config.neuron_group {
                Some(_) => {
                    let build = Box::new(move |g: usize, lt: &LayerTensors| build_bundle(&cfg, &*be, lt, g));
                    let cache = ExpertCache::new(config.n_layers, n_groups, units, build, &opts, stats)?;
                    let cache = Arc::new(cache.for_neuron_groups());
                    layers.attach_experts(cache.clone());
                    tracing::debug!(group_bytes = expert_bytes, core_bytes, "neuron groups held apart from the cores");
                    neurons = Some(cache);
                }
                None => {
                    let build = Box::new(move |e: usize, lt: &LayerTensors| build_expert(&cfg, &*be, lt, e));
                    let cache = Arc::new(ExpertCache::new(config.n_layers, n_experts, units, build, &opts, stats)?);
                    layers.attach_experts(cache.clone());
                    tracing::debug!(expert_bytes, core_bytes, "experts held apart from the layer cores");
                    experts = Some(cache);
                }
            }
        }
        let rope = config.layers.iter().map(|l| config.rope_for(l.rope)).collect();
        Ok(DecoderModel {
            config,
            backend,
            embed,
            norm,
            lm_head,
            layers,
            experts,
            cpu_side,
            guess_experts: sched.expert_guess,
            neurons,
            sparse,
            rope,
            weights_bytes,
            lm_head_bytes,
            workspace: Mutex::new(None),
            kv_type: KvType::F32,
        })
    }

    /// Stores its KV caches as `ty`, when the backend can.
    pub fn with_kv_type(mut self, ty: KvType) -> Result<Self, ModelError> {
        if !self.backend.kv_types().contains(&ty) {
            return Err(ModelError::UnsupportedKv(ty.name()));
        }
        self.kv_type = ty;
        Ok(self)
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

    /// The routed experts the CPU computes beside the device, when it computes some.
    pub fn cpu_side(&self) -> Option<&super::split::CpuSide> {
        self.cpu_side.as_deref()
    }

    /// Runs the new tokens of every sequence in `batch` through the model, appending to
    /// their caches. Returns, per sequence, the logits (`[n, vocab]` row-major) of every
    /// new token or of the last one.
    pub fn forward(&self, batch: &mut [SeqStep<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_until(batch, &|| false)
    }

    /// [`forward`](Self::forward) that checks `cancelled` before every layer and gives
    /// up with [`ModelError::Cancelled`] (the caches are left as they were).
    pub fn forward_until(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let vocab = self.config.vocab_size;
        let (logits, counts, _) = self.run(batch, cancelled, Readback::Full)?;
        let mut out = Vec::with_capacity(counts.len());
        let mut at = 0;
        for take in counts {
            out.push(logits[at * vocab..(at + take) * vocab].to_vec());
            at += take;
        }
        Ok(out)
    }

    /// Runs `batch` like [`forward_until`](Self::forward_until) (every sequence's
    /// `all_logits` is ignored) and returns, per sequence, the `k` most likely next
    /// tokens after its last new token; only those cross from the device.
    pub fn forward_top_k(
        &self,
        batch: &mut [SeqStep<'_>],
        k: usize,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<TopK>, ModelError> {
        batch.iter_mut().for_each(|s| s.all_logits = false);
        let (_, counts, top) = self.run(batch, cancelled, Readback::Top(k))?;
        let mut top = top.into_iter();
        // A sequence with no new tokens has no row: it gets an empty answer.
        Ok(counts
            .iter()
            .map(|&n| if n == 0 { TopK::empty() } else { top.next().unwrap_or_else(TopK::empty) })
            .collect())
    }

    /// The layers, then the final norm and head over each sequence's selected rows.
    /// Returns the logits (`Readback::Full`) or the top entries (`Readback::Top`, `k`
    /// clamped to 1..=`MAX_TOP_K`) of those rows, and how many rows each sequence got.
    pub(super) fn run(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
        readback: Readback,
    ) -> Result<PassOutput, ModelError> {
        let k = |k: usize| k.clamp(1, strata_backend::MAX_TOP_K);
        let readback = match readback {
            Readback::Top(n) => Readback::Top(k(n)),
            Readback::Both(n) => Readback::Both(k(n)),
            Readback::Full => Readback::Full,
        };
        self.backend.on_workers(|| self.run_here(batch, cancelled, readback))
    }

    /// [`run`](Self::run), on whichever thread calls it.
    fn run_here(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
        readback: Readback,
    ) -> Result<PassOutput, ModelError> {
        let rows: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let out_rows: usize =
            batch.iter().map(|s| if s.every_row() { s.tokens.len() } else { s.tokens.len().min(1) }).sum();
        let mut guard = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let ws = self.workspace_for(&mut guard, rows, out_rows)?;
        for s in batch.iter_mut() {
            s.cache.fresh_states().map_err(ModelError::Backend)?;
        }
        let result = self.run_pass(batch, cancelled, readback, ws);
        if result.is_err() {
            // A linear-attention state moved on in the layers that ran: start it over.
            batch.iter_mut().for_each(|s| s.cache.forget_states());
        }
        result
    }

    /// The workspace, grown (reallocated) when this pass needs more rows than it has.
    fn workspace_for<'w>(
        &self,
        slot: &'w mut Option<Workspace<B>>,
        rows: usize,
        out_rows: usize,
    ) -> Result<&'w mut Workspace<B>, ModelError> {
        let ws = match slot.take() {
            Some(w) if w.rows >= rows && w.out_rows >= out_rows => w,
            // The old buffers are freed (dropped by `map_or`) before the new ones exist.
            old => {
                let (old_rows, old_out) = old.map_or((0, 0), |w| (w.rows, w.out_rows));
                Workspace::new(&*self.backend, &self.config, rows.max(old_rows), out_rows.max(old_out))?
            }
        };
        Ok(slot.insert(ws))
    }

    /// A sentence embedding: the mean over positions of the final-norm hidden states,
    /// L2-normalized (`hidden` values).
    pub fn embed(&self, tokens: &[u32], cancelled: &(dyn Fn() -> bool + Sync)) -> Result<Vec<f32>, ModelError> {
        self.backend.on_workers(|| self.embed_here(tokens, cancelled))
    }

    /// [`embed`](Self::embed), on whichever thread calls it.
    fn embed_here(&self, tokens: &[u32], cancelled: &(dyn Fn() -> bool + Sync)) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let be = &*self.backend;
        let h = c.hidden_size;
        let mut cache = self.new_cache(tokens.len())?;
        let mut guard = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let ws = self.workspace_for(&mut guard, tokens.len(), 1)?;
        self.run_layers(&mut [SeqStep { tokens, cache: &mut cache, all_logits: true, verify: false }], cancelled, ws)?;
        be.rms_norm(&ws.x, tokens.len(), &self.norm, c.rms_norm_eps, &mut ws.normed)?;
        let hidden = be.download(&ws.normed, tokens.len() * h)?;
        let mut mean = vec![0.0f64; h];
        for row in hidden.chunks_exact(h) {
            mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v as f64);
        }
        let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
        Ok(mean.iter().map(|v| (v / norm) as f32).collect())
    }
}

/// `--expert-guess`, which only measures: nothing it computes reaches the output.
impl<B: Backend> DecoderModel<B> {
    /// With `--expert-guess`, what a speculative expert prefetch would read for this MoE
    /// layer, from the stream entering it ([`moe::guess`]); `None` otherwise.
    fn guess_experts(
        &self,
        w: &LayerWeights<B>,
        x: &B::Buf,
        rows: usize,
        normed: &mut B::Buf,
        moe_bufs: Option<&mut MoeBufs<B>>,
    ) -> Result<Option<Vec<Vec<u32>>>, ModelError> {
        match (&w.ffn, &w.ffn_norm, moe_bufs) {
            (FfnWeights::Moe(mw), Some(n), Some(mb)) if self.guess_experts => {
                Ok(Some(moe::guess(&*self.backend, &self.config, mw, n, x, rows, normed, mb)?))
            }
            _ => Ok(None),
        }
    }

    /// Counts how many of the experts `taken` the guess named.
    fn score_expert_guess(&self, guess: Option<Vec<Vec<u32>>>, taken: &[Vec<u32>]) {
        if let Some(g) = guess {
            let (right, total) = moe::score_guess(&g, taken);
            let stats = self.layers.stats();
            stats.expert_guess_right.fetch_add(right, std::sync::atomic::Ordering::Relaxed);
            stats.expert_guess_total.fetch_add(total, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Units `ids` of layer `layer` from `cache` (`what` names it when there is none).
fn from_cache<U: Send + Sync + 'static>(
    cache: Option<&Arc<ExpertCache<U>>>,
    what: &str,
    layer: usize,
    ids: &[usize],
    each: &mut EachUnit<'_, U>,
) -> Result<(), ModelError> {
    let cache = cache.ok_or_else(|| SchedError::Build { layer, msg: format!("no {what} cache") })?;
    cache.get_each(layer, ids, |i, u| each(i, &u))
}

impl<B: Backend> UnitSource<Bundle<B>> for DecoderModel<B> {
    fn units(&self, layer: usize, ids: &[usize], each: &mut EachUnit<'_, Bundle<B>>) -> Result<(), ModelError> {
        from_cache(self.neurons.as_ref(), "neuron-group", layer, ids, each)
    }
}

impl<B: Backend> UnitSource<Mlp<B>> for DecoderModel<B> {
    fn units(&self, layer: usize, ids: &[usize], each: &mut EachUnit<'_, Mlp<B>>) -> Result<(), ModelError> {
        from_cache(self.experts.as_ref(), "expert", layer, ids, each)
    }
}
