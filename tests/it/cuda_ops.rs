//! Every CUDA op against the CPU op on the same inputs, with llama.cpp's
//! test-backend-ops bounds: NMSE ≤ 1e-7 for elementwise ops, norms, RoPE and embedding
//! lookups, ≤ 5e-4 for matrix products and attention; identical ids for top-k.
//!
//! Needs a GPU: without one every test prints why and passes, unless
//! `STRATA_REQUIRE_GPU=1`, which turns a missing GPU into a failure (set it on a GPU
//! machine; docs/gpu.md says how these run there). `STRATA_CUDA_OPS_ON_CPU=1` runs the
//! same checks against a second CPU backend, to test this file where there is no GPU.

use strata::backend::cpu::CpuBackend;
use strata::backend::cuda::CudaBackend;
use strata::backend::cuda::launch::WEIGHT_FORMATS;
use strata::backend::{Activation, AttnParams, Backend, Fused, RopeFreqs, RopeHeads, Rows, Unary};
use strata::quant::ReadF32;
use strata::tensor::{AlignedBytes, DType, HostTensor};

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) if std::env::var("STRATA_REQUIRE_GPU").is_ok_and(|v| v == "1") => panic!("STRATA_REQUIRE_GPU=1: {e}"),
        Err(e) => {
            eprintln!("no GPU ({e}): skipping");
            None
        }
    }
}

/// Runs a check on the GPU, or (with `STRATA_CUDA_OPS_ON_CPU=1`, to test this file
/// itself where there is no GPU) on a second CPU backend.
fn on_gpu(gpu_run: impl FnOnce(&CudaBackend), cpu_run: impl FnOnce(&CpuBackend)) {
    if std::env::var("STRATA_CUDA_OPS_ON_CPU").is_ok_and(|v| v == "1") {
        return cpu_run(&CpuBackend::new(1));
    }
    if let Some(g) = gpu() {
        gpu_run(&g);
    }
}

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
        })
        .collect()
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let err: f64 = got.iter().zip(want).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    err / norm.max(1e-30)
}

fn check(what: &str, got: &[f32], want: &[f32], bound: f64) {
    let e = nmse(got, want);
    assert!(e <= bound, "{what}: NMSE {e:.3e} > {bound:.0e}");
    eprintln!("{what}: NMSE {e:.2e}");
}

/// A `[rows, cols]` weight in `dtype`: quantized from values where Strata has a
/// quantizer, else random blocks with small f16 scales.
fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> HostTensor {
    let x = values(rows * cols, seed, 1.0);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let bytes = match strata::quant::quantize_matrix(&pool, dtype, &x, rows, cols) {
        Ok(b) => b,
        Err(e) => panic!("{dtype:?}: {e}"),
    };
    HostTensor::new(std::sync::Arc::new(bytes), 0, dtype.bytes_for(rows * cols).unwrap(), dtype, vec![rows, cols])
}

