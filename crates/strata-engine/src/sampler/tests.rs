use super::*;

fn cands(logits: &[f32]) -> Vec<Candidate> {
    let mut v = Vec::new();
    candidates_from_logits(logits, &mut v);
    v
}

fn ids(c: &[Candidate]) -> Vec<u32> {
    c.iter().map(|c| c.id).collect()
}

#[test]
fn defaults_match_the_documented_values() {
    let p = SamplingParams::default();
    assert_eq!(p.temperature, 0.8);
    assert_eq!(p.top_k, 40);
    assert_eq!(p.top_p, 0.9);
    assert_eq!(p.min_p, 0.0);
    assert_eq!(p.repeat_penalty, 1.0);
    assert_eq!(p.repeat_last_n, 64);
    assert_eq!(p.seed, None);
    assert!(!p.is_greedy());
    assert!(SamplingParams::greedy().is_greedy());
    assert!(p.validate().is_ok());
}

#[test]
fn validate_names_the_field() {
    let p = SamplingParams { top_p: 0.0, ..Default::default() };
    let err = p.validate().unwrap_err().to_string();
    assert!(err.contains("top_p"), "{err}");
    let p = SamplingParams { repeat_penalty: -1.0, ..Default::default() };
    assert!(p.validate().unwrap_err().to_string().contains("repeat_penalty"));
    let p = SamplingParams { min_p: 1.5, ..Default::default() };
    assert!(p.validate().unwrap_err().to_string().contains("min_p"));
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative() {
    let mut c = cands(&[2.0, -2.0, 1.0]);
    apply_penalties(&mut c, &[0, 1], 2.0, 0.0, 0.0);
    assert_eq!(c[0].logit, 1.0);
    assert_eq!(c[1].logit, -4.0);
    assert_eq!(c[2].logit, 1.0);
}

#[test]
fn frequency_and_presence_penalties_count_occurrences() {
    let mut c = cands(&[0.0, 0.0, 0.0]);
    apply_penalties(&mut c, &[1, 1, 1, 2], 1.0, 0.5, 0.25);
    assert_eq!(c[0].logit, 0.0);
    assert_eq!(c[1].logit, -(3.0 * 0.25 + 0.5));
    assert_eq!(c[2].logit, -(0.25 + 0.5));
}

#[test]
fn penalties_ignore_out_of_range_ids_and_work_on_reordered_lists() {
    let mut c = cands(&[3.0, 1.0, 2.0]);
    top_k(&mut c, 2); // sorted and cut: ids 0, 2
    assert_eq!(ids(&c), vec![0, 2]);
    apply_penalties(&mut c, &[2, 99], 2.0, 0.0, 0.0);
    assert_eq!(c[1].logit, 1.0);
    assert_eq!(c[0].logit, 3.0);
}

#[test]
fn sampler_penalizes_only_the_last_n_tokens() {
    // Token 0 is best, but it was repeated long ago (outside the window) and token 1
    // recently. With a window of 2, only token 1 is penalized; greedy still picks 0.
    let logits = [1.0, 0.9, 0.0];
    let mut params = SamplingParams::greedy();
    params.repeat_last_n = 2;
    params.presence_penalty = 5.0;
    let mut s = Sampler::new(params.clone());
    assert_eq!(s.sample(&logits, &[0, 0, 0, 2, 2]), 0);
    // With 0 recent, greedy must avoid it.
    assert_eq!(s.sample(&logits, &[2, 0]), 1);
    params.repeat_last_n = 0;
    let mut s = Sampler::new(params);
    assert_eq!(s.sample(&logits, &[0, 0]), 0, "repeat_last_n = 0 disables penalties");
}

#[test]
fn top_k_keeps_the_k_best_sorted() {
    let mut c = cands(&[0.1, 0.5, 0.3, 0.9, 0.2]);
    top_k(&mut c, 3);
    assert_eq!(ids(&c), vec![3, 1, 2]);
    let mut c = cands(&[0.1, 0.5]);
    top_k(&mut c, 0);
    assert_eq!(c.len(), 2);
    top_k(&mut c, 10);
    assert_eq!(c.len(), 2);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    // probabilities 0.5, 0.3, 0.2 (logits = ln p)
    let l = [0.2f32.ln(), 0.5f32.ln(), 0.3f32.ln()];
    let mut c = cands(&l);
    top_p(&mut c, 0.5);
    assert_eq!(ids(&c), vec![1]);
    let mut c = cands(&l);
    top_p(&mut c, 0.6);
    assert_eq!(ids(&c), vec![1, 2]);
    let mut c = cands(&l);
    top_p(&mut c, 0.81);
    assert_eq!(ids(&c), vec![1, 2, 0]);
    let mut c = cands(&l);
    top_p(&mut c, 1e-9);
    assert_eq!(ids(&c), vec![1], "keeps at least one");
    let mut c = cands(&l);
    top_p(&mut c, 1.0);
    assert_eq!(c.len(), 3);
}

#[test]
fn top_p_on_a_large_vocabulary_matches_a_full_sort() {
    // 50k candidates: one peaked case (nucleus inside the probe) and one flat case
    // (nucleus larger than the probe).
    let mut rng = Rng::new(5);
    for scale in [8.0f64, 0.01] {
        let logits: Vec<f32> = (0..50_000).map(|_| (rng.next_f64() * scale) as f32).collect();
        for p in [0.3f32, 0.9] {
            let mut fast = cands(&logits);
            top_p(&mut fast, p);
            // Reference: full sort and accumulate.
            let mut all = cands(&logits);
            all.sort_by(desc);
            let pr = probs(&all);
            let mut cum = 0.0;
            let mut keep = all.len();
            for (i, x) in pr.iter().enumerate() {
                cum += x;
                if cum >= p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            assert!((fast.len() as i64 - keep as i64).abs() <= 1, "scale {scale} p {p}: {} vs {keep}", fast.len());
            assert_eq!(ids(&fast[..fast.len().min(keep)]), ids(&all[..fast.len().min(keep)]));
        }
    }
}

#[test]
fn min_p_drops_tokens_below_the_scaled_max() {
    // probabilities 0.6, 0.3, 0.1: p_max = 0.6
    let l = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
    let mut c = cands(&l);
    min_p(&mut c, 0.4); // threshold 0.24
    assert_eq!(ids(&c), vec![0, 1]);
    let mut c = cands(&l);
    min_p(&mut c, 0.6); // threshold 0.36
    assert_eq!(ids(&c), vec![0]);
    let mut c = cands(&l);
    min_p(&mut c, 0.0);
    assert_eq!(c.len(), 3);
}

#[test]
fn temperature_scales_logits() {
    let mut c = cands(&[1.0, -2.0]);
    temperature(&mut c, 0.5);
    assert_eq!(c[0].logit, 2.0);
    assert_eq!(c[1].logit, -4.0);
}

#[test]
fn greedy_is_argmax_and_breaks_ties_by_smallest_id() {
    let mut s = Sampler::new(SamplingParams::greedy());
    assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0], &[]), 1);
    assert_eq!(s.sample(&[f32::NAN, 0.5, 0.2], &[]), 1);
    assert_eq!(s.sample(&[], &[]), 0);
}

