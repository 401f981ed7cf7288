//! The placement plan of a mixture-of-experts model on a GPU box (DESIGN.md §5): for every
//! routed expert, where its weights live (its *home*, a [`Tier`]) and which side computes it
//! ([`Side`]). Pure logic, no I/O: the caller measures free memory and the rates and passes
//! the router's statistics; the plan never touches memory. The model's CPU side (in
//! `strata-model`) runs it and follows it ([`split`]).
//!
//! The layer cores (attention, norms, router, shared expert) always live in VRAM and run on
//! the GPU. One use of a routed expert of `b` bytes at decode (one row) costs, on its side:
//!
//! | home              | side | seconds                         |
//! |-------------------|------|---------------------------------|
//! | `vram`            | GPU  | b/gpu                           |
//! | `pinned` or `ram` | GPU  | b/h2d + b/gpu (uploaded)        |
//! | `ram`             | CPU  | b/cpu                           |
//! | `storage`         | GPU  | b/storage + b/h2d + b/gpu       |
//! | `storage`         | CPU  | b/storage + b/cpu (page cache)  |
//!
//! An expert is used by a token with probability `f`, its frequency ([`RouterStats`], scaled
//! so that a layer's sum to its top-k). A layer's CPU side runs while its GPU side does, so
//! its expert time per token is `max(G, C + X)`: G and C the expected seconds on each side,
//! X the hidden rows' trip to the CPU and back (`crossing_s + row_bytes / h2d`), paid every
//! token once any of the layer's experts computes on the CPU; G alone when none does. The
//! plan's predicted decode time ([`DecodeTime`]) is the sum over the layers; the cores' own
//! time is the same under every placement and is not in it.
//!
//! [`Mode::Auto`], the rule: lower the expected decode time within the budgets (VRAM less its
//! reserve less the cores; RAM less its reserve, pinned experts included; pinned at most
//! `pinned_max`):
//!
//! 1. VRAM: every expert ranked by the expected seconds per token it saves per byte of VRAM
//!    against the best it could do from RAM (`f × (host − b/gpu) / b`; in a model of one
//!    format that is its frequency, hottest first), admitted in that order while it fits,
//!    one that does not fit skipped for the smaller ones after it.
//! 2. RAM: the rest ranked the same way against storage; admitted while RAM holds them. The
//!    coldest are left on storage.
//! 3. Sides, per layer: each expert outside VRAM starts on its cheaper side; then experts
//!    change sides one at a time, the best move first, while that lowers `max(G, C + X)`;
//!    the layer stays wholly on the GPU where that is cheaper (the crossing is not worth it).
//!    So a layer whose CPU side is the slower also uploads some of its host experts.
//! 4. Of the GPU's experts in RAM, the hottest are page-locked (`pinned`) up to
//!    `pinned_max`; the rest are copied from pageable `ram`.
//!
//! Auto then compares that plan with every fixed split (`--n-cpu-moe 0..=M`, `M` the MoE
//! layers, so `--cpu-moe` too) and keeps the fastest: it is never predicted slower than any.
//!
//! [`Mode::NCpuMoe`] and [`Mode::CpuMoe`] keep the user's split (the first `n` MoE layers, or
//! all, compute their experts on the CPU from RAM; the other layers on the GPU with the VRAM
//! expert cache, the rest uploaded) and place homes by the same ranks within the budgets: an
//! expert RAM cannot hold is on `storage`. Unlike llama.cpp's `--n-cpu-moe`, which counts
//! layers, `n` counts MoE layers (a model's leading dense layers are not among them).
//!
//! A rate of 0 means "not measured" and is infinitely slow: a path through it is never
//! chosen where another exists, and a plan that must use one predicts infinity (serialized as
//! `null`). An infinite rate is infinitely fast. Not modelled: the CPU's reads and the GPU's
//! copies from host memory sharing DRAM bandwidth (each side is taken at its measured rate
//! while the other runs), copies from pageable memory (charged at the pinned rate), and the
//! cost of moving experts when a [`PlacementPlan::replan`] changes them.

