//! Reading weights from storage for layer streaming: page-aligned buffers, a file handle
//! that reads with `O_DIRECT` where the filesystem allows it (otherwise buffered reads
//! followed by `posix_fadvise(DONTNEED)`, so the page cache does not keep a second copy),
//! a count of every byte read, and the sequential-read roofline a benchmark divides by.
//!
//! Linux first; elsewhere [`StorageFile`] reads through plain buffered descriptors.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub use strata_tensor::aligned::{AlignedBuf, BUF_ALIGN, HostPin};

/// The alignment of file offsets and lengths assumed for `O_DIRECT` when the kernel
/// does not report it (`statx(STATX_DIOALIGN)` needs Linux 6.1).
pub const DEFAULT_DIRECT_ALIGN: usize = 4096;

/// The most one `pread` asks for. Larger requests were slower on the virtio disk this
/// was measured on (O_DIRECT, sequential: 4–8 MiB reads 3.8 GB/s, 24 MiB 3.2, 64 MiB
/// 2.9), and 8 MiB is long enough that the per-call cost vanishes.
const MAX_READ: usize = 8 << 20;

/// Time, process-wide, during which at least one [`StorageFile`] read was in flight,
/// whichever thread issued it (the layer streamer's, the expert readers', a probe's):
/// the share of a decode that kept storage busy, which no per-thread clock shows when
/// reads overlap.
pub fn storage_busy_ns() -> u64 {
    let busy = lock_busy();
    busy.total_ns + busy.since.map_or(0, |t| t.elapsed().as_nanos() as u64)
}

struct Busy {
    in_flight: usize,
    since: Option<Instant>,
    total_ns: u64,
}

static BUSY: std::sync::Mutex<Busy> = std::sync::Mutex::new(Busy { in_flight: 0, since: None, total_ns: 0 });

fn lock_busy() -> std::sync::MutexGuard<'static, Busy> {
    BUSY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts a read in flight from its creation to its drop.
struct InFlight;

impl InFlight {
    fn start() -> InFlight {
        let mut busy = lock_busy();
        if busy.in_flight == 0 {
            busy.since = Some(Instant::now());
        }
        busy.in_flight += 1;
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut busy = lock_busy();
        busy.in_flight -= 1;
        if busy.in_flight == 0
            && let Some(t) = busy.since.take()
        {
            busy.total_ns += t.elapsed().as_nanos() as u64;
        }
    }
}

/// Chunk size of [`measure_sequential_read`].
const MEASURE_CHUNK: usize = 8 << 20;

/// A model file opened for streaming reads.
#[derive(Debug)]
pub struct StorageFile {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
    /// Offset and length alignment of reads (a power of two; 1 when buffered).
    align: usize,
    bytes_read: Arc<AtomicU64>,
}

impl StorageFile {
    /// Opens `path` with `O_DIRECT` if its filesystem accepts it (checked by opening and by
    /// one aligned probe read of the first block, which counts as bytes read), otherwise
    /// with a buffered descriptor.
    pub fn open(path: impl AsRef<Path>) -> io::Result<StorageFile> {
        Self::open_mode(path.as_ref(), true)
    }

    /// Opens `path` buffered even where `O_DIRECT` would work.
    pub fn open_buffered(path: impl AsRef<Path>) -> io::Result<StorageFile> {
        Self::open_mode(path.as_ref(), false)
    }

    /// Counts bytes read into `counter` (shared with other files or the scheduler's
    /// stats) instead of this file's own counter. Bytes already counted stay where they were.
    pub fn with_counter(mut self, counter: Arc<AtomicU64>) -> Self {
        self.bytes_read = counter;
        self
    }

