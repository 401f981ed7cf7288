//! `strata doctor [--compile-kernels] [--json]`: what this machine offers Strata. Needs
//! no GPU: every CUDA library is looked for, reported present or absent, and never
//! called unless present.
//!
//! `--json` prints one object:
//!
//! - `version`: Strata's version.
//! - `cpu`: `{model, logical_cores, features: {avx2, fma, f16c, avx512f, avx512bw,
//!   avx512vl, avx512vnni, avx512vbmi, amx_tile, amx_int8, amx_bf16: bool}, quant_kernel,
//!   matmul_kernel}`: the model from `/proc/cpuinfo` (or null), the SIMD features Strata
//!   uses, and the kernel variants the CPU backend picks (`Scalar`, `Avx2`, `Avx512`).
//! - `ram`: `{total_bytes, available_bytes}` from `/proc/meminfo` (null where unknown).
//! - `odirect`: `{dir, supported, alignment, error}`: whether a file written under
//!   `$STRATA_HOME` (created if needed) reads back through `O_DIRECT`, with the
//!   alignment direct reads need; `error` says what failed (null otherwise).
//! - `cuda`: `{driver, nvrtc, cublas, cufile, searched}`: each library `{present, path,
//!   version, reason, note}` (`reason` says why it is absent; the driver's `version` is
//!   the CUDA version it supports), and the directories searched (see
//!   `backend::cuda::libs`).
//! - `gpus`: `[{ordinal, name, total_memory_bytes, compute_capability: [major, minor]}]`,
//!   and `gpu_error`: why there are none to list (null when the driver answered).
//! - `gds`: `{available, mode, nvidia_fs_version, reason}`: whether the cuFile driver
//!   opens (tried only with a GPU and cuFile present, on GPU 0), `mode` `"direct"` (DMA
//!   from NVMe into GPU memory through nvidia-fs) or `"compat"` (cuFile's POSIX reads
//!   through bounce buffers), the nvidia-fs module's version when loaded, and `reason`:
//!   why GDS is unavailable (no GPU, no cuFile, the driver did not open); see
//!   `backend::cuda::gds`.
//! - `kernels` (with `--compile-kernels` only): `{cache_dir, nvrtc_version,
//!   nvrtc_supported_sm, archs, error, failed, results}`; `error` is set when NVRTC is
//!   absent; `results` has one entry per kernel file and architecture: `{file, arch,
//!   functions, image: COMPILE, ptx: COMPILE}` where `functions` counts the `extern "C"`
//!   kernels the source declares, `image` is what the backend loads (a `cubin` for
//!   `sm_XY` where NVRTC supports it, else `ptx`), `ptx` is PTX for `compute_XY` (kept in
//!   the cache for `ptxas`), and COMPILE is `{kind, bytes, millis, from_cache, path,
//!   error}`; `ptx` also has `entries` (the kernels in the PTX) and `missing` (declared
//!   kernels the PTX lacks). `failed` counts entries with any error or missing kernel.
//! - `ok`: false when something asked for failed (a kernel compile); the exit status is
//!   then non-zero too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Args;
use serde::Serialize;

use super::{out, outln};
use crate::backend::cuda::gds::{self, GdsMode, GdsReport};
use crate::backend::cuda::kernels::{self, KernelFile};
use crate::backend::cuda::libs::{self, CudaLibs, GpuInfo};
use crate::backend::cuda::nvrtc::{self, Arch, Compiled, Compiler};
use crate::backend::device::meminfo_bytes;
use crate::cli::store_cmds::human_size;

/// The architectures `--compile-kernels` always builds for: A100, RTX 30xx/A10, RTX
/// 40xx/L4/L40, H100.
pub const DOCTOR_ARCHS: [Arch; 4] = [Arch::new(8, 0), Arch::new(8, 6), Arch::new(8, 9), Arch::new(9, 0)];

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Compile every CUDA kernel with NVRTC for sm_80, sm_86, sm_89, sm_90 and the local
    /// GPU's architecture, into the kernel cache ($STRATA_HOME/cache/kernels), and report
    /// each; fails if NVRTC is absent or any compile fails.
    #[arg(long = "compile-kernels")]
    pub compile_kernels: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    version: &'static str,
    cpu: CpuReport,
    ram: RamReport,
    odirect: ODirectReport,
    cuda: CudaLibs,
    gpus: Vec<GpuInfo>,
    gpu_error: Option<String>,
    gds: GdsReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    kernels: Option<KernelsReport>,
    ok: bool,
}

