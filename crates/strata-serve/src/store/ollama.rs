//! Reading Ollama's own store: `manifests/<host>/<namespace>/<model>/<tag>` is a JSON
//! image manifest whose layer of media type `application/vnd.ollama.image.model` names
//! the GGUF blob `blobs/sha256-<hex>`. The template, parameters, license and projector
//! layers are not used.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Result, StoreError, io};

const DEFAULT_HOST: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const DEFAULT_TAG: &str = "latest";
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
/// Manifests are a few hundred bytes.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// `$OLLAMA_MODELS`, or `~/.ollama/models`.
pub fn ollama_models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OLLAMA_MODELS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".ollama").join("models")
}

/// An Ollama model name: `[[host/]namespace/]model[:tag]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OllamaName {
    host: String,
    namespace: String,
    model: String,
    tag: String,
}

impl OllamaName {
    pub fn parse(name: &str) -> Result<Self> {
        let bad = |reason: String| StoreError::InvalidName { name: name.escape_debug().to_string(), reason };
        let (base, tag) = match name.rsplit_once(':') {
            Some((base, tag)) if !tag.contains('/') => (base, tag),
            _ => (name, DEFAULT_TAG),
        };
        let parts: Vec<&str> = base.split('/').collect();
        let (host, namespace, model) = match parts.as_slice() {
            [m] => (DEFAULT_HOST, DEFAULT_NAMESPACE, *m),
            [ns, m] => (DEFAULT_HOST, *ns, *m),
            [host, ns, m] => (*host, *ns, *m),
            _ => return Err(bad("an Ollama name is [[host/]namespace/]model[:tag]".into())),
        };
        for part in [host, namespace, model, tag] {
            check_part(part).map_err(|r| bad(format!("`{}` {r}", part.escape_debug())))?;
        }
        Ok(OllamaName { host: host.into(), namespace: namespace.into(), model: model.into(), tag: tag.into() })
    }

    /// The Strata name it is imported as by default: the host is dropped, and so is the
    /// `library` namespace.
    pub fn store_name(&self) -> String {
        match self.namespace.as_str() {
            DEFAULT_NAMESPACE => format!("{}:{}", self.model, self.tag),
            ns => format!("{ns}/{}:{}", self.model, self.tag),
        }
    }

    fn manifest_path(&self, root: &Path) -> PathBuf {
        root.join("manifests").join(&self.host).join(&self.namespace).join(&self.model).join(&self.tag)
    }
}

impl fmt::Display for OllamaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host != DEFAULT_HOST {
            write!(f, "{}/", self.host)?;
        }
        if self.host != DEFAULT_HOST || self.namespace != DEFAULT_NAMESPACE {
            write!(f, "{}/", self.namespace)?;
        }
        write!(f, "{}:{}", self.model, self.tag)
    }
}

/// A path component Ollama could have written and that stays inside its directory.
fn check_part(part: &str) -> std::result::Result<(), String> {
    if part.is_empty() || part.len() > 255 {
        return Err("must be 1 to 255 characters".into());
    }
    if !part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return Err("may hold only letters, digits, `.`, `_` and `-`".into());
    }
    if !part.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must start with a letter or a digit".into());
    }
    Ok(())
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    layers: Vec<Layer>,
}

#[derive(Deserialize)]
struct Layer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    #[serde(default)]
    size: Option<u64>,
}

/// The model layer's blob.
pub(super) struct Blob {
    pub path: PathBuf,
    /// `sha256:<hex>`
    pub digest: String,
}

/// Finds the GGUF blob of `name` in the Ollama store at `root`.
pub(super) fn model_blob(root: &Path, name: &OllamaName) -> Result<Blob> {
    let mut path = name.manifest_path(root);
    if !path.is_file() {
        // Newer Ollama releases match names regardless of case.
        let lower = OllamaName {
            host: name.host.to_ascii_lowercase(),
            namespace: name.namespace.to_ascii_lowercase(),
            model: name.model.to_ascii_lowercase(),
            tag: name.tag.to_ascii_lowercase(),
        };
        path = lower.manifest_path(root);
    }
    if !path.is_file() {
        return Err(StoreError::OllamaNotFound { name: name.to_string(), manifest: name.manifest_path(root) });
    }
    let corrupt = |msg: String| StoreError::Corrupt { path: path.clone(), msg };
    let len = std::fs::metadata(&path).map_err(io(&path))?.len();
    if len > MAX_MANIFEST_BYTES {
        return Err(corrupt(format!("{len} bytes is too large for a manifest")));
    }
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let manifest: Manifest =
        serde_json::from_str(&text).map_err(|e| corrupt(format!("not an Ollama manifest: {e}")))?;
    let layer = manifest
        .layers
        .iter()
        .find(|l| l.media_type == MODEL_LAYER)
        .ok_or_else(|| corrupt(format!("no `{MODEL_LAYER}` layer")))?;
    let hex = layer
        .digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| corrupt(format!("the model layer's digest `{}` is not sha256:<64 hex digits>", layer.digest)))?;
    let blob = root.join("blobs").join(format!("sha256-{hex}"));
    let actual = std::fs::metadata(&blob).map_err(io(&blob))?.len();
    if let Some(size) = layer.size.filter(|&s| s != actual) {
        return Err(StoreError::Corrupt {
            path: blob,
            msg: format!("{actual} bytes, but the manifest says {size} (an incomplete pull?)"),
        });
    }
    Ok(Blob { path: blob, digest: format!("sha256:{}", hex.to_ascii_lowercase()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_names() {
        let n = OllamaName::parse("llama3").unwrap();
        assert_eq!(
            n.manifest_path(Path::new("/o")),
            Path::new("/o/manifests/registry.ollama.ai/library/llama3/latest")
        );
        assert_eq!((n.to_string(), n.store_name()), ("llama3:latest".into(), "llama3:latest".into()));
        let n = OllamaName::parse("hf.co/Org/Model-GGUF:Q4_K_M").unwrap();
        assert_eq!(n.manifest_path(Path::new("/o")), Path::new("/o/manifests/hf.co/Org/Model-GGUF/Q4_K_M"));
        assert_eq!(n.store_name(), "Org/Model-GGUF:Q4_K_M");
        assert_eq!(OllamaName::parse("me/m:1b").unwrap().to_string(), "me/m:1b");
        for bad in ["", "../x", "a/../b", "x:..", "a/b/c/d", "x:", ".x", "a\\b", "/abs", "x y", "h:1/ns/m"] {
            assert!(OllamaName::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
