//! Q4_0 weights repacked for the CPU as panels of 16 rows, so that one vector lane is
//! one weight row.
//!
//! The row-major decode tile ([`simd::dec512`](super::simd)) spends, per block and
//! activation row, a `vpermt2b` gather, an int→float conversion, a scale multiply and an
//! FMA on 4 lanes, and sums 16 lanes at the end. With 16 rows interleaved, each
//! `vpdpbusd` takes 4 levels of every row of the panel against one broadcast activation
//! word, and a block's conversion, scale multiply and FMA serve all 16 rows at once:
//! about half the vector operations per multiply-add, and no horizontal sums.
//!
//! A panel of `nb` blocks per row holds, for block `b`, 4 lines of 64 bytes at `256·b`
//! (line `s`, bytes `4i..4i + 4`: row `i`'s packed levels `qs[4s..4s + 4]`, so its low
//! nibbles are values `4s..4s + 4` and its high nibbles `16 + 4s..`), then after all
//! blocks the scales, 16 f16 per block at `256·nb + 32·b`. That is `16·nb·18` bytes,
//! what the 16 rows take as stored, and line `s` of block `b` is exactly the 32-bit
//! gather the prompt GEMM makes from row-major rows, so the GEMM unpacks a panel with the
//! same operations and results, minus the gathers.
//!
//! Each row's sum is `Σ_b cvt(i_b)·(d_b·da_b)` added block after block into one lane
//! (FMA), whatever the number of activation rows run at once, so a batch of decoding
//! sequences gets each sequence's bits as alone.

use crate::quant::QK;
use crate::quant::q8_0::BlockQ8_0;
use crate::tensor::DType;

/// Weight rows per panel.
pub(crate) const ROWS: usize = 16;

/// Bytes of one packed activation block: its 32 levels, `−8·Σ levels` (i32) and its
/// scale (f32).
pub(crate) const ACT_BLOCK: usize = 40;

/// Whether a weight of `dtype` and `shape` is kept as panels on this CPU: Q4_0 `[m, k]`
/// with `m` a multiple of 16, where the AVX-512 VBMI kernels run (and the instruction
/// set is not capped below them).
pub(crate) fn eligible(dtype: DType, shape: &[usize]) -> bool {
    let &[m, k] = shape else { return false };
    dtype == DType::Q4_0
        && m > 0
        && m.is_multiple_of(ROWS)
        && k > 0
        && k.is_multiple_of(QK)
        && super::QuantKernel::best().decode_fn(DType::Q4_0).is_some()
}

/// Repacks `src`, `m` rows of `k` values of Q4_0 as stored, into panels in `dst` (the
/// same length). `m` is a multiple of 16.
pub(crate) fn repack(src: &[u8], m: usize, k: usize, dst: &mut [u8]) {
    let nb = k / QK;
    let row_bytes = nb * 18;
    assert!(m.is_multiple_of(ROWS) && src.len() >= m * row_bytes && dst.len() >= m * row_bytes);
    for (p, out) in dst[..m * row_bytes].chunks_exact_mut(ROWS * row_bytes).enumerate() {
        let (levels, scales) = out.split_at_mut(256 * nb);
        for i in 0..ROWS {
            let row = &src[(p * ROWS + i) * row_bytes..][..row_bytes];
            for (b, blk) in row.chunks_exact(18).enumerate() {
                scales[32 * b + 2 * i..][..2].copy_from_slice(&blk[..2]);
                for s in 0..4 {
                    levels[256 * b + 64 * s + 4 * i..][..4].copy_from_slice(&blk[2 + 4 * s..][..4]);
                }
            }
        }
    }
}

/// Row `r` of a repacked `[m, k]` weight, as stored (its `k / 32` Q4_0 blocks), into
/// `dst`.
pub(crate) fn row(panels: &[u8], k: usize, r: usize, dst: &mut [u8]) {
    let nb = k / QK;
    let (p, i) = (r / ROWS, r % ROWS);
    let panel = &panels[p * ROWS * nb * 18..][..ROWS * nb * 18];
    let (levels, scales) = panel.split_at(256 * nb);
    for (b, blk) in dst[..nb * 18].chunks_exact_mut(18).enumerate() {
        blk[..2].copy_from_slice(&scales[32 * b + 2 * i..][..2]);
        for s in 0..4 {
            blk[2 + 4 * s..][..4].copy_from_slice(&levels[256 * b + 64 * s + 4 * i..][..4]);
        }
    }
}

