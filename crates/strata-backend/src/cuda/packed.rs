//! The packed layout of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K, AffineQ4 and
//! I8 weights (kernels/README.md, "Packed weights"): a `[out, in]` tensor's blocks split
//! into their quant bytes (16-byte aligned, block `i` at `i · QB`) followed by their other
//! bytes, the scales, in stored order (block `i` at `out · nblk · QB + MB · i`). The same
//! bytes as the stored tensor, so its size and accounting do not change.

use std::ops::Range;

use strata_tensor::tensor::DType;

/// Where a stored block of a format with a packed layout keeps its quants: the byte
/// range of `quants` in a block of `block` bytes. The other `block - quants.len()` bytes
/// are its scales.
struct Split {
    block: usize,
    quants: Range<usize>,
}

fn split(dtype: DType) -> Option<Split> {
    let (block, quants) = match dtype {
        DType::Q4_0 => (18, 2..18),
        DType::Q4_1 => (20, 4..20),
        DType::Q5_0 => (22, 6..22),
        DType::Q5_1 => (24, 8..24),
        DType::Q8_0 => (34, 2..34),
        DType::Mxfp4 => (17, 1..17),
        DType::Q4_K => (144, 16..144),
        DType::Q5_K => (176, 16..176),
        DType::Q6_K => (210, 0..192),
        DType::AffineQ4 => (68, 4..68),
        DType::I8 => (36, 4..36),
        _ => return None,
    };
    Some(Split { block, quants })
}

/// A format's stored block as the packed layout splits it: `(block bytes, where its
/// quants start, how many bytes they are)`, as `pack_blocks_u8` takes them.
pub fn block_split(dtype: DType) -> Option<(usize, usize, usize)> {
    split(dtype).map(|s| (s.block, s.quants.start, s.quants.len()))
}

/// Bytes of quants per block (`QB`) of a format with a packed layout.
pub fn quant_bytes(dtype: DType) -> Option<usize> {
    split(dtype).map(|s| s.quants.len())
}

/// Bytes of scales per block (`MB`) of a format with a packed layout.
pub fn scale_bytes(dtype: DType) -> Option<usize> {
    split(dtype).map(|s| s.block - s.quants.len())
}

/// `stored` (whole blocks of `dtype`) in the packed layout, or `None` when `dtype` has
/// none or `stored` is not whole blocks.
pub fn pack(dtype: DType, stored: &[u8]) -> Option<Vec<u8>> {
    let Split { block, quants } = split(dtype)?;
    if !stored.len().is_multiple_of(block) {
        return None;
    }
    let (qb, mb) = (quants.len(), block - quants.len());
    let n = stored.len() / block;
    let mut out = vec![0u8; stored.len()];
    let (qs, ds) = out.split_at_mut(n * qb);
    for ((blk, q), d) in stored.chunks_exact(block).zip(qs.chunks_exact_mut(qb)).zip(ds.chunks_exact_mut(mb)) {
        q.copy_from_slice(&blk[quants.clone()]);
        let (before, after) = d.split_at_mut(quants.start);
        before.copy_from_slice(&blk[..quants.start]);
        after.copy_from_slice(&blk[quants.end..]);
    }
    Some(out)
}

/// Byte offsets of the quants and the scales of row `o0`'s first block in a packed
/// tensor of `out` rows of `nblk` blocks.
pub fn row_offsets(dtype: DType, out: usize, nblk: usize, o0: usize) -> (usize, usize) {
    let (qb, mb) = (quant_bytes(dtype).unwrap_or(0), scale_bytes(dtype).unwrap_or(0));
    (o0 * nblk * qb, out * nblk * qb + mb * o0 * nblk)
}

#[cfg(test)]
mod tests {
    use super::super::launch::PACKED_FORMATS;
    use super::*;

    /// `pack_blocks_u8`'s loop (kernels/rows.cu), from `block_split`'s numbers.
    fn pack_as_the_kernel_does(stored: &[u8], (block, q0, q_len): (usize, usize, usize)) -> Vec<u8> {
        let n = stored.len() / block;
        let mut dst = vec![0u8; stored.len()];
        for (i, s) in stored.chunks_exact(block).enumerate() {
            dst[i * q_len..][..q_len].copy_from_slice(&s[q0..q0 + q_len]);
            let m = n * q_len + i * (block - q_len);
            dst[m..m + q0].copy_from_slice(&s[..q0]);
            dst[m + q0..m + block - q_len].copy_from_slice(&s[q0 + q_len..]);
        }
        dst
    }