#[derive(Debug, Serialize)]
struct CpuReport {
    model: Option<String>,
    logical_cores: usize,
    features: BTreeMap<&'static str, bool>,
    quant_kernel: String,
    matmul_kernel: String,
}

#[derive(Debug, Serialize)]
struct RamReport {
    total_bytes: Option<u64>,
    available_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
struct ODirectReport {
    dir: PathBuf,
    supported: bool,
    /// Offset/length alignment of direct reads, bytes.
    alignment: Option<usize>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct KernelsReport {
    cache_dir: PathBuf,
    nvrtc_version: Option<String>,
    nvrtc_supported_sm: Vec<u32>,
    archs: Vec<String>,
    error: Option<String>,
    failed: usize,
    results: Vec<KernelResult>,
}

#[derive(Debug, Serialize)]
struct KernelResult {
    file: &'static str,
    arch: String,
    /// `extern "C"` kernels the source declares.
    functions: usize,
    image: CompileResult,
    ptx: CompileResult,
}

#[derive(Debug, Default, Serialize)]
struct CompileResult {
    kind: Option<nvrtc::ImageKind>,
    bytes: usize,
    millis: f64,
    from_cache: bool,
    path: Option<PathBuf>,
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entries: Option<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    missing: Vec<String>,
}

impl CompileResult {
    fn from(r: Result<Compiled, nvrtc::CompileError>) -> CompileResult {
        match r {
            Ok(c) => CompileResult {
                kind: Some(c.kind),
                bytes: c.image.len(),
                millis: (c.millis * 10.0).round() / 10.0,
                from_cache: c.from_cache,
                error: c.cache_error.clone(),
                path: Some(c.path_in_cache),
                entries: None,
                missing: Vec::new(),
            },
            Err(e) => CompileResult { error: Some(e.to_string()), ..CompileResult::default() },
        }
    }

