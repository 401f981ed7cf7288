//! The AVX2 panel kernels: the panel layout read 8 rows a register.

use std::arch::x86_64::*;

use super::imp::{BYTE_IDX, MXFP4, MXFP4_U, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0};
use super::{ACT_BLOCK, K6_LINE, Kernels};

/// Bytes ahead of the current block to prefetch.
const PREFETCH: usize = 2048;

/// The kernels of format `F`. Batches read side by side up to 7 rows (the 32-value
/// formats) or 3 (the K-quants), in turn beyond: with 16 registers, the 8-row tile in
/// turn beat pairs side by side at 8 rows, and the K-quants' pairs lost from 4 (AMD
/// EPYC VM capped to AVX2, docs/benchmarks.md).
pub fn kernels<const F: u8>() -> Kernels {
    Kernels {
        rows: [rows::<F, 8>, rows::<F, 4>, rows::<F, 2>, rows::<F, 1>],
        side_by_side: [side_by_side::<F, 2>, side_by_side::<F, 1>],
        side_rows: if F >= Q4_K { 3 } else { 7 },
    }
}

/// The 4 bytes at `p` in every 32-bit lane.
///
/// # Safety
/// 4 readable bytes at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn word(p: *const u8) -> __m256i {
    // SAFETY: the caller's 4 bytes.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Half `h` (rows `8h..8h + 8`) of a block's 8 level registers, in the order of the
/// activation words they meet: Q4 nibbles (unsigned), Q8_0 levels (signed).
///
/// # Safety
/// The block's lines readable at `wp`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn levels<const F: u8>(wp: *const u8, h: usize) -> [__m256i; 8] {
    let mut u = [_mm256_setzero_si256(); 8];
    // SAFETY: the caller's lines.
    unsafe {
        if F == Q8_0 {
            for s in 0..8 {
                u[s] = _mm256_loadu_si256(wp.add(64 * s + 32 * h).cast());
            }
            return u;
        }
        let nib = _mm256_set1_epi8(0x0F);
        for s in 0..4 {
            let v = _mm256_loadu_si256(wp.add(64 * s + 32 * h).cast());
            u[s] = _mm256_and_si256(v, nib);
            u[s + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
        }
        if F == MXFP4 {
            let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_U.as_ptr().cast()));
            for x in &mut u {
                *x = _mm256_shuffle_epi8(lut, *x);
            }
        }
        u
    }
}

/// A block's integer sum `Σ w·a` for 8 rows (Q4_0: with the activation's `−8·Σa`;
/// Q4_1: without its min).
///
/// # Safety
/// AVX2; a packed activation block at `ap`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_sum<const F: u8>(u: &[__m256i; 8], ap: *const u8) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    // SAFETY: the caller's activation block.
    unsafe {
        if F == Q8_0 {
            let mut i = _mm256_setzero_si256();
            for s in 0..8 {
                let p = _mm256_maddubs_epi16(_mm256_sign_epi8(u[s], u[s]), _mm256_sign_epi8(word(ap.add(4 * s)), u[s]));
                i = _mm256_add_epi32(i, _mm256_madd_epi16(p, ones));
            }
            return i;
        }
        if F == MXFP4 {
            // Levels up to 24: eight words' pairs would pass i16, so each widens at once.
            let mut i = word(ap.add(32));
            for s in 0..8 {
                i = _mm256_add_epi32(i, _mm256_madd_epi16(_mm256_maddubs_epi16(u[s], word(ap.add(4 * s))), ones));
            }
            return i;
        }
        let mut p = _mm256_setzero_si256();
        for s in 0..8 {
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[s], word(ap.add(4 * s))));
        }
        let i = _mm256_madd_epi16(p, ones);
        if F == Q4_1 { i } else { _mm256_add_epi32(i, word(ap.add(32))) }
    }
}

super::panel_entry_points!("avx2,fma,f16c");

