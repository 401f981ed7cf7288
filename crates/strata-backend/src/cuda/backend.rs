//! The CUDA backend: one context and one stream per device, kernels from `kernels/`
//! compiled by NVRTC at first use (cached on disk), cuBLAS for prefill GEMMs.
//!
//! Every op is enqueued on the one compute stream, so ops are ordered among themselves;
//! only `download` and `top_k` wait for the stream. Activation buffers come from the
//! model's workspace (allocated once, reused every token); the small per-call inputs
//! (token ids, positions, RoPE frequencies) and the kernels' own scratch live in
//! [`Scratch`], grown when a call needs more and otherwise reused, so a decode step
//! allocates nothing on the device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, sys};

use super::copy::{CudaCopy, CudaPin};
use super::launch::{self, Shape};
use super::memory::{Tracked, dev_err};
use crate::delta::DeltaRule;
use crate::stage::{SlotHold, Stage, TransferStats, Uploader};
use crate::{
    Activation, AttnParams, Backend, BackendError, BackendResult, Cols, HostCopy, KvType, MAX_TOP_K, RopeFreqs, Rows,
    TopK, Unary,
};
use strata_quant::ReadF32;
use strata_tensor::aligned::HostPin;
use strata_tensor::tensor::{DType, HostTensor};

mod attend;
mod enqueue;
mod graph;
mod init;
mod products;
mod repack;
mod rows;
mod tape;

use tape::{Kernel, Step};

/// An f32 activation buffer in device memory.
pub struct CudaBuf {
    data: CudaSlice<f32>,
    _tracked: Tracked,
}

/// A weight in device memory, in its stored format (`[out, in]` rows of blocks), or in
/// f32 for 1-D tensors (norm weights and biases, which the kernels read as f32), or in
/// the packed layout ([`Layout`] says which kernels read it).
pub struct CudaWeight {
    mem: WeightMem,
    dtype: DType,
    shape: Vec<usize>,
    layout: Layout,
}

/// Which kernels read a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// The stored layout, read by the stored-layout kernels (`matvec_FMT` or
    /// `matvec_wide_FMT`, `dequant_FMT_f16`, `embed_FMT`).
    Stored,
    /// A tensor of a block format repacked (`super::packed`; the formats of
    /// `launch::PACKED_FORMATS`): every reader a packed kernel (`matvec_packed_FMT` and
    /// its fused kernels, `dequant_packed_FMT_f16`, `embed_packed_FMT`) through
    /// [`CudaWeight::packed_ptrs`].
    Repacked,
    /// An F32/F16/BF16 tensor in the stored layout with 16-byte aligned rows
    /// (`launch::Matvec::reads_in_place`): the decode products take `matvec_packed_FMT`
    /// and its fused kernels, every other reader (the GEMM's dequantisation, embeddings)
    /// its stored-layout kernel.
    InPlace,
}

/// Where a weight's bytes are on the device.
enum WeightMem {
    /// Its own allocation (resident weights, and units uploaded without the pipeline).
    Owned { data: CudaSlice<u8>, _tracked: Tracked },
    /// `offset..` of a streaming slot the upload pipeline filled; the slot returns to its
    /// ring when the last weight viewing it drops.
    Slot { hold: Arc<SlotHold<CudaCopy>>, offset: usize },
}

impl CudaWeight {
    /// The device address of byte `offset` of the weight.
    fn ptr(&self, stream: &Arc<CudaStream>, offset: usize) -> u64 {
        match &self.mem {
            WeightMem::Owned { data, .. } => ptr(data, stream, offset),
            WeightMem::Slot { hold, offset: at } => hold.slot().ptr(stream, at + offset),
        }
    }

