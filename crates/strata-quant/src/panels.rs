//! Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K weights repacked for the CPU as panels of 16
//! rows, so that one vector lane is one weight row.
//!
//! The row-major decode tile ([`simd::dec512`](super::simd)) spends, per 4 blocks and
//! activation row, `vpermt2b` gathers, an int→float conversion, a scale multiply and an
//! FMA on 4 lanes a block, and sums 16 lanes at the end. With 16 rows interleaved, each
//! `vpdpbusd` takes 4 levels of every row of the panel against one broadcast activation
//! word, and a block's conversion, scale multiply and FMA serve all 16 rows at once:
//! about half the vector operations per multiply-add, and no horizontal sums.
//!
//! A panel holds the 16 rows' blocks block by block, each taking exactly what its 16
//! blocks take as stored (`16·B` bytes for `B`-byte blocks): `L` lines of 64 bytes (line
//! `s`, bytes `4i..4i + 4`: row `i`'s level bytes `qs[4s..4s + 4]`; a Q4 block's 16 bytes
//! make 4 lines, whose low nibbles are values `4s..` and high nibbles `16 + 4s..`; a
//! Q8_0 block's 32 make 8), then the 16 rows' f16 `d` (32 bytes) and for Q4_1 their
//! mins `m` (32 more). So a weight is one sequential stream, scales beside their levels
//! (scales kept apart at the end of each panel made two streams that restarted every
//! panel, and read memory about a fifth slower). Line `s` of a block is the 32-bit
//! gather the prompt GEMM makes from row-major rows, so the GEMM unpacks a panel with the
//! same operations and results, minus the gathers.
//!
//! A Q4_K panel block is simpler: its 144-byte blocks are whole 4-byte words, so line `t`
//! holds the 16 rows' word `t` (line 0 their `d` and `dmin`, lines 1..4 their packed
//! 6-bit scales and mins, lines 4..36 their levels): again the GEMM's gathers, as loads.
//! Its kernel sums each sub-block's scaled dot and the mins' term exactly in i32 before
//! two FMAs a block, as llama.cpp's Q4_K × Q8_K dot does per row. Q5_K's 176-byte blocks
//! are the same with the levels' high bits in lines 4..12 (`qh`). Q6_K's 210-byte blocks
//! are 52 words (`ql` 0..32, `qh` 32..48, the i8 scales 48..52), their lines placed in
//! the order the kernels read them ([`K6_LINE`]), and then `d`, kept after the lines as
//! the 16 rows' f16.
//!
//! On AVX2 machines (no AVX-512, or `STRATA_CPU_ISA=avx2`) every one of these formats is
//! panels too, with kernels that take each line in two 256-bit halves (module `avx2`)
//! and give a row the AVX-512 kernels' bits.
//!
//! `STRATA_CPU_PANELS=off` keeps every weight as stored (the row-major kernels).
//!
//! Each row's sum is `Σ_b cvt(i_b)·(d_b·da_b)` (`+ m_b·s_b` for Q4_1) added block after
//! block into one lane (FMA), whatever the number of activation rows run at once, so a
//! batch of decoding sequences gets each sequence's bits as alone.

use crate::q8_0::BlockQ8_0;
use crate::q8_1::BlockQ8_1;
use crate::q8_k::BlockQ8K;
use crate::{QK, QK_K, cast_blocks};
use strata_tensor::team;
use strata_tensor::tensor::{DType, HostTensor};

/// Weight rows per panel.
pub const ROWS: usize = strata_tensor::tensor::PANEL_ROWS;

/// Bytes of one packed activation block: its 32 levels, a first word (the levels'
/// offset `−8·Σ` or `−128·Σ` levels as i32; Q4_1's activation sum `s` as f32) and its
/// scale (f32).
pub const ACT_BLOCK: usize = 40;

/// Bytes of one packed Q8_K activation block for Q4_K panels: its scale (f32), its 256
/// levels, and its eight 32-value sums as four pairs of i16 (see [`pack_act`]).
pub const ACT_K: usize = 4 + QK_K + 16;

/// Packed activation bytes per block of `dtype` (Q6_K's pairs are eight: see
/// [`pack_act`]).
const fn act_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q4_K | DType::Q5_K => ACT_K,
        DType::Q6_K => ACT_K6,
        _ => ACT_BLOCK,
    }
}