/// The 8 one-byte exponents at `p` as MXFP4's scales, `2^(e − 128)` (as `imp`'s
/// 16-lane form).
///
/// # Safety
/// 8 readable bytes at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn e8m0_half8(p: *const u8) -> __m256 {
    // SAFETY: the caller's 8 bytes.
    let e = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.cast()) });
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, denormal, small))
}

/// Half `h` (rows `8h..8h + 8`) of line `t` of the block at `p`.
///
/// # Safety
/// 64 readable bytes at `p + 64·t`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn half(p: *const u8, t: usize, h: usize) -> __m256i {
    // SAFETY: the caller's bytes.
    unsafe { _mm256_loadu_si256(p.add(64 * t + 32 * h).cast()) }
}

/// Each 32-bit lane's low byte as the i16 pair `(v, v)` (a `vpmaddwd` factor).
#[target_feature(enable = "avx2")]
#[inline]
fn pair(x: __m256i) -> __m256i {
    _mm256_or_si256(x, _mm256_slli_epi32::<16>(x))
}

/// Bit `j` of each byte of `h` as bit 4 (a Q5_K level's high bit), as `imp`'s: one
/// shift and a mask. `bit4` holds 0x10 in every byte.
#[target_feature(enable = "avx2")]
#[inline]
fn high_bit(h: __m256i, j: usize, bit4: __m256i) -> __m256i {
    let moved = match j {
        ..4 => _mm256_sllv_epi32(h, _mm256_set1_epi32(4 - j as i32)),
        _ => _mm256_srlv_epi32(h, _mm256_set1_epi32(j as i32 - 4)),
    };
    _mm256_and_si256(moved, bit4)
}

/// A Q4_K line 0 half (8 rows' `d | dmin << 16`) as the rows' `d` and `dmin`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn d_dmin(dm: __m256i) -> (__m256, __m256) {
    // Per 128-bit lane: the four `d` halves, then the four `dmin`; then the lanes'
    // `d` quarters together and their `dmin` quarters.
    let idx = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
    );
    let t = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(dm, idx));
    (_mm256_cvtph_ps(_mm256_castsi256_si128(t)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(t)))
}

