//! The quantized matmul (`strata::backend::cpu::matmul::quant::matmul_with`): every SIMD kernel against the
//! scalar `vec_dot_*` reference on random valid blocks, odd shapes, 1- and 2-thread pools
//! and weights that are not 64-byte aligned; the scalar path against a dequantized f32
//! matmul; and an ignored benchmark (`cargo test --release --test it quant_matmul:: --
//! --ignored --nocapture`).

use std::sync::Arc;
use std::time::Instant;

use half::f16;
use rayon::{ThreadPool, ThreadPoolBuilder};
use strata::backend::cpu::matmul::{self as cpu_matmul, quant as qmatmul};
use strata::quant::panels::to_panels;
use strata::quant::{self, QuantKernel};
use strata::tensor::{AlignedBytes, DType, HostTensor};

/// SplitMix64, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// The formats with an integer dot product.
const FORMATS: [DType; 9] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::Q5_K,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Mxfp4,
];

/// Byte offsets of each format's f16 fields: (scale `d`, min `dmin`/`m` if any). MXFP4
/// has none (its scale is an exponent byte, which [`random_weight_bytes`] sets).
fn f16_fields(dtype: DType) -> (usize, Option<usize>) {
    match dtype {
        DType::Mxfp4 => (0, None),
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => (0, None),
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => (0, Some(2)),
        DType::Q6_K => (208, None),
        other => panic!("{other:?}"),
    }
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// `m × k` random valid blocks: random levels, scales and high bits; finite f16 scales
/// (non-negative `d`, `dmin`; `m` of either sign).
fn random_weight_bytes(dtype: DType, m: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let nblocks = m * k / dtype.block_size();
    let bb = dtype.block_bytes();
    let mut bytes: Vec<u8> = (0..nblocks * bb).map(|_| rng.next_u64() as u8).collect();
    if dtype == DType::Mxfp4 {
        // Scales 2^-8 ..= 2^-4 (exponent bytes 120..=124).
        bytes.chunks_exact_mut(bb).for_each(|b| b[0] = 120 + (rng.next_u64() % 5) as u8);
        return bytes;
    }
    let (d, min) = f16_fields(dtype);
    for b in bytes.chunks_exact_mut(bb) {
        put_f16(b, d, (rng.f32().abs() + 0.01) * 0.05);
        if let Some(at) = min {
            let v = rng.f32() * 0.05;
            put_f16(b, at, if matches!(dtype, DType::Q4_K | DType::Q5_K) { v.abs() } else { v });
        }
    }
    bytes
}

/// Per value, |scale part| + |min part| of the weight: the magnitude each product term
/// of the dot product can have (K-quants: d·sc·q + dmin·m; Q4_1/Q5_1: d·q + |m|).
fn abs_weights(dtype: DType, bytes: &[u8], k: usize) -> Vec<f32> {
    let mut b = bytes.to_vec();
    if let (_, Some(at)) = f16_fields(dtype) {
        for blk in b.chunks_exact_mut(dtype.block_bytes()) {
            let v = f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
            // K-quants subtract dmin·m: store −dmin so dequantize adds it.
            let v = if matches!(dtype, DType::Q4_K | DType::Q5_K) { -v.abs() } else { v.abs() };
            put_f16(blk, at, v);
        }
    }
    let mut out = vec![0.0; b.len() / dtype.block_bytes() * dtype.block_size()];
    quant::dequantize(dtype, &b, &mut out);
    assert_eq!(out.len() % k, 0);
    out.iter().map(|v| v.abs()).collect()
}

/// A tensor over `bytes` that starts `shift` bytes into its buffer (64-byte aligned
/// buffers, so `shift = 2` gives data that is only 2-aligned).
fn tensor(dtype: DType, bytes: &[u8], m: usize, k: usize, shift: usize) -> HostTensor {
    let mut raw = vec![0u8; shift];
    raw.extend_from_slice(bytes);
    HostTensor::new(Arc::new(AlignedBytes::from_slice(&raw)), shift, bytes.len(), dtype, vec![m, k])
}

fn pool(threads: usize) -> ThreadPool {
    ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
}

fn available() -> Vec<QuantKernel> {
    QuantKernel::ALL.into_iter().filter(|k| k.is_available()).collect()
}

/// Runs every available kernel on one shape and checks each against the scalar kernel
/// within 1e-6 of Σ|terms| per output.
fn check(dtype: DType, rows: usize, m: usize, k: usize, shift: usize, pool: &ThreadPool, seed: u64) {
    let mut rng = Rng(seed);
    let bytes = random_weight_bytes(dtype, m, k, &mut rng);
    let w = tensor(dtype, &bytes, m, k, shift);
    let x = rng.vec(rows * k, 2.0);
    let absw = abs_weights(dtype, &bytes, k);
    let mut want = vec![f32::NAN; rows * m];
    qmatmul::matmul_with(QuantKernel::Scalar, pool, &x, rows, &w, &mut want);
    for kernel in available() {
        let mut got = vec![f32::NAN; rows * m + 3];
        qmatmul::matmul_with(kernel, pool, &x, rows, &w, &mut got);
        assert!(got[rows * m..].iter().all(|v| v.is_nan()), "{kernel:?} {dtype:?}: wrote past rows × m");
        for r in 0..rows {
            let xr = &x[r * k..(r + 1) * k];
            let amax = xr.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for o in 0..m {
                // |dequantized activation| ≤ |x| + half a step (+ f16 slop) < |x| + amax/127
                let terms: f32 =
                    absw[o * k..(o + 1) * k].iter().zip(xr).map(|(w, x)| w * (x.abs() + amax / 127.0)).sum();
                let (g, e) = (got[r * m + o], want[r * m + o]);
                assert!(
                    (g - e).abs() <= 1e-6 * terms,
                    "{kernel:?} {dtype:?} rows={rows} m={m} k={k} shift={shift}: out[{r},{o}] = {g} vs scalar {e} (Σ|terms| {terms})"
                );
            }
        }
    }
}

#[test]
fn every_kernel_matches_scalar_reference_on_odd_shapes() {
    let (p1, p2) = (pool(1), pool(2));
    let mut seed = 1;
    for dtype in FORMATS {
        let bs = dtype.block_size();
        // 32-value formats: 1, 3, 5, 7 and 22 blocks (the AVX-512 kernels take four at a time)
        let ks: Vec<usize> = if bs == 32 { vec![32, 96, 160, 224, 704] } else { vec![256, 768] };
        for &k in &ks {
            for (rows, m) in [(1, 1), (1, 13), (3, 17), (9, 33), (17, 40), (8, 129)] {
                for shift in [0, 2, 6] {
                    seed += 1;
                    check(dtype, rows, m, k, shift, if seed % 2 == 0 { &p2 } else { &p1 }, seed);
                }
            }
        }
        // large enough to split across the pool's tasks
        check(dtype, 2, 300, bs * 8, 2, &p2, 1000);
        check(dtype, 12, 301, bs * 4, 0, &p2, 1001);
    }
}

/// Rows computed together "each as alone" (the decode rows of a batch) equal one-row
/// calls bit for bit, whatever their number: the several-row kernels repeat exactly the
/// one-row kernel's operations per row.
#[test]
fn rows_alone_equal_one_row_calls_bit_for_bit() {
    let (one, two) = (pool(1), pool(2));
    for dtype in FORMATS {
        // 576 and 2048 wide: whole register groups and a tail of blocks after them.
        for (m, k) in [(37, 576), (20, 2048), (9, dtype.block_size() * 3)] {
            if k % dtype.block_size() != 0 {
                continue;
            }
            let mut rng = Rng(m as u64 * 31 + k as u64);
            let bytes = random_weight_bytes(dtype, m, k, &mut rng);
            let w = tensor(dtype, &bytes, m, k, 2);
            for rows in [2, 3, 4, 7, 8, 13] {
                let x = rng.vec(rows * k, 2.0);
                let mut got = vec![f32::NAN; rows * m];
                cpu_matmul::matmul_rows_alone(&two, &x, rows, &w, &mut got);
                for r in 0..rows {
                    let mut want = vec![f32::NAN; m];
                    cpu_matmul::matmul(&one, &x[r * k..(r + 1) * k], 1, &w, &mut want);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got[r * m..(r + 1) * m]), bits(&want), "{dtype:?} {m}×{k}, row {r} of {rows}");
                }
            }
        }
    }
}

