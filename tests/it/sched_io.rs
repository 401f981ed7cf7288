//! The storage reader for layer streaming (`strata::sched::io`) against `std::fs::read`,
//! on a real filesystem (under `target/`) and on the temporary directory (which may be
//! tmpfs, where `O_DIRECT` can be refused), in direct and buffered mode.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata::sched::io::{
    AlignedBuf, StorageFile, measure_sequential_read, measure_sequential_read_into, proc_self_read_bytes, replay_reads,
    start_read_trace, storage_busy_ns, take_read_trace,
};
use strata::tensor::{ByteSource, DType, HostTensor};

/// Directories to test in: one under `target/` (a real filesystem), the system temporary
/// directory, and `/dev/shm` (tmpfs) where it exists.
fn dirs() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR")), std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        out.push(PathBuf::from("/dev/shm"));
    }
    out
}

/// Deterministic pseudo-random bytes (xorshift64).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A file that is removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(dir: &Path, name: &str, data: &[u8]) -> Scratch {
        let path = dir.join(format!("strata-sched-io-{}-{name}", std::process::id()));
        let mut f = std::fs::File::create(&path).expect("create scratch file");
        f.write_all(data).expect("write scratch file");
        f.sync_all().expect("sync scratch file");
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Bytes one `read_range(offset, len)` reads from storage.
fn expected_read(f: &StorageFile, offset: u64, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let a = f.alignment() as u64;
    let start = offset / a * a;
    let end = (offset + len as u64).div_ceil(a) * a;
    end.min(f.size()) - start
}

fn check_ranges(f: &StorageFile, data: &[u8]) {
    let size = data.len() as u64;
    let mut ranges: Vec<(u64, usize)> = vec![
        (0, 0),
        (size, 0),
        (12345, 0),
        (0, data.len()),
        (size - 1, 1),
        (size - 5000, 5000),
        (1, 4095),
        (4095, 2),
        (4096, 4096),
        (0, 1),
        (8191, 8193),
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let offset = x % size;
        let len = ((x >> 32) % (size - offset + 1).min(300_000)) as usize;
        ranges.push((offset, len));
    }
    let mut buf = AlignedBuf::new();
    for (offset, len) in ranges {
        let before = f.bytes_read();
        let r = f.read_range(offset, len, &mut buf).unwrap_or_else(|e| panic!("read {offset}+{len}: {e}"));
        assert_eq!(r.len(), len, "range length for {offset}+{len}");
        assert_eq!(
            &buf.as_slice()[r.clone()],
            &data[offset as usize..offset as usize + len],
            "bytes of {offset}+{len}"
        );
        assert_eq!(f.bytes_read() - before, expected_read(f, offset, len), "bytes counted for {offset}+{len}");
        if len == 0 {
            assert_eq!(r, 0..0);
        } else if f.is_direct() {
            assert_eq!(r.start as u64, offset % f.alignment() as u64);
        } else {
            assert_eq!(r.start, 0);
        }
        assert!((buf.as_slice().as_ptr() as usize).is_multiple_of(4096));
    }
}

#[test]
fn random_ranges_match_std_read() {
    // 1 MiB plus an odd tail, so reads near the end cross an unaligned end of file.
    let data = pattern((1 << 20) + 1234, 7);
    for dir in dirs() {
        let file = Scratch::new(&dir, "ranges", &data);
        assert_eq!(std::fs::read(&file.0).unwrap(), data);
        let auto = StorageFile::open(&file.0).unwrap();
        println!(
            "{}: O_DIRECT {} (alignment {})",
            dir.display(),
            if auto.is_direct() { "used" } else { "refused, buffered fallback" },
            auto.alignment()
        );
        check_ranges(&auto, &data);
        let buffered = StorageFile::open_buffered(&file.0).unwrap();
        assert!(!buffered.is_direct());
        assert_eq!(buffered.alignment(), 1);
        check_ranges(&buffered, &data);
    }
}

