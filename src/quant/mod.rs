//! Block-quantized weight formats: GGML's Q4_0 ... Q8_K (layouts exactly as
//! `ggml-common.h`) and Strata's own `AffineQ4` and `I8`. One file per format with its
//! `#[repr(C)]` block, a size assertion, a scalar reference `dequantize`, a quantizer
//! where one is needed, and the integer dot product llama.cpp uses for matmul (weights
//! against Q8_0/Q8_1/Q8_K-quantized activations). SIMD/CUDA paths are tested against
//! these references; the references are tested against gguf-py in
//! `tests/quant_golden.rs` (fixtures from `tools/make_quant_fixtures.py`).
//!
//! Blocks are read straight out of little-endian files, so this module only builds on
//! little-endian targets.

use rayon::ThreadPool;
use rayon::prelude::*;

use crate::backend::cpu::bandwidth::{DecodeReads, decode_reads};
use crate::backend::cpu::team;
use crate::tensor::{DType, HostTensor};

pub mod affine_q4;
mod gemm;
pub mod int8;
pub(crate) mod panels;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub(crate) mod simd;

pub use simd::QuantKernel;

#[cfg(not(target_endian = "little"))]
compile_error!("quant blocks are cast from little-endian bytes");

/// Values per block of the 32-value formats (`QK4_0`, `QK8_0`, ...).
pub const QK: usize = 32;
/// Values per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// A quantized block that can be viewed in place in a file's bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have no padding (their size assertion equals the sum
/// of their fields) and only hold fields valid for every bit pattern (`u8`, `i8`, `i16`,
/// `f16`, `f32` and arrays of them), so any `size_of::<Self>()` bytes are a valid block.
pub unsafe trait Block: Copy + Send + Sync + 'static {
    /// The [`DType`] whose `block_bytes()` this block's size equals.
    const DTYPE: DType;
}

/// Why bytes could not be viewed as blocks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CastError {
    #[error("{dtype:?}: {len} bytes is not a whole number of {block}-byte blocks")]
    Length { dtype: DType, len: usize, block: usize },
    #[error("{dtype:?}: address {addr:#x} is not aligned to {align}")]
    Align { dtype: DType, addr: usize, align: usize },
}

/// Why a Strata-format quantizer refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error("value {value} at index {index} is not finite")]
    NotFinite { index: usize, value: f32 },
    #[error("value {value} at index {index} is outside the f16 range the format stores")]
    OutOfRange { index: usize, value: f32 },
}

/// Views `bytes` as blocks: the length must be a whole number of blocks and the start
/// aligned for `B`.
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Result<&[B], CastError> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(CastError::Length { dtype: B::DTYPE, len: bytes.len(), block: size });
    }
    let addr = bytes.as_ptr() as usize;
    if !addr.is_multiple_of(align_of::<B>()) {
        return Err(CastError::Align { dtype: B::DTYPE, addr, align: align_of::<B>() });
    }
    // SAFETY: length and alignment checked above; `Block` guarantees every bit pattern is
    // a valid `B` and there is no padding; the borrow keeps the bytes alive.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// The raw bytes of `blocks` (what a file holds).
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: `Block` types have no padding, so every byte is initialised; u8 has no
    // alignment needs and the borrow keeps the blocks alive.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), size_of_val(blocks)) }
}

/// `n` all-zero blocks (a valid value of every `Block`), for quantizers to fill.
pub fn zeroed_blocks<B: Block>(n: usize) -> Vec<B> {
    (0..n)
        .map(|_| {
            // SAFETY: `Block` types are valid for every bit pattern, all-zero included.
            unsafe { std::mem::zeroed::<B>() }
        })
        .collect()
}

/// Calls `f` with the first `n` blocks of `bytes`, in place when aligned and from an
/// aligned copy otherwise. Panics when `bytes` holds fewer than `n` blocks.
fn with_blocks<B: Block, R>(bytes: &[u8], n: usize, f: impl FnOnce(&[B]) -> R) -> R {
    let need = n * size_of::<B>();
    assert!(bytes.len() >= need, "{:?}: {} bytes hold fewer than {n} blocks", B::DTYPE, bytes.len());
    let bytes = &bytes[..need];
    match cast_blocks::<B>(bytes) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let mut copy = zeroed_blocks::<B>(n);
            // SAFETY: `copy` holds exactly `need` bytes of plain-old-data blocks, and the
            // source and destination do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), copy.as_mut_ptr().cast::<u8>(), need) };
            f(&copy)
        }
    }
}

