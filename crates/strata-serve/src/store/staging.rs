//! Work in progress under `models/.tmp/` (and `blobs/*.partial`): how a writer holds it,
//! how a finished model is published, and what the sweep does with what writers left.
//!
//! A writer holds an exclusive `flock(2)` on each staging directory or partial file it
//! makes, for as long as it runs; the kernel drops the lock when the process ends,
//! however it ends. The sweep removes only what it can lock itself, so a live writer in
//! another PID namespace (a container sharing `$STRATA_HOME`) keeps its work.
//!
//! Publishing a model that replaces another is one `renameat2(RENAME_EXCHANGE)` where the
//! filesystem has it: the name holds the old model or the new one at every instant. Where
//! it does not, the old directory is renamed aside (`<staging>.aside`) and the new one in,
//! with the name recorded beside them (`<staging>.target`) first, so that the sweep puts
//! a model back when a writer died between the two renames ([`plan`]).

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::{ENTRY_FILE, ModelName, Result, StoreError, io, read_entry};
use strata_format::temp;

/// How the staging directories of installs are named (`import-PID-N-NANOS`): only
/// these are ever put back.
pub(super) const INSTALL: &str = "import";
/// The suffix of the file beside a staging directory that names the model it replaces
/// (`ns/model/tag`).
const TARGET: &str = ".target";
/// The suffix of a replaced model's directory while it is set aside.
const ASIDE: &str = ".aside";

/// A staging directory or partial file under a writer's lock, removed when dropped unless
/// [`disarm`](Held::disarm)ed.
pub(super) struct Held {
    path: PathBuf,
    file: File,
    remove_on_drop: bool,
}

impl Held {
    /// Creates the directory `fresh()` names and locks it (a fresh name again, if a sweep
    /// took the first one before the lock was held).
    pub(super) fn create_dir(fresh: &mut dyn FnMut() -> Result<PathBuf>) -> Result<Held> {
        Held::create(fresh, &|p| fs::create_dir(p).and_then(|()| File::open(p)))
    }

    /// Creates the file `fresh()` names, for writing, and locks it.
    pub(super) fn create_file(fresh: &mut dyn FnMut() -> Result<PathBuf>) -> Result<Held> {
        Held::create(fresh, &|p| fs::OpenOptions::new().write(true).create_new(true).open(p))
    }

    fn create(
        fresh: &mut dyn FnMut() -> Result<PathBuf>,
        make: &dyn Fn(&Path) -> std::io::Result<File>,
    ) -> Result<Held> {
        let mut tries = 0;
        loop {
            tries += 1;
            let path = fresh()?;
            match make(&path) {
                // A sweep that listed the new name before the lock was taken may hold it,
                // or may have removed it: then it is not ours to use.
                Ok(file) if try_lock(&file).unwrap_or(true) && same_file(&file, &path) => {
                    return Ok(Held { path, file, remove_on_drop: true });
                }
                Ok(_) if tries < 3 => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => {}
                Ok(_) => return Err(StoreError::Io { path, err: std::io::Error::other("a concurrent sweep took it") }),
                Err(e) => return Err(io(&path)(e)),
            }
        }
    }

    /// Locks the existing directory `path` (a model about to be removed).
    pub(super) fn lock_existing(path: &Path) -> Result<Held> {
        let file = File::open(path).map_err(io(path))?;
        let _ = try_lock(&file);
        Ok(Held { path: path.to_owned(), file, remove_on_drop: false })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn file(&self) -> &File {
        &self.file
    }

    /// Keeps the path when dropped (it was renamed into place); the lock goes with it.
    pub(super) fn disarm(mut self) {
        self.remove_on_drop = false;
    }

    /// What a killed writer leaves: the path stays, the lock is gone.
    #[cfg(test)]
    pub(super) fn abandon(self) {
        self.disarm();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.remove_on_drop {
            remove_any(&self.path);
        }
    }
}

/// Takes an exclusive `flock` on `file` without waiting: `Ok(false)` when another open
/// file (another process, or another open of it here) holds one.
pub(super) fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock(2) on a descriptor `file` owns for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

/// Whether `path` still names the file `file` has open.
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Removes the file or directory `path` (best effort).
pub(super) fn remove_any(path: &Path) {
    let _ = fs::remove_dir_all(path).or_else(|_| fs::remove_file(path));
}

/// Swaps the paths `a` and `b` in one step: `Ok(false)` where the filesystem (or the
/// kernel) cannot.
fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
        let (a, b) = (c(a)?, c(b)?);
        // SAFETY: renameat2(2) with two NUL-terminated paths that outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(false),
            _ => Err(e),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (a, b);
        Ok(false)
    }
}

