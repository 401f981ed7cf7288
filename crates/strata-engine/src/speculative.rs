//! Speculative decoding (DESIGN.md §5b): a draft proposes a sequence's next tokens, and
//! one pass of the model verifies them all, as rows of the batch step. The draft is a
//! small model that shares the target's vocabulary (kept resident while the target
//! streams), or the context itself (`ngram`: the continuation of the latest earlier
//! occurrence of the context's last few tokens).
//!
//! The output is the one decoding without speculation gives, token for token and for a
//! seeded sampler too: the verifying pass computes each row exactly as a one-token step
//! would ([`SeqStep::verify`](strata_model::decoder::SeqStep::verify)), the sequence
//! samples each row in turn with its own sampler (penalties, grammar, logprobs and stops
//! as ever), and keeps a drafted token only when it is the token it sampled. A draft
//! proposes its most likely tokens, so this is the standard accept/resample rule for a
//! deterministic draft: a drafted token `d` is kept with the target's probability of
//! `d`, and otherwise the token comes from the target's distribution without `d`.
//! What the pass computed for the rejected rows is dropped (keys and values cut back, a
//! recurrent state put back as it was after the last kept row).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::tokenizer::TextTokenizer;
use strata_model::LanguageModel;

/// Tokens a draft proposes at most per step, unless told (llama-server's `--draft-max`).
pub const DEFAULT_DRAFT_MAX: usize = 16;
/// The fewest drafted tokens worth a verifying pass (llama-server's `--draft-min`).
pub const DEFAULT_DRAFT_MIN: usize = 0;
/// The most tokens a step may draft for one sequence (`--draft-max` above it is refused).
pub const MAX_DRAFT: usize = 64;

/// The shortest and longest run of the context's last tokens the n-gram draft looks up.
pub const NGRAM_MIN: usize = 2;
pub const NGRAM_MAX: usize = 4;

/// Where drafted tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// No speculation.
    Off,
    /// The draft model (`--draft MODEL`).
    Draft,
    /// The context: the tokens after the latest earlier occurrence of its last few.
    Ngram,
}

impl SpecKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SpecKind::Off => "off",
            SpecKind::Draft => "draft",
            SpecKind::Ngram => "ngram",
        }
    }
}

/// How much to draft.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecSettings {
    /// Tokens drafted at most per step.
    pub max: usize,
    /// Fewer drafted tokens than this are not verified (the step decodes one token).
    pub min: usize,
    /// A draft model stops where its most likely token's probability is below this
    /// (llama-server's `--draft-p-min`). `None` (the default, `auto`): where the chance
    /// that every token drafted so far is kept is no longer worth another draft pass
    /// ([`SpecStats::draft_threshold`]).
    pub p_min: Option<f32>,
}

impl Default for SpecSettings {
    fn default() -> Self {
        SpecSettings { max: DEFAULT_DRAFT_MAX, min: DEFAULT_DRAFT_MIN, p_min: None }
    }
}

/// Speculation settings a request may not have: the field (as llama-server's request
/// names it) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct SpecError {
    pub field: &'static str,
    pub msg: String,
}

impl SpecError {
    fn new(field: &'static str, msg: impl Into<String>) -> Self {
        SpecError { field, msg: msg.into() }
    }
}

impl SpecSettings {
    /// Checks the ranges; the error names the field as llama-server's request does.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.max > MAX_DRAFT {
            return Err(SpecError::new(
                "speculative.n_max",
                format!("`speculative.n_max` must be at most {MAX_DRAFT}"),
            ));
        }
        if self.min > self.max {
            return Err(SpecError::new(
                "speculative.n_min",
                "`speculative.n_min` must not be more than `speculative.n_max`",
            ));
        }
        if self.p_min.is_some_and(|p| !(p.is_finite() && (0.0..=1.0).contains(&p))) {
            return Err(SpecError::new("speculative.p_min", "`speculative.p_min` must be in [0, 1]"));
        }
        Ok(())
    }
}

/// A request's own speculation settings; each `None` takes the server's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecRequest {
    pub kind: Option<SpecKind>,
    pub max: Option<usize>,
    pub min: Option<usize>,
    pub p_min: Option<f32>,
}

/// A draft model, loaded beside the model it drafts for.
pub struct DraftModel {
    /// Its name (the file or store name it was given as).
    pub name: String,
    pub model: Box<dyn LanguageModel>,
}