/// GGML's `nearest_int`: rounds to nearest (ties to even) via the 1.5·2²³ trick, valid
/// for |f| ≤ 4194303.
#[inline]
pub(crate) fn nearest_int(f: f32) -> i32 {
    debug_assert!(f.abs() <= 4_194_303.0, "nearest_int({f})");
    let v = f + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Dequantizes the leading blocks of `blocks` (format `dtype`) into `out`, whose length
/// is a whole number of blocks.
pub fn dequantize(dtype: DType, blocks: &[u8], out: &mut [f32]) {
    assert!(out.len().is_multiple_of(dtype.block_size()), "{dtype:?}: {} values is not whole blocks", out.len());
    let n = out.len() / dtype.block_size();
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => unreachable!("plain floats are read directly"),
        DType::Q4_0 => with_blocks(blocks, n, |b| q4_0::dequantize(b, out)),
        DType::Q4_1 => with_blocks(blocks, n, |b| q4_1::dequantize(b, out)),
        DType::Q5_0 => with_blocks(blocks, n, |b| q5_0::dequantize(b, out)),
        DType::Q5_1 => with_blocks(blocks, n, |b| q5_1::dequantize(b, out)),
        DType::Q8_0 => with_blocks(blocks, n, |b| q8_0::dequantize(b, out)),
        DType::Q8_1 => with_blocks(blocks, n, |b| q8_1::dequantize(b, out)),
        DType::Q4_K => with_blocks(blocks, n, |b| q4_k::dequantize(b, out)),
        DType::Q5_K => with_blocks(blocks, n, |b| q5_k::dequantize(b, out)),
        DType::Q6_K => with_blocks(blocks, n, |b| q6_k::dequantize(b, out)),
        DType::Q8_K => with_blocks(blocks, n, |b| q8_k::dequantize(b, out)),
        DType::AffineQ4 => with_blocks(blocks, n, |b| affine_q4::dequantize(b, out)),
        DType::I8 => with_blocks(blocks, n, |b| int8::dequantize(b, out)),
    }
}

/// Activation rows from which the packed GEMM ([`gemm`]) takes over from the
/// single-row dot products.
const GEMM_MIN_ROWS: usize = 2;
/// Calls with fewer weight-block dot products than this run on the calling thread.
const PAR_MIN_DOTS: usize = 1 << 12;
/// Tasks per pool thread, so work stealing can even out a thread that falls behind.
const TASKS_PER_THREAD: usize = 4;
/// Weight rows per tile: each x row passes over a tile's rows while they sit in L1/L2
/// (a tile of 2048-value Q8_0 rows is ~17 KiB), and task boundaries fall on tiles.
const TILE: usize = 8;
/// Parts of a task's weight rows decode reads in turn or side by side
/// ([`DecodeReads`]).
const STREAMS: usize = 4;

/// The format activations are quantized to for the integer dot products with `dtype`
/// weights (llama.cpp's `vec_dot_type`), or `None` for formats without one here.
pub fn activation_dtype(dtype: DType) -> Option<DType> {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => Some(DType::Q8_0),
        DType::Q4_1 | DType::Q5_1 => Some(DType::Q8_1),
        DType::Q4_K | DType::Q5_K | DType::Q6_K => Some(DType::Q8_K),
        _ => None,
    }
}

/// `out[r·m + o] = Σ_k x[r·k + k'] · w[o, k']` for a block-quantized `w` (`[m, k]`), as
/// llama.cpp does it: every x row is quantized once per call (Q8_0, Q8_1 or Q8_K, see
/// [`activation_dtype`]) and each weight block meets it in an integer dot product, so the
/// weights are never dequantized. Runs on `pool` split by output feature (each weight
/// row is read from memory once per call), with the best [`QuantKernel`] this CPU has:
/// one activation row (decode) takes the single-row dot products, several (prefill)
/// the packed GEMM of [`gemm`] where the kernel has one. Formats without an integer dot (Q8_1, Q8_K, AffineQ4, I8) take the dequantizing
/// reference path.
pub fn matmul(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_with(QuantKernel::best(), pool, x, rows, w, out)
}

/// [`matmul`] with a chosen kernel variant; panics if the CPU does not support it.
pub fn matmul_with(kernel: QuantKernel, pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_on(kernel, pool, x, rows, w, out, Rows::ByCount)
}

/// [`matmul`] computing every row exactly as a one-row call computes it (the decode
/// kernel, not the GEMM), while reading the weights once for all of them: the rows of
/// a batch of decoding sequences, each of which must get what it would get alone.
pub fn matmul_rows_alone(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_on(QuantKernel::best(), pool, x, rows, w, out, Rows::Alone)
}

/// [`matmul_rows_alone`] of one `x` through several weights, each into its own output
/// (a layer's q, k and v; its gate and up), as one parallel op: every weight's tasks go
/// to the pool at once, so the threads meet once rather than once per weight, and a
/// weight too small to split runs beside the others instead of alone. Each output comes
/// out as its own call gives it.
pub fn matmul_many_rows_alone(pool: &ThreadPool, x: &[f32], rows: usize, each: &mut [(&HostTensor, &mut [f32])]) {
    let mut each: Vec<(&[f32], &HostTensor, &mut [f32])> =
        each.iter_mut().map(|(w, out)| (x, *w, &mut **out)).collect();
    matmul_many_inputs_rows_alone(pool, rows, &mut each);
}