use serde::Serialize;

use super::Tier;
use super::expert_policy::ExpertId;

mod cost;
mod planner;
pub mod split;
#[cfg(test)]
mod testkit;

pub use cost::PrefillChoice;
use cost::frequencies;
use planner::{Planner, Sides};

/// The most routed experts a layer may have (models have up to a few hundred).
pub const MAX_EXPERTS: u32 = 1 << 16;

/// One layer of the model, as the planner sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerShape {
    /// Bytes of the layer's non-expert part (attention, norms, router, shared expert; a
    /// dense layer's whole weights): always in VRAM.
    pub core_bytes: u64,
    /// Routed experts; 0 for a dense layer.
    pub experts: u32,
    /// Bytes of one routed expert (its gate, up and down matrices together).
    pub expert_bytes: u64,
    /// Experts the router picks per token.
    pub top_k: u32,
}

/// Memory the plan may use, measured by the caller (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budgets {
    /// Free device memory now.
    pub vram_free: u64,
    /// Of it, what KV caches and activations need: never placed.
    pub vram_reserve: u64,
    /// Free host memory now.
    pub ram_free: u64,
    pub ram_reserve: u64,
    /// The most page-locked bytes (`--host-budget`); `u64::MAX`: no limit but RAM.
    pub pinned_max: u64,
}

/// Measured rates; 0 is "not measured", infinitely slow (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    /// Host-to-device copy bandwidth from pinned memory, bytes/s.
    pub h2d: f64,
    /// Storage read bandwidth, bytes/s.
    pub storage: f64,
    /// Bytes of expert weights per second the CPU computes one row through (decode), for
    /// this format: a use costs `bytes / cpu` seconds.
    pub cpu: f64,
    /// The same for the GPU, from VRAM.
    pub gpu: f64,
    /// Weight bytes × rows per second the CPU computes through a large batch (its
    /// compute-bound rate): `rows` rows through `b` bytes cost `max(b/cpu, rows·b/cpu_gemm)`.
    pub cpu_gemm: f64,
    pub gpu_gemm: f64,
    /// Fixed seconds of one layer's rows to the CPU and back (launches, synchronisation).
    pub crossing_s: f64,
    /// Bytes one row moves across PCIe there and back together (2 × hidden × 4 for f32).
    pub row_bytes: u64,
}

/// Who chooses the compute side (`--cpu-moe`, `--n-cpu-moe N`, or neither).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The planner chooses (see the module docs).
    #[default]
    Auto,
    /// Every routed expert computes on the CPU.
    CpuMoe,
    /// The first `n` MoE layers' experts compute on the CPU, the others' on the GPU.
    NCpuMoe(u32),
}

/// How often the router picks each expert: per layer, one weight per expert (use counts,
/// decayed counts or fractions of tokens; only their ratios matter). A layer without
/// weights, or whose weights are all 0, is uniform.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouterStats {
    /// `weights[layer][expert]`.
    pub weights: Vec<Vec<f64>>,
}

impl RouterStats {
    /// Every expert as likely as every other.
    pub fn uniform() -> Self {
        RouterStats::default()
    }

    /// `weight(id)` for every expert of `layers`, e.g. `|id| policy.decayed_uses(id)` of an
    /// [`ExpertPolicy`](super::expert_policy::ExpertPolicy).
    pub fn from_fn(layers: &[LayerShape], mut weight: impl FnMut(ExpertId) -> f64) -> Self {
        let weights = (0..layers.len() as u32)
            .map(|l| (0..layers[l as usize].experts).map(|e| weight(ExpertId::new(l, e))).collect())
            .collect();
        RouterStats { weights }
    }

    fn layer(&self, l: usize) -> &[f64] {
        self.weights.get(l).map_or(&[], Vec::as_slice)
    }
}

