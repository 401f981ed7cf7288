use std::sync::Arc;
use std::time::Instant;

use half::{bf16, f16};

use super::*;
use strata_quant::ReadF32;
use strata_tensor::tensor::AlignedBytes;

/// SplitMix64: a tiny seeded generator, so failures reproduce.
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

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

fn pool(threads: usize) -> ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
}

fn available() -> Vec<Kernel> {
    Kernel::ALL.into_iter().filter(|k| k.is_available()).collect()
}

/// A random `[m, k]` weight whose data starts one element past a 64-byte boundary
/// (aligned for its dtype only, as a memory-mapped tensor may be).
fn weight(dtype: DType, m: usize, k: usize, rng: &mut Rng) -> HostTensor {
    let skew = dtype.block_bytes();
    let mut bytes = vec![0u8; skew];
    for _ in 0..m * k {
        let v = rng.f32();
        match dtype {
            DType::F32 => bytes.extend(v.to_le_bytes()),
            DType::F16 => bytes.extend(f16::from_f32(v).to_bits().to_le_bytes()),
            DType::BF16 => bytes.extend(bf16::from_f32(v).to_bits().to_le_bytes()),
            other => unreachable!("the float kernels take F32, F16 and BF16, not {other:?}"),
        }
    }
    let len = bytes.len() - skew;
    HostTensor::new(Arc::new(AlignedBytes::from_slice(&bytes)), skew, len, dtype, vec![m, k])
}

/// Runs one kernel on random data and compares every output with an f64 reference:
/// `|got - ref| <= 1e-6 · Σ|x·w| + 1e-7`. Also checks that `out` is overwritten (it
/// starts as NaN) and that values past `rows × m` are left alone.
fn check(kernel: Kernel, pool: &ThreadPool, dtype: DType, rows: usize, m: usize, k: usize) {
    let mut rng = Rng((rows * 1_000_003 + m * 1009 + k) as u64);
    let w = weight(dtype, m, k, &mut rng);
    let x = rng.vec(rows * k + 3);
    let mut out = vec![f32::NAN; rows * m + 5];
    matmul_with(kernel, pool, &x, rows, &w, &mut out);
    for r in 0..rows {
        for o in 0..m {
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for kk in 0..k {
                let term = x[r * k + kk] as f64 * w.get_f32(o * k + kk) as f64;
                want += term;
                mag += term.abs();
            }
            let got = out[r * m + o] as f64;
            assert!(
                (got - want).abs() <= 1e-6 * mag + 1e-7,
                "{kernel:?} {dtype:?} rows={rows} m={m} k={k}: out[{r}, {o}] = {got}, want {want} (Σ|terms| {mag})"
            );
        }
    }
    assert!(out[rows * m..].iter().all(|v| v.is_nan()), "{kernel:?} wrote past rows × m");
}

/// (rows, m, k): decode and small batches (the streaming path, x rows in groups of
/// four), prefill batches around the register tiles (12 rows for AVX-512, 6 for AVX2,
/// 4 for scalar), panel widths (8, 16, 32) and `KC` (512), and calls big enough to be
/// split across tasks.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (1, 37, 15),
    (1, 67, 131),
    (1, 130, 1030),
    (2, 9, 33),
    (3, 45, 97),
    (4, 33, 64),
    (5, 31, 17),
    (7, 301, 257),
    (8, 20, 40),
    (9, 33, 40),
    (12, 32, 16),
    (13, 65, 600),
    (17, 71, 301),
    (17, 300, 700),
    (40, 100, 1100),
    (3, 5, 0),
    (0, 5, 7),
];

#[test]
fn every_kernel_matches_reference() {
    let pool = pool(2);
    let kernels = available();
    eprintln!("matmul kernels tested on this CPU: {kernels:?}");
    for &kernel in &kernels {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for &(rows, m, k) in SHAPES {
                check(kernel, &pool, dtype, rows, m, k);
            }
        }
    }
}

