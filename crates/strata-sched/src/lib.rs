//! Where weights live. The model asks the scheduler for each layer's weights, every
//! token, in order; the scheduler decides whether they are resident or streamed. The
//! model code only ever sees `Arc<L>` handles from [`Scheduler::layer`].
//!
//! With no budget, or one every layer fits, the layers are the source's tensors (memory
//! maps): nothing is read until used. Under a smaller budget the layers the
//! [`plan::ResidencyPlan`] pins are read once into memory and the rest stream through a
//! ring of read buffers, filled `prefetch_depth` layers ahead by an I/O thread
//! ([`stream`]), from the files the source maps ([`layout`]).

mod baseline;
pub mod expert_policy;
pub mod experts;
pub mod io;
pub mod layout;
pub mod placement;
pub mod plan;
pub mod runtime;
pub mod sparse;
mod stats;
mod stream;
pub mod upload;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use serde::Serialize;

pub use stats::{SchedStats, StatsSnapshot};

use plan::PlanSummary;
use strata_tensor::tensor::HostTensor;
use stream::Core;

/// The host tensors of one layer, by their name inside the layer (for Hugging Face
/// checkpoints, the part after `model.layers.N.`).
#[derive(Clone, Debug, Default)]
pub struct LayerTensors {
    pub index: usize,
    pub tensors: HashMap<String, HostTensor>,
}

impl LayerTensors {
    pub fn get(&self, name: &str) -> Result<&HostTensor, SchedError> {
        self.tensors.get(name).ok_or_else(|| SchedError::MissingTensor { layer: self.index, name: name.to_string() })
    }

    pub fn get_opt(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }

    /// Bytes of weights in this layer.
    pub fn bytes(&self) -> usize {
        self.tensors.values().map(HostTensor::byte_len).sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("layer {layer}: missing tensor `{name}`")]
    MissingTensor { layer: usize, name: String },
    #[error("layer {layer}: {msg}")]
    Build { layer: usize, msg: String },
    #[error("layer {layer}: {source}")]
    Backend { layer: usize, source: strata_backend::BackendError },
    #[error("layer {0} does not exist")]
    NoSuchLayer(usize),
    #[error("layer {layer}: reading its weights: {msg}")]
    Io { layer: usize, msg: String },
    #[error("layer {0} is not stored in a file and cannot be streamed")]
    NotStreamable(usize),
}

/// How layers beyond the budget are handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Pin a fixed set (first and last layers first) and stream the rest through the
    /// prefetch ring. The default, and the only one meant for use.
    #[default]
    Pinned,
    /// Baseline: a plain LRU cache of layers over the budget, read on a miss without
    /// prefetch.
    Lru,
    /// Baseline: read every layer every time it is used, without prefetch (as AirLLM
    /// does); ignores the budget.
    Reload,
}

/// Default `--prefetch-depth`: layers read ahead of the one computing.
pub const DEFAULT_PREFETCH_DEPTH: usize = 2;

/// How a model's layers are held.
#[derive(Clone, Debug)]
pub struct SchedOptions {
    /// Bytes of layer weights kept resident; `None`: every layer.
    pub budget: Option<u64>,
    pub policy: Policy,
    /// Layers the I/O thread reads ahead (0: read each layer when asked, no thread).
    pub prefetch_depth: usize,
    /// Runtime memory (KV caches) the budget already leaves room for: what
    /// [`Scheduler::reserve`] takes beyond this comes out of the budget.
    pub runtime_allowance: u64,
    /// Read with buffered I/O even where `O_DIRECT` works.
    pub buffered: bool,
    /// Bytes of routed experts a MoE model keeps cached (`--expert-cache`); `None`:
    /// what `budget` leaves after the layer cores (every expert when there is no budget).
    pub expert_cache: Option<experts::CacheSize>,
    pub expert_policy: expert_policy::CachePolicy,
    /// How a MoE layer's routed experts are loaded.
    pub expert_loading: ExpertLoading,
    /// Score how well each MoE layer's router, applied to the stream entering the layer,
    /// guesses the experts taken after attention (what a speculative prefetch would read).
    pub expert_guess: bool,
    /// How a model stored with neuron-group bundles chooses them (`--sparse-ffn`).
    pub sparse_ffn: sparse::SparseFfn,
    /// A MoE model's routed experts computed by the CPU beside the GPU, and how they are
    /// planned (`None`: every expert computes where the layers do).
    pub split: Option<placement::split::SplitOptions>,
    /// Bytes of streamed layers kept in page-locked host memory behind the device
    /// (`--host-budget`; only where the compute has memory of its own, a GPU).
    pub host_budget: u64,
    /// The upload pipeline into device memory (`None`: the compute reads host memory).
    pub stage: Option<upload::StageFactory>,
    /// Whether streamed weights are repacked after each read into the CPU's 16-row panels,
    /// as the backend repacks resident ones (set from the backend, not by users).
    pub repack: bool,
}

