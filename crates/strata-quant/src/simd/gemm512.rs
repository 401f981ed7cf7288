//! AVX-512 (F, BW, VL, VNNI) kernels of the packed GEMM (see [`crate::gemm`]):
//! per-format unpackers that turn a panel of 16 weight rows into interleaved `u8` levels
//! and per-group scales with 32-bit gathers (one gather reads the same 4 bytes of all 16
//! rows), and the `vpdpbusd` micro-kernel that runs up to 12 activation rows over an
//! unpacked panel. Unavailable off x86-64.

use crate::gemm::kernel::{GemmFormat, GemmKernel, MicroFn, UnpackFn};
use strata_tensor::tensor::DType;

pub fn kernel(dtype: DType) -> Option<GemmKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        let fmt = GemmFormat::of(dtype)?;
        // Up to 12 activation rows per call: 12 i32 and 12 f32 accumulators in registers,
        // so 12 independent `vpdpbusd` chains cover its 5-cycle latency at 2 per cycle.
        macro_rules! micros {
            ($steps:literal, $min:literal) => {{
                const M: &[MicroFn] = &[
                    micro::<$steps, $min, 1> as MicroFn,
                    micro::<$steps, $min, 2>,
                    micro::<$steps, $min, 3>,
                    micro::<$steps, $min, 4>,
                    micro::<$steps, $min, 5>,
                    micro::<$steps, $min, 6>,
                    micro::<$steps, $min, 7>,
                    micro::<$steps, $min, 8>,
                    micro::<$steps, $min, 9>,
                    micro::<$steps, $min, 10>,
                    micro::<$steps, $min, 11>,
                    micro::<$steps, $min, 12>,
                ];
                M
            }};
        }
        let unpack: UnpackFn = match dtype {
            DType::Q4_0 => unpack32::<Q4_0>,
            DType::Q5_0 => unpack32::<Q5_0>,
            DType::Q8_0 => unpack32::<Q8_0>,
            DType::Q4_1 => unpack32::<Q4_1>,
            DType::Q5_1 => unpack32::<Q5_1>,
            DType::Q4_K => unpack_q4k::<false, false>,
            DType::Q5_K => unpack_q4k::<true, false>,
            DType::Q6_K => unpack_q6k::<false>,
            _ => return None,
        };
        let micro = match (fmt.group, fmt.has_min) {
            (32, false) => micros!(8, false),
            (32, true) => micros!(8, true),
            (16, false) => micros!(4, false),
            _ => return None,
        };
        Some(GemmKernel { fmt, unpack, micro })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        None
    }
}

/// The Q4_K and Q6_K unpackers, for panel weights too (their `P`).
#[cfg(target_arch = "x86_64")]
pub use imp::{unpack_q4k, unpack_q6k};

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, reason = "the row index drives several arrays and pointers")]
mod imp {
    use std::arch::x86_64::*;

    use crate::gemm::kernel::MicroTile;
    pub use crate::gemm::kernel::block32::*;

