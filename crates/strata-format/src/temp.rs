//! Temporary names for outputs written in place: `convert` and `export` write `OUT` as a
//! hidden sibling `.NAME.tmp-PID-N` (`NAME` is `OUT`'s file name, `PID` the writing
//! process, `N` a counter within it) and rename it to `OUT` when done. A process that
//! is killed (SIGKILL, SIGINT, a power cut) leaves its sibling behind; the next writer
//! of the same `OUT` removes those whose process is gone ([`remove_stale`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;

/// Distinguishes the temporaries of writers in one process.
static WRITERS: AtomicUsize = AtomicUsize::new(0);

/// A fresh temporary sibling name for `out`: `.NAME.tmp-PID-N`, unique per process and
/// call.
pub fn sibling(out: &Path) -> anyhow::Result<PathBuf> {
    let name = out.file_name().with_context(|| format!("{}: not a file or directory name", out.display()))?;
    let n = WRITERS.fetch_add(1, Ordering::Relaxed);
    Ok(out.with_file_name(format!(".{}.tmp-{}-{n}", name.to_string_lossy(), std::process::id())))
}

/// The PID in `entry` when it is a temporary name of `out_name` written by [`sibling`]
/// (`.NAME.tmp-PID-N`) or by earlier Strata versions (`.NAME.tmp-PID`, the `.cawsf`
/// writer's).
fn writer_pid(entry: &str, out_name: &str) -> Option<u32> {
    let rest = entry.strip_prefix('.')?.strip_prefix(out_name)?.strip_prefix(".tmp-")?;
    let (pid, n) = rest.split_once('-').unwrap_or((rest, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(n)).then(|| pid.parse().ok()).flatten()
}

/// Whether process `pid` is gone, as far as this process can tell: `Some(true)` when
/// `/proc` lists processes and not `pid`, `None` where there is no `/proc` to ask.
fn process_gone(pid: u32) -> Option<bool> {
    let proc = Path::new("/proc");
    proc.join("self").exists().then(|| !proc.join(pid.to_string()).exists())
}

/// Removes the temporaries of `out` (files or directories named as by [`sibling`]) that
/// processes which are gone left behind, and returns them. One whose process still
/// runs (or that this process writes) is kept, and so is every one where `/proc` cannot
/// tell. A temporary that cannot be removed is an error naming it.
pub fn remove_stale(out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let Some(out_name) = out.file_name().map(|n| n.to_string_lossy().into_owned()) else { return Ok(Vec::new()) };
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // A parent that cannot be listed fails the write itself, naming it.
    let Ok(entries) = std::fs::read_dir(parent) else { return Ok(Vec::new()) };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = writer_pid(&name, &out_name) else { continue };
        if pid == std::process::id() || process_gone(pid) != Some(true) {
            continue;
        }
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let gone = if is_dir { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        match gone {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("removing {}, left by process {pid}, which is gone", path.display()));
            }
        }
    }
    Ok(removed)
}

/// An I/O error and the path it happened on.
pub type PathError = (PathBuf, std::io::Error);

/// Flushes every file and directory under `path` (or the file `path`) to the disk, each
/// directory after what it holds, so that renaming `path` into place publishes complete
/// contents even across a power cut. Symbolic links are not followed.
pub fn sync_tree(path: &Path) -> Result<(), PathError> {
    visit_tree(path, &mut |p, file| sync_one(p, &file))
}

/// Flushes the directory `dir`, making a rename into or out of it durable. A filesystem
/// that cannot sync directories (some answer `EINVAL`) is not an error.
pub fn sync_dir(dir: &Path) -> Result<(), PathError> {
    let file = std::fs::File::open(dir).map_err(|e| (dir.to_owned(), e))?;
    sync_one(dir, &file)
}

fn sync_one(path: &Path, file: &std::fs::File) -> Result<(), PathError> {
    match file.sync_all() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && path.is_dir() => Ok(()),
        other => other.map_err(|e| (path.to_owned(), e)),
    }
}

