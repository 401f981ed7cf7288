//! Finding the CUDA libraries before cudarc looks for them.
//!
//! cudarc (`dynamic-loading`) `dlopen()`s bare names (`libnvrtc.so`, …, `libnvrtc.so.13`,
//! `libnvrtc.so.12`, …) on first use and panics when none loads. A GPU box often has NVRTC
//! and cuBLAS only inside Python wheels (`site-packages/nvidia/cuda_nvrtc/lib`,
//! `nvidia/cublas/lib`, `nvidia/cu13/lib`) or under `/usr/local/cuda*/lib64`, where the
//! loader does not look. [`preload`] finds them there and opens them `RTLD_NOW |
//! RTLD_GLOBAL`, keeping the handles forever; cudarc's later `dlopen("libnvrtc.so.12")` then
//! matches the already-loaded object by its soname.
//!
//! Search order, first match wins (within one place, the newer major first):
//! 1. each directory of `STRATA_CUDA_LIBS` (colon-separated), in order;
//! 2. the dynamic loader's own search (`LD_LIBRARY_PATH`, `ld.so.cache`, …);
//! 3. `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`, `/usr/local/cuda/lib64`,
//!    `/usr/local/cuda-*/lib64` (newest first), `/usr/lib/x86_64-linux-gnu`;
//! 4. `nvidia/*/lib` of the Python site-packages directories: `$VIRTUAL_ENV`'s,
//!    `/usr/lib/python3*/{site,dist}-packages`, `/usr/local/lib/python3*/{site,dist}-packages`,
//!    `~/.local/lib/python3*/site-packages`, `/opt/conda/lib/python3*/site-packages`.
//!
//! The driver (`libcuda.so.1`) comes from the loader's search only, never from a wheel: it
//! must match the kernel module. Nothing here needs a GPU, and nothing panics: call
//! cudarc's `is_culib_present()` (through [`driver_present`], [`nvrtc_present`],
//! [`cublas_present`]) before any cudarc call into a library.

use std::ffi::{CStr, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
use serde::Serialize;

/// The environment variable naming extra library directories (colon-separated), searched
/// first.
pub const LIBS_ENV: &str = strata_tensor::env::CUDA_LIBS.name;

/// One CUDA library as [`report`] finds it.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct LibInfo {
    pub present: bool,
    /// The file the process uses (resolved through `dladdr`).
    pub path: Option<PathBuf>,
    /// `MAJOR.MINOR[.PATCH]`, where the library tells without a GPU.
    pub version: Option<String>,
    /// Why the library is absent or unusable.
    pub reason: Option<String>,
    /// Anything else worth knowing (e.g. cudarc picked another copy than the one preloaded).
    pub note: Option<String>,
}

/// The CUDA libraries Strata uses, present or not.
#[derive(Clone, Debug, Serialize)]
pub struct CudaLibs {
    /// `libcuda.so.1`: the driver API (version = the CUDA version the driver supports).
    pub driver: LibInfo,
    /// `libnvrtc.so.{13,12}`: run-time compilation of `kernels/*.cu`.
    pub nvrtc: LibInfo,
    /// `libcublas.so.{13,12}` (with its `libcublasLt`): the prefill GEMMs.
    pub cublas: LibInfo,
    /// `libcufile.so.{1,0}`: GPUDirect Storage reads.
    pub cufile: LibInfo,
    /// The directories searched for NVRTC, cuBLAS and cuFile, in order (the loader's own
    /// search is not listed).
    pub searched: Vec<PathBuf>,
}

/// One GPU the driver sees.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct GpuInfo {
    /// The `cuda:N` index.
    pub ordinal: u32,
    pub name: String,
    pub total_memory_bytes: u64,
    /// `(major, minor)`: `(8, 6)` is `sm_86`.
    pub compute_capability: (u32, u32),
}

/// What [`preload`] found for one library.
#[derive(Debug)]
enum Found {
    /// Opened (several files when one needs another, e.g. cublasLt then cublas); the
    /// handles live as long as the process.
    Loaded { paths: Vec<PathBuf>, libs: Vec<Library> },
    /// Nothing loaded; why each candidate that existed failed (empty: none existed).
    Absent { errors: Vec<String> },
}

