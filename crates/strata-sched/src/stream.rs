//! The streaming side of the scheduler: resident layers under a budget, a ring of read
//! buffers that an I/O thread fills `depth` layers ahead of the compute, and the two
//! baselines a benchmark compares against (plain LRU, and reloading every layer).
//!
//! Two locks: `Core::cache` (the plan and the resident layers) and `Shared::ring` (what
//! the I/O thread reads next, and the buffers). Whoever holds both took `cache` first.
//! A ring buffer goes back to the ring when the last tensor viewing it drops, which
//! takes `ring`, so nothing is dropped while `ring` is held.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use super::io::{AlignedBuf, HostPin};
use super::layout::{LayerLayout, Reader};
use super::plan::{HostTierSummary, ResidencyPlan, format_ranges, host_tier};
use super::upload::{DeviceRead, Early, Stage};
use super::{Build, Policy, SchedError, SchedStats, SchedSummary};
use strata_tensor::tensor::ByteSource;

/// Ring buffers beyond the prefetch depth: one for the layer being computed, one spare
/// so that a caller briefly holding two layers does not stall the I/O thread.
pub(super) const EXTRA_BUFFERS: usize = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the I/O thread and the compute share.
struct Shared {
    ring: Mutex<Ring>,
    /// Wakes the I/O thread: a buffer came back, a layer was taken, a seek, shutdown.
    io_wake: Condvar,
    /// Wakes the compute: a layer is ready.
    ready_wake: Condvar,
}

struct Ring {
    /// The next layer the I/O thread considers (it skips `skip`ped ones).
    cursor: usize,
    /// Layers read and not yet taken, oldest first (an `Err` is a failed read).
    ready: VecDeque<(usize, Result<Loaded, SchedError>)>,
    /// The layer being read, and the epoch it was started in.
    loading: Option<(usize, u64)>,
    free: Vec<AlignedBuf>,
    /// Ring buffers in existence (free, ready, loading or viewed by a layer in use).
    allocated: usize,
    max_buffers: usize,
    depth: usize,
    /// Layers the I/O thread does not read (resident).
    skip: Vec<bool>,
    /// Bumped by a seek: reads begun before it are stale.
    epoch: u64,
    shutdown: bool,
}

impl Ring {
    /// The next layer to read from the cursor on, if any is not skipped.
    fn next_layer(&self) -> Option<usize> {
        let n = self.skip.len();
        (0..n).map(|k| (self.cursor + k) % n).find(|&l| !self.skip[l])
    }
}

/// A layer the I/O thread has read: into a ring buffer, or straight into a device slot
/// (GPUDirect Storage).
enum Loaded {
    Host(AlignedBuf),
    Device(Arc<dyn ByteSource>),
}

/// Reads layers straight into device slots, where the stage can and the layer needs no
/// fixup on the host.
struct Direct {
    stage: Arc<dyn Stage>,
    paths: Vec<std::path::PathBuf>,
    /// Per layer: whether its bytes are used as stored (no fixup).
    eligible: Vec<bool>,
}

impl Direct {
    /// Layer `i` read into a device slot, with the bytes read; `None`: read it through
    /// host memory.
    fn read(&self, reader: &Reader, i: usize) -> Option<(Arc<dyn ByteSource>, u64)> {
        let layout = reader.layout(i).filter(|_| self.eligible[i])?;
        let reads: Vec<DeviceRead<'_>> = layout
            .reads
            .iter()
            .map(|r| DeviceRead { path: &self.paths[r.file], offset: r.offset, len: r.len, min: r.min, dst: r.dst })
            .collect();
        let src = self.stage.read_direct(&reads, layout.buf_len)?;
        Some((src, layout.reads.iter().map(|r| r.len as u64).sum()))
    }
}

/// A ring buffer lent to the compute: the tensors of a streamed layer view it, and it
/// goes back to the ring when the last of them drops (unless it was kept as a resident
/// layer, see [`RingBuf::keep`]).
struct RingBuf {
    buf: AlignedBuf,
    home: Weak<Shared>,
    kept: AtomicBool,
}

