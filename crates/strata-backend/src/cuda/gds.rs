//! GPUDirect Storage reads through cuFile: file bytes into device memory without a host
//! staging buffer of ours.
//!
//! cuFile (`libcufile.so.{1,0}`) is found and kept loaded by [`libs`]; its few functions
//! used here are resolved from that already-loaded object (never loading a second copy)
//! through a small `#[repr(C)]` surface checked against cufile.h below. Nothing here
//! needs a GPU to compile or to fail cleanly: without the driver, a GPU or cuFile, every
//! entry point returns an error saying which is missing.
//!
//! cuFile works in one of two ways ([`GdsMode`]): `Direct`, where the nvidia-fs kernel
//! module DMAs from NVMe into GPU memory, and `Compat`, cuFile's compatibility mode, where
//! it reads with POSIX calls into its own bounce buffers and copies them to the GPU.
//! Either way a read lands in device memory; only `Direct` skips the host.
//!
//! What the caller must have done: see [`Gds::open`]. In short, the CUDA driver is
//! initialised and a context (the one owning the device memory) is current on the calling
//! thread for every call that touches device memory, and stays alive while cuFile is used.

use std::ffi::{c_int, c_uint, c_void};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use libloading::os::unix::{Library, RTLD_NOW};
use serde::Serialize;

use super::libs;

/// How cuFile moves bytes on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdsMode {
    /// DMA from NVMe straight into GPU memory (nvidia-fs loaded, filesystem supported).
    Direct,
    /// cuFile's compatibility mode: POSIX reads through cuFile's own bounce buffers (no
    /// P2P).
    Compat,
}

impl GdsMode {
    /// `"direct"` or `"compat"`, as `strata doctor --json` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            GdsMode::Direct => "direct",
            GdsMode::Compat => "compat",
        }
    }
}

/// The mode cuFile runs in, from what the driver reports.
///
/// - `nvfs` is `CUfileDrvProps_t.nvfs.{major,minor}_version` from
///   `cuFileDriverGetProperties`: the version of the nvidia-fs kernel module, `0.0` when
///   it is not loaded. NVIDIA's kvikio tests GDS availability the same way
///   (`DriverProperties::is_gds_available` in cpp/src/cufile/driver.cpp: "If both the
///   major and minor version is zero, the GDS driver isn't loaded"), and the cuFile API
///   reference lists "deployments where nvidia-fs.ko is not loaded" as a compatibility-mode
///   case (docs.nvidia.com/gpudirect-storage/api-reference-guide, "cuFile Compatibility
///   Mode").
/// - `force_compat` is cuFile's `properties.force_compat_mode` setting (cufile.json, or
///   the `CUFILE_FORCE_COMPAT_MODE` environment variable that overrides it), which sends
///   all I/O through compatibility mode even with nvidia-fs loaded.
pub fn mode_from(nvfs: (u32, u32), force_compat: bool) -> GdsMode {
    if nvfs == (0, 0) || force_compat { GdsMode::Compat } else { GdsMode::Direct }
}

/// `CUFILE_FORCE_COMPAT_MODE`'s value as a boolean (`None`: unset or not a boolean).
fn env_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

// ---- The cuFile ABI (cufile.h), checked against cudarc 0.19.10's generated bindings ----

/// `CUfileError_t`: `{ CUfileOpError err; CUresult cu_err; }` (two C enums), returned by
/// value. Kept as plain integers: a library newer than our list may return any code.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CuFileError {
    err: c_int,
    cu_err: c_int,
}
const _: () = assert!(size_of::<CuFileError>() == 8);

/// `CU_FILE_SUCCESS`.
const CU_FILE_SUCCESS: c_int = 0;
/// `CU_FILE_DRIVER_ALREADY_OPEN`: someone in this process opened the driver first.
const CU_FILE_DRIVER_ALREADY_OPEN: c_int = 5026;
/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD` of `CUfileFileHandleType`.
const CU_FILE_HANDLE_TYPE_OPAQUE_FD: c_uint = 1;
/// `CUFILE_PARAM_FORCE_COMPAT_MODE` of `CUFileBoolConfigParameter_t` (cuFile ≥ 1.14).
const CUFILE_PARAM_FORCE_COMPAT_MODE: c_uint = 2;

/// The `nvfs` member of `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct NvfsProps {
    major_version: c_uint,
    minor_version: c_uint,
    poll_thresh_size: usize,
    max_direct_io_size: usize,
    dstatusflags: c_uint,
    dcontrolflags: c_uint,
}

