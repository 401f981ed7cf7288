//! The memory-bandwidth roofline of a CPU decode: how fast `threads` threads can read
//! memory. A roofline is an upper bound or it is nothing, so the probe tries several ways
//! of reading (one task per thread over a contiguous half or many small tasks; one to
//! eight streams per task, as the decode kernels read several weight rows at once; the
//! widest vector loads the CPU has, with software prefetch ahead of each stream) and keeps
//! the best. A decode that still reads faster than this points at the probe, not at the
//! decode (`strata bench` says so).

use std::time::Instant;

use rayon::ThreadPool;

/// Bytes the probe reads per pass: far beyond any cache.
const PROBE_BYTES: usize = 1 << 30;
/// Timed passes per pattern; the best counts (on a shared VM single passes vary by half:
/// three gave 42 GB/s where ten gave 63, as much as `sysbench memory` reads).
const PASSES: usize = 10;
/// How far ahead of each stream the vector patterns prefetch.
const PREFETCH_BYTES: usize = 1024;

/// What [`measure`] found: the best bandwidth, the pattern that gave it, and every
/// pattern's best.
#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub bytes_per_sec: f64,
    pub pattern: String,
    pub patterns: Vec<(String, f64)>,
}

/// Read bandwidth of `threads` threads over 1 GiB; the best of every pattern tried.
pub fn measure(threads: usize) -> Bandwidth {
    let threads = threads.max(1);
    let words: Vec<u64> = (0..(PROBE_BYTES / 8) as u64).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
    let mut patterns = Vec::new();
    let mut time = |name: String, f: &dyn Fn() -> u64| {
        let mut best = 0.0f64;
        for _ in 0..PASSES {
            let t = Instant::now();
            std::hint::black_box(f());
            best = best.max(PROBE_BYTES as f64 / t.elapsed().as_secs_f64());
        }
        patterns.push((name, best));
    };
    for streams in [1, 4, 8] {
        time(format!("1 MiB tasks, {streams} streams, scalar"), &|| sum_words(&pool, &words, streams));
    }
    let simd = Simd::best();
    for streams in [1, 2, 4, 8] {
        time(format!("a contiguous part per thread, {streams} streams, {simd:?} with prefetch"), &|| {
            per_thread(&words, threads, streams, simd)
        });
    }
    let (pattern, bytes_per_sec) =
        patterns.iter().cloned().max_by(|a, b| a.1.total_cmp(&b.1)).expect("at least one pattern");
    Bandwidth { bytes_per_sec, pattern, patterns }
}

/// How a one-row (decode) quantized matmul reads its weight rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeReads {
    /// One row at a time, a task's four parts in turn (one memory stream at a time).
    InTurn,
    /// Four rows from four parts of a task side by side, block by block (four streams).
    SideBySide,
}

/// Bytes each way of the [`decode_reads`] comparison reads per pass: far beyond the
/// caches, and one allocation well under the 64 MiB that tests/cawsf_format.rs allows
/// any allocation in a process that opens damaged files.
const CHOICE_BYTES: usize = 48 << 20;
/// Passes of each way, alternated; the best of each counts.
const CHOICE_PASSES: usize = 6;

/// Which [`DecodeReads`] reads memory faster here, decided once per process: the kernels
/// give the same bits either way, but CPUs differ in what their prefetchers keep up with
/// (an Intel Xeon VM read 27 GB/s with four streams per thread and 19 with one; an AMD
/// EPYC VM 38 and 54). `STRATA_DECODE_READS=in-turn|side-by-side` fixes it; otherwise
/// `threads` threads each read a contiguous part of 48 MiB as one stream and as four,
/// alternated, the best of six passes each (about 0.1 s), and four streams win only by
/// at least 5%.
pub fn decode_reads(threads: usize) -> DecodeReads {
    static CHOICE: std::sync::OnceLock<DecodeReads> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| match std::env::var("STRATA_DECODE_READS").as_deref() {
        Ok("in-turn") => DecodeReads::InTurn,
        Ok("side-by-side") => DecodeReads::SideBySide,
        _ => {
            let (one, four) = compare_streams(threads.max(1));
            if four >= one * 1.05 { DecodeReads::SideBySide } else { DecodeReads::InTurn }
        }
    })
}