impl ByteSource for RingBuf {
    fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

impl RingBuf {
    /// Takes the buffer out of the ring for good (a streamed layer admitted as resident);
    /// the I/O thread may then allocate a replacement.
    fn keep(&self) {
        if !self.kept.swap(true, Ordering::Relaxed)
            && let Some(shared) = self.home.upgrade()
        {
            lock(&shared.ring).allocated -= 1;
            shared.io_wake.notify_all();
        }
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        if self.kept.load(Ordering::Relaxed) {
            return;
        }
        if let Some(shared) = self.home.upgrade() {
            lock(&shared.ring).free.push(std::mem::take(&mut self.buf));
            shared.io_wake.notify_all();
        }
    }
}

/// The plan and the resident layers.
struct Cache<L> {
    plan: ResidencyPlan,
    resident: Vec<Option<Arc<L>>>,
    /// LRU and reload baselines: cached layers, least recently used first.
    lru: VecDeque<(usize, Arc<L>, u64)>,
    lru_bytes: u64,
    /// The configured budget, runtime memory in use, and what the budget already
    /// leaves for runtime memory.
    base_budget: u64,
    runtime_in_use: u64,
    runtime_allowance: u64,
}

impl<L> Cache<L> {
    fn effective_budget(&self) -> u64 {
        let over = self.runtime_in_use.saturating_sub(self.runtime_allowance);
        self.base_budget.saturating_sub(over)
    }
}

/// How a streaming core starts.
pub(super) struct Start {
    /// Read-buffer bytes of each layer.
    pub layer_bytes: Vec<u64>,
    pub budget: u64,
    pub runtime_allowance: u64,
    pub policy: Policy,
    /// Prefetch depth (0 for the baselines, which read on demand).
    pub depth: usize,
    /// Bytes of streamed layers held in page-locked host memory (with a `stage` only).
    pub host_budget: u64,
    /// The upload into device memory, when the compute has memory of its own.
    pub stage: Option<Arc<dyn Stage>>,
}

/// How the I/O thread allocates ring buffers: page-locked, and large enough for every
/// layer so that they never reallocate (and lose their lock), when a stage uploads them.
#[derive(Clone)]
struct Alloc {
    pin: Option<Arc<dyn HostPin>>,
    cap: usize,
}

impl Alloc {
    /// A ring buffer.
    fn buf(&self) -> AlignedBuf {
        self.buf_for(self.cap)
    }