/// Random blocks of a format Strata cannot quantize to, with its f16 scale fields (at
/// `scale_offsets` in each block) set to small values.
fn random_blocks(dtype: DType, rows: usize, cols: usize, scale_offsets: &[usize], seed: u64) -> HostTensor {
    let len = dtype.bytes_for(rows * cols).unwrap();
    let mut bytes = AlignedBytes::zeroed(len);
    let noise = values(len, seed, 1.0);
    let b = bytes.bytes_mut();
    for (i, v) in noise.iter().enumerate() {
        b[i] = (v.to_bits() >> 7) as u8;
    }
    let scales = values(len / dtype.block_bytes() * scale_offsets.len(), seed + 1, 1.0);
    let mut s = scales.iter();
    for block in b.chunks_exact_mut(dtype.block_bytes()) {
        for &off in scale_offsets {
            let v = half::f16::from_f32(0.01 + 0.01 * s.next().unwrap().abs());
            block[off..off + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    HostTensor::new(std::sync::Arc::new(bytes), 0, len, dtype, vec![rows, cols])
}

fn any_weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> HostTensor {
    match dtype {
        DType::Q4_1 | DType::Q5_1 | DType::Q5_K => random_blocks(dtype, rows, cols, &[0, 2], seed),
        DType::Q5_0 => random_blocks(dtype, rows, cols, &[0], seed),
        _ => weight(dtype, rows, cols, seed),
    }
}

#[test]
fn elementwise_norm_and_rope_match_the_cpu() {
    on_gpu(elementwise_norm_and_rope_match_the_cpu_on, elementwise_norm_and_rope_match_the_cpu_on);
}

fn elementwise_norm_and_rope_match_the_cpu_on<G: Backend>(g: &G) {
    let c = CpuBackend::new(2);
    let (rows, dim) = (3, 4096);
    let (x, y) = (values(rows * dim, 1, 2.0), values(rows * dim, 2, 2.0));

    let (mut cx, cy) = (c.upload(&x).unwrap(), c.upload(&y).unwrap());
    let (mut gx, gy) = (g.upload(&x).unwrap(), g.upload(&y).unwrap());
    c.add_rows(&mut cx, &cy, dim, Rows::first(rows), None).unwrap();
    g.add_rows(&mut gx, &gy, dim, Rows::first(rows), None).unwrap();
    check("add", &g.download(&gx, rows * dim).unwrap(), &c.download(&cx, rows * dim).unwrap(), 1e-7);
    c.glu(&mut cx, &cy, rows * dim, Activation::Silu).unwrap();
    g.glu(&mut gx, &gy, rows * dim, Activation::Silu).unwrap();
    check("silu_mul", &g.download(&gx, rows * dim).unwrap(), &c.download(&cx, rows * dim).unwrap(), 1e-7);
    // GeGLU on fresh values (wide enough to reach both saturated tails of the GELU).
    let gate = values(rows * dim, 6, 6.0);
    let (mut cg, mut gg) = (c.upload(&gate).unwrap(), g.upload(&gate).unwrap());
    c.glu(&mut cg, &cy, rows * dim, Activation::GeluTanh).unwrap();
    g.glu(&mut gg, &gy, rows * dim, Activation::GeluTanh).unwrap();
    check("gelu_mul", &g.download(&gg, rows * dim).unwrap(), &c.download(&cg, rows * dim).unwrap(), 1e-7);
    // The sigmoid gate (Qwen3-Next's attention output), over the same wide values.
    let (mut cs, mut gs) = (c.upload(&gate).unwrap(), g.upload(&gate).unwrap());
    c.glu(&mut cs, &cy, rows * dim, Activation::Sigmoid).unwrap();
    g.glu(&mut gs, &gy, rows * dim, Activation::Sigmoid).unwrap();
    check("sigmoid_mul", &g.download(&gs, rows * dim).unwrap(), &c.download(&cs, rows * dim).unwrap(), 1e-7);
    // gpt-oss's clamped SwiGLU (alpha 1.702, limit 7), over gates and ups past the limit
    // on both sides.
    let (gate, up) = (values(rows * dim, 7, 12.0), values(rows * dim, 8, 12.0));
    assert!(gate.iter().any(|&g| g > 7.0) && up.iter().any(|&u| u > 7.0) && up.iter().any(|&u| u < -7.0));
    let act = Activation::SwigluOai { alpha: 1.702, limit: 7.0 };
    let (mut cs, mut gs) = (c.upload(&gate).unwrap(), g.upload(&gate).unwrap());
    let (cu, gu) = (c.upload(&up).unwrap(), g.upload(&up).unwrap());
    c.glu(&mut cs, &cu, rows * dim, act).unwrap();
    g.glu(&mut gs, &gu, rows * dim, act).unwrap();
    check("swiglu_oai", &g.download(&gs, rows * dim).unwrap(), &c.download(&cs, rows * dim).unwrap(), 1e-7);
    // Scale and softcap in place, over a prefix of the buffer (the rest must not change).
    let n = rows * dim - 5;
    for op in [Unary::Scale(0.125), Unary::Scale(-3.0), Unary::Softcap(30.0), Unary::Softcap(0.5)] {
        let logits = values(rows * dim, 9, 40.0);
        let (mut cl, mut gl) = (c.upload(&logits).unwrap(), g.upload(&logits).unwrap());
        c.unary(&mut cl, n, op).unwrap();
        g.unary(&mut gl, n, op).unwrap();
        let (got, want) = (g.download(&gl, rows * dim).unwrap(), c.download(&cl, rows * dim).unwrap());
        assert_eq!(got[n..], logits[n..], "unary {op:?} wrote past `len`");
        check(&format!("unary {op:?}"), &got, &want, 1e-7);
    }

    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let w = HostTensor::from_f32(&values(dim, 3, 1.0), vec![dim]);
        let w = match dtype {
            DType::F32 => w,
            _ => {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
                let b = strata::quant::quantize_matrix(&pool, dtype, &w.to_f32_vec(), 1, dim).unwrap();
                HostTensor::new(std::sync::Arc::new(b), 0, dim * 2, dtype, vec![dim])
            }
        };
        let (cw, gw) = (c.weight(&w).unwrap(), g.weight(&w).unwrap());
        let (mut co, mut go) = (c.alloc(rows * dim).unwrap(), g.alloc(rows * dim).unwrap());
        c.rms_norm(&cx, rows, &cw, 1e-5, &mut co).unwrap();
        g.rms_norm(&gx, rows, &gw, 1e-5, &mut go).unwrap();
        let what = format!("rms_norm ({dtype:?} weight)");
        check(&what, &g.download(&go, rows * dim).unwrap(), &c.download(&co, rows * dim).unwrap(), 1e-7);
        c.add_bias(&mut co, rows, &cw).unwrap();
        g.add_bias(&mut go, rows, &gw).unwrap();
        let what = format!("add_bias ({dtype:?})");
        check(&what, &g.download(&go, rows * dim).unwrap(), &c.download(&co, rows * dim).unwrap(), 1e-7);
    }

    for (interleaved, head_dim, factor) in [(false, 128, 1.0), (true, 128, 1.0), (false, 64, 0.7), (true, 96, 1.3)] {
        let n_heads = 4;
        let theta = 10_000f32;
        let inv_freq = (0..head_dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32)).collect();
        let freqs = RopeFreqs { inv_freq, attention_factor: factor, interleaved };
        let positions = [0u32, 17, 4095];
        let v = values(positions.len() * n_heads * head_dim, 4, 1.0);
        let (mut cv, mut gv) = (c.upload(&v).unwrap(), g.upload(&v).unwrap());
        c.rope(&mut cv, n_heads, head_dim, &positions, &freqs).unwrap();
        g.rope(&mut gv, n_heads, head_dim, &positions, &freqs).unwrap();
        let what = format!("rope (interleaved {interleaved}, head_dim {head_dim}, factor {factor})");
        check(&what, &g.download(&gv, v.len()).unwrap(), &c.download(&cv, v.len()).unwrap(), 1e-7);
    }
    // Partial RoPE: only the first `2 * pairs` dimensions of each head rotate.
    for (interleaved, head_dim, pairs) in [(false, 128, 16), (true, 128, 16), (false, 80, 16), (true, 64, 8)] {
        let n_heads = 3;
        let inv_freq = (0..pairs).map(|i| 1.0 / 10_000f32.powf(i as f32 / pairs as f32)).collect();
        let freqs = RopeFreqs { inv_freq, attention_factor: 1.0, interleaved };
        let positions = [0u32, 9, 2047];
        let v = values(positions.len() * n_heads * head_dim, 10, 1.0);
        let (mut cv, mut gv) = (c.upload(&v).unwrap(), g.upload(&v).unwrap());
        c.rope(&mut cv, n_heads, head_dim, &positions, &freqs).unwrap();
        g.rope(&mut gv, n_heads, head_dim, &positions, &freqs).unwrap();
        let want = c.download(&cv, v.len()).unwrap();
        // The pass-through dimensions are untouched on the CPU too: the check is not vacuous.
        assert_eq!(want[head_dim - 1], v[head_dim - 1]);
        let what = format!("partial rope (interleaved {interleaved}, head_dim {head_dim}, {pairs} pairs)");
        check(&what, &g.download(&gv, v.len()).unwrap(), &want, 1e-7);
    }

    let (mut cd, mut gd) = (c.alloc(5 * 64).unwrap(), g.alloc(5 * 64).unwrap());
    let src = values(4 * 64, 5, 1.0);
    let (cs, gs) = (c.upload(&src).unwrap(), g.upload(&src).unwrap());
    c.copy_rows(&cs, Rows::Range { start: 1, n: 3 }, 64, &mut cd, 2).unwrap();
    g.copy_rows(&gs, Rows::Range { start: 1, n: 3 }, 64, &mut gd, 2).unwrap();
    assert_eq!(g.download(&gd, 5 * 64).unwrap(), c.download(&cd, 5 * 64).unwrap(), "copy_rows");
}

#[test]
fn row_gathers_and_scatter_adds_match_the_cpu() {
    on_gpu(row_gathers_and_scatter_adds_match_the_cpu_on, row_gathers_and_scatter_adds_match_the_cpu_on);
}

/// `copy_rows` and `add_rows` over ranges and MoE-style row lists: `row_len` 300 and 1
/// (not multiples of the 256-thread block) and 4097, a gather that repeats a source
/// row, a scatter in a scrambled order with and without routing weights.
fn row_gathers_and_scatter_adds_match_the_cpu_on<G: Backend>(g: &G) {
    let c = CpuBackend::new(2);
    for row_len in [300, 1, 4097] {
        let (src_rows, dst_rows) = (9, 12);
        let src = values(src_rows * row_len, 31, 1.0);
        let dst = values(dst_rows * row_len, 32, 1.0);
        let (cs, gs) = (c.upload(&src).unwrap(), g.upload(&src).unwrap());
        let gather = [8u32, 3, 3, 0, 5, 3];
        for (rows, dst_row) in [
            (Rows::Range { start: 2, n: 5 }, 4),
            (Rows::List(&gather), 0),
            (Rows::List(&gather), 6),
            (Rows::List(&[4]), 11),
        ] {
            let (mut cd, mut gd) = (c.upload(&dst).unwrap(), g.upload(&dst).unwrap());
            c.copy_rows(&cs, rows, row_len, &mut cd, dst_row).unwrap();
            g.copy_rows(&gs, rows, row_len, &mut gd, dst_row).unwrap();
            let (got, want) = (g.download(&gd, dst.len()).unwrap(), c.download(&cd, dst.len()).unwrap());
            // A copy is exact; rows outside the destination range keep their values.
            assert_eq!(got, want, "copy_rows {rows:?} to row {dst_row}, row_len {row_len}");
        }

        let (x_rows, n) = (12, 5);
        let x = values(x_rows * row_len, 33, 1.0);
        let y = values(n * row_len, 34, 1.0);
        let (cy, gy) = (c.upload(&y).unwrap(), g.upload(&y).unwrap());
        let scatter = [7u32, 0, 11, 2, 5];
        let weights = [0.25f32, -1.5, 0.7, 1.0, 3.0];
        let cases: [(Rows<'_>, Option<&[f32]>); 4] = [
            (Rows::Range { start: 6, n }, None),
            (Rows::Range { start: 3, n }, Some(&weights)),
            (Rows::List(&scatter), None),
            (Rows::List(&scatter), Some(&weights)),
        ];
        for (rows, w) in cases {
            let (mut cx, mut gx) = (c.upload(&x).unwrap(), g.upload(&x).unwrap());
            c.add_rows(&mut cx, &cy, row_len, rows, w).unwrap();
            g.add_rows(&mut gx, &gy, row_len, rows, w).unwrap();
            let (got, want) = (g.download(&gx, x.len()).unwrap(), c.download(&cx, x.len()).unwrap());
            let what = format!("add_rows {rows:?} weights {} row_len {row_len}", w.is_some());
            for r in (0..x_rows).filter(|&r| !(0..n).any(|i| rows.get(i) == r)) {
                assert_eq!(got[r * row_len..][..row_len], x[r * row_len..][..row_len], "{what}: row {r} changed");
            }
            check(&what, &got, &want, 1e-7);
        }
    }
}

/// Row ids past the buffer, a repeated scatter row and a short weight list are errors on
/// the GPU, before anything is launched (the CPU backend would panic instead).
#[test]
fn row_ops_reject_bad_rows_on_the_gpu() {
    on_gpu(
        |g| {
            let row_len = 8;
            let src = g.upload(&values(4 * row_len, 41, 1.0)).unwrap();
            let mut dst = g.upload(&values(4 * row_len, 42, 1.0)).unwrap();
            let y = g.upload(&values(2 * row_len, 43, 1.0)).unwrap();
            let bad = |r: Result<(), strata::backend::BackendError>, what: &str| {
                let e = r.expect_err(what).to_string();
                assert!(e.contains(what.split(' ').next().unwrap()), "{what}: {e}");
            };
            bad(g.copy_rows(&src, Rows::List(&[1, 4]), row_len, &mut dst, 0), "copy_rows row past src");
            bad(g.copy_rows(&src, Rows::Range { start: 2, n: 3 }, row_len, &mut dst, 0), "copy_rows range past src");
            bad(g.copy_rows(&src, Rows::List(&[0, 1]), row_len, &mut dst, 3), "copy_rows past dst");
            bad(g.add_rows(&mut dst, &y, row_len, Rows::List(&[0, 4]), None), "add_rows row past x");
            bad(g.add_rows(&mut dst, &y, row_len, Rows::List(&[2, 2]), None), "add_rows repeated row");
            bad(g.add_rows(&mut dst, &y, row_len, Rows::List(&[0, 1]), Some(&[1.0])), "add_rows short weights");
            bad(g.add_rows(&mut dst, &y, row_len, Rows::List(&[0, 1, 2]), None), "add_rows y too short");
            // The buffers are untouched and still usable.
            g.copy_rows(&src, Rows::List(&[3, 0]), row_len, &mut dst, 2).unwrap();
            let got = g.download(&dst, 4 * row_len).unwrap();
            assert_eq!(got[2 * row_len..3 * row_len], values(4 * row_len, 41, 1.0)[3 * row_len..]);
        },
        |_| {},
    );
}

#[test]
fn embedding_and_matmul_match_the_cpu_for_every_weight_format() {
    on_gpu(
        |g| embedding_and_matmul_match_the_cpu_for_every_weight_format_on(g, true),
        // The CPU stand-in quantises activations like the reference does: no exact check.
        |c| embedding_and_matmul_match_the_cpu_for_every_weight_format_on(c, false),
    );
}

fn embedding_and_matmul_match_the_cpu_for_every_weight_format_on<G: Backend>(g: &G, exact: bool) {
    let c = CpuBackend::new(2);
    let (out, inn) = (300, 512);
    let mut too_far = Vec::new();
    for dtype in WEIGHT_FORMATS {
        let w = any_weight(dtype, out, inn, 7);
        let (cw, gw) = (c.weight(&w).unwrap(), g.weight(&w).unwrap());
        let ids = [0u32, 299, 5, 5, 123];
        let (mut ce, mut ge) = (c.alloc(ids.len() * inn).unwrap(), g.alloc(ids.len() * inn).unwrap());
        c.embedding(&cw, &ids, &mut ce).unwrap();
        g.embedding(&gw, &ids, &mut ge).unwrap();
        let n = ids.len() * inn;
        check(&format!("embedding {dtype:?}"), &g.download(&ge, n).unwrap(), &c.download(&ce, n).unwrap(), 1e-7);
        // The exact product: the weight dequantised to f32 (the CPU's own kernels for
        // GGUF block formats quantise the activations to 8 bits, as llama.cpp does, so
        // they are a loose reference for a GPU that does not).
        let exact_w = c.weight(&HostTensor::from_f32(&w.to_f32_vec(), vec![out, inn])).unwrap();
        // Matrix-vector kernels (≤ 8 rows, more in several launches) and the GEMM path.
        for rows in [1, 3, 8, 11, 40] {
            let x = values(rows * inn, 8 + rows as u64, 1.0);
            let (cx, gx) = (c.upload(&x).unwrap(), g.upload(&x).unwrap());
            let (mut cy, mut gy) = (c.alloc(rows * out).unwrap(), g.alloc(rows * out).unwrap());
            c.matmul(&cx, rows, &cw, &mut cy).unwrap();
            g.matmul(&gx, rows, &gw, &mut gy).unwrap();
            let n = rows * out;
            let what = format!("matmul {dtype:?} rows {rows}");
            let got = g.download(&gy, n).unwrap();
            check(&what, &got, &c.download(&cy, n).unwrap(), 5e-4);
            // Against the exact product: f32 arithmetic in the matrix-vector kernels; the
            // GEMM rounds activations and dequantised weights to f16 (each 2^-11 at
            // most, an NMSE near 1e-7 together).
            let mut ey = c.alloc(rows * out).unwrap();
            c.matmul(&cx, rows, &exact_w, &mut ey).unwrap();
            let bound = if rows <= 8 { 1e-10 } else { 1e-6 };
            if exact {
                let e = nmse(&got, &c.download(&ey, n).unwrap());
                eprintln!("{what} against the exact product: NMSE {e:.2e}");
                if e > bound {
                    too_far.push(format!("{what}: NMSE {e:.3e} > {bound:.0e}"));
                }
            }
        }
    }
    assert!(too_far.is_empty(), "against the exact product:\n{}", too_far.join("\n"));
}

/// MXFP4 blocks with the edge exponents (2^-128 and 2^-127 denormal scales, 2^-126, and
/// 254, whose values of 4 and more are past f32's range: inf as on the CPU) and every
/// nibble in both halves of a byte: the embedding rows bit for bit the CPU's, and
/// products (matrix-vector and GEMM, where 254 is replaced by 140, the sums staying
/// finite) against the exact product.
#[test]
fn mxfp4_edge_blocks_match_the_cpu() {
    on_gpu(|g| mxfp4_edge_blocks_match_the_cpu_on(g, true), |c| mxfp4_edge_blocks_match_the_cpu_on(c, false));
}

fn mxfp4_edge_blocks_match_the_cpu_on<G: Backend>(g: &G, exact: bool) {
    let c = CpuBackend::new(2);
    let (out, inn) = (20, 256);
    for exps in [[0u8, 1, 2, 254], [0, 1, 2, 140]] {
        let w = weight(DType::Mxfp4, out, inn, 61);
        let mut bytes = AlignedBytes::zeroed(w.bytes().len());
        bytes.bytes_mut().copy_from_slice(w.bytes());
        // The first blocks of rows 0 and 7, block i with exponent exps[i] and quants
        // j | ((j + 5 + i) % 16) << 4 (every nibble low and high).
        for row in [0, 7] {
            for (i, &e) in exps.iter().enumerate() {
                let b = &mut bytes.bytes_mut()[(row * inn / 32 + i) * 17..][..17];
                b[0] = e;
                for j in 0..16 {
                    b[1 + j] = (j | ((j + 5 + i) % 16) << 4) as u8;
                }
            }
        }
        let w = HostTensor::new(std::sync::Arc::new(bytes), 0, w.bytes().len(), DType::Mxfp4, vec![out, inn]);
        let (cw, gw) = (c.weight(&w).unwrap(), g.weight(&w).unwrap());
        let ids = [7u32, 0, 19];
        let (mut ce, mut ge) = (c.alloc(ids.len() * inn).unwrap(), g.alloc(ids.len() * inn).unwrap());
        c.embedding(&cw, &ids, &mut ce).unwrap();
        g.embedding(&gw, &ids, &mut ge).unwrap();
        let (got, want) = (g.download(&ge, ids.len() * inn).unwrap(), c.download(&ce, ids.len() * inn).unwrap());
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "MXFP4 embedding rows with exponents {exps:?}");
        if exps[3] == 254 {
            assert!(want.iter().any(|v| v.is_infinite()) && want.iter().any(|&v| v != 0.0 && v.abs() < 1e-37));
            continue;
        }
        let exact_w = c.weight(&HostTensor::from_f32(&w.to_f32_vec(), vec![out, inn])).unwrap();
        for rows in [1, 11] {
            let x = values(rows * inn, 62 + rows as u64, 1.0);
            let (cx, gx) = (c.upload(&x).unwrap(), g.upload(&x).unwrap());
            let (mut ey, mut gy) = (c.alloc(rows * out).unwrap(), g.alloc(rows * out).unwrap());
            c.matmul(&cx, rows, &exact_w, &mut ey).unwrap();
            g.matmul(&gx, rows, &gw, &mut gy).unwrap();
            let what = format!("MXFP4 matmul with exponents {exps:?}, rows {rows}, against the exact product");
            // The CPU stand-in's own product quantises the activations to Q8_0: a loose bound.
            let bound = if !exact {
                2e-3
            } else if rows <= 8 {
                1e-10
            } else {
                1e-6
            };
            check(&what, &g.download(&gy, rows * out).unwrap(), &c.download(&ey, rows * out).unwrap(), bound);
        }
    }
}

#[test]
fn a_batch_gives_each_sequence_the_rows_it_gets_alone() {
    on_gpu(
        a_batch_gives_each_sequence_the_rows_it_gets_alone_on,
        a_batch_gives_each_sequence_the_rows_it_gets_alone_on,
    );
}

/// `matmul_seqs` over decode rows and prompt chunks of several lengths (the matrix-vector
/// kernel and the GEMM): each sequence's rows bit for bit what it gets in a call alone.
fn a_batch_gives_each_sequence_the_rows_it_gets_alone_on<G: Backend>(g: &G) {
    let (out, inn) = (300, 512);
    let seqs = [1, 1, 1, 16, 13, 1, 7, 40, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
    let rows: usize = seqs.iter().sum();
    let x = values(rows * inn, 99, 1.0);
    let gx = g.upload(&x).unwrap();
    for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_K] {
        let gw = g.weight(&any_weight(dtype, out, inn, 5)).unwrap();
        let mut gy = g.alloc(rows * out).unwrap();
        g.matmul_seqs(&gx, &seqs, &gw, &mut gy).unwrap();
        let batched = g.download(&gy, rows * out).unwrap();
        let mut at = 0;
        for (i, &n) in seqs.iter().enumerate() {
            let sx = g.upload(&x[at * inn..(at + n) * inn]).unwrap();
            let mut sy = g.alloc(n * out).unwrap();
            g.matmul_seqs(&sx, &[n], &gw, &mut sy).unwrap();
            let alone = g.download(&sy, n * out).unwrap();
            let same = alone.iter().zip(&batched[at * out..(at + n) * out]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype:?}: sequence {i} ({n} rows) differs from its rows alone");
            at += n;
        }
        eprintln!("matmul_seqs {dtype:?}: {} sequences as alone", seqs.len());
    }
}

#[test]
fn a_fused_gate_up_and_activation_gives_the_unfused_bits() {
    // STRATA_CUDA_MATVEC=packed: the packed weights' decode rows must take the fused op.
    let packed = std::env::var("STRATA_CUDA_MATVEC").is_ok_and(|v| v.trim() == "packed");
    on_gpu(
        |g| a_fused_gate_up_and_activation_gives_the_unfused_bits_on(g, packed),
        |c| a_fused_gate_up_and_activation_gives_the_unfused_bits_on(c, false),
    );
}

/// `Fused::Glu` against `matmul_seqs_each` of gate and up then `glu`, bit for bit, for
/// every activation, decode batches, a verifying sequence's rows and a prompt chunk
/// (which a GPU with a GEMM does not fuse); `expect_fused`: the decode batches of the
/// packed formats, and of F16 (its rows 16-byte aligned, read in place), must be fused.
fn a_fused_gate_up_and_activation_gives_the_unfused_bits_on<G: Backend>(g: &G, expect_fused: bool) {
    let (width, inn) = (300, 512);
    let acts = [
        Activation::Silu,
        Activation::GeluTanh,
        Activation::Sigmoid,
        Activation::SwigluOai { alpha: 1.702, limit: 0.5 },
    ];
    let batches: [&[usize]; 4] = [&[1], &[1, 1, 1], &[1, 8, 1, 1], &[1, 16]];
    let mut fused = 0;
    for dtype in [DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16] {
        let (gate, up) = (any_weight(dtype, width, inn, 21), any_weight(dtype, width, inn, 22));
        let (gw, uw) = (g.weight(&gate).unwrap(), g.weight(&up).unwrap());
        for (i, seqs) in batches.iter().enumerate() {
            let rows: usize = seqs.iter().sum();
            let gx = g.upload(&values(rows * inn, 30 + i as u64, 0.2)).unwrap();
            for act in acts {
                let mut out = g.alloc(rows * width).unwrap();
                let mut op = Fused::Glu { x: &gx, seq_rows: seqs, gate: &gw, up: &uw, act, out: &mut out };
                let Some(done) = g.fused(&mut op) else {
                    let decode = seqs.iter().all(|&n| n <= 8);
                    assert!(!(expect_fused && decode), "{dtype:?} {seqs:?} {act:?}: not fused");
                    continue;
                };
                done.unwrap();
                let (mut gb, mut ub) = (g.alloc(rows * width).unwrap(), g.alloc(rows * width).unwrap());
                g.matmul_seqs_each(&gx, seqs, &mut [(&gw, &mut gb), (&uw, &mut ub)]).unwrap();
                g.glu(&mut gb, &ub, rows * width, act).unwrap();
                let (got, want) = (g.download(&out, rows * width).unwrap(), g.download(&gb, rows * width).unwrap());
                let diff = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(diff, 0, "{dtype:?} {seqs:?} {act:?}: {diff} values differ from the unfused ops");
                fused += 1;
            }
        }
    }
    eprintln!("Fused::Glu: {fused} fused runs, each bit for bit the unfused ops");
}

#[test]
fn a_fused_product_into_the_residual_gives_the_unfused_bits() {
    // STRATA_CUDA_MATVEC=packed: the packed weights' decode rows must take the fused op.
    let packed = std::env::var("STRATA_CUDA_MATVEC").is_ok_and(|v| v.trim() == "packed");
    on_gpu(
        |g| a_fused_product_into_the_residual_gives_the_unfused_bits_on(g, packed),
        |c| a_fused_product_into_the_residual_gives_the_unfused_bits_on(c, false),
    );
}

/// `Fused::MatmulAdd` against `matmul_seqs` into a buffer then `add_rows` of it, bit for
/// bit, for decode batches, a verifying sequence's rows and a prompt chunk (which a GPU
/// with a GEMM does not fuse); `expect_fused`: the decode batches of the packed formats,
/// and of F16 (read in place), must be fused.
fn a_fused_product_into_the_residual_gives_the_unfused_bits_on<G: Backend>(g: &G, expect_fused: bool) {
    let (out, inn) = (300, 512);
    let batches: [&[usize]; 4] = [&[1], &[1, 1, 1], &[1, 8, 1, 1], &[1, 16]];
    let mut fused = 0;
    for dtype in [DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16] {
        let w = g.weight(&any_weight(dtype, out, inn, 23)).unwrap();
        for (i, seqs) in batches.iter().enumerate() {
            let rows: usize = seqs.iter().sum();
            let gx = g.upload(&values(rows * inn, 40 + i as u64, 0.2)).unwrap();
            let residual = values(rows * out, 50 + i as u64, 2.0);
            let mut got = g.upload(&residual).unwrap();
            let mut op = Fused::MatmulAdd { x: &gx, seq_rows: seqs, w: &w, out: &mut got };
            let Some(done) = g.fused(&mut op) else {
                let decode = seqs.iter().all(|&n| n <= 8);
                assert!(!(expect_fused && decode), "{dtype:?} {seqs:?}: not fused");
                continue;
            };
            done.unwrap();
            let (mut want, mut y) = (g.upload(&residual).unwrap(), g.alloc(rows * out).unwrap());
            g.matmul_seqs(&gx, seqs, &w, &mut y).unwrap();
            g.add_rows(&mut want, &y, out, Rows::Range { start: 0, n: rows }, None).unwrap();
            let (got, want) = (g.download(&got, rows * out).unwrap(), g.download(&want, rows * out).unwrap());
            let diff = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(diff, 0, "{dtype:?} {seqs:?}: {diff} values differ from the unfused ops");
            fused += 1;
        }
    }
    eprintln!("Fused::MatmulAdd: {fused} fused runs, each bit for bit the unfused ops");
}

#[test]
fn element_weights_with_unaligned_rows_take_the_stored_kernels() {
    on_gpu(
        element_weights_with_unaligned_rows_take_the_stored_kernels_on,
        element_weights_with_unaligned_rows_take_the_stored_kernels_on,
    );
}

/// F32, F16 and BF16 weights whose rows do not start 16-byte aligned (`in` = 516, not a
/// whole number of 8-value units) are not fused (the packed matvecs do not read them)
/// and their products still match the CPU's.
fn element_weights_with_unaligned_rows_take_the_stored_kernels_on<G: Backend>(g: &G) {
    let c = CpuBackend::new(2);
    let (out, inn, rows) = (40, 516, 3);
    let x = values(rows * inn, 80, 1.0);
    let (cx, gx) = (c.upload(&x).unwrap(), g.upload(&x).unwrap());
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let w = any_weight(dtype, out, inn, 81);
        let (cw, gw) = (c.weight(&w).unwrap(), g.weight(&w).unwrap());
        let mut gy = g.alloc(rows * out).unwrap();
        let mut op = Fused::MatmulAdd { x: &gx, seq_rows: &[1, 1, 1], w: &gw, out: &mut gy };
        assert!(g.fused(&mut op).is_none(), "{dtype:?}: a row of {inn} values was fused");
        let mut cy = c.alloc(rows * out).unwrap();
        c.matmul_seqs(&cx, &[1, 1, 1], &cw, &mut cy).unwrap();
        g.matmul_seqs(&gx, &[1, 1, 1], &gw, &mut gy).unwrap();
        let n = rows * out;
        check(&format!("unaligned {dtype:?}"), &g.download(&gy, n).unwrap(), &c.download(&cy, n).unwrap(), 5e-4);
    }
}