/// `CUfileDrvProps_t` (layout of cufile.h since CUDA 11.6, unchanged through 13.x), with
/// slack after it: the library writes the whole struct it knows, so a newer one with more
/// fields still writes into our memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DrvProps {
    nvfs: NvfsProps,
    fflags: c_uint,
    max_device_cache_size: c_uint,
    per_buffer_cache_size: c_uint,
    max_device_pinned_mem_size: c_uint,
    max_batch_io_size: c_uint,
    max_batch_io_timeout_msecs: c_uint,
    _slack: [u64; 16],
}
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<NvfsProps>() == 32);
    assert!(offset_of!(NvfsProps, poll_thresh_size) == 8);
    assert!(offset_of!(NvfsProps, dstatusflags) == 24);
    assert!(offset_of!(NvfsProps, dcontrolflags) == 28);
    assert!(offset_of!(DrvProps, fflags) == 32);
    assert!(offset_of!(DrvProps, max_batch_io_timeout_msecs) == 52);
    assert!(offset_of!(DrvProps, _slack) == 56);
};

/// The `handle` union of `CUfileDescr_t`: `{ int fd; void *handle; }`.
#[repr(C)]
#[derive(Clone, Copy)]
union DescrHandle {
    fd: c_int,
    handle: *mut c_void,
}

/// `CUfileDescr_t`: `{ CUfileFileHandleType type; union handle; const CUfileFSOps_t *fs_ops; }`.
#[repr(C)]
struct Descr {
    handle_type: c_uint,
    handle: DescrHandle,
    fs_ops: *const c_void,
}
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<Descr>() == 24);
    assert!(offset_of!(Descr, handle) == 8);
    assert!(offset_of!(Descr, fs_ops) == 16);
};

/// `CUfileHandle_t`: an opaque pointer.
type Handle = *mut c_void;

type DriverOpenFn = unsafe extern "C" fn() -> CuFileError;
type GetPropertiesFn = unsafe extern "C" fn(*mut DrvProps) -> CuFileError;
type HandleRegisterFn = unsafe extern "C" fn(*mut Handle, *mut Descr) -> CuFileError;
type HandleDeregisterFn = unsafe extern "C" fn(Handle);
type BufRegisterFn = unsafe extern "C" fn(*const c_void, usize, c_int) -> CuFileError;
type BufDeregisterFn = unsafe extern "C" fn(*const c_void) -> CuFileError;
/// `ssize_t cuFileRead(CUfileHandle_t, void *bufPtr_base, size_t, off_t file_offset,
/// off_t bufPtr_offset)`.
type ReadFn = unsafe extern "C" fn(Handle, *mut c_void, usize, i64, i64) -> isize;
/// `CUfileError_t cuFileGetParameterBool(CUFileBoolConfigParameter_t, bool *)`; read
/// through a byte so any non-zero value counts as true.
type GetParameterBoolFn = unsafe extern "C" fn(c_uint, *mut u8) -> CuFileError;

/// The cuFile functions used here, resolved once from the loaded library.
struct Api {
    driver_open: DriverOpenFn,
    get_properties: GetPropertiesFn,
    handle_register: HandleRegisterFn,
    handle_deregister: HandleDeregisterFn,
    buf_register: BufRegisterFn,
    buf_deregister: BufDeregisterFn,
    read: ReadFn,
    /// Absent before cuFile 1.14 (CUDA 12.9).
    get_parameter_bool: Option<GetParameterBoolFn>,
    /// Keeps the library mapped while the pointers above are used (`libs` keeps it loaded
    /// for the process anyway).
    _lib: Library,
}

