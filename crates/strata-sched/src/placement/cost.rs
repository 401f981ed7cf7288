//! The placement plan's cost model (see [`super`]): seconds per use on each path, the
//! router's weights as per-token use probabilities, a layer's split between its sides, and
//! the prefill choice. Every cost is a number >= 0 or `+∞`, never NaN.

use super::planner::Sides;
use super::{Placement, PlacementPlan, Rates, Side, Tier};

/// `bytes / rate` seconds: 0 for no bytes, `+∞` at a rate of 0 (not measured).
pub(super) fn secs(bytes: f64, rate: f64) -> f64 {
    match () {
        _ if bytes == 0.0 => 0.0,
        _ if rate > 0.0 => bytes / rate,
        _ => f64::INFINITY,
    }
}

/// `f × s` for a probability (or count) `f`, 0 when `f` is 0 even for an infinite `s`.
pub(super) fn scaled(f: f64, s: f64) -> f64 {
    if f == 0.0 { 0.0 } else { f * s }
}

/// The expected seconds per token one byte saves when an expert of `bytes` used with
/// probability `f` costs `better` per use instead of `worse` (negative when it is worse).
pub(super) fn saving_per_byte(f: f64, worse: f64, better: f64, bytes: u64) -> f64 {
    if f == 0.0 || worse == better {
        return 0.0;
    }
    let saved = f * (worse - better);
    if bytes == 0 { saved.signum() * f64::INFINITY } else { saved / bytes as f64 }
}

/// A layer's expert seconds per token: its GPU side, or the slower of both sides once
/// `on_cpu > 0` experts compute on the CPU, whose side then includes the crossing `x`.
pub(super) fn layer_time(gpu: f64, cpu: f64, on_cpu: usize, x: f64) -> f64 {
    if on_cpu == 0 { gpu } else { gpu.max(cpu + x) }
}

/// What one use of one expert of a layer costs on each path at decode (one row), seconds.
#[derive(Clone, Copy, Debug)]
pub(super) struct Unit {
    /// The GPU computing it from VRAM.
    pub gpu: f64,
    /// Uploading it.
    pub h2d: f64,
    /// The CPU computing it from RAM.
    pub cpu: f64,
    /// Reading it from storage.
    pub read: f64,
}

impl Unit {
    pub fn new(r: &Rates, bytes: u64) -> Self {
        let b = bytes as f64;
        Unit { gpu: secs(b, r.gpu), h2d: secs(b, r.h2d), cpu: secs(b, r.cpu), read: secs(b, r.storage) }
    }

    /// Seconds of one use placed at `p`, on its side (the table in the module docs).
    pub fn cost(self, p: Placement) -> f64 {
        let read = if p.home == Tier::Storage { self.read } else { 0.0 };
        match p.compute {
            Side::Cpu => read + self.cpu,
            Side::Gpu if p.home == Tier::Vram => self.gpu,
            Side::Gpu => read + self.h2d + self.gpu,
        }
    }

    /// What a use from `home` (`Ram` or `Storage`) costs at best on `sides`: on `Free`,
    /// both sides sharing the work (`a·b / (a + b)`), as a balanced layer does.
    pub fn estimate(self, sides: Sides, home: Tier) -> f64 {
        let on = |compute| self.cost(Placement { home, compute });
        match sides {
            Sides::Gpu => on(Side::Gpu),
            Sides::Cpu => on(Side::Cpu),
            Sides::Free => match (on(Side::Cpu), on(Side::Gpu)) {
                (a, b) if a.is_infinite() => b,
                (a, b) if b.is_infinite() => a,
                (a, b) if a + b == 0.0 => 0.0,
                (a, b) => a * b / (a + b),
            },
        }
    }
}

/// Per-token use probabilities of a layer's `experts` experts from relative `weights`:
/// scaled to sum to `top_k`, none above 1 (an expert's excess goes to the others in
/// proportion to their weights, or evenly where they have none); uniform when `weights` is
/// empty or all 0. `weights` are finite and >= 0 (validated).
pub(super) fn frequencies(weights: &[f64], experts: usize, top_k: u32) -> Vec<f64> {
    let k = (top_k as usize).min(experts) as f64;
    let max = weights.iter().copied().fold(0.0, f64::max);
    let w: Vec<f64> = match max > 0.0 && weights.len() == experts {
        true => weights.iter().map(|x| x / max).collect(),
        false => vec![1.0; experts],
    };
    let mut f = vec![0.0; experts];
    let mut capped = vec![false; experts];
    // Each pass caps at least one more expert or ends; fewer than `k` are ever capped.
    for _ in 0..=experts {
        let free: Vec<usize> = (0..experts).filter(|&e| !capped[e]).collect();
        let left = k - (experts - free.len()) as f64;
        let mass: f64 = free.iter().map(|&e| w[e]).sum();
        let mut over = false;
        for &e in &free {
            f[e] = if mass > 0.0 { left * w[e] / mass } else { left / free.len() as f64 };
            if f[e] > 1.0 {
                (f[e], capped[e], over) = (1.0, true, true);
            }
        }
        if !over {
            break;
        }
    }
    f
}

