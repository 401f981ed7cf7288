//! The placement as it runs: what the loader measures and chooses (`SplitOptions`), the
//! router's statistics gathered while the model runs ([`UseCounts`]), and what each side
//! did ([`SplitCounters`], shown as [`SplitSummary`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde::Serialize;

use super::{Budgets, Mode, PlacementSummary, RouterStats};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Passes between two plans, unless told ([`SplitOptions::replan_every`]).
pub const DEFAULT_REPLAN_EVERY: u64 = 128;

/// How a MoE model on a GPU computes its routed experts beside the CPU, as the loader
/// resolved `--cpu-moe` / `--n-cpu-moe N` / auto and measured the machine. The model
/// measures the rest (each side's expert rate, the rows' crossing) on its own weights.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitOptions {
    pub mode: Mode,
    pub budgets: Budgets,
    /// Host-to-device copy bandwidth from pinned memory, bytes/s (0: not measured).
    pub h2d: f64,
    /// Storage read bandwidth, bytes/s (0: not measured).
    pub storage: f64,
    /// Forward passes between plans made from the router's statistics (0: the first
    /// plan stays).
    pub replan_every: u64,
    /// The CPU's threads (`--threads`; 0: one per core).
    pub threads: usize,
    /// Every rate, measured elsewhere (a benchmark's, a test's); `None`: the model
    /// measures its own at load, with `h2d` and `storage` from here.
    pub rates: Option<super::Rates>,
}

/// The router's choices since the last plan, per layer and expert, decayed by half at
/// every plan so that recent use weighs most.
#[derive(Debug, Default)]
pub struct UseCounts {
    uses: Mutex<Vec<Vec<f64>>>,
}

impl UseCounts {
    /// Counts for `experts[layer]` experts per layer (0 for a dense layer).
    pub fn new(experts: &[u32]) -> Self {
        UseCounts { uses: Mutex::new(experts.iter().map(|&n| vec![0.0; n as usize]).collect()) }
    }

    /// The experts one pass routed its rows to at `layer` (each row's list).
    pub fn record<'a>(&self, layer: usize, routing: impl IntoIterator<Item = &'a [u32]>) {
        let mut uses = lock(&self.uses);
        if let Some(l) = uses.get_mut(layer) {
            for &e in routing.into_iter().flatten() {
                if let Some(u) = l.get_mut(e as usize) {
                    *u += 1.0;
                }
            }
        }
    }

    /// The statistics for a plan; the counts are halved afterwards.
    pub fn take(&self) -> RouterStats {
        let mut uses = lock(&self.uses);
        let stats = RouterStats { weights: uses.clone() };
        uses.iter_mut().flatten().for_each(|u| *u *= 0.5);
        stats
    }
}

/// What the two sides did, counted as the model runs.
#[derive(Debug, Default)]
pub struct SplitCounters {
    /// Routed experts computed on each side (one per expert and pass it ran in).
    pub gpu_experts: AtomicU64,
    pub cpu_experts: AtomicU64,
    /// Hidden rows copied to the CPU and back, in bytes, and the layer crossings.
    pub bytes_down: AtomicU64,
    pub bytes_up: AtomicU64,
    pub crossings: AtomicU64,
    /// Time the CPU spent on its experts, and the time the forward pass waited for the
    /// GPU after the CPU was done (the copy up included).
    pub cpu_ns: AtomicU64,
    pub gpu_wait_ns: AtomicU64,
    /// Passes whose large batches uploaded a layer's CPU experts instead (prefill).
    pub uploaded_layers: AtomicU64,
    /// Plans made after the first, and the experts they moved from one side to the other.
    pub replans: AtomicU64,
    pub moved: AtomicU64,
}

impl SplitCounters {
    pub fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> SplitSteps {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SplitSteps {
            gpu_experts: get(&self.gpu_experts),
            cpu_experts: get(&self.cpu_experts),
            bytes_down: get(&self.bytes_down),
            bytes_up: get(&self.bytes_up),
            crossings: get(&self.crossings),
            cpu_s: get(&self.cpu_ns) as f64 / 1e9,
            gpu_wait_s: get(&self.gpu_wait_ns) as f64 / 1e9,
            uploaded_layers: get(&self.uploaded_layers),
            replans: get(&self.replans),
            moved: get(&self.moved),
        }
    }
}

/// [`SplitCounters`] read at one moment (totals since the model loaded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SplitSteps {
    pub gpu_experts: u64,
    pub cpu_experts: u64,
    pub bytes_down: u64,
    pub bytes_up: u64,
    pub crossings: u64,
    pub cpu_s: f64,
    pub gpu_wait_s: f64,
    pub uploaded_layers: u64,
    pub replans: u64,
    pub moved: u64,
}

/// The rates a plan was made from, as measured (bytes/s; `null` where not measured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RatesSummary {
    pub h2d_bytes_s: Option<f64>,
    pub storage_bytes_s: Option<f64>,
    /// Expert bytes a second one row goes through, on each side (decode).
    pub cpu_expert_bytes_s: Option<f64>,
    pub gpu_expert_bytes_s: Option<f64>,
    /// Weight bytes × rows a second through a batch of rows (prefill).
    pub cpu_gemm_bytes_s: Option<f64>,
    pub gpu_gemm_bytes_s: Option<f64>,
    /// Seconds of one layer's rows to the CPU and back.
    pub crossing_s: f64,
}

impl RatesSummary {
    pub fn of(r: &super::Rates) -> Self {
        let known = |x: f64| (x > 0.0 && x.is_finite()).then_some(x);
        RatesSummary {
            h2d_bytes_s: known(r.h2d),
            storage_bytes_s: known(r.storage),
            cpu_expert_bytes_s: known(r.cpu),
            gpu_expert_bytes_s: known(r.gpu),
            cpu_gemm_bytes_s: known(r.cpu_gemm),
            gpu_gemm_bytes_s: known(r.gpu_gemm),
            crossing_s: r.crossing_s,
        }
    }
}

/// What `bench`, `/api/ps`, `/metrics`, the status page and `strata top` show of a MoE
/// model's routed experts computed on both sides.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SplitSummary {
    /// `auto`, `cpu_moe`, or `{"n_cpu_moe": N}`.
    pub mode: Mode,
    /// Forward passes between plans (0: never replanned).
    pub replan_every: u64,
    pub rates: RatesSummary,
    /// The plan in force: totals, predicted decode time, and per MoE layer its experts in
    /// VRAM, computed on the CPU, uploaded when used and read from storage.
    pub plan: PlacementSummary,
    pub steps: SplitSteps,
}

/// A split of any weight type, read from other threads.
pub trait SplitInfo: Send + Sync {
    fn summary(&self) -> SplitSummary;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_counts_decay_by_half_at_each_plan() {
        let u = UseCounts::new(&[0, 4]);
        u.record(1, [&[0, 2][..], &[2, 3]]);
        u.record(7, [&[0][..]]); // no such layer: ignored
        u.record(1, [&[9][..]]); // no such expert: ignored
        assert_eq!(u.take().weights, vec![vec![], vec![1.0, 0.0, 2.0, 1.0]]);
        u.record(1, [&[1][..]]);
        assert_eq!(u.take().weights[1], vec![0.5, 1.0, 1.0, 0.5]);
    }
}
