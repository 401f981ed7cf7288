//! How long a model's context is when `--ctx-size` does not say: the length it was trained
//! for, shortened only where memory cannot hold the KV caches of the sequences it serves
//! at once. Ollama picks from fixed steps by VRAM size instead, and cuts prompts that do
//! not fit; here nothing is cut that memory could have held.

use std::fmt;

use strata_sched::plan::{RuntimeBytes, human_size};

/// The shortest default context memory may bring a model down to: the fixed default
/// of earlier releases (or the trained length, when shorter). Below this a model still
/// runs, its layers streaming to make room for the KV cache.
pub const CONTEXT_FLOOR: usize = 4096;

/// Of the free memory beyond the always-resident weights and the prefetch ring, the share
/// the KV caches may take when the layers do not all fit (the rest keeps layers resident,
/// which decides how fast a streamed model decodes).
const STREAMED_KV_SHARE: f64 = 0.25;

/// What the choice depends on.
#[derive(Clone, Debug)]
pub struct ContextInputs {
    /// `--ctx-size` (0: not given).
    pub asked: usize,
    /// The length the model was trained for (`max_position_embeddings`, GGUF
    /// `*.context_length`).
    pub trained: usize,
    /// Sequences whose full-context KV caches must fit at once (`--parallel`, else 1).
    pub sequences: usize,
    /// Free memory the compute reads (`None`: unknown, the trained length is taken).
    pub free: Option<u64>,
    /// Of `free`, the fraction left unused for the allocator and everything else.
    pub headroom: f64,
    /// Embeddings, output head and norms: always resident.
    pub always_resident: u64,
    /// The layers' weights.
    pub layers: u64,
    /// The streaming ring's slots (needed only when some layer streams).
    pub ring: u64,
    /// `--memory-budget`, when given: the layer bytes kept resident.
    pub memory_budget: Option<u64>,
}

/// Why the context has its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextReason {
    /// `--ctx-size` asked for it.
    Asked,
    /// The model's trained length: memory holds it.
    Trained,
    /// Shorter than the trained length: a longer one's KV caches would not fit.
    Memory { trained: usize, room: u64, sequences: usize },
    /// The floor ([`CONTEXT_FLOOR`]): memory is short even for that; layers stream.
    Floor { trained: usize },
}

/// A chosen context length and the reason for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextChoice {
    pub tokens: usize,
    pub reason: ContextReason,
}

impl fmt::Display for ContextChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.tokens;
        match self.reason {
            ContextReason::Asked => write!(f, "{n} tokens (--ctx-size)"),
            ContextReason::Trained => write!(f, "{n} tokens, the length the model was trained for"),
            ContextReason::Memory { trained, room, sequences } => write!(
                f,
                "{n} tokens of the {trained} the model was trained for: the KV caches of {sequences} \
                 sequence(s) at full length must fit in the {} that memory leaves beside the weights",
                human_size(room)
            ),
            ContextReason::Floor { trained } => write!(
                f,
                "{n} tokens of the {trained} the model was trained for: memory is short even for this many, so \
                 layers stream from storage to make room"
            ),
        }
    }
}

