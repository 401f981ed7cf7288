//! The model store: names → model files under `$STRATA_HOME` (default `~/.strata`).
//!
//! ```text
//! $STRATA_HOME/models/
//!   <namespace>/<model>/<tag>/    one model; `llama3` is `library/llama3:latest`
//!     entry.json                  what it is: format, source, size, import time, details
//!     model.gguf                  a GGUF file, or
//!     model.cawsf                 a .cawsf file, or
//!     model/                      a flat layer directory or a Hugging Face directory
//!   .tmp/                         imports, copies and removals in progress
//! ```
//!
//! A name is `[namespace/]model[:tag]`, compared in lower case as Ollama does. The
//! namespace defaults to `library` and the tag to `latest`; each of the three parts is
//! 1 to 80 characters of `[a-z0-9._-]` starting with a letter or a digit. So no part is
//! empty, `.`, `..` or hidden, none holds a separator, and every name maps to exactly one
//! directory three levels below `models/`: no name can reach outside the store, and no
//! model's directory lies inside another's.
//!
//! A directory is a model only once it holds a complete `entry.json`. Every change is
//! built under `.tmp/` (on the same filesystem), flushed to the disk and renamed into
//! place (a replacement in one exchange, see [`staging`]), so a killed write leaves the
//! old model or the new one, never a gap; what it leaves in `.tmp/` is swept by the next
//! write once no process holds its lock. Model files are hard-linked from their
//! source where the filesystem allows (an import then takes no space; a file later
//! changed *in place* at its source changes in the store too), and copied otherwise.

mod blobs;
mod inspect;
mod install;
mod ollama;
pub mod pull;
mod staging;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

pub use blobs::{BlobPartial, Tidied};
pub use inspect::inspect;
use install::{copy_hf_dir, copy_tree, link_or_copy};
pub use ollama::{OllamaName, ollama_models_dir};
use staging::Held;

pub use strata_tensor::home::strata_home;

/// The file that makes a directory under `models/` a model.
pub const ENTRY_FILE: &str = "entry.json";
pub const DEFAULT_NAMESPACE: &str = "library";
pub const DEFAULT_TAG: &str = "latest";
const MAX_PART: usize = 80;
/// `entry.json` is a few hundred bytes; anything much larger is not ours.
const MAX_ENTRY_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid model name `{name}`: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("model `{0}` is not in the store")]
    NotFound(String),
    #[error("Ollama has no model `{name}` (no manifest at {}; Ollama's store is $OLLAMA_MODELS, default ~/.ollama/models)", manifest.display())]
    OllamaNotFound { name: String, manifest: PathBuf },
    #[error("model `{0}` already exists")]
    Exists(String),
    #[error("{path}: {msg}")]
    Unsupported { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    Corrupt { path: PathBuf, msg: String },
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

type Result<T> = std::result::Result<T, StoreError>;

/// [`inspect::check_loadable`] as a store error: a model this build cannot load is
/// not imported.
fn loadable(path: &Path, format: Format) -> Result<()> {
    inspect::check_loadable(path, format).map_err(|e| {
        let e = crate::errors::chain(&e);
        // Most errors name the file already.
        let e = e.strip_prefix(&format!("{}: ", path.display())).unwrap_or(&e);
        StoreError::Unsupported { path: path.to_owned(), msg: format!("not a model this build can load: {e}") }
    })
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |err| StoreError::Io { path: path.to_owned(), err }
}

/// A valid store name: `namespace/model:tag`, lower case.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelName {
    namespace: String,
    model: String,
    tag: String,
}

impl ModelName {
    /// [`parse`](Self::parse) for a name a new model (or alias) may take: not the
    /// built-in demo model's.
    pub fn parse_new(name: &str) -> Result<Self> {
        let parsed = ModelName::parse(name)?;
        if parsed.model == strata_model::demo::DEMO_NAME && parsed.namespace == DEFAULT_NAMESPACE {
            return Err(StoreError::InvalidName {
                name: name.into(),
                reason: "it is the built-in demo model's name".into(),
            });
        }
        Ok(parsed)
    }

