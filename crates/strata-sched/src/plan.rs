//! The residency plan for layer streaming: which layers' weights stay resident under a
//! memory budget, and which stream through the prefetch ring. Pure logic, no I/O: the
//! scheduler asks the plan, the plan never touches memory.
//!
//! Layers are read in the same order every token (0..N), so plain LRU over a budget
//! smaller than the model evicts each layer just before it is needed again and gets about
//! zero hits. Instead the plan pins a fixed set ([`pin_order`]) and streams the rest. When
//! the KV cache or activations must grow, [`ResidencyPlan::shrink`] evicts pinned layers
//! least recently used first; when memory frees, [`ResidencyPlan::grow`] re-admits them
//! in pin order. After every operation `resident_bytes() <= budget()`.

use serde::Serialize;

pub use super::runtime::{RuntimeBytes, RuntimeShape, default_budget, estimate_runtime_bytes};
pub use strata_tensor::sizes::{human_size, parse_size};

// ---------------------------------------------------------------------------------------
// The plan
// ---------------------------------------------------------------------------------------

/// The order in which layers are pinned: first, last, then the rest in order —
/// `0, n-1, 1, 2, …, n-2` (the issue's "first and last layers first, then the rest in
/// order").
///
/// The first and last layers go first because they sit at the token boundary: the last
/// layer is followed by the head and sampling, the first layer by nothing the prefetch
/// ring could have overlapped, so with both resident the ring has a whole layer's compute
/// to fetch layer 1 for the next token (and a streamed last layer cannot stall sampling).
/// The rest go in order so that the resident set is a contiguous run `0..k` plus `n-1`,
/// read as one stretch of hits per token.
pub fn pin_order(n: usize) -> Vec<usize> {
    match n {
        0 => Vec::new(),
        1 => vec![0],
        _ => std::iter::once(0).chain(std::iter::once(n - 1)).chain(1..n - 1).collect(),
    }
}

/// Which layers are resident under a budget, and what each resident layer holds once it
/// is loaded (`T`: the scheduler's built layer; `()` where only the decision matters).
/// This one map is where residency lives: the scheduler keeps no other record of it.
/// See the module docs.
#[derive(Clone, Debug)]
pub struct ResidencyPlan<T = ()> {
    layer_bytes: Vec<u64>,
    budget: u64,
    order: Vec<usize>,
    /// `rank[layer]` = position of `layer` in `order`.
    rank: Vec<usize>,
    slots: Vec<Slot<T>>,
    resident_bytes: u64,
    /// Logical time of each layer's last [`touch`](Self::touch); 0 = never.
    last_used: Vec<u64>,
    clock: u64,
}

/// One layer in a [`ResidencyPlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot<T> {
    /// Read from storage every time it is used.
    Streamed,
    /// Resident by the plan, not loaded yet: it becomes [`Slot::Held`] as it next streams by.
    Admitted,
    /// Resident, and loaded.
    Held(T),
}

impl<T> Slot<T> {
    fn is_resident(&self) -> bool {
        !matches!(self, Slot::Streamed)
    }
}

/// What a budget change did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetChange<T = ()> {
    /// Layers evicted, in eviction order.
    pub evicted: Vec<usize>,
    /// Layers admitted, in admission (pin) order.
    pub admitted: Vec<usize>,
    /// What the evicted layers held, for the caller to drop (outside its lock).
    pub released: Vec<T>,
}

/// What `strata bench`, `/api/ps` and `/metrics` show of a plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct PlanSummary {
    pub budget_bytes: u64,
    pub resident_bytes: u64,
    /// All layer bytes the budget governs.
    pub streamable_bytes: u64,
    pub layers: usize,
    /// Resident layers as compact ranges, e.g. `"0-9,31"`; empty when none.
    pub resident_layers: String,
    pub resident_count: usize,
    pub streamed_count: usize,
    /// The layers by the size of their unit (a MoE layer's core: its routed experts are
    /// units of their own), smallest layer first in each: a hybrid model's linear-attention
    /// and attention layers differ, as do the layers of a file that mixes quantizations.
    pub layer_sizes: Vec<LayerSize>,
}

/// Layers whose units are `bytes` each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct LayerSize {
    pub bytes: u64,
    /// As compact ranges, e.g. `"0-2,4-6"`.
    pub layers: String,
}