#[test]
fn greedy_ignores_filters_but_applies_penalties() {
    let params = SamplingParams { temperature: 0.0, top_k: 1, repeat_penalty: 4.0, ..Default::default() };
    let mut s = Sampler::new(params);
    // 2.0 / 4 = 0.5 < 1.5
    assert_eq!(s.sample(&[2.0, 1.5], &[0]), 1);
}

#[test]
fn same_seed_gives_same_tokens_and_different_seeds_differ() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let params = SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, seed: Some(1234), ..Default::default() };
    let draw = |params: SamplingParams| {
        let mut s = Sampler::new(params);
        (0..64).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
    };
    let a = draw(params.clone());
    let b = draw(params.clone());
    assert_eq!(a, b);
    let c = draw(SamplingParams { seed: Some(99), ..params });
    assert_ne!(a, c);
    // Not stuck on one token.
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert!(distinct.len() > 5, "{distinct:?}");
}

#[test]
fn draws_follow_the_distribution() {
    // probabilities 0.7 / 0.2 / 0.1 at temperature 1.
    let l = [0.7f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: Some(7), ..Default::default() };
    let mut s = Sampler::new(params);
    let mut counts = [0usize; 3];
    let n = 20_000;
    for _ in 0..n {
        counts[s.sample(&l, &[]) as usize] += 1;
    }
    let freq: Vec<f64> = counts.iter().map(|&c| c as f64 / n as f64).collect();
    assert!((freq[0] - 0.7).abs() < 0.02, "{freq:?}");
    assert!((freq[1] - 0.2).abs() < 0.02, "{freq:?}");
    assert!((freq[2] - 0.1).abs() < 0.02, "{freq:?}");
}

