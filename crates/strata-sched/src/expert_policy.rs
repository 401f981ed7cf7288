//! The expert cache's eviction policy: which routed experts of a mixture-of-experts model
//! stay in memory under a byte budget. Pure state, no I/O: the caller holds the weights,
//! reports each use ([`ExpertPolicy::touch`]) and each step ([`ExpertPolicy::tick`]), and
//! asks whether to keep an expert it has just read ([`ExpertPolicy::admit`]).
//!
//! Experts are used on demand (the router picks k of E per layer per token) and the access
//! is skewed, not cyclic, so a cache works here where it fails for whole layers (see
//! [`super::plan`]). Three policies, [`CachePolicy`]:
//!
//! - `lru`: evict the least recently used expert; admit every newcomer that fits.
//! - `lfu`: evict the least used expert (ties: the least recent); admit a newcomer only if
//!   it has been used at least as often as every expert it would evict, so a stream of
//!   one-off experts cannot flush the popular ones. Counts never decay: after a shift in
//!   popularity a newly popular expert must catch up with the old ones' whole history.
//! - `freq`: the exponentially decayed use count of LRFU (Lee et al., "LRFU: A Spectrum of
//!   Policies that Subsumes the LRU and LFU Policies", IEEE Trans. Computers 2001): a use
//!   `age` steps ago weighs `2^(-age / H)`, `H` the half-life in steps
//!   ([`DEFAULT_HALF_LIFE`]). Eviction and admission as for `lfu`, on this score. A large
//!   `H` tends to `lfu`, a small one to `lru`; in between, popularity is what was popular
//!   over the last few `H` steps.
//!
//! Statistics are kept for every expert seen, cached or not, so a newcomer can be compared
//! with the residents. After every call `cached_bytes() <= budget()`.
//!
//! Cost: `touch` and `remove` are O(log n) (a hash map of statistics and an ordered set of
//! the cached experts, first to evict first); `contains` and `tick` are O(1); `admit` and
//! `set_budget` are O(v log n) for v experts evicted, plus O(p) per protected expert
//! skipped on the way (p = `protect.len()`). The decayed score never needs a pass over
//! every expert: each expert stores `log2(Σ 2^(t_i / H))` over the steps `t_i` of its
//! uses, which orders experts exactly as their decayed scores do (all decay by the same
//! factor `2^(-now / H)`), and grows only like `now / H`, so it never overflows.

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU32;

/// Default half-life of `freq`'s decayed use count, in steps (tokens): long enough to
/// count several uses of a moderately popular expert (a layer picks k of E experts per
/// token, so an average expert is used every E/k steps, 16 for 8 of 128), short enough to
/// follow the topic of a conversation.
pub const DEFAULT_HALF_LIFE: NonZeroU32 = NonZeroU32::new(128).unwrap();

/// An expert of a MoE layer: `(layer, expert)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ExpertId {
    pub layer: u32,
    pub expert: u32,
}

impl ExpertId {
    pub const fn new(layer: u32, expert: u32) -> Self {
        ExpertId { layer, expert }
    }
}

/// Which experts an expert cache keeps when it is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Evict the least recently used expert; admit every newcomer that fits.
    Lru,
    /// Evict the least used expert (ties: least recent); admit a newcomer only if it has
    /// been used at least as often as each expert it would evict. Counts never decay.
    Lfu,
    /// Like `lfu` on an exponentially decayed use count (LRFU): a use weighs
    /// 2^(-age/half-life), age in steps.
    #[default]
    Freq,
}

/// The use statistics of one expert, cached or not.
#[derive(Clone, Copy, Debug)]
struct Stat {
    /// Uses, all time.
    uses: u64,
    /// `log2(Σ 2^(t / H))` over the steps `t` of the uses: the decayed use count is
    /// `2^(log_score - now / H)`. `-∞` before the first use.
    log_score: f64,
    /// The touch sequence number of the last use: recency, finer than steps.
    last: u64,
    /// Bytes held, when cached.
    cached: Option<u64>,
}

/// A cached expert's place in the eviction order: the lowest is evicted first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    /// What the policy compares: last use (lru), uses (lfu), decayed score (freq).
    rank: u64,
    /// Ties: the least recent first.
    last: u64,
    id: ExpertId,
    bytes: u64,
}

