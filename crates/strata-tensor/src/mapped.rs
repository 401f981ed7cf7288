//! Model files mapped read-only, and what happens when one changes on disk while mapped.
//!
//! A mapped file that shrinks (truncated, or rewritten in place by `curl -o` or
//! `open(path, "wb")`, which a store import's hard link shares) makes the next read of a
//! page past its new end raise SIGBUS, which by default kills the process and every
//! request on every model with it. Instead:
//!
//! - every [`MappedFile`] registers its address range in a fixed table of atomics;
//! - a process-wide SIGBUS handler, for a fault inside a registered range, maps anonymous
//!   zero pages over the rest of that range (`mmap(MAP_FIXED)`, a plain system call),
//!   marks the mapping faulted and returns: the read that faulted, and every later one,
//!   sees zeros, so the pass in progress completes with garbage instead of killing the
//!   process. A fault outside every registered range goes to the handler that was there
//!   before (Rust's stack-overflow report) or to the default action;
//! - whoever runs a model watches the files its load mapped ([`watch`], [`FileSet`]):
//!   after each pass it asks whether one faulted, before each request whether one changed
//!   on disk (size, modification time or inode: an in-place rewrite of the same size
//!   raises no SIGBUS), and then fails that model's requests naming the file and drops
//!   the model, so that the next request loads the file as it is now.
//!
//! Why this and not the alternatives: a read lease (`F_SETLEASE`) only tells us a writer
//! opened the file, needs the file's owner or CAP_LEASE, and cannot stop the truncation;
//! copying files on import instead of hard-linking them protects store copies but not a
//! file served by path. The handler needs nothing from the file's owner and covers every
//! format, since every reader maps through [`MappedFile::map`].

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::SystemTime;

use crate::tensor::ByteSource;

/// Mappings registered at once; one past this is mapped unguarded (and logged).
const SLOTS: usize = 4096;

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const LIVE: u8 = 2;

/// One registered mapping: only atomics, so that the signal handler may read it.
struct Entry {
    state: AtomicU8,
    start: AtomicUsize,
    len: AtomicUsize,
    /// Distinguishes this registration from earlier ones of the same entry.
    id: AtomicU64,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // the initializer of each table entry
const EMPTY: Entry = Entry {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    id: AtomicU64::new(0),
    faulted: AtomicBool::new(false),
};

static TABLE: [Entry; SLOTS] = [EMPTY; SLOTS];
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
/// The SIGBUS action before ours, for faults that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

thread_local! {
    /// The files mapped on this thread while [`watch`] runs.
    static WATCHING: RefCell<Option<Vec<Watched>>> = const { RefCell::new(None) };
}

/// What a file was when it was mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stat {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stat {
    fn of(m: &std::fs::Metadata) -> Self {
        Stat { dev: m.dev(), ino: m.ino(), len: m.len(), modified: m.modified().ok() }
    }
}

/// A whole file mapped read-only, remembering its path so that tensors viewing it can be
/// streamed from storage instead (see [`HostTensor::origin`](crate::tensor::HostTensor::origin)),
/// and registered with the SIGBUS guard for as long as it is mapped.
pub struct MappedFile {
    map: memmap2::Mmap,
    path: Arc<Path>,
    /// Its entry in the table, and that registration's id (`None`: the table was full,
    /// or the file is empty).
    entry: Option<(usize, u64)>,
}

impl MappedFile {
    /// Maps `file` (opened from `path`) read-only.
    pub fn map(file: &File, path: &Path) -> std::io::Result<Self> {
        install();
        let stat = Stat::of(&file.metadata()?);
        // SAFETY: a read-only shared map of a file we opened. Another process may still
        // change the file underneath it: a page past a new end of file then raises SIGBUS,
        // which `on_sigbus` turns into zeros and a mark on this mapping (see the module
        // docs); bytes changed in place are read as they are now, and `FileSet::changed`
        // reports them before the next request.
        let map = unsafe { memmap2::Mmap::map(file) }?;
        let path: Arc<Path> = Arc::from(path);
        let entry = register(map.as_ptr() as usize, map.len());
        if entry.is_none() && !map.is_empty() {
            tracing::warn!(path = %path.display(), "more than {SLOTS} files mapped: this one is not guarded");
        }
        if let Some((index, id)) = entry {
            WATCHING.with(|w| {
                if let Some(list) = w.borrow_mut().as_mut() {
                    list.push(Watched { index, id, path: path.clone(), stat });
                }
            });
        }
        Ok(MappedFile { map, path, entry })
    }