/// [`matmul_many_rows_alone`] with an input of its own for each weight (a sparse FFN's
/// kept groups: each group's `down` columns meet that group's activations), as one
/// parallel op. Each output comes out as its own [`matmul_rows_alone`] call gives it.
pub fn matmul_many_inputs_rows_alone(pool: &ThreadPool, rows: usize, each: &mut [(&[f32], &HostTensor, &mut [f32])]) {
    let kernel = QuantKernel::best();
    let reads = decode_reads();
    let mut starts = vec![0];
    let mut tasks = Vec::with_capacity(each.len());
    for (x, w, out) in each.iter_mut() {
        if let Some((n, task)) = plan(kernel, pool, x, rows, w, out, Rows::Alone, reads) {
            starts.push(starts.last().copied().unwrap_or(0) + n);
            tasks.push(task);
        }
    }
    let total = starts.pop().unwrap_or(0);
    team::for_each(pool, total, |t| {
        let i = starts.partition_point(|&s| s <= t) - 1;
        tasks[i](t - starts[i]);
    });
}

/// [`matmul`] computing every row as the prefill path does whatever the row count: the
/// packed GEMM for formats that have one (a single row included), else each row as a
/// one-row call computes it ([`matmul_rows_alone`]).
pub fn matmul_packed(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    let kernel = QuantKernel::best();
    let gemm =
        activation_dtype(w.dtype).is_some() && kernel.dot_fn(w.dtype).is_some() && kernel.gemm(w.dtype).is_some();
    match gemm {
        true => matmul_on(kernel, pool, x, rows, w, out, Rows::Gemm),
        false => matmul_on(kernel, pool, x, rows, w, out, Rows::Alone),
    }
}

/// How [`matmul_on`] computes its rows.
#[derive(Clone, Copy, PartialEq)]
enum Rows {
    /// The GEMM from `GEMM_MIN_ROWS` rows, the decode kernel for one.
    ByCount,
    /// Each as a one-row call would.
    Alone,
    /// The GEMM whatever the count.
    Gemm,
}

fn matmul_on(
    kernel: QuantKernel,
    pool: &ThreadPool,
    x: &[f32],
    rows: usize,
    w: &HostTensor,
    out: &mut [f32],
    how: Rows,
) {
    let reads = decode_reads();
    matmul_reading(kernel, pool, x, rows, w, out, how, reads)
}

/// [`matmul_on`] with the way one-row calls read their weight rows chosen.
#[allow(clippy::too_many_arguments, reason = "the call spelled out")]
fn matmul_reading(
    kernel: QuantKernel,
    pool: &ThreadPool,
    x: &[f32],
    rows: usize,
    w: &HostTensor,
    out: &mut [f32],
    how: Rows,
    reads: DecodeReads,
) {
    if let Some((tasks, task)) = plan(kernel, pool, x, rows, w, out, how, reads) {
        team::for_each(pool, tasks, task);
    }
}

