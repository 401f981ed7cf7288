//! Model SPECs as users give them: a path, the demo model, or a name in the model store
//! (`name[:tag]`, see [`crate::store`]). The model layer opens files
//! ([`ModelSource::from_path`]); this serve-layer module adds the store names.

use std::path::{Path, PathBuf};

use strata_model::{ModelSource, demo};

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

/// A model SPEC: `strata-demo`, a `.gguf` or `.cawsf` file, a flat or Hugging Face
/// directory, or else a name in the model store (`name[:tag]`, see [`crate::store`]).
pub fn open(spec: &str) -> anyhow::Result<ModelSource> {
    if spec == demo::DEMO_NAME {
        return demo::demo_source();
    }
    let (path, store_name) = spec_path(Path::new(spec))?;
    let mut source = ModelSource::open_at(&path, spec)?;
    if let Some(name) = store_name {
        source.name = name; // not the store's `model.gguf` / `model`
    }
    Ok(source)
}

/// [`Engine::load`](strata_engine::session::Engine::load) for any SPEC [`open`] takes,
/// store names included.
pub fn load(spec: &str, opts: &strata_engine::session::RunOptions) -> anyhow::Result<strata_engine::session::Engine> {
    strata_engine::session::Engine::from_source(open(spec)?, opts)
}