/// How a MoE layer's routed experts are loaded (`--experts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ExpertLoading {
    /// Only the experts the router chose, through the expert cache (the default).
    #[default]
    Routed,
    /// Every expert with its layer, as a dense streamer would (a baseline).
    All,
}

impl Default for SchedOptions {
    fn default() -> Self {
        SchedOptions {
            budget: None,
            policy: Policy::Pinned,
            prefetch_depth: DEFAULT_PREFETCH_DEPTH,
            runtime_allowance: u64::MAX,
            buffered: false,
            expert_cache: None,
            expert_policy: expert_policy::CachePolicy::default(),
            expert_loading: ExpertLoading::Routed,
            expert_guess: false,
            sparse_ffn: Default::default(),
            split: None,
            host_budget: 0,
            stage: None,
            repack: false,
        }
    }
}

/// Builds a layer's weights (`L`) from its tensors.
pub type Build<L> = Box<dyn Fn(&LayerTensors) -> Result<L, SchedError> + Send + Sync>;

enum Mode<L> {
    Resident(Vec<Arc<L>>),
    /// The production core ([`stream::Core`]) or a baseline ([`baseline::Baseline`]).
    Streaming(Arc<dyn Streamer<L>>),
}

/// A streaming core of any layer type, for [`Reservation`] and [`SchedMonitor`].
trait CoreHandle: Send + Sync {
    /// Runtime memory (a KV cache) was allocated (`delta > 0`) or freed.
    fn adjust_runtime(&self, delta: i64);
    fn summary(&self) -> SchedSummary;
}

/// How a streaming scheduler holds layers beyond its budget: the production policy, or
/// a benchmark baseline beside it.
trait Streamer<L>: CoreHandle {
    /// The weights of layer `i` (in range), ready for compute.
    fn layer(&self, i: usize) -> Result<Arc<L>, SchedError>;
    fn resident_bytes(&self) -> u64;
    fn paths(&self) -> Vec<std::path::PathBuf>;
    /// Stops any thread of its own.
    fn stop(&self);
}

/// Hands out each layer's weights (`L`, built by the model from [`LayerTensors`]).
pub struct Scheduler<L> {
    mode: Mode<L>,
    /// Per layer: tensor bytes (resident) or read-buffer bytes (streaming).
    layer_bytes: Vec<u64>,
    /// The budget asked for, if any.
    budget: Option<u64>,
    policy: Policy,
    stats: Arc<SchedStats>,
    /// The routed experts of a MoE model, held apart from the layer cores.
    experts: Option<Arc<dyn experts::ExpertInfo>>,
    /// Those computed beside the GPU by the CPU.
    split: Option<Arc<dyn placement::split::SplitInfo>>,
}

/// What `strata bench`, `/api/ps` and `/metrics` show of the scheduler.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SchedSummary {
    /// `resident` (every layer in memory or mapped) or `streaming`.
    pub mode: &'static str,
    pub policy: Policy,
    pub prefetch_depth: usize,
    /// Whether streamed reads bypass the page cache (`O_DIRECT`); `None` when resident.
    pub direct_io: Option<bool>,
    #[serde(flatten)]
    pub plan: PlanSummary,
    /// The host tier behind a GPU: streamed layers kept in page-locked RAM and copied
    /// to the device on every use (`None` where the compute reads host memory).
    pub host_tier: Option<plan::HostTierSummary>,
    /// The upload pipeline into device memory (`None` where the compute reads host
    /// memory).
    pub upload: Option<upload::UploadSummary>,
    /// The expert cache of a MoE model (`None` for a dense one).
    pub experts: Option<experts::ExpertSummary>,
    /// A MoE model's routed experts computed beside the GPU by the CPU (`--cpu-moe`,
    /// `--n-cpu-moe`, auto): the plan and what each side did (`None` without one).
    pub split: Option<placement::split::SplitSummary>,
}

