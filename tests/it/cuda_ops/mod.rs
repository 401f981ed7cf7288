//! Every CUDA op against the CPU op on the same inputs, with llama.cpp's
//! test-backend-ops bounds: NMSE ≤ 1e-7 for elementwise ops, norms, RoPE and embedding
//! lookups, ≤ 5e-4 for matrix products and attention; identical ids for top-k.
//!
//! Needs a GPU: without one every test prints why and passes, unless
//! `STRATA_REQUIRE_GPU=1`, which turns a missing GPU into a failure (set it on a GPU
//! machine; docs/gpu.md says how these run there). `STRATA_CUDA_OPS_ON_CPU=1` runs the
//! same checks against a second CPU backend, to test these files where there is no GPU.

mod attention;
mod elementwise;
mod products;

use strata::backend::cpu::CpuBackend;
use strata::backend::cuda::CudaBackend;
use strata::tensor::{AlignedBytes, DType, HostTensor};

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) if std::env::var("STRATA_REQUIRE_GPU").is_ok_and(|v| v == "1") => panic!("STRATA_REQUIRE_GPU=1: {e}"),
        Err(e) => {
            eprintln!("no GPU ({e}): skipping");
            None
        }
    }
}

/// Runs a check on the GPU, or (with `STRATA_CUDA_OPS_ON_CPU=1`, to test this file
/// itself where there is no GPU) on a second CPU backend.
fn on_gpu(gpu_run: impl FnOnce(&CudaBackend), cpu_run: impl FnOnce(&CpuBackend)) {
    if std::env::var("STRATA_CUDA_OPS_ON_CPU").is_ok_and(|v| v == "1") {
        return cpu_run(&CpuBackend::new(1));
    }
    if let Some(g) = gpu() {
        gpu_run(&g);
    }
}

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
        })
        .collect()
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let err: f64 = got.iter().zip(want).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    err / norm.max(1e-30)
}

fn check(what: &str, got: &[f32], want: &[f32], bound: f64) {
    let e = nmse(got, want);
    assert!(e <= bound, "{what}: NMSE {e:.3e} > {bound:.0e}");
    eprintln!("{what}: NMSE {e:.2e}");
}

/// A `[rows, cols]` weight in `dtype`: quantized from values where Strata has a
/// quantizer, else random blocks with small f16 scales.
fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> HostTensor {
    let x = values(rows * cols, seed, 1.0);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let bytes = match strata::quant::quantize_matrix(&pool, dtype, &x, rows, cols) {
        Ok(b) => b,
        Err(e) => panic!("{dtype:?}: {e}"),
    };
    HostTensor::new(std::sync::Arc::new(bytes), 0, dtype.bytes_for(rows * cols).unwrap(), dtype, vec![rows, cols])
}

/// Random blocks of a format Strata cannot quantize to, with its f16 scale fields (at
/// `scale_offsets` in each block) set to small values.
fn random_blocks(dtype: DType, rows: usize, cols: usize, scale_offsets: &[usize], seed: u64) -> HostTensor {
    let len = dtype.bytes_for(rows * cols).unwrap();
    let mut bytes = AlignedBytes::zeroed(len);
    let noise = values(len, seed, 1.0);
    let b = bytes.bytes_mut();
    for (i, v) in noise.iter().enumerate() {
        b[i] = (v.to_bits() >> 7) as u8;
    }
    let scales = values(len / dtype.block_bytes() * scale_offsets.len(), seed + 1, 1.0);
    let mut s = scales.iter();
    for block in b.chunks_exact_mut(dtype.block_bytes()) {
        for &off in scale_offsets {
            let v = half::f16::from_f32(0.01 + 0.01 * s.next().unwrap().abs());
            block[off..off + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    HostTensor::new(std::sync::Arc::new(bytes), 0, len, dtype, vec![rows, cols])
}

fn any_weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> HostTensor {
    match dtype {
        DType::Q4_1 | DType::Q5_1 | DType::Q5_K => random_blocks(dtype, rows, cols, &[0, 2], seed),
        DType::Q5_0 => random_blocks(dtype, rows, cols, &[0], seed),
        _ => weight(dtype, rows, cols, seed),
    }
}