    fn open_mode(path: &Path, try_direct: bool) -> io::Result<StorageFile> {
        let bytes_read = Arc::new(AtomicU64::new(0));
        if try_direct && let Some(f) = sys::open_direct(path, &bytes_read)? {
            return Ok(f);
        }
        let file = File::open(path).map_err(|e| context(path, "open", e))?;
        let size = file.metadata().map_err(|e| context(path, "stat", e))?.len();
        Ok(StorageFile { file, path: path.to_path_buf(), size, direct: false, align: 1, bytes_read })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether reads bypass the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Offsets and lengths of reads are widened to multiples of this (1 when buffered).
    pub fn alignment(&self) -> usize {
        self.align
    }

    /// Bytes read so far into this file's counter, as returned by `pread` (including the
    /// widening to the alignment in direct mode, and the open-time probe).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    pub fn counter(&self) -> &Arc<AtomicU64> {
        &self.bytes_read
    }

    /// Reads `[offset, offset + len)` of the file into `buf` (grown if needed) and returns
    /// where those bytes are inside `buf`. In direct mode the read is widened to the
    /// alignment and the aligned start sits at `buf[0]`; in buffered mode the range is
    /// `0..len` and the pages read are dropped from the page cache afterwards.
    /// A range that ends past the end of the file is an error naming the file.
    pub fn read_range(&self, offset: u64, len: usize, buf: &mut AlignedBuf) -> io::Result<Range<usize>> {
        let end = offset.checked_add(len as u64).ok_or_else(|| self.eof_error(offset, len))?;
        if end > self.size {
            return Err(self.eof_error(offset, len));
        }
        buf.reserve_discarding(0);
        if len == 0 {
            return Ok(0..0);
        }
        let align = self.align as u64;
        let start = offset / align * align;
        let wide_end = end.div_ceil(align) * align;
        let want = usize::try_from(wide_end - start).map_err(|_| self.eof_error(offset, len))?;
        buf.reserve_discarding(want);
        let got = self.read_into(start, &mut buf.spare_mut()[..want])?;
        let lead = (offset - start) as usize;
        if got < lead + len {
            return Err(self.eof_error(offset, len));
        }
        buf.set_len(got);
        if !self.direct {
            sys::drop_cache(&self.file, offset, len as u64);
        }
        Ok(lead..lead + len)
    }

    /// Fills `dst` from `offset` (both multiples of [`alignment`](Self::alignment), as is
    /// `dst`'s address when it is larger than 1) until it is full or the file ends, and
    /// fails naming the file unless at least `min` bytes were read.
    pub fn read_at_least(&self, offset: u64, dst: &mut [u8], min: usize) -> io::Result<()> {
        let got = self.read_into(offset, dst)?;
        if got < min {
            return Err(self.eof_error(offset, min));
        }
        Ok(())
    }

    /// Fills `dst` from `offset` with large reads until it is full or the file ends;
    /// returns the bytes read.
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> io::Result<usize> {
        let _busy = InFlight::start();
        let mut pos = 0;
        while pos < dst.len() {
            let n = (dst.len() - pos).min(MAX_READ);
            let at = offset + pos as u64;
            match sys::read_at(&self.file, &mut dst[pos..pos + n], at) {
                Ok(0) => break,
                Ok(r) => {
                    pos += r;
                    self.bytes_read.fetch_add(r as u64, Ordering::Relaxed);
                    if TRACING.load(Ordering::Relaxed) {
                        let path: Arc<Path> = Arc::from(self.path.as_path());
                        lock_trace().push(TracedRead { path, direct: self.direct, offset: at, len: r });
                    }
                    // A short direct read leaves `pos` unaligned only at the end of the
                    // file; the next (unaligned) read would fail rather than return 0.
                    if self.direct && !pos.is_multiple_of(self.align) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(context(&self.path, &format!("read of {n} bytes at offset {at}"), e)),
            }
        }
        Ok(pos)
    }

    /// Names the file and its size now: a file truncated since it was opened says so.
    fn eof_error(&self, offset: u64, len: usize) -> io::Error {
        let size = match self.file.metadata().map(|m| m.len()) {
            Ok(now) if now != self.size => {
                format!("now {now} bytes; it was {} when opened, so it changed on disk", self.size)
            }
            _ => format!("{} bytes", self.size),
        };
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{}: range at offset {offset} of {len} bytes ends past the end of the file ({size})",
                self.path.display()
            ),
        )
    }
}