/// Bytes of one packed Q8_K activation block for Q6_K panels: its scale, its 256 levels
/// and its sixteen 16-value sums as eight pairs of i16.
pub const ACT_K6: usize = 4 + QK_K + 32;

/// How a format's blocks sit in a panel.
#[derive(Clone, Copy)]
enum Layout {
    /// 32-value blocks of `bytes` bytes: `heads` f16 values at the block's head (1: `d`;
    /// 2: `d`, `m`) moved after `lines` 64-byte level lines.
    Block32 { bytes: usize, heads: usize, lines: usize },
    /// MXFP4's 17-byte blocks: the 16 level bytes as 4 lines (as Q4_0's), then the 16
    /// rows' one-byte exponents `e`.
    Mx,
    /// Blocks of `bytes` bytes (Q4_K, Q5_K, Q6_K): line `t` of a panel block is the 16 rows'
    /// 4-byte word `t`, in stored order, so a row's byte `x` (4-aligned) of block `b` is
    /// at `16·(b·bytes + x) + 4i` in panel row `i`; a block's last 2 bytes when `bytes`
    /// is not a multiple of 4 (Q6_K's `d`) follow the lines as 16 f16.
    Words { bytes: usize },
}

pub mod k6;
pub use k6::{K6_LINE, k6_at};

/// The line a panel block of `bb`-byte blocks keeps stored word `t` in.
const fn word_line(bb: usize, t: usize) -> usize {
    if bb == 210 { K6_LINE[t] } else { t }
}

const fn layout(dtype: DType) -> Option<Layout> {
    match dtype {
        DType::Q4_0 => Some(Layout::Block32 { bytes: 18, heads: 1, lines: 4 }),
        DType::Q4_1 => Some(Layout::Block32 { bytes: 20, heads: 2, lines: 4 }),
        DType::Q8_0 => Some(Layout::Block32 { bytes: 34, heads: 1, lines: 8 }),
        DType::Mxfp4 => Some(Layout::Mx),
        DType::Q4_K => Some(Layout::Words { bytes: 144 }),
        DType::Q5_K => Some(Layout::Words { bytes: 176 }),
        DType::Q6_K => Some(Layout::Words { bytes: 210 }),
        _ => None,
    }
}

/// Whether a weight of `dtype` and `shape` is kept as panels on this CPU: Q4_0, Q4_1,
/// Q8_0, Q4_K, Q5_K or Q6_K `[m, k]` with `m` a multiple of 16, where the AVX-512 VBMI
/// kernels run (and the instruction set is not capped below them), or where AVX2 is the
/// best the CPU runs.
pub fn eligible(dtype: DType, shape: &[usize]) -> bool {
    let &[m, k] = shape else { return false };
    enabled()
        && layout(dtype).is_some()
        && m > 0
        && m.is_multiple_of(ROWS)
        && k > 0
        && k.is_multiple_of(dtype.block_size())
        && kernels(dtype).is_some()
}

/// Whether panels are used at all: `STRATA_CPU_PANELS=off` (or `0`) keeps every weight
/// as stored (read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| strata_tensor::env::CPU_PANELS.switch() != Some(false))
}

/// Moves one row's blocks between stored order (`row`) and its places in a panel
/// (`panel`), either way: `f(row range, panel range)` for each piece of row `i` of a
/// panel of `nb` blocks.
fn each_piece(dtype: DType, nb: usize, i: usize, mut f: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>)) {
    match layout(dtype).expect("a panel format") {
        Layout::Block32 { bytes: bb, heads, lines } => {
            for b in 0..nb {
                let (at, scales) = (ROWS * bb * b, ROWS * bb * b + 64 * lines);
                for j in 0..heads {
                    let (from, to) = (b * bb + 2 * j, scales + 32 * j + 2 * i);
                    f(from..from + 2, to..to + 2);
                }
                for s in 0..lines {
                    let (from, to) = (b * bb + 2 * heads + 4 * s, at + 64 * s + 4 * i);
                    f(from..from + 4, to..to + 4);
                }
            }
        }
        Layout::Mx => {
            for b in 0..nb {
                let at = ROWS * 17 * b;
                f(b * 17..b * 17 + 1, at + 256 + i..at + 256 + i + 1);
                for s in 0..4 {
                    let (from, to) = (b * 17 + 1 + 4 * s, at + 64 * s + 4 * i);
                    f(from..from + 4, to..to + 4);
                }
            }
        }
        Layout::Words { bytes: bb } => {
            let words = bb / 4;
            for b in 0..nb {
                for t in 0..words {
                    let (x, y) = (b * bb + 4 * t, b * bb + 4 * word_line(bb, t));
                    f(x..x + 4, ROWS * y + 4 * i..ROWS * y + 4 * i + 4);
                }
                if bb % 4 == 2 {
                    let (from, to) = (b * bb + 4 * words, ROWS * (b * bb + 4 * words) + 2 * i);
                    f(from..from + 2, to..to + 2);
                }
            }
        }
    }
}

