//! AVX-512F kernels: 16 f32 lanes. F16 is widened with `vcvtph2ps`, BF16 by moving its
//! bits into the high half of each 32-bit lane. Unavailable off x86-64.

use super::Ops;

/// The kernel table, if this CPU has AVX-512F.
pub(super) fn ops() -> Option<&'static Ops> {
    #[cfg(target_arch = "x86_64")]
    if strata_quant::isa::avx512() && std::arch::is_x86_feature_detected!("avx512f") {
        return Some(&imp::OPS);
    }
    None
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, reason = "register tiles read best as indexed loops")]
mod imp {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::super::{Bf16, F16, Ops, OutPtr, Prefetch, PrefetchCursor, WData, WElem, Weights, XRows};

    /// f32 lanes per register.
    const L: usize = 16;
    /// How far ahead of its reads the few-rows kernel prefetches each weight row, in bytes
    /// (the hardware prefetcher alone leaves bandwidth unused on the decode path).
    const PREFETCH_AHEAD: usize = 1024;
    /// Output features per packed panel: two registers.
    const NR: usize = 2 * L;
    /// x rows per register tile: `MR × 2` accumulators of the 32 registers.
    const MR: usize = 12;
    /// Weight rows per group in the few-rows kernel (one accumulator each per x row).
    const C: usize = 4;

    pub(super) static OPS: Ops = super::super::ops_table!();

    /// Weight elements that widen to 16 f32 lanes.
    trait Load: WElem {
        /// Loads 16 elements at `p` as f32.
        ///
        /// # Safety
        /// AVX-512F; `p..p + 16` readable.
        unsafe fn load(p: *const Self) -> __m512;

        /// Loads `n < 16` elements at `p` as f32, zero in the other lanes.
        ///
        /// # Safety
        /// AVX-512F; `p..p + n` readable.
        #[inline(always)]
        unsafe fn load_n(p: *const Self, n: usize) -> __m512 {
            // SAFETY: by the trait contract.
            unsafe { load_part(p, n) }
        }
    }

    impl Load for f32 {
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            // SAFETY: by the trait contract.
            unsafe { _mm512_loadu_ps(p) }
        }