#[test]
fn single_thread_pool_matches_reference() {
    let pool = pool(1);
    for kernel in available() {
        check(kernel, &pool, DType::BF16, 17, 300, 700);
        check(kernel, &pool, DType::F16, 1, 130, 1030);
    }
}

#[test]
fn detection_matches_cpu_features() {
    assert!(Kernel::Scalar.is_available());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        use strata_quant::isa;
        assert_eq!(Kernel::Avx512.is_available(), isa::avx512() && has!("avx512f"));
        assert_eq!(Kernel::Avx2.is_available(), isa::avx2() && has!("avx2") && has!("fma") && has!("f16c"));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        assert!(!Kernel::Avx512.is_available() && !Kernel::Avx2.is_available());
    }
    assert_eq!(Kernel::best(), *available().last().unwrap());
}

/// The fused attention loops give bit for bit what `dot` and `axpy` give position by
/// position and head by head, in every kernel, for head sizes with and without a tail
/// and any number of heads sharing the keys and values (several at once in the
/// AVX-512 kernels, with a remainder); their f16 forms give what they give over the
/// widened values.
#[test]
fn scores_and_weighted_sums_are_dot_and_axpy_per_position() {
    let mut rng = Rng(11);
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for kernel in available() {
        let ops = kernel.ops_or_panic();
        for hd in [1, 7, 8, 16, 24, 63, 64, 80, 96, 128, 130] {
            for (positions, heads) in [(1, 1), (2, 3), (5, 1), (16, 2), (33, 5), (40, 8), (17, 4)] {
                let stride = hd + 3;
                let (q, k) = (rng.vec(heads * hd), rng.vec((positions - 1) * stride + hd));
                let mut got = vec![0.0; heads * positions];
                // SAFETY: `k` holds the positions asked for; `q` and `got` whole heads.
                unsafe { (ops.scores)(&q, hd, &k, stride, 0.125, &mut got) };
                for (g, j) in (0..heads).flat_map(|g| (0..positions).map(move |j| (g, j))) {
                    let want = dot_with(kernel, &q[g * hd..][..hd], &k[j * stride..][..hd]) * 0.125;
                    let got = got[g * positions + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "{kernel:?} scores hd={hd} head {g} of {heads} j={j}");
                }
                let (w, v) = (rng.vec(heads * positions), rng.vec((positions - 1) * stride + hd));
                let start = rng.vec(heads * hd);
                let (mut got, mut want) = (start.clone(), start);
                // SAFETY: `v` holds the positions asked for; `w` and `got` whole heads.
                unsafe { (ops.weighted_sum)(&w, &v, stride, &mut got, hd) };
                for (g, want) in want.chunks_exact_mut(hd).enumerate() {
                    for (j, &wj) in w[g * positions..][..positions].iter().enumerate() {
                        axpy_with(kernel, wj, &v[j * stride..][..hd], want);
                    }
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{kernel:?} weighted_sum hd={hd} positions={positions} heads={heads}"
                );

                // Over f16 keys and values: the bits of the same loops over their
                // f32 widening.
                let half = |x: &[f32]| x.iter().map(|&v| f16::from_f32(v).to_bits()).collect::<Vec<u16>>();
                let widen = |x: &[u16]| x.iter().map(|&h| f16::from_bits(h).to_f32()).collect::<Vec<f32>>();
                let (kh, vh) = (half(&k), half(&v));
                let (kw, vw) = (widen(&kh), widen(&vh));
                let (mut got, mut want) = (vec![0.0; heads * positions], vec![0.0; heads * positions]);
                // SAFETY: `k` and `kh` hold the positions asked for.
                unsafe {
                    (ops.scores_f16)(&q, hd, F16::cast(&kh), stride, 0.125, &mut got);
                    (ops.scores)(&q, hd, &kw, stride, 0.125, &mut want);
                }
                assert_eq!(bits(&got), bits(&want), "{kernel:?} scores_f16 hd={hd} positions={positions}");
                let start = rng.vec(heads * hd);
                let (mut got, mut want) = (start.clone(), start);
                // SAFETY: `v` and `vh` hold the positions asked for.
                unsafe {
                    (ops.weighted_sum_f16)(&w, F16::cast(&vh), stride, &mut got, hd);
                    (ops.weighted_sum)(&w, &vw, stride, &mut want, hd);
                }
                assert_eq!(bits(&got), bits(&want), "{kernel:?} weighted_sum_f16 hd={hd} positions={positions}");
            }
        }
    }
}

