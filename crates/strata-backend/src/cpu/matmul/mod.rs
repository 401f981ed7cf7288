//! The CPU's one matmul engine: `out = x · wᵀ` for every weight format, split across the
//! pool by output feature (each task owns a contiguous block of weight rows, so every
//! weight byte is read once per call).
//!
//! One dispatch, by how the rows are computed ([`Rows`]) and the weight's format:
//!
//! | | float weights ([`float`]) | block-quantized weights ([`quant`]) |
//! |---|---|---|
//! | [`Rows::ByCount`] | streaming up to [`SMALL_ROWS`] rows, packed GEMM beyond | one-row dot products for one row, the integer GEMM for more |
//! | [`Rows::Alone`] | the streaming path, [`SMALL_ROWS`] rows at a time | the one-row kernels (or their several-row forms), the weights read once |
//! | [`Rows::Gemm`] | the packed GEMM | the integer GEMM where the format has one, else as `Alone` |
//!
//! `Alone` is what a batch of decoding sequences needs (each row comes out as it would
//! alone); `Gemm` what a row-invariant run needs (each row comes out the same whatever
//! the row count). The kernels themselves (block dot products, panels, the GEMM's
//! micro-kernels) are `strata::quant`'s and [`float`]'s per-ISA tables.

pub mod float;
mod gemm;
pub mod quant;

use rayon::ThreadPool;

pub use float::{
    Kernel, SMALL_ROWS, axpy, dot, max_exp_sum, scores, scores_f16, silu_mul, softmax, weighted_sum, weighted_sum_f16,
};
pub use quant::{matmul_many_inputs_rows_alone, matmul_many_rows_alone};

use strata_tensor::tensor::HostTensor;

/// Tasks per pool thread, so work stealing can even out a thread that falls behind.
const TASKS_PER_THREAD: usize = 4;

/// How a matmul computes its rows (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// The path the row count calls for: the fastest.
    ByCount,
    /// Each row as a one-row call computes it.
    Alone,
    /// The GEMM whatever the count, so each row comes out the same in any call.
    Gemm,
}

/// `out[r·m + o] = Σ_k x[r·k_dim + k] · w[o, k]` for `r < rows`, `o < m`, where `w` is
/// `[m, k_dim]` of any format. `x` and `out` may be longer than `rows` rows; the rest is
/// left alone. Runs on `pool`, split by output feature, with the best kernels this CPU has.
pub fn matmul(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_as(Rows::ByCount, pool, x, rows, w, out)
}

/// [`matmul`] with its rows computed `how`.
pub fn matmul_as(how: Rows, pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    match (w.dtype.is_float(), how) {
        (false, how) => quant::matmul_as(how, pool, x, rows, w, out),
        (true, Rows::ByCount) => float::matmul_with(Kernel::best(), pool, x, rows, w, out),
        (true, Rows::Gemm) => float::matmul_packed(pool, x, rows, w, out),
        (true, Rows::Alone) => {
            // Up to `SMALL_ROWS` rows, each comes out as it does alone.
            let (m, k) = (w.shape[0], w.shape[1]);
            if rows == 0 || m == 0 || k == 0 {
                return float::matmul_with(Kernel::best(), pool, x, rows, w, out);
            }
            let (x, out) = (&x[..rows * k], &mut out[..rows * m]);
            for (x, out) in x.chunks(SMALL_ROWS * k).zip(out.chunks_mut(SMALL_ROWS * m)) {
                float::matmul_with(Kernel::best(), pool, x, out.len() / m, w, out);
            }
        }
    }
}

/// [`matmul_as`] with [`Rows::Alone`].
pub fn matmul_rows_alone(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_as(Rows::Alone, pool, x, rows, w, out)
}

/// [`matmul_as`] with [`Rows::Gemm`].
pub fn matmul_packed(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_as(Rows::Gemm, pool, x, rows, w, out)
}

/// Output features per task: a multiple of `unit` (so only the last task has a partial
/// panel, tile or row group), about `TASKS_PER_THREAD` tasks per thread, and all of `m`
/// in one task when the call is too small to be worth waking the pool (`par` false).
fn chunk_len(m: usize, unit: usize, par: bool, threads: usize) -> usize {
    if threads <= 1 || !par {
        return m;
    }
    m.div_ceil(threads * TASKS_PER_THREAD).next_multiple_of(unit).min(m)
}

/// A row-major output the kernels write through: element `(r, c)` is at `ptr + r·ld + c`.
/// A raw pointer because the pool's tasks write disjoint columns of the same rows.
#[derive(Clone, Copy)]
struct OutPtr {
    ptr: *mut f32,
    ld: usize,
}

// SAFETY: an `OutPtr` is only created from a `&mut [f32]` borrowed for the whole parallel
// section, and each task writes a disjoint set of its elements (each owns its columns).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn new(out: &mut [f32], ld: usize) -> OutPtr {
        OutPtr { ptr: out.as_mut_ptr(), ld }
    }

    /// Through a method, so closures capture the whole (`Sync`) wrapper, not its field.
    fn ptr(self) -> *mut f32 {
        self.ptr
    }

    /// The same matrix starting at element `(r, c)`.
    ///
    /// # Safety
    /// `(r, c)` must lie inside the matrix.
    unsafe fn at(self, r: usize, c: usize) -> OutPtr {
        // SAFETY: in bounds by the caller's contract.
        OutPtr { ptr: unsafe { self.ptr.add(r * self.ld + c) }, ..self }
    }
}
