//! What a GEMM kernel of one format and instruction set is: how the format maps onto
//! the integer GEMM, its unpacker and its micro-kernels (the SIMD modules provide them).

use strata_tensor::tensor::DType;

/// Weight rows per panel: one 512-bit register of i32 lanes.
pub const PANEL: usize = 16;

/// How a weight format maps onto the GEMM (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmFormat {
    /// Values per scale group: 32, or 16 (Q6_K).
    pub group: usize,
    /// Whether the weights carry a min (`mw`, against the activations' `da · Σ q`) rather
    /// than an integer offset subtracted from the levels.
    pub has_min: bool,
    /// The integer offset of the levels (8, 16, 32 or 128; 0 for formats with a min).
    pub offset: i32,
}

impl GemmFormat {
    pub fn of(dtype: DType) -> Option<GemmFormat> {
        let (group, has_min, offset) = match dtype {
            DType::Q4_0 => (32, false, 8),
            DType::Q5_0 => (32, false, 16),
            DType::Q8_0 => (32, false, 128),
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => (32, true, 0),
            DType::Q6_K => (16, false, 32),
            _ => return None,
        };
        Some(GemmFormat { group, has_min, offset })
    }
}

/// `unsafe fn(w, row_bytes, lanes, nb, levels, dw, mw)`: unpacks `nb` blocks of the
/// `lanes` (1..=16) weight rows at `w`, `w + row_bytes`, ... into `levels`
/// (`group / 4` 64-byte lines per group, lane `i` of a line holding 4 consecutive values
/// of row `i`), `dw` and `mw` (16 f32 per group). Lanes past `lanes` are zero.
///
/// # Safety
/// `w + i·row_bytes` must point at `nb` readable weight blocks for `i < lanes`;
/// `levels`, `dw` and `mw` must be 64-byte aligned and hold every group of `nb` blocks;
/// the CPU must have the kernel's features.
pub type UnpackFn =
    unsafe fn(w: *const u8, row_bytes: usize, lanes: usize, nb: usize, levels: *mut u8, dw: *mut f32, mw: *mut f32);

/// What one micro-kernel call reads and writes: an unpacked panel (as [`UnpackFn`]
/// wrote it, `groups` groups) against activation rows `r` = 0.. whose levels start at
/// `qs + r·qs_stride` and whose per-group `da`, `ioff` and `ms` start at `r·g_stride`;
/// writes `out[r·os + i]` for the lanes set in `mask`.
pub struct MicroTile {
    pub levels: *const u8,
    pub dw: *const f32,
    pub mw: *const f32,
    pub groups: usize,
    pub qs: *const i8,
    pub qs_stride: usize,
    pub da: *const f32,
    pub ioff: *const i32,
    pub ms: *const f32,
    pub g_stride: usize,
    /// Consecutive groups that share one activation scale `da` (8 or 16 in a Q8_K block,
    /// else 1); divides `groups`.
    pub per: usize,
    pub out: *mut f32,
    pub os: usize,
    pub mask: u16,
}

/// # Safety
/// Every pointer of the [`MicroTile`] must be valid for the rows, groups and lanes it
/// describes; `levels`, `dw` and `mw` 64-byte aligned; the CPU must have the features.
pub type MicroFn = unsafe fn(&MicroTile);

/// The unpacker and the micro-kernels (index: activation rows − 1; as many as the
/// instruction set has registers for) of one format and instruction set.
#[derive(Clone, Copy)]
pub struct GemmKernel {
    pub fmt: GemmFormat,
    pub unpack: UnpackFn,
    pub micro: &'static [MicroFn],
}

/// The 32-value block formats, which the unpackers take as a const parameter.
pub mod block32 {
    pub const Q4_0: u8 = 0;
    pub const Q5_0: u8 = 1;
    pub const Q8_0: u8 = 2;
    pub const Q4_1: u8 = 3;
    pub const Q5_1: u8 = 4;

    /// Per format: block bytes, offset of `qs`, offset of `qh` (0: none), whether the
    /// second f16 of the block is a min `m` (`w = d·u + m`).
    pub const fn layout(f: u8) -> (usize, usize, usize, bool) {
        match f {
            Q4_0 => (18, 2, 0, false),
            Q5_0 => (22, 6, 2, false),
            Q8_0 => (34, 2, 0, false),
            Q4_1 => (20, 4, 0, true),
            _ => (24, 8, 4, true),
        }
    }
}
