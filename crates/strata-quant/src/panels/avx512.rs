//! The AVX-512 panel kernels (VNNI, VBMI): 16 rows a register.

use std::arch::x86_64::*;

use super::{ACT_BLOCK, K6_LINE};

/// The formats of [`rows`] and [`unpack`].
pub const Q4_0: u8 = 0;
pub const Q4_1: u8 = 1;
pub const Q8_0: u8 = 2;
/// MXFP4 (after the K-quants' 3, 4, 5): Q4_0's lines, its nibbles looked up as the
/// doubled E2M1 values plus 12, and one-byte exponents for scales.
pub const MXFP4: u8 = 6;

/// MXFP4's values ([`KVALUES`](crate::mxfp4::KVALUES)) plus 12, as unsigned levels.
pub(super) const MXFP4_U: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// Bytes ahead of the current block the tiles prefetch, or `None` for no software
/// prefetch, decided once per process: `STRATA_PANEL_PREFETCH=on|off`, else off on
/// AMD CPUs and 2048 bytes ahead elsewhere. On an AMD EPYC VM (2 threads, side by
/// side, 2026-11-28) decode without the prefetches was faster at every format: the
/// 1.1B Q4_0 46.3 → 48.5 tok/s, Q8_0 29.0 → 29.6, Q4_K_M 40.0 → 43.7, SmolLM2 Q4_1
/// 250.5 → 291.0 (docs/benchmarks.md); on the Intel Xeon VMs, where the panels were
/// measured, the prefetch distance changed little, and they keep it.
pub fn prefetch_ahead() -> Option<usize> {
    static AHEAD: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| match strata_tensor::env::PANEL_PREFETCH.switch() {
        Some(false) => None,
        Some(true) => Some(2048),
        None if amd() => None,
        None => Some(2048),
    })
}

/// Prefetches the 64-byte `lines` of the block at `wp`, `ahead` bytes further on (none
/// when `ahead` is `None`, see [`prefetch_ahead`]). Prefetches never fault.
#[target_feature(enable = "sse")]
#[inline]
fn prefetch_lines(wp: *const u8, ahead: Option<usize>, lines: std::ops::Range<usize>) {
    if let Some(pf) = ahead {
        for l in lines {
            _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(pf + 64 * l).cast());
        }
    }
}

/// Whether the CPU says it is AMD's (`cpuid` leaf 0 vendor "AuthenticAMD").
fn amd() -> bool {
    let id = __cpuid(0);
    [id.ebx, id.edx, id.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163]
}

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

/// A block's 8 level registers (unsigned: Q4 nibbles; Q8_0 levels plus 128), in the
/// order of the activation words they meet (values 0..4, 4..8, ...), from its lines
/// at `wp`.
///
/// # Safety
/// The block's lines readable at `wp`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn levels<const F: u8>(wp: *const u8) -> [__m512i; 8] {
    let mut u = [_mm512_setzero_si512(); 8];
    // SAFETY: the caller's lines.
    unsafe {
        if F == Q8_0 {
            for s in 0..8 {
                u[s] = _mm512_xor_si512(_mm512_loadu_si512(wp.add(64 * s).cast()), _mm512_set1_epi8(-128));
            }
            return u;
        }
        let nib = _mm512_set1_epi8(0x0F);
        for s in 0..4 {
            let v = _mm512_loadu_si512(wp.add(64 * s).cast());
            u[s] = _mm512_and_si512(v, nib);
            u[s + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
        }
        if F == MXFP4 {
            let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_U.as_ptr().cast()));
            for x in &mut u {
                *x = _mm512_shuffle_epi8(lut, *x);
            }
        }
        u
    }
}

super::panel_entry_points!("avx512f,avx512bw,avx512vl,avx512vnni,f16c");

