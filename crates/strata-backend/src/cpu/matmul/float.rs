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
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use half::{bf16, f16};

    use super::*;
    use strata_quant::ReadF32;
    use strata_tensor::tensor::AlignedBytes;

    /// SplitMix64: a tiny seeded generator, so failures reproduce.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in [-1, 1).
        fn f32(&mut self) -> f32 {
            (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.f32()).collect()
        }
    }

    fn pool(threads: usize) -> ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    fn available() -> Vec<Kernel> {
        Kernel::ALL.into_iter().filter(|k| k.is_available()).collect()
    }

    /// A random `[m, k]` weight whose data starts one element past a 64-byte boundary
    /// (aligned for its dtype only, as a memory-mapped tensor may be).
    fn weight(dtype: DType, m: usize, k: usize, rng: &mut Rng) -> HostTensor {
        let skew = dtype.block_bytes();
        let mut bytes = vec![0u8; skew];
        for _ in 0..m * k {
            let v = rng.f32();
            match dtype {
                DType::F32 => bytes.extend(v.to_le_bytes()),
                DType::F16 => bytes.extend(f16::from_f32(v).to_bits().to_le_bytes()),
                DType::BF16 => bytes.extend(bf16::from_f32(v).to_bits().to_le_bytes()),
                other => unreachable!("the float kernels take F32, F16 and BF16, not {other:?}"),
            }
        }
        let len = bytes.len() - skew;
        HostTensor::new(Arc::new(AlignedBytes::from_slice(&bytes)), skew, len, dtype, vec![m, k])
    }

    /// Runs one kernel on random data and compares every output with an f64 reference:
    /// `|got - ref| <= 1e-6 · Σ|x·w| + 1e-7`. Also checks that `out` is overwritten (it
    /// starts as NaN) and that values past `rows × m` are left alone.
    fn check(kernel: Kernel, pool: &ThreadPool, dtype: DType, rows: usize, m: usize, k: usize) {
        let mut rng = Rng((rows * 1_000_003 + m * 1009 + k) as u64);
        let w = weight(dtype, m, k, &mut rng);
        let x = rng.vec(rows * k + 3);
        let mut out = vec![f32::NAN; rows * m + 5];
        matmul_with(kernel, pool, &x, rows, &w, &mut out);
        for r in 0..rows {
            for o in 0..m {
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for kk in 0..k {
                    let term = x[r * k + kk] as f64 * w.get_f32(o * k + kk) as f64;
                    want += term;
                    mag += term.abs();
                }
                let got = out[r * m + o] as f64;
                assert!(
                    (got - want).abs() <= 1e-6 * mag + 1e-7,
                    "{kernel:?} {dtype:?} rows={rows} m={m} k={k}: out[{r}, {o}] = {got}, want {want} (Σ|terms| {mag})"
                );
            }
        }
        assert!(out[rows * m..].iter().all(|v| v.is_nan()), "{kernel:?} wrote past rows × m");
    }

    /// (rows, m, k): decode and small batches (the streaming path, x rows in groups of
    /// four), prefill batches around the register tiles (12 rows for AVX-512, 6 for AVX2,
    /// 4 for scalar), panel widths (8, 16, 32) and `KC` (512), and calls big enough to be
    /// split across tasks.
    const SHAPES: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (1, 37, 15),
        (1, 67, 131),
        (1, 130, 1030),
        (2, 9, 33),
        (3, 45, 97),
        (4, 33, 64),
        (5, 31, 17),
        (7, 301, 257),
        (8, 20, 40),
        (9, 33, 40),
        (12, 32, 16),
        (13, 65, 600),
        (17, 71, 301),
        (17, 300, 700),
        (40, 100, 1100),
        (3, 5, 0),
        (0, 5, 7),
    ];

    #[test]
    fn every_kernel_matches_reference() {
        let pool = pool(2);
        let kernels = available();
        eprintln!("matmul kernels tested on this CPU: {kernels:?}");
        for &kernel in &kernels {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                for &(rows, m, k) in SHAPES {
                    check(kernel, &pool, dtype, rows, m, k);
                }
            }
        }
    }

    #[test]
    fn single_thread_pool_matches_reference() {
        let pool = pool(1);
        for kernel in available() {
            check(kernel, &pool, DType::BF16, 17, 300, 700);
            check(kernel, &pool, DType::F16, 1, 130, 1030);
        }
    }

    #[test]
    fn detection_matches_cpu_features() {
        assert!(Kernel::Scalar.is_available());
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            use strata_quant::isa;
            assert_eq!(Kernel::Avx512.is_available(), isa::avx512() && has!("avx512f"));
            assert_eq!(Kernel::Avx2.is_available(), isa::avx2() && has!("avx2") && has!("fma") && has!("f16c"));
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            assert!(!Kernel::Avx512.is_available() && !Kernel::Avx2.is_available());
        }
        assert_eq!(Kernel::best(), *available().last().unwrap());
    }

    /// The fused attention loops give bit for bit what `dot` and `axpy` give position by
    /// position and head by head, in every kernel, for head sizes with and without a tail
    /// and any number of heads sharing the keys and values (several at once in the
    /// AVX-512 kernels, with a remainder); their f16 forms give what they give over the
    /// widened values.
    #[test]
    fn scores_and_weighted_sums_are_dot_and_axpy_per_position() {
        let mut rng = Rng(11);
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for kernel in available() {
            let ops = kernel.ops_or_panic();
            for hd in [1, 7, 8, 16, 24, 63, 64, 80, 96, 128, 130] {
                for (positions, heads) in [(1, 1), (2, 3), (5, 1), (16, 2), (33, 5), (40, 8), (17, 4)] {
                    let stride = hd + 3;
                    let (q, k) = (rng.vec(heads * hd), rng.vec((positions - 1) * stride + hd));
                    let mut got = vec![0.0; heads * positions];
                    // SAFETY: `k` holds the positions asked for; `q` and `got` whole heads.
                    unsafe { (ops.scores)(&q, hd, &k, stride, 0.125, &mut got) };
                    for (g, j) in (0..heads).flat_map(|g| (0..positions).map(move |j| (g, j))) {
                        let want = dot_with(kernel, &q[g * hd..][..hd], &k[j * stride..][..hd]) * 0.125;
                        let got = got[g * positions + j];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{kernel:?} scores hd={hd} head {g} of {heads} j={j}"
                        );
                    }
                    let (w, v) = (rng.vec(heads * positions), rng.vec((positions - 1) * stride + hd));
                    let start = rng.vec(heads * hd);
                    let (mut got, mut want) = (start.clone(), start);
                    // SAFETY: `v` holds the positions asked for; `w` and `got` whole heads.
                    unsafe { (ops.weighted_sum)(&w, &v, stride, &mut got, hd) };
                    for (g, want) in want.chunks_exact_mut(hd).enumerate() {
                        for (j, &wj) in w[g * positions..][..positions].iter().enumerate() {
                            axpy_with(kernel, wj, &v[j * stride..][..hd], want);
                        }
                    }
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{kernel:?} weighted_sum hd={hd} positions={positions} heads={heads}"
                    );

                    // Over f16 keys and values: the bits of the same loops over their
                    // f32 widening.
                    let half = |x: &[f32]| x.iter().map(|&v| f16::from_f32(v).to_bits()).collect::<Vec<u16>>();
                    let widen = |x: &[u16]| x.iter().map(|&h| f16::from_bits(h).to_f32()).collect::<Vec<f32>>();
                    let (kh, vh) = (half(&k), half(&v));
                    let (kw, vw) = (widen(&kh), widen(&vh));
                    let (mut got, mut want) = (vec![0.0; heads * positions], vec![0.0; heads * positions]);
                    // SAFETY: `k` and `kh` hold the positions asked for.
                    unsafe {
                        (ops.scores_f16)(&q, hd, F16::cast(&kh), stride, 0.125, &mut got);
                        (ops.scores)(&q, hd, &kw, stride, 0.125, &mut want);
                    }
                    assert_eq!(bits(&got), bits(&want), "{kernel:?} scores_f16 hd={hd} positions={positions}");
                    let start = rng.vec(heads * hd);
                    let (mut got, mut want) = (start.clone(), start);
                    // SAFETY: `v` and `vh` hold the positions asked for.
                    unsafe {
                        (ops.weighted_sum_f16)(&w, F16::cast(&vh), stride, &mut got, hd);
                        (ops.weighted_sum)(&w, &vw, stride, &mut want, hd);
                    }
                    assert_eq!(bits(&got), bits(&want), "{kernel:?} weighted_sum_f16 hd={hd} positions={positions}");
                }
            }
        }
    }

    /// Every kernel's softmax (the scalar one included) agrees with the softmax of the f32
    /// differences `x − max` taken in f64, within a few ulp for each `exp` and the division, plus what summing `n` terms in
    /// some order in f32 may add (√n ulp), on lengths with and without a vector tail and
    /// on scores whose exponentials underflow. Every kernel sees the same inputs.
    #[test]
    fn softmax_matches_the_scalar_one() {
        let mut rng = Rng(5);
        for n in [1, 5, 16, 17, 100, 1000] {
            for spread in [1.0f32, 30.0, 200.0] {
                let x: Vec<f32> = rng.vec(n).iter().map(|v| v * spread).collect();
                // Every kernel takes `x − max` in f32 (the rounding of a large difference
                // moves its `exp` by many ulp), so the reference starts from it too.
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f64> = x.iter().map(|&v| ((v - max) as f64).exp()).collect();
                let want: Vec<f64> = e.iter().map(|v| v / e.iter().sum::<f64>()).collect();
                for kernel in available() {
                    let mut got = x.clone();
                    // SAFETY: the kernel's features were detected.
                    unsafe { (kernel.ops_or_panic().softmax)(&mut got) };
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        let tol = (4.0 + (n as f64).sqrt()) * f32::EPSILON as f64 * w + 1e-37;
                        assert!((g as f64 - w).abs() <= tol, "{kernel:?} n={n} spread={spread} i={i}: {g} vs {w}");
                    }
                    let total: f32 = got.iter().sum();
                    assert!((total - 1.0).abs() < 1e-5, "{kernel:?} n={n}: sums to {total}");
                }
            }
        }
    }

    /// Every kernel's max and `Σ exp(x − max)` agree with the scalar ones in f64: the max
    /// exactly, the sum within 1e-6 relative; NaN lanes are left out and a row with no
    /// finite max sums to 0, whatever the tail.
    #[test]
    fn max_exp_sum_matches_the_scalar_one() {
        let mut rng = Rng(7);
        for kernel in available() {
            let ops = kernel.ops_or_panic();
            for n in [1, 15, 16, 17, 1000, 8192] {
                for spread in [1.0f32, 30.0, 200.0] {
                    let mut x: Vec<f32> = rng.vec(n).iter().map(|v| v * spread).collect();
                    if n > 3 {
                        (x[1], x[n - 2]) = (f32::NAN, f32::NEG_INFINITY);
                    }
                    // SAFETY: the kernel's features were detected.
                    let (max, sum) = unsafe { (ops.max_exp_sum)(&x) };
                    let (want_max, want_sum) = scalar::max_exp_sum_ref(&x);
                    assert_eq!(max, want_max, "{kernel:?} n={n} spread={spread}");
                    assert!((sum - want_sum).abs() <= 1e-6 * want_sum, "{kernel:?} n={n}: {sum} vs {want_sum}");
                }
            }
            for x in [vec![f32::NAN; 20], vec![f32::NEG_INFINITY; 17], vec![1.0, f32::INFINITY, 2.0]] {
                // SAFETY: as above.
                let got = unsafe { (ops.max_exp_sum)(&x) };
                let want = scalar::max_exp_sum_ref(&x);
                assert!(got.0 == want.0 || (got.0.is_nan() && want.0.is_nan()), "{kernel:?} {x:?}: {got:?}");
                assert_eq!((got.1, want.1), (0.0, 0.0), "{kernel:?} {x:?}");
            }
        }
    }

    /// Every kernel's SwiGLU product agrees with the scalar formula within a few ulp,
    /// across the range where `exp(−g)` overflows and underflows.
    #[test]
    fn silu_mul_matches_the_scalar_one() {
        let mut rng = Rng(6);
        for kernel in available() {
            let ops = kernel.ops_or_panic();
            for n in [1, 15, 16, 33, 1000] {
                for spread in [1.0f32, 20.0, 200.0] {
                    let g: Vec<f32> = rng.vec(n).iter().map(|v| v * spread).collect();
                    let u = rng.vec(n);
                    let (mut got, mut want) = (g.clone(), g);
                    // SAFETY: the kernel's features were detected; equal lengths.
                    unsafe { (ops.silu_mul)(&mut got, &u) };
                    scalar::silu_mul_ref(&mut want, &u);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let tol = 4.0 * f32::EPSILON * w.abs() + 1e-37;
                        assert!((g - w).abs() <= tol, "{kernel:?} n={n} spread={spread} i={i}: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn dot_and_axpy_match_reference() {
        let mut rng = Rng(7);
        for kernel in available() {
            for n in [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000] {
                let (a, b) = (rng.vec(n), rng.vec(n));
                let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
                let mag: f64 = a.iter().zip(&b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
                let got = dot_with(kernel, &a, &b) as f64;
                assert!((got - want).abs() <= 1e-6 * mag + 1e-7, "{kernel:?} dot n={n}: {got} vs {want}");

                let alpha = rng.f32();
                let mut y = b.clone();
                axpy_with(kernel, alpha, &a, &mut y);
                for i in 0..n {
                    let term = alpha as f64 * a[i] as f64;
                    let want = b[i] as f64 + term;
                    let tol = 1e-6 * (b[i].abs() as f64 + term.abs()) + 1e-7;
                    assert!((y[i] as f64 - want).abs() <= tol, "{kernel:?} axpy n={n} i={i}: {} vs {want}", y[i]);
                }
            }
        }
        assert_eq!(dot(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
        let mut y = [1.0, 1.0];
        axpy(2.0, &[3.0, 4.0], &mut y);
        assert_eq!(y, [7.0, 9.0]);
    }

    #[test]
    fn chunks_cover_every_column_on_unit_boundaries() {
        for (m, unit, work, threads) in [
            (2048, 4, 1 << 24, 2),
            (2048, 32, 1 << 30, 2),
            (70, 32, 1 << 20, 16),
            (5, 4, 1 << 20, 2),
            (2048, 4, 100, 2),
            (1000, 8, 1 << 24, 1),
        ] {
            let chunk = super::super::chunk_len(m, unit, work >= PAR_MIN_WORK, threads);
            assert!(chunk > 0 && (chunk.is_multiple_of(unit) || chunk == m), "m={m} unit={unit}: chunk {chunk}");
            if work >= PAR_MIN_WORK && threads > 1 && m >= 2 * threads * unit {
                assert!(m.div_ceil(chunk) >= threads, "m={m}: {chunk} leaves a thread idle");
            }
        }
    }

    /// Decode and prefill throughput against the machine's read bandwidth, per kernel.
    /// Not a pass/fail test; numbers vary with whatever else the machine is doing, so each
    /// figure is the best of several interleaved rounds.
    /// `cargo test --release -p strata-backend --lib cpu::matmul::float::tests::throughput -- --ignored --nocapture`
    ///
    /// On 2 vCPUs of a Sapphire Rapids Xeon (KVM, shared host; best of three quiet runs):
    /// summing 1 GiB of u64 reads 14–18 GB/s (24–28 GB/s with four streams per thread);
    /// AVX-512 BF16 matvec streams 20–25 GB/s from DRAM (~85% of the four-stream read,
    /// ~1.0 ms per 2048 × 5632), AVX2 18–22 GB/s, scalar 4–5 GB/s; prefill with 128 rows
    /// reaches ~205 GFLOP/s for BF16/F16 with AVX-512 (a bare FMA loop peaks at ~268),
    /// ~130 with AVX2, 25–30 scalar.
    #[test]
    #[ignore = "benchmark: run with --ignored --nocapture"]
    fn throughput() {
        const M: usize = 2048;
        const K: usize = 5632;
        const COPIES: usize = 16;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
        let pool = pool(threads);
        let time = |f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        };

        // 16 distinct BF16 weights (370 MB, more than any L3 here), cycled so that every
        // decode call streams from DRAM as it does in a real forward pass.
        let mut rng = Rng(1);
        let first = weight(DType::BF16, M, K, &mut rng);
        let ws: Vec<HostTensor> = (0..COPIES)
            .map(|i| {
                let mut bytes = first.bytes().to_vec();
                bytes[i] ^= 1;
                HostTensor::new(Arc::new(AlignedBytes::from_slice(&bytes)), 0, bytes.len(), DType::BF16, vec![M, K])
            })
            .collect();
        let x = rng.vec(128 * K);
        let mut out = vec![0.0f32; 128 * M];
        let weight_bytes = (M * K * 2) as f64;
        // Plain read bandwidth: `threads` threads summing a 1 GiB u64 array (eight
        // independent sums per thread so the adds keep up with memory).
        let words: Vec<u64> = (0..1u64 << 27).collect();
        let sum_words = |streams: usize| crate::cpu::bandwidth::sum_words(&pool, &words, streams);

        let kernels = available();
        let mut read_s = [f64::INFINITY; 2];
        let (mut stream_s, mut cached_s) = (vec![f64::INFINITY; 3], vec![f64::INFINITY; 3]);
        for _round in 0..5 {
            for (s, streams) in read_s.iter_mut().zip([1, 4]) {
                *s = s.min(time(&mut || {
                    std::hint::black_box(sum_words(streams));
                }));
            }
            for (i, &kernel) in kernels.iter().enumerate() {
                let t = time(&mut || ws.iter().for_each(|w| matmul_with(kernel, &pool, &x, 1, w, &mut out)));
                stream_s[i] = stream_s[i].min(t / COPIES as f64);
                for _ in 0..4 {
                    let t = time(&mut || matmul_with(kernel, &pool, &x, 1, &ws[0], &mut out));
                    cached_s[i] = cached_s[i].min(t);
                }
            }
        }
        let [read_gbs, read4_gbs] = read_s.map(|s| (words.len() * 8) as f64 / s / 1e9);
        eprintln!(
            "plain read, {threads} threads summing 1 GiB of u64: {read_gbs:.1} GB/s (4 streams per thread: {read4_gbs:.1} GB/s)"
        );
        for (i, kernel) in kernels.iter().enumerate() {
            let gbs = weight_bytes / stream_s[i] / 1e9;
            eprintln!(
                "{kernel:?} matvec {M}x{K} BF16, {threads} threads: {gbs:.1} GB/s from DRAM ({:.0}% of the better read, {:.0} us), {:.1} GB/s cached ({:.0} us)",
                100.0 * gbs / read_gbs.max(read4_gbs),
                stream_s[i] * 1e6,
                weight_bytes / cached_s[i] / 1e9,
                cached_s[i] * 1e6,
            );
        }
        drop(words);

        // Prefill: rows = 128, best of interleaved rounds.
        let flops = 2.0 * (128 * M * K) as f64;
        let prefill_ws: Vec<HostTensor> = [DType::BF16, DType::F16, DType::F32]
            .map(|d| if d == DType::BF16 { first.clone() } else { weight(d, M, K, &mut rng) })
            .into();
        let mut best = vec![f64::INFINITY; prefill_ws.len() * kernels.len()];
        for round in 0..4 {
            for (i, w) in prefill_ws.iter().enumerate() {
                for (j, &kernel) in kernels.iter().enumerate() {
                    if kernel == Kernel::Scalar && round > 0 {
                        continue;
                    }
                    let t = time(&mut || matmul_with(kernel, &pool, &x, 128, w, &mut out));
                    let b = &mut best[i * kernels.len() + j];
                    *b = b.min(t);
                }
            }
        }
        for (i, w) in prefill_ws.iter().enumerate() {
            for (j, kernel) in kernels.iter().enumerate() {
                let t = best[i * kernels.len() + j];
                eprintln!(
                    "{kernel:?} prefill rows=128, {M}x{K} {:?}, {threads} threads: {:.1} GFLOP/s ({:.2} ms)",
                    w.dtype,
                    flops / t / 1e9,
                    t * 1e3
                );
            }
        }
    }
}
