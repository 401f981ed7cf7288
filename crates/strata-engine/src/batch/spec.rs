//! A sequence's speculative decoding inside the step (see [`crate::speculative`]):
//! drafting before the pass, keeping what the sequence samples after it.

use std::time::Instant;

use super::{Sequence, cut_output};
use crate::session::{Engine, PREFILL_CHUNK};
use crate::speculative::{SpecCounts, SpecKind, SpecSettings, ngram_draft};
use strata_model::decoder::{KvCache, LastOutput, ModelError, SeqStep};

/// What a sequence speculates with, and what it has drafted.
pub(super) struct SeqSpec {
    kind: SpecKind,
    settings: SpecSettings,
    /// The draft model's cache for this sequence and the tokens it holds (made on the
    /// first draft).
    draft: Option<(KvCache, Vec<u32>)>,
    /// The tokens drafted for the coming pass (after the sequence's pending token).
    pub(super) proposal: Vec<u32>,
    pub(super) counts: SpecCounts,
    /// Verifying passes that ended at a drafted token the sequence did not sample.
    rejections: u64,
}

impl SeqSpec {
    /// Speculation by `kind`; a draft model's takes the draft cache `cache` carries (a
    /// previous request's, see [`Sequence::into_cache`]).
    pub(super) fn new(kind: SpecKind, settings: SpecSettings, cache: &mut KvCache) -> Self {
        let draft = match kind {
            SpecKind::Draft => cache.draft.take().map(|d| *d),
            _ => None,
        };
        SeqSpec { kind, settings, draft, proposal: Vec::new(), counts: SpecCounts::default(), rejections: 0 }
    }

    /// How often its drafted tokens are kept: each kept one against each rejection, the
    /// model's rate `prior` weighing as four tokens of its own at first.
    fn keep_rate(&self, prior: f64) -> f64 {
        let (kept, lost) = (self.counts.accepted as f64, self.rejections as f64);
        (kept + 4.0 * prior) / (kept + lost + 4.0)
    }

    /// Bytes its draft model's cache holds.
    pub(super) fn cache_bytes(&self) -> u64 {
        self.draft.as_ref().map_or(0, |(c, _)| c.allocated_bytes())
    }

    /// Its draft model's cache, to carry with the sequence's own.
    pub(super) fn take_draft(&mut self) -> Option<Box<(KvCache, Vec<u32>)>> {
        self.draft.take().map(Box::new)
    }
}

impl Sequence {
    /// Tokens it may draft before the coming pass: its setting, no more than it may
    /// still generate after its pending token, nor than its cache holds.
    fn draft_room(&self) -> usize {
        let Some(spec) = &self.spec else { return 0 };
        let left = self.req.max_tokens.saturating_sub(self.generated.len()).saturating_sub(1);
        let room = self.cache.capacity().saturating_sub(self.cache.len() + 1);
        spec.settings.max.min(left).min(room)
    }

    /// The tokens drafted for the coming pass.
    pub(super) fn proposal(&self) -> &[u32] {
        self.spec.as_ref().map_or(&[], |s| &s.proposal)
    }

    /// Its context as the next pass sees it: the cached tokens, then the pending one.
    fn context(&self) -> Vec<u32> {
        let mut ctx = Vec::with_capacity(self.tokens.len() + 1);
        ctx.extend_from_slice(&self.tokens);
        ctx.extend(self.pending);
        ctx
    }
}