/// Everything the planner reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlacementInputs {
    /// Every layer of the model, dense ones included (`experts: 0`).
    pub layers: Vec<LayerShape>,
    pub budgets: Budgets,
    pub rates: Rates,
    pub stats: RouterStats,
    pub mode: Mode,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error("`{field}` must be a number >= 0 (got {value})")]
    Rate { field: &'static str, value: f64 },
    #[error("layer {layer}: `top_k` {top_k} must be in 1..={experts}")]
    TopK { layer: usize, top_k: u32, experts: u32 },
    #[error("layer {layer}: {experts} experts, more than {MAX_EXPERTS}")]
    TooManyExperts { layer: usize, experts: u32 },
    #[error("router statistics for {got} layers, the model has {layers}")]
    StatsLayers { got: usize, layers: usize },
    #[error("layer {layer}: router statistics for {got} experts, the layer has {experts}")]
    StatsLen { layer: usize, got: usize, experts: u32 },
    #[error("layer {layer}, expert {expert}: router weight {value} must be a finite number >= 0")]
    Weight { layer: usize, expert: usize, value: f64 },
    #[error("the layer cores need {cores} bytes of VRAM; {available} are free after the reserve")]
    CoresExceedVram { cores: u64, available: u64 },
}

/// Which side computes an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Gpu,
    Cpu,
}

/// Where one routed expert lives and computes. `home: Vram` computes on the GPU; a CPU
/// expert's home is `Ram` or `Storage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Placement {
    pub home: Tier,
    pub compute: Side,
}

/// The predicted decode time per token of the routed experts, expected over the router's
/// statistics, and its parts. The parts are sums over the layers of each side's work; as
/// the sides overlap, they add up to more than `total_s` where both sides work. Each is
/// `null` when infinite (a rate it needs was not measured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DecodeTime {
    /// Σ over layers of `max(G, C + X)` (see the module docs).
    #[cfg_attr(feature = "schema", schema(value_type = Option<f64>))]
    pub total_s: f64,
    /// The GPU computing experts (from VRAM or uploaded).
    #[cfg_attr(feature = "schema", schema(value_type = Option<f64>))]
    pub gpu_s: f64,
    #[cfg_attr(feature = "schema", schema(value_type = Option<f64>))]
    pub cpu_s: f64,
    /// Uploading experts not in VRAM.
    #[cfg_attr(feature = "schema", schema(value_type = Option<f64>))]
    pub h2d_s: f64,
    /// Reading experts that live on storage.
    #[cfg_attr(feature = "schema", schema(value_type = Option<f64>))]
    pub storage_s: f64,
    /// The rows' trips to the CPU and back.
    #[cfg_attr(feature = "schema", schema(value_type = Option<f64>))]
    pub crossing_s: f64,
    /// Layers whose rows cross to the CPU and back every token.
    pub crossings: u32,
}

/// Bytes placed in each tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Totals {
    /// Cores and experts in VRAM: at most `vram_free - vram_reserve`.
    pub vram_bytes: u64,
    pub vram_expert_bytes: u64,
    /// Page-locked experts; `pinned_bytes + ram_bytes <= ram_free - ram_reserve`.
    pub pinned_bytes: u64,
    /// Experts in pageable RAM.
    pub ram_bytes: u64,
    /// Experts read from storage on use.
    pub storage_bytes: u64,
}

/// One MoE layer of a [`PlacementSummary`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct LayerSummary {
    pub layer: usize,
    pub experts: u32,
    pub in_vram: u32,
    pub on_cpu: u32,
    /// Computed on the GPU from outside VRAM (uploaded on each use).
    pub streamed: u32,
    /// Living on storage (either side).
    pub from_storage: u32,
    /// The layer's predicted expert seconds per token (`null` when infinite).
    #[cfg_attr(feature = "schema", schema(value_type = Option<f64>))]
    pub seconds: f64,
}

/// What `strata bench --json` and `/api/ps` show of a plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct PlacementSummary {
    pub mode: Mode,
    pub totals: Totals,
    pub decode: DecodeTime,
    /// The MoE layers, in order.
    pub layers: Vec<LayerSummary>,
}