/// `W` panels (`w_stride` bytes apart) × `R` packed rows: each (panel, row) pair takes
/// exactly the operations it takes alone, so every path gives a row the same bits.
///
/// # Safety
/// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
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
    let mut acc = [[_mm512_setzero_ps(); R]; W];
    let ahead = prefetch_ahead();
    // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
    // prefetches never fault; stores go to the caller's outputs.
    unsafe {
        for b in 0..nb {
            for j in 0..W {
                let wp = panel.add(j * w_stride + block * b);
                prefetch_lines(wp, ahead, 0..lines);
                let u = levels::<F>(wp);
                let sp = wp.add(64 * lines);
                let dw = if F == MXFP4 { e8m0_half16(sp) } else { _mm512_cvtph_ps(_mm256_loadu_si256(sp.cast())) };
                let mw = if min { _mm512_cvtph_ps(_mm256_loadu_si256(sp.add(32).cast())) } else { dw };
                for r in 0..R {
                    let ap = a.add(r * stride + ACT_BLOCK * b);
                    let mut i = if min { _mm512_setzero_si512() } else { word(ap.add(32)) };
                    for s in 0..8 {
                        i = _mm512_dpbusd_epi32(i, u[s], word(ap.add(4 * s)));
                    }
                    let sc = _mm512_mul_ps(dw, _mm512_set1_ps(ap.add(36).cast::<f32>().read_unaligned()));
                    acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sc, acc[j][r]);
                    if min {
                        acc[j][r] = _mm512_fmadd_ps(mw, _mm512_castsi512_ps(word(ap.add(32))), acc[j][r]);
                    }
                }
            }
        }
        for j in 0..W {
            for r in 0..R {
                _mm512_storeu_ps(out.add(j * o_stride + r * os), acc[j][r]);
            }
        }
    }
}

/// The 16 one-byte exponents at `p` as MXFP4's scales, `2^(e − 128)` (ggml's
/// `e8m0_to_fp32_half`: `e < 2` are denormals `2^-128`, `2^-127`).
///
/// # Safety
/// 16 readable bytes at `p`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn e8m0_half16(p: *const u8) -> __m512 {
    // SAFETY: the caller's 16 bytes.
    let e = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) });
    let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
    let denormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, denormal))
}

/// Line `t` (64 bytes) at `p`.
///
/// # Safety
/// 64 readable bytes at `p + 64·t`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn line(p: *const u8, t: usize) -> __m512i {
    // SAFETY: the caller's bytes.
    unsafe { _mm512_loadu_si512(p.add(64 * t).cast()) }
}

/// Bit `j` of each byte of `h` as bit 4 (a Q5_K level's high bit; a helper: closures
/// lose target features): one shift of the whole lane and a mask, since no other
/// bit of the lane lands on a byte's bit 4. `bit4` holds 0x10 in every byte.
#[target_feature(enable = "avx512f")]
#[inline]
fn high_bit(h: __m512i, j: usize, bit4: __m512i) -> __m512i {
    let moved = match j {
        ..4 => _mm512_sllv_epi32(h, _mm512_set1_epi32(4 - j as i32)),
        _ => _mm512_srlv_epi32(h, _mm512_set1_epi32(j as i32 - 4)),
    };
    _mm512_and_si512(moved, bit4)
}

/// The K-quant formats of [`rows`] and [`side_by_side`] (after the 32-value ones).
pub const Q4_K: u8 = 3;
pub const Q6_K: u8 = 4;
pub const Q5_K: u8 = 5;

