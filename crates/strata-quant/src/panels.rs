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
pub const ROWS: usize = 16;

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
    /// Blocks of `bytes` bytes (Q4_K, Q5_K, Q6_K): line `t` of a panel block is the 16 rows'
    /// 4-byte word `t`, in stored order, so a row's byte `x` (4-aligned) of block `b` is
    /// at `16·(b·bytes + x) + 4i` in panel row `i`; a block's last 2 bytes when `bytes`
    /// is not a multiple of 4 (Q6_K's `d`) follow the lines as 16 f16.
    Words { bytes: usize },
}

/// Where a Q6_K panel block keeps each of its 52 lines (stored word `t` of the 16 rows:
/// `ql` 0..32, `qh` 32..48, the scales 48..52): in the order the kernels read them, so
/// that a block is one forward stream. Per half `n` of the block: scale words `48 + 2n`
/// and `49 + 2n`, then for `s` in 0..8 the lines `16n + s`, `16n + 8 + s` and
/// `32 + 8n + s`. (In stored order the kernels' reads jumped between four regions of
/// each 3,360-byte block, and an AMD EPYC read Q6_K panels from memory at 0.55–0.65 of
/// its rows' rate.) `d` stays after the 52 lines.
pub const K6_LINE: [usize; 52] = {
    let mut place = [0usize; 52];
    let mut p = 0;
    let mut n = 0;
    while n < 2 {
        place[48 + 2 * n] = p;
        place[49 + 2 * n] = p + 1;
        p += 2;
        let mut s = 0;
        while s < 8 {
            place[16 * n + s] = p;
            place[16 * n + 8 + s] = p + 1;
            place[32 + 8 * n + s] = p + 2;
            p += 3;
            s += 1;
        }
        n += 1;
    }
    place
};

/// Byte `x` of a stored Q6_K block at its place in the block's line order ([`K6_LINE`]),
/// per row: bytes of word `t` move with it; `d` (208, 209) stays.
pub const fn k6_at(x: usize) -> usize {
    if x >= 208 { x } else { 4 * K6_LINE[x / 4] + x % 4 }
}

/// The line a panel block of `bb`-byte blocks keeps stored word `t` in.
const fn word_line(bb: usize, t: usize) -> usize {
    if bb == 210 { K6_LINE[t] } else { t }
}