/// Prepares [`matmul_reading`]'s split by output feature: its task count and the task
/// (by index) that computes each part. Runs the calls that take another path (the GEMM,
/// the dequantizing reference) at once and returns `None`.
#[allow(clippy::too_many_arguments, reason = "the call spelled out")]
fn plan<'a>(
    kernel: QuantKernel,
    pool: &ThreadPool,
    x: &[f32],
    rows: usize,
    w: &'a HostTensor,
    out: &'a mut [f32],
    how: Rows,
    reads: DecodeReads,
) -> Option<(usize, impl Fn(usize) + Sync + 'a)> {
    let alone = how == Rows::Alone;
    // Panels exist only where the best kernel runs them, whatever kernel was asked for.
    let kernel = if w.is_panels() { QuantKernel::best() } else { kernel };
    let (m, k) = (w.shape[0], w.shape[1]);
    assert!(x.len() >= rows * k, "quant matmul: x holds {} values, need {rows} rows of {k}", x.len());
    assert!(out.len() >= rows * m, "quant matmul: out holds {} values, need {rows} rows of {m}", out.len());
    let (Some(act), Some(dot)) = (activation_dtype(w.dtype), kernel.dot_fn(w.dtype)) else {
        matmul_dequantized(pool, x, rows, w, out);
        return None;
    };
    if rows == 0 || m == 0 {
        return None;
    }
    let row_bytes = w.dtype.bytes_for(k).expect("a weight row is whole blocks");
    let nb = k / w.dtype.block_size();
    let bytes = w.bytes();
    assert!(
        bytes.len() >= m * row_bytes,
        "quant matmul: {:?} weight holds {} bytes, need {}",
        w.dtype,
        bytes.len(),
        m * row_bytes
    );
    if (rows >= GEMM_MIN_ROWS || how == Rows::Gemm)
        && !alone
        && let Some(mut g) = kernel.gemm(w.dtype)
    {
        #[cfg(target_arch = "x86_64")]
        if w.is_panels() {
            g.unpack = panels::gemm_unpack(w.dtype).expect("panel formats have a GEMM unpacker");
        }
        gemm::matmul(pool, &g, w.dtype, bytes, m, k, x, rows, out);
        return None;
    }
    let threads = pool.current_num_threads();
    let par = threads > 1 && rows * m * nb >= PAR_MIN_DOTS;
    let mut acts = quantize_rows(pool, act, &x[..rows * k], rows, k, par);
    // Panels: each activation row packed for them, every row through their kernels.
    let panel_fns = w.is_panels().then(|| panels::kernels(w.dtype)).flatten();
    assert!(panel_fns.is_some() || !w.is_panels(), "panels exist only where their kernels run");
    if w.is_panels() {
        acts = panels::pack_rows(w.dtype, &acts, rows, nb);
    }
    let mut dot = dot;
    // The four-row form of whichever one-row kernel runs (`streams_fn` follows
    // `decode_fn`, as `dot` does below).
    // (Panels have kernels of their own, below.)
    let rows_layout = panel_fns.is_none();
    let streams = kernel.streams_fn(w.dtype).filter(|_| rows_layout && rows == 1 && reads == DecodeReads::SideBySide);
    let decode = (rows_layout && (rows == 1 || alone)).then(|| kernel.decode_fn(w.dtype)).flatten();
    // Several rows, each as one alone: the several-row form of the same kernel.
    let several = match alone && rows > 1 {
        true => kernel.rows_fn(w.dtype).filter(|&(_, packed)| packed == decode.is_some()).map(|(f, _)| f),
        false => None,
    };
    if let Some(dec) = decode {
        let act_row = acts.len() / rows;
        let mut packed = Vec::new();
        let used = act.bytes_for(k).expect("activation rows are whole blocks");
        for r in 0..rows {
            let row = &acts[r * act_row..(r + 1) * act_row];
            // SAFETY: a row of whole activation blocks, viewed as bytes.
            let bytes = unsafe { std::slice::from_raw_parts(row.as_ptr().cast::<u8>(), row.len() * 4) };
            packed.extend(simd::dec512::pack(w.dtype, &bytes[..used]).expect("decode kernels have a packing"));
        }
        acts = packed;
        dot = dec;
    }
    let act_row = acts.len() / rows;

    let unit = if panel_fns.is_some() { panels::ROWS } else { TILE };
    let chunk = if par { m.div_ceil(threads * TASKS_PER_THREAD).next_multiple_of(unit).min(m) } else { m };
    let dst = OutPtr(out.as_mut_ptr());
    let tasks = m.div_ceil(chunk);
    let run = move |t: usize| {
        let dot_at = |r: usize, o: usize| {
            let a = acts[r * act_row..(r + 1) * act_row].as_ptr();
            let wrow = bytes[o * row_bytes..(o + 1) * row_bytes].as_ptr();
            // SAFETY: `dot` came from `kernel.dot_fn`, which checked the CPU features; `wrow`
            // holds `nb` weight blocks and `a` the row's `nb` activation blocks of the
            // matching format, aligned (see `quantize_rows`). `r·m + o` is inside `out`
            // (checked above), and only the task owning column `o` writes it while `out`
            // stays mutably borrowed for this call.
            unsafe { dst.ptr().add(r * m + o).write(dot(wrow, a.cast(), nb)) };
        };
        let task = |cols: std::ops::Range<usize>| {
            if let Some(fns) = panel_fns {
                let side_by_side = reads == DecodeReads::SideBySide;
                // SAFETY: `bytes` holds `m` rows as panels (a panel tensor's `m` is a
                // multiple of 16, so `cols` is whole panels); `acts` holds `rows` packed
                // rows of `nb` blocks, `act_row` words apart; only this task writes the
                // columns `cols` of each of the `rows` rows of `out` (`m` apart).
                unsafe {
                    panels::run(&fns, bytes, row_bytes, nb, cols, &acts, act_row * 4, rows, dst.ptr(), m, side_by_side)
                };
                return;
            }
            if let Some(f) = streams {
                // Decode reads `STREAMS` distant parts of the range side by side: rows
                // `o + s·per` for `s < STREAMS` at once, block by block.
                let per = cols.len() / STREAMS;
                let a = acts.as_ptr().cast::<u8>();
                for o in cols.start..cols.start + per {
                    // SAFETY: as in `dot_at`, for the weight rows `o + s·per` (inside `cols`)
                    // and the one activation row; `f` is the four-row form of `dot`.
                    let got = unsafe { f(bytes[o * row_bytes..].as_ptr(), per * row_bytes, a, nb) };
                    for (s, v) in got.into_iter().enumerate() {
                        // SAFETY: as in `dot_at`: column `o + s·per` belongs to this task.
                        unsafe { dst.ptr().add(o + s * per).write(v) };
                    }
                }
                (cols.start + STREAMS * per..cols.end).for_each(|o| dot_at(0, o));
                return;
            }
            if rows == 1 {
                // Decode streams the weights once: walk `STREAMS` distant parts of the range
                // in turn, so several sequential reads are in flight at once (one stream per
                // core reaches only about 60% of the memory bandwidth on some machines).
                let per = cols.len().div_ceil(STREAMS);
                for i in 0..per {
                    for o in (cols.start + i..cols.end).step_by(per) {
                        dot_at(0, o);
                    }
                }
                return;
            }
            if let Some(f) = several {
                // Each weight row meets the activation rows 8, 4 or 2 at a time; where the
                // format has it, two weight rows meet them at once.
                let stride = act_row * 4;
                let put = |r: usize, o: usize, v: f32| {
                    // SAFETY: as in `dot_at`.
                    unsafe { dst.ptr().add(r * m + o).write(v) }
                };
                let mut o = cols.start;
                while o < cols.end {
                    let wrow = bytes[o * row_bytes..].as_ptr();
                    let mut r = 0;
                    if let Some(pairs) = f.pairs.filter(|_| o + 1 < cols.end) {
                        while rows - r >= 2 {
                            let a = acts[r * act_row..].as_ptr().cast::<u8>();
                            let take = |got: &[&[f32]; 2]| {
                                for (j, vals) in got.iter().enumerate() {
                                    vals.iter().enumerate().for_each(|(i, &v)| put(r + i, o + j, v));
                                }
                                got[0].len()
                            };
                            // SAFETY: as in `dot_at`, for weight rows `o`, `o + 1` (inside
                            // `cols`) and the activation rows from `r` (as many as remain).
                            r += unsafe {
                                match rows - r {
                                    8.. => {
                                        let [x, y] = (pairs.p8)(wrow, row_bytes, a, stride, nb);
                                        take(&[&x, &y])
                                    }
                                    4.. => {
                                        let [x, y] = (pairs.p4)(wrow, row_bytes, a, stride, nb);
                                        take(&[&x, &y])
                                    }
                                    _ => {
                                        let [x, y] = (pairs.p2)(wrow, row_bytes, a, stride, nb);
                                        take(&[&x, &y])
                                    }
                                }
                            };
                        }
                        // A last odd row: each weight row on its own.
                        if r < rows {
                            let a = acts[r * act_row..].as_ptr().cast::<u8>();
                            for oo in [o, o + 1] {
                                // SAFETY: as in `dot_at`.
                                put(r, oo, unsafe { dot(bytes[oo * row_bytes..].as_ptr(), a, nb) });
                            }
                        }
                        o += 2;
                        continue;
                    }
                    while r < rows {
                        let (left, at) = (rows - r, &acts[r * act_row..]);
                        // SAFETY: as in `dot_at`, for weight row `o` and the rows left.
                        r += unsafe { several_at(&f, dot, wrow, at, stride, left, nb, |i, v| put(r + i, o, v)) };
                    }
                    o += 1;
                }
                return;
            }
            for tile in cols.clone().step_by(TILE) {
                let tile = tile..(tile + TILE).min(cols.end);
                for r in 0..rows {
                    for o in tile.clone() {
                        dot_at(r, o);
                    }
                }
            }
        };
        task(t * chunk..((t + 1) * chunk).min(m));
    };
    Some((tasks, run))
}

