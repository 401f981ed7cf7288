//! The compute backend: a small trait of the operations the forward passes need.
//!
//! Activations are row-major f32 matrices in backend buffers (`Buf`); weights are
//! uploaded once into the backend's own form (`Weight`) and keep their stored dtype.
//! New ops land on the CPU first; other backends are checked against it.

pub mod cpu;
pub mod cuda;
pub mod delta;
pub mod device;
pub mod stage;

use strata_tensor::tensor::HostTensor;

/// Parameters of causal attention over a KV cache for one sequence.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams<'a> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Position of the first query row; query row `r` sits at `start_pos + r` and sees
    /// cache rows `0..=start_pos + r`.
    pub start_pos: usize,
    /// Multiplier applied to q·k (usually `head_dim^-0.5`).
    pub scale: f32,
    /// A query at position `p` sees only keys at positions `> p - window`.
    pub sliding_window: Option<usize>,
    /// Scores `s` become `cap * tanh(s / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
    /// How the cache stores its keys and values.
    pub kv: KvType,
    /// A learned logit per query head that joins each softmax's denominator and takes
    /// part of the weight from every key (gpt-oss's attention sinks).
    pub sinks: Option<&'a [f32]>,
}

/// How a KV cache stores its keys and values (`--kv-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum KvType {
    /// As computed.
    #[default]
    #[value(name = "f32")]
    #[serde(rename = "f32")]
    F32,
    /// Half precision: half the memory.
    #[value(name = "f16")]
    #[serde(rename = "f16")]
    F16,
    /// Blocks of 32 values as 8-bit integers and one f32 scale: 9/32 of the memory.
    #[value(name = "q8_0")]
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl KvType {
    /// Values of a cache buffer (f32 slots) one row of `width` keys or values takes.
    pub fn row_len(self, width: usize) -> usize {
        match self {
            KvType::F32 => width,
            KvType::F16 => width.div_ceil(2),
            KvType::Q8_0 => width.div_ceil(Q8_BLOCK) * (Q8_BLOCK / 4 + 1),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }
}

/// Values per scale in a [`KvType::Q8_0`] row.
pub const Q8_BLOCK: usize = 32;

/// Which rows of a buffer an indexed op reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows<'a> {
    /// `n` rows from `start` on.
    Range { start: usize, n: usize },
    /// These rows, in this order (repeats allowed when reading, not when adding).
    List(&'a [u32]),
}

impl Rows<'_> {
    /// The first `n` rows.
    pub fn first(n: usize) -> Rows<'static> {
        Rows::Range { start: 0, n }
    }

    pub fn len(&self) -> usize {
        match self {
            Rows::Range { n, .. } => *n,
            Rows::List(rows) => rows.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th row selected.
    pub fn get(&self, i: usize) -> usize {
        match self {
            Rows::Range { start, .. } => start + i,
            Rows::List(rows) => rows[i] as usize,
        }
    }

    /// One past the largest row selected (0 when none is).
    pub fn end(&self) -> usize {
        match self {
            Rows::Range { start, n } => {
                if *n == 0 {
                    0
                } else {
                    start + n
                }
            }
            Rows::List(rows) => rows.iter().max().map_or(0, |&r| r as usize + 1),
        }
    }
}

/// Where a block of columns sits in a row-major buffer: rows `stride` values apart, the
/// block starting at value `col` of each ([`Backend::copy_cols`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cols {
    pub stride: usize,
    pub col: usize,
}

impl Cols {
    pub fn new(stride: usize, col: usize) -> Self {
        Cols { stride, col }
    }

    /// The values a block of `rows` rows of `width` reaches: its end in the buffer.
    pub fn end(self, rows: usize, width: usize) -> usize {
        match rows {
            0 => 0,
            _ => (rows - 1) * self.stride + self.col + width,
        }
    }
}

/// The activation of a gated MLP (`act(gate) * up`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// gpt-oss's clamped SwiGLU: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `g * sigmoid(alpha * g) * (u + 1)`.
    SwigluOai { alpha: f32, limit: f32 },
    /// GELU with the tanh approximation (GeGLU, `gelu_pytorch_tanh`).
    GeluTanh,
    /// `sigmoid(x)`: `glu` then gates `up` by the sigmoid of `gate` (Qwen3-Next's
    /// attention output gate). Never a family's MLP activation.
    Sigmoid,
}