impl Api {
    /// Resolves the functions from the copy of cuFile that `libs` preloaded.
    fn load() -> Result<Api, String> {
        let info = libs::report().cufile;
        let Some(path) = info.path.filter(|_| info.present) else {
            return Err(format!("no cuFile: {}", info.reason.unwrap_or_else(|| "libcufile.so not found".into())));
        };
        // SAFETY: RTLD_NOLOAD only returns a handle to an object already in the process (the
        // one `libs` preloaded), so no initialiser runs; the handle keeps it mapped while we
        // hold it.
        let lib = unsafe { Library::open(Some(&path), RTLD_NOW | libc::RTLD_NOLOAD) }
            .map_err(|e| format!("{}: cuFile is no longer loaded: {e}", path.display()))?;
        fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
            // SAFETY: each `T` at the call sites below is the C signature cufile.h declares
            // for `name`; the pointer stays valid while `lib` (stored beside it) is held.
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| format!("cuFile lacks {name} (too old a libcufile?): {e}"))
        }
        Ok(Api {
            driver_open: sym(&lib, "cuFileDriverOpen")?,
            get_properties: sym(&lib, "cuFileDriverGetProperties")?,
            handle_register: sym(&lib, "cuFileHandleRegister")?,
            handle_deregister: sym(&lib, "cuFileHandleDeregister")?,
            buf_register: sym(&lib, "cuFileBufRegister")?,
            buf_deregister: sym(&lib, "cuFileBufDeregister")?,
            read: sym(&lib, "cuFileRead")?,
            get_parameter_bool: sym(&lib, "cuFileGetParameterBool").ok(),
            _lib: lib,
        })
    }
}

/// The name of a `CUfileOpError` code (cufile.h), where we know it.
fn op_error_name(code: c_int) -> Option<&'static str> {
    Some(match code {
        0 => "CU_FILE_SUCCESS",
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5002 => "CU_FILE_DRIVER_INVALID_PROPS",
        5003 => "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        5004 => "CU_FILE_DRIVER_VERSION_MISMATCH",
        5005 => "CU_FILE_DRIVER_VERSION_READ_ERROR",
        5006 => "CU_FILE_DRIVER_CLOSING",
        5007 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5008 => "CU_FILE_IO_NOT_SUPPORTED",
        5009 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5010 => "CU_FILE_NVFS_DRIVER_ERROR",
        5011 => "CU_FILE_CUDA_DRIVER_ERROR",
        5012 => "CU_FILE_CUDA_POINTER_INVALID",
        5013 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5014 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5015 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5016 => "CU_FILE_INVALID_MAPPING_SIZE",
        5017 => "CU_FILE_INVALID_MAPPING_RANGE",
        5018 => "CU_FILE_INVALID_FILE_TYPE",
        5019 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5020 => "CU_FILE_DIO_NOT_SET",
        5021 => "CU_FILE_EXPECTED_FILE_MODE",
        5022 => "CU_FILE_INVALID_VALUE",
        5023 => "CU_FILE_MEMORY_ALREADY_REGISTERED",
        5024 => "CU_FILE_MEMORY_NOT_REGISTERED",
        5025 => "CU_FILE_PERMISSION_DENIED",
        5026 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5028 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5029 => "CU_FILE_DEVICE_NOT_FOUND",
        5030 => "CU_FILE_INTERNAL_ERROR",
        5031 => "CU_FILE_GETNEWFD_FAILED",
        5033 => "CU_FILE_NVFS_SETUP_ERROR",
        5034 => "CU_FILE_IO_DISABLED",
        5035 => "CU_FILE_BATCH_SUBMIT_FAILED",
        5036 => "CU_FILE_GPU_MEMORY_PINNING_FAILED",
        5037 => "CU_FILE_BATCH_FULL",
        5038 => "CU_FILE_ASYNC_NOT_SUPPORTED",
        5043 => "CU_FILE_NOMEM_ERROR",
        5044 => "CU_FILE_IO_ERROR",
        5047 => "CU_FILE_INVALID_CONTEXT_ERROR",
        5048 => "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR",
        _ => return None,
    })
}

/// What a user can do about the commonest codes.
fn op_error_hint(code: c_int) -> Option<&'static str> {
    Some(match code {
        5001 => {
            "the nvidia-fs kernel module is not loaded; load it (modprobe nvidia-fs) or allow \
             cuFile's compatibility mode (\"allow_compat_mode\": true in /etc/cufile.json)"
        }
        5009 => "this GPU does not support GPUDirect Storage",
        5015 | 5047 => "the current CUDA context does not own this memory; bind the right context first",
        5019 | 5020 => "the file was not opened with O_DIRECT",
        5018 => "cuFile cannot read this kind of file",
        5012..=5014 => "the address is not device memory from cuMemAlloc",
        _ => return None,
    })
}

