//! `strata verify`: every checksum of a flat directory or `.cawsf` file, given by path
//! or by its name in the store.

use std::path::{Path, PathBuf};

use super::outln;
use clap::Args;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// A flat layer directory or a `.cawsf` file, or a name in the store.
    pub path: PathBuf,
}

pub fn main(args: VerifyArgs) -> anyhow::Result<()> {
    let (path, _) = crate::resolve::spec_path(&args.path)?;
    let p: &Path = &path;
    let report = if p.is_dir() && p.join("manifest.json").is_file() {
        let r = crate::format::flat::verify(p)?;
        format!("{} files, {} tensors, {} bytes checked", r.files, r.tensors, r.bytes)
    } else if p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case("cawsf")) {
        let r = crate::format::cawsf::verify(p)?;
        format!("{} sections, {} shards, {} tensors, {} bytes checked", r.sections, r.shards, r.tensors, r.bytes_hashed)
    } else if p.exists() {
        anyhow::bail!(
            "{}: not a format with checksums (flat layer directories and .cawsf files have them; GGUF and safetensors do not)",
            p.display()
        );
    } else {
        anyhow::bail!("{}: no such file or directory", p.display());
    };
    outln!("{}: ok ({report})", p.display())?;
    Ok(())
}