/// `W` Q4_K panels (`Q5`: Q5_K) × `R` (≤ 4) packed rows. Per block, panel and row:
/// each sub-block's 8 `vpdpbusd` dot (levels 0..15, or Q5_K's 0..31, against the
/// row's levels) times its 6-bit scale, summed exactly in i32 (`Σ sc_j·dot_j`), and
/// the mins against the sub-block sums likewise (`Σ m_j·S_j`, in `vpdpwssd` pairs); then
/// `acc += d·da·Σ − dmin·da·Σ'` as two roundings. The integer sums do not depend on
/// the order of anything, so every (panel, row) pair gets the same bits whatever
/// else runs beside it.
///
/// Side by side, each block is read a quarter (two sub-blocks, 8 lines) of each
/// panel in turn: a whole 2304-byte block of one stream, then of the next, read
/// memory a fifth slower than rows do, where quarters read it faster.
///
/// # Safety
/// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
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
    // Q5_K: the levels' high bits in lines 4..12 (`qh`), the low nibbles from line 12.
    let (block, qs) = if Q5 { (16 * 176, 12) } else { (16 * 144, 4) };
    let (nib, bit4) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    let (k1, k2, k3) = (_mm512_set1_epi32(0x3f3f_3f3f), _mm512_set1_epi32(0x0f0f_0f0f), _mm512_set1_epi32(0x0303_0303));
    let (byte, pair) = (_mm512_set1_epi32(0xFF), _mm512_set1_epi32(0x00FF_00FF));
    let mut acc = [[_mm512_setzero_ps(); R]; W];
    let ahead = prefetch_ahead();
    // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
    // prefetches never fault; stores go to the caller's outputs.
    unsafe {
        for b in 0..nb {
            let mut sumi = [[_mm512_setzero_si512(); R]; W];
            for n in 0..4 {
                for j in 0..W {
                    let wp = panel.add(j * w_stride + block * b);
                    let per = if Q5 { 11 } else { 9 };
                    prefetch_lines(wp, ahead, per * n..per * (n + 1));
                    // Lines 1..4: each row's 12 scale bytes, unpacked as ggml's
                    // `get_scale_min_k4` does (scales 0..4 in the bytes of `u0 & k1`,
                    // 4..8 in the bytes made from `u2` and `u0`'s top bits).
                    let u0 = line(wp, 1);
                    let scales = if n < 2 {
                        _mm512_and_si512(u0, k1)
                    } else {
                        _mm512_or_si512(
                            _mm512_and_si512(line(wp, 3), k2),
                            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3)),
                        )
                    };
                    // Sub-blocks 2n (low nibbles of lines 4 + 8n..) and 2n + 1 (high).
                    let (mut lo, mut hi) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
                    for s in 0..8 {
                        let v = line(wp, qs + 8 * n + s);
                        let (mut vl, mut vh) =
                            (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
                        if Q5 {
                            // Bit j of `qh` byte l is the high bit of value 32j + l.
                            let h = line(wp, 4 + s);
                            vl = _mm512_or_si512(vl, high_bit(h, 2 * n, bit4));
                            vh = _mm512_or_si512(vh, high_bit(h, 2 * n + 1, bit4));
                        }
                        for r in 0..R {
                            let ap = a.add(r * stride + AB * b + 4 + 64 * n + 4 * s);
                            lo[r] = _mm512_dpbusd_epi32(lo[r], vl, word(ap));
                            hi[r] = _mm512_dpbusd_epi32(hi[r], vh, word(ap.add(32)));
                        }
                    }
                    let sh = 16 * (n % 2) as i32;
                    let s_lo = _mm512_and_si512(_mm512_srlv_epi32(scales, _mm512_set1_epi32(sh)), byte);
                    let s_hi = _mm512_and_si512(_mm512_srlv_epi32(scales, _mm512_set1_epi32(sh + 8)), byte);
                    for r in 0..R {
                        let t = _mm512_add_epi32(_mm512_mullo_epi32(lo[r], s_lo), _mm512_mullo_epi32(hi[r], s_hi));
                        sumi[j][r] = _mm512_add_epi32(sumi[j][r], t);
                    }
                }
            }
            for j in 0..W {
                let wp = panel.add(j * w_stride + block * b);
                // Line 0: each row's (d, dmin). The mins (lines 2 and 3, with line 1's
                // top bits) as i16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7), as the
                // packed sums are.
                let dm = line(wp, 0);
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
                let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm)));
                let (u1, u2) = (line(wp, 2), line(wp, 3));
                let m_lo = _mm512_and_si512(u1, k1);
                let m_hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2),
                    _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)),
                );
                let mins = [
                    _mm512_and_si512(m_lo, pair),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(m_lo), pair),
                    _mm512_and_si512(m_hi, pair),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(m_hi), pair),
                ];
                for r in 0..R {
                    let ap = a.add(r * stride + AB * b);
                    let mut summ = _mm512_setzero_si512();
                    for (w, m) in mins.into_iter().enumerate() {
                        summ = _mm512_dpwssd_epi32(summ, m, word(ap.add(4 + super::QK_K + 4 * w)));
                    }
                    let da = _mm512_set1_ps(ap.cast::<f32>().read_unaligned());
                    acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j][r]), _mm512_mul_ps(d, da), acc[j][r]);
                    acc[j][r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dmin, da), acc[j][r]);
                }
            }
        }
        for j in 0..W {
            for r in 0..R {
                _mm512_storeu_ps(out.add(j * o_stride + r * os), acc[j][r]);
            }
        }
    }
}

