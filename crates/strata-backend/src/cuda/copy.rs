//! CUDA's copy engine for the upload pipeline ([`crate::stage`]): a stream of its
//! own for host→device copies, events that order it against the compute stream, device
//! slots, and page-locking of the streamer's staging buffers (`cuMemHostRegister`).
//!
//! With `CU_STREAM_NON_BLOCKING` copy streams the copy engine runs beside the kernels;
//! only what the events say orders the two.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DriverError, sys};

use super::gds::{Gds, GdsBuffer, GdsFile};
use super::memory::{Tracked, dev_err as err};
use crate::BackendError;
use crate::stage::{CopyEngine, DeviceRead};
use strata_tensor::aligned::{AlignedBuf, HostPin};

/// Host→device copies on their own stream, and storage reads straight into device
/// memory where GPUDirect Storage works.
pub struct CudaCopy {
    copy: Arc<CudaStream>,
    compute: Arc<CudaStream>,
    /// Device bytes the backend has allocated (slots count in it).
    used: Arc<AtomicU64>,
    gds: Option<Direct>,
}

/// The cuFile driver and the files opened through it, by path.
struct Direct {
    gds: Arc<Gds>,
    files: Mutex<HashMap<PathBuf, Arc<GdsFile>>>,
}

impl Direct {
    fn file(&self, path: &Path) -> Result<Arc<GdsFile>, String> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = files.get(path) {
            return Ok(f.clone());
        }
        let f = Arc::new(self.gds.open_file(path)?);
        files.insert(path.to_path_buf(), f.clone());
        Ok(f)
    }
}

/// A device slot: one streamed unit's bytes. (Fields drop in order: the cuFile
/// registration goes before the memory.)
pub struct CudaSlot {
    _registered: Option<GdsBuffer>,
    data: CudaSlice<u8>,
    _tracked: Tracked,
}

impl CudaSlot {
    /// The device address of byte `offset`.
    pub fn ptr(&self, stream: &CudaStream, offset: usize) -> u64 {
        let (p, _sync) = self.data.device_ptr(stream);
        p + offset as u64
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.len() == 0
    }
}

/// The end of a copy (timed from `start`), or a mark on the compute stream. `waited`:
/// recorded on the compute stream where it began to wait for the copy.
pub struct CopyEvent {
    start: Option<CudaEvent>,
    end: CudaEvent,
    waited: Mutex<Option<CudaEvent>>,
}

impl CudaCopy {
    /// A copy stream beside `compute` (the backend's stream); with `gds`, storage reads
    /// go straight into device slots.
    pub fn new(compute: Arc<CudaStream>, used: Arc<AtomicU64>, gds: Option<Arc<Gds>>) -> Result<Self, BackendError> {
        let copy = compute.context().new_stream().map_err(err("creating the copy stream", 0))?;
        let gds = gds.map(|gds| Direct { gds, files: Mutex::default() });
        Ok(CudaCopy { copy, compute, used, gds })
    }

    fn ctx(&self) -> &Arc<CudaContext> {
        self.compute.context()
    }
}

impl CopyEngine for CudaCopy {
    type Event = CopyEvent;
    type Slot = CudaSlot;

    fn alloc_slot(&self, len: usize, direct: bool) -> Result<CudaSlot, BackendError> {
        let what = "a streaming slot";
        // Left unset: a slot is read only where a copy or a storage read wrote it first.
        // Expert misses allocate one each (not `direct`: only copies fill them), so this
        // stays off the host's critical path: no memset, and neither a wait nor a cuFile
        // registration (each costs more than the copy of an expert) unless storage may
        // read into it.
        // SAFETY: as said, nothing reads a slot's bytes before they are written.
        let data = unsafe { self.copy.alloc::<u8>(len.max(1)) }.map_err(err(what, len as u64))?;
        // The allocation is ordered on the copy stream; the compute stream first reads
        // it after waiting on a copy into it. A slot storage reads land in is registered
        // with cuFile (unregistered, cuFile still reads into it, through its own buffers),
        // which needs the memory to exist now.
        let gds = self.gds.as_ref().filter(|_| direct);
        if gds.is_some() {
            self.copy.synchronize().map_err(err(what, len as u64))?;
        }
        let registered = gds.and_then(|d| {
            let (p, _sync) = data.device_ptr(&self.copy);
            d.gds.register_buffer(p, data.len()).map_err(|e| tracing::debug!(error = %e, "cuFileBufRegister")).ok()
        });
        Ok(CudaSlot { _registered: registered, _tracked: Tracked::new(data.len() as u64, &self.used), data })
    }