/// What a step, a request or the whole server drafted and kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecCounts {
    /// Verifying passes (steps that ran drafted tokens).
    pub steps: u64,
    /// Tokens drafted and run in those passes.
    pub drafted: u64,
    /// Drafted tokens the model sampled too (kept).
    pub accepted: u64,
}

impl SpecCounts {
    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        match self.drafted {
            0 => 0.0,
            d => self.accepted as f64 / d as f64,
        }
    }

    /// Tokens a verifying pass gave: its accepted drafts and the one it sampled after them.
    pub fn tokens_per_step(&self) -> f64 {
        match self.steps {
            0 => 0.0,
            s => 1.0 + self.accepted as f64 / s as f64,
        }
    }

    pub fn add(&mut self, other: SpecCounts) {
        self.steps += other.steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

/// The server's running totals (for `/metrics` and `bench`), and the times the cost rule
/// of drafting weighs.
#[derive(Debug, Default)]
pub struct SpecStats {
    steps: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
    /// Nanoseconds spent drafting (a draft model's passes, the n-gram lookups).
    draft_ns: AtomicU64,
    /// The moving average (f64 bits; 0: none yet) of a draft model's pass of one token
    /// per sequence, in nanoseconds.
    draft_pass_ns: AtomicU64,
    /// The model's decoding (and verifying) passes: their time against their rows.
    passes: std::sync::Mutex<PassFit>,
    /// Verifying passes that ended at a drafted token the model did not sample.
    rejections: AtomicU64,
}

/// The weight of each new time in [`SpecStats`]' moving averages.
const TIME_WEIGHT: f64 = 0.2;

/// The weight of each pass in [`PassFit`] (smaller: the fit needs passes of several
/// row counts).
const FIT_WEIGHT: f64 = 0.05;

/// A moving least-squares line through the model's pass times (ns) against their rows:
/// `a + b · rows`, the pass's own cost and each row's.
#[derive(Clone, Copy, Debug, Default)]
struct PassFit {
    w: f64,
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
}

impl PassFit {
    fn note(&mut self, rows: f64, ns: f64) {
        let keep = 1.0 - FIT_WEIGHT;
        let PassFit { w, n, t, nn, nt } = *self;
        *self = PassFit {
            w: w * keep + 1.0,
            n: n * keep + rows,
            t: t * keep + ns,
            nn: nn * keep + rows * rows,
            nt: nt * keep + rows * ns,
        };
    }

    /// `(a, b)`, both at least 0; `None` before any pass. Passes of one row count alone
    /// cannot tell a row's cost from the pass's: `b` is then 0.
    fn line(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 {
            return None;
        }
        let (mn, mt) = (self.n / self.w, self.t / self.w);
        let var = self.nn / self.w - mn * mn;
        let b = match var > 1e-6 {
            true => ((self.nt / self.w - mn * mt) / var).max(0.0),
            false => 0.0,
        };
        Some(((mt - b * mn).max(0.0), b))
    }
}

fn note_time(avg: &AtomicU64, ns: f64) {
    let old = f64::from_bits(avg.load(Ordering::Relaxed));
    let new = if old > 0.0 { old + TIME_WEIGHT * (ns - old) } else { ns };
    avg.store(new.to_bits(), Ordering::Relaxed);
}

impl SpecStats {
    /// Records verifying passes that ended at a rejected draft.
    pub fn note_rejections(&self, n: u64) {
        self.rejections.fetch_add(n, Ordering::Relaxed);
    }

    /// How often a drafted token the model reached was kept, so far: each kept one
    /// against each rejection (a verifying pass ends at the first), from even odds.
    pub fn acceptance_estimate(&self) -> f64 {
        let kept = self.accepted.load(Ordering::Relaxed) as f64;
        let lost = self.rejections.load(Ordering::Relaxed) as f64;
        (kept + 1.0) / (kept + lost + 2.0)
    }

    /// Records a draft model's pass of one token per drafting sequence.
    pub fn note_draft_pass(&self, ns: u64) {
        note_time(&self.draft_pass_ns, ns as f64);
    }

    /// Records a decoding (or verifying) pass of the model over `rows` rows.
    pub fn note_pass(&self, rows: usize, ns: u64) {
        self.passes.lock().unwrap_or_else(|e| e.into_inner()).note(rows as f64, ns as f64);
    }

    /// Where drafting stops (`--draft-p-min auto`): once the chance that every token
    /// drafted so far is kept (at the rate drafted tokens have been kept) falls below
    /// this, the next one costs more than it is expected to give back. It costs a draft
    /// model's pass (`with_model`) and a row of the model's verifying pass; kept, it
    /// saves the model a pass: `(row + draft) / (pass + row)`, from the passes timed so
    /// far (the model's fitted as `pass + row · rows`).
    /// Small for a model that streams its weights (its pass is a read of them), larger
    /// for a resident one beside a draft of its own size. 0 until the model's passes
    /// have been timed.
    pub fn draft_threshold(&self, with_model: bool) -> f64 {
        let draft = match with_model {
            true => f64::from_bits(self.draft_pass_ns.load(Ordering::Relaxed)),
            false => 0.0,
        };
        let fit = *self.passes.lock().unwrap_or_else(|e| e.into_inner());
        match fit.line() {
            Some((pass, row)) if pass + row > 0.0 => ((row + draft) / (pass + row)).min(1.0),
            _ => 0.0,
        }
    }

    pub fn add(&self, c: SpecCounts, draft_ns: u64) {
        self.steps.fetch_add(c.steps, Ordering::Relaxed);
        self.drafted.fetch_add(c.drafted, Ordering::Relaxed);
        self.accepted.fetch_add(c.accepted, Ordering::Relaxed);
        self.draft_ns.fetch_add(draft_ns, Ordering::Relaxed);
    }

    pub fn counts(&self) -> SpecCounts {
        SpecCounts {
            steps: self.steps.load(Ordering::Relaxed),
            drafted: self.drafted.load(Ordering::Relaxed),
            accepted: self.accepted.load(Ordering::Relaxed),
        }
    }

    /// Seconds spent drafting.
    pub fn draft_seconds(&self) -> f64 {
        self.draft_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }
}

/// A model's speculation: its draft model (if any), the default kind and settings, and
/// the running totals.
pub struct Speculation {
    pub draft: Option<DraftModel>,
    /// What a request that does not say speculates with.
    pub kind: SpecKind,
    pub settings: SpecSettings,
    pub stats: Arc<SpecStats>,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation { draft: None, kind: SpecKind::Off, settings: SpecSettings::default(), stats: Arc::default() }
    }
}