const fn layout(dtype: DType) -> Option<Layout> {
    match dtype {
        DType::Q4_0 => Some(Layout::Block32 { bytes: 18, heads: 1, lines: 4 }),
        DType::Q4_1 => Some(Layout::Block32 { bytes: 20, heads: 2, lines: 4 }),
        DType::Q8_0 => Some(Layout::Block32 { bytes: 34, heads: 1, lines: 8 }),
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
    let offset = if dtype == DType::Q8_0 { 128 } else { 8 };
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
mod imp {
    use std::arch::x86_64::*;

    use super::{ACT_BLOCK, K6_LINE};

    /// The formats of [`rows`] and [`unpack`].
    pub const Q4_0: u8 = 0;
    pub const Q4_1: u8 = 1;
    pub const Q8_0: u8 = 2;

    /// Bytes ahead of the current block the tiles prefetch, or `None` for no software
    /// prefetch, decided once per process: `STRATA_PANEL_PREFETCH=on|off`, else off on
    /// AMD CPUs and 2048 bytes ahead elsewhere. On an AMD EPYC VM (2 threads, side by
    /// side, 2026-11-28) decode without the prefetches was faster at every format: the
    /// 1.1B Q4_0 46.3 → 48.5 tok/s, Q8_0 29.0 → 29.6, Q4_K_M 40.0 → 43.7, SmolLM2 Q4_1
    /// 250.5 → 291.0 (docs/benchmarks.md); on the Intel Xeon VMs, where the panels were
    /// measured, the prefetch distance changed little, and they keep it.
    pub fn prefetch_ahead() -> Option<usize> {
        static AHEAD: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        *AHEAD.get_or_init(|| match strata_tensor::env::PANEL_PREFETCH.switch() {
            Some(false) => None,
            Some(true) => Some(2048),
            None if amd() => None,
            None => Some(2048),
        })
    }

    /// Prefetches the 64-byte `lines` of the block at `wp`, `ahead` bytes further on (none
    /// when `ahead` is `None`, see [`prefetch_ahead`]). Prefetches never fault.
    #[target_feature(enable = "sse")]
    #[inline]
    fn prefetch_lines(wp: *const u8, ahead: Option<usize>, lines: std::ops::Range<usize>) {
        if let Some(pf) = ahead {
            for l in lines {
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(pf + 64 * l).cast());
            }
        }
    }

    /// Whether the CPU says it is AMD's (`cpuid` leaf 0 vendor "AuthenticAMD").
    fn amd() -> bool {
        let id = __cpuid(0);
        [id.ebx, id.edx, id.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163]
    }

    /// The 4 bytes at `p` in every 32-bit lane (a helper, not a closure: closures do not
    /// share their function's target features).
    ///
    /// # Safety
    /// 4 readable bytes at `p`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn word(p: *const u8) -> __m512i {
        // SAFETY: the caller's 4 bytes.
        unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }

    /// A block's 8 level registers (unsigned: Q4 nibbles; Q8_0 levels plus 128), in the
    /// order of the activation words they meet (values 0..4, 4..8, ...), from its lines
    /// at `wp`.
    ///
    /// # Safety
    /// The block's lines readable at `wp`.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn levels<const F: u8>(wp: *const u8) -> [__m512i; 8] {
        let mut u = [_mm512_setzero_si512(); 8];
        // SAFETY: the caller's lines.
        unsafe {
            if F == Q8_0 {
                for s in 0..8 {
                    u[s] = _mm512_xor_si512(_mm512_loadu_si512(wp.add(64 * s).cast()), _mm512_set1_epi8(-128));
                }
                return u;
            }
            let nib = _mm512_set1_epi8(0x0F);
            for s in 0..4 {
                let v = _mm512_loadu_si512(wp.add(64 * s).cast());
                u[s] = _mm512_and_si512(v, nib);
                u[s + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            }
            u
        }
    }

    super::panel_entry_points!("avx512f,avx512bw,avx512vl,avx512vnni,f16c");

    /// `W` panels (`w_stride` bytes apart) × `R` packed rows: each (panel, row) pair takes
    /// exactly the operations it takes alone, so every path gives a row the same bits.
    ///
    /// # Safety
    /// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
    #[inline]
    unsafe fn tile<const F: u8, const W: usize, const R: usize>(
        panel: *const u8,
        w_stride: usize,
        nb: usize,
        a: *const u8,
        stride: usize,
        out: *mut f32,
        o_stride: usize,
        os: usize,
    ) {
        let lines = if F == Q8_0 { 8 } else { 4 };
        let min = F == Q4_1;
        let block = 64 * lines + if min { 64 } else { 32 };
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        let ahead = prefetch_ahead();
        // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
        // prefetches never fault; stores go to the caller's outputs.
        unsafe {
            for b in 0..nb {
                for j in 0..W {
                    let wp = panel.add(j * w_stride + block * b);
                    prefetch_lines(wp, ahead, 0..lines);
                    let u = levels::<F>(wp);
                    let sp = wp.add(64 * lines);
                    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(sp.cast()));
                    let mw = if min { _mm512_cvtph_ps(_mm256_loadu_si256(sp.add(32).cast())) } else { dw };
                    for r in 0..R {
                        let ap = a.add(r * stride + ACT_BLOCK * b);
                        let mut i = if min { _mm512_setzero_si512() } else { word(ap.add(32)) };
                        for s in 0..8 {
                            i = _mm512_dpbusd_epi32(i, u[s], word(ap.add(4 * s)));
                        }
                        let sc = _mm512_mul_ps(dw, _mm512_set1_ps(ap.add(36).cast::<f32>().read_unaligned()));
                        acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sc, acc[j][r]);
                        if min {
                            acc[j][r] = _mm512_fmadd_ps(mw, _mm512_castsi512_ps(word(ap.add(32))), acc[j][r]);
                        }
                    }
                }
            }
            for j in 0..W {
                for r in 0..R {
                    _mm512_storeu_ps(out.add(j * o_stride + r * os), acc[j][r]);
                }
            }
        }
    }

    /// Line `t` (64 bytes) at `p`.
    ///
    /// # Safety
    /// 64 readable bytes at `p + 64·t`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn line(p: *const u8, t: usize) -> __m512i {
        // SAFETY: the caller's bytes.
        unsafe { _mm512_loadu_si512(p.add(64 * t).cast()) }
    }

    /// Bit `j` of each byte of `h` as bit 4 (a Q5_K level's high bit; a helper: closures
    /// lose target features): one shift of the whole lane and a mask, since no other
    /// bit of the lane lands on a byte's bit 4. `bit4` holds 0x10 in every byte.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn high_bit(h: __m512i, j: usize, bit4: __m512i) -> __m512i {
        let moved = match j {
            ..4 => _mm512_sllv_epi32(h, _mm512_set1_epi32(4 - j as i32)),
            _ => _mm512_srlv_epi32(h, _mm512_set1_epi32(j as i32 - 4)),
        };
        _mm512_and_si512(moved, bit4)
    }

    /// The K-quant formats of [`rows`] and [`side_by_side`] (after the 32-value ones).
    pub const Q4_K: u8 = 3;
    pub const Q6_K: u8 = 4;
    pub const Q5_K: u8 = 5;

    /// `W` Q4_K panels (`Q5`: Q5_K) × `R` (≤ 4) packed rows. Per block, panel and row:
    /// each sub-block's 8 `vpdpbusd` dot (levels 0..15, or Q5_K's 0..31, against the
    /// row's levels) times its 6-bit scale, summed exactly in i32 (`Σ sc_j·dot_j`), and
    /// the mins against the sub-block sums likewise (`Σ m_j·S_j`, in `vpdpwssd` pairs); then
    /// `acc += d·da·Σ − dmin·da·Σ'` as two roundings. The integer sums do not depend on
    /// the order of anything, so every (panel, row) pair gets the same bits whatever
    /// else runs beside it.
    ///
    /// Side by side, each block is read a quarter (two sub-blocks, 8 lines) of each
    /// panel in turn: a whole 2304-byte block of one stream, then of the next, read
    /// memory a fifth slower than rows do, where quarters read it faster.
    ///
    /// # Safety
    /// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
    #[inline]
    unsafe fn tile_k<const Q5: bool, const W: usize, const R: usize>(
        panel: *const u8,
        w_stride: usize,
        nb: usize,
        a: *const u8,
        stride: usize,
        out: *mut f32,
        o_stride: usize,
        os: usize,
    ) {
        const AB: usize = super::ACT_K;
        // Q5_K: the levels' high bits in lines 4..12 (`qh`), the low nibbles from line 12.
        let (block, qs) = if Q5 { (16 * 176, 12) } else { (16 * 144, 4) };
        let (nib, bit4) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
        let (k1, k2, k3) =
            (_mm512_set1_epi32(0x3f3f_3f3f), _mm512_set1_epi32(0x0f0f_0f0f), _mm512_set1_epi32(0x0303_0303));
        let (byte, pair) = (_mm512_set1_epi32(0xFF), _mm512_set1_epi32(0x00FF_00FF));
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        let ahead = prefetch_ahead();
        // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
        // prefetches never fault; stores go to the caller's outputs.
        unsafe {
            for b in 0..nb {
                let mut sumi = [[_mm512_setzero_si512(); R]; W];
                for n in 0..4 {
                    for j in 0..W {
                        let wp = panel.add(j * w_stride + block * b);
                        let per = if Q5 { 11 } else { 9 };
                        prefetch_lines(wp, ahead, per * n..per * (n + 1));
                        // Lines 1..4: each row's 12 scale bytes, unpacked as ggml's
                        // `get_scale_min_k4` does (scales 0..4 in the bytes of `u0 & k1`,
                        // 4..8 in the bytes made from `u2` and `u0`'s top bits).
                        let u0 = line(wp, 1);
                        let scales = if n < 2 {
                            _mm512_and_si512(u0, k1)
                        } else {
                            _mm512_or_si512(
                                _mm512_and_si512(line(wp, 3), k2),
                                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3)),
                            )
                        };
                        // Sub-blocks 2n (low nibbles of lines 4 + 8n..) and 2n + 1 (high).
                        let (mut lo, mut hi) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
                        for s in 0..8 {
                            let v = line(wp, qs + 8 * n + s);
                            let (mut vl, mut vh) =
                                (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
                            if Q5 {
                                // Bit j of `qh` byte l is the high bit of value 32j + l.
                                let h = line(wp, 4 + s);
                                vl = _mm512_or_si512(vl, high_bit(h, 2 * n, bit4));
                                vh = _mm512_or_si512(vh, high_bit(h, 2 * n + 1, bit4));
                            }
                            for r in 0..R {
                                let ap = a.add(r * stride + AB * b + 4 + 64 * n + 4 * s);
                                lo[r] = _mm512_dpbusd_epi32(lo[r], vl, word(ap));
                                hi[r] = _mm512_dpbusd_epi32(hi[r], vh, word(ap.add(32)));
                            }
                        }
                        let sh = 16 * (n % 2) as i32;
                        let s_lo = _mm512_and_si512(_mm512_srlv_epi32(scales, _mm512_set1_epi32(sh)), byte);
                        let s_hi = _mm512_and_si512(_mm512_srlv_epi32(scales, _mm512_set1_epi32(sh + 8)), byte);
                        for r in 0..R {
                            let t = _mm512_add_epi32(_mm512_mullo_epi32(lo[r], s_lo), _mm512_mullo_epi32(hi[r], s_hi));
                            sumi[j][r] = _mm512_add_epi32(sumi[j][r], t);
                        }
                    }
                }
                for j in 0..W {
                    let wp = panel.add(j * w_stride + block * b);
                    // Line 0: each row's (d, dmin). The mins (lines 2 and 3, with line 1's
                    // top bits) as i16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7), as the
                    // packed sums are.
                    let dm = line(wp, 0);
                    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
                    let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm)));
                    let (u1, u2) = (line(wp, 2), line(wp, 3));
                    let m_lo = _mm512_and_si512(u1, k1);
                    let m_hi = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)),
                    );
                    let mins = [
                        _mm512_and_si512(m_lo, pair),
                        _mm512_and_si512(_mm512_srli_epi32::<8>(m_lo), pair),
                        _mm512_and_si512(m_hi, pair),
                        _mm512_and_si512(_mm512_srli_epi32::<8>(m_hi), pair),
                    ];
                    for r in 0..R {
                        let ap = a.add(r * stride + AB * b);
                        let mut summ = _mm512_setzero_si512();
                        for (w, m) in mins.into_iter().enumerate() {
                            summ = _mm512_dpwssd_epi32(summ, m, word(ap.add(4 + super::QK_K + 4 * w)));
                        }
                        let da = _mm512_set1_ps(ap.cast::<f32>().read_unaligned());
                        acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j][r]), _mm512_mul_ps(d, da), acc[j][r]);
                        acc[j][r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dmin, da), acc[j][r]);
                    }
                }
            }
            for j in 0..W {
                for r in 0..R {
                    _mm512_storeu_ps(out.add(j * o_stride + r * os), acc[j][r]);
                }
            }
        }
    }

    /// Bytes of a Q6_K panel block: 16 stored blocks of 210 bytes, as 52 lines and the
    /// rows' 16 `d`.
    const BLOCK_K6: usize = 16 * 210;

    /// `vpshufb` indices that copy byte `b` of each 32-bit lane into all four of its
    /// bytes (then `>> 8` per i16 makes the i16 pair `(sc, sc)`, sign-extended).
    pub static BYTE_IDX: [[u8; 64]; 4] = {
        let mut t = [[0u8; 64]; 4];
        let mut b = 0;
        while b < 4 {
            let mut i = 0;
            while i < 64 {
                t[b][i] = ((i % 16) / 4 * 4 + b) as u8;
                i += 1;
            }
            b += 1;
        }
        t
    };

    /// The byte of each 32-bit lane of `w` that `i` (a row of [`BYTE_IDX`]) picks, as an
    /// i16 pair `(sc, sc)` sign-extended (a helper: closures lose target features).
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn byte_pair(w: __m512i, i: __m512i) -> __m512i {
        _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(w, i))
    }

    /// `W` Q6_K panels × `R` (≤ 4) packed rows. Per block, panel and row: each 4-value
    /// word's levels (0..63) against the row's levels in `vpmaddubsw` pairs, times the
    /// 16-value sub-block's i8 scale in `vpdpwssd` (`Σ sc_g·Σ q·y`, exact in i32), less
    /// `32·Σ sc_g·S_g` against the sub-blocks' sums (the levels' −32), then one FMA with
    /// `d·da`, as llama.cpp's Q6_K × Q8_K dot does per row. Integer sums, so each (panel,
    /// row) pair gets the same bits in any company. Side by side, a quarter block (four
    /// sub-blocks' 12 lines) of each panel in turn, as [`tile_k`] reads.
    ///
    /// # Safety
    /// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
    #[inline]
    unsafe fn tile_k6<const W: usize, const R: usize>(
        panel: *const u8,
        w_stride: usize,
        nb: usize,
        a: *const u8,
        stride: usize,
        out: *mut f32,
        o_stride: usize,
        os: usize,
    ) {
        const AB: usize = super::ACT_K6;
        let (nib, high) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let mut acc = [[_mm512_setzero_ps(); R]; W];
        let ahead = prefetch_ahead();
        // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
        // prefetches never fault; stores go to the caller's outputs.
        unsafe {
            let idx = BYTE_IDX.map(|t| _mm512_loadu_si512(t.as_ptr().cast()));
            for b in 0..nb {
                let mut sumi = [[_mm512_setzero_si512(); R]; W];
                // Quarter (n, h): values 128n + 32t + 4s.. for t < 4 and s in 4h..4h + 4,
                // that is sub-blocks 8n + 2t + h.
                for n in 0..2 {
                    for h in 0..2 {
                        for j in 0..W {
                            let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                            let c = 2 * n + h;
                            prefetch_lines(wp, ahead, 13 * c..13 * c + 13);
                            // Sub-block 8n + 2t + h's scale is byte 2(t % 2) + h of word
                            // 48 + 2n + t / 2: as i16 pairs (sc, sc).
                            let (wa, wb) = (line(wp, K6_LINE[48 + 2 * n]), line(wp, K6_LINE[49 + 2 * n]));
                            let sc = [
                                byte_pair(wa, idx[h]),
                                byte_pair(wa, idx[2 + h]),
                                byte_pair(wb, idx[h]),
                                byte_pair(wb, idx[2 + h]),
                            ];
                            for s in 4 * h..4 * h + 4 {
                                let (ql0, ql1) = (line(wp, K6_LINE[16 * n + s]), line(wp, K6_LINE[16 * n + 8 + s]));
                                let qh = line(wp, K6_LINE[32 + 8 * n + s]);
                                let v = [
                                    _mm512_or_si512(
                                        _mm512_and_si512(ql0, nib),
                                        _mm512_and_si512(_mm512_slli_epi16::<4>(qh), high),
                                    ),
                                    _mm512_or_si512(
                                        _mm512_and_si512(ql1, nib),
                                        _mm512_and_si512(_mm512_slli_epi16::<2>(qh), high),
                                    ),
                                    _mm512_or_si512(
                                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql0), nib),
                                        _mm512_and_si512(qh, high),
                                    ),
                                    _mm512_or_si512(
                                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql1), nib),
                                        _mm512_and_si512(_mm512_srli_epi16::<2>(qh), high),
                                    ),
                                ];
                                for r in 0..R {
                                    let ap = a.add(r * stride + AB * b + 4 + 128 * n + 4 * s);
                                    for t in 0..4 {
                                        let p = _mm512_maddubs_epi16(v[t], word(ap.add(32 * t)));
                                        sumi[j][r] = _mm512_dpwssd_epi32(sumi[j][r], p, sc[t]);
                                    }
                                }
                            }
                        }
                    }
                }
                for j in 0..W {
                    let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                    let d = _mm512_cvtph_ps(_mm256_loadu_si256(wp.add(64 * 52).cast()));
                    for r in 0..R {
                        let ap = a.add(r * stride + AB * b);
                        // Σ sc_g·S_g: scale word q's bytes as i16 pairs (sc[4q], sc[4q + 2])
                        // and (sc[4q + 1], sc[4q + 3]), against the packed sums.
                        let mut summ = _mm512_setzero_si512();
                        for q in 0..4 {
                            let w = line(wp, K6_LINE[48 + q]);
                            let (even, odd) =
                                (_mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(w)), _mm512_srai_epi16::<8>(w));
                            summ = _mm512_dpwssd_epi32(summ, even, word(ap.add(4 + super::QK_K + 8 * q)));
                            summ = _mm512_dpwssd_epi32(summ, odd, word(ap.add(8 + super::QK_K + 8 * q)));
                        }
                        let total = _mm512_sub_epi32(sumi[j][r], _mm512_slli_epi32::<5>(summ));
                        let da = _mm512_set1_ps(ap.cast::<f32>().read_unaligned());
                        acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, da), acc[j][r]);
                    }
                }
            }
            for j in 0..W {
                for r in 0..R {
                    _mm512_storeu_ps(out.add(j * o_stride + r * os), acc[j][r]);
                }
            }
        }
    }

    /// See [`gemm_unpack`](super::gemm_unpack): `w` is a panel of format `F` (`lanes` is 16).
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::UnpackFn), with `w` a whole panel.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn unpack<const F: u8>(
        w: *const u8,
        _row_bytes: usize,
        _lanes: usize,
        nb: usize,
        levels: *mut u8,
        dw: *mut f32,
        mw: *mut f32,
    ) {
        let lines = if F == Q8_0 { 8 } else { 4 };
        let min = F == Q4_1;
        // SAFETY: reads inside the panel, writes group `b` of the caller's buffers.
        let block = 64 * lines + if min { 64 } else { 32 };
        unsafe {
            for b in 0..nb {
                let sp = w.add(block * b + 64 * lines);
                _mm512_store_ps(dw.add(16 * b), _mm512_cvtph_ps(_mm256_loadu_si256(sp.cast())));
                if min {
                    let m = _mm512_cvtph_ps(_mm256_loadu_si256(sp.add(32).cast()));
                    _mm512_store_ps(mw.add(16 * b), _mm512_sub_ps(_mm512_setzero_ps(), m));
                }
                for (t, v) in super::imp::levels::<F>(w.add(block * b)).into_iter().enumerate() {
                    _mm512_store_si512(levels.add(64 * (8 * b + t)).cast(), v);
                }
            }
        }
    }
}

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
mod avx2 {
    use std::arch::x86_64::*;

