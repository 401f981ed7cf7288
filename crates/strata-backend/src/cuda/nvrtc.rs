//! Compiling `kernels/*.cu` with NVRTC at first use, cached on disk.
//!
//! [`Compiler::compile`] builds SASS (a cubin) for the GPU's architecture when this NVRTC
//! knows it, so the driver has nothing to JIT; for a newer GPU than NVRTC knows it builds
//! PTX for the highest architecture NVRTC supports below it, and the driver JITs that.
//! Results are cached under the cache directory (default `$STRATA_HOME/cache/kernels`) as
//!
//! ```text
//! {file}-{hash16}-sm_{XY}-nvrtc{major}.{minor}.{cubin|ptx}
//! ```
//!
//! where `hash16` is the first 16 hex digits of the SHA-256 of the full source (headers
//! included), the options, the target architecture and the NVRTC version. A cache file is
//! the image followed by a one-line trailer `// strata-kernel-cache sha256=<hex of the
//! image>` (a PTX comment, so `ptxas` accepts a cached `.ptx` as it is); an entry whose
//! trailer does not match is recompiled. Files are written to a temporary name and renamed,
//! so no reader ever sees half a file.
//!
//! NVRTC is found by [`super::libs::preload`]; without it every call returns
//! [`CompileError::NvrtcMissing`], never panics.

use std::ffi::{CStr, CString, c_char, c_int};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::kernels::{self, KernelFile};
use super::libs;

/// Options every compile gets (then `--gpu-architecture=…`). No `--use_fast_math`: the
/// kernels must match the CPU ops within test-backend-ops bounds. No `-lineinfo`.
pub const BASE_OPTIONS: &[&str] = &["--std=c++17", "-default-device"];

/// Largest cache file we read (the biggest image is a few MiB).
const MAX_CACHE_BYTES: u64 = 256 << 20;
const TRAILER_PREFIX: &[u8] = b"\n// strata-kernel-cache sha256=";
/// `TRAILER_PREFIX` + 64 hex digits + `\n`.
const TRAILER_LEN: usize = TRAILER_PREFIX.len() + 64 + 1;

/// A GPU architecture (compute capability): `Arch { major: 8, minor: 6 }` is `sm_86`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub const fn new(major: u32, minor: u32) -> Arch {
        Arch { major, minor }
    }

    /// The `XY` of `sm_XY` (`86`, `90`, `120`).
    pub const fn sm(self) -> u32 {
        self.major * 10 + self.minor
    }

    /// The inverse of [`Arch::sm`] (`nvrtcGetSupportedArchs` lists these numbers).
    pub const fn from_sm(sm: u32) -> Arch {
        Arch { major: sm / 10, minor: sm % 10 }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}", self.sm())
    }
}

impl std::str::FromStr for Arch {
    type Err = String;

    /// `sm_86`, `compute_86`, `86` or `8.6`.
    fn from_str(s: &str) -> Result<Arch, String> {
        let bad = || format!("`{s}` is not a GPU architecture (e.g. sm_86 or 8.6)");
        let t = s.trim();
        if let Some((a, b)) = t.split_once('.') {
            return Ok(Arch::new(a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?));
        }
        let digits = t.strip_prefix("sm_").or_else(|| t.strip_prefix("compute_")).unwrap_or(t);
        let sm: u32 = digits.parse().map_err(|_| bad())?;
        if !(10..=999).contains(&sm) {
            return Err(bad());
        }
        Ok(Arch::from_sm(sm))
    }
}

/// What a compile produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    /// SASS for exactly the target architecture.
    Cubin,
    /// PTX the driver JITs (or `ptxas` checks).
    Ptx,
}

impl ImageKind {
    pub fn extension(self) -> &'static str {
        match self {
            ImageKind::Cubin => "cubin",
            ImageKind::Ptx => "ptx",
        }
    }
}