/// `CU_FILE_…_ERROR (50xx): hint, CUDA error N` for a failed call.
fn describe(e: CuFileError) -> String {
    let mut s = match op_error_name(e.err) {
        Some(name) => format!("{name} ({})", e.err),
        None => format!("cuFile error {}", e.err),
    };
    if let Some(h) = op_error_hint(e.err) {
        s.push_str(&format!(": {h}"));
    }
    if e.cu_err != 0 {
        s.push_str(&format!(" (CUDA error {})", e.cu_err));
    }
    s
}

fn check(what: &str, e: CuFileError) -> Result<(), String> {
    if e.err == CU_FILE_SUCCESS { Ok(()) } else { Err(format!("{what} failed: {}", describe(e))) }
}

/// Errors unless a CUDA context is current on the calling thread (cuFile needs one: its
/// API reference says "the APIs with GPU buffers should be called in a valid CUDA
/// context", and cuFileDriverOpen fails without one, rapidsai/cudf#14140).
fn require_context() -> Result<(), String> {
    use cudarc::driver::sys::{CUresult, cuCtxGetCurrent};
    if !libs::driver_present() {
        return Err("no NVIDIA driver: libcuda.so.1 not found".into());
    }
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the driver is present (checked above); `ctx` is a valid out-pointer.
    let rc = unsafe { cuCtxGetCurrent(&mut ctx) };
    match rc {
        CUresult::CUDA_SUCCESS if !ctx.is_null() => Ok(()),
        CUresult::CUDA_SUCCESS => Err("no CUDA context is current on this thread: create or bind one \
                                      (CudaContext::new / bind_to_thread) before using cuFile"
            .into()),
        rc => Err(format!("the CUDA driver is not initialised ({rc:?}): create a CUDA context before using cuFile")),
    }
}

/// Whether `[ptr, ptr + len)` lies inside the allocation `[start, start + size)`.
fn range_within(start: u64, size: u64, ptr: u64, len: u64) -> bool {
    match (start.checked_add(size), ptr.checked_add(len)) {
        (Some(alloc_end), Some(end)) => ptr >= start && end <= alloc_end,
        _ => false,
    }
}

/// Errors unless `[ptr, ptr + len)` is plain device memory inside one allocation, so that
/// cuFile can only ever write GPU memory (never host memory: cuFile may accept host
/// buffers where `allow_system_memory` is set).
fn check_device_range(ptr: u64, len: usize) -> Result<(), String> {
    use cudarc::driver::sys::{CUmemorytype, CUpointer_attribute as A, CUresult, cuPointerGetAttribute};
    let attr = |attribute: A, out: *mut c_void| -> Result<(), String> {
        // SAFETY: the driver is present (the caller checked a context is current); `out`
        // points at a zeroed u64, wide enough for every attribute asked for here (an
        // unsigned int, a bool, a CUdeviceptr or a size_t).
        let rc = unsafe { cuPointerGetAttribute(out, attribute, ptr) };
        if rc == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{ptr:#x} is not CUDA device memory ({attribute:?}: {rc:?})"))
        }
    };
    let (mut mem_type, mut managed, mut start, mut size) = (0u64, 0u64, 0u64, 0u64);
    attr(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (&mut mem_type as *mut u64).cast())?;
    attr(A::CU_POINTER_ATTRIBUTE_IS_MANAGED, (&mut managed as *mut u64).cast())?;
    attr(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (&mut start as *mut u64).cast())?;
    attr(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, (&mut size as *mut u64).cast())?;
    // CUmemorytype is an unsigned int: only the low 32 bits were written.
    if mem_type as u32 != CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 || managed != 0 {
        return Err(format!("{ptr:#x} is not plain device memory (managed or host memory)"));
    }
    if !range_within(start, size, ptr, len as u64) {
        return Err(format!(
            "{len} bytes at {ptr:#x} run past the device allocation [{start:#x}, {:#x})",
            start.saturating_add(size)
        ));
    }
    Ok(())
}

