//! Launch shapes of every kernel in `kernels/` (grid, block, shared memory), as pure
//! functions of the problem size so they can be tested without a device. The shapes
//! are the ones `kernels/README.md` documents for each kernel.

use crate::{Activation, KvType, Q8_BLOCK};
use strata_tensor::tensor::DType;

/// Grid and block dimensions of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
}

impl Shape {
    fn new(grid: (u32, u32, u32), block: u32) -> Self {
        Shape { grid, block: (block, 1, 1) }
    }
}

/// Threads per block of the 1-D elementwise kernels.
pub const ELEMENTWISE_BLOCK: u32 = 256;
/// Output rows per matvec block (one warp each).
pub const MATVEC_ROWS_PER_BLOCK: u32 = 8;
/// Activation rows one matvec launch handles.
pub const MATVEC_MAX_ROWS: usize = 8;
/// Threads per attention block (four warps).
pub const ATTN_BLOCK: u32 = 128;
/// Threads per sampling block.
pub const SAMPLE_BLOCK: u32 = 1024;
/// The widest head the attention kernels take.
pub const MAX_HEAD_DIM: usize = 256;
/// Blocks of the grid-stride dequantisation kernels, at most.
const DEQUANT_MAX_BLOCKS: u64 = 65_535;

/// The largest grid x dimension a launch may use.
const MAX_GRID_X: u64 = (1 << 31) - 1;

fn blocks(n: u64, per: u32) -> u32 {
    n.div_ceil(per as u64).clamp(1, MAX_GRID_X) as u32
}

/// `add_f32`, `silu_mul_f32`, `gelu_mul_f32`, `sigmoid_mul_f32`, `swiglu_oai_f32`, `scale_f32`, `softcap_f32`,
/// `add_bias_f32` over `n` values, `f32_to_f16` over `n`.
pub fn elementwise(n: usize) -> Shape {
    Shape::new((blocks(n as u64, ELEMENTWISE_BLOCK), 1, 1), ELEMENTWISE_BLOCK)
}

/// Threads per block of the row kernels (`gather_rows_f32`, `add_rows_f32`).
pub const ROWS_BLOCK: u32 = 256;
/// The largest grid y (and z) dimension a launch may use.
const MAX_GRID_Y: u64 = 65_535;

/// `gather_rows_f32` and `add_rows_f32`: a block per (row, `ROWS_BLOCK` values of it),
/// rows on x. Both kernels loop over both dimensions, so the caps keep them correct.
pub fn rows(n_rows: usize, row_len: usize) -> Shape {
    let chunks = (row_len as u64).div_ceil(ROWS_BLOCK as u64).clamp(1, MAX_GRID_Y) as u32;
    Shape::new(((n_rows as u64).clamp(1, MAX_GRID_X) as u32, chunks, 1), ROWS_BLOCK)
}

/// `pack_blocks_u8` over `n_blocks` blocks: a thread per block, grid-stride past the
/// grid's 65,535 blocks.
pub fn pack_blocks(n_blocks: usize) -> Shape {
    Shape::new((blocks(n_blocks as u64, 256).min(65_535), 1, 1), 256)
}

/// `rms_norm_f32`: one block per row.
pub fn rms_norm(rows: usize) -> Shape {
    Shape::new((rows.max(1) as u32, 1, 1), 256)
}

/// `rope_f32`: one block per (row, head), a thread per rotated pair (`pairs` of them:
/// `head_dim / 2`, or fewer for partial RoPE).
pub fn rope(rows: usize, n_heads: usize, pairs: usize) -> Shape {
    Shape::new((rows.max(1) as u32, n_heads.max(1) as u32, 1), pairs.clamp(1, 1024) as u32)
}

/// The widest head `rope_store_*` takes (its shared memory holds one head).
pub const ROPE_STORE_MAX_HEAD_DIM: usize = 512;

