//! Routed experts computed by the CPU beside the GPU (`--cpu-moe`, `--n-cpu-moe N`, auto;
//! DESIGN.md §5, "Placement"). The layer cores (attention, norms, router, shared expert)
//! run on the device; for each MoE layer the placement plan
//! ([`strata_sched::placement`]) says which routed experts the CPU computes, from RAM (or
//! read from storage where RAM is short). Only hidden rows cross: the layer's input
//! comes down once, the CPU experts' weighted sum goes up once, and the CPU works while
//! the device runs the shared expert and its own experts (its launches are queued
//! first). The device's experts come from its expert cache, as without a split.
//!
//! The plan is made at load from the sizes, the measured rates (each side's expert rate
//! on one of the model's own experts, the rows' crossing; the loader measures the
//! upload and storage bandwidths) and uniform router statistics, then made again every
//! [`SplitOptions::replan_every`] passes from the router's choices (decayed), so that
//! the experts in use move to the device as use shifts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::Instant;

use super::config::ModelConfig;
use super::decoder::build::build_expert;
use super::error::ModelError;
use super::moe::{self, Mlp, MlpBufs};
use strata_backend::cpu::CpuBackend;
use strata_backend::{Backend, HostCopy, Rows};
use strata_sched::experts::{ExpertCache, ExpertOptions, ExpertUnit};
use strata_sched::placement::split::{RatesSummary, SplitCounters, SplitInfo, SplitOptions, SplitSummary, UseCounts};
use strata_sched::placement::{Budgets, LayerShape, PlacementInputs, PlacementPlan, RouterStats, Side};
use strata_sched::{SchedError, SchedStats, Tier};

mod measure;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The CPU's scratch buffers, grown with the rows a pass needs.
#[derive(Default)]
struct HostBufs {
    rows: usize,
    xe: Vec<f32>,   // (rows, hidden)
    ye: Vec<f32>,   // (rows, hidden)
    gate: Vec<f32>, // (rows, expert width)
    up: Vec<f32>,   // (rows, expert width)
}

impl HostBufs {
    fn fit(&mut self, rows: usize, hidden: usize, width: usize) {
        if rows > self.rows {
            *self = HostBufs {
                rows,
                xe: vec![0.0; rows * hidden],
                ye: vec![0.0; rows * hidden],
                gate: vec![0.0; rows * width],
                up: vec![0.0; rows * width],
            };
        }
    }
}

/// What building a CPU side takes.
pub struct SideBuild<'a, B: Backend> {
    pub config: &'a ModelConfig,
    /// The device the rest of the model runs on (its expert rate is measured on it).
    pub device: &'a B,
    /// Every routed expert, as the device's expert cache gets them.
    pub units: &'a [ExpertUnit],
    /// Bytes of each layer's core (all of a dense layer).
    pub cores: &'a [u64],
    pub opts: &'a SplitOptions,
    /// The scheduler's counters: the CPU's reads from storage count among the experts'.
    pub stats: &'a SchedStats,
    pub policy: strata_sched::expert_policy::CachePolicy,
    pub buffered: bool,
}

/// One MoE layer's sides for one pass: which experts the CPU computes, and which
/// sequences' rows run wholly on the device instead (prompt chunks large enough that
/// uploading the CPU's experts beats computing them there).
pub struct LayerSides {
    cpu: Vec<bool>,
    upload: Vec<bool>,
}

impl LayerSides {
    /// Whether sequence `seq`'s rows through expert `e` compute on the CPU.
    pub fn on_cpu(&self, seq: usize, e: usize) -> bool {
        !self.upload.get(seq).copied().unwrap_or(true) && self.cpu.get(e).copied().unwrap_or(false)
    }

    /// Whether some sequence's rows run wholly on the device.
    pub fn uploads(&self) -> bool {
        self.upload.contains(&true)
    }
}

/// What the CPU side's own thread works with: its backend, the experts it computes and
/// its scratch, and the counters both threads add to.
struct Work {
    cpu: Arc<CpuBackend>,
    config: ModelConfig,
    experts: ExpertCache<Mlp<CpuBackend>>,
    bufs: Mutex<HostBufs>,
    counters: SplitCounters,
}

/// The routed experts `on_host` computes (by expert: the rows routed to it and their
/// weights).
type OnHost = std::collections::BTreeMap<usize, (Vec<u32>, Vec<f32>)>;

type Job = Box<dyn FnOnce() + Send>;

