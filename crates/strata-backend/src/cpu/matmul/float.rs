//! `out = x · wᵀ` against weights kept in their stored dtype (F32, F16, BF16), and the
//! small vector helpers attention uses ([`dot`], [`axpy`]).
//!
//! Two shapes of work, both split across the pool by output feature (each task owns a
//! contiguous block of weight rows, so every weight byte is read once per call):
//!
//! - **Few x rows (decode, `rows <= SMALL_ROWS`)** is bound by memory bandwidth. A task
//!   streams its weight rows four at a time with software prefetch ahead of the reads,
//!   widening 16-bit values in registers and multiplying them into every x row (four x
//!   rows at a time) while they are in cache (`Ops::small`).
//! - **More x rows (prefill)** is bound by arithmetic. A task converts a panel of `nr`
//!   weight rows × `KC` columns to f32 once, transposed to `[KC][nr]` (`Ops::pack`), then
//!   sweeps all x rows over it with a register-tiled kernel that broadcasts one x value
//!   against `nr` outputs (`Ops::panel`), prefetching the next panel's weights as it goes.
//!   Conversion costs O(m·k) against O(rows·m·k) multiply-adds.
//!
//! Each instruction set (portable scalar, AVX2+FMA+F16C, AVX-512F) provides one table of
//! kernels ([`Ops`]); the best one the CPU supports is picked once at run time.
//! `cfg(target_arch)` appears only inside the SIMD modules, which report themselves
//! unavailable on other architectures. All paths accumulate in f32 (with FMA in SIMD).
//!
//! Measured throughput is noted on the ignored `tests::throughput` benchmark.

mod avx2;
mod avx512;
mod scalar;

use std::cell::RefCell;
use std::ops::Range;
use std::sync::OnceLock;

use rayon::ThreadPool;

use super::OutPtr;
use strata_tensor::tensor::{DType, HostTensor};

/// Calls with at most this many x rows stream the weights (decode, small decode batches);
/// more rows use the packed, register-tiled path (prefill). Measured crossover on a
/// 2048 × 5632 BF16 weight: between 8 and 12 rows.
pub const SMALL_ROWS: usize = 8;
/// Task boundaries in the few-rows path fall on multiples of this many weight rows (the
/// kernels' row group).
const SMALL_UNIT: usize = 4;
/// Columns of k per packed weight panel: `KC × nr` f32 values (64 KiB for AVX-512) stay
/// in L2 while every x row passes over them.
const KC: usize = 512;
/// Calls with fewer multiply-adds than this run on the calling thread (waking the pool
/// costs more than the work).
const PAR_MIN_WORK: usize = 1 << 16;

/// The kernel variants; [`Kernel::best`] is what [`matmul`], [`dot`] and [`axpy`] use.
/// Public so tests and benchmarks can run each variant explicitly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Portable Rust; always available.
    Scalar,
    /// AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// AVX-512F, 16 lanes.
    Avx512,
}

impl Kernel {
    pub const ALL: [Kernel; 3] = [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512];

    /// The fastest variant this CPU supports (detected once).
    pub fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            [Kernel::Avx512, Kernel::Avx2].into_iter().find(|k| k.is_available()).unwrap_or(Kernel::Scalar)
        })
    }

    /// Whether this CPU has the features the variant needs.
    pub fn is_available(self) -> bool {
        self.ops().is_some()
    }

    fn ops(self) -> Option<&'static Ops> {
        match self {
            Kernel::Scalar => Some(&scalar::OPS),
            Kernel::Avx2 => avx2::ops(),
            Kernel::Avx512 => avx512::ops(),
        }
    }

    fn ops_or_panic(self) -> &'static Ops {
        self.ops().unwrap_or_else(|| panic!("the {self:?} matmul kernel needs CPU features this machine lacks"))
    }
}

fn best_ops() -> &'static Ops {
    static BEST: OnceLock<&'static Ops> = OnceLock::new();
    BEST.get_or_init(|| Kernel::best().ops_or_panic())
}

/// [`super::matmul`] of float weights with a chosen kernel variant; panics if the CPU does not support it.
pub fn matmul_with(kernel: Kernel, pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_on(kernel, pool, x, rows, w, out, rows <= SMALL_ROWS)
}

