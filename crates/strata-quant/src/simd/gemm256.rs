//! AVX2 (+FMA) kernels of the packed GEMM (see [`crate::gemm`]), for machines
//! without AVX-512: the same panel of 16 weight rows as the AVX-512 kernels, unpacked by
//! plain word arithmetic (AVX2's 8-lane gathers would not beat it), and a micro-kernel
//! that meets each 64-byte line as two 256-bit halves with `vpmaddubsw` + `vpmaddwd`
//! (u8 × i8 pairs summed to i16, then to i32). The pair sums cannot saturate for levels
//! below 64 (2 · 63 · 127 < 2¹⁵), which covers every format but Q8_0: its levels stay
//! signed and meet the activations through `vpsignb` (|w| times q with w's sign), with no
//! integer offset. Unavailable off x86-64.

use crate::gemm::kernel::GemmKernel;
#[cfg(target_arch = "x86_64")]
use crate::gemm::kernel::{GemmFormat, MicroFn, UnpackFn};
use strata_tensor::tensor::DType;

pub fn kernel(dtype: DType) -> Option<GemmKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        let mut fmt = GemmFormat::of(dtype)?;
        // Four activation rows per call: 8 i32 accumulators (two halves a row), the two
        // weight halves and the temporaries fill AVX2's 16 registers.
        macro_rules! micros {
            ($steps:literal, $fold:literal, $min:literal, $signed:literal) => {{
                const M: &[MicroFn] = &[
                    micro::<$steps, $fold, $min, $signed, 1> as MicroFn,
                    micro::<$steps, $fold, $min, $signed, 2>,
                    micro::<$steps, $fold, $min, $signed, 3>,
                    micro::<$steps, $fold, $min, $signed, 4>,
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
        // Steps folded in i16 (see `micro`): 4-bit levels (≤ 15) all 8 of a group, 5-bit
        // 4, Q6_K's 6-bit 2, Q8_0's |w| ≤ 128 one.
        let micro = match dtype {
            DType::Q8_0 => {
                // Signed levels: no offset to take off.
                fmt.offset = 0;
                micros!(8, 1, false, true)
            }
            DType::Q4_0 => micros!(8, 8, false, false),
            DType::Q5_0 => micros!(8, 4, false, false),
            DType::Q4_1 | DType::Q4_K => micros!(8, 8, true, false),
            DType::Q5_1 | DType::Q5_K => micros!(8, 4, true, false),
            DType::Q6_K => micros!(4, 2, false, false),
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

/// The K-quant unpackers, for panels (see [`crate::panels::gemm_unpack`]).
#[cfg(target_arch = "x86_64")]
pub use imp::{unpack_q4k, unpack_q6k};

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, reason = "the row index drives several arrays and pointers")]
mod imp {
    use std::arch::x86_64::*;

    use crate::gemm::kernel::MicroTile;
    pub use crate::gemm::kernel::block32::*;
    use crate::simd::scales_mins_k4;

    const NIB: u32 = 0x0F0F_0F0F;

    /// The little-endian word at `p`.
    ///
    /// # Safety
    /// `p` must point at 4 readable bytes.
    #[inline]
    unsafe fn word(p: *const u8) -> u32 {
        // SAFETY: the caller's contract.
        u32::from_le_bytes(unsafe { p.cast::<[u8; 4]>().read_unaligned() })
    }

    /// # Safety
    /// `p` must point at 2 readable bytes.
    #[inline]
    unsafe fn f16_at(p: *const u8) -> f32 {
        // SAFETY: the caller's contract.
        half::f16::from_bits(u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read_unaligned() })).to_f32()
    }

    /// Byte `x` of block `b` of weight row `i`: in rows `row_bytes` apart (`P = false`),
    /// or in a panel in the word layout of [`panels`](crate::panels) (`P = true`:
    /// word `t` of the 16 rows' blocks side by side, a block's last 2 bytes when `bb` is
    /// not a multiple of 4 after its words as 16 halves).
    #[inline]
    fn at<const P: bool>(w: *const u8, row_bytes: usize, bb: usize, i: usize, b: usize, x: usize) -> *const u8 {
        let words = bb / 4 * 4;
        w.wrapping_add(match (P, x < words) {
            (false, _) => i * row_bytes + b * bb + x,
            (true, true) => 16 * (b * bb + x / 4 * 4) + 4 * i + x % 4,
            (true, false) => 16 * (b * bb + words) + 2 * i + (x - words),
        })
    }

    /// Bit b of the low 4 bits of `n` moved to bit 4 of byte b (the fifth bit of 4 levels).
    #[inline]
    fn spread4(n: u32) -> u32 {
        // n · (1 + 2⁷ + 2¹⁴ + 2²¹) puts bit b at 8b among 16 distinct positions.
        ((n & 0xF).wrapping_mul(0x0020_4081) & 0x0101_0101) << 4
    }

    /// Zeroes the lanes from `lanes` of `lines` lines at `levels` and of `groups` scale
    /// lines at `dw` and `mw`.
    ///
    /// # Safety
    /// The buffers must hold that many 64-byte lines.
    unsafe fn clear_lanes(lanes: usize, levels: *mut u8, lines: usize, dw: *mut f32, mw: *mut f32, groups: usize) {
        // SAFETY: the caller's contract; lane `i < 16` of a line is bytes `4i..4i + 4`.
        unsafe {
            for i in lanes..16 {
                for l in 0..lines {
                    levels.add(64 * l + 4 * i).cast::<u32>().write(0);
                }
                for g in 0..groups {
                    dw.add(16 * g + i).write(0.0);
                    mw.add(16 * g + i).write(0.0);
                }
            }
        }
    }

    /// Q4_0, Q5_0, Q8_0 (signed levels), Q4_1 and Q5_1 (one group per block).
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::kernel::UnpackFn).
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
        // SAFETY: every read is inside block `b` of row `i < lanes`; every write is lane
        // `i` of block `b`'s group in the caller's buffers.
        unsafe {
            for i in 0..lanes {
                for b in 0..nb {
                    let blk = w.add(i * row_bytes + b * bb);
                    let line = |s: usize| levels.add(64 * (8 * b + s) + 4 * i).cast::<u32>();
                    dw.add(16 * b + i).write(f16_at(blk));
                    if has_min {
                        mw.add(16 * b + i).write(-f16_at(blk.add(2)));
                    }
                    if F == Q8_0 {
                        for s in 0..8 {
                            line(s).write(word(blk.add(qs + 4 * s)));
                        }
                        continue;
                    }
                    let h = if qh != 0 { word(blk.add(qh)) } else { 0 };
                    for s in 0..4 {
                        let v = word(blk.add(qs + 4 * s));
                        let (mut lo, mut hi) = (v & NIB, (v >> 4) & NIB);
                        if qh != 0 {
                            lo |= spread4(h >> (4 * s));
                            hi |= spread4(h >> (16 + 4 * s));
                        }
                        line(s).write(lo);
                        line(s + 4).write(hi);
                    }
                }
            }
            clear_lanes(lanes, levels, 8 * nb, dw, mw, nb);
        }
    }

    /// Q4_K (`Q5 = false`) and Q5_K: eight groups of 32 per block, `dw = d · sc_j`,
    /// `mw = dmin · m_j`; from rows (`P = false`) or a panel (`P = true`, see [`at`]).
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::kernel::UnpackFn) (with `w` a whole panel when
    /// `P`).
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
        // SAFETY: as in `unpack32`; `at` finds each byte of row `i`'s block `b`.
        unsafe {
            for i in 0..lanes {
                for b in 0..nb {
                    let blk = |x: usize| at::<P>(w, row_bytes, bb, i, b, x);
                    let (d, dmin) = (f16_at(blk(0)), f16_at(blk(2)));
                    let mut packed = [0u8; 12];
                    for (t, q) in packed.chunks_exact_mut(4).enumerate() {
                        q.copy_from_slice(&word(blk(4 + 4 * t)).to_le_bytes());
                    }
                    let (sc, m) = scales_mins_k4(&packed);
                    for j in 0..8 {
                        dw.add(16 * (8 * b + j) + i).write(d * sc[j] as f32);
                        mw.add(16 * (8 * b + j) + i).write(dmin * m[j] as f32);
                    }
                    for s in 0..8 {
                        let h = if Q5 { word(blk(16 + 4 * s)) } else { 0 };
                        for n in 0..4 {
                            let v = word(blk(qs + 32 * n + 4 * s));
                            let (mut lo, mut hi) = (v & NIB, (v >> 4) & NIB);
                            if Q5 {
                                lo |= ((h >> (2 * n)) & 0x0101_0101) << 4;
                                hi |= ((h >> (2 * n + 1)) & 0x0101_0101) << 4;
                            }
                            let g = 8 * b + 2 * n;
                            levels.add(64 * (8 * g + s) + 4 * i).cast::<u32>().write(lo);
                            levels.add(64 * (8 * (g + 1) + s) + 4 * i).cast::<u32>().write(hi);
                        }
                    }
                }
            }
            clear_lanes(lanes, levels, 64 * nb, dw, mw, 8 * nb);
        }
    }

    /// Q6_K: sixteen groups of 16 per block, `dw = d · sc_j`, offset 32; from rows
    /// (`P = false`) or a panel (`P = true`, see [`at`]).
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::kernel::UnpackFn) (with `w` a whole panel when
    /// `P`).
    pub unsafe fn unpack_q6k<const P: bool>(
        w: *const u8,
        row_bytes: usize,
        lanes: usize,
        nb: usize,
        levels: *mut u8,
        dw: *mut f32,
        mw: *mut f32,
    ) {
        const BB: usize = 210;
        // SAFETY: as in `unpack32`; `at` finds each byte of row `i`'s block `b`.
        unsafe {
            for i in 0..lanes {
                for b in 0..nb {
                    // A panel keeps the block's words in the kernels' order.
                    let blk =
                        |x: usize| at::<P>(w, row_bytes, BB, i, b, if P { crate::panels::k6::k6_at(x) } else { x });
                    let d = f16_at(blk(208));
                    for j in 0..16 {
                        dw.add(16 * (16 * b + j) + i).write(d * (*blk(192 + j) as i8) as f32);
                    }
                    for n in 0..2 {
                        for half in 0..2 {
                            for s in 0..4 {
                                let off = 16 * half + 4 * s;
                                let ql0 = word(blk(off + 64 * n));
                                let ql1 = word(blk(off + 64 * n + 32));
                                let qh = word(blk(128 + 32 * n + off));
                                for t in 0..4 {
                                    let ql = if t % 2 == 0 { ql0 } else { ql1 };
                                    let ql = if t < 2 { ql } else { ql >> 4 };
                                    let v = (ql & NIB) | (((qh >> (2 * t)) & 0x0303_0303) << 4);
                                    let g = 16 * b + 8 * n + 2 * t + half;
                                    levels.add(64 * (4 * g + s) + 4 * i).cast::<u32>().write(v);
                                }
                            }
                        }
                    }
                }
            }
            clear_lanes(lanes, levels, 64 * nb, dw, mw, 16 * nb);
        }
    }

    /// `AR` activation rows over an unpacked panel, `STEPS` (group / 4) lines per group,
    /// each line as two halves of 8 weight rows. The pair sums of `FOLD` steps add up in
    /// i16 before they are widened to i32, as many as cannot overflow: a pair sum is at
    /// most 2 · 127 · the largest level. `MIN` and the per-block scaling as in
    /// the AVX-512 micro-kernel; `SIGNED`: the levels are signed (Q8_0), so each
    /// activation word takes the sign of the levels it meets (`vpsignb`) and the levels
    /// their absolute value. A row's arithmetic is the same whatever `AR` is.
    ///
    /// # Safety
    /// As for [`MicroFn`](crate::gemm::kernel::MicroFn).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn micro<const STEPS: usize, const FOLD: usize, const MIN: bool, const SIGNED: bool, const AR: usize>(
        t: &MicroTile,
    ) {
        let glen = 4 * STEPS;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[0.0f32; 16]; AR];
        // SAFETY: the caller vouches for every pointer of `t` over `t.groups` groups,
        // `AR` activation rows and the lanes in `t.mask`.
        unsafe {
            let qs: [*const u8; AR] = std::array::from_fn(|r| t.qs.add(r * t.qs_stride).cast::<u8>());
            let row = |r: usize, g: usize| r * t.g_stride + g;
            for blk in (0..t.groups).step_by(t.per) {
                let mut accb = [[_mm256_setzero_ps(); 2]; AR];
                for g in blk..blk + t.per {
                    let mut isum = [[_mm256_setzero_si256(); 2]; AR];
                    if !MIN {
                        for r in 0..AR {
                            let off = _mm256_set1_epi32(*t.ioff.add(row(r, g)));
                            isum[r] = [off, off];
                        }
                    }
                    let wl = t.levels.add(64 * STEPS * g);
                    for f in (0..STEPS).step_by(FOLD) {
                        // `FOLD` steps of pair sums in i16, then widened once.
                        let mut part = [[_mm256_setzero_si256(); 2]; AR];
                        for s in f..f + FOLD {
                            let w = [
                                _mm256_load_si256(wl.add(64 * s).cast()),
                                _mm256_load_si256(wl.add(64 * s + 32).cast()),
                            ];
                            let u = if SIGNED { [_mm256_abs_epi8(w[0]), _mm256_abs_epi8(w[1])] } else { w };
                            for r in 0..AR {
                                let q = _mm256_set1_epi32(qs[r].add(glen * g + 4 * s).cast::<i32>().read_unaligned());
                                for h in 0..2 {
                                    let q = if SIGNED { _mm256_sign_epi8(q, w[h]) } else { q };
                                    part[r][h] = _mm256_add_epi16(part[r][h], _mm256_maddubs_epi16(u[h], q));
                                }
                            }
                        }
                        for r in 0..AR {
                            for h in 0..2 {
                                isum[r][h] = _mm256_add_epi32(isum[r][h], _mm256_madd_epi16(part[r][h], ones));
                            }
                        }
                    }
                    for h in 0..2 {
                        let dw = _mm256_load_ps(t.dw.add(16 * g + 8 * h));
                        for r in 0..AR {
                            accb[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][h]), dw, accb[r][h]);
                        }
                        if MIN {
                            let mw = _mm256_load_ps(t.mw.add(16 * g + 8 * h));
                            for r in 0..AR {
                                accb[r][h] = _mm256_fnmadd_ps(mw, _mm256_set1_ps(*t.ms.add(row(r, g))), accb[r][h]);
                            }
                        }
                    }
                }
                for r in 0..AR {
                    let da = _mm256_set1_ps(*t.da.add(row(r, blk)));
                    for h in 0..2 {
                        let a = acc[r].as_mut_ptr().add(8 * h);
                        _mm256_storeu_ps(a, _mm256_fmadd_ps(accb[r][h], da, _mm256_loadu_ps(a)));
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (i, &v) in a.iter().enumerate() {
                    if t.mask >> i & 1 != 0 {
                        t.out.add(r * t.os + i).write(v);
                    }
                }
            }
        }
    }
}
