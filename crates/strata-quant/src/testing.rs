//! Test data for this crate's tests and the ones above it (a test module cannot cross
//! crates).

use strata_tensor::rng::Rng;
use strata_tensor::tensor::{AlignedBytes, ByteSource, DType, HostTensor};

/// A random `[m, k]` weight of `dtype` (as stored): quantized where this crate has a
/// quantizer, else random levels with small scales (and mins).
pub fn random_weight(pool: &rayon::ThreadPool, rng: &mut Rng, dtype: DType, m: usize, k: usize) -> HostTensor {
    let b = match dtype {
        // No Q5_K quantizer here: random levels and packed scales, small positive
        // `d` and `dmin`.
        DType::Q5_K => {
            let mut b = rng.bytes(m * k / crate::QK_K * 176);
            for blk in b.chunks_exact_mut(176) {
                blk[..2].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.002).to_le_bytes());
                blk[2..4].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.002).to_le_bytes());
            }
            b
        }
        // No Q4_1 quantizer here: random levels, small random scales and mins.
        DType::Q4_1 => {
            let mut b = rng.bytes(m * k / crate::QK * 20);
            for blk in b.chunks_exact_mut(20) {
                blk[..2].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.02).to_le_bytes());
                blk[2..4].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.1 - 0.05).to_le_bytes());
            }
            b
        }
        _ => crate::quantize_matrix(pool, dtype, &rng.vec(m * k, 1.0), m, k).unwrap().bytes().to_vec(),
    };
    HostTensor::new(std::sync::Arc::new(AlignedBytes::from_slice(&b)), 0, b.len(), dtype, vec![m, k])
}