/// One weight row against the next 8, 4, 2 or 1 of `left` activation rows (`stride`
/// bytes apart from `acts`), through `f`'s several-row forms or `dot`; hands each result
/// to `put` with its row offset and returns how many rows it did.
///
/// # Safety
/// `f` and `dot` are kernels of `wrow`'s format this CPU runs; `wrow` holds `nb` weight
/// blocks, and `acts` at least `left` activation rows of `nb` blocks `stride` bytes apart,
/// in the kernels' activation format.
#[allow(clippy::too_many_arguments, reason = "the kernel call spelled out")]
unsafe fn several_at(
    f: &simd::RowsFn,
    dot: simd::DotFn,
    wrow: *const u8,
    acts: &[u32],
    stride: usize,
    left: usize,
    nb: usize,
    mut put: impl FnMut(usize, f32),
) -> usize {
    let a = acts.as_ptr().cast::<u8>();
    // SAFETY: the caller's contract.
    let got: &[f32] = unsafe {
        match left {
            8.. => &(f.r8)(wrow, a, stride, nb),
            4.. => &(f.r4)(wrow, a, stride, nb),
            2.. => &(f.r2)(wrow, a, stride, nb),
            _ => &[dot(wrow, a, nb)],
        }
    };
    got.iter().enumerate().for_each(|(i, &v)| put(i, v));
    got.len()
}

/// The output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

impl OutPtr {
    /// Through a method, so closures capture the whole (`Sync`) wrapper, not its field.
    fn ptr(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: tasks write disjoint elements (see `matmul_with`), so sharing the pointer is
// no more than sharing disjoint `&mut f32`s.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Activation blocks, aligned for any activation block type (`u32` words suffice: Q8_K
/// needs 4, Q8_0/Q8_1 need 2) with every row starting on a block boundary.
fn quantize_rows(pool: &ThreadPool, act: DType, x: &[f32], rows: usize, k: usize, par: bool) -> Vec<u32> {
    let row_bytes = act.bytes_for(k).expect("a weight row is whole activation blocks");
    // Round each row up to whole u32 words: Q8_0/Q8_1 rows of odd block counts are not.
    let row_words = row_bytes.div_ceil(4);
    let mut buf = vec![0u32; rows * row_words];
    let one = |(xr, words): (&[f32], &mut [u32])| {
        // SAFETY: `words` is `row_words ≥ row_bytes / 4` initialised u32s; viewing them as
        // bytes needs no alignment.
        let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), row_bytes) };
        simd::quantize_activations(act, xr, bytes);
    };
    if par && rows > 1 {
        team::for_each_chunk_mut(pool, &mut buf, row_words, |r, words| one((&x[r * k..][..k], words)));
    } else {
        x.chunks(k).zip(buf.chunks_mut(row_words)).for_each(one);
    }
    buf
}