    /// Parses `[namespace/]model[:tag]`; upper case is folded to lower case.
    pub fn parse(name: &str) -> Result<Self> {
        let bad =
            |reason: &str| StoreError::InvalidName { name: name.escape_debug().to_string(), reason: reason.into() };
        let lower = name.to_ascii_lowercase();
        let (base, tag) = match lower.split_once(':') {
            Some((base, tag)) => (base, tag),
            None => (lower.as_str(), DEFAULT_TAG),
        };
        let parts: Vec<&str> = base.split('/').collect();
        let (namespace, model) = match parts.as_slice() {
            [model] => (DEFAULT_NAMESPACE, *model),
            [namespace, model] => (*namespace, *model),
            _ => return Err(bad("at most one `/` (`namespace/model`)")),
        };
        for (what, part) in [("namespace", namespace), ("model name", model), ("tag", tag)] {
            check_part(part).map_err(|reason| bad(&format!("the {what} {reason}")))?;
        }
        Ok(ModelName { namespace: namespace.into(), model: model.into(), tag: tag.into() })
    }

    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The directory under `models/`.
    fn rel_dir(&self) -> PathBuf {
        [&self.namespace, &self.model, &self.tag].iter().collect()
    }
}

/// `model:tag`, or `namespace/model:tag` outside the default namespace.
impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace != DEFAULT_NAMESPACE {
            write!(f, "{}/", self.namespace)?;
        }
        write!(f, "{}:{}", self.model, self.tag)
    }
}

fn check_part(part: &str) -> std::result::Result<(), String> {
    if part.is_empty() {
        return Err("is empty".into());
    }
    if part.len() > MAX_PART {
        return Err(format!("is longer than {MAX_PART} characters"));
    }
    if let Some(c) = part.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '-')) {
        return Err(format!("holds {c:?} (allowed: a-z, 0-9, `.`, `_`, `-`)"));
    }
    if !part.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must start with a letter or a digit".into());
    }
    Ok(())
}

/// How a model's weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Gguf,
    /// A Hugging Face directory (`config.json`, tokenizer, `*.safetensors`).
    Safetensors,
    /// Strata's flat layer directory (`manifest.json`).
    Flat,
    Cawsf,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Gguf => "gguf",
            Format::Safetensors => "safetensors",
            Format::Flat => "flat",
            Format::Cawsf => "cawsf",
        }
    }

    /// The model's file or directory inside its store directory.
    fn payload(self) -> &'static str {
        match self {
            Format::Gguf => "model.gguf",
            Format::Cawsf => "model.cawsf",
            Format::Safetensors | Format::Flat => "model",
        }
    }

    /// What `path` holds: a GGUF file (by its magic, so Ollama's extensionless blobs
    /// count), a `.cawsf` file, a flat directory or a Hugging Face directory.
    pub fn detect(path: &Path) -> Result<Format> {
        let meta = fs::metadata(path).map_err(io(path))?;
        let unsupported = |msg: &str| StoreError::Unsupported { path: path.to_owned(), msg: msg.into() };
        if meta.is_dir() {
            if path.join("manifest.json").is_file() {
                return Ok(Format::Flat);
            }
            if path.join("config.json").is_file() {
                return Ok(Format::Safetensors);
            }
            return Err(unsupported("a directory with neither config.json (Hugging Face) nor manifest.json (flat)"));
        }
        // Opening a FIFO would wait for a writer; a device is no model either.
        if !meta.is_file() {
            return Err(unsupported("not a regular file or a directory (a model is a file or a model directory)"));
        }
        let mut magic = [0u8; 4];
        let read = fs::File::open(path).and_then(|mut f| std::io::Read::read(&mut f, &mut magic)).map_err(io(path))?;
        if read == 4 && &magic == b"GGUF" {
            return Ok(Format::Gguf);
        }
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("cawsf")) {
            return Ok(Format::Cawsf);
        }
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return Err(unsupported("named .gguf but does not start with the GGUF magic"));
        }
        Err(unsupported("not a model file Strata can import (a .gguf or .cawsf file, or a model directory)"))
    }
}

