//! Elementwise ops, norms, RoPE, row gathers and scatter-adds, and top-k on the device
//! against the CPU's.

use super::{check, on_gpu, values};
use strata::backend::cpu::CpuBackend;
use strata::backend::{Activation, Backend, RopeFreqs, Rows, Unary};
use strata::quant::ReadF32;
use strata::tensor::{DType, HostTensor};

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