/// [`matmul`] of float weights through the packed, register-tiled path whatever the row
/// count: each row comes out as it does among any other rows in that path.
pub fn matmul_packed(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    assert!(w.dtype.is_float(), "matmul_packed takes float weights");
    matmul_on(Kernel::best(), pool, x, rows, w, out, false)
}

fn matmul_on(kernel: Kernel, pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32], small: bool) {
    let ops = kernel.ops_or_panic();
    let w = Weights::new(w);
    let (m, k) = (w.m, w.k);
    assert!(x.len() >= rows * k, "matmul: x holds {} values, need {rows} rows of {k}", x.len());
    assert!(out.len() >= rows * m, "matmul: out holds {} values, need {rows} rows of {m}", out.len());
    if rows == 0 || m == 0 {
        return;
    }
    if k == 0 {
        out[..rows * m].fill(0.0);
        return;
    }
    let x = XRows { data: &x[..rows * k], ld: k, rows };
    let dst = OutPtr::new(out, m);
    let unit = if small { SMALL_UNIT } else { ops.nr };
    let par = rows * m * k >= PAR_MIN_WORK;
    let chunk = super::chunk_len(m, unit, par, pool.current_num_threads());
    let task = |cols: Range<usize>| {
        // SAFETY: `ops` exists only if its CPU features were detected. `x` holds `rows × k`
        // values and `w` holds `m × k` (checked above and in `Weights::new`); `dst` points
        // at `rows × m` values that stay borrowed mutably for this whole call, and each
        // task writes only its own columns `cols` of them, so no two tasks touch the same
        // element.
        unsafe {
            if small {
                (ops.small)(x, w, cols, dst);
            } else {
                gemm(ops, x, w, cols, dst);
            }
        }
    };
    let tasks = m.div_ceil(chunk);
    if tasks == 1 {
        task(0..m);
    } else {
        strata_tensor::team::for_each(pool, tasks, |t| task(t * chunk..((t + 1) * chunk).min(m)));
    }
}

/// `Σ a[i]·b[i]` in f32; panics if the lengths differ.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_on(best_ops(), a, b)
}

/// `y += alpha · x`; panics if the lengths differ.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_on(best_ops(), alpha, x, y)
}

/// Checks the shapes of a group of attention heads sharing keys or values: whole heads of
/// `hd` values in `per_head`, as many rows of `n` scores or weights in `weights`, and `n`
/// positions in `rows` (`stride` apart, `hd` read of each). Panics with `what` on a
/// mismatch.
fn check_heads(what: &str, hd: usize, per_head: usize, weights: usize, rows: usize, stride: usize) {
    assert!(hd > 0 && per_head.is_multiple_of(hd), "{what}: {per_head} values are not whole heads of {hd}");
    let heads = per_head / hd;
    assert!(heads > 0 && weights.is_multiple_of(heads), "{what}: {weights} scores are not whole rows of {heads} heads");
    let n = weights / heads;
    if let Some(last) = n.checked_sub(1) {
        assert!(rows >= last * stride + hd, "{what}: the cache holds {rows} values, too few");
    }
}

/// `out[g·n + j] = dot(q_g, k[j·stride..][..hd]) · scale` for every query head `q_g =
/// q[g·hd..][..hd]` of `q` (heads that share one KV head) and every `j < n`, where `out`
/// holds `n` scores per head: attention scores over cached positions, each exactly
/// [`dot`]'s. Each key is read once for all the heads. Panics on shapes that disagree.
pub fn scores(q: &[f32], hd: usize, k: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    check_heads("scores", hd, q.len(), out.len(), k.len(), stride);
    // SAFETY: a table exists only if its CPU features were detected; shapes were checked.
    unsafe { (best_ops().scores)(q, hd, k, stride, scale, out) }
}

/// `o_g += w[g·n + j] · v[j·stride..][..hd]` for every head `o_g = o[g·hd..][..hd]` of `o`
/// and every `j < n`, in order, each element exactly as those [`axpy`] calls leave it
/// (`w` holds `n` weights per head). Each value row is read once for all the heads.
/// Panics on shapes that disagree.
pub fn weighted_sum(w: &[f32], v: &[f32], stride: usize, o: &mut [f32], hd: usize) {
    check_heads("weighted_sum", hd, o.len(), w.len(), v.len(), stride);
    // SAFETY: a table exists only if its CPU features were detected; shapes were checked.
    unsafe { (best_ops().weighted_sum)(w, v, stride, o, hd) }
}