    pub fn path(&self) -> &Arc<Path> {
        &self.path
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Before the map itself goes (the fields drop after this).
        if let Some((index, _)) = self.entry {
            TABLE[index].state.store(FREE, Ordering::Release);
        }
    }
}

impl ByteSource for MappedFile {
    fn release(&self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        let (start, end) = (range.start.next_multiple_of(PAGE), range.end.min(self.map.len()) / PAGE * PAGE);
        if end > start {
            // SAFETY: the map is read-only, so dropping the pages only makes the next read
            // fault the same bytes back in from the file (or, past a new end of file, the
            // zeros of `on_sigbus`); no borrow sees other contents than a read would.
            // Failure (another page size) leaves them.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.map
    }

    fn file(&self) -> Option<(&Arc<Path>, u64)> {
        Some((&self.path, 0))
    }
}

/// Takes a free entry for `[start, start + len)`.
fn register(start: usize, len: usize) -> Option<(usize, u64)> {
    if len == 0 {
        return None;
    }
    for (index, e) in TABLE.iter().enumerate() {
        if e.state.compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            e.start.store(start, Ordering::Relaxed);
            e.len.store(len, Ordering::Relaxed);
            e.id.store(id, Ordering::Relaxed);
            e.faulted.store(false, Ordering::Relaxed);
            e.state.store(LIVE, Ordering::Release);
            return Some((index, id));
        }
    }
    None
}

/// Installs the SIGBUS handler, once per process.
fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: plain-data structs filled before use; `on_sigbus` has the signature
        // SA_SIGINFO requires and only makes async-signal-safe calls (atomics, mmap,
        // sigaction, raise).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            let _ = PREVIOUS.set(old);
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut());
        }
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler; errno is this
    // thread's, restored before returning to the interrupted code.
    unsafe {
        let errno = *libc::__errno_location();
        let addr = (*info).si_addr() as usize;
        if zero_fill(addr) {
            *libc::__errno_location() = errno;
            return;
        }
        pass_on(sig, info, ctx);
    }
}