/// A sum of costs >= 0 that may hold infinities, so that one can be taken out again.
#[derive(Clone, Copy, Debug, Default)]
struct Sum {
    finite: f64,
    infinite: u32,
}

impl Sum {
    fn add(mut self, s: f64) -> Self {
        if s.is_infinite() {
            self.infinite += 1
        } else {
            self.finite += s
        }
        self
    }

    fn sub(mut self, s: f64) -> Self {
        if s.is_infinite() {
            self.infinite -= 1
        } else {
            self.finite -= s
        }
        self
    }

    fn value(self) -> f64 {
        if self.infinite > 0 { f64::INFINITY } else { self.finite.max(0.0) }
    }
}

/// Whether `t` is (more than rounding) below `than`.
fn improves(t: f64, than: f64) -> bool {
    if than.is_infinite() { t.is_finite() } else { t < than * (1.0 - 1e-12) }
}

/// Which of a layer's experts outside VRAM compute on the CPU (step 3 of the module docs):
/// `items[i] = (gpu, cpu)`, expert i's expected seconds per token on each side; `base` the
/// GPU side's fixed part (the VRAM experts); `x` the crossing. From two starts, each
/// expert on its cheaper side and all on the GPU, the move that lowers [`layer_time`] most
/// while one does; the faster of the two ends (the GPU's on a tie).
pub(super) fn balance(base: f64, items: &[(f64, f64)], x: f64) -> Vec<bool> {
    let (gpu, gpu_t) = descend(base, items, x, vec![false; items.len()]);
    let (cheaper, cheaper_t) = descend(base, items, x, items.iter().map(|&(g, c)| c < g).collect());
    if cheaper_t < gpu_t { cheaper } else { gpu }
}

/// [`balance`] from `on_cpu`: the sides it ends on and their time.
fn descend(base: f64, items: &[(f64, f64)], x: f64, mut on_cpu: Vec<bool>) -> (Vec<bool>, f64) {
    let (mut gpu, mut cpu) = (Sum::default().add(base), Sum::default());
    for (&(g, c), &o) in items.iter().zip(&on_cpu) {
        (gpu, cpu) = if o { (gpu, cpu.add(c)) } else { (gpu.add(g), cpu) };
    }
    let mut n = on_cpu.iter().filter(|&&o| o).count();
    let flip = |i: usize, o: bool, gpu: Sum, cpu: Sum, n: usize| {
        let (g, c) = items[i];
        if o { (gpu.add(g), cpu.sub(c), n - 1) } else { (gpu.sub(g), cpu.add(c), n + 1) }
    };
    let mut now = layer_time(gpu.value(), cpu.value(), n, x);
    // Every move lowers the time, so this ends; the bound only keeps rounding honest.
    for _ in 0..=2 * items.len() {
        let mut best = (now, None);
        for (i, &o) in on_cpu.iter().enumerate() {
            let (g, c, m) = flip(i, o, gpu, cpu, n);
            let t = layer_time(g.value(), c.value(), m, x);
            if improves(t, best.0) {
                best = (t, Some(i));
            }
        }
        let (t, Some(i)) = best else { break };
        (gpu, cpu, n) = flip(i, on_cpu[i], gpu, cpu, n);
        on_cpu[i] = !on_cpu[i];
        now = t;
    }
    (on_cpu, layer_time(gpu.value(), cpu.value(), n, x))
}

/// A batch's cost through one layer as planned, and with its CPU experts uploaded and run
/// on the GPU ([`PlacementPlan::prefill`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillChoice {
    /// Whether uploading is faster.
    pub upload: bool,
    /// Expected seconds as planned: `max(G, C + X)`, X the rows' crossing.
    pub planned_s: f64,
    /// Expected seconds with every expert on the GPU: G plus the CPU experts uploaded and
    /// computed there.
    pub uploaded_s: f64,
}

/// Expected seconds of an expert of `b` bytes used with probability `used` by some row of
/// a batch, by `rows` of its rows on average: the roofline `max(b/rate, rows·b/gemm)`.
fn roofline(used: f64, rows: f64, b: f64, rate: f64, gemm: f64) -> f64 {
    scaled(used, secs(b, rate)).max(scaled(rows, secs(b, gemm)))
}