    unsafe fn copy(&self, src: &[u8], dst: &CudaSlot, after: Option<&CopyEvent>) -> Result<CopyEvent, BackendError> {
        if src.len() > dst.len() {
            return Err(BackendError::Device {
                op: "host-to-device copy".into(),
                msg: format!("{} bytes into a {}-byte slot", src.len(), dst.len()),
            });
        }
        if let Some(after) = after {
            self.copy.wait(&after.end).map_err(err("ordering a copy after the compute", 0))?;
        }
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.copy.record_event(timing).map_err(err("recording a copy's start", 0))?;
        let dst_ptr = dst.ptr(&self.copy, 0);
        self.ctx().bind_to_thread().map_err(err("host-to-device copy", 0))?;
        // SAFETY: `dst` holds at least `src.len()` bytes (checked above) and lives in the
        // slot pool until this copy's event and the compute after it complete; the caller
        // keeps `src` allocated and unchanged until the returned event completes. From
        // page-locked memory the copy is asynchronous; from pageable memory the driver
        // stages it and returns once `src` has been read, which is also correct.
        let rc = unsafe { sys::cuMemcpyHtoDAsync_v2(dst_ptr, src.as_ptr().cast(), src.len(), self.copy.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(err("host-to-device copy", src.len() as u64)(DriverError(rc)));
        }
        let end = self.copy.record_event(timing).map_err(err("recording a copy's end", 0))?;
        Ok(CopyEvent { start: Some(start), end, waited: Mutex::new(None) })
    }

    fn compute_wait(&self, event: &CopyEvent) -> Result<(), BackendError> {
        // Where the compute stream stands when it begins to wait, to time the wait.
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let at = self.compute.record_event(timing).map_err(err("recording a compute wait", 0))?;
        *event.waited.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        self.compute.wait(&event.end).map_err(err("ordering the compute after a copy", 0))
    }

    fn compute_mark(&self) -> Result<CopyEvent, BackendError> {
        let end = self.compute.record_event(None).map_err(err("recording the end of a unit's compute", 0))?;
        Ok(CopyEvent { start: None, end, waited: Mutex::new(None) })
    }

    fn synchronize(&self, event: &CopyEvent) -> Result<(), BackendError> {
        event.end.synchronize().map_err(err("waiting for a copy", 0))
    }

    fn copy_seconds(&self, event: &CopyEvent) -> Option<f64> {
        let ms = event.start.as_ref()?.elapsed_ms(&event.end).ok()?;
        Some(f64::from(ms) / 1e3)
    }

    fn read_into(&self, dst: &CudaSlot, reads: &[DeviceRead<'_>]) -> Option<Result<u64, BackendError>> {
        let direct = self.gds.as_ref()?;
        let fail = |msg: String| BackendError::Device { op: "GPUDirect Storage read".into(), msg };
        let read = || -> Result<u64, BackendError> {
            // cuFile reads into the memory of the context current on this thread.
            self.ctx().bind_to_thread().map_err(err("GPUDirect Storage read", 0))?;
            let base = dst.ptr(&self.copy, 0);
            let mut total = 0u64;
            for r in reads {
                if r.dst + r.len > dst.len() {
                    return Err(fail(format!("{} bytes at {} do not fit a {}-byte slot", r.len, r.dst, dst.len())));
                }
                let n = direct.file(r.path).map_err(fail)?.read(base, r.dst, r.len, r.offset).map_err(fail)?;
                if n < r.min {
                    let msg = format!("{}: {n} bytes at offset {}, {} expected", r.path.display(), r.offset, r.min);
                    return Err(fail(msg));
                }
                total += n as u64;
            }
            Ok(total)
        };
        Some(read())
    }

    fn direct_mode(&self) -> Option<&'static str> {
        self.gds.as_ref().map(|d| d.gds.mode().as_str())
    }

    fn download(&self, slot: &CudaSlot, len: usize) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; len.min(slot.len())];
        let n = out.len();
        self.copy.memcpy_dtoh(&slot.data.slice(..n), &mut out).map_err(err("copying a unit back to the host", 0))?;
        self.copy.synchronize().map_err(err("copying a unit back to the host", 0))?;
        Ok(out)
    }

    fn stall_seconds(&self, event: &CopyEvent) -> Option<f64> {
        let waited = event.waited.lock().unwrap_or_else(|e| e.into_inner());
        // Negative when the copy had finished before the compute reached it: no stall.
        let ms = waited.as_ref()?.elapsed_ms(&event.end).ok()?;
        Some(f64::from(ms.max(0.0)) / 1e3)
    }
}