    /// Its format, shape and layout, as the choice of a kernel sees them.
    fn kind(&self) -> launch::WeightKind<'_> {
        launch::WeightKind { dtype: self.dtype, shape: &self.shape, packed: self.layout != Layout::Stored }
    }

    /// Repacked: the GEMM's and embeddings' readers are the packed ones.
    fn repacked(&self) -> bool {
        self.layout == Layout::Repacked
    }

    /// The `(q, d)` arguments of the packed matvecs for a weight they read (`kind().packed`):
    /// a repacked weight's quants and scales, an element weight's bytes and null.
    fn matvec_ptrs(&self, stream: &Arc<CudaStream>) -> (u64, u64) {
        match self.layout {
            Layout::Repacked => self.packed_ptrs(stream, 0),
            Layout::Stored | Layout::InPlace => (self.ptr(stream, 0), 0),
        }
    }

    /// A packed weight's device addresses of the quants and the scale of row `o0`'s
    /// first block.
    fn packed_ptrs(&self, stream: &Arc<CudaStream>, o0: usize) -> (u64, u64) {
        let nblk = self.shape[1] / self.dtype.block_size();
        let (q, d) = super::packed::row_offsets(self.dtype, self.shape[0], nblk, o0);
        (self.ptr(stream, q), self.ptr(stream, d))
    }
}

/// Reused device scratch: grown on demand, never shrunk.
struct Scratch {
    ids: Option<CudaSlice<u32>>,
    positions: Option<CudaSlice<u32>>,
    /// What `positions` holds (empty: unknown).
    positions_host: Vec<u32>,
    freqs: Option<(Vec<f32>, CudaSlice<f32>)>,
    partial: Option<CudaSlice<f32>>,
    w16: Option<CudaSlice<u16>>,
    x16: Option<CudaSlice<u16>>,
    /// The top-k ids, values and logsumexps, one buffer (`sample_top_k`).
    top: Option<CudaSlice<u32>>,
    /// A streamed weight's stored bytes while it is repacked in its slot (`repack`).
    repack: Option<CudaSlice<u8>>,
    /// The row list of a `Rows::List` for `copy_rows` / `add_rows`.
    row_ids: Option<CudaSlice<u32>>,
    /// The routing weights of `add_rows`, one per listed row.
    row_weights: Option<CudaSlice<f32>>,
    /// The convolved queries, keys and values of `delta_rule`.
    conv: Option<CudaSlice<f32>>,
    /// One attention layer's sink logits (gpt-oss), one per query head.
    sinks: Option<CudaSlice<f32>>,
}

impl HostCopy for CudaBuf {
    fn to_host(&self) -> BackendResult<Vec<f32>> {
        let stream = self.data.stream();
        let mut out = vec![0.0f32; self.data.len()];
        stream.memcpy_dtoh(&self.data, &mut out).map_err(dev_err("copying a state to the host", 0))?;
        stream.synchronize().map_err(dev_err("copying a state to the host", 0))?;
        Ok(out)
    }

    fn write_host(&mut self, data: &[f32]) -> BackendResult<()> {
        check_len(&[self.data.len()], data.len(), "write_host")?;
        let stream = self.data.stream().clone();
        let mut view = self.data.slice_mut(..data.len());
        stream.memcpy_htod(data, &mut view).map_err(dev_err("copying a state to the GPU", 0))
    }
}

pub use init::CudaInitError;

pub struct CudaBackend {
    ordinal: usize,
    gpu_name: String,
    stream: Arc<CudaStream>,
    blas: Option<cudarc::cublas::CudaBlas>,
    funcs: HashMap<String, CudaFunction>,
    /// The decode products' kernel (`STRATA_CUDA_MATVEC`).
    matvec: launch::Matvec,
    /// The few-row attention launches' kernel (`STRATA_CUDA_ATTN`).
    attn: launch::Attn,
    /// Every row computed as a one-row call computes it ([`CudaBackend::row_invariant`]).
    row_invariant: bool,
    sm_count: usize,
    scratch: Mutex<Scratch>,
    used: Arc<AtomicU64>,
    /// Kernel launches so far.
    launches: AtomicU64,
    /// Page-locked memory the small copies are staged in (`None`: `STRATA_CUDA_STAGING=off`).
    staging: Option<Mutex<super::staging::Staging>>,
    /// Small host→device copies so far ([`CudaBackend::put`]), and the host's time in them.
    puts: AtomicU64,
    put_ns: AtomicU64,
    /// The decode steps' CUDA graphs (`STRATA_CUDA_GRAPHS=on`); whether one is being
    /// captured or replayed now, and the ops of that pass ([`tape`]); whether something
    /// refused the capture or replay ([`graph`]).
    graphs: Option<Mutex<graph::Graphs>>,
    capturing: std::sync::atomic::AtomicBool,
    tape: Mutex<tape::Tape>,
    refusal: std::sync::atomic::AtomicBool,
    /// Seconds one empty launch takes, measured on first request.
    launch_latency: std::sync::OnceLock<Option<f64>>,
    /// Host→device bandwidth, measured on first request.
    h2d: std::sync::OnceLock<Option<f64>>,
    /// The cuFile driver, opened on first request.
    gds: std::sync::OnceLock<Option<Arc<super::gds::Gds>>>,
}

