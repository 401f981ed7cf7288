//! NDSQ (seed 000): a weight matrix as `W ≈ L + S + D + R`, each part in a codec of its
//! own, written as the `.cawsf` shard types the seed names (`docs/formats.md`).
//!
//! The factorisation follows the seed's order:
//! 1. `L`, rank `r`, by a randomised truncated SVD of `W` (two power iterations), kept as
//!    two FP16 factors `U` (`rows x r`, the singular values folded in) and `V` (`r x cols`);
//! 2. the residue `W' = W - L` (with `L` from the FP16 factors, as it is decoded);
//! 3. `S`: the `outlier_q` fraction of `W'`'s entries largest in magnitude, exact (f32),
//!    as (row, col, value) triplets, then zeroed;
//! 4. `D`: the main diagonal of what is left, FP16;
//! 5. `R`: the rest, product-quantised: each row cut into vectors of `d` values, each
//!    vector into `m` sub-vectors of `d / m`, each sub-vector replaced by the nearest of
//!    `k` centroids of its position's codebook (k-means, Lloyd's iterations).
//!
//! Decoding adds the four parts back ([`Ndsq::reconstruct`]): the result is exactly the
//! sum of the decoded components, and an approximation of `W` whose error the caller
//! measures on a real model (docs/benchmarks.md).

use anyhow::{Context, bail};
use half::f16;
use rayon::prelude::*;

use strata_backend::cpu::matmul::dot;
use strata_tensor::tensor::HostTensor;

/// The knobs of the decomposition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NdsqParams {
    /// Rank of `L` (capped by the matrix).
    pub rank: usize,
    /// Fraction of entries kept exactly as outliers in `S` (0 to 1).
    pub outlier_q: f64,
    /// Values per PQ vector (a divisor of the columns; `pq_m` divides it).
    pub pq_d: usize,
    /// Sub-vectors (codebooks) per vector.
    pub pq_m: usize,
    /// Centroids per codebook (2 to 256: codes are bytes).
    pub pq_k: usize,
}

impl Default for NdsqParams {
    fn default() -> Self {
        NdsqParams { rank: 16, outlier_q: 0.005, pq_d: 8, pq_m: 4, pq_k: 256 }
    }
}

impl NdsqParams {
    pub fn check(&self) -> anyhow::Result<()> {
        if !(0.0..1.0).contains(&self.outlier_q) {
            bail!("--outlier-q {} is not in [0, 1)", self.outlier_q);
        }
        if self.pq_m == 0 || self.pq_d == 0 || !self.pq_d.is_multiple_of(self.pq_m) || self.pq_d > 1024 {
            bail!("--pq-m {} must divide the PQ vector length {} (at most 1024)", self.pq_m, self.pq_d);
        }
        if !(2..=256).contains(&self.pq_k) {
            bail!("--pq-k {} is not between 2 and 256", self.pq_k);
        }
        Ok(())
    }
}

/// The product-quantised residue.
#[derive(Clone, Debug, PartialEq)]
pub struct Pq {
    pub d: usize,
    pub m: usize,
    pub k: usize,
    /// `m` codebooks of `k` centroids of `d / m` values each.
    pub codebooks: Vec<f32>,
    /// One byte per sub-vector: `rows * cols / d` vectors of `m` codes.
    pub codes: Vec<u8>,
}

/// One matrix, decomposed.
#[derive(Clone, Debug, PartialEq)]
pub struct Ndsq {
    pub rows: usize,
    pub cols: usize,
    /// `rows x r`, FP16 bits.
    pub u: Vec<u16>,
    /// `r x cols`, FP16 bits.
    pub v: Vec<u16>,
    pub rank: usize,
    /// `min(rows, cols)` values, FP16 bits.
    pub diag: Vec<u16>,
    /// Outliers: (row, col, value).
    pub sparse: Vec<(u32, u32, f32)>,
    pub pq: Pq,
}

