//! Strata: an inference server for large language models that streams what does not fit.
//!
//! The layers are crates of their own (`crates/`), so a lower one cannot name a higher
//! one; this library re-exports them under the module names the rest of the code and the
//! tests use, and holds the command line (`cli`, `config`, `settings`).

pub use strata_backend as backend;
pub use strata_engine as engine;
pub use strata_format as format;
pub use strata_model as model;
pub use strata_quant as quant;
pub use strata_sched as sched;
pub use strata_serve::{draft, errors, hub, queue, resolve, server, store};
pub use strata_tensor::{aligned, env, home, mapped, rng, sizes, team, tensor};

pub mod cli;
pub mod config;
pub mod settings;
