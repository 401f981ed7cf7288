//! The bottom layer: dtypes, host tensors and their byte sources (mapped files, aligned
//! buffers), and the small helpers every layer shares (sizes, the thread team, one RNG,
//! the home directory).

pub mod aligned;
pub mod env;
pub mod home;
pub mod mapped;
pub mod rng;
pub mod sizes;
pub mod team;
pub mod tensor;