/// Every kernel's softmax (the scalar one included) agrees with the softmax of the f32
/// differences `x − max` taken in f64, within a few ulp for each `exp` and the division, plus what summing `n` terms in
/// some order in f32 may add (√n ulp), on lengths with and without a vector tail and
/// on scores whose exponentials underflow. Every kernel sees the same inputs.
#[test]
fn softmax_matches_the_scalar_one() {
    let mut rng = Rng(5);
    for n in [1, 5, 16, 17, 100, 1000] {
        for spread in [1.0f32, 30.0, 200.0] {
            let x: Vec<f32> = rng.vec(n).iter().map(|v| v * spread).collect();
            // Every kernel takes `x − max` in f32 (the rounding of a large difference
            // moves its `exp` by many ulp), so the reference starts from it too.
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f64> = x.iter().map(|&v| ((v - max) as f64).exp()).collect();
            let want: Vec<f64> = e.iter().map(|v| v / e.iter().sum::<f64>()).collect();
            for kernel in available() {
                let mut got = x.clone();
                // SAFETY: the kernel's features were detected.
                unsafe { (kernel.ops_or_panic().softmax)(&mut got) };
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let tol = (4.0 + (n as f64).sqrt()) * f32::EPSILON as f64 * w + 1e-37;
                    assert!((g as f64 - w).abs() <= tol, "{kernel:?} n={n} spread={spread} i={i}: {g} vs {w}");
                }
                let total: f32 = got.iter().sum();
                assert!((total - 1.0).abs() < 1e-5, "{kernel:?} n={n}: sums to {total}");
            }
        }
    }
}

/// Every kernel's max and `Σ exp(x − max)` agree with the scalar ones in f64: the max
/// exactly, the sum within 1e-6 relative; NaN lanes are left out and a row with no
/// finite max sums to 0, whatever the tail.
#[test]
fn max_exp_sum_matches_the_scalar_one() {
    let mut rng = Rng(7);
    for kernel in available() {
        let ops = kernel.ops_or_panic();
        for n in [1, 15, 16, 17, 1000, 8192] {
            for spread in [1.0f32, 30.0, 200.0] {
                let mut x: Vec<f32> = rng.vec(n).iter().map(|v| v * spread).collect();
                if n > 3 {
                    (x[1], x[n - 2]) = (f32::NAN, f32::NEG_INFINITY);
                }
                // SAFETY: the kernel's features were detected.
                let (max, sum) = unsafe { (ops.max_exp_sum)(&x) };
                let (want_max, want_sum) = scalar::max_exp_sum_ref(&x);
                assert_eq!(max, want_max, "{kernel:?} n={n} spread={spread}");
                assert!((sum - want_sum).abs() <= 1e-6 * want_sum, "{kernel:?} n={n}: {sum} vs {want_sum}");
            }
        }
        for x in [vec![f32::NAN; 20], vec![f32::NEG_INFINITY; 17], vec![1.0, f32::INFINITY, 2.0]] {
            // SAFETY: as above.
            let got = unsafe { (ops.max_exp_sum)(&x) };
            let want = scalar::max_exp_sum_ref(&x);
            assert!(got.0 == want.0 || (got.0.is_nan() && want.0.is_nan()), "{kernel:?} {x:?}: {got:?}");
            assert_eq!((got.1, want.1), (0.0, 0.0), "{kernel:?} {x:?}");
        }
    }
}

