//! Opening a device: the driver, NVRTC and cuBLAS found and checked, a context and its
//! stream, every kernel compiled (or read from the cache) and loaded.

use super::*;

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
        crate::cuda::libs::preload();
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
        // Graphs are captured on a stream of the backend's own (the legacy default stream
        // cannot be captured); they need the page-locked staging for their small copies.
        let graphs = strata_tensor::env::CUDA_GRAPHS.switch() == Some(true)
            && strata_tensor::env::CUDA_STAGING.switch() != Some(false);
        let stream = match graphs {
            true => ctx.new_stream().map_err(dev_err)?,
            false => ctx.default_stream(),
        };
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
        let staging = crate::cuda::staging::Staging::from_env(&stream).map_err(dev_err)?.map(Mutex::new);
        tracing::info!(
            device = ordinal,
            gpu = %gpu_name,
            sm = format!("{major}.{minor}"),
            sm_count,
            ?matvec,
            ?attn,
            staging = staging.is_some(),
            graphs,
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
                positions_host: Vec::new(),
                freqs: None,
                partial: None,
                w16: None,
                x16: None,
                top: None,
                repack: None,
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
            graphs: graphs.then(Mutex::default),
            capturing: Default::default(),
            tape: Mutex::default(),
            refusal: Default::default(),
            launch_latency: std::sync::OnceLock::new(),
            h2d: std::sync::OnceLock::new(),
            gds: std::sync::OnceLock::new(),
        })
    }
}

/// Compiles (or reads from the cache) every kernel file for `arch` and loads the
/// functions the backend launches.
fn load_kernels(ctx: &Arc<CudaContext>, arch: (u32, u32)) -> BackendResult<HashMap<String, CudaFunction>> {
    use crate::cuda::{kernels, nvrtc};
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
