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

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, LaunchConfig,
};
use cudarc::driver::{LaunchArgs, PushKernelArg, sys};

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

/// An f32 activation buffer in device memory.
pub struct CudaBuf {
    data: CudaSlice<f32>,
    _tracked: Tracked,
}

/// A weight in device memory, in its stored format (`[out, in]` rows of blocks), or in
/// f32 for 1-D tensors (norm weights and biases, which the kernels read as f32). With
/// `packed`, a Q4_0/Q8_0/Q4_K/Q6_K tensor in the packed layout (`super::packed`), which only the
/// `*_packed_*` kernels read.
pub struct CudaWeight {
    mem: WeightMem,
    dtype: DType,
    shape: Vec<usize>,
    packed: bool,
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
        launch::WeightKind { dtype: self.dtype, shape: &self.shape, packed: self.packed }
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
    freqs: Option<(Vec<f32>, CudaSlice<f32>)>,
    partial: Option<CudaSlice<f32>>,
    w16: Option<CudaSlice<u16>>,
    x16: Option<CudaSlice<u16>>,
    top_idx: Option<CudaSlice<u32>>,
    top_val: Option<CudaSlice<f32>>,
    lse: Option<CudaSlice<f32>>,
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
    /// Seconds one empty launch takes, measured on first request.
    launch_latency: std::sync::OnceLock<Option<f64>>,
    /// Host→device bandwidth, measured on first request.
    h2d: std::sync::OnceLock<Option<f64>>,
    /// The cuFile driver, opened on first request.
    gds: std::sync::OnceLock<Option<Arc<super::gds::Gds>>>,
}

fn cfg(s: Shape) -> LaunchConfig {
    LaunchConfig { grid_dim: s.grid, block_dim: s.block, shared_mem_bytes: 0 }
}

/// The raw device address of element `offset` of a slice (the kernels take plain
/// pointers; the stream orders every use, so no per-slice events are needed).
fn ptr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>, offset: usize) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p + (offset * std::mem::size_of::<T>()) as u64
}

/// Why `cuda:N` cannot be used, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum CudaInitError {
    #[error("no NVIDIA driver: libcuda.so.1 was not found (install the NVIDIA driver, or use --device cpu)")]
    NoDriver,
    #[error("the NVIDIA driver did not initialise: {0}")]
    Init(String),
    #[error("no CUDA device {ordinal}: this machine has {count}")]
    NoDevice { ordinal: usize, count: usize },
    #[error(
        "NVRTC (libnvrtc.so.13 or .12) was not found: it compiles Strata's kernels at run time \
         (install the CUDA runtime libraries or `pip install nvidia-cuda-nvrtc-cu12`, or set STRATA_CUDA_LIBS)"
    )]
    NoNvrtc,
    #[error("cuda:{ordinal}: {msg}")]
    Device { ordinal: usize, msg: String },
    #[error("cuda:{ordinal}: {source}")]
    Kernels { ordinal: usize, source: BackendError },
}