/// Bytes of a Q6_K panel block: 16 stored blocks of 210 bytes, as 52 lines and the
/// rows' 16 `d`.
const BLOCK_K6: usize = 16 * 210;

/// `vpshufb` indices that copy byte `b` of each 32-bit lane into all four of its
/// bytes (then `>> 8` per i16 makes the i16 pair `(sc, sc)`, sign-extended).
pub static BYTE_IDX: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut b = 0;
    while b < 4 {
        let mut i = 0;
        while i < 64 {
            t[b][i] = ((i % 16) / 4 * 4 + b) as u8;
            i += 1;
        }
        b += 1;
    }
    t
};

/// The byte of each 32-bit lane of `w` that `i` (a row of [`BYTE_IDX`]) picks, as an
/// i16 pair `(sc, sc)` sign-extended (a helper: closures lose target features).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn byte_pair(w: __m512i, i: __m512i) -> __m512i {
    _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(w, i))
}

/// `W` Q6_K panels × `R` (≤ 4) packed rows. Per block, panel and row: each 4-value
/// word's levels (0..63) against the row's levels in `vpmaddubsw` pairs, times the
/// 16-value sub-block's i8 scale in `vpdpwssd` (`Σ sc_g·Σ q·y`, exact in i32), less
/// `32·Σ sc_g·S_g` against the sub-blocks' sums (the levels' −32), then one FMA with
/// `d·da`, as llama.cpp's Q6_K × Q8_K dot does per row. Integer sums, so each (panel,
/// row) pair gets the same bits in any company. Side by side, a quarter block (four
/// sub-blocks' 12 lines) of each panel in turn, as [`tile_k`] reads.
///
/// # Safety
/// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
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
    let (nib, high) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let mut acc = [[_mm512_setzero_ps(); R]; W];
    let ahead = prefetch_ahead();
    // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
    // prefetches never fault; stores go to the caller's outputs.
    unsafe {
        let idx = BYTE_IDX.map(|t| _mm512_loadu_si512(t.as_ptr().cast()));
        for b in 0..nb {
            let mut sumi = [[_mm512_setzero_si512(); R]; W];
            // Quarter (n, h): values 128n + 32t + 4s.. for t < 4 and s in 4h..4h + 4,
            // that is sub-blocks 8n + 2t + h.
            for n in 0..2 {
                for h in 0..2 {
                    for j in 0..W {
                        let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                        let c = 2 * n + h;
                        prefetch_lines(wp, ahead, 13 * c..13 * c + 13);
                        // Sub-block 8n + 2t + h's scale is byte 2(t % 2) + h of word
                        // 48 + 2n + t / 2: as i16 pairs (sc, sc).
                        let (wa, wb) = (line(wp, K6_LINE[48 + 2 * n]), line(wp, K6_LINE[49 + 2 * n]));
                        let sc = [
                            byte_pair(wa, idx[h]),
                            byte_pair(wa, idx[2 + h]),
                            byte_pair(wb, idx[h]),
                            byte_pair(wb, idx[2 + h]),
                        ];
                        for s in 4 * h..4 * h + 4 {
                            let (ql0, ql1) = (line(wp, K6_LINE[16 * n + s]), line(wp, K6_LINE[16 * n + 8 + s]));
                            let qh = line(wp, K6_LINE[32 + 8 * n + s]);
                            let v = [
                                _mm512_or_si512(
                                    _mm512_and_si512(ql0, nib),
                                    _mm512_and_si512(_mm512_slli_epi16::<4>(qh), high),
                                ),
                                _mm512_or_si512(
                                    _mm512_and_si512(ql1, nib),
                                    _mm512_and_si512(_mm512_slli_epi16::<2>(qh), high),
                                ),
                                _mm512_or_si512(
                                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql0), nib),
                                    _mm512_and_si512(qh, high),
                                ),
                                _mm512_or_si512(
                                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql1), nib),
                                    _mm512_and_si512(_mm512_srli_epi16::<2>(qh), high),
                                ),
                            ];
                            for r in 0..R {
                                let ap = a.add(r * stride + AB * b + 4 + 128 * n + 4 * s);
                                for t in 0..4 {
                                    let p = _mm512_maddubs_epi16(v[t], word(ap.add(32 * t)));
                                    sumi[j][r] = _mm512_dpwssd_epi32(sumi[j][r], p, sc[t]);
                                }
                            }
                        }
                    }
                }
            }
            for j in 0..W {
                let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(wp.add(64 * 52).cast()));
                for r in 0..R {
                    let ap = a.add(r * stride + AB * b);
                    // Σ sc_g·S_g: scale word q's bytes as i16 pairs (sc[4q], sc[4q + 2])
                    // and (sc[4q + 1], sc[4q + 3]), against the packed sums.
                    let mut summ = _mm512_setzero_si512();
                    for q in 0..4 {
                        let w = line(wp, K6_LINE[48 + q]);
                        let (even, odd) =
                            (_mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(w)), _mm512_srai_epi16::<8>(w));
                        summ = _mm512_dpwssd_epi32(summ, even, word(ap.add(4 + super::QK_K + 8 * q)));
                        summ = _mm512_dpwssd_epi32(summ, odd, word(ap.add(8 + super::QK_K + 8 * q)));
                    }
                    let total = _mm512_sub_epi32(sumi[j][r], _mm512_slli_epi32::<5>(summ));
                    let da = _mm512_set1_ps(ap.cast::<f32>().read_unaligned());
                    acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, da), acc[j][r]);
                }
            }
        }
        for j in 0..W {
            for r in 0..R {
                _mm512_storeu_ps(out.add(j * o_stride + r * os), acc[j][r]);
            }
        }
    }
}

/// See [`gemm_unpack`](super::gemm_unpack): `w` is a panel of format `F` (`lanes` is 16).
///
/// # Safety
/// As for [`UnpackFn`](crate::gemm::UnpackFn), with `w` a whole panel.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
    // SAFETY: reads inside the panel, writes group `b` of the caller's buffers.
    let block = 64 * lines + if min { 64 } else { 32 };
    unsafe {
        for b in 0..nb {
            let sp = w.add(block * b + 64 * lines);
            _mm512_store_ps(dw.add(16 * b), _mm512_cvtph_ps(_mm256_loadu_si256(sp.cast())));
            if min {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(sp.add(32).cast()));
                _mm512_store_ps(mw.add(16 * b), _mm512_sub_ps(_mm512_setzero_ps(), m));
            }
            for (t, v) in super::imp::levels::<F>(w.add(block * b)).into_iter().enumerate() {
                _mm512_store_si512(levels.add(64 * (8 * b + t)).cast(), v);
            }
        }
    }
}
