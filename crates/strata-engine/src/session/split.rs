//! `--cpu-moe`, `--n-cpu-moe N` or neither (auto), resolved at load into the
//! [`SplitOptions`] a MoE model on a GPU computes some routed experts on the CPU with
//! (DESIGN.md §5, "Placement"): whether it does at all, the budgets the plan is made
//! within, and the machine's upload and storage rates.

use std::path::Path;

use strata_model::ModelSource;
use strata_model::config::ModelConfig;
use strata_sched::placement::split::{DEFAULT_REPLAN_EVERY, SplitOptions};
use strata_sched::placement::{Budgets, Mode};
use strata_sched::plan::human_size;
use strata_sched::{ExpertLoading, SchedOptions};

use super::{BUDGET_HEADROOM, RunOptions, WeightSizes, weight_sizes};

/// Bytes the storage probe reads of the experts' file.
const STORAGE_PROBE_BYTES: u64 = 64 << 20;

/// What a GPU tells the resolution.
pub(super) struct GpuRates<'a> {
    /// Free device memory now, if known.
    pub vram_free: Option<u64>,
    /// Host-to-device bandwidth from pinned memory (measured on first call).
    pub h2d: &'a dyn Fn() -> Option<f64>,
}

/// Whether the CPU computes routed experts beside the GPU under `mode`: always for
/// `--cpu-moe`, for `--n-cpu-moe N` when N > 0, and under auto when the layers (their
/// cores and routed experts) do not fit `budget` (`None`: they fit).
pub(super) fn wanted(mode: Mode, layer_bytes: u64, budget: Option<u64>) -> bool {
    match mode {
        Mode::CpuMoe => true,
        Mode::NCpuMoe(n) => n > 0,
        Mode::Auto => budget.is_some_and(|b| layer_bytes > b),
    }
}

/// The budgets a plan is made within: the layer-weights budget on the device (it
/// already leaves room for KV caches and activations) or else free VRAM, free RAM less
/// the tenth `--host-budget`'s default leaves, and at most `--host-budget` page-locked.
pub(super) fn budgets(sched: &SchedOptions, vram_free: Option<u64>, ram_free: u64) -> Budgets {
    Budgets {
        vram_free: sched.budget.or(vram_free).unwrap_or(0),
        vram_reserve: 0,
        ram_free,
        ram_reserve: (ram_free as f64 * BUDGET_HEADROOM) as u64,
        pinned_max: sched.host_budget,
    }
}

/// The split a model on a GPU runs with, or `None`: a dense model, experts loaded with
/// their layers (`--experts all`), `--n-cpu-moe 0`, or auto with the layers in budget.
pub(super) fn resolve(
    source: &ModelSource,
    config: &ModelConfig,
    opts: &RunOptions,
    sched: &SchedOptions,
    gpu: &GpuRates<'_>,
) -> Option<SplitOptions> {
    let mode = opts.expert_split;
    if config.moe.is_none() || opts.expert_loading != ExpertLoading::Routed {
        if mode != Mode::Auto {
            tracing::info!(?mode, "--cpu-moe and --n-cpu-moe apply to a MoE model's routed experts: not used here");
        }
        return None;
    }
    let WeightSizes { streamable, routed, .. } = weight_sizes(source, config, opts);
    if !wanted(mode, streamable, sched.budget) {
        return None;
    }
    let ram_free = strata_backend::device::available_memory().unwrap_or(0);
    let split = SplitOptions {
        mode,
        budgets: budgets(sched, gpu.vram_free, ram_free),
        h2d: (gpu.h2d)().unwrap_or(0.0),
        storage: expert_file(source).map_or(0.0, |p| storage_rate(&p)),
        replan_every: DEFAULT_REPLAN_EVERY,
        threads: opts.threads,
        rates: None,
    };
    tracing::info!(
        ?mode,
        routed,
        cores = streamable - routed,
        vram = split.budgets.vram_free,
        ram = ram_free,
        pinned_max = split.budgets.pinned_max,
        h2d_bytes_s = split.h2d,
        storage_bytes_s = split.storage,
        "routed experts computed beside the GPU by the CPU ({} of routed experts, {} of layer cores, {} for them \
         on the device)",
        human_size(routed),
        human_size(streamable - routed),
        human_size(split.budgets.vram_free)
    );
    Some(split)
}

