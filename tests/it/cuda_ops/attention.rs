//! Attention (prefill, split decode, sinks, grouped kernels), the compact KV caches, the
//! fused RoPE + KV store and the gated delta rule on the device against the CPU's or the
//! unfused ops' bits.

use super::{check, gpu, nmse, on_gpu, values};
use strata::backend::cpu::CpuBackend;
use strata::backend::cuda::CudaBackend;
use strata::backend::{AttnParams, Backend, Fused, RopeFreqs, RopeHeads, Rows};

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
