//! Device memory accounting and driver errors, shared by the ops (`backend.rs`) and the
//! copy engine (`copy.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{DriverError, sys};

use crate::BackendError;

/// Device memory held by one allocation, counted in the backend's total while it lives.
pub(super) struct Tracked {
    bytes: u64,
    total: Arc<AtomicU64>,
}

impl Tracked {
    pub(super) fn new(bytes: u64, total: &Arc<AtomicU64>) -> Self {
        total.fetch_add(bytes, Ordering::Relaxed);
        Tracked { bytes, total: total.clone() }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Maps a driver error to a backend error, naming GPU memory when that ran out.
pub(super) fn dev_err(op: &str, bytes: u64) -> impl Fn(DriverError) -> BackendError + '_ {
    move |e: DriverError| {
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            BackendError::OutOfMemory { what: op.to_string(), bytes, msg: format!("{e:?}") }
        } else {
            BackendError::Device { op: op.to_string(), msg: format!("{e:?}") }
        }
    }
}
