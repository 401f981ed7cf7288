//! The quantized half of the matmul: `out = x · wᵀ` for a block-quantized `w`, as
//! llama.cpp does it. Every x row is quantized once per call (Q8_0, Q8_1 or Q8_K, see
//! [`activation_dtype`]) and each weight block meets it in an integer dot product from
//! `strata::quant`'s kernels, so the weights are never dequantized; one activation row
//! (decode) takes the single-row dot products, several (prefill) the packed GEMM
//! ([`super::gemm`]) where the kernel has one. Formats without an integer dot (Q8_1, Q8_K,
//! AffineQ4, I8) take the dequantizing reference path.

use std::ops::Range;

use rayon::ThreadPool;
use rayon::prelude::*;

use super::{OutPtr, Rows};
use strata_quant::simd::{self, QuantKernel};
use strata_quant::{STREAMS, activation_dtype, dequantize, panels};
use strata_tensor::team;
use strata_tensor::tensor::{DType, HostTensor};

/// Activation rows from which the packed GEMM ([`gemm`]) takes over from the
/// single-row dot products.
const GEMM_MIN_ROWS: usize = 2;
/// Calls with fewer weight-block dot products than this run on the calling thread.
const PAR_MIN_DOTS: usize = 1 << 12;
/// Weight rows per tile: each x row passes over a tile's rows while they sit in L1/L2
/// (a tile of 2048-value Q8_0 rows is ~17 KiB), and task boundaries fall on tiles.
const TILE: usize = 8;

/// How a one-row call reads a task's weight rows: four parts of them side by side, block
/// by block (four memory streams, faster on every machine measured), or one row at a time,
/// the parts in turn. Both give the same bits; production reads side by side, and the
/// tests prove the two agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code, reason = "in-turn reads are what the tests compare against"))]
enum DecodeReads {
    InTurn,
    SideBySide,
}

/// `out[r·m + o] = Σ_k x[r·k + k'] · w[o, k']` for a block-quantized `w` (`[m, k]`) with
/// the best [`QuantKernel`] this CPU has, its rows computed `how` ([`super::matmul_as`]):
/// [`Rows::Gemm`] falls back to [`Rows::Alone`] for formats without a GEMM.
pub fn matmul_as(how: Rows, pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    let kernel = QuantKernel::best();
    let gemm =
        activation_dtype(w.dtype).is_some() && kernel.dot_fn(w.dtype).is_some() && kernel.gemm(w.dtype).is_some();
    let how = if how == Rows::Gemm && !gemm { Rows::Alone } else { how };
    matmul_reading(kernel, pool, x, rows, w, out, how, DecodeReads::SideBySide)
}

/// [`super::matmul`] of a block-quantized weight with a chosen kernel variant; panics if
/// the CPU does not support it.
pub fn matmul_with(kernel: QuantKernel, pool: &ThreadPool, x: &[f32], rows: usize, w: &HostTensor, out: &mut [f32]) {
    matmul_reading(kernel, pool, x, rows, w, out, Rows::ByCount, DecodeReads::SideBySide)
}

/// [`super::matmul_rows_alone`] of one `x` through several weights, each into its own
/// output (a layer's q, k and v; its gate and up), as one parallel op: every weight's
/// tasks go to the pool at once, so the threads meet once rather than once per weight,
/// and a weight too small to split runs beside the others instead of alone. Each output
/// comes out as its own call gives it.
pub fn matmul_many_rows_alone(pool: &ThreadPool, x: &[f32], rows: usize, each: &mut [(&HostTensor, &mut [f32])]) {
    let mut each: Vec<(&[f32], &HostTensor, &mut [f32])> =
        each.iter_mut().map(|(w, out)| (x, *w, &mut **out)).collect();
    matmul_many_inputs_rows_alone(pool, rows, &mut each);
}