    use super::imp::{BYTE_IDX, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0};
    use super::{ACT_BLOCK, K6_LINE, Kernels};

    /// Bytes ahead of the current block to prefetch.
    const PREFETCH: usize = 2048;

    /// The kernels of format `F`. Batches read side by side up to 7 rows (the 32-value
    /// formats) or 3 (the K-quants), in turn beyond: with 16 registers, the 8-row tile in
    /// turn beat pairs side by side at 8 rows, and the K-quants' pairs lost from 4 (AMD
    /// EPYC VM capped to AVX2, docs/benchmarks.md).
    pub fn kernels<const F: u8>() -> Kernels {
        Kernels {
            rows: [rows::<F, 8>, rows::<F, 4>, rows::<F, 2>, rows::<F, 1>],
            side_by_side: [side_by_side::<F, 2>, side_by_side::<F, 1>],
            side_rows: if F >= Q4_K { 3 } else { 7 },
        }
    }

    /// The 4 bytes at `p` in every 32-bit lane.
    ///
    /// # Safety
    /// 4 readable bytes at `p`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn word(p: *const u8) -> __m256i {
        // SAFETY: the caller's 4 bytes.
        unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }

    /// Half `h` (rows `8h..8h + 8`) of a block's 8 level registers, in the order of the
    /// activation words they meet: Q4 nibbles (unsigned), Q8_0 levels (signed).
    ///
    /// # Safety
    /// The block's lines readable at `wp`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn levels<const F: u8>(wp: *const u8, h: usize) -> [__m256i; 8] {
        let mut u = [_mm256_setzero_si256(); 8];
        // SAFETY: the caller's lines.
        unsafe {
            if F == Q8_0 {
                for s in 0..8 {
                    u[s] = _mm256_loadu_si256(wp.add(64 * s + 32 * h).cast());
                }
                return u;
            }
            let nib = _mm256_set1_epi8(0x0F);
            for s in 0..4 {
                let v = _mm256_loadu_si256(wp.add(64 * s + 32 * h).cast());
                u[s] = _mm256_and_si256(v, nib);
                u[s + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
            }
            u
        }
    }

    /// A block's integer sum `Σ w·a` for 8 rows (Q4_0: with the activation's `−8·Σa`;
    /// Q4_1: without its min).
    ///
    /// # Safety
    /// AVX2; a packed activation block at `ap`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn block_sum<const F: u8>(u: &[__m256i; 8], ap: *const u8) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        // SAFETY: the caller's activation block.
        unsafe {
            if F == Q8_0 {
                let mut i = _mm256_setzero_si256();
                for s in 0..8 {
                    let p =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(u[s], u[s]), _mm256_sign_epi8(word(ap.add(4 * s)), u[s]));
                    i = _mm256_add_epi32(i, _mm256_madd_epi16(p, ones));
                }
                return i;
            }
            let mut p = _mm256_setzero_si256();
            for s in 0..8 {
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[s], word(ap.add(4 * s))));
            }
            let i = _mm256_madd_epi16(p, ones);
            if F == Q4_1 { i } else { _mm256_add_epi32(i, word(ap.add(32))) }
        }
    }

    super::panel_entry_points!("avx2,fma,f16c");

    /// Half `h` (rows `8h..8h + 8`) of line `t` of the block at `p`.
    ///
    /// # Safety
    /// 64 readable bytes at `p + 64·t`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn half(p: *const u8, t: usize, h: usize) -> __m256i {
        // SAFETY: the caller's bytes.
        unsafe { _mm256_loadu_si256(p.add(64 * t + 32 * h).cast()) }
    }

    /// Each 32-bit lane's low byte as the i16 pair `(v, v)` (a `vpmaddwd` factor).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn pair(x: __m256i) -> __m256i {
        _mm256_or_si256(x, _mm256_slli_epi32::<16>(x))
    }

    /// Bit `j` of each byte of `h` as bit 4 (a Q5_K level's high bit), as `imp`'s: one
    /// shift and a mask. `bit4` holds 0x10 in every byte.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn high_bit(h: __m256i, j: usize, bit4: __m256i) -> __m256i {
        let moved = match j {
            ..4 => _mm256_sllv_epi32(h, _mm256_set1_epi32(4 - j as i32)),
            _ => _mm256_srlv_epi32(h, _mm256_set1_epi32(j as i32 - 4)),
        };
        _mm256_and_si256(moved, bit4)
    }

    /// A Q4_K line 0 half (8 rows' `d | dmin << 16`) as the rows' `d` and `dmin`.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn d_dmin(dm: __m256i) -> (__m256, __m256) {
        // Per 128-bit lane: the four `d` halves, then the four `dmin`; then the lanes'
        // `d` quarters together and their `dmin` quarters.
        let idx = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
        );
        let t = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(dm, idx));
        (_mm256_cvtph_ps(_mm256_castsi256_si128(t)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(t)))
    }

    /// `W` Q4_K panels (`Q5`: Q5_K) × `R` (≤ 4) packed rows, as `imp::tile_k`, a block
    /// in two halves of 8 rows: each sub-block's level words meet the row's in
    /// `vpmaddubsw` pairs summed in i16 (8 words for 4-bit levels, 2 · 8 · 15 · 128 <
    /// 2¹⁵; 4 for Q5_K's 5-bit ones), then `vpmaddwd` against the 6-bit scale as an i16
    /// pair widens and scales them at once. The integer sums are `imp::tile_k`'s exactly,
    /// and its conversions and FMAs follow, so a row gets the AVX-512 panels' bits.
    ///
    /// # Safety
    /// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
    #[inline]
    unsafe fn tile_k<const Q5: bool, const W: usize, const R: usize>(
        panel: *const u8,
        w_stride: usize,
        nb: usize,
        a: *const u8,
        stride: usize,
        out: *mut f32,
        o_stride: usize,
        os: usize,
    ) {
        const AB: usize = super::ACT_K;
        let (block, qs, fold) = if Q5 { (16 * 176, 12, 4) } else { (16 * 144, 4, 8) };
        let (nib, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
        let (k1, k2, k3) =
            (_mm256_set1_epi32(0x3f3f_3f3f), _mm256_set1_epi32(0x0f0f_0f0f), _mm256_set1_epi32(0x0303_0303));
        let (byte, pairs) = (_mm256_set1_epi32(0xFF), _mm256_set1_epi32(0x00FF_00FF));
        let zero = _mm256_setzero_si256();
        let mut acc = [[[_mm256_setzero_ps(); 2]; R]; W];
        // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
        // prefetches never fault; stores go to the caller's outputs.
        unsafe {
            for b in 0..nb {
                for h in 0..2 {
                    let mut sumi = [[zero; R]; W];
                    for n in 0..4 {
                        for j in 0..W {
                            let wp = panel.add(j * w_stride + block * b);
                            if h == 0 {
                                let per = if Q5 { 11 } else { 9 };
                                for l in per * n..per * (n + 1) {
                                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * l).cast());
                                }
                            }
                            // Sub-blocks 2n and 2n + 1's scales, as in `imp::tile_k`.
                            let u0 = half(wp, 1, h);
                            let scales = if n < 2 {
                                _mm256_and_si256(u0, k1)
                            } else {
                                _mm256_or_si256(
                                    _mm256_and_si256(half(wp, 3, h), k2),
                                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u0), k3)),
                                )
                            };
                            let pick = _mm256_srl_epi32(scales, _mm_cvtsi32_si128(16 * (n % 2) as i32));
                            let s_lo = pair(_mm256_and_si256(pick, byte));
                            let s_hi = pair(_mm256_and_si256(_mm256_srli_epi32::<8>(pick), byte));
                            let (mut lo, mut hi) = ([zero; R], [zero; R]);
                            for s in 0..8 {
                                let v = half(wp, qs + 8 * n + s, h);
                                let (mut vl, mut vh) =
                                    (_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
                                if Q5 {
                                    let hb = half(wp, 4 + s, h);
                                    vl = _mm256_or_si256(vl, high_bit(hb, 2 * n, bit4));
                                    vh = _mm256_or_si256(vh, high_bit(hb, 2 * n + 1, bit4));
                                }
                                for r in 0..R {
                                    let ap = a.add(r * stride + AB * b + 4 + 64 * n + 4 * s);
                                    lo[r] = _mm256_add_epi16(lo[r], _mm256_maddubs_epi16(vl, word(ap)));
                                    hi[r] = _mm256_add_epi16(hi[r], _mm256_maddubs_epi16(vh, word(ap.add(32))));
                                }
                                if (s + 1) % fold == 0 {
                                    for r in 0..R {
                                        let t = _mm256_add_epi32(
                                            _mm256_madd_epi16(lo[r], s_lo),
                                            _mm256_madd_epi16(hi[r], s_hi),
                                        );
                                        sumi[j][r] = _mm256_add_epi32(sumi[j][r], t);
                                        (lo[r], hi[r]) = (zero, zero);
                                    }
                                }
                            }
                        }
                    }
                    for j in 0..W {
                        let wp = panel.add(j * w_stride + block * b);
                        let (d, dmin) = d_dmin(half(wp, 0, h));
                        let (u1, u2) = (half(wp, 2, h), half(wp, 3, h));
                        let m_lo = _mm256_and_si256(u1, k1);
                        let m_hi = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi32::<4>(u2), k2),
                            _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u1), k3)),
                        );
                        let mins = [
                            _mm256_and_si256(m_lo, pairs),
                            _mm256_and_si256(_mm256_srli_epi32::<8>(m_lo), pairs),
                            _mm256_and_si256(m_hi, pairs),
                            _mm256_and_si256(_mm256_srli_epi32::<8>(m_hi), pairs),
                        ];
                        for r in 0..R {
                            let ap = a.add(r * stride + AB * b);
                            let mut summ = zero;
                            for (w, m) in mins.into_iter().enumerate() {
                                let t = _mm256_madd_epi16(m, word(ap.add(4 + super::QK_K + 4 * w)));
                                summ = _mm256_add_epi32(summ, t);
                            }
                            let da = _mm256_set1_ps(ap.cast::<f32>().read_unaligned());
                            let acc = &mut acc[j][r][h];
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j][r]), _mm256_mul_ps(d, da), *acc);
                            *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmin, da), *acc);
                        }
                    }
                }
            }
            store(acc, out, o_stride, os);
        }
    }

    /// The byte of each 32-bit lane of `w` that `i` (a row of `BYTE_IDX`) picks, as an
    /// i16 pair `(sc, sc)` sign-extended.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn byte_pair(w: __m256i, i: __m256i) -> __m256i {
        _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(w, i))
    }

    /// `W` Q6_K panels × `R` (≤ 4) packed rows, as `imp::tile_k6`, a block in two halves
    /// of 8 rows (`vpdpwssd` as `vpmaddwd` and an add: the same exact i32 sums), so a row
    /// gets the AVX-512 panels' bits.
    ///
    /// # Safety
    /// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
    #[inline]
    unsafe fn tile_k6<const W: usize, const R: usize>(
        panel: *const u8,
        w_stride: usize,
        nb: usize,
        a: *const u8,
        stride: usize,
        out: *mut f32,
        o_stride: usize,
        os: usize,
    ) {
        const AB: usize = super::ACT_K6;
        const BLOCK_K6: usize = 16 * 210;
        let (nib, high) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let zero = _mm256_setzero_si256();
        let mut acc = [[[_mm256_setzero_ps(); 2]; R]; W];
        // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
        // prefetches never fault; stores go to the caller's outputs.
        unsafe {
            let idx = BYTE_IDX.map(|t| _mm256_loadu_si256(t.as_ptr().cast()));
            for b in 0..nb {
                for h in 0..2 {
                    let mut sumi = [[zero; R]; W];
                    for n in 0..2 {
                        for hh in 0..2 {
                            for j in 0..W {
                                let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                                if h == 0 {
                                    let c = 2 * n + hh;
                                    for l in 13 * c..13 * c + 13 {
                                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * l).cast());
                                    }
                                }
                                let (wa, wb) = (half(wp, K6_LINE[48 + 2 * n], h), half(wp, K6_LINE[49 + 2 * n], h));
                                let sc = [
                                    byte_pair(wa, idx[hh]),
                                    byte_pair(wa, idx[2 + hh]),
                                    byte_pair(wb, idx[hh]),
                                    byte_pair(wb, idx[2 + hh]),
                                ];
                                for s in 4 * hh..4 * hh + 4 {
                                    let (ql0, ql1) =
                                        (half(wp, K6_LINE[16 * n + s], h), half(wp, K6_LINE[16 * n + 8 + s], h));
                                    let qh = half(wp, K6_LINE[32 + 8 * n + s], h);
                                    let v = [
                                        _mm256_or_si256(
                                            _mm256_and_si256(ql0, nib),
                                            _mm256_and_si256(_mm256_slli_epi16::<4>(qh), high),
                                        ),
                                        _mm256_or_si256(
                                            _mm256_and_si256(ql1, nib),
                                            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), high),
                                        ),
                                        _mm256_or_si256(
                                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), nib),
                                            _mm256_and_si256(qh, high),
                                        ),
                                        _mm256_or_si256(
                                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), nib),
                                            _mm256_and_si256(_mm256_srli_epi16::<2>(qh), high),
                                        ),
                                    ];
                                    for r in 0..R {
                                        let ap = a.add(r * stride + AB * b + 4 + 128 * n + 4 * s);
                                        for t in 0..4 {
                                            let p = _mm256_maddubs_epi16(v[t], word(ap.add(32 * t)));
                                            sumi[j][r] = _mm256_add_epi32(sumi[j][r], _mm256_madd_epi16(p, sc[t]));
                                        }
                                    }
                                }
                            }
                        }
                    }
                    for j in 0..W {
                        let wp = panel.add(j * w_stride + BLOCK_K6 * b);
                        let d = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(64 * 52 + 16 * h).cast()));
                        for r in 0..R {
                            let ap = a.add(r * stride + AB * b);
                            let mut summ = zero;
                            for q in 0..4 {
                                let w = half(wp, K6_LINE[48 + q], h);
                                let (even, odd) =
                                    (_mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w)), _mm256_srai_epi16::<8>(w));
                                let e = _mm256_madd_epi16(even, word(ap.add(4 + super::QK_K + 8 * q)));
                                let o = _mm256_madd_epi16(odd, word(ap.add(8 + super::QK_K + 8 * q)));
                                summ = _mm256_add_epi32(summ, _mm256_add_epi32(e, o));
                            }
                            let total = _mm256_sub_epi32(sumi[j][r], _mm256_slli_epi32::<5>(summ));
                            let da = _mm256_set1_ps(ap.cast::<f32>().read_unaligned());
                            let acc = &mut acc[j][r][h];
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, da), *acc);
                        }
                    }
                }
            }
            store(acc, out, o_stride, os);
        }
    }

    /// Each (panel `j`, row `r`) pair's two halves to `out + j·o_stride + r·os`.
    ///
    /// # Safety
    /// Those 16 floats writable for each pair.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn store<const W: usize, const R: usize>(
        acc: [[[__m256; 2]; R]; W],
        out: *mut f32,
        o_stride: usize,
        os: usize,
    ) {
        // SAFETY: the caller's outputs.
        unsafe {
            for j in 0..W {
                for r in 0..R {
                    for h in 0..2 {
                        _mm256_storeu_ps(out.add(j * o_stride + r * os + 8 * h), acc[j][r][h]);
                    }
                }
            }
        }
    }

    /// `W` panels × `R` packed rows, as `imp::tile`, in two halves of 8 rows.
    ///
    /// # Safety
    /// As for [`rows`], for each panel `j` and its outputs `out + j·o_stride + r·os`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments, reason = "the tile spelled out")]
    #[inline]
    unsafe fn tile<const F: u8, const W: usize, const R: usize>(
        panel: *const u8,
        w_stride: usize,
        nb: usize,
        a: *const u8,
        stride: usize,
        out: *mut f32,
        o_stride: usize,
        os: usize,
    ) {
        let lines = if F == Q8_0 { 8 } else { 4 };
        let min = F == Q4_1;
        let block = 64 * lines + if min { 64 } else { 32 };
        let mut acc = [[[_mm256_setzero_ps(); 2]; R]; W];
        // SAFETY: loads stay inside the panels' `nb` blocks and the activation rows;
        // prefetches never fault; stores go to the caller's outputs.
        unsafe {
            for b in 0..nb {
                for j in 0..W {
                    let wp = panel.add(j * w_stride + block * b);
                    for line in 0..lines {
                        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH + 64 * line).cast());
                    }
                    let sp = wp.add(64 * lines);
                    for h in 0..2 {
                        let u = levels::<F>(wp, h);
                        let dw = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h).cast()));
                        let mw = if min { _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h).cast())) } else { dw };
                        for r in 0..R {
                            let ap = a.add(r * stride + ACT_BLOCK * b);
                            let i = block_sum::<F>(&u, ap);
                            let sc = _mm256_mul_ps(dw, _mm256_set1_ps(ap.add(36).cast::<f32>().read_unaligned()));
                            let acc = &mut acc[j][r][h];
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, *acc);
                            if min {
                                *acc = _mm256_fmadd_ps(mw, _mm256_castsi256_ps(word(ap.add(32))), *acc);
                            }
                        }
                    }
                }
            }
            store(acc, out, o_stride, os);
        }
    }

    /// The AVX2 prompt GEMM's unpacker for a panel of format `F` (`lanes` is 16): the
    /// lines, scales and negated mins `gemm256`'s row unpacker makes (Q8_0's levels
    /// signed), read without gathers.
    ///
    /// # Safety
    /// As for [`UnpackFn`](crate::gemm::UnpackFn), with `w` a whole panel.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn unpack<const F: u8>(
        w: *const u8,
        _row_bytes: usize,
        _lanes: usize,
        nb: usize,
        levels: *mut u8,
        dw: *mut f32,
        mw: *mut f32,
    ) {
        let lines = if F == Q8_0 { 8 } else { 4 };
        let min = F == Q4_1;
        let block = 64 * lines + if min { 64 } else { 32 };
        // SAFETY: reads inside the panel, writes group `b` of the caller's buffers.
        unsafe {
            for b in 0..nb {
                let sp = w.add(block * b + 64 * lines);
                for h in 0..2 {
                    _mm256_store_ps(dw.add(16 * b + 8 * h), _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h).cast())));
                    if min {
                        let m = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h).cast()));
                        _mm256_store_ps(mw.add(16 * b + 8 * h), _mm256_sub_ps(_mm256_setzero_ps(), m));
                    }
                    for (t, v) in self::levels::<F>(w.add(block * b), h).into_iter().enumerate() {
                        _mm256_store_si256(levels.add(64 * (8 * b + t) + 32 * h).cast(), v);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::testutil::Rng;
    use crate::{ReadF32, blocks_as_bytes, quantize_matrix, zeroed_blocks};
    use strata_tensor::tensor::{AlignedBytes, ByteSource, HostTensor};

    const FORMATS: [DType; 6] = [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K];

    /// A row length of about `k` values in whole blocks of `dtype`.
    fn whole(dtype: DType, k: usize) -> usize {
        k.next_multiple_of(dtype.block_size())
    }

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap()
    }

    /// A random `[m, k]` weight of `dtype` (as stored).
    fn weight(pool: &rayon::ThreadPool, rng: &mut Rng, dtype: DType, m: usize, k: usize) -> HostTensor {
        let b = match dtype {
            // No Q5_K quantizer here: random levels and packed scales, small positive
            // `d` and `dmin`.
            DType::Q5_K => {
                let mut b = rng.bytes(m * k / QK_K * 176);
                for blk in b.chunks_exact_mut(176) {
                    blk[..2].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.002).to_le_bytes());
                    blk[2..4].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.002).to_le_bytes());
                }
                b
            }
            // No Q4_1 quantizer here: random levels, small random scales and mins.
            DType::Q4_1 => {
                let mut b = rng.bytes(m * k / QK * 20);
                for blk in b.chunks_exact_mut(20) {
                    blk[..2].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.02).to_le_bytes());
                    blk[2..4].copy_from_slice(&half::f16::from_f32(rng.uniform() * 0.1 - 0.05).to_le_bytes());
                }
                b
            }
            _ => quantize_matrix(pool, dtype, &rng.vec(m * k, 1.0), m, k).unwrap().bytes().to_vec(),
        };
        HostTensor::new(Arc::new(AlignedBytes::from_slice(&b)), 0, b.len(), dtype, vec![m, k])
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    #[test]
    fn rows_come_back_as_stored() {
        let (pool, mut rng) = (pool(), Rng::new(1));
        let m = 48;
        for dtype in FORMATS {
            let k = whole(dtype, 96);
            let w = weight(&pool, &mut rng, dtype, m, k);
            let mut panels = vec![0u8; w.byte_len()];
            repack(dtype, w.bytes(), m, k, &mut panels);
            assert_ne!(panels, w.bytes(), "{dtype:?}: the layout moved");
            let mut in_place = w.bytes().to_vec();
            repack_in_place(dtype, &mut in_place, m, k);
            assert_eq!(in_place, panels, "{dtype:?}: repacked in place");
            let row_bytes = w.byte_len() / m;
            let mut row_out = vec![0u8; row_bytes];
            for r in 0..m {
                row(dtype, &panels, k, r, &mut row_out);
                assert_eq!(row_out, &w.bytes()[r * row_bytes..(r + 1) * row_bytes], "{dtype:?}: row {r}");
            }
            // A panel tensor reads its values as the stored one does, across rows too.
            let Some(p) = to_panels(&w) else { continue };
            assert!(p.is_panels() && p.rows(0, 16).is_none());
            let (mut a, mut b) = (vec![0f32; 3 * k], vec![0f32; 3 * k]);
            let at = 5 * k + dtype.block_size();
            w.read_f32(at, &mut a);
            p.read_f32(at, &mut b);
            assert_eq!(bits(&a), bits(&b), "{dtype:?}");
        }
    }

    /// Spread over threads, in tasks of many panels, the repack moves every byte as the
    /// serial one does, in place too (the bytes need not be valid blocks: a repack only
    /// moves them).
    #[test]
    fn repacking_on_threads_gives_the_same_bytes() {
        let pool = pool();
        for dtype in FORMATS {
            let k = whole(dtype, 512);
            let row_bytes = dtype.bytes_for(k).unwrap();
            // More panels than one task takes, and a last task shorter than the others.
            let m = ROWS * ((3 << 20) / (ROWS * row_bytes) + 7);
            let src: Vec<u8> = (0..m * row_bytes).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
            let (mut serial, mut threaded) = (vec![0u8; src.len()], vec![0u8; src.len()]);
            repack(dtype, &src, m, k, &mut serial);
            pool.install(|| repack_par(dtype, &src, m, k, &mut threaded));
            assert!(serial == threaded, "{dtype:?}: {m} rows");
            // In place, on the team of a forward pass (as the streamer repacks a layer).
            let mut in_place = src.clone();
            team::lead(&pool, || repack_in_place(dtype, &mut in_place, m, k));
            assert!(serial == in_place, "{dtype:?}: {m} rows in place");
        }
    }

    /// How fast a layer-sized weight (2048 × 5632) is repacked in place on one thread, in
    /// GB/s, against a plain copy of it (docs/benchmarks.md):
    /// `cargo test --release -p strata-quant --lib repack_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn repack_speed() {
        for dtype in FORMATS {
            let (m, k) = (2048, whole(dtype, 5632));
            let mut bytes: Vec<u8> = (0..m * dtype.bytes_for(k).unwrap()).map(|i| ((i * 31) >> 7) as u8).collect();
            let mut copy = vec![0u8; bytes.len()];
            let best = |f: &mut dyn FnMut()| {
                (0..7)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        f();
                        t.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let n = bytes.len() as f64;
            let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
            let repack = best(&mut || one.install(|| repack_in_place(dtype, &mut bytes, m, k)));
            let plain = best(&mut || copy.copy_from_slice(&bytes));
            eprintln!("{dtype:?}: repack in place {:.1} GB/s, a copy {:.1} GB/s", n / repack / 1e9, n / plain / 1e9);
        }
    }

    /// Q6_K's line order is a permutation, and the AVX-512 tile's reads of a block (per
    /// half: its two scale lines, then each 4-value step's two `ql` lines and its `qh`
    /// line) run forward through it.
    #[test]
    fn q6_k_lines_sit_in_reading_order() {
        let mut seen = [false; 52];
        K6_LINE.iter().for_each(|&l| seen[l] = true);
        assert!(seen.iter().all(|&s| s), "{K6_LINE:?}");
        let mut reads = Vec::new();
        for n in 0..2 {
            for h in 0..2 {
                if h == 0 {
                    reads.extend([48 + 2 * n, 49 + 2 * n]);
                }
                for s in 4 * h..4 * h + 4 {
                    reads.extend([16 * n + s, 16 * n + 8 + s, 32 + 8 * n + s]);
                }
            }
        }
        let lines: Vec<usize> = reads.iter().map(|&t| K6_LINE[t]).collect();
        assert_eq!(lines, (0..52).collect::<Vec<_>>());
        assert_eq!((k6_at(192), k6_at(193), k6_at(208), k6_at(209)), (0, 1, 208, 209));
    }

    #[test]
    fn only_panel_formats_of_whole_panels_repack() {
        assert!(!eligible(DType::Q4_0, &[40, 64]));
        assert!(!eligible(DType::Q5_0, &[32, 256]));
        assert!(!eligible(DType::Q4_K, &[32, 128]));
        assert!(!eligible(DType::Q8_0, &[64]));
        // Every format where the VBMI kernels run, or where AVX2 is the best there is.
        let best = crate::QuantKernel::best();
        for dtype in FORMATS {
            let want = best.decode_fn(DType::Q4_0).is_some() || best == crate::QuantKernel::Avx2;
            assert_eq!(eligible(dtype, &[32, whole(dtype, 64)]), want, "{dtype:?}");
        }
    }

    /// Each output against the exact (f64) sum of llama.cpp's products per block
    /// (`d·da·Σ (q − 8)·y` for Q4_0, `d·da·Σ q·y` for Q8_0, `d·da·Σ q·y + m·s` for Q4_1),
    /// within f32 rounding of the terms' magnitudes; four panels side by side give 2
    /// rows and 1 the same bits.
    #[test]
    fn the_kernels_match_the_exact_sum() {
        let (pool, mut rng) = (pool(), Rng::new(2));
        let (m, k) = (64, 320);
        let nb = k / QK;
        for dtype in &FORMATS[..3] {
            let dtype = *dtype;
            let Some(all) = kernels(dtype) else { continue };
            let fns = all.rows;
            let Some(Layout::Block32 { bytes: bb, heads, .. }) = layout(dtype) else { unreachable!() };
            let w = weight(&pool, &mut rng, dtype, m, k);
            let mut panels = vec![0u8; w.byte_len()];
            repack(dtype, w.bytes(), m, k, &mut panels);
            for (n, f) in [8, 4, 2, 1].into_iter().zip(fns) {
                // Each activation row's blocks, and (scale, levels, s) per block.
                let mut acts = vec![0u8; n * nb * ACT_BLOCK];
                let mut xs: Vec<Vec<(f64, [i8; QK], f64)>> = Vec::new();
                for dst in acts.chunks_exact_mut(nb * ACT_BLOCK) {
                    let x = rng.vec(k, 1.0);
                    if dtype == DType::Q4_1 {
                        let mut b = zeroed_blocks::<BlockQ8_1>(nb);
                        crate::q8_1::quantize(&x, &mut b);
                        pack_act(dtype, blocks_as_bytes(&b), dst);
                        xs.push(b.iter().map(|b| (b.d.to_f32() as f64, b.qs, b.s.to_f32() as f64)).collect());
                    } else {
                        let mut b = zeroed_blocks::<BlockQ8_0>(nb);
                        crate::q8_0::quantize(&x, &mut b);
                        pack_act(dtype, blocks_as_bytes(&b), dst);
                        xs.push(b.iter().map(|b| (b.d.to_f32() as f64, b.qs, 0.0)).collect());
                    }
                }
                let mut out = vec![0f32; n * m];
                for p in 0..m / ROWS {
                    // SAFETY: a whole panel, `n` packed rows, `n` rows of `m` outputs.
                    unsafe {
                        f(
                            panels[p * ROWS * nb * bb..].as_ptr(),
                            nb,
                            acts.as_ptr(),
                            nb * ACT_BLOCK,
                            out.as_mut_ptr().add(p * ROWS),
                            m,
                        )
                    };
                }
                if let Some(i) = [2, 1].iter().position(|&s| s == n) {
                    let side = apply_side(all.side_by_side[i], &panels, nb, &acts, nb * ACT_BLOCK, n, m);
                    assert_eq!(bits(&side), bits(&out), "{dtype:?}: {n} rows side by side");
                }
                let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32() as f64;
                for (r, x) in xs.iter().enumerate() {
                    for o in 0..m {
                        let (mut exact, mut mag) = (0f64, 0f64);
                        for (b, &(da, y, s)) in x.iter().enumerate() {
                            let blk = &w.bytes()[(o * nb + b) * bb..][..bb];
                            let q = &blk[2 * heads..];
                            let level = |t: usize| match dtype {
                                DType::Q8_0 => q[t] as i8 as i64,
                                DType::Q4_0 => ((q[t % 16] >> (4 * (t / 16))) & 15) as i64 - 8,
                                _ => ((q[t % 16] >> (4 * (t / 16))) & 15) as i64,
                            };
                            let i: i64 = (0..QK).map(|t| level(t) * y[t] as i64).sum();
                            let mut term = f16(blk) * da * i as f64;
                            if heads == 2 {
                                term += f16(&blk[2..]) * s;
                            }
                            (exact, mag) = (exact + term, mag + term.abs());
                        }
                        let got = out[r * m + o] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-6 * mag,
                            "{dtype:?}, {n} rows: row {r}, output {o}: {got} against {exact}"
                        );
                    }
                }
            }
        }
    }

    /// Q4_K and Q5_K: each output against the exact (f64) sum of llama.cpp's products
    /// per block, `d·da·Σ_j sc_j·Σ q·y − dmin·da·Σ_j m_j·Σ y` (Q5_K's q with its high bit
    /// from `qh`), within f32 rounding of the terms' magnitudes, for 8, 4, 2 and 1 rows and
    /// four panels side by side for 2 rows and 1.
    #[test]
    fn the_q4_k_and_q5_k_kernels_match_the_exact_sum() {
        use crate::q4_k::get_scale_min_k4;
        use crate::q8_k::{BlockQ8K, quantize};
        for (dtype, saturated) in [DType::Q4_K, DType::Q5_K].into_iter().flat_map(|d| [(d, false), (d, true)]) {
            let Some(fns) = kernels(dtype) else { return };
            let (pool, mut rng) = (pool(), Rng::new(4));
            let (m, k) = (64, 768);
            let nb = k / QK_K;
            let (bb, qs) = if dtype == DType::Q5_K { (176, 48) } else { (144, 16) };
            let w = weight(&pool, &mut rng, dtype, m, k);
            let w = if saturated { saturate(&w, bb, 4..bb) } else { w };
            let mut panels = vec![0u8; w.byte_len()];
            repack(dtype, w.bytes(), m, k, &mut panels);
            let exact = |o: usize, x: &[BlockQ8K]| {
                let (mut sum, mut mag) = (0f64, 0f64);
                for (b, y) in x.iter().enumerate() {
                    let blk = &w.bytes()[(o * nb + b) * bb..][..bb];
                    let f16 = |at: usize| half::f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32() as f64;
                    let (d, dmin, da) = (f16(0), f16(2), y.d as f64);
                    let scales: &[u8; 12] = blk[4..16].try_into().unwrap();
                    for j in 0..8 {
                        let (sc, mn) = get_scale_min_k4(j, scales);
                        let (mut qy, mut sy) = (0i64, 0i64);
                        for t in 0..32 {
                            let v = 32 * j + t;
                            let mut q = (blk[qs + 32 * (v / 64) + v % 32] >> (4 * (v % 64 / 32))) & 15;
                            if dtype == DType::Q5_K {
                                q |= ((blk[16 + v % 32] >> (v / 32)) & 1) << 4;
                            }
                            (qy, sy) = (qy + q as i64 * y.qs[v] as i64, sy + y.qs[v] as i64);
                        }
                        let (a, b) = (d * da * (sc as i64 * qy) as f64, dmin * da * (mn as i64 * sy) as f64);
                        (sum, mag) = (sum + a - b, mag + a.abs() + b.abs());
                    }
                }
                (sum, mag)
            };
            let check = |what: &str, out: &[f32], xs: &[Vec<BlockQ8K>]| {
                for (r, x) in xs.iter().enumerate() {
                    for o in 0..m {
                        let ((want, mag), got) = (exact(o, x), out[r * m + o] as f64);
                        assert!((got - want).abs() <= 1e-6 * mag, "{what}: row {r}, output {o}: {got} against {want}");
                    }
                }
            };
            let pack = |rng: &mut Rng, n: usize| {
                let (mut acts, mut xs) = (vec![0u8; n * nb * ACT_K], Vec::new());
                for dst in acts.chunks_exact_mut(nb * ACT_K) {
                    let mut b = zeroed_blocks::<BlockQ8K>(nb);
                    quantize(&if saturated { vec![1.0; k] } else { rng.vec(k, 1.0) }, &mut b);
                    pack_act(dtype, blocks_as_bytes(&b), dst);
                    xs.push(b);
                }
                (acts, xs)
            };
            for (n, f) in [8, 4, 2, 1].into_iter().zip(fns.rows) {
                let (acts, xs) = pack(&mut rng, n);
                let out = apply(f, &panels, nb, &acts, nb * ACT_K, n, m);
                check(&format!("{dtype:?} (saturated: {saturated}), {n} rows"), &out, &xs);
            }
            for (n, f) in [2, 1].into_iter().zip(fns.side_by_side) {
                let (acts, xs) = pack(&mut rng, n);
                let out = apply_side(f, &panels, nb, &acts, nb * ACT_K, n, m);
                check(&format!("{dtype:?} (saturated: {saturated}) side by side, {n} rows"), &out, &xs);
            }
        }
    }

    /// Q6_K: each output against the exact (f64) sum of llama.cpp's products per block,
    /// `d·da·Σ_g sc_g·Σ (q − 32)·y`, within f32 rounding of the terms' magnitudes, for 8,
    /// 4, 2 and 1 rows and four panels side by side for 2 rows and 1.
    #[test]
    fn the_q6_k_kernels_match_the_exact_sum() {
        use crate::q6_k::{BlockQ6K, unpack};
        use crate::q8_k::{BlockQ8K, quantize};
        let Some(fns) = kernels(DType::Q6_K) else { return };
        for saturated in [false, true] {
            let (pool, mut rng) = (pool(), Rng::new(5));
            let (m, k) = (64, 768);
            let nb = k / QK_K;
            let w = weight(&pool, &mut rng, DType::Q6_K, m, k);
            let w = if saturated { saturate(&w, 210, 0..208) } else { w };
            let mut panels = vec![0u8; w.byte_len()];
            repack(DType::Q6_K, w.bytes(), m, k, &mut panels);
            let blocks = cast_blocks::<BlockQ6K>(w.bytes()).unwrap();
            let exact = |o: usize, x: &[BlockQ8K]| {
                let (mut sum, mut mag) = (0f64, 0f64);
                for (b, y) in x.iter().enumerate() {
                    let blk = &blocks[o * nb + b];
                    let q = unpack(blk);
                    for g in 0..16 {
                        let qy: i64 = (16 * g..16 * g + 16).map(|v| q[v] as i64 * y.qs[v] as i64).sum();
                        let term = blk.d.to_f32() as f64 * y.d as f64 * (blk.scales[g] as i64 * qy) as f64;
                        (sum, mag) = (sum + term, mag + term.abs());
                    }
                }
                (sum, mag)
            };
            let check = |what: &str, out: &[f32], xs: &[Vec<BlockQ8K>]| {
                for (r, x) in xs.iter().enumerate() {
                    for o in 0..m {
                        let ((want, mag), got) = (exact(o, x), out[r * m + o] as f64);
                        assert!((got - want).abs() <= 1e-6 * mag, "{what}: row {r}, output {o}: {got} against {want}");
                    }
                }
            };
            let pack = |rng: &mut Rng, n: usize| {
                let (mut acts, mut xs) = (vec![0u8; n * nb * ACT_K6], Vec::new());
                for dst in acts.chunks_exact_mut(nb * ACT_K6) {
                    let mut b = zeroed_blocks::<BlockQ8K>(nb);
                    quantize(&if saturated { vec![1.0; k] } else { rng.vec(k, 1.0) }, &mut b);
                    pack_act(DType::Q6_K, blocks_as_bytes(&b), dst);
                    xs.push(b);
                }
                (acts, xs)
            };
            for (n, f) in [8, 4, 2, 1].into_iter().zip(fns.rows) {
                let (acts, xs) = pack(&mut rng, n);
                let out = apply(f, &panels, nb, &acts, nb * ACT_K6, n, m);
                check(&format!("(saturated: {saturated}) {n} rows"), &out, &xs);
            }
            for (n, f) in [2, 1].into_iter().zip(fns.side_by_side) {
                let (acts, xs) = pack(&mut rng, n);
                let out = apply_side(f, &panels, nb, &acts, nb * ACT_K6, n, m);
                check(&format!("(saturated: {saturated}) side by side, {n} rows"), &out, &xs);
            }
        }
    }

    /// Where the AVX-512 panel kernels run, the AVX2 ones give every format's rows their
    /// bits exactly: 8, 4, 2 and 1 rows, and four panels side by side for 2 rows and 1, on random and on
    /// saturated weights (the largest integer sums the narrow AVX2 sums must hold).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_kernels_give_the_avx512_bits() {
        use crate::{q8_0, q8_1, q8_k};
        if crate::QuantKernel::best().decode_fn(DType::Q4_0).is_none() {
            return; // no AVX-512 kernels to compare with here
        }
        let (pool, mut rng) = (pool(), Rng::new(6));
        let m = 64;
        for dtype in FORMATS {
            let (wide, narrow) = (
                kernels(dtype).unwrap(),
                match dtype {
                    DType::Q4_0 => avx2::kernels::<{ imp::Q4_0 }>(),
                    DType::Q4_1 => avx2::kernels::<{ imp::Q4_1 }>(),
                    DType::Q8_0 => avx2::kernels::<{ imp::Q8_0 }>(),
                    DType::Q4_K => avx2::kernels::<{ imp::Q4_K }>(),
                    DType::Q5_K => avx2::kernels::<{ imp::Q5_K }>(),
                    _ => avx2::kernels::<{ imp::Q6_K }>(),
                },
            );
            let k = whole(dtype, 768);
            let (nb, row_bytes) = (k / dtype.block_size(), dtype.bytes_for(k).unwrap());
            let ab = act_bytes(dtype);
            for saturated in [false, true] {
                let w = weight(&pool, &mut rng, dtype, m, k);
                let bb = row_bytes / nb;
                // Every byte but the scales `d` (and Q4_1's `m`, the K-quants' `dmin`).
                let levels = match dtype {
                    DType::Q6_K => 0..208,
                    DType::Q4_1 | DType::Q4_K | DType::Q5_K => 4..bb,
                    _ => 2..bb,
                };
                let w = if saturated { saturate(&w, bb, levels) } else { w };
                let mut panels = vec![0u8; w.byte_len()];
                repack(dtype, w.bytes(), m, k, &mut panels);
                let mut acts = vec![0u8; 8 * nb * ab];
                for dst in acts.chunks_exact_mut(nb * ab) {
                    let x = if saturated { vec![1.0; k] } else { rng.vec(k, 1.0) };
                    match dtype {
                        DType::Q4_1 => {
                            let mut b = zeroed_blocks::<q8_1::BlockQ8_1>(nb);
                            q8_1::quantize(&x, &mut b);
                            pack_act(dtype, blocks_as_bytes(&b), dst);
                        }
                        DType::Q4_K | DType::Q5_K | DType::Q6_K => {
                            let mut b = zeroed_blocks::<q8_k::BlockQ8K>(nb);
                            q8_k::quantize(&x, &mut b);
                            pack_act(dtype, blocks_as_bytes(&b), dst);
                        }
                        _ => {
                            let mut b = zeroed_blocks::<q8_0::BlockQ8_0>(nb);
                            q8_0::quantize(&x, &mut b);
                            pack_act(dtype, blocks_as_bytes(&b), dst);
                        }
                    }
                }
                let run = |k: &Kernels| {
                    let rows = [8, 4, 2, 1].into_iter().zip(k.rows);
                    let mut outs: Vec<_> =
                        rows.map(|(n, f)| bits(&apply(f, &panels, nb, &acts, nb * ab, n, m))).collect();
                    let side = [2, 1].into_iter().zip(k.side_by_side);
                    outs.extend(side.map(|(n, f)| bits(&apply_side(f, &panels, nb, &acts, nb * ab, n, m))));
                    outs
                };
                assert_eq!(run(&narrow), run(&wide), "{dtype:?}, saturated: {saturated}");
            }
        }
    }

    /// Kernel `f` over every panel of `panels` (`m` rows of `nb` blocks) against the
    /// first `n` packed rows of `acts`, `stride` bytes apart: `n` rows of `m` outputs.
    fn apply(f: PanelFn, panels: &[u8], nb: usize, acts: &[u8], stride: usize, n: usize, m: usize) -> Vec<f32> {
        let panel_bytes = panels.len() / (m / ROWS);
        assert!(acts.len() >= n * stride);
        let mut out = vec![0f32; n * m];
        for p in 0..m / ROWS {
            // SAFETY: a whole panel, `n` packed rows, `n` rows of `m` outputs.
            unsafe {
                f(panels[p * panel_bytes..].as_ptr(), nb, acts.as_ptr(), stride, out.as_mut_ptr().add(p * ROWS), m)
            };
        }
        out
    }

    /// Side-by-side kernel `f` over the first four panels of `panels` (`m` rows) against
    /// the first `n` packed rows of `acts`, `stride` bytes apart: each row's 64 outputs,
    /// `m` apart.
    fn apply_side(f: SideFn, panels: &[u8], nb: usize, acts: &[u8], stride: usize, n: usize, m: usize) -> Vec<f32> {
        let panel_bytes = panels.len() / (m / ROWS);
        assert!(m >= 4 * ROWS && acts.len() >= n * stride);
        let mut out = vec![0f32; n * m];
        // SAFETY: four whole panels one panel apart, `n` packed rows, their 64 outputs a
        // row `m` apart.
        unsafe { f(panels.as_ptr(), panel_bytes, nb, acts.as_ptr(), stride, out.as_mut_ptr(), ROWS, m) };
        out
    }

    /// `w` with every byte in `levels` of each `bb`-byte block set (the largest levels,
    /// scales and mins the format holds; Q6_K's scales all −1), so that the kernels'
    /// narrow integer sums meet their largest magnitudes.
    fn saturate(w: &HostTensor, bb: usize, levels: std::ops::Range<usize>) -> HostTensor {
        let mut b = w.bytes().to_vec();
        for blk in b.chunks_exact_mut(bb) {
            blk[levels.clone()].fill(0xFF);
        }
        HostTensor::new(Arc::new(AlignedBytes::from_slice(&b)), 0, b.len(), w.dtype, w.shape.clone())
    }
}
