//! A GGUF file through `source_from_gguf`: metadata to `config.json`, llama.cpp tensor
//! names to Hugging Face ones (Q/K rows unpermuted), the vocabulary to `tokenizer.json`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata::model::gguf_source::source_from_gguf;

fuzz_target!(|data: &[u8]| {
    let path = strata_fuzz::write_scratch("fuzz.gguf", data);
    if let Ok(src) = source_from_gguf(&path) {
        strata_fuzz::touch_tensors(src.tensors.values());
    }
});