/// [`matmul_many_rows_alone`] with an input of its own for each weight (a sparse FFN's
/// kept groups: each group's `down` columns meet that group's activations), as one
/// parallel op. Each output comes out as its own [`super::matmul_rows_alone`] call gives it.
pub fn matmul_many_inputs_rows_alone(pool: &ThreadPool, rows: usize, each: &mut [(&[f32], &HostTensor, &mut [f32])]) {
    let kernel = QuantKernel::best();
    let mut starts = vec![0];
    let mut tasks = Vec::with_capacity(each.len());
    for (x, w, out) in each.iter_mut() {
        if let Some((n, task)) = plan(kernel, pool, x, rows, w, out, Rows::Alone, DecodeReads::SideBySide) {
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

/// A quantized matmul with the way one-row calls read their weight rows chosen.
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
        super::gemm::matmul(pool, &g, w.dtype, bytes, m, k, x, rows, out);
        return None;
    }
    let threads = pool.current_num_threads();
    let par = threads > 1 && rows * m * nb >= PAR_MIN_DOTS;
    let (path, decode) = choose_path(kernel, w, rows, alone, reads);
    let acts = activations(pool, act, w, &x[..rows * k], rows, par, decode.is_some());
    let unit = if matches!(path, Path::Panels { .. }) { panels::ROWS } else { TILE };
    let chunk = super::chunk_len(m, unit, par, threads);
    let act_row = acts.len() / rows;
    let dot = decode.unwrap_or(dot);
    let pass = Pass { bytes, row_bytes, nb, m, rows, acts, act_row, dst: OutPtr::new(out, m), dot, path };
    Some((m.div_ceil(chunk), move |t: usize| pass.task(t * chunk..((t + 1) * chunk).min(m))))
}

/// How a task computes its outputs, in the order [`choose_path`] tries them.
#[derive(Clone, Copy)]
enum Path {
    /// 16-row panels through their own kernels.
    Panels { fns: panels::Kernels, side_by_side: bool },
    /// One activation row against four distant weight rows at once, block by block.
    SideBySide(simd::StreamsFn),
    /// One activation row, distant parts of the task's range in turn.
    InTurn,
    /// Several activation rows, each as it would come out alone: the several-row forms of
    /// the one-row kernel.
    Several(simd::RowsFn),
    /// Several activation rows in tiles of weight rows (the rows need not come out as
    /// they would alone).
    Tiles,
}

/// The path of a call with `rows` activation rows (each as alone where `alone`), and the
/// decode kernel that replaces the plain dot product where one runs: the one-row kernels
/// of `kernel`'s rows layout, unless the weight is panels.
fn choose_path(
    kernel: QuantKernel,
    w: &HostTensor,
    rows: usize,
    alone: bool,
    reads: DecodeReads,
) -> (Path, Option<simd::DotFn>) {
    let side_by_side = reads == DecodeReads::SideBySide;
    if w.is_panels() {
        let fns = panels::kernels(w.dtype).expect("panels exist only where their kernels run");
        return (Path::Panels { fns, side_by_side }, None);
    }
    let decode = (rows == 1 || alone).then(|| kernel.decode_fn(w.dtype)).flatten();
    // The four-row form of whichever one-row kernel runs (`streams_fn` follows
    // `decode_fn`, as the dot product does).
    let path = match kernel.streams_fn(w.dtype).filter(|_| rows == 1 && side_by_side) {
        Some(f) => Path::SideBySide(f),
        None if rows == 1 => Path::InTurn,
        // Several rows, each as one alone: the several-row form of the same kernel.
        None => match alone.then(|| kernel.rows_fn(w.dtype)).flatten() {
            Some((f, packed)) if packed == decode.is_some() => Path::Several(f),
            _ => Path::Tiles,
        },
    };
    (path, decode)
}

/// The `rows` rows of `x` quantized to `act` blocks for `w`'s kernels: packed for its
/// panels, or for the decode kernels where `decode`.
fn activations(
    pool: &ThreadPool,
    act: DType,
    w: &HostTensor,
    x: &[f32],
    rows: usize,
    par: bool,
    decode: bool,
) -> Vec<u32> {
    let k = w.shape[1];
    let nb = k / w.dtype.block_size();
    let acts = quantize_rows(pool, act, x, rows, k, par);
    if w.is_panels() {
        return panels::pack_rows(w.dtype, &acts, rows, nb);
    }
    if !decode {
        return acts;
    }
    let act_row = acts.len() / rows;
    let used = act.bytes_for(k).expect("activation rows are whole blocks");
    let mut packed = Vec::new();
    for r in 0..rows {
        let row = &acts[r * act_row..(r + 1) * act_row];
        // SAFETY: a row of whole activation blocks, viewed as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(row.as_ptr().cast::<u8>(), row.len() * 4) };
        packed.extend(simd::dec512::pack(w.dtype, &bytes[..used]).expect("decode kernels have a packing"));
    }
    packed
}

/// One quantized matmul's work once its activations are quantized and its path chosen:
/// what every task reads and writes.
struct Pass<'a> {
    /// The weight: `m` rows of `row_bytes`, `nb` blocks each (or panels of them).
    bytes: &'a [u8],
    row_bytes: usize,
    nb: usize,
    m: usize,
    /// The activations: `rows` rows, `act_row` words apart, in the kernels' format.
    rows: usize,
    acts: Vec<u32>,
    act_row: usize,
    /// `rows × m` outputs, `m` apart.
    dst: OutPtr,
    /// The one-row dot product of the path (the decode kernel where one runs).
    dot: simd::DotFn,
    path: Path,
}

