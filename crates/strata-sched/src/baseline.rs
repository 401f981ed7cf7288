//! The baselines a streaming benchmark compares the production core with
//! (`--stream-policy lru` and `--stream-policy reload`): no prefetch, a synchronous read
//! on every miss (all of it stall), and for LRU a cache of the layers read, least
//! recently used first, under the budget. Reload is the same with nothing cached: its
//! budget is 0. They share nothing with [`super::stream::Core`] but the reader and the
//! layer type.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use super::io::AlignedBuf;
use super::layout::Reader;
use super::plan::{ResidencyPlan, RuntimeBudget};
use super::stream::{BufHome, LentBuf, lock};
use super::{Build, CoreHandle, Policy, SchedError, SchedStats, SchedSummary, Streamer};

/// Read buffers that came back from layers dropped, so that a baseline pays no
/// allocation or page faults on its reads.
#[derive(Default)]
struct Pool {
    free: Mutex<Vec<AlignedBuf>>,
}

impl BufHome for Pool {
    fn give_back(&self, buf: AlignedBuf) {
        lock(&self.free).push(buf);
    }
}

/// Cached layers, least recently used first, and their bytes.
struct Lru<L> {
    layers: VecDeque<(usize, Arc<L>, u64)>,
    bytes: u64,
    budget: RuntimeBudget,
}

impl<L> Lru<L> {
    /// Evicts least recently used layers until the cache fits the budget; returns them,
    /// for the caller to drop unlocked.
    fn fit(&mut self) -> Vec<Arc<L>> {
        let budget = self.budget.effective();
        let mut evicted = Vec::new();
        while self.bytes > budget {
            let Some((_, layer, bytes)) = self.layers.pop_front() else { break };
            self.bytes -= bytes;
            evicted.push(layer);
        }
        evicted
    }
}

pub(super) struct Baseline<L> {
    reader: Reader,
    build: Build<L>,
    stats: Arc<SchedStats>,
    policy: Policy,
    layer_bytes: Vec<u64>,
    cache: Mutex<Lru<L>>,
    pool: Arc<Pool>,
}

impl<L: Send + Sync + 'static> Baseline<L> {
    pub fn new(
        reader: Reader,
        build: Build<L>,
        policy: Policy,
        layer_bytes: Vec<u64>,
        budget: RuntimeBudget,
        stats: Arc<SchedStats>,
    ) -> Self {
        let cache = Mutex::new(Lru { layers: VecDeque::new(), bytes: 0, budget });
        Baseline { reader, build, stats, policy, layer_bytes, cache, pool: Arc::default() }
    }
}

impl<L: Send + Sync + 'static> Streamer<L> for Baseline<L> {
    /// A hit, or a synchronous read (all stall) whose layer is then cached if it fits the
    /// budget, evicting least recently used ones.
    fn layer(&self, i: usize) -> Result<Arc<L>, SchedError> {
        {
            let mut cache = lock(&self.cache);
            if let Some(pos) = cache.layers.iter().position(|(l, ..)| *l == i) {
                let entry = cache.layers.remove(pos).expect("found above");
                let layer = entry.1.clone();
                cache.layers.push_back(entry);
                self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(layer);
            }
        }
        let t = Instant::now();
        let mut buf = lock(&self.pool.free).pop().unwrap_or_default();
        let read = self.reader.read(i, &mut buf).and_then(|()| self.reader.fix(i, &mut buf));
        self.stats.stall_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let home: Weak<Pool> = Arc::downgrade(&self.pool);
        let buf = LentBuf::lend(buf, home);
        read?;
        let layer = Arc::new((self.build)(&self.reader.tensors(i, buf))?);
        let bytes = self.layer_bytes[i];
        let mut cache = lock(&self.cache);
        let evicted = match bytes <= cache.budget.effective() {
            true => {
                cache.layers.push_back((i, layer.clone(), bytes));
                cache.bytes += bytes;
                cache.fit()
            }
            false => Vec::new(),
        };
        drop(cache);
        drop(evicted);
        Ok(layer)
    }

    fn resident_bytes(&self) -> u64 {
        lock(&self.cache).bytes
    }

    fn paths(&self) -> Vec<std::path::PathBuf> {
        self.reader.paths()
    }

    fn stop(&self) {}
}

impl<L: Send + Sync + 'static> CoreHandle for Baseline<L> {
    fn adjust_runtime(&self, delta: i64) {
        let mut cache = lock(&self.cache);
        cache.budget.adjust(delta);
        let evicted = cache.fit();
        drop(cache);
        drop(evicted);
    }

    fn summary(&self) -> SchedSummary {
        let mut plan = ResidencyPlan::<()>::new(self.layer_bytes.clone(), 0).summary();
        let cache = lock(&self.cache);
        plan.budget_bytes = cache.budget.effective();
        plan.resident_bytes = cache.bytes;
        drop(cache);
        SchedSummary {
            mode: "streaming",
            policy: self.policy,
            prefetch_depth: 0,
            direct_io: Some(self.reader.is_direct()),
            plan,
            host_tier: None,
            upload: None,
            experts: None,
            split: None,
        }
    }
}