impl<L: Send + Sync + 'static> Scheduler<L> {
    /// Every layer resident: `build` runs once per layer now.
    pub fn resident(
        sources: Vec<LayerTensors>,
        build: impl Fn(&LayerTensors) -> Result<L, SchedError>,
    ) -> Result<Self, SchedError> {
        let layer_bytes = sources.iter().map(|s| s.bytes() as u64).collect();
        let layers = sources.iter().map(|s| build(s).map(Arc::new)).collect::<Result<_, _>>()?;
        Ok(Scheduler {
            mode: Mode::Resident(layers),
            layer_bytes,
            budget: None,
            policy: Policy::Pinned,
            stats: Arc::default(),
            experts: None,
            split: None,
        })
    }

    /// Layers under `opts`: resident when no budget is given or every layer fits it (or
    /// some layer's tensors are not in a file, with a warning), streaming otherwise.
    pub fn new(
        sources: Vec<LayerTensors>,
        build: impl Fn(&LayerTensors) -> Result<L, SchedError> + Send + Sync + 'static,
        opts: &SchedOptions,
    ) -> Result<Self, SchedError> {
        let budget = match opts.policy {
            Policy::Reload => Some(0),
            _ => opts.budget,
        };
        let total: u64 = sources.iter().map(|s| s.bytes() as u64).sum();
        let Some(budget) = budget.filter(|&b| b < total) else {
            let mut s = Self::resident(sources, build)?;
            s.budget = opts.budget;
            return Ok(s);
        };
        let stats = Arc::new(SchedStats::default());
        let reader = layout::Reader::open(&sources, &stats.bytes_read, opts.buffered, opts.repack)
            .map_err(|e| SchedError::Io { layer: 0, msg: e.to_string() })?;
        if let Some(i) = (0..reader.n_layers()).find(|&i| reader.layout(i).is_none()) {
            tracing::warn!(
                layer = i,
                budget,
                "some layer weights are not stored in a file (a compressed .cawsf, say): every layer stays resident"
            );
            let mut s = Self::resident(sources, build)?;
            s.budget = opts.budget;
            return Ok(s);
        }
        let layer_bytes: Vec<u64> =
            (0..reader.n_layers()).map(|i| reader.layout(i).map_or(0, |l| l.buf_len as u64)).collect();
        drop(sources); // the memory maps stay open in the model source, untouched
        let core: Arc<dyn Streamer<L>> = match opts.policy {
            Policy::Pinned => {
                let depth = opts.prefetch_depth.max(1);
                // Where the compute reads its own memory, streamed layers are uploaded
                // into a ring of device slots.
                let stage = match &opts.stage {
                    Some(factory) => {
                        let slot_len = layer_bytes.iter().copied().max().unwrap_or(0) as usize;
                        let ring = depth + stream::EXTRA_BUFFERS;
                        Some(
                            (factory.0)(slot_len, ring, stats.transfer.clone())
                                .map_err(|source| SchedError::Backend { layer: 0, source })?,
                        )
                    }
                    None => None,
                };
                let start = stream::Start {
                    layer_bytes: layer_bytes.clone(),
                    budget,
                    runtime_allowance: opts.runtime_allowance,
                    depth,
                    host_budget: opts.host_budget,
                    stage,
                };
                Core::start(reader, Box::new(build), start, stats.clone())?
            }
            // The baselines copy each tensor to the device as they build it.
            Policy::Lru | Policy::Reload => Arc::new(baseline::Baseline::new(
                reader,
                Box::new(build),
                opts.policy,
                layer_bytes.clone(),
                plan::RuntimeBudget::new(budget, opts.runtime_allowance),
                stats.clone(),
            )),
        };
        Ok(Scheduler {
            mode: Mode::Streaming(core),
            layer_bytes,
            budget: Some(budget),
            policy: opts.policy,
            stats,
            experts: None,
            split: None,
        })
    }

    pub fn n_layers(&self) -> usize {
        self.layer_bytes.len()
    }

    /// The weights of layer `i`, ready for compute.
    pub fn layer(&self, i: usize) -> Result<Arc<L>, SchedError> {
        self.stats.layer_requests.fetch_add(1, Ordering::Relaxed);
        match &self.mode {
            Mode::Resident(layers) => {
                let layer = layers.get(i).ok_or(SchedError::NoSuchLayer(i))?;
                self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
                Ok(layer.clone())
            }
            Mode::Streaming(_) if i >= self.layer_bytes.len() => Err(SchedError::NoSuchLayer(i)),
            Mode::Streaming(core) => core.layer(i),
        }
    }

    /// Bytes of layer weights the memory budget governs (a MoE model's routed experts
    /// included).
    pub fn streamable_bytes(&self) -> usize {
        let experts = self.experts.as_ref().map_or(0, |e| e.expert_bytes());
        (self.layer_bytes.iter().sum::<u64>() + experts) as usize
    }

    /// Bytes of layer weights kept resident (and routed experts cached).
    pub fn resident_bytes(&self) -> usize {
        let cores = match &self.mode {
            Mode::Resident(_) => self.layer_bytes.iter().sum::<u64>(),
            Mode::Streaming(core) => core.resident_bytes(),
        };
        let experts = self.experts.as_ref().map_or(0, |e| e.summary().cached_bytes);
        (cores + experts) as usize
    }

    /// Whether layers (or experts) stream from storage.
    pub fn is_streaming(&self) -> bool {
        matches!(self.mode, Mode::Streaming(_)) || self.experts.as_ref().is_some_and(|e| e.is_on_demand())
    }

    /// The files streamed layers and experts are read from (none when resident).
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        let mut files = match &self.mode {
            Mode::Resident(_) => Vec::new(),
            Mode::Streaming(core) => core.paths(),
        };
        for f in self.experts.iter().flat_map(|e| e.files()) {
            if !files.contains(&f) {
                files.push(f);
            }
        }
        files
    }

    pub fn stats(&self) -> &SchedStats {
        &self.stats
    }

    /// The counters, shared (an expert cache counts into the same ones).
    pub fn stats_arc(&self) -> Arc<SchedStats> {
        self.stats.clone()
    }

    /// Shows `experts` (a MoE model's expert cache) with the layers' summary.
    pub fn attach_experts(&mut self, experts: Arc<dyn experts::ExpertInfo>) {
        self.experts = Some(experts);
    }

    pub fn attach_split(&mut self, split: Arc<dyn placement::split::SplitInfo>) {
        self.split = Some(split);
    }

    pub fn summary(&self) -> SchedSummary {
        let mut s = self.layer_summary();
        s.experts = self.experts.as_ref().map(|e| e.summary());
        s.split = self.split.as_ref().map(|e| e.summary());
        s
    }

    fn layer_summary(&self) -> SchedSummary {
        match &self.mode {
            Mode::Resident(_) => {
                let bytes = self.layer_bytes.clone();
                let budget = self.budget.unwrap_or_else(|| bytes.iter().sum());
                let mut plan = plan::ResidencyPlan::<()>::new(bytes, u64::MAX).summary();
                plan.budget_bytes = budget;
                SchedSummary {
                    mode: "resident",
                    policy: self.policy,
                    prefetch_depth: 0,
                    direct_io: None,
                    plan,
                    host_tier: None,
                    upload: None,
                    experts: None,
                    split: None,
                }
            }
            Mode::Streaming(core) => core.summary(),
        }
    }

    /// A handle that reads this scheduler's summary and counters from other threads
    /// (for `/api/ps` and `/metrics`), without keeping it alive.
    pub fn monitor(&self) -> SchedMonitor {
        let live = match &self.mode {
            Mode::Resident(_) => None,
            Mode::Streaming(core) => {
                let core: Arc<dyn CoreHandle> = core.clone();
                Some(Arc::downgrade(&core))
            }
        };
        let experts = self.experts.as_ref().map(Arc::downgrade);
        let split = self.split.as_ref().map(Arc::downgrade);
        SchedMonitor { stats: self.stats.clone(), fixed: self.summary(), live, experts, split }
    }

    /// Records `bytes` of runtime memory (a KV cache) held until the reservation drops.
    /// What the streaming scheduler's allowance does not cover comes out of its budget:
    /// pinned layers are evicted, and re-admitted once the reservation drops.
    pub fn reserve(&self, bytes: u64) -> Reservation {
        match &self.mode {
            Mode::Resident(_) => Reservation { bytes, sink: None },
            Mode::Streaming(core) => {
                core.adjust_runtime(bytes as i64);
                let core: Arc<dyn CoreHandle> = core.clone();
                Reservation { bytes, sink: Some(Arc::downgrade(&core)) }
            }
        }
    }
}

