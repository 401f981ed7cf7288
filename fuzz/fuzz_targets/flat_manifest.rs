//! A flat layer directory's `manifest.json` through `flat::open`, `verify`, `inspect` and
//! `layer_ranges`. The input is the manifest text; it is written into a scratch directory
//! that holds copies of every other file of the real flat model named by
//! `STRATA_FUZZ_FLAT_MODEL` (`tools/fuzz.sh` converts one), so the fuzzer explores the
//! manifest checks against real `.bin` files.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use strata::format::flat;

/// The scratch model directory, filled once per process.
fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let Some(src) = std::env::var_os("STRATA_FUZZ_FLAT_MODEL").map(PathBuf::from) else {
            eprintln!("flat_manifest: set STRATA_FUZZ_FLAT_MODEL to a flat layer directory (tools/fuzz.sh does)");
            std::process::exit(2);
        };
        let dir = strata_fuzz::scratch_dir().join("flat");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let entries = std::fs::read_dir(&src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
            if entry.file_name() != flat::MANIFEST {
                let to = dir.join(entry.file_name());
                std::fs::copy(entry.path(), &to).unwrap_or_else(|e| panic!("copying to {}: {e}", to.display()));
            }
        }
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = model_dir();
    let manifest = dir.join(flat::MANIFEST);
    std::fs::write(&manifest, data).unwrap_or_else(|e| panic!("writing {}: {e}", manifest.display()));
    if let Ok(src) = flat::open(dir) {
        strata_fuzz::touch_tensors(src.tensors.values());
    }
    let _ = flat::verify(dir);
    let _ = flat::inspect(dir);
    let _ = flat::layer_ranges(dir);
});