#[test]
fn products_of_one_input_give_each_weight_s_own_bits() {
    // STRATA_CUDA_MATVEC=packed: weights of one packed format and `in` share launches.
    let packed = std::env::var("STRATA_CUDA_MATVEC").is_ok_and(|v| v.trim() == "packed");
    on_gpu(
        |g| products_of_one_input_give_each_weight_s_own_bits_on(g, packed),
        |c| products_of_one_input_give_each_weight_s_own_bits_on(c, false),
    );
}

/// `matmul_seqs_each` of a layer's q, k and v (one format, Q4_K_M's mix with v in Q6_K,
/// F16 and BF16 read in place, and a BF16 q and k with an F32 v) against `matmul_seqs` of each weight alone, bit for bit, for decode batches, a
/// verifying sequence's rows and a prompt chunk; `shared`: the decode batches of packed
/// weights of one format take one launch per 8 rows (launch counts).
fn products_of_one_input_give_each_weight_s_own_bits_on<G: Backend>(g: &G, shared: bool) {
    let (inn, outs) = (512, [300, 72, 72]);
    let batches: [&[usize]; 4] = [&[1], &[1, 1, 1], &[1, 8, 1, 1], &[1, 16]];
    let launches = || g.launch_stats().map_or(0, |s| s.launches);
    for kinds in [
        [DType::Q4_0; 3],
        [DType::Q8_0; 3],
        [DType::Q4_K; 3],
        [DType::Q5_K; 3],
        [DType::Q6_K; 3],
        [DType::Q4_K, DType::Q4_K, DType::Q6_K],
        [DType::F16; 3],
        [DType::BF16, DType::BF16, DType::F32],
    ] {
        let ws: Vec<_> = kinds
            .iter()
            .zip(outs)
            .enumerate()
            .map(|(i, (&d, o))| g.weight(&any_weight(d, o, inn, 60 + i as u64)).unwrap())
            .collect();
        for (b, seqs) in batches.iter().enumerate() {
            let rows: usize = seqs.iter().sum();
            let gx = g.upload(&values(rows * inn, 70 + b as u64, 1.0)).unwrap();
            let mut ys: Vec<_> = outs.iter().map(|&o| g.alloc(rows * o).unwrap()).collect();
            let before = launches();
            let mut each: Vec<_> = ws.iter().zip(ys.iter_mut()).collect();
            g.matmul_seqs_each(&gx, seqs, &mut each).unwrap();
            let took = launches() - before;
            let mut alone_launches = Vec::new();
            for (i, (w, y)) in ws.iter().zip(&ys).enumerate() {
                let mut alone = g.alloc(rows * outs[i]).unwrap();
                let before = launches();
                g.matmul_seqs(&gx, seqs, w, &mut alone).unwrap();
                alone_launches.push(launches() - before);
                let (got, want) = (g.download(y, rows * outs[i]).unwrap(), g.download(&alone, rows * outs[i]).unwrap());
                let diff = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(diff, 0, "{kinds:?} {seqs:?}: weight {i}: {diff} values differ from matmul_seqs alone");
            }
            if shared && seqs.iter().all(|&n| n <= 8) {
                // One launch per 8 rows for the weights of the first's format, v alone if not.
                let v_alone = if kinds[2] == kinds[0] { 0 } else { alone_launches[2] };
                assert_eq!(took, rows.div_ceil(8) as u64 + v_alone, "{kinds:?} {seqs:?}: {took} launches");
            }
        }
        eprintln!("matmul_seqs_each {kinds:?}: every weight bit for bit alone");
    }
}