    fn failed(&self) -> bool {
        self.error.is_some() || !self.missing.is_empty()
    }
}

pub fn main(args: DoctorArgs) -> anyhow::Result<()> {
    let cuda = libs::report();
    let (gpus, gpu_error) = match libs::gpus() {
        Ok(g) => (g, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let gds = gds::report();
    let kernels = args.compile_kernels.then(|| compile_kernels(&gpus));
    let ok = kernels.as_ref().is_none_or(|k| k.error.is_none() && k.failed == 0);
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        cpu: cpu_report(),
        ram: ram_report(),
        odirect: odirect_report(&crate::store::strata_home()),
        cuda,
        gpus,
        gpu_error,
        gds,
        kernels,
        ok,
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out!("{}", render_text(&report))?;
    }
    if let Some(k) = &report.kernels {
        if let Some(e) = &k.error {
            anyhow::bail!("cannot compile kernels: {e}");
        }
        if k.failed > 0 {
            anyhow::bail!("{} of {} kernel compiles failed", k.failed, k.results.len());
        }
    }
    Ok(())
}

fn cpu_report() -> CpuReport {
    let flags = cpuinfo_flags();
    let mut features = BTreeMap::new();
    for (name, on) in simd_features() {
        features.insert(name, on);
    }
    // AMX detection is unstable in `is_x86_feature_detected!`; the kernel lists it in
    // /proc/cpuinfo only when the OS has enabled the tile state.
    for (key, flag) in [("amx_tile", "amx_tile"), ("amx_int8", "amx_int8"), ("amx_bf16", "amx_bf16")] {
        features.insert(key, flags.iter().any(|f| f == flag));
    }
    CpuReport {
        model: crate::backend::device::cpu_model(),
        logical_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        features,
        quant_kernel: format!("{:?}", crate::quant::QuantKernel::best()),
        matmul_kernel: format!("{:?}", crate::backend::cpu::matmul::Kernel::best()),
    }
}

/// The SIMD features the CPU kernels dispatch on (`quant::simd`, `backend::cpu::matmul`).
fn simd_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        vec![
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("f16c", has!("f16c")),
            ("avx512f", has!("avx512f")),
            ("avx512bw", has!("avx512bw")),
            ("avx512vl", has!("avx512vl")),
            ("avx512vnni", has!("avx512vnni")),
            ("avx512vbmi", has!("avx512vbmi")),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vbmi"]
            .into_iter()
            .map(|f| (f, false))
            .collect()
    }
}

/// The `flags` line of the first processor in `/proc/cpuinfo`.
fn cpuinfo_flags() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("flags").and_then(|r| r.split_once(':')))
        .map(|(_, f)| f.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

fn ram_report() -> RamReport {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    RamReport { total_bytes: meminfo_bytes(&text, "MemTotal"), available_bytes: meminfo_bytes(&text, "MemAvailable") }
}

/// Writes a 1 MiB file under `dir`, reads it back through [`crate::sched::io::StorageFile`]
/// (`O_DIRECT` where the filesystem allows it) and removes it.
fn odirect_report(dir: &Path) -> ODirectReport {
    let mut r = ODirectReport { dir: dir.to_path_buf(), supported: false, alignment: None, error: None };
    match odirect_probe(dir) {
        Ok((direct, align)) => {
            r.supported = direct;
            r.alignment = direct.then_some(align);
            if !direct {
                r.error = Some("the filesystem refuses O_DIRECT; reads go through the page cache".into());
            }
        }
        Err(e) => r.error = Some(e),
    }
    r
}

fn odirect_probe(dir: &Path) -> Result<(bool, usize), String> {
    use crate::sched::io::{AlignedBuf, StorageFile};
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!(".doctor-odirect-{}", std::process::id()));
    // 1 MiB of a pattern that differs at every 4 KiB page.
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i ^ (i >> 12)) as u8).collect();
    let result = (|| {
        std::fs::write(&path, &data).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = StorageFile::open(&path).map_err(|e| e.to_string())?;
        let mut buf = AlignedBuf::new();
        // Unaligned on purpose: the reader widens to the alignment.
        let range = file.read_range(4097, 300_000, &mut buf).map_err(|e| e.to_string())?;
        if buf.as_slice()[range] != data[4097..4097 + 300_000] {
            return Err(format!("{}: read back different bytes", path.display()));
        }
        Ok((file.is_direct(), file.alignment()))
    })();
    let _ = std::fs::remove_file(&path);
    result
}

fn compile_kernels(gpus: &[GpuInfo]) -> KernelsReport {
    let mut archs: Vec<Arch> = DOCTOR_ARCHS.to_vec();
    archs.extend(gpus.iter().map(|g| Arch::new(g.compute_capability.0, g.compute_capability.1)));
    archs.sort();
    archs.dedup();
    let compiler = Compiler::new(nvrtc::default_cache_dir());
    let mut report = KernelsReport {
        cache_dir: compiler.cache_dir().to_path_buf(),
        nvrtc_version: None,
        nvrtc_supported_sm: Vec::new(),
        archs: archs.iter().map(|a| a.to_string()).collect(),
        error: None,
        failed: 0,
        results: Vec::new(),
    };
    match nvrtc::nvrtc_info() {
        Ok(info) => {
            report.nvrtc_version = Some(format!("{}.{}", info.version.0, info.version.1));
            report.nvrtc_supported_sm = info.supported_sm.clone();
        }
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    }
    let jobs: Vec<(&'static KernelFile, Arch)> =
        kernels::FILES.iter().flat_map(|f| archs.iter().map(move |&a| (f, a))).collect();
    report.results = run_parallel(&jobs, |&(file, arch)| compile_one(&compiler, file, arch));
    report.failed = report.results.iter().filter(|r| r.image.failed() || r.ptx.failed()).count();
    report
}

fn compile_one(compiler: &Compiler, file: &'static KernelFile, arch: Arch) -> KernelResult {
    let declared = kernels::functions(file);
    let image = CompileResult::from(compiler.compile(file, arch));
    let ptx = compiler.compile_ptx(file, arch);
    let entries = ptx.as_ref().map(|c| c.ptx_entries()).unwrap_or_default();
    let mut ptx_result = CompileResult::from(ptx);
    if ptx_result.error.is_none() {
        ptx_result.entries = Some(entries.len());
        ptx_result.missing = declared.iter().filter(|d| !entries.contains(d)).cloned().collect();
    }
    KernelResult { file: file.name, arch: arch.to_string(), functions: declared.len(), image, ptx: ptx_result }
}

/// `f` over `jobs` on one thread per core; results in job order.
fn run_parallel<J: Sync, R: Send>(jobs: &[J], f: impl Fn(&J) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len()).max(1);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let r = f(job);
                    if let Ok(mut slots) = results.lock() {
                        slots[i] = Some(r);
                    }
                }
            });
        }
    });
    results.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().flatten().collect()
}

