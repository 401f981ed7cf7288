//! Sequences and the step that advances all of them with one forward pass (DESIGN.md
//! §5b): each running sequence adds its next prompt chunk or its last sampled token to
//! the batch; after the pass, each one samples, detokenizes and checks its own stops.
//! A sequence owns everything it needs (KV cache, sampler, stop matcher, detokenizer,
//! grammar constraint); what it reports waits in its outbox until the caller drains it.
//!
//! A sequence under a grammar samples only the tokens the grammar allows. Its mask for
//! the next token depends only on the tokens it has committed, so [`step`] computes it on
//! another thread while the forward pass runs.

use std::time::{Duration, Instant};

use super::detok::DetokState;
use super::grammar::Constraint;
use super::sampler::{Sampler, log_softmax_at, top_logprobs};
use super::session::{
    Engine, FinishReason, GenerateError, GenerateRequest, GenerationSummary, PREFILL_CHUNK, TokenEvent,
};
use super::stop::StopMatcher;
use strata_backend::cpu::top_k_row;
use strata_model::decoder::{KvCache, LastOutput, ModelError, SeqStep};

pub mod plan;
mod spec;
use plan::{Feed, Need, StepBudget};
use spec::SeqSpec;
use strata_model::{PassRows, Readback};

/// One generation in progress.
pub struct Sequence {
    cache: KvCache,
    /// The tokens whose keys and values the cache holds.
    tokens: Vec<u32>,
    req: GenerateRequest,
    /// Prompt tokens in the cache (a reused prefix counts).
    fed: usize,
    /// The most likely tokens sampling needs (`None`: every logit).
    cut: Option<usize>,
    sampler: Sampler,
    /// The grammar its output must match, if the request has one.
    constraint: Option<Constraint>,
    detok: DetokState,
    stop: StopMatcher,
    generated: Vec<u32>,
    /// Prompt tokens the cache held when it started.
    cached: usize,
    /// The token sampled last, which the next step runs.
    pending: Option<u32>,
    finish: Option<FinishReason>,
    started: Instant,
    prefill: Option<Duration>,
    decode_start: Option<Instant>,
    decode: Duration,
    outbox: Vec<TokenEvent>,
    /// Why it ended early, when its own text went wrong.
    error: Option<GenerateError>,
    /// A hybrid model's linear-attention state as its prompt left it (taken when the
    /// prompt's last chunk ran), for [`into_cache`](Self::into_cache): that state cannot
    /// be cut back from the one after the answer.
    prompt_state: Option<(usize, Vec<Vec<f32>>)>,
    /// Its first token's output, already there: the request repeats exactly a prompt
    /// whose cache (and last output) it took over; the next step samples from it.
    ready: Option<LastOutput>,
    /// Its speculative decoding, when it speculates.
    spec: Option<SeqSpec>,
}

impl Sequence {
    /// Starts `req` on `cache`, which already holds the keys and values of `cached`
    /// (a previous exchange's tokens; the prefix it shares with the prompt is reused).
    pub fn new(engine: &Engine, cache: KvCache, cached: Vec<u32>, req: GenerateRequest) -> Result<Self, GenerateError> {
        check_prompt(engine, &cache, &req)?;
        let constraint = match &req.grammar {
            Some(spec) => Some(Constraint::new(spec, engine.token_env()?).map_err(GenerateError::Grammar)?),
            None => None,
        };
        Self::with_constraint(engine, cache, cached, req, constraint)
    }