/// `W` Q4_K panels (`Q5`: Q5_K) × `R` (≤ 4) packed rows, as `imp::tile_k`, a block
/// in two halves of 8 rows: each sub-block's level words meet the row's in
/// `vpmaddubsw` pairs summed in i16 (8 words for 4-bit levels, 2 · 8 · 15 · 128 <
/// 2¹⁵; 4 for Q5_K's 5-bit ones), then `vpmaddwd` against the 6-bit scale as an i16
/// pair widens and scales them at once. The integer sums are `imp::tile_k`'s exactly,
/// and its conversions and FMAs follow, so a row gets the AVX-512 panels' bits.
///
/// # Safety
/// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
#[inline]
unsafe fn tile_k<const Q5: bool, const W: usize, const R: usize>(
    panel: *const u8,
    w_stride: usize,
    nb: usize,
    a: *const u8,
    stride: usize,
    out: *mut f32,
    o_stride: usize,
    os: usize,
) {
    const AB: usize = super::ACT_K;
    let (block, qs, fold) = if Q5 { (16 * 176, 12, 4) } else { (16 * 144, 4, 8) };
    let (nib, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let (k1, k2, k3) = (_mm256_set1_epi32(0x3f3f_3f3f), _mm256_set1_epi32(0x0f0f_0f0f), _mm256_set1_epi32(0x0303_0303));
    let (byte, pairs) = (_mm256_set1_epi32(0xFF), _mm256_set1_epi32(0x00FF_00FF));
    let zero = _mm256_setzero_si256();
    let mut acc = [[[_mm256_setzero_ps(); 2]; R]; W];
    // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
    // prefetches never fault; stores go to the caller's outputs.
    unsafe {
        for b in 0..nb {
            for h in 0..2 {
                let mut sumi = [[zero; R]; W];
                for n in 0..4 {
                    for j in 0..W {
                        let wp = panel.add(j * w_stride + block * b);
                        if h == 0 {
                            let per = if Q5 { 11 } else { 9 };
                            for l in per * n..per * (n + 1) {
                                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * l).cast());
                            }
                        }
                        // Sub-blocks 2n and 2n + 1's scales, as in `imp::tile_k`.
                        let u0 = half(wp, 1, h);
                        let scales = if n < 2 {
                            _mm256_and_si256(u0, k1)
                        } else {
                            _mm256_or_si256(
                                _mm256_and_si256(half(wp, 3, h), k2),
                                _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u0), k3)),
                            )
                        };
                        let pick = _mm256_srl_epi32(scales, _mm_cvtsi32_si128(16 * (n % 2) as i32));
                        let s_lo = pair(_mm256_and_si256(pick, byte));
                        let s_hi = pair(_mm256_and_si256(_mm256_srli_epi32::<8>(pick), byte));
                        let (mut lo, mut hi) = ([zero; R], [zero; R]);
                        for s in 0..8 {
                            let v = half(wp, qs + 8 * n + s, h);
                            let (mut vl, mut vh) =
                                (_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
                            if Q5 {
                                let hb = half(wp, 4 + s, h);
                                vl = _mm256_or_si256(vl, high_bit(hb, 2 * n, bit4));
                                vh = _mm256_or_si256(vh, high_bit(hb, 2 * n + 1, bit4));
                            }
                            for r in 0..R {
                                let ap = a.add(r * stride + AB * b + 4 + 64 * n + 4 * s);
                                lo[r] = _mm256_add_epi16(lo[r], _mm256_maddubs_epi16(vl, word(ap)));
                                hi[r] = _mm256_add_epi16(hi[r], _mm256_maddubs_epi16(vh, word(ap.add(32))));
                            }
                            if (s + 1) % fold == 0 {
                                for r in 0..R {
                                    let t = _mm256_add_epi32(
                                        _mm256_madd_epi16(lo[r], s_lo),
                                        _mm256_madd_epi16(hi[r], s_hi),
                                    );
                                    sumi[j][r] = _mm256_add_epi32(sumi[j][r], t);
                                    (lo[r], hi[r]) = (zero, zero);
                                }
                            }
                        }
                    }
                }
                for j in 0..W {
                    let wp = panel.add(j * w_stride + block * b);
                    let (d, dmin) = d_dmin(half(wp, 0, h));
                    let (u1, u2) = (half(wp, 2, h), half(wp, 3, h));
                    let m_lo = _mm256_and_si256(u1, k1);
                    let m_hi = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi32::<4>(u2), k2),
                        _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u1), k3)),
                    );
                    let mins = [
                        _mm256_and_si256(m_lo, pairs),
                        _mm256_and_si256(_mm256_srli_epi32::<8>(m_lo), pairs),
                        _mm256_and_si256(m_hi, pairs),
                        _mm256_and_si256(_mm256_srli_epi32::<8>(m_hi), pairs),
                    ];
                    for r in 0..R {
                        let ap = a.add(r * stride + AB * b);
                        let mut summ = zero;
                        for (w, m) in mins.into_iter().enumerate() {
                            let t = _mm256_madd_epi16(m, word(ap.add(4 + super::QK_K + 4 * w)));
                            summ = _mm256_add_epi32(summ, t);
                        }
                        let da = _mm256_set1_ps(ap.cast::<f32>().read_unaligned());
                        let acc = &mut acc[j][r][h];
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j][r]), _mm256_mul_ps(d, da), *acc);
                        *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmin, da), *acc);
                    }
                }
            }
        }
        store(acc, out, o_stride, os);
    }
}

/// The byte of each 32-bit lane of `w` that `i` (a row of `BYTE_IDX`) picks, as an
/// i16 pair `(sc, sc)` sign-extended.
#[target_feature(enable = "avx2")]
#[inline]
fn byte_pair(w: __m256i, i: __m256i) -> __m256i {
    _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(w, i))
}

