//! The memory-bandwidth roofline of a CPU decode: how fast `threads` threads can read
//! memory. A roofline is an upper bound or it is nothing, so the probe tries several ways
//! of reading (one task per thread over a contiguous half or many small tasks; one to
//! eight streams per task, as the decode kernels read several weight rows at once; the
//! widest vector loads the CPU has (within `STRATA_CPU_ISA`), with software prefetch
//! ahead of each stream) and keeps the best. It reads a buffer the size of what a decode
//! step reads, over and over as the decode does: a model whose weights fit in the
//! last-level cache is read from that cache, and so is the probe. A decode that still
//! reads faster than this points at the probe, not at the decode (`strata bench` says so).

use std::time::Instant;

use rayon::ThreadPool;

/// The largest buffer the probe reads: far beyond any cache.
const PROBE_BYTES: usize = 1 << 30;
/// Each timed pass reads its buffer as many times as it takes to read at least this much.
const PASS_BYTES: usize = 256 << 20;
/// The buffer is a whole number of these per thread (every pattern then reads all of it).
const GRAIN_BYTES: usize = 1 << 20;
/// Timed passes per pattern; the best counts (on a shared VM single passes vary by half:
/// three gave 42 GB/s where ten gave 63, as much as `sysbench memory` reads).
pub const PASSES: usize = 10;
/// How far ahead of each stream the vector patterns prefetch.
const PREFETCH_BYTES: usize = 1024;

/// What [`measure`] found: the best bandwidth, the pattern that gave it, every pattern's
/// best, and the size of the buffer read.
#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub bytes_per_sec: f64,
    pub pattern: String,
    pub patterns: Vec<(String, f64)>,
    pub buffer_bytes: usize,
}

/// The buffer [`measure`] reads for a decode step that reads `step_bytes`: that size,
/// rounded down to whole grains per thread (a smaller buffer can only read faster), at
/// least one grain per thread and at most [`PROBE_BYTES`].
pub fn buffer_bytes(step_bytes: usize, threads: usize) -> usize {
    let grain = GRAIN_BYTES * threads.max(1);
    (step_bytes.min(PROBE_BYTES) / grain).max(1) * grain
}

impl Bandwidth {
    /// Each pattern's better figure of two probes (taken before and after the runs they
    /// judge, as a shared VM's memory speed drifts), and the best of those.
    pub fn or_better(self, other: Bandwidth) -> Bandwidth {
        let patterns: Vec<(String, f64)> = self
            .patterns
            .into_iter()
            .map(|(name, bw)| {
                let theirs = other.patterns.iter().find(|p| p.0 == name).map_or(0.0, |p| p.1);
                (name, bw.max(theirs))
            })
            .collect();
        let (pattern, bytes_per_sec) =
            patterns.iter().cloned().max_by(|a, b| a.1.total_cmp(&b.1)).expect("at least one pattern");
        Bandwidth { bytes_per_sec, pattern, patterns, buffer_bytes: self.buffer_bytes.min(other.buffer_bytes) }
    }
}