/// Layer indices grouped by their byte size, in order of each size's first layer.
fn layer_sizes(layer_bytes: &[u64]) -> Vec<LayerSize> {
    let mut sizes: Vec<(u64, Vec<usize>)> = Vec::new();
    for (l, &b) in layer_bytes.iter().enumerate() {
        match sizes.iter_mut().find(|(s, _)| *s == b) {
            Some((_, layers)) => layers.push(l),
            None => sizes.push((b, vec![l])),
        }
    }
    sizes.into_iter().map(|(bytes, layers)| LayerSize { bytes, layers: format_ranges(&layers) }).collect()
}

impl<T> ResidencyPlan<T> {
    /// Pins layers in [`pin_order`] while they fit `budget`. A layer that does not fit is
    /// skipped and later (smaller) ones still get their chance, so one large layer does
    /// not waste the rest of the budget; with uniform layers this is a prefix of the order.
    pub fn new(layer_bytes: Vec<u64>, budget: u64) -> Self {
        let n = layer_bytes.len();
        let order = pin_order(n);
        let mut rank = vec![0; n];
        for (r, &layer) in order.iter().enumerate() {
            rank[layer] = r;
        }
        let mut plan = ResidencyPlan {
            layer_bytes,
            budget,
            order,
            rank,
            slots: (0..n).map(|_| Slot::Streamed).collect(),
            resident_bytes: 0,
            last_used: vec![0; n],
            clock: 0,
        };
        plan.admit_fitting();
        plan
    }

