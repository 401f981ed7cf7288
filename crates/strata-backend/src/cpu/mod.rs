//! The CPU backend: multithreaded, SIMD where it matters (detected at run time).

pub mod bandwidth;
mod kv;
pub mod matmul;

use super::delta::{self, DeltaRule, DeltaWeights};
use super::{Activation, AttnParams, Backend, BackendError, BackendResult, Cols, KvType, RopeFreqs, Rows, TopK, Unary};
use strata_quant::ReadF32;
use strata_tensor::team;
use strata_tensor::tensor::HostTensor;

pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
    /// Every matmul row through the prefill (packed GEMM) path, whatever the row count
    /// ([`CpuBackend::row_invariant`]).
    row_invariant: bool,
}

/// The cached keys or values attention reads: f32 rows, or f16 rows as they are stored.
#[derive(Clone, Copy)]
enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
}

/// The worker threads a CPU backend asked for `threads` runs: one per core this process
/// may use for 0, and never more. A forward pass's threads meet at every op and spin
/// between them, so a thread without a core holds up the rest for a scheduler slice each
/// time (SmolLM2 on 2 cores decoded at 233 tok/s with 2 threads and 5.3 with 3).
pub fn threads_for(threads: usize) -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if threads == 0 || threads > cores { cores } else { threads }
}