#[test]
fn the_delta_rule_matches_the_cpu_in_one_pass_and_in_chunks() {
    on_gpu(
        the_delta_rule_matches_the_cpu_in_one_pass_and_in_chunks_on,
        the_delta_rule_matches_the_cpu_in_one_pass_and_in_chunks_on,
    );
}

/// The gated delta rule (Qwen3-Next's and Qwen3.5's linear attention) on the device
/// against the CPU's, for every layout: the outputs and the carried state over a prompt
/// fed in one pass, in chunks and token by token, from rows in the middle of a batch.
fn the_delta_rule_matches_the_cpu_in_one_pass_and_in_chunks_on<G: Backend>(g: &G) {
    use strata::backend::delta::{DeltaRule, DeltaShape, DeltaWeights};
    let cpu = CpuBackend::new(2);
    for (i, &(nk, nv, dk, dv, grouped, tiled)) in
        [(2, 4, 16, 24, true, false), (2, 4, 128, 128, false, false), (4, 8, 32, 40, false, true)].iter().enumerate()
    {
        let shape = DeltaShape {
            n_k_heads: nk,
            n_v_heads: nv,
            k_head_dim: dk,
            v_head_dim: dv,
            conv_kernel: 4,
            qkvz_grouped: grouped,
            ba_grouped: grouped,
            v_tiled: tiled,
            eps: 1e-6,
        };
        let seed = 10 * i as u64;
        let conv = values(shape.conv_dim() * 4, seed + 1, 0.5);
        let neg_a: Vec<f32> = values(nv, seed + 2, 1.0).iter().map(|a| -a.exp()).collect();
        let (dt_bias, norm) = (values(nv, seed + 3, 1.0), values(dv, seed + 4, 1.0));
        let (skip, n) = (3, 13);
        let rows = skip + n;
        let qkvz = values(rows * shape.qkvz_len(), seed + 5, 2.0);
        let ba = values(rows * 2 * nv, seed + 6, 2.0);
        macro_rules! go {
            ($be:expr, $cuts:expr) => {{
                let be = $be;
                let w = DeltaWeights {
                    conv: be.upload(&conv).unwrap(),
                    neg_a: be.upload(&neg_a).unwrap(),
                    dt_bias: be.upload(&dt_bias).unwrap(),
                    norm: be.upload(&norm).unwrap(),
                };
                let (bq, bb) = (be.upload(&qkvz).unwrap(), be.upload(&ba).unwrap());
                let mut state = be.alloc(shape.state_len()).unwrap();
                let mut out = be.alloc(rows * shape.value_dim()).unwrap();
                let mut row0 = skip;
                for &m in $cuts {
                    let d = DeltaRule { shape, weights: &w, qkvz: &bq, ba: &bb, row0, n: m };
                    be.delta_rule(&d, &mut state, &mut out).unwrap();
                    row0 += m;
                }
                let out = be.download(&out, rows * shape.value_dim()).unwrap();
                (out[skip * shape.value_dim()..].to_vec(), be.download(&state, shape.state_len()).unwrap())
            }};
        }
        let want = go!(&cpu, &[n]);
        assert!(want.0.iter().all(|x| x.is_finite()) && want.0.iter().any(|&x| x != 0.0));
        for cuts in [&[n][..], &[5, 8], &[1; 13]] {
            let got = go!(g, cuts);
            check(&format!("delta rule {shape:?} out, cuts {cuts:?}"), &got.0, &want.0, 1e-9);
            check(&format!("delta rule {shape:?} state, cuts {cuts:?}"), &got.1, &want.1, 1e-9);
        }
        eprintln!("delta rule nk={nk} nv={nv} dk={dk} dv={dv} grouped={grouped} tiled={tiled}: as the CPU");
    }
}