    /// [`Sequence::new`] with `req.grammar` already compiled (on the thread that
    /// prepared the request): `constraint` is its state, `None` without a grammar.
    pub fn with_constraint(
        engine: &Engine,
        mut cache: KvCache,
        mut cached: Vec<u32>,
        req: GenerateRequest,
        constraint: Option<Constraint>,
    ) -> Result<Self, GenerateError> {
        check_prompt(engine, &cache, &req)?;
        let spec = engine.speculation.resolve(&req.speculative).map_err(GenerateError::Speculative)?;
        let vocab = engine.model.config().vocab_size;
        // A grammar may allow only tokens far down the list: it needs every logit.
        let cut = match constraint {
            Some(_) => None,
            None => req.sampling.candidates_needed(req.top_logprobs),
        };
        // Reuse the cached prefix, but run at least two prompt tokens (one alone would take
        // the decode kernel, and come out other than in a whole prompt: see `step`).
        // Where the backend's rows depend on how a prompt is cut, only the positions that
        // ran as a fresh prompt's chunks are reused. A prompt the cache holds exactly,
        // with the output its last row gave, runs nothing: that output is what a fresh
        // run computes (rows do not depend on the chunks here).
        let common = cached.iter().zip(&req.prompt).take_while(|(a, b)| a == b).count();
        let whole = common == req.prompt.len() && cache.len() == common && !engine.model.chunking_changes_rows();
        let ready = cache.kept_output().filter(|_| whole).and_then(|out| out_for(out, cut, vocab));
        let mut keep = match ready {
            Some(_) => common,
            None => common.min(req.prompt.len().saturating_sub(2)).min(cache.len()),
        };
        if engine.model.chunking_changes_rows() {
            keep = cache.grid_rows(keep);
        }
        cache.truncate(keep);
        // A linear-attention (hybrid) cache cannot go back: it may have emptied itself.
        let fed = cache.len();
        cached.truncate(fed);
        let detok = DetokState::new(!req.keep_special_tokens).with_prompt_context(&req.prompt);
        // A hybrid model's state at the prompt's end, for `into_cache` (no chunk runs).
        let prompt_state = ready.as_ref().and_then(|_| cache.states_snapshot()).map(|s| (fed, s));
        let spec = spec.map(|(kind, settings)| SeqSpec::new(kind, settings, &mut cache));
        Ok(Sequence {
            cache,
            tokens: cached,
            fed,
            cut,
            sampler: Sampler::new(req.sampling.clone()),
            constraint,
            detok,
            stop: StopMatcher::new(req.stop.clone()),
            generated: Vec::new(),
            cached: fed,
            pending: None,
            finish: None,
            started: Instant::now(),
            prefill: None,
            decode_start: None,
            decode: Duration::ZERO,
            outbox: Vec::new(),
            error: None,
            prompt_state,
            ready,
            spec,
            req,
        })
    }

    pub fn request(&self) -> &GenerateRequest {
        &self.req
    }

    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Bytes its KV cache holds now (its draft model's too).
    pub fn cache_bytes(&self) -> u64 {
        self.cache.allocated_bytes() + self.spec.as_ref().map_or(0, SeqSpec::cache_bytes)
    }

    /// Prompt tokens the cache held when it started.
    pub fn cached_len(&self) -> usize {
        self.cached
    }

    /// Tokens generated so far.
    pub fn generated_len(&self) -> usize {
        self.generated.len()
    }

    /// Prompt tokens still to run.
    pub fn prompt_left(&self) -> usize {
        self.req.prompt.len() - self.fed
    }

    /// Ends the sequence now (its consumer went away); it keeps what it has cached.
    pub fn cancel(&mut self) {
        if self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
            self.stop_clock();
        }
    }

    /// Ends the sequence now as a stop string would: its reply is complete (a reply's one
    /// tool call has ended). It keeps what it has cached.
    pub fn stop(&mut self) {
        if self.finish.is_none() {
            self.finish = Some(FinishReason::Stop);
            self.stop_clock();
        }
    }

    /// Ends the sequence as [`stop`](Self::stop) would have after its first `n`
    /// generated tokens: for a consumer that found its reply complete there, within a
    /// step that generated more (speculative decoding). The later tokens go, with their
    /// keys and values, as if never generated.
    pub fn stop_after(&mut self, n: usize) {
        if n < self.generated.len() {
            self.generated.truncate(n);
            // The cache holds the generated tokens that ran: all but the last sampled.
            self.tokens.truncate(self.fed + n.saturating_sub(1));
            self.cache.truncate(self.tokens.len());
            self.tokens.truncate(self.cache.len());
            self.pending = None;
            // How a later token ended it (a stop string, the length) is not how it ends.
            self.finish = None;
            self.stop = StopMatcher::new(Vec::new());
        }
        self.stop();
    }