/// What a model's `entry.json` says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub format: Format,
    /// Where it came from: the absolute path imported, or `ollama:NAME:TAG`.
    pub source: String,
    /// Bytes of the model's files.
    pub size: u64,
    /// When it was imported or copied (RFC 3339).
    pub imported_at: String,
    /// `sha256:<hex>` of the weights, when known without reading them (Ollama's blobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// What the import could read from the model's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
    /// Settings `POST /api/create` gave the model (Ollama's Modelfile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modelfile: Option<Modelfile>,
}

/// What Ollama's Modelfile (or `POST /api/create`) sets besides the weights: applied to
/// every request for the model, each overridden by what the request itself gives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Modelfile {
    /// A Jinja chat template in place of the model's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The system message of conversations that bring none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Default `options` (Ollama's names: `temperature`, `num_ctx`, `stop`, ...).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub parameters: serde_json::Map<String, serde_json::Value>,
    /// Messages put before every conversation (after the system message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
}

impl Modelfile {
    /// `self` with what `over` sets put over it.
    pub fn overlaid(&self, over: &Modelfile) -> Modelfile {
        let mut parameters = self.parameters.clone();
        parameters.extend(over.parameters.clone());
        Modelfile {
            template: over.template.clone().or_else(|| self.template.clone()),
            system: over.system.clone().or_else(|| self.system.clone()),
            parameters,
            messages: if over.messages.is_empty() { self.messages.clone() } else { over.messages.clone() },
            license: over.license.clone().or_else(|| self.license.clone()),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Modelfile::default()
    }
}

/// Facts read cheaply from a model's metadata.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Details {
    /// `llama`, `qwen2`, ...
    pub architecture: String,
    pub parameter_count: u64,
    /// `Q4_K_M`, `Q8_0`, `F16`, `BF16`, ...
    pub quantization: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
}

impl Entry {
    /// The import time (now, if `imported_at` does not parse).
    pub fn modified(&self) -> SystemTime {
        self.imported_at.parse::<jiff::Timestamp>().map_or_else(|_| SystemTime::now(), SystemTime::from)
    }

    /// A hex identifier: the weights' SHA-256 when known, else a hash of the entry
    /// (stable for as long as the model stays as imported).
    pub fn digest_hex(&self) -> String {
        if let Some(hex) = self.digest.as_deref().and_then(|d| d.strip_prefix("sha256:")) {
            return hex.to_string();
        }
        let key = format!("{}\0{}\0{}\0{}", self.format.name(), self.source, self.size, self.imported_at);
        format!("{:032x}", xxhash_rust::xxh3::xxh3_128(key.as_bytes()))
    }
}

/// A model in the store.
#[derive(Clone, Debug)]
pub struct StoredModel {
    pub name: ModelName,
    /// Its directory, `models/<namespace>/<model>/<tag>`.
    pub dir: PathBuf,
    pub entry: Entry,
}

impl StoredModel {
    /// The model file or directory, as a model SPEC.
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.entry.format.payload())
    }
}

/// Where an installed model came from.
struct Origin {
    source: String,
    digest: Option<String>,
    /// Known details (a copy's); `None`: read them from the new files.
    details: Option<Details>,
    modelfile: Option<Modelfile>,
}

/// The store under one `$STRATA_HOME`.
#[derive(Clone, Debug)]
pub struct Store {
    home: PathBuf,
}

/// The store under `$STRATA_HOME` (default `~/.strata`).
impl Default for Store {
    fn default() -> Self {
        Store::open(strata_home())
    }
}