        #[inline(always)]
        unsafe fn load_n(p: *const f32, n: usize) -> __m512 {
            // SAFETY: by the trait contract; masked lanes are not read.
            unsafe { _mm512_maskz_loadu_ps(tail_mask(n), p) }
        }
    }

    impl Load for F16 {
        #[inline(always)]
        unsafe fn load(p: *const F16) -> __m512 {
            // SAFETY: by the trait contract.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
        }
    }

    impl Load for Bf16 {
        #[inline(always)]
        unsafe fn load(p: *const Bf16) -> __m512 {
            // SAFETY: by the trait contract.
            unsafe {
                let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
            }
        }
    }

    /// Loads `n < 16` elements at `p` as f32, zero-filling the other lanes.
    ///
    /// # Safety
    /// AVX-512F; `p..p + n` readable.
    #[inline(always)]
    unsafe fn load_part<T: Load>(p: *const T, n: usize) -> __m512 {
        let mut buf = [T::ZERO; L];
        // SAFETY: `n < L` elements are readable at `p`; `buf` holds `L`.
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            T::load(buf.as_ptr())
        }
    }

    /// # Safety
    /// AVX-512F and the contract of `Ops::small`.
    #[target_feature(enable = "avx512f")]
    unsafe fn small(x: XRows, w: Weights, cols: Range<usize>, dst: OutPtr) {
        // SAFETY: forwarded contract.
        unsafe {
            match w.data {
                WData::F32(d) => small_t(x, d, w.k, cols, dst),
                WData::F16(d) => small_t(x, d, w.k, cols, dst),
                WData::Bf16(d) => small_t(x, d, w.k, cols, dst),
            }
        }
    }

    #[inline(always)]
    unsafe fn small_t<T: Load>(x: XRows, w: &[T], k: usize, cols: Range<usize>, dst: OutPtr) {
        // SAFETY: forwarded contract.
        unsafe { small_g::<T, C>(x, w, k, cols, dst) }
    }

    /// Weight rows in groups of `G`, each multiplied into all x rows (four at a time)
    /// while it is in cache; only the first x group prefetches the weights.
    #[inline(always)]
    unsafe fn small_g<T: Load, const G: usize>(x: XRows, w: &[T], k: usize, cols: Range<usize>, dst: OutPtr) {
        assert!(x.rows > 0 && x.data.len() >= (x.rows - 1) * x.ld + k && w.len() >= cols.end * k);
        let mut o = cols.start;
        // SAFETY: rows `o..o + G` (or `o`) of `w` and all x rows are in bounds (asserted
        // above); `dst` by the caller's contract.
        unsafe {
            while o < cols.end {
                let wo = w.as_ptr().add(o * k);
                let g = if o + G <= cols.end { G } else { 1 };
                let mut r = 0;
                while r < x.rows {
                    let xr = XRows { data: &x.data[r * x.ld..], ..x };
                    let (d, pf) = (dst.at(r, o), r == 0);
                    let n = match (g == G, x.rows - r) {
                        (true, 1) => group::<T, 1, G>(xr, wo, k, d, pf),
                        (true, 2) => group::<T, 2, G>(xr, wo, k, d, pf),
                        (true, 3) => group::<T, 3, G>(xr, wo, k, d, pf),
                        (true, _) => group::<T, 4, G>(xr, wo, k, d, pf),
                        (false, 1) => group::<T, 1, 1>(xr, wo, k, d, pf),
                        (false, 2) => group::<T, 2, 1>(xr, wo, k, d, pf),
                        (false, 3) => group::<T, 3, 1>(xr, wo, k, d, pf),
                        (false, _) => group::<T, 4, 1>(xr, wo, k, d, pf),
                    };
                    r += n;
                }
                o += g;
            }
        }
    }

    /// `dst(r, c) = x(r, ·) · w[c, ·]` for `R` x rows and the `G` weight rows at `w`
    /// (prefetching further along those rows if `prefetch`); returns `R`.
    #[inline(always)]
    unsafe fn group<T: Load, const R: usize, const G: usize>(
        x: XRows,
        w: *const T,
        k: usize,
        dst: OutPtr,
        prefetch: bool,
    ) -> usize {
        // SAFETY: the caller keeps `R` rows of `x`, `G` rows of `w` (stride `k`) and
        // `R × G` elements of `dst` in bounds; every access below stays within `k`.
        unsafe {
            let xp = x.data.as_ptr();
            let mut acc = [[_mm512_setzero_ps(); G]; R];
            let mut wv = [_mm512_setzero_ps(); G];
            let mut kk = 0;
            while kk + L <= k {
                if prefetch && kk % (64 / size_of::<T>()) == 0 {
                    for c in 0..G {
                        _mm_prefetch::<_MM_HINT_T0>(w.add(c * k + kk).cast::<i8>().wrapping_add(PREFETCH_AHEAD));
                    }
                }
                for c in 0..G {
                    wv[c] = T::load(w.add(c * k + kk));
                }
                for r in 0..R {
                    let xv = _mm512_loadu_ps(xp.add(r * x.ld + kk));
                    for c in 0..G {
                        acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
                    }
                }
                kk += L;
            }
            if kk < k {
                let n = k - kk;
                for c in 0..G {
                    wv[c] = load_part(w.add(c * k + kk), n);
                }
                for r in 0..R {
                    let xv = load_part(xp.add(r * x.ld + kk), n);
                    for c in 0..G {
                        acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
                    }
                }
            }
            for r in 0..R {
                for c in 0..G {
                    *dst.at(r, c).ptr = _mm512_reduce_add_ps(acc[r][c]);
                }
            }
        }
        R
    }

    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn pack(w: Weights, cols: Range<usize>, ks: Range<usize>, packed: &mut [f32]) {
        // SAFETY: AVX-512F by contract; bounds are checked in `pack_t`.
        unsafe {
            match w.data {
                WData::F32(d) => pack_t(d, w.k, cols, ks, packed),
                WData::F16(d) => pack_t(d, w.k, cols, ks, packed),
                WData::Bf16(d) => pack_t(d, w.k, cols, ks, packed),
            }
        }
    }

    /// Converts and transposes 16 × 16 blocks: 16 weight rows' next 16 values become 16
    /// consecutive `packed` rows' 16 lanes.
    #[inline(always)]
    unsafe fn pack_t<T: Load>(w: &[T], k: usize, cols: Range<usize>, ks: Range<usize>, packed: &mut [f32]) {
        let (n, kc) = (cols.len(), ks.len());
        assert!(n <= NR && packed.len() >= kc * NR && ks.end <= k && cols.end * k <= w.len());
        let dst = packed.as_mut_ptr();
        // SAFETY: reads stay in rows `cols` and columns `ks` of `w`, writes in the first
        // `kc × NR` values of `packed` (asserted above); AVX-512F by the caller.
        unsafe {
            for h in 0..NR / L {
                let mut kk = 0;
                while kk < kc {
                    let len = L.min(kc - kk);
                    let mut v = [_mm512_setzero_ps(); L];
                    for (i, v) in v.iter_mut().enumerate() {
                        let j = h * L + i;
                        if j < n {
                            let p = w.as_ptr().add((cols.start + j) * k + ks.start + kk);
                            *v = if len == L { T::load(p) } else { load_part(p, len) };
                        }
                    }
                    transpose16(&mut v);
                    for (c, v) in v.iter().enumerate().take(len) {
                        _mm512_storeu_ps(dst.add((kk + c) * NR + h * L), *v);
                    }
                    kk += L;
                }
            }
        }
    }

    /// Transposes a 16 × 16 block held as 16 rows.
    #[inline(always)]
    unsafe fn transpose16(r: &mut [__m512; L]) {
        // SAFETY: AVX-512F by the caller.
        unsafe {
            // Within each 128-bit lane: pairs, then quads of rows.
            let mut t = [_mm512_setzero_ps(); L];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            // u[4i + j], 128-bit lane l: column 4l + j of rows 4i..4i + 4.
            let mut u = [_mm512_setzero_ps(); L];
            for i in 0..4 {
                u[4 * i] = _mm512_shuffle_ps::<0x44>(t[4 * i], t[4 * i + 2]);
                u[4 * i + 1] = _mm512_shuffle_ps::<0xEE>(t[4 * i], t[4 * i + 2]);
                u[4 * i + 2] = _mm512_shuffle_ps::<0x44>(t[4 * i + 1], t[4 * i + 3]);
                u[4 * i + 3] = _mm512_shuffle_ps::<0xEE>(t[4 * i + 1], t[4 * i + 3]);
            }
            // Gather lane l of u[j], u[4 + j], u[8 + j], u[12 + j] into column 4l + j.
            for j in 0..4 {
                let even_lo = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
                let odd_lo = _mm512_shuffle_f32x4::<0xDD>(u[j], u[4 + j]);
                let even_hi = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
                let odd_hi = _mm512_shuffle_f32x4::<0xDD>(u[8 + j], u[12 + j]);
                r[j] = _mm512_shuffle_f32x4::<0x88>(even_lo, even_hi);
                r[8 + j] = _mm512_shuffle_f32x4::<0xDD>(even_lo, even_hi);
                r[4 + j] = _mm512_shuffle_f32x4::<0x88>(odd_lo, odd_hi);
                r[12 + j] = _mm512_shuffle_f32x4::<0xDD>(odd_lo, odd_hi);
            }
        }
    }

    /// # Safety
    /// AVX-512F and the contract of `Ops::panel`.
    #[target_feature(enable = "avx512f")]
    unsafe fn panel(x: XRows, kc: usize, packed: &[f32], dst: OutPtr, accumulate: bool, next: Prefetch) {
        assert!(packed.len() >= kc * NR && x.data.len() >= (x.rows.max(1) - 1) * x.ld + kc);
        let full = x.rows / MR * MR;
        let pf = &mut PrefetchCursor::new(next, x.rows.div_ceil(MR) * kc);
        // SAFETY: x rows and `packed` are in bounds (asserted above); `dst` by contract.
        unsafe {
            let at = |r: usize| (XRows { data: &x.data[r * x.ld..], ld: x.ld, rows: x.rows - r }, dst.at(r, 0));
            let p = packed.as_ptr();
            for r in (0..full).step_by(MR) {
                let (x, dst) = at(r);
                tile::<MR>(x, kc, p, dst, accumulate, pf);
            }
            // The remaining rows (if any) in one narrower tile.
            let rest = x.rows - full;
            let (x, dst) = if rest > 0 { at(full) } else { (x, dst) };
            match rest {
                0 => {}
                1 => tile::<1>(x, kc, p, dst, accumulate, pf),
                2 => tile::<2>(x, kc, p, dst, accumulate, pf),
                3 => tile::<3>(x, kc, p, dst, accumulate, pf),
                4 => tile::<4>(x, kc, p, dst, accumulate, pf),
                5 => tile::<5>(x, kc, p, dst, accumulate, pf),
                6 => tile::<6>(x, kc, p, dst, accumulate, pf),
                7 => tile::<7>(x, kc, p, dst, accumulate, pf),
                8 => tile::<8>(x, kc, p, dst, accumulate, pf),
                9 => tile::<9>(x, kc, p, dst, accumulate, pf),
                10 => tile::<10>(x, kc, p, dst, accumulate, pf),
                11 => tile::<11>(x, kc, p, dst, accumulate, pf),
                _ => unreachable!(),
            }
            // Few rows: the rest at once.
            while let Some(line) = pf.next() {
                _mm_prefetch::<_MM_HINT_T1>(line.cast());
            }
        }
    }

    /// The register tile: x rows `r0..r0 + R` against one packed panel.
    #[inline(always)]
    unsafe fn tile<const R: usize>(
        x: XRows,
        kc: usize,
        packed: *const f32,
        dst: OutPtr,
        accumulate: bool,
        pf: &mut PrefetchCursor,
    ) {
        // SAFETY: the caller keeps `R` rows of `x` (`kc` values each), `kc × NR` values of
        // `packed` and `R × NR` elements of `dst` in bounds.
        unsafe {
            let xp = x.data.as_ptr();
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            if accumulate {
                for (r, acc) in acc.iter_mut().enumerate() {
                    acc[0] = _mm512_loadu_ps(dst.at(r, 0).ptr);
                    acc[1] = _mm512_loadu_ps(dst.at(r, L).ptr);
                }
            }
            for kk in 0..kc {
                if let Some(line) = pf.tick() {
                    _mm_prefetch::<_MM_HINT_T1>(line.cast());
                }
                let w0 = _mm512_loadu_ps(packed.add(kk * NR));
                let w1 = _mm512_loadu_ps(packed.add(kk * NR + L));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xb = _mm512_set1_ps(*xp.add(r * x.ld + kk));
                    acc[0] = _mm512_fmadd_ps(xb, w0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(xb, w1, acc[1]);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(dst.at(r, 0).ptr, acc[0]);
                _mm512_storeu_ps(dst.at(r, L).ptr, acc[1]);
            }
        }
    }

    /// # Safety
    /// AVX-512F; `a.len() == b.len()`.
    #[target_feature(enable = "avx512f")]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { dot_with(a, b) }
    }

    /// [`dot`] with `b` in any element type widened to f32 (exactly, so an f16 `b` gives
    /// the bits its f32 widening gives).
    ///
    /// # Safety
    /// AVX-512F; `a.len() == b.len()`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn dot_with<T: Load>(a: &[f32], b: &[T]) -> f32 {
        let n = a.len().min(b.len());
        // SAFETY: forwarded contract.
        unsafe { hsum(dot_lanes::<T, 1>(a.as_ptr(), n, n, b.as_ptr())[0]) }
    }

    /// The 16 lanes each of `G` dot products `Σ q_g[i]·b[i]` (`q_g` at `q + g·q_stride`,
    /// `n` values) whose [`hsum`] is the dot, with `b` widened once for all of them: every
    /// head takes the same operations in the same order as a dot on its own.
    ///
    /// # Safety
    /// AVX-512F; `n` values readable at `b` and at each `q_g`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn dot_lanes<T: Load, const G: usize>(q: *const f32, q_stride: usize, n: usize, b: *const T) -> [__m512; G] {
        // SAFETY: every access is below `n`.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 4]; G];
            let mut i = 0;
            while i + 4 * L <= n {
                for u in 0..4 {
                    let o = i + u * L;
                    let vb = T::load(b.add(o));
                    for g in 0..G {
                        acc[g][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(g * q_stride + o)), vb, acc[g][u]);
                    }
                }
                i += 4 * L;
            }
            while i + L <= n {
                let vb = T::load(b.add(i));
                for g in 0..G {
                    acc[g][0] = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(g * q_stride + i)), vb, acc[g][0]);
                }
                i += L;
            }
            if i < n {
                let vb = T::load_n(b.add(i), n - i);
                for g in 0..G {
                    let va = _mm512_maskz_loadu_ps(tail_mask(n - i), q.add(g * q_stride + i));
                    acc[g][1] = _mm512_fmadd_ps(va, vb, acc[g][1]);
                }
            }
            let mut out = [_mm512_setzero_ps(); G];
            for g in 0..G {
                out[g] = _mm512_add_ps(_mm512_add_ps(acc[g][0], acc[g][1]), _mm512_add_ps(acc[g][2], acc[g][3]));
            }
            out
        }
    }

    /// The sum of the 16 lanes, halving: lanes `i` and `i + 8`, then `i + 4`, `i + 2` and
    /// `i + 1` (the order [`hsum16`] keeps for each of its vectors).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn hsum(v: __m512) -> f32 {
        let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0xEE>(v, v));
        let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0x55>(v, v));
        let v = _mm512_add_ps(v, _mm512_permute_ps::<0x4E>(v));
        let v = _mm512_add_ps(v, _mm512_permute_ps::<0xB1>(v));
        _mm512_cvtss_f32(v)
    }

    /// Lane `p` of the result is [`hsum`]`(v[p])`, bit for bit: the same pairs added in
    /// the same order, 16 vectors at a time (about 3 instructions a vector instead of 8).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn hsum16(v: &[__m512; L]) -> __m512 {
        // Lanes i and i + 8: vectors 2m and 2m + 1 in the halves of t[m].
        let mut t = [_mm512_setzero_ps(); 8];
        for m in 0..8 {
            let (a, b) = (v[2 * m], v[2 * m + 1]);
            t[m] = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b));
        }
        // And i + 4: vectors 4k .. 4k + 3 in the quarters of w[k].
        let mut w = [_mm512_setzero_ps(); 4];
        for k in 0..4 {
            let (a, b) = (t[2 * k], t[2 * k + 1]);
            w[k] = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b));
        }
        // And i + 2: quarter q of z[h] holds vectors 8h + q and 8h + 4 + q, two lanes each.
        let mut z = [_mm512_setzero_ps(); 2];
        for h in 0..2 {
            let (a, b) = (w[2 * h], w[2 * h + 1]);
            z[h] = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b));
        }
        // And i + 1: lane 4q + t holds vector 4t + q.
        let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(z[0], z[1]), _mm512_shuffle_ps::<0xDD>(z[0], z[1]));
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r)
    }

    /// # Safety
    /// AVX-512F; `x.len() == y.len()`.
    #[target_feature(enable = "avx512f")]
    unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let a = _mm512_set1_ps(alpha);
            let mut i = 0;
            while i + L <= n {
                let v = _mm512_fmadd_ps(a, _mm512_loadu_ps(px.add(i)), _mm512_loadu_ps(py.add(i)));
                _mm512_storeu_ps(py.add(i), v);
                i += L;
            }
            if i < n {
                let mask = tail_mask(n - i);
                let v =
                    _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(mask, px.add(i)), _mm512_maskz_loadu_ps(mask, py.add(i)));
                _mm512_mask_storeu_ps(py.add(i), mask, v);
            }
        }
    }

    /// Query heads whose dot products share one widened key, and value heads one widened
    /// value row (4 heads' accumulators fill 16 registers).
    const HEADS: usize = 4;
    /// Positions ahead of the one read that the attention loops prefetch: cached keys and
    /// values are rows `stride` apart, which the hardware prefetcher leaves waiting on
    /// memory.
    const AHEAD: usize = 16;

    /// Prefetches the cache lines of `n` elements at `p` (which need not be readable).
    #[inline(always)]
    fn prefetch_row<T>(p: *const T, n: usize) {
        let bytes = n * std::mem::size_of::<T>();
        for at in (0..bytes).step_by(64) {
            // SAFETY: a prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>().wrapping_add(at)) };
        }
    }

    /// The table's `scores`: up to [`HEADS`] heads at a time read each key once.
    ///
    /// # Safety
    /// AVX512F; `q` and `out` are whole heads (`hd` values and `n` scores each), `k` holds
    /// `(n - 1) · stride + hd` values.
    #[target_feature(enable = "avx512f")]
    unsafe fn scores<T: Load>(q: &[f32], hd: usize, k: &[T], stride: usize, scale: f32, out: &mut [f32]) {
        let heads = q.len() / hd;
        let n = out.len() / heads;
        let (q, k, out) = (q.as_ptr(), k.as_ptr(), out.as_mut_ptr());
        let mut h = 0;
        while h < heads {
            let (qh, oh) = (q.wrapping_add(h * hd), out.wrapping_add(h * n));
            // SAFETY: the caller's contract, for heads `h ..`.
            h += unsafe {
                match heads - h {
                    1 => scores_heads::<T, 1>(qh, hd, k, stride, scale, oh, n),
                    2 => scores_heads::<T, 2>(qh, hd, k, stride, scale, oh, n),
                    3 => scores_heads::<T, 3>(qh, hd, k, stride, scale, oh, n),
                    _ => scores_heads::<T, HEADS>(qh, hd, k, stride, scale, oh, n),
                }
            };
        }
    }

    /// `G` heads' scores (see [`scores`]): 16 positions at a time, each head's 16 lane
    /// vectors summed together by [`hsum16`]. Returns `G`.
    ///
    /// # Safety
    /// As for [`scores`], for the `G` heads at `q` and `out`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments, reason = "the kernel call spelled out")]
    unsafe fn scores_heads<T: Load, const G: usize>(
        q: *const f32,
        hd: usize,
        k: *const T,
        stride: usize,
        scale: f32,
        out: *mut f32,
        n: usize,
    ) -> usize {
        let mut lanes = [[_mm512_setzero_ps(); L]; G];
        let s = _mm512_set1_ps(scale);
        let mut j = 0;
        // SAFETY: positions below `n`, `hd` values each, heads below `G`.
        unsafe {
            while j + L <= n {
                for p in 0..L {
                    prefetch_row(k.wrapping_add((j + p + AHEAD) * stride), hd);
                    let v = dot_lanes::<T, G>(q, hd, hd, k.add((j + p) * stride));
                    for g in 0..G {
                        lanes[g][p] = v[g];
                    }
                }
                for g in 0..G {
                    _mm512_storeu_ps(out.add(g * n + j), _mm512_mul_ps(hsum16(&lanes[g]), s));
                }
                j += L;
            }
            while j < n {
                let v = dot_lanes::<T, G>(q, hd, hd, k.add(j * stride));
                for g in 0..G {
                    *out.add(g * n + j) = hsum(v[g]) * scale;
                }
                j += 1;
            }
        }
        G
    }

    /// The table's `weighted_sum`: up to [`HEADS`] heads at a time read each value row
    /// once, their outputs held in registers block by block; each element takes the same
    /// fused multiply-adds, in the same order, as `axpy` per position.
    ///
    /// # Safety
    /// AVX512F; `o` and `w` are whole heads (`hd` values and `n` weights each), `v` holds
    /// `(n - 1) · stride + hd` values.
    #[target_feature(enable = "avx512f")]
    unsafe fn weighted_sum<T: Load>(w: &[f32], v: &[T], stride: usize, o: &mut [f32], hd: usize) {
        let heads = o.len() / hd;
        let n = w.len() / heads;
        let (w, v, o) = (w.as_ptr(), v.as_ptr(), o.as_mut_ptr());
        let mut h = 0;
        while h < heads {
            let (wh, oh) = (w.wrapping_add(h * n), o.wrapping_add(h * hd));
            // SAFETY: the caller's contract, for heads `h ..`.
            h += unsafe {
                match heads - h {
                    1 => weighted_sum_heads::<T, 1>(wh, n, v, stride, oh, hd),
                    2 => weighted_sum_heads::<T, 2>(wh, n, v, stride, oh, hd),
                    3 => weighted_sum_heads::<T, 3>(wh, n, v, stride, oh, hd),
                    _ => weighted_sum_heads::<T, HEADS>(wh, n, v, stride, oh, hd),
                }
            };
        }
    }

    /// `G` heads' weighted sums (see [`weighted_sum`]). Returns `G`.
    ///
    /// # Safety
    /// As for [`weighted_sum`], for the `G` heads at `w` and `o`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn weighted_sum_heads<T: Load, const G: usize>(
        w: *const f32,
        n: usize,
        pv: *const T,
        stride: usize,
        po: *mut f32,
        hd: usize,
    ) -> usize {
        // SAFETY: every access is below `hd` in each head of `o`, below `n` in each head
        // of `w`, and below the caller's bound in `v`.
        unsafe {
            let mut i = 0;
            while i + 4 * L <= hd {
                let mut acc = [[_mm512_setzero_ps(); 4]; G];
                for g in 0..G {
                    for b in 0..4 {
                        acc[g][b] = _mm512_loadu_ps(po.add(g * hd + i + b * L));
                    }
                }
                for j in 0..n {
                    let p = pv.add(j * stride + i);
                    prefetch_row(p.wrapping_add(AHEAD * stride), 4 * L);
                    for b in 0..4 {
                        let x = T::load(p.add(b * L));
                        for g in 0..G {
                            acc[g][b] = _mm512_fmadd_ps(_mm512_set1_ps(*w.add(g * n + j)), x, acc[g][b]);
                        }
                    }
                }
                for g in 0..G {
                    for b in 0..4 {
                        _mm512_storeu_ps(po.add(g * hd + i + b * L), acc[g][b]);
                    }
                }
                i += 4 * L;
            }
            while i + L <= hd {
                let mut acc = [_mm512_setzero_ps(); G];
                for g in 0..G {
                    acc[g] = _mm512_loadu_ps(po.add(g * hd + i));
                }
                for j in 0..n {
                    prefetch_row(pv.wrapping_add((j + AHEAD) * stride + i), L);
                    let x = T::load(pv.add(j * stride + i));
                    for g in 0..G {
                        acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(*w.add(g * n + j)), x, acc[g]);
                    }
                }
                for g in 0..G {
                    _mm512_storeu_ps(po.add(g * hd + i), acc[g]);
                }
                i += L;
            }
            if i < hd {
                let mask = tail_mask(hd - i);
                for g in 0..G {
                    let po = po.add(g * hd + i);
                    for j in 0..n {
                        let (a, p) = (_mm512_set1_ps(*w.add(g * n + j)), pv.add(j * stride + i));
                        let y = _mm512_maskz_loadu_ps(mask, po);
                        _mm512_mask_storeu_ps(po, mask, _mm512_fmadd_ps(a, T::load_n(p, hd - i), y));
                    }
                }
            }
        }
        G
    }

    /// `exp(x)` in each lane, within about an ulp of the correctly rounded value: `x =
    /// n·ln 2 + r` with `|r| ≤ ln 2 / 2`, a degree-7 Taylor polynomial for `e^r`, scaled
    /// by `2^n`. Lanes far below −87 come out as 0, as `expf` gives them.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn exp(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(-104.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
        ));
        // ln 2 in two parts: n·0.693145751953125 is exact for the n that occur.
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    /// The lanes of `x` from `i`: all 16, or the `n − i < 16` left with `fill` beyond them.
    ///
    /// # Safety
    /// AVX-512F; `x[i..n]` readable.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn lanes_from(x: *const f32, i: usize, n: usize, fill: f32) -> __m512 {
        // SAFETY: the caller's bound; masked lanes are not read.
        unsafe {
            match i + L <= n {
                true => _mm512_loadu_ps(x.add(i)),
                false => _mm512_mask_loadu_ps(_mm512_set1_ps(fill), tail_mask(n - i), x.add(i)),
            }
        }
    }

    /// Stores the lanes of `v` that [`lanes_from`] read at `i`.
    ///
    /// # Safety
    /// AVX-512F; `x[i..n]` writable.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store_lanes(x: *mut f32, i: usize, n: usize, v: __m512) {
        // SAFETY: the caller's bound; masked lanes are not written.
        unsafe {
            match i + L <= n {
                true => _mm512_storeu_ps(x.add(i), v),
                false => _mm512_mask_storeu_ps(x.add(i), tail_mask(n - i), v),
            }
        }
    }

    /// The table's `softmax`, 16 lanes at a time (the sum in lanes, then [`hsum`]).
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn softmax(x: &mut [f32]) {
        let (n, p) = (x.len(), x.as_mut_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i < n {
                m = _mm512_max_ps(m, lanes_from(p, i, n, f32::NEG_INFINITY));
                i += L;
            }
            let m = _mm512_set1_ps(_mm512_reduce_max_ps(m));
            let mut sum = _mm512_setzero_ps();
            i = 0;
            while i < n {
                // The lanes past `n` read −∞ and give 0.
                let e = exp(_mm512_sub_ps(lanes_from(p, i, n, f32::NEG_INFINITY), m));
                let e = _mm512_maskz_mov_ps(if i + L <= n { 0xFFFF } else { tail_mask(n - i) }, e);
                sum = _mm512_add_ps(sum, e);
                store_lanes(p, i, n, e);
                i += L;
            }
            let sum = _mm512_set1_ps(hsum(sum));
            i = 0;
            while i < n {
                store_lanes(p, i, n, _mm512_div_ps(lanes_from(p, i, n, 0.0), sum));
                i += L;
            }
        }
    }

    /// The table's `max_exp_sum`: the max in lanes (NaN lanes read as −∞), then each
    /// lane's `exp(x − max)` in f32, widened and summed in f64 lanes.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn max_exp_sum(x: &[f32]) -> (f32, f64) {
        let (n, p) = (x.len(), x.as_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i < n {
                let v = lanes_from(p, i, n, f32::NEG_INFINITY);
                // `max(m, NaN)` gives NaN's partner, `m`, so NaN never wins.
                m = _mm512_max_ps(v, m);
                i += L;
            }
            let max = _mm512_reduce_max_ps(m);
            if !max.is_finite() {
                return (max, 0.0);
            }
            let (m, mut lo, mut hi) = (_mm512_set1_ps(max), _mm512_setzero_pd(), _mm512_setzero_pd());
            i = 0;
            while i < n {
                let v = lanes_from(p, i, n, f32::NEG_INFINITY);
                let keep = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
                let e = _mm512_maskz_mov_ps(keep, exp(_mm512_sub_ps(v, m)));
                lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
                hi = _mm512_add_pd(
                    hi,
                    _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)))),
                );
                i += L;
            }
            (max, _mm512_reduce_add_pd(_mm512_add_pd(lo, hi)))
        }
    }

    /// The table's `silu_mul`: `g / (1 + exp(−g)) · u`, 16 lanes at a time.
    ///
    /// # Safety
    /// AVX-512F; `g.len() == u.len()`.
    #[target_feature(enable = "avx512f")]
    unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        let (n, pg, pu) = (g.len().min(u.len()), g.as_mut_ptr(), u.as_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut i = 0;
            while i < n {
                let x = lanes_from(pg, i, n, 0.0);
                let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
                let y = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
                store_lanes(pg, i, n, _mm512_mul_ps(y, lanes_from(pu, i, n, 0.0)));
                i += L;
            }
        }
    }

    /// A mask of the low `n < 16` lanes.
    #[inline(always)]
    fn tail_mask(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }
}
