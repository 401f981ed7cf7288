//! The streaming side of the scheduler: resident layers under a budget, a ring of read
//! buffers that an I/O thread fills `depth` layers ahead of the compute, and the host
//! tier behind a device. The benchmark baselines are beside it, in [`super::baseline`].
//!
//! One lock, `Shared::state`: the residency plan (which holds the resident layers
//! themselves, the one record of what is resident) and the ring (what the I/O thread
//! reads next, and the buffers). The I/O thread holds it only between reads. A ring
//! buffer goes back to the ring when the last tensor viewing it drops, which takes the
//! lock, so no layer or buffer is dropped while it is held.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use super::io::{AlignedBuf, HostPin};
use super::layout::{LayerLayout, Reader};
use super::plan::{HostTierSummary, ResidencyPlan, RuntimeBudget, Slot, format_ranges, host_tier};
use super::upload::{DeviceRead, Early, Stage};
use super::{Build, CoreHandle, Policy, SchedError, SchedStats, SchedSummary, Streamer};
use strata_tensor::tensor::ByteSource;

/// Ring buffers beyond the prefetch depth: one for the layer being computed, one spare
/// so that a caller briefly holding two layers does not stall the I/O thread.
pub(super) const EXTRA_BUFFERS: usize = 2;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the I/O thread and the compute share.
struct Shared<L> {
    state: Mutex<State<L>>,
    /// Wakes the I/O thread: a buffer came back, a layer was taken, a seek, shutdown.
    io_wake: Condvar,
    /// Wakes the compute: a layer is ready.
    ready_wake: Condvar,
    /// The host tier: layers kept in (page-locked) host memory, uploaded on every use.
    /// Fixed when the core starts; the I/O thread never reads these.
    host: Vec<Option<Arc<AlignedBuf>>>,
}

struct State<L> {
    /// Which layers are resident, and the resident layers themselves.
    plan: ResidencyPlan<Arc<L>>,
    ring: Ring,
    budget: RuntimeBudget,
}

impl<L> State<L> {
    /// The next layer the I/O thread reads from the cursor on: one not held resident and
    /// not in the host tier.
    fn next_layer(&self, host: &[Option<Arc<AlignedBuf>>]) -> Option<usize> {
        let n = host.len();
        (0..n).map(|k| (self.ring.cursor + k) % n).find(|&l| self.plan.held(l).is_none() && host[l].is_none())
    }
}

impl<L: Send + Sync> BufHome for Shared<L> {
    fn give_back(&self, buf: AlignedBuf) {
        lock(&self.state).ring.free.push(buf);
        self.io_wake.notify_all();
    }
}

struct Ring {
    /// The next layer the I/O thread considers (from it on, the first
    /// [`State::next_layer`] gives).
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
    /// Bumped by a seek: reads begun before it are stale.
    epoch: u64,
    shutdown: bool,
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

/// Where a lent buffer goes back to when the last tensor viewing it drops: the ring of
/// a streaming core, or a baseline's pool.
pub(super) trait BufHome: Send + Sync {
    fn give_back(&self, buf: AlignedBuf);
}

/// A read buffer lent to the compute: the tensors of a streamed layer view it, and it
/// goes back to its home when the last of them drops (unless it was kept as a resident
/// layer, see [`LentBuf::keep`]).
pub(super) struct LentBuf {
    buf: AlignedBuf,
    home: Weak<dyn BufHome>,
    kept: AtomicBool,
}

impl ByteSource for LentBuf {
    fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

impl LentBuf {
    pub(super) fn lend(buf: AlignedBuf, home: Weak<dyn BufHome>) -> Arc<LentBuf> {
        Arc::new(LentBuf { buf, home, kept: AtomicBool::new(false) })
    }

