//! safetensors bytes through `safetensors::parse` (what `load_file` runs on the memory map).
#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use strata::format::safetensors;
use strata::tensor::{AlignedBytes, ByteSource};

fuzz_target!(|data: &[u8]| {
    let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(data));
    if let Ok(tensors) = safetensors::parse(src, Path::new("fuzz.safetensors")) {
        strata_fuzz::touch_tensors(tensors.values());
    }
});