/// The cuFile driver, opened once per process.
pub struct Gds {
    api: Api,
    mode: GdsMode,
    /// nvidia-fs `(major, minor)`; `(0, 0)` when it is not loaded.
    nvfs: (u32, u32),
}

/// The driver once opened: it stays open for the life of the process (cuFile closes it
/// when the library unloads at exit).
static OPENED: Mutex<Option<Arc<Gds>>> = Mutex::new(None);

impl Gds {
    /// Opens the cuFile driver (cuFileDriverOpen) once per process and reads its
    /// properties to tell [`GdsMode::Direct`] from [`GdsMode::Compat`]; later calls return
    /// the same driver. Err (a sentence a user can act on) when the NVIDIA driver or cuFile
    /// is absent or the cuFile driver does not open; a failed open is not remembered, so a
    /// caller can fix the cause and call again. Never panics.
    ///
    /// The caller must first have initialised the CUDA driver and made a context current
    /// on this thread (`CudaContext::new(ordinal)` does both; otherwise
    /// `bind_to_thread()`), and must keep that context alive while cuFile is used: the
    /// driver stays open for the process. Every later call that touches device memory
    /// ([`Gds::register_buffer`], [`GdsFile::read`]) needs the context owning that memory
    /// current on its thread.
    pub fn open() -> Result<Arc<Gds>, String> {
        let mut slot = OPENED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = slot.as_ref() {
            return Ok(g.clone());
        }
        let gds = Arc::new(Gds::open_driver()?);
        *slot = Some(gds.clone());
        Ok(gds)
    }

    /// The driver if [`Gds::open`] already succeeded in this process.
    fn opened() -> Option<Arc<Gds>> {
        OPENED.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn open_driver() -> Result<Gds, String> {
        if !libs::driver_present() {
            return Err("no NVIDIA driver: libcuda.so.1 not found".into());
        }
        let api = Api::load()?;
        require_context()?;
        // SAFETY: cuFile is loaded and the function has this signature (cufile.h); a
        // context is current, which cuFileDriverOpen needs.
        let rc = unsafe { (api.driver_open)() };
        if rc.err != CU_FILE_DRIVER_ALREADY_OPEN {
            check("cuFileDriverOpen", rc)?;
        }
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut props: DrvProps = unsafe { std::mem::zeroed() };
        // SAFETY: the driver is open; `props` is a valid out-pointer at least as large as
        // cufile.h's CUfileDrvProps_t (checked by the layout asserts above).
        check("cuFileDriverGetProperties", unsafe { (api.get_properties)(&mut props) })?;
        let nvfs = (props.nvfs.major_version, props.nvfs.minor_version);
        let force_compat = force_compat_mode(&api);
        let mode = mode_from(nvfs, force_compat);
        tracing::debug!(?nvfs, force_compat, ?mode, "cuFile driver opened");
        Ok(Gds { api, mode, nvfs })
    }

    /// The driver's mode. `Direct` is per driver: a file on a filesystem nvidia-fs does not
    /// serve (tmpfs, overlayfs, …) still goes through compatibility mode where cuFile allows
    /// it (`allow_compat_mode`, true by default), and fails to register where it does not.
    pub fn mode(&self) -> GdsMode {
        self.mode
    }

    /// The nvidia-fs kernel module's version, `None` when it is not loaded.
    pub fn nvidia_fs_version(&self) -> Option<(u32, u32)> {
        (self.nvfs != (0, 0)).then_some(self.nvfs)
    }

    /// Opens `path` with O_DIRECT (read-only) and registers it (cuFileHandleRegister).
    /// Err names the file.
    pub fn open_file(self: &Arc<Self>, path: &Path) -> Result<GdsFile, String> {
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).map_err(|e| {
            let why = if e.raw_os_error() == Some(libc::EINVAL) {
                "the filesystem does not support O_DIRECT".to_string()
            } else {
                e.to_string()
            };
            format!("{}: cannot open for GPUDirect Storage (O_DIRECT): {why}", path.display())
        })?;
        let mut descr = Descr {
            handle_type: CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            // The widest member first, so every byte of the union is initialised.
            handle: DescrHandle { handle: std::ptr::null_mut() },
            fs_ops: std::ptr::null(),
        };
        descr.handle.fd = file.as_raw_fd();
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: the driver is open; `handle` and `descr` are valid pointers for the call,
        // and `descr` names an open fd that `file` keeps open until after deregistration.
        let rc = unsafe { (self.api.handle_register)(&mut handle, &mut descr) };
        check("cuFileHandleRegister", rc).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(GdsFile { gds: self.clone(), handle, path: path.to_path_buf(), _file: file })
    }

