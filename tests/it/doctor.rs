//! `strata doctor` on a machine without a GPU, and the NVRTC kernel cache.
//!
//! The NVRTC test runs only where `STRATA_TEST_NVRTC_LIBS` names a directory holding
//! `libnvrtc.so.12` or `.13` (tools/cuda_toolchain.sh sets it to the pip wheel's); the
//! others need nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use strata::backend::cuda::kernels::{self, KernelFile};
use strata::backend::cuda::libs;
use strata::backend::cuda::nvrtc::{Arch, CompileError, Compiler, ImageKind, ptx_entries};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-doctor-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `strata doctor ARGS` with its own `$STRATA_HOME` and no library hints.
fn doctor(home: &Path, args: &[&str]) -> (std::process::Output, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("doctor")
        .args(args)
        .env("STRATA_HOME", home)
        .env_remove("STRATA_CUDA_LIBS")
        .env_remove("VIRTUAL_ENV")
        .output()
        .expect("running strata doctor");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, json)
}

#[test]
fn doctor_json_reports_the_machine_without_a_gpu() {
    let home = temp_dir("json").join("home-not-yet-made");
    let (out, j) = doctor(&home, &["--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(j["ok"], true, "{j:#}");
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"));

    let cpu = &j["cpu"];
    assert!(cpu["logical_cores"].as_u64().unwrap() >= 1);
    for f in ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vbmi", "amx_tile"] {
        assert!(cpu["features"][f].is_boolean(), "cpu.features.{f}: {cpu:#}");
    }
    assert!(["Scalar", "Avx2", "Avx512"].contains(&cpu["quant_kernel"].as_str().unwrap()));

    let ram = &j["ram"];
    let (total, avail) = (ram["total_bytes"].as_u64().unwrap(), ram["available_bytes"].as_u64().unwrap());
    assert!(total > 0 && avail <= total, "{ram}");

    // $STRATA_HOME is created for the probe, and the probe file is gone afterwards.
    let od = &j["odirect"];
    assert_eq!(od["dir"], home.to_str().unwrap());
    assert!(od["supported"].as_bool().unwrap() || od["error"].is_string(), "{od}");
    assert_eq!(std::fs::read_dir(&home).unwrap().count(), 0);

    let driver = &j["cuda"]["driver"];
    if driver["present"] == true {
        // A machine with a driver: it either lists GPUs or says why not.
        assert!(driver["version"].is_string(), "{driver}");
        assert!(j["gpus"].as_array().is_some_and(|g| !g.is_empty()) || j["gpu_error"].is_string(), "{j:#}");
    } else {
        assert_eq!(driver["reason"], "libcuda.so.1 not found: no NVIDIA driver", "{driver}");
        assert_eq!(j["gpus"], serde_json::json!([]));
        assert_eq!(j["gpu_error"], "libcuda.so.1 not found: no NVIDIA driver");
    }
    for lib in ["nvrtc", "cublas", "cufile"] {
        let l = &j["cuda"][lib];
        assert_eq!(l["present"].as_bool().unwrap(), l["reason"].is_null(), "{lib}: {l}");
        assert_eq!(l["present"].as_bool().unwrap(), l["path"].is_string(), "{lib}: {l}");
    }
    assert!(j.get("kernels").is_none(), "kernels only with --compile-kernels");

    // The table says the same in words.
    let (out, _) = doctor(&home, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for label in ["CPU", "RAM", "O_DIRECT", "driver", "NVRTC", "cuBLAS", "cuFile"] {
        assert!(text.lines().any(|l| l.starts_with(label)), "no {label} line in:\n{text}");
    }
    std::fs::remove_dir_all(home.parent().unwrap()).unwrap();
}

#[test]
fn compile_kernels_without_nvrtc_fails_cleanly() {
    let home = temp_dir("nonvrtc");
    let (out, j) = doctor(&home, &["--compile-kernels", "--json"]);
    if j["cuda"]["nvrtc"]["present"] == true {
        return; // this machine has NVRTC on its own; tools/cuda_toolchain.sh covers it.
    }
    assert!(!out.status.success(), "must fail without NVRTC");
    assert_eq!(j["ok"], false);
    let err = j["kernels"]["error"].as_str().unwrap();
    assert!(err.starts_with("NVRTC (libnvrtc.so.12 or .13) not found: "), "{err}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot compile kernels"));
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn nvrtc_compiles_caches_and_recompiles_a_corrupt_entry() {
    let Some(dir) = std::env::var_os("STRATA_TEST_NVRTC_LIBS") else {
        eprintln!("skipped: set STRATA_TEST_NVRTC_LIBS to a directory holding libnvrtc.so.12 or .13");
        return;
    };
    // The first preload of this process, so the directory is searched first.
    assert!(libs::preload_with(&[PathBuf::from(&dir)]), "something preloaded the CUDA libraries earlier");
    assert!(libs::nvrtc_present(), "no NVRTC in {dir:?}: {:?}", libs::report().nvrtc);

    let cache = temp_dir("nvrtc");
    let compiler = Compiler::new(cache.clone());
    let file = kernels::by_name("norm").unwrap();
    let arch = Arch::new(8, 6);

    let first = compiler.compile(file, arch).unwrap();
    assert!(!first.from_cache && first.cache_error.is_none());
    assert_eq!(first.kind, ImageKind::Cubin, "NVRTC 12+ compiles SASS for sm_86");
    assert!(first.image.starts_with(b"\x7fELF"));
    let name = first.path_in_cache.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("norm-") && name.contains("-sm_86-nvrtc") && name.ends_with(".cubin"), "{name}");

    let second = compiler.compile(file, arch).unwrap();
    assert!(second.from_cache);
    assert_eq!(second.image, first.image);
    assert_eq!(second.path_in_cache, first.path_in_cache);

    // A flipped byte in the middle of the entry: recompiled, rewritten, then cached again.
    let mut bytes = std::fs::read(&first.path_in_cache).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&first.path_in_cache, &bytes).unwrap();
    let third = compiler.compile(file, arch).unwrap();
    assert!(!third.from_cache, "a corrupt entry must be recompiled");
    assert_eq!(third.image, first.image);
    assert!(compiler.compile(file, arch).unwrap().from_cache);
    // A truncated one too.
    std::fs::write(&first.path_in_cache, &bytes[..100]).unwrap();
    assert!(!compiler.compile(file, arch).unwrap().from_cache);

    // PTX for compute_86 lists every kernel the source declares.
    let ptx = compiler.compile_ptx(file, arch).unwrap();
    assert_eq!(ptx.kind, ImageKind::Ptx);
    assert!(!ptx.image.contains(&0));
    let entries = ptx_entries(std::str::from_utf8(&ptx.image).unwrap());
    assert_eq!(entries, kernels::functions(file));
    assert!(ptx.path_in_cache.to_str().unwrap().ends_with(".ptx"));

    // A GPU newer than NVRTC knows gets PTX for the newest architecture it does know.
    let future = compiler.compile(file, Arch::new(99, 9)).unwrap();
    assert_eq!(future.kind, ImageKind::Ptx);
    let text = String::from_utf8_lossy(&future.image);
    assert!(text.contains(".target sm_"), "{}", &text[..text.len().min(400)]);
    assert!(matches!(compiler.compile(file, Arch::new(1, 0)), Err(CompileError::UnsupportedArch { .. })));

    // A compile error names the file and carries NVRTC's log.
    let broken = KernelFile {
        name: "broken",
        source: "extern \"C\" __global__ void f(float* x) { x[0] = undeclared_thing; }\n",
        needs_quant: false,
    };
    let err = compiler.compile(&broken, arch).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CompileError::Compile { .. }), "{msg}");
    assert!(msg.contains("broken.cu") && msg.contains("undeclared_thing"), "{msg}");

    // Nothing half-written is left in the cache.
    for e in std::fs::read_dir(&cache).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        assert!(!n.ends_with(".tmp"), "{n}");
    }
    std::fs::remove_dir_all(&cache).unwrap();
}