/// Repacks `src`, `m` rows of `k` values of `dtype` as stored, into panels in `dst` (the
/// same length). `m` is a multiple of 16.
pub fn repack(dtype: DType, src: &[u8], m: usize, k: usize, dst: &mut [u8]) {
    let row_bytes = dtype.bytes_for(k).expect("whole blocks");
    assert!(m.is_multiple_of(ROWS) && src.len() >= m * row_bytes && dst.len() >= m * row_bytes);
    let layout = layout(dtype).expect("a panel format");
    for (p, out) in dst[..m * row_bytes].chunks_exact_mut(ROWS * row_bytes).enumerate() {
        let rows: [&[u8]; ROWS] = std::array::from_fn(|i| &src[(p * ROWS + i) * row_bytes..][..row_bytes]);
        pack_panel(layout, &rows, out);
    }
}

/// One panel from its 16 stored rows, written line by line: the places [`each_piece`]
/// gives each row's pieces, gathered across the rows (a line's 16 words, or 16 halves).
fn pack_panel(layout: Layout, rows: &[&[u8]; ROWS], out: &mut [u8]) {
    // Each row's 4 bytes at `from`, side by side; each row's 2 bytes at `from`.
    let words = |from: usize| -> [u8; 4 * ROWS] {
        let mut v = [0u8; 4 * ROWS];
        for (d, r) in v.chunks_exact_mut(4).zip(rows) {
            d.copy_from_slice(&r[from..from + 4]);
        }
        v
    };
    let halves = |from: usize| -> [u8; 2 * ROWS] {
        let mut v = [0u8; 2 * ROWS];
        for (d, r) in v.chunks_exact_mut(2).zip(rows) {
            d.copy_from_slice(&r[from..from + 2]);
        }
        v
    };
    match layout {
        Layout::Block32 { bytes: bb, heads, lines } => {
            for (b, block) in out.chunks_exact_mut(ROWS * bb).enumerate() {
                let (lev, scales) = block.split_at_mut(64 * lines);
                for (s, line) in lev.chunks_exact_mut(64).enumerate() {
                    line.copy_from_slice(&words(b * bb + 2 * heads + 4 * s));
                }
                for (j, head) in scales.chunks_exact_mut(2 * ROWS).enumerate() {
                    head.copy_from_slice(&halves(b * bb + 2 * j));
                }
            }
        }
        Layout::Mx => {
            for (b, block) in out.chunks_exact_mut(ROWS * 17).enumerate() {
                let (lev, e) = block.split_at_mut(256);
                for (s, line) in lev.chunks_exact_mut(64).enumerate() {
                    line.copy_from_slice(&words(b * 17 + 1 + 4 * s));
                }
                for (d, r) in e.iter_mut().zip(rows) {
                    *d = r[b * 17];
                }
            }
        }
        Layout::Words { bytes: bb } => {
            for (b, block) in out.chunks_exact_mut(ROWS * bb).enumerate() {
                let (lines, tail) = block.split_at_mut(64 * (bb / 4));
                for t in 0..bb / 4 {
                    let l = word_line(bb, t);
                    lines[64 * l..64 * (l + 1)].copy_from_slice(&words(b * bb + 4 * t));
                }
                if bb % 4 == 2 {
                    tail.copy_from_slice(&halves(b * bb + 4 * (bb / 4)));
                }
            }
        }
    }
}