fn h(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

fn f(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

/// `a (n_a x inner) · btᵀ` where `bt` is `n_b x inner`: `n_a x n_b`, on `pool`.
fn a_bt(pool: &rayon::ThreadPool, a: &[f32], n_a: usize, bt: &[f32], n_b: usize, inner: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n_a * n_b];
    let w = HostTensor::from_f32(bt, vec![n_b, inner]);
    strata_backend::cpu::matmul::matmul(pool, a, n_a, &w, &mut out);
    out
}

fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// Orthonormalises the rows of `a` (`n x len`) in place (modified Gram-Schmidt, twice
/// for stability); a row that vanishes becomes zero.
fn orthonormalise(a: &mut [f32], n: usize, len: usize) {
    for _ in 0..2 {
        for i in 0..n {
            let (done, rest) = a.split_at_mut(i * len);
            let row = &mut rest[..len];
            for j in 0..i {
                let q = &done[j * len..(j + 1) * len];
                let dot: f64 = q.iter().zip(row.iter()).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
                row.iter_mut().zip(q).for_each(|(y, x)| *y -= (dot as f32) * x);
            }
            let norm = row.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
            let inv = if norm > 1e-20 { (1.0 / norm) as f32 } else { 0.0 };
            row.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

/// Eigen-decomposition of a symmetric `n x n` matrix (cyclic Jacobi, f64): eigenvalues
/// descending and their eigenvectors as the columns of an `n x n` matrix.
fn symmetric_eigen(mut a: Vec<f64>, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut v = vec![0.0f64; n * n];
    (0..n).for_each(|i| v[i * n + i] = 1.0);
    for _ in 0..60 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j].powi(2))
            .sum();
        let total: f64 = a.iter().map(|x| x * x).sum();
        if off <= 1e-24 * total.max(1e-300) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq.abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let (c, s) = (1.0 / (t * t + 1.0).sqrt(), t / (t * t + 1.0).sqrt());
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| a[j * n + j].total_cmp(&a[i * n + i]));
    let vals = order.iter().map(|&i| a[i * n + i]).collect();
    let mut vecs = vec![0.0f64; n * n];
    for (new, &old) in order.iter().enumerate() {
        for k in 0..n {
            vecs[k * n + new] = v[k * n + old];
        }
    }
    (vals, vecs)
}

/// A deterministic standard normal stream (xorshift and Box-Muller).
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n).map(|_| ((-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos()) as f32).collect()
}

/// `L`'s factors for `w` (`rows x cols`) at rank `r`: `U` (`rows x r`) and `V`
/// (`r x cols`), by a randomised SVD with `r + 8` probes and two power iterations.
fn low_rank(pool: &rayon::ThreadPool, w: &[f32], rows: usize, cols: usize, r: usize) -> (Vec<f32>, Vec<f32>) {
    let k = (r + 8).min(rows).min(cols);
    let wt = transpose(w, rows, cols);
    // Qt: k x rows, an orthonormal basis of W's range.
    let omega_t = gaussian(k * cols, (rows * 31 + cols) as u64);
    let mut qt = transpose(&a_bt(pool, w, rows, &omega_t, k, cols), rows, k);
    orthonormalise(&mut qt, k, rows);
    for _ in 0..2 {
        let mut zt = transpose(&a_bt(pool, &wt, cols, &qt, k, rows), cols, k);
        orthonormalise(&mut zt, k, cols);
        qt = transpose(&a_bt(pool, w, rows, &zt, k, cols), rows, k);
        orthonormalise(&mut qt, k, rows);
    }
    // B = Qᵀ W (k x cols); B Bᵀ = E Λ Eᵀ; L = Q E_r E_rᵀ B.
    let b = a_bt(pool, &qt, k, &wt, cols, rows);
    let bbt = a_bt(pool, &b, k, &b, k, cols);
    let (_, e) = symmetric_eigen(bbt.iter().map(|&x| f64::from(x)).collect(), k);
    let er_t: Vec<f32> = (0..r).flat_map(|j| (0..k).map(move |t| (t, j))).map(|(t, j)| e[t * k + j] as f32).collect();
    let q = transpose(&qt, k, rows);
    let u = a_bt(pool, &q, rows, &er_t, r, k);
    let v = a_bt(pool, &er_t, r, &transpose(&b, k, cols), cols, k);
    (u, v)
}