/// `W` Q6_K panels × `R` (≤ 4) packed rows, as `imp::tile_k6`, a block in two halves
/// of 8 rows (`vpdpwssd` as `vpmaddwd` and an add: the same exact i32 sums), so a row
/// gets the AVX-512 panels' bits.
///
/// # Safety
/// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
#[inline]
unsafe fn tile_k6<const W: usize, const R: usize>(
    panel: *const u8,
    w_stride: usize,
    nb: usize,
    a: *const u8,
    stride: usize,
    out: *mut f32,
    o_stride: usize,
    os: usize,
) {
    const AB: usize = super::ACT_K6;
    const BLOCK_K6: usize = 16 * 210;
    let (nib, high) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let zero = _mm256_setzero_si256();
    let mut acc = [[[_mm256_setzero_ps(); 2]; R]; W];
    // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
    // prefetches never fault; stores go to the caller's outputs.
    unsafe {
        let idx = BYTE_IDX.map(|t| _mm256_loadu_si256(t.as_ptr().cast()));
        for b in 0..nb {
            for h in 0..2 {
                let mut sumi = [[zero; R]; W];
                for n in 0..2 {
                    for hh in 0..2 {
                        for j in 0..W {
                            let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                            if h == 0 {
                                let c = 2 * n + hh;
                                for l in 13 * c..13 * c + 13 {
                                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * l).cast());
                                }
                            }
                            let (wa, wb) = (half(wp, K6_LINE[48 + 2 * n], h), half(wp, K6_LINE[49 + 2 * n], h));
                            let sc = [
                                byte_pair(wa, idx[hh]),
                                byte_pair(wa, idx[2 + hh]),
                                byte_pair(wb, idx[hh]),
                                byte_pair(wb, idx[2 + hh]),
                            ];
                            for s in 4 * hh..4 * hh + 4 {
                                let (ql0, ql1) =
                                    (half(wp, K6_LINE[16 * n + s], h), half(wp, K6_LINE[16 * n + 8 + s], h));
                                let qh = half(wp, K6_LINE[32 + 8 * n + s], h);
                                let v = [
                                    _mm256_or_si256(
                                        _mm256_and_si256(ql0, nib),
                                        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), high),
                                    ),
                                    _mm256_or_si256(
                                        _mm256_and_si256(ql1, nib),
                                        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), high),
                                    ),
                                    _mm256_or_si256(
                                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), nib),
                                        _mm256_and_si256(qh, high),
                                    ),
                                    _mm256_or_si256(
                                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), nib),
                                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), high),
                                    ),
                                ];
                                for r in 0..R {
                                    let ap = a.add(r * stride + AB * b + 4 + 128 * n + 4 * s);
                                    for t in 0..4 {
                                        let p = _mm256_maddubs_epi16(v[t], word(ap.add(32 * t)));
                                        sumi[j][r] = _mm256_add_epi32(sumi[j][r], _mm256_madd_epi16(p, sc[t]));
                                    }
                                }
                            }
                        }
                    }
                }
                for j in 0..W {
                    let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(64 * 52 + 16 * h).cast()));
                    for r in 0..R {
                        let ap = a.add(r * stride + AB * b);
                        let mut summ = zero;
                        for q in 0..4 {
                            let w = half(wp, K6_LINE[48 + q], h);
                            let (even, odd) =
                                (_mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w)), _mm256_srai_epi16::<8>(w));
                            let e = _mm256_madd_epi16(even, word(ap.add(4 + super::QK_K + 8 * q)));
                            let o = _mm256_madd_epi16(odd, word(ap.add(8 + super::QK_K + 8 * q)));
                            summ = _mm256_add_epi32(summ, _mm256_add_epi32(e, o));
                        }
                        let total = _mm256_sub_epi32(sumi[j][r], _mm256_slli_epi32::<5>(summ));
                        let da = _mm256_set1_ps(ap.cast::<f32>().read_unaligned());
                        let acc = &mut acc[j][r][h];
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, da), *acc);
                    }
                }
            }
        }
        store(acc, out, o_stride, os);
    }
}