impl Found {
    fn path(&self) -> Option<&Path> {
        match self {
            Found::Loaded { paths, .. } => paths.last().map(|p| p.as_path()),
            Found::Absent { .. } => None,
        }
    }
}

#[derive(Debug)]
struct Preloaded {
    driver: Found,
    nvrtc: Found,
    cublas: Found,
    cufile: Found,
    searched: Vec<PathBuf>,
}

/// What to look for: alternatives in order of preference; each alternative is a list of
/// files opened in order from one place (a library's dependency first), with a symbol of
/// each to locate the file through `dladdr`.
struct Spec {
    alternatives: &'static [&'static [(&'static str, &'static CStr)]],
}

const NVRTC: Spec =
    Spec { alternatives: &[&[("libnvrtc.so.13", c"nvrtcVersion")], &[("libnvrtc.so.12", c"nvrtcVersion")]] };
const CUBLAS: Spec = Spec {
    alternatives: &[
        &[("libcublasLt.so.13", c"cublasLtGetVersion"), ("libcublas.so.13", c"cublasGetProperty")],
        &[("libcublasLt.so.12", c"cublasLtGetVersion"), ("libcublas.so.12", c"cublasGetProperty")],
    ],
};
const CUFILE: Spec =
    Spec { alternatives: &[&[("libcufile.so.1", c"cuFileDriverOpen")], &[("libcufile.so.0", c"cuFileDriverOpen")]] };
const DRIVER: Spec =
    Spec { alternatives: &[&[("libcuda.so.1", c"cuDriverGetVersion")], &[("libcuda.so", c"cuDriverGetVersion")]] };

/// Where to look: a group of directories searched together (for each alternative in
/// order, each directory), or the loader's own search by bare name.
#[derive(Debug, PartialEq)]
enum Place {
    Dirs(Vec<PathBuf>),
    Loader,
}

/// Finds and opens NVRTC, cuBLAS(Lt), cuFile and the driver once per process (see the
/// module doc for the order); later calls return at once. Never fails: what was not
/// found shows in [`report`].
pub fn preload() {
    preloaded();
}

/// [`preload`] with `extra_dirs` searched before everything else (before
/// `STRATA_CUDA_LIBS`). Only the first preload of a process searches: returns whether this
/// call was it (false: the libraries were already looked for, and `extra_dirs` is unused).
pub fn preload_with(extra_dirs: &[PathBuf]) -> bool {
    let mut ran = false;
    PRELOADED.get_or_init(|| {
        ran = true;
        load(extra_dirs)
    });
    ran
}

static PRELOADED: OnceLock<Preloaded> = OnceLock::new();

fn preloaded() -> &'static Preloaded {
    PRELOADED.get_or_init(|| load(&[]))
}

fn load(extra_dirs: &[PathBuf]) -> Preloaded {
    let mut places: Vec<Place> =
        extra_dirs.iter().filter(|d| d.is_dir()).map(|d| Place::Dirs(vec![d.clone()])).collect();
    places.extend(search_places());
    let searched = places
        .iter()
        .flat_map(|p| match p {
            Place::Dirs(d) => d.clone(),
            Place::Loader => Vec::new(),
        })
        .collect();
    let p = Preloaded {
        driver: find(&DRIVER, &[Place::Loader]),
        nvrtc: find(&NVRTC, &places),
        cublas: find(&CUBLAS, &places),
        cufile: find(&CUFILE, &places),
        searched,
    };
    tracing::debug!(
        nvrtc = ?p.nvrtc.path(),
        cublas = ?p.cublas.path(),
        cufile = ?p.cufile.path(),
        driver = ?p.driver.path(),
        "CUDA libraries preloaded"
    );
    p
}