/// Read bandwidth of `threads` threads over a buffer the size of a decode step's reads
/// (`step_bytes`, see [`buffer_bytes`]), read again and again; for every pattern tried,
/// the best of `passes` timed passes, and the best of those.
pub fn measure(threads: usize, step_bytes: usize, passes: usize) -> Bandwidth {
    let threads = threads.max(1);
    let bytes = buffer_bytes(step_bytes, threads);
    let words = huge_page_words(bytes / 8);
    let repeats = PASS_BYTES.div_ceil(bytes);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
    let mut patterns = Vec::new();
    let mut time = |name: String, f: &dyn Fn() -> u64| {
        let mut best = 0.0f64;
        for _ in 0..passes.max(1) {
            let t = Instant::now();
            for _ in 0..repeats {
                std::hint::black_box(f());
            }
            best = best.max((bytes * repeats) as f64 / t.elapsed().as_secs_f64());
        }
        patterns.push((name, best));
    };
    for streams in [1, 4, 8] {
        time(format!("1 MiB tasks, {streams} streams, scalar"), &|| sum_words(&pool, &words, streams));
    }
    let simd = Simd::best();
    let far = |streams, prefetch| Reads { streams, near: None, prefetch };
    // From a cache, the prefetches may only cost issue slots; and the decode kernels'
    // streams are neighbouring weight rows or panels, tens of KiB apart, not far apart.
    let reads = [1, 2, 4, 8]
        .map(|n| far(n, true))
        .into_iter()
        .chain([far(1, false), far(8, false)])
        .chain([4, 8].map(|streams| Reads { streams, near: Some(NEAR_WORDS), prefetch: true }));
    for r in reads {
        time(format!("a contiguous part per thread, {simd:?}, {r}"), &|| per_thread(&words, threads, r, simd));
    }
    let (pattern, bytes_per_sec) =
        patterns.iter().cloned().max_by(|a, b| a.1.total_cmp(&b.1)).expect("at least one pattern");
    Bandwidth { bytes_per_sec, pattern, patterns, buffer_bytes: bytes }
}

/// `0..len` as words, backed by transparent huge pages where the kernel gives them on
/// request: 2 MiB pages spare the reads their page walks, and read about a tenth faster
/// than 4 KiB pages on the Intel Xeon VM (24.9 → 27.7 GB/s, medians of 3). The probe is an
/// upper bound on what the machine can read, whatever pages a decode happens to get.
fn huge_page_words(len: usize) -> Vec<u64> {
    let mut words: Vec<u64> = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = (words.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (words.as_ptr() as usize + len * 8) / PAGE * PAGE;
        if end > start {
            // SAFETY: the range lies inside the allocation, page aligned; the advice
            // changes how its pages are backed, never their contents.
            let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    words.extend(0..len as u64);
    words
}

/// Sums `words` on `pool` in 1 MiB-word tasks (a probe pattern): each task sums `streams`
/// far-apart pieces of its chunk at once, as the decode kernel reads several weight rows
/// at once, with eight independent sums so the adds keep up with memory.
pub fn sum_words(pool: &ThreadPool, words: &[u64], streams: usize) -> u64 {
    use rayon::prelude::*;
    let streams = streams.max(1);
    pool.install(|| {
        words
            .par_chunks(1 << 20)
            .map(|chunk| {
                let mut acc = [0u64; 8];
                let len = chunk.len() / streams / 8 * 8;
                for i in (0..len).step_by(8) {
                    for s in 0..streams {
                        for (a, &b) in acc.iter_mut().zip(&chunk[s * len + i..][..8]) {
                            *a = a.wrapping_add(b);
                        }
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
            .reduce(|| 0, u64::wrapping_add)
    })
}

/// The vector width the probe reads with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    Scalar,
    Avx2,
    Avx512,
}

impl Simd {
    /// The widest loads the CPU has, within `STRATA_CPU_ISA`'s cap (a capped run measures
    /// what the machine it stands for could read).
    fn best() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            if strata_quant::isa::avx512() && std::arch::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if strata_quant::isa::avx2() && std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Scalar
    }
}

/// How a probe thread reads its part of the buffer.
#[derive(Clone, Copy, Debug)]
struct Reads {
    /// Pieces read side by side.
    streams: usize,
    /// `None`: the part is cut into `streams` pieces. `Some(w)`: into groups of `streams`
    /// pieces of `w` words, read group after group.
    near: Option<usize>,
    /// Software prefetch ahead of each stream.
    prefetch: bool,
}

/// The pieces of a near pattern: 32 KiB, about a 2048-wide Q8_0 panel or 16 weight rows.
const NEAR_WORDS: usize = 4096;

impl std::fmt::Display for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} streams", self.streams)?;
        if let Some(w) = self.near {
            write!(f, " {} KiB apart", w * 8 / 1024)?;
        }
        f.write_str(if self.prefetch { " with prefetch" } else { "" })
    }
}

/// Every thread sums its own contiguous part of `words` as `reads` says; the threads
/// start together.
fn per_thread(words: &[u64], threads: usize, reads: Reads, simd: Simd) -> u64 {
    let part = words.len() / threads;
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        let sums: Vec<_> = (0..threads)
            .map(|t| {
                let (mine, barrier) = (&words[t * part..(t + 1) * part], &barrier);
                s.spawn(move || {
                    barrier.wait();
                    sum_part(mine, reads, simd)
                })
            })
            .collect();
        sums.into_iter().map(|h| h.join().expect("a probe thread panicked")).fold(0, u64::wrapping_add)
    })
}

