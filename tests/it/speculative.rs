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