/// One activation row's Q8_0 blocks packed for [`rows`]: per block its levels, `−8·Σ`
/// levels and scale ([`ACT_BLOCK`] bytes).
pub(crate) fn pack_act(blocks: &[BlockQ8_0], out: &mut [u8]) {
    for (b, dst) in blocks.iter().zip(out.chunks_exact_mut(ACT_BLOCK)) {
        for (d, &q) in dst[..QK].iter_mut().zip(&b.qs) {
            *d = q as u8;
        }
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        dst[QK..QK + 4].copy_from_slice(&(-8 * sum).to_le_bytes());
        dst[QK + 4..QK + 8].copy_from_slice(&b.d.to_f32().to_le_bytes());
    }
}

/// `R` (1, 2, 4 or 8) packed activation rows `stride` bytes apart against one panel of
/// `nb` blocks: `out[r·os + i]` = row `r` · weight row `i`, for `i < 16`.
pub(crate) type PanelFn = unsafe fn(panel: *const u8, nb: usize, a: *const u8, stride: usize, out: *mut f32, os: usize);

/// The panel kernels for 8, 4, 2 and 1 activation rows at once, on CPUs that run them.
pub(crate) fn kernels() -> Option<[PanelFn; 4]> {
    #[cfg(target_arch = "x86_64")]
    {
        if super::QuantKernel::best().decode_fn(DType::Q4_0).is_some() {
            return Some([imp::rows::<8>, imp::rows::<4>, imp::rows::<2>, imp::rows::<1>]);
        }
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The prompt GEMM's unpacker (see [`UnpackFn`](super::gemm::UnpackFn)) for a panel: the
/// lines and scales Q4_0's row-major unpacker makes, read without gathers.
#[cfg(target_arch = "x86_64")]
pub(crate) use imp::unpack as gemm_unpack;

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, reason = "the row index drives several arrays and pointers")]
mod imp {
    use std::arch::x86_64::*;

    use super::ACT_BLOCK;

    /// Bytes ahead of the current block to prefetch.
    const PREFETCH: usize = 2048;