/// An expert whose placement differs between two plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub id: ExpertId,
    pub from: Placement,
    pub to: Placement,
}

/// Every routed expert's [`Placement`], with what it predicts. See the module docs.
#[derive(Clone, Debug)]
pub struct PlacementPlan {
    inputs: PlacementInputs,
    /// `freq[layer][expert]`: per-token use probabilities, a layer's summing to its top-k.
    freq: Vec<Vec<f64>>,
    /// `placements[layer][expert]`; empty for a dense layer.
    placements: Vec<Vec<Placement>>,
    /// Each layer's predicted expert seconds per token.
    layer_s: Vec<f64>,
    decode: DecodeTime,
}

fn core_bytes(layers: &[LayerShape]) -> u64 {
    layers.iter().fold(0u64, |a, s| a.saturating_add(s.core_bytes))
}

fn layer_frequencies(inputs: &PlacementInputs) -> Vec<Vec<f64>> {
    let stats = &inputs.stats;
    inputs.layers.iter().enumerate().map(|(l, s)| frequencies(stats.layer(l), s.experts as usize, s.top_k)).collect()
}

fn validate(inputs: &PlacementInputs) -> Result<(), PlacementError> {
    let r = &inputs.rates;
    let rates = [
        ("h2d", r.h2d),
        ("storage", r.storage),
        ("cpu", r.cpu),
        ("gpu", r.gpu),
        ("cpu_gemm", r.cpu_gemm),
        ("gpu_gemm", r.gpu_gemm),
        ("crossing_s", r.crossing_s),
    ];
    if let Some(&(field, value)) = rates.iter().find(|(_, v)| v.is_nan() || *v < 0.0) {
        return Err(PlacementError::Rate { field, value });
    }
    let (got, layers) = (inputs.stats.weights.len(), inputs.layers.len());
    if got > layers {
        return Err(PlacementError::StatsLayers { got, layers });
    }
    for (layer, s) in inputs.layers.iter().enumerate() {
        if s.experts > MAX_EXPERTS {
            return Err(PlacementError::TooManyExperts { layer, experts: s.experts });
        }
        if s.experts > 0 && !(1..=s.experts).contains(&s.top_k) {
            return Err(PlacementError::TopK { layer, top_k: s.top_k, experts: s.experts });
        }
        let w = inputs.stats.layer(layer);
        if !w.is_empty() && w.len() != s.experts as usize {
            return Err(PlacementError::StatsLen { layer, got: w.len(), experts: s.experts });
        }
        if let Some(expert) = w.iter().position(|x| !x.is_finite() || *x < 0.0) {
            return Err(PlacementError::Weight { layer, expert, value: w[expert] });
        }
    }
    Ok(())
}

impl PlacementPlan {
    /// Plans `inputs` (see the module docs). Errors name the input at fault, but for
    /// [`PlacementError::CoresExceedVram`], a fact of the machine: then the layers
    /// themselves must stream ([`super::plan::ResidencyPlan`]).
    pub fn new(inputs: PlacementInputs) -> Result<Self, PlacementError> {
        validate(&inputs)?;
        let freq = layer_frequencies(&inputs);
        let planner = Planner::new(&inputs, &freq)?;
        let moe = inputs.layers.iter().filter(|s| s.experts > 0).count();
        let placements = match inputs.mode {
            Mode::CpuMoe => planner.place(&planner.split(moe)),
            Mode::NCpuMoe(n) => planner.place(&planner.split(n as usize)),
            Mode::Auto => {
                let free = planner.place(&vec![Sides::Free; inputs.layers.len()]);
                let mut best = (planner.evaluate(&free).0.total_s, free);
                for n in 0..=moe {
                    let fixed = planner.place(&planner.split(n));
                    let t = planner.evaluate(&fixed).0.total_s;
                    if t < best.0 {
                        best = (t, fixed);
                    }
                }
                best.1
            }
        };
        let (decode, layer_s) = planner.evaluate(&placements);
        Ok(PlacementPlan { inputs, freq, placements, layer_s, decode })
    }

