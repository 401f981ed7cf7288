//! The models a server offers: names, where they come from, and what is known about them
//! without loading them (for `/v1/models`, `/api/tags`, `/api/show`).
//!
//! Two kinds of names: the models the server was started with (`--model`, or the demo)
//! and their `/api/copy` aliases, held in memory; and the models in the store
//! ([`crate::store`]), read from disk at each request so that an import or removal made
//! while the server runs shows at once. A started-with name hides a store model of the
//! same name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use serde_json::Value;

use crate::store::{ModelName, Modelfile, Store, StoreError, StoredModel};
use strata_tensor::tensor::DType;

/// Static facts about a model, read from its files once.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub name: String,
    /// What `--model` said: a path or `strata-demo`.
    pub spec: String,
    /// How the weights are stored: `gguf`, `safetensors`, `flat`, `cawsf`, or `demo`.
    pub format: String,
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
    /// What `POST /api/create` set (a store model's `entry.json`); its template is
    /// already `chat_template`.
    pub modelfile: Option<crate::store::Modelfile>,
    /// Neurons per group when the FFNs are stored as neuron-group bundles (a model
    /// converted with `--sparse-ffn`).
    pub neuron_group: Option<usize>,
    /// The FFN width.
    pub intermediate_size: usize,
    /// Whether the vocabulary has the fill-in-the-middle tokens (Ollama's `insert`).
    pub fills_in_middle: bool,
}

impl ModelInfo {
    pub fn read(name: &str, spec: &str) -> anyhow::Result<Self> {
        let source = crate::resolve::open(spec)?;
        let config = source.config.clone();
        let parameters: u64 = source.tensors.values().map(|t| t.numel() as u64).sum();
        let size_bytes: u64 = source.tensors.values().map(|t| t.byte_len() as u64).sum();
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
            format: format_of(spec),
            // llama.cpp's architecture names, as Ollama reports them (`gemma3`, not `gemma3_text`).
            arch: config.spec().gguf_arch.to_string(),
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
            modelfile: None,
            neuron_group: config.neuron_group,
            intermediate_size: config.intermediate_size,
            fills_in_middle: strata_engine::tokenizer::fills_in_middle(
                &source.tokenizer_json,
                source.tokenizer_config_json.as_deref(),
            ),
        })
    }

    /// Ollama's `parameter_size`, e.g. `1.1B`, `820K`.
    pub fn parameter_size(&self) -> String {
        parameter_size(self.parameters)
    }
}

/// Ollama's `parameter_size` of `n` parameters, e.g. `1.1B`, `820K`.
pub fn parameter_size(n: u64) -> String {
    let p = n as f64;
    match p {
        p if p >= 1e9 => format!("{:.1}B", p / 1e9),
        p if p >= 1e6 => format!("{:.1}M", p / 1e6),
        p if p >= 1e3 => format!("{:.0}K", p / 1e3),
        p => format!("{p}"),
    }
}

/// The storage format of a model SPEC, for `details.format`.
fn format_of(spec: &str) -> String {
    if spec == strata_model::demo::DEMO_NAME {
        return "demo".into();
    }
    let path = std::path::Path::new(spec);
    let format = match path.exists() {
        true => crate::store::Format::detect(path).ok(),
        // A name in the store (`--model llama3:q4`).
        false => Store::default().get(spec).ok().map(|m| m.entry.format),
    };
    format.map_or_else(|| "unknown".into(), |f| f.name().into())
}

/// A model as `/api/tags` and `/v1/models` list it: known without reading its weights.
#[derive(Clone, Debug)]
pub struct Listing {
    /// The name as offered: a `--model` name as given, a store name with its tag.
    pub name: String,
    pub modified_at: SystemTime,
    /// Bytes of weights (`--model`) or of the model's files (store).
    pub size_bytes: u64,
    pub digest: String,
    pub format: String,
    pub family: String,
    pub parameters: u64,
    /// `Q4_K_M`, `F16`, ... (the dtype of most weights when nothing better is known).
    pub quantization: String,
}

impl Listing {
    pub fn of(info: &ModelInfo) -> Self {
        Listing {
            name: info.name.clone(),
            modified_at: info.modified_at,
            size_bytes: info.size_bytes,
            digest: info.digest.clone(),
            format: info.format.clone(),
            family: info.arch.clone(),
            parameters: info.parameters,
            quantization: info.dtype.clone(),
        }
    }

