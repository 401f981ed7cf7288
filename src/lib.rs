//! Strata: an inference server for large language models that streams what does not fit.

pub mod aligned;
pub mod backend;
pub mod cli;
pub mod config;
pub mod engine;
pub mod errors;
pub mod format;
pub mod home;
pub mod hub;
pub mod mapped;
pub mod model;
pub mod quant;
pub mod queue;
pub mod resolve;
pub mod rng;
pub mod sched;
pub mod server;
pub mod settings;
pub mod sizes;
pub mod store;
pub mod team;
pub mod tensor;