/// A prompt row gets the same bits from every kernel's GEMM whatever else is in the
/// call (how many rows, and where it sits among them): what lets a batch's prompt chunks
/// give what the prompt gets alone (tests/it/batching.rs) on AVX-512 and on AVX2 machines.
#[test]
fn gemm_rows_do_not_depend_on_the_rest_of_the_call() {
    let p = pool(2);
    for kernel in available() {
        for dtype in FORMATS {
            let (m, k) = (35, dtype.block_size() * 5);
            let mut rng = Rng(k as u64 + m as u64);
            let bytes = random_weight_bytes(dtype, m, k, &mut rng);
            let w = tensor(dtype, &bytes, m, k, 2);
            let rows = 15;
            let x = rng.vec(rows * k, 2.0);
            let mut all = vec![f32::NAN; rows * m];
            qmatmul::matmul_with(kernel, &p, &x, rows, &w, &mut all);
            for r in 0..rows {
                // The row second of two, beside the last row.
                let mut two = x[(rows - 1) * k..].to_vec();
                two.extend_from_slice(&x[r * k..(r + 1) * k]);
                let mut got = vec![f32::NAN; 2 * m];
                qmatmul::matmul_with(kernel, &p, &two, 2, &w, &mut got);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got[m..]), bits(&all[r * m..(r + 1) * m]), "{kernel:?} {dtype:?} row {r}");
            }
        }
    }
}

