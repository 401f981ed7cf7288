//! The generation loop end to end on fixture models (made by `tools/make_fixtures.py`):
//! greedy output equals transformers' greedy continuation, stop strings, token limits,
//! seeds and KV-cache reuse across chat turns.

use std::path::PathBuf;

use serde::Deserialize;
use strata::engine::batch::Session;
use strata::engine::sampler::SamplingParams;
use strata::engine::session::{Engine, FinishReason, GenerateRequest, RunOptions, TokenEvent};
use strata::engine::template::ChatMessage;

#[derive(Deserialize)]
struct Reference {
    dir: String,
    prompts: Vec<Prompt>,
}

#[derive(Deserialize)]
struct Prompt {
    ids: Vec<u32>,
    greedy: Vec<u32>,
}

fn load(name: &str) -> (Engine, Reference) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(format!("tests/fixtures/ref/{name}.json"))).unwrap();
    let r: Reference = serde_json::from_str(&text).unwrap();
    let engine =
        Engine::load(root.join(&r.dir).to_str().unwrap(), &RunOptions { threads: 2, ..Default::default() }).unwrap();
    (engine, r)
}

fn run(engine: &Engine, session: &mut Session, req: &GenerateRequest) -> (String, Vec<u32>, FinishReason) {
    let mut text = String::new();
    let summary = session
        .generate(engine, req, &|| false, |ev| {
            if let TokenEvent::Text(t) = ev {
                text.push_str(&t);
            }
            true
        })
        .unwrap();
    (text, summary.tokens, summary.finish)
}

fn greedy(prompt: &[u32], max_tokens: usize, stop: Vec<String>) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop,
        stop_at_eos: false,
        top_logprobs: 0,
        grammar: None,
        keep_special_tokens: false,
        speculative: Default::default(),
    }
}

#[test]
fn greedy_generation_equals_the_reference_and_streams_its_text() {
    for name in ["llama3", "mistral", "qwen2", "qwen3"] {
        let (e, r) = load(name);
        for p in &r.prompts {
            let mut s = Session::new(&e).unwrap();
            let (text, tokens, finish) = run(&e, &mut s, &greedy(&p.ids, p.greedy.len(), vec![]));
            assert_eq!(tokens, p.greedy, "{name}");
            assert_eq!(finish, FinishReason::Length);
            assert_eq!(text, e.tokenizer.decode(&p.greedy, true).unwrap(), "{name}: streamed text");
        }
    }
}

/// An end-of-sequence id from generation_config.json ends the answer. The fixture's
/// greedy continuation of its second prompt starts with `</s>` (488), which is not one of
/// its eos ids: a copy of the model that lists 488 among several eos ids must stop there.
#[test]
fn eos_ends_generation_with_stop() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (e, r) = load("llama_bf16_256");
    let p = &r.prompts[1];
    assert_eq!(p.greedy[0], 488);
    let (_, tokens, _) =
        run(&e, &mut Session::new(&e).unwrap(), &GenerateRequest { stop_at_eos: true, ..greedy(&p.ids, 4, vec![]) });
    assert_eq!(tokens.len(), 4, "488 is not an eos id of the fixture itself");

    let dir = std::env::temp_dir().join(format!("strata-eos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(root.join(&r.dir)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [481, 488]}"#).unwrap();
    let e = Engine::load(dir.to_str().unwrap(), &RunOptions { threads: 2, ..Default::default() }).unwrap();
    let req = GenerateRequest { stop_at_eos: true, ..greedy(&p.ids, 4, vec![]) };
    let (text, tokens, finish) = run(&e, &mut Session::new(&e).unwrap(), &req);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(tokens, [488]);
    assert_eq!(finish, FinishReason::Stop);
    assert_eq!(text, "");
}

#[test]
fn stop_strings_cut_the_text_before_them() {
    let (e, r) = load("qwen3");
    let p = &r.prompts[0];
    let full = e.tokenizer.decode(&p.greedy, true).unwrap();
    // A stop string that starts inside the text, spanning whatever tokens it spans.
    let cut = full.char_indices().map(|(i, _)| i).find(|&i| i >= full.len() / 2).unwrap();
    let stop: String = full[cut..].chars().take(3).collect();
    let first = full.find(&stop).unwrap();
    let (text, _, finish) =
        run(&e, &mut Session::new(&e).unwrap(), &greedy(&p.ids, p.greedy.len(), vec![stop.clone()]));
    assert_eq!(finish, FinishReason::Stop);
    assert_eq!(text, full[..first], "stop string {stop:?}");
}

#[test]
fn max_tokens_ends_with_length() {
    let (e, r) = load("qwen2");
    let (_, tokens, finish) = run(&e, &mut Session::new(&e).unwrap(), &greedy(&r.prompts[0].ids, 3, vec![]));
    assert_eq!(tokens.len(), 3);
    assert_eq!(finish, FinishReason::Length);
}

#[test]
fn same_seed_same_tokens_and_another_seed_differs() {
    let (e, r) = load("llama3");
    let sampled = |seed| {
        let sampling =
            SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, seed: Some(seed), ..SamplingParams::default() };
        let req = GenerateRequest {
            prompt: r.prompts[0].ids.clone(),
            max_tokens: 24,
            sampling,
            stop: vec![],
            stop_at_eos: false,
            top_logprobs: 0,
            grammar: None,
            keep_special_tokens: false,
            speculative: Default::default(),
        };
        run(&e, &mut Session::new(&e).unwrap(), &req).1
    };
    assert_eq!(sampled(7), sampled(7));
    assert_ne!(sampled(7), sampled(8));
}

