//! The expert cache: the routed experts of a mixture-of-experts model, one unit per
//! `(layer, expert)`, loaded on demand. The model asks for exactly the experts its
//! router chose for a layer ([`ExpertCache::get_each`]); the hits come from memory, and the
//! misses are read from storage together, each expert one contiguous read in Strata's
//! own formats (one range per tensor in a GGUF file, whose stacked experts are
//! expert-major). What stays cached afterwards is the [`ExpertPolicy`]'s decision under
//! the cache's byte budget.
//!
//! Access is skewed, not cyclic, so this is a cache with LRU / LFU / frequency-weighted
//! eviction, unlike the pinned set and prefetch ring of the layer cores.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use serde::Serialize;

use super::expert_policy::{CachePolicy, ExpertId, ExpertPolicy};
use super::io::AlignedBuf;
use super::layout::Reader;
use super::upload::Stage;
use super::{LayerTensors, SchedError, SchedStats};
use strata_tensor::tensor::ByteSource;

mod host;
use host::{Held, HostTier};

/// Expert reads in flight at once (a layer's misses are read together).
const EXPERT_STREAMS: usize = 4;
/// Read buffers kept for reuse (beyond this they are freed when their expert drops).
const POOL_MAX: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds one expert's weights (`E`) from its tensors: `(expert index, tensors)`, the
/// tensors under their layer-local names and `index` the layer.
pub type BuildExpert<E> = Box<dyn Fn(usize, &LayerTensors) -> Result<E, SchedError> + Send + Sync>;

/// The size of an expert cache: bytes, or a share of every routed expert's bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSize {
    Bytes(u64),
    /// `0.25` for `25%`.
    Fraction(f64),
}

impl CacheSize {
    /// `25%`, or a size as [`super::plan::parse_size`] reads it.
    pub fn parse(s: &str) -> Result<CacheSize, String> {
        match s.trim().strip_suffix('%') {
            Some(pct) => match pct.trim().parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => Ok(CacheSize::Fraction(p / 100.0)),
                _ => Err(format!("`{s}`: a percentage is between 0% and 100%")),
            },
            None => super::plan::parse_size(s).map(CacheSize::Bytes),
        }
    }

    /// Bytes, of `total` expert bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            CacheSize::Bytes(b) => b,
            CacheSize::Fraction(f) => (total as f64 * f).round() as u64,
        }
    }
}

/// How the routed experts are held.
#[derive(Clone, Debug)]
pub struct ExpertOptions {
    /// Bytes of experts kept in memory between uses; `None`: every expert resident.
    pub budget: Option<u64>,
    pub policy: CachePolicy,
    /// Read with buffered I/O even where `O_DIRECT` works.
    pub buffered: bool,
    /// The upload into device memory, when the compute has memory of its own: misses
    /// are read into page-locked buffers and copied to device memory of their own.
    pub stage: Option<super::upload::StageFactory>,
    /// Whether experts read are repacked into the CPU's 16-row panels (see
    /// [`SchedOptions::repack`](super::SchedOptions::repack)).
    pub repack: bool,
    /// Bytes of experts kept in host memory once uploaded, so that one evicted from the
    /// device's memory comes back by a copy, not a read (0: none).
    pub host_budget: u64,
}

/// One expert's stored tensors.
pub struct ExpertUnit {
    pub id: ExpertId,
    pub tensors: LayerTensors,
}

/// Hits and misses of one layer's experts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct LayerExpertStats {
    pub hits: u64,
    pub misses: u64,
}

/// What `bench`, `/api/ps` and `/metrics` show of the expert cache.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ExpertSummary {
    /// What a unit is: `expert` (a routed expert of a MoE model) or `neuron_group` (a
    /// sparse FFN's group of neurons: its rows of `up` and columns of `down`).
    pub unit: &'static str,
    /// `resident` (every expert in memory or mapped) or `on_demand`.
    pub mode: &'static str,
    pub policy: CachePolicy,
    pub experts_per_layer: usize,
    pub moe_layers: usize,
    /// Bytes of every routed expert of every layer.
    pub expert_bytes: u64,
    /// The cache's budget, and what it holds now.
    pub cache_budget_bytes: u64,
    pub cached_bytes: u64,
    pub cached_experts: usize,
    /// Hits and misses so far, by layer (MoE layers only, in order).
    pub layers: Vec<LayerExpertStats>,
    /// With `--expert-guess`: routed experts a guess from the previous layer's output
    /// named, of those scored.
    pub guess_right: u64,
    pub guess_total: u64,
    /// The host tier behind a device's cache: its budget, the bytes it holds, and the
    /// misses it served (copied to the device instead of read from storage).
    pub host_tier_budget_bytes: u64,
    pub host_tier_bytes: u64,
    pub host_hits: u64,
}