/// Attention over `(n_heads, n_kv_heads, head_dim, start_pos)`, scaled by `head_dim^-0.5`.
fn attn_params(
    (n_heads, n_kv_heads, head_dim, start_pos): (usize, usize, usize, usize),
    sliding_window: Option<usize>,
    softcap: Option<f32>,
    kv: strata::backend::KvType,
) -> AttnParams<'static> {
    let scale = (head_dim as f32).powf(-0.5);
    AttnParams { n_heads, n_kv_heads, head_dim, start_pos, scale, sliding_window, softcap, kv, sinks: None }
}

#[test]
fn attention_matches_the_cpu_for_prefill_and_split_decode() {
    on_gpu(
        attention_matches_the_cpu_for_prefill_and_split_decode_on,
        attention_matches_the_cpu_for_prefill_and_split_decode_on,
    );
}

fn attention_matches_the_cpu_for_prefill_and_split_decode_on<G: Backend>(g: &G) {
    let c = CpuBackend::new(2);
    // (n_heads, n_kv_heads, head_dim, start_pos, rows, window, softcap)
    let cases = [
        (4, 4, 64, 0, 7, None, None),
        (8, 2, 128, 0, 33, None, None),
        (8, 2, 128, 600, 1, None, None),
        (8, 2, 128, 5000, 1, None, None),
        (8, 2, 64, 40, 5, Some(16), None),
        (32, 8, 128, 3000, 2, Some(1024), None),
        (4, 1, 256, 300, 3, None, None),
        // Softcapped scores (Gemma 2 caps at 50; 0.5 reshapes every score here), in
        // prefill, split decode and with a sliding window.
        (8, 4, 256, 0, 9, None, Some(50.0)),
        (8, 2, 128, 0, 6, None, Some(0.5)),
        (8, 2, 128, 5000, 1, None, Some(0.5)),
        (8, 4, 64, 40, 5, Some(16), Some(1.5)),
    ];
    for (n_heads, n_kv, hd, start, rows, window, softcap) in cases {
        let cap = start + rows + 3;
        let (qw, kvw) = (n_heads * hd, n_kv * hd);
        let q = values((rows + 2) * qw, 11, 1.0);
        let (k, v) = (values(cap * kvw, 12, 1.0), values(cap * kvw, 13, 1.0));
        let p = attn_params((n_heads, n_kv, hd, start), window, softcap, strata::backend::KvType::F32);
        let (cq, ck, cv) = (c.upload(&q).unwrap(), c.upload(&k).unwrap(), c.upload(&v).unwrap());
        let (gq, gk, gv) = (g.upload(&q).unwrap(), g.upload(&k).unwrap(), g.upload(&v).unwrap());
        let (mut co, mut go) = (c.alloc((rows + 2) * qw).unwrap(), g.alloc((rows + 2) * qw).unwrap());
        // Rows 1..=rows of q: the kernels must honour the row offset.
        c.attention(&cq, 1, rows, &ck, &cv, &p, &mut co).unwrap();
        g.attention(&gq, 1, rows, &gk, &gv, &p, &mut go).unwrap();
        let (got, want) = (g.download(&go, (rows + 2) * qw).unwrap(), c.download(&co, (rows + 2) * qw).unwrap());
        let what = format!(
            "attention heads {n_heads}/{n_kv} hd {hd} start {start} rows {rows} window {window:?} softcap {softcap:?}"
        );
        check(&what, &got[qw..(rows + 1) * qw], &want[qw..(rows + 1) * qw], 5e-4);
    }
}