    /// Registers `len` bytes of device memory at `dev_ptr` (cuFileBufRegister) for repeated
    /// reads; the returned guard deregisters on drop. The memory must stay allocated until
    /// the guard is dropped, and its context must be current on this thread.
    pub fn register_buffer(self: &Arc<Self>, dev_ptr: u64, len: usize) -> Result<GdsBuffer, String> {
        let fail = |e: String| format!("registering {len} bytes of device memory at {dev_ptr:#x}: {e}");
        require_context().map_err(fail)?;
        check_device_range(dev_ptr, len).map_err(fail)?;
        // SAFETY: the driver is open; `[dev_ptr, dev_ptr + len)` is device memory inside one
        // allocation (checked above). Registration only pins it for cuFile's DMA.
        let rc = unsafe { (self.api.buf_register)(dev_ptr as *const c_void, len, 0) };
        check("cuFileBufRegister", rc).map_err(fail)?;
        Ok(GdsBuffer { gds: self.clone(), dev_ptr, len })
    }
}

/// cuFile's `force_compat_mode` setting: asked of the library where it can tell
/// (cuFileGetParameterBool, cuFile ≥ 1.14, which sees cufile.json and the environment),
/// else read from `CUFILE_FORCE_COMPAT_MODE` (false when unset: cufile.json's default).
fn force_compat_mode(api: &Api) -> bool {
    if let Some(get) = api.get_parameter_bool {
        let mut v: u8 = 0;
        // SAFETY: the function has this signature (cufile.h, C `bool` is one byte); `v` is
        // a valid out-pointer; the driver is open.
        if unsafe { get(CUFILE_PARAM_FORCE_COMPAT_MODE, &mut v) }.err == CU_FILE_SUCCESS {
            return v != 0;
        }
    }
    std::env::var("CUFILE_FORCE_COMPAT_MODE").ok().and_then(|v| env_bool(&v)).unwrap_or(false)
}

/// A file registered with cuFile; deregisters the handle and closes the fd on drop.
pub struct GdsFile {
    gds: Arc<Gds>,
    handle: Handle,
    path: PathBuf,
    /// Closed after the handle is deregistered (fields drop after `Drop::drop`).
    _file: File,
}

// SAFETY: `handle` is an opaque token into cuFile's own table, only ever passed back to
// cuFile, whose API reference states "All APIs are thread-safe"; the rest is Send + Sync.
unsafe impl Send for GdsFile {}
// SAFETY: as above; `read` takes `&self` and cuFileRead may run concurrently on a handle.
unsafe impl Sync for GdsFile {}

