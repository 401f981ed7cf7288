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
pub const PACKED_FORMATS: [DType; 5] = [DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K];

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
    /// Q4_0, Q8_0, Q4_K, Q5_K and Q6_K weights repacked at upload, and F32, F16 and BF16
    /// weights whose rows start 16-byte aligned as stored ([`Matvec::reads_in_place`]),
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
        names.push(("matvec", format!("matvec_packed_{f}")));
        names.push(("matvec", format!("matvec_glu_packed_{f}")));
        names.push(("matvec", format!("matvec_add_packed_{f}")));
        names.push(("matvec", format!("matvec_multi_packed_{f}")));
        names.push(("dequant", format!("dequant_packed_{f}_f16")));
    }
    for d in ALIGNED_FORMATS {
        let f = format_name(d).unwrap_or_default();
        for k in ["packed", "glu_packed", "add_packed", "multi_packed"] {
            names.push(("matvec", format!("matvec_{k}_{f}")));
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glu_fuses_packed_pairs_of_one_kind_on_the_matvec() {
        let (shape, other) = ([96usize, 64], [64usize, 96]);
        let q4 = WeightKind { dtype: DType::Q4_0, shape: &shape, packed: true };
        let decode = [1usize, 1, 1];
        assert!(fuses_glu(q4, q4, &decode, true));
        // A verifying sequence's rows (up to MATVEC_MAX_ROWS) stay on the matvec too.
        assert!(fuses_glu(q4, q4, &[1, MATVEC_MAX_ROWS, 1], true));
        // A prompt chunk takes the GEMM, unless there is no GEMM (or rows must not vary).
        assert!(!fuses_glu(q4, q4, &[1, MATVEC_MAX_ROWS + 1], true));
        assert!(fuses_glu(q4, q4, &[1, MATVEC_MAX_ROWS + 1], false));
        // Both packed, of one format and one shape.
        assert!(!fuses_glu(q4, WeightKind { packed: false, ..q4 }, &decode, true));
        assert!(!fuses_glu(WeightKind { packed: false, ..q4 }, q4, &decode, true));
        assert!(!fuses_glu(q4, WeightKind { dtype: DType::Q8_0, ..q4 }, &decode, true));
        assert!(!fuses_glu(q4, WeightKind { shape: &other, ..q4 }, &decode, true));
    }

    #[test]
    fn a_product_adds_into_the_residual_when_packed_and_on_the_matvec() {
        let shape = [96usize, 64];
        let q4 = WeightKind { dtype: DType::Q4_K, shape: &shape, packed: true };
        assert!(fuses_add(q4, &[1, 1, 1], true));
        assert!(fuses_add(q4, &[1, MATVEC_MAX_ROWS, 1], true));
        // A prompt chunk takes the GEMM, unless there is none.
        assert!(!fuses_add(q4, &[1, MATVEC_MAX_ROWS + 1], true));
        assert!(fuses_add(q4, &[MATVEC_MAX_ROWS + 1], false));
        // The stored layout runs the unfused ops; so does a 1-D weight.
        assert!(!fuses_add(WeightKind { packed: false, ..q4 }, &[1], true));
        assert!(!fuses_add(WeightKind { shape: &shape[..1], ..q4 }, &[1], true));
    }

    #[test]
    fn products_of_one_input_share_launches_by_format_and_width() {
        let (q, kv, wide) = ([128usize, 64], [32usize, 64], [64usize, 128]);
        let k = |dtype, shape, packed| WeightKind { dtype, shape, packed };
        let decode = [1usize, 1, MATVEC_MAX_ROWS];
        // A layer's q, k and v: one launch.
        let qkv = [k(DType::Q4_K, &q, true), k(DType::Q4_K, &kv, true), k(DType::Q4_K, &kv, true)];
        assert_eq!(multi_groups(&qkv, &decode, true), vec![vec![0, 1, 2]]);
        // A prompt chunk on the GEMM: each alone (but not without a GEMM).
        assert_eq!(multi_groups(&qkv, &[1, MATVEC_MAX_ROWS + 1], true), vec![vec![0], vec![1], vec![2]]);
        assert_eq!(multi_groups(&qkv, &[MATVEC_MAX_ROWS + 1], false), vec![vec![0, 1, 2]]);
        // Q4_K_M's v in Q6_K: q and k share, v runs alone; so does a stored or 1-D weight.
        let mixed = [k(DType::Q4_K, &q, true), k(DType::Q4_K, &kv, true), k(DType::Q6_K, &kv, true)];
        assert_eq!(multi_groups(&mixed, &decode, true), vec![vec![0, 1], vec![2]]);
        let stored = [k(DType::Q4_K, &q, false), k(DType::Q4_K, &kv, true), k(DType::Q4_K, &kv[..1], true)];
        assert_eq!(multi_groups(&stored, &decode, true), vec![vec![0], vec![1], vec![2]]);
        // Another `in`, and a fourth weight of one kind, start groups of their own.
        let four = [qkv[0], k(DType::Q4_K, &wide, true), qkv[1], qkv[2], qkv[2]];
        assert_eq!(multi_groups(&four, &decode, true), vec![vec![0, 2, 3], vec![1], vec![4]]);
        // The grid: each weight's packed blocks, one after the other.
        assert_eq!(matvec_multi(&[128, 32, 33]).grid.0, 16 + 4 + 5);
        assert_eq!(matvec_multi(&[67]), matvec_packed(67));
    }

    #[test]
    fn glu_codes_are_common_cuh_s() {
        assert_eq!(glu_code(Activation::Silu), (0, 0.0, 0.0));
        assert_eq!(glu_code(Activation::GeluTanh).0, 1);
        assert_eq!(glu_code(Activation::Sigmoid).0, 2);
        assert_eq!(glu_code(Activation::SwigluOai { alpha: 1.702, limit: 7.0 }), (3, 1.702, 7.0));
        let common = crate::cuda::kernels::COMMON;
        for (name, code) in [("SILU", 0), ("GELU_TANH", 1), ("SIGMOID", 2), ("SWIGLU_OAI", 3)] {
            assert!(common.contains(&format!("#define STRATA_GLU_{name} {code}u")), "STRATA_GLU_{name}");
        }
    }

    #[test]
    fn one_dimensional_grids_cover_every_element() {
        for n in [1usize, 255, 256, 257, 4096 * 11008] {
            let s = elementwise(n);
            assert!(s.grid.0 as usize * s.block.0 as usize >= n);
            assert!((s.grid.0 as usize - 1) * (s.block.0 as usize) < n);
        }
        // An empty launch still has a valid (non-zero) grid.
        assert_eq!(elementwise(0).grid.0, 1);
    }

    #[test]
    fn row_grids_have_a_row_per_x_and_cover_each_row() {
        assert_eq!(rows(3, 4097), Shape { grid: (3, 17, 1), block: (256, 1, 1) });
        assert_eq!(rows(1, 1).grid, (1, 1, 1));
        assert_eq!(rows(100_000, 256).grid, (100_000, 1, 1));
        // Empty launches still have a valid grid; huge rows cap y (the kernels loop).
        assert_eq!(rows(0, 0).grid, (1, 1, 1));
        assert_eq!(rows(2, 1 << 26).grid.1 as u64, MAX_GRID_Y);
    }

    #[test]
    fn matvec_has_a_warp_per_output_row() {
        let s = matvec(4097);
        assert_eq!(s.block, (256, 1, 1));
        assert_eq!(s.grid.0, 513);
        assert!(s.grid.0 * MATVEC_ROWS_PER_BLOCK >= 4097);
    }

    #[test]
    fn the_wide_matvec_has_a_block_per_output_row() {
        let s = matvec_wide(4097);
        assert_eq!((s.grid, s.block), ((4097, 1, 1), (128, 1, 1)));
        assert_eq!(matvec_wide(0).grid.0, 1);
        assert_eq!(Matvec::Wide.shape(10, false), matvec_wide(10));
        assert_eq!(Matvec::Warp.shape(10, false), matvec(10));
        assert_eq!(Matvec::Wide.kernel("q4_k", false), "matvec_wide_q4_k");
        assert_eq!(Matvec::Warp.kernel("q4_k", false), "matvec_q4_k");
    }

    #[test]
    fn the_packed_matvec_has_two_rows_a_warp_and_falls_back_to_wide() {
        let s = matvec_packed(67);
        assert_eq!((s.grid, s.block), ((9, 1, 1), (128, 1, 1)));
        assert!(s.grid.0 * 2 * (s.block.0 / 32) >= 67);
        assert_eq!(Matvec::Packed.kernel("q4_0", true), "matvec_packed_q4_0");
        assert_eq!(Matvec::Packed.shape(67, true), s);
        // Formats without a packed layout, and streamed units, run the wide kernel.
        assert_eq!(Matvec::Packed.kernel("q4_k", true), "matvec_packed_q4_k");
        assert_eq!(Matvec::Packed.kernel("q5_1", false), "matvec_wide_q5_1");
        assert_eq!(Matvec::Packed.shape(67, false), matvec_wide(67));
        assert!(Matvec::Packed.packs(DType::Q8_0) && Matvec::Packed.packs(DType::Q4_K));
        assert!(Matvec::Packed.packs(DType::Q6_K) && Matvec::Packed.packs(DType::Q5_K));
        assert!(!Matvec::Packed.packs(DType::Q5_1) && !Matvec::Packed.packs(DType::Mxfp4));
        assert!(!Matvec::Wide.packs(DType::Q4_0));
    }

    #[test]
    fn element_weights_are_read_in_place_when_their_rows_are_16_byte_aligned() {
        let p = Matvec::Packed;
        for d in ALIGNED_FORMATS {
            assert!(p.reads_in_place(d, &[300, 4096], 0x7f00_0000_0100), "{d:?}");
            // A row of f16 whose `in` is not whole units starts unaligned; so does a view
            // at an offset of 8 bytes into a slot.
            assert!(!p.reads_in_place(d, &[300, 4100], 0x7f00_0000_0100), "{d:?}");
            assert!(!p.reads_in_place(d, &[300, 4096], 0x7f00_0000_0108), "{d:?}");
            assert!(!p.reads_in_place(d, &[4096], 0x7f00_0000_0100), "{d:?}");
        }
        // Only element formats (the others are repacked or not read by the packed walk),
        // and only under `packed`.
        assert!(!p.reads_in_place(DType::Q4_0, &[300, 4096], 256));
        assert!(!p.reads_in_place(DType::Q5_K, &[300, 4096], 256));
        assert!(!Matvec::Wide.reads_in_place(DType::F16, &[300, 4096], 256));
        assert_eq!(p.kernel("f16", true), "matvec_packed_f16");
        assert!(!p.packs(DType::F16), "element formats are not repacked");
    }

    #[test]
    fn strata_cuda_attn_takes_group_or_head() {
        assert_eq!(Attn::from_env(None), Ok(Attn::Head));
        assert_eq!(Attn::from_env(Some(" group ")), Ok(Attn::Group));
        assert_eq!(Attn::from_env(Some("head")), Ok(Attn::Head));
        let e = Attn::from_env(Some("kv")).unwrap_err();
        assert!(e.contains("`kv`") && e.contains("`group`"), "{e}");
    }

    #[test]
    fn grouped_attention_takes_few_rows_of_shared_kv_heads() {
        let g = |kv, rows, nh, nkv| Attn::Group.kernel(kv, rows, nh, nkv);
        // Llama-3-8B decode: a block per KV head.
        assert_eq!(g(KvType::F16, 1, 32, 8), AttnKernel { name: "attn_group_f16", heads: 8 });
        assert_eq!(g(KvType::F32, 1, 32, 8).name, "attn_group_f32");
        assert_eq!(g(KvType::Q8_0, 1, 64, 1).name, "attn_group_q8_0");
        // A verifying sequence's rows too, a prompt's not.
        assert_eq!(g(KvType::F32, ATTN_GROUP_MAX_ROWS, 32, 8).heads, 8);
        assert_eq!(g(KvType::F32, ATTN_GROUP_MAX_ROWS + 1, 32, 8), AttnKernel { name: "attn_partial_f32", heads: 32 });
        // MHA, uneven groups and no KV heads keep a block per query head.
        assert_eq!(g(KvType::F16, 1, 32, 32), AttnKernel { name: "attn_partial_f16", heads: 32 });
        assert_eq!(g(KvType::F16, 1, 12, 8).name, "attn_partial_f16");
        assert_eq!(g(KvType::F16, 1, 12, 0).name, "attn_partial_f16");
        // `head` is attn_partial_* everywhere.
        assert_eq!(Attn::Head.kernel(KvType::Q8_0, 1, 32, 8), AttnKernel { name: "attn_partial_q8_0", heads: 32 });
        assert_eq!(attn_partial(1, 8, attn_split(1, 8, 8192, 132)).grid.0, 8);
    }

    #[test]
    fn strata_cuda_matvec_takes_warp_or_wide() {
        assert_eq!(Matvec::from_env(None), Ok(Matvec::Wide));
        assert_eq!(Matvec::from_env(Some("warp")), Ok(Matvec::Warp));
        assert_eq!(Matvec::from_env(Some(" wide ")), Ok(Matvec::Wide));
        assert_eq!(Matvec::from_env(Some("packed")), Ok(Matvec::Packed));
        let e = Matvec::from_env(Some("fast")).unwrap_err();
        assert!(e.contains("`fast`") && e.contains("`wide`"), "{e}");
    }

    #[test]
    fn per_row_kernels_have_a_block_per_row() {
        assert_eq!(rms_norm(7).grid, (7, 1, 1));
        assert_eq!(rope(5, 32, 64), Shape { grid: (5, 32, 1), block: (64, 1, 1) });
        // Partial RoPE: a thread per rotated pair only.
        assert_eq!(rope(5, 32, 16).block, (16, 1, 1));
        assert_eq!(embedding(3).grid.0, 3);
        assert_eq!(sample(2), Shape { grid: (2, 1, 1), block: (1024, 1, 1) });
        assert_eq!(attn_combine(3, 8, 64), Shape { grid: (24, 1, 1), block: (64, 1, 1) });
    }

    #[test]
    fn dequant_grid_is_capped_and_covers_small_tensors() {
        let small = dequant(DType::Q4_0, 32 * 100);
        assert_eq!(small.grid.0, 1);
        let huge = dequant(DType::F16, 8192 * 28672);
        assert_eq!(huge.grid.0 as u64, DEQUANT_MAX_BLOCKS);
    }

    #[test]
    fn attention_splits_cover_the_keys_exactly_once() {
        for (rows, heads, kv, sms) in [(1, 32, 4096, 132), (1, 8, 100, 132), (1, 32, 70_000, 132), (512, 32, 512, 132)]
        {
            let s = attn_split(rows, heads, kv, sms);
            assert!(s.splits >= 1 && s.splits <= 64, "{s:?}");
            assert!(s.splits * s.split_len >= kv, "{s:?} covers {kv}");
            assert!((s.splits - 1) * s.split_len < kv, "{s:?}: the last split is empty");
            if s.splits > 1 {
                assert_eq!(s.split_len % 64, 0);
                assert!(s.split_len >= 256);
            }
        }
        // Fixed splits: the same boundaries whatever the length.
        for kv in [1, 100, 512, 513, 4096, 70_000] {
            let s = attn_split_fixed(kv);
            assert!(s.splits * s.split_len >= kv && (s.splits - 1) * s.split_len < kv, "{s:?} covers {kv}");
            assert!(s.splits == 1 || s.split_len == ATTN_FIXED_SPLIT, "{s:?}");
        }
        // Decode over a long context splits; prefill with many rows does not.
        assert!(attn_split(1, 32, 8192, 132).splits > 1);
        assert_eq!(attn_split(512, 32, 8192, 132).splits, 1);
        let s = attn_split(1, 32, 8192, 132);
        assert_eq!(attn_partial(1, 32, s).grid, (32, s.splits as u32, 1));
        assert_eq!(attn_partial_len(1, 32, 128, s), 32 * s.splits * 130);
    }

    #[test]
    fn gemm_tiles_bound_the_scratch_and_cover_every_row() {
        // An 8B model's FFN fits in one tile; a 128k vocabulary head does not.
        assert_eq!(gemm_tile_rows(14336, 4096), 8192);
        assert_eq!(gemm_tile_rows(4096, 4096), 4096);
        let t = gemm_tile_rows(128_256, 4096);
        assert!(t * 4096 <= GEMM_TILE_VALUES && t.is_multiple_of(128) && t > 0, "{t}");
        assert!(128_256usize.div_ceil(t) * t >= 128_256);
        assert_eq!(gemm_tile_rows(0, 4096), 1);
        assert!(gemm_tile_rows(10, 1 << 26) >= 1);
    }

    #[test]
    fn every_weight_format_has_kernels() {
        let names = kernel_names();
        for d in WEIGHT_FORMATS {
            let f = format_name(d).unwrap();
            for k in
                [format!("matvec_{f}"), format!("matvec_wide_{f}"), format!("embed_{f}"), format!("dequant_{f}_f16")]
            {
                assert!(names.iter().any(|(_, n)| *n == k), "{k}");
            }
        }
        assert_eq!(format_name(DType::Q8_K), None);
    }

    #[test]
    fn rope_store_takes_whole_even_heads_and_q8_0_blocks_inside_a_head() {
        let s = rope_store(KvType::F16, 3, 32, 8, 128).unwrap();
        assert_eq!((s.grid, s.block), ((3, 48, 1), (128, 1, 1)));
        assert!(rope_store(KvType::F32, 1, 4, 4, 512).is_some());
        assert!(rope_store(KvType::F32, 1, 4, 4, 514).is_none(), "wider than the shared memory");
        assert!(rope_store(KvType::F32, 1, 4, 4, 63).is_none(), "odd");
        assert!(rope_store(KvType::Q8_0, 1, 4, 4, 96).is_some());
        assert!(rope_store(KvType::Q8_0, 1, 4, 4, 80).is_none(), "a block across two heads");
        assert!(rope_store(KvType::F16, 1, 4, 4, 80).is_some());
        assert_eq!(rope_store_kernel(KvType::Q8_0), "rope_store_q8_0");
    }

    #[test]
    fn kernel_names_are_exactly_what_the_files_declare() {
        use super::super::kernels;
        let listed = kernel_names();
        let mut declared = Vec::new();
        for f in kernels::FILES {
            for name in kernels::functions(f) {
                assert!(listed.contains(&(f.name, name.clone())), "kernels/{}.cu: `{name}` is not listed", f.name);
                declared.push((f.name, name));
            }
        }
        for entry in &listed {
            assert!(declared.contains(entry), "{entry:?} is listed but no kernel file declares it");
        }
        // 4 kernels per weight format (two matvecs, embedding, dequantisation), 6 per
        // packed format (the fused GLU, add and multi matvecs too), 4 per element format
        // read in place (the packed matvecs), 31 others.
        assert_eq!(listed.len(), 4 * WEIGHT_FORMATS.len() + 6 * PACKED_FORMATS.len() + 4 * ALIGNED_FORMATS.len() + 31);
        assert_eq!(declared.len(), listed.len());
    }
}
