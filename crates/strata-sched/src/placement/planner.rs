//! The planner of [`super`]: the rule of its module docs over validated inputs (steps 1-4,
//! the fixed splits), and the decode time a set of placements predicts.

use super::cost::{Unit, balance, layer_time, saving_per_byte, scaled, secs};
use super::{DecodeTime, ExpertId, LayerShape, Placement, PlacementError, PlacementInputs, Side, Tier, core_bytes};

/// Which sides a layer's experts may compute on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sides {
    Gpu,
    Cpu,
    Free,
}

/// The planner over validated inputs and their frequencies.
pub(super) struct Planner<'a> {
    inputs: &'a PlacementInputs,
    freq: &'a [Vec<f64>],
    /// Per layer: what one use of one of its experts costs on each path.
    units: Vec<Unit>,
    /// Bytes of VRAM for experts (after the reserve and the cores), and of RAM.
    vram: u64,
    ram: u64,
    /// One layer's crossing at decode (one row), seconds.
    crossing: f64,
}

/// A candidate of a fill: admitted by `value`, then frequency, then id.
struct Candidate {
    value: f64,
    freq: f64,
    id: ExpertId,
    bytes: u64,
}

/// Admits the candidates whose value is >= 0, best first, each while it fits what is left
/// of `budget` (one that does not fit is skipped for the smaller ones after it).
fn fill(mut cands: Vec<Candidate>, budget: u64) -> Vec<ExpertId> {
    cands.retain(|c| c.value >= 0.0);
    cands.sort_by(|a, b| b.value.total_cmp(&a.value).then(b.freq.total_cmp(&a.freq)).then(a.id.cmp(&b.id)));
    let mut left = budget;
    cands
        .into_iter()
        .filter(|c| {
            let fits = c.bytes <= left;
            left -= if fits { c.bytes } else { 0 };
            fits
        })
        .map(|c| c.id)
        .collect()
}

pub(super) const fn at(home: Tier, compute: Side) -> Placement {
    Placement { home, compute }
}

impl<'a> Planner<'a> {
    /// Over validated `inputs` and their frequencies.
    pub(super) fn new(inputs: &'a PlacementInputs, freq: &'a [Vec<f64>]) -> Result<Self, PlacementError> {
        let (b, r) = (inputs.budgets, &inputs.rates);
        let cores = core_bytes(&inputs.layers);
        let available = b.vram_free.saturating_sub(b.vram_reserve);
        if cores > available {
            return Err(PlacementError::CoresExceedVram { cores, available });
        }
        Ok(Planner {
            inputs,
            freq,
            units: inputs.layers.iter().map(|s| Unit::new(r, s.expert_bytes)).collect(),
            vram: available - cores,
            ram: b.ram_free.saturating_sub(b.ram_reserve),
            crossing: r.crossing_s + secs(r.row_bytes as f64, r.h2d),
        })
    }

    /// A candidate per expert for which `keep(layer, expert)`, valued `value(layer, freq)`.
    fn candidates(&self, keep: impl Fn(usize, usize) -> bool, value: impl Fn(usize, f64) -> f64) -> Vec<Candidate> {
        let mut out = Vec::new();
        for (l, shape) in self.inputs.layers.iter().enumerate() {
            for e in (0..shape.experts as usize).filter(|&e| keep(l, e)) {
                let freq = self.freq[l][e];
                let id = ExpertId::new(l as u32, e as u32);
                out.push(Candidate { value: value(l, freq), freq, id, bytes: shape.expert_bytes });
            }
        }
        out
    }

    /// The sides of a fixed split: the first `n` MoE layers on the CPU, the rest on the GPU.
    pub(super) fn split(&self, n: usize) -> Vec<Sides> {
        let mut moe = 0;
        let side = |s: &LayerShape| {
            moe += usize::from(s.experts > 0);
            if s.experts > 0 && moe <= n { Sides::Cpu } else { Sides::Gpu }
        };
        self.inputs.layers.iter().map(side).collect()
    }