    fn of_stored(m: &StoredModel) -> Self {
        let details = m.entry.details.clone().unwrap_or_default();
        Listing {
            name: m.name.to_string(),
            modified_at: m.entry.modified(),
            size_bytes: m.entry.size,
            digest: m.entry.digest_hex(),
            format: m.entry.format.name().into(),
            family: details.architecture,
            parameters: details.parameter_count,
            quantization: details.quantization,
        }
    }
}

/// Why a name could not be looked up, removed or copied.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("model '{0}' not found")]
    NotFound(String),
    /// A request the registry refuses (a bad destination name, deleting a `--model`).
    #[error("{message}")]
    Invalid { param: &'static str, message: String },
    /// The store failed (I/O), or a store model's files do not read as a model.
    #[error("model `{name}`: {message}")]
    Failed { name: String, message: String },
}

impl RegistryError {
    fn store(name: &str, e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) => RegistryError::NotFound(name.to_string()),
            other => RegistryError::Failed { name: name.to_string(), message: other.to_string() },
        }
    }
}

/// Where a name in memory came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// `--model`, or the demo model.
    Started,
    /// An `/api/copy` of a started-with model.
    Alias,
}

/// The models held in memory, by canonical name.
type Offered = BTreeMap<String, (Origin, Arc<ModelInfo>)>;
/// Store models read so far, by full name, with the `imported_at` they were read at.
type ReadCache = HashMap<String, (String, Arc<ModelInfo>)>;

/// Names → models. Shared by the HTTP handlers (list, show, copy, delete) and the
/// worker (which loads by name).
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<RwLock<Offered>>,
    store: Option<Store>,
    read: Arc<Mutex<ReadCache>>,
}

/// A model's identity, what every route and the worker match names by: Ollama-style
/// (`name` and `name:latest` are the same model) and, as in the store, without regard to
/// case or surrounding spaces.
pub fn canonical(name: &str) -> String {
    let name = name.trim().to_ascii_lowercase();
    match name.rsplit_once(':') {
        Some((base, tag)) if !base.is_empty() && !tag.contains('/') => format!("{base}:{tag}"),
        _ => format!("{name}:latest"),
    }
}

impl Registry {
    /// A registry that also offers the models in `store`.
    pub fn with_store(store: Store) -> Self {
        Registry { store: Some(store), ..Registry::default() }
    }

    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// Offers a model the server was started with.
    pub fn insert(&self, info: ModelInfo) {
        self.insert_as(Origin::Started, info);
    }

    fn insert_as(&self, origin: Origin, info: ModelInfo) {
        let key = canonical(&info.name);
        self.inner.write().expect("registry lock").insert(key, (origin, Arc::new(info)));
    }

    fn in_memory(&self, name: &str) -> Option<(Origin, Arc<ModelInfo>)> {
        self.inner.read().expect("registry lock").get(&canonical(name)).cloned()
    }

    pub fn get(&self, name: &str) -> Option<Arc<ModelInfo>> {
        self.find(name).ok()
    }

    /// The model `name`: a started-with model or alias, else a store model (read from its
    /// files the first time it is asked for, and again after it is re-imported).
    pub fn find(&self, name: &str) -> Result<Arc<ModelInfo>, RegistryError> {
        let name = name.trim();
        if let Some((_, info)) = self.in_memory(name) {
            return Ok(info);
        }
        let not_found = || RegistryError::NotFound(name.to_string());
        let store = self.store.as_ref().ok_or_else(not_found)?;
        if ModelName::parse(name).is_err() {
            return Err(not_found());
        }
        let stored = store.get(name).map_err(|e| RegistryError::store(name, e))?;
        let key = stored.name.to_string();
        if let Some((stamp, info)) = self.read.lock().expect("registry cache lock").get(&key)
            && *stamp == stored.entry.imported_at
        {
            return Ok(info.clone());
        }
        let path = store.resolve(name).map_err(|e| RegistryError::store(name, e))?;
        let failed = |e: anyhow::Error| RegistryError::Failed { name: key.clone(), message: crate::errors::chain(&e) };
        let mut info = ModelInfo::read(&key, path.to_str().ok_or_else(|| failed(anyhow::anyhow!("non-UTF-8 path")))?)
            .map_err(failed)?;
        // The same identity `/api/tags` shows.
        info.digest = stored.entry.digest_hex();
        info.modified_at = stored.entry.modified();
        info.format = stored.entry.format.name().into();
        if let Some(m) = &stored.entry.modelfile {
            if m.template.is_some() {
                info.chat_template = m.template.clone();
            }
            info.modelfile = Some(m.clone());
        }
        let info = Arc::new(info);
        self.read.lock().expect("registry cache lock").insert(key, (stored.entry.imported_at, info.clone()));
        Ok(info)
    }

