//! AVX2 + FMA + F16C kernels: 8 f32 lanes. F16 is widened with `vcvtph2ps`, BF16 by
//! moving its bits into the high half of each 32-bit lane. Unavailable off x86-64.

use super::Ops;

/// The kernel table, if this CPU has AVX2, FMA and F16C.
pub(super) fn ops() -> Option<&'static Ops> {
    #[cfg(target_arch = "x86_64")]
    if strata_quant::isa::avx2()
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
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
    use strata_quant::simd::act256::imp::hmax;

    /// f32 lanes per register.
    const L: usize = 8;
    /// How far ahead of its reads the few-rows kernel prefetches each weight row, in bytes
    /// (the hardware prefetcher alone leaves bandwidth unused on the decode path).
    const PREFETCH_AHEAD: usize = 1024;
    /// Output features per packed panel: two registers.
    const NR: usize = 2 * L;
    /// x rows per register tile: `MR × 2` accumulators of the 16 registers.
    const MR: usize = 6;

    pub(super) static OPS: Ops = super::super::ops_table!();

    /// Weight elements that widen to 8 f32 lanes.
    trait Load: WElem {
        /// Loads 8 elements at `p` as f32.
        ///
        /// # Safety
        /// AVX2, FMA, F16C; `p..p + 8` readable.
        unsafe fn load(p: *const Self) -> __m256;
    }

    impl Load for f32 {
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            // SAFETY: by the trait contract.
            unsafe { _mm256_loadu_ps(p) }
        }
    }

    impl Load for F16 {
        #[inline(always)]
        unsafe fn load(p: *const F16) -> __m256 {
            // SAFETY: by the trait contract.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
    }

    impl Load for Bf16 {
        #[inline(always)]
        unsafe fn load(p: *const Bf16) -> __m256 {
            // SAFETY: by the trait contract.
            unsafe {
                let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
            }
        }
    }

    /// Loads `n < 8` elements at `p` as f32, zero-filling the other lanes.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `p..p + n` readable.
    #[inline(always)]
    unsafe fn load_part<T: Load>(p: *const T, n: usize) -> __m256 {
        let mut buf = [T::ZERO; L];
        // SAFETY: `n < L` elements are readable at `p`; `buf` holds `L`.
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            T::load(buf.as_ptr())
        }
    }

    /// The sum of the 8 lanes.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: AVX2 by the caller.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// # Safety
    /// AVX2, FMA, F16C and the contract of `Ops::small`.
    #[target_feature(enable = "avx2,fma,f16c")]
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
        // Weight rows per group: `4 × G` accumulators plus `G + 1` operands fit 16 registers.
        // SAFETY: forwarded contract.
        unsafe { if x.rows <= 2 { small_g::<T, 4>(x, w, k, cols, dst) } else { small_g::<T, 2>(x, w, k, cols, dst) } }
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
            let mut acc = [[_mm256_setzero_ps(); G]; R];
            let mut wv = [_mm256_setzero_ps(); G];
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
                    let xv = _mm256_loadu_ps(xp.add(r * x.ld + kk));
                    for c in 0..G {
                        acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
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
                        acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
                    }
                }
            }
            for r in 0..R {
                for c in 0..G {
                    *dst.at(r, c).ptr = hsum(acc[r][c]);
                }
            }
        }
        R
    }

    /// # Safety
    /// AVX2, FMA, F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack(w: Weights, cols: Range<usize>, ks: Range<usize>, packed: &mut [f32]) {
        // SAFETY: features by contract; bounds are checked in `pack_t`.
        unsafe {
            match w.data {
                WData::F32(d) => pack_t(d, w.k, cols, ks, packed),
                WData::F16(d) => pack_t(d, w.k, cols, ks, packed),
                WData::Bf16(d) => pack_t(d, w.k, cols, ks, packed),
            }
        }
    }

    /// Converts and transposes 8 × 8 blocks: 8 weight rows' next 8 values become 8
    /// consecutive `packed` rows' 8 lanes.
    #[inline(always)]
    unsafe fn pack_t<T: Load>(w: &[T], k: usize, cols: Range<usize>, ks: Range<usize>, packed: &mut [f32]) {
        let (n, kc) = (cols.len(), ks.len());
        assert!(n <= NR && packed.len() >= kc * NR && ks.end <= k && cols.end * k <= w.len());
        let dst = packed.as_mut_ptr();
        // SAFETY: reads stay in rows `cols` and columns `ks` of `w`, writes in the first
        // `kc × NR` values of `packed` (asserted above); features by the caller.
        unsafe {
            for h in 0..NR / L {
                let mut kk = 0;
                while kk < kc {
                    let len = L.min(kc - kk);
                    let mut v = [_mm256_setzero_ps(); L];
                    for (i, v) in v.iter_mut().enumerate() {
                        let j = h * L + i;
                        if j < n {
                            let p = w.as_ptr().add((cols.start + j) * k + ks.start + kk);
                            *v = if len == L { T::load(p) } else { load_part(p, len) };
                        }
                    }
                    transpose8(&mut v);
                    for (c, v) in v.iter().enumerate().take(len) {
                        _mm256_storeu_ps(dst.add((kk + c) * NR + h * L), *v);
                    }
                    kk += L;
                }
            }
        }
    }

    /// Transposes an 8 × 8 block held as 8 rows.
    #[inline(always)]
    unsafe fn transpose8(r: &mut [__m256; L]) {
        // SAFETY: AVX by the caller.
        unsafe {
            let mut t = [_mm256_setzero_ps(); L];
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            // u[4i + j], 128-bit lane l: column 4l + j of rows 4i..4i + 4.
            let mut u = [_mm256_setzero_ps(); L];
            for i in 0..2 {
                u[4 * i] = _mm256_shuffle_ps::<0x44>(t[4 * i], t[4 * i + 2]);
                u[4 * i + 1] = _mm256_shuffle_ps::<0xEE>(t[4 * i], t[4 * i + 2]);
                u[4 * i + 2] = _mm256_shuffle_ps::<0x44>(t[4 * i + 1], t[4 * i + 3]);
                u[4 * i + 3] = _mm256_shuffle_ps::<0xEE>(t[4 * i + 1], t[4 * i + 3]);
            }
            for j in 0..4 {
                r[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
                r[4 + j] = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
            }
        }
    }

    /// # Safety
    /// AVX2, FMA, F16C and the contract of `Ops::panel`.
    #[target_feature(enable = "avx2,fma,f16c")]
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
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            if accumulate {
                for (r, acc) in acc.iter_mut().enumerate() {
                    acc[0] = _mm256_loadu_ps(dst.at(r, 0).ptr);
                    acc[1] = _mm256_loadu_ps(dst.at(r, L).ptr);
                }
            }
            for kk in 0..kc {
                if let Some(line) = pf.tick() {
                    _mm_prefetch::<_MM_HINT_T1>(line.cast());
                }
                let w0 = _mm256_loadu_ps(packed.add(kk * NR));
                let w1 = _mm256_loadu_ps(packed.add(kk * NR + L));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xb = _mm256_broadcast_ss(&*xp.add(r * x.ld + kk));
                    acc[0] = _mm256_fmadd_ps(xb, w0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(xb, w1, acc[1]);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(dst.at(r, 0).ptr, acc[0]);
                _mm256_storeu_ps(dst.at(r, L).ptr, acc[1]);
            }
        }
    }

    /// # Safety
    /// AVX2, FMA; `a.len() == b.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { dot_with(a, b) }
    }

    /// [`dot`] with `b` in any element type widened to f32 (exactly, so an f16 `b` gives
    /// the bits its f32 widening gives).
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `a.len() == b.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn dot_with<T: Load>(a: &[f32], b: &[T]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 4 * L <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let o = i + j * L;
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(o)), T::load(pb.add(o)), *acc);
                }
                i += 4 * L;
            }
            while i + L <= n {
                acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), T::load(pb.add(i)), acc[0]);
                i += L;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut total = hsum(sum);
            while i < n {
                total += *pa.add(i) * (*pb.add(i)).to_f32();
                i += 1;
            }
            total
        }
    }

    /// # Safety
    /// AVX2, FMA; `x.len() == y.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let a = _mm256_set1_ps(alpha);
            let mut i = 0;
            while i + L <= n {
                let v = _mm256_fmadd_ps(a, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), v);
                i += L;
            }
            while i < n {
                *py.add(i) = alpha.mul_add(*px.add(i), *py.add(i));
                i += 1;
            }
        }
    }
    /// [`scores_one`] for each head of `q`, as the table's `scores` asks.
    ///
    /// # Safety
    /// AVX2,FMA,F16C; `q` and `out` are whole heads (`hd` values and `n` scores each), `k`
    /// holds `(n - 1) · stride + hd` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores<T: Load>(q: &[f32], hd: usize, k: &[T], stride: usize, scale: f32, out: &mut [f32]) {
        let n = out.len() / (q.len() / hd);
        for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(n)) {
            // SAFETY: the caller's bound, for this head.
            unsafe { scores_one(q, k, stride, scale, out) };
        }
    }

    /// [`weighted_sum_one`] for each head of `o`, as the table's `weighted_sum` asks.
    ///
    /// # Safety
    /// AVX2,FMA,F16C; `o` and `w` are whole heads (`hd` values and `n` weights each), `v`
    /// holds `(n - 1) · stride + hd` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_sum<T: Load>(w: &[f32], v: &[T], stride: usize, o: &mut [f32], hd: usize) {
        let n = w.len() / (o.len() / hd);
        for (o, w) in o.chunks_exact_mut(hd).zip(w.chunks_exact(n)) {
            // SAFETY: the caller's bound, for this head.
            unsafe { weighted_sum_one(w, v, stride, o) };
        }
    }

    /// `exp(x)` in each lane, as the AVX-512 kernel's `exp` computes it: `x = n·ln 2 + r`
    /// with `|r| ≤ ln 2 / 2`, a degree-7 Taylor polynomial for `e^r`, scaled by `2^n` in
    /// two exact steps of `2^(n/2)` (AVX2 has no `scalef`), so that results overflow to
    /// ∞ and fall through the subnormals to 0 as `expf`'s do. Lanes are clamped to ±104
    /// first (beyond which every `f32` result is 0 or ∞).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn exp(x: __m256) -> __m256 {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0)), _mm256_set1_ps(104.0));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        ));
        // ln 2 in two parts: n·0.693145751953125 is exact for the n that occur.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(1.0 / 5040.0);
        for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        // |n| ≤ 150: each half within the normal exponents.
        let n = _mm256_cvtps_epi32(n);
        let half = _mm256_srai_epi32::<1>(n);
        let pow2 =
            |e: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e, _mm256_set1_epi32(127))));
        _mm256_mul_ps(_mm256_mul_ps(p, pow2(half)), pow2(_mm256_sub_epi32(n, half)))
    }

    /// The low `n < 8` lanes set.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn tail_mask(n: usize) -> __m256i {
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
    }

    /// The lanes of `x` from `i`: all 8, or the `n − i < 8` left with `fill` beyond them.
    ///
    /// # Safety
    /// AVX2; `x[i..n]` readable.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn lanes_from(x: *const f32, i: usize, n: usize, fill: f32) -> __m256 {
        // SAFETY: the caller's bound; masked lanes are not read.
        unsafe {
            match i + L <= n {
                true => _mm256_loadu_ps(x.add(i)),
                false => {
                    let m = tail_mask(n - i);
                    _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(x.add(i), m), _mm256_castsi256_ps(m))
                }
            }
        }
    }

    /// Stores the lanes of `v` that [`lanes_from`] read at `i`.
    ///
    /// # Safety
    /// AVX2; `x[i..n]` writable.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn store_lanes(x: *mut f32, i: usize, n: usize, v: __m256) {
        // SAFETY: the caller's bound; masked lanes are not written.
        unsafe {
            match i + L <= n {
                true => _mm256_storeu_ps(x.add(i), v),
                false => _mm256_maskstore_ps(x.add(i), tail_mask(n - i), v),
            }
        }
    }

    /// The table's `softmax`, 8 lanes at a time (the sum in lanes, then [`hsum`]).
    ///
    /// # Safety
    /// AVX2, FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn softmax(x: &mut [f32]) {
        let (n, p) = (x.len(), x.as_mut_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i < n {
                m = _mm256_max_ps(m, lanes_from(p, i, n, f32::NEG_INFINITY));
                i += L;
            }
            let m = _mm256_set1_ps(hmax(m));
            let mut sum = _mm256_setzero_ps();
            i = 0;
            while i < n {
                // The lanes past `n` read −∞ and give 0.
                let e = exp(_mm256_sub_ps(lanes_from(p, i, n, f32::NEG_INFINITY), m));
                let e = if i + L <= n { e } else { _mm256_and_ps(e, _mm256_castsi256_ps(tail_mask(n - i))) };
                sum = _mm256_add_ps(sum, e);
                store_lanes(p, i, n, e);
                i += L;
            }
            let sum = _mm256_set1_ps(hsum(sum));
            i = 0;
            while i < n {
                store_lanes(p, i, n, _mm256_div_ps(lanes_from(p, i, n, 0.0), sum));
                i += L;
            }
        }
    }

    /// The table's `silu_mul`: `g / (1 + exp(−g)) · u`, 8 lanes at a time.
    ///
    /// # Safety
    /// AVX2, FMA; `g.len() == u.len()`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        let (n, pg, pu) = (g.len().min(u.len()), g.as_mut_ptr(), u.as_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut i = 0;
            while i < n {
                let x = lanes_from(pg, i, n, 0.0);
                let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
                let y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
                store_lanes(pg, i, n, _mm256_mul_ps(y, lanes_from(pu, i, n, 0.0)));
                i += L;
            }
        }
    }

    /// The table's `max_exp_sum`: the max in lanes (NaN lanes lose), then each lane's
    /// `exp(x − max)` in f32, widened and summed in f64 lanes.
    ///
    /// # Safety
    /// AVX2, FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn max_exp_sum(x: &[f32]) -> (f32, f64) {
        let (n, p) = (x.len(), x.as_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i < n {
                // `max(NaN, m)` gives `m`, so NaN never wins.
                m = _mm256_max_ps(lanes_from(p, i, n, f32::NEG_INFINITY), m);
                i += L;
            }
            let max = hmax(m);
            if !max.is_finite() {
                return (max, 0.0);
            }
            let (m, mut lo, mut hi) = (_mm256_set1_ps(max), _mm256_setzero_pd(), _mm256_setzero_pd());
            i = 0;
            while i < n {
                let v = lanes_from(p, i, n, f32::NEG_INFINITY);
                let e = _mm256_and_ps(exp(_mm256_sub_ps(v, m)), _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
                lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
                hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
                i += L;
            }
            let s = _mm256_add_pd(lo, hi);
            let s = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd::<1>(s));
            (max, _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s))))
        }
    }

    /// One head's scores.
    ///
    /// # Safety
    /// AVX2,FMA,F16C; `k` holds `(out.len() - 1) · stride + q.len()` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn scores_one<T: Load>(q: &[f32], k: &[T], stride: usize, scale: f32, out: &mut [f32]) {
        let hd = q.len();
        for (j, o) in out.iter_mut().enumerate() {
            // SAFETY: the caller's bound; `dot_with` inlines here, with the same features.
            *o = unsafe { dot_with(q, k.get_unchecked(j * stride..j * stride + hd)) } * scale;
        }
    }

    /// The values' weighted sum with `o` held in registers, block by block: each element
    /// takes the same fused multiply-adds, in the same order, as `axpy` per position.
    ///
    /// # Safety
    /// AVX2,FMA,F16C; `v` holds `(w.len() - 1) · stride + o.len()` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn weighted_sum_one<T: Load>(w: &[f32], v: &[T], stride: usize, o: &mut [f32]) {
        let n = o.len();
        let (pv, po) = (v.as_ptr(), o.as_mut_ptr());
        // SAFETY: every access is below `n` in `o` and below the caller's bound in `v`.
        unsafe {
            let mut i = 0;
            while i + 4 * L <= n {
                let mut acc = [_mm256_setzero_ps(); 4];
                for (b, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_loadu_ps(po.add(i + b * L));
                }
                for (j, &wj) in w.iter().enumerate() {
                    let (a, p) = (_mm256_set1_ps(wj), pv.add(j * stride + i));
                    for (b, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(a, T::load(p.add(b * L)), *acc);
                    }
                }
                for (b, acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(po.add(i + b * L), *acc);
                }
                i += 4 * L;
            }
            while i + L <= n {
                let mut acc = _mm256_loadu_ps(po.add(i));
                for (j, &wj) in w.iter().enumerate() {
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(wj), T::load(pv.add(j * stride + i)), acc);
                }
                _mm256_storeu_ps(po.add(i), acc);
                i += L;
            }
            while i < n {
                for (j, &wj) in w.iter().enumerate() {
                    *po.add(i) = wj.mul_add((*pv.add(j * stride + i)).to_f32(), *po.add(i));
                }
                i += 1;
            }
        }
    }
}