/// Prefixes an I/O error with the file and what was being done.
fn context(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
}

/// The `read_bytes` field of `/proc/self/io`: bytes this process caused to be fetched
/// from storage (page-cache hits do not count). `None` where the file does not exist.
pub fn proc_self_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines().find_map(|line| line.strip_prefix("read_bytes:")).and_then(|v| v.trim().parse().ok())
}

/// One sequential read of a file: the storage roofline a streaming benchmark divides by.
#[derive(Clone, Copy, Debug)]
pub struct ReadBandwidth {
    /// Bytes read from the file (including the widening of the last read to the alignment).
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_sec: f64,
    /// Whether the reads bypassed the page cache. When false the number may be the page
    /// cache's bandwidth, not the disk's.
    pub direct: bool,
}

/// Reads `path` from the start, up to `max_bytes`, in 8 MiB chunks with `O_DIRECT` where
/// the filesystem allows it (otherwise buffered, after asking the kernel to drop the
/// file's cached pages), into one 8 MiB buffer, and reports the bandwidth.
pub fn measure_sequential_read(path: impl AsRef<Path>, max_bytes: u64) -> io::Result<ReadBandwidth> {
    measure_sequential_read_into(&[path], max_bytes, MEASURE_CHUNK)
}

/// As [`measure_sequential_read`], over `paths` one after the other until `max_bytes`
/// are read, with the chunks landing in turn across a destination of `dest_len` bytes.
///
/// The destination matters where the kernel copies what the device wrote (software
/// bounce buffers, SWIOTLB, as in many VMs): copying into a small buffer that stays in
/// cache is faster than into a layer-sized one, which is what a layer streamer must fill.
pub fn measure_sequential_read_into(
    paths: &[impl AsRef<Path>],
    max_bytes: u64,
    dest_len: usize,
) -> io::Result<ReadBandwidth> {
    measure_parallel_read_into(paths, 0, max_bytes, dest_len, 1)
}

/// As [`measure_sequential_read_into`], starting `skip` bytes into the files (taken one
/// after the other; rounded down to 8 MiB, and wrapping round to the start), with
/// `streams` reads in flight: each of `streams` threads takes the next 8 MiB chunk in
/// file order into its own destination of `dest_len` bytes. Devices that serve several
/// requests at once (NVMe, virtio) read faster so, and a streamer that keeps several
/// reads in flight must be judged by it. Passes that start at different places read
/// different bytes, so that a cache below the machine (a VM host's) serves none of them.
pub fn measure_parallel_read_into(
    paths: &[impl AsRef<Path>],
    skip: u64,
    max_bytes: u64,
    dest_len: usize,
    streams: usize,
) -> io::Result<ReadBandwidth> {
    let mut files = Vec::new();
    let mut all: Vec<(usize, u64, usize)> = Vec::new();
    for path in paths {
        let file = StorageFile::open(path)?;
        if !file.is_direct() {
            sys::drop_cache(&file.file, 0, 0);
        }
        let mut offset = 0u64;
        while offset < file.size() {
            let n = (file.size() - offset).min(MEASURE_CHUNK as u64) as usize;
            all.push((files.len(), offset, n));
            offset += n as u64;
        }
        files.push(file);
    }
    // Chunks from `skip` on, wrapping, until `max_bytes`.
    let first = if all.is_empty() { 0 } else { (skip / MEASURE_CHUNK as u64) as usize % all.len() };
    let mut chunks: Vec<(usize, u64, usize)> = Vec::new();
    let mut planned = 0u64;
    for &(f, offset, n) in all.iter().cycle().skip(first).take(all.len()) {
        if planned >= max_bytes {
            break;
        }
        let n = n.min((max_bytes - planned) as usize);
        chunks.push((f, offset, n));
        planned += n as u64;
    }
    time_reads(&files, &chunks, dest_len, streams)
}

