//! Writing a model into the store: built in a staging directory under `.tmp/` that this
//! process holds, flushed to the disk, then published at its name (see [`super::staging`]
//! for how a replacement stays whole when the process is killed).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use super::staging::{self, Held, Publish};
use super::{
    ENTRY_FILE, Entry, Format, ModelName, Origin, Result, Store, StoreError, StoredModel, inspect, io, read_entry,
};

impl Store {
    /// Builds the model in a staging directory (`fill` writes its payload), writes its
    /// entry, flushes both to the disk, then publishes it at its name: in one step
    /// (replacing what is there), so the name holds the old model or the new one, whole,
    /// whenever the process is killed (see [`staging`]).
    pub(super) fn install(
        &self,
        name: &ModelName,
        format: Format,
        origin: Origin,
        replace: bool,
        fill: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<StoredModel> {
        let (dir, staged, entry) = self.stage(name, format, origin, replace, fill)?;
        Publish { staged: &staged, dir: &dir, name }.all()?;
        staged.disarm();
        Ok(StoredModel { name: name.clone(), dir, entry })
    }

    /// The first half of [`install`](Self::install): the model complete and synced in a
    /// staging directory this process holds, and the directory it is to be published at.
    pub(super) fn stage(
        &self,
        name: &ModelName,
        format: Format,
        origin: Origin,
        replace: bool,
        fill: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<(PathBuf, Held, Entry)> {
        let dir = self.models_dir().join(name.rel_dir());
        if !replace && read_entry(&dir)?.is_some() {
            return Err(StoreError::Exists(name.to_string()));
        }
        self.sweep();
        let staged = Held::create_dir(&mut || self.staging(staging::INSTALL))?;
        let payload = staged.path().join(format.payload());
        fill(&payload)?;
        let details = match origin.details {
            Some(d) => Some(d),
            None => inspect(&payload, format)
                .inspect_err(|e| tracing::warn!(model = %name, error = %crate::errors::chain(e), "no model details"))
                .ok(),
        };
        let entry = Entry {
            format,
            source: origin.source,
            size: tree_size(&payload)?,
            imported_at: format!("{:.9}", jiff::Timestamp::now()),
            digest: origin.digest,
            details,
            modelfile: origin.modelfile.filter(|m| !m.is_empty()),
        };
        let entry_path = staged.path().join(ENTRY_FILE);
        let text = serde_json::to_string_pretty(&entry).expect("an entry serializes");
        fs::write(&entry_path, text + "\n").map_err(io(&entry_path))?;
        // Everything is on the disk before a rename makes it a model.
        staging::sync(staged.path())?;
        let parent = dir.parent().expect("a model directory has a parent");
        fs::create_dir_all(parent).map_err(io(parent))?;
        if !replace && read_entry(&dir)?.is_some() {
            return Err(StoreError::Exists(name.to_string()));
        }
        Ok((dir, staged, entry))
    }

    /// A fresh path under `.tmp/` (the directory's parent is created; the path itself is
    /// not).
    pub(super) fn staging(&self, what: &str) -> Result<PathBuf> {
        fresh_in(&self.tmp_dir(), what, "")
    }

    /// Removes what writers that are gone left in `.tmp/`, putting back a model whose
    /// replacement they interrupted (best effort; see [`staging::plan`]).
    pub(super) fn sweep(&self) {
        staging::sweep(&self.tmp_dir(), &self.models_dir());
    }
}

/// A fresh path in `dir` (created if missing), `WHAT-PID-N-NANOS` and `suffix`: unique
/// among this process's (`N` counts) and other processes' (`PID`, `NANOS`).
pub(super) fn fresh_in(dir: &Path, what: &str, suffix: &str) -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(dir).map_err(io(dir))?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    Ok(dir.join(format!("{what}-{}-{n}-{nanos}{suffix}", std::process::id())))
}

/// Hard-links the file `src` (symbolic links followed) to `dst`, or copies it when the
/// link cannot be made (another filesystem, no permission).
pub(super) fn link_or_copy(src: &Path, dst: &Path) -> Result<()> {
    let real = fs::canonicalize(src).map_err(io(src))?;
    if !fs::metadata(&real).map_err(io(&real))?.is_file() {
        return Err(StoreError::Unsupported { path: src.to_owned(), msg: "not a regular file".into() });
    }
    if fs::hard_link(&real, dst).is_ok() {
        return Ok(());
    }
    fs::copy(&real, dst).map_err(io(dst))?;
    Ok(())
}

/// Copies the directory `src` into the new directory `dst` file by file
/// ([`link_or_copy`]), skipping hidden entries; into subdirectories when `recurse`.
pub(super) fn copy_tree(src: &Path, dst: &Path, recurse: bool) -> Result<()> {
    copy_dir_filtered(src, dst, recurse, &|_| true)
}

/// A Hugging Face directory's top-level files. Weights in other formats that sit next to
/// safetensors (`*.bin`, `*.pth`, ...) and subdirectories (`original/`) are left out.
pub(super) fn copy_hf_dir(src: &Path, dst: &Path) -> Result<()> {
    const OTHER_WEIGHTS: [&str; 8] = ["bin", "pt", "pth", "h5", "msgpack", "onnx", "ot", "gguf"];
    let names = fs::read_dir(src).map_err(io(src))?;
    let has_safetensors =
        names.flatten().any(|e| Path::new(&e.file_name()).extension().is_some_and(|x| x == "safetensors"));
    let keep = |p: &Path| {
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
        !(has_safetensors && OTHER_WEIGHTS.contains(&ext))
    };
    copy_dir_filtered(src, dst, false, &keep)
}

fn copy_dir_filtered(src: &Path, dst: &Path, recurse: bool, keep: &dyn Fn(&Path) -> bool) -> Result<()> {
    fs::create_dir(dst).map_err(io(dst))?;
    let mut entries: Vec<_> = fs::read_dir(src).map_err(io(src))?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symbolic links: a Hugging Face cache snapshot is links into its blobs.
        let meta = fs::metadata(&path).map_err(io(&path))?;
        if meta.is_dir() {
            if recurse {
                copy_dir_filtered(&path, &dst.join(&name), recurse, keep)?;
            }
        } else if meta.is_file() && keep(&path) {
            link_or_copy(&path, &dst.join(&name))?;
        }
    }
    Ok(())
}

