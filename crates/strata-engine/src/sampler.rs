//! Token sampling: logit bias, repetition penalties, top-k, top-p, min-p, temperature and a
//! seeded draw.
//!
//! The chain runs in llama.cpp's order: the request's logit bias, penalties over the last
//! `repeat_last_n` tokens of the history, then `top_k`, `top_p`, `min_p`, `temperature`,
//! and finally a draw from the softmax of what is left. Each stage is a plain function on a
//! candidate list so it can be tested alone. Greedy decoding (`temperature <= 0`) skips the
//! filters and the draw but still applies the bias and the penalties.
//!
//! The random source is a small xoshiro256** generator seeded through splitmix64, so the
//! same seed, logits and history always give the same token.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::text_error::TextError;

/// How to pick the next token. Resolved once per request; see [`SamplingParams::validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy argmax.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set whose cumulative probability reaches `top_p`; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p * p_max`; 0 = off.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens; 1.0 = off.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalties look at; 0 = off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token seen in the window.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token seen in the window.
    pub frequency_penalty: f32,
    /// Seed of the random draw; `None` seeds from the clock.
    pub seed: Option<u64>,
    /// Added to these tokens' logits before anything else, in ascending id order, each id
    /// once; `-inf` bans a token. Checked at the request's boundary (ids in the
    /// vocabulary, finite values or `-inf`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Deterministic argmax decoding with every filter and penalty off.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Self::default() }
    }

    /// How many of the most likely tokens picking (and reporting `top_logprobs`
    /// alternatives) needs, when that is a small cut of the vocabulary: the forward
    /// pass then selects them on the device and copies back only those. `None` when
    /// every logit matters (penalties, a positive logit bias, or sampling without a
    /// top-k cut).
    ///
    /// A bias that only lowers tokens widens the cut by one per biased token: lowering
    /// `n` tokens moves each other token up at most `n` places, so the `k` best after
    /// the bias are among the `k + n` best before it. A raised token may come from
    /// anywhere in the vocabulary, so that needs every logit.
    pub fn candidates_needed(&self, top_logprobs: usize) -> Option<usize> {
        let penalties = self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0);
        if self.logit_bias.iter().any(|&(_, b)| b > 0.0) {
            return None;
        }
        let k = match (penalties, self.is_greedy(), self.top_k) {
            (true, _, _) => return None,
            (false, true, _) => 1,
            (false, false, 0) => return None,
            (false, false, k) => k,
        };
        let k = k.checked_add(self.logit_bias.len())?;
        Some(k.max(top_logprobs)).filter(|&k| k <= strata_backend::MAX_TOP_K)
    }

    /// Whether this picks the argmax instead of drawing.
    pub fn is_greedy(&self) -> bool {
        // NaN counts as greedy too: there is no meaningful distribution to draw from.
        self.temperature.is_nan() || self.temperature <= 0.0
    }

    /// Checks the ranges; the error names the offending field.
    pub fn validate(&self) -> Result<(), TextError> {
        let bad = |field: &'static str, msg: &str| Err(TextError::InvalidSampling { field, msg: msg.to_string() });
        if !self.temperature.is_finite() {
            return bad("temperature", "must be a finite number");
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]");
        }
        if !(self.min_p.is_finite() && (0.0..=1.0).contains(&self.min_p)) {
            return bad("min_p", "must be in [0, 1]");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", "must be a finite number > 0");
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", "must be a finite number");
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", "must be a finite number");
        }
        Ok(())
    }
}

/// One entry of the candidate list the stages work on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// Turns raw logits into a candidate list in id order (NaN becomes -inf).
pub fn candidates_from_logits(logits: &[f32], out: &mut Vec<Candidate>) {
    out.clear();
    out.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate { id: i as u32, logit: if l.is_nan() { f32::NEG_INFINITY } else { l } }),
    );
}

fn desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    // Larger logit first; ties broken by the smaller id so results are deterministic.
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

fn sort_desc(cands: &mut [Candidate]) {
    if !cands.is_sorted_by(|a, b| desc(a, b).is_le()) {
        cands.sort_unstable_by(desc);
    }
}

/// Where each id sits in a candidate list. Lists fresh from the logits are in id order,
/// so index == id; the allowed tokens of a grammar are in id order with gaps, found by
/// binary search; other orders (the device's top entries) get a map from id to position.
enum Positions {
    Identity,
    Ascending,
    Map(HashMap<u32, usize>),
}

