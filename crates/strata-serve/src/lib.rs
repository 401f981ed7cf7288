//! The daemon's serving layer: the admission queue and its worker, the HTTP server
//! (OpenAI, Ollama, Anthropic routes), the model store and hub, and the resolver from a
//! model SPEC (a path or a store name) to a checkpoint.

pub mod draft;
pub mod errors;
pub mod hub;
pub mod queue;
pub mod resolve;
pub mod server;
pub mod store;
