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

use strata::backend::KvType;
use strata::backend::device::DeviceSpec;
use strata::engine::batch::plan::WAITING_STEP_TOKENS;
use strata::engine::batch::{self, Sequence};
use strata::engine::sampler::SamplingParams;
use strata::engine::session::{Engine, GenerateRequest, RunOptions, TokenEvent};
use strata::model::decoder::KvCache;

const CHUNK: usize = 16;

/// The repository: where this was built, or the working directory (a copy elsewhere,
/// as on the GPU machine `tools/gpu_check.sh run` uses).
fn root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match built.join("tests/fixtures").exists() {
        true => built,
        false => std::env::current_dir().unwrap(),
    }
}

fn engine(fixture: &str) -> Engine {
    engine_with(fixture, KvType::F32)
}

fn engine_with(fixture: &str, kv: KvType) -> Engine {
    let path = root().join("tests/fixtures").join(fixture);
    let opts =
        RunOptions { threads: 2, context: 256, kv_type: Some(kv), device: DeviceSpec::Auto, ..Default::default() };
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
            grammar: None,
            keep_special_tokens: false,
            speculative: Default::default(),
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

/// Runs `seq` alone to its end.
fn run_out(e: &Engine, seq: &mut Sequence) -> Trace {
    let mut trace = Trace::default();
    while !seq.is_finished() {
        batch::step(e, &mut [&mut *seq], CHUNK, &|| false).unwrap();
        record(seq, &mut trace);
    }
    trace
}

fn alone(e: &Engine, req: &GenerateRequest) -> Trace {
    let cache = e.model.new_cache(e.context_len).unwrap();
    run_out(e, &mut Sequence::new(e, cache, Vec::new(), req.clone()).unwrap())
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
    check_with(fixture, KvType::F32)
}

fn check_with(fixture: &str, kv: KvType) {
    let e = engine_with(fixture, kv);
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
fn f16_and_q8_0_kv_caches_give_each_sequence_what_it_gets_alone() {
    check_with("gguf/llama3.q4_0.gguf", KvType::F16);
    check_with("hf/llama3", KvType::Q8_0);
}

/// A compact KV cache costs only its rounding: on the F32 fixture, log-probs stay close
/// to the f32 cache's.
#[test]
fn compact_kv_caches_stay_close_to_f32() {
    let reference = engine("hf/llama3");
    let mut greedy = requests(reference.model.config().vocab_size as u32)[3].clone();
    greedy.top_logprobs = 0;
    greedy.sampling = SamplingParams::greedy();
    let want = alone(&reference, &greedy);
    for (kv, tol) in [(KvType::F16, 1e-2), (KvType::Q8_0, 5e-2)] {
        let got = alone(&engine_with("hf/llama3", kv), &greedy);
        let lp = |t: &Trace| t.0.iter().map(|(_, l, _)| f32::from_bits(*l)).collect::<Vec<_>>();
        // The first token: the same prompt, only the cache's rounding differs.
        let (a, b) = (lp(&got)[0], lp(&want)[0]);
        assert!((a - b).abs() < tol, "{kv:?}: first log-prob {a} vs {b}");
        assert_ne!(got, want, "{kv:?} changed nothing: is the cache really stored as {kv:?}?");
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

/// Mixture-of-experts layers route and run each sequence's rows per sequence (the router,
/// the shared expert and every expert's rows), and Qwen3-Next's linear-attention layers
/// carry each sequence's state: both as alone.
#[test]
fn moe_and_hybrid_models_give_each_sequence_what_it_gets_alone() {
    for fixture in
        ["gguf/qwen2_moe.q8_0.gguf", "gguf/mixtral.f32.gguf", "hf/qwen3_next", "hf/qwen3_5", "hf/qwen3_5_moe"]
    {
        check(fixture);
    }
}

/// A follow-up request reuses the prompt part of a finished sequence's cache and still
/// computes what it computes on a fresh cache; a hybrid model's too, from the
/// linear-attention state its prompt left (kept when the prompt's last chunk ran).
#[test]
fn a_reused_prefix_gives_what_a_fresh_cache_gives() {
    for fixture in ["gguf/llama3.q4_0.gguf", "hf/qwen3_5"] {
        reused_prefix(fixture);
    }
}

fn reused_prefix(fixture: &str) {
    let e = engine(fixture);
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
    assert_eq!(cached, first.prompt, "{fixture}: only the prompt's keys and values are kept");
    // The conversation goes on: the old prompt, the answer, and more.
    let mut next = first.clone();
    next.prompt.extend(trace.0.iter().map(|t| t.0));
    next.prompt.extend(&reqs[2].prompt);
    // Where the backend's rows depend on how a prompt is cut (CUDA: more than 8 rows
    // take the GEMM), only what ran as a fresh prompt's chunks is reused: 48 of the 61
    // positions here. A hybrid model's state cannot go back from 61 to 48: it runs all.
    assert_eq!((first.prompt.len(), cache.grid_rows(usize::MAX), cache.grid_rows(47)), (61, 48, 32), "{fixture}");
    let hybrid = e.model.config().linear_attn.is_some();
    let reusable = |cache: &KvCache, limit: usize| match e.model.chunking_changes_rows() {
        false => limit,
        true if hybrid && cache.grid_rows(limit) < cache.len() => 0,
        true => cache.grid_rows(limit),
    };
    let kept = reusable(&cache, first.prompt.len());
    let mut reused = Sequence::new(&e, cache, cached, next.clone()).unwrap();
    assert_eq!(reused.prompt_left(), next.prompt.len() - kept, "{fixture}: the prefix is reused");
    let got = run_out(&e, &mut reused);
    let fresh = alone(&e, &next);
    assert!(got == fresh, "{fixture}: reusing the prefix changed the answer");
    eprintln!("{}: {fixture}: {kept} of {} prompt positions reused", e.device.device, next.prompt.len());
    // The same prompt again runs nothing where rows do not depend on the chunking: its
    // first token comes from the output the prompt's last row gave, kept with the cache
    // (a hybrid model's state too). Elsewhere it runs at least two tokens (never one
    // alone), and a hybrid model, whose state cannot go back, the whole prompt.
    let (cache, cached) = reused.into_cache();
    let kept = match (e.model.chunking_changes_rows(), hybrid) {
        (false, _) => next.prompt.len(),
        (true, true) => 0,
        (true, false) => reusable(&cache, next.prompt.len() - 2),
    };
    let mut again = Sequence::new(&e, cache, cached, next.clone()).unwrap();
    assert_eq!(again.prompt_left(), next.prompt.len() - kept, "{fixture}");
    let got = run_out(&e, &mut again);
    assert!(got == fresh, "{fixture}: the repeated prompt's answer differs from a fresh run's");
    // And once more, from the cache that answer left (the prompt's state kept again).
    let (cache, cached) = again.into_cache();
    let mut third = Sequence::new(&e, cache, cached, next.clone()).unwrap();
    assert_eq!(third.prompt_left(), next.prompt.len() - kept, "{fixture}: the third run reuses as much");
    let got = run_out(&e, &mut third);
    assert!(got == fresh, "{fixture}: the third answer differs from a fresh run's");
}

/// A short request admitted while a long prompt prefills gets its first token at the
/// step it joins, and a token every step after: while it decodes, the long prompt
/// advances in slices that fit the waiting budget beside it, then in whole chunks again.
#[test]
fn a_short_request_is_not_kept_behind_a_long_prompt() {
    let path = root().join("tests/fixtures/hf/llama3");
    let e =
        Engine::load(path.to_str().unwrap(), &RunOptions { threads: 2, context: 2304, ..Default::default() }).unwrap();
    let reqs = requests(e.model.config().vocab_size as u32);
    let mut long = reqs[3].clone();
    long.prompt = long.prompt.iter().copied().cycle().take(2048).collect();
    let chunk = 512;
    let mut seqs = vec![Sequence::new(&e, e.model.new_cache(e.context_len).unwrap(), Vec::new(), long).unwrap()];
    let step = |seqs: &mut Vec<Sequence>| {
        let before = seqs[0].prompt_left();
        batch::step(&e, &mut seqs.iter_mut().collect::<Vec<_>>(), chunk, &|| false).unwrap();
        before - seqs[0].prompt_left()
    };
    assert_eq!(step(&mut seqs), chunk, "alone, a whole chunk");
    // The short one joins: it prefills and samples in this very step.
    seqs.push(Sequence::new(&e, e.model.new_cache(e.context_len).unwrap(), Vec::new(), reqs[1].clone()).unwrap());
    let ran = step(&mut seqs);
    assert_eq!(seqs[1].prompt_left(), 0);
    assert!(seqs[1].drain_events().any(|ev| matches!(ev, TokenEvent::Token { .. })), "a first token at once");
    assert!(ran + reqs[1].prompt.len() <= WAITING_STEP_TOKENS, "beside the short prompt, {ran} rows of the long one");
    // While it decodes, a token every step, each beside a slice of the long prompt.
    while !seqs[1].is_finished() {
        let ran = step(&mut seqs);
        assert!((2..WAITING_STEP_TOKENS).contains(&ran), "{ran} rows of the long prompt beside a decode");
        assert!(seqs[1].drain_events().any(|ev| matches!(ev, TokenEvent::Token { .. })), "a token every step");
    }
    seqs.pop();
    let left = seqs[0].prompt_left();
    assert!(left > chunk, "the long prompt is still there: {left} tokens");
    assert_eq!(step(&mut seqs), chunk, "alone again, whole chunks");
}

mod worker {
    //! The step loop inside the worker: places, KV memory and cancellation.

    use std::time::{Duration, Instant};

    use strata::engine::sampler::SamplingParams;
    use strata::engine::session::RunOptions;
    use strata::queue::worker::WorkerConfig;
    use strata::queue::{Event, GenerateJob, JobDone, JobError, KeepAlive, PromptInput, Work};
    use strata::server::{AppState, ServeOptions, ServerConfig};
    use tokio::sync::mpsc::UnboundedReceiver;

    fn server(parallel: usize, context: usize, kv_memory: Option<u64>) -> AppState {
        let model = super::root().join("tests/fixtures/hf/llama3").to_string_lossy().into_owned();
        let opts = ServeOptions {
            models: vec![("llama3".into(), model)],
            worker: WorkerConfig {
                run: RunOptions { threads: 1, context, ..Default::default() },
                keep_alive: KeepAlive::For(Duration::from_secs(300)),
                max_loaded: 1,
                parallel: Some(parallel),
                prefill_chunk: 64,
                kv_memory,
                drafts: Default::default(),
            },
            server: ServerConfig::default(),
            queue_depth: 16,
            preload: true,
        };
        strata::server::start(opts).expect("starting the server").1
    }

    fn job(prompt: usize, max_tokens: Option<usize>) -> Work {
        Work::Generate(GenerateJob {
            model: "llama3".into(),
            prompt: PromptInput::Tokens((0..prompt as u32).map(|i| 10 + i % 400).collect()),
            context: Vec::new(),
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            top_logprobs: 0,
            num_ctx: None,
            keep_alive: None,
            tools: None,
            grammar: None,
            grammar_param: "grammar",
            messages_param: "messages",
            count_only: false,
            template_vars: Default::default(),
            split_reasoning: false,
            sparse_ffn: None,
            truncate: None,
            speculative: Default::default(),
        })
    }

    /// The events up to the end: the `Done`, or the error.
    fn finish(rx: &mut UnboundedReceiver<Event>) -> Result<JobDone, JobError> {
        loop {
            match rx.blocking_recv().expect("the worker answers") {
                Event::Done(d) => return Ok(d),
                Event::Error(e) => return Err(e),
                _ => {}
            }
        }
    }

    #[test]
    fn a_cancelled_requests_place_goes_to_the_next() {
        let state = server(1, 4096, None);
        // Alone, a request that runs to the end of its context takes this long.
        let t = Instant::now();
        let alone = finish(&mut state.queue.submit(job(8, None)).unwrap()).unwrap();
        let full = t.elapsed();
        assert!(alone.completion_tokens > 1000, "{alone:?}");
        // Started again and dropped after its first token, its place goes to the next
        // request at once, not after it would have ended.
        let mut a = state.queue.submit(job(9, None)).unwrap();
        while !matches!(a.blocking_recv(), Some(Event::Token { .. })) {}
        let t = Instant::now();
        drop(a);
        let b = finish(&mut state.queue.submit(job(5, Some(3))).unwrap()).unwrap();
        assert_eq!(b.completion_tokens, 3);
        assert!(
            t.elapsed() < full / 2,
            "the next request waited {:?}; the dropped one ran {full:?} alone",
            t.elapsed()
        );
        let loaded = state.status.loaded.lock().unwrap().clone();
        assert_eq!((loaded[0].batching.running, loaded[0].batching.waiting), (0, 0));
    }

    #[test]
    fn kv_memory_makes_a_request_wait_or_refuses_one_that_can_never_fit() {
        // Room for 100 positions of the fixture's KV cache (2 layers × 2 KV heads × 16 × 4
        // bytes, keys and values).
        let position = 2 * 2 * 2 * 16 * 4;
        let state = server(8, 256, Some(100 * position));
        match finish(&mut state.queue.submit(job(10, Some(200))).unwrap()) {
            Err(JobError::Invalid { param: Some("max_tokens"), message }) => {
                assert!(message.contains("210 positions") && message.contains("100 positions"), "{message}")
            }
            other => panic!("expected a 400 naming the sizes, got {other:?}"),
        }
        // Two requests of 60 positions each: the second waits for the first.
        // `waited` runs from b's submission, which a busy machine may delay while a is
        // already decoding: the time between the two submissions is counted as waited.
        let submitting = Instant::now();
        let (mut a, mut b) =
            (state.queue.submit(job(10, Some(50))).unwrap(), state.queue.submit(job(12, Some(48))).unwrap());
        let between = submitting.elapsed();
        let (a, b) = (finish(&mut a).unwrap(), finish(&mut b).unwrap());
        assert_eq!((a.completion_tokens, b.completion_tokens), (50, 48));
        let waited = b.total - b.prefill - b.decode + between;
        assert!(waited >= a.decode, "the second waited {waited:?}; the first decoded for {:?}", a.decode);
        // Its prompt counts too, known only once it is tokenized: 50 positions running, and
        // 40 + 20 more would not fit beside them.
        let submitting = Instant::now();
        let (mut a, mut b) =
            (state.queue.submit(job(10, Some(40))).unwrap(), state.queue.submit(job(40, Some(20))).unwrap());
        let between = submitting.elapsed();
        let (a, b) = (finish(&mut a).unwrap(), finish(&mut b).unwrap());
        assert_eq!((a.completion_tokens, b.completion_tokens), (40, 20));
        let waited = b.total - b.prefill - b.decode + between;
        assert!(waited >= a.decode, "the long prompt waited {waited:?}; the first decoded for {:?}", a.decode);
        let loaded = state.status.loaded.lock().unwrap().clone();
        assert_eq!((loaded[0].batching.running, loaded[0].batching.waiting), (0, 0));
    }
}