    /// Takes the buffer out of `ring` (its home, whose lock the caller holds) for good: a
    /// streamed layer admitted as resident. The I/O thread may then allocate a replacement.
    fn keep(&self, ring: &mut Ring) {
        if !self.kept.swap(true, Ordering::Relaxed) {
            ring.allocated -= 1;
        }
    }
}

impl Drop for LentBuf {
    fn drop(&mut self) {
        if self.kept.load(Ordering::Relaxed) {
            return;
        }
        if let Some(home) = self.home.upgrade() {
            home.give_back(std::mem::take(&mut self.buf));
        }
    }
}

/// How a streaming core starts.
pub(super) struct Start {
    /// Read-buffer bytes of each layer.
    pub layer_bytes: Vec<u64>,
    pub budget: u64,
    pub runtime_allowance: u64,
    /// Prefetch depth (at least 1).
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

/// The production streaming core (`--stream-policy pinned`): the plan's layers resident, the rest
/// read ahead by the I/O thread.
pub(super) struct Core<L> {
    reader: Arc<Reader>,
    build: Build<L>,
    shared: Arc<Shared<L>>,
    stats: Arc<SchedStats>,
    depth: usize,
    io_thread: Mutex<Option<JoinHandle<()>>>,
    stage: Option<Arc<dyn Stage>>,
    host_budget: u64,
    /// Host-tier layers whose upload is already enqueued, ahead of their use: the copy
    /// engine works through the next `depth` layers while the compute (and the host
    /// thread driving it) is still on this one, so that a host thread that falls behind
    /// or waits on the device never leaves the copy engine idle.
    ahead: Mutex<VecDeque<(usize, Early)>>,
}

impl<L: Send + Sync + 'static> Core<L> {
    /// Loads the layers the plan pins (one read each), fills the host tier and starts the
    /// I/O thread.
    pub fn start(
        reader: Reader,
        build: Build<L>,
        start: Start,
        stats: Arc<SchedStats>,
    ) -> Result<Arc<Self>, SchedError> {
        let Start { layer_bytes, budget, runtime_allowance, depth, host_budget, stage } = start;
        let n = layer_bytes.len();
        let alloc = Alloc {
            pin: stage.as_ref().and_then(|s| s.host_pin()),
            cap: layer_bytes.iter().copied().max().unwrap_or(0) as usize,
        };
        let mut plan = ResidencyPlan::new(layer_bytes, budget);
        let reader = Arc::new(reader);
        for i in plan.pinned() {
            let mut buf = AlignedBuf::new();
            reader.read(i, &mut buf)?;
            reader.fix(i, &mut buf)?;
            let layer = Arc::new(build(&reader.tensors(i, Arc::new(buf)))?);
            let _ = plan.hold(i, layer);
        }
        let on_device: Vec<bool> = (0..n).map(|i| plan.held(i).is_some()).collect();
        let host_budget = if stage.is_some() { host_budget } else { 0 };
        let mut host = vec![None; n];
        for (i, held) in host_tier(plan.layer_bytes(), &on_device, host_budget).into_iter().enumerate() {
            if held {
                let mut buf = alloc.buf_for(plan.layer_bytes()[i] as usize);
                reader.read(i, &mut buf)?;
                reader.fix(i, &mut buf)?;
                host[i] = Some(Arc::new(buf));
            }
        }
        let ring = Ring {
            cursor: 0,
            ready: VecDeque::new(),
            loading: None,
            free: Vec::new(),
            allocated: 0,
            max_buffers: depth + EXTRA_BUFFERS,
            depth,
            epoch: 0,
            shutdown: false,
        };
        let state = State { plan, ring, budget: RuntimeBudget::new(budget, runtime_allowance) };
        let shared =
            Arc::new(Shared { state: Mutex::new(state), io_wake: Condvar::new(), ready_wake: Condvar::new(), host });
        let core = Arc::new(Core {
            reader,
            build,
            shared,
            stats,
            depth,
            io_thread: Mutex::new(None),
            stage,
            host_budget,
            ahead: Mutex::new(VecDeque::new()),
        });
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
        Ok(core)
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
        let host = &self.shared.host;
        let n = host.len();
        let next: Vec<usize> =
            (1..=self.depth.min(n.saturating_sub(1))).map(|d| (i + d) % n).filter(|&j| host[j].is_some()).collect();
        let mut ahead = lock(&self.ahead);
        ahead.retain(|(j, _)| next.contains(j));
        for j in next {
            if ahead.iter().all(|(k, _)| *k != j)
                && let Some(held) = &host[j]
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
            let mut state = lock(&self.shared.state);
            state.plan.touch(i);
            if let Some(layer) = state.plan.held(i) {
                self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(layer.clone());
            }
        }
        if let Some(held) = &self.shared.host[i] {
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
            Taken::Held(layer) => return Ok(layer),
            Taken::Read(Loaded::Host(mut buf)) => {
                self.reader.fix(i, &mut buf)?;
                let pinned = buf.is_pinned();
                let buf = self.lend(buf);
                (self.staged(i, buf.clone(), pinned)?, Some(buf))
            }
            Taken::Read(Loaded::Device(src)) => (src, None),
        };
        let layer = Arc::new((self.build)(&self.reader.tensors(i, src))?);
        self.admit(i, &layer, buf)?;
        Ok(layer)
    }

