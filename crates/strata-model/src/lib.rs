//! Models: configuration, weights and forward passes per architecture.

pub mod config;
pub mod convert;
pub mod decoder;
pub mod deltanet;
pub mod demo;
pub mod error;
pub mod gguf_source;
pub mod gguf_vocab;
pub mod gpt_oss;
pub mod mla;
pub mod moe;
pub mod shapes;
pub mod sparse;
pub mod spec;
pub mod split;

use std::path::Path;

use config::ModelConfig;
use decoder::{KvCache, ModelError, SeqStep};
use strata_backend::TopK;
use strata_format::Checkpoint;
use strata_sched::SchedInfo;

/// What a forward pass hands back for each sequence's selected rows.
#[derive(Clone, Copy, Debug)]
pub enum Readback {
    /// Every logit.
    Full,
    /// The `k` most likely entries and the `logsumexp` (copied back instead of the row).
    Top(usize),
    /// Both: every logit, and the `k` most likely entries as the backend selects them,
    /// for a batch where some sequences sample from every logit and the others from
    /// their top entries, which then get exactly what `Top` gives them (on a GPU the
    /// device's `logsumexp`, which a host scan of the downloaded row may round otherwise).
    Both(usize),
}

/// A pass's output rows, in order: `counts[i]` of them for sequence `i` (its last new
/// token's, or every new token's with `all_logits` or `verify`); their logits
/// (`[rows, vocab]`, with [`Readback::Full`] or [`Readback::Both`], else empty) and
/// their top entries (one per row, with [`Readback::Top`] or [`Readback::Both`]).
#[derive(Clone, Debug, Default)]
pub struct PassRows {
    pub logits: Vec<f32>,
    pub counts: Vec<usize>,
    pub top: Vec<TopK>,
}

