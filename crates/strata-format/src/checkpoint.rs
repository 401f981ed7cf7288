//! What a reader hands back: a model's files as stored (names, `config.json`, tokenizer,
//! chat template) and its tensors, before anything parses the config. The model layer
//! turns a [`Checkpoint`] into a `ModelSource` by parsing `config.json` against the
//! architectures it knows.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::FormatError;
use super::cawsf::Routing;
use super::checksum::StoredSums;
use strata_tensor::tensor::HostTensor;

/// A model as a reader found it: everything needed to build it, independent of where it
/// came from (a Hugging Face directory, a flat directory, a `.cawsf` or GGUF file, or the
/// in-memory demo model), but its parsed hyperparameters.
pub struct Checkpoint {
    /// Display name (a directory or file stem, or `strata-demo`).
    pub name: String,
    /// `config.json` as stored (what conversions write and `/api/show` reports).
    pub config_json: String,
    /// Where `config_json` was read from, for the error when it does not parse.
    pub config_origin: ConfigOrigin,
    /// Contents of `tokenizer.json`.
    pub tokenizer_json: String,
    /// Contents of `tokenizer_config.json`, if present.
    pub tokenizer_config_json: Option<String>,
    /// Contents of `generation_config.json`, if present.
    pub generation_config_json: Option<String>,
    /// Contents of `chat_template.jinja`, if present (newer transformers save the
    /// template there instead of in `tokenizer_config.json`).
    pub chat_template: Option<String>,
    /// Every weight tensor by its Hugging Face name.
    pub tensors: HashMap<String, HostTensor>,
    /// An NDSQ `.cawsf` file's ROUTING section and what rebuilding its tensors with
    /// components left out needs (`format::route`, `--route-budget`).
    pub routing: Option<Arc<Routing>>,
    /// The checksums a flat directory or `.cawsf` file records for each tensor, which
    /// readers of whole tensors (`convert`, `export`) check as they read; empty for
    /// formats without them.
    pub sums: StoredSums,
}

/// Where a checkpoint's `config.json` came from, so that the layer that parses it names
/// it in an error as the reader does.
#[derive(Clone, Debug)]
pub enum ConfigOrigin {
    /// A file of a directory whose reader reports problems as [`FormatError`]s (a flat
    /// directory's `config.json`): the error is [`FormatError::Invalid`] naming it.
    File(PathBuf),
    /// The error is the parser's, under this context (`model.cawsf: META config`, a
    /// Hugging Face directory's `config.json` path).
    Context(String),
}

impl ConfigOrigin {
    /// `e`, why the config did not parse, named as this origin names it.
    pub fn error<E: std::error::Error + Send + Sync + 'static>(&self, e: E) -> anyhow::Error {
        match self {
            ConfigOrigin::File(path) => FormatError::Invalid { path: path.clone(), msg: e.to_string() }.into(),
            ConfigOrigin::Context(context) => anyhow::Error::new(e).context(context.clone()),
        }
    }
}