    /// What it reported since the last call, in order.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, TokenEvent> {
        self.outbox.drain(..)
    }

    /// The error that ended it, if one did (taken once).
    pub fn take_error(&mut self) -> Option<GenerateError> {
        self.error.take()
    }

    /// How it ended, once finished.
    pub fn summary(&self) -> Option<GenerationSummary> {
        let finish = self.finish?;
        Some(GenerationSummary {
            finish,
            prompt_tokens: self.req.prompt.len(),
            completion_tokens: self.generated.len(),
            cached_tokens: self.cached,
            stop_sequence: self.stop.matched_stop().map(str::to_string),
            prefill: self.prefill.unwrap_or_else(|| self.started.elapsed()),
            decode: self.decode,
            tokens: self.generated.clone(),
            speculative: self.spec.as_ref().map(|s| s.counts).unwrap_or_default(),
        })
    }

    /// Its cache and the tokens it holds, for a later request to continue from: its
    /// prompt's only. The generated tokens' keys and values came from the decode kernel;
    /// a prompt that contains them runs them again, so that it computes exactly what it
    /// would on a fresh cache. (A hybrid model's linear-attention state cannot be cut
    /// back to the prompt: the state the prompt left is put back instead, or the cache
    /// comes back empty when there is none.)
    pub fn into_cache(mut self) -> (KvCache, Vec<u32>) {
        // The draft model's cache goes with it, as it is (it knows the tokens it holds).
        if let Some(draft) = self.spec.as_mut().and_then(SeqSpec::take_draft) {
            self.cache.draft = Some(draft);
        }
        let prompt = self.fed.min(self.tokens.len());
        match self.prompt_state.take() {
            Some((len, states)) if len == prompt => self.cache.restore_states(len, states),
            _ => self.cache.truncate(prompt),
        }
        self.tokens.truncate(self.cache.len());
        (self.cache, self.tokens)
    }

    fn stop_clock(&mut self) {
        if let Some(t) = self.decode_start {
            self.decode = t.elapsed();
        }
    }

    /// What it asks of the next step ([`plan::plan`]).
    fn need(&self) -> Need {
        match (self.finish, self.prompt_left(), self.pending) {
            (Some(_), ..) => Need::Nothing,
            (None, 0, Some(_)) => Need::Decode { at: self.cache.len() },
            (None, 0, None) => Need::Nothing,
            (None, left, _) => Need::Prompt { at: self.fed, left },
        }
    }

    /// After a pass that gave it logits (or its top entries) for its last token.
    ///
    /// Under a grammar, the token is sampled among those the grammar allows, but the
    /// log-probabilities reported (its own and the alternatives') are the model's, over
    /// every token, as llama.cpp's server reports them: they say how far the grammar
    /// steered the model.
    fn advance(&mut self, engine: &Engine, next: LastOutput) -> Result<(), GenerateError> {
        if self.prefill.is_none() {
            self.prefill = Some(self.started.elapsed());
            self.decode_start = Some(Instant::now());
        }
        if self.generated.len() >= self.req.max_tokens {
            self.finish = Some(FinishReason::Length);
            return self.finish_text(engine);
        }
        if !finite(&next) {
            return Err(GenerateError::Model(ModelError::NonFiniteLogits));
        }
        let (id, logprob, top) = match &next {
            LastOutput::Logits(logits) => {
                let id = match &mut self.constraint {
                    None => self.sampler.sample(logits, &self.tokens),
                    Some(c) => {
                        let mask = c.allowed().map_err(GenerateError::Grammar)?;
                        self.sampler
                            .sample_among(logits, &self.tokens, mask.iter())
                            .ok_or_else(|| GenerateError::Grammar("the grammar allows no token here".into()))?
                    }
                };
                let logprob = log_softmax_at(logits, id as usize);
                let top = match self.req.top_logprobs {
                    0 => Vec::new(),
                    n => top_logprobs(logits, n),
                };
                (id, logprob, top)
            }
            LastOutput::Top(t) => {
                // A constrained sequence asks for every logit (its `cut` is `None`).
                debug_assert!(self.constraint.is_none(), "a constrained sequence got only the top logits");
                let id = self.sampler.sample_top(t);
                let lp = |l: f32| (l as f64 - t.lse as f64) as f32;
                let logprob = t.ids.iter().position(|&i| i == id).map_or(f32::NEG_INFINITY, |at| lp(t.logits[at]));
                let top = t.ids.iter().zip(&t.logits).take(self.req.top_logprobs).map(|(&i, &l)| (i, lp(l))).collect();
                (id, logprob, top)
            }
        };
        if let Some(c) = &mut self.constraint {
            c.commit(id).map_err(GenerateError::Grammar)?;
        }
        self.generated.push(id);
        self.outbox.push(TokenEvent::Token { id, logprob, top });
        // A grammar allows an end-of-sequence token only where it is complete.
        if (self.req.stop_at_eos || self.constraint.is_some()) && engine.tokenizer.is_eos(id) {
            self.finish = Some(FinishReason::Stop);
            return self.finish_text(engine);
        }
        let text = self.detok.push(&*engine.tokenizer, id)?;
        if self.emit(text) {
            self.finish = Some(FinishReason::Stop);
            self.stop_clock();
            return Ok(());
        }
        // A complete grammar allows only an end-of-sequence token: it ends here, as that
        // token would.
        if self.constraint.as_ref().is_some_and(Constraint::is_done) {
            self.finish = Some(FinishReason::Stop);
            return self.finish_text(engine);
        }
        // Running the token needs one more position; past `max_tokens` it is not run.
        if self.generated.len() >= self.req.max_tokens || self.tokens.len() + 1 >= self.cache.capacity() {
            self.finish = Some(FinishReason::Length);
            return self.finish_text(engine);
        }
        self.pending = Some(id);
        Ok(())
    }

    /// Passes text through the stop matcher into the outbox; true when a stop string
    /// ended it.
    fn emit(&mut self, text: String) -> bool {
        let step = self.stop.push(&text);
        if !step.emit.is_empty() {
            self.outbox.push(TokenEvent::Text(step.emit));
        }
        step.stopped
    }

    /// The text held back (an unfinished character, a possible stop string's start).
    fn finish_text(&mut self, engine: &Engine) -> Result<(), GenerateError> {
        self.stop_clock();
        let tail = self.detok.flush(&*engine.tokenizer)?;
        if self.emit(tail) {
            self.finish = Some(FinishReason::Stop);
        } else {
            let rest = std::mem::replace(&mut self.stop, StopMatcher::new(Vec::new())).finish();
            if !rest.is_empty() {
                self.outbox.push(TokenEvent::Text(rest));
            }
        }
        Ok(())
    }
}