impl Positions {
    fn of(cands: &[Candidate]) -> Self {
        if cands.iter().enumerate().all(|(i, c)| c.id as usize == i) {
            Positions::Identity
        } else if cands.is_sorted_by_key(|c| c.id) {
            Positions::Ascending
        } else {
            Positions::Map(cands.iter().enumerate().map(|(i, c)| (c.id, i)).collect())
        }
    }

    fn find(&self, cands: &[Candidate], id: u32) -> Option<usize> {
        match self {
            Positions::Identity => Some(id as usize).filter(|&i| i < cands.len()),
            Positions::Ascending => cands.binary_search_by_key(&id, |c| c.id).ok(),
            Positions::Map(m) => m.get(&id).copied(),
        }
    }
}

/// Adds each `(id, bias)` to that candidate's logit (`-inf` bans it). Ids not in the
/// candidate list are ignored.
pub fn apply_bias(cands: &mut [Candidate], bias: &[(u32, f32)]) {
    if bias.is_empty() {
        return;
    }
    let positions = Positions::of(cands);
    for &(id, b) in bias {
        if let Some(i) = positions.find(cands, id) {
            cands[i].logit += b;
        }
    }
}

/// Repetition, presence and frequency penalties for the tokens in `window` (the last
/// `repeat_last_n` tokens of the history). Ids not in the candidate list are ignored.
pub fn apply_penalties(
    cands: &mut [Candidate],
    window: &[u32],
    repeat_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
) {
    if window.is_empty() || (repeat_penalty == 1.0 && presence_penalty == 0.0 && frequency_penalty == 0.0) {
        return;
    }
    let mut counts: HashMap<u32, u32> = HashMap::with_capacity(window.len());
    for &id in window {
        *counts.entry(id).or_insert(0) += 1;
    }
    let positions = Positions::of(cands);
    for (&id, &count) in &counts {
        let Some(idx) = positions.find(cands, id) else { continue };
        let c = &mut cands[idx];
        if c.logit > 0.0 {
            c.logit /= repeat_penalty;
        } else {
            c.logit *= repeat_penalty;
        }
        c.logit -= count as f32 * frequency_penalty + presence_penalty;
    }
}

/// Keeps the `k` largest logits, sorted in descending order. `k == 0` keeps everything.
pub fn top_k(cands: &mut Vec<Candidate>, k: usize) {
    if k == 0 || k >= cands.len() {
        return;
    }
    cands.select_nth_unstable_by(k - 1, desc);
    cands.truncate(k);
    cands.sort_unstable_by(desc);
}

/// Probabilities of the candidates (softmax over their logits), in f64.
fn probs(cands: &[Candidate]) -> Vec<f64> {
    let max = cands.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        // Everything masked: treat as uniform so callers still have a distribution.
        let n = cands.len().max(1) as f64;
        return vec![1.0 / n; cands.len()];
    }
    let exps: Vec<f64> = cands.iter().map(|c| ((c.logit as f64) - (max as f64)).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Nucleus filter: sorts descending and keeps the smallest prefix whose cumulative
/// probability is at least `p` (at least one candidate). `p >= 1` keeps everything.
pub fn top_p(cands: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    let max = cands.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        cands.truncate(1);
        return;
    }
    let sum: f64 = cands.iter().map(|c| (c.logit as f64 - max as f64).exp()).sum();
    let target = p as f64 * sum;
    // The nucleus is usually small: try the best TOP_P_PROBE candidates before sorting
    // the whole (vocabulary-sized) list.
    const TOP_P_PROBE: usize = 1024;
    let mut sorted_len = cands.len();
    if cands.len() > TOP_P_PROBE {
        cands.select_nth_unstable_by(TOP_P_PROBE - 1, desc);
        sorted_len = TOP_P_PROBE;
    }
    loop {
        cands[..sorted_len].sort_unstable_by(desc);
        let mut cum = 0.0f64;
        for i in 0..sorted_len {
            cum += (cands[i].logit as f64 - max as f64).exp();
            if cum >= target {
                cands.truncate(i + 1);
                return;
            }
        }
        if sorted_len == cands.len() {
            // Rounding kept the total just under the target: keep everything.
            return;
        }
        sorted_len = cands.len();
    }
}

