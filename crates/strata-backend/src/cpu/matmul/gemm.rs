//! The prefill GEMM's drive: 16-row weight panels split over the pool, each unpacked
//! once into its task's scratch and run against every activation row by the kernels of
//! `strata::quant::gemm` (whose module docs give the arithmetic).

use rayon::ThreadPool;

use super::OutPtr;
use super::TASKS_PER_THREAD;
use strata_quant::gemm::{GemmKernel, MicroTile, PANEL, PackedActs};
use strata_tensor::tensor::DType;

/// A 64-byte aligned line of panel scratch.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// One task's unpacked panel: levels and the per-group `dw`/`mw` lanes.
struct Scratch {
    levels: Vec<Line>,
    dw: Vec<Line>,
    mw: Vec<Line>,
}

impl Scratch {
    /// Room for a panel of `k` values in groups of `group` (a line holds 4 values of
    /// each of the 16 rows; a group's scales are one line).
    fn reserve(&mut self, k: usize, group: usize) {
        let grow = |v: &mut Vec<Line>, n: usize| {
            if v.len() < n {
                v.resize(n, Line([0; 64]));
            }
        };
        grow(&mut self.levels, k / 4);
        grow(&mut self.dw, k / group);
        grow(&mut self.mw, k / group);
    }
}

thread_local! {
    /// Each pool thread's panel scratch, kept between calls.
    static SCRATCH: std::cell::RefCell<Scratch> =
        const { std::cell::RefCell::new(Scratch { levels: Vec::new(), dw: Vec::new(), mw: Vec::new() }) };
    /// The calling thread's packed activations, kept between calls.
    static ACTS: std::cell::RefCell<PackedActs> = const { std::cell::RefCell::new(PackedActs::empty()) };
}

/// `out[r·m + o] = Σ x[r, ·] · w[o, ·]` for the `[m, k]` block-quantized weight `bytes`
/// (rows of `row_bytes`), with `gemm`'s kernels: 16-row panels split over `pool`, each
/// unpacked once and run against every activation row.
#[allow(clippy::too_many_arguments, reason = "the matmul shape spelled out")]
pub(crate) fn matmul(
    pool: &ThreadPool,
    gemm: &GemmKernel,
    dtype: DType,
    bytes: &[u8],
    m: usize,
    k: usize,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) {
    let fmt = gemm.fmt;
    let row_bytes = dtype.bytes_for(k).expect("a weight row is whole blocks");
    assert!(bytes.len() >= m * row_bytes && out.len() >= rows * m && x.len() >= rows * k);
    let nb = k / dtype.block_size();
    let mut run = |acts: &mut PackedActs| {
        acts.fill(pool, dtype, fmt, x, rows, k);
        run_panels(pool, gemm, bytes, row_bytes, nb, m, k, acts, rows, out);
    };
    // A nested call on this thread (work stolen while it waits) gets its own buffers.
    ACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut acts) => run(&mut acts),
        Err(_) => run(&mut PackedActs::empty()),
    });
}

/// The panels of [`matmul`] over `pool`, against activations already packed.
#[allow(clippy::too_many_arguments, reason = "the matmul shape spelled out")]
fn run_panels(
    pool: &ThreadPool,
    gemm: &GemmKernel,
    bytes: &[u8],
    row_bytes: usize,
    nb: usize,
    m: usize,
    k: usize,
    acts: &PackedActs,
    rows: usize,
    out: &mut [f32],
) {
    let fmt = gemm.fmt;
    let dst = OutPtr::new(out, m);
    let run = |scratch: &mut Scratch, p: usize| {
        let o = p * PANEL;
        let lanes = (m - o).min(PANEL);
        let (levels, dw, mw) =
            (scratch.levels.as_mut_ptr().cast(), scratch.dw.as_mut_ptr().cast(), scratch.mw.as_mut_ptr().cast());
        // SAFETY: rows `o..o + lanes` are whole rows of `nb` blocks inside `bytes`
        // (asserted above); the scratch lines are aligned and sized for `k` values;
        // `gemm` came from `QuantKernel::gemm`, which checked the CPU features.
        unsafe { (gemm.unpack)(bytes.as_ptr().add(o * row_bytes), row_bytes, lanes, nb, levels, dw, mw) };
        let ar_max = gemm.micro.len();
        for r in (0..rows).step_by(ar_max) {
            let ar = (rows - r).min(ar_max);
            let tile = MicroTile {
                levels,
                dw,
                mw,
                groups: acts.groups,
                qs: acts.qs[r * k..].as_ptr(),
                qs_stride: k,
                da: acts.da[r * acts.groups..].as_ptr(),
                ioff: acts.ioff[r * acts.groups..].as_ptr(),
                ms: acts.ms[r * acts.groups..].as_ptr(),
                g_stride: acts.groups,
                per: acts.per,
                // SAFETY: `(r + j)·m + o + i` for j < ar, i < lanes is inside `out`.
                out: unsafe { dst.ptr().add(r * m + o) },
                os: m,
                mask: ((1u32 << lanes) - 1) as u16,
            };
            // SAFETY: the tile describes the panel just unpacked and activation rows
            // `r..r + ar` of `acts`; only the task owning panel `p` writes columns
            // `o..o + lanes`.
            unsafe { (gemm.micro[ar - 1])(&tile) };
        }
    };
    let panels = m.div_ceil(PANEL);
    let threads = pool.current_num_threads();
    // A few tasks per thread, each with one scratch panel for its run of panels.
    let tasks = if threads > 1 { panels.min(threads * TASKS_PER_THREAD) } else { 1 };
    let task = |t: usize| {
        let go = |scratch: &mut Scratch| {
            scratch.reserve(k, fmt.group);
            (t * panels / tasks..(t + 1) * panels / tasks).for_each(|p| run(scratch, p));
        };
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => go(&mut scratch),
            Err(_) => go(&mut Scratch { levels: Vec::new(), dw: Vec::new(), mw: Vec::new() }),
        })
    };
    if tasks > 1 {
        strata_tensor::team::for_each(pool, tasks, task);
    } else {
        task(0);
    }
}