    /// Every model offered, by name: the started-with ones and aliases, then the store's
    /// (those a started-with name hides left out).
    pub fn list(&self) -> Vec<Listing> {
        let mut out: Vec<Listing> =
            self.inner.read().expect("registry lock").values().map(|(_, info)| Listing::of(info)).collect();
        // The store is read without holding the lock.
        if let Some(store) = &self.store {
            match store.list() {
                Ok(models) => {
                    let hidden = |m: &&StoredModel| self.in_memory(&m.name.to_string()).is_some();
                    let stored: Vec<Listing> = models.iter().filter(|m| !hidden(m)).map(Listing::of_stored).collect();
                    out.extend(stored);
                }
                Err(e) => tracing::warn!(error = %e, "listing the model store failed"),
            }
        }
        out.sort_by_key(|l| canonical(&l.name));
        out
    }

    /// The model used when a request names none the server knows... (the first one).
    pub fn default_model(&self) -> Option<Arc<ModelInfo>> {
        self.inner.read().expect("registry lock").values().next().map(|(_, info)| info.clone())
    }

    /// Whether [`remove`](Self::remove) would remove `name`: not a model the server was
    /// started with (400), and one that exists (404).
    pub fn check_removable(&self, name: &str) -> Result<(), RegistryError> {
        match self.in_memory(name) {
            Some((Origin::Alias, _)) => Ok(()),
            Some((Origin::Started, _)) => Err(RegistryError::Invalid {
                param: "model",
                message: format!(
                    "model '{name}' was given to `strata serve` (--model, or the demo model) and is not in the \
                     store; it cannot be deleted while the server runs"
                ),
            }),
            None => match (&self.store, ModelName::parse(name)) {
                // A model whose entry.json does not read can still be removed.
                (Some(store), Ok(_)) => store.removable(name).map(|_| ()).map_err(|e| RegistryError::store(name, e)),
                _ => Err(RegistryError::NotFound(name.to_string())),
            },
        }
    }

    /// Stops offering `name`: an alias is forgotten, a store model deleted from disk. A
    /// model the server was started with cannot be removed.
    pub fn remove(&self, name: &str) -> Result<(), RegistryError> {
        self.check_removable(name)?;
        let key = canonical(name);
        if self.inner.write().expect("registry lock").remove(&key).is_some() {
            return Ok(());
        }
        let store = self.store.as_ref().ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let removed = store.remove(name).map_err(|e| RegistryError::store(name, e))?;
        self.read.lock().expect("registry cache lock").remove(&removed.to_string());
        Ok(())
    }

    /// Offers `src` under the name `dst` too. A store model is copied within the store
    /// (hard links; an existing `dst` is replaced, as Ollama does); a model the server
    /// was started with gets an in-memory alias that lasts until the server stops.
    pub fn copy(&self, src: &str, dst: &str) -> Result<(), RegistryError> {
        let invalid = |message: String| RegistryError::Invalid { param: "destination", message };
        if let Some((Origin::Started, _)) = self.in_memory(dst) {
            return Err(invalid(format!("'{dst}' is the name of a model given to `strata serve`")));
        }
        if let Some((_, info)) = self.in_memory(src) {
            // An alias is named as a store model is: it is listed beside them.
            ModelName::parse_new(dst).map_err(|e| invalid(e.to_string()))?;
            if let Some(store) = &self.store
                && store.get(dst).is_ok()
            {
                return Err(invalid(format!("'{dst}' is a model in the store; delete it first")));
            }
            let mut copy = (*info).clone();
            copy.name = dst.to_string();
            self.insert_as(Origin::Alias, copy);
            return Ok(());
        }
        let store = self.store.as_ref().ok_or_else(|| RegistryError::NotFound(src.to_string()))?;
        if ModelName::parse(src).is_err() {
            return Err(RegistryError::NotFound(src.to_string()));
        }
        if let Some((Origin::Alias, _)) = self.in_memory(dst) {
            return Err(invalid(format!("'{dst}' is an alias made with /api/copy; delete it first")));
        }
        match store.copy(src, dst, true) {
            Ok(_) => Ok(()),
            // `src` is a valid name, so this is about `dst`.
            Err(e @ StoreError::InvalidName { .. }) => Err(invalid(e.to_string())),
            Err(e) => Err(RegistryError::store(src, e)),
        }
    }
}

/// Where `POST /api/create` takes a model's weights from.
#[derive(Clone, Debug)]
pub enum CreateFrom {
    /// A GGUF blob uploaded with `POST /api/blobs/sha256:<hex>`.
    Blob(String),
    /// Another model: a store model, or one the server was started with.
    Model(String),
}