/// `t` repacked as the CPU's 16-row panels, where this CPU runs their kernels and the
/// dtype and shape have them; `None` otherwise. The copy is made now, on the threads of
/// the rayon pool (or team) this runs in; it keeps no file origin (the streamer reads the
/// stored tensor, and the backend repacks what it read).
pub fn to_panels(t: &HostTensor) -> Option<HostTensor> {
    if t.is_panels() || !eligible(t.dtype, &t.shape) {
        return None;
    }
    let (dtype, m, k) = (t.dtype, t.shape[0], t.shape[1]);
    Some(t.repacked(|stored, out| repack_par(dtype, stored, m, k, out)))
}

/// `t` as stored (row-major blocks), from panels; `t` itself otherwise. For a split
/// that cuts a panel.
pub fn row_major(t: &HostTensor) -> HostTensor {
    if !t.is_panels() {
        return t.clone();
    }
    let (dtype, m, k) = (t.dtype, t.shape[0], t.shape[1]);
    let row_bytes = dtype.bytes_for(k).expect("a panel row is whole blocks");
    let mut out = strata_tensor::tensor::AlignedBytes::zeroed(m * row_bytes);
    for (r, dst) in out.bytes_mut().chunks_exact_mut(row_bytes).enumerate() {
        row(dtype, t.bytes(), k, r, dst);
    }
    let len = m * row_bytes;
    HostTensor::new(std::sync::Arc::new(out), 0, len, dtype, t.shape.clone())
}

/// [`repack`] with the panels spread over threads (the team this thread leads, or the
/// rayon pool it is in): a model's resident weights are repacked when it loads, hundreds
/// of megabytes to tens of gigabytes of them.
pub fn repack_par(dtype: DType, src: &[u8], m: usize, k: usize, dst: &mut [u8]) {
    let (panel_bytes, task) = panel_tasks(dtype, k);
    let bytes = m / ROWS * panel_bytes;
    assert!(m.is_multiple_of(ROWS) && src.len() >= bytes && dst.len() >= bytes);
    team::for_each_chunk_mut_here(&mut dst[..bytes], task, |t, out| {
        repack(dtype, &src[t * task..][..out.len()], out.len() / panel_bytes * ROWS, k, out);
    });
}

/// A panel's bytes, and the bytes of a repack task: whole panels, 256 KiB or more (a
/// panel of a narrow weight is a few KiB).
fn panel_tasks(dtype: DType, k: usize) -> (usize, usize) {
    let panel_bytes = ROWS * dtype.bytes_for(k).expect("whole blocks");
    (panel_bytes, (256usize << 10).div_ceil(panel_bytes) * panel_bytes)
}

/// [`repack`] in place: `bytes`, `m` rows of `k` values of `dtype` as stored, become
/// panels, one panel's rows copied aside at a time, the panels spread over threads as in
/// [`repack_par`] (a streamed layer is repacked after every read of it, by the forward
/// pass that is about to use it: on its team).
pub fn repack_in_place(dtype: DType, bytes: &mut [u8], m: usize, k: usize) {
    let (panel_bytes, task) = panel_tasks(dtype, k);
    team::for_each_chunk_mut_here(&mut bytes[..m / ROWS * panel_bytes], task, |_, panels| {
        let mut rows = vec![0u8; panel_bytes];
        for panel in panels.chunks_exact_mut(panel_bytes) {
            rows.copy_from_slice(panel);
            repack(dtype, &rows, ROWS, k, panel);
        }
    });
}

/// Row `r` of a repacked `[m, k]` weight of `dtype`, as stored (its blocks), into `dst`.
pub fn row(dtype: DType, panels: &[u8], k: usize, r: usize, dst: &mut [u8]) {
    let nb = k / dtype.block_size();
    let panel_bytes = ROWS * dtype.bytes_for(k).expect("whole blocks");
    let panel = &panels[r / ROWS * panel_bytes..][..panel_bytes];
    each_piece(dtype, nb, r % ROWS, |from, to| dst[from].copy_from_slice(&panel[to]));
}