/// Lloyd's k-means of `points` (`n x dim`) into `k` centroids, from `k` distinct-index
/// points, `iters` rounds on a sample; returns the centroids.
fn kmeans(points: &[f32], dim: usize, k: usize, iters: usize, seed: u64) -> Vec<f32> {
    let n = points.len() / dim;
    let step = (n / 32768).max(1);
    let sample: Vec<&[f32]> = points.chunks_exact(dim).step_by(step).collect();
    let mut cents = vec![0.0f32; k * dim];
    for c in 0..k {
        let i = ((c as u64).wrapping_mul(2_654_435_761).wrapping_add(seed) as usize) % sample.len().max(1);
        if let Some(p) = sample.get(i) {
            cents[c * dim..(c + 1) * dim].copy_from_slice(p);
        }
    }
    for _ in 0..iters {
        let assign: Vec<usize> = sample.par_iter().map(|p| nearest(&cents, dim, p)).collect();
        let mut sum = vec![0.0f64; k * dim];
        let mut count = vec![0usize; k];
        for (p, &a) in sample.iter().zip(&assign) {
            count[a] += 1;
            sum[a * dim..(a + 1) * dim].iter_mut().zip(p.iter()).for_each(|(s, x)| *s += f64::from(*x));
        }
        for c in 0..k {
            if count[c] > 0 {
                for j in 0..dim {
                    cents[c * dim + j] = (sum[c * dim + j] / count[c] as f64) as f32;
                }
            }
        }
    }
    cents
}

fn nearest(cents: &[f32], dim: usize, p: &[f32]) -> usize {
    let mut best = (f32::INFINITY, 0);
    for (c, cent) in cents.chunks_exact(dim).enumerate() {
        let d: f32 = cent.iter().zip(p).map(|(a, b)| (a - b) * (a - b)).sum();
        if d < best.0 {
            best = (d, c);
        }
    }
    best.1
}

impl Ndsq {
    /// Decomposes `w` (`rows x cols`, row-major).
    pub fn encode(
        pool: &rayon::ThreadPool,
        w: &[f32],
        rows: usize,
        cols: usize,
        p: &NdsqParams,
    ) -> anyhow::Result<Ndsq> {
        p.check()?;
        if rows == 0 || cols == 0 || w.len() != rows * cols {
            bail!("a {rows}x{cols} matrix with {} values", w.len());
        }
        if !cols.is_multiple_of(p.pq_d) {
            bail!("{cols} columns are not whole PQ vectors of {}", p.pq_d);
        }
        let r = p.rank.min(rows).min(cols);
        let (u, v) = if r > 0 { low_rank(pool, w, rows, cols, r) } else { (Vec::new(), Vec::new()) };
        let (u, v): (Vec<u16>, Vec<u16>) = (u.iter().map(|&x| h(x)).collect(), v.iter().map(|&x| h(x)).collect());
        let mut rest = w.to_vec();
        if r > 0 {
            let l = dense_low_rank(&u, &v, rows, cols, r);
            rest.iter_mut().zip(&l).for_each(|(x, l)| *x -= l);
        }
        // S: the largest residue entries, exact.
        let n_out = ((rows * cols) as f64 * p.outlier_q) as usize;
        let mut sparse = Vec::with_capacity(n_out);
        if n_out > 0 {
            let mut mags: Vec<f32> = rest.iter().map(|x| x.abs()).collect();
            let at = rows * cols - n_out;
            let (_, t, _) = mags.select_nth_unstable_by(at, f32::total_cmp);
            let t = *t;
            for (i, x) in rest.iter_mut().enumerate() {
                if x.abs() >= t && sparse.len() < n_out {
                    sparse.push(((i / cols) as u32, (i % cols) as u32, *x));
                    *x = 0.0;
                }
            }
        }
        // D: the main diagonal.
        let diag: Vec<u16> = (0..rows.min(cols)).map(|i| h(rest[i * cols + i])).collect();
        for (i, &d) in diag.iter().enumerate() {
            rest[i * cols + i] -= f(d);
        }
        // R: product quantisation, one codebook per sub-vector position.
        let (d, m, k) = (p.pq_d, p.pq_m, p.pq_k);
        let sub = d / m;
        let n_vec = rows * cols / d;
        let mut codebooks = Vec::with_capacity(m * k * sub);
        let mut codes = vec![0u8; n_vec * m];
        for j in 0..m {
            let pts: Vec<f32> = rest.chunks_exact(d).flat_map(|v| v[j * sub..(j + 1) * sub].iter().copied()).collect();
            let cents = kmeans(&pts, sub, k, 8, j as u64);
            let assign: Vec<u8> = pts.par_chunks_exact(sub).map(|pt| nearest(&cents, sub, pt) as u8).collect();
            for (v, &a) in assign.iter().enumerate() {
                codes[v * m + j] = a;
            }
            codebooks.extend(cents);
        }
        Ok(Ndsq { rows, cols, u, v, rank: r, diag, sparse, pq: Pq { d, m, k, codebooks, codes } })
    }