/// What callers outside the model read of a scheduler, whatever its layer type.
pub trait SchedInfo: Send + Sync {
    fn n_layers(&self) -> usize;
    /// Bytes of layer weights the memory budget governs.
    fn streamable_bytes(&self) -> usize;
    /// Bytes of layer weights kept resident.
    fn resident_bytes(&self) -> usize;
    /// Whether layers stream from storage.
    fn is_streaming(&self) -> bool;
    /// The files streamed layers are read from (none when resident).
    fn files(&self) -> Vec<std::path::PathBuf>;
    fn stats(&self) -> &SchedStats;
    fn summary(&self) -> SchedSummary;
    /// A handle that reads the summary and counters from other threads.
    fn monitor(&self) -> SchedMonitor;
}

impl<L: Send + Sync + 'static> SchedInfo for Scheduler<L> {
    fn n_layers(&self) -> usize {
        Scheduler::n_layers(self)
    }
    fn streamable_bytes(&self) -> usize {
        Scheduler::streamable_bytes(self)
    }
    fn resident_bytes(&self) -> usize {
        Scheduler::resident_bytes(self)
    }
    fn is_streaming(&self) -> bool {
        Scheduler::is_streaming(self)
    }
    fn files(&self) -> Vec<std::path::PathBuf> {
        Scheduler::files(self)
    }
    fn stats(&self) -> &SchedStats {
        Scheduler::stats(self)
    }
    fn summary(&self) -> SchedSummary {
        Scheduler::summary(self)
    }
    fn monitor(&self) -> SchedMonitor {
        Scheduler::monitor(self)
    }
}