impl PlacementPlan {
    /// Whether a batch of `rows` rows (a prefill chunk) through MoE layer `layer` is faster
    /// with the layer's CPU experts uploaded and computed on the GPU, as llama.cpp does for
    /// large batches: an expert used by `f` of the rows is used at all with probability
    /// `1 - (1 - f)^rows` and then read (uploaded) once for all its rows, and computes on
    /// the roofline of its side (`max(b/rate, rows·b/gemm)`, expected values taken through
    /// the max). `None` for a layer that does not exist.
    pub fn prefill(&self, layer: usize, rows: u32) -> Option<PrefillChoice> {
        let placements = self.placements.get(layer)?;
        let r = &self.inputs.rates;
        let b = self.inputs.layers[layer].expert_bytes as f64;
        let n = f64::from(rows);
        let (mut gpu, mut cpu, mut moved, mut on_cpu) = (0.0, 0.0, 0.0, 0);
        for (p, &f) in placements.iter().zip(&self.freq[layer]) {
            let used = if rows == 0 { 0.0 } else { 1.0 - (1.0 - f).powf(n) };
            let read = if p.home == Tier::Storage { scaled(used, secs(b, r.storage)) } else { 0.0 };
            let upload = if p.home == Tier::Vram { 0.0 } else { scaled(used, secs(b, r.h2d)) };
            let on_gpu = read + upload + roofline(used, f * n, b, r.gpu, r.gpu_gemm);
            match p.compute {
                Side::Gpu => gpu += on_gpu,
                Side::Cpu => {
                    on_cpu += 1;
                    cpu += read + roofline(used, f * n, b, r.cpu, r.cpu_gemm);
                    moved += on_gpu;
                }
            }
        }
        let x = if rows == 0 { 0.0 } else { r.crossing_s + secs(n * r.row_bytes as f64, r.h2d) };
        let planned_s = layer_time(gpu, cpu, on_cpu, x);
        let uploaded_s = gpu + moved;
        Some(PrefillChoice { upload: uploaded_s < planned_s, planned_s, uploaded_s })
    }
}

#[cfg(test)]
mod tests {
    use super::super::RouterStats;
    use super::super::testkit::*;
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn frequencies_sum_to_top_k_and_none_exceeds_one() {
        let f = frequencies(&[], 4, 2);
        assert_eq!(f, [0.5; 4]);
        assert_eq!(frequencies(&[0.0; 4], 4, 2), [0.5; 4]);
        // Counts 3:1 with top-1: 0.75 and 0.25.
        let f = frequencies(&[30.0, 10.0], 2, 1);
        assert!(close(f[0], 0.75) && close(f[1], 0.25), "{f:?}");
        // One expert holds nearly every use with top-2: it is capped at 1, the rest share 1.
        let f = frequencies(&[1000.0, 2.0, 1.0, 1.0], 4, 2);
        assert!(close(f[0], 1.0) && close(f[1], 0.5) && close(f[2], 0.25), "{f:?}");
        assert!(close(f.iter().sum(), 2.0));
        // The weightless share what the capped leave, evenly.
        let f = frequencies(&[5.0, 0.0, 0.0], 3, 2);
        assert!(close(f[0], 1.0) && close(f[1], 0.5) && close(f[2], 0.5), "{f:?}");
        // Top-k of all: every expert every token.
        assert_eq!(frequencies(&[9.0, 1.0, 0.0], 3, 3), [1.0; 3]);
        assert!(frequencies(&[], 0, 0).is_empty());
        // Huge weights do not overflow.
        let f = frequencies(&[f64::MAX, f64::MAX], 2, 1);
        assert!(close(f[0], 0.5) && close(f[1], 0.5));
    }

    #[test]
    fn costs_are_never_nan() {
        assert_eq!(secs(0.0, 0.0), 0.0);
        assert_eq!(secs(10.0, 0.0), f64::INFINITY);
        assert_eq!(secs(10.0, f64::INFINITY), 0.0);
        assert_eq!(scaled(0.0, f64::INFINITY), 0.0);
        assert_eq!(saving_per_byte(0.5, f64::INFINITY, f64::INFINITY, 10), 0.0);
        assert_eq!(saving_per_byte(0.5, f64::INFINITY, 1.0, 10), f64::INFINITY);
        assert_eq!(saving_per_byte(0.5, 1.0, f64::INFINITY, 10), f64::NEG_INFINITY);
        assert_eq!(saving_per_byte(0.5, 3.0, 1.0, 0), f64::INFINITY);
        assert!(close(saving_per_byte(0.5, 3.0, 1.0, 4), 0.25));
        let u = Unit::new(&Rates::default(), 100);
        assert_eq!(u.estimate(Sides::Free, Tier::Ram), f64::INFINITY);
        let u = Unit { gpu: 1.0, h2d: 3.0, cpu: 4.0, read: 10.0 };
        // From RAM: CPU 4, upload 4: shared, 2.
        assert!(close(u.estimate(Sides::Free, Tier::Ram), 2.0));
        assert!(close(u.estimate(Sides::Cpu, Tier::Storage), 14.0));
        assert!(close(u.cost(Placement { home: Tier::Vram, compute: Side::Gpu }), 1.0));
    }

