//! The host→device leg of streaming (DESIGN.md §4–5), for a backend whose compute reads
//! its own memory (a GPU). The I/O thread reads storage into page-locked staging buffers
//! (or a layer of the host tier is already in one); [`Uploader::upload`] enqueues an
//! asynchronous copy of it into a device slot of a ring on a copy stream and makes the
//! compute stream wait for it; the layer's weights view the slot. A host-tier layer's copy
//! is enqueued `--prefetch-depth` layers early ([`Uploader::upload_early`]), and the
//! compute waits for it only where it uses the layer. Routed experts, which
//! a cache keeps, get device memory of their own instead ([`Uploader::upload_owned`]).
//! Where the engine reads storage straight into device memory (GPUDirect Storage),
//! [`Uploader::read_direct`] fills a slot without passing the host.
//!
//! Two orderings keep this correct without the host ever waiting on the GPU:
//! - a staging buffer goes back to its pool only after the copy reading it has completed
//!   (the reaper thread waits on each copy's event, then drops its hold on the buffer);
//! - a slot is reused only after the compute reading it has completed: when the layer's
//!   weights drop, an event is recorded on the compute stream, and the next copy into the
//!   slot waits for it on the copy stream.
//!
//! The device is abstract ([`CopyEngine`]): CUDA's streams and events in production, and a
//! recording fake in the tests, which executes copies and compute late and on its own
//! threads, and checks both orderings on what it executed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use serde::Serialize;

use crate::BackendError;
use strata_tensor::aligned::HostPin;
use strata_tensor::tensor::ByteSource;

/// Copies between host and device memory on a stream of their own, ordered against the
/// compute stream by events.
pub trait CopyEngine: Send + Sync + 'static {
    /// Completes when the work enqueued before it on its stream has.
    type Event: Send + Sync + 'static;
    /// Device memory for one unit.
    type Slot: Send + Sync + 'static;

    /// A device slot of `len` bytes. `direct`: storage may read straight into it (a slot
    /// of the ring, for GPUDirect Storage), so the engine may register it for that.
    fn alloc_slot(&self, len: usize, direct: bool) -> Result<Self::Slot, BackendError>;

    /// Enqueues on the copy stream: wait for `after` (the compute that last read `dst`),
    /// then copy `src` into the front of `dst`. The event returned completes with the copy.
    ///
    /// # Safety
    /// `src` must stay allocated and unchanged until the returned event has completed.
    unsafe fn copy(
        &self,
        src: &[u8],
        dst: &Self::Slot,
        after: Option<&Self::Event>,
    ) -> Result<Self::Event, BackendError>;

    /// Makes the compute stream wait for `event` before whatever is enqueued next.
    fn compute_wait(&self, event: &Self::Event) -> Result<(), BackendError>;

    /// An event on the compute stream: completes when everything enqueued there so far has.
    fn compute_mark(&self) -> Result<Self::Event, BackendError>;

    /// Blocks the calling thread until `event` has completed.
    fn synchronize(&self, event: &Self::Event) -> Result<(), BackendError>;

    /// Seconds the copy that returned `event` took on the device, once it has completed,
    /// where the engine times copies.
    fn copy_seconds(&self, _event: &Self::Event) -> Option<f64> {
        None
    }

    /// Seconds the compute stream waited on the device for the copy that returned
    /// `event` (0 when the copy was done first), once it has completed, where the engine
    /// times it.
    fn stall_seconds(&self, _event: &Self::Event) -> Option<f64> {
        None
    }

    /// Reads `reads` from storage straight into `dst` (GPUDirect Storage), synchronously,
    /// where the engine can: `None` when it cannot. Returns the bytes read.
    fn read_into(&self, _dst: &Self::Slot, _reads: &[DeviceRead<'_>]) -> Option<Result<u64, BackendError>> {
        None
    }

    /// How [`CopyEngine::read_into`] moves bytes (`direct` or `compat`), where it can.
    fn direct_mode(&self) -> Option<&'static str> {
        None
    }

    /// The first `len` bytes of `slot`, copied back to the host (for the rare reader of
    /// a unit's host bytes when the unit went to the device without passing the host).
    fn download(&self, slot: &Self::Slot, len: usize) -> Result<Vec<u8>, BackendError>;
}

