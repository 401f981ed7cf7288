//! AVX-512F kernels: 16 f32 lanes. F16 is widened with `vcvtph2ps`, BF16 by moving its
//! bits into the high half of each 32-bit lane. Unavailable off x86-64.

use super::Ops;

/// The kernel table, if this CPU has AVX-512F.
pub(super) fn ops() -> Option<&'static Ops> {
    #[cfg(target_arch = "x86_64")]
    if super::super::isa::avx512() && std::arch::is_x86_feature_detected!("avx512f") {
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
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: every access is below `n`.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 4 * L <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let o = i + j * L;
                    *acc = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(o)), T::load(pb.add(o)), *acc);
                }
                i += 4 * L;
            }
            while i + L <= n {
                acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), T::load(pb.add(i)), acc[0]);
                i += L;
            }
            if i < n {
                let (va, vb) = (_mm512_maskz_loadu_ps(tail_mask(n - i), pa.add(i)), T::load_n(pb.add(i), n - i));
                acc[1] = _mm512_fmadd_ps(va, vb, acc[1]);
            }
            let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            _mm512_reduce_add_ps(sum)
        }
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

    /// # Safety
    /// AVX512F; `k` holds `(out.len() - 1) · stride + q.len()` values.
    #[target_feature(enable = "avx512f")]
    unsafe fn scores<T: Load>(q: &[f32], k: &[T], stride: usize, scale: f32, out: &mut [f32]) {
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
    /// AVX512F; `v` holds `(w.len() - 1) · stride + o.len()` values.
    #[target_feature(enable = "avx512f")]
    unsafe fn weighted_sum<T: Load>(w: &[f32], v: &[T], stride: usize, o: &mut [f32]) {
        let n = o.len();
        let (pv, po) = (v.as_ptr(), o.as_mut_ptr());
        // SAFETY: every access is below `n` in `o` and below the caller's bound in `v`.
        unsafe {
            let mut i = 0;
            while i + 4 * L <= n {
                let mut acc = [_mm512_setzero_ps(); 4];
                for (b, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_loadu_ps(po.add(i + b * L));
                }
                for (j, &wj) in w.iter().enumerate() {
                    let (a, p) = (_mm512_set1_ps(wj), pv.add(j * stride + i));
                    for (b, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_fmadd_ps(a, T::load(p.add(b * L)), *acc);
                    }
                }
                for (b, acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(po.add(i + b * L), *acc);
                }
                i += 4 * L;
            }
            while i + L <= n {
                let mut acc = _mm512_loadu_ps(po.add(i));
                for (j, &wj) in w.iter().enumerate() {
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(wj), T::load(pv.add(j * stride + i)), acc);
                }
                _mm512_storeu_ps(po.add(i), acc);
                i += L;
            }
            if i < n {
                let mask = tail_mask(n - i);
                for (j, &wj) in w.iter().enumerate() {
                    let (a, p) = (_mm512_set1_ps(wj), pv.add(j * stride + i));
                    let y = _mm512_maskz_loadu_ps(mask, po.add(i));
                    _mm512_mask_storeu_ps(po.add(i), mask, _mm512_fmadd_ps(a, T::load_n(p, n - i), y));
                }
            }
        }
    }

    /// A mask of the low `n < 16` lanes.
    #[inline(always)]
    fn tail_mask(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }
}