/// Drops candidates whose probability is below `p * p_max` (the most likely one always
/// stays). `p <= 0` keeps everything. Order is preserved.
pub fn min_p(cands: &mut Vec<Candidate>, p: f32) {
    if p <= 0.0 || cands.len() <= 1 {
        return;
    }
    let max = cands.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    // p_i / p_max = exp(l_i - l_max) >= p  <=>  l_i >= l_max + ln p
    let threshold = max as f64 + (p as f64).ln();
    cands.retain(|c| c.logit == max || c.logit as f64 >= threshold);
}

/// Divides every logit by `t` (`t > 0`; other values leave the list unchanged).
pub fn temperature(cands: &mut [Candidate], t: f32) {
    if t.is_nan() || t <= 0.0 || t == 1.0 {
        return;
    }
    for c in cands {
        c.logit /= t;
    }
}

/// The candidate with the largest logit (the smallest id on ties).
pub fn argmax(cands: &[Candidate]) -> Option<u32> {
    cands.iter().copied().min_by(desc).map(|c| c.id)
}

/// Draws from the softmax of the candidates.
pub fn sample_from(cands: &[Candidate], rng: &mut Rng) -> Option<u32> {
    if cands.is_empty() {
        return None;
    }
    let probs = probs(cands);
    let r = rng.next_f64();
    let mut cum = 0.0f64;
    for (c, p) in cands.iter().zip(&probs) {
        cum += p;
        if r < cum {
            return Some(c.id);
        }
    }
    // Rounding left r above the final cumulative sum: take the last one with mass.
    cands.iter().zip(&probs).rev().find(|(_, p)| **p > 0.0).map(|(c, _)| c.id).or(Some(cands[cands.len() - 1].id))
}

/// Picks tokens according to a [`SamplingParams`]; owns its random state.
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    scratch: Vec<Candidate>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(entropy_seed);
        Self { rng: Rng::new(seed), seed, params, scratch: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed actually in use (the drawn one when `params.seed` was `None`).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Picks the next token. `history` is every token so far (prompt and generated).
    /// Empty `logits` (a caller bug) yields 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let mut cands = std::mem::take(&mut self.scratch);
        candidates_from_logits(logits, &mut cands);
        apply_bias(&mut cands, &p.logit_bias);
        let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
        apply_penalties(&mut cands, window, p.repeat_penalty, p.presence_penalty, p.frequency_penalty);
        self.pick(cands)
    }

    /// Picks the next token among those `allowed` accepts (a grammar's mask): the same
    /// as [`sample`](Self::sample) with every other logit set to -inf, so penalties and
    /// the filters act on the allowed tokens only and greedy picks the best allowed one.
    /// `None` when no token is allowed. (Generation lists the allowed tokens instead, with
    /// [`sample_among`](Self::sample_among); this is the tests' reference.)
    #[cfg(test)]
    pub fn sample_masked(&mut self, logits: &[f32], history: &[u32], allowed: impl Fn(u32) -> bool) -> Option<u32> {
        self.sample_among(logits, history, (0..logits.len() as u32).filter(|&id| allowed(id)))
    }

    /// [`sample_masked`](Self::sample_masked) with the allowed tokens listed, in
    /// ascending id order: only they become candidates, so a narrow grammar state costs
    /// little. Ids past the logits are skipped.
    pub fn sample_among(&mut self, logits: &[f32], history: &[u32], allowed: impl Iterator<Item = u32>) -> Option<u32> {
        let p = &self.params;
        let mut cands = std::mem::take(&mut self.scratch);
        cands.clear();
        // Dropping the others is the same as -inf logits, and the filters then sort only
        // what can be drawn. An allowed token keeps its place even at -inf, so that
        // something allowed is picked whatever the logits.
        cands.extend(
            allowed
                .map_while(|id| logits.get(id as usize).map(|&l| (id, l)))
                .map(|(id, l)| Candidate { id, logit: if l.is_nan() { f32::NEG_INFINITY } else { l } }),
        );
        apply_bias(&mut cands, &p.logit_bias);
        let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
        apply_penalties(&mut cands, window, p.repeat_penalty, p.presence_penalty, p.frequency_penalty);
        if cands.is_empty() {
            self.scratch = cands;
            return None;
        }
        Some(self.pick(cands))
    }

    /// Picks the next token from the most likely candidates only (`top`, most likely
    /// first, as the device selects them; the logit bias applies to those among them).
    /// Gives what [`sample`](Self::sample) gives from every logit whenever
    /// [`SamplingParams::candidates_needed`] allowed the cut.
    pub fn sample_top(&mut self, top: &strata_backend::TopK) -> u32 {
        let mut cands = std::mem::take(&mut self.scratch);
        cands.clear();
        cands.extend(
            top.ids
                .iter()
                .zip(&top.logits)
                .map(|(&id, &l)| Candidate { id, logit: if l.is_nan() { f32::NEG_INFINITY } else { l } }),
        );
        apply_bias(&mut cands, &self.params.logit_bias);
        self.pick(cands)
    }

    /// Greedy argmax, or the filters then a draw; keeps `cands` as scratch.
    fn pick(&mut self, mut cands: Vec<Candidate>) -> u32 {
        let p = &self.params;
        let picked = if p.is_greedy() {
            argmax(&cands)
        } else {
            top_k(&mut cands, p.top_k);
            top_p(&mut cands, p.top_p);
            min_p(&mut cands, p.min_p);
            temperature(&mut cands, p.temperature);
            sample_from(&cands, &mut self.rng)
        };
        self.scratch = cands;
        picked.unwrap_or(0)
    }
}