/// [`scores`] over keys stored as IEEE f16 bits: the same bits as over their f32 widening.
pub fn scores_f16(q: &[f32], hd: usize, k: &[u16], stride: usize, scale: f32, out: &mut [f32]) {
    check_heads("scores_f16", hd, q.len(), out.len(), k.len(), stride);
    // SAFETY: a table exists only if its CPU features were detected; shapes were checked.
    unsafe { (best_ops().scores_f16)(q, hd, F16::cast(k), stride, scale, out) }
}

/// [`weighted_sum`] over values stored as IEEE f16 bits: the same bits as over their f32
/// widening.
pub fn weighted_sum_f16(w: &[f32], v: &[u16], stride: usize, o: &mut [f32], hd: usize) {
    check_heads("weighted_sum_f16", hd, o.len(), w.len(), v.len(), stride);
    // SAFETY: a table exists only if its CPU features were detected; shapes were checked.
    unsafe { (best_ops().weighted_sum_f16)(w, F16::cast(v), stride, o, hd) }
}

/// `x[i] = exp(x[i] − max x) / Σ_j exp(x[j] − max x)`: attention's softmax over one
/// head's scores (in the AVX-512 kernel a vector `exp` within 2 ulp of the correctly
/// rounded one; the others call `f32::exp`).
pub fn softmax(x: &mut [f32]) {
    // SAFETY: a table exists only if its CPU features were detected.
    unsafe { (best_ops().softmax)(x) }
}

/// The largest of `x`'s values that are not NaN, and `Σ exp(x[i] − max)` over them in
/// f64 (0 when that max is not finite): a row of logits' `logsumexp` is `max + ln sum`.
/// The AVX-512 kernel takes each `exp` in f32 with [`softmax`]'s vector `exp` (within 2
/// ulp; the sum's relative error stays near 1e-7), the others in f64.
pub fn max_exp_sum(x: &[f32]) -> (f32, f64) {
    // SAFETY: a table exists only if its CPU features were detected.
    unsafe { (best_ops().max_exp_sum)(x) }
}

/// `g[i] = silu(g[i]) · u[i]` (SwiGLU's gate times its up projection), with the `exp`
/// [`softmax`] uses; panics if the lengths differ.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "silu_mul: length mismatch");
    // SAFETY: a table exists only if its CPU features were detected; lengths are equal.
    unsafe { (best_ops().silu_mul)(g, u) }
}

/// [`dot`] with a chosen kernel variant; panics if the CPU does not support it.
pub fn dot_with(kernel: Kernel, a: &[f32], b: &[f32]) -> f32 {
    dot_on(kernel.ops_or_panic(), a, b)
}

/// [`axpy`] with a chosen kernel variant; panics if the CPU does not support it.
pub fn axpy_with(kernel: Kernel, alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_on(kernel.ops_or_panic(), alpha, x, y)
}

fn dot_on(ops: &Ops, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    // SAFETY: a table exists only if its CPU features were detected; lengths are equal.
    unsafe { (ops.dot)(a, b) }
}

fn axpy_on(ops: &Ops, alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    // SAFETY: a table exists only if its CPU features were detected; lengths are equal.
    unsafe { (ops.axpy)(alpha, x, y) }
}