/// An elementwise map of a buffer onto itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    /// `x * factor`.
    Scale(f32),
    /// `cap * tanh(x / cap)`.
    Softcap(f32),
}

/// Rotary embedding frequencies, one per pair of rotated dimensions, already adjusted
/// for any RoPE scaling. `inv_freq.len()` pairs rotate the first `2 * inv_freq.len()`
/// dimensions of each head (all of them, `head_dim / 2` values, unless RoPE is partial);
/// the rest pass through.
#[derive(Clone, Debug)]
pub struct RopeFreqs {
    pub inv_freq: Vec<f32>,
    /// Multiplier on cos and sin (1.0 except for scalings such as YaRN).
    pub attention_factor: f32,
    /// Which dimensions a pair rotates: `i` with `i + n` for `n = inv_freq.len()` (false: the
    /// "NEOX"/rotate-half layout Hugging Face checkpoints use, and GGUF llama once its
    /// Q/K rows are un-permuted), or `2i` with `2i + 1` (true: GGML's "normal" layout).
    pub interleaved: bool,
}

/// What a device op can fail with. None of these is a client's mistake: the server
/// answers 503 and keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Device memory ran out.
    #[error("GPU memory exhausted: {what} needs {bytes} more bytes than the GPU has free ({msg})")]
    OutOfMemory { what: String, bytes: u64, msg: String },
    /// A kernel launch, a copy or a library call failed.
    #[error("GPU {op} failed: {msg}")]
    Device { op: String, msg: String },
    /// A kernel did not compile or load.
    #[error("compiling CUDA kernels: {0}")]
    Compile(String),
}

pub type BackendResult<T> = Result<T, BackendError>;

/// The most likely entries of one row of logits, most likely first (lower id first on
/// ties), and the row's `logsumexp` (so `logit - lse` is a log-probability).
#[derive(Clone, Debug, PartialEq)]
pub struct TopK {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub lse: f32,
}

/// Kernel launches on a GPU, for `bench`'s launch-overhead figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaunchStats {
    /// Launches since the backend started.
    pub launches: u64,
    /// Seconds one empty launch takes from enqueue to completion (measured once).
    pub latency_s: f64,
    /// Small host→device copies the compute stream ordered (positions, row lists, token
    /// ids, norms converted on the host), and the seconds the calling thread spent in
    /// them: from pageable memory the driver may wait for the stream first, which
    /// would keep the host from running ahead of the device.
    pub host_copies: u64,
    pub host_copy_s: f64,
    /// Passes launched as one CUDA graph (`STRATA_CUDA_GRAPHS=on`), each one launch from
    /// the host; of those, the ones replayed (the graph of an earlier pass launched again,
    /// only the kernels whose arguments changed updated in it). A captured pass's kernels
    /// count in `launches`, a replayed one's do not.
    pub graphs: u64,
    pub graph_replays: u64,
}

impl TopK {
    /// No entries (a row with nothing to pick from).
    pub fn empty() -> Self {
        TopK { ids: Vec::new(), logits: Vec::new(), lse: f32::NEG_INFINITY }
    }
}

/// The largest `k` the device top-k supports.
pub const MAX_TOP_K: usize = 256;

/// A buffer's values to and from the host, without the backend at hand: a cache's
/// linear-attention state is saved and put back by code that holds only the cache.
pub trait HostCopy {
    /// Every value of the buffer.
    fn to_host(&self) -> BackendResult<Vec<f32>>;
    /// Overwrites the buffer's first `data.len()` values.
    fn write_host(&mut self, data: &[f32]) -> BackendResult<()>;
}

impl HostCopy for Vec<f32> {
    fn to_host(&self) -> BackendResult<Vec<f32>> {
        Ok(self.clone())
    }

    fn write_host(&mut self, data: &[f32]) -> BackendResult<()> {
        match self.get_mut(..data.len()) {
            Some(dst) => {
                dst.copy_from_slice(data);
                Ok(())
            }
            None => Err(BackendError::Device { op: "write_host".into(), msg: "the buffer is too small".into() }),
        }
    }
}