    /// The 4 bytes at `p` in every 32-bit lane (a helper, not a closure: closures do not
    /// share their function's target features).
    ///
    /// # Safety
    /// 4 readable bytes at `p`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn word(p: *const u8) -> __m512i {
        // SAFETY: the caller's 4 bytes.
        unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }

    /// # Safety
    /// `panel` holds a whole panel of `nb` blocks; `a + r·stride` holds `nb` packed
    /// activation blocks for `r < R`; `out[r·os + i]` is writable for `r < R`, `i < 16`;
    /// a CPU with the features enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn rows<const R: usize>(
        panel: *const u8,
        nb: usize,
        a: *const u8,
        stride: usize,
        out: *mut f32,
        os: usize,
    ) {
        let nib = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); R];
        // SAFETY: loads stay inside the panel's `nb` blocks and the activation rows;
        // prefetches never fault; stores go to the caller's outputs.
        unsafe {
            let scales = panel.add(256 * nb);
            for b in 0..nb {
                let wp = panel.add(256 * b);
                for line in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * line).cast());
                }
                let mut lo = [_mm512_setzero_si512(); 4];
                let mut hi = [_mm512_setzero_si512(); 4];
                for s in 0..4 {
                    let v = _mm512_loadu_si512(wp.add(64 * s).cast());
                    lo[s] = _mm512_and_si512(v, nib);
                    hi[s] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                }
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(32 * b).cast()));
                for r in 0..R {
                    let ap = a.add(r * stride + ACT_BLOCK * b);
                    let mut i = word(ap.add(32));
                    for s in 0..4 {
                        i = _mm512_dpbusd_epi32(i, lo[s], word(ap.add(4 * s)));
                        i = _mm512_dpbusd_epi32(i, hi[s], word(ap.add(16 + 4 * s)));
                    }
                    let sc = _mm512_mul_ps(dw, _mm512_set1_ps(ap.add(36).cast::<f32>().read_unaligned()));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sc, acc[r]);
                }
            }
            for r in 0..R {
                _mm512_storeu_ps(out.add(r * os), acc[r]);
            }
        }
    }

    /// See [`gemm_unpack`](super::gemm_unpack): `w` is the panel (`lanes` is 16).
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::quant::gemm::UnpackFn), with `w` a whole panel.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn unpack(
        w: *const u8,
        _row_bytes: usize,
        _lanes: usize,
        nb: usize,
        levels: *mut u8,
        dw: *mut f32,
        _mw: *mut f32,
    ) {
        let nib = _mm512_set1_epi8(0x0F);
        // SAFETY: reads inside the panel, writes group `b` of the caller's buffers.
        unsafe {
            for b in 0..nb {
                let d = _mm256_loadu_si256(w.add(256 * nb + 32 * b).cast());
                _mm512_store_ps(dw.add(16 * b), _mm512_cvtph_ps(d));
                for s in 0..4 {
                    let v = _mm512_loadu_si512(w.add(256 * b + 64 * s).cast());
                    let line = |t: usize| levels.add(64 * (8 * b + t)).cast::<__m512i>();
                    _mm512_store_si512(line(s), _mm512_and_si512(v, nib));
                    _mm512_store_si512(line(s + 4), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::quant::testutil::Rng;
    use crate::quant::{matmul, matmul_rows_alone, q4_0::BlockQ4_0, quantize_matrix};
    use crate::tensor::{AlignedBytes, ByteSource, HostTensor};

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap()
    }

    /// A random Q4_0 `[m, k]` weight (as stored).
    fn weight(pool: &rayon::ThreadPool, rng: &mut Rng, m: usize, k: usize) -> HostTensor {
        let t = quantize_matrix(pool, DType::Q4_0, &rng.vec(m * k, 1.0), m, k).unwrap();
        let b = t.bytes().to_vec();
        HostTensor::new(Arc::new(AlignedBytes::from_slice(&b)), 0, b.len(), DType::Q4_0, vec![m, k])
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    #[test]
    fn rows_come_back_as_stored() {
        let (pool, mut rng) = (pool(), Rng::new(1));
        let (m, k) = (48, 96);
        let w = weight(&pool, &mut rng, m, k);
        let mut panels = vec![0u8; w.byte_len()];
        repack(w.bytes(), m, k, &mut panels);
        assert_ne!(panels, w.bytes(), "the layout moved");
        let row_bytes = w.byte_len() / m;
        let mut row_out = vec![0u8; row_bytes];
        for r in 0..m {
            row(&panels, k, r, &mut row_out);
            assert_eq!(row_out, &w.bytes()[r * row_bytes..(r + 1) * row_bytes], "row {r}");
        }
        // A panel tensor reads its values as the stored one does, across rows too.
        let Some(p) = w.to_panels() else { return };
        assert!(p.is_panels() && p.rows(0, 16).is_none());
        let (mut a, mut b) = (vec![0f32; 3 * k], vec![0f32; 3 * k]);
        w.read_f32(5 * k + 32, &mut a);
        p.read_f32(5 * k + 32, &mut b);
        assert_eq!(bits(&a), bits(&b));
    }

    #[test]
    fn only_q4_0_weights_of_whole_panels_repack() {
        assert!(!eligible(DType::Q4_0, &[40, 64]));
        assert!(!eligible(DType::Q8_0, &[32, 64]));
        assert!(!eligible(DType::Q4_0, &[64]));
        let want = crate::quant::QuantKernel::best().decode_fn(DType::Q4_0).is_some();
        assert_eq!(eligible(DType::Q4_0, &[32, 64]), want);
    }

    /// Each output against the exact sum of llama.cpp's Q4_0 × Q8_0 products
    /// (`Σ_b d·da·Σ (q − 8)·y`, in f64), within f32 rounding of the terms' magnitudes.
    #[test]
    fn the_kernel_matches_the_exact_sum() {
        let Some(fns) = kernels() else { return };
        let (pool, mut rng) = (pool(), Rng::new(2));
        let (m, k) = (32, 320);
        let nb = k / QK;
        let w = weight(&pool, &mut rng, m, k);
        let mut panels = vec![0u8; w.byte_len()];
        repack(w.bytes(), m, k, &mut panels);
        let wb = crate::quant::cast_blocks::<BlockQ4_0>(w.bytes()).unwrap();
        for (n, f) in [8, 4, 2, 1].into_iter().zip(fns) {
            let xs: Vec<Vec<BlockQ8_0>> = (0..n)
                .map(|_| {
                    let x = rng.vec(k, 1.0);
                    let mut b = crate::quant::zeroed_blocks::<BlockQ8_0>(nb);
                    crate::quant::q8_0::quantize(&x, &mut b);
                    b
                })
                .collect();
            let mut acts = vec![0u8; n * nb * ACT_BLOCK];
            for (x, dst) in xs.iter().zip(acts.chunks_exact_mut(nb * ACT_BLOCK)) {
                pack_act(x, dst);
            }
            let mut out = vec![0f32; n * m];
            for p in 0..m / ROWS {
                // SAFETY: a whole panel, `n` packed rows, `n` rows of `m` outputs.
                unsafe {
                    f(
                        panels[p * ROWS * nb * 18..].as_ptr(),
                        nb,
                        acts.as_ptr(),
                        nb * ACT_BLOCK,
                        out.as_mut_ptr().add(p * ROWS),
                        m,
                    )
                };
            }
            for r in 0..n {
                for o in 0..m {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for (wb, xb) in wb[o * nb..(o + 1) * nb].iter().zip(&xs[r]) {
                        let i: i64 = (0..QK / 2)
                            .map(|t| {
                                let q = wb.qs[t];
                                ((q & 15) as i64 - 8) * xb.qs[t] as i64 + ((q >> 4) as i64 - 8) * xb.qs[16 + t] as i64
                            })
                            .sum();
                        let term = wb.d.to_f32() as f64 * xb.d.to_f32() as f64 * i as f64;
                        (exact, mag) = (exact + term, mag + term.abs());
                    }
                    let got = out[r * m + o] as f64;
                    assert!((got - exact).abs() <= 1e-6 * mag, "{n} rows: row {r}, output {o}: {got} against {exact}");
                }
            }
        }
    }

    /// Through the quantized matmul: a batch's rows each get the bits they get alone; the
    /// prompt GEMM gives a panel tensor's rows the bits it gives the stored rows; decode
    /// stays within rounding of the row-major kernels.
    #[test]
    fn panels_through_the_matmul() {
        let (pool, mut rng) = (pool(), Rng::new(3));
        let (m, k) = (96, 576);
        let w = weight(&pool, &mut rng, m, k);
        let Some(p) = w.to_panels() else { return };
        let rows = 11;
        let x = rng.vec(rows * k, 1.0);
        let mut batch = vec![0f32; rows * m];
        matmul_rows_alone(&pool, &x, rows, &p, &mut batch);
        for r in 0..rows {
            let mut one = vec![0f32; m];
            matmul(&pool, &x[r * k..(r + 1) * k], 1, &p, &mut one);
            assert_eq!(bits(&one), bits(&batch[r * m..(r + 1) * m]), "row {r} in a batch");
            let mut stored = vec![0f32; m];
            matmul(&pool, &x[r * k..(r + 1) * k], 1, &w, &mut stored);
            for (a, b) in one.iter().zip(&stored) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "row {r}: {a} against {b}");
            }
        }
        let (mut gp, mut gw) = (vec![0f32; rows * m], vec![0f32; rows * m]);
        matmul(&pool, &x, rows, &p, &mut gp);
        matmul(&pool, &x, rows, &w, &mut gw);
        assert_eq!(bits(&gp), bits(&gw), "the prompt GEMM");
    }
}