    /// The plan for new router statistics, the rest of the inputs as they were: the experts
    /// now hot move into VRAM, those gone cold out ([`changes`](Self::changes) lists them).
    pub fn replan(&self, stats: RouterStats) -> Result<PlacementPlan, PlacementError> {
        PlacementPlan::new(PlacementInputs { stats, ..self.inputs.clone() })
    }

    /// What this plan's placements would take per token under other statistics (to weigh
    /// a [`replan`](Self::replan) against staying put).
    pub fn predict(&self, stats: &RouterStats) -> Result<DecodeTime, PlacementError> {
        let inputs = PlacementInputs { stats: stats.clone(), ..self.inputs.clone() };
        validate(&inputs)?;
        let freq = layer_frequencies(&inputs);
        Ok(Planner::new(&inputs, &freq)?.evaluate(&self.placements).0)
    }

    /// The experts whose placement differs in `next` (over the experts both plans have).
    pub fn changes(&self, next: &PlacementPlan) -> Vec<Change> {
        let mut out = Vec::new();
        for (l, (a, b)) in self.placements.iter().zip(&next.placements).enumerate() {
            for (e, (&from, &to)) in a.iter().zip(b).enumerate().filter(|(_, (a, b))| a != b) {
                out.push(Change { id: ExpertId::new(l as u32, e as u32), from, to });
            }
        }
        out
    }

    pub fn inputs(&self) -> &PlacementInputs {
        &self.inputs
    }

    /// An expert's placement; `None` for one the model does not have.
    pub fn placement(&self, id: ExpertId) -> Option<Placement> {
        self.placements.get(id.layer as usize)?.get(id.expert as usize).copied()
    }

    /// Layer `l`'s placements by expert (empty for a dense layer or one that does not exist).
    pub fn layer(&self, l: usize) -> &[Placement] {
        self.placements.get(l).map_or(&[], Vec::as_slice)
    }

    /// Layer `l`'s per-token use probabilities by expert, as the plan read the statistics.
    pub fn frequencies(&self, l: usize) -> &[f64] {
        self.freq.get(l).map_or(&[], Vec::as_slice)
    }

    pub fn decode(&self) -> DecodeTime {
        self.decode
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals { vram_bytes: core_bytes(&self.inputs.layers), ..Totals::default() };
        for (shape, layer) in self.inputs.layers.iter().zip(&self.placements) {
            for p in layer {
                let field = match p.home {
                    Tier::Vram => &mut t.vram_expert_bytes,
                    Tier::Pinned => &mut t.pinned_bytes,
                    Tier::Ram => &mut t.ram_bytes,
                    Tier::Storage => &mut t.storage_bytes,
                };
                *field = field.saturating_add(shape.expert_bytes);
            }
        }
        t.vram_bytes = t.vram_bytes.saturating_add(t.vram_expert_bytes);
        t
    }