/// Work a backend may run as one op ([`Backend::fused`]). Each variant says the ops it
/// stands for; a backend that fuses it gives their result bit for bit.
pub enum Fused<'a, B: Backend> {
    /// A gated MLP's gate and up products and its activation: for every row `r` of the
    /// batch (`seq_rows` as in [`Backend::matmul_seqs`]), `out[r] = act(x[r] · gateᵀ) ⊙
    /// (x[r] · upᵀ)`, `gate` and `up` both `(width, k)`: as
    /// [`matmul_seqs_each`](Backend::matmul_seqs_each) of both weights followed by
    /// [`glu`](Backend::glu).
    Glu {
        x: &'a B::Buf,
        seq_rows: &'a [usize],
        gate: &'a B::Weight,
        up: &'a B::Weight,
        act: Activation,
        out: &'a mut B::Buf,
    },
    /// A product added into what `out` holds (a residual stream): `out[r] += x[r] · wᵀ`
    /// for every row of the batch: as [`matmul_seqs`](Backend::matmul_seqs) into a
    /// buffer of its own followed by [`add_rows`](Backend::add_rows) of it.
    MatmulAdd { x: &'a B::Buf, seq_rows: &'a [usize], w: &'a B::Weight, out: &'a mut B::Buf },
    /// One sequence's new rows `row0..row0 + n` rotated and stored: RoPE of `q`'s heads
    /// in place and of `k`'s heads, at positions `at..at + n`, then `k`'s and `v`'s rows
    /// stored into the caches `k_cache` and `v_cache` at rows `at..` as `ty`: as
    /// [`rope`](Backend::rope) of `q` and of `k` followed by [`kv_store`](Backend::kv_store)
    /// of `k` and of `v`. `k`'s own rows may be left rotated or not (the cache holds them).
    RopeStore {
        q: &'a mut B::Buf,
        k: &'a mut B::Buf,
        v: &'a B::Buf,
        row0: usize,
        n: usize,
        at: usize,
        heads: RopeHeads,
        freqs: &'a RopeFreqs,
        k_cache: &'a mut B::Buf,
        v_cache: &'a mut B::Buf,
        ty: KvType,
    },
    /// One row of a sparse FFN over the neuron groups it keeps: for each `(g, up, down)`
    /// in order, `out[..h] += down · (act(gate[g·group..][..group]) ⊙ (up · x))`, where
    /// `gate` holds the row's gate pre-activations and `up` is `(group, k)`, `down` `(h,
    /// group)`: as the group-by-group one-row [`matmul_seqs`](Backend::matmul_seqs),
    /// [`glu`](Backend::glu) and [`add_rows`](Backend::add_rows), added in order.
    SparseGroupsRow {
        x: &'a B::Buf,
        gate: &'a B::Buf,
        groups: &'a [(usize, &'a B::Weight, &'a B::Weight)],
        group: usize,
        act: Activation,
        out: &'a mut B::Buf,
    },
}