#[test]
fn reading_past_the_end_names_the_file() {
    let data = pattern(10_000, 3);
    for dir in dirs() {
        let file = Scratch::new(&dir, "eof", &data);
        let name = file.0.file_name().unwrap().to_str().unwrap().to_string();
        for f in [StorageFile::open(&file.0).unwrap(), StorageFile::open_buffered(&file.0).unwrap()] {
            let mut buf = AlignedBuf::new();
            for (offset, len) in [(9_990, 11), (10_001, 0), (20_000, 5), (u64::MAX, 1)] {
                let err = f.read_range(offset, len, &mut buf).expect_err("read past the end must fail");
                let msg = err.to_string();
                assert!(msg.contains(&name), "{msg}");
                assert!(msg.contains(&offset.to_string()), "{msg}");
            }
        }
    }
}

#[test]
fn missing_file_error_names_it() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("strata-sched-io-does-not-exist");
    let err = StorageFile::open(&path).expect_err("open of a missing file");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains("strata-sched-io-does-not-exist"), "{err}");
}

#[test]
fn shared_counter_adds_up_across_files() {
    let data = pattern(50_000, 11);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let a = Scratch::new(&dir, "counter-a", &data);
    let b = Scratch::new(&dir, "counter-b", &data);
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let fa = StorageFile::open(&a.0).unwrap().with_counter(counter.clone());
    let fb = StorageFile::open_buffered(&b.0).unwrap().with_counter(counter.clone());
    let mut buf = AlignedBuf::new();
    fa.read_range(100, 20_000, &mut buf).unwrap();
    fb.read_range(100, 20_000, &mut buf).unwrap();
    let want = expected_read(&fa, 100, 20_000) + 20_000;
    assert_eq!(counter.load(std::sync::atomic::Ordering::Relaxed), want);
}

#[test]
fn host_tensor_views_the_buffer_without_a_copy() {
    let values: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    for dir in dirs() {
        let file = Scratch::new(&dir, "tensor", &bytes);
        let f = StorageFile::open(&file.0).unwrap();
        let mut buf = AlignedBuf::new();
        // Elements 1001..1301: a 4-byte-aligned offset that is not block-aligned.
        let r = f.read_range(1001 * 4, 300 * 4, &mut buf).unwrap();
        let buf: Arc<AlignedBuf> = Arc::new(buf);
        let want_ptr = buf.as_slice()[r.clone()].as_ptr();
        let src: Arc<dyn ByteSource> = buf;
        let t = HostTensor::new(src, r.start, r.len(), DType::F32, vec![300]);
        assert_eq!(t.bytes().as_ptr(), want_ptr, "the tensor must view the read buffer, not a copy");
        assert_eq!(t.as_f32(), &values[1001..1301]);
    }
}

#[test]
fn sequential_read_numbers_are_plausible() {
    let len = (16 << 20) + 100;
    let file = Scratch::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "seq", &pattern(len, 5));
    let bw = measure_sequential_read(&file.0, u64::MAX).unwrap();
    println!("sequential read of {len} bytes under target/: {bw:?} ({:.0} MB/s)", bw.bytes_per_sec / 1e6);
    assert_eq!(bw.bytes, len as u64);
    assert!(bw.seconds > 0.0);
    assert!((bw.bytes_per_sec - bw.bytes as f64 / bw.seconds).abs() <= 1e-6 * bw.bytes_per_sec);
    // Capped: reads exactly the first 5 MiB (block-aligned).
    let capped = measure_sequential_read(&file.0, 5 << 20).unwrap();
    assert_eq!(capped.bytes, 5 << 20);
    assert_eq!(capped.direct, bw.direct);
    // Several files one after the other, into a destination larger than one read, capped
    // in the second file.
    let second = Scratch::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "seq2", &pattern(len, 6));
    let both = measure_sequential_read_into(&[&file.0, &second.0], u64::MAX, 40 << 20).unwrap();
    assert_eq!(both.bytes, 2 * len as u64);
    let capped = measure_sequential_read_into(&[&file.0, &second.0], len as u64 + (3 << 20), 40 << 20).unwrap();
    assert_eq!(capped.bytes, len as u64 + (3 << 20));
}

