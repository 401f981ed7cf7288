//! On-disk layouts.

pub mod gguf;
pub mod safetensors;

use std::path::PathBuf;

/// A problem with a weight file: always names the file, and the byte offset when one
/// applies.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: at byte {offset}: {msg}")]
    Corrupt { path: PathBuf, offset: u64, msg: String },
    #[error("{path}: {msg}")]
    Invalid { path: PathBuf, msg: String },
}
