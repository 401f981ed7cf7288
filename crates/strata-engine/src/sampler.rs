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
mod tests;