#[test]
fn integer_path_matches_dequantized_f32_matmul() {
    // Only the activations are rounded (to 8 bits), so the result is within a few
    // percent of Σ|w·x| of the f32 product with the dequantized weights.
    let p = pool(2);
    let mut rng = Rng(77);
    for dtype in FORMATS {
        let (rows, m, k) = (3, 21, dtype.block_size() * 6);
        let bytes = random_weight_bytes(dtype, m, k, &mut rng);
        let w = tensor(dtype, &bytes, m, k, 0);
        let mut deq = vec![0.0; m * k];
        quant::dequantize(dtype, &bytes, &mut deq);
        let absw = abs_weights(dtype, &bytes, k);
        let x = rng.vec(rows * k, 1.0);
        for kernel in available() {
            let mut got = vec![0.0; rows * m];
            qmatmul::matmul_with(kernel, &p, &x, rows, &w, &mut got);
            for r in 0..rows {
                for o in 0..m {
                    let (xr, wr) = (&x[r * k..(r + 1) * k], &deq[o * k..(o + 1) * k]);
                    let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let scale: f32 = xr.iter().zip(&absw[o * k..(o + 1) * k]).map(|(a, b)| a.abs() * b).sum();
                    let g = got[r * m + o];
                    assert!(
                        ((g as f64) - want).abs() <= 0.02 * scale as f64,
                        "{kernel:?} {dtype:?}: {g} vs {want} (scale {scale})"
                    );
                }
            }
        }
    }
}

#[test]
fn zero_rows_and_best_kernel_entry_point() {
    let p = pool(2);
    let mut rng = Rng(5);
    let bytes = random_weight_bytes(DType::Q4_0, 8, 64, &mut rng);
    let w = tensor(DType::Q4_0, &bytes, 8, 64, 0);
    let mut out = vec![7.0f32; 8];
    cpu_matmul::matmul(&p, &[], 0, &w, &mut out);
    assert!(out.iter().all(|v| *v == 7.0));
    let x = rng.vec(64, 1.0);
    let mut a = vec![0.0; 8];
    let mut b = vec![0.0; 8];
    cpu_matmul::matmul(&p, &x, 1, &w, &mut a);
    qmatmul::matmul_with(QuantKernel::best(), &p, &x, 1, &w, &mut b);
    assert_eq!(a, b);
    assert!(a.iter().any(|v| *v != 0.0));
}