#[test]
fn one_log_softmax_entry_is_the_rows() {
    let rows: [&[f32]; 4] = [
        &[1.5, -2.0, 0.25, 7.0, f32::NAN],
        &[f32::NEG_INFINITY, 0.0, 3.0],
        &[f32::INFINITY, 1.0, f32::INFINITY],
        &[f32::NEG_INFINITY; 3],
    ];
    for row in rows {
        let all = log_softmax(row);
        for (id, want) in all.iter().enumerate() {
            assert_eq!(log_softmax_at(row, id).to_bits(), want.to_bits(), "{row:?} {id}");
        }
    }
}

/// Listing the allowed tokens draws exactly what masking the others does, penalties
/// included (the penalized tokens are found among a list with gaps).
#[test]
fn sampling_among_listed_tokens_is_sampling_masked() {
    let logits: Vec<f32> = (0..500).map(|i| ((i * 7919) % 113) as f32 / 10.0).collect();
    let allowed = |id: u32| id % 3 != 1 && id != 42;
    let history: Vec<u32> = (0..40).map(|i| (i * 37) % 500).collect();
    for seed in 0..20 {
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            repeat_penalty: 1.3,
            repeat_last_n: 64,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            seed: Some(seed),
            ..Default::default()
        };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        for _ in 0..5 {
            let listed = (0..600u32).filter(|&id| allowed(id));
            assert_eq!(a.sample_among(&logits, &history, listed), b.sample_masked(&logits, &history, allowed));
        }
    }
}

#[test]
fn filters_restrict_what_can_be_drawn() {
    let l = [5.0, 4.9, 4.8, 0.0, -1.0];
    let params = SamplingParams { temperature: 3.0, top_k: 2, top_p: 1.0, seed: Some(3), ..Default::default() };
    let mut s = Sampler::new(params);
    for _ in 0..500 {
        let t = s.sample(&l, &[]);
        assert!(t == 0 || t == 1, "top_k=2 allowed {t}");
    }
    // min_p = 0.5 at temperature 1 before scaling: exp(-0.1) and exp(-0.2) survive,
    // exp(-5) does not, even though temperature 100 would flatten everything.
    let params =
        SamplingParams { temperature: 100.0, top_k: 0, top_p: 1.0, min_p: 0.5, seed: Some(3), ..Default::default() };
    let mut s = Sampler::new(params);
    for _ in 0..500 {
        assert!(s.sample(&l, &[]) <= 2);
    }
}

#[test]
fn masked_sampling_picks_only_allowed_tokens() {
    let l = [5.0, 4.0, 3.0, 2.0, f32::NEG_INFINITY];
    let odd = |id: u32| id % 2 == 1;
    let mut greedy = Sampler::new(SamplingParams::greedy());
    assert_eq!(greedy.sample_masked(&l, &[], odd), Some(1));
    // Penalties act on the allowed tokens: 4 - 3 < 2.
    let params = SamplingParams { presence_penalty: 3.0, ..SamplingParams::greedy() };
    assert_eq!(Sampler::new(params).sample_masked(&l, &[1], odd), Some(3));
    let params = SamplingParams { temperature: 2.0, top_k: 0, top_p: 1.0, seed: Some(5), ..Default::default() };
    let mut s = Sampler::new(params);
    for _ in 0..500 {
        assert!(odd(s.sample_masked(&l, &[], odd).unwrap()));
    }
    // An allowed token is picked even when the model gives it -inf; nothing allowed
    // is `None`.
    assert_eq!(greedy.sample_masked(&l, &[], |id| id == 4), Some(4));
    assert_eq!(s.sample_masked(&l, &[], |id| id == 4), Some(4));
    assert_eq!(s.sample_masked(&l, &[], |_| false), None);
}

