use super::*;

/// 0 means one thread per core, and no more than one per core is ever taken.
#[test]
fn threads_are_at_most_one_per_core() {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert_eq!(threads_for(0), cores);
    assert_eq!(threads_for(1), 1);
    assert_eq!(threads_for(cores), cores);
    assert_eq!(threads_for(cores + 3), cores);
    assert_eq!(CpuBackend::new(cores + 3).threads(), cores);
}

#[test]
fn top_k_row_orders_by_logit_then_id_and_reports_lse() {
    let row = [1.0, 3.0, f32::NAN, 3.0, -2.0, 0.5];
    let t = top_k_row(&row, 3);
    assert_eq!(t.ids, vec![1, 3, 0]);
    assert_eq!(t.logits, vec![3.0, 3.0, 1.0]);
    let want = row.iter().filter(|l| !l.is_nan()).map(|&l| (l as f64).exp()).sum::<f64>().ln();
    assert!((t.lse as f64 - want).abs() < 1e-6);
    assert_eq!(top_k_row(&row, 1).ids, vec![1]);
    assert_eq!(top_k_row(&row, 10).ids.len(), 5);
}

/// A vocabulary-sized row is scanned in parts (beside each other on a team): the
/// same ids, logits and lse as one scan would give, ties across parts included.
#[test]
fn a_long_row_scanned_in_parts_gives_one_scan_s_top_k() {
    let n = 3 * TOP_K_PART + 1234;
    let mut rng = strata_tensor::rng::Rng::new(3);
    let mut row: Vec<f32> = rng.vec(n, 4.0);
    // Ties across parts, and a part that is all NaN and -inf.
    row[5] = 9.0;
    row[2 * TOP_K_PART + 7] = 9.0;
    row[TOP_K_PART - 1] = 8.5;
    row[3 * TOP_K_PART + 3] = 8.5;
    for (i, l) in row[TOP_K_PART..2 * TOP_K_PART].iter_mut().enumerate() {
        *l = if i % 2 == 0 { f32::NAN } else { f32::NEG_INFINITY };
    }
    let mut want: Vec<(f32, u32)> =
        row.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (l, i as u32)).collect();
    want.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    let max = want[0].0 as f64;
    let lse = max + row.iter().filter(|l| !l.is_nan()).map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    let be = CpuBackend::new(2);
    for k in [1, 4, 40] {
        let one = top_k_row(&row, k);
        assert_eq!(one.ids, want[..k].iter().map(|w| w.1).collect::<Vec<_>>(), "k = {k}");
        assert_eq!(one.logits, want[..k].iter().map(|w| w.0).collect::<Vec<_>>());
        assert!((one.lse as f64 - lse).abs() < 1e-6 * lse.abs(), "{} vs {lse}", one.lse);
        for on_team in [false, true] {
            let got = match on_team {
                true => be.on_workers(|| be.top_k(&row, 1, n, k).unwrap()),
                false => be.top_k(&row, 1, n, k).unwrap(),
            };
            assert_eq!((&got[0].ids, &got[0].logits, got[0].lse.to_bits()), (&one.ids, &one.logits, one.lse.to_bits()));
        }
    }
    // Many ties (whole numbers): each run of 16 that holds one equal to the k-th best
    // is scanned, and an equal logit never displaces the lower id.
    let tied: Vec<f32> = row.iter().map(|l| l.round()).collect();
    let mut want: Vec<(f32, u32)> =
        tied.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (l, i as u32)).collect();
    want.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    for k in [1, 3, 17, 100] {
        assert_eq!(top_k_row(&tied, k).ids, want[..k].iter().map(|w| w.1).collect::<Vec<_>>(), "tied, k = {k}");
    }
    let mut inf = row.clone();
    inf[n - 1] = f32::INFINITY;
    assert_eq!(top_k_row(&inf, 2).lse, f32::INFINITY);
    assert_eq!(top_k_row(&[f32::NAN; 3], 2).lse, f32::NEG_INFINITY);
}

#[test]
fn rope_layouts_rotate_different_pairs() {
    let be = CpuBackend::new(1);
    let freqs = |interleaved| RopeFreqs { inv_freq: vec![1.0, 0.5], attention_factor: 1.0, interleaved };
    let x0 = vec![1.0f32, 2.0, 3.0, 4.0];
    let (mut neox, mut inter) = (x0.clone(), x0.clone());
    be.rope(&mut neox, 1, 4, &[1], &freqs(false)).unwrap();
    be.rope(&mut inter, 1, 4, &[1], &freqs(true)).unwrap();
    let (c, s) = (1f32.cos(), 1f32.sin());
    // NEOX pairs (0, 2) at frequency 1; interleaved pairs (0, 1) at frequency 1.
    assert!((neox[0] - (1.0 * c - 3.0 * s)).abs() < 1e-6 && (neox[2] - (3.0 * c + 1.0 * s)).abs() < 1e-6);
    assert!((inter[0] - (1.0 * c - 2.0 * s)).abs() < 1e-6 && (inter[1] - (2.0 * c + 1.0 * s)).abs() < 1e-6);
}