/// Drafts the next tokens of each sequence of `decoding` (indices into `seqs` of those
/// whose next pass runs their pending token) that speculates, into its `proposal`: the
/// n-gram lookups, then the draft model's sequences together, one batched pass per
/// drafted token. Returns the nanoseconds it took. A proposal shorter than the
/// sequence's `min` is dropped (the sequence decodes one token).
pub(super) fn draft(
    engine: &Engine,
    seqs: &mut [&mut Sequence],
    decoding: &[usize],
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<u64, ModelError> {
    if !decoding.iter().any(|&i| seqs[i].spec.is_some()) {
        return Ok(0);
    }
    let started = Instant::now();
    let mut by_model = Vec::new();
    for &i in decoding {
        let room = seqs[i].draft_room();
        let Some(spec) = seqs[i].spec.as_mut() else { continue };
        spec.proposal.clear();
        match spec.kind {
            SpecKind::Ngram if room > 0 => {
                let ctx = seqs[i].context();
                // The lookup costs nothing: it proposes all it found, up to `room`.
                let proposal = ngram_draft(&ctx, room);
                seqs[i].spec.as_mut().expect("a speculating sequence").proposal = proposal;
            }
            SpecKind::Draft if room > 0 => by_model.push((i, room)),
            _ => {}
        }
    }
    if let (Some(model), false) = (engine.speculation.draft.as_ref(), by_model.is_empty()) {
        draft_with_model(engine, &*model.model, seqs, &by_model, cancelled)?;
    }
    for &i in decoding {
        if let Some(spec) = seqs[i].spec.as_mut()
            && spec.proposal.len() < spec.settings.min.max(1)
        {
            spec.proposal.clear();
        }
    }
    Ok(started.elapsed().as_nanos() as u64)
}

/// The draft model's part of [`draft`]: each sequence `(i, room)` of `todo` catches its
/// draft cache up with its context (the prompt the first time, in chunks), then drafts
/// its most likely tokens one pass at a time while each is likely enough (`p_min`), or
/// by default while all of them together are likely enough to be kept (at the rate its
/// drafts have been) to be worth another draft pass
/// ([`SpecStats::draft_threshold`](crate::speculative::SpecStats::draft_threshold)),
/// until `room`, or an end-of-sequence token.
fn draft_with_model(
    engine: &Engine,
    model: &dyn strata_model::LanguageModel,
    seqs: &mut [&mut Sequence],
    todo: &[(usize, usize)],
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<(), ModelError> {
    let vocab = engine.model.config().vocab_size.min(model.config().vocab_size);
    // What each sequence still has to run through the draft: its context past what the
    // draft cache holds (a cache that cannot go back that far starts over).
    let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(todo.len());
    for &(i, _) in todo {
        let ctx = seqs[i].context();
        let capacity = seqs[i].cache.capacity();
        let spec = seqs[i].spec.as_mut().expect("a speculating sequence");
        let (cache, held) = match spec.draft.as_mut() {
            Some(d) => d,
            None => spec.draft.insert((model.new_cache(capacity)?, Vec::new())),
        };
        let common = held.iter().zip(&ctx).take_while(|(a, b)| a == b).count().min(cache.len());
        // Run at least the last token: its output is the first draft.
        let keep = common.min(ctx.len() - 1);
        cache.truncate(keep);
        held.truncate(cache.len());
        feeds.push(ctx[cache.len()..].to_vec());
    }
    // Long catch-ups (a prompt) go in chunks first, all but their last token's chunk.
    loop {
        let long: Vec<usize> = (0..todo.len()).filter(|&j| feeds[j].len() > PREFILL_CHUNK).collect();
        if long.is_empty() {
            break;
        }
        let chunks: Vec<Vec<u32>> = long.iter().map(|&j| feeds[j].drain(..PREFILL_CHUNK).collect()).collect();
        run_draft(model, seqs, todo, &long, &chunks, cancelled)?;
    }
    let stats = &engine.speculation.stats;
    let auto = stats.draft_threshold(true);
    // Each one's chance that all it drafted so far is kept, each token kept as often as
    // its drafts were.
    let prior = stats.acceptance_estimate();
    let rate: Vec<f64> =
        todo.iter().map(|&(i, _)| seqs[i].spec.as_ref().map_or(prior, |s| s.keep_rate(prior))).collect();
    let mut kept = vec![1.0f64; todo.len()];
    let mut active: Vec<usize> = (0..todo.len()).collect();
    let mut first = true;
    while !active.is_empty() {
        let inputs: Vec<Vec<u32>> = active.iter().map(|&j| std::mem::take(&mut feeds[j])).collect();
        let started = Instant::now();
        let tops = run_draft(model, seqs, todo, &active, &inputs, cancelled)?;
        // The first pass runs what the draft had not seen (at least the pending token).
        if !first {
            stats.note_draft_pass(started.elapsed().as_nanos() as u64);
        }
        first = false;
        let mut still = Vec::with_capacity(active.len());
        for (&j, top) in active.iter().zip(tops) {
            let (i, room) = todo[j];
            let spec = seqs[i].spec.as_mut().expect("a speculating sequence");
            let (Some(&id), Some(&logit)) = (top.ids.first(), top.logits.first()) else { continue };
            let p = ((logit as f64) - (top.lse as f64)).exp();
            kept[j] *= rate[j];
            let enough = match spec.settings.p_min {
                Some(p_min) => p >= p_min as f64,
                None => kept[j] >= auto,
            };
            if (id as usize) >= vocab || !enough {
                continue;
            }
            spec.proposal.push(id);
            if spec.proposal.len() < room && !engine.tokenizer.is_eos(id) {
                feeds[j] = vec![id];
                still.push(j);
            }
        }
        active = still;
    }
    Ok(())
}

/// One draft pass: sequence `todo[j].0` runs `inputs[..]` for each `j` of `which`, its
/// draft cache's tokens extended by them. Returns each one's most likely next token.
fn run_draft(
    model: &dyn strata_model::LanguageModel,
    seqs: &mut [&mut Sequence],
    todo: &[(usize, usize)],
    which: &[usize],
    inputs: &[Vec<u32>],
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<Vec<strata_backend::TopK>, ModelError> {
    let mut wanted: Vec<Option<&mut Sequence>> = seqs.iter_mut().map(|s| Some(&mut **s)).collect();
    let mut batch = Vec::with_capacity(which.len());
    let mut helds = Vec::with_capacity(which.len());
    for (&j, tokens) in which.iter().zip(inputs) {
        let seq = wanted[todo[j].0].take().expect("each sequence drafts once a pass");
        let (cache, held) = seq.spec.as_mut().and_then(|s| s.draft.as_mut()).expect("a draft cache");
        batch.push(SeqStep { tokens, cache, all_logits: false, verify: false });
        helds.push(held);
    }
    let tops = model.forward_top_k(&mut batch, 1, cancelled)?;
    for (held, tokens) in helds.into_iter().zip(inputs) {
        held.extend_from_slice(tokens);
    }
    Ok(tops)
}

/// After a verifying pass that ran `inputs` (the pending token, then the proposal) for
/// `seq` and gave `outs` (one per row): samples row after row as decoding would, while
/// the token sampled is the one drafted next; keeps those rows' keys and values (and
/// recurrent state) and drops the rest. Returns what was drafted and kept, and whether
/// a drafted token was rejected.
pub(super) fn accept(engine: &Engine, seq: &mut Sequence, inputs: &[u32], outs: Vec<LastOutput>) -> (SpecCounts, bool) {
    let proposal = seq.spec.as_mut().map(|s| std::mem::take(&mut s.proposal)).unwrap_or_default();
    let (mut accepted, mut rejected) = (0, false);
    for (j, out) in outs.into_iter().enumerate() {
        seq.tokens.push(inputs[j]);
        seq.pending = None;
        let next = cut_output(out, seq.cut);
        if let Err(e) = seq.advance(engine, next) {
            seq.cancel();
            seq.error = Some(e);
            break;
        }
        match (seq.pending, proposal.get(j)) {
            (Some(t), Some(&d)) if t == d && !seq.is_finished() => accepted += 1,
            (Some(_), Some(_)) if !seq.is_finished() => {
                rejected = true;
                break;
            }
            _ => break,
        }
    }
    seq.cache.truncate(seq.tokens.len());
    let counts = SpecCounts { steps: 1, drafted: proposal.len() as u64, accepted };
    if let Some(spec) = seq.spec.as_mut() {
        spec.counts.add(counts);
        spec.rejections += rejected as u64;
    }
    (counts, rejected)
}