    pub fn summary(&self) -> PlacementSummary {
        let layers = (self.inputs.layers.iter().enumerate())
            .filter(|(_, s)| s.experts > 0)
            .map(|(l, s)| {
                let count = |f: &dyn Fn(&Placement) -> bool| self.placements[l].iter().filter(|p| f(p)).count() as u32;
                LayerSummary {
                    layer: l,
                    experts: s.experts,
                    in_vram: count(&|p| p.home == Tier::Vram),
                    on_cpu: count(&|p| p.compute == Side::Cpu),
                    streamed: count(&|p| p.compute == Side::Gpu && p.home != Tier::Vram),
                    from_storage: count(&|p| p.home == Tier::Storage),
                    seconds: self.layer_s[l],
                }
            })
            .collect();
        PlacementSummary { mode: self.inputs.mode, totals: self.totals(), decode: self.decode, layers }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::at;
    use testkit::*;

    #[test]
    fn cpu_moe_computes_every_routed_expert_on_the_cpu() {
        let plan = with_mode(&a3b(8 * GB, 64 * GB, zipf(48, 128, 1)), Mode::CpuMoe);
        check(&plan);
        assert!(all(&plan).all(|(_, p, _)| p == at(Tier::Ram, Side::Cpu)));
        assert_eq!(plan.totals().vram_expert_bytes, 0);
        assert_eq!(plan.decode().crossings, 48);
        assert_eq!(plan.decode().h2d_s, 0.0);
        // With too little RAM for them all, the coldest live on storage, still on the CPU.
        let plan = with_mode(&a3b(8 * GB, 14 * GB, zipf(48, 128, 1)), Mode::CpuMoe);
        check(&plan);
        assert!(all(&plan).all(|(_, p, _)| p.compute == Side::Cpu));
        assert!(all(&plan).any(|(_, p, _)| p.home == Tier::Storage));
    }

    #[test]
    fn n_cpu_moe_takes_exactly_the_first_n_moe_layers() {
        // A leading dense layer, as DeepSeek's: not a MoE layer, so not counted.
        let mut inputs = a3b(8 * GB, 64 * GB, RouterStats::uniform());
        inputs.layers.insert(0, LayerShape { core_bytes: 300 * MB, ..LayerShape::default() });
        for n in [0, 1, 10, 48, 100] {
            let plan = with_mode(&inputs, Mode::NCpuMoe(n));
            check(&plan);
            for (id, p, _) in all(&plan) {
                let cpu = (id.layer as usize) <= n as usize;
                assert_eq!(p.compute == Side::Cpu, cpu, "n {n}: {id:?} {p:?}");
                // The GPU's layers keep their hottest experts in VRAM and upload the rest.
                assert!(cpu || matches!(p.home, Tier::Vram | Tier::Pinned), "n {n}: {id:?} {p:?}");
            }
            assert_eq!(plan.decode().crossings, n.min(48));
        }
        assert!(with_mode(&inputs, Mode::NCpuMoe(48)).layer(0).is_empty());
    }

    #[test]
    fn a_shift_in_the_statistics_moves_experts_between_vram_and_the_cpu() {
        let before = PlacementPlan::new(a3b(8 * GB, 64 * GB, zipf(48, 128, 5))).unwrap();
        // The same skew over other experts: what was hot is now mostly cold.
        let shifted = zipf(48, 128, 6);
        let after = before.replan(shifted.clone()).unwrap();
        check(&after);
        assert!(hottest_in_vram(&after));
        let changes = before.changes(&after);
        let into = changes.iter().filter(|c| c.to.home == Tier::Vram).count();
        let out = changes.iter().filter(|c| c.from.home == Tier::Vram).count();
        assert!(into > 500 && into == out, "{into} in, {out} out");
        // What left VRAM went to the CPU or the GPU's uploads from RAM, and vice versa.
        assert!(changes.iter().any(|c| c.from.home == Tier::Vram && c.to == at(Tier::Ram, Side::Cpu)));
        assert!(changes.iter().any(|c| c.from == at(Tier::Ram, Side::Cpu) && c.to.home == Tier::Vram));
        // The new hottest expert of each layer is in VRAM; the old plan would be slower now.
        for l in 0..48 {
            let f = after.frequencies(l);
            let hot = (0..128).max_by(|&a, &b| f[a].total_cmp(&f[b])).unwrap();
            assert_eq!(after.layer(l)[hot].home, Tier::Vram);
        }
        let stay = before.predict(&shifted).unwrap().total_s;
        assert!(after.decode().total_s < 0.9 * stay, "{} vs {stay}", after.decode().total_s);
        // Back to the old statistics: back to the old plan.
        assert!(after.replan(before.inputs().stats.clone()).unwrap().changes(&before).is_empty());
    }

    #[test]
    fn degenerate_inputs_plan_without_panics_and_errors_name_the_input() {
        let empty = PlacementPlan::new(PlacementInputs::default()).unwrap();
        assert_eq!((empty.decode(), empty.totals().vram_bytes), (DecodeTime::default(), 0));
        assert!(empty.summary().layers.is_empty() && empty.prefill(0, 8).is_none());
        // Dense layers only: the cores, no experts.
        let dense = PlacementInputs {
            layers: vec![LayerShape { core_bytes: 10, ..LayerShape::default() }; 3],
            budgets: Budgets { vram_free: 30, ..Budgets::default() },
            ..PlacementInputs::default()
        };
        let plan = PlacementPlan::new(dense).unwrap();
        assert_eq!((plan.totals().vram_bytes, plan.decode().total_s), (30, 0.0));
        // No rate measured: every path is infinitely slow, and the plan says so.
        let mut inputs = a3b(8 * GB, 64 * GB, RouterStats::uniform());
        inputs.rates = Rates::default();
        for mode in [Mode::Auto, Mode::CpuMoe, Mode::NCpuMoe(3)] {
            let plan = with_mode(&inputs, mode);
            check(&plan);
            assert_eq!(plan.decode().total_s, f64::INFINITY);
            assert!(serde_json::to_value(plan.summary()).unwrap()["decode"]["total_s"].is_null());
            assert!(!plan.prefill(0, 512).unwrap().planned_s.is_nan());
        }
        // Only the GPU measured: no CPU and no uploads, so VRAM, then nothing better.
        inputs.rates = Rates { gpu: 800e9, ..Rates::default() };
        let plan = with_mode(&inputs, Mode::Auto);
        assert!(all(&plan).all(|(_, p, _)| p.compute == Side::Gpu));
        // The errors.
        let bad = |f: fn(&mut PlacementInputs)| {
            let mut inputs = a3b(8 * GB, 64 * GB, RouterStats::uniform());
            f(&mut inputs);
            PlacementPlan::new(inputs).unwrap_err()
        };
        assert_eq!(bad(|i| i.rates.cpu = f64::NAN).to_string().split(' ').next(), Some("`cpu`"));
        assert!(matches!(bad(|i| i.rates.h2d = -1.0), PlacementError::Rate { field: "h2d", .. }));
        assert!(matches!(bad(|i| i.layers[3].top_k = 0), PlacementError::TopK { layer: 3, .. }));
        assert!(matches!(bad(|i| i.layers[3].top_k = 129), PlacementError::TopK { layer: 3, .. }));
        assert!(matches!(bad(|i| i.layers[0].experts = MAX_EXPERTS + 1), PlacementError::TooManyExperts { .. }));
        assert!(matches!(bad(|i| i.stats.weights = vec![vec![1.0; 3]]), PlacementError::StatsLen { got: 3, .. }));
        assert!(matches!(bad(|i| i.stats.weights = vec![Vec::new(); 49]), PlacementError::StatsLayers { got: 49, .. }));
        let inf = |i: &mut PlacementInputs| i.stats.weights = vec![vec![f64::INFINITY; 128]];
        assert!(matches!(bad(inf), PlacementError::Weight { layer: 0, expert: 0, .. }));
    }

    #[test]
    fn summary_serializes() {
        let plan = PlacementPlan::new(a3b(8 * GB, 64 * GB, RouterStats::uniform())).unwrap();
        let json = serde_json::to_value(plan.summary()).unwrap();
        assert_eq!(json["mode"], "auto");
        assert_eq!(json["layers"].as_array().unwrap().len(), 48);
        let l = &json["layers"][0];
        let n = |k: &str| l[k].as_u64().unwrap();
        assert_eq!(n("in_vram") + n("on_cpu") + n("streamed"), 128);
        assert_eq!(json["totals"]["vram_bytes"], plan.totals().vram_bytes);
        let fixed = with_mode(plan.inputs(), Mode::NCpuMoe(4));
        assert_eq!(serde_json::to_value(fixed.summary()).unwrap()["mode"], serde_json::json!({"n_cpu_moe": 4}));
        let p = serde_json::to_value(at(Tier::Pinned, Side::Gpu)).unwrap();
        assert_eq!(p, serde_json::json!({"home": "pinned", "compute": "gpu"}));
    }
}