#[test]
fn proc_self_io_sees_direct_reads() {
    let Some(_) = proc_self_read_bytes() else {
        println!("skipped: no /proc/self/io");
        return;
    };
    let len = 64 << 20;
    let file = Scratch::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "proc-io", &pattern(len, 9));
    let f = StorageFile::open(&file.0).unwrap();
    if !f.is_direct() {
        println!("skipped: O_DIRECT unavailable under target/, reads may be served from the page cache");
        return;
    }
    let before = proc_self_read_bytes().unwrap();
    let counted = f.bytes_read();
    let mut buf = AlignedBuf::new();
    let mut offset = 0;
    while offset < len {
        f.read_range(offset as u64, 8 << 20, &mut buf).unwrap();
        offset += 8 << 20;
    }
    let moved = proc_self_read_bytes().unwrap() - before;
    println!("read_bytes moved by {moved}, counter by {}", f.bytes_read() - counted);
    assert_eq!(f.bytes_read() - counted, len as u64);
    assert!(moved >= len as u64, "/proc/self/io read_bytes moved by {moved}, expected at least {len}");
}

/// The storage roofline on a large file: `STRATA_IO_BENCH_MIB` (default 1024) MiB under
/// `target/`. Run with `cargo test --release --test it sched_io:: -- --ignored --nocapture`.
#[test]
#[ignore]
fn roofline_large_file() {
    let mib: usize = std::env::var("STRATA_IO_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let chunk = pattern(1 << 20, 1);
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("strata-sched-io-{}-roofline", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    for _ in 0..mib {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let file = Scratch(path);
    for _ in 0..2 {
        let before = proc_self_read_bytes();
        let bw = measure_sequential_read(&file.0, u64::MAX).unwrap();
        let moved = proc_self_read_bytes().zip(before).map(|(a, b)| a - b);
        println!(
            "{mib} MiB: {:.3} s, {:.0} MB/s, direct {}, /proc/self/io read_bytes moved {moved:?}",
            bw.seconds,
            bw.bytes_per_sec / 1e6,
            bw.direct
        );
    }
}

/// A trace records each read (file, offset, length, mode) as made; its replay reads the
/// same bytes; the busy clock runs while reads are in flight and never beyond the time
/// that passed. (Other tests read concurrently, so only this test's files count.)
#[test]
fn reads_are_traced_replayed_and_timed() {
    let len = (20 << 20) + 1000;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (a, b) = (Scratch::new(dir, "trace-a", &pattern(len, 11)), Scratch::new(dir, "trace-b", &pattern(len, 12)));
    let fa = StorageFile::open(&a.0).unwrap();
    let fb = StorageFile::open_buffered(&b.0).unwrap();
    let reads: [(&StorageFile, u64, usize); 4] =
        [(&fa, 0, 10 << 20), (&fb, 4096, 5000), (&fa, 12 << 20, len - (12 << 20)), (&fb, 0, len)];
    let (busy0, t0) = (storage_busy_ns(), std::time::Instant::now());
    start_read_trace();
    let mut buf = AlignedBuf::new();
    let mut want: u64 = 0;
    for (f, offset, n) in reads {
        f.read_range(offset, n, &mut buf).unwrap();
        want += expected_read(f, offset, n);
    }
    let trace: Vec<_> = take_read_trace().into_iter().filter(|r| *r.path == *a.0 || *r.path == *b.0).collect();
    let (busy, elapsed) = (storage_busy_ns() - busy0, t0.elapsed().as_nanos() as u64);
    assert!(busy > 0 && busy <= elapsed, "busy {busy} ns over {elapsed} ns");
    // Reads are split at 8 MiB: 10 MiB is two, the buffered whole file three.
    assert_eq!(trace.iter().map(|r| r.len as u64).sum::<u64>(), want);
    assert_eq!(trace.len(), 2 + 1 + 2 + 3, "{trace:?}");
    assert!(trace.iter().all(|r| r.direct == (*r.path == *a.0 && fa.is_direct())));
    assert_eq!((trace[0].offset, trace[1].offset, trace[2].offset), (0, 8 << 20, 4096));
    for streams in [1, 3] {
        let bw = replay_reads(&trace, streams).unwrap();
        assert_eq!(bw.bytes, want, "{streams} in flight");
        assert!(bw.seconds > 0.0);
    }
    // Tracing stopped: later reads are not recorded.
    fa.read_range(0, 4096, &mut buf).unwrap();
    assert!(take_read_trace().iter().all(|r| *r.path != *a.0));
}