/// A read buffer lent to an expert's tensors; it goes back to the pool when they drop.
struct PooledBuf {
    buf: AlignedBuf,
    home: Weak<Mutex<Vec<AlignedBuf>>>,
}

impl ByteSource for PooledBuf {
    fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.home.upgrade() {
            let mut pool = lock(&pool);
            if pool.len() < POOL_MAX {
                pool.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

struct OnDemand<E> {
    reader: Reader,
    build: BuildExpert<E>,
    state: Mutex<State<E>>,
    pool: Arc<Mutex<Vec<AlignedBuf>>>,
    stage: Option<Arc<dyn Stage>>,
    /// The experts' bytes kept in host memory behind the device.
    host: Mutex<HostTier>,
    /// Read buffers are allocated this large (every expert fits, so a page-locked one
    /// never reallocates).
    buf_cap: usize,
}

impl<E> OnDemand<E> {
    /// A read buffer from the pool, or a new one (page-locked where a stage uploads).
    fn buf(&self) -> AlignedBuf {
        if let Some(buf) = lock(&self.pool).pop() {
            return buf;
        }
        match self.stage.as_ref().and_then(|s| s.host_pin()) {
            None => AlignedBuf::new(),
            Some(pin) => {
                let mut buf = AlignedBuf::with_capacity(self.buf_cap);
                buf.pin_with(pin);
                buf
            }
        }
    }
}

struct State<E> {
    policy: ExpertPolicy,
    cached: HashMap<ExpertId, Arc<E>>,
}

enum Mode<E> {
    Resident(Vec<Arc<E>>),
    OnDemand(Box<OnDemand<E>>),
}

/// The routed experts of every MoE layer (or the neuron groups of a sparse FFN).
pub struct ExpertCache<E> {
    /// `expert` or `neuron_group` ([`ExpertSummary::unit`]).
    unit: &'static str,
    n_experts: usize,
    /// Per layer, the unit index of its expert 0 (`None` for a dense layer).
    base: Vec<Option<usize>>,
    /// Per unit, its bytes as stored.
    unit_bytes: Vec<u64>,
    policy: CachePolicy,
    mode: Mode<E>,
    stats: Arc<SchedStats>,
}

impl<E: Send + Sync + 'static> ExpertCache<E> {
    /// The experts of `units` (every expert of every MoE layer, layer by layer, experts
    /// in order), all built now when `opts.budget` is `None` or holds them all (or when
    /// some are not stored in a file), else read on demand. Counts into `stats`.
    pub fn new(
        n_layers: usize,
        n_experts: usize,
        units: Vec<ExpertUnit>,
        build: BuildExpert<E>,
        opts: &ExpertOptions,
        stats: Arc<SchedStats>,
    ) -> Result<Self, SchedError> {
        let mut base = vec![None; n_layers];
        for (i, u) in units.iter().enumerate() {
            let l = u.id.layer as usize;
            let slot = base.get_mut(l).ok_or(SchedError::NoSuchLayer(l))?;
            if u.id.expert == 0 {
                *slot = Some(i);
            }
            if *slot != i.checked_sub(u.id.expert as usize) {
                return Err(SchedError::Build { layer: l, msg: format!("expert {} is out of order", u.id.expert) });
            }
        }
        let unit_bytes: Vec<u64> = units.iter().map(|u| u.tensors.bytes() as u64).collect();
        let total: u64 = unit_bytes.iter().sum();
        lock(&stats.expert_layers).resize(n_layers, LayerExpertStats::default());
        let mode = Mode::Resident(Vec::new());
        let mut cache = ExpertCache { unit: "expert", n_experts, base, unit_bytes, policy: opts.policy, mode, stats };
        let resident = |units: &[ExpertUnit]| -> Result<Vec<Arc<E>>, SchedError> {
            units.iter().map(|u| build(u.id.expert as usize, &u.tensors).map(Arc::new)).collect()
        };
        let Some(budget) = opts.budget.filter(|&b| b < total) else {
            cache.mode = Mode::Resident(resident(&units)?);
            return Ok(cache);
        };
        let sources: Vec<LayerTensors> = units.iter().map(|u| u.tensors.clone()).collect();
        let reader = Reader::open(&sources, &cache.stats.expert_bytes_read, opts.buffered, opts.repack)
            .map_err(|e| SchedError::Io { layer: 0, msg: format!("opening the expert files: {e}") })?;
        if (0..reader.n_layers()).any(|i| reader.layout(i).is_none()) {
            tracing::warn!(budget, "some experts are not stored in a file: every expert stays resident");
            cache.mode = Mode::Resident(resident(&units)?);
            return Ok(cache);
        }
        let state = State { policy: ExpertPolicy::new(opts.policy, budget), cached: HashMap::new() };
        let pool = Arc::new(Mutex::new(Vec::new()));
        let buf_cap = (0..reader.n_layers()).filter_map(|i| reader.layout(i)).map(|l| l.buf_len).max().unwrap_or(0);
        // Experts get device memory of their own, so the stage's ring goes unused.
        let stage = match &opts.stage {
            Some(factory) => Some(
                (factory.0)(buf_cap, 1, cache.stats.transfer.clone())
                    .map_err(|source| SchedError::Backend { layer: 0, source })?,
            ),
            None => None,
        };
        let host = Mutex::new(HostTier::new(opts.host_budget));
        let on_demand = OnDemand { reader, build, state: Mutex::new(state), pool, stage, host, buf_cap };
        cache.mode = Mode::OnDemand(Box::new(on_demand));
        Ok(cache)
    }

    /// The same cache, holding a sparse FFN's neuron groups (as summaries say).
    pub fn for_neuron_groups(self) -> Self {
        ExpertCache { unit: "neuron_group", ..self }
    }

    /// Marks the start of a forward pass (recency is counted in passes).
    pub fn step(&self) {
        if let Mode::OnDemand(d) = &self.mode {
            lock(&d.state).policy.tick();
        }
    }

    /// Hands `each` the weights of `experts` (distinct) of layer `layer` one by one, in
    /// that order, as soon as each is there: the hits at once, the misses as their reads
    /// complete (all issued together, `EXPERT_STREAMS` at a time), so that the caller
    /// computes an expert while the next ones are still being read. Misses are then
    /// offered to the cache. An error from `each` or a read stops the rest.
    pub fn get_each<X: From<SchedError>>(
        &self,
        layer: usize,
        experts: &[usize],
        mut each: impl FnMut(usize, Arc<E>) -> Result<(), X>,
    ) -> Result<(), X> {
        let base = self.base.get(layer).copied().flatten().ok_or(SchedError::NoSuchLayer(layer))?;
        if let Some(&e) = experts.iter().find(|&&e| e >= self.n_experts) {
            let msg = format!("expert {e} of {} asked for", self.n_experts);
            return Err(SchedError::Build { layer, msg }.into());
        }
        self.stats.expert_requests.fetch_add(experts.len() as u64, Ordering::Relaxed);
        let routed: u64 = experts.iter().map(|&e| self.unit_bytes[base + e]).sum();
        self.stats.expert_routed_bytes.fetch_add(routed, Ordering::Relaxed);
        let d = match &self.mode {
            Mode::Resident(all) => {
                self.count(layer, experts.len() as u64, 0);
                return experts.iter().enumerate().try_for_each(|(i, &e)| each(i, all[base + e].clone()));
            }
            Mode::OnDemand(d) => d,
        };
        let id = |e: usize| ExpertId { layer: layer as u32, expert: e as u32 };
        let mut got: Vec<Option<Arc<E>>> = Vec::with_capacity(experts.len());
        {
            let mut state = lock(&d.state);
            for &e in experts {
                state.policy.touch(id(e));
                got.push(state.cached.get(&id(e)).cloned());
            }
        }
        let missing: Vec<usize> = (0..experts.len()).filter(|&i| got[i].is_none()).collect();
        self.count(layer, (experts.len() - missing.len()) as u64, missing.len() as u64);
        // Hands over, in order, every expert that is there up to the first that is not.
        let mut next = 0;
        let mut release = |got: &mut [Option<Arc<E>>]| -> Result<(), X> {
            while let Some(expert) = got.get_mut(next).and_then(Option::take) {
                each(next, expert)?;
                next += 1;
            }
            Ok(())
        };
        release(&mut got)?;
        if missing.is_empty() {
            return Ok(());
        }
        let protect: Vec<ExpertId> = experts.iter().map(|&e| id(e)).collect();
        // The misses the host tier holds come back by a copy; the rest are read.
        let held: Vec<(usize, Held)> = {
            let mut host = lock(&d.host);
            missing.iter().filter_map(|&i| host.get(id(experts[i])).map(|h| (i, h))).collect()
        };
        self.stats.expert_host_hits.fetch_add(held.len() as u64, Ordering::Relaxed);
        let to_read: Vec<usize> = missing.iter().copied().filter(|i| !held.iter().any(|(h, _)| h == i)).collect();
        let queue: Mutex<std::collections::VecDeque<(usize, AlignedBuf)>> =
            { Mutex::new(to_read.iter().map(|&i| (i, d.buf())).collect()) };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<AlignedBuf, SchedError>)>();
        let read_err = |e: SchedError| match e {
            SchedError::Io { msg, .. } => SchedError::Io { layer, msg: format!("reading its experts: {msg}") },
            other => other,
        };
        let mut evicted = Vec::new();
        let result = std::thread::scope(|s| -> Result<(), X> {
            for _ in 0..EXPERT_STREAMS.min(to_read.len()) {
                let (tx, queue, stop) = (tx.clone(), &queue, &stop);
                s.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Some((i, mut buf)) = lock(queue).pop_front() else { return };
                        let read = d.reader.read_many(&mut [(base + experts[i], &mut buf)], 1).map(|()| buf);
                        if tx.send((i, read)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            let outcome = (|| -> Result<(), X> {
                let mut held = held.into_iter();
                for _ in 0..missing.len() {
                    let unit_of = |i: usize| base + experts[i];
                    let (i, src, pinned) = match held.next() {
                        Some((i, h)) => (i, h.src, h.pinned),
                        None => {
                            let t = Instant::now();
                            let Ok((i, read)) = rx.recv() else { break };
                            self.stats.stall_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            let mut buf = read.map_err(read_err)?;
                            d.reader.fix(unit_of(i), &mut buf)?;
                            let pinned = buf.is_pinned();
                            let src: Arc<dyn ByteSource> = Arc::new(PooledBuf { buf, home: Arc::downgrade(&d.pool) });
                            let bytes = self.unit_bytes[unit_of(i)];
                            lock(&d.host).offer(id(experts[i]), Held { src: src.clone(), pinned, bytes });
                            (i, src, pinned)
                        }
                    };
                    let unit = unit_of(i);
                    let src = match &d.stage {
                        None => src,
                        Some(stage) => {
                            stage.stage_owned(src, pinned).map_err(|source| SchedError::Backend { layer, source })?
                        }
                    };
                    let mut tensors = d.reader.tensors(unit, src);
                    tensors.index = layer;
                    let expert = Arc::new((d.build)(experts[i], &tensors)?);
                    let mut state = lock(&d.state);
                    let admission = state.policy.admit(id(experts[i]), self.unit_bytes[unit], &protect);
                    for gone in admission.evicted {
                        evicted.extend(state.cached.remove(&gone));
                    }
                    if admission.admitted {
                        state.cached.insert(id(experts[i]), expert.clone());
                    }
                    drop(state);
                    got[i] = Some(expert);
                    release(&mut got)?;
                }
                Ok(())
            })();
            // On an error the readers stop taking work; what they hold is dropped.
            stop.store(true, Ordering::Relaxed);
            outcome
        });
        drop(evicted); // outside the lock: freeing returns buffers to the pool
        result?;
        match next == experts.len() {
            true => Ok(()),
            false => Err(SchedError::Io { layer, msg: "an expert read was lost".into() }.into()),
        }
    }

    fn count(&self, layer: usize, hits: u64, misses: u64) {
        self.stats.expert_hits.fetch_add(hits, Ordering::Relaxed);
        if let Some(s) = lock(&self.stats.expert_layers).get_mut(layer) {
            s.hits += hits;
            s.misses += misses;
        }
    }

    /// Bytes of all routed experts.
    pub fn expert_bytes(&self) -> u64 {
        self.unit_bytes.iter().sum()
    }

    /// The files experts are read from (none when resident).
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        match &self.mode {
            Mode::Resident(_) => Vec::new(),
            Mode::OnDemand(d) => d.reader.paths(),
        }
    }

    pub fn summary(&self) -> ExpertSummary {
        let moe_layers: Vec<usize> = (0..self.base.len()).filter(|&l| self.base[l].is_some()).collect();
        let per_layer = lock(&self.stats.expert_layers).clone();
        let layers = moe_layers.iter().map(|&l| per_layer.get(l).copied().unwrap_or_default()).collect();
        let (mode, budget, cached_bytes, cached_experts) = match &self.mode {
            Mode::Resident(_) => ("resident", self.expert_bytes(), self.expert_bytes(), self.unit_bytes.len()),
            Mode::OnDemand(d) => {
                let s = lock(&d.state);
                ("on_demand", s.policy.budget(), s.policy.cached_bytes(), s.cached.len())
            }
        };
        let (host_tier_budget_bytes, host_tier_bytes) = match &self.mode {
            Mode::Resident(_) => (0, 0),
            Mode::OnDemand(d) => {
                let h = lock(&d.host);
                (h.budget(), h.used())
            }
        };
        ExpertSummary {
            unit: self.unit,
            mode,
            policy: self.policy,
            experts_per_layer: self.n_experts,
            moe_layers: moe_layers.len(),
            expert_bytes: self.expert_bytes(),
            cache_budget_bytes: budget,
            cached_bytes,
            cached_experts,
            layers,
            guess_right: self.stats.expert_guess_right.load(Ordering::Relaxed),
            guess_total: self.stats.expert_guess_total.load(Ordering::Relaxed),
            host_tier_budget_bytes,
            host_tier_bytes,
            host_hits: self.stats.expert_host_hits.load(Ordering::Relaxed),
        }
    }
}

/// An expert cache of any weight type, for summaries read from other threads.
pub trait ExpertInfo: Send + Sync {
    fn summary(&self) -> ExpertSummary;
    fn files(&self) -> Vec<std::path::PathBuf>;
    /// Whether experts are read from storage on demand.
    fn is_on_demand(&self) -> bool;
    /// Bytes of all routed experts.
    fn expert_bytes(&self) -> u64;
    /// The experts in memory now, as (layer, expert): every one when resident.
    fn cached(&self) -> Vec<ExpertId>;
    /// The layers that route to experts.
    fn moe_layers(&self) -> Vec<usize>;
}

impl<E: Send + Sync + 'static> ExpertInfo for ExpertCache<E> {
    fn summary(&self) -> ExpertSummary {
        ExpertCache::summary(self)
    }
    fn files(&self) -> Vec<std::path::PathBuf> {
        ExpertCache::files(self)
    }
    fn is_on_demand(&self) -> bool {
        matches!(self.mode, Mode::OnDemand(_))
    }
    fn expert_bytes(&self) -> u64 {
        ExpertCache::expert_bytes(self)
    }
    fn moe_layers(&self) -> Vec<usize> {
        (0..self.base.len()).filter(|&l| self.base[l].is_some()).collect()
    }
    fn cached(&self) -> Vec<ExpertId> {
        let mut ids: Vec<ExpertId> = match &self.mode {
            Mode::Resident(_) => ExpertInfo::moe_layers(self)
                .into_iter()
                .flat_map(|l| (0..self.n_experts).map(move |e| ExpertId::new(l as u32, e as u32)))
                .collect(),
            Mode::OnDemand(d) => lock(&d.state).cached.keys().copied().collect(),
        };
        ids.sort();
        ids
    }
}