/// The wrapping sum of one thread's part, read as `reads` says (a tail that does not
/// divide evenly is left out).
fn sum_part(words: &[u64], reads: Reads, simd: Simd) -> u64 {
    let Reads { streams, near, prefetch } = reads;
    match near {
        None => sum_streams(words, streams, simd, prefetch),
        Some(w) => words
            .chunks_exact(w * streams)
            .fold(0, |a, group| a.wrapping_add(sum_streams(group, streams, simd, prefetch))),
    }
}

/// The wrapping sum of `words`, read as `streams` equal pieces side by side (a tail that
/// does not divide evenly is left out).
fn sum_streams(words: &[u64], streams: usize, simd: Simd, prefetch: bool) -> u64 {
    let len = words.len() / streams / 64 * 64;
    let pieces: Vec<&[u64]> = (0..streams).map(|s| &words[s * len..(s + 1) * len]).collect();
    match (simd, prefetch) {
        // SAFETY: `Simd::best` chose these only where the CPU has the features.
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx512, true) => unsafe { x86::sum_avx512::<true>(&pieces) },
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx512, false) => unsafe { x86::sum_avx512::<false>(&pieces) },
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx2, true) => unsafe { x86::sum_avx2::<true>(&pieces) },
        #[cfg(target_arch = "x86_64")]
        (Simd::Avx2, false) => unsafe { x86::sum_avx2::<false>(&pieces) },
        _ => pieces.iter().flat_map(|p| p.iter()).fold(0u64, |a, &b| a.wrapping_add(b)),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::PREFETCH_BYTES;

    /// # Safety
    /// Needs AVX-512F. Every piece has the same length, a multiple of 64 words.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn sum_avx512<const PREFETCH: bool>(pieces: &[&[u64]]) -> u64 {
        let len = pieces.first().map_or(0, |p| p.len());
        let mut acc = [_mm512_setzero_si512(); 8];
        for i in (0..len).step_by(32) {
            for (s, p) in pieces.iter().enumerate() {
                let at = p[i..i + 32].as_ptr();
                // Prefetches never fault, so the addresses may run past the piece.
                if PREFETCH {
                    _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES));
                    _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES + 128));
                }
                for (k, slot) in acc[(s * 4) % 8..].iter_mut().take(4).enumerate() {
                    // SAFETY: words `i + 8k .. i + 8k + 8` lie within `p[i..i + 32]`, and
                    // the caller checked AVX-512F.
                    let v = unsafe { _mm512_loadu_si512(at.wrapping_add(8 * k).cast()) };
                    *slot = _mm512_add_epi64(*slot, v);
                }
            }
        }
        let mut total = 0u64;
        for a in acc {
            let mut lanes = [0u64; 8];
            // SAFETY: `lanes` holds 64 bytes.
            unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), a) };
            total = lanes.iter().fold(total, |t, &l| t.wrapping_add(l));
        }
        total
    }

    /// # Safety
    /// Needs AVX2. Every piece has the same length, a multiple of 64 words.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sum_avx2<const PREFETCH: bool>(pieces: &[&[u64]]) -> u64 {
        let len = pieces.first().map_or(0, |p| p.len());
        let mut acc = [_mm256_setzero_si256(); 8];
        for i in (0..len).step_by(16) {
            for (s, p) in pieces.iter().enumerate() {
                let at = p[i..i + 16].as_ptr();
                // Prefetches never fault, so the addresses may run past the piece.
                if PREFETCH {
                    _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES));
                    _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES + 64));
                }
                for (k, slot) in acc[(s * 4) % 8..].iter_mut().take(4).enumerate() {
                    // SAFETY: words `i + 4k .. i + 4k + 4` lie within `p[i..i + 16]`, and
                    // the caller checked AVX2.
                    let v = unsafe { _mm256_loadu_si256(at.wrapping_add(4 * k).cast()) };
                    *slot = _mm256_add_epi64(*slot, v);
                }
            }
        }
        let mut total = 0u64;
        for a in acc {
            let mut lanes = [0u64; 4];
            // SAFETY: `lanes` holds 32 bytes.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), a) };
            total = lanes.iter().fold(total, |t, &l| t.wrapping_add(l));
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe reads with no wider loads than `STRATA_CPU_ISA` allows (`tests/run.sh`
    /// runs this under `avx2` too).
    #[test]
    fn the_probe_reads_within_the_isa_cap() {
        use strata_quant::isa::{Isa, cap};
        match (cap(), Simd::best()) {
            (Isa::Scalar, Simd::Avx2 | Simd::Avx512) | (Isa::Avx2, Simd::Avx512) => {
                panic!("STRATA_CPU_ISA caps at {:?}, the probe reads with {:?}", cap(), Simd::best())
            }
            _ => {}
        }
    }

    #[test]
    fn every_pattern_sums_what_it_reads() {
        // 64 words per stream and piece boundary: the sums are exact, whichever width.
        let words: Vec<u64> = (0..4096u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        let want = words.iter().fold(0u64, |a, &b| a.wrapping_add(b));
        for simd in [Simd::Scalar, Simd::best()] {
            for (streams, prefetch) in [1, 2, 4, 8].into_iter().flat_map(|s| [(s, true), (s, false)]) {
                assert_eq!(sum_streams(&words, streams, simd, prefetch), want, "{simd:?}, {streams} streams");
            }
            for near in [None, Some(128)] {
                let r = Reads { streams: 4, near, prefetch: true };
                assert_eq!(per_thread(&words, 2, r, simd), want, "{simd:?}, two threads, {r}");
            }
        }
    }

    #[test]
    fn the_buffer_is_a_decode_steps_reads_in_whole_grains() {
        let grain = GRAIN_BYTES * 2;
        // SmolLM2's 96.6 MB per token: 92 MiB, rounded down (never larger than the step).
        assert_eq!(buffer_bytes(96_574_464, 2), 92 << 20);
        assert!(buffer_bytes(96_574_464, 2) <= 96_574_464);
        assert_eq!(buffer_bytes(1, 2), grain);
        assert_eq!(buffer_bytes(usize::MAX, 2), PROBE_BYTES);
        assert_eq!(buffer_bytes(640 << 20, 3) % (GRAIN_BYTES * 3), 0);
    }

    /// Prints what each pattern reads on this machine (docs/benchmarks.md):
    /// `cargo test --release -p strata-backend --lib bandwidth::tests::patterns -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn patterns() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        // STRATA_PROBE_MIB sets the buffer (a decode step's reads); 1 GiB otherwise.
        let mib = std::env::var("STRATA_PROBE_MIB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(1024);
        let m = measure(threads, mib << 20, PASSES);
        for (name, bw) in &m.patterns {
            println!("{:6.2} GB/s  {name}", bw / 1e9);
        }
        println!(
            "best: {:.2} GB/s ({}), {threads} threads, a {} MiB buffer",
            m.bytes_per_sec / 1e9,
            m.pattern,
            m.buffer_bytes >> 20
        );
    }
}
