//! Models: configuration, weights and forward passes per architecture.

pub mod config;
pub mod decoder;
pub mod deltanet;
pub mod demo;
pub mod gguf_source;
pub mod gguf_vocab;
pub mod moe;
pub mod sparse;
pub mod spec;

use std::collections::HashMap;

use crate::backend::TopK;
use crate::sched::SchedInfo;
use crate::tensor::HostTensor;
use config::ModelConfig;
use decoder::{KvCache, ModelError, SeqStep};

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
    /// Like `forward_top_k`, but also returns the logits of each sequence's last new
    /// token, beside its top entries.
    fn forward_logits_and_top_k(
        &self,
        batch: &mut [SeqStep<'_>],
        k: usize,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<(Vec<f32>, TopK)>, ModelError>;
    fn forward(&self, batch: &mut [SeqStep<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_until(batch, &|| false)
    }
    /// A sentence embedding (mean of the final hidden states, L2-normalized).
    fn embed(&self, tokens: &[u32], cancelled: &(dyn Fn() -> bool + Sync)) -> Result<Vec<f32>, ModelError>;
    fn scheduler(&self) -> &dyn SchedInfo;
    /// See [`Backend::chunking_changes_rows`](crate::backend::Backend::chunking_changes_rows).
    fn chunking_changes_rows(&self) -> bool;
    /// The backend, in words (`cpu (2 threads)`, `cuda:0 (NVIDIA H100 …)`).
    fn backend_name(&self) -> String;
    /// Bytes of GPU memory the model holds (0 on the CPU).
    fn device_bytes(&self) -> u64;
    /// The device's memory bandwidth measured now, in bytes/s (`None` on the CPU,
    /// whose bandwidth `bench` measures itself).
    fn memory_bandwidth(&self) -> Option<f64>;
    /// Kernel launches so far and the cost of one (`None` on the CPU).
    fn launch_stats(&self) -> Option<crate::backend::LaunchStats>;
    /// Bytes of all weights (layers, embeddings, head, norms).
    fn weights_bytes(&self) -> usize;
    /// Bytes of the output head (read in full every decode step).
    fn lm_head_bytes(&self) -> usize;
}

/// Everything needed to build a model, independent of where it came from (a Hugging
/// Face directory on disk, or the in-memory demo model).
pub struct ModelSource {
    /// Display name (a directory or file stem, or `strata-demo`).
    pub name: String,
    /// The model's hyperparameters, read once where the source was opened.
    pub config: ModelConfig,
    /// `config.json` as stored (what conversions write and `/api/show` reports).
    pub config_json: String,
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
    pub routing: Option<std::sync::Arc<crate::format::cawsf::Routing>>,
    /// The checksums a flat directory or `.cawsf` file records for each tensor, which
    /// readers of whole tensors (`convert`, `export`) check as they read; empty for
    /// formats without them.
    pub sums: crate::format::checksum::StoredSums,
}

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The language model's tensors of a multimodal Qwen3.5 checkpoint (`model_type`
/// `qwen3_5` or `qwen3_5_moe`, its text model's config nested, see `config.rs`), named as
/// the text model's: `model.language_model.*` becomes `model.*`; the vision tower
/// (`model.visual.*`) and the multi-token-prediction head (`mtp.*`) are left out. Other
/// checkpoints' tensors are returned as they are.
fn text_tensors(config_json: &str, tensors: HashMap<String, HostTensor>) -> HashMap<String, HostTensor> {
    let model_type = serde_json::from_str::<serde_json::Value>(config_json)
        .ok()
        .and_then(|v| v.get("model_type").and_then(|t| t.as_str()).map(str::to_owned));
    if !matches!(model_type.as_deref(), Some("qwen3_5" | "qwen3_5_moe")) {
        return tensors;
    }
    tensors
        .into_iter()
        .filter(|(name, _)| !name.starts_with("model.visual.") && !name.starts_with("mtp."))
        .map(|(name, t)| match name.strip_prefix("model.language_model.") {
            Some(rest) => (format!("model.{rest}"), t),
            None => (name, t),
        })
        .collect()
}

/// Where a model SPEC's files are: the path itself when it exists, else the files of the
/// store model it names, with that model's full name.
pub fn spec_path(spec: &Path) -> anyhow::Result<(PathBuf, Option<String>)> {
    let name = match spec.to_str() {
        Some(name) if !spec.exists() && crate::store::ModelName::parse(name).is_ok() => name,
        _ => return Ok((spec.to_owned(), None)),
    };
    let store = crate::store::Store::default();
    match store.get(name) {
        Ok(model) => Ok((store.resolve(name)?, Some(model.name.to_string()))),
        Err(crate::store::StoreError::NotFound(_)) => anyhow::bail!(
            "model `{name}` not found: it is neither a file or directory nor a model in the store at {} \
             (`strata list` shows them; `{}` is the built-in demo model)",
            store.models_dir().display(),
            demo::DEMO_NAME
        ),
        Err(e) => Err(e.into()),
    }
}

impl ModelSource {
    /// The model's tokenizer and chat template, checked against the model: every token
    /// has a row in the embedding, and the template renders a one-message chat. Loads and
    /// imports go through here, so a model that would fail each request is refused once.
    pub fn tokenizer(&self) -> anyhow::Result<crate::engine::tokenizer::TextTokenizer> {
        let tok = crate::engine::tokenizer::TextTokenizer::from_parts(crate::engine::tokenizer::TokenizerSources {
            tokenizer_json: &self.tokenizer_json,
            tokenizer_config_json: self.tokenizer_config_json.as_deref(),
            generation_config_json: self.generation_config_json.as_deref(),
            chat_template: self.chat_template.as_deref(),
            model_config_json: Some(&self.config_json),
        })
        .with_context(|| format!("model `{}`: loading the tokenizer", self.name))?;
        let (tokens, rows) = (tok.vocab_size(), self.config.vocab_size);
        if tokens > rows {
            let embed = ["model.embed_tokens.weight", "model.embed_tokens"]
                .into_iter()
                .find(|n| self.tensors.contains_key(*n))
                .unwrap_or("the token embedding");
            anyhow::bail!(
                "model `{}`: the tokenizer has {tokens} tokens but `{embed}` has {rows} rows (vocab_size), one per token",
                self.name
            );
        }
        if let Some(t) = tok.chat_template() {
            let hello = [crate::engine::template::ChatMessage::new("user", "Hello")];
            t.render(&hello, true).with_context(|| {
                format!("model `{}`: its chat template cannot render a one-message chat", self.name)
            })?;
        }
        Ok(tok)
    }

    /// Reads a Hugging Face model directory: config, tokenizer files and the
    /// memory-mapped safetensors weights.
    pub fn from_hf_dir(dir: &Path) -> anyhow::Result<Self> {
        let read = |name: &str| -> anyhow::Result<String> {
            let path = dir.join(name);
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
        };
        let optional = |name: &str| -> anyhow::Result<Option<String>> {
            match dir.join(name).is_file() {
                true => read(name).map(Some),
                false => Ok(None),
            }
        };
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| dir.display().to_string());
        let config_json = read("config.json")?;
        let config =
            ModelConfig::from_json(&config_json).with_context(|| format!("{}", dir.join("config.json").display()))?;
        let tensors = text_tensors(&config_json, crate::format::safetensors::load_dir(dir)?);
        Ok(ModelSource {
            name,
            config,
            config_json,
            tokenizer_json: read("tokenizer.json")?,
            tokenizer_config_json: optional("tokenizer_config.json")?,
            generation_config_json: optional("generation_config.json")?,
            chat_template: optional("chat_template.jinja")?,
            tensors,
            routing: None,
            sums: Default::default(),
        })
    }

    /// A model SPEC: `strata-demo`, a `.gguf` or `.cawsf` file, a flat or Hugging Face
    /// directory, or else a name in the model store (`name[:tag]`, see [`crate::store`]).
    pub fn from_spec(spec: &str) -> anyhow::Result<Self> {
        if spec == demo::DEMO_NAME {
            return demo::demo_source();
        }
        let (path, store_name) = spec_path(Path::new(spec))?;
        let path = path.as_path();
        let mut source = if path.is_dir() {
            if path.join("manifest.json").is_file() {
                crate::format::flat::open(path)?
            } else if path.join("config.json").is_file() {
                Self::from_hf_dir(path)?
            } else {
                anyhow::bail!("{spec}: a directory without config.json is not a model this build can load");
            }
        } else if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            gguf_source::source_from_gguf(path)?
        } else if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("cawsf")) {
            crate::format::cawsf::open(path)?
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
        if let Some(name) = store_name {
            source.name = name; // not the store's `model.gguf` / `model`
        }
        Ok(source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multimodal_qwen3_5_checkpoint_gives_its_text_model_tensors() {
        let t = || HostTensor::from_f32(&[0.0], vec![1]);
        let names = [
            "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
            "model.language_model.embed_tokens.weight",
            "model.visual.blocks.0.attn.qkv.weight",
            "mtp.fc.weight",
            "lm_head.weight",
        ];
        let tensors: HashMap<String, HostTensor> = names.iter().map(|n| (n.to_string(), t())).collect();
        let mut got: Vec<String> =
            text_tensors(r#"{"model_type":"qwen3_5_moe"}"#, tensors.clone()).into_keys().collect();
        got.sort();
        assert_eq!(
            got,
            ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.linear_attn.in_proj_qkv.weight"]
        );
        // Any other checkpoint keeps its names.
        assert_eq!(text_tensors(r#"{"model_type":"qwen3_next"}"#, tensors.clone()).len(), names.len());
    }
}
