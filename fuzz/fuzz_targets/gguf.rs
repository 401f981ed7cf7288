//! GGUF bytes through `GgufFile::parse` (what `GgufFile::open` runs on the memory map).
#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use strata::format::gguf::GgufFile;
use strata::tensor::{AlignedBytes, ByteSource};

fuzz_target!(|data: &[u8]| {
    let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(data));
    if let Ok(f) = GgufFile::parse(src, Path::new("fuzz.gguf")) {
        for info in &f.infos {
            std::hint::black_box(info.shape());
        }
        strata_fuzz::touch_tensors(f.tensors.values());
    }
});