/// `rope_store_{f32,f16,q8_0}` for `rows` new rows of one sequence: a block of 128
/// threads per (row, head), over the query heads, then the key heads, then the value
/// heads. `None` where the kernel cannot take the shape: an odd head, one wider than
/// [`ROPE_STORE_MAX_HEAD_DIM`], a Q8_0 cache whose blocks of 32 would straddle two heads,
/// or more heads than a grid's y dimension.
pub fn rope_store(ty: KvType, rows: usize, n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Option<Shape> {
    let heads = (n_heads + 2 * n_kv_heads) as u64;
    let fits = head_dim > 0
        && head_dim.is_multiple_of(2)
        && head_dim <= ROPE_STORE_MAX_HEAD_DIM
        && (ty != KvType::Q8_0 || head_dim.is_multiple_of(Q8_BLOCK))
        && heads <= MAX_GRID_Y
        && rows as u64 <= MAX_GRID_X;
    fits.then(|| Shape::new((rows.max(1) as u32, heads as u32, 1), 128))
}

/// The `rope_store_*` kernel for a cache type.
pub fn rope_store_kernel(ty: KvType) -> &'static str {
    match ty {
        KvType::F32 => "rope_store_f32",
        KvType::F16 => "rope_store_f16",
        KvType::Q8_0 => "rope_store_q8_0",
    }
}

/// `embed_FMT`: one block per looked-up row.
pub fn embedding(rows: usize) -> Shape {
    Shape::new((rows.max(1) as u32, 1, 1), 256)
}

/// `matvec_FMT`: one warp per output row, eight per block.
pub fn matvec(out: usize) -> Shape {
    Shape::new((blocks(out as u64, MATVEC_ROWS_PER_BLOCK), 1, 1), 32 * MATVEC_ROWS_PER_BLOCK)
}

/// Threads per block of `matvec_wide_FMT` (a block per output row).
pub const MATVEC_WIDE_BLOCK: u32 = 128;

/// `matvec_wide_FMT`: a block of [`MATVEC_WIDE_BLOCK`] threads per output row.
pub fn matvec_wide(out: usize) -> Shape {
    Shape::new(((out as u64).clamp(1, MAX_GRID_X) as u32, 1, 1), MATVEC_WIDE_BLOCK)
}

/// Output rows per `matvec_packed_FMT` block (two per warp).
pub const MATVEC_PACKED_ROWS_PER_BLOCK: u32 = 8;

/// `matvec_packed_FMT`: four warps of two output rows each per block.
pub fn matvec_packed(out: usize) -> Shape {
    Shape::new((blocks(out as u64, MATVEC_PACKED_ROWS_PER_BLOCK), 1, 1), 16 * MATVEC_PACKED_ROWS_PER_BLOCK)
}

/// Weights one `matvec_multi_packed_FMT` launch computes at most.
pub const MATVEC_MULTI_MAX: usize = 3;

/// `matvec_multi_packed_FMT` over weights of `outs` output rows: the blocks of each
/// weight's `matvec_packed_FMT` launch, one after the other.
pub fn matvec_multi(outs: &[usize]) -> Shape {
    let n: u64 = outs.iter().map(|&o| (o as u64).div_ceil(MATVEC_PACKED_ROWS_PER_BLOCK as u64)).sum();
    Shape::new((n.clamp(1, MAX_GRID_X) as u32, 1, 1), 16 * MATVEC_PACKED_ROWS_PER_BLOCK)
}

/// The formats the backend repacks for `matvec_packed_FMT` (kernels/README.md, "Packed
/// weights").
pub const PACKED_FORMATS: [DType; 11] = {
    use DType::*;
    [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Mxfp4, Q4_K, Q5_K, Q6_K, AffineQ4, I8]
};

/// The element formats the packed matvecs read in their stored layout
/// ([`Matvec::reads_in_place`]).
pub const ALIGNED_FORMATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Values of an element format's unit in the packed matvecs (16 bytes of f16 or bf16,
/// 32 of f32).
const ALIGNED_UNIT: usize = 8;