#[test]
fn attention_sinks_match_the_cpu() {
    on_gpu(
        |g| {
            attention_sinks_match_the_cpu_on(g);
            // The row-invariant backend's fixed splits (every 512 keys) as well.
            attention_sinks_match_the_cpu_on(&CudaBackend::new(0).unwrap().row_invariant());
        },
        attention_sinks_match_the_cpu_on,
    );
}

/// Attention with sinks (gpt-oss: one logit per query head in each softmax's
/// denominator), in prefill, in decode over a long context (split partials on the
/// GPU), with and without a sliding window, through the row-invariant backend's fixed
/// splits too; the sinks change the result (checked against attention without them).
fn attention_sinks_match_the_cpu_on<G: Backend>(g: &G) {
    let c = CpuBackend::new(2);
    // (n_heads, n_kv_heads, head_dim, start_pos, rows, window)
    let cases = [
        (8, 2, 64, 0, 9, None),
        (8, 2, 64, 40, 5, Some(16)),
        (8, 2, 64, 5000, 1, None),
        (8, 2, 64, 5000, 1, Some(128)),
        (64, 8, 64, 700, 3, Some(128)),
    ];
    for (n_heads, n_kv, hd, start, rows, window) in cases {
        let cap = start + rows;
        let (qw, kvw) = (n_heads * hd, n_kv * hd);
        let q = values(rows * qw, 51, 1.0);
        let (k, v) = (values(cap * kvw, 52, 1.0), values(cap * kvw, 53, 1.0));
        let mut sinks = values(n_heads, 54, 3.0);
        sinks[0] = 8.0; // most of head 0's weight
        let plain = attn_params((n_heads, n_kv, hd, start), window, None, strata::backend::KvType::F32);
        let p = AttnParams { sinks: Some(&sinks), ..plain };
        let (cq, ck, cv) = (c.upload(&q).unwrap(), c.upload(&k).unwrap(), c.upload(&v).unwrap());
        let (gq, gk, gv) = (g.upload(&q).unwrap(), g.upload(&k).unwrap(), g.upload(&v).unwrap());
        let (mut co, mut go) = (c.alloc(rows * qw).unwrap(), g.alloc(rows * qw).unwrap());
        c.attention(&cq, 0, rows, &ck, &cv, &p, &mut co).unwrap();
        g.attention(&gq, 0, rows, &gk, &gv, &p, &mut go).unwrap();
        let (got, want) = (g.download(&go, rows * qw).unwrap(), c.download(&co, rows * qw).unwrap());
        c.attention(&cq, 0, rows, &ck, &cv, &plain, &mut co).unwrap();
        assert!(nmse(&c.download(&co, rows * qw).unwrap(), &want) > 1e-3, "the sinks change nothing");
        let what =
            format!("attention with sinks heads {n_heads}/{n_kv} hd {hd} start {start} rows {rows} window {window:?}");
        check(&what, &got, &want, 5e-4);
    }
}