impl Store {
    /// The store under `home` (created on the first import).
    pub fn open(home: impl Into<PathBuf>) -> Self {
        Store { home: home.into() }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn models_dir(&self) -> PathBuf {
        self.home.join("models")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.models_dir().join(".tmp")
    }

    /// Imports a model file or directory as `name`; `replace` allows overwriting.
    pub fn import(&self, src: &Path, name: &str, replace: bool) -> Result<StoredModel> {
        let name = ModelName::parse_new(name)?;
        let format = Format::detect(src)?;
        let source = fs::canonicalize(src).map_err(io(src))?;
        loadable(&source, format)?;
        let origin = Origin { source: source.display().to_string(), digest: None, details: None, modelfile: None };
        self.install(&name, format, origin, replace, |payload| match format {
            Format::Gguf | Format::Cawsf => link_or_copy(&source, payload),
            Format::Flat => copy_tree(&source, payload, true),
            Format::Safetensors => copy_hf_dir(&source, payload),
        })
    }

    /// Imports a model from Ollama's store at `ollama_root` (see [`ollama_models_dir`]):
    /// its manifest names the GGUF blob, which is hard-linked. `name` defaults to the
    /// Ollama name.
    pub fn import_ollama(
        &self,
        ollama_root: &Path,
        ollama_name: &str,
        name: Option<&str>,
        replace: bool,
    ) -> Result<StoredModel> {
        let wanted = OllamaName::parse(ollama_name)?;
        let name = ModelName::parse_new(name.unwrap_or(&wanted.store_name()))?;
        let blob = ollama::model_blob(ollama_root, &wanted)?;
        if Format::detect(&blob.path)? != Format::Gguf {
            return Err(StoreError::Unsupported { path: blob.path, msg: "the model layer is not a GGUF file".into() });
        }
        loadable(&blob.path, Format::Gguf)?;
        let origin =
            Origin { source: format!("ollama:{wanted}"), digest: Some(blob.digest), details: None, modelfile: None };
        self.install(&name, Format::Gguf, origin, replace, |payload| link_or_copy(&blob.path, payload))
    }

    /// Every model, sorted by name. Directories that are not complete models are skipped.
    pub fn list(&self) -> Result<Vec<StoredModel>> {
        let mut out = Vec::new();
        for ns in subdirs(&self.models_dir())? {
            for model in subdirs(&ns)? {
                for tag in subdirs(&model)? {
                    let name = [&ns, &model, &tag].map(|p| p.file_name().unwrap_or_default().to_string_lossy());
                    let Ok(name) = ModelName::parse(&format!("{}/{}:{}", name[0], name[1], name[2])) else {
                        continue;
                    };
                    match read_entry(&tag) {
                        Ok(Some(entry)) => out.push(StoredModel { name, dir: tag, entry }),
                        Ok(None) => {}
                        Err(e) => tracing::warn!(error = %e, "skipping a broken store entry"),
                    }
                }
            }
        }
        out.sort_by_cached_key(|m| m.name.to_string());
        Ok(out)
    }

    /// The model `name`, as its `entry.json` describes it.
    pub fn get(&self, name: &str) -> Result<StoredModel> {
        let parsed = ModelName::parse(name)?;
        let dir = self.models_dir().join(parsed.rel_dir());
        match read_entry(&dir)? {
            Some(entry) => Ok(StoredModel { name: parsed, dir, entry }),
            None => Err(StoreError::NotFound(parsed.to_string())),
        }
    }

    /// [`get`](Self::get), with the details read from the files when the entry lacks them.
    pub fn show(&self, name: &str) -> Result<StoredModel> {
        let mut model = self.get(name)?;
        if model.entry.details.is_none() {
            model.entry.details = inspect(&model.path(), model.entry.format).ok();
        }
        Ok(model)
    }

    /// The model file or directory of `name`, to load.
    pub fn resolve(&self, name: &str) -> Result<PathBuf> {
        let model = self.get(name)?;
        let path = model.path();
        match path.exists() {
            true => Ok(path),
            false => Err(StoreError::Corrupt {
                path,
                msg: format!("the files of `{}` are missing; remove it and import it again", model.name),
            }),
        }
    }

    /// Removes `name`, also when its `entry.json` does not read; returns its full name.
    pub fn remove(&self, name: &str) -> Result<ModelName> {
        let name = self.removable(name)?;
        let dir = self.models_dir().join(name.rel_dir());
        self.sweep();
        // Held, so that no sweep takes it while it is removed; out of the namespace first
        // (one rename), so a half-deleted model is never listed.
        let held = Held::lock_existing(&dir)?;
        let trash = self.staging("rm")?;
        fs::rename(&dir, &trash).map_err(io(&dir))?;
        if let Some(parent) = dir.parent() {
            let _ = strata_format::temp::sync_dir(parent);
        }
        fs::remove_dir_all(&trash).map_err(io(&trash))?;
        drop(held);
        prune_empty_parents(&dir, &self.models_dir());
        Ok(name)
    }

    /// The full name of `name` when [`remove`](Self::remove) would remove it: its
    /// directory holds an `entry.json`, readable or not.
    pub fn removable(&self, name: &str) -> Result<ModelName> {
        let parsed = ModelName::parse(name)?;
        match staging::has_entry(&self.models_dir().join(parsed.rel_dir())) {
            true => Ok(parsed),
            false => Err(StoreError::NotFound(parsed.to_string())),
        }
    }

    /// Copies `src` to `dst` (hard links: no space taken); `replace` allows overwriting.
    pub fn copy(&self, src: &str, dst: &str, replace: bool) -> Result<StoredModel> {
        let from = self.get(src)?;
        let name = ModelName::parse_new(dst)?;
        if name == from.name {
            return Ok(from);
        }
        let modelfile = from.entry.modelfile.clone();
        self.install_copy(&from, &name, modelfile, replace)
    }

    /// Installs `from`'s files (hard links) as `name`, with `modelfile`.
    fn install_copy(
        &self,
        from: &StoredModel,
        name: &ModelName,
        modelfile: Option<Modelfile>,
        replace: bool,
    ) -> Result<StoredModel> {
        let e = &from.entry;
        let origin =
            Origin { source: e.source.clone(), digest: e.digest.clone(), details: e.details.clone(), modelfile };
        self.install(name, e.format, origin, replace, |payload| {
            let path = from.path();
            match fs::metadata(&path).map_err(io(&path))?.is_dir() {
                true => copy_tree(&path, payload, true),
                false => link_or_copy(&path, payload),
            }
        })
    }

    /// Creates `name` from the GGUF blob `sha256:<hex>` (hard-linked) with `modelfile`.
    pub fn create_from_blob(&self, name: &str, hex: &str, modelfile: Modelfile) -> Result<StoredModel> {
        let blob = self.blob_path(hex);
        if !blob.exists() {
            return Err(StoreError::NotFound(format!("blob sha256:{hex}")));
        }
        if Format::detect(&blob)? != Format::Gguf {
            return Err(StoreError::Unsupported { path: blob, msg: "the blob is not a GGUF file".into() });
        }
        loadable(&blob, Format::Gguf)?;
        let origin = Origin {
            source: format!("blob:sha256:{hex}"),
            digest: Some(format!("sha256:{hex}")),
            details: None,
            modelfile: Some(modelfile),
        };
        self.install(&ModelName::parse_new(name)?, Format::Gguf, origin, true, |payload| link_or_copy(&blob, payload))
    }

    /// Creates `name` from a model file or directory (as [`import`](Self::import) does,
    /// replacing) with `modelfile`.
    pub fn create_from_path(&self, name: &str, src: &Path, modelfile: Modelfile) -> Result<StoredModel> {
        let name = ModelName::parse_new(name)?;
        let format = Format::detect(src)?;
        let source = fs::canonicalize(src).map_err(io(src))?;
        let origin =
            Origin { source: source.display().to_string(), digest: None, details: None, modelfile: Some(modelfile) };
        self.install(&name, format, origin, true, |payload| match format {
            Format::Gguf | Format::Cawsf => link_or_copy(&source, payload),
            Format::Flat => copy_tree(&source, payload, true),
            Format::Safetensors => copy_hf_dir(&source, payload),
        })
    }

    /// Creates (or redefines) `name` from the store model `from`: its files (hard links)
    /// and its Modelfile with `modelfile` put over it.
    pub fn create_from_model(&self, name: &str, from: &str, modelfile: &Modelfile) -> Result<StoredModel> {
        let src = self.get(from)?;
        let name = ModelName::parse_new(name)?;
        let merged = src.entry.modelfile.clone().unwrap_or_default().overlaid(modelfile);
        self.install_copy(&src, &name, Some(merged), true)
    }
}

/// `dir/entry.json`, or `None` when there is none.
fn read_entry(dir: &Path) -> Result<Option<Entry>> {
    let path = dir.join(ENTRY_FILE);
    let meta = match fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(StoreError::Corrupt { path, msg: format!("{} bytes is too large for an entry", meta.len()) });
    }
    let text = fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text).map(Some).map_err(|e| StoreError::Corrupt { path, msg: e.to_string() })
}

