//! Page-locked staging for the small host→device copies a forward pass makes on the
//! compute stream: rope positions, row lists, token ids, the norms of a streamed layer
//! converted on the host. From pageable memory the driver may wait for the stream before
//! such a copy (CUDA's "API synchronization behavior"), which would keep the host from
//! running ahead of the device; from page-locked memory the copy is asynchronous.
//!
//! The bytes must then stay unchanged until the copy has run. The staging memory is two
//! halves filled in turn, and a half is written again only once an event, recorded on
//! the stream when the filling moved on from it, has completed: a whole half of small
//! copies later, long done in practice. `STRATA_CUDA_STAGING=off` copies from pageable
//! memory as before (for comparison).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, DriverError, result, sys};

/// Bytes of each half.
pub(super) const HALF: usize = 1 << 20;

pub(super) struct Staging {
    base: *mut u8,
    /// The half being filled, and the next free byte in it.
    cur: usize,
    head: usize,
    /// Per half, an event that completes once every copy from it has.
    fence: [Option<CudaEvent>; 2],
    stream: Arc<CudaStream>,
}

// SAFETY: `base` is page-locked host memory this value owns; it is only touched through
// `&mut self` (the backend keeps the value behind a lock).
unsafe impl Send for Staging {}

impl Staging {
    /// Staging for copies on `stream`, unless `STRATA_CUDA_STAGING` is `off`.
    pub fn from_env(stream: &Arc<CudaStream>) -> Result<Option<Staging>, DriverError> {
        if strata_tensor::env::CUDA_STAGING.switch() == Some(false) {
            return Ok(None);
        }
        stream.context().bind_to_thread()?;
        // SAFETY: a plain page-locked allocation, freed in `drop`.
        let base = unsafe { result::malloc_host(2 * HALF, 0) }?.cast::<u8>();
        Ok(Some(Staging { base, cur: 0, head: 0, fence: [None, None], stream: stream.clone() }))
    }

    /// Fills the staging memory from its start again. Only once every copy from it has
    /// run (the stream idle).
    pub fn restart(&mut self) {
        self.cur = 0;
        self.head = 0;
        self.fence = [None, None];
    }

    /// Whether `n` bytes fit in the half being filled, so that staging them waits for
    /// nothing (a CUDA graph capture must not).
    pub fn fits(&self, n: usize) -> bool {
        self.head.next_multiple_of(64) + n <= HALF
    }

    /// Copies `src` into staging memory and enqueues its copy to device address `dst` on
    /// the stream. `None` when `src` is larger than a half: the caller copies it as it is.
    ///
    /// # Safety
    /// `dst` must hold at least `src.len()` bytes until the copy has run.
    pub unsafe fn copy(&mut self, src: &[u8], dst: sys::CUdeviceptr) -> Option<Result<(), DriverError>> {
        let n = src.len();
        if n > HALF {
            return None;
        }
        if n == 0 {
            return Some(Ok(()));
        }
        // SAFETY: as the caller promises.
        Some(unsafe { self.stage(src, dst) })
    }

    /// # Safety
    /// As [`Staging::copy`], with `src.len() <= HALF`.
    unsafe fn stage(&mut self, src: &[u8], dst: sys::CUdeviceptr) -> Result<(), DriverError> {
        // SAFETY: as the caller promises.
        let p = unsafe { self.place(src) }?;
        // SAFETY: `p` holds the `src.len()` bytes just placed; `dst` as the caller promises.
        unsafe { self.enqueue(p, src.len(), dst) }
    }

    /// Copies `src` (at most [`HALF`] bytes) into staging memory, waiting first for the
    /// copies from the other half when the one being filled has no room (never when
    /// [`Staging::fits`] said it fits); where it went.
    ///
    /// # Safety
    /// `src.len() <= HALF`.
    pub unsafe fn place(&mut self, src: &[u8]) -> Result<*mut u8, DriverError> {
        let n = src.len();
        let mut at = self.head.next_multiple_of(64);
        if at + n > HALF {
            // Moving on: this half's copies end at a new event; the other half may be
            // written once the event recorded when it was left has completed.
            self.fence[self.cur] = Some(self.stream.record_event(None)?);
            self.cur ^= 1;
            if let Some(done) = self.fence[self.cur].take() {
                done.synchronize()?;
            }
            at = 0;
        }
        self.head = at + n;
        // SAFETY: `at + n <= HALF`, inside half `cur` of the `2 * HALF` bytes allocated;
        // no copy still reads that range (the fence above).
        let p = unsafe { self.base.add(self.cur * HALF + at) };
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, n) };
        Ok(p)
    }

    /// Enqueues the copy of `n` bytes at `p`, a place [`Staging::place`] gave, to device
    /// address `dst` on the stream.
    ///
    /// # Safety
    /// `p` must hold `n` placed bytes, unchanged until the copy has run (the fence keeps
    /// them so); `dst` must hold at least `n` bytes until the copy has run.
    pub unsafe fn enqueue(&self, p: *mut u8, n: usize, dst: sys::CUdeviceptr) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        // SAFETY: as the caller promises.
        let rc = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, p.cast(), n, self.stream.cu_stream()) };
        match rc {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            rc => Err(DriverError(rc)),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Copies still in flight read this memory: let them finish first.
        let _ = self.stream.synchronize();
        // SAFETY: `base` came from `malloc_host` and nothing reads it any more.
        let _ = unsafe { result::free_host(self.base.cast()) };
    }
}