/// The prefill path for output features `cols`: for each `KC`-wide slice of k, convert
/// each `nr`-row panel of weights once and run every x row over it.
///
/// # Safety
/// As for `Ops::panel`, with `cols` inside `0..w.m` and `dst` covering `x.rows × w.m`.
unsafe fn gemm(ops: &Ops, x: XRows, w: Weights, cols: Range<usize>, dst: OutPtr) {
    let nr = ops.nr;
    let kc_max = KC.min(w.k);
    // The (panel, k-slice) pairs in the order they are packed.
    let blocks = (0..w.k).step_by(KC).flat_map(|k0| cols.clone().step_by(nr).map(move |p0| (p0, k0)));
    let mut next_blocks = blocks.clone().skip(1);
    with_scratch(kc_max * nr + x.rows * nr, |scratch| {
        let (packed, tile) = scratch.split_at_mut(kc_max * nr);
        for (p0, k0) in blocks {
            let p1 = (p0 + nr).min(cols.end);
            let ks = k0..(k0 + KC).min(w.k);
            let kc = ks.len();
            let packed = &mut packed[..kc * nr];
            let xs = XRows { data: &x.data[k0..], ..x };
            let accumulate = k0 > 0;
            // While this panel computes, pull the next one's weights toward the cache.
            let next = next_blocks
                .next()
                .map_or(Prefetch::NONE, |(q0, l0)| w.region(q0..(q0 + nr).min(cols.end), l0..(l0 + KC).min(w.k)));
            // SAFETY: (all calls below) the caller guarantees the table's features and
            // that `dst` covers `x.rows × w.m`; `p0..p1` lies inside `cols`. `packed`
            // holds `kc × nr` values and `tile` `x.rows × nr`.
            unsafe {
                (ops.pack)(w, p0..p1, ks, packed);
                if p1 - p0 == nr {
                    (ops.panel)(xs, kc, packed, dst.at(0, p0), accumulate, next);
                    continue;
                }
                // A partial panel: run the full-width kernel on a scratch tile and copy
                // back only the real columns.
                let n = p1 - p0;
                if accumulate {
                    for (r, t) in tile.chunks_exact_mut(nr).enumerate() {
                        std::ptr::copy_nonoverlapping(dst.at(r, p0).ptr, t.as_mut_ptr(), n);
                    }
                }
                (ops.panel)(xs, kc, packed, OutPtr { ptr: tile.as_mut_ptr(), ld: nr }, accumulate, next);
                for (r, t) in tile.chunks_exact(nr).enumerate() {
                    std::ptr::copy_nonoverlapping(t.as_ptr(), dst.at(r, p0).ptr, n);
                }
            }
        }
    });
}

/// Runs `f` on a 64-byte-aligned scratch buffer of `len` values owned by this thread
/// (allocated once per thread and grown as needed).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([f32; 16]);

    fn view(lines: &mut [Line], len: usize) -> &mut [f32] {
        // SAFETY: `Line` is 16 f32 values with no padding, so `lines` is
        // `16 × lines.len() >= len` initialised f32 values.
        unsafe { &mut std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), lines.len() * 16)[..len] }
    }

    thread_local! {
        static SCRATCH: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    }
    let lines = len.div_ceil(16);
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < lines {
                buf.resize(lines, Line([0.0; 16]));
            }
            f(view(&mut buf, len))
        }
        // Re-entered on this thread (a caller nested a matmul inside one): use a fresh one.
        Err(_) => f(view(&mut vec![Line([0.0; 16]); lines], len)),
    })
}

// ---------------------------------------------------------------------------------------
// The interface between the driver above and the per-instruction-set kernels.

/// `scores(q, hd, k, stride, scale, out)` over keys of element type `T` (see [`Ops`]).
type ScoresFn<T> = unsafe fn(q: &[f32], hd: usize, k: &[T], stride: usize, scale: f32, out: &mut [f32]);
/// `weighted_sum(w, v, stride, o, hd)` over values of element type `T` (see [`Ops`]).
type WeightedSumFn<T> = unsafe fn(w: &[f32], v: &[T], stride: usize, o: &mut [f32], hd: usize);

