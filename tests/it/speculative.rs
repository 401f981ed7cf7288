//! Speculative decoding: what a sequence generates with drafted tokens verified in one
//! pass is what it generates without them, token for token and log-probability for
//! log-probability (greedy, and a seeded sampler too), on every architecture family,
//! resident and streamed; the drafts are verified and cut back (a hybrid model's
//! recurrent state too); a draft of another vocabulary is refused; and many seeded
//! samples with speculation follow the distribution of those without.

use std::path::PathBuf;

use strata::backend::KvType;
use strata::backend::device::DeviceSpec;
use strata::engine::sampler::SamplingParams;
use strata::engine::session::{Engine, GenerateRequest, RunOptions};

use crate::support::steps::{self, Trace};
use strata::engine::speculative::{SpecCounts, SpecKind, SpecRequest, SpecSettings};

fn root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match built.join("tests/fixtures").exists() {
        true => built,
        false => std::env::current_dir().unwrap(),
    }
}

fn load(fixture: &str, budget: Option<u64>) -> Engine {
    let path = root().join("tests/fixtures").join(fixture);
    let opts = RunOptions {
        threads: 2,
        context: 256,
        kv_type: Some(KvType::F32),
        device: DeviceSpec::Auto,
        memory_budget: budget,
        ..Default::default()
    };
    Engine::load(path.to_str().unwrap(), &opts).unwrap()
}

/// A prompt that says the same thing twice (so the n-gram draft finds matches), of
/// ids from the fixture's vocabulary.
fn prompt(vocab: u32) -> Vec<u32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut id = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % vocab as u64) as u32
    };
    let part: Vec<u32> = (0..12).map(|_| id()).collect();
    [&part[..], &[id(), id()], &part[..]].concat()
}

fn request(prompt: Vec<u32>, sampling: SamplingParams, spec: SpecRequest) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens: 40,
        sampling,
        stop: Vec::new(),
        stop_at_eos: false,
        top_logprobs: 2,
        grammar: None,
        keep_special_tokens: false,
        speculative: spec,
    }
}

/// What each of `reqs` reported through one step loop, and what it drafted and kept.
fn run(e: &Engine, reqs: &[GenerateRequest]) -> Vec<(Trace, SpecCounts)> {
    steps::together(e, reqs, 16).into_iter().map(|(t, s)| (t, s.speculative)).collect()
}

fn off() -> SpecRequest {
    SpecRequest { kind: Some(SpecKind::Off), ..SpecRequest::default() }
}

fn with(kind: SpecKind, max: usize) -> SpecRequest {
    SpecRequest { kind: Some(kind), max: Some(max), p_min: Some(0.0), ..SpecRequest::default() }
}

/// The requests each check runs: greedy, seeded sampling, and penalties over every
/// logit, all at once in the batch.
fn samplings() -> Vec<SamplingParams> {
    vec![
        SamplingParams::greedy(),
        SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(7), ..SamplingParams::greedy() },
        SamplingParams { repeat_penalty: 1.3, repeat_last_n: 16, ..SamplingParams::greedy() },
    ]
}

/// `fixture` with speculation by `kind` (`draft`: the draft model it was given) gives
/// every request exactly what it gets without; returns what was drafted and kept.
fn same_with(e: &Engine, kind: SpecKind, max: usize, label: &str) -> SpecCounts {
    let p = prompt(e.model.config().vocab_size as u32);
    let plain: Vec<GenerateRequest> = samplings().into_iter().map(|s| request(p.clone(), s, off())).collect();
    let spec: Vec<GenerateRequest> = samplings().into_iter().map(|s| request(p.clone(), s, with(kind, max))).collect();
    let want = run(e, &plain);
    let got = run(e, &spec);
    let mut total = SpecCounts::default();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(w.0.0.len(), 40, "{label}: request {i} generates its 40 tokens");
        assert!(g.0 == w.0, "{label}: request {i} with {kind:?} differs:\n{:?}\n{:?}", g.0, w.0);
        assert_eq!(w.1, SpecCounts::default(), "{label}: request {i} speculated with speculation off");
        total.add(g.1);
    }
    eprintln!(
        "{label}: {kind:?} drafted {} kept {} in {} verifying passes ({:.2} tokens a pass)",
        total.drafted,
        total.accepted,
        total.steps,
        total.tokens_per_step()
    );
    total
}