/// Which kernel runs the decode products (`matvec_FMT`, `matvec_wide_FMT` or
/// `matvec_packed_FMT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matvec {
    /// A warp per output row (`matvec_FMT`).
    Warp,
    /// A block of four warps per output row (`matvec_wide_FMT`): more loads in flight per
    /// row, and a block for every SM even when a matrix has few rows.
    Wide,
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K, AffineQ4 and I8 weights (every
    /// block format) repacked at upload, and F32, F16 and BF16 weights whose rows start
    /// 16-byte aligned as stored ([`Matvec::reads_in_place`]),
    /// through `matvec_packed_FMT` (16-byte weight loads, activations staged in shared
    /// memory, two rows a warp); other formats, streamed units of the repacked formats
    /// and unaligned element weights run [`Matvec::Wide`].
    Packed,
}

impl Matvec {
    /// From `STRATA_CUDA_MATVEC` (`warp`, `wide` or `packed`); unset: `wide`, which
    /// decoded the 1.1B Q4_0 7% faster than `warp` on an H200 (docs/gpu.md, item 6);
    /// `packed` has not run on a GPU yet. Anything else is an error naming it.
    pub fn from_env(value: Option<&str>) -> Result<Matvec, String> {
        match value.map(str::trim) {
            None | Some("" | "wide") => Ok(Matvec::Wide),
            Some("warp") => Ok(Matvec::Warp),
            Some("packed") => Ok(Matvec::Packed),
            Some(v) => Err(format!("STRATA_CUDA_MATVEC is `{v}`; it takes `warp`, `wide` or `packed`")),
        }
    }

    /// Whether weights of `dtype` are repacked at upload for this choice.
    pub fn packs(self, dtype: DType) -> bool {
        self == Matvec::Packed && PACKED_FORMATS.contains(&dtype)
    }

    /// Whether the packed matvecs read a weight of `dtype` and `shape` at device address
    /// `addr` in its stored layout for this choice: an element format
    /// ([`ALIGNED_FORMATS`]), 2-D, every row 16-byte aligned (`in` a whole number of
    /// 8-value units, the weight at a multiple of 16 bytes: streamed weights are views at
    /// offsets into their slots).
    pub fn reads_in_place(self, dtype: DType, shape: &[usize], addr: u64) -> bool {
        self == Matvec::Packed
            && ALIGNED_FORMATS.contains(&dtype)
            && shape.len() == 2
            && shape[1].is_multiple_of(ALIGNED_UNIT)
            && addr.is_multiple_of(16)
    }

    /// The kernel's name for weights of format `fmt` (`launch::format_name`) in the
    /// stored layout (`Packed`: `wide`'s) or, with `packed`, the packed one.
    pub fn kernel(self, fmt: &str, packed: bool) -> String {
        match (self, packed) {
            (_, true) => format!("matvec_packed_{fmt}"),
            (Matvec::Warp, false) => format!("matvec_{fmt}"),
            (Matvec::Wide | Matvec::Packed, false) => format!("matvec_wide_{fmt}"),
        }
    }

    /// Its launch shape for `out` output rows.
    pub fn shape(self, out: usize, packed: bool) -> Shape {
        match (self, packed) {
            (_, true) => matvec_packed(out),
            (Matvec::Warp, false) => matvec(out),
            (Matvec::Wide | Matvec::Packed, false) => matvec_wide(out),
        }
    }
}

/// A weight as the choice of a decode kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightKind<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    /// Read by the packed matvecs (`STRATA_CUDA_MATVEC=packed`): repacked, or an element
    /// format read in place ([`Matvec::reads_in_place`]).
    pub packed: bool,
}