/// The best read rate (bytes/s) of one and of four streams per thread, alternated.
fn compare_streams(threads: usize) -> (f64, f64) {
    let words: Vec<u64> = (0..(CHOICE_BYTES / 8) as u64).collect();
    let simd = Simd::best();
    let mut best = [0.0f64; 2];
    for _ in 0..CHOICE_PASSES {
        for (b, streams) in best.iter_mut().zip([1, 4]) {
            let t = Instant::now();
            std::hint::black_box(per_thread(&words, threads, streams, simd));
            *b = b.max(CHOICE_BYTES as f64 / t.elapsed().as_secs_f64());
        }
    }
    (best[0], best[1])
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
    fn best() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Scalar
    }
}

/// Every thread sums its own contiguous part of `words`, split into `streams` pieces read
/// side by side; the threads start together.
fn per_thread(words: &[u64], threads: usize, streams: usize, simd: Simd) -> u64 {
    let part = words.len() / threads;
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        let sums: Vec<_> = (0..threads)
            .map(|t| {
                let (mine, barrier) = (&words[t * part..(t + 1) * part], &barrier);
                s.spawn(move || {
                    barrier.wait();
                    sum_streams(mine, streams, simd)
                })
            })
            .collect();
        sums.into_iter().map(|h| h.join().expect("a probe thread panicked")).fold(0, u64::wrapping_add)
    })
}

/// The wrapping sum of `words`, read as `streams` equal pieces side by side (a tail that
/// does not divide evenly is left out).
fn sum_streams(words: &[u64], streams: usize, simd: Simd) -> u64 {
    let len = words.len() / streams / 64 * 64;
    let pieces: Vec<&[u64]> = (0..streams).map(|s| &words[s * len..(s + 1) * len]).collect();
    match simd {
        // SAFETY: `Simd::best` chose these only where the CPU has the features.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => unsafe { x86::sum_avx512(&pieces) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { x86::sum_avx2(&pieces) },
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
    pub unsafe fn sum_avx512(pieces: &[&[u64]]) -> u64 {
        let len = pieces.first().map_or(0, |p| p.len());
        let mut acc = [_mm512_setzero_si512(); 8];
        for i in (0..len).step_by(32) {
            for (s, p) in pieces.iter().enumerate() {
                let at = p[i..i + 32].as_ptr();
                // Prefetches never fault, so the addresses may run past the piece.
                _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES));
                _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES + 128));
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
    pub unsafe fn sum_avx2(pieces: &[&[u64]]) -> u64 {
        let len = pieces.first().map_or(0, |p| p.len());
        let mut acc = [_mm256_setzero_si256(); 8];
        for i in (0..len).step_by(16) {
            for (s, p) in pieces.iter().enumerate() {
                let at = p[i..i + 16].as_ptr();
                // Prefetches never fault, so the addresses may run past the piece.
                _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES));
                _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES + 64));
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

    #[test]
    fn every_pattern_sums_what_it_reads() {
        // 64 words per stream and piece boundary: the sums are exact, whichever width.
        let words: Vec<u64> = (0..4096u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        let want = words.iter().fold(0u64, |a, &b| a.wrapping_add(b));
        for simd in [Simd::Scalar, Simd::best()] {
            for streams in [1, 2, 4, 8] {
                assert_eq!(sum_streams(&words, streams, simd), want, "{simd:?}, {streams} streams");
            }
            assert_eq!(per_thread(&words, 2, 4, simd), want, "{simd:?}, two threads");
        }
    }

    /// Prints what each pattern reads on this machine (docs/benchmarks.md):
    /// `cargo test --release --lib bandwidth::tests::patterns -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn patterns() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let m = measure(threads);
        for (name, bw) in &m.patterns {
            println!("{:6.2} GB/s  {name}", bw / 1e9);
        }
        println!("best: {:.2} GB/s ({}), {threads} threads", m.bytes_per_sec / 1e9, m.pattern);
    }
}