/// Every architecture family, with the n-gram draft (which guesses wrong often: the
/// rejected rows are cut back) and with a draft model (the fixture itself, whose every
/// draft greedy decoding keeps).
fn families(budget: Option<u64>) {
    let fixtures = [
        "hf/llama3",
        "gguf/llama3.q4_0.gguf",
        "gguf/llama256.q4_k_m.gguf",
        "hf/qwen2",
        "hf/qwen3",
        "hf/gemma",
        "hf/gemma2",
        "hf/gemma3",
        "hf/phi3",
        "hf/olmo2",
        "hf/granite",
        "hf/smollm3",
        "hf/mixtral",
        "hf/qwen2_moe",
        "hf/qwen3_moe",
        "hf/qwen3_next",
        "hf/qwen3_5",
        "hf/qwen3_5_moe",
        "hf/deepseek_v3",
        "hf/glm4_moe",
        "hf/gpt_oss",
    ];
    let (mut rejected, mut kept) = (0, 0);
    for fixture in fixtures {
        let label = format!("{fixture} (budget {budget:?})");
        let mut e = load(fixture, budget);
        let n = same_with(&e, SpecKind::Ngram, 6, &label);
        rejected += n.drafted - n.accepted;
        kept += n.accepted;
        e.set_draft(load(fixture, None), SpecSettings::default()).unwrap();
        let d = same_with(&e, SpecKind::Draft, 4, &label);
        assert!(d.accepted > 0, "{label}: the draft model's drafts were never kept");
        // The sampled and penalized requests reject some: a hybrid model's recurrent
        // state goes back to the last kept row.
        assert!(d.accepted < d.drafted, "{label}: every draft was kept");
        kept += d.accepted;
    }
    assert!(rejected > 0 && kept > 0, "drafts were both kept ({kept}) and rejected ({rejected})");
}

#[test]
fn every_family_generates_the_same_with_speculation() {
    families(None);
}

#[test]
fn streamed_models_generate_the_same_with_speculation() {
    families(Some(0));
}

/// The exact distribution of a top-4 draw at temperature 1 after `context` (the four
/// most likely ids and their probabilities), from the model's own logits.
fn top4(e: &Engine, context: &[u32]) -> Vec<(u32, f64)> {
    let mut cache = e.model.new_cache(e.context_len).unwrap();
    let step = strata::model::decoder::SeqStep { tokens: context, cache: &mut cache, all_logits: false, verify: false };
    let logits = e.model.forward(&mut [step]).unwrap().remove(0);
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    ids.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    ids.truncate(4);
    let max = logits[ids[0] as usize] as f64;
    let w: Vec<f64> = ids.iter().map(|&i| (logits[i as usize] as f64 - max).exp()).collect();
    let sum: f64 = w.iter().sum();
    ids.into_iter().zip(w).map(|(i, w)| (i, w / sum)).collect()
}