/// The places of the module doc, in order, existing directories only.
fn search_places() -> Vec<Place> {
    let env_dirs = strata_tensor::env::CUDA_LIBS
        .get_os()
        .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect::<Vec<_>>())
        .unwrap_or_default();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let venv = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from);
    let cuda_env: Vec<PathBuf> =
        ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(std::env::var_os).map(PathBuf::from).collect();
    places_from(&env_dirs, &cuda_env, venv.as_deref(), home.as_deref(), Path::new("/"))
}

/// [`search_places`] with its inputs explicit; `root` prefixes every fixed path (tests).
fn places_from(
    env_dirs: &[PathBuf],
    cuda_env: &[PathBuf],
    venv: Option<&Path>,
    home: Option<&Path>,
    root: &Path,
) -> Vec<Place> {
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let mut places = Vec::new();
    let mut seen = Vec::<PathBuf>::new();
    let mut push_dirs = |places: &mut Vec<Place>, dirs: Vec<PathBuf>| {
        let dirs: Vec<PathBuf> = dirs.into_iter().filter(|d| d.is_dir() && !seen.contains(d)).collect();
        if !dirs.is_empty() {
            seen.extend(dirs.iter().cloned());
            places.push(Place::Dirs(dirs));
        }
    };
    for d in env_dirs {
        push_dirs(&mut places, vec![d.clone()]);
    }
    places.push(Place::Loader);
    for c in cuda_env {
        push_dirs(&mut places, vec![c.join("lib64")]);
    }
    push_dirs(&mut places, vec![at("/usr/local/cuda/lib64")]);
    for d in versioned_cuda_dirs(&at("/usr/local")) {
        push_dirs(&mut places, vec![d.join("lib64")]);
    }
    push_dirs(&mut places, vec![at("/usr/lib/x86_64-linux-gnu")]);
    let mut sites = Vec::new();
    if let Some(v) = venv {
        sites.extend(python_dirs(&v.join("lib"), &["site-packages"]));
    }
    sites.extend(python_dirs(&at("/usr/lib"), &["site-packages", "dist-packages"]));
    sites.extend(python_dirs(&at("/usr/local/lib"), &["site-packages", "dist-packages"]));
    if let Some(h) = home {
        sites.extend(python_dirs(&h.join(".local/lib"), &["site-packages"]));
    }
    sites.extend(python_dirs(&at("/opt/conda/lib"), &["site-packages"]));
    for site in sites {
        push_dirs(&mut places, wheel_lib_dirs(&site));
    }
    places
}