/// The raw device address of element `offset` of a slice (the kernels take plain
/// pointers; the stream orders every use, so no per-slice events are needed).
fn ptr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>, offset: usize) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p + (offset * std::mem::size_of::<T>()) as u64
}

impl CudaBackend {
    /// Computes every row as a one-row call computes it, whatever the call's row count:
    /// every product through the matrix-vector kernel (never the GEMM), and attention
    /// split at fixed key positions ([`launch::attn_split_fixed`]). A decode step then
    /// gets what the same token gets inside a prompt, and any prompt chunking gives the
    /// same numbers. For models with a recurrent state (the gated delta rule), where the
    /// GEMM's other rounding would otherwise accumulate, as
    /// [`CpuBackend::row_invariant`](crate::cpu::CpuBackend::row_invariant) does
    /// on the CPU. Costs prefill speed: no tensor-core GEMM.
    pub fn row_invariant(mut self) -> Self {
        self.row_invariant = true;
        self
    }

    /// [`Layout::InPlace`] for a stored weight the packed matvecs read where it is (an
    /// element format with 16-byte aligned rows, `STRATA_CUDA_MATVEC=packed`), else
    /// [`Layout::Stored`].
    fn in_place(&self, w: &CudaWeight) -> Layout {
        match self.matvec.reads_in_place(w.dtype, &w.shape, w.ptr(&self.stream, 0)) {
            true => Layout::InPlace,
            false => Layout::Stored,
        }
    }