/// Reads `chunks` (`(index into files, offset, length)`, each at most 8 MiB and aligned
/// as its file needs) in order, `streams` at a time, each thread's reads landing in turn
/// across its own destination of `dest_len` bytes, and times them.
fn time_reads(
    files: &[StorageFile],
    chunks: &[(usize, u64, usize)],
    dest_len: usize,
    streams: usize,
) -> io::Result<ReadBandwidth> {
    let dest_len = dest_len.max(MEASURE_CHUNK).next_multiple_of(MEASURE_CHUNK);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = |dest: &mut AlignedBuf| -> io::Result<()> {
        let mut pos = 0usize;
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&(f, offset, n)) = chunks.get(i) else { return Ok(()) };
            let file = &files[f];
            // Aligned for O_DIRECT: the last read may run past the end of the file.
            let want = n.next_multiple_of(file.alignment());
            file.read_at_least(offset, &mut dest.as_mut_slice()[pos..pos + want], n)?;
            pos = (pos + MEASURE_CHUNK) % dest_len;
        }
    };
    let mut dests: Vec<AlignedBuf> = (0..streams.max(1))
        .map(|_| {
            let mut d = AlignedBuf::with_capacity(dest_len);
            d.resize_discarding(dest_len);
            d
        })
        .collect();
    let before: u64 = files.iter().map(StorageFile::bytes_read).sum();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = dests.iter_mut().map(|d| s.spawn(|| work(d))).collect();
        handles.into_iter().map(|h| h.join().expect("a read worker panicked")).collect::<io::Result<Vec<()>>>()
    })?;
    let seconds = t0.elapsed().as_secs_f64();
    let bytes = files.iter().map(StorageFile::bytes_read).sum::<u64>() - before;
    let direct = files.iter().all(StorageFile::is_direct);
    let bytes_per_sec = if seconds > 0.0 { bytes as f64 / seconds } else { 0.0 };
    Ok(ReadBandwidth { bytes, seconds, bytes_per_sec, direct })
}

/// One `pread` a [`StorageFile`] made while reads were traced ([`start_read_trace`]).
#[derive(Clone, Debug)]
pub struct TracedRead {
    pub path: Arc<Path>,
    pub direct: bool,
    pub offset: u64,
    pub len: usize,
}

static TRACING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static TRACE: std::sync::Mutex<Vec<TracedRead>> = std::sync::Mutex::new(Vec::new());

fn lock_trace() -> std::sync::MutexGuard<'static, Vec<TracedRead>> {
    TRACE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts recording every storage read of this process (any thread), forgetting what
/// an earlier trace left.
pub fn start_read_trace() {
    lock_trace().clear();
    TRACING.store(true, Ordering::SeqCst);
}

/// Stops recording and returns the reads since [`start_read_trace`], in the order they
/// completed.
pub fn take_read_trace() -> Vec<TracedRead> {
    TRACING.store(false, Ordering::SeqCst);
    std::mem::take(&mut *lock_trace())
}