/// One activation row (`act`: its Q8_0 blocks, Q8_1 for Q4_1 weights, Q8_K for Q4_K)
/// packed for the `dtype` kernels into `out`: per block its levels, first word and scale
/// ([`ACT_BLOCK`] bytes); for Q4_K, [`ACT_K`] bytes a block.
pub fn pack_act(dtype: DType, act: &[u8], out: &mut [u8]) {
    if dtype == DType::Q6_K {
        let blocks = cast_blocks::<BlockQ8K>(act).expect("Q8_K activation blocks");
        for (x, dst) in blocks.iter().zip(out.chunks_exact_mut(ACT_K6)) {
            dst[..4].copy_from_slice(&x.d.to_le_bytes());
            for (d, &q) in dst[4..4 + QK_K].iter_mut().zip(&x.qs) {
                *d = q as u8;
            }
            // The 16-value sums paired as a scale word's bytes pair up: (S[4q], S[4q + 2]),
            // (S[4q + 1], S[4q + 3]) for q < 4.
            for q in 0..4 {
                for (w, (lo, hi)) in [(4 * q, 4 * q + 2), (4 * q + 1, 4 * q + 3)].into_iter().enumerate() {
                    let at = 4 + QK_K + 8 * q + 4 * w;
                    dst[at..at + 2].copy_from_slice(&x.bsums[lo].to_le_bytes());
                    dst[at + 2..at + 4].copy_from_slice(&x.bsums[hi].to_le_bytes());
                }
            }
        }
        return;
    }
    if matches!(dtype, DType::Q4_K | DType::Q5_K) {
        let blocks = cast_blocks::<BlockQ8K>(act).expect("Q8_K activation blocks");
        for (x, dst) in blocks.iter().zip(out.chunks_exact_mut(ACT_K)) {
            dst[..4].copy_from_slice(&x.d.to_le_bytes());
            for (d, &q) in dst[4..4 + QK_K].iter_mut().zip(&x.qs) {
                *d = q as u8;
            }
            // Sub-block j's sum S_j, paired as the mins are: (S0, S2), (S1, S3), (S4, S6),
            // (S5, S7).
            let sum = |j: usize| x.bsums[2 * j] + x.bsums[2 * j + 1];
            for (w, (lo, hi)) in [(0, 2), (1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
                let at = 4 + QK_K + 4 * w;
                dst[at..at + 2].copy_from_slice(&sum(lo).to_le_bytes());
                dst[at + 2..at + 4].copy_from_slice(&sum(hi).to_le_bytes());
            }
        }
        return;
    }
    let mut put = |b: usize, qs: &[i8; QK], first: [u8; 4], d: f32| {
        let dst = &mut out[b * ACT_BLOCK..(b + 1) * ACT_BLOCK];
        for (d, &q) in dst[..QK].iter_mut().zip(qs) {
            *d = q as u8;
        }
        dst[QK..QK + 4].copy_from_slice(&first);
        dst[QK + 4..QK + 8].copy_from_slice(&d.to_le_bytes());
    };
    if dtype == DType::Q4_1 {
        let blocks = cast_blocks::<BlockQ8_1>(act).expect("Q8_1 activation blocks");
        blocks.iter().enumerate().for_each(|(b, x)| put(b, &x.qs, x.s.to_f32().to_le_bytes(), x.d.to_f32()));
        return;
    }
    // The weights' levels are stored unsigned: Q8_0's plus 128, MXFP4's values plus 12.
    let offset = match dtype {
        DType::Q8_0 => 128,
        DType::Mxfp4 => 12,
        _ => 8,
    };
    let blocks = cast_blocks::<BlockQ8_0>(act).expect("Q8_0 activation blocks");
    for (b, x) in blocks.iter().enumerate() {
        let sum: i32 = x.qs.iter().map(|&q| q as i32).sum();
        put(b, &x.qs, (-offset * sum).to_le_bytes(), x.d.to_f32());
    }
}

/// `R` (1, 2, 4 or 8) packed activation rows `stride` bytes apart against one panel of
/// `nb` blocks: `out[r·os + i]` = row `r` · weight row `i`, for `i < 16`.
pub type PanelFn = unsafe fn(panel: *const u8, nb: usize, a: *const u8, stride: usize, out: *mut f32, os: usize);

/// Four panels `w_stride` bytes apart against `R` (1 or 2) packed rows `stride` bytes
/// apart, read side by side (four memory streams, as decode reads rows where memory
/// serves that faster): panel `j`'s 16 outputs for row `r` at `out + j·o_stride + r·os`,
/// each with [`PanelFn`]'s bits.
#[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
pub type SideFn = unsafe fn(
    panel: *const u8,
    w_stride: usize,
    nb: usize,
    a: *const u8,
    stride: usize,
    out: *mut f32,
    o_stride: usize,
    os: usize,
);

/// A format's panel kernels: for 8, 4, 2 and 1 activation rows at once, and four panels
/// side by side for 2 rows and 1, which batches of at most `side_rows` rows take where
/// decode reads side by side.
#[derive(Clone, Copy)]
pub struct Kernels {
    pub rows: [PanelFn; 4],
    pub side_by_side: [SideFn; 2],
    pub side_rows: usize,
}

/// The panel kernels of `dtype`, where this CPU runs them.
pub fn kernels(dtype: DType) -> Option<Kernels> {
    #[cfg(target_arch = "x86_64")]
    {
        use imp::*;
        // Machines with AVX2 and no AVX-512 (or with it capped off) get the 32-value
        // formats' kernels in 256-bit halves.
        if super::QuantKernel::best() == super::QuantKernel::Avx2 {
            return match dtype {
                DType::Q4_0 => Some(avx2::kernels::<Q4_0>()),
                DType::Q4_1 => Some(avx2::kernels::<Q4_1>()),
                DType::Q8_0 => Some(avx2::kernels::<Q8_0>()),
                DType::Mxfp4 => Some(avx2::kernels::<MXFP4>()),
                DType::Q4_K => Some(avx2::kernels::<Q4_K>()),
                DType::Q5_K => Some(avx2::kernels::<Q5_K>()),
                DType::Q6_K => Some(avx2::kernels::<Q6_K>()),
                _ => None,
            };
        }
        // Where the VBMI decode kernels run (the instruction set not capped below them).
        super::QuantKernel::best().decode_fn(DType::Q4_0)?;
        macro_rules! of {
            ($f:expr) => {
                Kernels {
                    rows: [rows::<{ $f }, 8>, rows::<{ $f }, 4>, rows::<{ $f }, 2>, rows::<{ $f }, 1>],
                    side_by_side: [side_by_side::<{ $f }, 2>, side_by_side::<{ $f }, 1>],
                    side_rows: usize::MAX,
                }
            };
        }
        match dtype {
            DType::Q4_0 => Some(of!(Q4_0)),
            DType::Q4_1 => Some(of!(Q4_1)),
            DType::Q8_0 => Some(of!(Q8_0)),
            DType::Mxfp4 => Some(of!(MXFP4)),
            DType::Q4_K => Some(of!(Q4_K)),
            DType::Q5_K => Some(of!(Q5_K)),
            DType::Q6_K => Some(of!(Q6_K)),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        None
    }
}

/// Every activation row of `acts` (`rows` rows of `nb` quantized activation blocks,
/// Q8_0, for Q4_1 Q8_1, for Q4_K Q8_K, each row starting on a 32-bit word) packed for the panel
/// kernels of `dtype`.
pub fn pack_rows(dtype: DType, acts: &[u32], rows: usize, nb: usize) -> Vec<u32> {
    let row_words = acts.len() / rows.max(1);
    let used = nb
        * match dtype {
            DType::Q4_1 => size_of::<BlockQ8_1>(),
            DType::Q4_K | DType::Q5_K | DType::Q6_K => size_of::<BlockQ8K>(),
            _ => size_of::<BlockQ8_0>(),
        };
    let row_out = nb * act_bytes(dtype) / 4;
    let mut packed = vec![0u32; rows * row_out];
    for (r, dst) in packed.chunks_exact_mut(row_out).enumerate() {
        let row = &acts[r * row_words..(r + 1) * row_words];
        // SAFETY: a row of whole activation blocks, and its packed form, as bytes.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(row.as_ptr().cast::<u8>(), row.len() * 4),
                std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), dst.len() * 4),
            )
        };
        pack_act(dtype, &src[..used], dst);
    }
    packed
}