/// How a model directory that already exists is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Swap {
    /// `renameat2(RENAME_EXCHANGE)`, falling back to [`Swap::Aside`] where it is missing.
    Exchange,
    /// Rename the old one aside, the new one in, then delete the old.
    Aside,
}

/// One step of publishing a staged model at its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The name is free: rename the staging directory to it.
    Rename,
    /// Swap the staging directory and the old model (the staging path then holds the old).
    Exchange,
    /// Write `<staging>.target` (the name).
    WriteTarget,
    /// Rename the old model to `<staging>.aside`.
    SetAside,
    /// Rename the staging directory to the name (after [`Step::SetAside`]).
    RenameIn,
    /// Flush the directories the renames changed.
    SyncParents,
    /// Remove what was replaced, and `<staging>.target`.
    RemoveOld,
}

/// Publishing `staged` (complete and synced) at `dir`, the directory of `name`.
pub(super) struct Publish<'a> {
    pub(super) staged: &'a Held,
    pub(super) dir: &'a Path,
    pub(super) name: &'a ModelName,
}

impl Publish<'_> {
    /// The steps, in order: for a free name, or one holding a model, by `swap`.
    pub(super) fn steps(&self, swap: Swap) -> &'static [Step] {
        use Step::*;
        match (self.dir.exists(), swap) {
            (false, _) => &[Rename, SyncParents],
            (true, Swap::Exchange) => &[Exchange, SyncParents, RemoveOld],
            (true, Swap::Aside) => &[WriteTarget, SetAside, RenameIn, SyncParents, RemoveOld],
        }
    }

    fn aside(&self) -> PathBuf {
        beside(self.staged.path(), ASIDE)
    }

    /// Runs `step`. `Ok(Some(Swap::Aside))`: the exchange is not available here, so the
    /// steps of [`Swap::Aside`] are to be run instead.
    pub(super) fn run(&self, step: Step) -> Result<Option<Swap>> {
        let staged = self.staged.path();
        let taken = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::AlreadyExists => {
                StoreError::Exists(self.name.to_string())
            }
            _ => io(self.dir)(e),
        };
        match step {
            Step::Rename => fs::rename(staged, self.dir).map_err(taken)?,
            Step::Exchange => {
                if !exchange(staged, self.dir).map_err(io(self.dir))? {
                    return Ok(Some(Swap::Aside));
                }
            }
            Step::WriteTarget => {
                let path = beside(staged, TARGET);
                fs::write(&path, self.name.rel_dir().to_string_lossy().as_bytes()).map_err(io(&path))?;
                sync(&path)?;
                if let Some(tmp) = staged.parent() {
                    temp::sync_dir(tmp).map_err(|(path, err)| StoreError::Io { path, err })?;
                }
            }
            Step::SetAside => fs::rename(self.dir, self.aside()).map_err(io(self.dir))?,
            Step::RenameIn => {
                if let Err(e) = fs::rename(staged, self.dir) {
                    // The old model goes back where it was.
                    let _ = fs::rename(self.aside(), self.dir);
                    return Err(taken(e));
                }
            }
            Step::SyncParents => {
                // The model is published; a filesystem that fails to flush it now is told
                // in the log, not as a failed write.
                for dir in [self.dir.parent(), staged.parent()].into_iter().flatten() {
                    if let Err((path, e)) = temp::sync_dir(dir) {
                        tracing::warn!(path = %path.display(), error = %e, "flushing the store's directory failed");
                    }
                }
            }
            Step::RemoveOld => {
                remove_any(staged);
                remove_any(&self.aside());
                remove_any(&beside(staged, TARGET));
            }
        }
        Ok(None)
    }

    /// Runs every step.
    pub(super) fn all(&self) -> Result<()> {
        let mut steps = self.steps(Swap::Exchange);
        let mut i = 0;
        while let Some(&step) = steps.get(i) {
            match self.run(step)? {
                Some(swap) => (steps, i) = (self.steps(swap), 0),
                None => i += 1,
            }
        }
        Ok(())
    }
}

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// [`temp::sync_tree`] as a store error.
pub(super) fn sync(path: &Path) -> Result<()> {
    temp::sync_tree(path).map_err(|(path, err)| StoreError::Io { path, err })
}