/// The subdirectories of `dir` whose names could be a name's part (so not `.tmp`), sorted;
/// none when `dir` does not exist.
fn subdirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().to_str().is_some_and(|n| check_part(n).is_ok()))
        .map(|e| e.path())
        .collect();
    out.sort();
    Ok(out)
}

/// Removes `dir`'s parents up to (not including) `root` while they are empty.
fn prune_empty_parents(dir: &Path, root: &Path) {
    let mut cur = dir.parent();
    while let Some(p) = cur.filter(|p| p.starts_with(root) && *p != root) {
        if fs::remove_dir(p).is_err() {
            break;
        }
        cur = p.parent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fold_case_and_take_defaults() {
        let n = ModelName::parse("Llama3").unwrap();
        assert_eq!(n.to_string(), "llama3:latest");
        assert_eq!(n.rel_dir(), Path::new("library/llama3/latest"));
        assert_eq!(ModelName::parse("library/llama3:latest").unwrap(), n);
        let n = ModelName::parse("meta-llama/llama-3.2-1b:q4_k").unwrap();
        assert_eq!(n.to_string(), "meta-llama/llama-3.2-1b:q4_k");
        assert_eq!(n.rel_dir(), Path::new("meta-llama/llama-3.2-1b/q4_k"));
    }

    #[test]
    fn names_that_could_leave_the_store_are_refused() {
        for bad in [
            "",
            ":",
            "x:",
            ":tag",
            "..",
            "../x",
            "x/..",
            "x:..",
            "./x",
            "x/./y",
            "/etc/passwd",
            "a/b/c",
            "a//b",
            ".hidden",
            "x:.tag",
            "-flag",
            "x:-t",
            "a\\b",
            "a b",
            "x\0y",
            "x\ny",
            "x:y:z",
            "x:a/b",
            "ñame",
            "x/",
            "/x",
            "a:b/../../c",
            "..:latest",
            "x:../../etc",
        ] {
            assert!(ModelName::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(ModelName::parse(&"a".repeat(81)).is_err());
        assert!(ModelName::parse(&"a".repeat(80)).is_ok());
        let e = ModelName::parse("x/../y").unwrap_err().to_string();
        assert!(e.contains("at most one"), "{e}");
    }

    #[test]
    fn digests_are_hex() {
        let entry = Entry {
            format: Format::Gguf,
            source: "/m.gguf".into(),
            size: 3,
            imported_at: "2025-01-02T03:04:05.000000006Z".into(),
            digest: None,
            details: None,
            modelfile: None,
        };
        let d = entry.digest_hex();
        assert!(d.len() == 32 && d.chars().all(|c| c.is_ascii_hexdigit()), "{d}");
        let with = Entry { digest: Some(format!("sha256:{}", "ab".repeat(32))), ..entry.clone() };
        assert_eq!(with.digest_hex(), "ab".repeat(32));
        assert_eq!(
            entry.modified().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            1_735_787_045,
            "imported_at parses"
        );
    }
}
