//! Strata's scalar quant references against golden vectors from independent
//! implementations: gguf-py's numpy `gguf.quants` (plus small numpy functions for the
//! formats it lacks) for the dequantizers and the Q8_0/Q4_0/MXFP4 quantizers, and llama.cpp's
//! own `quantize_row_*_ref` for the Q4_K/Q6_K/Q8_K quantizers. Fixtures:
//! tests/fixtures/quant/, produced by `tools/make_quant_fixtures.py` (re-run with
//! /work/refvenv/bin/python after `pip install gguf llama-cpp-python`); see its
//! docstring for which reference made each file.

use std::path::{Path, PathBuf};

use strata::quant::{self, Block, blocks_as_bytes, zeroed_blocks};
use strata::tensor::{AlignedBytes, ByteSource, DType};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn read(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run tools/make_quant_fixtures.py)", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn dtype_of(name: &str) -> DType {
    use DType::*;
    match name {
        "Q4_0" => Q4_0,
        "Q4_1" => Q4_1,
        "Q5_0" => Q5_0,
        "Q5_1" => Q5_1,
        "Q8_0" => Q8_0,
        "Q8_1" => Q8_1,
        "Q4_K" => Q4_K,
        "Q5_K" => Q5_K,
        "Q6_K" => Q6_K,
        "Q8_K" => Q8_K,
        "MXFP4" => Mxfp4,
        "AffineQ4" => AffineQ4,
        "I8" => I8,
        other => panic!("unknown dtype {other} in index.json"),
    }
}

fn index() -> Vec<serde_json::Value> {
    let index: serde_json::Value = serde_json::from_slice(&read("index.json")).expect("index.json parses");
    assert_eq!(index["generator"], "tools/make_quant_fixtures.py");
    index["fixtures"].as_array().expect("fixtures is an array").clone()
}

#[test]
fn dequantize_is_bit_exact_for_every_block_type() {
    let fixtures = index();
    let mut seen = Vec::new();
    for f in &fixtures {
        let dt = dtype_of(f["dtype"].as_str().unwrap());
        let raw = read(f["blocks"].as_str().unwrap());
        let want = f32s(&read(f["expected"].as_str().unwrap()));
        let n = f["n_blocks"].as_u64().unwrap() as usize;
        assert_eq!(f["block_bytes"].as_u64().unwrap() as usize, dt.block_bytes(), "{dt:?} block size");
        assert_eq!(raw.len(), n * dt.block_bytes(), "{dt:?}");
        assert_eq!(want.len(), n * dt.block_size(), "{dt:?}");
        // Aligned (the in-place cast) and misaligned by one byte (the copying path).
        let aligned = AlignedBytes::from_slice(&raw);
        let mut shifted_raw = vec![0u8];
        shifted_raw.extend_from_slice(&raw);
        let shifted = AlignedBytes::from_slice(&shifted_raw);
        for bytes in [aligned.bytes(), &shifted.bytes()[1..]] {
            let mut got = vec![f32::NAN; want.len()];
            quant::dequantize(dt, bytes, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{dt:?} value {i}: strata {g} vs {} {w}", f["reference"]);
            }
        }
        seen.push(dt);
    }
    use DType::*;
    for dt in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K, Mxfp4, AffineQ4, I8] {
        assert!(seen.contains(&dt), "no fixture for {dt:?}");
    }
}

/// Strata's quantizer for `dtype` applied to `x`, as the raw bytes of its blocks.
fn strata_quantize(dtype: &str, x: &[f32]) -> Vec<u8> {
    fn run<B: Block>(x: &[f32], quantize: fn(&[f32], &mut [B])) -> Vec<u8> {
        let mut b = zeroed_blocks::<B>(x.len() / B::DTYPE.block_size());
        quantize(x, &mut b);
        blocks_as_bytes(&b).to_vec()
    }
    match dtype {
        "Q8_0" => run(x, quant::q8_0::quantize),
        "Q4_0" => run(x, quant::q4_0::quantize),
        "Q4_K" => run(x, quant::q4_k::quantize),
        "Q6_K" => run(x, quant::q6_k::quantize),
        "Q8_K" => run(x, quant::q8_k::quantize),
        "MXFP4" => run(x, quant::mxfp4::quantize),
        other => panic!("no quantizer test for {other}"),
    }
}