    /// The parts decoded to dense `rows x cols` matrices: L, S, D, R.
    pub fn components(&self) -> [Vec<f32>; 4] {
        let n = self.rows * self.cols;
        let l = match self.rank {
            0 => vec![0.0; n],
            r => dense_low_rank(&self.u, &self.v, self.rows, self.cols, r),
        };
        let mut s = vec![0.0f32; n];
        for &(r, c, x) in &self.sparse {
            s[r as usize * self.cols + c as usize] = x;
        }
        let mut dm = vec![0.0f32; n];
        for (i, &d) in self.diag.iter().enumerate() {
            dm[i * self.cols + i] = f(d);
        }
        [l, s, dm, self.decode_r()]
    }

    /// The routing key of each component, `[L, S, D, R]` (`format::route`): the unit
    /// dominant singular vector of the decoded component on its side of length `hidden`
    /// (the input side when the columns are `hidden`, else the output side); `None` when
    /// neither side is. A zero component has a zero key.
    pub fn component_keys(&self, hidden: usize) -> Option<[Vec<f32>; 4]> {
        let (rows, cols) = (self.rows, self.cols);
        let input = match () {
            _ if cols == hidden => true,
            _ if rows == hidden => false,
            _ => return None,
        };
        let triplets = |t: Vec<(usize, usize, f32)>| {
            let mul = |x: &[f32]| {
                let mut y = vec![0.0f32; rows];
                t.iter().for_each(|&(r, c, v)| y[r] += v * x[c]);
                y
            };
            let tmul = |y: &[f32]| {
                let mut x = vec![0.0f32; cols];
                t.iter().for_each(|&(r, c, v)| x[c] += v * y[r]);
                x
            };
            dominant(rows, cols, input, mul, tmul)
        };
        let (r, v) = (self.rank, &self.v);
        let u: Vec<f32> = self.u.iter().map(|&b| f(b)).collect();
        let vf: Vec<f32> = v.iter().map(|&b| f(b)).collect();
        // L = U V: through the rank-r middle.
        let l = dominant(
            rows,
            cols,
            input,
            |x| {
                let mid: Vec<f32> = (0..r).map(|t| dot(&vf[t * cols..(t + 1) * cols], x)).collect();
                (0..rows).map(|i| dot(&u[i * r..(i + 1) * r], &mid)).collect()
            },
            |y| {
                let mut mid = vec![0.0f32; r];
                (0..rows).for_each(|i| mid.iter_mut().zip(&u[i * r..(i + 1) * r]).for_each(|(m, a)| *m += a * y[i]));
                (0..cols).map(|c| (0..r).map(|t| vf[t * cols + c] * mid[t]).sum()).collect()
            },
        );
        let s = triplets(self.sparse.iter().map(|&(r, c, x)| (r as usize, c as usize, x)).collect());
        let d = triplets(self.diag.iter().enumerate().map(|(i, &b)| (i, i, f(b))).collect());
        let dense = self.decode_r();
        let rk = dominant(
            rows,
            cols,
            input,
            |x| dense.par_chunks_exact(cols).map(|row| dot(row, x)).collect(),
            |y| {
                let mut x = vec![0.0f32; cols];
                dense
                    .chunks_exact(cols)
                    .zip(y)
                    .for_each(|(row, &w)| x.iter_mut().zip(row).for_each(|(o, a)| *o += a * w));
                x
            },
        );
        Some([l, s, d, rk])
    }

