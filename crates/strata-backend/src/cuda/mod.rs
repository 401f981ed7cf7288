//! The CUDA backend (DESIGN.md §4), compiled into every build: cudarc loads the driver,
//! NVRTC and cuBLAS at run time, so a machine without them runs the same binary on the
//! CPU. `libs` finds the libraries, `kernels` and `nvrtc` turn `kernels/*.cu` into
//! device code (cached on disk), `launch` holds every launch shape, `backend` the ops (one file per op family).

pub mod backend;
pub mod copy;
pub mod gds;
pub mod kernels;
pub mod launch;
pub mod libs;
mod memory;
pub mod nvrtc;
pub mod packed;
mod staging;

pub use backend::{CudaBackend, CudaInitError};