/// A compiled kernel file.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The module image: an ELF cubin (load with `cudarc::nvrtc::Ptx::from_binary`), or PTX
    /// text with no terminating NUL (load with `Ptx::from_src`, which adds it; not
    /// `from_binary`, which would pass the driver an unterminated string).
    pub image: Vec<u8>,
    pub kind: ImageKind,
    /// The cache file (written unless [`Compiled::cache_error`] says otherwise).
    pub path_in_cache: PathBuf,
    /// Whether the image came from the cache rather than NVRTC.
    pub from_cache: bool,
    /// Wall time of the compile or cache read, in milliseconds.
    pub millis: f64,
    /// Why the image could not be written to the cache (the image is still good).
    pub cache_error: Option<String>,
}

impl Compiled {
    /// The kernel entry points of a PTX image (`.entry NAME(`); empty for a cubin.
    pub fn ptx_entries(&self) -> Vec<String> {
        match self.kind {
            ImageKind::Ptx => ptx_entries(&String::from_utf8_lossy(&self.image)),
            ImageKind::Cubin => Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("NVRTC (libnvrtc.so.12 or .13) not found: {0}")]
    NvrtcMissing(String),
    #[error("{file}.cu failed to compile for {arch} (NVRTC {nvrtc}):\n{log}")]
    Compile { file: String, arch: Arch, nvrtc: String, log: String },
    #[error("{file}.cu for {arch}: {call} returned {code}")]
    Nvrtc { file: String, arch: Arch, call: &'static str, code: String },
    #[error("NVRTC {nvrtc} supports no architecture at or below {arch} (it supports {supported})")]
    UnsupportedArch { arch: Arch, nvrtc: String, supported: String },
    #[error("{file}.cu: the source holds a NUL byte")]
    NulInSource { file: String },
}

/// NVRTC's version and the architectures it compiles SASS for, asked once.
#[derive(Clone, Debug, Serialize)]
pub struct NvrtcInfo {
    pub version: (u32, u32),
    /// `nvrtcGetSupportedArchs`, ascending (`[50, 52, …, 90, 100, 120]`).
    pub supported_sm: Vec<u32>,
}

impl NvrtcInfo {
    fn version_string(&self) -> String {
        format!("{}.{}", self.version.0, self.version.1)
    }

    /// Whether `--gpu-architecture=sm_XY` works for `arch`.
    pub fn supports(&self, arch: Arch) -> bool {
        self.supported_sm.contains(&arch.sm())
    }
}

/// NVRTC's [`NvrtcInfo`], or why NVRTC cannot be used. Never panics.
pub fn nvrtc_info() -> Result<&'static NvrtcInfo, CompileError> {
    static INFO: OnceLock<Result<NvrtcInfo, String>> = OnceLock::new();
    let info = INFO.get_or_init(|| {
        if !libs::nvrtc_present() {
            return Err(libs::report().nvrtc.reason.unwrap_or_else(|| "not loadable".into()));
        }
        let version = libs::nvrtc_version().ok_or("nvrtcVersion failed")?;
        let mut n: c_int = 0;
        // SAFETY: NVRTC is present (checked above); `n` is a valid out-pointer.
        let rc = unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) };
        if rc != nvrtcResult::NVRTC_SUCCESS || n < 0 {
            return Err(format!("nvrtcGetNumSupportedArchs returned {rc:?}"));
        }
        let mut archs = vec![0 as c_int; n as usize];
        // SAFETY: `archs` holds the `n` ints NVRTC said it will write.
        let rc = unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
        if rc != nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcGetSupportedArchs returned {rc:?}"));
        }
        let mut supported_sm: Vec<u32> = archs.into_iter().filter(|&a| a > 0).map(|a| a as u32).collect();
        supported_sm.sort_unstable();
        Ok(NvrtcInfo { version, supported_sm })
    });
    info.as_ref().map_err(|e| CompileError::NvrtcMissing(e.clone()))
}

