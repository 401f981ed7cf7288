//! What the placement tests share: a small deterministic RNG, an A3B-shaped model on a
//! PCIe-4 box, Zipf statistics, and the invariants every plan keeps.

use super::*;

pub(super) const MB: u64 = 1_000_000;
pub(super) const GB: u64 = 1_000_000_000;

/// xorshift64: enough randomness for property tests, reproducible from the seed.
pub(super) struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// A PCIe-4 desktop: 25 GB/s uploads, an NVMe at 3 GB/s, a CPU computing a Q4_K
/// expert at 40 GB/s (faster than uploading it: 1/25 + 1/800 s/GB), a GPU at 800 GB/s.
pub(super) fn pcie4() -> Rates {
    Rates {
        h2d: 25e9,
        storage: 3e9,
        cpu: 40e9,
        gpu: 800e9,
        cpu_gemm: 1.4e11,
        gpu_gemm: 2.8e13,
        crossing_s: 30e-6,
        row_bytes: 2 * 2048 * 4,
    }
}

/// Qwen3-30B-A3B at Q4_K: 48 layers of 128 experts of 2.65 MB, top-8, 11 MB cores; a
/// card with `vram` free (1 GB kept for KV and activations), `ram` free (6 GB kept).
pub(super) fn a3b(vram: u64, ram: u64, stats: RouterStats) -> PlacementInputs {
    PlacementInputs {
        layers: vec![LayerShape { core_bytes: 11 * MB, experts: 128, expert_bytes: 2_650_000, top_k: 8 }; 48],
        budgets: Budgets {
            vram_free: vram,
            vram_reserve: GB,
            ram_free: ram,
            ram_reserve: 6 * GB,
            pinned_max: u64::MAX,
        },
        rates: pcie4(),
        stats,
        mode: Mode::Auto,
    }
}

/// Zipf(1) use counts over `experts`, ranked by a permutation of its own per layer
/// (`seed` picks them).
pub(super) fn zipf(layers: usize, experts: usize, seed: u64) -> RouterStats {
    let mut rng = XorShift(seed);
    let weights = (0..layers)
        .map(|_| {
            let mut rank: Vec<usize> = (0..experts).collect();
            for i in (1..experts).rev() {
                rank.swap(i, rng.below(i as u64 + 1) as usize);
            }
            rank.iter().map(|&r| 1.0 / (r + 1) as f64).collect()
        })
        .collect();
    RouterStats { weights }
}

pub(super) fn with_mode(inputs: &PlacementInputs, mode: Mode) -> PlacementPlan {
    PlacementPlan::new(PlacementInputs { mode, ..inputs.clone() }).unwrap()
}

pub(super) fn all(plan: &PlacementPlan) -> impl Iterator<Item = (ExpertId, Placement, f64)> + '_ {
    (0..plan.inputs().layers.len()).flat_map(move |l| {
        let f = plan.frequencies(l);
        plan.layer(l).iter().enumerate().map(move |(e, &p)| (ExpertId::new(l as u32, e as u32), p, f[e]))
    })
}

/// The budgets hold, the totals add up, and homes agree with sides.
pub(super) fn check(plan: &PlacementPlan) {
    let (i, t) = (plan.inputs(), plan.totals());
    let b = i.budgets;
    assert!(t.vram_bytes <= b.vram_free.saturating_sub(b.vram_reserve), "{t:?} {b:?}");
    assert!(t.pinned_bytes + t.ram_bytes <= b.ram_free.saturating_sub(b.ram_reserve), "{t:?} {b:?}");
    assert!(t.pinned_bytes <= b.pinned_max);
    let mut bytes = [0u64; 4];
    for (id, p, _) in all(plan) {
        bytes[Tier::ALL.iter().position(|&x| x == p.home).unwrap()] += i.layers[id.layer as usize].expert_bytes;
        assert!(p.home != Tier::Vram || p.compute == Side::Gpu, "{id:?} {p:?}");
        assert!(p.compute == Side::Gpu || matches!(p.home, Tier::Ram | Tier::Storage), "{id:?} {p:?}");
    }
    assert_eq!(bytes, [t.vram_expert_bytes, t.pinned_bytes, t.ram_bytes, t.storage_bytes]);
    assert_eq!(t.vram_bytes, core_bytes(&i.layers) + t.vram_expert_bytes);
    let d = plan.decode();
    for x in [d.total_s, d.gpu_s, d.cpu_s, d.h2d_s, d.storage_s, d.crossing_s] {
        assert!(x >= 0.0, "{d:?}");
    }
    let s = plan.summary();
    assert_eq!(s.layers.len(), i.layers.iter().filter(|l| l.experts > 0).count());
    assert_eq!(s.layers.iter().map(|l| l.seconds).sum::<f64>(), d.total_s);
}

/// Whether no expert outside VRAM is hotter than any in it, over every layer (for models
/// whose experts are all of one size).
pub(super) fn hottest_in_vram(plan: &PlacementPlan) -> bool {
    let (mut coldest_in, mut hottest_out) = (f64::INFINITY, 0.0f64);
    for (_, p, f) in all(plan) {
        if p.home == Tier::Vram {
            coldest_in = coldest_in.min(f);
        } else {
            hottest_out = hottest_out.max(f);
        }
    }
    coldest_in >= hottest_out
}