/// Many seeded draws, each token from the four most likely at temperature 1, with a
/// draft model of other weights (so that many drafts are rejected): the second and
/// third tokens, which come from verified rows (the third from a drafted token's row
/// where the second was kept), follow the model's exact distribution (a chi-square
/// test over their 16 pairs), and each seed draws exactly what it draws without
/// speculation.
#[test]
fn sampled_tokens_follow_the_models_distribution() {
    let mut e = load("hf/llama3", None);
    e.set_draft(load("gguf/llama3.q4_0.gguf", None), SpecSettings::default()).unwrap();
    let p: Vec<u32> = prompt(e.model.config().vocab_size as u32)[..8].to_vec();
    // P(t2, t3) = Σ over t1 of P(t1) P(t2 | t1) P(t3 | t1, t2).
    let mut exact = std::collections::BTreeMap::<(u32, u32), f64>::new();
    for (t1, p1) in top4(&e, &p) {
        for (t2, p2) in top4(&e, &[&p[..], &[t1]].concat()) {
            for (t3, p3) in top4(&e, &[&p[..], &[t1, t2]].concat()) {
                *exact.entry((t2, t3)).or_default() += p1 * p2 * p3;
            }
        }
    }
    let draw = |seed: u64, spec: SpecRequest| {
        let sampling = SamplingParams { temperature: 1.0, top_k: 4, seed: Some(seed), ..SamplingParams::greedy() };
        GenerateRequest { max_tokens: 4, top_logprobs: 0, ..request(p.clone(), sampling, spec) }
    };
    const N: u64 = 3000;
    let mut counts = std::collections::HashMap::<(u32, u32), u64>::new();
    let mut spec_total = SpecCounts::default();
    for block in 0..N / 100 {
        let seeds: Vec<u64> = (block * 100..(block + 1) * 100).collect();
        let spec = run(&e, &seeds.iter().map(|&s| draw(s, with(SpecKind::Draft, 4))).collect::<Vec<_>>());
        let plain = run(&e, &seeds.iter().map(|&s| draw(s, off())).collect::<Vec<_>>());
        for ((s, c), (w, _)) in spec.iter().zip(&plain) {
            assert!(s.0 == w.0, "a seed drew other tokens with speculation");
            *counts.entry((s.0[1].0, s.0[2].0)).or_default() += 1;
            spec_total.add(*c);
        }
    }
    // Pairs expected fewer than 5 times are pooled into one cell.
    let (mut cells, mut pooled) = (Vec::new(), (0.0, 0.0));
    for (pair, q) in &exact {
        let (want, got) = (q * N as f64, counts.get(pair).copied().unwrap_or(0) as f64);
        match want < 5.0 {
            true => pooled = (pooled.0 + want, pooled.1 + got),
            false => cells.push((want, got)),
        }
    }
    if pooled.0 > 0.0 {
        cells.push(pooled);
    }
    let chi2: f64 = cells.iter().map(|(want, got)| (got - want).powi(2) / want).sum();
    // The 1e-4 tail of chi-square with `k` degrees of freedom (Wilson-Hilferty).
    let k = (cells.len() - 1) as f64;
    let limit = k * (1.0 - 2.0 / (9.0 * k) + 3.72 * (2.0 / (9.0 * k)).sqrt()).powi(3);
    let outside: u64 = counts.iter().filter(|(k, _)| !exact.contains_key(k)).map(|(_, &n)| n).sum();
    eprintln!(
        "chi2 {chi2:.1} over {} cells (limit {limit:.1}); drafted {} kept {} ({:.0}%)",
        cells.len(),
        spec_total.drafted,
        spec_total.accepted,
        100.0 * spec_total.acceptance_rate()
    );
    assert_eq!(outside, 0, "pairs outside the four most likely");
    assert!(chi2 < limit, "the draws do not follow the model's distribution: chi2 {chi2:.1} > {limit:.1}");
    let rejected = spec_total.drafted - spec_total.accepted;
    assert!(rejected > N / 10 && spec_total.accepted > N / 10, "drafts kept and rejected: {spec_total:?}");
}

/// A stop string met inside a verified run of drafts, an end-of-sequence token and the
/// length limit end the sequence where they end it without speculation, with the same
/// text and reason.
#[test]
fn stops_end_a_speculating_sequence_where_they_end_it_without() {
    let mut e = load("hf/llama3", None);
    e.set_draft(load("hf/llama3", None), SpecSettings::default()).unwrap();
    let p = prompt(e.model.config().vocab_size as u32);
    let full = run(&e, &[request(p.clone(), SamplingParams::greedy(), off())]).remove(0).0;
    // A stop string from the middle of the reply, and one at its very end.
    let text = &full.1;
    let cut = text.char_indices().map(|(i, _)| i).nth(text.chars().count() / 2).unwrap();
    let stops = [
        text[cut..].chars().take(3).collect::<String>(),
        text.chars().rev().take(2).collect::<Vec<_>>().iter().rev().collect(),
    ];
    for stop in stops {
        for (eos, max_tokens) in [(false, 40), (true, 40), (false, 7)] {
            let req = |spec| GenerateRequest {
                stop: vec![stop.clone()],
                stop_at_eos: eos,
                max_tokens,
                ..request(p.clone(), SamplingParams::greedy(), spec)
            };
            let want = steps::together(&e, &[req(off())], 16).remove(0);
            let got = steps::together(&e, &[req(with(SpecKind::Draft, 8))], 16).remove(0);
            assert!(got.0 == want.0, "stop {stop:?}: {:?} against {:?}", got.0.1, want.0.1);
            assert_eq!(
                (got.1.finish, got.1.stop_sequence.clone(), got.1.completion_tokens, got.1.tokens.clone()),
                (want.1.finish, want.1.stop_sequence.clone(), want.1.completion_tokens, want.1.tokens.clone()),
                "stop {stop:?}, max_tokens {max_tokens}"
            );
            assert!(got.1.speculative.accepted > 0, "stop {stop:?}: nothing was kept");
        }
    }
}

