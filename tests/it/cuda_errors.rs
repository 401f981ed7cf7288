//! `--device` on machines where CUDA cannot run: the error says what is missing and the
//! process exits non-zero without panicking; `auto` falls back to the CPU.
//!
//! A real driver is not needed: tests/it/support/fake_libcuda.c, built here with the C
//! compiler, stands in for `libcuda.so.1` (found through `LD_LIBRARY_PATH`) and reports
//! no devices, a failing `cuInit`, or one device. Without a C compiler only the
//! no-driver case runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-cuda-errors-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds the fake driver into `dir/libcuda.so.1`; `None` without a C compiler.
fn fake_driver(dir: &Path) -> Option<PathBuf> {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/support/fake_libcuda.c");
    assert!(Path::new(src).is_file(), "{src} is missing");
    let out = dir.join("libcuda.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(cc).args(["-shared", "-fPIC", "-o"]).arg(&out).arg(src).status();
    match built {
        Ok(s) if s.success() => Some(out),
        _ => {
            eprintln!("no C compiler: skipping the fake-driver cases");
            None
        }
    }
}

/// `strata ARGS` with no CUDA library hints, `lib_dir` (if any) on the loader path and
/// the fake driver's settings in `env`.
fn strata(lib_dir: Option<&Path>, env: &[(&str, &str)], args: &[&str]) -> Output {
    let home = temp_dir("home");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(args).env("STRATA_HOME", &home).env_remove("STRATA_CUDA_LIBS").env_remove("VIRTUAL_ENV");
    match lib_dir {
        Some(d) => cmd.env("LD_LIBRARY_PATH", d),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running strata")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_clean_failure(o: &Output, want: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(want), "expected `{want}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

const RUN: [&str; 6] = ["run", "strata-demo", "-p", "hi", "--max-tokens", "2"];

fn with_device(device: &str) -> Vec<&str> {
    let mut args = RUN.to_vec();
    args.extend(["--device", device]);
    args
}

/// Whether this machine has a real NVIDIA driver (the no-driver cases then do not apply).
fn real_driver_present() -> bool {
    ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1", "/usr/lib/libcuda.so.1"]
        .iter()
        .any(|p| Path::new(p).exists())
}

#[test]
fn cuda_without_a_driver_is_a_clean_error_and_auto_uses_the_cpu() {
    if real_driver_present() {
        eprintln!("this machine has an NVIDIA driver: skipping");
        return;
    }
    for cmd in [with_device("cuda"), with_device("cuda:0")] {
        assert_clean_failure(&strata(None, &[], &cmd), "no NVIDIA driver: libcuda.so.1 was not found");
    }
    let bench = strata(None, &[], &["bench", "strata-demo", "--device", "cuda", "--runs", "1"]);
    assert_clean_failure(&bench, "no NVIDIA driver");
    let ppl_text = temp_dir("ppl").join("t.txt");
    std::fs::write(&ppl_text, "some text to score").unwrap();
    let ppl =
        strata(None, &[], &["perplexity", "strata-demo", "--file", ppl_text.to_str().unwrap(), "--device", "cuda"]);
    assert_clean_failure(&ppl, "no NVIDIA driver");

    // The setting from the environment, and `serve`, which refuses before it listens.
    assert_clean_failure(&strata(None, &[("STRATA_DEVICE", "cuda:0")], &RUN), "no NVIDIA driver");
    assert_clean_failure(&strata(None, &[], &["serve", "--device", "cuda", "--port", "0"]), "no NVIDIA driver");

    let auto = strata(None, &[], &with_device("auto"));
    assert!(auto.status.success(), "{}", stderr(&auto));
    let bench = strata(None, &[], &["bench", "strata-demo", "--runs", "1", "--gen-tokens", "2", "--json"]);
    assert!(bench.status.success(), "{}", stderr(&bench));
    let report: serde_json::Value = serde_json::from_slice(&bench.stdout).unwrap();
    assert_eq!(report["device"], "cpu", "{report}");
    assert!(report["device_name"].is_string());
}

#[test]
fn a_driver_without_devices_or_without_nvrtc_is_named() {
    if real_driver_present() {
        eprintln!("this machine has an NVIDIA driver: skipping");
        return;
    }
    let dir = temp_dir("driver");
    if fake_driver(&dir).is_none() {
        return;
    }
    let lib = Some(dir.as_path());
    // The driver loads but sees no GPU.
    assert_clean_failure(&strata(lib, &[], &with_device("cuda")), "no CUDA device 0: this machine has 0");
    let two = [("FAKE_CUDA_COUNT", "2")];
    // cuInit fails (CUDA_ERROR_NO_DEVICE), as it does when the driver finds no GPU.
    let failing = [("FAKE_CUDA_INIT", "100")];
    assert_clean_failure(&strata(lib, &failing, &with_device("cuda:0")), "the NVIDIA driver did not initialise");
    assert_clean_failure(&strata(lib, &two, &with_device("cuda:5")), "no CUDA device 5: this machine has 2");
    let serve = strata(lib, &two, &["serve", "--device", "cuda:2", "--port", "0"]);
    assert_clean_failure(&serve, "no CUDA device 2: this machine has 2");
    // `auto` falls back to the CPU in every one of these cases.
    for env in [&[][..], &failing[..]] {
        let o = strata(lib, env, &with_device("auto"));
        assert!(o.status.success(), "{}", stderr(&o));
    }

    // A device, but no NVRTC to compile the kernels with (only where this machine has
    // none on the loader's default path, which `doctor` tells).
    let doctor = strata(lib, &[], &["doctor", "--json"]);
    assert!(doctor.status.success(), "{}", stderr(&doctor));
    let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let nvrtc_present = report.pointer("/cuda/nvrtc/present").and_then(|v| v.as_bool()).unwrap_or(true);
    if !nvrtc_present {
        assert_clean_failure(&strata(lib, &two, &with_device("cuda:1")), "NVRTC (libnvrtc.so.13 or .12) was not found");
    }
}