/// A loaded model on whichever backend it runs: what the engine, the worker and the
/// CLI use, so nothing past the loader branches on the device.
pub trait LanguageModel: Send + Sync {
    fn config(&self) -> &ModelConfig;
    /// An empty KV cache for up to `capacity` positions, in this model's device memory.
    fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError>;
    /// Grows `cache` to hold at least `positions` (forward passes grow it as they need).
    fn reserve_cache(&self, cache: &mut KvCache, positions: usize) -> Result<(), ModelError>;
    /// Free memory on the device the model runs on (RAM on the CPU), if known.
    fn free_memory(&self) -> Option<u64>;
    /// Runs the new tokens of every sequence, appending to their caches; per sequence,
    /// the logits (`[n, vocab]`) of every new token or only of the last one.
    fn forward_until(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Vec<f32>>, ModelError>;
    /// Like `forward_until`, but returns only each sequence's `k` most likely next
    /// tokens (selected on the device).
    fn forward_top_k(
        &self,
        batch: &mut [SeqStep<'_>],
        k: usize,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<TopK>, ModelError>;
    /// Runs `batch` and hands back what `readback` asks of every row each sequence
    /// wants (see [`PassRows`]).
    fn forward_rows(
        &self,
        batch: &mut [SeqStep<'_>],
        readback: Readback,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<PassRows, ModelError>;
    fn forward(&self, batch: &mut [SeqStep<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_until(batch, &|| false)
    }
    /// A sentence embedding (mean of the final hidden states, L2-normalized).
    fn embed(&self, tokens: &[u32], cancelled: &(dyn Fn() -> bool + Sync)) -> Result<Vec<f32>, ModelError>;
    fn scheduler(&self) -> &dyn SchedInfo;
    /// See [`Backend::chunking_changes_rows`](strata_backend::Backend::chunking_changes_rows).
    fn chunking_changes_rows(&self) -> bool;
    /// The backend, in words (`cpu (2 threads)`, `cuda:0 (NVIDIA H100 …)`).
    fn backend_name(&self) -> String;
    /// Bytes of GPU memory the model holds (0 on the CPU).
    fn device_bytes(&self) -> u64;
    /// The device's memory bandwidth measured now, in bytes/s (`None` on the CPU,
    /// whose bandwidth `bench` measures itself).
    fn memory_bandwidth(&self) -> Option<f64>;
    /// Kernel launches so far and the cost of one (`None` on the CPU).
    fn launch_stats(&self) -> Option<strata_backend::LaunchStats>;
    /// Bytes of all weights (layers, embeddings, head, norms).
    fn weights_bytes(&self) -> usize;
    /// Bytes of the output head (read in full every decode step).
    fn lm_head_bytes(&self) -> usize;
}

/// Everything needed to build a model: a [`Checkpoint`] (names, text files, tensors) and
/// its parsed config.
///
/// It dereferences to its checkpoint, so `source.tensors`, `source.name` and the other
/// fields read as they did when they were its own.
pub struct ModelSource {
    /// What the reader returned.
    pub checkpoint: Checkpoint,
    /// The model's hyperparameters, read once where the source was opened.
    pub config: ModelConfig,
}

impl std::ops::Deref for ModelSource {
    type Target = Checkpoint;
    fn deref(&self) -> &Checkpoint {
        &self.checkpoint
    }
}

impl std::ops::DerefMut for ModelSource {
    fn deref_mut(&mut self) -> &mut Checkpoint {
        &mut self.checkpoint
    }
}

impl ModelSource {
    /// Parses `checkpoint`'s `config.json` (an error names it as its reader does, see
    /// [`ConfigOrigin`](strata_format::ConfigOrigin)) and notes whether its layers are
    /// stored as neuron-group bundles.
    pub fn from_checkpoint(checkpoint: Checkpoint) -> anyhow::Result<Self> {
        let mut config =
            ModelConfig::from_json(&checkpoint.config_json).map_err(|e| checkpoint.config_origin.error(e))?;
        config.detect_neuron_groups(&checkpoint.tensors);
        let mut checkpoint = checkpoint;
        if config.arch == spec::Arch::GptOss {
            gpt_oss::unstack_experts(&mut checkpoint.tensors, &config)?;
        }
        Ok(ModelSource { checkpoint, config })
    }

    /// Reads a Hugging Face model directory: config, tokenizer files and the
    /// memory-mapped safetensors weights.
    pub fn from_hf_dir(dir: &Path) -> anyhow::Result<Self> {
        Self::from_checkpoint(strata_format::hf_dir::open(dir)?)
    }

    /// A model SPEC that is `strata-demo` or a path: a `.gguf` or `.cawsf` file, a flat or
    /// Hugging Face directory. Names in the model store are `resolve::open`'s.
    pub fn from_path(spec: &str) -> anyhow::Result<Self> {
        if spec == demo::DEMO_NAME {
            return demo::demo_source();
        }
        Self::open_at(Path::new(spec), spec)
    }

    /// The model file or directory at `path`, called `spec` in errors (the SPEC it was
    /// found by).
    pub fn open_at(path: &Path, spec: &str) -> anyhow::Result<Self> {
        let source = if path.is_dir() {
            if path.join("manifest.json").is_file() {
                Self::from_checkpoint(strata_format::flat::open(path)?)?
            } else if path.join("config.json").is_file() {
                Self::from_hf_dir(path)?
            } else {
                anyhow::bail!("{spec}: a directory without config.json is not a model this build can load");
            }
        } else if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            gguf_source::source_from_gguf(path)?
        } else if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("cawsf")) {
            Self::from_checkpoint(strata_format::cawsf::open(path)?)?
        } else if path.exists() {
            anyhow::bail!(
                "{spec}: unsupported model file (this build loads .gguf and .cawsf files and model directories)"
            );
        } else {
            anyhow::bail!(
                "model `{spec}` not found: give a model file or directory, a name in the store, or `{}`",
                demo::DEMO_NAME
            )
        };
        Ok(source)
    }
}
