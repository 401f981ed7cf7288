//! `strata import`: a model file or directory, or a model in Ollama's store, into the
//! model store under a name.

use std::path::Path;

use anyhow::Context;
use clap::Args;

use super::outln;
use super::store_cmds::{explain, human_size};
use crate::store::{ModelName, Store, ollama_models_dir};

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// A `.gguf` or `.cawsf` file, a flat layer directory or a Hugging Face directory; or
    /// `ollama:NAME[:TAG]`, a model pulled by Ollama (from $OLLAMA_MODELS, default
    /// ~/.ollama/models).
    pub source: String,
    /// The name in the store, `NAME[:TAG]` (default: the Ollama name, or the file or
    /// directory name).
    #[arg(long)]
    pub name: Option<String>,
    /// Replace a model that already has this name.
    #[arg(long)]
    pub force: bool,
}

pub fn main(args: ImportArgs) -> anyhow::Result<()> {
    let store = Store::default();
    let imported = match args.source.strip_prefix("ollama:") {
        Some(ollama_name) => {
            let root = ollama_models_dir();
            store
                .import_ollama(&root, ollama_name, args.name.as_deref(), args.force)
                .map_err(|e| explain(&store, e, args.force))?
        }
        None => {
            let path = Path::new(&args.source);
            let name = match &args.name {
                Some(n) => n.clone(),
                None => default_name(path)?,
            };
            store.import(path, &name, args.force).map_err(|e| explain(&store, e, args.force))?
        }
    };
    let e = &imported.entry;
    let what = e.details.as_ref().map_or(String::new(), |d| format!(", {} {}", d.architecture, d.quantization));
    outln!("imported {} ({}{what}, {}) from {}", imported.name, e.format.name(), human_size(e.size), e.source)?;
    Ok(())
}

/// A store name from a path: the file stem of a model file, or a directory's name.
fn default_name(path: &Path) -> anyhow::Result<String> {
    let is_file = path.is_file();
    let stem = match is_file {
        true => path.file_stem(),
        false => path.components().next_back().map(|c| c.as_os_str()),
    };
    let stem = stem.and_then(|s| s.to_str()).context("give the model a name with --name NAME[:TAG]")?;
    ModelName::parse(stem)
        .map(|n| n.to_string())
        .map_err(|e| anyhow::anyhow!("{e}; give a name with --name NAME[:TAG]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_default_to_the_stem() {
        assert_eq!(default_name(Path::new("/no/such/Llama-3.2-1B/")).unwrap(), "llama-3.2-1b:latest");
        assert!(default_name(Path::new("/no/such/my model")).unwrap_err().to_string().contains("--name"));
    }
}