/// One instruction set's kernels. Every function requires the CPU features of its
/// variant; a table is handed out only after they were detected.
struct Ops {
    /// Output features per packed panel (the width of the register tile).
    nr: usize,
    /// For x rows `r < x.rows <= SMALL_ROWS` and weight rows `o` in `cols`:
    /// `dst(r, o) = Σ_k x(r, k) · w[o, k]`.
    small: unsafe fn(x: XRows<'_>, w: Weights<'_>, cols: Range<usize>, dst: OutPtr),
    /// Converts weight rows `cols` (at most `nr`), columns `ks`, to f32 in `packed`
    /// (`ks.len() × nr`, `packed[kk·nr + j] = w[cols.start + j, ks.start + kk]`), padding
    /// missing rows with zeros.
    pack: unsafe fn(w: Weights<'_>, cols: Range<usize>, ks: Range<usize>, packed: &mut [f32]),
    /// For every x row `r` and `j < nr`: `dst(r, j) (+)= Σ_{kk < kc} x(r, kk) · packed[kk·nr + j]`
    /// (adding to what `dst` holds when `accumulate`), prefetching `next` along the way.
    panel: unsafe fn(x: XRows<'_>, kc: usize, packed: &[f32], dst: OutPtr, accumulate: bool, next: Prefetch),
    /// `Σ a[i]·b[i]` over equal-length slices.
    dot: unsafe fn(a: &[f32], b: &[f32]) -> f32,
    /// `y += alpha · x` over equal-length slices.
    axpy: unsafe fn(alpha: f32, x: &[f32], y: &mut [f32]),
    /// For each query head `g` of `q` (`hd` values each) and `j < n` (`out` holds `n`
    /// per head): `out[g·n + j] = dot(q_g, k[j·stride..][..hd]) · scale`, each exactly as
    /// `dot` gives it (attention scores over cached positions).
    scores: ScoresFn<f32>,
    /// For each head `g` of `o` (`hd` values each) and `j < n` in order (`w` holds `n`
    /// per head): `o_g += w[g·n + j] · v[j·stride..][..hd]`, each element exactly as that
    /// sequence of `axpy` calls leaves it (attention's weighted sum of values).
    weighted_sum: WeightedSumFn<f32>,
    /// `scores` over f16 keys, each exactly what `scores` gives over their f32 widening.
    scores_f16: ScoresFn<F16>,
    /// `weighted_sum` over f16 values, exactly what it gives over their f32 widening.
    weighted_sum_f16: WeightedSumFn<F16>,
    /// `x[i] = exp(x[i] − max x) / Σ_j exp(x[j] − max x)` (attention's softmax).
    softmax: unsafe fn(x: &mut [f32]),
    /// `g[i] = g[i] / (1 + exp(−g[i])) · u[i]` over equal-length slices (SwiGLU).
    silu_mul: unsafe fn(g: &mut [f32], u: &[f32]),
    /// The max of the values that are not NaN, and `Σ exp(x − max)` over them (0 when
    /// the max is not finite): see [`max_exp_sum`].
    max_exp_sum: unsafe fn(x: &[f32]) -> (f32, f64),
}

/// An [`Ops`] table of the kernels named as the fields are, in the invoking module (its
/// `scores` and `weighted_sum` generic over the key and value element type).
macro_rules! ops_table {
    () => {
        Ops {
            nr: NR,
            small,
            pack,
            panel,
            dot,
            axpy,
            scores: scores::<f32>,
            weighted_sum: weighted_sum::<f32>,
            scores_f16: scores::<F16>,
            weighted_sum_f16: weighted_sum::<F16>,
            softmax,
            silu_mul,
            max_exp_sum,
        }
    };
}
use ops_table;

/// `rows` rows of x: element `(r, kk)` is `data[r·ld + kk]`.
#[derive(Clone, Copy)]
struct XRows<'a> {
    data: &'a [f32],
    ld: usize,
    rows: usize,
}

/// Weight bytes a kernel should pull toward the cache while it computes (the next panel
/// to pack): `runs` runs of `len` bytes, `stride` apart, from `ptr`. Only an address hint;
/// nothing is read through it.
#[derive(Clone, Copy)]
#[allow(dead_code, reason = "read only by the x86 kernels")]
struct Prefetch {
    ptr: *const u8,
    stride: usize,
    len: usize,
    runs: usize,
}

impl Prefetch {
    const NONE: Prefetch = Prefetch { ptr: std::ptr::null(), stride: 0, len: 0, runs: 0 };
}

/// Walks a [`Prefetch`] one cache line at a time, spread over a kernel's loop: `tick`
/// yields a line every `every` calls, `next` the next line at once.
#[allow(dead_code, reason = "used only by the x86 kernels")]
struct PrefetchCursor {
    plan: Prefetch,
    lines_per_run: usize,
    total: usize,
    done: usize,
    every: u32,
    countdown: u32,
}

#[allow(dead_code, reason = "used only by the x86 kernels")]
impl PrefetchCursor {
    /// A cursor that spreads the plan's lines evenly over about `ticks` calls to `tick`.
    fn new(plan: Prefetch, ticks: usize) -> Self {
        let lines_per_run = plan.len.div_ceil(64);
        let total = plan.runs * lines_per_run;
        let every = (ticks / total.max(1)).clamp(1, 64) as u32;
        PrefetchCursor { plan, lines_per_run, total, done: 0, every, countdown: every }
    }