impl CudaBackend {
    /// Initialises device `ordinal`: the driver, a context and stream, every kernel
    /// (compiled or read from the cache), and cuBLAS when present.
    /// Whether `cuda:ordinal` can be used, without creating a context: the driver
    /// loads and initialises, the device exists, and NVRTC is there to compile the
    /// kernels. `serve` asks this before it starts listening.
    pub fn check(ordinal: usize) -> Result<(), CudaInitError> {
        super::libs::preload();
        // SAFETY: only probes whether the library can be opened; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaInitError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(|e| CudaInitError::Init(format!("{e:?}")))? as usize;
        if ordinal >= count {
            return Err(CudaInitError::NoDevice { ordinal, count });
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaInitError::NoNvrtc);
        }
        Ok(())
    }

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

    /// The few-row attention launches' kernel, whatever `STRATA_CUDA_ATTN` says (tests
    /// compare the two kernels' bits in one process).
    pub fn attn_kernels(mut self, attn: launch::Attn) -> Self {
        self.attn = attn;
        self
    }

    pub fn new(ordinal: usize) -> Result<Self, CudaInitError> {
        Self::check(ordinal)?;
        let matvec = launch::Matvec::from_env(strata_tensor::env::CUDA_MATVEC.get())
            .map_err(|msg| CudaInitError::Device { ordinal, msg })?;
        let attn = launch::Attn::from_env(strata_tensor::env::CUDA_ATTN.get())
            .map_err(|msg| CudaInitError::Device { ordinal, msg })?;
        let dev_err = |e: DriverError| CudaInitError::Device { ordinal, msg: format!("{e:?}") };
        let ctx = CudaContext::new(ordinal).map_err(dev_err)?;
        // SAFETY: Strata uses one stream per context, so the per-slice events that order
        // uses across streams are not needed; every buffer is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let gpu_name = ctx.name().map_err(dev_err)?;
        let (major, minor) = ctx.compute_capability().map_err(dev_err)?;
        let sm_count =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(dev_err)? as usize;
        let stream = ctx.default_stream();
        let funcs = load_kernels(&ctx, (major as u32, minor as u32))
            .map_err(|source| CudaInitError::Kernels { ordinal, source })?;
        // SAFETY: as above.
        let blas = match unsafe { cudarc::cublas::sys::is_culib_present() } {
            true => match cudarc::cublas::CudaBlas::new(stream.clone()) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!(error = ?e, "cuBLAS did not initialise: prefill uses the matrix-vector kernels");
                    None
                }
            },
            false => {
                tracing::warn!("cuBLAS (libcublas.so.13 or .12) not found: prefill uses the matrix-vector kernels");
                None
            }
        };
        let staging = super::staging::Staging::from_env(&stream).map_err(dev_err)?.map(Mutex::new);
        tracing::info!(
            device = ordinal,
            gpu = %gpu_name,
            sm = format!("{major}.{minor}"),
            sm_count,
            ?matvec,
            ?attn,
            staging = staging.is_some(),
            "CUDA ready"
        );
        Ok(CudaBackend {
            ordinal,
            gpu_name,
            stream,
            blas,
            funcs,
            matvec,
            attn,
            row_invariant: false,
            sm_count,
            scratch: Mutex::new(Scratch {
                ids: None,
                positions: None,
                freqs: None,
                partial: None,
                w16: None,
                x16: None,
                top_idx: None,
                top_val: None,
                lse: None,
                row_ids: None,
                row_weights: None,
                conv: None,
                sinks: None,
            }),
            used: Arc::default(),
            launches: AtomicU64::new(0),
            staging,
            puts: AtomicU64::new(0),
            put_ns: AtomicU64::new(0),
            launch_latency: std::sync::OnceLock::new(),
            h2d: std::sync::OnceLock::new(),
            gds: std::sync::OnceLock::new(),
        })
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

    /// Launches what `b` holds with `shape`, and counts the launch.
    ///
    /// # Safety
    /// The arguments pushed on `b` must match the kernel's parameters, and every buffer
    /// must hold what the kernel reads and writes with this launch shape.
    unsafe fn launch(&self, b: &mut LaunchArgs<'_>, shape: Shape, op: &str) -> BackendResult<()> {
        self.launches.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { b.launch(cfg(shape)) }.map(|_| ()).map_err(dev_err(op, 0))
    }

    fn func(&self, name: &str) -> BackendResult<&CudaFunction> {
        self.funcs.get(name).ok_or_else(|| BackendError::Compile(format!("kernel `{name}` was not loaded")))
    }

    fn scratch(&self) -> std::sync::MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot of `n` elements at least: the existing allocation, or a bigger one.
    fn grow<'s, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        slot: &'s mut Option<CudaSlice<T>>,
        n: usize,
        what: &str,
    ) -> BackendResult<&'s mut CudaSlice<T>> {
        if slot.as_ref().is_none_or(|s| s.len() < n) {
            *slot = None;
            let bytes = (n.max(1) * std::mem::size_of::<T>()) as u64;
            *slot = Some(self.stream.alloc_zeros::<T>(n.max(1)).map_err(dev_err(what, bytes))?);
        }
        slot.as_mut().ok_or_else(|| BackendError::Device { op: what.into(), msg: "no scratch".into() })
    }

    /// Copies host values into the front of a device slot (which holds at least as many).
    /// Small ones (up to [`super::staging::HALF`]) go through the page-locked staging.
    fn put<T: cudarc::driver::DeviceRepr>(&self, src: &[T], dst: &mut CudaSlice<T>, what: &str) -> BackendResult<()> {
        let mut view = dst.slice_mut(..src.len());
        let t = std::time::Instant::now();
        let staged = self.staging.as_ref().and_then(|staging| {
            // SAFETY: `DeviceRepr` values are plain bytes, `size_of_val(src)` of them.
            let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src)) };
            let (dp, _sync) = view.device_ptr_mut(&self.stream);
            let mut staging = staging.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: `view` holds `src.len()` values, and `dst` stays allocated until
            // the copy has run: it is freed on this stream, after it.
            unsafe { staging.copy(bytes, dp) }
        });
        let done = match staged {
            Some(r) => r.map_err(dev_err(what, 0)),
            None => self.stream.memcpy_htod(src, &mut view).map_err(dev_err(what, 0)),
        };
        self.put_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.puts.fetch_add(1, Ordering::Relaxed);
        done
    }

    /// `y[rows, out] = x[rows, in] · w[out, in]ᵀ` with the fused-dequantising
    /// matrix-vector kernel, `MATVEC_MAX_ROWS` activation rows per launch.
    /// Rows `at..at + rows` of `x` and `y`; each row comes out the same whatever the
    /// launch's row count (a warp per output row keeps one sum per activation row).
    fn matvec(&self, x: &CudaBuf, at: usize, rows: usize, w: &CudaWeight, y: &mut CudaBuf) -> BackendResult<()> {
        let (out, inn) = (w.shape[0], w.shape[1]);
        let fmt = launch::format_name(w.dtype)
            .ok_or_else(|| BackendError::Compile(format!("no kernel reads {} weights", w.dtype.name())))?;
        let f = self.func(&self.matvec.kernel(&fmt, w.packed))?;
        let wp = w.ptr(&self.stream, 0);
        let (qp, dp) = if w.packed { w.packed_ptrs(&self.stream, 0) } else { (wp, 0) };
        for r0 in (at..at + rows).step_by(launch::MATVEC_MAX_ROWS) {
            let n = (at + rows - r0).min(launch::MATVEC_MAX_ROWS);
            let (xp, yp) = (ptr(&x.data, &self.stream, r0 * inn), ptr(&y.data, &self.stream, r0 * out));
            let (n, o, i) = (n as u32, out as u32, inn as u32);
            let mut b = self.stream.launch_builder(f);
            match w.packed {
                true => b.arg(&qp).arg(&dp),
                false => b.arg(&wp),
            };
            b.arg(&xp).arg(&yp).arg(&n).arg(&o).arg(&i);
            // SAFETY: matvec_FMT(w, x, y, rows, out, in) per kernels/README.md: `w` holds
            // `out × in` values of its format (matvec_packed_FMT(q, d, ...): `q` and `d`
            // its packed quants and scales), `x` at least `(r0 + n) × in` floats and `y`
            // `(r0 + n) × out` (the workspace is sized for `rows`); the grid has a warp
            // (`matvec_wide_FMT`: a block; `matvec_packed_FMT`: half a warp) per output row.
            unsafe { self.launch(&mut b, self.matvec.shape(out, w.packed), "matvec") }?;
        }
        Ok(())
    }

    /// `y[r] = act(x[r] · gateᵀ) ⊙ (x[r] · upᵀ)` for rows `0..rows` with
    /// `matvec_glu_packed_FMT`, `MATVEC_MAX_ROWS` activation rows per launch; both
    /// weights packed, of one format and shape ([`launch::fuses_glu`]).
    fn matvec_glu(
        &self,
        x: &CudaBuf,
        rows: usize,
        gate: &CudaWeight,
        up: &CudaWeight,
        act: Activation,
        y: &mut CudaBuf,
    ) -> BackendResult<()> {
        let (out, inn) = (gate.shape[0], gate.shape[1]);
        check_len(&[x.data.len()], rows * inn, "matmul_glu")?;
        check_len(&[y.data.len()], rows * out, "matmul_glu")?;
        let fmt = launch::format_name(gate.dtype)
            .ok_or_else(|| BackendError::Compile(format!("no kernel reads {} weights", gate.dtype.name())))?;
        let f = self.func(&format!("matvec_glu_packed_{fmt}"))?;
        let ((qg, dg), (qu, du)) = (gate.packed_ptrs(&self.stream, 0), up.packed_ptrs(&self.stream, 0));
        let (code, alpha, limit) = launch::glu_code(act);
        for r0 in (0..rows).step_by(launch::MATVEC_MAX_ROWS) {
            let n = (rows - r0).min(launch::MATVEC_MAX_ROWS);
            let (xp, yp) = (ptr(&x.data, &self.stream, r0 * inn), ptr(&y.data, &self.stream, r0 * out));
            let (n, o, i) = (n as u32, out as u32, inn as u32);
            let mut b = self.stream.launch_builder(f);
            b.arg(&qg).arg(&dg).arg(&qu).arg(&du).arg(&xp).arg(&yp).arg(&n).arg(&o).arg(&i);
            b.arg(&code).arg(&alpha).arg(&limit);
            // SAFETY: matvec_glu_packed_FMT(qg, dg, qu, du, x, y, rows, out, in, act, alpha,
            // limit) per kernels/README.md: `qg`/`dg` and `qu`/`du` are the packed quants and
            // scales of two `out × in` weights of format FMT (checked by the caller), `x`
            // holds at least `(r0 + n) × in` floats and `y` `(r0 + n) × out` (checked
            // above); the grid has half a warp per output row, as matvec_packed_FMT's.
            unsafe { self.launch(&mut b, launch::matvec_packed(out), "matmul_glu") }?;
        }
        Ok(())
    }

    /// The prefill product through cuBLAS: f32 weights as they are; any other format
    /// dequantised to f16 a tile of output rows at a time (so the scratch stays small
    /// even for a vocabulary-sized head) against `x` converted to f16, accumulated in
    /// f32 on the tensor cores. Rows `at..at + rows` of `x` and `y`.
    fn gemm(
        &self,
        blas: &cudarc::cublas::CudaBlas,
        x: &CudaBuf,
        at: usize,
        rows: usize,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) -> BackendResult<()> {
        use cudarc::cublas::sys::cudaDataType::{CUDA_R_16F, CUDA_R_32F};
        let (out, inn) = (w.shape[0], w.shape[1]);
        // cuBLAS runs on whatever context is current on this thread (the worker's, not
        // the loader's): make it this device's.
        self.stream.context().bind_to_thread().map_err(dev_err("cuBLAS GEMM", 0))?;
        let (xp, yp) = (ptr(&x.data, &self.stream, at * inn), ptr(&y.data, &self.stream, at * out));
        let shape = GemmShape { out, rows, inn, ldc: out };
        if w.dtype == DType::F32 {
            return gemm_ex(blas, shape, (w.ptr(&self.stream, 0), CUDA_R_32F), (xp, CUDA_R_32F), yp);
        }
        let mut s = self.scratch();
        let fmt = launch::format_name(w.dtype).unwrap_or_default();
        let tile = launch::gemm_tile_rows(out, inn);
        let x16 = ptr(self.grow(&mut s.x16, rows * inn, "converting activations for GEMM")?, &self.stream, 0);
        let w16 = ptr(self.grow(&mut s.w16, tile * inn, "dequantising a weight for GEMM")?, &self.stream, 0);
        let nx = (rows * inn) as u64;
        let mut b = self.stream.launch_builder(self.func("f32_to_f16")?);
        b.arg(&xp).arg(&x16).arg(&nx);
        // SAFETY: f32_to_f16(x, y, n): `x` holds `rows × in` floats, the scratch as many.
        unsafe { self.launch(&mut b, launch::elementwise(rows * inn), "f32_to_f16") }?;
        let row_bytes = w.dtype.bytes_for(inn).unwrap_or(0);
        for o0 in (0..out).step_by(tile.max(1)) {
            let n_out = (out - o0).min(tile);
            let n = (n_out * inn) as u64;
            let wp = w.ptr(&self.stream, o0 * row_bytes);
            let (qp, dp) = if w.packed { w.packed_ptrs(&self.stream, o0) } else { (wp, 0) };
            let name = if w.packed { format!("dequant_packed_{fmt}_f16") } else { format!("dequant_{fmt}_f16") };
            let mut b = self.stream.launch_builder(self.func(&name)?);
            match w.packed {
                true => b.arg(&qp).arg(&dp),
                false => b.arg(&wp),
            };
            b.arg(&w16).arg(&n);
            // SAFETY: dequant_FMT_f16(w, out, n): from output row `o0`, `w` holds
            // `n_out × in` values of its format (dequant_packed_FMT_f16(q, d, out, n): `q`
            // and `d` row `o0`'s packed quants and scales); the f16 scratch holds `tile × in`.
            unsafe { self.launch(&mut b, launch::dequant(w.dtype, n), "dequant") }?;
            // Output rows `o0..o0 + n_out` start at row `o0` of the column-major C.
            let tile_shape = GemmShape { out: n_out, ..shape };
            gemm_ex(blas, tile_shape, (w16, CUDA_R_16F), (x16, CUDA_R_16F), yp + (o0 * 4) as u64)?;
        }
        Ok(())
    }

    /// [`Backend::matmul`] over rows `at..at + rows` of `x` and `out`.
    fn matmul_at(&self, x: &CudaBuf, at: usize, rows: usize, w: &CudaWeight, out: &mut CudaBuf) -> BackendResult<()> {
        if rows == 0 {
            return Ok(());
        }
        match &self.blas {
            Some(blas) if rows > launch::MATVEC_MAX_ROWS && !self.row_invariant => self.gemm(blas, x, at, rows, w, out),
            _ => self.matvec(x, at, rows, w, out),
        }
    }

    /// Launches a 1-D elementwise kernel `name(a, b, n)`.
    fn elementwise(&self, name: &str, a: u64, b: u64, n: usize) -> BackendResult<()> {
        let n32 = n as u32;
        let mut l = self.stream.launch_builder(self.func(name)?);
        l.arg(&a).arg(&b).arg(&n32);
        // SAFETY: add_f32 / silu_mul_f32 / gelu_mul_f32 / sigmoid_mul_f32 (x, y, n): both buffers hold at
        // least `n` floats (checked by the callers against their lengths).
        unsafe { self.launch(&mut l, launch::elementwise(n), name) }?;
        Ok(())
    }

    /// Launches a 1-D in-place kernel `name(x, n, param)`.
    fn elementwise_unary(&self, name: &str, x: u64, n: usize, param: f32) -> BackendResult<()> {
        let n32 = n as u32;
        let mut l = self.stream.launch_builder(self.func(name)?);
        l.arg(&x).arg(&n32).arg(&param);
        // SAFETY: scale_f32(x, n, factor) / softcap_f32(x, n, cap): `x` holds at least `n`
        // floats (checked by the caller against its length).
        unsafe { self.launch(&mut l, launch::elementwise(n), name) }?;
        Ok(())
    }
}