    pub fn n_layers(&self) -> usize {
        self.layer_bytes.len()
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn layer_bytes(&self) -> &[u64] {
        &self.layer_bytes
    }

    /// Sum of all layers' bytes (saturating).
    pub fn streamable_bytes(&self) -> u64 {
        self.layer_bytes.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Whether layer `i` is resident; `false` for a layer that does not exist.
    pub fn is_resident(&self, i: usize) -> bool {
        self.slots.get(i).is_some_and(Slot::is_resident)
    }

    /// Layer `i`'s slot; `None` for a layer that does not exist.
    pub fn slot(&self, i: usize) -> Option<&Slot<T>> {
        self.slots.get(i)
    }

    /// What resident layer `i` holds, once loaded.
    pub fn held(&self, i: usize) -> Option<&T> {
        match self.slots.get(i) {
            Some(Slot::Held(t)) => Some(t),
            _ => None,
        }
    }

    /// Loads admitted layer `i` with `value`; gives `value` back if the plan does not
    /// admit `i` or it is loaded already.
    pub fn hold(&mut self, i: usize, value: T) -> Result<(), T> {
        match self.slots.get_mut(i) {
            Some(slot @ Slot::Admitted) => {
                *slot = Slot::Held(value);
                Ok(())
            }
            _ => Err(value),
        }
    }

    pub fn resident_bytes(&self) -> u64 {
        self.resident_bytes
    }

    /// Resident layers in pin order.
    pub fn pinned(&self) -> Vec<usize> {
        self.order.iter().copied().filter(|&l| self.slots[l].is_resident()).collect()
    }

    /// Layers that stream through the prefetch ring, ascending.
    pub fn streamed_layers(&self) -> Vec<usize> {
        (0..self.n_layers()).filter(|&l| !self.slots[l].is_resident()).collect()
    }

    /// Records that layer `i` was just used (ignored for a layer that does not exist).
    pub fn touch(&mut self, i: usize) {
        if let Some(t) = self.last_used.get_mut(i) {
            self.clock += 1;
            *t = self.clock;
        }
    }

    /// Lowers the budget to `new_budget`, evicting pinned layers until the resident bytes
    /// fit. Returns the evicted layers in eviction order. Nothing is admitted, even if
    /// `new_budget` is larger than the old one (that is [`grow`](Self::grow)).
    ///
    /// Eviction order: least recently used first among the layers other than the first
    /// and last, which go only once no other layer is resident (they are the ones the pin
    /// order values most, see [`pin_order`]). Ties (e.g. never touched) go to the layer
    /// pinned latest, so shrinking an untouched plan undoes [`grow`](Self::grow) exactly.
    pub fn shrink(&mut self, new_budget: u64) -> Vec<usize> {
        self.evict_to(new_budget).0
    }

    /// [`shrink`](Self::shrink), with what the evicted layers held.
    fn evict_to(&mut self, new_budget: u64) -> (Vec<usize>, Vec<T>) {
        self.budget = new_budget;
        let (mut evicted, mut released) = (Vec::new(), Vec::new());
        while self.resident_bytes > self.budget {
            let Some(victim) = self.eviction_candidate() else { break };
            if let Slot::Held(t) = std::mem::replace(&mut self.slots[victim], Slot::Streamed) {
                released.push(t);
            }
            self.resident_bytes -= self.layer_bytes[victim];
            evicted.push(victim);
        }
        (evicted, released)
    }

    /// Sets the budget to `new_budget` and re-admits layers in pin order while they fit
    /// (skipping any that do not). Returns the admitted layers. A budget below the
    /// resident bytes evicts first, as [`shrink`](Self::shrink) does; use
    /// [`set_budget`](Self::set_budget) to see those evictions too.
    pub fn grow(&mut self, new_budget: u64) -> Vec<usize> {
        self.set_budget(new_budget).admitted
    }

    /// [`shrink`](Self::shrink) then admit what fits, reporting both.
    pub fn set_budget(&mut self, new_budget: u64) -> BudgetChange<T> {
        let (evicted, released) = self.evict_to(new_budget);
        let admitted = self.admit_fitting();
        BudgetChange { evicted, admitted, released }
    }

    pub fn summary(&self) -> PlanSummary {
        let resident: Vec<usize> = (0..self.n_layers()).filter(|&l| self.slots[l].is_resident()).collect();
        PlanSummary {
            budget_bytes: self.budget,
            resident_bytes: self.resident_bytes,
            streamable_bytes: self.streamable_bytes(),
            layers: self.n_layers(),
            resident_layers: format_ranges(&resident),
            resident_count: resident.len(),
            streamed_count: self.n_layers() - resident.len(),
            layer_sizes: layer_sizes(&self.layer_bytes),
        }
    }

    fn is_edge(&self, layer: usize) -> bool {
        layer == 0 || layer + 1 == self.n_layers()
    }

    fn eviction_candidate(&self) -> Option<usize> {
        (0..self.n_layers())
            .filter(|&l| self.slots[l].is_resident())
            .min_by_key(|&l| (self.is_edge(l), self.last_used[l], std::cmp::Reverse(self.rank[l])))
    }

    fn admit_fitting(&mut self) -> Vec<usize> {
        let mut admitted = Vec::new();
        for r in 0..self.order.len() {
            let layer = self.order[r];
            let bytes = self.layer_bytes[layer];
            if !self.slots[layer].is_resident() && bytes <= self.budget - self.resident_bytes {
                self.slots[layer] = Slot::Admitted;
                self.resident_bytes += bytes;
                admitted.push(layer);
            }
        }
        admitted
    }
}

/// A streaming scheduler's budget under runtime memory: the configured budget, less the
/// runtime memory (KV caches) in use beyond what the budget already leaves for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeBudget {
    base: u64,
    in_use: u64,
    allowance: u64,
}

impl RuntimeBudget {
    pub fn new(base: u64, allowance: u64) -> Self {
        RuntimeBudget { base, in_use: 0, allowance }
    }

    /// Runtime memory allocated (`delta > 0`) or freed.
    pub fn adjust(&mut self, delta: i64) {
        self.in_use = match delta >= 0 {
            true => self.in_use.saturating_add(delta as u64),
            false => self.in_use.saturating_sub(delta.unsigned_abs()),
        };
    }

    /// The bytes left for layer weights.
    pub fn effective(&self) -> u64 {
        self.base.saturating_sub(self.in_use.saturating_sub(self.allowance))
    }
}

/// The host tier behind a device (DESIGN.md §5): of the layers not resident on the
/// device, those kept in page-locked host memory under `budget` and copied to the device
/// on every use, in [`pin_order`], skipping any that does not fit (as
/// [`ResidencyPlan::new`] does). The rest stream from storage.
pub fn host_tier(layer_bytes: &[u64], on_device: &[bool], budget: u64) -> Vec<bool> {
    let mut left = budget;
    let mut host = vec![false; layer_bytes.len()];
    for l in pin_order(layer_bytes.len()) {
        if !on_device.get(l).copied().unwrap_or(false) && layer_bytes[l] <= left {
            left -= layer_bytes[l];
            host[l] = true;
        }
    }
    host
}

/// What the host tier holds, as `strata bench`, `/api/ps` and `/metrics` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct HostTierSummary {
    pub budget_bytes: u64,
    pub resident_bytes: u64,
    /// Layers held, as compact ranges (`"2-5,9"`).
    pub layers: String,
    pub count: usize,
    /// Whether the OS page-locked every one of them (else copies from them are pageable).
    pub pinned: bool,
}