/// Log-probabilities of `logits`, computed in f64 with the max subtracted first.
/// `-inf` logits get `-inf`; if every logit is `-inf` (or NaN) the result is all `-inf`.
/// `log_softmax(logits)[id]`, computed the same way without the whole row.
pub fn log_softmax_at(logits: &[f32], id: usize) -> f32 {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let l = logits.get(id).copied().unwrap_or(f32::NAN);
    if max == f32::NEG_INFINITY || l.is_nan() {
        return f32::NEG_INFINITY;
    }
    if max == f32::INFINITY {
        let n = logits.iter().filter(|&&l| l == f32::INFINITY).count() as f64;
        return if l == f32::INFINITY { (-(n.ln())) as f32 } else { f32::NEG_INFINITY };
    }
    let max = max as f64;
    let sum: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&l| (l as f64 - max).exp()).sum();
    (l as f64 - max - sum.ln()) as f32
}

pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![f32::NEG_INFINITY; logits.len()];
    }
    if max == f32::INFINITY {
        // The +inf entries share all the mass.
        let n = logits.iter().filter(|&&l| l == f32::INFINITY).count() as f64;
        let lp = (-(n.ln())) as f32;
        return logits.iter().map(|&l| if l == f32::INFINITY { lp } else { f32::NEG_INFINITY }).collect();
    }
    let max = max as f64;
    let sum: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&l| (l as f64 - max).exp()).sum();
    let log_sum = sum.ln();
    logits.iter().map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { (l as f64 - max - log_sum) as f32 }).collect()
}

/// The `n` most likely tokens with their log-probabilities, most likely first
/// (smaller id first on ties).
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 || logits.is_empty() {
        return Vec::new();
    }
    let lp = log_softmax(logits);
    let mut cands: Vec<Candidate> = lp.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: l }).collect();
    top_k(&mut cands, n);
    sort_desc(&mut cands);
    cands.into_iter().map(|c| (c.id, c.logit)).collect()
}

/// xoshiro256** seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut st = seed;
        let s = [splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st)];
        Self { s }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

fn entropy_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let local = 0u8;
    let addr = &local as *const u8 as u64;
    let mut st = nanos
        ^ addr.rotate_left(32)
        ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(std::process::id()).rotate_left(17);
    splitmix64(&mut st)
}

#[cfg(test)]
mod tests {
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
        let params = SamplingParams {
            temperature: 100.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: Some(3),
            ..Default::default()
        };
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
        let lowered =
            SamplingParams { logit_bias: vec![(1, -5.0), (7, f32::NEG_INFINITY)], ..SamplingParams::greedy() };
        assert_eq!(lowered.candidates_needed(0), Some(3));
        assert_eq!(lowered.candidates_needed(5), Some(5));
        assert_eq!(SamplingParams { top_k: 0, ..SamplingParams::default() }.candidates_needed(0), None);
        assert_eq!(SamplingParams::greedy().candidates_needed(5), Some(5));
        assert_eq!(SamplingParams { top_k: 40, ..SamplingParams::default() }.candidates_needed(300), None);
    }
}