/// What [`ExpertPolicy::admit`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    pub admitted: bool,
    /// Cached experts dropped to make room, in eviction order.
    pub evicted: Vec<ExpertId>,
}

/// What the cache keeps, under a byte budget. Pure state: the caller holds the weights
/// and asks this which to keep.
#[derive(Clone, Debug)]
pub struct ExpertPolicy {
    policy: CachePolicy,
    budget: u64,
    half_life: NonZeroU32,
    /// Steps since the start ([`ExpertPolicy::tick`]).
    now: u64,
    /// Touches since the start.
    seq: u64,
    cached_bytes: u64,
    stats: HashMap<ExpertId, Stat>,
    /// The cached experts, the next to evict first.
    order: BTreeSet<Key>,
}

impl ExpertPolicy {
    pub fn new(policy: CachePolicy, budget: u64) -> Self {
        Self::with_half_life(policy, budget, DEFAULT_HALF_LIFE)
    }

    /// With `freq`'s half-life (in steps) other than [`DEFAULT_HALF_LIFE`]; the other
    /// policies ignore it.
    pub fn with_half_life(policy: CachePolicy, budget: u64, half_life: NonZeroU32) -> Self {
        ExpertPolicy {
            policy,
            budget,
            half_life,
            now: 0,
            seq: 0,
            cached_bytes: 0,
            stats: HashMap::new(),
            order: BTreeSet::new(),
        }
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn half_life(&self) -> NonZeroU32 {
        self.half_life
    }

    /// Steps counted by [`ExpertPolicy::tick`].
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Bytes of the experts cached; never more than [`ExpertPolicy::budget`].
    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// Experts cached.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn contains(&self, id: ExpertId) -> bool {
        self.stats.get(&id).is_some_and(|s| s.cached.is_some())
    }