impl Registry {
    /// Creates (or redefines) the store model `name` from `from`, with `modelfile` (over
    /// the source model's own, for a store model). A loaded `name` keeps its old settings
    /// until it is unloaded.
    pub fn create(&self, name: &str, from: &CreateFrom, modelfile: Modelfile) -> Result<(), RegistryError> {
        let invalid = |param: &'static str, message: String| RegistryError::Invalid { param, message };
        if self.in_memory(name).is_some() {
            return Err(invalid("model", format!("'{name}' is the name of a model given to `strata serve`")));
        }
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| invalid("model", "this server was started without a model store".into()))?;
        let result = match from {
            CreateFrom::Blob(hex) => store.create_from_blob(name, hex, modelfile),
            CreateFrom::Model(src) => match self.in_memory(src) {
                Some((_, info)) if info.format == "demo" => {
                    return Err(invalid(
                        "from",
                        format!("`from`: '{src}' is the built-in demo model; it has no files"),
                    ));
                }
                Some((_, info)) => store.create_from_path(name, Path::new(&info.spec), modelfile),
                None => store.create_from_model(name, src, &modelfile),
            },
        };
        match result {
            Ok(_) => Ok(()),
            Err(e @ StoreError::InvalidName { .. }) => Err(invalid("model", e.to_string())),
            Err(StoreError::NotFound(what)) => match from {
                CreateFrom::Blob(_) => {
                    Err(invalid("files", format!("`files`: {what} has not been uploaded (POST /api/blobs)")))
                }
                CreateFrom::Model(src) => Err(RegistryError::NotFound(src.clone())),
            },
            Err(e @ StoreError::Unsupported { .. }) => Err(invalid("files", format!("`files`: {e}"))),
            Err(e) => Err(RegistryError::store(name, e)),
        }
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
        assert_eq!(canonical(" Demo:Q4 "), "demo:q4");
    }

    #[test]
    fn registry_lists_copies_and_removes() {
        let r = Registry::default();
        r.insert(ModelInfo::read("strata-demo", "strata-demo").unwrap());
        assert!(r.get("strata-demo:latest").is_some());
        r.copy("strata-demo", "other:v1").unwrap();
        assert_eq!(r.list().len(), 2);
        assert_eq!(r.get("other:v1").unwrap().spec, "strata-demo");
        r.remove("other:v1").unwrap();
        assert!(matches!(r.remove("other:v1"), Err(RegistryError::NotFound(_))));
        assert!(matches!(r.remove("strata-demo"), Err(RegistryError::Invalid { .. })), "started-with models stay");
        assert!(matches!(r.copy("missing", "x"), Err(RegistryError::NotFound(_))));
        assert!(matches!(r.copy("other", "strata-demo"), Err(RegistryError::Invalid { .. })));
        // Aliases are named as store models are, and never as the demo model.
        let served = Registry::default();
        served.insert(ModelInfo::read("mine", "strata-demo").unwrap());
        for bad in ["strata-demo", "../x", "a b", "x:y:z", ""] {
            assert!(matches!(served.copy("mine", bad), Err(RegistryError::Invalid { .. })), "{bad:?}");
        }
        served.copy("mine", "other/name:v2").unwrap();
        assert!(served.get("other/name:v2").is_some());
    }

    #[test]
    fn store_models_are_read_once_and_again_after_a_reimport() {
        let home = std::env::temp_dir().join(format!("strata-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let store = Store::open(&home);
        store.import(&fixtures.join("gguf/llama3.q4_0.gguf"), "m", false).unwrap();
        let r = Registry::with_store(store.clone());
        let first = r.find("M").unwrap();
        assert_eq!((first.name.as_str(), first.format.as_str()), ("m:latest", "gguf"));
        assert_eq!(first.digest, store.get("m").unwrap().entry.digest_hex(), "the digest /api/tags shows");
        assert!(Arc::ptr_eq(&first, &r.find("m:latest").unwrap()), "read once");
        store.import(&fixtures.join("hf/llama3"), "m", true).unwrap();
        assert_eq!(r.find("m").unwrap().format, "safetensors", "read again after a re-import");
        assert!(matches!(r.find("../m"), Err(RegistryError::NotFound(_))));
        // A started-with model of the same name hides the store's.
        r.insert(ModelInfo::read("m", "strata-demo").unwrap());
        assert_eq!(r.find("m").unwrap().format, "demo");
        assert_eq!(r.list().len(), 1);
        std::fs::remove_dir_all(&home).unwrap();
    }
}