impl GdsFile {
    /// Reads `len` bytes at `file_offset` into device memory at `dev_ptr` (+ `dev_offset`),
    /// synchronously (cuFileRead), looping over short reads. Returns the bytes read: `len`,
    /// or fewer only when the file ends first. Err names the file and the offset.
    ///
    /// Offsets and lengths need not be 4 KiB aligned for correctness, but only 4 KiB
    /// aligned file offsets, device addresses and lengths (and a buffer registered with
    /// [`Gds::register_buffer`]) give a P2P DMA in [`GdsMode::Direct`]; anything else goes
    /// through cuFile's bounce buffers. The context owning `dev_ptr` must be current on
    /// this thread; `[dev_ptr + dev_offset, + len)` must lie in one device allocation
    /// (checked).
    pub fn read(&self, dev_ptr: u64, dev_offset: usize, len: usize, file_offset: u64) -> Result<usize, String> {
        let at = |off: u64, e: String| format!("{}: reading {len} bytes at offset {off}: {e}", self.path.display());
        let fits = |start: u64| start.checked_add(len as u64).is_some_and(|end| end <= i64::MAX as u64);
        if !fits(file_offset) || !fits(dev_offset as u64) {
            return Err(at(file_offset, "offset + length overflows off_t".into()));
        }
        let target =
            dev_ptr.checked_add(dev_offset as u64).ok_or_else(|| at(file_offset, "address overflows".into()))?;
        require_context().map_err(|e| at(file_offset, e))?;
        check_device_range(target, len).map_err(|e| at(file_offset, e))?;
        let mut done = 0usize;
        while done < len {
            let off = file_offset + done as u64;
            // SAFETY: the handle is registered (deregistered only on drop); the destination
            // `[dev_ptr + dev_offset + done, + len - done)` is inside one device allocation
            // (checked above); both offsets fit off_t (checked above).
            let n = unsafe {
                (self.gds.api.read)(
                    self.handle,
                    dev_ptr as *mut c_void,
                    len - done,
                    off as i64,
                    (dev_offset + done) as i64,
                )
            };
            match n {
                0 => break, // end of file
                n if n > 0 => done += (n as usize).min(len - done),
                -1 => {
                    // -1: a system error, in errno (cuFile API reference, cuFileRead).
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(at(off, e.to_string()));
                    }
                }
                n => {
                    // Any other negative value is -CUfileOpError.
                    let code = n.checked_neg().and_then(|v| c_int::try_from(v).ok()).unwrap_or(c_int::MAX);
                    return Err(at(
                        off,
                        format!("cuFileRead failed: {}", describe(CuFileError { err: code, cu_err: 0 })),
                    ));
                }
            }
        }
        Ok(done)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for GdsFile {
    fn drop(&mut self) {
        // SAFETY: the handle was registered by `open_file` and is deregistered only here;
        // the fd it refers to is still open (`_file` drops after this).
        unsafe { (self.gds.api.handle_deregister)(self.handle) };
    }
}

/// Device memory registered with cuFile; deregisters on drop.
pub struct GdsBuffer {
    gds: Arc<Gds>,
    dev_ptr: u64,
    len: usize,
}

impl GdsBuffer {
    pub fn dev_ptr(&self) -> u64 {
        self.dev_ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for GdsBuffer {
    fn drop(&mut self) {
        // SAFETY: `dev_ptr` was registered by `register_buffer` and is deregistered only
        // here; cuFile reports (does not crash on) an address it no longer knows.
        let rc = unsafe { (self.gds.api.buf_deregister)(self.dev_ptr as *const c_void) };
        if let Err(e) = check("cuFileBufDeregister", rc) {
            tracing::warn!(dev_ptr = self.dev_ptr, "{e}");
        }
    }
}

/// GPUDirect Storage as `strata doctor` reports it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct GdsReport {
    /// Whether the cuFile driver opened.
    pub available: bool,
    /// `"direct"` or `"compat"` when available.
    pub mode: Option<&'static str>,
    /// The nvidia-fs kernel module's `MAJOR.MINOR` when loaded.
    pub nvidia_fs_version: Option<String>,
    /// Why GDS is unavailable: no GPU, no cuFile, or the driver did not open.
    pub reason: Option<String>,
}

impl GdsReport {
    fn unavailable(reason: String) -> GdsReport {
        GdsReport { available: false, mode: None, nvidia_fs_version: None, reason: Some(reason) }
    }