    #[test]
    fn balance_splits_a_layer_between_its_sides() {
        // Four equal experts, 4 s on the GPU or 3 s on the CPU each, no crossing: two and two.
        let items = [(4.0, 3.0); 4];
        let on_cpu = balance(0.0, &items, 0.0);
        assert_eq!(on_cpu.iter().filter(|&&o| o).count(), 2, "{on_cpu:?}");
        // The GPU side already busy with 9 s of VRAM experts: all four on the CPU (12 s;
        // one back on the GPU would make it 13).
        assert_eq!(balance(9.0, &items, 0.0), [true; 4]);
        // A crossing dearer than any gain: all on the GPU.
        assert_eq!(balance(0.0, &items, 100.0), [false; 4]);
        // An expert the GPU cannot take (no upload rate) stays on the CPU; one the CPU
        // cannot take on the GPU.
        let items = [(f64::INFINITY, 1.0), (1.0, f64::INFINITY), (2.0, 2.0)];
        let on_cpu = balance(0.0, &items, 0.5);
        assert!(on_cpu[0] && !on_cpu[1], "{on_cpu:?}");
        // Nothing that can run anywhere: no panic, no NaN.
        assert_eq!(balance(0.0, &[(f64::INFINITY, f64::INFINITY)], 0.0), [false]);
        assert!(balance(0.0, &[], 1.0).is_empty());
    }

    #[test]
    fn balance_never_loses_to_either_side_alone() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f64 / 100.0
        };
        for _ in 0..300 {
            let items: Vec<(f64, f64)> = (0..(next() as usize)).map(|_| (next(), next())).collect();
            let (base, cross) = (next(), next() / 4.0);
            let on_cpu = balance(base, &items, cross);
            let time = |on_cpu: &[bool]| {
                let g: f64 = base + items.iter().zip(on_cpu).filter(|(_, o)| !**o).map(|(i, _)| i.0).sum::<f64>();
                let c: f64 = items.iter().zip(on_cpu).filter(|(_, o)| **o).map(|(i, _)| i.1).sum();
                layer_time(g, c, on_cpu.iter().filter(|&&o| o).count(), cross)
            };
            let t = time(&on_cpu);
            assert!(t <= time(&vec![false; items.len()]) + 1e-9);
            assert!(t <= time(&vec![true; items.len()]) + 1e-9, "{items:?} {base} {cross}");
            // No single move improves it.
            for i in 0..items.len() {
                let mut moved = on_cpu.clone();
                moved[i] = !moved[i];
                assert!(time(&moved) >= t * (1.0 - 1e-9), "{items:?}: moving {i} helps");
            }
        }
    }

    #[test]
    fn a_large_prefill_batch_uploads_the_cpu_experts_a_single_row_does_not() {
        let plan = PlacementPlan::new(a3b(8 * GB, 64 * GB, zipf(48, 128, 8))).unwrap();
        let l = (0..48).find(|&l| plan.layer(l).iter().any(|p| p.compute == Side::Cpu)).unwrap();
        let one = plan.prefill(l, 1).unwrap();
        assert!(!one.upload, "{one:?}");
        // At one row the prefill model agrees with the plan's own layer time.
        assert!((one.planned_s - plan.summary().layers[l].seconds).abs() < 1e-9 * one.planned_s);
        let batch = plan.prefill(l, 4096).unwrap();
        assert!(batch.upload && batch.uploaded_s < batch.planned_s, "{batch:?}");
        assert_eq!(plan.prefill(l, 0).unwrap().planned_s, 0.0);
        // A layer with nothing on the CPU has nothing to upload.
        let gpu = PlacementPlan::new(a3b(24 * GB, 64 * GB, RouterStats::uniform())).unwrap();
        let c = gpu.prefill(0, 4096).unwrap();
        assert!(!c.upload && c.planned_s == c.uploaded_s);
    }
}