/// The heads [`Fused::RopeStore`] rotates: `n_heads` query heads and `n_kv_heads` key
/// (and value) heads of `head_dim` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeHeads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// The operations a forward pass is written against.
pub trait Backend: Send + Sync + 'static {
    /// A row-major f32 activation buffer.
    type Buf: Send + Sync + HostCopy + 'static;
    /// A weight tensor in the backend's own form (any stored dtype).
    type Weight: Send + Sync;

    fn name(&self) -> String;
    /// Bytes of device memory this backend holds (weights, caches, workspaces); 0 on
    /// the CPU.
    fn device_bytes(&self) -> u64;
    /// Bytes of the compute memory still free (RAM on the CPU, VRAM on a GPU), if known.
    fn free_memory(&self) -> Option<u64>;
    /// Device memory bandwidth measured now (bytes read plus bytes written per second
    /// by a device-to-device copy); `None` where the caller measures it another way.
    fn memory_bandwidth(&self) -> Option<f64>;
    /// Kernel launches so far and the cost of one, on backends that launch kernels.
    fn launch_stats(&self) -> Option<LaunchStats>;

    /// A zeroed buffer of `len` f32 values.
    fn alloc(&self, len: usize) -> BackendResult<Self::Buf>;
    /// Copies host values into a new buffer.
    fn upload(&self, data: &[f32]) -> BackendResult<Self::Buf>;
    /// Copies the first `len` values of a buffer back to the host.
    fn download(&self, buf: &Self::Buf, len: usize) -> BackendResult<Vec<f32>>;
    /// Makes a weight usable by the ops (on the CPU a zero-copy view, on a GPU an upload).
    fn weight(&self, t: &HostTensor) -> BackendResult<Self::Weight>;
    /// Whether [`weight`](Self::weight) repacks some stored weights into a form of its
    /// own (the CPU's 16-row panels, `quant::panels`): then the layer streamer repacks
    /// what it reads the same way, in place.
    fn repacks_weights(&self) -> bool {
        false
    }
    /// The weight `w`, which [`weight`](Self::weight) made from `t`, for a second use of
    /// the same tensor (a tied output head). By default made again from `t`; the CPU
    /// shares it (its own copy of a repacked weight is not made twice).
    fn weight_again(&self, w: &Self::Weight, t: &HostTensor) -> BackendResult<Self::Weight> {
        let _ = w;
        self.weight(t)
    }
    /// The `k` most likely entries of each of `rows` rows of `vocab` logits
    /// (`k ≤ MAX_TOP_K`; `k = 1` is the greedy argmax).
    fn top_k(&self, logits: &Self::Buf, rows: usize, vocab: usize, k: usize) -> BackendResult<Vec<TopK>>;

    /// `out[r] = table[ids[r]]` for a table of shape `[vocab, dim]`.
    fn embedding(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf) -> BackendResult<()>;
    /// `out[r, o] = Σ_k x[r, k] · w[o, k]`: `x` is `[rows, in]`, `w` is `[out, in]`,
    /// `out` is `[rows, out]`.
    fn matmul(&self, x: &Self::Buf, rows: usize, w: &Self::Weight, out: &mut Self::Buf) -> BackendResult<()>;
    /// [`matmul`](Self::matmul) over the rows of several sequences in a batch,
    /// `seq_rows[i]` rows each, in order. Each sequence's rows come out as a call with
    /// only them would give, so that what a sequence computes does not depend on what
    /// shares its batch. This default is right for kernels whose per-row result does
    /// not depend on the row count.
    fn matmul_seqs(
        &self,
        x: &Self::Buf,
        seq_rows: &[usize],
        w: &Self::Weight,
        out: &mut Self::Buf,
    ) -> BackendResult<()> {
        self.matmul(x, seq_rows.iter().sum(), w, out)
    }
    /// [`matmul_seqs`](Self::matmul_seqs) of one `x` through several weights, each into
    /// its own output: a layer's q, k and v, or its gate and up. The CPU runs a batch of
    /// one-row sequences as one parallel op.
    fn matmul_seqs_each(
        &self,
        x: &Self::Buf,
        seq_rows: &[usize],
        each: &mut [(&Self::Weight, &mut Self::Buf)],
    ) -> BackendResult<()> {
        each.iter_mut().try_for_each(|(w, out)| self.matmul_seqs(x, seq_rows, w, out))
    }
    /// Whether a row of [`matmul`](Self::matmul) comes out differently with the row
    /// count (the CUDA backend's prompt chunks take the GEMM, shorter ones the
    /// matrix-vector kernel): then a prompt cut into other chunks computes other values,
    /// and a reused prefix must end where a fresh prompt's chunks would
    /// (the decoder's `KvCache::grid_rows`).
    fn chunking_changes_rows(&self) -> bool {
        false
    }
    /// `x[r] += bias` for each of `rows` rows of `bias.len()` values.
    fn add_bias(&self, x: &mut Self::Buf, rows: usize, bias: &Self::Weight) -> BackendResult<()>;
    /// RMS norm of each `w.len()`-wide row of `x` (`rows` rows), scaled by `w`, into `out`.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    ) -> BackendResult<()>;
    /// Rotates `n_heads` heads of `head_dim` in each of `positions.len()` rows of `x`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        n_heads: usize,
        head_dim: usize,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> BackendResult<()>;
    /// Writes the `rows` of `src` (each `width` values) into the KV cache buffer `dst` at
    /// rows `at..`, stored as `ty` (each row [`KvType::row_len`] buffer values). This
    /// default stores f32 only; a backend that stores more says so in
    /// [`kv_types`](Self::kv_types).
    fn kv_store(
        &self,
        src: &Self::Buf,
        rows: Rows<'_>,
        width: usize,
        dst: &mut Self::Buf,
        at: usize,
        ty: KvType,
    ) -> BackendResult<()> {
        match ty {
            KvType::F32 => self.copy_rows(src, rows, width, dst, at),
            other => Err(BackendError::Device {
                op: "storing the KV cache".into(),
                msg: format!("{} KV caches are not supported on this device", other.name()),
            }),
        }
    }
    /// The KV cache types [`kv_store`](Self::kv_store) and `attention` handle.
    fn kv_types(&self) -> &'static [KvType] {
        &[KvType::F32]
    }
    /// Copies the `rows` of `src` (each `row_len` values), in their order, into `dst` at
    /// rows `dst_row..` (a listed selection gathers: the rows a MoE expert was routed).
    fn copy_rows(
        &self,
        src: &Self::Buf,
        rows: Rows<'_>,
        row_len: usize,
        dst: &mut Self::Buf,
        dst_row: usize,
    ) -> BackendResult<()>;
    /// Copies `width` values of each of `rows` rows: row `r`'s values from
    /// `src[r * from.stride + from.col..]` to `dst[r * to.stride + to.col..]` (one
    /// head's part of a row of heads, gathered into a buffer of its own or put back).
    fn copy_cols(
        &self,
        src: &Self::Buf,
        from: Cols,
        dst: &mut Self::Buf,
        to: Cols,
        rows: usize,
        width: usize,
    ) -> BackendResult<()>;
    /// Causal attention of query rows `row0..row0 + rows` of `q` (`n_heads * head_dim`
    /// wide) over cached keys and values (`n_kv_heads * head_dim` wide, already holding
    /// the new rows) into the same rows of `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf,
        row0: usize,
        rows: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        p: &AttnParams,
        out: &mut Self::Buf,
    ) -> BackendResult<()>;
    /// The gated delta rule over one sequence's rows ([`delta`]): the gated, normalized
    /// mixer output of rows `d.row0..d.row0 + d.n` into the same rows of `out`
    /// (`value_dim` wide); `state` (`d.shape.state_len()` floats) carries over.
    fn delta_rule(
        &self,
        d: &delta::DeltaRule<'_, Self::Buf>,
        state: &mut Self::Buf,
        out: &mut Self::Buf,
    ) -> BackendResult<()>;
    /// `gate = act(gate) * up`, elementwise over `len` values.
    fn glu(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize, act: Activation) -> BackendResult<()>;
    /// Runs `op`, several ops' work, as one where this backend fuses it (fewer launches
    /// and memory passes), with the same bits as the ops it replaces ([`Fused`] says
    /// which, variant by variant), so nothing downstream changes. `None` when this
    /// backend does not fuse it (or these weights, or these rows): `op` is then as it
    /// was, and the caller runs the ops it stands for.
    fn fused(&self, op: &mut Fused<'_, Self>) -> Option<BackendResult<()>>
    where
        Self: Sized,
    {
        let _ = op;
        None
    }
    /// `x = op(x)`, elementwise over `len` values.
    fn unary(&self, x: &mut Self::Buf, len: usize, op: Unary) -> BackendResult<()>;
    /// Adds row `i` of `y` (each `row_len` values), times `weights[i]` when given, to the
    /// `i`-th of the `rows` of `x`: a residual add over `Rows::Range`, or a MoE expert's
    /// output scattered back to its tokens with their routing weights.
    fn add_rows(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        row_len: usize,
        rows: Rows<'_>,
        weights: Option<&[f32]>,
    ) -> BackendResult<()>;

    /// Runs `work`, a forward pass's device work that waits for nothing on the host (no
    /// [`download`](Self::download) or [`top_k`](Self::top_k), no streamed weights, no
    /// routing read back), as one submission where this backend has such a thing: CUDA
    /// with `STRATA_CUDA_GRAPHS=on` captures it into a graph and launches that, the passes
    /// of one `shape` updating one executable graph. `work` may run twice (a capture the
    /// driver refuses runs again as it is), so it must do the same each time. By default
    /// it runs once, here.
    fn graphed<E: From<BackendError>>(&self, shape: u64, work: &mut dyn FnMut() -> Result<(), E>) -> Result<(), E>
    where
        Self: Sized,
    {
        let _ = shape;
        work()
    }

    /// Runs `f`, a whole forward pass, where the backend's ops dispatch their work
    /// cheapest. The CPU runs it inside its thread pool, so that each op's parallel work
    /// starts in place rather than being handed to the pool while the caller sleeps (a
    /// wake-up and a sleep per op). Elsewhere `f` runs here.
    fn on_workers<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R
    where
        Self: Sized,
    {
        f()
    }
}