    fn of(gds: &Gds) -> GdsReport {
        GdsReport {
            available: true,
            mode: Some(gds.mode().as_str()),
            nvidia_fs_version: gds.nvidia_fs_version().map(|(a, b)| format!("{a}.{b}")),
            reason: None,
        }
    }
}

/// The CUDA context `report` created for cuFileDriverOpen, kept alive with the driver.
static REPORT_CONTEXT: OnceLock<Arc<cudarc::driver::CudaContext>> = OnceLock::new();

/// Whether GDS works here and how: opens the cuFile driver only when the NVIDIA driver
/// lists a GPU and cuFile is present, creating (and keeping) GPU 0's primary context for
/// it. Never panics; an unavailable report says why.
pub fn report() -> GdsReport {
    match probe() {
        Ok(gds) => GdsReport::of(&gds),
        Err(reason) => GdsReport::unavailable(reason),
    }
}

fn probe() -> Result<Arc<Gds>, String> {
    if let Some(gds) = Gds::opened() {
        return Ok(gds);
    }
    let gpus = libs::gpus().map_err(|e| format!("no GPU: {e}"))?;
    if gpus.is_empty() {
        return Err("no GPU: the driver lists no device".into());
    }
    if !libs::cufile_present() {
        let reason = libs::report().cufile.reason.unwrap_or_else(|| "libcufile.so not found".into());
        return Err(format!("no cuFile: {reason}"));
    }
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| format!("cannot create a CUDA context on GPU 0: {e}"))?;
    let gds = Gds::open().map_err(|e| format!("the cuFile driver did not open: {e}"))?;
    let _ = REPORT_CONTEXT.set(ctx);
    Ok(gds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_follows_nvidia_fs_and_forced_compat() {
        assert_eq!(mode_from((0, 0), false), GdsMode::Compat, "nvidia-fs not loaded");
        assert_eq!(mode_from((0, 0), true), GdsMode::Compat);
        assert_eq!(mode_from((2, 17), false), GdsMode::Direct);
        assert_eq!(mode_from((0, 1), false), GdsMode::Direct, "a 0.x module is still loaded");
        assert_eq!(mode_from((2, 17), true), GdsMode::Compat, "force_compat_mode wins");
        assert_eq!(GdsMode::Direct.as_str(), "direct");
        assert_eq!(GdsMode::Compat.as_str(), "compat");
    }

    #[test]
    fn force_compat_env_values() {
        assert_eq!(env_bool("true"), Some(true));
        assert_eq!(env_bool(" TRUE "), Some(true));
        assert_eq!(env_bool("1"), Some(true));
        assert_eq!(env_bool("false"), Some(false));
        assert_eq!(env_bool("0"), Some(false));
        assert_eq!(env_bool(""), None);
        assert_eq!(env_bool("maybe"), None);
    }

    #[test]
    fn errors_are_named_with_a_hint() {
        let e = describe(CuFileError { err: 5001, cu_err: 0 });
        assert!(e.starts_with("CU_FILE_DRIVER_NOT_INITIALIZED (5001): ") && e.contains("nvidia-fs"), "{e}");
        let e = describe(CuFileError { err: 5011, cu_err: 201 });
        assert_eq!(e, "CU_FILE_CUDA_DRIVER_ERROR (5011) (CUDA error 201)");
        assert_eq!(describe(CuFileError { err: 4242, cu_err: 0 }), "cuFile error 4242");
        assert!(check("cuFileDriverOpen", CuFileError { err: 0, cu_err: 0 }).is_ok());
        let err = check("cuFileDriverOpen", CuFileError { err: 5009, cu_err: 0 }).unwrap_err();
        assert!(err.starts_with("cuFileDriverOpen failed: CU_FILE_DEVICE_NOT_SUPPORTED"), "{err}");
    }

    #[test]
    fn device_ranges_stay_inside_the_allocation() {
        assert!(range_within(0x1000, 0x1000, 0x1000, 0x1000));
        assert!(range_within(0x1000, 0x1000, 0x1800, 0x800));
        assert!(range_within(0x1000, 0x1000, 0x1fff, 0));
        assert!(!range_within(0x1000, 0x1000, 0x1800, 0x801), "past the end");
        assert!(!range_within(0x1000, 0x1000, 0xfff, 1), "before the start");
        assert!(!range_within(0x1000, u64::MAX, 0x1000, 1), "allocation end overflows");
        assert!(!range_within(0, 0x1000, u64::MAX, 2), "range end overflows");
    }

    #[test]
    fn nothing_panics_without_a_gpu_and_the_report_says_why() {
        let r = report();
        assert_eq!(r.available, r.reason.is_none(), "{r:?}");
        assert_eq!(r.available, r.mode.is_some(), "{r:?}");
        if !libs::driver_present() {
            let reason = r.reason.as_deref().unwrap_or_default();
            assert!(reason.starts_with("no GPU: ") && reason.contains("libcuda.so.1"), "{reason}");
            let err = Gds::open().err().unwrap_or_default();
            assert!(err.starts_with("no NVIDIA driver"), "{err}");
        }
        let json = serde_json::to_value(&r).unwrap();
        for key in ["available", "mode", "nvidia_fs_version", "reason"] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
    }
}