    /// A layer the plan (re-)admitted since it was evicted becomes resident as it streams
    /// by: the buffer itself where the compute reads host memory, else a copy of its own
    /// on the device (not a slot of the ring), from the buffer or read again when the
    /// layer went to the device without passing the host.
    fn admit(&self, i: usize, layer: &Arc<L>, buf: Option<Arc<LentBuf>>) -> Result<(), SchedError> {
        let own = match (&self.stage, buf) {
            (None, Some(buf)) => {
                let mut state = lock(&self.shared.state);
                if matches!(state.plan.slot(i), Some(Slot::Admitted)) {
                    buf.keep(&mut state.ring);
                    let _ = state.plan.hold(i, layer.clone());
                }
                drop(state);
                self.shared.io_wake.notify_all();
                return Ok(());
            }
            _ if !self.is_admitted(i) => return Ok(()),
            (_, Some(buf)) => Arc::new((self.build)(&self.reader.tensors(i, buf))?),
            (_, None) => {
                let mut own = AlignedBuf::new();
                self.reader.read(i, &mut own)?;
                self.reader.fix(i, &mut own)?;
                Arc::new((self.build)(&self.reader.tensors(i, Arc::new(own)))?)
            }
        };
        // The plan may have changed while the copy was made: then it is dropped, unlocked.
        let refused = lock(&self.shared.state).plan.hold(i, own).err();
        drop(refused);
        self.shared.io_wake.notify_all();
        Ok(())
    }

    /// Whether the plan admitted layer `i` and it is not loaded yet (takes the lock and
    /// lets it go).
    fn is_admitted(&self, i: usize) -> bool {
        matches!(lock(&self.shared.state).plan.slot(i), Some(Slot::Admitted))
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
    fn lend(&self, buf: AlignedBuf) -> Arc<LentBuf> {
        let home: Weak<Shared<L>> = Arc::downgrade(&self.shared);
        LentBuf::lend(buf, home)
    }

    /// Waits for the I/O thread to deliver layer `i`, redirecting it first if `i` is not
    /// what it is reading next. Time spent waiting counts as stall.
    fn take(&self, i: usize) -> Result<Taken<L>, SchedError> {
        let shared = &*self.shared;
        let mut state = lock(&shared.state);
        let mut waited: Option<Instant> = None;
        let got = loop {
            // Another caller made it resident while this one waited.
            if let Some(layer) = state.plan.held(i) {
                break Ok(Taken::Held(layer.clone()));
            }
            let ring = &mut state.ring;
            if let Some(pos) = ring.ready.iter().position(|(l, _)| *l == i) {
                // Entries before it are layers the compute skipped: recycle them.
                recycle(ring, pos);
                let (_, got) = ring.ready.pop_front().expect("found above");
                break got.map(Taken::Read);
            }
            // Whatever is ready was read for layers the compute has moved past.
            let all = ring.ready.len();
            recycle(ring, all);
            let coming = state.ring.loading == Some((i, state.ring.epoch))
                || (state.ring.loading.is_none() && state.next_layer(&shared.host) == Some(i));
            if !coming {
                // Out of the cyclic order (a new pass after a cancelled one, say): read
                // `i` next, and discard the read in flight.
                state.ring.cursor = i;
                state.ring.epoch += 1;
                self.stats.seeks.fetch_add(1, Ordering::Relaxed);
            }
            shared.io_wake.notify_all();
            waited.get_or_insert_with(Instant::now);
            state = shared.ready_wake.wait(state).unwrap_or_else(|e| e.into_inner());
        };
        drop(state);
        shared.io_wake.notify_all();
        if let Some(t) = waited {
            self.stats.stall_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        got
    }
}

/// What [`Core::take`] got: the read, or the layer already resident.
enum Taken<L> {
    Read(Loaded),
    Held(Arc<L>),
}

impl<L: Send + Sync + 'static> Streamer<L> for Core<L> {
    fn layer(&self, i: usize) -> Result<Arc<L>, SchedError> {
        self.pinned_layer(i)
    }

    fn resident_bytes(&self) -> u64 {
        lock(&self.shared.state).plan.resident_bytes()
    }

    fn paths(&self) -> Vec<std::path::PathBuf> {
        self.reader.paths()
    }

    /// Stops the I/O thread (it finishes the read in flight).
    fn stop(&self) {
        lock(&self.shared.state).ring.shutdown = true;
        self.shared.io_wake.notify_all();
        if let Some(handle) = lock(&self.io_thread).take() {
            let _ = handle.join();
        }
    }
}

impl<L: Send + Sync + 'static> CoreHandle for Core<L> {
    /// Runtime memory (a KV cache) was allocated (`delta > 0`) or freed: the part beyond
    /// the allowance comes out of the budget, evicting pinned layers (least recently
    /// used) now and re-admitting them as they next stream by once memory frees.
    fn adjust_runtime(&self, delta: i64) {
        let mut state = lock(&self.shared.state);
        state.budget.adjust(delta);
        let budget = state.budget.effective();
        let change = state.plan.set_budget(budget);
        drop(state);
        if !change.evicted.is_empty() || !change.admitted.is_empty() {
            tracing::info!(
                evicted = ?change.evicted,
                admitted = ?change.admitted,
                budget,
                "memory pressure changed the resident layers"
            );
        }
        // The evicted layers stream again; their weights drop here, unlocked.
        self.shared.io_wake.notify_all();
        drop(change);
    }