/// Quantizes the `quant_input` of `dtype`'s fixture with Strata and asserts the bytes
/// equal the fixture's `quant_blocks`, naming the first differing block and byte.
/// Returns the fixture's `quant_reference`.
fn assert_quantizer_matches(dtype: &str) -> String {
    let fixtures = index();
    let f = fixtures.iter().find(|f| f["dtype"] == dtype).unwrap_or_else(|| panic!("no {dtype} in index.json"));
    let (Some(input), Some(blocks), Some(reference)) =
        (f["quant_input"].as_str(), f["quant_blocks"].as_str(), f["quant_reference"].as_str())
    else {
        panic!("{dtype} has no quantizer fixture in index.json (run tools/make_quant_fixtures.py)")
    };
    let x = f32s(&read(input));
    let want = read(blocks);
    let got = strata_quantize(dtype, &x);
    let bb = dtype_of(dtype).block_bytes();
    assert_eq!(got.len(), want.len(), "{dtype}: {} values", x.len());
    assert_eq!(want.len() % bb, 0, "{blocks}");
    let bad: Vec<usize> = (0..want.len() / bb).filter(|&i| got[i * bb..][..bb] != want[i * bb..][..bb]).collect();
    if let Some(&i) = bad.first() {
        let (g, w) = (&got[i * bb..][..bb], &want[i * bb..][..bb]);
        let off = g.iter().zip(w).position(|(a, b)| a != b).unwrap();
        panic!(
            "{dtype}: {} of {} blocks differ from {reference}; first: block {i} (input values {}..{}), \
             byte {off}: strata {:#04x} vs {:#04x}\nstrata:    {g:02x?}\nreference: {w:02x?}",
            bad.len(),
            want.len() / bb,
            i * dtype_of(dtype).block_size(),
            (i + 1) * dtype_of(dtype).block_size(),
            g[off],
            w[off],
        );
    }
    reference.to_string()
}

#[test]
fn q8_0_and_q4_0_quantizers_match_gguf_py_bytes() {
    for dtype in ["Q8_0", "Q4_0"] {
        assert_eq!(assert_quantizer_matches(dtype), "gguf.quants.quantize");
    }
}

/// MXFP4 against gguf-py's `MXFP4.quantize_blocks` on blocks that are all zero, have one
/// outlier, sit on ties between grid values (first index wins), clip beyond 12 steps,
/// have the exponents 0 and 252, and a max just below a power of two (where `log2f`
/// rounds up to it).
#[test]
fn mxfp4_quantizer_matches_gguf_py_bytes() {
    assert_eq!(assert_quantizer_matches("MXFP4"), "gguf.quants.quantize");
}

// The K-quant quantizers against llama.cpp's own `quantize_row_*_ref` (ggml-quants.c),
// on one input with an all-zero, an outlier, an all-negative, a tiny (~1e-8), a
// constant, a per-sub-block-scaled and an on-grid super-block.

#[test]
fn q4_k_quantizer_matches_llama_cpp_bytes() {
    assert_eq!(assert_quantizer_matches("Q4_K"), "llama.cpp quantize_row_q4_K_ref");
}

#[test]
fn q6_k_quantizer_matches_llama_cpp_bytes() {
    assert_eq!(assert_quantizer_matches("Q6_K"), "llama.cpp quantize_row_q6_K_ref");
}

#[test]
fn q8_k_quantizer_matches_llama_cpp_bytes() {
    assert_eq!(assert_quantizer_matches("Q8_K"), "llama.cpp quantize_row_q8_K_ref");
}