/// `$STRATA_HOME/cache/kernels`.
pub fn default_cache_dir() -> PathBuf {
    strata_tensor::home::strata_home().join("cache").join("kernels")
}

/// Compiles kernel files into a cache directory. Cheap to make; `Sync`, so one compiler can
/// serve several threads (NVRTC compiles distinct programs concurrently).
#[derive(Clone, Debug)]
pub struct Compiler {
    cache_dir: PathBuf,
}

impl Compiler {
    /// A compiler caching under `cache_dir` (created on the first write).
    pub fn new(cache_dir: PathBuf) -> Compiler {
        Compiler { cache_dir }
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// `file` for a GPU of architecture `arch`: a cubin for `sm_XY` when NVRTC supports it,
    /// else PTX for the highest supported `compute_XY` below `arch`.
    pub fn compile(&self, file: &KernelFile, arch: Arch) -> Result<Compiled, CompileError> {
        let nv = nvrtc_info()?;
        if nv.supports(arch) {
            return self.compile_as(file, arch, ImageKind::Cubin, format!("--gpu-architecture=sm_{}", arch.sm()), nv);
        }
        let Some(&best) = nv.supported_sm.iter().filter(|&&s| s <= arch.sm()).max() else {
            return Err(CompileError::UnsupportedArch {
                arch,
                nvrtc: nv.version_string(),
                supported: nv.supported_sm.iter().map(|s| format!("sm_{s}")).collect::<Vec<_>>().join(", "),
            });
        };
        self.compile_as(file, arch, ImageKind::Ptx, format!("--gpu-architecture=compute_{best}"), nv)
    }

    /// `file` as PTX for `compute_XY` of `arch` (what `ptxas -arch=sm_XY` checks).
    pub fn compile_ptx(&self, file: &KernelFile, arch: Arch) -> Result<Compiled, CompileError> {
        let nv = nvrtc_info()?;
        self.compile_as(file, arch, ImageKind::Ptx, format!("--gpu-architecture=compute_{}", arch.sm()), nv)
    }

    fn compile_as(
        &self,
        file: &KernelFile,
        arch: Arch,
        kind: ImageKind,
        arch_option: String,
        nv: &NvrtcInfo,
    ) -> Result<Compiled, CompileError> {
        let start = Instant::now();
        let source = kernels::full_source(file);
        let mut options: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
        options.push(arch_option);
        let path = self.cache_dir.join(cache_file_name(file.name, &source, &options, arch, nv.version, kind));
        if let Some(image) = read_cache(&path, kind) {
            let millis = start.elapsed().as_secs_f64() * 1e3;
            return Ok(Compiled { image, kind, path_in_cache: path, from_cache: true, millis, cache_error: None });
        }
        let ctx = CallCtx { file: file.name, arch, nvrtc: nv.version_string() };
        let image = nvrtc_compile(&ctx, &source, &options, kind)?;
        let cache_error = write_cache(&path, &image).err().map(|e| {
            tracing::warn!("kernel cache {}: {e}", path.display());
            format!("{}: {e}", path.display())
        });
        let millis = start.elapsed().as_secs_f64() * 1e3;
        Ok(Compiled { image, kind, path_in_cache: path, from_cache: false, millis, cache_error })
    }
}

/// `{file}-{hash16}-sm_{XY}-nvrtc{major}.{minor}.{ext}`.
fn cache_file_name(
    name: &str,
    source: &str,
    options: &[String],
    arch: Arch,
    nvrtc: (u32, u32),
    kind: ImageKind,
) -> String {
    let mut h = Sha256::new();
    // Length-prefixed fields, so no two inputs hash the same bytes.
    for field in [source.as_bytes()].into_iter().chain(options.iter().map(|o| o.as_bytes())) {
        h.update((field.len() as u64).to_le_bytes());
        h.update(field);
    }
    h.update(format!("{arch} nvrtc {}.{} {}", nvrtc.0, nvrtc.1, kind.extension()).as_bytes());
    let hex = to_hex(&h.finalize());
    format!("{name}-{}-sm_{}-nvrtc{}.{}.{}", &hex[..16], arch.sm(), nvrtc.0, nvrtc.1, kind.extension())
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cached image at `path` when it is whole (its trailer's hash matches), else `None`
/// (absent, unreadable or corrupt: the caller recompiles and overwrites it).
fn read_cache(path: &Path, kind: ImageKind) -> Option<Vec<u8>> {
    let len = std::fs::metadata(path).ok()?.len();
    if len > MAX_CACHE_BYTES || len < TRAILER_LEN as u64 {
        if path.exists() {
            tracing::warn!("kernel cache {}: {len} bytes is not a cache entry; recompiling", path.display());
        }
        return None;
    }
    let mut bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("kernel cache {}: {e}; recompiling", path.display());
            return None;
        }
    };
    let split = bytes.len().checked_sub(TRAILER_LEN)?;
    let (body, trailer) = bytes.split_at(split);
    let whole = trailer.starts_with(TRAILER_PREFIX)
        && trailer.ends_with(b"\n")
        && trailer[TRAILER_PREFIX.len()..TRAILER_LEN - 1] == *to_hex(&Sha256::digest(body)).as_bytes()
        && match kind {
            ImageKind::Cubin => body.starts_with(b"\x7fELF"),
            ImageKind::Ptx => !body.contains(&0),
        };
    if !whole {
        tracing::warn!("kernel cache {}: corrupt entry; recompiling", path.display());
        return None;
    }
    bytes.truncate(split);
    Some(bytes)
}

/// Writes `image` (+ trailer) to `path` through a temporary file in the same directory
/// and a rename.
fn write_cache(path: &Path, body: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body)?;
        f.write_all(TRAILER_PREFIX)?;
        f.write_all(to_hex(&Sha256::digest(body)).as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Names the compile in errors.
struct CallCtx<'a> {
    file: &'a str,
    arch: Arch,
    nvrtc: String,
}

impl CallCtx<'_> {
    fn check(&self, call: &'static str, rc: nvrtcResult) -> Result<(), CompileError> {
        if rc == nvrtcResult::NVRTC_SUCCESS {
            return Ok(());
        }
        Err(CompileError::Nvrtc { file: self.file.to_string(), arch: self.arch, call, code: result_name(rc) })
    }
}