fn render_text(r: &Report) -> String {
    let mut out = String::new();
    let mut line = |label: &str, text: String| out.push_str(&format!("{label:<10}{text}\n"));
    line("Strata", r.version.to_string());
    let cpu = &r.cpu;
    line("CPU", format!("{} ({} logical cores)", cpu.model.as_deref().unwrap_or("unknown"), cpu.logical_cores));
    let (on, off): (Vec<_>, Vec<_>) = cpu.features.iter().partition(|(_, v)| **v);
    let names = |v: Vec<(&&str, &bool)>| v.into_iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>().join(" ");
    line("", format!("has: {}", if on.is_empty() { "-".into() } else { names(on) }));
    line("", format!("lacks: {}", if off.is_empty() { "-".into() } else { names(off) }));
    line("", format!("kernels: quant {}, matmul {}", cpu.quant_kernel, cpu.matmul_kernel));
    let size = |b: Option<u64>| b.map_or("?".into(), human_size);
    line("RAM", format!("{} total, {} available", size(r.ram.total_bytes), size(r.ram.available_bytes)));
    let od = &r.odirect;
    line(
        "O_DIRECT",
        match (od.supported, &od.error) {
            (true, _) => format!("yes on {} (alignment {} B)", od.dir.display(), od.alignment.unwrap_or(0)),
            (false, Some(e)) => format!("no on {}: {e}", od.dir.display()),
            (false, None) => format!("no on {}", od.dir.display()),
        },
    );
    if r.gpus.is_empty() {
        line("GPU", format!("none: {}", r.gpu_error.as_deref().unwrap_or("the driver lists no device")));
    }
    for g in &r.gpus {
        let (a, b) = g.compute_capability;
        line(
            &format!("GPU {}", g.ordinal),
            format!("{} ({}, compute capability {a}.{b}, sm_{a}{b})", g.name, human_size(g.total_memory_bytes)),
        );
    }
    for (label, lib) in
        [("driver", &r.cuda.driver), ("NVRTC", &r.cuda.nvrtc), ("cuBLAS", &r.cuda.cublas), ("cuFile", &r.cuda.cufile)]
    {
        let text = if lib.present {
            let path = lib.path.as_ref().map_or("?".into(), |p| p.display().to_string());
            format!("{:<8} {path}", lib.version.as_deref().unwrap_or("present"))
        } else {
            format!("{:<8} {}", "absent", lib.reason.as_deref().unwrap_or(""))
        };
        line(label, text);
        if let Some(n) = &lib.note {
            line("", format!("note: {n}"));
        }
    }
    line("GDS", gds_text(&r.gds));
    if let Some(k) = &r.kernels {
        out.push_str(&render_kernels(k));
    }
    out
}

/// The `GDS` line: the mode and what it means, or why GDS is unavailable.
fn gds_text(g: &GdsReport) -> String {
    match (g.available, g.mode, &g.nvidia_fs_version) {
        (true, Some(m), v) if m == GdsMode::Direct.as_str() => {
            format!("direct   nvidia-fs {}: DMA from NVMe into GPU memory", v.as_deref().unwrap_or("?"))
        }
        (true, Some(_), None) => {
            "compat   nvidia-fs not loaded: cuFile reads through host bounce buffers (no P2P)".to_string()
        }
        (true, Some(_), Some(v)) => {
            format!(
                "compat   forced by cuFile's force_compat_mode (nvidia-fs {v} loaded): reads through host bounce buffers"
            )
        }
        (true, None, _) => "available".to_string(),
        (false, ..) => format!("unavailable: {}", g.reason.as_deref().unwrap_or("unknown")),
    }
}