/// The panels in output columns `cols` (whole panels) of a `[m, ·]` panel weight
/// (`bytes`, rows of `row_bytes`, `nb` blocks) against `rows` packed activation rows
/// (`acts`, `stride` bytes apart): `out[r·m + o]` for `o` in `cols`. With
/// `side_by_side` (and at most the kernels' `side_rows` rows) the rows, two at a time,
/// read four distant parts of the range at once (as decode reads rows where memory serves
/// several streams faster); the panels left, or every panel otherwise, go through the 8,
/// 4, 2 or 1-row kernels, walking `STREAMS` distant parts in turn. Every path gives each
/// output the same bits.
///
/// # Safety
/// `kernels` came from [`kernels`] for the weight's format; `bytes` holds the panels of
/// `cols`; `acts` holds `rows` packed rows of `nb` blocks; `out[r·m + o]` is writable for
/// `r < rows`, `o` in `cols`, and no one else writes it meanwhile.
#[allow(clippy::too_many_arguments, reason = "the matmul's part spelled out")]
pub unsafe fn run(
    kernels: &Kernels,
    bytes: &[u8],
    row_bytes: usize,
    nb: usize,
    cols: std::ops::Range<usize>,
    acts: &[u32],
    stride: usize,
    rows: usize,
    out: *mut f32,
    m: usize,
    side_by_side: bool,
) {
    use super::STREAMS;
    let panel_bytes = ROWS * row_bytes;
    let (first, count) = (cols.start / ROWS, cols.len() / ROWS);
    let panel = |p: usize| bytes[p * panel_bytes..].as_ptr();
    let a = acts.as_ptr().cast::<u8>();
    let mut done = 0;
    if side_by_side && rows <= kernels.side_rows {
        let per = count / STREAMS;
        for p in first..first + per {
            let mut r = 0;
            while r < rows {
                let (n, f) = match rows - r {
                    2.. => (2, kernels.side_by_side[0]),
                    _ => (1, kernels.side_by_side[1]),
                };
                // SAFETY: panels `p + s·per` (s < 4) lie in `cols`, inside `bytes`, and so
                // do their outputs for rows `r..r + n` (the caller's contract).
                unsafe {
                    f(
                        panel(p),
                        per * panel_bytes,
                        nb,
                        a.add(r * stride),
                        stride,
                        out.add(r * m + p * ROWS),
                        per * ROWS,
                        m,
                    )
                };
                r += n;
            }
        }
        done = STREAMS * per;
    }
    let per = (count - done).div_ceil(STREAMS);
    for p in (0..per).flat_map(|i| (first + done + i..first + count).step_by(per)) {
        let mut r = 0;
        while r < rows {
            let (n, f) = match rows - r {
                8.. => (8, kernels.rows[0]),
                4.. => (4, kernels.rows[1]),
                2.. => (2, kernels.rows[2]),
                _ => (1, kernels.rows[3]),
            };
            // SAFETY: panel `p` and activation rows `r..r + n` as the caller vouches;
            // outputs `(r + j)·m + 16p + i` (j < n, i < 16) are the caller's.
            unsafe { f(panel(p), nb, a.add(r * stride), stride, out.add(r * m + p * ROWS), m) };
            r += n;
        }
    }
}