/// One read of a unit from storage straight into device memory: `len` bytes at `offset`
/// of `path`, to byte `dst` of the slot; at least `min` of them exist (the rest is
/// widening past the end of the file).
#[derive(Clone, Copy, Debug)]
pub struct DeviceRead<'a> {
    pub path: &'a std::path::Path,
    pub offset: u64,
    pub len: usize,
    pub min: usize,
    pub dst: usize,
}

/// What [`Uploader`] has moved, for `bench`, `/api/ps` and `/metrics`.
#[derive(Debug, Default)]
pub struct TransferStats {
    /// Bytes copied host → device.
    pub h2d_bytes: AtomicU64,
    /// Copies enqueued, and of those, from memory the OS would not page-lock.
    pub copies: AtomicU64,
    pub pageable_copies: AtomicU64,
    /// Device time of the copies that have completed (where the engine times them).
    pub copy_ns: AtomicU64,
    /// Device time the compute stream waited for copies.
    pub stall_ns: AtomicU64,
    /// Slots allocated beyond the ring because every slot was held.
    pub extra_slots: AtomicU64,
    /// Device bytes the slots hold now.
    pub slot_bytes: AtomicU64,
}

/// [`TransferStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct TransferSnapshot {
    pub h2d_bytes: u64,
    pub copies: u64,
    pub pageable_copies: u64,
    pub copy_ns: u64,
    /// Device time the compute waited for copies.
    pub copy_stall_ns: u64,
    /// Device bytes the streaming slots hold (a level, not a count: the later one of two
    /// snapshots wins when they are subtracted or added).
    pub slot_bytes: u64,
}

impl std::ops::Add for TransferSnapshot {
    type Output = TransferSnapshot;
    fn add(self, o: TransferSnapshot) -> TransferSnapshot {
        TransferSnapshot {
            h2d_bytes: self.h2d_bytes + o.h2d_bytes,
            copies: self.copies + o.copies,
            pageable_copies: self.pageable_copies + o.pageable_copies,
            copy_ns: self.copy_ns + o.copy_ns,
            copy_stall_ns: self.copy_stall_ns + o.copy_stall_ns,
            slot_bytes: self.slot_bytes.max(o.slot_bytes),
        }
    }
}

impl std::ops::Sub for TransferSnapshot {
    type Output = TransferSnapshot;
    fn sub(self, o: TransferSnapshot) -> TransferSnapshot {
        TransferSnapshot {
            h2d_bytes: self.h2d_bytes.saturating_sub(o.h2d_bytes),
            copies: self.copies.saturating_sub(o.copies),
            pageable_copies: self.pageable_copies.saturating_sub(o.pageable_copies),
            copy_ns: self.copy_ns.saturating_sub(o.copy_ns),
            copy_stall_ns: self.copy_stall_ns.saturating_sub(o.copy_stall_ns),
            slot_bytes: self.slot_bytes,
        }
    }
}

impl TransferStats {
    pub fn snapshot(&self) -> TransferSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransferSnapshot {
            h2d_bytes: get(&self.h2d_bytes),
            copies: get(&self.copies),
            pageable_copies: get(&self.pageable_copies),
            copy_ns: get(&self.copy_ns),
            copy_stall_ns: get(&self.stall_ns),
            slot_bytes: get(&self.slot_bytes),
        }
    }
}

/// How streamed units reach the device, as `bench`, `/api/ps` and `/metrics` show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct UploadSummary {
    /// Device slots in the ring, and the bytes each holds (the largest streamed unit).
    pub ring_slots: usize,
    pub slot_bytes: u64,
    /// Host→device bandwidth from page-locked memory, measured when the model loaded.
    pub h2d_bandwidth_bytes_s: Option<f64>,
    /// How storage is read straight into device memory: `direct` (GPUDirect Storage),
    /// `compat` (cuFile's compatibility mode, through its own host buffers), or `None`
    /// (through page-locked host memory and the copy engine).
    pub gds: Option<String>,
}

