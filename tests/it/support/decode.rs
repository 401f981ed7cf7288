//! Running a model the way the streaming tests compare it: every logit of a fixed prompt
//! and a few greedy steps, as bits; and the scheduler's counters over whole decode steps.

use std::time::Duration;

use strata::model::LanguageModel;
use strata::model::decoder::SeqStep;
use strata::sched::StatsSnapshot;

pub const PROMPT: [u32; 7] = [5, 17, 99, 3, 250, 42, 7];
pub const DECODE_STEPS: usize = 5;

/// Logits of every prompt position and of `DECODE_STEPS` greedy decode steps, as bits
/// (the prompt's ids taken modulo a smaller vocabulary).
pub fn logit_bits(model: &dyn LanguageModel) -> Vec<u32> {
    logit_bits_for(model, DECODE_STEPS)
}

/// [`logit_bits`] with `steps` greedy decode steps.
pub fn logit_bits_for(model: &dyn LanguageModel, steps: usize) -> Vec<u32> {
    let mut cache = model.new_cache(64).unwrap();
    let vocab = model.config().vocab_size;
    let prompt: Vec<u32> = PROMPT.iter().map(|&t| t % vocab as u32).collect();
    let mut out =
        model.forward(&mut [SeqStep { tokens: &prompt, cache: &mut cache, all_logits: true, verify: false }]).unwrap();
    let mut bits: Vec<u32> = out[0].iter().map(|v| v.to_bits()).collect();
    for _ in 0..steps {
        let last = &out[0][out[0].len() - vocab..];
        let next = (0..vocab).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        out = model
            .forward(&mut [SeqStep { tokens: &[next], cache: &mut cache, all_logits: false, verify: false }])
            .unwrap();
        bits.extend(out[0].iter().map(|v| v.to_bits()));
    }
    bits
}

/// Counters over `steps` decode steps, with the prefetch thread settled at both ends so
/// the window holds whole tokens.
pub fn decode_window(model: &dyn LanguageModel, steps: usize) -> StatsSnapshot {
    let mut cache = model.new_cache(PROMPT.len() + steps + 2).unwrap();
    model.forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }]).unwrap();
    let settle = || std::thread::sleep(Duration::from_millis(100));
    settle();
    let before = model.scheduler().stats().snapshot();
    for i in 0..steps {
        let t = [(i % 200) as u32 + 1];
        model.forward(&mut [SeqStep { tokens: &t, cache: &mut cache, all_logits: false, verify: false }]).unwrap();
    }
    settle();
    model.scheduler().stats().snapshot() - before
}