/// Compact KV caches: rows stored on the device hold the CPU's bytes exactly (the same
/// f16 rounding and Q8_0 scales), from a range of rows and from a list, and attention over
/// them matches the CPU's.
#[test]
fn compact_kv_caches_match_the_cpu() {
    on_gpu(compact_kv_caches_match_the_cpu_on, compact_kv_caches_match_the_cpu_on);
}

fn compact_kv_caches_match_the_cpu_on<G: Backend>(g: &G) {
    use strata::backend::{KvType, Rows};
    let c = CpuBackend::new(2);
    // (n_heads, n_kv_heads, head_dim, start_pos, rows): widths of whole and partial
    // Q8_0 blocks, odd widths (a padding half in f16 rows).
    for (n_heads, n_kv, hd, start, rows) in [(8, 2, 128, 40, 3), (6, 3, 80, 0, 9), (4, 1, 27, 300, 1)] {
        for ty in [KvType::F16, KvType::Q8_0] {
            let (qw, kvw) = (n_heads * hd, n_kv * hd);
            let cap = start + rows;
            let (row_len, len) = (ty.row_len(kvw), ty.row_len(kvw) * cap);
            let (k, v) = (values(cap * kvw, 31, 3.0), values(cap * kvw, 32, 0.01));
            let q = values(rows * qw, 33, 1.0);
            let mut stored = Vec::new();
            for (src, seed) in [(&k, 0u32), (&v, 1)] {
                let (cs, gs) = (c.upload(src).unwrap(), g.upload(src).unwrap());
                let (mut cc, mut gc) = (c.alloc(len).unwrap(), g.alloc(len).unwrap());
                // The first rows as a range, the rest as a list in reverse order.
                let list: Vec<u32> = (1..cap as u32).rev().collect();
                for (rows, at) in [(Rows::Range { start: 0, n: 1 }, 0), (Rows::List(&list), 1)] {
                    c.kv_store(&cs, rows, kvw, &mut cc, at, ty).unwrap();
                    g.kv_store(&gs, rows, kvw, &mut gc, at, ty).unwrap();
                }
                let (want, got) = (c.download(&cc, len).unwrap(), g.download(&gc, len).unwrap());
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{ty:?} cache {seed} of width {kvw} ({row_len} floats a row)");
                stored.push((cc, gc));
            }
            let p = attn_params((n_heads, n_kv, hd, start), None, None, ty);
            // The cache rows in reverse order hold the source rows reversed: fine for
            // attention, which only sees the stored rows.
            let (cq, gq) = (c.upload(&q).unwrap(), g.upload(&q).unwrap());
            let (mut co, mut go) = (c.alloc(rows * qw).unwrap(), g.alloc(rows * qw).unwrap());
            c.attention(&cq, 0, rows, &stored[0].0, &stored[1].0, &p, &mut co).unwrap();
            g.attention(&gq, 0, rows, &stored[0].1, &stored[1].1, &p, &mut go).unwrap();
            let (got, want) = (g.download(&go, rows * qw).unwrap(), c.download(&co, rows * qw).unwrap());
            check(&format!("{ty:?} attention heads {n_heads}/{n_kv} hd {hd} start {start}"), &got, &want, 5e-4);
        }
    }
}