    /// A buffer for `len` bytes (page-locked when pinning; unpinned ones grow as needed).
    fn buf_for(&self, len: usize) -> AlignedBuf {
        match &self.pin {
            None => AlignedBuf::new(),
            Some(pin) => {
                let mut buf = AlignedBuf::with_capacity(len);
                buf.pin_with(pin.clone());
                buf
            }
        }
    }
}

pub(super) struct Core<L> {
    reader: Arc<Reader>,
    build: Build<L>,
    shared: Arc<Shared>,
    cache: Mutex<Cache<L>>,
    stats: Arc<SchedStats>,
    policy: Policy,
    depth: usize,
    io_thread: Mutex<Option<JoinHandle<()>>>,
    stage: Option<Arc<dyn Stage>>,
    /// The host tier: layers kept in (page-locked) host memory, uploaded on every use.
    host: Vec<Option<Arc<AlignedBuf>>>,
    host_budget: u64,
    /// Host-tier layers whose upload is already enqueued, ahead of their use: the copy
    /// engine works through the next `depth` layers while the compute (and the host
    /// thread driving it) is still on this one, so that a host thread that falls behind
    /// or waits on the device never leaves the copy engine idle.
    ahead: Mutex<VecDeque<(usize, Early)>>,
}

impl<L: Send + Sync + 'static> Core<L> {
    /// Loads the layers the plan pins (one read each) and starts the I/O thread
    /// (pinned policy with a depth above 0).
    pub fn start(
        reader: Reader,
        build: Build<L>,
        start: Start,
        stats: Arc<SchedStats>,
    ) -> Result<Arc<Self>, SchedError> {
        let Start { layer_bytes, budget, runtime_allowance, policy, depth, host_budget, stage } = start;
        let n = layer_bytes.len();
        let alloc = Alloc {
            pin: stage.as_ref().and_then(|s| s.host_pin()),
            cap: layer_bytes.iter().copied().max().unwrap_or(0) as usize,
        };
        let plan = match policy {
            Policy::Pinned => ResidencyPlan::new(layer_bytes, budget),
            Policy::Lru | Policy::Reload => ResidencyPlan::new(layer_bytes, 0),
        };
        let reader = Arc::new(reader);
        let mut resident = vec![None; n];
        for i in plan.pinned() {
            let mut buf = AlignedBuf::new();
            reader.read(i, &mut buf)?;
            reader.fix(i, &mut buf)?;
            resident[i] = Some(Arc::new(build(&reader.tensors(i, Arc::new(buf)))?));
        }
        let on_device: Vec<bool> = resident.iter().map(Option::is_some).collect();
        let host_budget = if stage.is_some() && policy == Policy::Pinned { host_budget } else { 0 };
        let mut host = vec![None; n];
        for (i, held) in host_tier(plan.layer_bytes(), &on_device, host_budget).into_iter().enumerate() {
            if held {
                let mut buf = alloc.buf_for(plan.layer_bytes()[i] as usize);
                reader.read(i, &mut buf)?;
                reader.fix(i, &mut buf)?;
                host[i] = Some(Arc::new(buf));
            }
        }
        let skip = on_device.iter().zip(&host).map(|(&d, h)| d || h.is_some()).collect();
        let shared = Arc::new(Shared {
            ring: Mutex::new(Ring {
                cursor: 0,
                ready: VecDeque::new(),
                loading: None,
                free: Vec::new(),
                allocated: 0,
                max_buffers: depth + EXTRA_BUFFERS,
                depth,
                skip,
                epoch: 0,
                shutdown: false,
            }),
            io_wake: Condvar::new(),
            ready_wake: Condvar::new(),
        });
        let cache = Cache {
            plan,
            resident,
            lru: VecDeque::new(),
            lru_bytes: 0,
            base_budget: budget,
            runtime_in_use: 0,
            runtime_allowance,
        };
        let core = Arc::new(Core {
            reader,
            build,
            shared,
            cache: Mutex::new(cache),
            stats,
            policy,
            depth,
            io_thread: Mutex::new(None),
            stage,
            host,
            host_budget,
            ahead: Mutex::new(VecDeque::new()),
        });
        if policy == Policy::Pinned && depth > 0 {
            let (reader, shared, stats) = (core.reader.clone(), core.shared.clone(), core.stats.clone());
            let direct = core.stage.as_ref().filter(|s| s.summary().gds.is_some()).map(|stage| Direct {
                stage: stage.clone(),
                paths: reader.paths(),
                eligible: (0..n).map(|i| reader.layout(i).is_some_and(LayerLayout::as_stored)).collect(),
            });
            let handle = std::thread::Builder::new()
                .name("strata-io".into())
                .spawn(move || io_thread(&reader, &shared, &stats, &alloc, direct.as_ref()))
                .map_err(|e| SchedError::Io { layer: 0, msg: format!("starting the I/O thread: {e}") })?;
            *lock(&core.io_thread) = Some(handle);
        }
        Ok(core)
    }

    pub fn layer(&self, i: usize) -> Result<Arc<L>, SchedError> {
        if i >= self.reader.n_layers() {
            return Err(SchedError::NoSuchLayer(i));
        }
        match self.policy {
            Policy::Pinned => self.pinned_layer(i),
            Policy::Lru | Policy::Reload => self.cached_layer(i),
        }
    }

    fn pinned_layer(&self, i: usize) -> Result<Arc<L>, SchedError> {
        let layer = self.pinned_layer_now(i)?;
        self.upload_ahead(i)?;
        Ok(layer)
    }

    /// Enqueues the uploads of the host-tier layers among the `depth` that follow layer
    /// `i` (cyclically: the last layer's are the next pass's first), unless already
    /// enqueued; forgets those no longer among them (their slots go back to the ring).
    fn upload_ahead(&self, i: usize) -> Result<(), SchedError> {
        let Some(stage) = &self.stage else { return Ok(()) };
        let n = self.host.len();
        let next: Vec<usize> = (1..=self.depth.min(n.saturating_sub(1)))
            .map(|d| (i + d) % n)
            .filter(|&j| self.host[j].is_some())
            .collect();
        let mut ahead = lock(&self.ahead);
        ahead.retain(|(j, _)| next.contains(j));
        for j in next {
            if ahead.iter().all(|(k, _)| *k != j)
                && let Some(held) = &self.host[j]
            {
                let early = stage
                    .stage_early(held.clone(), held.is_pinned())
                    .map_err(|source| SchedError::Backend { layer: j, source })?;
                ahead.push_back((j, early));
            }
        }
        Ok(())
    }