/// Reads exactly what `trace` read (the same files, offsets and lengths, in that order
/// and opened the same way), `streams` at a time and with nothing else to do, and times
/// it: what storage delivers for one workload's reads, the bound that workload's
/// reading could reach. (Right after the workload, a cache below this machine may still
/// hold some of those bytes, which only raises the bound.)
pub fn replay_reads(trace: &[TracedRead], streams: usize) -> io::Result<ReadBandwidth> {
    let mut files: Vec<StorageFile> = Vec::new();
    let mut index: std::collections::HashMap<(Arc<Path>, bool), usize> = std::collections::HashMap::new();
    let mut chunks = Vec::with_capacity(trace.len());
    for r in trace {
        let f = match index.get(&(r.path.clone(), r.direct)) {
            Some(&f) => f,
            None => {
                let file = match r.direct {
                    true => StorageFile::open(&r.path)?,
                    false => StorageFile::open_buffered(&r.path)?,
                };
                files.push(file);
                index.insert((r.path.clone(), r.direct), files.len() - 1);
                files.len() - 1
            }
        };
        chunks.push((f, r.offset, r.len));
    }
    // Buffered files are read from storage, not from pages the workload (or this replay)
    // left cached, which would flatter the next run as much as this bound.
    let drop_cached = || files.iter().filter(|f| !f.is_direct()).for_each(|f| sys::drop_cache(&f.file, 0, 0));
    drop_cached();
    let timed = time_reads(&files, &chunks, MEASURE_CHUNK, streams);
    drop_cached();
    timed
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::CString;
    use std::fs::File;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::{AlignedBuf, BUF_ALIGN, DEFAULT_DIRECT_ALIGN, StorageFile, context};

    /// Opens `path` with `O_DIRECT` and probes one aligned read; `None` when the
    /// filesystem refuses direct I/O (EINVAL at open or at the probe).
    pub fn open_direct(path: &Path, counter: &Arc<AtomicU64>) -> io::Result<Option<StorageFile>> {
        let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(context(path, "open", e)),
        };
        let size = file.metadata().map_err(|e| context(path, "stat", e))?.len();
        let Some(align) = direct_alignment(path) else { return Ok(None) };
        let mut probe = AlignedBuf::with_capacity(align);
        loop {
            match file.read_at(&mut probe.spare_mut()[..align], 0) {
                Ok(n) => {
                    counter.fetch_add(n as u64, Ordering::Relaxed);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
                Err(e) => return Err(context(path, "probe read at offset 0", e)),
            }
        }
        let bytes_read = counter.clone();
        Ok(Some(StorageFile { file, path: path.to_path_buf(), size, direct: true, align, bytes_read }))
    }

    /// The offset/length alignment direct reads of `path` need: what
    /// `statx(STATX_DIOALIGN)` reports, else [`DEFAULT_DIRECT_ALIGN`]. `None` when the
    /// kernel says direct I/O is unsupported, or needs more memory alignment than
    /// [`BUF_ALIGN`].
    fn direct_alignment(path: &Path) -> Option<usize> {
        let Ok(cpath) = CString::new(path.as_os_str().as_bytes()) else { return Some(DEFAULT_DIRECT_ALIGN) };
        // SAFETY: `statx` is plain old data; zero is a valid value.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: `cpath` is NUL-terminated and `stx` is a valid out-pointer.
        let rc = unsafe { libc::statx(libc::AT_FDCWD, cpath.as_ptr(), 0, libc::STATX_DIOALIGN, &mut stx) };
        if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
            return Some(DEFAULT_DIRECT_ALIGN);
        }
        let (mem, off) = (stx.stx_dio_mem_align as usize, stx.stx_dio_offset_align as usize);
        if !mem.is_power_of_two() || !off.is_power_of_two() || mem > BUF_ALIGN {
            return None;
        }
        Some(off.max(mem))
    }

    pub fn read_at(file: &File, dst: &mut [u8], offset: u64) -> io::Result<usize> {
        file.read_at(dst, offset)
    }

    /// Asks the kernel to drop `[offset, offset + len)` (0 = to the end) from the page
    /// cache. Advisory: failure changes nothing we rely on.
    pub fn drop_cache(file: &File, offset: u64, len: u64) {
        // SAFETY: plain syscall on a descriptor we own.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED);
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;
    use std::io;
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    use super::StorageFile;

    pub fn open_direct(_path: &Path, _counter: &Arc<AtomicU64>) -> io::Result<Option<StorageFile>> {
        Ok(None)
    }

    #[cfg(unix)]
    pub fn read_at(file: &File, dst: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(file, dst, offset)
    }

    #[cfg(windows)]
    pub fn read_at(file: &File, dst: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(file, dst, offset)
    }

    pub fn drop_cache(_file: &File, _offset: u64, _len: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read past the end of a file truncated since it was opened gives its size now.
    #[test]
    fn a_short_read_names_the_size_now() {
        let dir = std::env::temp_dir().join(format!("strata-io-short-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.bin");
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let f = StorageFile::open_buffered(&path).unwrap();
        File::options().write(true).open(&path).unwrap().set_len(100).unwrap();
        let e = f.read_range(4096, 4096, &mut AlignedBuf::new()).unwrap_err().to_string();
        assert!(e.contains("w.bin") && e.contains("(now 100 bytes; it was 8192 when opened"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