/// `base/cuda-X.Y` directories, newest version first.
fn versioned_cuda_dirs(base: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(Vec<u32>, PathBuf)> = subdirs(base)
        .into_iter()
        .filter_map(|(name, path)| {
            let v = name.strip_prefix("cuda-")?;
            let parts: Option<Vec<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
            Some((parts?, path))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// `base/python3*/KIND` for each KIND, the newest Python first.
fn python_dirs(base: &Path, kinds: &[&str]) -> Vec<PathBuf> {
    let mut pys: Vec<(Vec<u32>, PathBuf)> = subdirs(base)
        .into_iter()
        .filter_map(|(name, path)| {
            let v = name.strip_prefix("python3")?;
            let minor = v.strip_prefix('.').unwrap_or(v);
            let key = if minor.is_empty() { vec![] } else { vec![minor.parse().ok()?] };
            Some((key, path))
        })
        .collect();
    pys.sort_by(|a, b| b.0.cmp(&a.0));
    pys.into_iter().flat_map(|(_, p)| kinds.iter().map(move |k| p.join(k))).collect()
}

/// `site/nvidia/*/lib` (`cuda_nvrtc`, `cublas`, `cufile`, `cu13`, …), names descending so
/// `cu13` comes before `cu12`.
fn wheel_lib_dirs(site: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<(String, PathBuf)> = subdirs(&site.join("nvidia"));
    dirs.sort_by(|a, b| b.0.cmp(&a.0));
    dirs.into_iter().map(|(_, p)| p.join("lib")).filter(|p| p.is_dir()).collect()
}

/// The subdirectories of `dir` as `(name, path)`; nothing when it cannot be read.
fn subdirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect()
}

/// Opens the first alternative of `spec` that loads from the first place that has it.
fn find(spec: &Spec, places: &[Place]) -> Found {
    let mut errors = Vec::new();
    for place in places {
        for alt in spec.alternatives {
            let dirs: Vec<Option<&Path>> = match place {
                Place::Dirs(d) => d.iter().map(|d| Some(d.as_path())).collect(),
                Place::Loader => vec![None],
            };
            for dir in dirs {
                if let Some(found) = open_all(alt, dir, &mut errors) {
                    return found;
                }
            }
        }
    }
    Found::Absent { errors }
}

/// Opens every file of `alt` from `dir` (or by bare name through the loader when `None`);
/// `None` unless all load. A file that exists but fails to load is recorded in `errors`.
fn open_all(alt: &[(&str, &CStr)], dir: Option<&Path>, errors: &mut Vec<String>) -> Option<Found> {
    let mut libs = Vec::new();
    let mut paths = Vec::new();
    for (file, symbol) in alt {
        let target = match dir {
            Some(d) => {
                let p = d.join(file);
                if !p.is_file() {
                    return None;
                }
                p
            }
            None => PathBuf::from(file),
        };
        // SAFETY: loading a CUDA library runs its initialisers, which only set up the
        // library's own state; the handle is kept for the life of the process, so its
        // finalisers never run while anything might use it.
        match unsafe { Library::open(Some(&target), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => {
                // SAFETY: the symbol is only used as an address for `dladdr`, never called.
                let addr = unsafe { lib.get::<*mut c_void>(symbol.to_bytes()) }.ok().map(|s| *s);
                paths.push(addr.and_then(path_of_address).unwrap_or(target));
                libs.push(lib);
            }
            Err(e) => {
                // Through the loader, "not found" is the normal absence; anything else (a
                // broken file, a missing dependency) is worth reporting.
                let msg = error_chain(&e);
                if dir.is_some() || !msg.contains("cannot open shared object file") {
                    errors.push(if dir.is_some() { format!("{}: {msg}", target.display()) } else { msg });
                }
                return None;
            }
        }
    }
    Some(Found::Loaded { paths, libs })
}

/// An error and its sources (`dlopen failed: libx.so: cannot open shared object file`).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    msg
}

/// The file of the loaded object that holds `addr`, via `dladdr`.
fn path_of_address(addr: *mut c_void) -> Option<PathBuf> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: `Dl_info` is plain old data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is an address inside a loaded object (from dlsym) and `info` is a
    // valid out-pointer; dladdr only reads the loader's tables.
    let ok = unsafe { libc::dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: on success `dli_fname` is a NUL-terminated string owned by the loader, valid
    // while the object stays loaded (we copy it at once).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let s = name.to_str().ok()?;
    if s.is_empty() { None } else { Some(PathBuf::from(s)) }
}

/// The address of `symbol` in a library cudarc loaded.
fn cudarc_symbol(lib: &libloading::Library, symbol: &CStr) -> Option<*mut c_void> {
    // SAFETY: the symbol is only used as an address for `dladdr`, never called.
    unsafe { lib.get::<*mut c_void>(symbol.to_bytes()) }.ok().map(|s| *s)
}

/// Whether cudarc can load the driver (`libcuda`); calls into `cudarc::driver` are safe
/// only when this is true.
pub fn driver_present() -> bool {
    preload();
    // SAFETY: `is_culib_present` only dlopen()s candidate names (running initialisers of
    // CUDA libraries, which touch nothing of ours) and closes them again.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether cudarc can load NVRTC; calls into `cudarc::nvrtc` are safe only when true.
pub fn nvrtc_present() -> bool {
    preload();
    // SAFETY: as in `driver_present`.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether cudarc can load cuBLAS; calls into `cudarc::cublas` are safe only when true.
pub fn cublas_present() -> bool {
    preload();
    // SAFETY: as in `driver_present`.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// Whether cuFile was found (cudarc's cuFile module is not built; the handle is ours).
pub fn cufile_present() -> bool {
    matches!(preloaded().cufile, Found::Loaded { .. })
}

/// Presence, path and version of the driver, NVRTC, cuBLAS and cuFile. Needs no GPU.
pub fn report() -> CudaLibs {
    let pre = preloaded();
    CudaLibs {
        driver: driver_info(pre),
        nvrtc: nvrtc_info(pre),
        cublas: cublas_info(pre),
        cufile: cufile_info(pre),
        searched: pre.searched.clone(),
    }
}

/// Why a library is absent: what failed to load, else that nothing was found.
fn absent_reason(found: &Found, not_found: String) -> String {
    match found {
        Found::Absent { errors } if !errors.is_empty() => format!("{not_found} ({})", errors.join("; ")),
        _ => not_found,
    }
}

fn not_found_where(what: &str, wheel: &str) -> String {
    format!(
        "{what} not found in ${LIBS_ENV}, the loader's search path, /usr/local/cuda*/lib64, \
         /usr/lib/x86_64-linux-gnu or Python site-packages (pip wheel {wheel}); set {LIBS_ENV} \
         to the directory that holds it"
    )
}

/// Notes when cudarc resolved another file than the one preloaded.
fn differs(used: Option<&Path>, preloaded: &Found) -> Option<String> {
    let (used, pre) = (used?, preloaded.path()?);
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    (canon(used) != canon(pre)).then(|| {
        format!("found {} first, but cudarc loads {} (earlier in its list of names)", pre.display(), used.display())
    })
}

fn driver_info(pre: &Preloaded) -> LibInfo {
    if !driver_present() {
        return LibInfo { reason: Some(driver_reason(&pre.driver)), ..LibInfo::default() };
    }
    // SAFETY: the driver is present (checked above), so `culib` does not panic.
    let lib = unsafe { cudarc::driver::sys::culib() };
    let path = cudarc_symbol(lib, c"cuDriverGetVersion").and_then(path_of_address);
    let mut v: c_int = 0;
    // SAFETY: the driver is present; `v` is a valid out-pointer. cuDriverGetVersion needs
    // no cuInit and no GPU.
    let rc = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    let version =
        (rc == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, v % 1000 / 10));
    LibInfo { present: true, note: differs(path.as_deref(), &pre.driver), path, version, reason: None }
}

fn nvrtc_info(pre: &Preloaded) -> LibInfo {
    if !nvrtc_present() {
        let reason =
            absent_reason(&pre.nvrtc, not_found_where("libnvrtc.so.13 / libnvrtc.so.12", "nvidia-cuda-nvrtc-cu12"));
        return LibInfo { reason: Some(reason), ..LibInfo::default() };
    }
    // SAFETY: NVRTC is present (checked above), so `culib` does not panic.
    let lib = unsafe { cudarc::nvrtc::sys::culib() };
    let path = cudarc_symbol(lib, c"nvrtcVersion").and_then(path_of_address);
    let version = nvrtc_version().map(|(a, b)| format!("{a}.{b}"));
    LibInfo { present: true, note: differs(path.as_deref(), &pre.nvrtc), path, version, reason: None }
}

/// `nvrtcVersion()`, when NVRTC is present.
pub fn nvrtc_version() -> Option<(u32, u32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is present (checked above); both are valid out-pointers.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (rc == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major.max(0) as u32, minor.max(0) as u32))
}

fn cublas_info(pre: &Preloaded) -> LibInfo {
    use cudarc::cublas::sys::{cublasGetProperty, cublasStatus_t, libraryPropertyType};
    if !cublas_present() {
        let reason =
            absent_reason(&pre.cublas, not_found_where("libcublas.so.13 / libcublas.so.12", "nvidia-cublas-cu12"));
        return LibInfo { reason: Some(reason), ..LibInfo::default() };
    }
    // SAFETY: cuBLAS is present (checked above), so `culib` does not panic.
    let lib = unsafe { cudarc::cublas::sys::culib() };
    let path = cudarc_symbol(lib, c"cublasGetProperty").and_then(path_of_address);
    let mut parts = Vec::new();
    for prop in
        [libraryPropertyType::MAJOR_VERSION, libraryPropertyType::MINOR_VERSION, libraryPropertyType::PATCH_LEVEL]
    {
        let mut v: c_int = 0;
        // SAFETY: cuBLAS is present; `v` is a valid out-pointer. cublasGetProperty needs
        // no handle and no GPU.
        if unsafe { cublasGetProperty(prop, &mut v) } != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            break;
        }
        parts.push(v.to_string());
    }
    let version = (parts.len() == 3).then(|| parts.join("."));
    LibInfo { present: true, note: differs(path.as_deref(), &pre.cublas), path, version, reason: None }
}

/// `CUfileError_t`: `{ CUfileOpError err; CUresult cu_err; }`, returned by value.
#[repr(C)]
struct CuFileError {
    err: c_int,
    cu_err: c_int,
}

fn cufile_info(pre: &Preloaded) -> LibInfo {
    let Found::Loaded { paths, libs } = &pre.cufile else {
        let reason =
            absent_reason(&pre.cufile, not_found_where("libcufile.so.1 / libcufile.so.0", "nvidia-cufile-cu12"));
        return LibInfo { reason: Some(reason), ..LibInfo::default() };
    };
    let version = libs.last().and_then(|lib| {
        type GetVersion = unsafe extern "C" fn(*mut c_int) -> CuFileError;
        // SAFETY: `cuFileGetVersion(int*)` has this signature in cufile.h (GDS ≥ 1.9);
        // older libraries lack the symbol and we report no version.
        let f = unsafe { lib.get::<GetVersion>(b"cuFileGetVersion") }.ok()?;
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; the call only reads the library's own
        // version constant (no driver or GPU needed, checked on cuFile 1.14).
        let rc = unsafe { f(&mut v) };
        (rc.err == 0 && rc.cu_err == 0 && v > 0).then(|| format!("{}.{}", v / 1000, v % 1000 / 10))
    });
    LibInfo { present: true, path: paths.last().cloned(), version, reason: None, note: None }
}

/// The GPUs the driver sees (`cuInit` + `cuDeviceGetCount` + each device's name, memory
/// and compute capability). An error says why there are none to ask about: no driver, or
/// `cuInit` failed (with the `CUresult` name, e.g. `CUDA_ERROR_NO_DEVICE`).
pub fn gpus() -> Result<Vec<GpuInfo>, String> {
    use cudarc::driver::sys::{self, CUdevice_attribute, CUresult};
    if !driver_present() {
        return Err(driver_reason(&preloaded().driver));
    }
    let check = |what: &str, rc: CUresult| -> Result<(), String> {
        if rc == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(format!("{what} failed: {rc:?}")) }
    };
    // SAFETY: the driver is present (checked above); cuInit(0) is the documented first call.
    check("cuInit", unsafe { sys::cuInit(0) })?;
    let mut count: c_int = 0;
    // SAFETY: driver initialised; `count` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })?;
    let mut out = Vec::new();
    for ordinal in 0..count.max(0) {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: driver initialised; `ordinal < count`; `dev` is a valid out-pointer.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
        let mut name = [0u8; 256];
        // SAFETY: `dev` came from cuDeviceGet; the buffer holds `name.len()` bytes and the
        // driver writes at most that many, NUL included.
        check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as c_int, dev) })?;
        let name = CStr::from_bytes_until_nul(&name)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(&name).into_owned());
        let mut bytes: usize = 0;
        // SAFETY: `dev` came from cuDeviceGet; `bytes` is a valid out-pointer.
        check("cuDeviceTotalMem", unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, dev) })?;
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: `dev` came from cuDeviceGet; the out-pointers are valid.
        unsafe {
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(
                    &mut major,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                    dev,
                ),
            )?;
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(
                    &mut minor,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                    dev,
                ),
            )?;
        }
        out.push(GpuInfo {
            ordinal: ordinal as u32,
            name,
            total_memory_bytes: bytes as u64,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
        });
    }
    Ok(out)
}