impl Speculation {
    /// What a request speculates with: its own settings over these; `None` when it does
    /// not. A request that asks for the draft model where there is none is refused.
    pub fn resolve(&self, req: &SpecRequest) -> Result<Option<(SpecKind, SpecSettings)>, SpecError> {
        let kind = req.kind.unwrap_or(self.kind);
        let s = SpecSettings {
            max: req.max.unwrap_or(self.settings.max),
            min: req.min.unwrap_or(self.settings.min),
            p_min: req.p_min.or(self.settings.p_min),
        };
        s.validate()?;
        match kind {
            SpecKind::Draft if self.draft.is_none() => Err(SpecError::new(
                "speculative.type",
                "`speculative.type` is `draft`, but this model was loaded without a draft model (`--draft`)",
            )),
            SpecKind::Off => Ok(None),
            _ if s.max == 0 => Ok(None),
            kind => Ok(Some((kind, s))),
        }
    }
}

/// Whether `draft` can draft for `target`: the same tokens under the same ids (every id
/// both have spells the same bytes) and vocabularies within 128 ids of each other
/// (llama.cpp's allowance for padding). Which tokens end a generation may differ: the
/// model's own decide. The error says what differs.
pub fn check_vocab(target: &TextTokenizer, draft: &TextTokenizer) -> Result<(), String> {
    let (nt, nd) = (target.vocab_size(), draft.vocab_size());
    if nt.abs_diff(nd) > 128 {
        return Err(format!("the draft's vocabulary has {nd} tokens, the model's {nt}: they must be the same"));
    }
    for id in 0..nt.min(nd) as u32 {
        let (a, b) = (target.token_bytes(id), draft.token_bytes(id));
        if a != b {
            return Err(format!(
                "token {id} is {:?} in the draft's vocabulary but {:?} in the model's",
                String::from_utf8_lossy(&b),
                String::from_utf8_lossy(&a)
            ));
        }
    }
    Ok(())
}