/// For a fault at `addr` inside a registered mapping: zero pages over the rest of it, and
/// the mapping marked. Async-signal-safe.
fn zero_fill(addr: usize) -> bool {
    let page = PAGE.load(Ordering::Relaxed);
    for e in &TABLE {
        if e.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let (start, len) = (e.start.load(Ordering::Relaxed), e.len.load(Ordering::Relaxed));
        if addr < start || addr - start >= len {
            continue;
        }
        let from = addr / page * page;
        let end = (start + len).next_multiple_of(page);
        // SAFETY: `[from, end)` lies within a live read-only mapping of ours (the map
        // starts on a page and owns its last partial page); replacing its pages with
        // zero pages keeps every reference into it valid, and the map's own munmap later
        // removes them with it.
        let p = unsafe {
            libc::mmap(
                from as *mut libc::c_void,
                end - from,
                libc::PROT_READ,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        e.faulted.store(true, Ordering::Release);
        return true;
    }
    false
}

/// A SIGBUS that is not ours: the previous handler's, else the default action.
///
/// # Safety
/// Called from the signal handler with its arguments.
unsafe fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY (all below): the previous action was read from the kernel; calling its
    // handler as the kernel would is what it expects, and resetting to the default then
    // raising makes the pending signal kill the process as it would have without us.
    unsafe {
        if let Some(prev) = PREVIOUS.get() {
            let h = prev.sa_sigaction;
            if h != libc::SIG_DFL && h != libc::SIG_IGN {
                if prev.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(h);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                    f(sig);
                }
                return;
            }
        }
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// One mapping a model's load made, as it was then.
#[derive(Clone, Debug)]
struct Watched {
    index: usize,
    id: u64,
    path: Arc<Path>,
    stat: Stat,
}

impl Watched {
    /// Whether this registration is still the entry's (the file still mapped).
    fn live(&self) -> bool {
        let e = &TABLE[self.index];
        e.state.load(Ordering::Acquire) == LIVE && e.id.load(Ordering::Relaxed) == self.id
    }

    fn faulted(&self) -> bool {
        self.live() && TABLE[self.index].faulted.load(Ordering::Acquire)
    }

    fn change(&self) -> FileChange {
        FileChange {
            path: self.path.clone(),
            was: self.stat.len,
            now: std::fs::metadata(&self.path).ok().map(|m| m.len()),
        }
    }
}

/// The files one model's load mapped.
#[derive(Clone, Debug, Default)]
pub struct FileSet {
    files: Vec<Watched>,
}

/// Runs `load` (on this thread) and returns what it returned with the files it mapped.
pub fn watch<T>(load: impl FnOnce() -> T) -> (T, FileSet) {
    let outer = WATCHING.with(|w| w.borrow_mut().replace(Vec::new()));
    let out = load();
    let files = WATCHING.with(|w| std::mem::replace(&mut *w.borrow_mut(), outer)).unwrap_or_default();
    (out, FileSet { files })
}

impl FileSet {
    /// A file whose pages faulted (it shrank while mapped): a few atomic loads per file,
    /// cheap enough for every step.
    pub fn faulted(&self) -> Option<FileChange> {
        self.files.iter().find(|w| w.faulted()).map(Watched::change)
    }

    /// A file that faulted, or that is not what was mapped any more (size, modification
    /// time or inode differ): one `stat` per file. A file removed from its directory is
    /// not a change (the mapping still holds it).
    pub fn changed(&self) -> Option<FileChange> {
        self.faulted().or_else(|| {
            self.files
                .iter()
                .find(|w| w.live() && std::fs::metadata(&w.path).is_ok_and(|m| Stat::of(&m) != w.stat))
                .map(Watched::change)
        })
    }
}

/// A model file that changed on disk while mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileChange {
    pub path: Arc<Path>,
    /// Its size when it was mapped.
    pub was: u64,
    /// Its size now (`None`: it is gone).
    pub now: Option<u64>,
}

impl std::fmt::Display for FileChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let now = self.now.map_or("gone".to_string(), |n| format!("now {n} bytes"));
        write!(f, "the model file {} changed on disk while being served ({now}, was {})", self.path.display(), self.was)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapped file truncated under its map: reading past the new end gives zeros and a
    /// fault on the set that watched the mapping, not a dead process; rewriting it in place
    /// at the same size is a change too.
    #[test]
    fn a_truncated_mapped_file_reads_zeros_and_is_reported() {
        let dir = std::env::temp_dir().join(format!("strata-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.bin");
        std::fs::write(&path, vec![7u8; 5 * 4096]).unwrap();
        let (map, files) = watch(|| MappedFile::map(&File::open(&path).unwrap(), &path).unwrap());
        assert_eq!(files.files.len(), 1);
        assert_eq!(map.bytes()[4 * 4096], 7);
        assert!(files.changed().is_none());
        File::options().write(true).open(&path).unwrap().set_len(4096).unwrap();
        let tail = std::hint::black_box(&map.bytes()[3 * 4096..]);
        assert!(tail.iter().all(|&b| b == 0));
        assert_eq!(map.bytes()[10], 7, "the pages before the fault stay");
        let change = files.faulted().expect("the fault is reported");
        assert_eq!((change.was, change.now), (5 * 4096, Some(4096)));
        assert!(change.to_string().contains("w.bin changed on disk while being served (now 4096 bytes, was 20480)"));
        drop(map);
        assert!(files.faulted().is_none(), "an unmapped file reports nothing");

        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let (map, files) = watch(|| MappedFile::map(&File::open(&path).unwrap(), &path).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, vec![8u8; 4096]).unwrap();
        assert!(files.faulted().is_none());
        assert_eq!(files.changed().map(|c| c.now), Some(Some(4096)));
        drop(map);
        std::fs::remove_dir_all(&dir).ok();
    }
}