/// Compiles (or reads from the cache) every kernel file for `arch` and loads the
/// functions the backend launches.
fn load_kernels(ctx: &Arc<CudaContext>, arch: (u32, u32)) -> BackendResult<HashMap<String, CudaFunction>> {
    use super::{kernels, nvrtc};
    let compiler = nvrtc::Compiler::new(nvrtc::default_cache_dir());
    let mut funcs = HashMap::new();
    for file in kernels::FILES {
        let compiled = compiler
            .compile(file, nvrtc::Arch { major: arch.0, minor: arch.1 })
            .map_err(|e| BackendError::Compile(e.to_string()))?;
        let image = match compiled.kind {
            nvrtc::ImageKind::Cubin => cudarc::nvrtc::Ptx::from_binary(compiled.image),
            nvrtc::ImageKind::Ptx => {
                cudarc::nvrtc::Ptx::from_src(String::from_utf8_lossy(&compiled.image).into_owned())
            }
        };
        let module = ctx
            .load_module(image)
            .map_err(|e| BackendError::Compile(format!("loading kernels/{}.cu: {e:?}", file.name)))?;
        for name in kernels::functions(file) {
            let f = module
                .load_function(&name)
                .map_err(|e| BackendError::Compile(format!("kernels/{}.cu: `{name}`: {e:?}", file.name)))?;
            funcs.insert(name, f);
        }
    }
    for (file, name) in launch::kernel_names() {
        if !funcs.contains_key(&name) {
            return Err(BackendError::Compile(format!("kernels/{file}.cu has no kernel `{name}`")));
        }
    }
    Ok(funcs)
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
            for _ in 0..500 {
                let mut b = self.stream.launch_builder(f);
                b.arg(&zero).arg(&zero).arg(&n);
                // SAFETY: add_f32(x, y, n) with n = 0 reads and writes nothing, so null
                // pointers are never dereferenced.
                unsafe { b.launch(cfg(launch::elementwise(0))) }.ok()?;
            }
            self.stream.synchronize().ok()?;
            Some(t.elapsed().as_secs_f64() / 500.0)
        });
        Some(crate::LaunchStats {
            launches,
            latency_s: latency?,
            host_copies: self.puts.load(Ordering::Relaxed),
            host_copy_s: self.put_ns.load(Ordering::Relaxed) as f64 / 1e9,
        })
    }

    fn alloc(&self, len: usize) -> BackendResult<CudaBuf> {
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
        let mut out = vec![0.0f32; len];
        self.stream.memcpy_dtoh(&buf.data.slice(..len), &mut out).map_err(dev_err("download", 0))?;
        self.stream.synchronize().map_err(dev_err("download", 0))?;
        Ok(out)
    }

    fn weight(&self, t: &HostTensor) -> BackendResult<CudaWeight> {
        // A streamed unit the upload pipeline already copied: view its slot.
        let f32_ready = t.shape.len() != 1 || t.dtype == DType::F32;
        if let Some((copy, offset)) = t.device_copy().filter(|_| f32_ready)
            && let Ok(hold) = copy.downcast::<SlotHold<CudaCopy>>()
        {
            let shape = t.shape.clone();
            return Ok(CudaWeight { mem: WeightMem::Slot { hold, offset }, dtype: t.dtype, shape, packed: false });
        }
        // 1-D tensors (norms, biases) are read by the kernels as f32.
        let (bytes, dtype): (std::borrow::Cow<'_, [u8]>, DType) = if t.shape.len() == 1 && t.dtype != DType::F32 {
            let v = t.to_f32_vec();
            (v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>().into(), DType::F32)
        } else {
            (t.bytes().into(), t.dtype)
        };
        // STRATA_CUDA_MATVEC=packed: 2-D Q4_0/Q8_0/Q4_K/Q6_K weights in the packed layout.
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
        Ok(CudaWeight { mem, dtype, shape: t.shape.clone(), packed: is_packed })
    }

    fn top_k(&self, logits: &CudaBuf, rows: usize, vocab: usize, k: usize) -> BackendResult<Vec<TopK>> {
        let k = k.clamp(1, MAX_TOP_K);
        let mut s = self.scratch();
        let idx = ptr(self.grow(&mut s.top_idx, rows * k, "top-k indices")?, &self.stream, 0);
        let val = ptr(self.grow(&mut s.top_val, rows * k, "top-k values")?, &self.stream, 0);
        let lse = ptr(self.grow(&mut s.lse, rows, "logsumexp")?, &self.stream, 0);
        let lp = ptr(&logits.data, &self.stream, 0);
        let (v32, k32) = (vocab as u32, k as u32);
        let name = if k == 1 { "argmax_f32" } else { "topk_f32" };
        let mut b = self.stream.launch_builder(self.func(name)?);
        b.arg(&lp).arg(&v32);
        if k > 1 {
            b.arg(&k32);
        }
        b.arg(&idx).arg(&val).arg(&lse);
        // SAFETY: argmax_f32(logits, vocab, idx, val, lse) / topk_f32(logits, vocab, k,
        // idx, val, lse): `logits` holds `rows × vocab` floats, the outputs `rows × k`,
        // `rows × k` and `rows` (grown above); one block per row.
        unsafe { self.launch(&mut b, launch::sample(rows), name) }?;
        let (mut ids, mut vals, mut lses) = (vec![0u32; rows * k], vec![0f32; rows * k], vec![0f32; rows]);
        let st = &self.stream;
        st.memcpy_dtoh(&s.top_idx.as_ref().map(|b| b.slice(..rows * k)).ok_or_else(no_scratch)?, &mut ids)
            .map_err(dev_err("top-k readback", 0))?;
        st.memcpy_dtoh(&s.top_val.as_ref().map(|b| b.slice(..rows * k)).ok_or_else(no_scratch)?, &mut vals)
            .map_err(dev_err("top-k readback", 0))?;
        st.memcpy_dtoh(&s.lse.as_ref().map(|b| b.slice(..rows)).ok_or_else(no_scratch)?, &mut lses)
            .map_err(dev_err("top-k readback", 0))?;
        st.synchronize().map_err(dev_err("top-k readback", 0))?;
        // Slots past the row's non-NaN logits come back as id u32::MAX: drop them.
        Ok((0..rows)
            .map(|r| {
                let n = ids[r * k..][..k].iter().take_while(|&&i| i != u32::MAX).count();
                TopK { ids: ids[r * k..][..n].to_vec(), logits: vals[r * k..][..n].to_vec(), lse: lses[r] }
            })
            .collect())
    }

    fn embedding(&self, table: &CudaWeight, ids: &[u32], out: &mut CudaBuf) -> BackendResult<()> {
        let dim = table.shape[1];
        let fmt = launch::format_name(table.dtype)
            .ok_or_else(|| BackendError::Compile(format!("no kernel reads {} embeddings", table.dtype.name())))?;
        let mut s = self.scratch();
        let slot = self.grow(&mut s.ids, ids.len(), "token ids")?;
        self.put(ids, slot, "token ids")?;
        let (tp, ip, op, d) =
            (table.ptr(&self.stream, 0), ptr(slot, &self.stream, 0), ptr(&out.data, &self.stream, 0), dim as u32);
        let (qp, dp) = if table.packed { table.packed_ptrs(&self.stream, 0) } else { (tp, 0) };
        let name = if table.packed { format!("embed_packed_{fmt}") } else { format!("embed_{fmt}") };
        let mut b = self.stream.launch_builder(self.func(&name)?);
        match table.packed {
            true => b.arg(&qp).arg(&dp),
            false => b.arg(&tp),
        };
        b.arg(&ip).arg(&op).arg(&d);
        // SAFETY: embed_FMT(table, ids, out, dim): ids (checked < vocab by the model) index
        // rows of the `[vocab, dim]` table (embed_packed_FMT(q, d, ...): its packed quants
        // and scales); `out` holds `ids.len() × dim` floats.
        unsafe { self.launch(&mut b, launch::embedding(ids.len()), "embedding") }
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

    fn chunking_changes_rows(&self) -> bool {
        self.blas.is_some() && !self.row_invariant
    }

    fn add_bias(&self, x: &mut CudaBuf, rows: usize, bias: &CudaWeight) -> BackendResult<()> {
        let width = bias.shape.iter().product::<usize>();
        let (xp, bp, r, w) = (ptr(&x.data, &self.stream, 0), bias.ptr(&self.stream, 0), rows as u32, width as u32);
        let mut b = self.stream.launch_builder(self.func("add_bias_f32")?);
        b.arg(&xp).arg(&bp).arg(&r).arg(&w);
        // SAFETY: add_bias_f32(x, b, rows, width): `x` holds `rows × width` floats and the
        // bias (stored as f32) `width`.
        unsafe { self.launch(&mut b, launch::elementwise(rows * width), "add_bias") }
    }

    fn rms_norm(&self, x: &CudaBuf, rows: usize, w: &CudaWeight, eps: f32, out: &mut CudaBuf) -> BackendResult<()> {
        let dim = w.shape.iter().product::<usize>() as u32;
        let (xp, wp, op) = (ptr(&x.data, &self.stream, 0), w.ptr(&self.stream, 0), ptr(&out.data, &self.stream, 0));
        let mut b = self.stream.launch_builder(self.func("rms_norm_f32")?);
        b.arg(&xp).arg(&wp).arg(&op).arg(&dim).arg(&eps);
        // SAFETY: rms_norm_f32(x, w, out, dim, eps): `x` and `out` hold `rows × dim`
        // floats, `w` (stored as f32) `dim`; a block per row.
        unsafe { self.launch(&mut b, launch::rms_norm(rows), "rms_norm") }
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        n_heads: usize,
        head_dim: usize,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> BackendResult<()> {
        // Partial RoPE rotates the first `2 * pairs` dimensions of each head.
        let pairs = freqs.inv_freq.len().min(head_dim / 2);
        if positions.is_empty() || pairs == 0 {
            return Ok(());
        }
        let mut s = self.scratch();
        let pos = self.grow(&mut s.positions, positions.len(), "positions")?;
        self.put(positions, pos, "positions")?;
        let pp = ptr(pos, &self.stream, 0);
        if s.freqs.as_ref().is_none_or(|(host, _)| *host != freqs.inv_freq) {
            s.freqs = None;
            let mut dev = self.stream.alloc_zeros::<f32>(freqs.inv_freq.len().max(1)).map_err(dev_err("rope", 0))?;
            self.put(&freqs.inv_freq, &mut dev, "rope frequencies")?;
            s.freqs = Some((freqs.inv_freq.clone(), dev));
        }
        let fp = s.freqs.as_ref().map(|(_, d)| ptr(d, &self.stream, 0)).ok_or_else(no_scratch)?;
        let (xp, nh, hd, np, af, il) = (
            ptr(&x.data, &self.stream, 0),
            n_heads as u32,
            head_dim as u32,
            pairs as u32,
            freqs.attention_factor,
            freqs.interleaved as i32,
        );
        let mut b = self.stream.launch_builder(self.func("rope_f32")?);
        b.arg(&xp).arg(&pp).arg(&fp).arg(&nh).arg(&hd).arg(&np).arg(&af).arg(&il);
        // SAFETY: rope_f32(x, pos, inv_freq, n_heads, head_dim, n_pairs, attn_factor,
        // interleaved): `x` holds `positions.len() × n_heads × head_dim` floats, `pos` one
        // position per row, `inv_freq` at least `n_pairs` values (`n_pairs ≤ head_dim / 2`).
        unsafe { self.launch(&mut b, launch::rope(positions.len(), n_heads, pairs), "rope") }
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
        if rows == 0 || width == 0 {
            return Ok(());
        }
        check_len(&[src.data.len()], from.end(rows, width), "copy_cols")?;
        check_len(&[dst.data.len()], to.end(rows, width), "copy_cols")?;
        let u = |x: usize| to_u32(x, "copy_cols");
        let (s_stride, d_stride, w32, n32) = (u(from.stride)?, u(to.stride)?, u(width)?, u(rows)?);
        let (sp, dp) = (ptr(&src.data, &self.stream, from.col), ptr(&dst.data, &self.stream, to.col));
        let mut b = self.stream.launch_builder(self.func("copy_cols_f32")?);
        b.arg(&sp).arg(&s_stride).arg(&dp).arg(&d_stride).arg(&w32).arg(&n32);
        // SAFETY: copy_cols_f32(src, src_stride, dst, dst_stride, width, n_rows) reads
        // `src[r * src_stride + j]` and writes `dst[r * dst_stride + j]` for r < n_rows,
        // j < width, from pointers already offset by each block's first column: both
        // ends were checked against the buffers above (`Cols::end`).
        unsafe { self.launch(&mut b, launch::rows(rows, width), "copy_cols") }
    }

    fn copy_rows(
        &self,
        src: &CudaBuf,
        rows: Rows<'_>,
        row_len: usize,
        dst: &mut CudaBuf,
        dst_row: usize,
    ) -> BackendResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        check_rows(rows, row_len, src.data.len(), "copy_rows")?;
        check_len(&[dst.data.len()], (dst_row + rows.len()) * row_len, "copy_rows")?;
        if row_len == 0 {
            return Ok(());
        }
        let list = match rows {
            Rows::Range { start, n } => {
                let from = src.data.slice(start * row_len..(start + n) * row_len);
                let at = dst_row * row_len;
                let mut to = dst.data.slice_mut(at..at + n * row_len);
                return self.stream.memcpy_dtod(&from, &mut to).map_err(dev_err("copy_rows", 0));
            }
            Rows::List(list) => list,
        };
        let (len32, n32) = (to_u32(row_len, "copy_rows")?, to_u32(list.len(), "copy_rows")?);
        let mut s = self.scratch();
        let ids = self.grow(&mut s.row_ids, list.len(), "copy_rows row list")?;
        self.put(list, ids, "copy_rows row list")?;
        let (sp, ip, dp) = (
            ptr(&src.data, &self.stream, 0),
            ptr(ids, &self.stream, 0),
            ptr(&dst.data, &self.stream, dst_row * row_len),
        );
        let mut b = self.stream.launch_builder(self.func("gather_rows_f32")?);
        b.arg(&sp).arg(&ip).arg(&dp).arg(&len32).arg(&n32);
        // SAFETY: gather_rows_f32(src, rows, dst, row_len, n_rows): every listed row is
        // below `src`'s row count (`check_rows`), so each read `src[rows[i] × row_len ..
        // + row_len]` is in bounds; `dst` from row `dst_row` holds `n_rows × row_len`
        // floats (`check_len`); the scratch holds the `n_rows` row ids just uploaded.
        unsafe { self.launch(&mut b, launch::rows(list.len(), row_len), "copy_rows") }
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
        if ty == KvType::F32 {
            return self.copy_rows(src, rows, width, dst, at);
        }
        if rows.is_empty() || width == 0 {
            return Ok(());
        }
        let row_len = ty.row_len(width);
        check_rows(rows, width, src.data.len(), "kv_store")?;
        check_len(&[dst.data.len()], (at + rows.len()) * row_len, "kv_store")?;
        let shape = launch::kv_store(ty, rows.len(), width).ok_or_else(|| BackendError::Device {
            op: "storing the KV cache".into(),
            msg: format!("{} rows of {width} values are past the launch grid", rows.len()),
        })?;
        let (w32, n32) = (to_u32(width, "kv_store")?, to_u32(rows.len(), "kv_store")?);
        let mut s = self.scratch();
        let (sp, ip) = match rows {
            Rows::Range { start, .. } => (ptr(&src.data, &self.stream, start * width), 0),
            Rows::List(list) => {
                let ids = self.grow(&mut s.row_ids, list.len(), "kv_store row list")?;
                self.put(list, ids, "kv_store row list")?;
                (ptr(&src.data, &self.stream, 0), ptr(ids, &self.stream, 0))
            }
        };
        let dp = ptr(&dst.data, &self.stream, at * row_len);
        let name = match ty {
            KvType::F16 => "kv_store_f16",
            _ => "kv_store_q8_0",
        };
        let mut b = self.stream.launch_builder(self.func(name)?);
        b.arg(&sp).arg(&ip).arg(&dp).arg(&w32).arg(&n32);
        // SAFETY: kv_store_{f16,q8_0}(src, rows, dst, width, n_rows) per kernels/README.md:
        // `src` holds every source row (`check_rows`; a range starts at its first row and
        // passes no list, a list was just uploaded to the scratch), `dst` from row `at`
        // holds `n_rows` rows of `ty.row_len(width)` floats (`check_len`).
        unsafe { self.launch(&mut b, shape, "kv_store") }
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
        if rows == 0 {
            return Ok(());
        }
        if let Some(sinks) = p.sinks
            && sinks.len() < p.n_heads
        {
            return Err(BackendError::Device {
                op: "attention".into(),
                msg: format!("{} attention sinks for {} heads", sinks.len(), p.n_heads),
            });
        }
        if p.head_dim > launch::MAX_HEAD_DIM {
            return Err(BackendError::Compile(format!(
                "head_dim {} exceeds the kernels' {}",
                p.head_dim,
                launch::MAX_HEAD_DIM
            )));
        }
        let q_width = p.n_heads * p.head_dim;
        let kv_len = p.start_pos + rows;
        let kernel = self.attn.kernel(p.kv, rows, p.n_heads, p.n_kv_heads);
        let split = match self.row_invariant {
            true => launch::attn_split_fixed(kv_len),
            false => launch::attn_split(rows, kernel.heads, kv_len, self.sm_count),
        };
        if self.row_invariant {
            let per_row = launch::attn_partial_len(1, p.n_heads, p.head_dim, split);
            let group = (launch::ATTN_FIXED_SCRATCH / per_row.max(1)).max(1);
            if rows > group {
                // A long prompt over fixed splits: its rows in launches of `group` (each
                // row's result does not depend on the others).
                for g0 in (0..rows).step_by(group) {
                    let n = (rows - g0).min(group);
                    let at = AttnParams { start_pos: p.start_pos + g0, ..*p };
                    self.attention(q, row0 + g0, n, k, v, &at, out)?;
                }
                return Ok(());
            }
        }
        let mut s = self.scratch();
        let part = self.grow(
            &mut s.partial,
            launch::attn_partial_len(rows, p.n_heads, p.head_dim, split),
            "attention scratch",
        )?;
        let pp = ptr(part, &self.stream, 0);
        let (qp, kp, vp) =
            (ptr(&q.data, &self.stream, row0 * q_width), ptr(&k.data, &self.stream, 0), ptr(&v.data, &self.stream, 0));
        let (sp, nh, nkv, hd) = (p.start_pos as u32, p.n_heads as u32, p.n_kv_heads as u32, p.head_dim as u32);
        let window = p.sliding_window.unwrap_or(0) as u32;
        let softcap = p.softcap.unwrap_or(0.0); // 0: off
        let split_len = split.split_len as u32;
        let row_len = p.kv.row_len(p.n_kv_heads * p.head_dim);
        check_len(&[k.data.len(), v.data.len()], kv_len * row_len, "attention")?;
        let mut b = self.stream.launch_builder(self.func(kernel.name)?);
        b.arg(&qp)
            .arg(&kp)
            .arg(&vp)
            .arg(&pp)
            .arg(&sp)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&p.scale)
            .arg(&softcap)
            .arg(&window)
            .arg(&split_len);
        // SAFETY: attn_partial_{f32,f16,q8_0} or attn_group_{f32,f16,q8_0}(q, k, v, part,
        // start_pos, n_heads, n_kv_heads, head_dim, scale, softcap, window, split_len) per
        // kernels/README.md, on the grid of `kernel.heads` (the group kernel only where
        // `n_kv_heads` divides `n_heads`, `Attn::kernel`): `q` points at
        // query row `row0` of `rows` rows of `n_heads × head_dim`, the caches hold
        // `start_pos + rows` rows of `n_kv_heads × head_dim` values stored as `p.kv`
        // (checked above), the scratch `rows × n_heads × splits × (head_dim + 2)`;
        // `softcap` is a plain float (0: off).
        unsafe { self.launch(&mut b, launch::attn_partial(rows, kernel.heads, split), "attention") }?;
        let (op, splits) = (ptr(&out.data, &self.stream, row0 * q_width), split.splits as u32);
        let shape = launch::attn_combine(rows, p.n_heads, p.head_dim);
        let Some(sinks) = p.sinks else {
            let mut b = self.stream.launch_builder(self.func("attn_combine_f32")?);
            b.arg(&pp).arg(&op).arg(&splits).arg(&hd);
            // SAFETY: attn_combine_f32(part, out, splits, head_dim): the partials written just
            // above; `out` from row `row0` holds `rows × n_heads × head_dim` floats.
            return unsafe { self.launch(&mut b, shape, "attention") };
        };
        // The layer's sinks, one per query head, uploaded with the call (a few hundred bytes,
        // as the rope positions are; each layer has its own).
        let slot = self.grow(&mut s.sinks, p.n_heads, "attention sinks")?;
        self.put(&sinks[..p.n_heads], slot, "attention sinks")?;
        let skp = ptr(slot, &self.stream, 0);
        let mut b = self.stream.launch_builder(self.func("attn_combine_sinks_f32")?);
        b.arg(&pp).arg(&skp).arg(&op).arg(&splits).arg(&nh).arg(&hd);
        // SAFETY: attn_combine_sinks_f32(part, sinks, out, splits, n_heads, head_dim): the
        // partials written just above; `sinks` holds `n_heads` floats (checked and uploaded
        // above), read at `h < n_heads`; `out` from row `row0` holds `rows × n_heads ×
        // head_dim` floats.
        unsafe { self.launch(&mut b, shape, "attention") }
    }

    fn delta_rule(&self, d: &DeltaRule<'_, CudaBuf>, state: &mut CudaBuf, out: &mut CudaBuf) -> BackendResult<()> {
        let sh = &d.shape;
        let (conv_dim, value_dim) = (sh.conv_dim(), sh.value_dim());
        let (r0, n) = (d.row0, d.n);
        if n == 0 {
            return Ok(());
        }
        if !launch::delta_fits(sh) {
            return Err(BackendError::Compile(format!("no delta-rule kernel for {sh:?}")));
        }
        check_len(&[d.qkvz.data.len()], (r0 + n) * sh.qkvz_len(), "delta_rule")?;
        check_len(&[d.ba.data.len()], (r0 + n) * 2 * sh.n_v_heads, "delta_rule")?;
        check_len(&[out.data.len()], (r0 + n) * value_dim, "delta_rule")?;
        check_len(&[state.data.len()], sh.state_len(), "delta_rule")?;
        let w = d.weights;
        check_len(&[w.conv.data.len()], conv_dim * sh.conv_kernel, "delta_rule")?;
        check_len(&[w.neg_a.data.len(), w.dt_bias.data.len()], sh.n_v_heads, "delta_rule")?;
        check_len(&[w.norm.data.len()], sh.v_head_dim, "delta_rule")?;
        let mut scratch = self.scratch();
        let mixed = ptr(self.grow(&mut scratch.conv, n * conv_dim, "the delta rule's convolution")?, &self.stream, 0);
        let st = &self.stream;
        let qkvz = ptr(&d.qkvz.data, st, r0 * sh.qkvz_len());
        let ba = ptr(&d.ba.data, st, r0 * 2 * sh.n_v_heads);
        let (conv_state, s) = (ptr(&state.data, st, 0), ptr(&state.data, st, conv_dim * (sh.conv_kernel - 1)));
        let o = ptr(&out.data, st, r0 * value_dim);
        let u = |x: usize| x as u32;
        let (nn, nk, nv, dk, dv, taps) =
            (u(n), u(sh.n_k_heads), u(sh.n_v_heads), u(sh.k_head_dim), u(sh.v_head_dim), u(sh.conv_kernel));
        let (qg, bg, vt) = (i32::from(sh.qkvz_grouped), i32::from(sh.ba_grouped), i32::from(sh.v_tiled));
        let cw = ptr(&w.conv.data, st, 0);
        let mut b = st.launch_builder(self.func("delta_conv_f32")?);
        b.arg(&qkvz).arg(&cw).arg(&conv_state).arg(&mixed).arg(&nn).arg(&nk).arg(&nv).arg(&dk).arg(&dv);
        b.arg(&taps).arg(&qg);
        // SAFETY: delta_conv_f32 per kernels/README.md: `qkvz` holds the n rows from `row0`
        // (checked above), `conv_w` conv_dim x taps floats, the state's first (taps - 1)
        // conv_dim floats the convolution's inputs, the scratch n x conv_dim floats.
        unsafe { self.launch(&mut b, launch::delta_conv(conv_dim), "delta_conv") }?;
        let (na, dt, nw) = (ptr(&w.neg_a.data, st, 0), ptr(&w.dt_bias.data, st, 0), ptr(&w.norm.data, st, 0));
        let mut b = st.launch_builder(self.func("delta_rule_f32")?);
        b.arg(&mixed).arg(&qkvz).arg(&ba).arg(&na).arg(&dt).arg(&nw).arg(&s).arg(&o).arg(&nn).arg(&nk).arg(&nv);
        b.arg(&dk).arg(&dv).arg(&qg).arg(&bg).arg(&vt).arg(&sh.eps);
        // SAFETY: delta_rule_f32 per kernels/README.md: the scratch holds the n convolved
        // rows, `ba` n x 2 nv floats from `row0`, `s` nv x dk x dv floats after the conv
        // state, `out` n x value_dim floats from `row0`; dk <= 256 (`delta_fits`).
        unsafe { self.launch(&mut b, launch::delta_rule(sh.n_v_heads, sh.v_head_dim), "delta_rule") }
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
                let mut l = self.stream.launch_builder(self.func("swiglu_oai_f32")?);
                l.arg(&gp).arg(&up).arg(&n32).arg(&alpha).arg(&limit);
                // SAFETY: swiglu_oai_f32(g, u, n, alpha, limit) per kernels/README.md: both
                // buffers hold at least `len` floats (checked above); the rest are plain floats.
                return unsafe { self.launch(&mut l, launch::elementwise(len), "glu") };
            }
        };
        self.elementwise(kernel, gp, up, len)
    }

    /// `matvec_glu_packed_FMT` when both weights are packed, of one format and shape,
    /// and every sequence's rows take the matrix-vector kernel (`launch::fuses_glu`):
    /// one launch per `MATVEC_MAX_ROWS` rows instead of two matvecs and a GLU.
    fn matmul_glu(
        &self,
        x: &CudaBuf,
        seq_rows: &[usize],
        gate: &CudaWeight,
        up: &CudaWeight,
        act: Activation,
        out_gate: &mut CudaBuf,
    ) -> Option<BackendResult<()>> {
        let gemm = self.blas.is_some() && !self.row_invariant;
        if !launch::fuses_glu(gate.kind(), up.kind(), seq_rows, gemm) {
            return None;
        }
        Some(self.matvec_glu(x, seq_rows.iter().sum(), gate, up, act, out_gate))
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
        check_rows(rows, row_len, x.data.len(), "add_rows")?;
        check_len(&[y.data.len()], rows.len() * row_len, "add_rows")?;
        if let Some(w) = weights
            && w.len() != rows.len()
        {
            return Err(BackendError::Device {
                op: "add_rows".into(),
                msg: format!("{} weights for {} rows", w.len(), rows.len()),
            });
        }
        if rows.is_empty() || row_len == 0 {
            return Ok(());
        }
        let (x0, list) = match rows {
            Rows::Range { start, n } if weights.is_none() => {
                let (xp, yp) = (ptr(&x.data, &self.stream, start * row_len), ptr(&y.data, &self.stream, 0));
                return self.elementwise("add_f32", xp, yp, n * row_len);
            }
            Rows::Range { start, .. } => (start * row_len, None),
            Rows::List(list) => {
                check_distinct(list, "add_rows")?;
                (0, Some(list))
            }
        };
        let (len32, n32) = (to_u32(row_len, "add_rows")?, to_u32(rows.len(), "add_rows")?);
        let mut s = self.scratch();
        // Left null: no list (a range: row `i` past `x`'s offset), no weights (weight 1).
        let mut ip = 0u64;
        if let Some(list) = list {
            let ids = self.grow(&mut s.row_ids, list.len(), "add_rows row list")?;
            self.put(list, ids, "add_rows row list")?;
            ip = ptr(ids, &self.stream, 0);
        }
        let mut wp = 0u64;
        if let Some(w) = weights {
            let slot = self.grow(&mut s.row_weights, w.len(), "add_rows weights")?;
            self.put(w, slot, "add_rows weights")?;
            wp = ptr(slot, &self.stream, 0);
        }
        let (xp, yp) = (ptr(&x.data, &self.stream, x0), ptr(&y.data, &self.stream, 0));
        let mut b = self.stream.launch_builder(self.func("add_rows_f32")?);
        b.arg(&xp).arg(&yp).arg(&ip).arg(&wp).arg(&len32).arg(&n32);
        // SAFETY: add_rows_f32(x, y, rows, w, row_len, n_rows): every destination row (a
        // listed one, or `start + i` for a range, `x` then pointing at row `start`) is
        // below `x`'s row count (`check_rows`), and listed rows are distinct
        // (`check_distinct`), so each row has one writer and nothing else is written; `y` holds
        // `n_rows × row_len` floats (`check_len`); the row ids and weights (exactly
        // `n_rows`, checked above) were just uploaded to scratch, or are null (identity
        // rows, weight 1), which the kernel tests for.
        unsafe { self.launch(&mut b, launch::rows(rows.len(), row_len), "add_rows") }
    }
}