    /// Steps 1-4 of the module docs, each layer's experts on `sides`.
    pub(super) fn place(&self, sides: &[Sides]) -> Vec<Vec<Placement>> {
        let layers = &self.inputs.layers;
        let mut out: Vec<Vec<Placement>> =
            layers.iter().map(|s| vec![at(Tier::Storage, Side::Gpu); s.experts as usize]).collect();
        let bytes = |l: usize| layers[l].expert_bytes;
        let host = |l: usize| self.units[l].estimate(sides[l], Tier::Ram);
        let vram_value = |l, f| saving_per_byte(f, host(l), self.units[l].gpu, bytes(l));
        for id in fill(self.candidates(|l, _| sides[l] != Sides::Cpu, vram_value), self.vram) {
            out[id.layer as usize][id.expert as usize] = at(Tier::Vram, Side::Gpu);
        }
        let storage = |l: usize| self.units[l].estimate(sides[l], Tier::Storage);
        let ram_value = |l, f| saving_per_byte(f, storage(l), host(l), bytes(l));
        let outside = self.candidates(|l, e| out[l][e].home != Tier::Vram, ram_value);
        for id in fill(outside, self.ram) {
            out[id.layer as usize][id.expert as usize].home = Tier::Ram;
        }
        for (l, side) in sides.iter().enumerate() {
            match side {
                Sides::Gpu => {}
                Sides::Cpu => out[l].iter_mut().for_each(|p| p.compute = Side::Cpu),
                Sides::Free => self.balance(l, &mut out[l]),
            }
        }
        let on_gpu_from_ram = |l: usize, e: usize| out[l][e] == at(Tier::Ram, Side::Gpu);
        let pinned = self.candidates(on_gpu_from_ram, |_, f| f);
        for id in fill(pinned, self.inputs.budgets.pinned_max) {
            out[id.layer as usize][id.expert as usize].home = Tier::Pinned;
        }
        out
    }

    /// Step 3 for layer `l`: the sides of its experts outside VRAM.
    fn balance(&self, l: usize, layer: &mut [Placement]) {
        let u = self.units[l];
        let freq = &self.freq[l];
        let base: f64 = (0..layer.len()).filter(|&e| layer[e].home == Tier::Vram).map(|e| scaled(freq[e], u.gpu)).sum();
        let outside: Vec<usize> = (0..layer.len()).filter(|&e| layer[e].home != Tier::Vram).collect();
        let items: Vec<(f64, f64)> = outside
            .iter()
            .map(|&e| {
                let side = |compute| scaled(freq[e], u.cost(at(layer[e].home, compute)));
                (side(Side::Gpu), side(Side::Cpu))
            })
            .collect();
        for (&e, on_cpu) in outside.iter().zip(balance(base, &items, self.crossing)) {
            layer[e].compute = if on_cpu { Side::Cpu } else { Side::Gpu };
        }
    }