/// One entry of `.tmp/` as the sweep found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) name: String,
    /// A live writer holds its lock.
    pub(super) held: bool,
    /// It holds an `entry.json` that reads.
    pub(super) complete: bool,
    /// The model directory it was publishing over (its `.target`), when that is missing now.
    pub(super) orphaned: Option<PathBuf>,
}

/// What the sweep does, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Rename the `.tmp/` entry `from` to the model directory `to`.
    Restore { from: String, to: PathBuf },
    /// Remove the `.tmp/` entry.
    Remove(String),
}

/// What to do with what is in `.tmp/`: nothing a live writer holds (nor the old model it
/// set aside) is touched; a model whose install died between setting the old one aside
/// and renaming the new one in is put back (the old one, else the new one, whichever is
/// complete); everything else goes (a removal's leftovers are never put back).
pub(super) fn plan(seen: &[Seen]) -> Vec<Action> {
    let find = |name: &str| seen.iter().find(|s| s.name == name);
    let mut restores = Vec::new();
    let mut removes = Vec::new();
    for s in seen {
        let owner = [ASIDE, TARGET].iter().find_map(|x| s.name.strip_suffix(x)).map(find);
        if s.held || owner.flatten().is_some_and(|o| o.held) {
            continue;
        }
        let mut restored = false;
        let install = s.name.strip_prefix(INSTALL).is_some_and(|r| r.starts_with('-'));
        if let Some(to) = s.orphaned.clone().filter(|_| install && owner.is_none()) {
            let aside = find(&format!("{}{ASIDE}", s.name)).filter(|a| a.complete && !a.held);
            if let Some(from) = aside.map(|a| a.name.clone()).or_else(|| s.complete.then(|| s.name.clone())) {
                restored = from == s.name;
                restores.push(Action::Restore { from, to });
            }
        }
        if !restored {
            removes.push(Action::Remove(s.name.clone()));
        }
    }
    restores.extend(removes);
    restores
}

/// The model directory a staging directory's `.target` names, if it is a valid name.
fn target_of(staging: &Path, models: &Path) -> Option<PathBuf> {
    let mut text = String::new();
    File::open(beside(staging, TARGET)).ok()?.take(1024).read_to_string(&mut text).ok()?;
    let parts: Vec<&str> = text.trim().split('/').collect();
    let [ns, model, tag] = parts.as_slice() else { return None };
    let name = ModelName::parse(&format!("{ns}/{model}:{tag}")).ok()?;
    Some(models.join(name.rel_dir()))
}