/// Attention over an f16 or Q8_0 cache equals attention over that cache's values
/// decoded to f32 (the only loss is the storage rounding).
#[test]
fn attention_over_a_compact_cache_matches_its_decoded_values() {
    let be = CpuBackend::new(2);
    let (n_heads, n_kv, hd, len) = (4, 2, 64, 37);
    let kvw = n_kv * hd;
    let val = |i: usize, salt: usize| (((i * 7919 + salt * 104729) % 1000) as f32 / 500.0 - 1.0) * 3.0;
    let q: Vec<f32> = (0..n_heads * hd).map(|i| val(i, 1)).collect();
    let k: Vec<f32> = (0..len * kvw).map(|i| val(i, 2)).collect();
    let v: Vec<f32> = (0..len * kvw).map(|i| val(i, 3)).collect();
    for ty in [KvType::F16, KvType::Q8_0] {
        let rl = ty.row_len(kvw);
        let (mut kc, mut vc) = (vec![0.0f32; len * rl], vec![0.0f32; len * rl]);
        be.kv_store(&k, Rows::first(len), kvw, &mut kc, 0, ty).unwrap();
        be.kv_store(&v, Rows::first(len), kvw, &mut vc, 0, ty).unwrap();
        // The decoded cache, as f32.
        let decoded = |c: &[f32]| {
            let mut out = vec![0.0f32; len * kvw];
            for j in 0..len {
                kv::decode(ty, &c[j * rl..][..rl], 0, &mut out[j * kvw..][..kvw]);
            }
            out
        };
        let (kd, vd) = (decoded(&kc), decoded(&vc));
        let scale = (hd as f32).powf(-0.5);
        let p = AttnParams {
            n_heads,
            n_kv_heads: n_kv,
            head_dim: hd,
            start_pos: len - 1,
            scale,
            sliding_window: None,
            softcap: None,
            kv: ty,
            sinks: None,
        };
        let (mut got, mut want) = (vec![0.0f32; n_heads * hd], vec![0.0f32; n_heads * hd]);
        be.attention(&q, 0, 1, &kc, &vc, &p, &mut got).unwrap();
        be.attention(&q, 0, 1, &kd, &vd, &AttnParams { kv: KvType::F32, ..p }, &mut want).unwrap();
        assert_eq!(got, want, "{ty:?}");
        let err = kd.iter().zip(&k).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 3.0 / 127.0, "{ty:?}: rounding {err}");
    }
}

/// Attention with sinks (gpt-oss) against the sum written out: each head's sink
/// joins the softmax's denominator only, under a sliding window too.
#[test]
fn attention_sinks_join_the_denominator() {
    let be = CpuBackend::new(2);
    let (n_heads, n_kv, hd, len) = (4, 2, 16, 9);
    let kvw = n_kv * hd;
    let val = |i: usize, salt: usize| (((i * 7919 + salt * 104729) % 1000) as f32 / 500.0 - 1.0) * 2.0;
    let q: Vec<f32> = (0..len * n_heads * hd).map(|i| val(i, 1)).collect();
    let k: Vec<f32> = (0..len * kvw).map(|i| val(i, 2)).collect();
    let v: Vec<f32> = (0..len * kvw).map(|i| val(i, 3)).collect();
    let sinks = [0.5f32, -1.0, 3.0, 40.0];
    let scale = (hd as f32).powf(-0.5);
    for window in [None, Some(4)] {
        let p = AttnParams {
            n_heads,
            n_kv_heads: n_kv,
            head_dim: hd,
            start_pos: 0,
            scale,
            sliding_window: window,
            softcap: None,
            kv: KvType::F32,
            sinks: Some(&sinks),
        };
        let mut got = vec![0.0f32; len * n_heads * hd];
        be.attention(&q, 0, len, &k, &v, &p, &mut got).unwrap();
        for (r, h) in (0..len).flat_map(|r| (0..n_heads).map(move |h| (r, h))) {
            let first = window.map_or(0, |w| (r + 1).saturating_sub(w));
            let kh = (h / (n_heads / n_kv)) * hd;
            let qh = &q[(r * n_heads + h) * hd..][..hd];
            let s: Vec<f64> = (first..=r)
                .map(|j| qh.iter().zip(&k[j * kvw + kh..][..hd]).map(|(a, b)| (a * b) as f64).sum::<f64>())
                .map(|d| d * scale as f64)
                .collect();
            let m = s.iter().copied().fold(sinks[h] as f64, f64::max);
            let denom = s.iter().map(|x| (x - m).exp()).sum::<f64>() + (sinks[h] as f64 - m).exp();
            for d in 0..hd {
                let want: f64 =
                    (first..=r).zip(&s).map(|(j, x)| (x - m).exp() / denom * v[j * kvw + kh + d] as f64).sum();
                let g = got[(r * n_heads + h) * hd + d] as f64;
                assert!((g - want).abs() < 1e-5, "row {r} head {h} dim {d} window {window:?}: {g} against {want}");
            }
        }
    }
}

/// gpt-oss's clamped SwiGLU, on both sides of each clamp.
#[test]
fn clamped_swiglu_matches_its_formula() {
    let be = CpuBackend::new(2);
    let (alpha, limit) = (1.702f32, 7.0f32);
    let gate: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) * 0.5).collect();
    let up: Vec<f32> = (0..64).map(|i| (31.0 - i as f32) * 0.4).collect();
    let mut got = gate.clone();
    be.glu(&mut got, &up, 64, Activation::SwigluOai { alpha, limit }).unwrap();
    for i in 0..64 {
        let g = gate[i].min(limit) as f64;
        let u = up[i].clamp(-limit, limit) as f64;
        let want = g / (1.0 + (-(alpha as f64) * g).exp()) * (u + 1.0);
        assert!((got[i] as f64 - want).abs() < 1e-5 * want.abs().max(1.0), "{i}: {} against {want}", got[i]);
    }
    assert!(gate.iter().any(|&g| g > limit) && up.iter().any(|&u| u.abs() > limit));
}