impl Pass<'_> {
    /// Computes output columns `cols` of every row: one task's part.
    fn task(&self, cols: Range<usize>) {
        match self.path {
            Path::Panels { fns, side_by_side } => {
                let (bytes, nb, rows, m) = (self.bytes, self.nb, self.rows, self.m);
                // SAFETY: `bytes` holds `m` rows as panels (a panel tensor's `m` is a
                // multiple of 16, so `cols` is whole panels); `acts` holds `rows` packed
                // rows of `nb` blocks, `act_row` words apart; only this task writes the
                // columns `cols` of each of the `rows` rows of `out` (`m` apart).
                unsafe {
                    let stride = self.act_row * 4;
                    let out = self.dst.ptr();
                    panels::run(&fns, bytes, self.row_bytes, nb, cols, &self.acts, stride, rows, out, m, side_by_side)
                };
            }
            Path::SideBySide(f) => self.side_by_side(f, cols),
            Path::InTurn => self.in_turn(cols),
            Path::Several(f) => self.several(&f, cols),
            Path::Tiles => self.tiles(cols),
        }
    }

    /// Output `(r, o)`: weight row `o` against activation row `r`.
    fn dot_at(&self, r: usize, o: usize) {
        let a = self.acts[r * self.act_row..(r + 1) * self.act_row].as_ptr();
        let wrow = self.bytes[o * self.row_bytes..(o + 1) * self.row_bytes].as_ptr();
        // SAFETY: `dot` came from the kernel's `dot_fn` or `decode_fn`, which checked the
        // CPU features; `wrow` holds `nb` weight blocks and `a` the row's `nb` activation
        // blocks of the matching format, aligned (see `quantize_rows`). `r·m + o` is inside
        // `out` (checked in `plan`), and only the task owning column `o` writes it while
        // `out` stays mutably borrowed for the call.
        unsafe { self.put(r, o, (self.dot)(wrow, a.cast(), self.nb)) };
    }

    /// Writes output `(r, o)`.
    ///
    /// # Safety
    /// `(r, o)` is inside the output, and column `o` belongs to the calling task.
    unsafe fn put(&self, r: usize, o: usize, v: f32) {
        // SAFETY: the caller's contract.
        unsafe { self.dst.ptr().add(r * self.m + o).write(v) }
    }

    /// Decode reads `STREAMS` distant parts of the range side by side: rows `o + s·per`
    /// for `s < STREAMS` at once, block by block.
    fn side_by_side(&self, f: simd::StreamsFn, cols: Range<usize>) {
        let per = cols.len() / STREAMS;
        let a = self.acts.as_ptr().cast::<u8>();
        for o in cols.start..cols.start + per {
            // SAFETY: as in `dot_at`, for the weight rows `o + s·per` (inside `cols`) and
            // the one activation row; `f` is the four-row form of `dot`.
            let got = unsafe { f(self.bytes[o * self.row_bytes..].as_ptr(), per * self.row_bytes, a, self.nb) };
            for (s, v) in got.into_iter().enumerate() {
                // SAFETY: as in `dot_at`: column `o + s·per` belongs to this task.
                unsafe { self.put(0, o + s * per, v) };
            }
        }
        (cols.start + STREAMS * per..cols.end).for_each(|o| self.dot_at(0, o));
    }

    /// Decode streams the weights once: walk `STREAMS` distant parts of the range in turn,
    /// so several sequential reads are in flight at once (one stream per core reaches only
    /// about 60% of the memory bandwidth on some machines).
    fn in_turn(&self, cols: Range<usize>) {
        let per = cols.len().div_ceil(STREAMS);
        for i in 0..per {
            for o in (cols.start + i..cols.end).step_by(per) {
                self.dot_at(0, o);
            }
        }
    }

    /// Each weight row meets the activation rows 8, 4 or 2 at a time; where the format has
    /// it, two weight rows meet them at once.
    fn several(&self, f: &simd::RowsFn, cols: Range<usize>) {
        let (rows, row_bytes, nb, stride) = (self.rows, self.row_bytes, self.nb, self.act_row * 4);
        let mut o = cols.start;
        while o < cols.end {
            let wrow = self.bytes[o * row_bytes..].as_ptr();
            if let Some(pairs) = f.pairs.filter(|_| o + 1 < cols.end) {
                self.pair(&pairs, o, stride);
                o += 2;
                continue;
            }
            let mut r = 0;
            while r < rows {
                let (left, at) = (rows - r, &self.acts[r * self.act_row..]);
                // SAFETY: as in `dot_at`, for weight row `o` and the rows left.
                r += unsafe { several_at(f, self.dot, wrow, at, stride, left, nb, |i, v| self.put(r + i, o, v)) };
            }
            o += 1;
        }
    }

    /// Weight rows `o` and `o + 1` against every activation row, two rows at once and a
    /// last odd one alone.
    fn pair(&self, pairs: &simd::PairFns, o: usize, stride: usize) {
        let (rows, row_bytes, nb) = (self.rows, self.row_bytes, self.nb);
        let wrow = self.bytes[o * row_bytes..].as_ptr();
        let mut r = 0;
        while rows - r >= 2 {
            let a = self.acts[r * self.act_row..].as_ptr().cast::<u8>();
            let take = |got: &[&[f32]; 2]| {
                for (j, vals) in got.iter().enumerate() {
                    // SAFETY: as in `dot_at`; columns `o`, `o + 1` belong to this task.
                    vals.iter().enumerate().for_each(|(i, &v)| unsafe { self.put(r + i, o + j, v) });
                }
                got[0].len()
            };
            // SAFETY: as in `dot_at`, for weight rows `o`, `o + 1` (inside the task's
            // columns) and the activation rows from `r` (as many as remain).
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
            self.dot_at(r, o);
            self.dot_at(r, o + 1);
        }
    }

    /// Each x row passes over a tile of weight rows while they sit in L1/L2.
    fn tiles(&self, cols: Range<usize>) {
        for tile in cols.clone().step_by(TILE) {
            let tile = tile..(tile + TILE).min(cols.end);
            for r in 0..self.rows {
                for o in tile.clone() {
                    self.dot_at(r, o);
                }
            }
        }
    }
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
                    (0..rows).map(|r| super::float::dot(&x[r * k..(r + 1) * k], row)).collect()
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