/// The file the first routed expert is stored in, if it is stored in one.
fn expert_file(source: &ModelSource) -> Option<std::path::PathBuf> {
    let mut experts: Vec<(usize, &strata_tensor::tensor::HostTensor)> = source
        .tensors
        .iter()
        .filter_map(|(name, t)| {
            let (layer, local) = strata_format::layer_tensor(name)?;
            strata_format::expert_tensor(local).map(|_| (layer, t))
        })
        .collect();
    experts.sort_by_key(|&(layer, _)| layer);
    experts.iter().find_map(|(_, t)| t.origin()).map(|o| o.path.to_path_buf())
}

/// Sequential read bandwidth of `path` (bytes/s), 0 when it cannot be measured.
fn storage_rate(path: &Path) -> f64 {
    match strata_sched::io::measure_sequential_read(path, STORAGE_PROBE_BYTES) {
        Ok(bw) => bw.bytes_per_sec,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "storage bandwidth not measured for the expert split");
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_is_wanted_when_asked_or_when_the_layers_do_not_fit() {
        assert!(wanted(Mode::CpuMoe, 10, None));
        assert!(wanted(Mode::NCpuMoe(2), 10, Some(100)));
        assert!(!wanted(Mode::NCpuMoe(0), 1000, Some(100)));
        assert!(wanted(Mode::Auto, 101, Some(100)));
        assert!(!wanted(Mode::Auto, 100, Some(100)));
        assert!(!wanted(Mode::Auto, u64::MAX, None));
    }

    /// A fixture MoE model (two MoE layers of 8 experts) resolved as on a GPU.
    #[test]
    fn a_moe_model_gets_a_split_when_asked_or_over_its_budget() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/gguf/qwen3_moe.f32.gguf");
        let source = ModelSource::from_path(path).unwrap();
        let h2d = || Some(1e10);
        let gpu = GpuRates { vram_free: Some(1 << 30), h2d: &h2d };
        let sched = |budget| SchedOptions { budget, host_budget: 5, ..SchedOptions::default() };
        let auto = RunOptions { threads: 3, ..RunOptions::default() };
        let resolve_with = |opts: &RunOptions, budget| resolve(&source, &source.config, opts, &sched(budget), &gpu);
        assert_eq!(resolve_with(&auto, None), None, "auto, in budget");
        let s = resolve_with(&auto, Some(0)).expect("auto over budget");
        assert_eq!((s.mode, s.threads, s.replan_every, s.h2d), (Mode::Auto, 3, DEFAULT_REPLAN_EVERY, 1e10));
        assert_eq!((s.budgets.vram_free, s.budgets.pinned_max), (0, 5));
        assert!(s.storage > 0.0, "the fixture's file is read: {}", s.storage);
        let asked = |mode| RunOptions { expert_split: mode, ..auto.clone() };
        assert_eq!(resolve_with(&asked(Mode::CpuMoe), None).map(|s| s.mode), Some(Mode::CpuMoe));
        assert_eq!(resolve_with(&asked(Mode::NCpuMoe(1)), None).map(|s| s.mode), Some(Mode::NCpuMoe(1)));
        assert_eq!(resolve_with(&asked(Mode::NCpuMoe(0)), Some(0)), None);
        let all = RunOptions { expert_loading: ExpertLoading::All, ..asked(Mode::CpuMoe) };
        assert_eq!(resolve_with(&all, Some(0)), None, "experts loaded with their layers");
        let dense = ModelSource::from_path("strata-demo").unwrap();
        assert_eq!(resolve(&dense, &dense.config, &asked(Mode::CpuMoe), &sched(Some(0)), &gpu), None);
    }

    #[test]
    fn the_budgets_are_the_devices_budget_or_free_vram_and_nine_tenths_of_ram() {
        let sched = SchedOptions { budget: Some(3000), host_budget: 700, ..SchedOptions::default() };
        let b = budgets(&sched, Some(9000), 1000);
        assert_eq!(b, Budgets { vram_free: 3000, vram_reserve: 0, ram_free: 1000, ram_reserve: 100, pinned_max: 700 });
        let unbounded = SchedOptions { budget: None, ..sched };
        assert_eq!(budgets(&unbounded, Some(9000), 1000).vram_free, 9000);
        assert_eq!(budgets(&unbounded, None, 1000).vram_free, 0);
    }
}