    /// The predicted decode time of `placements` (under the planner's frequencies), and each
    /// layer's part.
    pub(super) fn evaluate(&self, placements: &[Vec<Placement>]) -> (DecodeTime, Vec<f64>) {
        let mut t = DecodeTime::default();
        let mut per_layer = Vec::with_capacity(placements.len());
        for (l, layer) in placements.iter().enumerate() {
            let u = self.units[l];
            let (mut gpu, mut cpu, mut on_cpu) = (0.0, 0.0, 0);
            for (p, &f) in layer.iter().zip(&self.freq[l]) {
                let cost = scaled(f, u.cost(*p));
                if p.home == Tier::Storage {
                    t.storage_s += scaled(f, u.read);
                }
                match p.compute {
                    Side::Gpu => {
                        gpu += cost;
                        t.gpu_s += scaled(f, u.gpu);
                        t.h2d_s += if p.home == Tier::Vram { 0.0 } else { scaled(f, u.h2d) };
                    }
                    Side::Cpu => {
                        cpu += cost;
                        on_cpu += 1;
                        t.cpu_s += scaled(f, u.cpu);
                    }
                }
            }
            if on_cpu > 0 {
                t.crossings += 1;
                t.crossing_s += self.crossing;
            }
            let s = layer_time(gpu, cpu, on_cpu, self.crossing);
            t.total_s += s;
            per_layer.push(s);
        }
        (t, per_layer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::testkit::*;
    use crate::placement::{Budgets, Mode, PlacementPlan, Rates, RouterStats};

    /// Uniform, zero, or skewed weights, a layer at a time.
    fn random_stats(rng: &mut XorShift, layers: &[LayerShape]) -> RouterStats {
        let weights = (layers.iter())
            .map(|s| match rng.below(3) {
                0 => Vec::new(),
                _ => (0..s.experts).map(|_| rng.pick(&[0.0, 0.0, 1.0, 3.0, 50.0, 1e6])).collect(),
            })
            .collect();
        RouterStats { weights }
    }

    fn random_inputs(rng: &mut XorShift) -> PlacementInputs {
        let layers: Vec<LayerShape> = (0..rng.below(7))
            .map(|_| {
                let experts = rng.pick(&[0, 1, 2, 5, 16, 24]);
                let top_k = 1 + rng.below(u64::from(experts).max(1)) as u32;
                LayerShape { core_bytes: rng.below(500), experts, expert_bytes: rng.below(1000), top_k }
            })
            .collect();
        let total: u64 = layers.iter().map(|s| s.core_bytes + u64::from(s.experts) * s.expert_bytes).sum();
        let stats = random_stats(rng, &layers);
        let mut rate = |scale: f64| rng.pick(&[0.0, 0.3, 1.0, 10.0, f64::INFINITY]) * scale;
        let rates = Rates {
            h2d: rate(1e3),
            storage: rate(1e2),
            cpu: rate(1e3),
            gpu: rate(1e4),
            cpu_gemm: rate(1e4),
            gpu_gemm: rate(1e6),
            crossing_s: rate(1e-2),
            row_bytes: 16,
        };
        let budgets = Budgets {
            vram_free: rng.below(total + 200),
            vram_reserve: rng.below(100),
            ram_free: rng.below(total + 200),
            ram_reserve: rng.below(100),
            pinned_max: rng.pick(&[0, 300, u64::MAX]),
        };
        let mode =
            rng.pick(&[Mode::Auto, Mode::Auto, Mode::CpuMoe, Mode::NCpuMoe(0), Mode::NCpuMoe(2), Mode::NCpuMoe(9)]);
        PlacementInputs { layers, budgets, rates, stats, mode }
    }

    #[test]
    fn never_over_budget_and_auto_never_slower_than_a_fixed_split_on_random_inputs() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut planned = 0;
        for case in 0..600 {
            let inputs = random_inputs(&mut rng);
            let plan = match PlacementPlan::new(inputs.clone()) {
                Ok(plan) => plan,
                Err(PlacementError::CoresExceedVram { cores, available }) => {
                    assert!(
                        cores > available
                            && available == inputs.budgets.vram_free.saturating_sub(inputs.budgets.vram_reserve)
                    );
                    continue;
                }
                Err(e) => panic!("case {case}: {e}"),
            };
            planned += 1;
            check(&plan);
            assert_eq!(plan.predict(&inputs.stats).unwrap(), plan.decode());
            let moe: Vec<usize> = (0..inputs.layers.len()).filter(|&l| inputs.layers[l].experts > 0).collect();
            match inputs.mode {
                Mode::Auto => {
                    for n in 0..=moe.len() as u32 {
                        let fixed = with_mode(&inputs, Mode::NCpuMoe(n));
                        check(&fixed);
                        assert!(plan.decode().total_s <= fixed.decode().total_s, "case {case}, n {n}");
                    }
                }
                Mode::CpuMoe => assert!(all(&plan).all(|(_, p, _)| p.compute == Side::Cpu)),
                Mode::NCpuMoe(n) => {
                    for (id, p, _) in all(&plan) {
                        let cpu = moe.iter().position(|&l| l == id.layer as usize).unwrap() < n as usize;
                        assert_eq!(p.compute == Side::Cpu, cpu, "case {case}: {id:?}");
                    }
                }
            }
            // A replan under other statistics holds the budgets too.
            let replan = plan.replan(random_stats(&mut rng, &inputs.layers)).unwrap();
            check(&replan);
            assert_eq!(plan.changes(&replan).is_empty(), all(&plan).map(|x| x.1).eq(all(&replan).map(|x| x.1)));
        }
        assert!(planned > 300, "{planned} of 600 planned");
    }

    #[test]
    fn auto_with_everything_fitting_vram_is_all_gpu() {
        let plan = PlacementPlan::new(a3b(24 * GB, 64 * GB, zipf(48, 128, 2))).unwrap();
        check(&plan);
        assert!(all(&plan).all(|(_, p, _)| p == at(Tier::Vram, Side::Gpu)));
        let d = plan.decode();
        assert_eq!((d.crossings, d.cpu_s, d.h2d_s, d.storage_s), (0, 0.0, 0.0, 0.0));
        // Top-8 of 2.65 MB at 800 GB/s, 48 layers.
        assert!((d.total_s - 48.0 * 8.0 * 2.65e6 / 800e9).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn auto_on_a_pcie4_box_caches_the_hottest_and_computes_the_rest_beside_the_gpu() {
        for stats in [RouterStats::uniform(), zipf(48, 128, 3)] {
            let inputs = a3b(8 * GB, 64 * GB, stats);
            let plan = PlacementPlan::new(inputs.clone()).unwrap();
            check(&plan);
            assert!(hottest_in_vram(&plan));
            let t = plan.totals();
            // VRAM is full: less than one expert's room is left.
            assert!(t.vram_bytes + 2_650_000 > 7 * GB && t.vram_bytes <= 7 * GB, "{t:?}");
            assert_eq!(t.storage_bytes, 0);
            // Of what VRAM does not hold, the CPU computes most uses from RAM; the GPU
            // uploads the rest while the CPU works.
            let outside =
                |side| all(&plan).filter(move |(_, p, _)| p.home != Tier::Vram && p.compute == side).map(|x| x.2);
            let (cpu, gpu): (f64, f64) = (outside(Side::Cpu).sum(), outside(Side::Gpu).sum());
            assert!(cpu > gpu && gpu > 0.0, "cpu {cpu}, gpu {gpu}");
            assert!(all(&plan).all(|(_, p, _)| p.compute == Side::Gpu || p.home == Tier::Ram));
            let streamed = with_mode(&inputs, Mode::NCpuMoe(0)).decode().total_s;
            let cpu_moe = with_mode(&inputs, Mode::CpuMoe).decode().total_s;
            let auto = plan.decode().total_s;
            eprintln!("A3B on 8 GB: auto {auto:.4} s/token, all-GPU streamed {streamed:.4}, all-CPU {cpu_moe:.4}");
            assert!(auto < 0.8 * streamed && auto < 0.8 * cpu_moe, "auto {auto}, streamed {streamed}, cpu {cpu_moe}");
        }
    }

    #[test]
    fn skewed_statistics_put_the_hottest_experts_in_vram_first() {
        let plan = PlacementPlan::new(a3b(8 * GB, 64 * GB, zipf(48, 128, 4))).unwrap();
        assert!(hottest_in_vram(&plan));
        // About 40% of the experts cover far more than 40% of the uses.
        let in_vram: f64 = all(&plan).filter(|(_, p, _)| p.home == Tier::Vram).map(|x| x.2).sum();
        assert!(in_vram / (48.0 * 8.0) > 0.6, "{in_vram}");
        // Every layer keeps its own hottest in VRAM, none all of its experts.
        let s = plan.summary();
        assert!(s.layers.iter().all(|l| l.in_vram > 0 && l.in_vram < 128), "{:?}", s.layers);
    }

    #[test]
    fn ram_too_small_sends_the_coldest_experts_to_storage() {
        // 4 GB of RAM for ~10 GB of experts VRAM does not hold.
        let plan = PlacementPlan::new(a3b(8 * GB, 10 * GB, zipf(48, 128, 7))).unwrap();
        check(&plan);
        let t = plan.totals();
        assert!(t.storage_bytes > 5 * GB && t.pinned_bytes + t.ram_bytes + 2_650_000 > 4 * GB, "{t:?}");
        let hottest_stored = all(&plan).filter(|(_, p, _)| p.home == Tier::Storage).map(|x| x.2).fold(0.0, f64::max);
        let coldest_held = all(&plan).filter(|(_, p, _)| p.home != Tier::Storage).map(|x| x.2).fold(1.0, f64::min);
        assert!(hottest_stored <= coldest_held, "{hottest_stored} > {coldest_held}");
        assert!(plan.decode().storage_s > 0.0);
    }

    #[test]
    fn vram_for_the_cores_alone_holds_no_expert_and_less_is_an_error() {
        let cores = 48 * 11 * MB;
        let plan = PlacementPlan::new(a3b(GB + cores, 64 * GB, RouterStats::uniform())).unwrap();
        check(&plan);
        assert_eq!(plan.totals().vram_bytes, cores);
        assert!(plan.summary().layers.iter().all(|l| l.in_vram == 0 && l.on_cpu > 64));
        let err = PlacementPlan::new(a3b(GB + cores - 1, 64 * GB, RouterStats::uniform())).unwrap_err();
        assert_eq!(err, PlacementError::CoresExceedVram { cores, available: cores - 1 });
        assert!(PlacementPlan::new(a3b(0, 64 * GB, RouterStats::uniform())).is_err());
    }

    #[test]
    fn a_crossing_dearer_than_the_cpu_saves_keeps_every_layer_on_the_gpu() {
        let mut inputs = a3b(8 * GB, 64 * GB, RouterStats::uniform());
        inputs.rates.crossing_s = 0.01;
        let plan = PlacementPlan::new(inputs).unwrap();
        assert!(all(&plan).all(|(_, p, _)| p.compute == Side::Gpu));
        assert_eq!(plan.decode().crossings, 0);
    }
}