/// `NVRTC_ERROR_…` as NVRTC spells it.
fn result_name(rc: nvrtcResult) -> String {
    // SAFETY: NVRTC is loaded (we only get results from it); nvrtcGetErrorString returns
    // a static string or NULL.
    let p = unsafe { sys::nvrtcGetErrorString(rc) };
    if p.is_null() {
        return format!("{rc:?}");
    }
    // SAFETY: non-null: a NUL-terminated static string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Destroys the program when dropped.
struct Program(nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

/// One NVRTC compile of `source` with `options`, returning the `kind` image (PTX without
/// its NUL). The caller has confirmed NVRTC is present.
fn nvrtc_compile(ctx: &CallCtx, source: &str, options: &[String], kind: ImageKind) -> Result<Vec<u8>, CompileError> {
    let nul = || CompileError::NulInSource { file: ctx.file.to_string() };
    let src = CString::new(source).map_err(|_| nul())?;
    let name = CString::new(format!("{}.cu", ctx.file)).map_err(|_| nul())?;
    let opts: Vec<CString> =
        options.iter().map(|o| CString::new(o.as_str())).collect::<Result<_, _>>().map_err(|_| nul())?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

    let mut raw: nvrtcProgram = std::ptr::null_mut();
    // SAFETY: `src` and `name` are NUL-terminated and outlive the call; no headers are
    // passed (count 0, null arrays); `raw` is a valid out-pointer.
    let rc = unsafe {
        sys::nvrtcCreateProgram(&mut raw, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null())
    };
    ctx.check("nvrtcCreateProgram", rc)?;
    let prog = Program(raw);

    // SAFETY: `prog.0` is a live program; `opt_ptrs` holds `opts.len()` pointers to
    // NUL-terminated strings that outlive the call.
    let rc = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(&prog);
    if rc == nvrtcResult::NVRTC_ERROR_COMPILATION {
        return Err(CompileError::Compile {
            file: ctx.file.to_string(),
            arch: ctx.arch,
            nvrtc: ctx.nvrtc.clone(),
            log,
        });
    }
    ctx.check("nvrtcCompileProgram", rc).map_err(|e| match e {
        CompileError::Nvrtc { file, arch, call, code } if !log.is_empty() => {
            CompileError::Compile { file, arch, nvrtc: ctx.nvrtc.clone(), log: format!("{call}: {code}\n{log}") }
        }
        e => e,
    })?;
    if !log.trim().is_empty() {
        tracing::debug!("{}.cu for {}: NVRTC says:\n{log}", ctx.file, ctx.arch);
    }

    let mut size: usize = 0;
    let (size_call, size_rc) = match kind {
        // SAFETY: `prog.0` compiled successfully; `size` is a valid out-pointer.
        ImageKind::Cubin => ("nvrtcGetCUBINSize", unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }),
        // SAFETY: as above.
        ImageKind::Ptx => ("nvrtcGetPTXSize", unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) }),
    };
    ctx.check(size_call, size_rc)?;
    let mut image = vec![0u8; size];
    let (call, rc) = match kind {
        // SAFETY: `image` holds the `size` bytes NVRTC said the cubin takes.
        ImageKind::Cubin => ("nvrtcGetCUBIN", unsafe { sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr().cast()) }),
        // SAFETY: `image` holds the `size` bytes (NUL included) NVRTC said the PTX takes.
        ImageKind::Ptx => ("nvrtcGetPTX", unsafe { sys::nvrtcGetPTX(prog.0, image.as_mut_ptr().cast()) }),
    };
    ctx.check(call, rc)?;
    if kind == ImageKind::Ptx {
        // NVRTC counts the terminating NUL; the text is what we keep.
        while image.last() == Some(&0) {
            image.pop();
        }
    }
    if image.len() <= 1 {
        return Err(CompileError::Nvrtc {
            file: ctx.file.to_string(),
            arch: ctx.arch,
            call,
            code: "an empty image".into(),
        });
    }
    Ok(image)
}

