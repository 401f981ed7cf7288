//! Continuous batching (DESIGN.md §5b): a sequence computes exactly what it computes
//! alone, whatever shares its forward passes (decode rows, other prompts' chunks), and
//! whenever it joins or leaves.
//!
//! Each model runs four requests alone, then all four through the step loop, admitted
//! at different steps, with mixed sampling settings (greedy, seeded sampling, penalties
//! over every logit, top-k with log-probs) and a stop string, and a small prefill chunk
//! so that prompts are cut into several chunks that share passes with decode rows.
//! Every token and every log-probability must be bit-identical. Float and quantized
//! weights both, since the CPU picks its kernels by row count.

use std::path::PathBuf;

use strata::engine::batch::{self, Sequence};
use strata::engine::sampler::SamplingParams;
use strata::engine::session::{Engine, GenerateRequest, RunOptions, TokenEvent};

const CHUNK: usize = 16;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn engine(fixture: &str) -> Engine {
    let path = root().join("tests/fixtures").join(fixture);
    let opts = RunOptions { threads: 2, context: 256, ..Default::default() };
    Engine::load(path.to_str().unwrap(), &opts).unwrap()
}

/// Four requests: prompts of 1, 7, 23 and 61 tokens (several chunks), each with its own
/// sampling settings.
fn requests(vocab: u32) -> Vec<GenerateRequest> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut id = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % vocab as u64) as u32
    };
    let greedy = SamplingParams::greedy();
    let seeded = SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(7), ..SamplingParams::greedy() };
    let penalized = SamplingParams { repeat_penalty: 1.3, repeat_last_n: 16, ..SamplingParams::greedy() };
    let top_k = SamplingParams { temperature: 0.7, top_k: 5, seed: Some(11), ..SamplingParams::greedy() };
    [(1, greedy, 3), (7, seeded, 0), (23, penalized, 0), (61, top_k, 2)]
        .into_iter()
        .map(|(len, sampling, top_logprobs)| GenerateRequest {
            prompt: (0..len).map(|_| id()).collect(),
            max_tokens: 12,
            sampling,
            stop: Vec::new(),
            stop_at_eos: false,
            top_logprobs,
        })
        .collect()
}

/// What a sequence reported: its tokens with their log-probabilities (as bits) and
/// alternatives, and its text.
type Trace = (Vec<(u32, u32, Vec<(u32, u32)>)>, String);

fn record(seq: &mut Sequence, trace: &mut Trace) {
    for ev in seq.drain_events() {
        match ev {
            TokenEvent::Token { id, logprob, top } => {
                trace.0.push((id, logprob.to_bits(), top.into_iter().map(|(i, l)| (i, l.to_bits())).collect()))
            }
            TokenEvent::Text(t) => trace.1.push_str(&t),
        }
    }
}

fn alone(e: &Engine, req: &GenerateRequest) -> Trace {
    let cache = e.model.new_cache(e.context_len).unwrap();
    let mut seq = Sequence::new(e, cache, Vec::new(), req.clone()).unwrap();
    let mut trace = Trace::default();
    while !seq.is_finished() {
        batch::step(e, &mut [&mut seq], CHUNK, &|| false).unwrap();
        record(&mut seq, &mut trace);
    }
    trace
}

/// All of `reqs` through one step loop, request `i` joining at step `join[i]`.
fn together(e: &Engine, reqs: &[GenerateRequest], join: &[usize]) -> Vec<Trace> {
    let mut seqs: Vec<Option<Sequence>> = reqs.iter().map(|_| None).collect();
    let mut traces = vec![Trace::default(); reqs.len()];
    let mut step = 0;
    loop {
        for (i, req) in reqs.iter().enumerate() {
            if join[i] == step {
                let cache = e.model.new_cache(e.context_len).unwrap();
                seqs[i] = Some(Sequence::new(e, cache, Vec::new(), req.clone()).unwrap());
            }
        }
        let mut running: Vec<&mut Sequence> = seqs.iter_mut().flatten().filter(|s| !s.is_finished()).collect();
        if running.is_empty() && step > *join.iter().max().unwrap() {
            break;
        }
        batch::step(e, &mut running, CHUNK, &|| false).unwrap();
        for (seq, trace) in seqs.iter_mut().zip(&mut traces) {
            if let Some(seq) = seq {
                record(seq, trace);
            }
        }
        step += 1;
    }
    traces
}

fn check(fixture: &str) {
    let e = engine(fixture);
    let reqs = requests(e.model.config().vocab_size as u32);
    let solo: Vec<Trace> = reqs.iter().map(|r| alone(&e, r)).collect();
    for t in &solo {
        assert_eq!(t.0.len(), 12, "{fixture}: every request generates its 12 tokens");
    }
    for join in [[0, 0, 0, 0], [0, 1, 2, 5], [6, 2, 0, 1]] {
        let batched = together(&e, &reqs, &join);
        for (i, (b, s)) in batched.iter().zip(&solo).enumerate() {
            assert!(b == s, "{fixture}: request {i} joining at {join:?} differs from its solo run:\n{b:?}\n{s:?}");
        }
    }
}

#[test]
fn f32_weights_give_each_sequence_what_it_gets_alone() {
    check("hf/llama3");
}

#[test]
fn f16_weights_give_each_sequence_what_it_gets_alone() {
    check("gguf/llama3.f16.gguf");
}

#[test]
fn q4_0_weights_give_each_sequence_what_it_gets_alone() {
    check("gguf/llama3.q4_0.gguf");
}

#[test]
fn q8_0_weights_give_each_sequence_what_it_gets_alone() {
    check("gguf/llama3.q8_0.gguf");
}

#[test]
fn k_quant_weights_give_each_sequence_what_it_gets_alone() {
    check("gguf/llama256.q4_k_m.gguf");
}

/// A follow-up request reuses the prompt part of a finished sequence's cache and still
/// computes what it computes on a fresh cache.
#[test]
fn a_reused_prefix_gives_what_a_fresh_cache_gives() {
    let e = engine("gguf/llama3.q4_0.gguf");
    let reqs = requests(e.model.config().vocab_size as u32);
    let first = reqs[3].clone();
    let cache = e.model.new_cache(e.context_len).unwrap();
    let mut seq = Sequence::new(&e, cache, Vec::new(), first.clone()).unwrap();
    let mut trace = Trace::default();
    while !seq.is_finished() {
        batch::step(&e, &mut [&mut seq], CHUNK, &|| false).unwrap();
        record(&mut seq, &mut trace);
    }
    let (cache, cached) = seq.into_cache();
    assert_eq!(cached, first.prompt, "only the prompt's keys and values are kept");
    // The conversation goes on: the old prompt, the answer, and more.
    let mut next = first.clone();
    next.prompt.extend(trace.0.iter().map(|t| t.0));
    next.prompt.extend(&reqs[2].prompt);
    let mut reused = Sequence::new(&e, cache, cached, next.clone()).unwrap();
    assert_eq!(reused.prompt_left(), next.prompt.len() - first.prompt.len());
    let mut got = Trace::default();
    while !reused.is_finished() {
        batch::step(&e, &mut [&mut reused], CHUNK, &|| false).unwrap();
        record(&mut reused, &mut got);
    }
    assert!(got == alone(&e, &next), "reusing the prefix changed the answer");
    // The same prompt again still runs two tokens (never one alone).
    let (cache, cached) = reused.into_cache();
    let again = Sequence::new(&e, cache, cached, next.clone()).unwrap();
    assert_eq!(again.prompt_left(), 2);
}