    #[test]
    fn the_device_repack_gives_the_upload_repack_s_bytes() {
        for dtype in PACKED_FORMATS {
            let split = block_split(dtype).unwrap();
            let stored: Vec<u8> = (0..split.0 * 7).map(|i| (i * 31 % 251) as u8).collect();
            assert_eq!(pack_as_the_kernel_does(&stored, split), pack(dtype, &stored).unwrap(), "{dtype:?}");
        }
        assert!(block_split(DType::F16).is_none());
    }

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
        assert!(pack(DType::Q8_1, &[0; 36]).is_none());
        assert_eq!(pack(DType::Q8_0, &[0; 68]).map(|v| v.len()), Some(68));
    }

    /// Two stored blocks whose byte `j` of block `b` is `b * 0x80 + j % 0x80` (as u8, so
    /// every byte says where it came from).
    fn numbered(block: usize) -> Vec<u8> {
        (0..2).flat_map(|b| (0..block).map(move |j| (b * 0x80 + j % 0x80) as u8)).collect()
    }

    #[test]
    fn q4_k_keeps_its_128_quant_bytes_and_moves_d_dmin_and_scales_behind() {
        let stored = numbered(144);
        let p = pack(DType::Q4_K, &stored).unwrap();
        assert_eq!(p.len(), 288);
        assert_eq!(&p[..128], &stored[16..144]);
        assert_eq!(&p[128..256], &stored[160..288]);
        assert_eq!(&p[256..272], &stored[..16]);
        assert_eq!(&p[272..], &stored[144..160]);
        assert_eq!((quant_bytes(DType::Q4_K), scale_bytes(DType::Q4_K)), (Some(128), Some(16)));
        // Row 1 of a 3-row tensor of 2 super-blocks a row.
        assert_eq!(row_offsets(DType::Q4_K, 3, 2, 1), (256, 768 + 32));
        assert!(pack(DType::Q4_K, &[0; 145]).is_none());
    }

    #[test]
    fn q5_k_keeps_qh_and_qs_and_moves_d_dmin_and_scales_behind() {
        let stored = numbered(176);
        let p = pack(DType::Q5_K, &stored).unwrap();
        assert_eq!(p.len(), 352);
        assert_eq!(&p[..160], &stored[16..176]);
        assert_eq!(&p[160..320], &stored[192..352]);
        assert_eq!(&p[320..336], &stored[..16]);
        assert_eq!(&p[336..], &stored[176..192]);
        assert_eq!((quant_bytes(DType::Q5_K), scale_bytes(DType::Q5_K)), (Some(160), Some(16)));
        assert_eq!(row_offsets(DType::Q5_K, 3, 2, 1), (320, 960 + 32));
    }

    #[test]
    fn blocks_whose_quants_come_last_keep_them_and_move_their_scales_behind() {
        // Q4_1 d, m; Q5_0 d, qh; Q5_1 d, m, qh; MXFP4 its exponent byte; I8 its f32 scale;
        // AffineQ4 its f16 scale and bias (64 quant bytes: four 16-byte loads a block).
        let formats = [(DType::Q4_1, 20, 16), (DType::Q5_0, 22, 16), (DType::Q5_1, 24, 16), (DType::Mxfp4, 17, 16)];
        for (dtype, block, qb) in formats.into_iter().chain([(DType::I8, 36, 32), (DType::AffineQ4, 68, 64)]) {
            let stored = numbered(block);
            let p = pack(dtype, &stored).unwrap();
            let mb = block - qb;
            assert_eq!(&p[..qb], &stored[mb..block], "{dtype:?}");
            assert_eq!(&p[qb..2 * qb], &stored[block + mb..], "{dtype:?}");
            assert_eq!(&p[2 * qb..2 * qb + mb], &stored[..mb], "{dtype:?}");
            assert_eq!(&p[2 * qb + mb..], &stored[block..block + mb], "{dtype:?}");
            assert_eq!((quant_bytes(dtype), scale_bytes(dtype)), (Some(qb), Some(mb)));
            assert!(pack(dtype, &stored[1..]).is_none(), "{dtype:?}");
        }
        assert_eq!(row_offsets(DType::Q5_0, 3, 2, 1), (32, 96 + 12));
        // Row 2 of a 3-row MXFP4 tensor of 4 blocks a row.
        assert_eq!(row_offsets(DType::Mxfp4, 3, 4, 2), (128, 192 + 8));
        assert_eq!(row_offsets(DType::I8, 3, 4, 2), (256, 384 + 32));
        assert_eq!(row_offsets(DType::AffineQ4, 3, 2, 1), (128, 384 + 8));
    }

    #[test]
    fn q6_k_keeps_ql_and_qh_and_moves_scales_and_d_behind() {
        let stored = numbered(210);
        let p = pack(DType::Q6_K, &stored).unwrap();
        assert_eq!(p.len(), 420);
        assert_eq!(&p[..192], &stored[..192]);
        assert_eq!(&p[192..384], &stored[210..402]);
        assert_eq!(&p[384..402], &stored[192..210]);
        assert_eq!(&p[402..], &stored[402..]);
        assert_eq!((quant_bytes(DType::Q6_K), scale_bytes(DType::Q6_K)), (Some(192), Some(18)));
        assert_eq!(row_offsets(DType::Q6_K, 2, 3, 1), (576, 1152 + 54));
        // The scales start 16-byte aligned after the quants of every format.
        for d in PACKED_FORMATS {
            assert_eq!(quant_bytes(d).unwrap() % 16, 0, "{d:?}");
            assert_eq!(split(d).map(|s| s.block), Some(d.block_bytes()), "{d:?}");
        }
    }
}