/// The scheduler's view of an uploader, whatever its engine: a streamed unit's host bytes
/// in, a byte source whose tensors the backend can view on the device out.
pub trait Stage: Send + Sync {
    /// Enqueues the upload of `host` (read-only from now on) and returns a source with
    /// the same bytes whose device copy the backend's `weight` views (see
    /// [`ByteSource::device_copy`]). `pinned`: whether `host` is page-locked.
    fn stage(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Arc<dyn ByteSource>, BackendError>;
    /// As [`Stage::stage`], ahead of the unit's use: the copy is enqueued now, and the
    /// compute is ordered after it only by [`Early::ready`], when the unit is about to be
    /// used (ordering it now would hold up the compute enqueued in between).
    fn stage_early(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Early, BackendError>;
    /// As [`Stage::stage`], into device memory of the unit's own rather than a slot of
    /// the ring: for units a cache keeps (routed experts).
    fn stage_owned(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Arc<dyn ByteSource>, BackendError>;
    /// Page-locks staging buffers, where the engine can.
    fn host_pin(&self) -> Option<Arc<dyn HostPin>>;
    /// Reads a unit of `len` bytes from storage straight into a slot of the ring
    /// (GPUDirect Storage). `None` where the engine cannot, or when a direct read fails
    /// (said once in the log; from then on every unit goes through host memory): the
    /// caller then reads it through host memory.
    fn read_direct(&self, reads: &[DeviceRead<'_>], len: usize) -> Option<Arc<dyn ByteSource>>;
    fn stats(&self) -> TransferSnapshot;
    fn summary(&self) -> UploadSummary;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Free slots, each with the compute event its last reader left (oldest first).
struct Pool<E: CopyEngine> {
    free: VecDeque<(E::Slot, Option<E::Event>)>,
    /// Slots in existence: free, or held by staged units.
    allocated: usize,
}

struct Inner<E: CopyEngine> {
    engine: Arc<E>,
    slot_len: usize,
    /// Slots the ring holds (`--prefetch-depth` + the unit computing + a spare).
    ring: usize,
    pool: Mutex<Pool<E>>,
    stats: Arc<TransferStats>,
    warned_extra: AtomicBool,
    /// The reaper's queue (`None` once the uploader is dropped: then the caller waits).
    reaper: Mutex<Option<mpsc::Sender<Reap<E>>>>,
}

impl<E: CopyEngine> Inner<E> {
    /// Keeps `keep` until `event` completes: hands both to the reaper, or waits here when
    /// there is none.
    fn reap(&self, event: Arc<E::Event>, keep: Keep<E>) {
        let reap = Reap { event, _keep: keep };
        let unsent = match lock(&self.reaper).as_ref() {
            Some(tx) => tx.send(reap).err().map(|mpsc::SendError(r)| r),
            None => Some(reap),
        };
        if let Some(reap) = unsent {
            let _ = self.engine.synchronize(&reap.event);
        }
    }
}

impl<E: CopyEngine> Drop for Inner<E> {
    fn drop(&mut self) {
        let allocated = lock(&self.pool).allocated as u64;
        self.stats.slot_bytes.fetch_sub(allocated * self.slot_len as u64, Ordering::Relaxed);
    }
}

/// What the reaper keeps until an event completes: the host bytes a copy reads, or a
/// device slot of its own that the compute may still read. Held, never read: dropping it
/// is the point.
#[allow(dead_code)]
enum Keep<E: CopyEngine> {
    Host(Arc<dyn ByteSource>),
    Slot(E::Slot),
}

/// An event the reaper waits for, and what it keeps alive until then.
struct Reap<E: CopyEngine> {
    event: Arc<E::Event>,
    _keep: Keep<E>,
}

/// Uploads streamed units into a ring of device slots; see the module docs.
pub struct Uploader<E: CopyEngine> {
    inner: Arc<Inner<E>>,
    reaper_thread: Mutex<Option<JoinHandle<()>>>,
    pin: Option<Arc<dyn HostPin>>,
    h2d_bandwidth: Option<f64>,
    /// Set when a direct read failed: from then on units go through host memory.
    direct_failed: AtomicBool,
}

impl<E: CopyEngine> Uploader<E> {
    /// An uploader with `ring` slots of `slot_len` bytes (allocated as first needed).
    /// `pin` page-locks staging buffers (none: they stay pageable).
    pub fn new(
        engine: Arc<E>,
        slot_len: usize,
        ring: usize,
        pin: Option<Arc<dyn HostPin>>,
        stats: Arc<TransferStats>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Reap<E>>();
        let inner = Arc::new(Inner {
            engine,
            slot_len,
            ring: ring.max(1),
            pool: Mutex::new(Pool { free: VecDeque::new(), allocated: 0 }),
            stats,
            warned_extra: AtomicBool::new(false),
            reaper: Mutex::new(Some(tx)),
        });
        let reaper_inner = inner.clone();
        let thread = std::thread::Builder::new().name("strata-reap".into()).spawn(move || {
            for reap in rx {
                let engine = &reaper_inner.engine;
                if let Err(e) = engine.synchronize(&reap.event) {
                    // The device failed; the compute sees the same error on its next op.
                    tracing::error!(error = %e, "waiting for a host-to-device copy");
                }
                if let Some(s) = engine.copy_seconds(&reap.event) {
                    reaper_inner.stats.copy_ns.fetch_add((s * 1e9) as u64, Ordering::Relaxed);
                }
                if let Some(s) = engine.stall_seconds(&reap.event) {
                    reaper_inner.stats.stall_ns.fetch_add((s * 1e9) as u64, Ordering::Relaxed);
                }
                // Dropping `reap` now returns the staging buffer to its pool, or frees
                // a slot of its own.
            }
        })?;
        Ok(Uploader {
            inner,
            reaper_thread: Mutex::new(Some(thread)),
            pin,
            h2d_bandwidth: None,
            direct_failed: AtomicBool::new(false),
        })
    }

    /// Records the host→device bandwidth measured for this engine (for the summary).
    pub fn with_bandwidth(mut self, bytes_per_sec: Option<f64>) -> Self {
        self.h2d_bandwidth = bytes_per_sec;
        self
    }

    /// Slots allocated now (free or held).
    pub fn slots_allocated(&self) -> usize {
        lock(&self.inner.pool).allocated
    }

    /// A free slot with the event its last reader left, or a new one. Never waits: slot
    /// reuse is ordered on the device. When every slot of the ring is held (a caller
    /// keeping more units than the ring was sized for), one more is allocated, with a
    /// warning.
    fn take_slot(&self) -> Result<(E::Slot, Option<E::Event>), BackendError> {
        let inner = &*self.inner;
        let mut pool = lock(&inner.pool);
        if let Some(free) = pool.free.pop_front() {
            return Ok(free);
        }
        if pool.allocated >= inner.ring {
            inner.stats.extra_slots.fetch_add(1, Ordering::Relaxed);
            if !inner.warned_extra.swap(true, Ordering::Relaxed) {
                tracing::warn!(ring = inner.ring, "every device slot is in use: allocating one beyond the ring");
            }
        }
        pool.allocated += 1;
        drop(pool);
        match inner.engine.alloc_slot(inner.slot_len, true) {
            Ok(slot) => {
                inner.stats.slot_bytes.fetch_add(inner.slot_len as u64, Ordering::Relaxed);
                Ok((slot, None))
            }
            Err(e) => {
                lock(&inner.pool).allocated -= 1;
                Err(e)
            }
        }
    }

    /// See [`Stage::stage`]; the typed result gives the slot to the engine's backend.
    pub fn upload(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Arc<Staged<E>>, BackendError> {
        Ok(self.upload_unordered(host, pinned, true)?.0)
    }

    /// See [`Stage::stage_early`].
    pub fn upload_early(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Early, BackendError> {
        let (staged, event) = self.upload_unordered(host, pinned, false)?;
        let inner = self.inner.clone();
        Ok(Early { src: staged, wait: Box::new(move || inner.engine.compute_wait(&event)) })
    }

    /// Enqueues the copy into a slot of the ring, and with `order` the compute's wait
    /// for it.
    fn upload_unordered(
        &self,
        host: Arc<dyn ByteSource>,
        pinned: bool,
        order: bool,
    ) -> Result<Uploaded<E>, BackendError> {
        let inner = &*self.inner;
        let len = host.bytes().len();
        if len > inner.slot_len {
            return Err(BackendError::Device {
                op: "staging a streamed unit".into(),
                msg: format!("{len} bytes do not fit a {}-byte slot", inner.slot_len),
            });
        }
        let (slot, after) = self.take_slot()?;
        // SAFETY: `host` is kept alive and unchanged (nothing writes a staged buffer while
        // an `Arc` to it exists) until the reaper has seen `event` complete.
        let event = match unsafe { inner.engine.copy(host.bytes(), &slot, after.as_ref()) } {
            Ok(e) => e,
            Err(e) => {
                lock(&inner.pool).free.push_front((slot, after));
                return Err(e);
            }
        };
        drop(after);
        let hold = Arc::new(SlotHold { slot: Some(slot), home: Arc::downgrade(&self.inner), owned: false });
        self.finish(host, hold, event, pinned, order)
    }

    /// Uploads `host` into device memory of its own (not a slot of the ring), for a unit
    /// a cache keeps (a routed expert): freed once the last weight viewing it drops and
    /// the compute reading it has completed.
    pub fn upload_owned(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Arc<Staged<E>>, BackendError> {
        let inner = &*self.inner;
        // Only copies fill it: no registration for direct reads.
        let slot = inner.engine.alloc_slot(host.bytes().len(), false)?;
        // SAFETY: as in `upload`.
        let event = unsafe { inner.engine.copy(host.bytes(), &slot, None) }?;
        let hold = Arc::new(SlotHold { slot: Some(slot), home: Arc::downgrade(&self.inner), owned: true });
        Ok(self.finish(host, hold, event, pinned, true)?.0)
    }

    /// See [`Stage::read_direct`]. A storage read is ordered on no stream, so this waits
    /// here for the slot's last reader to finish before it may be overwritten.
    pub fn read_direct(&self, reads: &[DeviceRead<'_>], len: usize) -> Option<Arc<dyn ByteSource>> {
        let inner = &*self.inner;
        if len > inner.slot_len || self.direct_failed.load(Ordering::Relaxed) || inner.engine.direct_mode().is_none() {
            return None;
        }
        let failed = |e: BackendError| {
            if !self.direct_failed.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "a GPUDirect Storage read failed: reading through host memory from now on");
            }
        };
        let (slot, after) = self.take_slot().map_err(failed).ok()?;
        let read = match after.as_ref().map(|a| inner.engine.synchronize(a)) {
            Some(Err(e)) => Some(Err(e)),
            _ => inner.engine.read_into(&slot, reads),
        };
        match read {
            Some(Ok(_)) => {
                let hold = Arc::new(SlotHold { slot: Some(slot), home: Arc::downgrade(&self.inner), owned: false });
                Some(Arc::new(DeviceOnly { hold, len, host: std::sync::OnceLock::new() }))
            }
            other => {
                lock(&inner.pool).free.push_front((slot, None));
                if let Some(Err(e)) = other {
                    failed(e);
                }
                None
            }
        }
    }

    /// With `order`, orders the compute after the copy (else the caller does, before the
    /// unit is used); counts the copy, and has the reaper keep `host` until it completes.
    fn finish(
        &self,
        host: Arc<dyn ByteSource>,
        hold: Arc<SlotHold<E>>,
        event: E::Event,
        pinned: bool,
        order: bool,
    ) -> Result<Uploaded<E>, BackendError> {
        let inner = &*self.inner;
        let waited = if order { inner.engine.compute_wait(&event) } else { Ok(()) };
        inner.stats.h2d_bytes.fetch_add(host.bytes().len() as u64, Ordering::Relaxed);
        inner.stats.copies.fetch_add(1, Ordering::Relaxed);
        if !pinned {
            inner.stats.pageable_copies.fetch_add(1, Ordering::Relaxed);
        }
        let event = Arc::new(event);
        inner.reap(event.clone(), Keep::Host(host.clone()));
        waited?;
        Ok((Arc::new(Staged { host, hold }), event))
    }
}

impl<E: CopyEngine> Drop for Uploader<E> {
    fn drop(&mut self) {
        lock(&self.inner.reaper).take();
        if let Some(t) = lock(&self.reaper_thread).take() {
            let _ = t.join();
        }
    }
}

impl<E: CopyEngine> Stage for Uploader<E> {
    fn stage(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Arc<dyn ByteSource>, BackendError> {
        Ok(self.upload(host, pinned)?)
    }

    fn stage_early(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Early, BackendError> {
        self.upload_early(host, pinned)
    }

    fn stage_owned(&self, host: Arc<dyn ByteSource>, pinned: bool) -> Result<Arc<dyn ByteSource>, BackendError> {
        Ok(self.upload_owned(host, pinned)?)
    }

    fn host_pin(&self) -> Option<Arc<dyn HostPin>> {
        self.pin.clone()
    }

    fn read_direct(&self, reads: &[DeviceRead<'_>], len: usize) -> Option<Arc<dyn ByteSource>> {
        Uploader::read_direct(self, reads, len)
    }

    fn stats(&self) -> TransferSnapshot {
        self.inner.stats.snapshot()
    }

    fn summary(&self) -> UploadSummary {
        UploadSummary {
            ring_slots: self.inner.ring,
            slot_bytes: self.inner.slot_len as u64,
            h2d_bandwidth_bytes_s: self.h2d_bandwidth,
            gds: match self.direct_failed.load(Ordering::Relaxed) {
                true => None,
                false => self.inner.engine.direct_mode().map(str::to_string),
            },
        }
    }
}

/// A staged unit, and the event its copy completes with.
type Uploaded<E> = (Arc<Staged<E>>, Arc<<E as CopyEngine>::Event>);

/// A unit staged ahead of its use ([`Stage::stage_early`]).
pub struct Early {
    src: Arc<dyn ByteSource>,
    wait: Box<dyn FnOnce() -> Result<(), BackendError> + Send + Sync>,
}

impl Early {
    /// Orders the compute enqueued from now on after the unit's copy, and gives its
    /// bytes. (Dropped unused instead, the unit's slot goes back to the ring.)
    pub fn ready(self) -> Result<Arc<dyn ByteSource>, BackendError> {
        (self.wait)()?;
        Ok(self.src)
    }
}

/// A device slot held by the weights that view it. Dropping the last view records an
/// event on the compute stream and returns the slot to the pool with it (or, for a slot
/// of the unit's own, frees it once that event completes).
pub struct SlotHold<E: CopyEngine> {
    slot: Option<E::Slot>,
    home: Weak<Inner<E>>,
    owned: bool,
}

impl<E: CopyEngine> SlotHold<E> {
    pub fn slot(&self) -> &E::Slot {
        self.slot.as_ref().expect("a held slot is present until drop")
    }
}

impl<E: CopyEngine> Drop for SlotHold<E> {
    fn drop(&mut self) {
        let (Some(slot), Some(inner)) = (self.slot.take(), self.home.upgrade()) else { return };
        match inner.engine.compute_mark() {
            Ok(mark) if self.owned => inner.reap(Arc::new(mark), Keep::Slot(slot)),
            Ok(mark) => {
                lock(&inner.pool).free.push_back((slot, Some(mark)));
            }
            Err(e) if self.owned => {
                tracing::error!(error = %e, "recording the end of a cached unit's compute");
                drop(slot);
            }
            Err(e) => {
                // Without an event the slot's last reader cannot be waited for: retire it.
                tracing::error!(error = %e, "recording the end of a streamed unit's compute");
                lock(&inner.pool).allocated -= 1;
                inner.stats.slot_bytes.fetch_sub(inner.slot_len as u64, Ordering::Relaxed);
                drop(slot);
            }
        }
    }
}

/// A streamed unit's bytes on the host, and its copy in a device slot.
pub struct Staged<E: CopyEngine> {
    host: Arc<dyn ByteSource>,
    hold: Arc<SlotHold<E>>,
}

impl<E: CopyEngine> Staged<E> {
    pub fn hold(&self) -> &Arc<SlotHold<E>> {
        &self.hold
    }
}

impl<E: CopyEngine> ByteSource for Staged<E> {
    fn bytes(&self) -> &[u8] {
        self.host.bytes()
    }

    fn device_copy(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self.hold.clone())
    }
}

/// A unit read from storage straight into a device slot: its host bytes exist only if
/// something asks for them, copied back from the device then.
struct DeviceOnly<E: CopyEngine> {
    hold: Arc<SlotHold<E>>,
    len: usize,
    host: std::sync::OnceLock<Vec<u8>>,
}

impl<E: CopyEngine> ByteSource for DeviceOnly<E> {
    fn bytes(&self) -> &[u8] {
        self.host.get_or_init(|| {
            let inner = self.hold.home.upgrade();
            match inner.map(|i| i.engine.download(self.hold.slot(), self.len)) {
                Some(Ok(bytes)) => bytes,
                Some(Err(e)) => {
                    // The device failed: its next op fails too, and the request with it.
                    tracing::error!(error = %e, "copying a streamed unit back from the device");
                    vec![0; self.len]
                }
                None => vec![0; self.len],
            }
        })
    }

    fn device_copy(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self.hold.clone())
    }
}

#[cfg(test)]
mod tests;