/// Whether `matvec_glu_packed_FMT` computes a gated MLP's gate and up products and its
/// activation for a batch of sequences of `seq_rows` rows: both weights packed, of one
/// format and shape, and every sequence's rows on the matrix-vector kernel, as
/// `matmul_seqs` runs them (`gemm`: whether a sequence of more than
/// [`MATVEC_MAX_ROWS`] rows takes the GEMM). Its rows then come out as the matrix-vector
/// kernel's, whatever the launch's row count.
pub fn fuses_glu(gate: WeightKind<'_>, up: WeightKind<'_>, seq_rows: &[usize], gemm: bool) -> bool {
    gate.packed
        && up.packed
        && gate.dtype == up.dtype
        && gate.shape == up.shape
        && gate.shape.len() == 2
        && on_matvec(seq_rows, gemm)
}

/// Whether `matvec_add_packed_FMT` computes a product added into the residual stream for
/// a batch of sequences of `seq_rows` rows: the weight packed and 2-D, and every
/// sequence's rows on the matrix-vector kernel, as `matmul_seqs` runs them (`gemm` as in
/// [`fuses_glu`]). Its rows then come out as the matrix-vector kernel's followed by the
/// add, whatever the launch's row count.
pub fn fuses_add(w: WeightKind<'_>, seq_rows: &[usize], gemm: bool) -> bool {
    w.packed && w.shape.len() == 2 && on_matvec(seq_rows, gemm)
}

/// Whether `matmul_seqs` runs every sequence of `seq_rows` rows on the matrix-vector
/// kernel: always without a GEMM, else when none has more than [`MATVEC_MAX_ROWS`].
fn on_matvec(seq_rows: &[usize], gemm: bool) -> bool {
    !gemm || seq_rows.iter().all(|&n| n <= MATVEC_MAX_ROWS)
}