/// Views `n` blocks at the start of `bytes` mutably; panics when misaligned or short.
fn cast_blocks_mut<B: Block>(bytes: &mut [u8], n: usize) -> &mut [B] {
    let need = n * size_of::<B>();
    assert!(bytes.len() >= need && (bytes.as_ptr() as usize).is_multiple_of(align_of::<B>()));
    // SAFETY: length and alignment checked; every bit pattern is a valid `B` (`Block`),
    // and the exclusive borrow carries over.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) }
}

/// The reference path for formats without an integer dot: one dequantized weight row at
/// a time per task, dotted with the f32 x rows.
fn matmul_dequantized(pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    let (m, k) = (w.shape[0], w.shape[1]);
    let row_bytes = w.dtype.bytes_for(k).expect("a weight row is whole blocks");
    let bytes = w.bytes();
    let cols: Vec<Vec<f32>> = pool.install(|| {
        (0..m)
            .into_par_iter()
            .map_init(
                || vec![0.0f32; k],
                |row, o| {
                    dequantize(w.dtype, &bytes[o * row_bytes..(o + 1) * row_bytes], row);
                    (0..rows).map(|r| crate::backend::cpu::matmul::dot(&x[r * k..(r + 1) * k], row)).collect()
                },
            )
            .collect()
    });
    for (o, col) in cols.iter().enumerate() {
        for (r, v) in col.iter().enumerate() {
            out[r * m + o] = *v;
        }
    }
}

/// Formats `strata convert --quant` can produce, by the names it accepts.
pub const CONVERT_TARGETS: [(&str, DType); 9] = [
    ("f32", DType::F32),
    ("f16", DType::F16),
    ("bf16", DType::BF16),
    ("q8_0", DType::Q8_0),
    ("q4_0", DType::Q4_0),
    ("q4_k", DType::Q4_K),
    ("q6_k", DType::Q6_K),
    ("affine_q4", DType::AffineQ4),
    ("int8", DType::I8),
];

/// The conversion target called `name` (case-insensitive), or an error listing them.
pub fn convert_target(name: &str) -> Result<DType, String> {
    CONVERT_TARGETS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, d)| *d).ok_or_else(|| {
        let names: Vec<_> = CONVERT_TARGETS.iter().map(|(n, _)| *n).collect();
        format!("unknown quantization `{name}`; choose one of {}", names.join(", "))
    })
}

/// The bytes of a row-major `[rows, cols]` matrix `x` in `dtype` (one of
/// [`CONVERT_TARGETS`]); `cols` must be whole blocks of `dtype`. Rows are quantized in
/// parallel on `pool`; the results do not depend on the split.
pub fn quantize_matrix(
    pool: &ThreadPool,
    dtype: DType,
    x: &[f32],
    rows: usize,
    cols: usize,
) -> Result<crate::tensor::AlignedBytes, QuantError> {
    assert_eq!(x.len(), rows * cols, "quantize_matrix: {} values for {rows} x {cols}", x.len());
    let row_bytes = dtype.bytes_for(cols).unwrap_or_else(|| panic!("{cols} columns is not whole {dtype:?} blocks"));
    let mut out = crate::tensor::AlignedBytes::zeroed(rows * row_bytes);
    let nb = cols / dtype.block_size();
    let one = |(xr, br): (&[f32], &mut [u8])| -> Result<(), QuantError> {
        match dtype {
            DType::F32 => br.copy_from_slice(f32_bytes(xr)),
            DType::F16 => br
                .chunks_exact_mut(2)
                .zip(xr)
                .for_each(|(b, v)| b.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes())),
            DType::BF16 => br
                .chunks_exact_mut(2)
                .zip(xr)
                .for_each(|(b, v)| b.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes())),
            DType::Q8_0 => q8_0::quantize(xr, cast_blocks_mut(br, nb)),
            DType::Q4_0 => q4_0::quantize(xr, cast_blocks_mut(br, nb)),
            DType::Q4_K => q4_k::quantize(xr, cast_blocks_mut(br, nb)),
            DType::Q6_K => q6_k::quantize(xr, cast_blocks_mut(br, nb)),
            DType::AffineQ4 => affine_q4::quantize(xr, cast_blocks_mut(br, nb))?,
            DType::I8 => int8::quantize_rows(xr, cols, cast_blocks_mut(br, nb))?,
            other => panic!("{other:?} is not a conversion target"),
        }
        Ok(())
    };
    let bytes = out.bytes_mut();
    let result: Result<(), QuantError> = pool.install(|| {
        x.par_chunks(cols).zip(bytes.par_chunks_mut(row_bytes)).enumerate().try_for_each(|(r, pair)| {
            one(pair).map_err(|e| match e {
                QuantError::NotFinite { index, value } => QuantError::NotFinite { index: r * cols + index, value },
                QuantError::OutOfRange { index, value } => QuantError::OutOfRange { index: r * cols + index, value },
            })
        })
    });
    result.map(|()| out)
}

