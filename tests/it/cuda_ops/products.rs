//! Embeddings and matrix products of every weight format on the device against the CPU's
//! and the exact product, batched products against each sequence alone, and the fused
//! products (gate-up with its activation, a product into the residual, q/k/v of one
//! input) against the unfused ops' bits.

use super::{any_weight, check, nmse, on_gpu, values, weight};
use strata::backend::cpu::CpuBackend;
use strata::backend::cuda::launch::{PACKED_FORMATS, WEIGHT_FORMATS};
use strata::backend::{Activation, Backend, Fused, Rows};
use strata::quant::ReadF32;
use strata::tensor::{AlignedBytes, DType, HostTensor};

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
    for dtype in PACKED_FORMATS.into_iter().chain([DType::F16]) {
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
    for dtype in PACKED_FORMATS.into_iter().chain([DType::F16]) {
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
        [DType::Q4_1; 3],
        [DType::Q5_0; 3],
        [DType::Q5_1; 3],
        [DType::Mxfp4; 3],
        [DType::I8; 3],
        [DType::AffineQ4; 3],
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