impl<L> Drop for Scheduler<L> {
    fn drop(&mut self) {
        if let Mode::Streaming(core) = &self.mode {
            core.stop();
        }
    }
}

/// Reads a scheduler's summary and counters from another thread; see
/// [`Scheduler::monitor`].
#[derive(Clone)]
pub struct SchedMonitor {
    pub stats: Arc<SchedStats>,
    fixed: SchedSummary,
    live: Option<Weak<dyn CoreHandle>>,
    experts: Option<Weak<dyn experts::ExpertInfo>>,
    split: Option<Weak<dyn placement::split::SplitInfo>>,
}

impl SchedMonitor {
    /// The summary now (as when the monitor was made, for a resident scheduler or one
    /// that is gone).
    pub fn summary(&self) -> SchedSummary {
        let mut s = self.live.as_ref().and_then(Weak::upgrade).map_or_else(|| self.fixed.clone(), |c| c.summary());
        if let Some(e) = self.experts.as_ref().and_then(Weak::upgrade) {
            s.experts = Some(e.summary());
        }
        if let Some(e) = self.split.as_ref().and_then(Weak::upgrade) {
            s.split = Some(e.summary());
        }
        s
    }
}

/// Where a unit of weights is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Resident in GPU memory.
    Vram,
    /// Held in page-locked host memory behind a GPU, copied to it on every use.
    Pinned,
    /// Resident in host memory (or mapped from a file the page cache holds), used by the CPU.
    Ram,
    /// Read from storage when used.
    Storage,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Vram, Tier::Pinned, Tier::Ram, Tier::Storage];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Vram => "vram",
            Tier::Pinned => "pinned",
            Tier::Ram => "ram",
            Tier::Storage => "storage",
        }
    }
}

/// One unit of a model's weights and where it is.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct UnitStatus {
    /// `layer` (a whole layer, or a mixture-of-experts layer's core: attention, norms,
    /// router, shared expert) or `expert` (one routed expert).
    pub kind: &'static str,
    pub layer: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert: Option<usize>,
    pub tier: Tier,
    pub bytes: u64,
}

