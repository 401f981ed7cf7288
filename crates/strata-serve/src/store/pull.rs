//! `strata pull hf:ORG/REPO[@REV]` and `/api/pull`: download a Hugging Face repository's
//! safetensors and tokenizer files (see [`crate::hub`]), optionally convert them to a
//! quantized flat layer directory, and import the result into the store.
//!
//! Downloads go to `$STRATA_HOME/downloads/hf/<repo>/<revision>/` and resume from there
//! after an interruption; the directory is removed once the model is in the store.

use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::Context;

use super::{Store, StoredModel};
use crate::hub::{self, HubClient, RepoRef};
use strata_model::ModelSource;
use strata_model::convert::{self, ConvertOptions, Target};
use strata_tensor::tensor::DType;

/// What a pull is doing, for progress bars and Ollama-style status lines.
pub enum PullEvent<'a> {
    /// The repository's file list is being read.
    Listing(&'a RepoRef),
    Download(&'a hub::Progress<'a>),
    Convert(convert::Progress),
    /// The files are being moved into the store.
    Importing,
}

/// The store name a pull of `repo` gets unless one is given: the repository id in lower
/// case, tagged with the quantization (or `latest`).
pub fn default_name(repo: &RepoRef, quant: Option<DType>) -> String {
    let tag = quant.map_or_else(|| "latest".to_owned(), |q| q.name().to_ascii_lowercase());
    format!("{}:{tag}", repo.repo.to_ascii_lowercase())
}

/// Pulls `spec` (`hf:ORG/REPO[@REV]`) into `store` as `name` (default:
/// [`default_name`]). `on` sees every step and may stop the pull with `Break` (the
/// partial download stays for a later resume).
pub fn pull_hf(
    store: &Store,
    client: &HubClient,
    spec: &str,
    quant: Option<DType>,
    name: Option<&str>,
    replace: bool,
    on: &mut dyn FnMut(PullEvent<'_>) -> ControlFlow<()>,
) -> anyhow::Result<StoredModel> {
    let repo = hub::parse_spec(spec)?;
    let name = name.map_or_else(|| default_name(&repo, quant), str::to_owned);
    // Refuse a bad or taken name before downloading anything.
    super::ModelName::parse(&name)?;
    if !replace && store.get(&name).is_ok() {
        anyhow::bail!("model `{name}` already exists (remove it first, or pull with --force)");
    }
    let dir = download_dir(store, &repo);
    if on(PullEvent::Listing(&repo)).is_break() {
        anyhow::bail!("pull of {spec} cancelled");
    }
    let snapshot = client.download(&repo, &dir, &mut |p| on(PullEvent::Download(p)))?;
    let imported = match quant {
        None => {
            if on(PullEvent::Importing).is_break() {
                anyhow::bail!("pull of {spec} cancelled");
            }
            store.import(&snapshot.dir, &name, replace)?
        }
        Some(q) => {
            let work = dir.with_extension(format!("convert-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&work);
            std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
            let out = work.join("model");
            let result = (|| {
                let src = ModelSource::from_hf_dir(&snapshot.dir)?;
                let opts =
                    ConvertOptions { target: Target::Flat, quant: Some(q), threads: 0, ndsq: None, sparse_ffn: None };
                convert::convert(src, &out, &opts, &mut |p| {
                    let _ = on(PullEvent::Convert(p));
                })?;
                let _ = on(PullEvent::Importing);
                Ok::<_, anyhow::Error>(store.import(&out, &name, replace)?)
            })();
            let _ = std::fs::remove_dir_all(&work);
            result?
        }
    };
    // The store holds its own links or copies now.
    let _ = std::fs::remove_dir_all(&dir);
    Ok(imported)
}

/// `downloads/hf/<org>/<repo>/<revision>` under the store's home (a revision's `/`
/// becomes `%2F`).
fn download_dir(store: &Store, repo: &RepoRef) -> PathBuf {
    store.home().join("downloads").join("hf").join(&repo.repo).join(repo.revision.replace('/', "%2F"))
}
