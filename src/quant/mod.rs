//! Block-quantized weight formats (GGML's Q4_0 ... Q8_K): one file per format with its
//! `#[repr(C)]` block, a size assertion, a scalar reference dequantize and dot product
//! and a quantizer; SIMD paths are tested against those references.

use rayon::ThreadPool;
use rayon::prelude::*;

use crate::tensor::{DType, HostTensor};

/// Dequantizes the leading blocks of `blocks` (format `dtype`) into `out`, whose length
/// is a whole number of blocks.
pub fn dequantize(dtype: DType, _blocks: &[u8], out: &mut [f32]) {
    assert!(out.len().is_multiple_of(dtype.block_size()), "{dtype:?}: {} values is not whole blocks", out.len());
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => unreachable!("plain floats are read directly"),
        other => panic!("dequantizing {other:?} is not available in this build"),
    }
}

/// `out[r, o] = Σ_k x[r, k] · w[o, k]` for a block-quantized `w` (`[m, k]`): the
/// reference path, one dequantized weight row at a time per task.
pub fn matmul(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    let (m, k) = (w.shape[0], w.shape[1]);
    let row_bytes = w.dtype.bytes_for(k).expect("a weight row is whole blocks");
    let bytes = w.bytes();
    let cols: Vec<Vec<f32>> = pool.install(|| {
        (0..m)
            .into_par_iter()
            .map_init(
                || vec![0.0f32; k],
                |row, o| {
                    dequantize(w.dtype, &bytes[o * row_bytes..(o + 1) * row_bytes], row);
                    (0..rows).map(|r| crate::backend::cpu::matmul::dot(&x[r * k..(r + 1) * k], row)).collect()
                },
            )
            .collect()
    });
    for (o, col) in cols.iter().enumerate() {
        for (r, v) in col.iter().enumerate() {
            out[r * m + o] = *v;
        }
    }
}
