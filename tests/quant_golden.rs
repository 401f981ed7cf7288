//! Strata's scalar quant references against golden vectors from an independent
//! implementation (gguf-py's numpy `gguf.quants`, plus small numpy functions for the
//! formats it lacks). Fixtures: tests/fixtures/quant/, produced by
//! `tools/make_quant_fixtures.py` (re-run with /work/refvenv/bin/python after
//! `pip install gguf`); see its docstring for which reference made each file.

use std::path::{Path, PathBuf};

use strata::quant::{self, blocks_as_bytes, zeroed_blocks};
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

fn dtype(name: &str) -> DType {
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
        let dt = dtype(f["dtype"].as_str().unwrap());
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
    for dt in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K, AffineQ4, I8] {
        assert!(seen.contains(&dt), "no fixture for {dt:?}");
    }
}

#[test]
fn q8_0_and_q4_0_quantizers_match_gguf_py_bytes() {
    let fixtures = index();
    let mut checked = 0;
    for f in &fixtures {
        let (Some(input), Some(blocks)) = (f["quant_input"].as_str(), f["quant_blocks"].as_str()) else { continue };
        let x = f32s(&read(input));
        let want = read(blocks);
        let got: Vec<u8> = match f["dtype"].as_str().unwrap() {
            "Q8_0" => {
                let mut b = zeroed_blocks::<quant::q8_0::BlockQ8_0>(x.len() / 32);
                quant::q8_0::quantize(&x, &mut b);
                blocks_as_bytes(&b).to_vec()
            }
            "Q4_0" => {
                let mut b = zeroed_blocks::<quant::q4_0::BlockQ4_0>(x.len() / 32);
                quant::q4_0::quantize(&x, &mut b);
                blocks_as_bytes(&b).to_vec()
            }
            other => panic!("no quantizer test for {other}"),
        };
        assert_eq!(got.len(), want.len());
        let bb = dtype(f["dtype"].as_str().unwrap()).block_bytes();
        for (i, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
            assert_eq!(g, w, "{} block {i} differs from gguf.quants.quantize", f["dtype"]);
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "fixtures for both Q8_0 and Q4_0 quantizers");
}
