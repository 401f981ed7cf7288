//! The packed layout of Q4_0 and Q8_0 weights (kernels/README.md, "Packed weights"): a
//! `[out, in]` tensor's blocks split into their quants (16-byte aligned, block `i` at
//! `i · QB`) followed by their f16 scales (block `i` at `out · nblk · QB + 2i`). The
//! same bytes as the stored tensor, so its size and accounting do not change.

use strata_tensor::tensor::DType;

/// Bytes of quants per block (`QB`) of a format with a packed layout.
pub fn quant_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_0 => Some(16),
        DType::Q8_0 => Some(32),
        _ => None,
    }
}

/// `stored` (whole blocks of `dtype`, each a 2-byte f16 scale then `QB` bytes of quants)
/// in the packed layout, or `None` when `dtype` has none or `stored` is not whole blocks.
pub fn pack(dtype: DType, stored: &[u8]) -> Option<Vec<u8>> {
    let qb = quant_bytes(dtype)?;
    let bb = qb + 2;
    if !stored.len().is_multiple_of(bb) {
        return None;
    }
    let n = stored.len() / bb;
    let mut out = vec![0u8; stored.len()];
    let (qs, ds) = out.split_at_mut(n * qb);
    for (i, blk) in stored.chunks_exact(bb).enumerate() {
        ds[2 * i..2 * i + 2].copy_from_slice(&blk[..2]);
        qs[qb * i..qb * (i + 1)].copy_from_slice(&blk[2..]);
    }
    Some(out)
}

/// Byte offsets of the quants and the scale of row `o0`'s first block in a packed tensor
/// of `out` rows of `nblk` blocks.
pub fn row_offsets(dtype: DType, out: usize, nblk: usize, o0: usize) -> (usize, usize) {
    let qb = quant_bytes(dtype).unwrap_or(0);
    (o0 * nblk * qb, out * nblk * qb + 2 * o0 * nblk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_moves_the_scales_behind_the_quants() {
        // Two Q4_0 blocks: scales 0x0201 and 0x1211, quants 3.. and 19..
        let mut stored = Vec::new();
        for b in 0..2u8 {
            stored.extend([1 + 16 * b, 2 + 16 * b]);
            stored.extend((0..16).map(|j| 3 + 16 * b + j));
        }
        let p = pack(DType::Q4_0, &stored).unwrap();
        assert_eq!(p.len(), 36);
        assert_eq!(&p[..16], &stored[2..18]);
        assert_eq!(&p[16..32], &stored[20..36]);
        assert_eq!(&p[32..], &[1, 2, 17, 18]);
        assert_eq!(row_offsets(DType::Q4_0, 2, 1, 1), (16, 34));
        assert_eq!(row_offsets(DType::Q8_0, 3, 2, 2), (128, 192 + 8));
        assert!(pack(DType::Q8_0, &[0; 35]).is_none());
        assert!(pack(DType::Q4_K, &[0; 144]).is_none());
        assert_eq!(pack(DType::Q8_0, &[0; 68]).map(|v| v.len()), Some(68));
    }
}