    fn summary(&self) -> SchedSummary {
        let state = lock(&self.shared.state);
        let mut plan = state.plan.summary();
        plan.budget_bytes = state.budget.effective();
        drop(state);
        SchedSummary {
            mode: "streaming",
            policy: Policy::Pinned,
            prefetch_depth: self.depth,
            direct_io: Some(self.reader.is_direct()),
            plan,
            host_tier: self.stage.as_ref().map(|_| self.host_tier()),
            upload: self.stage.as_ref().map(|s| s.summary()),
            experts: None,
            split: None,
        }
    }
}

impl<L> Core<L> {
    fn host_tier(&self) -> HostTierSummary {
        let host = &self.shared.host;
        let held: Vec<usize> = (0..host.len()).filter(|&l| host[l].is_some()).collect();
        HostTierSummary {
            budget_bytes: self.host_budget,
            resident_bytes: host.iter().flatten().map(|b| b.len() as u64).sum(),
            layers: format_ranges(&held),
            count: held.len(),
            pinned: host.iter().flatten().all(|b| b.is_pinned()),
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
fn io_thread<L>(reader: &Reader, shared: &Shared<L>, stats: &SchedStats, alloc: &Alloc, direct: Option<&Direct>) {
    let mut state = lock(&shared.state);
    loop {
        if state.ring.shutdown {
            return;
        }
        let next = state.next_layer(&shared.host);
        let ring = &mut state.ring;
        let in_flight = ring.ready.len() + usize::from(ring.loading.is_some());
        let have_buffer = !ring.free.is_empty() || ring.allocated < ring.max_buffers;
        let (Some(layer), true, true) = (next, in_flight < ring.depth, have_buffer) else {
            state = shared.io_wake.wait(state).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        let epoch = ring.epoch;
        ring.cursor = (layer + 1) % shared.host.len();
        ring.loading = Some((layer, epoch));
        if let Some(d) = direct {
            drop(state);
            let t = Instant::now();
            let read = d.read(reader, layer);
            stats.io_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            state = lock(&shared.state);
            if let Some((src, bytes)) = read {
                stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
                let ring = &mut state.ring;
                ring.loading = None;
                if ring.epoch == epoch {
                    ring.ready.push_back((layer, Ok(Loaded::Device(src))));
                    shared.ready_wake.notify_all();
                }
                continue;
            }
            // Not read directly: through host memory below.
        }
        let ring = &mut state.ring;
        let free = ring.free.pop();
        if free.is_none() {
            ring.allocated += 1;
        }
        drop(state);
        // A new buffer is allocated (and page-locked) outside the lock.
        let mut buf = free.unwrap_or_else(|| alloc.buf());
        let t = Instant::now();
        let read = reader.read(layer, &mut buf);
        stats.io_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        state = lock(&shared.state);
        let ring = &mut state.ring;
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