/// A kernel module's [`PanelFn`] and [`SideFn`] entry points (`rows`, `side_by_side`)
/// for the target features named, over its `tile`, `tile_k` and `tile_k6`.
macro_rules! panel_entry_points {
    ($features:literal) => {
        /// `R` (1, 2, 4 or 8) packed rows against one panel of format `F`. The K-quant
        /// tiles take at most four rows: eight run as two fours.
        ///
        /// # Safety
        /// `panel` holds a whole panel of `nb` blocks of format `F`; `a + r·stride` holds
        /// `nb` packed activation blocks for `r < R`; `out[r·os + i]` is writable for
        /// `r < R`, `i < 16`; a CPU with the features enabled here.
        #[target_feature(enable = $features)]
        pub unsafe fn rows<const F: u8, const R: usize>(
            panel: *const u8,
            nb: usize,
            a: *const u8,
            stride: usize,
            out: *mut f32,
            os: usize,
        ) {
            // SAFETY: forwarded contract, for one panel and rows `g..g + 4` (or all `R`).
            unsafe {
                if R == 8 && F >= Q4_K {
                    for g in [0, 4] {
                        tile_of::<F, 1, 4>(panel, 0, nb, a.add(g * stride), stride, out.add(g * os), 0, os);
                    }
                } else {
                    tile_of::<F, 1, R>(panel, 0, nb, a, stride, out, 0, os);
                }
            }
        }

        /// Four panels `w_stride` bytes apart against `R` (1 or 2) packed rows, read
        /// side by side block by block (four memory streams); panel `j`'s outputs for
        /// row `r` at `out + j·o_stride + r·os`.
        ///
        /// # Safety
        /// As for [`rows`], for each of the four panels and their outputs.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
        pub unsafe fn side_by_side<const F: u8, const R: usize>(
            panel: *const u8,
            w_stride: usize,
            nb: usize,
            a: *const u8,
            stride: usize,
            out: *mut f32,
            o_stride: usize,
            os: usize,
        ) {
            // SAFETY: forwarded contract.
            unsafe { tile_of::<F, 4, R>(panel, w_stride, nb, a, stride, out, o_stride, os) }
        }

        /// `W` panels × `R` rows of format `F`: `tile`, `tile_k` or `tile_k6` (these two
        /// for `R` ≤ 4).
        ///
        /// # Safety
        /// As for those.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
        #[inline]
        unsafe fn tile_of<const F: u8, const W: usize, const R: usize>(
            panel: *const u8,
            w_stride: usize,
            nb: usize,
            a: *const u8,
            stride: usize,
            out: *mut f32,
            o_stride: usize,
            os: usize,
        ) {
            // SAFETY: forwarded contract.
            unsafe {
                match F {
                    Q4_K => tile_k::<false, W, R>(panel, w_stride, nb, a, stride, out, o_stride, os),
                    Q5_K => tile_k::<true, W, R>(panel, w_stride, nb, a, stride, out, o_stride, os),
                    Q6_K => tile_k6::<W, R>(panel, w_stride, nb, a, stride, out, o_stride, os),
                    _ => tile::<F, W, R>(panel, w_stride, nb, a, stride, out, o_stride, os),
                }
            }
        }
    };
}
use panel_entry_points;