/// Decode (1 row) bandwidth on 2048 × 5632 Q4_0 and Q4_K weights, streamed from DRAM
/// (32 distinct copies cycled, ~200 MB), next to a plain 1 GiB read, and prefill GFLOP/s
/// with 128 rows. Prints figures; asserts nothing about speed.
#[test]
#[ignore = "benchmark: cargo test --release --test it quant_matmul:: -- --ignored --nocapture"]
fn throughput() {
    const M: usize = 2048;
    const K: usize = 5632;
    const COPIES: usize = 32;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
    let pool = pool(threads);
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    let mut rng = Rng(9);
    let words: Vec<u64> = (0..1u64 << 27).collect();
    let mut read_s = [f64::INFINITY; 2];
    for _ in 0..3 {
        for (s, streams) in read_s.iter_mut().zip([1, 4]) {
            *s = s.min(time(&mut || {
                std::hint::black_box(strata::backend::cpu::bandwidth::sum_words(&pool, &words, streams));
            }));
        }
    }
    let [r1, r4] = read_s.map(|s| (words.len() * 8) as f64 / s / 1e9);
    eprintln!("plain read, {threads} threads summing 1 GiB of u64: {r1:.1} GB/s (4 streams per thread: {r4:.1} GB/s)");
    drop(words);

    let x = rng.vec(128 * K, 1.0);
    let mut out = vec![0.0f32; 128 * M];
    for dtype in [DType::Q4_0, DType::Q4_K, DType::Q8_0, DType::Q6_K] {
        let bytes = random_weight_bytes(dtype, M, K, &mut rng);
        let ws: Vec<HostTensor> = (0..COPIES)
            .map(|i| {
                let mut b = bytes.clone();
                b[dtype.block_bytes() - 1] ^= i as u8;
                tensor(dtype, &b, M, K, 0)
            })
            .collect();
        let weight_bytes = bytes.len() as f64;
        for kernel in available() {
            let mut stream_s = f64::INFINITY;
            for _ in 0..4 {
                let t = time(&mut || ws.iter().for_each(|w| qmatmul::matmul_with(kernel, &pool, &x, 1, w, &mut out)));
                stream_s = stream_s.min(t / COPIES as f64);
            }
            let mut prefill_s = f64::INFINITY;
            for _ in 0..if kernel == QuantKernel::Scalar { 1 } else { 3 } {
                prefill_s = prefill_s.min(time(&mut || qmatmul::matmul_with(kernel, &pool, &x, 128, &ws[0], &mut out)));
            }
            let gbs = weight_bytes / stream_s / 1e9;
            eprintln!(
                "{kernel:?} {dtype:?} {M}x{K} ({:.1} MB), {threads} threads: decode {gbs:.1} GB/s from DRAM ({:.0}% of the 4-stream read, {:.0} us); prefill rows=128 {:.1} GFLOP/s ({:.1} ms)",
                weight_bytes / 1e6,
                100.0 * gbs / r4.max(r1),
                stream_s * 1e6,
                2.0 * (128 * M * K) as f64 / prefill_s / 1e9,
                prefill_s * 1e3
            );
        }
    }
}