    fn pinned_layer_now(&self, i: usize) -> Result<Arc<L>, SchedError> {
        {
            let mut cache = lock(&self.cache);
            cache.plan.touch(i);
            if let Some(layer) = &cache.resident[i] {
                self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(layer.clone());
            }
        }
        if let Some(held) = &self.host[i] {
            self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
            self.stats.host_hits.fetch_add(1, Ordering::Relaxed);
            let early = {
                let mut ahead = lock(&self.ahead);
                ahead.iter().position(|(j, _)| *j == i).and_then(|p| ahead.remove(p)).map(|(_, src)| src)
            };
            let src = match early {
                Some(early) => early.ready().map_err(|source| SchedError::Backend { layer: i, source })?,
                None => self.staged(i, held.clone(), held.is_pinned())?,
            };
            return Ok(Arc::new((self.build)(&self.reader.tensors(i, src))?));
        }
        let (src, buf) = match self.take(i)? {
            Loaded::Host(mut buf) => {
                self.reader.fix(i, &mut buf)?;
                let pinned = buf.is_pinned();
                let buf = self.lend(buf);
                (self.staged(i, buf.clone(), pinned)?, Some(buf))
            }
            Loaded::Device(src) => (src, None),
        };
        let layer = Arc::new((self.build)(&self.reader.tensors(i, src))?);
        // A layer the plan (re-)admitted since it was evicted becomes resident now: the
        // buffer itself where the compute reads host memory, else a copy of its own on
        // the device (not a slot of the ring), from the buffer or read again when the
        // layer went to the device without passing the host.
        let mut cache = lock(&self.cache);
        if cache.plan.is_resident(i) && cache.resident[i].is_none() {
            let layer = match (&self.stage, buf) {
                (None, Some(buf)) => {
                    buf.keep();
                    layer.clone()
                }
                (_, Some(buf)) => Arc::new((self.build)(&self.reader.tensors(i, buf))?),
                (_, None) => {
                    let mut own = AlignedBuf::new();
                    self.reader.read(i, &mut own)?;
                    self.reader.fix(i, &mut own)?;
                    Arc::new((self.build)(&self.reader.tensors(i, Arc::new(own)))?)
                }
            };
            cache.resident[i] = Some(layer);
            lock(&self.shared.ring).skip[i] = true;
        }
        Ok(layer)
    }