/// Why the driver is absent.
fn driver_reason(driver: &Found) -> String {
    match driver {
        Found::Absent { errors } if !errors.is_empty() => format!("libcuda.so.1 failed to load: {}", errors.join("; ")),
        _ => "libcuda.so.1 not found: no NVIDIA driver".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkdirs(root: &Path, dirs: &[&str]) {
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
    }

    #[test]
    fn places_follow_the_documented_order() {
        let root = std::env::temp_dir().join(format!("strata-libs-places-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        mkdirs(
            &root,
            &[
                "env1",
                "usr/local/cuda/lib64",
                "usr/local/cuda-11.8/lib64",
                "usr/local/cuda-12.10/lib64",
                "usr/local/cuda-12.4/lib64",
                "usr/local/cuda-notes",
                "usr/lib/x86_64-linux-gnu",
                "venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib",
                "venv/lib/python3.11/site-packages/nvidia/cu13/lib",
                "venv/lib/python3.11/site-packages/nvidia/nolib",
                "usr/lib/python3/dist-packages/nvidia/cublas/lib",
                "usr/local/lib/python3.9/site-packages/nvidia/cufile/lib",
                "usr/local/lib/python3.12/dist-packages/nvidia/cuda_nvrtc/lib",
                "home/.local/lib/python3.10/site-packages/nvidia/cublas/lib",
                "opt/conda/lib/python3.13/site-packages/nvidia/cuda_nvrtc/lib",
            ],
        );
        let r = |p: &str| root.join(p);
        let places = places_from(
            &[r("env1"), r("missing"), r("env1")],
            &[r("usr/local/cuda")],
            Some(&r("venv")),
            Some(&r("home")),
            &root,
        );
        let want = vec![
            Place::Dirs(vec![r("env1")]),
            Place::Loader,
            Place::Dirs(vec![r("usr/local/cuda/lib64")]),
            Place::Dirs(vec![r("usr/local/cuda-12.10/lib64")]),
            Place::Dirs(vec![r("usr/local/cuda-12.4/lib64")]),
            Place::Dirs(vec![r("usr/local/cuda-11.8/lib64")]),
            Place::Dirs(vec![r("usr/lib/x86_64-linux-gnu")]),
            Place::Dirs(vec![
                r("venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib"),
                r("venv/lib/python3.11/site-packages/nvidia/cu13/lib"),
            ]),
            Place::Dirs(vec![r("usr/lib/python3/dist-packages/nvidia/cublas/lib")]),
            Place::Dirs(vec![r("usr/local/lib/python3.12/dist-packages/nvidia/cuda_nvrtc/lib")]),
            Place::Dirs(vec![r("usr/local/lib/python3.9/site-packages/nvidia/cufile/lib")]),
            Place::Dirs(vec![r("home/.local/lib/python3.10/site-packages/nvidia/cublas/lib")]),
            Place::Dirs(vec![r("opt/conda/lib/python3.13/site-packages/nvidia/cuda_nvrtc/lib")]),
        ];
        assert_eq!(places, want);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_broken_file_is_skipped_with_its_error() {
        let dir = std::env::temp_dir().join(format!("strata-libs-broken-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libnvrtc.so.13"), b"not an ELF file").unwrap();
        match find(&NVRTC, &[Place::Dirs(vec![dir.clone()])]) {
            Found::Absent { errors } => {
                assert!(errors.len() == 1 && errors[0].contains("libnvrtc.so.13"), "{errors:?}")
            }
            other => panic!("loaded a broken file: {other:?}"),
        }
        let reason = absent_reason(&find(&NVRTC, &[Place::Dirs(vec![dir.clone()])]), "missing".into());
        assert!(reason.starts_with("missing (") && reason.contains("libnvrtc.so.13"), "{reason}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn report_never_panics_and_explains_what_is_absent() {
        let r = report();
        for (name, lib) in [("driver", &r.driver), ("nvrtc", &r.nvrtc), ("cublas", &r.cublas), ("cufile", &r.cufile)] {
            assert_eq!(lib.present, lib.reason.is_none(), "{name}: {lib:?}");
            if lib.present {
                assert!(lib.path.is_some(), "{name}: {lib:?}");
            }
        }
        if !r.driver.present {
            assert!(gpus().unwrap_err().contains("libcuda.so.1"));
        }
    }
}