impl SchedMonitor {
    /// Every unit (layers in order, then each MoE layer's experts) and its tier now, from
    /// `summary` (this monitor's) and the expert cache. Resident units are in VRAM when
    /// the model runs on a GPU (`on_gpu`), else in RAM.
    pub fn units(&self, summary: &SchedSummary, on_gpu: bool) -> Vec<UnitStatus> {
        let home = if on_gpu { Tier::Vram } else { Tier::Ram };
        let p = &summary.plan;
        let mut bytes = vec![0u64; p.layers];
        for s in &p.layer_sizes {
            plan::parse_ranges(&s.layers).into_iter().filter(|&l| l < p.layers).for_each(|l| bytes[l] = s.bytes);
        }
        let all_resident = summary.mode == "resident";
        let resident: std::collections::HashSet<usize> = plan::parse_ranges(&p.resident_layers).into_iter().collect();
        let host: std::collections::HashSet<usize> =
            summary.host_tier.as_ref().map(|h| plan::parse_ranges(&h.layers).into_iter().collect()).unwrap_or_default();
        let mut units: Vec<UnitStatus> = (0..p.layers)
            .map(|l| {
                let tier = match () {
                    _ if all_resident || resident.contains(&l) => home,
                    _ if host.contains(&l) => Tier::Pinned,
                    _ => Tier::Storage,
                };
                UnitStatus { kind: "layer", layer: l, expert: None, tier, bytes: bytes[l] }
            })
            .collect();
        if let (Some(e), Some(info)) = (&summary.experts, self.experts.as_ref().and_then(Weak::upgrade)) {
            let cached: std::collections::HashSet<expert_policy::ExpertId> = info.cached().into_iter().collect();
            let n = e.experts_per_layer;
            let each = e.expert_bytes / (e.moe_layers * n).max(1) as u64;
            for l in info.moe_layers() {
                for x in 0..n {
                    let id = expert_policy::ExpertId::new(l as u32, x as u32);
                    let tier = if cached.contains(&id) { home } else { Tier::Storage };
                    units.push(UnitStatus { kind: "expert", layer: l, expert: Some(x), tier, bytes: each });
                }
            }
        }
        units
    }
}

impl std::fmt::Debug for SchedMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedMonitor").field("summary", &self.summary()).finish()
    }
}

/// Runtime memory held against a scheduler's budget; see [`Scheduler::reserve`].
pub struct Reservation {
    bytes: u64,
    sink: Option<Weak<dyn CoreHandle>>,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take().and_then(|w| w.upgrade()) {
            sink.adjust_runtime(-(self.bytes as i64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::plan::{HostTierSummary, LayerSize, PlanSummary};

    /// Six layers of 100 bytes on a GPU: 0 and 5 resident, 2-3 in the host tier.
    #[test]
    fn units_take_their_tier_from_the_plan_and_the_device() {
        let plan = PlanSummary {
            layers: 6,
            resident_layers: "0,5".into(),
            layer_sizes: vec![LayerSize { bytes: 100, layers: "0-5".into() }],
            ..Default::default()
        };
        let host = HostTierSummary { layers: "2-3".into(), count: 2, ..Default::default() };
        let summary = SchedSummary {
            mode: "streaming",
            policy: Policy::Pinned,
            prefetch_depth: 2,
            direct_io: Some(true),
            plan,
            host_tier: Some(host),
            upload: None,
            experts: None,
            split: None,
        };
        let monitor = SchedMonitor {
            stats: Arc::new(SchedStats::default()),
            fixed: summary.clone(),
            live: None,
            experts: None,
            split: None,
        };
        let tiers = |on_gpu| monitor.units(&summary, on_gpu).iter().map(|u| u.tier).collect::<Vec<_>>();
        use Tier::*;
        assert_eq!(tiers(true), [Vram, Storage, Pinned, Pinned, Storage, Vram]);
        assert_eq!(tiers(false)[0], Ram);
        assert!(monitor.units(&summary, true).iter().all(|u| u.bytes == 100 && u.kind == "layer"));
        // A resident scheduler: every layer where the model runs.
        let resident = SchedSummary { mode: "resident", host_tier: None, ..summary.clone() };
        assert!(monitor.units(&resident, false).iter().all(|u| u.tier == Ram));
    }
    use super::*;

    #[test]
    fn resident_layers_are_built_once_and_counted() {
        let sources = (0..3).map(|index| LayerTensors { index, ..Default::default() }).collect();
        let built = std::cell::Cell::new(0);
        let s = Scheduler::resident(sources, |t| {
            built.set(built.get() + 1);
            Ok(t.index * 10)
        })
        .unwrap();
        for _ in 0..2 {
            for i in 0..3 {
                assert_eq!(*s.layer(i).unwrap(), i * 10);
            }
        }
        assert_eq!(built.get(), 3);
        assert_eq!(s.stats().layer_requests.load(Ordering::Relaxed), 6);
        assert!(matches!(s.layer(3), Err(SchedError::NoSuchLayer(3))));
    }
}