    /// The bytes a layer is built from: `host` itself, or its upload into a device slot.
    fn staged(&self, i: usize, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Arc<dyn ByteSource>, SchedError> {
        match &self.stage {
            None => Ok(host),
            Some(stage) => stage.stage(host, pinned).map_err(|source| SchedError::Backend { layer: i, source }),
        }
    }

    /// Wraps a buffer read for the compute so that it comes back to the ring when the
    /// layer's tensors drop.
    fn lend(&self, buf: AlignedBuf) -> Arc<RingBuf> {
        Arc::new(RingBuf { buf, home: Arc::downgrade(&self.shared), kept: AtomicBool::new(false) })
    }

    /// Waits for the I/O thread to deliver layer `i`, redirecting it first if `i` is not
    /// what it is reading next. Time spent waiting counts as stall.
    fn take(&self, i: usize) -> Result<Loaded, SchedError> {
        let shared = &*self.shared;
        let mut ring = lock(&shared.ring);
        let mut waited: Option<Instant> = None;
        let got = loop {
            if let Some(pos) = ring.ready.iter().position(|(l, _)| *l == i) {
                // Entries before it are layers the compute skipped: recycle them.
                recycle(&mut ring, pos);
                let (_, got) = ring.ready.pop_front().expect("found above");
                break got;
            }
            // Whatever is ready was read for layers the compute has moved past.
            let all = ring.ready.len();
            recycle(&mut ring, all);
            let coming =
                ring.loading == Some((i, ring.epoch)) || (ring.loading.is_none() && ring.next_layer() == Some(i));
            if !coming {
                // Out of the cyclic order (a new pass after a cancelled one, say): read
                // `i` next, and discard the read in flight.
                ring.cursor = i;
                ring.epoch += 1;
                ring.skip[i] = false;
                self.stats.seeks.fetch_add(1, Ordering::Relaxed);
            }
            shared.io_wake.notify_all();
            waited.get_or_insert_with(Instant::now);
            ring = shared.ready_wake.wait(ring).unwrap_or_else(|e| e.into_inner());
        };
        drop(ring);
        shared.io_wake.notify_all();
        if let Some(t) = waited {
            self.stats.stall_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        got
    }

    /// The LRU and reload baselines: a hit, or a synchronous read (all stall) whose
    /// layer is then cached if it fits the budget, evicting least recently used ones.
    fn cached_layer(&self, i: usize) -> Result<Arc<L>, SchedError> {
        {
            let mut cache = lock(&self.cache);
            if let Some(layer) = &cache.resident[i] {
                self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(layer.clone());
            }
            if let Some(pos) = cache.lru.iter().position(|(l, ..)| *l == i) {
                let entry = cache.lru.remove(pos).expect("found above");
                let layer = entry.1.clone();
                cache.lru.push_back(entry);
                self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(layer);
            }
        }
        let t = Instant::now();
        // Buffers come back to the ring's free list when their layer drops (the ring
        // has no I/O thread here), so the baselines pay no allocation or page faults.
        let mut buf = lock(&self.shared.ring).free.pop().unwrap_or_default();
        let read = self.reader.read(i, &mut buf).and_then(|()| self.reader.fix(i, &mut buf));
        self.stats.stall_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let buf = self.lend(buf);
        read?;
        let layer = Arc::new((self.build)(&self.reader.tensors(i, buf))?);
        let mut evicted = Vec::new();
        let mut cache = lock(&self.cache);
        let bytes = cache.plan.layer_bytes()[i];
        let budget = cache.effective_budget();
        if bytes <= budget {
            cache.lru.push_back((i, layer.clone(), bytes));
            cache.lru_bytes += bytes;
            while cache.lru_bytes > budget {
                let Some(old) = cache.lru.pop_front() else { break };
                cache.lru_bytes -= old.2;
                evicted.push(old);
            }
        }
        drop(cache);
        drop(evicted);
        Ok(layer)
    }

    /// Runtime memory (a KV cache) was allocated (`delta > 0`) or freed: the part beyond
    /// the allowance comes out of the budget, evicting pinned layers (least recently
    /// used) now and re-admitting them as they next stream by once memory frees.
    pub fn adjust_runtime(&self, delta: i64) {
        let mut evicted = Vec::new();
        let mut cache = lock(&self.cache);
        cache.runtime_in_use = match delta >= 0 {
            true => cache.runtime_in_use.saturating_add(delta as u64),
            false => cache.runtime_in_use.saturating_sub(delta.unsigned_abs()),
        };
        let budget = cache.effective_budget();
        if self.policy == Policy::Pinned {
            let change = cache.plan.set_budget(budget);
            if !change.evicted.is_empty() || !change.admitted.is_empty() {
                tracing::info!(
                    evicted = ?change.evicted,
                    admitted = ?change.admitted,
                    budget,
                    "memory pressure changed the resident layers"
                );
            }
            let mut ring = lock(&self.shared.ring);
            for &l in &change.evicted {
                evicted.extend(cache.resident[l].take());
                ring.skip[l] = false;
            }
        } else {
            while cache.lru_bytes > budget {
                let Some(old) = cache.lru.pop_front() else { break };
                cache.lru_bytes -= old.2;
                evicted.push(old.1);
            }
        }
        drop(cache);
        self.shared.io_wake.notify_all();
        drop(evicted);
    }

    pub fn resident_bytes(&self) -> u64 {
        let cache = lock(&self.cache);
        match self.policy {
            Policy::Pinned => cache.plan.resident_bytes(),
            _ => cache.lru_bytes,
        }
    }

    pub fn paths(&self) -> Vec<std::path::PathBuf> {
        self.reader.paths()
    }
}

impl<L> Core<L> {
    /// Stops the I/O thread (it finishes the read in flight).
    pub fn stop(&self) {
        lock(&self.shared.ring).shutdown = true;
        self.shared.io_wake.notify_all();
        if let Some(handle) = lock(&self.io_thread).take() {
            let _ = handle.join();
        }
    }
}

/// Returns the first `n` ready entries' buffers to the free list (layers the compute
/// has moved past).
fn recycle(ring: &mut Ring, n: usize) {
    let stale: Vec<_> = ring.ready.drain(..n).collect();
    for (_, loaded) in stale {
        if let Ok(Loaded::Host(buf)) = loaded {
            ring.free.push(buf);
        }
    }
}

/// Reads the next layers in cyclic order into free ring buffers (or, with `direct`,
/// straight into device slots), keeping at most `depth` read or in flight ahead of the
/// compute.
fn io_thread(reader: &Reader, shared: &Shared, stats: &SchedStats, alloc: &Alloc, direct: Option<&Direct>) {
    let mut ring = lock(&shared.ring);
    loop {
        if ring.shutdown {
            return;
        }
        let in_flight = ring.ready.len() + usize::from(ring.loading.is_some());
        let next = ring.next_layer();
        let have_buffer = !ring.free.is_empty() || ring.allocated < ring.max_buffers;
        let (Some(layer), true, true) = (next, in_flight < ring.depth, have_buffer) else {
            ring = shared.io_wake.wait(ring).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        let epoch = ring.epoch;
        ring.cursor = (layer + 1) % ring.skip.len();
        ring.loading = Some((layer, epoch));
        if let Some(d) = direct {
            drop(ring);
            let t = Instant::now();
            let read = d.read(reader, layer);
            stats.io_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            ring = lock(&shared.ring);
            if let Some((src, bytes)) = read {
                stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
                ring.loading = None;
                if ring.epoch == epoch {
                    ring.ready.push_back((layer, Ok(Loaded::Device(src))));
                    shared.ready_wake.notify_all();
                }
                continue;
            }
            // Not read directly: through host memory below.
        }
        let free = ring.free.pop();
        if free.is_none() {
            ring.allocated += 1;
        }
        drop(ring);
        // A new buffer is allocated (and page-locked) outside the lock.
        let mut buf = free.unwrap_or_else(|| alloc.buf());
        let t = Instant::now();
        let read = reader.read(layer, &mut buf);
        stats.io_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        ring = lock(&shared.ring);
        ring.loading = None;
        if ring.epoch != epoch {
            ring.free.push(buf);
            continue;
        }
        match read {
            Ok(()) => ring.ready.push_back((layer, Ok(Loaded::Host(buf)))),
            Err(e) => {
                ring.free.push(buf);
                ring.ready.push_back((layer, Err(e)));
            }
        }
        shared.ready_wake.notify_all();
    }
}

/// A streaming core of any layer type, for [`super::Reservation`] and
/// [`super::SchedMonitor`].
pub(super) trait CoreHandle: Send + Sync {
    fn adjust_runtime(&self, delta: i64);
    fn summary(&self) -> SchedSummary;
}

impl<L: Send + Sync + 'static> CoreHandle for Core<L> {
    fn adjust_runtime(&self, delta: i64) {
        Core::adjust_runtime(self, delta);
    }

    fn summary(&self) -> SchedSummary {
        let cache = lock(&self.cache);
        let mut plan = cache.plan.summary();
        plan.budget_bytes = cache.effective_budget();
        if self.policy != Policy::Pinned {
            plan.resident_bytes = cache.lru_bytes;
        }
        SchedSummary {
            mode: "streaming",
            policy: self.policy,
            prefetch_depth: self.depth,
            direct_io: Some(self.reader.is_direct()),
            plan,
            host_tier: self.stage.as_ref().map(|_| self.host_tier()),
            upload: self.stage.as_ref().map(|s| s.summary()),
            experts: None,
        }
    }
}

impl<L> Core<L> {
    fn host_tier(&self) -> HostTierSummary {
        let held: Vec<usize> = (0..self.host.len()).filter(|&l| self.host[l].is_some()).collect();
        HostTierSummary {
            budget_bytes: self.host_budget,
            resident_bytes: self.host.iter().flatten().map(|b| b.len() as u64).sum(),
            layers: format_ranges(&held),
            count: held.len(),
            pinned: self.host.iter().flatten().all(|b| b.is_pinned()),
        }
    }
}