/// A consumer that finds the reply complete after a token within a step that generated
/// more (a tool call's end) stops the sequence there: it reports and keeps what a
/// sequence stopped after that token without speculation does (a hybrid model's
/// recurrent state too, which must go back into the verified rows).
#[test]
fn a_reply_stopped_inside_a_step_keeps_what_it_would_have() {
    use strata::engine::batch::{self, Sequence};
    for fixture in ["hf/llama3", "hf/qwen3_5"] {
        let mut e = load(fixture, None);
        e.set_draft(load(fixture, None), SpecSettings::default()).unwrap();
        let p = prompt(e.model.config().vocab_size as u32);
        let start = |spec| {
            let req = request(p.clone(), SamplingParams::greedy(), spec);
            Sequence::new(&e, e.model.new_cache(e.context_len).unwrap(), Vec::new(), req).unwrap()
        };
        // With speculation: stop after the second of a step's several tokens.
        let mut seq = start(with(SpecKind::Draft, 8));
        let mut trace = Trace::default();
        let n = loop {
            let before = seq.generated_len();
            batch::step(&e, &mut [&mut seq], 16, &|| false).unwrap();
            if seq.generated_len() >= before + 3 {
                break before + 2;
            }
            steps::record(&mut seq, &mut trace);
        };
        seq.stop_after(n);
        let got = (seq.summary().unwrap().tokens, seq.into_cache());
        // Without: stop once it has generated `n`.
        let mut seq = start(off());
        while seq.generated_len() < n {
            batch::step(&e, &mut [&mut seq], 16, &|| false).unwrap();
        }
        seq.stop();
        let want = (seq.summary().unwrap().tokens, seq.into_cache());
        assert_eq!(got.0, want.0, "{fixture}: the tokens kept");
        assert_eq!((got.1.1.clone(), got.1.0.len()), (want.1.1.clone(), want.1.0.len()), "{fixture}: the cache kept");
        // What comes next from either cache is the same.
        let mut next = request([&want.1.1[..], &p[..4]].concat(), SamplingParams::greedy(), off());
        next.max_tokens = 8;
        let a = run_from(&e, got.1, next.clone());
        let b = run_from(&e, want.1, next);
        assert!(a == b, "{fixture}: a follow-up differs");
    }
}

fn run_from(e: &Engine, (cache, cached): (strata::model::decoder::KvCache, Vec<u32>), req: GenerateRequest) -> Trace {
    use strata::engine::batch::Sequence;
    run_from_seq(e, &mut Sequence::new(e, cache, cached, req).unwrap())
}

/// A finished sequence's cache carries its draft model's cache, counted in its bytes,
/// so that a follow-up request drafts from there (its prompt is not run through the
/// draft again); the follow-up still generates what it does without speculation.
#[test]
fn a_follow_up_request_drafts_from_the_draft_cache_it_inherits() {
    use strata::engine::batch::Sequence;
    let mut e = load("hf/llama3", None);
    e.set_draft(load("gguf/llama3.q4_0.gguf", None), SpecSettings::default()).unwrap();
    let p = prompt(e.model.config().vocab_size as u32);
    let first = request(p.clone(), SamplingParams::greedy(), with(SpecKind::Draft, 4));
    let mut seq = Sequence::new(&e, e.model.new_cache(e.context_len).unwrap(), Vec::new(), first).unwrap();
    let answer = run_from_seq(&e, &mut seq);
    let (cache, cached) = seq.into_cache();
    let (draft, held) = &**cache.draft.as_ref().expect("the draft's cache comes back with the sequence's");
    assert!(held.len() >= p.len() + 30 && draft.len() == held.len(), "{} of {}", draft.len(), held.len());
    assert!(cache.allocated_bytes() > draft.allocated_bytes() && draft.allocated_bytes() > 0);
    // The conversation goes on.
    let next = [&p[..], &answer.0.iter().map(|t| t.0).collect::<Vec<_>>(), &p[..6]].concat();
    let spec = request(next.clone(), SamplingParams::greedy(), with(SpecKind::Draft, 4));
    let got = run_from(&e, (cache, cached), spec);
    let want = run(&e, &[request(next, SamplingParams::greedy(), off())]).remove(0).0;
    assert!(got == want, "the follow-up differs with the inherited draft cache");
}

fn run_from_seq(e: &Engine, seq: &mut strata::engine::batch::Sequence) -> Trace {
    let mut trace = Trace::default();
    while !seq.is_finished() {
        strata::engine::batch::step(e, &mut [&mut *seq], 16, &|| false).unwrap();
        steps::record(seq, &mut trace);
    }
    trace
}