/// The launches of `matmul_seqs_each` over `weights` for a batch of sequences of
/// `seq_rows` rows, as groups of indices into `weights`, in order of their first: a
/// group of 2 to [`MATVEC_MULTI_MAX`] packed 2-D weights of one format and `in` is one
/// `matvec_multi_packed_FMT` launch (when every sequence's rows take the matrix-vector
/// kernel, `gemm` as in [`fuses_glu`]); every other weight is a group of its own, run by
/// `matmul_seqs` alone. Each weight's rows come out as its own launch's either way.
pub fn multi_groups(weights: &[WeightKind<'_>], seq_rows: &[usize], gemm: bool) -> Vec<Vec<usize>> {
    let shares = |w: &WeightKind<'_>| w.packed && w.shape.len() == 2 && on_matvec(seq_rows, gemm);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, w) in weights.iter().enumerate() {
        let joins = groups.iter_mut().find(|g| {
            let first = &weights[g[0]];
            shares(w)
                && shares(first)
                && g.len() < MATVEC_MULTI_MAX
                && first.dtype == w.dtype
                && first.shape[1] == w.shape[1]
        });
        match joins {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// The `act` code of `matvec_glu_packed_FMT` (common.cuh's `STRATA_GLU_*`) with its
/// `alpha` and `limit` (SwigluOai's; 0 otherwise).
pub fn glu_code(act: Activation) -> (u32, f32, f32) {
    match act {
        Activation::Silu => (0, 0.0, 0.0),
        Activation::GeluTanh => (1, 0.0, 0.0),
        Activation::Sigmoid => (2, 0.0, 0.0),
        Activation::SwigluOai { alpha, limit } => (3, alpha, limit),
    }
}

/// `dequant_FMT_f16` over `n` values: a grid-stride loop, one thread per value (per
/// block of values for the block formats), capped.
pub fn dequant(dtype: DType, n: u64) -> Shape {
    let units = n / dtype.block_size() as u64;
    Shape::new((units.div_ceil(256).clamp(1, DEQUANT_MAX_BLOCKS) as u32, 1, 1), 256)
}

/// How the keys of one attention launch are split across blocks (flash-decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnSplit {
    pub splits: usize,
    /// Key positions per split (a multiple of 64, except when one split takes all).
    pub split_len: usize,
}

/// Splits the keys so that decode (few query rows) still fills the GPU: aim for about
/// two blocks per SM, never a split shorter than 256 keys, at most 64 splits.
pub fn attn_split(rows: usize, n_heads: usize, kv_len: usize, sm_count: usize) -> AttnSplit {
    let kv_len = kv_len.max(1);
    let blocks = (rows * n_heads).max(1);
    let want = (2 * sm_count.max(1)).div_ceil(blocks);
    let by_len = kv_len.div_ceil(256);
    let splits = want.min(by_len).clamp(1, 64);
    if splits == 1 {
        return AttnSplit { splits: 1, split_len: kv_len };
    }
    let split_len = kv_len.div_ceil(splits).div_ceil(64) * 64;
    AttnSplit { splits: kv_len.div_ceil(split_len), split_len }
}

/// Keys per split of [`attn_split_fixed`].
pub const ATTN_FIXED_SPLIT: usize = 512;

/// Splits at fixed key positions (every [`ATTN_FIXED_SPLIT`] keys), whatever the row
/// count: a query row's splits then hold the same keys in a prompt launch and in its own
/// decode step (the splits past its position are empty, which the combine adds exactly
/// as nothing), so it gets the same bits either way.
pub fn attn_split_fixed(kv_len: usize) -> AttnSplit {
    let kv_len = kv_len.max(1);
    match kv_len <= ATTN_FIXED_SPLIT {
        true => AttnSplit { splits: 1, split_len: kv_len },
        false => AttnSplit { splits: kv_len.div_ceil(ATTN_FIXED_SPLIT), split_len: ATTN_FIXED_SPLIT },
    }
}

/// Floats of attention scratch one launch may use with [`attn_split_fixed`] (32 MiB):
/// the rows of a longer prompt go in several launches.
pub const ATTN_FIXED_SCRATCH: usize = 8 << 20;

/// f16 values of weight the prefill GEMM dequantises at once (64 MiB of scratch).
pub const GEMM_TILE_VALUES: usize = 32 << 20;

/// Output rows of a `[out, in]` weight per dequantise-and-GEMM tile: as many as fit in
/// [`GEMM_TILE_VALUES`], a multiple of 128 when the tile does not take them all.
pub fn gemm_tile_rows(out: usize, inn: usize) -> usize {
    let fit = (GEMM_TILE_VALUES / inn.max(1)).max(1);
    if fit >= out { out.max(1) } else { (fit / 128 * 128).max(fit.min(128)) }
}

/// `attn_partial_*` (`heads` = `n_heads`: a block per query row · head, split) and
/// `attn_group_*` (`heads` = `n_kv_heads`: a block per query row · KV head, split).
pub fn attn_partial(rows: usize, heads: usize, split: AttnSplit) -> Shape {
    Shape::new(((rows * heads).max(1) as u32, split.splits as u32, 1), ATTN_BLOCK)
}

/// Which attention kernel computes the partials of the few-row (decode, verification)
/// launches when query heads share KV heads (`STRATA_CUDA_ATTN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attn {
    /// `attn_group_*`: a block per KV head, each K/V row read once for its query heads.
    Group,
    /// `attn_partial_*` everywhere: a block per query head.
    Head,
}

/// Query rows up to which an attention launch takes `attn_group_*` (a decode step, or a
/// verifying sequence's rows: the matvec's row count).
pub const ATTN_GROUP_MAX_ROWS: usize = MATVEC_MAX_ROWS;

/// The partial-attention kernel of one launch and the blocks it takes per query row
/// (before the splits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnKernel {
    pub name: &'static str,
    pub heads: usize,
}

impl Attn {
    /// From `STRATA_CUDA_ATTN` (`group` or `head`); unset: `head`, the kernel that has run
    /// on a GPU. `group` gives the same partials bit for bit on the emulator
    /// (tools/cuda_emu, `attn_group_*` cases) with each K/V row read once per group
    /// instead of once per query head; it becomes the default once a GPU has measured it
    /// (docs/gpu.md). Anything else is an error naming it.
    pub fn from_env(value: Option<&str>) -> Result<Attn, String> {
        match value.map(str::trim) {
            Some("group") => Ok(Attn::Group),
            None | Some("" | "head") => Ok(Attn::Head),
            Some(v) => Err(format!("STRATA_CUDA_ATTN is `{v}`; it takes `group` or `head`")),
        }
    }