/// Ascending layer indices as compact ranges: `[0,1,2,5,7,8]` → `"0-2,5,7-8"`.
pub fn format_ranges(sorted: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// The inverse of [`format_ranges`]: `"0-2,5"` → `[0, 1, 2, 5]` (an empty string gives
/// none; anything unparsable is skipped).
pub fn parse_ranges(s: &str) -> Vec<usize> {
    s.split(',')
        .filter_map(|part| {
            let (a, b) = part.trim().split_once('-').unwrap_or((part.trim(), part.trim()));
            Some(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?)
        })
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    type ResidencyPlan = super::ResidencyPlan<()>;

    #[test]
    fn the_host_tier_takes_what_the_device_does_not_hold_in_pin_order() {
        let bytes = [10, 10, 10, 10, 10, 10];
        let on_device = [true, false, false, false, false, true];
        // Pin order for 6 layers is 0, 5, 1, 2, 3, 4: the host tier gets the next ones.
        let host = host_tier(&bytes, &on_device, 25);
        assert_eq!(host, vec![false, true, true, false, false, false]);
        assert_eq!(host_tier(&bytes, &on_device, 0), vec![false; 6]);
        assert_eq!(host_tier(&bytes, &on_device, u64::MAX), vec![false, true, true, true, true, false]);
        // A layer that does not fit is skipped; a smaller later one still gets in.
        let host = host_tier(&[10, 50, 10], &[false; 3], 25);
        assert_eq!(host, vec![true, false, true]);
    }

    #[test]
    fn pin_order_is_first_last_then_in_order() {
        assert_eq!(pin_order(0), Vec::<usize>::new());
        assert_eq!(pin_order(1), vec![0]);
        assert_eq!(pin_order(2), vec![0, 1]);
        assert_eq!(pin_order(5), vec![0, 4, 1, 2, 3]);
    }

    fn check(plan: &ResidencyPlan) {
        assert!(plan.resident_bytes() <= plan.budget(), "{plan:?}");
        let sum: u64 = plan.pinned().iter().map(|&l| plan.layer_bytes()[l]).sum();
        assert_eq!(sum, plan.resident_bytes());
        assert_eq!(plan.pinned().len() + plan.streamed_layers().len(), plan.n_layers());
        for l in plan.streamed_layers() {
            assert!(!plan.is_resident(l));
        }
    }

    #[test]
    fn uniform_layers_at_100_50_25_and_0_percent() {
        let sizes = vec![10u64; 8]; // 80 bytes in all
        let cases: [(u64, &[usize], &str); 4] =
            [(80, &[0, 7, 1, 2, 3, 4, 5, 6], "0-7"), (40, &[0, 7, 1, 2], "0-2,7"), (20, &[0, 7], "0,7"), (0, &[], "")];
        for (budget, pinned, ranges) in cases {
            let plan = ResidencyPlan::new(sizes.clone(), budget);
            check(&plan);
            assert_eq!(plan.pinned(), pinned, "budget {budget}");
            assert_eq!(plan.resident_bytes(), 10 * pinned.len() as u64);
            let s = plan.summary();
            assert_eq!(s.resident_layers, ranges);
            assert_eq!(s.streamed_count, 8 - pinned.len());
            assert_eq!(s.streamable_bytes, 80);
        }
        // Just under a layer boundary: 39 bytes pins three.
        assert_eq!(ResidencyPlan::new(sizes, 39).pinned(), vec![0, 7, 1]);
    }

    #[test]
    fn non_uniform_layers_at_100_50_25_and_0_percent() {
        // Layer 0 dense and large, the last layer large too. Total 100.
        let sizes = vec![30u64, 10, 10, 10, 10, 30];
        let plan = ResidencyPlan::new(sizes.clone(), 100);
        check(&plan);
        assert_eq!(plan.pinned(), vec![0, 5, 1, 2, 3, 4]);
        assert!(plan.streamed_layers().is_empty());
        // 50: 0 (30), 5 does not fit (60), 1 (40), 2 (50), the rest do not fit.
        let plan = ResidencyPlan::new(sizes.clone(), 50);
        check(&plan);
        assert_eq!(plan.pinned(), vec![0, 1, 2]);
        assert_eq!(plan.streamed_layers(), vec![3, 4, 5]);
        assert_eq!(plan.resident_bytes(), 50);
        // 25: layer 0 and 5 do not fit; 1 and 2 do (20), 3 would make 30.
        let plan = ResidencyPlan::new(sizes.clone(), 25);
        check(&plan);
        assert_eq!(plan.pinned(), vec![1, 2]);
        assert_eq!(plan.summary().resident_layers, "1-2");
        let plan = ResidencyPlan::new(sizes, 0);
        check(&plan);
        assert!(plan.pinned().is_empty());
        assert_eq!(plan.summary().streamed_count, 6);
    }

    #[test]
    fn zero_byte_layers_and_empty_models() {
        let plan = ResidencyPlan::new(vec![0, 5, 0], 0);
        assert_eq!(plan.pinned(), vec![0, 2]);
        let plan = ResidencyPlan::new(Vec::new(), 100);
        check(&plan);
        assert_eq!(plan.summary().resident_layers, "");
        assert!(!plan.is_resident(0));
    }

    #[test]
    fn shrink_evicts_least_recently_used_middle_layers_first() {
        let mut plan = ResidencyPlan::new(vec![10; 6], 60);
        // One token: layers 0..6 in order, then 0..3 of the next.
        for l in (0..6).chain(0..3) {
            plan.touch(l);
        }
        // LRU among middle layers 1..=4: 3, 4 (last token), then 1, 2.
        assert_eq!(plan.shrink(40), vec![3, 4]);
        check(&plan);
        assert_eq!(plan.shrink(20), vec![1, 2]);
        // Only the edges remain; between them, LRU too: 5 was used before 0.
        assert_eq!(plan.shrink(10), vec![5]);
        assert_eq!(plan.shrink(0), vec![0]);
        check(&plan);
        assert!(plan.shrink(0).is_empty());
    }

    #[test]
    fn shrink_of_untouched_plan_evicts_in_reverse_pin_order() {
        let mut plan = ResidencyPlan::new(vec![10; 5], 50);
        assert_eq!(plan.shrink(0), vec![3, 2, 1, 4, 0]);
    }

    #[test]
    fn shrink_with_larger_budget_admits_nothing() {
        let mut plan = ResidencyPlan::new(vec![10; 4], 20);
        assert!(plan.shrink(40).is_empty());
        assert_eq!(plan.pinned(), vec![0, 3]);
        assert_eq!(plan.budget(), 40);
    }

    #[test]
    fn grow_readmits_in_pin_order() {
        let mut plan = ResidencyPlan::new(vec![10; 6], 60);
        for l in 0..6 {
            plan.touch(l);
        }
        assert_eq!(plan.shrink(0), vec![1, 2, 3, 4, 0, 5]);
        assert_eq!(plan.grow(30), vec![0, 5, 1]);
        check(&plan);
        assert_eq!(plan.grow(60), vec![2, 3, 4]);
        assert_eq!(plan.pinned(), ResidencyPlan::new(vec![10; 6], 60).pinned());
        // Growing to a budget below the resident bytes evicts first.
        let change = plan.set_budget(25);
        assert_eq!(change.evicted.len(), 4);
        assert!(change.admitted.is_empty());
        check(&plan);
    }

    #[test]
    fn grow_skips_a_layer_too_large_and_takes_later_ones() {
        let mut plan = ResidencyPlan::new(vec![10, 50, 10, 10], 0);
        assert_eq!(plan.grow(35), vec![0, 3, 2]);
        assert_eq!(plan.grow(100), vec![1]);
        check(&plan);
    }

    #[test]
    fn the_plan_holds_what_it_admits_and_releases_what_it_evicts() {
        let mut plan = super::ResidencyPlan::<String>::new(vec![10; 4], 20);
        assert_eq!(plan.slot(0), Some(&Slot::Admitted));
        assert_eq!(plan.slot(1), Some(&Slot::Streamed));
        assert_eq!(plan.hold(0, "zero".into()), Ok(()));
        // Only an admitted slot that is not loaded takes a value.
        assert_eq!(plan.hold(0, "again".into()), Err("again".into()));
        assert_eq!(plan.hold(1, "one".into()), Err("one".into()));
        assert_eq!(plan.held(0).map(String::as_str), Some("zero"));
        assert_eq!(plan.held(3), None);
        // Evicting a held layer hands its value back; an admitted one has none.
        let change = plan.set_budget(0);
        assert_eq!(change.evicted, vec![3, 0]);
        assert_eq!(change.released, vec!["zero".to_string()]);
        assert!(plan.held(0).is_none() && !plan.is_resident(0));
        // Re-admitted layers wait to be loaded again.
        assert_eq!(plan.set_budget(10).admitted, vec![0]);
        assert_eq!(plan.slot(0), Some(&Slot::Admitted));
    }

    #[test]
    fn runtime_memory_beyond_the_allowance_comes_out_of_the_budget() {
        let mut b = RuntimeBudget::new(100, 30);
        b.adjust(20);
        assert_eq!(b.effective(), 100);
        b.adjust(30);
        assert_eq!(b.effective(), 80);
        b.adjust(500);
        assert_eq!(b.effective(), 0);
        b.adjust(-1000);
        assert_eq!(b.effective(), 100);
    }

    #[test]
    fn touch_out_of_range_is_ignored() {
        let mut plan = ResidencyPlan::new(vec![10; 3], 30);
        plan.touch(99);
        assert_eq!(plan.pinned(), vec![0, 2, 1]);
    }

    /// xorshift64: enough randomness for a property test, reproducible from the seed.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: u64) -> u64 {
            if n == 0 { 0 } else { self.next() % n }
        }
    }

    #[test]
    fn resident_bytes_never_exceed_the_budget_under_random_operations() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for _case in 0..300 {
            let n = rng.below(40) as usize;
            let sizes: Vec<u64> = (0..n).map(|_| rng.below(1000)).collect();
            let total: u64 = sizes.iter().sum();
            let mut plan = ResidencyPlan::new(sizes.clone(), rng.below(total + 100));
            check(&plan);
            for _op in 0..100 {
                let before: Vec<bool> = (0..n).map(|l| plan.is_resident(l)).collect();
                match rng.below(4) {
                    0 | 1 => plan.touch(rng.below(n as u64 + 1) as usize),
                    2 => {
                        let budget = rng.below(plan.budget() + 1);
                        let evicted = plan.shrink(budget);
                        for &l in &evicted {
                            assert!(before[l] && !plan.is_resident(l));
                        }
                        // Nothing more was evicted than needed: putting back the last
                        // victim would exceed the budget.
                        if let Some(&last) = evicted.last() {
                            assert!(plan.resident_bytes() + sizes[last] > budget);
                        }
                    }
                    _ => {
                        let budget = plan.budget() + rng.below(total + 1);
                        let admitted = plan.grow(budget);
                        for &l in &admitted {
                            assert!(!before[l] && plan.is_resident(l));
                        }
                        // Greedy: no streamed layer still fits.
                        for l in plan.streamed_layers() {
                            assert!(sizes[l] > budget - plan.resident_bytes());
                        }
                    }
                }
                check(&plan);
            }
        }
    }

    #[test]
    fn format_ranges_compacts_runs() {
        assert_eq!(format_ranges(&[]), "");
        assert_eq!(format_ranges(&[3]), "3");
        assert_eq!(format_ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        for v in [vec![], vec![3], vec![0, 1, 2, 5, 7, 8]] {
            assert_eq!(parse_ranges(&format_ranges(&v)), v);
        }
        assert_eq!(format_ranges(&(0..10).chain([31]).collect::<Vec<_>>()), "0-9,31");
    }

    #[test]
    fn summary_serializes() {
        let plan = ResidencyPlan::new(vec![10; 32], 110);
        let json = serde_json::to_value(plan.summary()).unwrap();
        assert_eq!(json["resident_layers"], "0-9,31");
        assert_eq!(json["resident_bytes"], 110);
        assert_eq!(json["budget_bytes"], 110);
        assert_eq!(json["streamed_count"], 21);
        assert_eq!(json["layer_sizes"], serde_json::json!([{"bytes": 10, "layers": "0-31"}]));
        // Two kinds of layer (a hybrid model's): each size with its layers.
        let plan = ResidencyPlan::new(vec![7, 7, 7, 12, 7, 7, 7, 12], 0);
        let sizes = plan.summary().layer_sizes;
        assert_eq!(
            sizes,
            [LayerSize { bytes: 7, layers: "0-2,4-6".into() }, LayerSize { bytes: 12, layers: "3,7".into() }]
        );
    }
}