impl CpuBackend {
    /// A backend with [`threads_for`]`(threads)` worker threads; asking for more than
    /// there are cores says so once, in a warning.
    pub fn new(asked: usize) -> Self {
        let threads = threads_for(asked);
        if asked > threads {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    threads = asked,
                    cores = threads,
                    "more threads asked for than this process has cores: using one per core (a thread without a \
                     core stalls the others at every op)"
                )
            });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("strata-cpu-{i}"))
            .build()
            .expect("building a thread pool");
        CpuBackend { pool, threads, row_invariant: false }
    }

    /// Computes every matmul row as the prefill path does, whatever the call's row count:
    /// a decode step gets what the same token gets inside a prompt, and any prompt
    /// chunking gives the same numbers. For models with a recurrent state (the gated
    /// delta rule), where the decode kernel's other rounding would otherwise accumulate
    /// (1e-4 in log-probs over 700 tokens on the hybrid fixtures). Costs decode speed: 3%
    /// on Q4_1 weights, 20% on F32 (SmolLM2, docs/benchmarks.md).
    pub fn row_invariant(mut self) -> Self {
        self.row_invariant = true;
        self
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` over matching chunks of `x` and `y` (equal lengths), in parallel when the
    /// vectors are long enough to be worth splitting (from 1024 values, so that a decode
    /// step's GLU goes to the team). Each element sees the same arithmetic whichever way
    /// it runs.
    /// `gate[i] = act(gate[i]) · up[i]`.
    fn glu_slices(&self, gate: &mut [f32], up: &[f32], act: Activation) {
        let f = |(g, u): (&mut [f32], &[f32])| match act {
            Activation::Silu => matmul::silu_mul(g, u),
            Activation::SwigluOai { alpha, limit } => g.iter_mut().zip(u).for_each(|(g, &u)| {
                let x = g.min(limit);
                *g = x / (1.0 + (-alpha * x).exp()) * (u.clamp(-limit, limit) + 1.0)
            }),
            Activation::GeluTanh => g.iter_mut().zip(u).for_each(|(g, &u)| *g = gelu_tanh(*g) * u),
            Activation::Sigmoid => g.iter_mut().zip(u).for_each(|(g, &u)| *g = u / (1.0 + (-*g).exp())),
        };
        self.elementwise(gate, up, f);
    }

    fn elementwise(&self, x: &mut [f32], y: &[f32], f: impl Fn((&mut [f32], &[f32])) + Sync + Send) {
        const CHUNK: usize = 1 << 10;
        if self.threads > 1 && x.len() > CHUNK {
            team::for_each_chunk_mut(&self.pool, x, CHUNK, |i, x| {
                let n = x.len();
                f((x, &y[i * CHUNK..][..n]))
            });
        } else {
            f((x, y));
        }
    }
}

/// `x`'s softmax with one more logit, `sink`, in the denominator and not in the result:
/// the weights sum to less than 1 by the sink's share (gpt-oss's attention sinks).
fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let m = x.iter().copied().fold(sink, f32::max);
    let mut sum = (sink - m).exp();
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Weight = HostTensor;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads)
    }

    fn device_bytes(&self) -> u64 {
        0
    }

    fn free_memory(&self) -> Option<u64> {
        super::device::available_memory()
    }

    fn memory_bandwidth(&self) -> Option<f64> {
        None
    }
    fn launch_stats(&self) -> Option<crate::LaunchStats> {
        None
    }

    fn alloc(&self, len: usize) -> BackendResult<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn upload(&self, data: &[f32]) -> BackendResult<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn download(&self, buf: &Vec<f32>, len: usize) -> BackendResult<Vec<f32>> {
        Ok(buf[..len].to_vec())
    }

    /// A view of `t`, or for the weights that have them on this CPU a copy as 16-row
    /// panels (`quant::panels`), which decode reads at about twice the rate, repacked on
    /// the backend's threads.
    fn weight(&self, t: &HostTensor) -> BackendResult<HostTensor> {
        Ok(self.pool.install(|| strata_quant::panels::to_panels(t)).unwrap_or_else(|| t.clone()))
    }

    fn repacks_weights(&self) -> bool {
        true
    }

    fn weight_again(&self, w: &HostTensor, _t: &HostTensor) -> BackendResult<HostTensor> {
        Ok(w.clone())
    }

    fn top_k(&self, logits: &Vec<f32>, rows: usize, vocab: usize, k: usize) -> BackendResult<Vec<TopK>> {
        Ok(logits.chunks_exact(vocab).take(rows).map(|row| top_k_row_on(&self.pool, row, k)).collect())
    }

    fn embedding(&self, table: &HostTensor, ids: &[u32], out: &mut Vec<f32>) -> BackendResult<()> {
        let dim = table.shape[1];
        for (row, &id) in out.chunks_exact_mut(dim).zip(ids) {
            table.read_f32(id as usize * dim, row);
        }
        Ok(())
    }

    fn on_workers<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        team::lead(&self.pool, f)
    }

    fn matmul(&self, x: &Vec<f32>, rows: usize, w: &HostTensor, out: &mut Vec<f32>) -> BackendResult<()> {
        let how = if self.row_invariant { matmul::Rows::Gemm } else { matmul::Rows::ByCount };
        matmul::matmul_as(how, &self.pool, x, rows, w, out);
        Ok(())
    }

    /// Which kernel computes a row depends on the row count (one row: the decode
    /// kernel; a few: the streaming path; many: the GEMM), so the path is chosen per
    /// sequence instead: a one-row sequence's row (a decode step) takes the one-row
    /// kernel, and the rows of a longer sequence (a prompt chunk) the packed GEMM path,
    /// whatever the chunk's length, and whatever shares the call. The leading one-row
    /// sequences run together, reading the weights once for all of them; the rest share
    /// one GEMM, whose rows do not depend on each other.
    fn matmul_seqs(&self, x: &Vec<f32>, seq_rows: &[usize], w: &HostTensor, out: &mut Vec<f32>) -> BackendResult<()> {
        let (m, k) = (w.shape[0], w.shape[1]);
        let rows: usize = seq_rows.iter().sum();
        if rows == 0 || m == 0 || k == 0 || self.row_invariant {
            // Row-invariant: every row comes out alike whatever shares the call.
            return self.matmul(x, rows, w, out);
        }
        assert!(x.len() >= rows * k && out.len() >= rows * m, "matmul_seqs: buffers shorter than {rows} rows");
        // Runs of one-row sequences, and runs of longer ones (one of each in a batch).
        let mut at = 0;
        for run in seq_rows.chunk_by(|a, b| (*a == 1) == (*b == 1)) {
            let n: usize = run.iter().sum();
            let (x, out) = (&x[at * k..(at + n) * k], &mut out[at * m..(at + n) * m]);
            let how = match (run[0] == 1, w.dtype.is_float()) {
                (true, _) => matmul::Rows::Alone,
                // A quantized prompt chunk takes the GEMM from two rows (`ByCount`); a
                // float one the packed path whatever its length.
                (false, false) => matmul::Rows::ByCount,
                (false, true) => matmul::Rows::Gemm,
            };
            matmul::matmul_as(how, &self.pool, x, n, w, out);
            at += n;
        }
        Ok(())
    }

    fn matmul_seqs_each(
        &self,
        x: &Vec<f32>,
        seq_rows: &[usize],
        each: &mut [(&HostTensor, &mut Vec<f32>)],
    ) -> BackendResult<()> {
        let rows = seq_rows.len();
        let fused = !self.row_invariant
            && seq_rows.iter().all(|&n| n == 1)
            && each.iter().all(|(w, out)| !w.dtype.is_float() && out.len() >= rows * w.shape[0] && w.shape[1] > 0);
        if !fused || rows == 0 {
            return each.iter_mut().try_for_each(|(w, out)| self.matmul_seqs(x, seq_rows, w, out));
        }
        let k = each[0].0.shape[1];
        assert!(
            x.len() >= rows * k && each.iter().all(|(w, _)| w.shape[1] == k),
            "matmul_seqs_each: weights of other widths, or x shorter than {rows} rows"
        );
        let mut each: Vec<(&HostTensor, &mut [f32])> = each.iter_mut().map(|(w, out)| (*w, &mut out[..])).collect();
        matmul::matmul_many_rows_alone(&self.pool, &x[..rows * k], rows, &mut each);
        Ok(())
    }

    fn add_bias(&self, x: &mut Vec<f32>, rows: usize, bias: &HostTensor) -> BackendResult<()> {
        let b = bias.to_f32_vec();
        for row in x.chunks_exact_mut(b.len()).take(rows) {
            row.iter_mut().zip(&b).for_each(|(v, b)| *v += b);
        }
        Ok(())
    }

    fn rms_norm(&self, x: &Vec<f32>, rows: usize, w: &HostTensor, eps: f32, out: &mut Vec<f32>) -> BackendResult<()> {
        let w = w.to_f32_vec();
        let dim = w.len();
        let norm = |(src, dst): (&[f32], &mut [f32])| {
            let mean_sq = src.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / dim as f64;
            let inv = 1.0 / ((mean_sq as f32) + eps).sqrt();
            for ((d, &s), &g) in dst.iter_mut().zip(src).zip(&w) {
                *d = g * (s * inv);
            }
        };
        let (src, dst) = (&x[..rows * dim], &mut out[..rows * dim]);
        if rows >= 64 {
            team::for_each_chunk_mut(&self.pool, dst, dim, |i, d| norm((&src[i * dim..][..dim], d)));
        } else {
            src.chunks_exact(dim).zip(dst.chunks_exact_mut(dim)).for_each(norm);
        }
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        n_heads: usize,
        head_dim: usize,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> BackendResult<()> {
        // Partial RoPE rotates the first `2 * half` dimensions of each head.
        let half = freqs.inv_freq.len().min(head_dim / 2);
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        for (row, &pos) in x.chunks_exact_mut(n_heads * head_dim).zip(positions) {
            for (i, &f) in freqs.inv_freq[..half].iter().enumerate() {
                let angle = pos as f32 * f;
                cos[i] = angle.cos() * freqs.attention_factor;
                sin[i] = angle.sin() * freqs.attention_factor;
            }
            for head in row.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let (i0, i1) = if freqs.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (x0, x1) = (head[i0], head[i1]);
                    head[i0] = x0 * cos[i] - x1 * sin[i];
                    head[i1] = x1 * cos[i] + x0 * sin[i];
                }
            }
        }
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &Vec<f32>,
        rows: Rows<'_>,
        row_len: usize,
        dst: &mut Vec<f32>,
        dst_row: usize,
    ) -> BackendResult<()> {
        match rows {
            Rows::Range { start, n } => {
                let len = n * row_len;
                dst[dst_row * row_len..][..len].copy_from_slice(&src[start * row_len..][..len]);
            }
            Rows::List(list) => {
                let out = dst[dst_row * row_len..][..list.len() * row_len].chunks_exact_mut(row_len.max(1));
                for (o, &r) in out.zip(list) {
                    o.copy_from_slice(&src[r as usize * row_len..][..row_len]);
                }
            }
        }
        Ok(())
    }

    fn copy_cols(
        &self,
        src: &Vec<f32>,
        from: Cols,
        dst: &mut Vec<f32>,
        to: Cols,
        rows: usize,
        width: usize,
    ) -> BackendResult<()> {
        if from.end(rows, width) > src.len() || to.end(rows, width) > dst.len() {
            return Err(BackendError::Device {
                op: "copy_cols".into(),
                msg: format!(
                    "{rows} rows of {width} at {from:?} -> {to:?} reach past buffers of {} and {} values",
                    src.len(),
                    dst.len()
                ),
            });
        }
        for r in 0..rows {
            let s = &src[r * from.stride + from.col..][..width];
            dst[r * to.stride + to.col..][..width].copy_from_slice(s);
        }
        Ok(())
    }

    fn kv_store(
        &self,
        src: &Vec<f32>,
        rows: Rows<'_>,
        width: usize,
        dst: &mut Vec<f32>,
        at: usize,
        ty: KvType,
    ) -> BackendResult<()> {
        if ty == KvType::F32 {
            return self.copy_rows(src, rows, width, dst, at);
        }
        let row_len = ty.row_len(width);
        for i in 0..rows.len() {
            let from = &src[rows.get(i) * width..][..width];
            kv::encode(ty, from, &mut dst[(at + i) * row_len..][..row_len]);
        }
        Ok(())
    }

    fn kv_types(&self) -> &'static [KvType] {
        &[KvType::F32, KvType::F16, KvType::Q8_0]
    }

    fn attention(
        &self,
        q: &Vec<f32>,
        row0: usize,
        rows: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        p: &AttnParams,
        out: &mut Vec<f32>,
    ) -> BackendResult<()> {
        let hd = p.head_dim;
        let (q_width, kv_width) = (p.n_heads * hd, p.n_kv_heads * hd);
        if p.kv == KvType::Q8_0 {
            // A Q8_0 cache is decoded once per call, the positions the rows see.
            let (len, row_len) = (p.start_pos + rows, p.kv.row_len(kv_width));
            let decode = |c: &[f32]| {
                let mut out = vec![0.0f32; len * kv_width];
                let one = |j: usize, o: &mut [f32]| kv::decode(p.kv, &c[j * row_len..][..row_len], 0, o);
                match len * kv_width >= 1 << 16 {
                    true => team::for_each_chunk_mut(&self.pool, &mut out, kv_width, one),
                    false => out.chunks_exact_mut(kv_width).enumerate().for_each(|(j, o)| one(j, o)),
                }
                out
            };
            let (k, v) = (decode(k), decode(v));
            return self.attention(q, row0, rows, &k, &v, &AttnParams { kv: KvType::F32, ..*p }, out);
        }
        // F32 rows, or f16 rows read as they are (widened in registers: the same bits).
        let (k, v, stride) = match p.kv {
            KvType::F16 => (KvRows::F16(kv::as_u16_ref(k)), KvRows::F16(kv::as_u16_ref(v)), 2 * p.kv.row_len(kv_width)),
            _ => (KvRows::F32(k), KvRows::F32(v), kv_width),
        };
        let group = p.n_heads / p.n_kv_heads;
        // Query heads a task takes, all reading their KV head's keys and values once: the
        // most of a group (a divisor of it) that still gives every thread a task. How the
        // heads are grouped changes no result: each head gets the bits it gets alone.
        let threads = self.pool.current_num_threads();
        let per = (1..=group).rev().find(|&s| group.is_multiple_of(s) && rows * p.n_heads / s >= threads).unwrap_or(1);
        let q = &q[row0 * q_width..(row0 + rows) * q_width];
        let out = &mut out[row0 * q_width..(row0 + rows) * q_width];
        // One task per (query row, `per` heads of one KV head): `per · head_dim` contiguous
        // output values.
        let task = |scores: &mut Vec<f32>, i: usize, o: &mut [f32]| {
            let (r, h) = (i * per / p.n_heads, i * per % p.n_heads);
            let pos = p.start_pos + r;
            let first = match p.sliding_window {
                Some(w) if w > 0 => (pos + 1).saturating_sub(w),
                _ => 0,
            };
            let qh = &q[r * q_width + h * hd..][..per * hd];
            let kv_off = (h / group) * hd;
            let n = pos + 1 - first;
            scores.clear();
            scores.resize(per * n, 0.0);
            let at = first * stride + kv_off;
            match k {
                KvRows::F32(k) => matmul::scores(qh, hd, &k[at..], stride, p.scale, scores),
                KvRows::F16(k) => matmul::scores_f16(qh, hd, &k[at..], stride, p.scale, scores),
            }
            for (j, scores) in scores.chunks_exact_mut(n).enumerate() {
                if let Some(cap) = p.softcap {
                    scores.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
                }
                match p.sinks {
                    Some(sinks) => softmax_with_sink(scores, sinks[h + j]),
                    None => matmul::softmax(scores),
                }
            }
            o.fill(0.0);
            match v {
                KvRows::F32(v) => matmul::weighted_sum(scores, &v[at..], stride, o, hd),
                KvRows::F16(v) => matmul::weighted_sum_f16(scores, &v[at..], stride, o, hd),
            }
        };
        if rows * p.n_heads > per {
            // Each thread keeps one scores buffer across tasks, heads and layers.
            thread_local! {
                static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            team::for_each_chunk_mut(&self.pool, out, per * hd, |i, o| {
                SCORES.with(|cell| match cell.try_borrow_mut() {
                    Ok(mut scores) => task(&mut scores, i, o),
                    Err(_) => task(&mut Vec::new(), i, o),
                })
            });
        } else {
            let mut scores = Vec::new();
            out.chunks_exact_mut(per * hd).enumerate().for_each(|(i, o)| task(&mut scores, i, o));
        }
        Ok(())
    }

    fn delta_rule(&self, d: &DeltaRule<'_, Vec<f32>>, state: &mut Vec<f32>, out: &mut Vec<f32>) -> BackendResult<()> {
        let sh = &d.shape;
        let (qw, bw, vw) = (sh.qkvz_len(), 2 * sh.n_v_heads, sh.value_dim());
        let (r0, r1) = (d.row0, d.row0 + d.n);
        let short = || BackendError::Device { op: "delta_rule".into(), msg: "a buffer is too small".into() };
        let w = &d.weights;
        let small = DeltaWeights { conv: &w.conv[..], neg_a: &w.neg_a[..], dt_bias: &w.dt_bias[..], norm: &w.norm[..] };
        let qkvz = d.qkvz.get(r0 * qw..r1 * qw).ok_or_else(short)?;
        let ba = d.ba.get(r0 * bw..r1 * bw).ok_or_else(short)?;
        let state = state.get_mut(..sh.state_len()).ok_or_else(short)?;
        let out = out.get_mut(r0 * vw..r1 * vw).ok_or_else(short)?;
        delta::mix(sh, &small, qkvz, ba, state, out);
        Ok(())
    }

    fn glu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize, act: Activation) -> BackendResult<()> {
        self.glu_slices(&mut gate[..len], &up[..len], act);
        Ok(())
    }

    fn fused(&self, op: &mut crate::Fused<'_, Self>) -> Option<BackendResult<()>> {
        match op {
            crate::Fused::SparseGroupsRow { x, gate, groups, group, act, out } => {
                self.sparse_groups_row(x, gate, groups, *group, *act, out)
            }
            _ => None,
        }
    }

    fn unary(&self, x: &mut Vec<f32>, len: usize, op: Unary) -> BackendResult<()> {
        for v in &mut x[..len] {
            *v = match op {
                Unary::Scale(f) => *v * f,
                Unary::Softcap(cap) => cap * (*v / cap).tanh(),
            };
        }
        Ok(())
    }

    fn add_rows(
        &self,
        x: &mut Vec<f32>,
        y: &Vec<f32>,
        row_len: usize,
        rows: Rows<'_>,
        weights: Option<&[f32]>,
    ) -> BackendResult<()> {
        match (rows, weights) {
            (Rows::Range { start, n }, None) => {
                let len = n * row_len;
                let add = |(a, b): (&mut [f32], &[f32])| a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                self.elementwise(&mut x[start * row_len..][..len], &y[..len], add);
            }
            _ => {
                for i in 0..rows.len() {
                    let w = weights.map_or(1.0, |w| w[i]);
                    let dst = &mut x[rows.get(i) * row_len..][..row_len];
                    dst.iter_mut().zip(&y[i * row_len..][..row_len]).for_each(|(a, b)| *a += w * b);
                }
            }
        }
        Ok(())
    }
}

/// GELU with the tanh approximation, as PyTorch's `gelu(x, approximate="tanh")`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// The `k` largest logits of a row, largest first (lower id first on ties, NaN never
/// chosen), and the row's `logsumexp` computed in f64.
pub fn top_k_row(row: &[f32], k: usize) -> TopK {
    top_k_merge(row.chunks(TOP_K_PART).enumerate().map(|(i, part)| top_k_part(part, i * TOP_K_PART, k)), k)
}

/// [`top_k_row`] with the row's parts scanned in parallel: the same result.
fn top_k_row_on(pool: &rayon::ThreadPool, row: &[f32], k: usize) -> TopK {
    let mut parts: Vec<Option<TopKPart>> = (0..row.len().div_ceil(TOP_K_PART)).map(|_| None).collect();
    team::for_each_chunk_mut(pool, &mut parts, 1, |i, slot| {
        let first = i * TOP_K_PART;
        slot[0] = Some(top_k_part(&row[first..(first + TOP_K_PART).min(row.len())], first, k));
    });
    top_k_merge(parts.into_iter().flatten(), k)
}

/// Logits per part of a row that [`top_k_row`] scans as a unit, and may scan beside the
/// others; the parts are fixed, so the result does not depend on how they are spread.
const TOP_K_PART: usize = 1 << 13;

/// A part of a row, scanned: its `k` best (logit, id), largest first, its largest logit
/// and `Σ exp(logit − max)` over it (0 where the max is not finite).
struct TopKPart {
    best: Vec<(f32, u32)>,
    max: f32,
    sum: f64,
}

/// Scans `part`, the logits from id `first` on.
fn top_k_part(part: &[f32], first: usize, k: usize) -> TopKPart {
    // (logit, id) kept sorted descending; a part is scanned once. Once `k` are kept, a
    // run of 16 logits none of which beats the k-th is passed over in one test.
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    let consider = |best: &mut Vec<(f32, u32)>, i: usize, l: f32| {
        if l.is_nan() || (best.len() == k && l <= best[k - 1].0) {
            return;
        }
        let at = best.partition_point(|&(b, _)| b >= l);
        best.insert(at, (l, (first + i) as u32));
        best.truncate(k);
    };
    let mut i = 0;
    while k > 0 && i < part.len() {
        let run = &part[i..(i + 16).min(part.len())];
        if best.len() < k || run.iter().fold(false, |any, &l| any | (l > best[k - 1].0)) {
            for (j, &l) in run.iter().enumerate() {
                consider(&mut best, i + j, l);
            }
        }
        i += run.len();
    }
    let (max, sum) = matmul::max_exp_sum(part);
    TopKPart { best, max, sum }
}

/// A row's [`TopK`] from its parts, in order.
fn top_k_merge(parts: impl Iterator<Item = TopKPart>, k: usize) -> TopK {
    let parts: Vec<TopKPart> = parts.collect();
    let max = parts.iter().map(|p| p.max).fold(f32::NEG_INFINITY, f32::max);
    let lse = if max.is_finite() {
        let scaled = parts.iter().filter(|p| p.max.is_finite());
        let sum: f64 = scaled.map(|p| p.sum * (p.max as f64 - max as f64).exp()).sum();
        (max as f64 + sum.ln()) as f32
    } else {
        max
    };
    // A stable sort: equal logits keep their parts' order, so the lower id comes first.
    let mut best: Vec<(f32, u32)> = parts.into_iter().flat_map(|p| p.best).collect();
    best.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    best.truncate(k);
    TopK { ids: best.iter().map(|b| b.1).collect(), logits: best.iter().map(|b| b.0).collect(), lse }
}

impl CpuBackend {
    /// Every kept group's `up` in one parallel op, then every group's `down` in another,
    /// then the sums in group order: two meetings of the threads for the row instead of
    /// two per group. Quantized weights only (their one-row products can share an op
    /// bit for bit), and not when row-invariant.
    fn sparse_groups_row(
        &self,
        x: &Vec<f32>,
        gate: &Vec<f32>,
        groups: &[(usize, &HostTensor, &HostTensor)],
        group: usize,
        act: Activation,
        out: &mut Vec<f32>,
    ) -> Option<BackendResult<()>> {
        let &(_, first_up, first_down) = groups.first()?;
        let (k, h) = (first_up.shape.get(1).copied()?, first_down.shape.first().copied()?);
        let fits = |&(g, up, down): &(usize, &HostTensor, &HostTensor)| {
            !up.dtype.is_float()
                && !down.dtype.is_float()
                && up.shape[..] == [group, k]
                && down.shape[..] == [h, group]
                && (g + 1) * group <= gate.len()
        };
        if self.row_invariant || group == 0 || x.len() < k || out.len() < h || !groups.iter().all(fits) {
            return None;
        }
        let n = groups.len();
        let (mut ups, mut acts, mut ys) = (vec![0f32; n * group], vec![0f32; n * group], vec![0f32; n * h]);
        let mut each: Vec<(&[f32], &HostTensor, &mut [f32])> =
            groups.iter().zip(ups.chunks_exact_mut(group)).map(|(&(_, up, _), o)| (&x[..k], up, o)).collect();
        matmul::matmul_many_inputs_rows_alone(&self.pool, 1, &mut each);
        for (a, &(g, _, _)) in acts.chunks_exact_mut(group).zip(groups) {
            a.copy_from_slice(&gate[g * group..][..group]);
        }
        self.glu_slices(&mut acts, &ups, act);
        let mut each: Vec<(&[f32], &HostTensor, &mut [f32])> = groups
            .iter()
            .zip(acts.chunks_exact(group))
            .zip(ys.chunks_exact_mut(h))
            .map(|((&(_, _, down), a), o)| (a, down, o))
            .collect();
        matmul::matmul_many_inputs_rows_alone(&self.pool, 1, &mut each);
        let add = |(a, b): (&mut [f32], &[f32])| a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        for y in ys.chunks_exact(h) {
            self.elementwise(&mut out[..h], y, add);
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests;