#[test]
fn all_masked_logits_do_not_panic() {
    let l = [f32::NEG_INFINITY; 4];
    let mut s = Sampler::new(SamplingParams { seed: Some(1), ..Default::default() });
    assert!(s.sample(&l, &[]) < 4);
    let mut s = Sampler::new(SamplingParams::greedy());
    assert_eq!(s.sample(&l, &[]), 0);
}

#[test]
fn unseeded_samplers_get_different_seeds() {
    let a = Sampler::new(SamplingParams::default()).seed();
    let b = Sampler::new(SamplingParams::default()).seed();
    assert_ne!(a, b);
}

#[test]
fn log_softmax_is_normalized_and_stable() {
    let l = [1000.0f32, 999.0, 998.0];
    let lp = log_softmax(&l);
    let total: f64 = lp.iter().map(|&x| (x as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6, "{total}");
    // Shift invariance: same as [2, 1, 0].
    let lp2 = log_softmax(&[2.0, 1.0, 0.0]);
    for (a, b) in lp.iter().zip(&lp2) {
        assert!((a - b).abs() < 1e-6);
    }
    // Known value: log(e^2 / (e^2 + e + 1)).
    let expected = (2.0f64 - (2f64.exp() + 1f64.exp() + 1.0).ln()) as f32;
    assert!((lp2[0] - expected).abs() < 1e-7);
}

#[test]
fn log_softmax_edge_cases() {
    let lp = log_softmax(&[0.0, f32::NEG_INFINITY]);
    assert_eq!(lp[0], 0.0);
    assert_eq!(lp[1], f32::NEG_INFINITY);
    assert!(log_softmax(&[f32::NEG_INFINITY; 2]).iter().all(|x| *x == f32::NEG_INFINITY));
    let lp = log_softmax(&[f32::INFINITY, 1.0, f32::INFINITY]);
    assert!((lp[0] - (0.5f32).ln()).abs() < 1e-7);
    assert_eq!(lp[1], f32::NEG_INFINITY);
    assert!(log_softmax(&[]).is_empty());
}

#[test]
fn top_logprobs_are_sorted_and_match_log_softmax() {
    let l = [0.5, 2.0, -1.0, 2.0, 1.0];
    let lp = log_softmax(&l);
    let top = top_logprobs(&l, 3);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 4]);
    assert_eq!(top[0].1, lp[1]);
    assert_eq!(top[2].1, lp[4]);
    assert_eq!(top_logprobs(&l, 10).len(), 5);
    assert!(top_logprobs(&l, 0).is_empty());
}

#[test]
fn rng_is_deterministic_and_uniform() {
    let mut a = Rng::new(42);
    let mut b = Rng::new(42);
    let mut sum = 0.0;
    for _ in 0..10_000 {
        let x = a.next_f64();
        assert_eq!(x, b.next_f64());
        assert!((0.0..1.0).contains(&x));
        sum += x;
    }
    let mean = sum / 10_000.0;
    assert!((mean - 0.5).abs() < 0.02, "{mean}");
    assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
}