fn render_kernels(k: &KernelsReport) -> String {
    let mut out = format!(
        "\nKernels   NVRTC {} into {}\n",
        k.nvrtc_version.as_deref().unwrap_or("absent"),
        k.cache_dir.display()
    );
    if let Some(e) = &k.error {
        out.push_str(&format!("          not compiled: {e}\n"));
        return out;
    }
    out.push_str(&format!(
        "{:<12} {:<7} {:>4} {:<6} {:>9} {:>9} {:<6} {:>9} {:>9}  {}\n",
        "file", "arch", "fns", "image", "bytes", "ms", "cached", "ptx bytes", "ptx ms", "status"
    ));
    for r in &k.results {
        let status = match (&r.image.error, &r.ptx.error) {
            (None, None) if r.ptx.missing.is_empty() => "ok".to_string(),
            (None, None) => format!("PTX lacks {}", r.ptx.missing.join(", ")),
            (Some(e), _) | (None, Some(e)) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
        };
        out.push_str(&format!(
            "{:<12} {:<7} {:>4} {:<6} {:>9} {:>9.1} {:<6} {:>9} {:>9.1}  {status}\n",
            r.file,
            r.arch,
            r.functions,
            r.image.kind.map_or("-", |k| k.extension()),
            r.image.bytes,
            r.image.millis,
            if r.image.from_cache { "yes" } else { "no" },
            r.ptx.bytes,
            r.ptx.millis,
        ));
    }
    for r in k.results.iter().filter(|r| r.image.error.is_some() || r.ptx.error.is_some()) {
        for e in [&r.image.error, &r.ptx.error].into_iter().flatten() {
            out.push_str(&format!("\n{} {}:\n{e}\n", r.file, r.arch));
        }
    }
    out.push_str(&format!("{} of {} compiled without error\n", k.results.len() - k.failed, k.results.len()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_parsed_in_bytes() {
        let text =
            "MemTotal:       24576000 kB\nMemFree:   100 kB\nMemAvailable:   20000000 kB\nHugePages_Total:       0\n";
        assert_eq!(meminfo_bytes(text, "MemTotal"), Some(24576000 * 1024));
        assert_eq!(meminfo_bytes(text, "MemAvailable"), Some(20000000 * 1024));
        assert_eq!(meminfo_bytes(text, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_bytes(text, "Missing"), None);
        assert_eq!(meminfo_bytes("MemTotal: lots kB", "MemTotal"), None);
    }

    #[test]
    fn odirect_probe_reads_back_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("strata-doctor-odirect-{}", std::process::id()));
        let r = odirect_report(&dir);
        assert!(r.supported || r.error.is_some(), "{r:?}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the probe file is removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gds_line_says_the_mode_or_why_not() {
        let direct =
            GdsReport { available: true, mode: Some("direct"), nvidia_fs_version: Some("2.17".into()), reason: None };
        assert_eq!(gds_text(&direct), "direct   nvidia-fs 2.17: DMA from NVMe into GPU memory");
        let compat = GdsReport { mode: Some("compat"), nvidia_fs_version: None, ..direct.clone() };
        assert!(gds_text(&compat).starts_with("compat   nvidia-fs not loaded"), "{}", gds_text(&compat));
        let forced = GdsReport { mode: Some("compat"), ..direct.clone() };
        assert!(gds_text(&forced).contains("force_compat_mode"), "{}", gds_text(&forced));
        let absent = GdsReport {
            available: false,
            mode: None,
            nvidia_fs_version: None,
            reason: Some("no GPU: libcuda.so.1 not found: no NVIDIA driver".into()),
        };
        assert_eq!(gds_text(&absent), "unavailable: no GPU: libcuda.so.1 not found: no NVIDIA driver");
    }

    #[test]
    fn parallel_results_keep_job_order() {
        let jobs: Vec<u32> = (0..50).collect();
        assert_eq!(run_parallel(&jobs, |j| j * 2), jobs.iter().map(|j| j * 2).collect::<Vec<_>>());
        assert!(run_parallel(&[] as &[u32], |j| *j).is_empty());
    }
}