    fn decode_r(&self) -> Vec<f32> {
        let Pq { d, m, codebooks, codes, k } = &self.pq;
        let sub = d / m;
        let mut r = vec![0.0f32; self.rows * self.cols];
        for (v, out) in r.chunks_exact_mut(*d).enumerate() {
            for j in 0..*m {
                let c = codes[v * m + j] as usize;
                let cent = &codebooks[(j * k + c) * sub..(j * k + c + 1) * sub];
                out[j * sub..(j + 1) * sub].copy_from_slice(cent);
            }
        }
        r
    }

    /// `L + S + D + R`, `rows x cols` f32: exactly the sum of [`components`](Self::components).
    pub fn reconstruct(&self) -> Vec<f32> {
        let [l, s, d, r] = self.components();
        l.iter().zip(&s).zip(&d).zip(&r).map(|(((l, s), d), r)| l + s + d + r).collect()
    }
}

/// Power iterations for the dominant right (`input`) or left singular vector of the
/// `rows x cols` operator `mul` (`x -> W x`) with transpose `tmul` (`y -> Wᵀ y`): unit
/// length, its largest-magnitude entry positive; zeros for a zero operator.
fn dominant(
    rows: usize,
    cols: usize,
    input: bool,
    mul: impl Fn(&[f32]) -> Vec<f32>,
    tmul: impl Fn(&[f32]) -> Vec<f32>,
) -> Vec<f32> {
    let n = if input { cols } else { rows };
    // A fixed start that is not orthogonal to any basis direction.
    let mut x: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 / 7.0).collect();
    for _ in 0..KEY_ITERATIONS {
        let y = if input { tmul(&mul(&x)) } else { mul(&tmul(&x)) };
        let norm = y.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        if !(norm > 0.0 && norm.is_finite()) {
            return vec![0.0; n];
        }
        x = y.iter().map(|v| (f64::from(*v) / norm) as f32).collect();
    }
    let big = x.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
    if big < 0.0 {
        x.iter_mut().for_each(|v| *v = -*v);
    }
    x
}

/// Power iterations per routing key (enough to find the dominant direction's
/// neighbourhood; keys are compared by cosine, not used as weights).
const KEY_ITERATIONS: usize = 12;

/// `U V` from the FP16 factors, row by row (`rows * r * cols` multiply-adds, in order).
fn dense_low_rank(u: &[u16], v: &[u16], rows: usize, cols: usize, r: usize) -> Vec<f32> {
    let v: Vec<f32> = v.iter().map(|&b| f(b)).collect();
    let mut out = vec![0.0f32; rows * cols];
    out.par_chunks_mut(cols.max(1)).enumerate().for_each(|(i, row)| {
        for t in 0..r {
            let ui = f(u[i * r + t]);
            row.iter_mut().zip(&v[t * cols..(t + 1) * cols]).for_each(|(o, x)| *o += ui * x);
        }
    });
    out
}

/// Shard payloads (`docs/formats.md`, NDSQ shards), little-endian.
pub mod payload {
    use super::*;

    fn put_u32(o: &mut Vec<u8>, x: usize) {
        o.extend_from_slice(&(x as u32).to_le_bytes());
    }

    /// An L or D payload: `rows:u32, cols:u32`, then `rows * cols` FP16 values.
    pub fn fp16(rows: usize, cols: usize, vals: &[u16]) -> Vec<u8> {
        let mut o = Vec::with_capacity(8 + 2 * vals.len());
        put_u32(&mut o, rows);
        put_u32(&mut o, cols);
        vals.iter().for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
        o
    }

    /// An S payload: `rows:u32, cols:u32, n:u32`, `n` (row:u32, col:u32) pairs, `n` f32.
    pub fn sparse(n: &Ndsq) -> Vec<u8> {
        let mut o = Vec::with_capacity(12 + 12 * n.sparse.len());
        put_u32(&mut o, n.rows);
        put_u32(&mut o, n.cols);
        put_u32(&mut o, n.sparse.len());
        for &(r, c, _) in &n.sparse {
            o.extend_from_slice(&r.to_le_bytes());
            o.extend_from_slice(&c.to_le_bytes());
        }
        n.sparse.iter().for_each(|&(_, _, x)| o.extend_from_slice(&x.to_le_bytes()));
        o
    }