/// One cuBLAS product `y[rows, out] = x[rows, in] · w[out, in]ᵀ` on row-major data,
/// `y`'s rows `ldc` apart.
#[derive(Clone, Copy)]
struct GemmShape {
    out: usize,
    rows: usize,
    inn: usize,
    ldc: usize,
}

/// `cublasGemmEx` on device addresses: in cuBLAS's column-major terms C(out × rows) =
/// Wᵀ · X with W (in × out, ld in), X (in × rows, ld in) and C (ld `ldc`), accumulated in
/// f32. `w` and `x` carry their element types.
fn gemm_ex(
    blas: &cudarc::cublas::CudaBlas,
    g: GemmShape,
    w: (u64, cudarc::cublas::sys::cudaDataType),
    x: (u64, cudarc::cublas::sys::cudaDataType),
    y: u64,
) -> BackendResult<()> {
    use cudarc::cublas::sys as cb;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: `w` holds `out × in` values and `x` `rows × in` of their types, `y` has
    // `rows` rows of `ldc ≥ out` floats (the callers size them so); all were written
    // on the stream the handle is bound to, which orders this call after them.
    let status = unsafe {
        cb::cublasGemmEx(
            *blas.handle(),
            cb::cublasOperation_t::CUBLAS_OP_T,
            cb::cublasOperation_t::CUBLAS_OP_N,
            g.out as i32,
            g.rows as i32,
            g.inn as i32,
            &alpha as *const f32 as *const _,
            w.0 as *const _,
            w.1,
            g.inn as i32,
            x.0 as *const _,
            x.1,
            g.inn as i32,
            &beta as *const f32 as *const _,
            y as *mut _,
            cb::cudaDataType::CUDA_R_32F,
            g.ldc as i32,
            cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    if status == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    let what = format!("cuBLAS GEMM ({}×{} by {}×{})", g.rows, g.inn, g.out, g.inn);
    Err(match status {
        cb::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED => {
            BackendError::OutOfMemory { what, bytes: 0, msg: format!("{status:?}") }
        }
        _ => BackendError::Device { op: what, msg: format!("{status:?}") },
    })
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