/// Sweeps `tmp` (`models/.tmp`) as [`plan`] says. Best effort: what cannot be removed
/// stays for a later sweep.
pub(super) fn sweep(tmp: &Path, models: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else { return };
    let mut seen = Vec::new();
    // The locks taken are held until the sweep is done.
    let mut locks = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else { continue };
        let path = entry.path();
        let held = match File::open(&path) {
            Ok(f) => match try_lock(&f) {
                Ok(true) => {
                    locks.push(f);
                    false
                }
                // A filesystem without locks: nothing can be known, so nothing is removed.
                _ => true,
            },
            Err(_) => true,
        };
        let complete = matches!(read_entry(&path), Ok(Some(_)));
        let orphaned = target_of(&path, models).filter(|t| !t.exists());
        seen.push(Seen { name, held, complete, orphaned });
    }
    let mut kept = Vec::new();
    for action in plan(&seen) {
        match action {
            Action::Restore { from, to } => {
                let from = tmp.join(from);
                if let Some(parent) = to.parent() {
                    let _ = fs::create_dir_all(parent);
                }
                match fs::rename(&from, &to) {
                    Ok(()) => {
                        tracing::warn!(model = %to.display(), "put back a model whose replacement was interrupted");
                    }
                    Err(e) => {
                        tracing::warn!(from = %from.display(), error = %e, "could not put back an interrupted model");
                        kept.push(from);
                    }
                }
            }
            Action::Remove(name) if !kept.contains(&tmp.join(&name)) => remove_any(&tmp.join(name)),
            Action::Remove(_) => {}
        }
    }
    drop(locks);
}

/// Removes the `*.partial` files in `dir` that no live writer holds (a killed upload's);
/// returns them.
pub(super) fn sweep_partials(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "partial") {
            continue;
        }
        if let Ok(f) = File::open(&path)
            && let Ok(true) = try_lock(&f)
            && fs::remove_file(&path).is_ok()
        {
            removed.push(path);
        }
    }
    removed
}

/// Whether `dir` holds a model's `entry.json` (readable or not).
pub(super) fn has_entry(dir: &Path) -> bool {
    fs::symlink_metadata(dir.join(ENTRY_FILE)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(name: &str, held: bool, complete: bool, orphaned: Option<&str>) -> Seen {
        Seen { name: name.into(), held, complete, orphaned: orphaned.map(PathBuf::from) }
    }

    #[test]
    fn the_plan_keeps_what_live_writers_hold_and_puts_back_interrupted_models() {
        let remove = |n: &str| Action::Remove(n.into());
        // Live writers' work, with a set-aside model, is untouched; leftovers go.
        let live = [
            seen("import-1", true, true, Some("m")),
            seen("import-1.aside", false, true, None),
            seen("import-1.target", false, false, None),
        ];
        assert_eq!(plan(&live), []);
        let dead =
            [seen("import-2", false, false, None), seen("rm-3", false, true, None), seen("x.aside", false, true, None)];
        assert_eq!(plan(&dead), [remove("import-2"), remove("rm-3"), remove("x.aside")]);
        // Died between the renames: the old model goes back, then both go.
        let between = [
            seen("import-4", false, true, Some("m")),
            seen("import-4.aside", false, true, None),
            seen("import-4.target", false, false, None),
        ];
        let back = Action::Restore { from: "import-4.aside".into(), to: "m".into() };
        assert_eq!(plan(&between), [back, remove("import-4"), remove("import-4.aside"), remove("import-4.target")]);
        // No complete old model: the new one is put in (and not removed).
        let new_only = [seen("import-5", false, true, Some("m")), seen("import-5.aside", false, false, None)];
        let new = Action::Restore { from: "import-5".into(), to: "m".into() };
        assert_eq!(plan(&new_only), [new, remove("import-5.aside")]);
        // Nothing complete: nothing to put back. A removal is never undone.
        assert_eq!(plan(&[seen("import-6", false, false, Some("m"))]), [remove("import-6")]);
        assert_eq!(plan(&[seen("rm-7", false, true, Some("m"))]), [remove("rm-7")]);
    }

    #[test]
    fn a_lock_held_by_another_open_file_is_seen_and_released_with_it() {
        let dir = std::env::temp_dir().join(format!("strata-store-lock-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut n = 0;
        let held = Held::create_dir(&mut || {
            n += 1;
            Ok(dir.join(format!("import-{n}")))
        })
        .unwrap();
        let other = File::open(held.path()).unwrap();
        assert!(!try_lock(&other).unwrap(), "the writer holds it");
        let path = held.path().to_owned();
        held.abandon();
        assert!(path.exists() && try_lock(&other).unwrap(), "gone with the writer");
        fs::remove_dir_all(&dir).unwrap();
    }
}