    /// The cached experts, the next to evict first.
    pub fn cached(&self) -> impl Iterator<Item = ExpertId> + '_ {
        self.order.iter().map(|k| k.id)
    }

    /// Uses of `id` so far, cached or not.
    pub fn uses(&self, id: ExpertId) -> u64 {
        self.stats.get(&id).map_or(0, |s| s.uses)
    }

    /// `freq`'s score of `id` now: its uses, each weighed `2^(-age / half-life)`.
    pub fn decayed_uses(&self, id: ExpertId) -> f64 {
        self.stats.get(&id).map_or(0.0, |s| (s.log_score - self.clock()).exp2())
    }

    /// A use of `id` at the current step, cached or not (updates recency/frequency
    /// statistics; statistics of uncached experts are kept too, so that LFU/freq can
    /// compare a newcomer with residents). Call it once per use, before
    /// [`ExpertPolicy::admit`] on a miss.
    pub fn touch(&mut self, id: ExpertId) {
        self.seq += 1;
        let clock = self.clock();
        let stat =
            self.stats.entry(id).or_insert(Stat { uses: 0, log_score: f64::NEG_INFINITY, last: 0, cached: None });
        if let Some(old) = key(self.policy, id, stat) {
            self.order.remove(&old);
        }
        stat.uses += 1;
        stat.log_score = log2_add(stat.log_score, clock);
        stat.last = self.seq;
        if let Some(new) = key(self.policy, id, stat) {
            self.order.insert(new);
        }
    }

    /// Advances the logical clock: call once per forward pass (token step). Recency is
    /// measured in steps.
    pub fn tick(&mut self) {
        self.now += 1;
    }

    /// After a miss was read: keep `id` (of `bytes`) if the policy prefers it to what it
    /// would evict. Returns whether it was admitted and which cached experts were evicted
    /// to make room (none when it is not admitted). Never evicts an expert in `protect`
    /// (the experts the current step is using).
    ///
    /// Victims are taken in eviction order, skipping protected ones, until `bytes` fit.
    /// `lru` admits whenever that succeeds; `lfu` and `freq` only if the newcomer's count
    /// (score) is at least each victim's: ties go to the newcomer, the more recent. An
    /// expert larger than the budget, or any with a budget of 0, is never admitted.
    ///
    /// Admitting an expert already cached with the same size changes nothing; with another
    /// size it is admitted anew, and listed in `evicted` if that fails.
    pub fn admit(&mut self, id: ExpertId, bytes: u64, protect: &[ExpertId]) -> Admission {
        let mut resized = None;
        if let Some(held) = self.stats.get(&id).and_then(|s| s.cached) {
            if held == bytes {
                return Admission { admitted: true, evicted: Vec::new() };
            }
            self.remove(id);
            resized = Some(id);
        }
        let rejected = Admission { admitted: false, evicted: resized.into_iter().collect() };
        if self.budget == 0 || bytes > self.budget {
            return rejected;
        }
        let stat = *self.stats.entry(id).or_insert(Stat {
            uses: 0,
            log_score: f64::NEG_INFINITY,
            last: self.seq,
            cached: None,
        });
        let newcomer = rank(self.policy, &stat);

        let mut free = self.budget - self.cached_bytes;
        let mut victims = Vec::new();
        let mut candidates = self.order.iter().filter(|k| !protect.contains(&k.id));
        while free < bytes {
            let Some(&victim) = candidates.next() else {
                return rejected;
            };
            if self.policy != CachePolicy::Lru && victim.rank > newcomer {
                return rejected;
            }
            free += victim.bytes;
            victims.push(victim);
        }

        let mut evicted: Vec<ExpertId> = resized.into_iter().collect();
        for victim in victims {
            self.drop_cached(victim);
            evicted.push(victim.id);
        }
        let stat = Stat { cached: Some(bytes), ..stat };
        self.stats.insert(id, stat);
        self.order.insert(Key { rank: newcomer, last: stat.last, id, bytes });
        self.cached_bytes += bytes;
        Admission { admitted: true, evicted }
    }

    /// A new budget (memory pressure): evicts in eviction order until
    /// `cached_bytes() <= budget` (everything for a budget of 0); returns the evicted.
    /// Protects nothing: the caller must not be holding weights it cannot lose.
    pub fn set_budget(&mut self, budget: u64) -> Vec<ExpertId> {
        self.budget = budget;
        let mut evicted = Vec::new();
        while self.cached_bytes > budget || (budget == 0 && !self.order.is_empty()) {
            let Some(victim) = self.order.first().copied() else { break };
            self.drop_cached(victim);
            evicted.push(victim.id);
        }
        evicted
    }

    /// Forgets `id` (e.g. its read failed): it is no longer cached. Its use statistics
    /// stay, since the uses happened.
    pub fn remove(&mut self, id: ExpertId) {
        if let Some(cached) = self.stats.get(&id).and_then(|s| key(self.policy, id, s)) {
            self.drop_cached(cached);
        }
    }

    /// The clock in half-lives: the exponent of a use's weight now.
    fn clock(&self) -> f64 {
        self.now as f64 / f64::from(self.half_life.get())
    }

    fn drop_cached(&mut self, key: Key) {
        self.order.remove(&key);
        if let Some(stat) = self.stats.get_mut(&key.id) {
            stat.cached = None;
        }
        self.cached_bytes -= key.bytes;
    }
}

/// What `policy` compares, as an integer that orders the same way.
fn rank(policy: CachePolicy, stat: &Stat) -> u64 {
    match policy {
        CachePolicy::Lru => stat.last,
        CachePolicy::Lfu => stat.uses,
        CachePolicy::Freq => ordered_bits(stat.log_score),
    }
}

/// The eviction-order key of `id`, if it is cached.
fn key(policy: CachePolicy, id: ExpertId, stat: &Stat) -> Option<Key> {
    stat.cached.map(|bytes| Key { rank: rank(policy, stat), last: stat.last, id, bytes })
}

/// `log2(2^a + 2^b)`, without overflow; `-∞` stands for 0.
fn log2_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY { hi } else { hi + (lo - hi).exp2().ln_1p() * std::f64::consts::LOG2_E }
}