/// Calls `visit` with every file and directory under `path` opened for reading, each
/// directory after its entries.
fn visit_tree(
    path: &Path,
    visit: &mut dyn FnMut(&Path, std::fs::File) -> Result<(), PathError>,
) -> Result<(), PathError> {
    let at = |e| (path.to_owned(), e);
    let meta = std::fs::symlink_metadata(path).map_err(at)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(at)? {
            visit_tree(&entry.map_err(at)?.path(), visit)?;
        }
    }
    let file = std::fs::File::open(path).map_err(at)?;
    visit(path, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_outputs_temporaries_are_recognized() {
        assert_eq!(writer_pid(".m.cawsf.tmp-123-4", "m.cawsf"), Some(123));
        assert_eq!(writer_pid(".m.cawsf.tmp-123", "m.cawsf"), Some(123));
        assert_eq!(writer_pid(".model.tmp-7-0", "model"), Some(7));
        for other in
            [".model.tmp-7-0", ".m.cawsf.tmp", ".m.cawsf.tmp-", ".m.cawsf.tmp-12x", ".m.cawsf.tmp-1-2-3", "m.cawsf"]
        {
            assert_eq!(writer_pid(other, "m.cawsf"), None, "{other}");
        }
        assert_eq!(writer_pid(".model2.tmp-7-0", "model"), None);
    }

    #[test]
    fn siblings_are_unique_and_name_this_process() {
        let (a, b) = (sibling(Path::new("d/m.gguf")).unwrap(), sibling(Path::new("d/m.gguf")).unwrap());
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert_eq!(writer_pid(name, "m.gguf"), Some(std::process::id()));
        assert_eq!(a.parent(), Some(Path::new("d")));
    }

    #[test]
    fn leftovers_of_gone_processes_are_removed_and_live_ones_kept() {
        let dir = std::env::temp_dir().join(format!("strata-temp-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::process::id();
        let stale_dir = dir.join(format!(".m.tmp-{dead}-0"));
        std::fs::create_dir(&stale_dir).unwrap();
        std::fs::write(stale_dir.join("layer_000.bin"), b"x").unwrap();
        let stale_file = dir.join(format!(".m.tmp-{dead}"));
        std::fs::write(&stale_file, b"x").unwrap();
        let kept = [dir.join(format!(".m.tmp-{live}-0")), dir.join(format!(".n.tmp-{dead}-0")), dir.join(".m.tmp")];
        for k in &kept {
            std::fs::write(k, b"x").unwrap();
        }
        let mut removed = remove_stale(&dir.join("m")).unwrap();
        removed.sort();
        if process_gone(dead) == Some(true) {
            assert_eq!(removed, [stale_file, stale_dir]);
        }
        assert!(kept.iter().all(|k| k.exists()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_tree_is_synced_file_by_file_and_each_directory_after_its_entries() {
        let dir = std::env::temp_dir().join(format!("strata-temp-sync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("model/sub")).unwrap();
        for f in ["entry.json", "model/a.bin", "model/sub/b.bin"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        std::os::unix::fs::symlink("/nonexistent", dir.join("model/link")).unwrap();
        let mut seen = Vec::new();
        visit_tree(&dir, &mut |p, _| {
            seen.push(p.strip_prefix(&dir).unwrap().display().to_string());
            Ok(())
        })
        .unwrap();
        let at = |p: &str| seen.iter().position(|s| s == p).unwrap_or_else(|| panic!("{p} not synced: {seen:?}"));
        for f in ["entry.json", "model/a.bin", "model/sub/b.bin"] {
            at(f);
        }
        assert!(at("model/sub/b.bin") < at("model/sub") && at("model/sub") < at("model") && at("model") < at(""));
        assert!(!seen.iter().any(|s| s.contains("link")), "links are not followed: {seen:?}");
        sync_tree(&dir).unwrap();
        sync_dir(&dir).unwrap();
        let (path, e) = sync_tree(&dir.join("missing")).unwrap_err();
        assert_eq!((path, e.kind()), (dir.join("missing"), std::io::ErrorKind::NotFound));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