/// Prefill GFLOP/s only (2048 × 5632, 128 rows or `STRATA_BENCH_ROWS`; formats from
/// `STRATA_BENCH_TYPES`), many repetitions, beside the same rows as one-row calls: for
/// profiling the GEMM kernels (`STRATA_CPU_ISA=avx2` times the AVX2 ones). Prints
/// figures; asserts nothing about speed.
#[test]
#[ignore = "benchmark: cargo test --release --test it quant_matmul::prefill -- --ignored --nocapture"]
fn prefill_throughput() {
    const M: usize = 2048;
    const K: usize = 5632;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
    let pool = pool(threads);
    let rows: usize = std::env::var("STRATA_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(128);
    let mut rng = Rng(9);
    let x = rng.vec(rows * K, 1.0);
    let mut out = vec![0.0f32; rows * M];
    let kinds = std::env::var("STRATA_BENCH_TYPES").unwrap_or_else(|_| "q4_0,q8_0,q4_k,q6_k".into());
    for dtype in FORMATS.into_iter().filter(|d| kinds.split(',').any(|n| n.eq_ignore_ascii_case(d.name()))) {
        let bytes = random_weight_bytes(dtype, M, K, &mut rng);
        let w = tensor(dtype, &bytes, M, K, 0);
        let gflops = |s: f64| 2.0 * (rows * M * K) as f64 / s / 1e9;
        // The GEMM, and each row as a one-row call (the path without a GEMM), interleaved.
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..15 {
            for (i, ts) in times.iter_mut().enumerate() {
                let t = Instant::now();
                match i {
                    0 => cpu_matmul::matmul(&pool, &x, rows, &w, &mut out),
                    _ => cpu_matmul::matmul_rows_alone(&pool, &x, rows, &w, &mut out),
                }
                ts.push(t.elapsed().as_secs_f64());
            }
        }
        let [gemm, alone] = times.map(|mut ts| {
            ts.sort_by(f64::total_cmp);
            (gflops(ts[ts.len() / 2]), gflops(ts[0]))
        });
        eprintln!(
            "{dtype:?} {M}x{K} rows={rows}, {threads} threads, {:?}: median {:.1} GFLOP/s, best {:.1}; rows as one-row calls: median {:.1}, best {:.1}",
            QuantKernel::best(),
            gemm.0,
            gemm.1,
            alone.0,
            alone.1
        );
    }
}

/// The decode kernels' arithmetic, away from memory: a 256 × 2048 weight (or 256 ×
/// `STRATA_BENCH_K`) that stays in L2, one thread, one activation row (GB/s of weights)
/// and 16 rows as batched decode runs them (`matmul_rows_alone`, G multiply-adds/s).
/// Best of 20 × 200 calls. `STRATA_DECODE_READS` picks how one row reads its weight rows.
#[test]
#[ignore]
fn arithmetic_from_cache() {
    const M: usize = 256;
    let k: usize = std::env::var("STRATA_BENCH_K").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    let pool = pool(1);
    let mut rng = Rng(9);
    let x = rng.vec(16 * k, 1.0);
    let mut out = vec![0.0f32; 16 * M];
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        let bytes = random_weight_bytes(dtype, M, k, &mut rng);
        let stored = tensor(dtype, &bytes, M, k, 0);
        // As stored, and as the CPU backend keeps the weights that have 16-row panels.
        for w in [Some(stored.clone()), to_panels(&stored)].into_iter().flatten() {
            let best = |f: &mut dyn FnMut()| {
                (0..20)
                    .map(|_| {
                        let t = Instant::now();
                        (0..200).for_each(|_| f());
                        t.elapsed().as_secs_f64() / 200.0
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let one = best(&mut || cpu_matmul::matmul(&pool, &x, 1, &w, &mut out));
            let rows = best(&mut || cpu_matmul::matmul_rows_alone(&pool, &x, 16, &w, &mut out));
            eprintln!(
                "{dtype:?}{}: one row {:.1} GB/s ({:.1} us); 16 rows {:.1} G multiply-adds/s ({:.1} us)",
                if w.is_panels() { " panels" } else { "" },
                bytes.len() as f64 / one / 1e9,
                one * 1e6,
                (16 * M * k) as f64 / rows / 1e9,
                rows * 1e6
            );
        }
    }
}

/// Decode from memory: one activation row through weights of 2048 × 5632, 768 MiB of
/// them (more than the caches hold: some L3s hold 300 MiB), 2 threads, the weights as
/// stored and as the
/// CPU backend's 16-row panels, interleaved; GB/s of weights, median and best of 9
/// passes. `STRATA_BENCH_TYPES` picks the formats (default q4_0,q8_0,q4_k). Prints figures;
/// asserts nothing about speed.
#[test]
#[ignore = "benchmark: cargo test --release --test it quant_matmul::decode_from_memory -- --ignored --nocapture"]
fn decode_from_memory() {
    const M: usize = 2048;
    const K: usize = 5632;
    let pool = pool(2);
    let mut rng = Rng(5);
    let x = rng.vec(K, 1.0);
    let mut out = vec![0.0f32; M];
    let kinds = std::env::var("STRATA_BENCH_TYPES").unwrap_or_else(|_| "q4_0,q8_0,q4_k".into());
    for dtype in FORMATS.into_iter().filter(|d| kinds.split(',').any(|n| n.eq_ignore_ascii_case(d.name()))) {
        let count = (768usize << 20).div_ceil(dtype.bytes_for(M * K).unwrap());
        let stored: Vec<HostTensor> =
            (0..count).map(|_| tensor(dtype, &random_weight_bytes(dtype, M, K, &mut rng), M, K, 0)).collect();
        let Some(panels) = stored.iter().map(|w| to_panels(&w)).collect::<Option<Vec<_>>>() else { continue };
        let bytes = stored.iter().map(|w| w.byte_len()).sum::<usize>() as f64;
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..9 {
            for (ws, ts) in [&stored, &panels].into_iter().zip(times.iter_mut()) {
                let t = Instant::now();
                ws.iter().for_each(|w| cpu_matmul::matmul(&pool, &x, 1, w, &mut out));
                ts.push(t.elapsed().as_secs_f64());
            }
        }
        let [s, p] = times.map(|mut ts| {
            ts.sort_by(f64::total_cmp);
            (bytes / ts[ts.len() / 2] / 1e9, bytes / ts[0] / 1e9)
        });
        eprintln!(
            "{dtype:?} from memory, 2 threads: as stored median {:.1} GB/s, best {:.1}; panels median {:.1}, best {:.1}",
            s.0, s.1, p.0, p.1
        );
    }
}