/// Every kernel's SwiGLU product agrees with the scalar formula within a few ulp,
/// across the range where `exp(−g)` overflows and underflows.
#[test]
fn silu_mul_matches_the_scalar_one() {
    let mut rng = Rng(6);
    for kernel in available() {
        let ops = kernel.ops_or_panic();
        for n in [1, 15, 16, 33, 1000] {
            for spread in [1.0f32, 20.0, 200.0] {
                let g: Vec<f32> = rng.vec(n).iter().map(|v| v * spread).collect();
                let u = rng.vec(n);
                let (mut got, mut want) = (g.clone(), g);
                // SAFETY: the kernel's features were detected; equal lengths.
                unsafe { (ops.silu_mul)(&mut got, &u) };
                scalar::silu_mul_ref(&mut want, &u);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol = 4.0 * f32::EPSILON * w.abs() + 1e-37;
                    assert!((g - w).abs() <= tol, "{kernel:?} n={n} spread={spread} i={i}: {g} vs {w}");
                }
            }
        }
    }
}

#[test]
fn dot_and_axpy_match_reference() {
    let mut rng = Rng(7);
    for kernel in available() {
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000] {
            let (a, b) = (rng.vec(n), rng.vec(n));
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = a.iter().zip(&b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
            let got = dot_with(kernel, &a, &b) as f64;
            assert!((got - want).abs() <= 1e-6 * mag + 1e-7, "{kernel:?} dot n={n}: {got} vs {want}");

            let alpha = rng.f32();
            let mut y = b.clone();
            axpy_with(kernel, alpha, &a, &mut y);
            for i in 0..n {
                let term = alpha as f64 * a[i] as f64;
                let want = b[i] as f64 + term;
                let tol = 1e-6 * (b[i].abs() as f64 + term.abs()) + 1e-7;
                assert!((y[i] as f64 - want).abs() <= tol, "{kernel:?} axpy n={n} i={i}: {} vs {want}", y[i]);
            }
        }
    }
    assert_eq!(dot(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
    let mut y = [1.0, 1.0];
    axpy(2.0, &[3.0, 4.0], &mut y);
    assert_eq!(y, [7.0, 9.0]);
}

#[test]
fn chunks_cover_every_column_on_unit_boundaries() {
    for (m, unit, work, threads) in [
        (2048, 4, 1 << 24, 2),
        (2048, 32, 1 << 30, 2),
        (70, 32, 1 << 20, 16),
        (5, 4, 1 << 20, 2),
        (2048, 4, 100, 2),
        (1000, 8, 1 << 24, 1),
    ] {
        let chunk = super::super::chunk_len(m, unit, work >= PAR_MIN_WORK, threads);
        assert!(chunk > 0 && (chunk.is_multiple_of(unit) || chunk == m), "m={m} unit={unit}: chunk {chunk}");
        if work >= PAR_MIN_WORK && threads > 1 && m >= 2 * threads * unit {
            assert!(m.div_ceil(chunk) >= threads, "m={m}: {chunk} leaves a thread idle");
        }
    }
}

/// Decode and prefill throughput against the machine's read bandwidth, per kernel.
/// Not a pass/fail test; numbers vary with whatever else the machine is doing, so each
/// figure is the best of several interleaved rounds.
/// `cargo test --release -p strata-backend --lib cpu::matmul::float::tests::throughput -- --ignored --nocapture`
///
/// On 2 vCPUs of a Sapphire Rapids Xeon (KVM, shared host; best of three quiet runs):
/// summing 1 GiB of u64 reads 14–18 GB/s (24–28 GB/s with four streams per thread);
/// AVX-512 BF16 matvec streams 20–25 GB/s from DRAM (~85% of the four-stream read,
/// ~1.0 ms per 2048 × 5632), AVX2 18–22 GB/s, scalar 4–5 GB/s; prefill with 128 rows
/// reaches ~205 GFLOP/s for BF16/F16 with AVX-512 (a bare FMA loop peaks at ~268),
/// ~130 with AVX2, 25–30 scalar.
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn throughput() {
    const M: usize = 2048;
    const K: usize = 5632;
    const COPIES: usize = 16;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
    let pool = pool(threads);
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };

    // 16 distinct BF16 weights (370 MB, more than any L3 here), cycled so that every
    // decode call streams from DRAM as it does in a real forward pass.
    let mut rng = Rng(1);
    let first = weight(DType::BF16, M, K, &mut rng);
    let ws: Vec<HostTensor> = (0..COPIES)
        .map(|i| {
            let mut bytes = first.bytes().to_vec();
            bytes[i] ^= 1;
            HostTensor::new(Arc::new(AlignedBytes::from_slice(&bytes)), 0, bytes.len(), DType::BF16, vec![M, K])
        })
        .collect();
    let x = rng.vec(128 * K);
    let mut out = vec![0.0f32; 128 * M];
    let weight_bytes = (M * K * 2) as f64;
    // Plain read bandwidth: `threads` threads summing a 1 GiB u64 array (eight
    // independent sums per thread so the adds keep up with memory).
    let words: Vec<u64> = (0..1u64 << 27).collect();
    let sum_words = |streams: usize| crate::cpu::bandwidth::sum_words(&pool, &words, streams);

    let kernels = available();
    let mut read_s = [f64::INFINITY; 2];
    let (mut stream_s, mut cached_s) = (vec![f64::INFINITY; 3], vec![f64::INFINITY; 3]);
    for _round in 0..5 {
        for (s, streams) in read_s.iter_mut().zip([1, 4]) {
            *s = s.min(time(&mut || {
                std::hint::black_box(sum_words(streams));
            }));
        }
        for (i, &kernel) in kernels.iter().enumerate() {
            let t = time(&mut || ws.iter().for_each(|w| matmul_with(kernel, &pool, &x, 1, w, &mut out)));
            stream_s[i] = stream_s[i].min(t / COPIES as f64);
            for _ in 0..4 {
                let t = time(&mut || matmul_with(kernel, &pool, &x, 1, &ws[0], &mut out));
                cached_s[i] = cached_s[i].min(t);
            }
        }
    }
    let [read_gbs, read4_gbs] = read_s.map(|s| (words.len() * 8) as f64 / s / 1e9);
    eprintln!(
        "plain read, {threads} threads summing 1 GiB of u64: {read_gbs:.1} GB/s (4 streams per thread: {read4_gbs:.1} GB/s)"
    );
    for (i, kernel) in kernels.iter().enumerate() {
        let gbs = weight_bytes / stream_s[i] / 1e9;
        eprintln!(
            "{kernel:?} matvec {M}x{K} BF16, {threads} threads: {gbs:.1} GB/s from DRAM ({:.0}% of the better read, {:.0} us), {:.1} GB/s cached ({:.0} us)",
            100.0 * gbs / read_gbs.max(read4_gbs),
            stream_s[i] * 1e6,
            weight_bytes / cached_s[i] / 1e9,
            cached_s[i] * 1e6,
        );
    }
    drop(words);

    // Prefill: rows = 128, best of interleaved rounds.
    let flops = 2.0 * (128 * M * K) as f64;
    let prefill_ws: Vec<HostTensor> = [DType::BF16, DType::F16, DType::F32]
        .map(|d| if d == DType::BF16 { first.clone() } else { weight(d, M, K, &mut rng) })
        .into();
    let mut best = vec![f64::INFINITY; prefill_ws.len() * kernels.len()];
    for round in 0..4 {
        for (i, w) in prefill_ws.iter().enumerate() {
            for (j, &kernel) in kernels.iter().enumerate() {
                if kernel == Kernel::Scalar && round > 0 {
                    continue;
                }
                let t = time(&mut || matmul_with(kernel, &pool, &x, 128, w, &mut out));
                let b = &mut best[i * kernels.len() + j];
                *b = b.min(t);
            }
        }
    }
    for (i, w) in prefill_ws.iter().enumerate() {
        for (j, kernel) in kernels.iter().enumerate() {
            let t = best[i * kernels.len() + j];
            eprintln!(
                "{kernel:?} prefill rows=128, {M}x{K} {:?}, {threads} threads: {:.1} GFLOP/s ({:.2} ms)",
                w.dtype,
                flops / t / 1e9,
                t * 1e3
            );
        }
    }
}