/// Bytes of the files under `path` (or of the file `path`).
pub(super) fn tree_size(path: &Path) -> Result<u64> {
    let meta = fs::metadata(path).map_err(io(path))?;
    if !meta.is_dir() {
        return Ok(meta.len());
    }
    let mut total = 0;
    for entry in fs::read_dir(path).map_err(io(path))?.flatten() {
        total += tree_size(&entry.path())?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(source: &str) -> Origin {
        Origin { source: source.into(), digest: None, details: None, modelfile: None }
    }

    fn write(bytes: &'static [u8]) -> impl FnOnce(&Path) -> Result<()> {
        move |p| fs::write(p, bytes).map_err(io(p))
    }

    /// Every point a replacement can be killed at, on both ways of swapping: the sweep
    /// that follows leaves the old model or the new one, whole, and nothing in `.tmp/`.
    #[test]
    fn a_replacement_killed_after_any_step_leaves_a_whole_model() {
        let root = std::env::temp_dir().join(format!("strata-store-kill-{}", std::process::id()));
        let name = ModelName::parse("v").unwrap();
        for swap in [staging::Swap::Exchange, staging::Swap::Aside] {
            for k in 0.. {
                let _ = fs::remove_dir_all(&root);
                let store = Store::open(&root);
                store.install(&name, Format::Gguf, origin("old"), false, write(b"old")).unwrap();
                let (dir, staged, _) = store.stage(&name, Format::Gguf, origin("new"), true, write(b"new")).unwrap();
                let publish = Publish { staged: &staged, dir: &dir, name: &name };
                let steps = publish.steps(swap);
                if k > steps.len() {
                    break;
                }
                for &step in &steps[..k] {
                    if publish.run(step).unwrap().is_some() {
                        eprintln!("skipped: this filesystem has no RENAME_EXCHANGE");
                        return;
                    }
                }
                staged.abandon();
                // A later writer's sweep, or a server starting.
                store.sweep();
                let at = format!("{swap:?} killed after {:?}", &steps[..k]);
                let m = store.get("v").unwrap_or_else(|e| panic!("{at}: {e}"));
                let payload = fs::read(m.path()).unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!(payload, m.entry.source.as_bytes(), "{at}: the entry and the files agree");
                match k {
                    0 => assert_eq!(payload, b"old", "{at}"),
                    k if k == steps.len() => assert_eq!(payload, b"new", "{at}"),
                    _ => {}
                }
                let left: Vec<_> = fs::read_dir(store.tmp_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
                assert!(left.is_empty(), "{at}: {left:?}");
                let names: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
                assert_eq!(names.len(), 2, "{at}: entry.json and model.gguf only: {names:?}");
            }
        }
        let _ = fs::remove_dir_all(&root);
    }
}