/// Whether `req`'s prompt can start on `cache`: not empty, shorter than the context, every
/// id in the vocabulary.
fn check_prompt(engine: &Engine, cache: &KvCache, req: &GenerateRequest) -> Result<(), GenerateError> {
    let capacity = cache.capacity();
    if req.prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if req.prompt.len() >= capacity {
        return Err(GenerateError::PromptTooLong { tokens: req.prompt.len(), context: capacity });
    }
    let vocab = engine.model.config().vocab_size;
    match req.prompt.iter().find(|&&t| t as usize >= vocab) {
        Some(&id) => Err(ModelError::BadToken { id, vocab }.into()),
        None => Ok(()),
    }
}

/// Whether a pass's output can be sampled from: no NaN and no +infinity among the logits,
/// and at least one finite one (a masked logit may be -infinity). One pass over the row.
fn finite(out: &LastOutput) -> bool {
    match out {
        LastOutput::Logits(row) => {
            let mut any = false;
            for &x in row {
                if x.is_nan() || x == f32::INFINITY {
                    return false;
                }
                any |= x.is_finite();
            }
            any
        }
        // The top entries skip NaN; a row of NaN has a -infinity log-sum-exp.
        LastOutput::Top(t) => t.lse.is_finite() && t.logits.iter().all(|x| x.is_finite()),
    }
}