#[test]
fn logit_bias_comes_first_and_minus_infinity_bans() {
    let logits = [1.0, 3.0, 2.0, 0.0];
    let greedy = |bias: Vec<(u32, f32)>, history: &[u32]| {
        let params = SamplingParams { logit_bias: bias, presence_penalty: 1.5, ..SamplingParams::greedy() };
        Sampler::new(params).sample(&logits, history)
    };
    assert_eq!(greedy(vec![], &[]), 1);
    assert_eq!(greedy(vec![(1, f32::NEG_INFINITY)], &[]), 2);
    assert_eq!(greedy(vec![(3, 100.0)], &[]), 3);
    assert_eq!(greedy(vec![(0, 2.0)], &[]), 0, "ties go to the smaller id");
    assert_eq!(greedy(vec![(1, -0.5), (9, 100.0)], &[]), 1, "ids past the logits are ignored");
    // The penalty applies to the biased logit: 3 - 0.5 - 1.5 < 2.
    assert_eq!(greedy(vec![(1, -0.5)], &[1]), 2);
    // A banned token is never drawn, an allowed one is picked among the grammar's.
    let params = SamplingParams {
        temperature: 5.0,
        top_k: 0,
        top_p: 1.0,
        seed: Some(9),
        logit_bias: vec![(0, f32::NEG_INFINITY), (2, f32::NEG_INFINITY)],
        ..Default::default()
    };
    let mut s = Sampler::new(params.clone());
    for _ in 0..500 {
        assert!(matches!(s.sample(&logits, &[]), 1 | 3));
        assert_eq!(s.sample_masked(&logits, &[], |id| id != 1), Some(3));
    }
    let params = SamplingParams { logit_bias: vec![(1, f32::NEG_INFINITY)], ..SamplingParams::greedy() };
    assert_eq!(Sampler::new(params).sample_masked(&logits, &[], |id| id != 2), Some(0));
    // In the device's order (most likely first), the bias finds its token too.
    let top = strata_backend::cpu::top_k_row(&logits, 3);
    let params = SamplingParams { logit_bias: vec![(1, -2.5)], ..SamplingParams::greedy() };
    assert_eq!(Sampler::new(params).sample_top(&top), 2);
}

#[test]
fn sampling_from_the_device_top_k_matches_sampling_from_every_logit() {
    let mut rng = Rng::new(7);
    let logits: Vec<f32> = (0..5000).map(|_| (rng.next_f64() * 12.0 - 6.0) as f32).collect();
    // The four most likely tokens, banned or lowered (one only a little), in id order.
    let top4 = strata_backend::cpu::top_k_row(&logits, 4).ids;
    let mut best: Vec<(u32, f32)> = top4.into_iter().zip([f32::NEG_INFINITY, -20.0, -0.01, -30.0]).collect();
    best.sort_by_key(|&(id, _)| id);
    let cases = [
        SamplingParams { seed: Some(3), ..SamplingParams::default() },
        SamplingParams {
            seed: Some(4),
            top_k: 5,
            top_p: 1.0,
            min_p: 0.05,
            temperature: 1.3,
            ..SamplingParams::default()
        },
        SamplingParams::greedy(),
        // Bans and lowered tokens among the best: the cut widens to find the next ones.
        SamplingParams { logit_bias: best[..4].to_vec(), ..SamplingParams::greedy() },
        SamplingParams {
            seed: Some(5),
            top_k: 3,
            top_p: 1.0,
            temperature: 2.0,
            logit_bias: best[..3].to_vec(),
            ..SamplingParams::default()
        },
    ];
    for p in cases {
        let k = p.candidates_needed(0).expect("no penalties: a cut is enough");
        let top = strata_backend::cpu::top_k_row(&logits, k);
        let (mut full, mut cut) = (Sampler::new(p.clone()), Sampler::new(p.clone()));
        for _ in 0..200 {
            assert_eq!(full.sample(&logits, &[]), cut.sample_top(&top), "{p:?}");
        }
    }
    // Penalties or no top-k cut need every logit; top_logprobs widens the cut.
    assert_eq!(SamplingParams { repeat_penalty: 1.1, ..SamplingParams::greedy() }.candidates_needed(0), None);
    // A raised token may be anywhere: every logit. Lowered ones widen the cut.
    let raised = SamplingParams { logit_bias: vec![(1, -5.0), (7, 0.5)], ..SamplingParams::greedy() };
    assert_eq!(raised.candidates_needed(0), None);
    let lowered = SamplingParams { logit_bias: vec![(1, -5.0), (7, f32::NEG_INFINITY)], ..SamplingParams::greedy() };
    assert_eq!(lowered.candidates_needed(0), Some(3));
    assert_eq!(lowered.candidates_needed(5), Some(5));
    assert_eq!(SamplingParams { top_k: 0, ..SamplingParams::default() }.candidates_needed(0), None);
    assert_eq!(SamplingParams::greedy().candidates_needed(5), Some(5));
    assert_eq!(SamplingParams { top_k: 40, ..SamplingParams::default() }.candidates_needed(300), None);
}