/// `attn_group_*` (the default for up to 8 rows of grouped heads) against
/// `attn_partial_*` (`STRATA_CUDA_ATTN=head`) over the same fixed splits (row-invariant
/// backends): the same bits for every cache type, with windows, softcaps and sinks.
#[test]
fn grouped_attention_gives_the_per_head_kernels_bits() {
    use strata::backend::KvType;
    use strata::backend::cuda::launch::Attn;
    let Some(g) = (!std::env::var("STRATA_CUDA_OPS_ON_CPU").is_ok_and(|v| v == "1")).then(gpu).flatten() else {
        return;
    };
    let g = g.row_invariant();
    let h = CudaBackend::new(0).unwrap().row_invariant().attn_kernels(Attn::Head);
    // (n_heads, n_kv_heads, head_dim, start_pos, rows, window, softcap, sinks)
    let cases = [
        (32, 8, 128, 3000, 1, None, None, false),
        (16, 1, 64, 700, 4, Some(128), None, true),
        (8, 4, 256, 1500, 1, None, Some(50.0), false),
        (28, 4, 128, 40, 8, None, None, false),
        (6, 3, 80, 9, 2, Some(8), Some(1.0), false),
    ];
    for (n_heads, n_kv, hd, start, rows, window, softcap, with_sinks) in cases {
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let (qw, kvw, cap) = (n_heads * hd, n_kv * hd, start + rows);
            let q = values(rows * qw, 61, 1.0);
            let sinks = values(n_heads, 64, 3.0);
            let mut caches = Vec::new();
            for seed in [62, 63] {
                let src = g.upload(&values(cap * kvw, seed, 1.0)).unwrap();
                let mut cache = g.alloc(ty.row_len(kvw) * cap).unwrap();
                g.kv_store(&src, Rows::Range { start: 0, n: cap }, kvw, &mut cache, 0, ty).unwrap();
                caches.push(cache);
            }
            let p = AttnParams {
                sinks: with_sinks.then_some(&sinks[..]),
                ..attn_params((n_heads, n_kv, hd, start), window, softcap, ty)
            };
            let gq = g.upload(&q).unwrap();
            let (mut go, mut ho) = (g.alloc(rows * qw).unwrap(), g.alloc(rows * qw).unwrap());
            g.attention(&gq, 0, rows, &caches[0], &caches[1], &p, &mut go).unwrap();
            h.attention(&gq, 0, rows, &caches[0], &caches[1], &p, &mut ho).unwrap();
            let bits = |b| g.download(b, rows * qw).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&go),
                bits(&ho),
                "{ty:?} attention heads {n_heads}/{n_kv} hd {hd} start {start} rows {rows}"
            );
        }
    }
}

#[test]
fn top_k_on_the_device_matches_the_cpu() {
    on_gpu(top_k_on_the_device_matches_the_cpu_on, top_k_on_the_device_matches_the_cpu_on);
}

fn top_k_on_the_device_matches_the_cpu_on<G: Backend>(g: &G) {
    let c = CpuBackend::new(2);
    let (rows, vocab) = (3, 151_936);
    let logits = values(rows * vocab, 21, 8.0);
    let (cl, gl) = (c.upload(&logits).unwrap(), g.upload(&logits).unwrap());
    for k in [1, 2, 40, 256] {
        let (want, got) = (c.top_k(&cl, rows, vocab, k).unwrap(), g.top_k(&gl, rows, vocab, k).unwrap());
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(g.ids, w.ids, "top-{k} ids");
            assert_eq!(g.logits, w.logits, "top-{k} logits");
            // Summed in f64 on both sides (in another order): the same f32, so that a
            // sequence's log-probs do not depend on where its entries were picked.
            assert_eq!(g.lse.to_bits(), w.lse.to_bits(), "lse {} vs {}", g.lse, w.lse);
        }
    }
}

#[test]
fn rope_and_the_kv_store_fused_give_the_unfused_bits() {
    // STRATA_CUDA_MATVEC=packed: the fused decode path must take every shape below.
    let packed = std::env::var("STRATA_CUDA_MATVEC").is_ok_and(|v| v.trim() == "packed");
    on_gpu(|g| rope_store_gives_the_unfused_bits_on(g, packed), |c| rope_store_gives_the_unfused_bits_on(c, false));
}

/// `Fused::RopeStore` against `rope` of q and k then `kv_store` of k and v, bit for bit,
/// for every KV type, a sequence in the middle of a batch (`row0 > 0`) and of its cache
/// (`at > 0`), partial RoPE and interleaved pairs; `expect_fused`: each must be fused.
fn rope_store_gives_the_unfused_bits_on<G: Backend>(g: &G, expect_fused: bool) {
    let (rows, row0, n, at) = (5, 2, 3, 17);
    let mut fused = 0;
    for &ty in g.kv_types() {
        for (nh, nkv, hd, pairs, interleaved) in [(8, 2, 64, 32, false), (4, 4, 128, 16, true), (6, 2, 96, 48, false)] {
            let (q_width, width) = (nh * hd, nkv * hd);
            let (q, k, v) =
                (values(rows * q_width, 41, 2.0), values(rows * width, 42, 2.0), values(rows * width, 43, 1.0));
            let inv_freq = (0..pairs).map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32)).collect();
            let freqs = RopeFreqs { inv_freq, attention_factor: 1.0, interleaved };
            let cache_len = (at + n + 2) * ty.row_len(width);
            let (mut gq, mut gk, gv) = (g.upload(&q).unwrap(), g.upload(&k).unwrap(), g.upload(&v).unwrap());
            let (mut kc, mut vc) = (g.alloc(cache_len).unwrap(), g.alloc(cache_len).unwrap());
            let heads = RopeHeads { n_heads: nh, n_kv_heads: nkv, head_dim: hd };
            let mut op = Fused::RopeStore {
                q: &mut gq,
                k: &mut gk,
                v: &gv,
                row0,
                n,
                at,
                heads,
                freqs: &freqs,
                k_cache: &mut kc,
                v_cache: &mut vc,
                ty,
            };
            let Some(done) = g.fused(&mut op) else {
                assert!(!expect_fused, "{ty:?} heads {nh}/{nkv} of {hd}: not fused");
                continue;
            };
            done.unwrap();
            // The unfused ops over the sequence's rows alone.
            let positions: Vec<u32> = (at..at + n).map(|p| p as u32).collect();
            let mut uq = g.upload(&q[row0 * q_width..(row0 + n) * q_width]).unwrap();
            let mut uk = g.upload(&k[row0 * width..(row0 + n) * width]).unwrap();
            g.rope(&mut uq, nh, hd, &positions, &freqs).unwrap();
            g.rope(&mut uk, nkv, hd, &positions, &freqs).unwrap();
            let (mut ukc, mut uvc) = (g.alloc(cache_len).unwrap(), g.alloc(cache_len).unwrap());
            g.kv_store(&uk, Rows::first(n), width, &mut ukc, at, ty).unwrap();
            g.kv_store(&gv, Rows::Range { start: row0, n }, width, &mut uvc, at, ty).unwrap();
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            let mut want_q = q.clone();
            want_q[row0 * q_width..(row0 + n) * q_width].copy_from_slice(&g.download(&uq, n * q_width).unwrap());
            let what = format!("{ty:?} heads {nh}/{nkv} of {hd}, {pairs} pairs");
            assert_eq!(bits(g.download(&gq, rows * q_width).unwrap()), bits(want_q), "{what}: q");
            assert_eq!(
                bits(g.download(&kc, cache_len).unwrap()),
                bits(g.download(&ukc, cache_len).unwrap()),
                "{what}: k"
            );
            assert_eq!(
                bits(g.download(&vc, cache_len).unwrap()),
                bits(g.download(&uvc, cache_len).unwrap()),
                "{what}: v"
            );
            fused += 1;
        }
    }
    eprintln!("Fused::RopeStore: {fused} fused runs, each bit for bit the unfused ops");
}