    /// The few-row attention launches' kernel, whatever `STRATA_CUDA_ATTN` says (tests
    /// compare the two kernels' bits in one process).
    pub fn attn_kernels(mut self, attn: launch::Attn) -> Self {
        self.attn = attn;
        self
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn gpu_name(&self) -> &str {
        &self.gpu_name
    }

    /// The upload pipeline streamed units go through on this device: a copy stream, a
    /// ring of `ring` slots of `slot_len` bytes, page-locked staging buffers.
    pub fn stage(
        &self,
        slot_len: usize,
        ring: usize,
        stats: Arc<TransferStats>,
    ) -> Result<Arc<dyn Stage>, BackendError> {
        let engine = Arc::new(CudaCopy::new(self.stream.clone(), self.used.clone(), self.gds())?);
        let pin: Arc<dyn HostPin> = Arc::new(CudaPin::new(self.stream.context().clone()));
        let bandwidth = self.h2d_bandwidth();
        if let Some(bw) = bandwidth {
            tracing::info!(gb_s = format!("{:.1}", bw / 1e9), "host-to-device bandwidth (page-locked, copy engine)");
        }
        let up = Uploader::new(engine, slot_len, ring, Some(pin), stats)
            .map_err(|e| BackendError::Device { op: "starting the copy reaper".into(), msg: e.to_string() })?
            .with_bandwidth(bandwidth);
        Ok(Arc::new(up))
    }

    /// Host→device bandwidth from page-locked memory, measured once (bytes per second).
    pub fn h2d_bandwidth(&self) -> Option<f64> {
        *self.h2d.get_or_init(|| super::copy::measure_h2d(&self.stream))
    }

    /// The cuFile driver, opened once, for storage reads straight into device memory:
    /// `None` where cuFile is absent or does not open (said once in the log), or when
    /// `STRATA_GDS=off`.
    pub fn gds(&self) -> Option<Arc<super::gds::Gds>> {
        self.gds
            .get_or_init(|| {
                if strata_tensor::env::GDS.switch() == Some(false) {
                    tracing::info!("GPUDirect Storage off (STRATA_GDS): streamed layers go through host memory");
                    return None;
                }
                if !super::libs::cufile_present() {
                    tracing::debug!("cuFile not found: streamed layers go through host memory");
                    return None;
                }
                let opened = self.stream.context().bind_to_thread().map_err(|e| format!("{e:?}"));
                match opened.and_then(|()| super::gds::Gds::open()) {
                    Ok(g) => {
                        tracing::info!(
                            mode = g.mode().as_str(),
                            "GPUDirect Storage: streamed layers read into GPU memory"
                        );
                        Some(g)
                    }
                    Err(reason) => {
                        tracing::info!(%reason, "GPUDirect Storage not used: streamed layers go through host memory");
                        None
                    }
                }
            })
            .clone()
    }

    fn func(&self, name: &str) -> BackendResult<&CudaFunction> {
        self.funcs.get(name).ok_or_else(|| BackendError::Compile(format!("kernel `{name}` was not loaded")))
    }

    fn scratch(&self) -> std::sync::MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Weight = CudaWeight;

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.gpu_name)
    }

    fn device_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn free_memory(&self) -> Option<u64> {
        self.stream.context().mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn memory_bandwidth(&self) -> Option<f64> {
        // 256 MiB copied 10 times after a warm-up; the median pass counts.
        let n = 64 << 20; // f32 values
        let src = self.stream.alloc_zeros::<f32>(n).ok()?;
        let mut dst = self.stream.alloc_zeros::<f32>(n).ok()?;
        let mut secs = Vec::new();
        for pass in 0..11 {
            self.stream.synchronize().ok()?;
            let t = std::time::Instant::now();
            self.stream.memcpy_dtod(&src, &mut dst).ok()?;
            self.stream.synchronize().ok()?;
            if pass > 0 {
                secs.push(t.elapsed().as_secs_f64());
            }
        }
        secs.sort_by(f64::total_cmp);
        Some(2.0 * (n * 4) as f64 / secs[secs.len() / 2])
    }

    fn launch_stats(&self) -> Option<crate::LaunchStats> {
        let launches = self.launches.load(Ordering::Relaxed);
        // Measured once: 500 launches of an empty elementwise kernel (one block, nothing
        // to do), from the first enqueue to the last completion.
        let latency = *self.launch_latency.get_or_init(|| {
            let f = self.func("add_f32").ok()?;
            let (zero, n) = (0u64, 0u32);
            self.stream.synchronize().ok()?;
            let t = std::time::Instant::now();
            let mut b = Kernel::new(f);
            b.arg(&zero).arg(&zero).arg(&n);
            let args = b.args.get()?;
            for _ in 0..500 {
                // SAFETY: add_f32(x, y, n) with n = 0 reads and writes nothing, so null
                // pointers are never dereferenced.
                unsafe { self.enqueue(f, args, launch::elementwise(0)) }.ok()?;
            }
            self.stream.synchronize().ok()?;
            Some(t.elapsed().as_secs_f64() / 500.0)
        });
        Some(crate::LaunchStats {
            launches,
            latency_s: latency?,
            host_copies: self.puts.load(Ordering::Relaxed),
            host_copy_s: self.put_ns.load(Ordering::Relaxed) as f64 / 1e9,
            graphs: self.graphs.as_ref().map_or(0, |g| g.lock().unwrap_or_else(|e| e.into_inner()).launched),
            graph_replays: self.graphs.as_ref().map_or(0, |g| g.lock().unwrap_or_else(|e| e.into_inner()).replayed),
        })
    }

    fn alloc(&self, len: usize) -> BackendResult<CudaBuf> {
        self.not_capturing("an activation buffer")?;
        let bytes = (len.max(1) * 4) as u64;
        let data = self.stream.alloc_zeros::<f32>(len.max(1)).map_err(dev_err("an activation buffer", bytes))?;
        Ok(CudaBuf { data, _tracked: Tracked::new(bytes, &self.used) })
    }

    fn upload(&self, data: &[f32]) -> BackendResult<CudaBuf> {
        let mut buf = self.alloc(data.len())?;
        self.put(data, &mut buf.data, "upload")?;
        Ok(buf)
    }

    fn download(&self, buf: &CudaBuf, len: usize) -> BackendResult<Vec<f32>> {
        self.not_capturing("download")?;
        let mut out = vec![0.0f32; len];
        self.stream.memcpy_dtoh(&buf.data.slice(..len), &mut out).map_err(dev_err("download", 0))?;
        self.stream.synchronize().map_err(dev_err("download", 0))?;
        Ok(out)
    }

    fn weight(&self, t: &HostTensor) -> BackendResult<CudaWeight> {
        self.not_capturing("a weight")?;
        // A streamed unit the upload pipeline already copied: view its slot.
        let f32_ready = t.shape.len() != 1 || t.dtype == DType::F32;
        if let Some((copy, offset)) = t.device_copy().filter(|_| f32_ready)
            && let Ok(hold) = copy.downcast::<SlotHold<CudaCopy>>()
        {
            let (shape, mem) = (t.shape.clone(), WeightMem::Slot { hold, offset });
            let mut w = CudaWeight { mem, dtype: t.dtype, shape, layout: Layout::Stored };
            w.layout = match self.repack_in_slot(&w)? {
                true => Layout::Repacked,
                false => self.in_place(&w),
            };
            return Ok(w);
        }
        // 1-D tensors (norms, biases) are read by the kernels as f32.
        let (bytes, dtype): (std::borrow::Cow<'_, [u8]>, DType) = if t.shape.len() == 1 && t.dtype != DType::F32 {
            let v = t.to_f32_vec();
            (v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>().into(), DType::F32)
        } else {
            (t.bytes().into(), t.dtype)
        };
        // STRATA_CUDA_MATVEC=packed: 2-D weights of the block formats in the packed layout.
        let packed = if self.matvec.packs(dtype) && t.shape.len() == 2 && t.shape[1].is_multiple_of(dtype.block_size())
        {
            super::packed::pack(dtype, &bytes)
        } else {
            None
        };
        let is_packed = packed.is_some();
        let bytes: std::borrow::Cow<'_, [u8]> = packed.map_or(bytes, Into::into);
        let what = format!("a {} weight of shape {:?}", t.dtype.name(), t.shape);
        let mut data = self.stream.alloc_zeros::<u8>(bytes.len().max(1)).map_err(dev_err(&what, bytes.len() as u64))?;
        self.put(&bytes, &mut data, &what)?;
        let tracked = Tracked::new(data.len() as u64, &self.used);
        let mem = WeightMem::Owned { data, _tracked: tracked };
        let mut w = CudaWeight { mem, dtype, shape: t.shape.clone(), layout: Layout::Stored };
        w.layout = if is_packed { Layout::Repacked } else { self.in_place(&w) };
        Ok(w)
    }

    /// A slot view is shared (its bytes may have been repacked in place); a weight of
    /// its own memory is made again.
    fn weight_again(&self, w: &CudaWeight, t: &HostTensor) -> BackendResult<CudaWeight> {
        match self.same_view(w) {
            Some(view) => Ok(view),
            None => self.weight(t),
        }
    }

    fn top_k(&self, logits: &CudaBuf, rows: usize, vocab: usize, k: usize) -> BackendResult<Vec<TopK>> {
        self.not_capturing("top-k")?;
        self.sample_top_k(logits, rows, vocab, k)
    }

    fn embedding(&self, table: &CudaWeight, ids: &[u32], out: &mut CudaBuf) -> BackendResult<()> {
        self.embed(table, ids, out)
    }

    fn matmul(&self, x: &CudaBuf, rows: usize, w: &CudaWeight, out: &mut CudaBuf) -> BackendResult<()> {
        self.matmul_at(x, 0, rows, w, out)
    }

    /// The kernel that computes a row depends on the row count (up to
    /// `MATVEC_MAX_ROWS`: the matrix-vector kernel in f32; more: the GEMM, on f16
    /// tensor cores, whose per-row result also depends on the shape cuBLAS is given), so
    /// each sequence takes the path it takes alone: one-row sequences (decode steps) the
    /// matrix-vector kernel, several at a time (its rows do not depend on each other),
    /// and each longer sequence (a prompt chunk) a call of its own.
    fn matmul_seqs(&self, x: &CudaBuf, seq_rows: &[usize], w: &CudaWeight, out: &mut CudaBuf) -> BackendResult<()> {
        let mut at = 0;
        for run in seq_rows.chunk_by(|a, b| (*a == 1) == (*b == 1)) {
            if run[0] == 1 {
                self.matvec(x, at, run.len(), w, out)?;
                at += run.len();
                continue;
            }
            for &rows in run {
                self.matmul_at(x, at, rows, w, out)?;
                at += rows;
            }
        }
        Ok(())
    }

    fn matmul_seqs_each(
        &self,
        x: &CudaBuf,
        seq_rows: &[usize],
        each: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> BackendResult<()> {
        self.products_each(x, seq_rows, each)
    }

    fn chunking_changes_rows(&self) -> bool {
        self.blas.is_some() && !self.row_invariant
    }

    fn add_bias(&self, x: &mut CudaBuf, rows: usize, bias: &CudaWeight) -> BackendResult<()> {
        let width = bias.shape.iter().product::<usize>();
        let (xp, bp, r, w) = (ptr(&x.data, &self.stream, 0), bias.ptr(&self.stream, 0), rows as u32, width as u32);
        let mut b = Kernel::new(self.func("add_bias_f32")?);
        b.arg(&xp).arg(&bp).arg(&r).arg(&w);
        // SAFETY: add_bias_f32(x, b, rows, width): `x` holds `rows × width` floats and the
        // bias (stored as f32) `width`.
        unsafe { self.launch(&b, launch::elementwise(rows * width), "add_bias") }
    }

    fn rms_norm(&self, x: &CudaBuf, rows: usize, w: &CudaWeight, eps: f32, out: &mut CudaBuf) -> BackendResult<()> {
        let dim = w.shape.iter().product::<usize>() as u32;
        let (xp, wp, op) = (ptr(&x.data, &self.stream, 0), w.ptr(&self.stream, 0), ptr(&out.data, &self.stream, 0));
        let mut b = Kernel::new(self.func("rms_norm_f32")?);
        b.arg(&xp).arg(&wp).arg(&op).arg(&dim).arg(&eps);
        // SAFETY: rms_norm_f32(x, w, out, dim, eps): `x` and `out` hold `rows × dim`
        // floats, `w` (stored as f32) `dim`; a block per row.
        unsafe { self.launch(&b, launch::rms_norm(rows), "rms_norm") }
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        n_heads: usize,
        head_dim: usize,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> BackendResult<()> {
        self.rotate(x, n_heads, head_dim, positions, freqs)
    }

    fn copy_cols(
        &self,
        src: &CudaBuf,
        from: Cols,
        dst: &mut CudaBuf,
        to: Cols,
        rows: usize,
        width: usize,
    ) -> BackendResult<()> {
        self.gather_cols(src, from, dst, to, rows, width)
    }

    fn copy_rows(
        &self,
        src: &CudaBuf,
        rows: Rows<'_>,
        row_len: usize,
        dst: &mut CudaBuf,
        dst_row: usize,
    ) -> BackendResult<()> {
        self.gather_rows(src, rows, row_len, dst, dst_row)
    }

    fn kv_store(
        &self,
        src: &CudaBuf,
        rows: Rows<'_>,
        width: usize,
        dst: &mut CudaBuf,
        at: usize,
        ty: KvType,
    ) -> BackendResult<()> {
        self.store_kv(src, rows, width, dst, at, ty)
    }

    fn kv_types(&self) -> &'static [KvType] {
        &[KvType::F32, KvType::F16, KvType::Q8_0]
    }

    fn attention(
        &self,
        q: &CudaBuf,
        row0: usize,
        rows: usize,
        k: &CudaBuf,
        v: &CudaBuf,
        p: &AttnParams,
        out: &mut CudaBuf,
    ) -> BackendResult<()> {
        self.attend(q, row0, rows, k, v, p, out)
    }

    fn delta_rule(&self, d: &DeltaRule<'_, CudaBuf>, state: &mut CudaBuf, out: &mut CudaBuf) -> BackendResult<()> {
        self.delta(d, state, out)
    }

    fn glu(&self, gate: &mut CudaBuf, up: &CudaBuf, len: usize, act: Activation) -> BackendResult<()> {
        check_len(&[gate.data.len(), up.data.len()], len, "glu")?;
        let (gp, up) = (ptr(&gate.data, &self.stream, 0), ptr(&up.data, &self.stream, 0));
        let kernel = match act {
            Activation::Silu => "silu_mul_f32",
            Activation::GeluTanh => "gelu_mul_f32",
            Activation::Sigmoid => "sigmoid_mul_f32",
            Activation::SwigluOai { alpha, limit } => {
                let n32 = len as u32;
                let mut l = Kernel::new(self.func("swiglu_oai_f32")?);
                l.arg(&gp).arg(&up).arg(&n32).arg(&alpha).arg(&limit);
                // SAFETY: swiglu_oai_f32(g, u, n, alpha, limit) per kernels/README.md: both
                // buffers hold at least `len` floats (checked above); the rest are plain floats.
                return unsafe { self.launch(&l, launch::elementwise(len), "glu") };
            }
        };
        self.elementwise(kernel, gp, up, len)
    }

    fn graphed<E: From<BackendError>>(&self, shape: u64, work: &mut dyn FnMut() -> Result<(), E>) -> Result<(), E> {
        match &self.graphs {
            Some(graphs) => self.run_graphed(graphs, shape, work),
            None => work(),
        }
    }

    fn fused(&self, op: &mut crate::Fused<'_, Self>) -> Option<BackendResult<()>> {
        match op {
            crate::Fused::Glu { x, seq_rows, gate, up, act, out } => self.glu_fused(x, seq_rows, gate, up, *act, out),
            crate::Fused::RopeStore { q, k, v, row0, n, at, heads, freqs, k_cache, v_cache, ty } => {
                self.rope_store(q, k, v, (*row0, *n, *at), *heads, freqs, (k_cache, v_cache), *ty)
            }
            crate::Fused::MatmulAdd { x, seq_rows, w, out } => self.add_fused(x, seq_rows, w, out),
            _ => None,
        }
    }

    fn unary(&self, x: &mut CudaBuf, len: usize, op: Unary) -> BackendResult<()> {
        check_len(&[x.data.len()], len, "unary")?;
        let (kernel, param) = match op {
            Unary::Scale(f) => ("scale_f32", f),
            Unary::Softcap(cap) => ("softcap_f32", cap),
        };
        self.elementwise_unary(kernel, ptr(&x.data, &self.stream, 0), len, param)
    }

    fn add_rows(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        row_len: usize,
        rows: Rows<'_>,
        weights: Option<&[f32]>,
    ) -> BackendResult<()> {
        self.scatter_add(x, y, row_len, rows, weights)
    }
}

fn no_scratch() -> BackendError {
    BackendError::Device { op: "scratch".into(), msg: "a scratch buffer is missing".into() }
}

/// Every row of `rows` lies inside a buffer of `len` values of `row_len`-value rows.
fn check_rows(rows: Rows<'_>, row_len: usize, len: usize, op: &str) -> BackendResult<()> {
    let have = len.checked_div(row_len).unwrap_or(usize::MAX);
    let bad = match rows {
        Rows::Range { start, n } => (n > 0 && start.saturating_add(n) > have).then_some(start.saturating_add(n) - 1),
        Rows::List(list) => list.iter().map(|&r| r as usize).find(|&r| r >= have),
    };
    match bad {
        None => Ok(()),
        Some(r) => Err(BackendError::Device {
            op: op.into(),
            msg: format!("row {r} is past the buffer's {have} rows of {row_len} values"),
        }),
    }
}

/// The rows of a scatter-add are distinct (the kernel gives each row one writer).
fn check_distinct(list: &[u32], op: &str) -> BackendResult<()> {
    let mut seen = list.to_vec();
    seen.sort_unstable();
    match seen.windows(2).find(|w| w[0] == w[1]) {
        None => Ok(()),
        Some(w) => Err(BackendError::Device { op: op.into(), msg: format!("row {} is listed twice", w[0]) }),
    }
}

/// A size a kernel takes as `unsigned int`.
fn to_u32(n: usize, op: &str) -> BackendResult<u32> {
    u32::try_from(n).map_err(|_| BackendError::Device { op: op.into(), msg: format!("{n} exceeds the kernels' u32") })
}

fn check_len(lens: &[usize], need: usize, op: &str) -> BackendResult<()> {
    match lens.iter().all(|&l| l >= need) {
        true => Ok(()),
        false => Err(BackendError::Device { op: op.into(), msg: format!("buffers of {lens:?} values, {need} needed") }),
    }
}