/// The little-endian bytes of `x`.
fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte is initialised; u8 needs no alignment;
    // the crate only builds on little-endian targets.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), size_of_val(x)) }
}

/// Helpers shared by the per-format unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    /// The error a Q4_1/Q5_1 × Q8_1 integer dot may carry beyond float rounding: each
    /// weight block's offset `m` multiplies the activation's `s`, which is `d·Σq` rounded
    /// to f16 with an unrounded `d` (`ms` holds the weight blocks' `m`).
    pub fn q8_1_s_slop(ms: impl Iterator<Item = f32>, acts: &[super::q8_1::BlockQ8_1]) -> f32 {
        let ulp = 2f32.powi(-10);
        ms.zip(acts).map(|(m, a)| m.abs() * (a.s.to_f32().abs() * ulp + 32.0 * 127.0 * a.d.to_f32() * ulp)).sum()
    }

    /// Quantizes `x` with `quantize` into whole `B` blocks and dequantizes them back:
    /// the blocks and the values they stand for.
    pub fn quantize_roundtrip<B: super::Block>(
        x: &[f32],
        quantize: impl FnOnce(&[f32], &mut [B]),
        dequantize: fn(&[B], &mut [f32]),
    ) -> (Vec<B>, Vec<f32>) {
        let mut b = super::zeroed_blocks(x.len() / B::DTYPE.block_size());
        quantize(x, &mut b);
        let mut y = vec![0.0; x.len()];
        dequantize(&b, &mut y);
        (b, y)
    }

    /// A small deterministic generator (xorshift64*), so tests need no extra crates.
    pub struct Rng(u64);

    impl Rng {
        pub fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform in [-1, 1).
        pub fn uniform(&mut self) -> f32 {
            (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
        /// Roughly normal (sum of four uniforms), scaled.
        pub fn normal(&mut self, scale: f32) -> f32 {
            (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866 * scale
        }
        pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.normal(scale)).collect()
        }
        pub fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next_u64() as u8).collect()
        }
    }

    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (*x as f64) * (*y as f64)).sum::<f64>() as f32
    }

    /// Σ|a_i·b_i|: the scale the float error of a dot product is relative to.
    pub fn abs_dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode reads weight rows in turn or four side by side, as the machine reads faster;
    /// every output is the same bits either way, and the same as that weight row alone.
    #[test]
    fn decode_reads_rows_in_turn_or_side_by_side_with_the_same_bits() {
        use crate::backend::cpu::bandwidth::DecodeReads;
        use crate::tensor::{AlignedBytes, ByteSource};
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut rng = testutil::Rng::new(5);
        let formats =
            [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K];
        let kernels = QuantKernel::ALL.into_iter().filter(|k| k.is_available());
        for (kernel, dtype) in kernels.flat_map(|k| formats.map(|d| (k, d))) {
            // 544 wide: a last group of fewer blocks (32-value formats only).
            for (m, k) in [(6, 512), (37, 768), (300, 512), (41, 544)] {
                if k % dtype.block_size() != 0 {
                    continue;
                }
                let bytes = match dtype {
                    DType::Q6_K => quantize_matrix(&pool, dtype, &rng.vec(m * k, 1.0), m, k).unwrap().bytes().to_vec(),
                    _ => {
                        let mut b = rng.bytes(dtype.bytes_for(m * k).unwrap());
                        // Sane scales (and mins) where every format keeps them: bytes 0..4.
                        for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                            blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                            blk[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
                        }
                        b
                    }
                };
                let tensor = |b: &[u8], rows: usize| {
                    HostTensor::new(std::sync::Arc::new(AlignedBytes::from_slice(b)), 0, b.len(), dtype, vec![rows, k])
                };
                let w = tensor(&bytes, m);
                let x = rng.vec(k, 1.0);
                let run = |w: &HostTensor, rows: usize, reads| {
                    let mut out = vec![0f32; rows];
                    matmul_reading(kernel, &pool, &x, 1, w, &mut out, Rows::ByCount, reads);
                    out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                let in_turn = run(&w, m, DecodeReads::InTurn);
                assert_eq!(run(&w, m, DecodeReads::SideBySide), in_turn, "{kernel:?} {dtype:?} {m}x{k}");
                let row_bytes = bytes.len() / m;
                let alone: Vec<u32> = (0..m)
                    .flat_map(|o| {
                        run(&tensor(&bytes[o * row_bytes..(o + 1) * row_bytes], 1), 1, DecodeReads::SideBySide)
                    })
                    .collect();
                assert_eq!(alone, in_turn, "{kernel:?} {dtype:?} {m}x{k}: a row alone");
            }
        }
    }

    /// Several weights through one parallel op (`matmul_many_rows_alone`) give each the
    /// bits of its own call, on a team and off it, for one row and several.
    #[test]
    fn several_weights_in_one_op_give_each_call_s_bits() {
        use crate::tensor::{AlignedBytes, ByteSource};
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut rng = testutil::Rng::new(11);
        let k = 512;
        let weight = |rng: &mut testutil::Rng, dtype: DType, m: usize| {
            let t = quantize_matrix(&pool, dtype, &rng.vec(m * k, 1.0), m, k).unwrap();
            let b = t.bytes().to_vec();
            HostTensor::new(std::sync::Arc::new(AlignedBytes::from_slice(&b)), 0, b.len(), dtype, vec![m, k])
        };
        // Sizes from one task to many; formats with and without a decode kernel, and one
        // (AffineQ4) without an integer dot.
        let ws = [
            weight(&mut rng, DType::Q4_0, 300),
            weight(&mut rng, DType::Q6_K, 7),
            weight(&mut rng, DType::Q4_K, 64),
            weight(&mut rng, DType::Q8_0, 129),
            weight(&mut rng, DType::AffineQ4, 40),
        ];
        for rows in [1, 3] {
            let x = rng.vec(rows * k, 1.0);
            let alone: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| {
                    let mut out = vec![0f32; rows * w.shape[0]];
                    matmul_rows_alone(&pool, &x, rows, w, &mut out);
                    out
                })
                .collect();
            for on_team in [false, true] {
                let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; rows * w.shape[0]]).collect();
                let mut each: Vec<(&HostTensor, &mut [f32])> =
                    ws.iter().zip(outs.iter_mut()).map(|(w, o)| (w, &mut o[..])).collect();
                match on_team {
                    true => team::lead(&pool, || matmul_many_rows_alone(&pool, &x, rows, &mut each)),
                    false => matmul_many_rows_alone(&pool, &x, rows, &mut each),
                }
                let bits = |v: &[Vec<f32>]| {
                    v.iter().map(|o| o.iter().map(|f| f.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>()
                };
                assert_eq!(bits(&outs), bits(&alone), "{rows} rows, on a team: {on_team}");
            }
        }
    }

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(31.49), 31);
    }

    #[test]
    fn cast_checks_length_and_alignment() {
        let buf = crate::tensor::AlignedBytes::from_slice(&[0u8; 300]);
        use crate::tensor::ByteSource;
        let bytes = buf.bytes();
        assert_eq!(cast_blocks::<q8_0::BlockQ8_0>(&bytes[..68]).map(|b| b.len()), Ok(2));
        assert!(matches!(cast_blocks::<q8_0::BlockQ8_0>(&bytes[..67]), Err(CastError::Length { .. })));
        assert!(matches!(cast_blocks::<q8_0::BlockQ8_0>(&bytes[1..69]), Err(CastError::Align { .. })));
        assert!(matches!(cast_blocks::<int8::BlockI8>(&bytes[2..38]), Err(CastError::Align { .. })));
        assert!(matches!(cast_blocks::<q8_k::BlockQ8K>(&bytes[..146]), Err(CastError::Length { .. })));
        assert_eq!(cast_blocks::<q8_k::BlockQ8K>(&bytes[..292]).map(|b| b.len()), Ok(1));
    }

    #[test]
    fn misaligned_bytes_dequantize_like_aligned_ones() {
        let mut rng = testutil::Rng::new(7);
        let x = rng.vec(64, 1.0);
        let mut blocks = zeroed_blocks::<q8_0::BlockQ8_0>(2);
        q8_0::quantize(&x, &mut blocks);
        let mut raw = vec![0u8; 1];
        raw.extend_from_slice(blocks_as_bytes(&blocks));
        // AlignedBytes starts 64-aligned, so offset 1 is misaligned for f16.
        let shifted = crate::tensor::AlignedBytes::from_slice(&raw);
        use crate::tensor::ByteSource;
        assert!(cast_blocks::<q8_0::BlockQ8_0>(&shifted.bytes()[1..]).is_err());
        let (mut a, mut b) = (vec![0.0; 64], vec![0.0; 64]);
        dequantize(DType::Q8_0, blocks_as_bytes(&blocks), &mut a);
        dequantize(DType::Q8_0, &shifted.bytes()[1..], &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn dispatch_covers_every_block_dtype() {
        use DType::*;
        for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K, AffineQ4, I8] {
            let buf = crate::tensor::AlignedBytes::zeroed(dtype.block_bytes() * 2);
            use crate::tensor::ByteSource;
            let mut out = vec![1.0f32; dtype.block_size() * 2];
            dequantize(dtype, buf.bytes(), &mut out);
            assert!(out.iter().all(|v| *v == 0.0), "{dtype:?}: zero blocks are zeros");
        }
    }
}