    /// An R payload with its codebooks embedded: `rows:u32, cols:u32, d:u16, m:u16,
    /// k:u16, n:u32`, `m * k * (d / m)` f32, then `n * m` u8 codes.
    pub fn pq(n: &Ndsq) -> Vec<u8> {
        let q = &n.pq;
        let mut o = Vec::with_capacity(18 + 4 * q.codebooks.len() + q.codes.len());
        put_u32(&mut o, n.rows);
        put_u32(&mut o, n.cols);
        for x in [q.d, q.m, q.k] {
            o.extend_from_slice(&(x as u16).to_le_bytes());
        }
        put_u32(&mut o, q.codes.len() / q.m.max(1));
        q.codebooks.iter().for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
        o.extend_from_slice(&q.codes);
        o
    }

    /// An R payload whose codebooks are number `cb_id` of the CODEBOOKS section:
    /// `rows:u32, cols:u32, d:u16, m:u16, k:u16, n:u32, cb_id:u16`, then `n * m` u8 codes.
    pub fn pq_shared(n: &Ndsq, cb_id: u16) -> Vec<u8> {
        let q = &n.pq;
        let mut o = Vec::with_capacity(20 + q.codes.len());
        put_u32(&mut o, n.rows);
        put_u32(&mut o, n.cols);
        for x in [q.d, q.m, q.k] {
            o.extend_from_slice(&(x as u16).to_le_bytes());
        }
        put_u32(&mut o, q.codes.len() / q.m.max(1));
        o.extend_from_slice(&cb_id.to_le_bytes());
        o.extend_from_slice(&q.codes);
        o
    }

    /// One entry of the CODEBOOKS section: `m` codebooks of `k` centroids of `d / m`.
    #[derive(Clone, Debug, PartialEq)]
    pub struct Codebook {
        pub d: usize,
        pub m: usize,
        pub k: usize,
        pub values: Vec<f32>,
    }

    /// The CODEBOOKS section: `count:u32`, then per entry `d:u16, m:u16, k:u16, 0:u16`
    /// and its `m * k * (d / m)` f32.
    pub fn codebooks(books: &[Codebook]) -> Vec<u8> {
        let mut o = Vec::new();
        put_u32(&mut o, books.len());
        for b in books {
            for x in [b.d, b.m, b.k, 0] {
                o.extend_from_slice(&(x as u16).to_le_bytes());
            }
            b.values.iter().for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
        }
        o
    }

    /// Parses the CODEBOOKS section.
    pub fn parse_codebooks(b: &[u8]) -> anyhow::Result<Vec<Codebook>> {
        let mut c = Cur(b, 0);
        let n = c.u32("count")?;
        if n.checked_mul(8).is_none_or(|x| x > b.len()) {
            bail!("{n} codebooks exceed the section's {} bytes", b.len());
        }
        (0..n)
            .map(|i| {
                let (d, m, k, zero) = (c.u16("d")?, c.u16("m")?, c.u16("k")?, c.u16("reserved")?);
                if m == 0 || d == 0 || !d.is_multiple_of(m) || !(1..=256).contains(&k) || zero != 0 {
                    bail!("codebook {i}: d {d}, m {m}, k {k}, reserved {zero} are not a PQ codebook");
                }
                let values = f32s(c.take(4 * m * k * (d / m), "centroids")?);
                if values.iter().any(|x| !x.is_finite()) {
                    bail!("codebook {i} has a centroid value that is not finite");
                }
                Ok(Codebook { d, m, k, values })
            })
            .collect::<anyhow::Result<_>>()
            .and_then(|books| c.done().map(|()| books))
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect()
    }