/// `out` as a sequence whose cut is `cut` sees it: its own number of top entries, or
/// every logit (see [`step`]).
fn cut_output(out: LastOutput, cut: Option<usize>) -> LastOutput {
    match (out, cut) {
        (LastOutput::Top(mut t), Some(k)) => {
            t.ids.truncate(k);
            t.logits.truncate(k);
            LastOutput::Top(t)
        }
        (LastOutput::Logits(l), Some(k)) => LastOutput::Top(top_k_row(&l, k)),
        (out, None) => out,
    }
}

/// A prompt's kept last output as a sequence whose cut is `cut` sees it, or `None` when
/// it holds less than that sequence needs.
fn out_for(out: &LastOutput, cut: Option<usize>, vocab: usize) -> Option<LastOutput> {
    let enough = match (out, cut) {
        (LastOutput::Logits(_), _) => true,
        (LastOutput::Top(t), Some(k)) => t.ids.len() >= k.min(vocab),
        (LastOutput::Top(_), None) => false,
    };
    enough.then(|| cut_output(out.clone(), cut))
}

/// Advances every unfinished sequence in `seqs` by one forward pass: each decoding one
/// runs its last sampled token, and the prefilling ones a slice of their prompt, as
/// [`plan::plan`] shares the step's rows out ([`StepBudget::new`]: whole chunks of
/// `prefill_chunk` tokens for prompts alone, about [`plan::WAITING_STEP_TOKENS`] rows
/// while a sequence decodes or a short prompt is about to answer). Returns the number
/// of sequences that ran. A sequence that starts from a kept prompt output (see
/// [`Sequence::new`]) samples its first token from it instead, and the step ends there:
/// it returns how many did.
///
/// A sequence computes exactly what it would alone. Where its rows depend on how a
/// prompt is cut (a backend's kernels chosen by row count, a mixture of experts: see
/// [`StepBudget::new`]), its prompt is cut into the same chunks whatever else runs;
/// elsewhere (a dense model on the CPU: a prompt's rows take the GEMM, whatever their
/// count) its slices follow the budget, but never a slice of one row, which would take
/// the decode kernel.
/// Sampling sees only its own cut of the logits, and the backend keeps sequences apart
/// in its row-count-dependent kernels
/// ([`Backend::matmul_seqs`](strata_backend::Backend::matmul_seqs)), which is why the
/// one-row sequences come first in the pass.
///
/// An error of the pass itself (a device failure, `cancelled`) ends every sequence in
/// it; a sequence's own text error ends only that one. `cancelled` is checked before
/// every layer.
pub fn step(
    engine: &Engine,
    seqs: &mut [&mut Sequence],
    prefill_chunk: usize,
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<usize, ModelError> {
    let chunk = prefill_chunk.max(1);
    // Sequences whose first output is already there sample it now; this step ends
    // there, so that their first tokens go out without waiting for a pass.
    let mut readied = 0;
    for seq in seqs.iter_mut() {
        if let Some(next) = seq.ready.take().filter(|_| !seq.is_finished()) {
            readied += 1;
            if let Err(e) = seq.advance(engine, next) {
                seq.cancel();
                seq.error = Some(e);
            }
        }
    }
    if readied > 0 {
        return Ok(readied);
    }
    let needs: Vec<Need> = seqs.iter().map(|s| s.need()).collect();
    let budget = StepBudget::new(engine.model.config(), chunk, engine.model.chunking_changes_rows());
    let feeds = plan::plan(&needs, &budget);
    let rows = |f: &Feed| match *f {
        Feed::Prompt { n, .. } => n,
        Feed::Decode => 1,
    };
    // One-row sequences first, then the others, each in the order given.
    let mut ran: Vec<usize> = (0..seqs.len()).filter(|&i| feeds[i].is_some()).collect();
    ran.sort_by_key(|&i| feeds[i].as_ref().map_or(0, rows) != 1);
    if ran.is_empty() {
        return Ok(0);
    }
    // Sampling after this pass: the most likely entries (as many as the widest request
    // needs) when every sequence samples from those; every logit if any sequence needs
    // them all, and then the top entries beside them for the others, as the backend
    // selects them (what they get alone).
    let sampling = |i: usize| matches!(feeds[i], Some(Feed::Decode | Feed::Prompt { last: true, .. }));
    let cuts: Vec<Option<usize>> = ran.iter().filter(|&&i| sampling(i)).map(|&i| seqs[i].cut).collect();
    let widest = cuts.iter().flatten().copied().max();
    let all_cut = cuts.iter().all(Option::is_some);
    let ran_cut: Vec<bool> = ran.iter().map(|&i| seqs[i].cut.is_some()).collect();
    // Speculating sequences draft the tokens after their pending one; a pass verifies
    // them with it.
    let decoding: Vec<usize> = ran.iter().copied().filter(|&i| matches!(feeds[i], Some(Feed::Decode))).collect();
    let draft_ns = spec::draft(engine, seqs, &decoding, cancelled)?;
    let inputs: Vec<Vec<u32>> = ran
        .iter()
        .map(|&i| match feeds[i] {
            Some(Feed::Prompt { n, .. }) => seqs[i].req.prompt[seqs[i].fed..seqs[i].fed + n].to_vec(),
            _ => seqs[i].pending.into_iter().chain(seqs[i].proposal().iter().copied()).collect(),
        })
        .collect();
    let verifying: Vec<bool> = ran.iter().map(|&i| !seqs[i].proposal().is_empty()).collect();
    let speculates: Vec<bool> = seqs.iter().map(|s| s.spec.is_some()).collect();
    let mut outs: Vec<Vec<LastOutput>> = {
        let mut by_index: Vec<Option<&mut Sequence>> = seqs.iter_mut().map(|s| Some(&mut **s)).collect();
        let mut batch: Vec<SeqStep<'_>> = Vec::with_capacity(ran.len());
        // The grammars whose next mask this pass's sampling needs.
        let mut masks: Vec<&mut Constraint> = Vec::new();
        for ((&i, tokens), &verify) in ran.iter().zip(&inputs).zip(&verifying) {
            let seq = by_index[i].take().expect("each sequence runs once");
            if sampling(i)
                && let Some(c) = seq.constraint.as_mut()
            {
                masks.push(c);
            }
            batch.push(SeqStep { tokens, cache: &mut seq.cache, all_logits: false, verify });
        }
        let rows_run: usize = inputs.iter().map(Vec::len).sum();
        let speculating = decoding.iter().any(|&i| speculates[i]);
        let readback = match (widest, all_cut) {
            (Some(k), true) => Readback::Top(k),
            (Some(k), false) => Readback::Both(k),
            (None, _) => Readback::Full,
        };
        let result = std::thread::scope(|scope| {
            // The masks are computed while the pass runs; an error stays in its
            // constraint, for `advance` to report. Without a thread, `advance` computes
            // them after the pass.
            if !masks.is_empty() {
                let _ = std::thread::Builder::new().name("grammar-mask".into()).spawn_scoped(scope, move || {
                    for c in masks {
                        let _ = c.allowed();
                    }
                });
            }
            let started = Instant::now();
            let rows = engine.model.forward_rows(&mut batch, readback, cancelled);
            // A speculating decoding pass's time against its rows, for the cost rule of
            // drafting.
            if decoding.len() == ran.len() && speculating {
                engine.speculation.stats.note_pass(rows_run, started.elapsed().as_nanos() as u64);
            }
            rows
        });
        drop(batch);
        match result {
            Ok(rows) => split_rows(rows, readback, &ran_cut, engine.model.config().vocab_size),
            Err(e) => {
                for &i in &ran {
                    seqs[i].cancel();
                }
                return Err(e);
            }
        }
    };
    let mut counts = crate::speculative::SpecCounts::default();
    let mut rejections = 0;
    for ((&i, tokens), &verify) in ran.iter().zip(&inputs).zip(&verifying).rev() {
        let mut out = outs.pop().expect("outputs for each running sequence");
        let seq = &mut *seqs[i];
        if verify {
            let (got, rejected) = spec::accept(engine, seq, tokens, out);
            counts.add(got);
            rejections += rejected as u64;
            continue;
        }
        let out = out.pop().expect("one output per running sequence");
        seq.tokens.extend_from_slice(tokens);
        match feeds[i] {
            Some(Feed::Prompt { n, last }) => {
                seq.cache.note_prompt_chunk(seq.fed, n, chunk);
                seq.fed += n;
                if !last {
                    continue;
                }
                seq.prompt_state = seq.cache.states_snapshot().map(|s| (seq.fed, s));
            }
            _ => seq.pending = None,
        }
        // Each sequence sees exactly what it would see alone: its own cut of the
        // entries, or entries selected from every logit.
        let next = cut_output(out, seq.cut);
        if matches!(feeds[i], Some(Feed::Prompt { .. })) {
            // For a request that repeats this prompt (`Sequence::new`).
            seq.cache.keep_output(next.clone());
        }
        if let Err(e) = seq.advance(engine, next) {
            seq.cancel();
            seq.error = Some(e);
        }
    }
    if counts.steps > 0 || draft_ns > 0 {
        engine.speculation.stats.add(counts, draft_ns);
        engine.speculation.stats.note_rejections(rejections);
    }
    Ok(ran.len())
}

/// A pass's rows as each sequence's outputs, in the order of the pass: with
/// [`Readback::Both`], the top entries for a sequence that samples from them (`cut`)
/// and every logit for the others.
fn split_rows(rows: PassRows, readback: Readback, cut: &[bool], vocab: usize) -> Vec<Vec<LastOutput>> {
    let PassRows { logits, counts, top } = rows;
    let mut top = top.into_iter();
    let mut row = 0;
    counts
        .iter()
        .zip(cut)
        .map(|(&n, &cut)| {
            (0..n)
                .map(|_| {
                    let logits = || logits[row * vocab..(row + 1) * vocab].to_vec();
                    let out = match (readback, cut) {
                        (Readback::Full, _) => LastOutput::Logits(logits()),
                        (Readback::Top(_), _) | (Readback::Both(_), true) => {
                            LastOutput::Top(top.next().unwrap_or_else(strata_backend::TopK::empty))
                        }
                        (Readback::Both(_), false) => {
                            let _ = top.next();
                            LastOutput::Logits(logits())
                        }
                    };
                    row += 1;
                    out
                })
                .collect()
        })
        .collect()
}

/// A conversation's state: its tokens and their KV cache. A new prompt that extends
/// the previous one reuses the cached prefix. It runs the step loop of
/// [`super::batch`] with one sequence.
pub struct Session {
    /// The cache and the tokens it holds (`None` after a failed request: the next one
    /// starts afresh).
    held: Option<(KvCache, Vec<u32>)>,
    capacity: usize,
}

impl Session {
    pub fn new(engine: &Engine) -> Result<Self, ModelError> {
        Self::with_capacity(engine, engine.context_len)
    }

    /// A session whose context holds `capacity` tokens.
    pub fn with_capacity(engine: &Engine, capacity: usize) -> Result<Self, ModelError> {
        Ok(Session { held: Some((engine.model.new_cache(capacity)?, Vec::new())), capacity })
    }

    pub fn context_len(&self) -> usize {
        self.capacity
    }

    /// Generates a continuation of `req.prompt`. `on_event` returns false to stop early;
    /// `cancelled` is also checked before every layer, so a consumer that went away stops
    /// the work within one layer step.
    pub fn generate(
        &mut self,
        engine: &Engine,
        req: &GenerateRequest,
        cancelled: &(dyn Fn() -> bool + Sync),
        mut on_event: impl FnMut(TokenEvent) -> bool,
    ) -> Result<GenerationSummary, GenerateError> {
        let (cache, tokens) = match self.held.take() {
            Some(held) => held,
            None => (engine.model.new_cache(self.capacity)?, Vec::new()),
        };
        let mut seq = Sequence::new(engine, cache, tokens, req.clone())?;
        while !seq.is_finished() {
            match step(engine, &mut [&mut seq], PREFILL_CHUNK, cancelled) {
                Ok(_) | Err(ModelError::Cancelled) => {}
                Err(e) => return Err(e.into()),
            }
            let gone = seq.drain_events().any(|ev| !on_event(ev));
            if gone {
                seq.cancel();
            }
            if let Some(e) = seq.take_error() {
                return Err(e);
            }
        }
        let summary = seq.summary().expect("a finished sequence has a summary");
        self.held = Some(seq.into_cache());
        Ok(summary)
    }
}