/// A second turn that extends the first reuses the cached prefix and gives exactly
/// what a fresh session gives.
#[test]
fn chat_turns_reuse_the_cache_without_changing_the_answer() {
    let (e, _) = load("llama3");
    let mut messages = vec![ChatMessage::new("user", "Tell me about rivers.")];
    let mut session = Session::new(&e).unwrap();
    let first = e.tokenizer.encode_chat(&messages, true).unwrap();
    let (reply, _, _) = run(&e, &mut session, &greedy(&first, 6, vec![]));
    messages.push(ChatMessage::new("assistant", reply));
    messages.push(ChatMessage::new("user", "And lakes?"));
    let second = e.tokenizer.encode_chat(&messages, true).unwrap();
    assert!(second.starts_with(&first[..first.len() - 1]));
    let reused = run(&e, &mut session, &greedy(&second, 8, vec![]));
    let fresh = run(&e, &mut Session::new(&e).unwrap(), &greedy(&second, 8, vec![]));
    assert_eq!(reused.1, fresh.1);
}

#[test]
fn a_prompt_longer_than_the_context_is_an_error() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let opts = RunOptions { threads: 1, context: 8, ..Default::default() };
    let e = Engine::load(root.join("tests/fixtures/hf/qwen2").to_str().unwrap(), &opts).unwrap();
    let err = Session::new(&e).unwrap().generate(&e, &greedy(&[1; 20], 4, vec![]), &|| false, |_| true).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
}

/// A consumer that goes away stops the work within one layer step: once `cancelled`
/// answers true, no further layer is run, during prefill or during decode.
#[test]
fn cancellation_stops_within_one_layer() {
    use std::sync::atomic::Ordering;
    let (e, r) = load("llama3");
    let layers = || e.model.scheduler().stats().layer_requests.load(Ordering::Relaxed);
    let n_layers = e.model.config().n_layers as u64;
    // Cancel at the k-th check: during prefill (k = 2, inside the first pass) and during
    // decode (k = 3 * n_layers + 2: prefill plus two decode steps, then mid-layer-stack).
    for k in [2u64, 3 * n_layers + 2] {
        let checks = std::sync::atomic::AtomicU64::new(0);
        let cancelled = || checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 >= k;
        let before = layers();
        let summary = Session::new(&e)
            .unwrap()
            .generate(&e, &greedy(&r.prompts[0].ids, 50, vec![]), &cancelled, |_| true)
            .unwrap();
        assert_eq!(summary.finish, FinishReason::Cancelled);
        assert_eq!(layers() - before, k - 1, "layers run after cancellation at check {k}");
    }
}
