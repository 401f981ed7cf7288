//! The engine: tokenizer and chat template glue, sampling, stop strings, incremental
//! detokenization, grammar-constrained sampling and the generation loop.

pub mod batch;
pub mod context;
pub mod detok;
pub mod export;
pub mod grammar;
pub mod reasoning;
pub mod sampler;
pub mod session;
pub mod speculative;
pub mod stop;
pub mod template;
pub mod text_error;
pub mod tokenizer;
pub mod toolcall;
