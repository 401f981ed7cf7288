//! Models: configuration, weights and forward passes per architecture.

pub mod config;
pub mod demo;
pub mod gguf_source;
pub mod llama;

use std::collections::HashMap;

use crate::tensor::HostTensor;

/// Everything needed to build a model, independent of where it came from (a Hugging
/// Face directory on disk, or the in-memory demo model).
pub struct ModelSource {
    /// Display name (a directory or file stem, or `strata-demo`).
    pub name: String,
    /// Contents of `config.json`.
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
}

use std::path::Path;

use anyhow::Context;

impl ModelSource {
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
        Ok(ModelSource {
            name,
            config_json: read("config.json")?,
            tokenizer_json: read("tokenizer.json")?,
            tokenizer_config_json: optional("tokenizer_config.json")?,
            generation_config_json: optional("generation_config.json")?,
            chat_template: optional("chat_template.jinja")?,
            tensors: crate::format::safetensors::load_dir(dir)?,
        })
    }

    /// A model SPEC: `strata-demo`, a `.gguf` file, or a Hugging Face directory.
    pub fn from_spec(spec: &str) -> anyhow::Result<Self> {
        if spec == demo::DEMO_NAME {
            return demo::demo_source();
        }
        let path = Path::new(spec);
        if path.is_dir() {
            if path.join("manifest.json").is_file() {
                return crate::format::flat::open(path);
            }
            if path.join("config.json").is_file() {
                return Self::from_hf_dir(path);
            }
            anyhow::bail!("{spec}: a directory without config.json is not a model this build can load");
        }
        if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return gguf_source::source_from_gguf(path);
        }
        if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("cawsf")) {
            return crate::format::cawsf::open(path);
        }
        if path.exists() {
            anyhow::bail!("{spec}: unsupported model file (this build loads .gguf files and Hugging Face directories)");
        }
        anyhow::bail!("model `{spec}` not found: give a model directory or `{}`", demo::DEMO_NAME)
    }
}
