//! The models a server offers: names, where they come from, and what is known about them
//! without loading them (for `/v1/models`, `/api/tags`, `/api/show`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde_json::Value;

use crate::model::ModelSource;
use crate::model::config::ModelConfig;
use crate::tensor::DType;

/// Static facts about a model, read from its files once.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub name: String,
    /// What `--model` said: a path or `strata-demo`.
    pub spec: String,
    pub arch: String,
    pub parameters: u64,
    /// Bytes of weights.
    pub size_bytes: u64,
    /// Stored dtype of most weights (`F32`, `F16`, `BF16`).
    pub dtype: String,
    pub context_length: usize,
    pub embedding_length: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab_size: usize,
    pub chat_template: Option<String>,
    /// `config.json` as it is.
    pub config: Value,
    /// Default sampling settings from `generation_config.json`.
    pub generation_config: Option<Value>,
    pub modified_at: SystemTime,
    /// A stable identifier of the weights (hex).
    pub digest: String,
}

impl ModelInfo {
    pub fn read(name: &str, spec: &str) -> anyhow::Result<Self> {
        let source = ModelSource::from_spec(spec)?;
        let config = ModelConfig::from_json(&source.config_json)?;
        let parameters: u64 = source.tensors.values().map(|t| t.numel() as u64).sum();
        let size_bytes: u64 = source.tensors.values().map(|t| t.bytes().len() as u64).sum();
        let mut by_dtype: BTreeMap<&'static str, u64> = BTreeMap::new();
        for t in source.tensors.values() {
            *by_dtype.entry(t.dtype.name()).or_default() += t.numel() as u64;
        }
        let dtype = by_dtype.iter().max_by_key(|(_, n)| **n).map_or(DType::F32.name(), |(d, _)| d).to_string();
        let chat_template = source.chat_template.clone().or_else(|| {
            let tc: Value = serde_json::from_str(source.tokenizer_config_json.as_deref()?).ok()?;
            match tc.get("chat_template")? {
                Value::String(s) => Some(s.clone()),
                Value::Array(list) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            }
        });
        let modified_at = std::fs::metadata(spec).and_then(|m| m.modified()).unwrap_or_else(|_| SystemTime::now());
        // FNV-1a over the config and the tensor layout: cheap, stable, changes with the model.
        let mut names: Vec<_> = source.tensors.iter().map(|(n, t)| format!("{n}{:?}{:?}", t.dtype, t.shape)).collect();
        names.sort();
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for b in source.config_json.bytes().chain(names.concat().bytes()) {
            hash = (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Ok(ModelInfo {
            name: name.to_string(),
            spec: spec.to_string(),
            arch: config.arch.name().to_string(),
            parameters,
            size_bytes,
            dtype,
            context_length: config.max_position_embeddings,
            embedding_length: config.hidden_size,
            n_layers: config.n_layers,
            n_heads: config.n_heads,
            n_kv_heads: config.n_kv_heads,
            vocab_size: config.vocab_size,
            chat_template,
            config: serde_json::from_str(&source.config_json)?,
            generation_config: source.generation_config_json.as_deref().and_then(|s| serde_json::from_str(s).ok()),
            modified_at,
            digest: format!("{hash:016x}{:016x}", hash.rotate_left(29) ^ size_bytes),
        })
    }

    /// Ollama's `parameter_size`, e.g. `1.1B`, `820K`.
    pub fn parameter_size(&self) -> String {
        let p = self.parameters as f64;
        match p {
            p if p >= 1e9 => format!("{:.1}B", p / 1e9),
            p if p >= 1e6 => format!("{:.1}M", p / 1e6),
            p if p >= 1e3 => format!("{:.0}K", p / 1e3),
            p => format!("{p}"),
        }
    }
}

/// Names → models. Shared by the HTTP handlers (list, show, copy, delete) and the
/// worker (which loads by name).
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<RwLock<BTreeMap<String, Arc<ModelInfo>>>>,
}

/// Ollama-style names: `name` and `name:latest` are the same model.
pub fn canonical(name: &str) -> String {
    let name = name.trim();
    match name.rsplit_once(':') {
        Some((base, tag)) if !base.is_empty() && !tag.contains('/') => format!("{base}:{tag}"),
        _ => format!("{name}:latest"),
    }
}

impl Registry {
    pub fn insert(&self, info: ModelInfo) {
        let key = canonical(&info.name);
        self.inner.write().expect("registry lock").insert(key, Arc::new(info));
    }

    pub fn get(&self, name: &str) -> Option<Arc<ModelInfo>> {
        self.inner.read().expect("registry lock").get(&canonical(name)).cloned()
    }

    pub fn list(&self) -> Vec<Arc<ModelInfo>> {
        self.inner.read().expect("registry lock").values().cloned().collect()
    }

    /// The model used when a request names none the server knows... (the first one).
    pub fn default_model(&self) -> Option<Arc<ModelInfo>> {
        self.inner.read().expect("registry lock").values().next().cloned()
    }

    pub fn remove(&self, name: &str) -> bool {
        self.inner.write().expect("registry lock").remove(&canonical(name)).is_some()
    }

    /// Offers `src` under the name `dst` too.
    pub fn copy(&self, src: &str, dst: &str) -> bool {
        let Some(info) = self.get(src) else { return false };
        let mut copy = (*info).clone();
        copy.name = dst.to_string();
        self.insert(copy);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_default_to_the_latest_tag() {
        assert_eq!(canonical("demo"), "demo:latest");
        assert_eq!(canonical("demo:latest"), "demo:latest");
        assert_eq!(canonical("demo:q4"), "demo:q4");
        assert_eq!(canonical("http://x/y"), "http://x/y:latest");
    }

    #[test]
    fn registry_lists_copies_and_removes() {
        let r = Registry::default();
        r.insert(ModelInfo::read("strata-demo", "strata-demo").unwrap());
        assert!(r.get("strata-demo:latest").is_some());
        assert!(r.copy("strata-demo", "other:v1"));
        assert_eq!(r.list().len(), 2);
        assert_eq!(r.get("other:v1").unwrap().spec, "strata-demo");
        assert!(r.remove("other:v1") && !r.remove("other:v1"));
        assert!(!r.copy("missing", "x"));
    }
}