#[cfg(test)]
mod tests {
    use super::super::{matmul, matmul_rows_alone};
    use super::*;
    use strata_quant::{panels::to_panels, quantize_matrix};
    use strata_tensor::rng::Rng;
    use strata_tensor::tensor::{AlignedBytes, ByteSource};

    /// Decode reads weight rows in turn or four side by side, as the machine reads faster;
    /// every output is the same bits either way, and the same as that weight row alone.
    #[test]
    fn decode_reads_rows_in_turn_or_side_by_side_with_the_same_bits() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut rng = Rng::new(5);
        let formats = [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::Mxfp4,
        ];
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
                        // Sane scales (and mins) where every format keeps them: bytes 0..4
                        // (MXFP4's exponent byte becomes 31: a scale of 2^-97).
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
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut rng = Rng::new(11);
        let k = 512;
        let weight = |rng: &mut Rng, dtype: DType, m: usize| {
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

    const FORMATS: [DType; 6] = [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K];

    /// A row length of about `k` values in whole blocks of `dtype`.
    fn whole(dtype: DType, k: usize) -> usize {
        k.next_multiple_of(dtype.block_size())
    }

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap()
    }

    fn weight(pool: &rayon::ThreadPool, rng: &mut Rng, dtype: DType, m: usize, k: usize) -> HostTensor {
        strata_quant::testing::random_weight(pool, rng, dtype, m, k)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Through the quantized matmul: a batch's rows each get the bits they get alone; the
    /// prompt GEMM gives a panel tensor's rows the bits it gives the stored rows; decode
    /// stays within rounding of the row-major kernels.
    #[test]
    fn panels_through_the_matmul() {
        let (pool, mut rng) = (pool(), Rng::new(3));
        let m = 96;
        for dtype in FORMATS {
            let k = whole(dtype, 576);
            let w = weight(&pool, &mut rng, dtype, m, k);
            let Some(p) = to_panels(&w) else { continue };
            let rows = 11;
            let x = rng.vec(rows * k, 1.0);
            // One row read side by side or in turn, and the matmul's pick for this
            // machine; a batch each way (two rows at a time, on one thread so that a task
            // holds four panels and more).
            let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
            let reading = |pool: &rayon::ThreadPool, n: usize, how: Rows, reads: DecodeReads| {
                let mut out = vec![0f32; n * m];
                let kernel = strata_quant::QuantKernel::best();
                matmul_reading(kernel, pool, &x[..n * k], n, &p, &mut out, how, reads);
                bits(&out)
            };
            for (pool, n, how, what) in
                [(&pool, 1, Rows::ByCount, "one row"), (&one_thread, rows, Rows::Alone, "a batch")]
            {
                assert_eq!(
                    reading(pool, n, how, DecodeReads::SideBySide),
                    reading(pool, n, how, DecodeReads::InTurn),
                    "{dtype:?}: {what} side by side"
                );
            }
            let mut batch = vec![0f32; rows * m];
            matmul_rows_alone(&pool, &x, rows, &p, &mut batch);
            for r in 0..rows {
                let mut one = vec![0f32; m];
                matmul(&pool, &x[r * k..(r + 1) * k], 1, &p, &mut one);
                assert_eq!(bits(&one), bits(&batch[r * m..(r + 1) * m]), "{dtype:?}: row {r} in a batch");
                let mut stored = vec![0f32; m];
                matmul(&pool, &x[r * k..(r + 1) * k], 1, &w, &mut stored);
                for (a, b) in one.iter().zip(&stored) {
                    assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{dtype:?}: row {r}: {a} against {b}");
                }
            }
            let (mut gp, mut gw) = (vec![0f32; rows * m], vec![0f32; rows * m]);
            matmul(&pool, &x, rows, &p, &mut gp);
            matmul(&pool, &x, rows, &w, &mut gw);
            assert_eq!(bits(&gp), bits(&gw), "{dtype:?}: the prompt GEMM");
        }
    }

    /// How fast batched decode reads panels in turn and side by side (docs/benchmarks.md):
    /// `PF=q4_0|q4_1|q8_0|q4_k|q6_k cargo test --release -p strata-backend --lib batched_panel_speed --
    /// --ignored --nocapture`. Eight FFN-sized weights (52 MB as Q4_0, beyond the L3), 1
    /// to 8 rows, each way 41 times interleaved on two threads: the medians.
    #[test]
    #[ignore]
    fn batched_panel_speed() {
        let pool = pool();
        let dtype: DType = match std::env::var("PF").as_deref() {
            Ok("q8_0") => DType::Q8_0,
            Ok("q4_k") => DType::Q4_K,
            Ok("q6_k") => DType::Q6_K,
            Ok("q4_1") => DType::Q4_1,
            _ => DType::Q4_0,
        };
        let (m, k) = (5632, 2048);
        let mut rng = Rng::new(5);
        let ws: Vec<HostTensor> = (0..8).map(|_| to_panels(&weight(&pool, &mut rng, dtype, m, k)).unwrap()).collect();
        let bytes: usize = ws.iter().map(|w| w.bytes().len()).sum();
        let reps = 41;
        for rows in [1usize, 2, 3, 4, 5, 6, 8] {
            let x = rng.vec(rows * k, 1.0);
            let mut out = vec![0f32; rows * m];
            let mut times = [vec![], vec![]];
            for i in 0..2 * reps {
                let reads = [DecodeReads::InTurn, DecodeReads::SideBySide][i % 2];
                let t = std::time::Instant::now();
                for w in &ws {
                    matmul_reading(strata_quant::QuantKernel::best(), &pool, &x, rows, w, &mut out, Rows::Alone, reads);
                }
                times[i % 2].push(t.elapsed().as_secs_f64());
            }
            let med = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let (a, b) = (med(&mut times[0]), med(&mut times[1]));
            eprintln!(
                "{dtype:?} rows {rows}: in turn {:.2} ms ({:.1} GB/s), side by side {:.2} ms ({:.1} GB/s), {:.2}x",
                a * 1e3,
                bytes as f64 / a / 1e9,
                b * 1e3,
                bytes as f64 / b / 1e9,
                a / b
            );
        }
    }
}