/// The context for `inputs`; `runtime(tokens)` is the KV cache of `inputs.sequences`
/// sequences of that length plus the activations of a prefill chunk beside it.
///
/// The weights keep what they would take anyway: all the layers when they fit, else the
/// `--memory-budget` asked for, else (a model larger than memory) all but
/// [`STREAMED_KV_SHARE`] of what the always-resident weights and the ring leave. The KV
/// caches get the rest, and the context is the longest whose caches fit there, at most
/// the trained length and at least [`CONTEXT_FLOOR`] (or the trained length, if shorter).
pub fn choose_context(inputs: &ContextInputs, runtime: impl Fn(usize) -> RuntimeBytes) -> ContextChoice {
    let trained = inputs.trained.max(1);
    if inputs.asked > 0 {
        return ContextChoice { tokens: inputs.asked, reason: ContextReason::Asked };
    }
    let Some(free) = inputs.free else { return ContextChoice { tokens: trained, reason: ContextReason::Trained } };
    let headroom = if inputs.headroom.is_nan() { 0.0 } else { inputs.headroom.clamp(0.0, 1.0) };
    let usable = free.saturating_sub((free as f64 * headroom) as u64);
    let floor = trained.min(CONTEXT_FLOOR);
    let all_weights = inputs.always_resident.saturating_add(inputs.layers);
    let weights = match inputs.memory_budget {
        Some(budget) if budget < inputs.layers => inputs.always_resident + budget + inputs.ring,
        Some(_) => all_weights,
        None if all_weights.saturating_add(runtime(floor).total()) <= usable => all_weights,
        None => {
            let fixed = inputs.always_resident.saturating_add(inputs.ring);
            let beyond = usable.saturating_sub(fixed);
            fixed + (beyond as f64 * (1.0 - STREAMED_KV_SHARE)) as u64
        }
    };
    let room = usable.saturating_sub(weights);
    let fits = |tokens: usize| runtime(tokens).total() <= room;
    if fits(trained) {
        return ContextChoice { tokens: trained, reason: ContextReason::Trained };
    }
    if !fits(floor) {
        return ContextChoice { tokens: floor, reason: ContextReason::Floor { trained } };
    }
    // The longest that fits, in [floor, trained): what runtime() needs grows with it.
    let (mut lo, mut hi) = (floor, trained);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fits(mid) {
            true => lo = mid,
            false => hi = mid,
        }
    }
    // A round number of tokens, as people write context lengths.
    let tokens = match lo / 256 * 256 {
        t if t >= floor => t,
        _ => lo,
    };
    ContextChoice { tokens, reason: ContextReason::Memory { trained, room, sequences: inputs.sequences.max(1) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// 1 KiB of KV cache a token, 1 MiB of activations.
    fn runtime(tokens: usize) -> RuntimeBytes {
        RuntimeBytes { kv_cache: tokens as u64 * 1024, activations: MIB }
    }

    fn inputs(free: u64) -> ContextInputs {
        ContextInputs {
            asked: 0,
            trained: 131_072,
            sequences: 1,
            free: Some(free),
            headroom: 0.0,
            always_resident: 10 * MIB,
            layers: 100 * MIB,
            ring: 20 * MIB,
            memory_budget: None,
        }
    }

    #[test]
    fn the_trained_length_when_memory_holds_it() {
        // 110 MiB of weights, 128 MiB of KV cache, 1 MiB of activations.
        let c = choose_context(&inputs(240 * MIB), runtime);
        assert_eq!(c, ContextChoice { tokens: 131_072, reason: ContextReason::Trained });
        let asked = choose_context(&ContextInputs { asked: 300, ..inputs(240 * MIB) }, runtime);
        assert_eq!(asked, ContextChoice { tokens: 300, reason: ContextReason::Asked });
        let unknown = choose_context(&ContextInputs { free: None, ..inputs(0) }, runtime);
        assert_eq!(unknown.tokens, 131_072);
    }

    #[test]
    fn memory_shortens_it_to_what_the_caches_of_every_sequence_fit() {
        // 150 MiB: 40 MiB beside the weights, 39 for the KV cache: 39936 tokens.
        let c = choose_context(&inputs(150 * MIB), runtime);
        assert_eq!(c.tokens, 39_936);
        assert!(matches!(c.reason, ContextReason::Memory { trained: 131_072, .. }), "{c}");
        assert!(runtime(c.tokens).total() <= 40 * MIB && runtime(c.tokens + 256).total() > 40 * MIB);
        // Two sequences at once: half as long.
        let two = |t: usize| RuntimeBytes { kv_cache: 2 * t as u64 * 1024, activations: MIB };
        assert_eq!(choose_context(&ContextInputs { sequences: 2, ..inputs(150 * MIB) }, two).tokens, 19_968);
        // A headroom of 10% keeps 15 MiB back.
        assert_eq!(choose_context(&ContextInputs { headroom: 0.1, ..inputs(150 * MIB) }, runtime).tokens, 24_576);
    }

    #[test]
    fn a_model_larger_than_memory_keeps_most_of_it_for_layers() {
        // 80 MiB free, 110 MiB of weights: 50 MiB beyond the fixed 30, a quarter (12.5 MiB)
        // for the runtime.
        let c = choose_context(&inputs(80 * MIB), runtime);
        assert_eq!(c.tokens, 11_776);
        assert!(runtime(c.tokens).total() <= 80 * MIB - 30 * MIB - (50.0 * 0.75) as u64 * MIB);
        // A budget given is what the layers keep.
        let budget = ContextInputs { memory_budget: Some(10 * MIB), ..inputs(80 * MIB) };
        assert_eq!(choose_context(&budget, runtime).tokens, 39_936);
        // Too little for even the floor: the floor, and the layers stream.
        let c = choose_context(&inputs(31 * MIB), runtime);
        assert_eq!(c, ContextChoice { tokens: CONTEXT_FLOOR, reason: ContextReason::Floor { trained: 131_072 } });
        let short = ContextInputs { trained: 2048, ..inputs(31 * MIB) };
        assert_eq!(choose_context(&short, runtime).tokens, 2048);
    }
}