    #[inline(always)]
    fn tick(&mut self) -> Option<*const u8> {
        self.countdown -= 1;
        if self.countdown != 0 {
            return None;
        }
        self.countdown = self.every;
        self.next()
    }

    #[inline(always)]
    fn next(&mut self) -> Option<*const u8> {
        if self.done == self.total {
            return None;
        }
        let (run, line) = (self.done / self.lines_per_run, self.done % self.lines_per_run);
        self.done += 1;
        Some(self.plan.ptr.wrapping_add(run * self.plan.stride + line * 64))
    }
}

/// A `[m, k]` weight matrix, typed.
#[derive(Clone, Copy)]
struct Weights<'a> {
    data: WData<'a>,
    m: usize,
    k: usize,
}

#[derive(Clone, Copy)]
enum WData<'a> {
    F32(&'a [f32]),
    F16(&'a [F16]),
    Bf16(&'a [Bf16]),
}

impl<'a> Weights<'a> {
    fn new(t: &'a HostTensor) -> Self {
        assert_eq!(t.shape.len(), 2, "matmul: weight must be 2-D, got shape {:?}", t.shape);
        let (m, k) = (t.shape[0], t.shape[1]);
        let data = match t.dtype {
            DType::F32 => WData::F32(t.as_f32()),
            DType::F16 => WData::F16(F16::cast(t.as_u16())),
            DType::BF16 => WData::Bf16(Bf16::cast(t.as_u16())),
            other => panic!("matmul_with: {other:?} weights go through the quantized matmul"),
        };
        let len = match data {
            WData::F32(d) => d.len(),
            WData::F16(d) => d.len(),
            WData::Bf16(d) => d.len(),
        };
        assert_eq!(len, m * k, "matmul: weight of shape {:?} holds {len} values", t.shape);
        Weights { data, m, k }
    }
}

impl Weights<'_> {
    /// Where rows `rows`, columns `ks` of the matrix lie in memory.
    fn region(&self, rows: Range<usize>, ks: Range<usize>) -> Prefetch {
        let (base, size) = match self.data {
            WData::F32(d) => (d.as_ptr().cast::<u8>(), 4),
            WData::F16(d) => (d.as_ptr().cast::<u8>(), 2),
            WData::Bf16(d) => (d.as_ptr().cast::<u8>(), 2),
        };
        Prefetch {
            ptr: base.wrapping_add((rows.start * self.k + ks.start) * size),
            stride: self.k * size,
            len: ks.len() * size,
            runs: rows.len(),
        }
    }
}

/// A stored weight element the kernels can widen to f32.
trait WElem: Copy + Send + Sync + 'static {
    /// Zero padding for partial SIMD loads.
    #[allow(dead_code, reason = "used only by the x86 kernels")]
    const ZERO: Self;
    fn to_f32(self) -> f32;
}

impl WElem for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// IEEE half-precision bits.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct F16(u16);

/// bfloat16 bits (the top half of an f32).
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Bf16(u16);

impl WElem for F16 {
    const ZERO: Self = F16(0);
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self.0).to_f32()
    }
}

impl WElem for Bf16 {
    const ZERO: Self = Bf16(0);
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl F16 {
    fn cast(bits: &[u16]) -> &[F16] {
        // SAFETY: `F16` is `repr(transparent)` over `u16`.
        unsafe { std::slice::from_raw_parts(bits.as_ptr().cast(), bits.len()) }
    }
}

impl Bf16 {
    fn cast(bits: &[u16]) -> &[Bf16] {
        // SAFETY: `Bf16` is `repr(transparent)` over `u16`.
        unsafe { std::slice::from_raw_parts(bits.as_ptr().cast(), bits.len()) }
    }
}

#[cfg(test)]
mod tests;