    /// The kernel for `rows` query rows of `n_heads` heads over `n_kv_heads` KV heads
    /// stored as `kv`: `attn_group_*` with [`Attn::Group`] when heads share KV heads
    /// (evenly) and there are at most [`ATTN_GROUP_MAX_ROWS`] rows, else `attn_partial_*`.
    pub fn kernel(self, kv: KvType, rows: usize, n_heads: usize, n_kv_heads: usize) -> AttnKernel {
        let grouped = self == Attn::Group
            && rows <= ATTN_GROUP_MAX_ROWS
            && n_kv_heads > 0
            && n_heads > n_kv_heads
            && n_heads.is_multiple_of(n_kv_heads);
        match grouped {
            true => AttnKernel { name: attn_group_kernel(kv), heads: n_kv_heads },
            false => AttnKernel { name: attn_partial_kernel(kv), heads: n_heads },
        }
    }
}

/// The `attn_group_*` kernel for caches stored as `ty`.
pub fn attn_group_kernel(ty: KvType) -> &'static str {
    match ty {
        KvType::F32 => "attn_group_f32",
        KvType::F16 => "attn_group_f16",
        KvType::Q8_0 => "attn_group_q8_0",
    }
}

/// `kv_store_f16` (a thread per value) and `kv_store_q8_0` (a warp per 32-value block, 8
/// blocks per launch block): a block row per cache row, `None` when a dimension would not
/// fit the grid.
pub fn kv_store(ty: KvType, n_rows: usize, width: usize) -> Option<Shape> {
    let per = match ty {
        KvType::F32 => return None,
        KvType::F16 => ROWS_BLOCK as u64,
        KvType::Q8_0 => (ROWS_BLOCK / 32 * Q8_BLOCK as u32) as u64,
    };
    let chunks = (width as u64).div_ceil(per).max(1);
    (n_rows as u64 <= MAX_GRID_X && chunks <= MAX_GRID_Y)
        .then(|| Shape::new((n_rows.max(1) as u32, chunks as u32, 1), ROWS_BLOCK))
}

/// The `attn_partial_*` kernel for caches stored as `ty`.
pub fn attn_partial_kernel(ty: KvType) -> &'static str {
    match ty {
        KvType::F32 => "attn_partial_f32",
        KvType::F16 => "attn_partial_f16",
        KvType::Q8_0 => "attn_partial_q8_0",
    }
}

/// `attn_combine_f32` and `attn_combine_sinks_f32`: a block per query row · head, a thread
/// per head dimension.
pub fn attn_combine(rows: usize, n_heads: usize, head_dim: usize) -> Shape {
    Shape::new(((rows * n_heads).max(1) as u32, 1, 1), head_dim as u32)
}

/// Floats of the partial results of one attention launch.
pub fn attn_partial_len(rows: usize, n_heads: usize, head_dim: usize, split: AttnSplit) -> usize {
    rows * n_heads * split.splits * (head_dim + 2)
}

/// `argmax_f32` and `topk_f32`: a block per row.
pub fn sample(rows: usize) -> Shape {
    Shape::new((rows.max(1) as u32, 1, 1), SAMPLE_BLOCK)
}

/// `delta_conv_f32`: a thread per convolution channel.
pub fn delta_conv(conv_dim: usize) -> Shape {
    elementwise(conv_dim)
}

/// `delta_rule_f32`: a block per value head, a thread per column of its state (the
/// value head's width rounded up to whole warps).
pub fn delta_rule(n_v_heads: usize, v_head_dim: usize) -> Shape {
    Shape::new((n_v_heads.max(1) as u32, 1, 1), (v_head_dim.div_ceil(32) * 32).clamp(32, 1024) as u32)
}