/// Up to `max` tokens that may follow `context`: after the latest earlier occurrence of
/// its last `n` tokens (the longest `n` from [`NGRAM_MAX`] down to [`NGRAM_MIN`] that
/// occurs), what followed there. Empty when none occurs.
pub fn ngram_draft(context: &[u32], max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if context.len() <= n {
            continue;
        }
        let tail = &context[context.len() - n..];
        // The latest start before the tail's own.
        let found = (0..context.len() - n).rev().find(|&i| &context[i..i + n] == tail);
        if let Some(i) = found {
            let from = i + n;
            return context[from..(from + max).min(context.len())].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_takes_what_followed_the_latest_longest_match() {
        // "1 2 3 4 | 9 2 3 4 | 7 ... 2 3 4": the 3-gram [2 3 4] occurs twice before the
        // tail; the 4-gram [x 2 3 4] ending the context is [8 2 3 4], found nowhere.
        let ctx = [1, 2, 3, 4, 5, 6, 9, 2, 3, 4, 7, 7, 8, 2, 3, 4];
        assert_eq!(ngram_draft(&ctx, 3), vec![7, 7, 8]);
        assert_eq!(ngram_draft(&ctx, 1), vec![7]);
        // A continuation that runs into the tail itself stops at the context's end.
        assert_eq!(ngram_draft(&[5, 6, 5, 6], 8), vec![5, 6]);
        // Nothing repeats: no draft; and a single repeated token is not enough.
        assert!(ngram_draft(&[1, 2, 3, 4], 4).is_empty());
        assert!(ngram_draft(&[1, 2, 1], 4).is_empty());
        assert!(ngram_draft(&ctx, 0).is_empty());
    }

    #[test]
    fn requests_override_the_servers_settings() {
        let spec = Speculation { kind: SpecKind::Ngram, ..Speculation::default() };
        let got = spec.resolve(&SpecRequest::default()).unwrap();
        assert_eq!(got, Some((SpecKind::Ngram, SpecSettings::default())));
        let req = SpecRequest { max: Some(4), p_min: Some(0.5), ..SpecRequest::default() };
        assert_eq!(spec.resolve(&req).unwrap().unwrap().1, SpecSettings { max: 4, min: 0, p_min: Some(0.5) });
        assert_eq!(spec.resolve(&SpecRequest { kind: Some(SpecKind::Off), ..req }).unwrap(), None);
        assert_eq!(spec.resolve(&SpecRequest { max: Some(0), ..req }).unwrap(), None);
        let err = spec.resolve(&SpecRequest { kind: Some(SpecKind::Draft), ..req }).unwrap_err();
        assert!(err.field == "speculative.type" && err.msg.contains("without a draft model"), "{err}");
        let err = spec.resolve(&SpecRequest { max: Some(MAX_DRAFT + 1), ..req }).unwrap_err();
        assert_eq!(err.field, "speculative.n_max", "{err}");
        let err = spec.resolve(&SpecRequest { min: Some(5), ..req }).unwrap_err();
        assert!(err.field == "speculative.n_min" && err.msg.contains("speculative.n_max"), "{err}");
        let err = spec.resolve(&SpecRequest { p_min: Some(1.5), ..req }).unwrap_err();
        assert_eq!(err.field, "speculative.p_min", "{err}");
    }

    #[test]
    fn counts_say_how_much_a_step_gave() {
        let stats = SpecStats::default();
        assert_eq!(stats.draft_threshold(true), 0.0, "untimed: no threshold");
        // Passes of 10 ms and 1 ms a row, a draft pass of 2 ms.
        stats.note_draft_pass(2_000_000);
        for rows in [1, 5, 1, 9, 3, 17] {
            stats.note_pass(rows, 10_000_000 + rows as u64 * 1_000_000);
        }
        let want = |draft: f64| (1e6 + draft) / (10e6 + 1e6);
        assert!((stats.draft_threshold(true) - want(2e6)).abs() < 1e-9, "{}", stats.draft_threshold(true));
        assert!((stats.draft_threshold(false) - want(0.0)).abs() < 1e-9, "{}", stats.draft_threshold(false));
        // A model that streams its weights: its passes take far longer than a row or a
        // draft pass.
        let streamed = SpecStats::default();
        streamed.note_draft_pass(2_000_000);
        for rows in [1, 17, 5, 12] {
            streamed.note_pass(rows, 300_000_000 + rows as u64 * 1_000_000);
        }
        assert!(streamed.draft_threshold(true) < 0.02, "{}", streamed.draft_threshold(true));
        // Passes of one row count alone: a row costs nothing that can be told apart.
        let flat = SpecStats::default();
        (0..4).for_each(|_| flat.note_pass(1, 5_000_000));
        assert_eq!(flat.draft_threshold(false), 0.0);
        let c = SpecCounts { steps: 4, drafted: 16, accepted: 12 };
        assert_eq!(c.acceptance_rate(), 0.75);
        assert_eq!(c.tokens_per_step(), 4.0);
        assert_eq!(SpecCounts::default().acceptance_rate(), 0.0);
    }
}