/// Each (panel `j`, row `r`) pair's two halves to `out + j·o_stride + r·os`.
///
/// # Safety
/// Those 16 floats writable for each pair.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store<const W: usize, const R: usize>(acc: [[[__m256; 2]; R]; W], out: *mut f32, o_stride: usize, os: usize) {
    // SAFETY: the caller's outputs.
    unsafe {
        for j in 0..W {
            for r in 0..R {
                for h in 0..2 {
                    _mm256_storeu_ps(out.add(j * o_stride + r * os + 8 * h), acc[j][r][h]);
                }
            }
        }
    }
}

/// `W` panels × `R` packed rows, as `imp::tile`, in two halves of 8 rows.
///
/// # Safety
/// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
#[inline]
unsafe fn tile<const F: u8, const W: usize, const R: usize>(
    panel: *const u8,
    w_stride: usize,
    nb: usize,
    a: *const u8,
    stride: usize,
    out: *mut f32,
    o_stride: usize,
    os: usize,
) {
    let lines = if F == Q8_0 { 8 } else { 4 };
    let min = F == Q4_1;
    let block = 64 * lines
        + match (min, F == MXFP4) {
            (true, _) => 64,
            (_, true) => 16,
            _ => 32,
        };
    let mut acc = [[[_mm256_setzero_ps(); 2]; R]; W];
    // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
    // prefetches never fault; stores go to the caller's outputs.
    unsafe {
        for b in 0..nb {
            for j in 0..W {
                let wp = panel.add(j * w_stride + block * b);
                for line in 0..lines {
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * line).cast());
                }
                let sp = wp.add(64 * lines);
                for h in 0..2 {
                    let u = levels::<F>(wp, h);
                    let dw = match F == MXFP4 {
                        true => e8m0_half8(sp.add(8 * h)),
                        false => _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h).cast())),
                    };
                    let mw = if min { _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h).cast())) } else { dw };
                    for r in 0..R {
                        let ap = a.add(r * stride + ACT_BLOCK * b);
                        let i = block_sum::<F>(&u, ap);
                        let sc = _mm256_mul_ps(dw, _mm256_set1_ps(ap.add(36).cast::<f32>().read_unaligned()));
                        let acc = &mut acc[j][r][h];
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, *acc);
                        if min {
                            *acc = _mm256_fmadd_ps(mw, _mm256_castsi256_ps(word(ap.add(32))), *acc);
                        }
                    }
                }
            }
        }
        store(acc, out, o_stride, os);
    }
}

/// The AVX2 prompt GEMM's unpacker for a panel of format `F` (`lanes` is 16): the
/// lines, scales and negated mins `gemm256`'s row unpacker makes (Q8_0's levels
/// signed), read without gathers.
///
/// # Safety
/// As for [`UnpackFn`](crate::gemm::UnpackFn), with `w` a whole panel.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn unpack<const F: u8>(
    w: *const u8,
    _row_bytes: usize,
    _lanes: usize,
    nb: usize,
    levels: *mut u8,
    dw: *mut f32,
    mw: *mut f32,
) {
    let lines = if F == Q8_0 { 8 } else { 4 };
    let min = F == Q4_1;
    let block = 64 * lines + if min { 64 } else { 32 };
    // SAFETY: reads inside the panel, writes group `b` of the caller's buffers.
    unsafe {
        for b in 0..nb {
            let sp = w.add(block * b + 64 * lines);
            for h in 0..2 {
                _mm256_store_ps(dw.add(16 * b + 8 * h), _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h).cast())));
                if min {
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h).cast()));
                    _mm256_store_ps(mw.add(16 * b + 8 * h), _mm256_sub_ps(_mm256_setzero_ps(), m));
                }
                for (t, v) in self::levels::<F>(w.add(block * b), h).into_iter().enumerate() {
                    _mm256_store_si256(levels.add(64 * (8 * b + t) + 32 * h).cast(), v);
                }
            }
        }
    }
}