/// Whether the delta-rule kernels take a layer of this shape: a key head of at most 256
/// values, a value head of at most 1024, a convolution of 2 to 8 taps.
pub fn delta_fits(s: &crate::delta::DeltaShape) -> bool {
    s.k_head_dim <= 256 && s.v_head_dim <= 1024 && (2..=8).contains(&s.conv_kernel) && s.n_k_heads > 0
}

/// The kernel-name suffix of a weight format (its name in lower case: `q4_k`,
/// `affine_q4`), or `None` for a format no kernel reads (the activation formats Q8_1
/// and Q8_K).
pub fn format_name(dtype: DType) -> Option<String> {
    WEIGHT_FORMATS.contains(&dtype).then(|| dtype.name().to_ascii_lowercase())
}

/// Every weight format the kernels read.
pub const WEIGHT_FORMATS: [DType; 14] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Mxfp4,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::AffineQ4,
    DType::I8,
];

/// Every kernel name the backend launches, by file (`kernels/FILE.cu`).
pub fn kernel_names() -> Vec<(&'static str, String)> {
    let mut names: Vec<(&'static str, String)> = vec![
        ("elementwise", "add_f32".into()),
        ("elementwise", "add_bias_f32".into()),
        ("elementwise", "silu_mul_f32".into()),
        ("elementwise", "gelu_mul_f32".into()),
        ("elementwise", "sigmoid_mul_f32".into()),
        ("elementwise", "swiglu_oai_f32".into()),
        ("elementwise", "scale_f32".into()),
        ("elementwise", "softcap_f32".into()),
        ("elementwise", "f32_to_f16".into()),
        ("rows", "gather_rows_f32".into()),
        ("rows", "add_rows_f32".into()),
        ("rows", "copy_cols_f32".into()),
        ("rows", "pack_blocks_u8".into()),
        ("norm", "rms_norm_f32".into()),
        ("rope", "rope_f32".into()),
        ("attention", "attn_partial_f32".into()),
        ("attention", "attn_combine_f32".into()),
        ("attention", "attn_combine_sinks_f32".into()),
        ("attention", "attn_partial_f16".into()),
        ("attention", "attn_partial_q8_0".into()),
        ("attention", "attn_group_f32".into()),
        ("attention", "attn_group_f16".into()),
        ("attention", "attn_group_q8_0".into()),
        ("attention", "kv_store_f16".into()),
        ("attention", "kv_store_q8_0".into()),
        ("attention", "rope_store_f32".into()),
        ("attention", "rope_store_f16".into()),
        ("attention", "rope_store_q8_0".into()),
        ("sample", "argmax_f32".into()),
        ("sample", "topk_f32".into()),
        ("deltanet", "delta_conv_f32".into()),
        ("deltanet", "delta_rule_f32".into()),
    ];
    for d in WEIGHT_FORMATS {
        let f = format_name(d).unwrap_or_default();
        names.push(("embedding", format!("embed_{f}")));
        names.push(("matvec", format!("matvec_{f}")));
        names.push(("matvec", format!("matvec_wide_{f}")));
        names.push(("dequant", format!("dequant_{f}_f16")));
    }
    for d in PACKED_FORMATS {
        let f = format_name(d).unwrap_or_default();
        names.push(("embedding", format!("embed_packed_{f}")));
        names.push(("matvec_packed", format!("matvec_packed_{f}")));
        names.push(("matvec_packed", format!("matvec_glu_packed_{f}")));
        names.push(("matvec_packed", format!("matvec_add_packed_{f}")));
        names.push(("matvec_packed", format!("matvec_multi_packed_{f}")));
        names.push(("dequant", format!("dequant_packed_{f}_f16")));
    }
    for d in ALIGNED_FORMATS {
        let f = format_name(d).unwrap_or_default();
        for k in ["packed", "glu_packed", "add_packed", "multi_packed"] {
            names.push(("matvec_packed", format!("matvec_{k}_{f}")));
        }
    }
    names
}

#[cfg(test)]
mod tests;