/// An integer that orders as `x` does (for non-NaN `x`, `-∞` included).
fn ordered_bits(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 { !bits } else { bits | 1 << 63 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: a small deterministic generator for workloads.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// Uniform in [0, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    const ALL: [CachePolicy; 3] = [CachePolicy::Lru, CachePolicy::Lfu, CachePolicy::Freq];

    fn e(expert: u32) -> ExpertId {
        ExpertId::new(0, expert)
    }

    /// A use: touch, and admit on a miss. Returns whether it hit.
    fn access(p: &mut ExpertPolicy, id: ExpertId, bytes: u64, protect: &[ExpertId]) -> bool {
        p.touch(id);
        let hit = p.contains(id);
        if !hit {
            p.admit(id, bytes, protect);
        }
        hit
    }

    #[test]
    fn ordered_bits_orders_as_floats() {
        let xs = [f64::NEG_INFINITY, -3.5, -1e-300, -0.0, 0.0, 1e-300, 1.0, 2.5, 1e300, f64::INFINITY];
        for w in xs.windows(2) {
            assert!(ordered_bits(w[0]) <= ordered_bits(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert!((log2_add(3.0, 3.0) - 4.0).abs() < 1e-12);
        assert_eq!(log2_add(f64::NEG_INFINITY, 5.0), 5.0);
    }

    #[test]
    fn invariants_hold_under_a_random_workload() {
        for policy in ALL {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ policy as u64);
            let sizes: Vec<u64> = (0..40).map(|_| 1 + rng.below(100)).collect();
            let mut p = ExpertPolicy::with_half_life(policy, 500, NonZeroU32::new(8).unwrap());
            let mut shadow: HashMap<ExpertId, u64> = HashMap::new();
            for step in 0..5000 {
                if rng.below(50) == 0 {
                    let budget = [0, 50, 99, 300, 500, 1000, 5000][rng.below(7) as usize];
                    for id in p.set_budget(budget) {
                        assert!(shadow.remove(&id).is_some(), "{policy:?} step {step}: evicted {id:?}, not cached");
                    }
                }
                if rng.below(100) == 0 {
                    let id = ExpertId::new(rng.below(2) as u32, rng.below(20) as u32);
                    p.remove(id);
                    shadow.remove(&id);
                }
                let protect: Vec<ExpertId> =
                    (0..rng.below(6)).map(|_| ExpertId::new(rng.below(2) as u32, rng.below(20) as u32)).collect();
                for &id in &protect {
                    p.touch(id);
                }
                let id = ExpertId::new(rng.below(2) as u32, (rng.below(400) as f64).sqrt() as u32);
                p.touch(id);
                let bytes = sizes[(id.layer * 20 + id.expert) as usize];
                if !p.contains(id) {
                    let protected_before: Vec<bool> = protect.iter().map(|&q| p.contains(q)).collect();
                    let a = p.admit(id, bytes, &protect);
                    for v in &a.evicted {
                        assert!(!protect.contains(v), "{policy:?} step {step}: evicted protected {v:?}");
                        assert!(shadow.remove(v).is_some(), "{policy:?} step {step}: evicted {v:?}, not cached");
                    }
                    assert!(a.admitted || a.evicted.is_empty(), "{policy:?}: evicted without admitting");
                    if a.admitted {
                        assert!(bytes <= p.budget() && p.budget() > 0);
                        shadow.insert(id, bytes);
                    }
                    for (&q, before) in protect.iter().zip(protected_before) {
                        assert_eq!(p.contains(q), before || (a.admitted && q == id));
                    }
                }
                // A resize of a cached expert: readmitted or dropped, reported either way.
                if rng.below(200) == 0 && p.contains(id) {
                    let a = p.admit(id, bytes + 1, &[]);
                    for v in &a.evicted {
                        assert!(shadow.remove(v).is_some());
                    }
                    if a.admitted {
                        shadow.insert(id, bytes + 1);
                    }
                }
                if rng.below(3) == 0 {
                    p.tick();
                }
                assert!(p.cached_bytes() <= p.budget(), "{policy:?} step {step}");
                assert_eq!(p.cached_bytes(), shadow.values().sum::<u64>(), "{policy:?} step {step}");
                assert_eq!(p.len(), shadow.len());
                for layer in 0..2 {
                    for expert in 0..20 {
                        let q = ExpertId::new(layer, expert);
                        assert_eq!(p.contains(q), shadow.contains_key(&q), "{policy:?} step {step}: {q:?}");
                    }
                }
                if p.budget() == 0 {
                    assert!(p.is_empty());
                }
            }
        }
    }

    #[test]
    fn oversized_experts_and_a_zero_budget_cache_nothing() {
        for policy in ALL {
            let mut p = ExpertPolicy::new(policy, 100);
            p.touch(e(1));
            assert!(!p.admit(e(1), 101, &[]).admitted);
            assert!(p.admit(e(2), 100, &[]).admitted);
            assert!(p.set_budget(0) == vec![e(2)]);
            p.touch(e(3));
            assert!(!p.admit(e(3), 0, &[]).admitted);
            assert!(p.is_empty() && p.cached_bytes() == 0);
        }
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut p = ExpertPolicy::new(CachePolicy::Lru, 30);
        for i in 0..3 {
            access(&mut p, e(i), 10, &[]);
            p.tick();
        }
        // Uses of 0 make 1 the least recent, however often 1 was used before.
        access(&mut p, e(0), 10, &[]);
        p.touch(e(3));
        assert_eq!(p.admit(e(3), 10, &[]), Admission { admitted: true, evicted: vec![e(1)] });
        // Protected, the least recent (2) stays and the next (0) goes.
        p.touch(e(4));
        assert_eq!(p.admit(e(4), 10, &[e(2)]), Admission { admitted: true, evicted: vec![e(0)] });
        // Varying sizes: a 20-byte expert evicts as many as it takes.
        p.touch(e(5));
        assert_eq!(p.admit(e(5), 20, &[]), Admission { admitted: true, evicted: vec![e(2), e(3)] });
        assert_eq!(p.cached().collect::<Vec<_>>(), vec![e(4), e(5)]);
        // Nothing left to evict but protected experts: rejected, nothing evicted.
        p.touch(e(6));
        assert_eq!(p.admit(e(6), 30, &[e(4)]), Admission::default());
        assert_eq!(p.cached_bytes(), 30);
    }

    #[test]
    fn lfu_keeps_a_popular_expert_against_one_offs() {
        let run = |policy| {
            let mut p = ExpertPolicy::new(policy, 20);
            for _ in 0..5 {
                access(&mut p, e(0), 10, &[]);
                p.tick();
            }
            for i in 1..100 {
                access(&mut p, e(i), 10, &[e(i)]);
                p.tick();
            }
            p
        };
        let lfu = run(CachePolicy::Lfu);
        assert!(lfu.contains(e(0)), "lfu dropped the popular expert");
        assert_eq!(lfu.uses(e(0)), 5);
        // The one-offs take turns in the other slot, each one evicting the last.
        assert!(lfu.contains(e(99)) && lfu.len() == 2);
        assert!(!run(CachePolicy::Lru).contains(e(0)), "lru keeps what it should not");

        // A one-off cannot displace an expert used more often than it.
        let mut p = ExpertPolicy::new(CachePolicy::Lfu, 10);
        access(&mut p, e(0), 10, &[]);
        access(&mut p, e(0), 10, &[]);
        p.touch(e(1));
        assert_eq!(p.admit(e(1), 10, &[]), Admission::default());
        // Once it has been used as often, it does (the tie goes to the newcomer).
        p.touch(e(1));
        assert_eq!(p.admit(e(1), 10, &[]), Admission { admitted: true, evicted: vec![e(0)] });
    }

    /// Four experts used every step for `old` steps, then four others: the steps it takes
    /// until the cache holds the new four.
    fn steps_to_follow_a_shift(policy: CachePolicy, old: u32) -> u32 {
        let mut p = ExpertPolicy::new(policy, 40);
        let run = |p: &mut ExpertPolicy, set: &[ExpertId]| {
            for &id in set {
                access(p, id, 10, set);
            }
            p.tick();
        };
        let (a, b) = ([e(0), e(1), e(2), e(3)], [e(4), e(5), e(6), e(7)]);
        for _ in 0..old {
            run(&mut p, &a);
        }
        for step in 1..10 * old {
            run(&mut p, &b);
            if b.iter().all(|&id| p.contains(id)) {
                return step;
            }
        }
        u32::MAX
    }

    #[test]
    fn freq_follows_a_shift_in_popularity_lfu_lags() {
        let h = DEFAULT_HALF_LIFE.get();
        let freq = steps_to_follow_a_shift(CachePolicy::Freq, 2000);
        let lfu = steps_to_follow_a_shift(CachePolicy::Lfu, 2000);
        let lru = steps_to_follow_a_shift(CachePolicy::Lru, 2000);
        eprintln!("steps to follow a shift after 2000 steps: freq {freq}, lfu {lfu}, lru {lru}");
        assert_eq!(lru, 1);
        // The old experts' score decays by half every `h` steps while the new ones' grows
        // toward the same limit: they cross after about one half-life, whatever the past.
        assert!(freq <= 2 * h, "freq took {freq} steps");
        // LFU must match the old experts' 2000 uses.
        assert!(lfu >= 2000, "lfu took {lfu} steps");
        assert!(steps_to_follow_a_shift(CachePolicy::Freq, 20_000) <= 2 * h);
    }

    #[test]
    fn freq_score_decays_by_half_every_half_life() {
        let mut p = ExpertPolicy::with_half_life(CachePolicy::Freq, 100, NonZeroU32::new(4).unwrap());
        p.touch(e(0));
        p.touch(e(0));
        assert!((p.decayed_uses(e(0)) - 2.0).abs() < 1e-9);
        for _ in 0..8 {
            p.tick();
        }
        assert!((p.decayed_uses(e(0)) - 0.5).abs() < 1e-9);
        p.touch(e(1));
        p.touch(e(0));
        assert!((p.decayed_uses(e(0)) - 1.5).abs() < 1e-9);
        // Ranked by decayed score: 1 (score 1) goes before 0 (1.5), though used later.
        assert!(p.admit(e(1), 50, &[]).admitted && p.admit(e(0), 50, &[]).admitted);
        assert_eq!(p.cached().collect::<Vec<_>>(), vec![e(1), e(0)]);
    }

    /// Hit rate over `steps` tokens (after as many to warm up) of a MoE with `layers` ×
    /// `experts` experts, `k` routed per token and layer, drawn without replacement from a
    /// Zipf(`s`) popularity (a different permutation per layer), with a cache of `frac` of
    /// the experts.
    fn zipf_hit_rate(policy: CachePolicy, steps: usize) -> f64 {
        let (layers, experts, k, s, frac) = (8u32, 64u32, 4usize, 1.0f64, 0.25);
        let mut rng = Rng(0x5EED_CAFE_F00D_0001);
        let weights: Vec<f64> = (1..=experts).map(|r| (r as f64).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        let cdf: Vec<f64> = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        let perms: Vec<Vec<u32>> = (0..layers)
            .map(|_| {
                let mut perm: Vec<u32> = (0..experts).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, rng.below(i as u64 + 1) as usize);
                }
                perm
            })
            .collect();
        let bytes = 1 << 20;
        let budget = (f64::from(layers * experts) * frac) as u64 * bytes;
        let mut p = ExpertPolicy::new(policy, budget);
        let (mut hits, mut uses) = (0u64, 0u64);
        let mut chosen = Vec::with_capacity(k);
        for step in 0..2 * steps {
            for layer in 0..layers {
                chosen.clear();
                while chosen.len() < k {
                    let u = rng.unit();
                    let rank = cdf.partition_point(|&c| c < u).min(experts as usize - 1);
                    let id = ExpertId::new(layer, perms[layer as usize][rank]);
                    if !chosen.contains(&id) {
                        chosen.push(id);
                    }
                }
                for &id in &chosen {
                    let hit = access(&mut p, id, bytes, &chosen);
                    if step >= steps {
                        hits += u64::from(hit);
                        uses += 1;
                    }
                }
            }
            p.tick();
            assert!(p.cached_bytes() <= budget);
        }
        hits as f64 / uses as f64
    }

    #[test]
    fn zipf_workload_favours_frequency_over_recency() {
        let steps = 5000;
        let [lru, lfu, freq] = ALL.map(|policy| zipf_hit_rate(policy, steps));
        eprintln!("zipf(1.0), 8 layers x 64 experts, top-4, cache 25%: lru {lru:.3}, lfu {lfu:.3}, freq {freq:.3}");
        assert!(lru > 0.25, "lru {lru:.3} is no better than chance");
        assert!(lfu > lru + 0.03, "lfu {lfu:.3} vs lru {lru:.3}");
        assert!(freq > lru + 0.03, "freq {freq:.3} vs lru {lru:.3}");
    }
}