/// Page-locks host buffers for the copy engine. When the OS refuses (`ulimit -l`,
/// systemd's `LimitMEMLOCK`), the buffer stays pageable and the log says so once.
pub struct CudaPin {
    ctx: Arc<CudaContext>,
    refused: AtomicBool,
    /// What is page-locked now: address → bytes.
    locked: Mutex<HashMap<usize, usize>>,
}

impl CudaPin {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        CudaPin { ctx, refused: AtomicBool::new(false), locked: Mutex::default() }
    }

    /// Bytes page-locked now.
    pub fn locked_bytes(&self) -> u64 {
        self.locked.lock().unwrap_or_else(|e| e.into_inner()).values().map(|&n| n as u64).sum()
    }

    /// Whether the OS has refused a page-lock.
    pub fn was_refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }
}

impl HostPin for CudaPin {
    fn pin(&self, ptr: *mut u8, len: usize) -> bool {
        if self.ctx.bind_to_thread().is_err() {
            return false;
        }
        // SAFETY: `ptr` is the start of a live allocation of `len` bytes that stays put
        // until `unpin` (AlignedBuf unpins before it frees or reallocates).
        let rc = unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, 0) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            self.locked.lock().unwrap_or_else(|e| e.into_inner()).insert(ptr as usize, len);
            return true;
        }
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                bytes = len,
                error = ?rc,
                "the OS refused to page-lock a staging buffer (ulimit -l, or LimitMEMLOCK under systemd): \
                 copies to the GPU go through pageable memory, which is slower"
            );
        }
        false
    }

    fn unpin(&self, ptr: *mut u8) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: `ptr` was registered by `pin` and is still allocated.
        let rc = unsafe { sys::cuMemHostUnregister(ptr.cast()) };
        self.locked.lock().unwrap_or_else(|e| e.into_inner()).remove(&(ptr as usize));
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(error = ?rc, "unlocking a staging buffer");
        }
    }
}

/// Host→device bandwidth through the copy engine from page-locked memory: the median of
/// five timed 64 MiB copies (after one untimed), in bytes per second. `None` when the
/// memory cannot be had or locked.
pub fn measure_h2d(compute: &Arc<CudaStream>) -> Option<f64> {
    const LEN: usize = 64 << 20;
    let pin = Arc::new(CudaPin::new(compute.context().clone()));
    let mut host = AlignedBuf::with_capacity(LEN);
    host.resize_discarding(LEN);
    if !host.pin_with(pin) {
        return None;
    }
    let engine = CudaCopy::new(compute.clone(), Arc::default(), None).ok()?;
    let slot = engine.alloc_slot(LEN, false).ok()?;
    let mut secs = Vec::new();
    for i in 0..6 {
        // SAFETY: `host` outlives the copy: it is waited for before the next iteration.
        let ev = unsafe { engine.copy(host.as_slice(), &slot, None) }.ok()?;
        engine.synchronize(&ev).ok()?;
        if i > 0 {
            secs.push(engine.copy_seconds(&ev)?);
        }
    }
    secs.sort_by(f64::total_cmp);
    let median = secs[secs.len() / 2];
    (median > 0.0).then(|| LEN as f64 / median)
}