/// The compile log (warnings or errors), or an empty string.
fn program_log(prog: &Program) -> String {
    let mut size: usize = 0;
    // SAFETY: `prog.0` is a live program; `size` is a valid out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) } != nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes (NUL included) NVRTC said the log takes.
    if unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr().cast()) } != nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
}

/// The kernel entry points (`.entry NAME(`) of PTX text, in order: what a module loaded
/// from it exports, macros expanded.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l.trim_start();
            let rest =
                rest.strip_prefix(".visible").or_else(|| rest.strip_prefix(".weak")).unwrap_or(rest).trim_start();
            let name = rest.strip_prefix(".entry")?.trim_start();
            let end = name.find(|c: char| c == '(' || c.is_whitespace()).unwrap_or(name.len());
            (end > 0).then(|| name[..end].to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_parses_and_prints() {
        for (s, want) in
            [("sm_86", (8, 6)), ("compute_90", (9, 0)), ("120", (12, 0)), ("8.9", (8, 9)), (" sm_100 ", (10, 0))]
        {
            let a: Arch = s.parse().unwrap();
            assert_eq!((a.major, a.minor), want, "{s}");
        }
        for bad in ["", "sm_", "sm_x", "8", "8.x", "sm_1234"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
        assert_eq!(Arch::new(12, 0).to_string(), "sm_120");
        assert_eq!(Arch::from_sm(89), Arch::new(8, 9));
    }

    #[test]
    fn cache_names_change_with_every_input() {
        let opts = |a: &str| vec!["--std=c++17".to_string(), a.to_string()];
        let base = cache_file_name("norm", "src", &opts("sm_86"), Arch::new(8, 6), (12, 9), ImageKind::Cubin);
        assert!(base.starts_with("norm-") && base.ends_with("-sm_86-nvrtc12.9.cubin"), "{base}");
        assert_eq!(base.len(), "norm-".len() + 16 + "-sm_86-nvrtc12.9.cubin".len());
        let variants = [
            cache_file_name("norm", "src2", &opts("sm_86"), Arch::new(8, 6), (12, 9), ImageKind::Cubin),
            cache_file_name("norm", "src", &opts("sm_80"), Arch::new(8, 6), (12, 9), ImageKind::Cubin),
            cache_file_name("norm", "src", &opts("sm_86"), Arch::new(8, 6), (12, 8), ImageKind::Cubin),
            cache_file_name("norm", "src", &opts("sm_86"), Arch::new(8, 6), (12, 9), ImageKind::Ptx),
        ];
        for v in variants {
            assert_ne!(v[..21], base[..21], "{v}");
        }
    }

    #[test]
    fn cache_round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("strata-nvrtc-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ptx_path = dir.join("a.ptx");
        let ptx = b".version 8.0\n.visible .entry f(\n)\n{ ret; }\n".to_vec();
        write_cache(&ptx_path, &ptx).unwrap();
        let on_disk = std::fs::read(&ptx_path).unwrap();
        assert!(on_disk.starts_with(&ptx) && on_disk.ends_with(b"\n"));
        assert_eq!(read_cache(&ptx_path, ImageKind::Ptx).unwrap(), ptx);
        // A PTX entry holding a NUL is not PTX.
        write_cache(&ptx_path, b".version 8.0\0").unwrap();
        assert!(read_cache(&ptx_path, ImageKind::Ptx).is_none());
        write_cache(&ptx_path, &ptx).unwrap();

        let cubin_path = dir.join("a.cubin");
        let cubin = b"\x7fELF\x02\x01\x01 some sass".to_vec();
        write_cache(&cubin_path, &cubin).unwrap();
        assert_eq!(read_cache(&cubin_path, ImageKind::Cubin).unwrap(), cubin);

        // A flipped byte, a truncation, an empty file and a missing file all read as absent.
        let mut bad = std::fs::read(&cubin_path).unwrap();
        bad[6] ^= 1;
        std::fs::write(&cubin_path, &bad).unwrap();
        assert!(read_cache(&cubin_path, ImageKind::Cubin).is_none());
        let whole = std::fs::read(&ptx_path).unwrap();
        std::fs::write(&ptx_path, &whole[..whole.len() - 3]).unwrap();
        assert!(read_cache(&ptx_path, ImageKind::Ptx).is_none());
        std::fs::write(&ptx_path, b"").unwrap();
        assert!(read_cache(&ptx_path, ImageKind::Ptx).is_none());
        assert!(read_cache(&dir.join("none.ptx"), ImageKind::Ptx).is_none());
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ptx_entries_are_listed() {
        let ptx = ".version 8.5\n.target sm_80\n.visible .entry add_f32(\n\t.param .u64 p0\n)\n{\n}\n\
                   .weak .entry w(\n)\n.entry plain\n(\n)\n.func helper(\n)\n// .entry not_me(\n";
        assert_eq!(ptx_entries(ptx), ["add_f32", "w", "plain"]);
    }

    #[test]
    fn without_nvrtc_compiling_is_an_error_not_a_panic() {
        if libs::nvrtc_present() {
            return;
        }
        let c = Compiler::new(std::env::temp_dir().join("strata-nvrtc-absent"));
        let e = c.compile(&kernels::FILES[0], Arch::new(8, 6)).unwrap_err();
        assert!(e.to_string().starts_with("NVRTC (libnvrtc.so.12 or .13) not found: "), "{e}");
        assert!(c.compile_ptx(&kernels::FILES[0], Arch::new(8, 6)).is_err());
    }
}