/// The CPU beside the device: its backend, its own cache of the experts it computes, the
/// plan it follows, and a thread of its own that leads the CPU's work on a layer while
/// the forward pass's thread queues the device's (so the two overlap even while the
/// device's side is reading experts from storage).
pub struct CpuSide {
    work: Arc<Work>,
    plan: Mutex<PlacementPlan>,
    uses: UseCounts,
    replan_every: u64,
    passes: AtomicU64,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A layer's CPU experts under way on the CPU side's thread.
pub struct Pending {
    rx: mpsc::Receiver<Result<Vec<f32>, ModelError>>,
}

impl Pending {
    /// Their weighted sum, `(rows, hidden)`, once computed.
    pub fn wait(self) -> Result<Vec<f32>, ModelError> {
        self.rx.recv().unwrap_or_else(|_| Err(build_err("the CPU side's thread stopped")))
    }
}

impl Drop for CpuSide {
    fn drop(&mut self) {
        drop(lock(&self.jobs).take());
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl CpuSide {
    /// The plan for `b`'s model, made from measured rates, and the CPU's expert cache:
    /// every expert resident when the plan leaves none on storage, else read on demand
    /// within the RAM the plan gives the CPU's experts.
    pub fn new<B: Backend>(b: SideBuild<'_, B>) -> Result<Self, ModelError> {
        let c = b.config;
        let m = c.moe.ok_or_else(|| build_err("the model routes to no experts"))?;
        let cpu = match c.linear_attn {
            // A recurrent state accumulates the decode kernel's other rounding (as the
            // CPU device runs such models).
            Some(_) => CpuBackend::new(b.opts.threads).row_invariant(),
            None => CpuBackend::new(b.opts.threads),
        };
        let mut layers: Vec<LayerShape> =
            b.cores.iter().map(|&core_bytes| LayerShape { core_bytes, ..LayerShape::default() }).collect();
        for u in b.units {
            let l = layers.get_mut(u.id.layer as usize).ok_or_else(|| build_err("an expert of no layer"))?;
            l.experts += 1;
            l.expert_bytes = l.expert_bytes.max(u.tensors.bytes() as u64);
            l.top_k = m.top_k as u32;
        }
        if b.units.is_empty() {
            return Err(build_err("no routed experts"));
        }
        let rates = match b.opts.rates {
            Some(rates) => rates,
            None => measure::rates(b.device, &cpu, c, b.units, b.opts)?,
        };
        let cores: u64 = b.cores.iter().sum();
        let budgets = Budgets {
            // The cores stream through the layer ring when they do not fit: the experts
            // then get no VRAM, and the plan is made as if the cores fit.
            vram_free: b.opts.budgets.vram_free.max(cores.saturating_add(b.opts.budgets.vram_reserve)),
            ..b.opts.budgets
        };
        let experts_per_layer: Vec<u32> = layers.iter().map(|l| l.experts).collect();
        let inputs = PlacementInputs { layers, budgets, rates, stats: RouterStats::uniform(), mode: b.opts.mode };
        let plan = PlacementPlan::new(inputs).map_err(|e| build_err(&format!("planning the experts: {e}")))?;
        let any_storage = plan.totals().storage_bytes > 0;
        let ram_for_cpu: u64 = b
            .units
            .iter()
            .filter(|u| plan.placement(u.id).is_some_and(|p| p.compute == Side::Cpu && p.home == Tier::Ram))
            .map(|u| u.tensors.bytes() as u64)
            .sum();
        let opts = ExpertOptions {
            budget: any_storage.then_some(ram_for_cpu),
            policy: b.policy,
            buffered: b.buffered,
            stage: None,
            repack: cpu.repacks_weights(),
            host_budget: 0,
        };
        let units: Vec<ExpertUnit> =
            b.units.iter().map(|u| ExpertUnit { id: u.id, tensors: u.tensors.clone() }).collect();
        // Its own counters, but its reads from storage count with the device's.
        let stats = Arc::new(SchedStats { expert_bytes_read: b.stats.expert_bytes_read.clone(), ..Default::default() });
        let cpu = Arc::new(cpu);
        let (cfg, be) = (c.clone(), cpu.clone());
        let build = Box::new(move |e: usize, lt: &strata_sched::LayerTensors| build_expert(&cfg, &*be, lt, e));
        let experts = ExpertCache::new(c.n_layers, m.n_experts, units, build, &opts, stats)?;
        let summary = plan.summary();
        tracing::info!(
            mode = ?plan.inputs().mode,
            on_cpu = summary.layers.iter().map(|l| l.on_cpu as u64).sum::<u64>(),
            in_vram = summary.layers.iter().map(|l| l.in_vram as u64).sum::<u64>(),
            predicted_ms = summary.decode.total_s * 1e3,
            "routed experts placed"
        );
        let work = Arc::new(Work {
            cpu,
            config: c.clone(),
            experts,
            bufs: Mutex::new(HostBufs::default()),
            counters: SplitCounters::default(),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("strata-cpu-experts".into())
            .spawn(move || rx.iter().for_each(|job| job()))
            .map_err(|e| build_err(&format!("starting its thread: {e}")))?;
        Ok(CpuSide {
            work,
            plan: Mutex::new(plan),
            uses: UseCounts::new(&experts_per_layer),
            replan_every: b.opts.replan_every,
            passes: AtomicU64::new(0),
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Bytes of routed experts the plan keeps in VRAM: the device's expert cache's size.
    pub fn device_expert_bytes(&self) -> u64 {
        lock(&self.plan).totals().vram_expert_bytes
    }

    /// Bytes of the experts the plan uploads from host memory (homes `pinned` and `ram`,
    /// computed on the device), at most `--host-budget`: the host tier behind the
    /// device's expert cache, so that they are copied from RAM rather than read.
    pub fn device_host_bytes(&self) -> u64 {
        let plan = lock(&self.plan);
        let inputs = plan.inputs();
        let mut bytes = 0u64;
        for (l, shape) in inputs.layers.iter().enumerate() {
            let host = |p: &&strata_sched::placement::Placement| {
                p.compute == Side::Gpu && matches!(p.home, Tier::Pinned | Tier::Ram)
            };
            bytes += plan.layer(l).iter().filter(host).count() as u64 * shape.expert_bytes;
        }
        bytes.min(inputs.budgets.pinned_max)
    }

    /// Layer `layer`'s sides for a pass of `seq_rows` rows per sequence (more than one:
    /// a prompt chunk); `None` when the CPU computes none of its experts.
    pub fn sides(&self, layer: usize, seq_rows: &[usize]) -> Option<LayerSides> {
        let plan = lock(&self.plan);
        let cpu: Vec<bool> = plan.layer(layer).iter().map(|p| p.compute == Side::Cpu).collect();
        if !cpu.contains(&true) {
            return None;
        }
        let upload = seq_rows
            .iter()
            .map(|&rows| rows > 1 && plan.prefill(layer, rows as u32).is_some_and(|p| p.upload))
            .collect();
        Some(LayerSides { cpu, upload })
    }

    /// Counts one layer's routing: the router's choices (for the next plan) and each
    /// side's experts.
    pub fn record(&self, layer: usize, routing: &[(Vec<u32>, Vec<f32>)], device: usize, host: usize, uploaded: bool) {
        self.uses.record(layer, routing.iter().map(|(ids, _)| ids.as_slice()));
        SplitCounters::add(&self.work.counters.gpu_experts, device as u64);
        SplitCounters::add(&self.work.counters.cpu_experts, host as u64);
        if uploaded {
            SplitCounters::add(&self.work.counters.uploaded_layers, 1);
        }
    }

    /// The layer's input rows on the host: the one copy down.
    pub fn rows_down<B: Backend>(&self, be: &B, input: &B::Buf, len: usize) -> Result<Vec<f32>, ModelError> {
        let rows = be.download(input, len)?;
        SplitCounters::add(&self.work.counters.bytes_down, 4 * len as u64);
        SplitCounters::add(&self.work.counters.crossings, 1);
        Ok(rows)
    }

    /// Starts the experts `on_host` of layer `layer` over their rows of `input` (on the
    /// host) on the CPU side's thread; [`Pending::wait`] gives their weighted sum.
    pub fn start(&self, layer: usize, input: Vec<f32>, seq_of: Vec<usize>, on_host: OnHost) -> Pending {
        let (reply, rx) = mpsc::channel();
        let work = self.work.clone();
        let job: Job = Box::new(move || {
            let _ = reply.send(work.run(layer, &input, &seq_of, &on_host));
        });
        let unsent = match lock(&self.jobs).as_ref() {
            Some(tx) => tx.send(job).err().map(|mpsc::SendError(job)| job),
            None => Some(job),
        };
        if let Some(job) = unsent {
            job(); // its thread is gone: here, then
        }
        Pending { rx }
    }

    /// The CPU experts' `sum` up into `dev` (the one copy up) and added into `out`.
    pub fn rows_up<B: Backend>(
        &self,
        be: &B,
        sum: &[f32],
        dev: &mut B::Buf,
        out: &mut B::Buf,
        rows: usize,
        h: usize,
    ) -> Result<(), ModelError> {
        let t = Instant::now();
        dev.write_host(sum)?;
        be.add_rows(out, dev, h, Rows::first(rows), None)?;
        SplitCounters::add(&self.work.counters.bytes_up, 4 * sum.len() as u64);
        SplitCounters::add(&self.work.counters.gpu_wait_ns, t.elapsed().as_nanos() as u64);
        Ok(())
    }

    /// The end of a forward pass: recency in the CPU's cache, and every
    /// `replan_every` passes a plan made from the router's choices.
    pub fn end_pass(&self) {
        self.work.experts.step();
        let passes = self.passes.fetch_add(1, Ordering::Relaxed) + 1;
        if self.replan_every > 0 && passes.is_multiple_of(self.replan_every) {
            self.replan(self.uses.take());
        }
    }

    /// A plan from `stats`, followed from the next pass on; returns how many experts
    /// changed sides (none when the statistics do not fit the model: the plan stays).
    pub fn replan(&self, stats: RouterStats) -> usize {
        let mut plan = lock(&self.plan);
        let next = match plan.replan(stats) {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %e, "the experts' placement was not planned again");
                return 0;
            }
        };
        let moved = plan.changes(&next).iter().filter(|ch| ch.from.compute != ch.to.compute).count();
        *plan = next;
        SplitCounters::add(&self.work.counters.replans, 1);
        SplitCounters::add(&self.work.counters.moved, moved as u64);
        tracing::debug!(moved, "the experts' placement planned again");
        moved
    }

    /// Where the plan in force puts expert `id`.
    pub fn placement(&self, id: strata_sched::expert_policy::ExpertId) -> Option<strata_sched::placement::Placement> {
        lock(&self.plan).placement(id)
    }
}

impl Work {
    /// The experts `on_host` of layer `layer` over their rows of `input`, in expert order,
    /// on the CPU's threads: their weighted sum, `(rows, hidden)`.
    fn run(&self, layer: usize, input: &Vec<f32>, seq_of: &[usize], on_host: &OnHost) -> Result<Vec<f32>, ModelError> {
        let t = Instant::now();
        let c = &self.config;
        let h = c.hidden_size;
        let width = c.moe.map_or(0, |m| m.expert_size);
        let most = on_host.values().map(|(rows, _)| rows.len()).max().unwrap_or(0);
        let wanted: Vec<usize> = on_host.keys().copied().collect();
        let groups: Vec<&(Vec<u32>, Vec<f32>)> = on_host.values().collect();
        let mut sum = vec![0.0f32; input.len()];
        let cpu = &*self.cpu;
        let result = cpu.on_workers(|| {
            let mut bufs = lock(&self.bufs);
            bufs.fit(most, h, width);
            let HostBufs { xe, ye, gate, up, .. } = &mut *bufs;
            self.experts.get_each(layer, &wanted, |i, expert: Arc<Mlp<CpuBackend>>| -> Result<(), ModelError> {
                let (rows_of, weights) = groups[i];
                let mut mlp = MlpBufs { gate: &mut *gate, up: &mut *up };
                let scratch = (&mut *xe, &mut *ye);
                moe::run_expert(cpu, c, &expert, input, (rows_of, weights), seq_of, &mut mlp, scratch, &mut sum)
            })
        });
        SplitCounters::add(&self.counters.cpu_ns, t.elapsed().as_nanos() as u64);
        result.map(|()| sum)
    }
}

impl SplitInfo for CpuSide {
    fn summary(&self) -> SplitSummary {
        let plan = lock(&self.plan);
        SplitSummary {
            mode: plan.inputs().mode,
            replan_every: self.replan_every,
            rates: RatesSummary::of(&plan.inputs().rates),
            plan: plan.summary(),
            steps: self.work.counters.snapshot(),
        }
    }
}

fn build_err(msg: &str) -> ModelError {
    ModelError::Sched(SchedError::Build { layer: 0, msg: format!("computing experts on the CPU: {msg}") })
}