    struct Cur<'a>(&'a [u8], usize);

    impl Cur<'_> {
        fn take(&mut self, n: usize, what: &str) -> anyhow::Result<&[u8]> {
            let end = self.1.checked_add(n).filter(|&e| e <= self.0.len());
            let end = end.with_context(|| format!("{what}: {n} bytes past the payload's {}", self.0.len()))?;
            let s = &self.0[self.1..end];
            self.1 = end;
            Ok(s)
        }
        fn u32(&mut self, what: &str) -> anyhow::Result<usize> {
            Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")) as usize)
        }
        fn u16(&mut self, what: &str) -> anyhow::Result<usize> {
            Ok(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2 bytes")) as usize)
        }
        fn done(&self) -> anyhow::Result<()> {
            match self.1 == self.0.len() {
                true => Ok(()),
                false => bail!("{} bytes left over", self.0.len() - self.1),
            }
        }
    }

    /// Parses an FP16 payload: (rows, cols, values).
    pub fn parse_fp16(b: &[u8]) -> anyhow::Result<(usize, usize, Vec<u16>)> {
        let mut c = Cur(b, 0);
        let (rows, cols) = (c.u32("rows")?, c.u32("cols")?);
        let n = rows.checked_mul(cols).filter(|&n| n <= b.len()).context("rows x cols exceeds the payload")?;
        let vals = c.take(2 * n, "values")?.chunks_exact(2).map(|x| u16::from_le_bytes([x[0], x[1]])).collect();
        c.done()?;
        Ok((rows, cols, vals))
    }

    /// Parses an S payload against the matrix shape.
    pub fn parse_sparse(b: &[u8], rows: usize, cols: usize) -> anyhow::Result<Vec<(u32, u32, f32)>> {
        let mut c = Cur(b, 0);
        if (c.u32("rows")?, c.u32("cols")?) != (rows, cols) {
            bail!("an S shard of another shape than {rows}x{cols}");
        }
        let n = c.u32("n")?;
        if n.checked_mul(12).is_none_or(|x| x > b.len()) {
            bail!("{n} outliers exceed the payload");
        }
        let idx = c.take(8 * n, "indices")?.to_vec();
        let vals = c.take(4 * n, "values")?.to_vec();
        c.done()?;
        (0..n)
            .map(|i| {
                let r = u32::from_le_bytes(idx[8 * i..8 * i + 4].try_into().expect("4"));
                let col = u32::from_le_bytes(idx[8 * i + 4..8 * i + 8].try_into().expect("4"));
                if r as usize >= rows || col as usize >= cols {
                    bail!("outlier {i} at ({r}, {col}) is outside {rows}x{cols}");
                }
                Ok((r, col, f32::from_le_bytes(vals[4 * i..4 * i + 4].try_into().expect("4"))))
            })
            .collect()
    }

    /// Parses an R payload against the matrix shape: with its codebooks embedded, or
    /// naming one of `pool` (the CODEBOOKS section).
    pub fn parse_pq(b: &[u8], rows: usize, cols: usize, pool: &[Codebook]) -> anyhow::Result<Pq> {
        let mut c = Cur(b, 0);
        if (c.u32("rows")?, c.u32("cols")?) != (rows, cols) {
            bail!("an R shard of another shape than {rows}x{cols}");
        }
        let (d, m, k, n) = (c.u16("d")?, c.u16("m")?, c.u16("k")?, c.u32("n")?);
        if m == 0 || d == 0 || !d.is_multiple_of(m) || !(1..=256).contains(&k) || !cols.is_multiple_of(d) {
            bail!("PQ d {d}, m {m}, k {k} do not fit {cols} columns");
        }
        if n != rows * cols / d {
            bail!("{n} PQ vectors for a {rows}x{cols} matrix of vectors of {d}");
        }
        let cb = m * k * (d / m);
        let codebooks = if b.len().checked_sub(c.1) == n.checked_mul(m).and_then(|x| x.checked_add(2)) {
            let id = c.u16("cb_id")?;
            let book = pool.get(id).with_context(|| format!("codebook {id} of the {} in CODEBOOKS", pool.len()))?;
            if (book.d, book.m, book.k) != (d, m, k) {
                bail!("codebook {id} has d {}, m {}, k {}, not this shard's {d}, {m}, {k}", book.d, book.m, book.k);
            }
            book.values.clone()
        } else {
            f32s(c.take(4 * cb, "codebooks")?)
        };
        let codes = c.take(n * m, "codes")?.to_vec();
        c.done()?;
        if let Some(&bad) = codes.iter().find(|&&x| usize::from(x) >= k) {
            bail!("a PQ code {bad} for {k} centroids");
        }
        Ok(Pq { d, m, k, codebooks, codes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap()
    }

    /// A rank-4 matrix plus noise and a few spikes.
    fn matrix(rows: usize, cols: usize) -> Vec<f32> {
        let (a, b) = (gaussian(rows * 4, 1), gaussian(4 * cols, 2));
        let noise = gaussian(rows * cols, 3);
        let mut w: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                (0..4).map(|t| a[r * 4 + t] * b[t * cols + c]).sum::<f32>() + 0.05 * noise[i]
            })
            .collect();
        w[7] = 9.0;
        w[cols * 3 + 5] = -8.0;
        w
    }

    fn rel_err(a: &[f32], b: &[f32]) -> f64 {
        let e: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let n: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum();
        (e / n).sqrt()
    }

    #[test]
    fn decomposition_approximates_and_reconstructs_as_the_sum_of_its_parts() {
        let (rows, cols) = (48, 64);
        let w = matrix(rows, cols);
        let p = pool();
        let params = NdsqParams { rank: 4, outlier_q: 0.002, pq_d: 8, pq_m: 4, pq_k: 16 };
        let n = Ndsq::encode(&p, &w, rows, cols, &params).unwrap();
        let back = n.reconstruct();
        let [l, s, d, r] = n.components();
        let sum: Vec<f32> = (0..rows * cols).map(|i| l[i] + s[i] + d[i] + r[i]).collect();
        assert_eq!(back, sum);
        // The spikes are outliers, kept exactly; rank 4 holds the structure.
        assert_eq!(n.sparse.len(), 6);
        assert!(n.sparse.iter().any(|&(r, c, x)| (r, c) == (0, 7) && x != 0.0));
        let err = rel_err(&back, &w);
        assert!(err < 0.05, "relative error {err}");
        // Without the low rank, the same codes do worse.
        let flat = Ndsq::encode(&p, &w, rows, cols, &NdsqParams { rank: 0, ..params }).unwrap();
        assert!(rel_err(&flat.reconstruct(), &w) > err);
    }

    #[test]
    fn payloads_round_trip_and_reject_damage() {
        let (rows, cols) = (16, 32);
        let w = matrix(rows, cols);
        let n = Ndsq::encode(&pool(), &w, rows, cols, &NdsqParams { pq_k: 8, ..Default::default() }).unwrap();
        let (r, c, u) = payload::parse_fp16(&payload::fp16(rows, n.rank, &n.u)).unwrap();
        assert_eq!((r, c, u), (rows, n.rank, n.u.clone()));
        assert_eq!(payload::parse_sparse(&payload::sparse(&n), rows, cols).unwrap(), n.sparse);
        let pq = payload::pq(&n);
        assert_eq!(payload::parse_pq(&pq, rows, cols, &[]).unwrap(), n.pq);
        assert!(payload::parse_pq(&pq[..pq.len() - 1], rows, cols, &[]).is_err());
        assert!(payload::parse_pq(&pq, rows, cols + 8, &[]).is_err());
        let mut bad = pq.clone();
        *bad.last_mut().unwrap() = 200;
        assert!(payload::parse_pq(&bad, rows, cols, &[]).unwrap_err().to_string().contains("code 200"));
        // The same codes with the codebooks in a CODEBOOKS section, as entry 1.
        let q = &n.pq;
        let book = payload::Codebook { d: q.d, m: q.m, k: q.k, values: q.codebooks.clone() };
        let other = payload::Codebook { d: q.d, m: q.m, k: 2, values: vec![0.0; 2 * q.d] };
        let books = payload::parse_codebooks(&payload::codebooks(&[other.clone(), book.clone()])).unwrap();
        assert_eq!(books, [other, book]);
        let shared = payload::pq_shared(&n, 1);
        assert_eq!(payload::parse_pq(&shared, rows, cols, &books).unwrap(), n.pq);
        let err = payload::parse_pq(&payload::pq_shared(&n, 0), rows, cols, &books).unwrap_err();
        assert!(err.to_string().contains("k 2"), "{err}");
        assert!(payload::parse_pq(&payload::pq_shared(&n, 2), rows, cols, &books).is_err());
        let section = payload::codebooks(&books);
        assert!(payload::parse_codebooks(&section[..section.len() - 4]).is_err());
        let mut s = payload::sparse(&n);
        s[12..16].copy_from_slice(&99u32.to_le_bytes());
        assert!(payload::parse_sparse(&s, rows, cols).is_err());
    }
}
