//! Every integration test in one binary, so a change relinks it once: one module per
//! area, with the shared helpers in `common` (HTTP) and `support` (fixtures, models).
//! Run one area with `cargo test --release --test it -- AREA::`.

mod common;
mod support;

mod backend_seam;
mod batching;
mod cawsf_format;
mod chat_templates;
mod cli;
mod config;
mod convert;
mod cuda_errors;
mod cuda_ops;
mod doctor;
mod env_vars;
mod export;
mod fill_in_middle;
mod flat_format;
mod fuzz_regressions;
mod generate;
mod gguf;
mod grammar;
mod http_anthropic;
mod http_bad_input;
mod http_create;
mod http_harmony;
mod http_moe;
mod http_ollama;
mod http_openai;
mod http_responses;
mod http_sparse;
mod http_speculative;
mod http_tools;
mod hub;
mod hybrid;
mod latent_cache;
mod llamacpp_parity;
mod llamacpp_vocab;
mod model_parity;
mod moe_bad_files;
mod moe_streaming;
mod ndsq;
mod openapi;
mod quant_golden;
mod quant_matmul;
mod sched_io;
mod sparse_ffn;
mod speculative;
mod split;
mod spm_tokenizer;
mod status;
mod store;
mod streaming;
mod tiers;
mod tokenizer_parity;
