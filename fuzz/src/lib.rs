//! Helpers shared by the fuzz targets: a per-process scratch directory for the parsers
//! that take a path, and a bounded read of every tensor a parser hands back, the way a
//! loader would read it, so that a view the parser failed to bound shows up as a crash
//! here rather than at inference time.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use strata::tensor::HostTensor;

/// Tensors with more values than this are checked for their byte range only, not
/// dequantized (keeps one execution in the microseconds).
const MAX_DEQUANT_VALUES: usize = 1 << 14;

/// `$STRATA_FUZZ_TMP/strata-fuzz-<pid>` (the system temp directory when unset), created
/// on first use and reused by every execution of this process.
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::var_os("STRATA_FUZZ_TMP").map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = base.join(format!("strata-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        dir
    })
}

/// Writes `data` to `name` in the scratch directory (replacing what an earlier
/// execution wrote there) and returns its path.
pub fn write_scratch(name: &str, data: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, data).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// Reads every tensor's bytes and dequantizes the small ones.
pub fn touch_tensors<'a>(tensors: impl IntoIterator<Item = &'a HostTensor>) {
    for t in tensors {
        let bytes = t.bytes();
        assert_eq!(t.dtype.bytes_for(t.numel()), Some(bytes.len()), "{t:?}: byte length does not match the shape");
        if t.numel() <= MAX_DEQUANT_VALUES {
            std::hint::black_box(t.to_f32_vec());
        }
    }
}