/// The prompt GEMM's unpacker (see [`UnpackFn`](super::gemm::UnpackFn)) for a panel of
/// `dtype`: the lines and scales its row-major unpacker makes, read without gathers.
#[cfg(target_arch = "x86_64")]
pub fn gemm_unpack(dtype: DType) -> Option<super::gemm::UnpackFn> {
    if super::QuantKernel::best() == super::QuantKernel::Avx2 {
        return match dtype {
            DType::Q4_0 => Some(avx2::unpack::<{ imp::Q4_0 }>),
            DType::Q4_1 => Some(avx2::unpack::<{ imp::Q4_1 }>),
            DType::Q8_0 => Some(avx2::unpack::<{ imp::Q8_0 }>),
            DType::Q4_K => Some(super::simd::gemm256::unpack_q4k::<false, true>),
            DType::Q5_K => Some(super::simd::gemm256::unpack_q4k::<true, true>),
            DType::Q6_K => Some(super::simd::gemm256::unpack_q6k::<true>),
            _ => None,
        };
    }
    match dtype {
        DType::Q4_0 => Some(imp::unpack::<{ imp::Q4_0 }>),
        DType::Q4_1 => Some(imp::unpack::<{ imp::Q4_1 }>),
        DType::Q8_0 => Some(imp::unpack::<{ imp::Q8_0 }>),
        DType::Q4_K => Some(super::simd::gemm512::unpack_q4k::<false, true>),
        DType::Q5_K => Some(super::simd::gemm512::unpack_q4k::<true, true>),
        DType::Q6_K => Some(super::simd::gemm512::unpack_q6k::<true>),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, reason = "the row index drives several arrays and pointers")]
#[path = "panels/avx512.rs"]
mod imp;

/// The panel kernels for AVX2 (with FMA and F16C), the K-quants' in `tile_k` and
/// `tile_k6`: each 64-byte line as two 256-bit halves of 8 rows. For the 32-value
/// formats `vpdpbusd` becomes `vpmaddubsw` into 16-bit pairs:
/// a Q4 block's eight level words are summed in 16 bits (8 · 2 · 15 · 127 < 2¹⁵) and
/// widened once with `vpmaddwd`; Q8_0's signed levels take `vpsignb` (|w| against `a`
/// with `w`'s sign: activations never hold −128) and are widened each word. The block's
/// integer sum is the AVX-512 tile's exactly, and its conversion, scale product and FMAs
/// are the same, so a row gets the same bits as from the AVX-512 panels, and from every
/// path here alike.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop, reason = "the row index drives several arrays and pointers")]
mod avx2;

#[cfg(test)]
mod tests;
