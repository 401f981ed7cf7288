//! Portable kernels: the fallback on CPUs without the SIMD features, and the shape every
//! SIMD table follows. Plain `a * b + c` rather than `mul_add`, which without hardware FMA
//! becomes a libm call per element.

use std::ops::Range;

use super::{Bf16, F16, Ops, OutPtr, Prefetch, WData, WElem, Weights, XRows};

/// Output features per packed panel.
const NR: usize = 8;
/// x rows per register tile.
const MR: usize = 4;

pub(super) static OPS: Ops = super::ops_table!();

/// # Safety
/// See `Ops::small`: `dst` must cover `x.rows` rows and the columns `cols`.
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

unsafe fn small_t<T: WElem>(x: XRows, w: &[T], k: usize, cols: Range<usize>, dst: OutPtr) {
    for o in cols {
        let wr = &w[o * k..][..k];
        for r in 0..x.rows {
            let xr = &x.data[r * x.ld..][..k];
            let sum = xr.iter().zip(wr).fold(0.0f32, |acc, (&a, &b)| acc + a * b.to_f32());
            // SAFETY: `(r, o)` is inside `dst` by the caller's contract.
            unsafe { *dst.at(r, o).ptr = sum };
        }
    }
}

/// # Safety
/// None beyond the slice bounds, which are checked.
unsafe fn pack(w: Weights, cols: Range<usize>, ks: Range<usize>, packed: &mut [f32]) {
    match w.data {
        WData::F32(d) => pack_t(d, w.k, cols, ks, packed),
        WData::F16(d) => pack_t::<F16>(d, w.k, cols, ks, packed),
        WData::Bf16(d) => pack_t::<Bf16>(d, w.k, cols, ks, packed),
    }
}

fn pack_t<T: WElem>(w: &[T], k: usize, cols: Range<usize>, ks: Range<usize>, packed: &mut [f32]) {
    let n = cols.len();
    assert!(n <= NR && packed.len() >= ks.len() * NR);
    for (kk, dst) in packed.chunks_exact_mut(NR).take(ks.len()).enumerate() {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = if j < n { w[(cols.start + j) * k + ks.start + kk].to_f32() } else { 0.0 };
        }
    }
}

/// # Safety
/// See `Ops::panel`: `dst` must cover `x.rows × NR` elements. (No prefetching here.)
unsafe fn panel(x: XRows, kc: usize, packed: &[f32], dst: OutPtr, accumulate: bool, _next: Prefetch) {
    let mut r = 0;
    while r < x.rows {
        let rows = MR.min(x.rows - r);
        let mut acc = [[0.0f32; NR]; MR];
        for (i, acc) in acc.iter_mut().enumerate().take(rows) {
            let xr = &x.data[(r + i) * x.ld..][..kc];
            for (&xv, wv) in xr.iter().zip(packed.chunks_exact(NR)) {
                for (a, &b) in acc.iter_mut().zip(wv) {
                    *a += xv * b;
                }
            }
        }
        for (i, acc) in acc.iter().enumerate().take(rows) {
            // SAFETY: row `r + i` of `dst` has `NR` elements by the caller's contract.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.at(r + i, 0).ptr, NR) };
            for (o, &a) in out.iter_mut().zip(acc) {
                *o = if accumulate { *o + a } else { a };
            }
        }
        r += rows;
    }
}

/// # Safety
/// None.
unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(a, b)
}

/// [`dot`] with `b` in any element type widened to f32 (exactly).
fn dot_with<T: WElem>(a: &[f32], b: &[T]) -> f32 {
    // Eight independent partial sums: faster, and closer to what the SIMD kernels add up.
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y.to_f32()).sum();
    for (ca, cb) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i].to_f32();
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// # Safety
/// None.
unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_with(alpha, x, y)
}

/// [`axpy`] with `x` in any element type widened to f32 (exactly).
fn axpy_with<T: WElem>(alpha: f32, x: &[T], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x.to_f32();
    }
}

/// # Safety
/// `q` and `out` are whole heads (`hd` values and `n` scores each), `k` holds
/// `(n - 1) · stride + hd` values.
unsafe fn scores<T: WElem>(q: &[f32], hd: usize, k: &[T], stride: usize, scale: f32, out: &mut [f32]) {
    let n = out.len() / (q.len() / hd);
    for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(n)) {
        for (j, o) in out.iter_mut().enumerate() {
            *o = dot_with(q, &k[j * stride..][..hd]) * scale;
        }
    }
}

/// # Safety
/// `o` and `w` are whole heads (`hd` values and `n` weights each), `v` holds
/// `(n - 1) · stride + hd` values.
unsafe fn weighted_sum<T: WElem>(w: &[f32], v: &[T], stride: usize, o: &mut [f32], hd: usize) {
    let n = w.len() / (o.len() / hd);
    for (o, w) in o.chunks_exact_mut(hd).zip(w.chunks_exact(n)) {
        for (j, &wj) in w.iter().enumerate() {
            axpy_with(wj, &v[j * stride..][..hd], o);
        }
    }
}

/// # Safety
/// None.
unsafe fn softmax(x: &mut [f32]) {
    softmax_ref(x)
}

/// The softmax with `f32::exp`, summing in order.
pub(super) fn softmax_ref(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for s in x.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    x.iter_mut().for_each(|s| *s /= sum);
}

/// # Safety
/// None.
unsafe fn max_exp_sum(x: &[f32]) -> (f32, f64) {
    max_exp_sum_ref(x)
}

/// The max of `x` without its NaNs, and `Σ exp(x − max)` with `f64::exp`, in order.
pub(crate) fn max_exp_sum_ref(x: &[f32]) -> (f32, f64) {
    let max = x.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let sum = match max.is_finite() {
        true => x.iter().filter(|l| !l.is_nan()).map(|&l| (l as f64 - max as f64).exp()).sum(),
        false => 0.0,
    };
    (max, sum)
}

/// # Safety
/// None.
unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
    silu_mul_ref(g, u)
}

/// SwiGLU's product with `f32::exp`.
pub(super) fn silu_mul_ref(g: &mut [f32], u: &[f32]) {
    g.iter_mut().zip(u).for_each(|(g, &u)| *g = *g / (1.0 + (-*g).exp()) * u);
}
