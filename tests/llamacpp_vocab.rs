//! Tokenization against llama.cpp's own expectations: the vocabulary-only GGUFs in
//! llama.cpp's `models/` (`ggml-vocab-NAME.gguf`, with `.inp` texts and `.out` token
//! ids that llama.cpp's tokenizer test writes).
//!
//! They ship in the llama-cpp-python sdist (`vendor/llama.cpp/models`), which is not
//! committed: set `STRATA_LLAMACPP_VOCAB_DIR` to that directory to run this test
//! (`pip download --no-deps --no-binary :all: --no-build-isolation
//! llama-cpp-python==0.3.36`, with cmake and scikit-build-core installed). Without it
//! the test says so and passes.

use std::path::Path;

use strata::cli::tokenize::load_tokenizer;

/// The vocabularies whose tokenizer type Strata supports, and must match exactly.
const SUPPORTED: &[&str] = &[
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "starcoder",
    "refact",
    "command-r",
    "falcon",
    "mpt",
    "deepseek-coder",
    "deepseek-llm",
    "llama-spm",
    "phi-3",
];

#[test]
fn every_supported_vocabulary_tokenizes_as_llama_cpp_does() {
    let Ok(dir) = std::env::var("STRATA_LLAMACPP_VOCAB_DIR") else {
        eprintln!("STRATA_LLAMACPP_VOCAB_DIR is not set: skipping");
        return;
    };
    let mut failures = Vec::new();
    for name in SUPPORTED {
        let gguf = Path::new(&dir).join(format!("ggml-vocab-{name}.gguf"));
        let (inp, out) = (gguf.with_extension("gguf.inp"), gguf.with_extension("gguf.out"));
        let tok = match load_tokenizer(gguf.to_str().unwrap()) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e:#}"));
                continue;
            }
        };
        let inp = std::fs::read_to_string(&inp).unwrap();
        let out = std::fs::read_to_string(&out).unwrap();
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let want: Vec<&str> = out.lines().collect();
        let mut bad = 0;
        for (text, want) in texts.iter().zip(&want) {
            let want: Vec<u32> = want.split_whitespace().map(|t| t.parse().unwrap()).collect();
            let got = tok.encode(text, false).unwrap();
            if got != want {
                if bad < 3 {
                    failures.push(format!("{name}: {text:?}: got {got:?}, llama.cpp {want:?}"));
                }
                bad += 1;
            }
        }
        eprintln!("{name}: {} of {} texts match", want.len().min(texts.len()) - bad, want.len().min(texts.len()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