    /// The 4 bytes at `w + off + lane_offset` for the lanes in `k` (zero elsewhere).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn gather(w: *const u8, rows: __m512i, k: __mmask16, off: usize) -> __m512i {
        // SAFETY: the caller vouches that every active lane's address is readable.
        unsafe { _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), k, rows, w.add(off).cast()) }
    }

    /// The low (`HI = false`) or high f16 of each i32 lane as f32.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn f16_lanes<const HI: bool>(v: __m512i) -> __m512 {
        let v = if HI { _mm512_srli_epi32::<16>(v) } else { v };
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
    }

    /// Lane offsets `i · row_bytes` and the mask of the first `lanes` lanes.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn rows(row_bytes: usize, lanes: usize) -> (__m512i, __mmask16) {
        let rb = i32::try_from(row_bytes).expect("a weight row under 2 GiB");
        let idx = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        (_mm512_mullo_epi32(idx, _mm512_set1_epi32(rb)), ((1u32 << lanes) - 1) as u16)
    }

    /// Lane table for spreading 4 bits to bit 4 of 4 bytes: entry n = Σ_b bit_b(n) << (8b + 4).
    static SPREAD4: [i32; 16] = {
        let mut t = [0i32; 16];
        let mut n = 0;
        while n < 16 {
            let mut b = 0;
            while b < 4 {
                t[n] |= (((n >> b) & 1) << (8 * b + 4)) as i32;
                b += 1;
            }
            n += 1;
        }
        t
    };

    /// Q4_0, Q5_0, Q8_0, Q4_1 and Q5_1 (one group per block).
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::kernel::UnpackFn).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn unpack32<const F: u8>(
        w: *const u8,
        row_bytes: usize,
        lanes: usize,
        nb: usize,
        levels: *mut u8,
        dw: *mut f32,
        mw: *mut f32,
    ) {
        let (bb, qs, qh, has_min) = layout(F);
        let (rows, k) = rows(row_bytes, lanes);
        let nib = _mm512_set1_epi8(0x0F);
        // SAFETY: gathers read inside the caller's blocks (every offset below is inside
        // a block of `bb` bytes); stores go to group `b` of the caller's buffers.
        unsafe {
            let spread = _mm512_loadu_si512(SPREAD4.as_ptr().cast());
            for b in 0..nb {
                let base = b * bb;
                let dm = gather(w, rows, k, base);
                _mm512_store_ps(dw.add(16 * b), f16_lanes::<false>(dm));
                if has_min {
                    let m = f16_lanes::<true>(dm);
                    _mm512_store_ps(mw.add(16 * b), _mm512_sub_ps(_mm512_setzero_ps(), m));
                }
                let line = |s: usize| levels.add(64 * (8 * b + s)).cast::<__m512i>();
                if F == Q8_0 {
                    for s in 0..8 {
                        let v = gather(w, rows, k, base + qs + 4 * s);
                        _mm512_store_si512(line(s), _mm512_xor_si512(v, _mm512_set1_epi8(-128)));
                    }
                    continue;
                }
                let h = if qh != 0 { gather(w, rows, k, base + qh) } else { _mm512_setzero_si512() };
                for s in 0..4 {
                    let v = gather(w, rows, k, base + qs + 4 * s);
                    let mut lo = _mm512_and_si512(v, nib);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                    if qh != 0 {
                        let sh = _mm512_set1_epi32(4 * s as i32);
                        lo = _mm512_or_si512(lo, _mm512_permutexvar_epi32(_mm512_srlv_epi32(h, sh), spread));
                        let sh = _mm512_set1_epi32(16 + 4 * s as i32);
                        hi = _mm512_or_si512(hi, _mm512_permutexvar_epi32(_mm512_srlv_epi32(h, sh), spread));
                    }
                    _mm512_store_si512(line(s), lo);
                    _mm512_store_si512(line(s + 4), hi);
                }
            }
        }
    }

    /// The 4 bytes at offset `off` of each lane's row: gathered from rows `rows` apart
    /// (`P = false`), or from a panel of 16 rows in the word layout of
    /// [`panels`](crate::panels) (`P = true`), where they are the line at `16·off`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn fetch<const P: bool>(w: *const u8, rows: __m512i, k: __mmask16, off: usize) -> __m512i {
        // SAFETY: the caller vouches for the rows' (or the panel's) bytes at `off`.
        unsafe { if P { _mm512_loadu_si512(w.add(16 * off).cast()) } else { gather(w, rows, k, off) } }
    }

    /// Q4_K (`Q5 = false`) and Q5_K: eight groups of 32 per block, `dw = d · sc_j`,
    /// `mw = dmin · m_j`; from rows (`P = false`) or, for Q4_K, from a panel in the word
    /// layout of [`panels`](crate::panels) (`P = true`; see [`fetch`]): the same
    /// levels and scales, read with loads.
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::kernel::UnpackFn) (with `w` a whole panel when
    /// `P`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn unpack_q4k<const Q5: bool, const P: bool>(
        w: *const u8,
        row_bytes: usize,
        lanes: usize,
        nb: usize,
        levels: *mut u8,
        dw: *mut f32,
        mw: *mut f32,
    ) {
        let (bb, qs) = if Q5 { (176, 48) } else { (144, 16) };
        let (rows, k) = rows(row_bytes, lanes);
        let nib = _mm512_set1_epi8(0x0F);
        let one = _mm512_set1_epi8(1);
        let (k1, k2, k3) =
            (_mm512_set1_epi32(0x3f3f_3f3f), _mm512_set1_epi32(0x0f0f_0f0f), _mm512_set1_epi32(0x0303_0303));
        let byte = _mm512_set1_epi32(0xFF);
        // SAFETY: gathers read inside the caller's blocks; stores go to the groups of
        // block `b` in the caller's buffers.
        unsafe {
            for b in 0..nb {
                let base = b * bb;
                let dm = fetch::<P>(w, rows, k, base);
                let (d, dmin) = (f16_lanes::<false>(dm), f16_lanes::<true>(dm));
                // The 6-bit scales and mins, as `scales_mins_k4` unpacks them, 16 lanes
                // at a time.
                let u0 = fetch::<P>(w, rows, k, base + 4);
                let u1 = fetch::<P>(w, rows, k, base + 8);
                let u2 = fetch::<P>(w, rows, k, base + 12);
                let sc_lo = _mm512_and_si512(u0, k1);
                let sc_hi = _mm512_or_si512(
                    _mm512_and_si512(u2, k2),
                    _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3)),
                );
                let m_lo = _mm512_and_si512(u1, k1);
                let m_hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2),
                    _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)),
                );
                for j in 0..8 {
                    let sh = _mm512_set1_epi32(8 * (j % 4) as i32);
                    let (sc, m) = if j < 4 { (sc_lo, m_lo) } else { (sc_hi, m_hi) };
                    let sc = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(sc, sh), byte));
                    let m = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(m, sh), byte));
                    _mm512_store_ps(dw.add(16 * (8 * b + j)), _mm512_mul_ps(d, sc));
                    _mm512_store_ps(mw.add(16 * (8 * b + j)), _mm512_mul_ps(dmin, m));
                }
                for s in 0..8 {
                    let h = if Q5 { fetch::<P>(w, rows, k, base + 16 + 4 * s) } else { _mm512_setzero_si512() };
                    for n in 0..4 {
                        let v = fetch::<P>(w, rows, k, base + qs + 32 * n + 4 * s);
                        let mut lo = _mm512_and_si512(v, nib);
                        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                        if Q5 {
                            let bit = |j: usize| {
                                let t = _mm512_and_si512(_mm512_srlv_epi32(h, _mm512_set1_epi32(j as i32)), one);
                                _mm512_slli_epi32::<4>(t)
                            };
                            lo = _mm512_or_si512(lo, bit(2 * n));
                            hi = _mm512_or_si512(hi, bit(2 * n + 1));
                        }
                        let g = 8 * b + 2 * n;
                        _mm512_store_si512(levels.add(64 * (8 * g + s)).cast(), lo);
                        _mm512_store_si512(levels.add(64 * (8 * (g + 1) + s)).cast(), hi);
                    }
                }
            }
        }
    }

    /// Q6_K: sixteen groups of 16 per block, `dw = d · sc_j`, offset 32; from rows
    /// (`P = false`) or a panel in the word layout of [`panels`](crate::panels),
    /// its lines in the kernels' order ([`K6_LINE`](crate::panels::k6::K6_LINE)) and
    /// each block's 16 `d` after them (`P = true`).
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::kernel::UnpackFn) (with `w` a whole panel when
    /// `P`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn unpack_q6k<const P: bool>(
        w: *const u8,
        row_bytes: usize,
        lanes: usize,
        nb: usize,
        levels: *mut u8,
        dw: *mut f32,
        _mw: *mut f32,
    ) {
        const BB: usize = 210;
        let (rows, k) = rows(row_bytes, lanes);
        let nib = _mm512_set1_epi8(0x0F);
        let two = _mm512_set1_epi8(0x03);
        // SAFETY: gathers read inside the caller's blocks (`d` through the word at 206,
        // which ends at the block's last byte); stores go to block `b`'s groups.
        unsafe {
            for b in 0..nb {
                let base = b * BB;
                // Byte `x` of the block: a panel keeps its words in the kernels' order.
                let at = |x: usize| base + if P { crate::panels::k6::k6_at(x) } else { x };
                let d = if P {
                    _mm512_cvtph_ps(_mm256_loadu_si256(w.add(16 * (base + 208)).cast()))
                } else {
                    f16_lanes::<true>(gather(w, rows, k, base + 206))
                };
                for q in 0..4 {
                    let sw = fetch::<P>(w, rows, k, at(192 + 4 * q));
                    for i in 0..4 {
                        let sc = _mm512_srai_epi32::<24>(_mm512_sllv_epi32(sw, _mm512_set1_epi32(24 - 8 * i as i32)));
                        _mm512_store_ps(dw.add(16 * (16 * b + 4 * q + i)), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
                    }
                }
                for n in 0..2 {
                    for half in 0..2 {
                        for s in 0..4 {
                            let off = 16 * half + 4 * s;
                            let ql0 = fetch::<P>(w, rows, k, at(off + 64 * n));
                            let ql1 = fetch::<P>(w, rows, k, at(off + 64 * n + 32));
                            let qh = fetch::<P>(w, rows, k, at(off + 128 + 32 * n));
                            for t in 0..4 {
                                let ql = if t % 2 == 0 { ql0 } else { ql1 };
                                let ql = if t < 2 { ql } else { _mm512_srli_epi16::<4>(ql) };
                                let hb = _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_set1_epi32(2 * t as i32)), two);
                                let v = _mm512_or_si512(_mm512_and_si512(ql, nib), _mm512_slli_epi32::<4>(hb));
                                let g = 16 * b + 8 * n + 2 * t + half;
                                _mm512_store_si512(levels.add(64 * (4 * g + s)).cast(), v);
                            }
                        }
                    }
                }
            }
        }
    }

    /// `AR` activation rows over an unpacked panel, `STEPS` (group / 4) lines per group;
    /// `MIN`: the format has mins (against `ms`) rather than an integer offset (`ioff`, which
    /// starts each group's integer sum). Groups that
    /// share an activation scale (`t.per` of them: the 8 or 16 groups of a Q8_K block)
    /// are summed before `da` multiplies them.
    ///
    /// # Safety
    /// As for [`MicroFn`](crate::gemm::kernel::MicroFn).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn micro<const STEPS: usize, const MIN: bool, const AR: usize>(t: &MicroTile) {
        let glen = 4 * STEPS;
        // The running sums live in memory (L1): only a block's sums stay in registers.
        let mut acc = [[0.0f32; 16]; AR];
        // SAFETY: the caller vouches for every pointer of `t` over `t.groups` groups,
        // `AR` activation rows and the lanes in `t.mask`.
        unsafe {
            let qs: [*const u8; AR] = std::array::from_fn(|r| t.qs.add(r * t.qs_stride).cast::<u8>());
            let row = |r: usize, g: usize| r * t.g_stride + g;
            for blk in (0..t.groups).step_by(t.per) {
                let mut accb = [_mm512_setzero_ps(); AR];
                for g in blk..blk + t.per {
                    let mut isum = [_mm512_setzero_si512(); AR];
                    if !MIN {
                        for r in 0..AR {
                            isum[r] = _mm512_set1_epi32(*t.ioff.add(row(r, g)));
                        }
                    }
                    let wl = t.levels.add(64 * STEPS * g);
                    for s in 0..STEPS {
                        let wv = _mm512_load_si512(wl.add(64 * s).cast());
                        for r in 0..AR {
                            let q = qs[r].add(glen * g + 4 * s).cast::<i32>().read_unaligned();
                            isum[r] = _mm512_dpbusd_epi32(isum[r], wv, _mm512_set1_epi32(q));
                        }
                        // Keep the rows' instructions interleaved step by step (LLVM
                        // otherwise serializes each row's dependent chain).
                        for v in isum.iter_mut() {
                            std::arch::asm!("/* {0} */", inout(zmm_reg) * v, options(nomem, nostack, preserves_flags));
                        }
                    }
                    let dw = _mm512_load_ps(t.dw.add(16 * g));
                    for r in 0..AR {
                        accb[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), dw, accb[r]);
                    }
                    if MIN {
                        let mw = _mm512_load_ps(t.mw.add(16 * g));
                        for r in 0..AR {
                            accb[r] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(*t.ms.add(row(r, g))), accb[r]);
                        }
                    }
                }
                for r in 0..AR {
                    let a = _mm512_loadu_ps(acc[r].as_ptr());
                    let a = _mm512_fmadd_ps(accb[r], _mm512_set1_ps(*t.da.add(row(r, blk))), a);
                    _mm512_storeu_ps(acc[r].as_mut_ptr(), a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(t.out.add(r * t.os), t.mask, _mm512_loadu_ps(a.as_ptr()));
            }
        }
    }
}
