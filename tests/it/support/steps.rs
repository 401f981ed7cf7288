//! Sequences through the step loop, and what they report.

use strata::engine::batch::{self, Sequence};
use strata::engine::session::{Engine, GenerateRequest, GenerationSummary, TokenEvent};

/// What a sequence reported: its tokens with their log-probabilities and alternatives
/// (as bits), and its text.
pub type Trace = (Vec<(u32, u32, Vec<(u32, u32)>)>, String);

/// Moves what `seq` reported since the last call into `trace`.
pub fn record(seq: &mut Sequence, trace: &mut Trace) {
    for ev in seq.drain_events() {
        match ev {
            TokenEvent::Token { id, logprob, top } => {
                trace.0.push((id, logprob.to_bits(), top.into_iter().map(|(i, l)| (i, l.to_bits())).collect()))
            }
            TokenEvent::Text(t) => trace.1.push_str(&t),
        }
    }
}

/// All of `reqs` through one step loop from the start (prompts in chunks of `chunk`),
/// each to its end: what each reported, and how it ended. A sequence's own error fails
/// the test.
pub fn together(e: &Engine, reqs: &[GenerateRequest], chunk: usize) -> Vec<(Trace, GenerationSummary)> {
    let mut seqs: Vec<Sequence> = reqs
        .iter()
        .map(|r| Sequence::new(e, e.model.new_cache(e.context_len).unwrap(), Vec::new(), r.clone()).unwrap())
        .collect();
    let mut traces = vec![Trace::default(); reqs.len()];
    loop {
        let mut running: Vec<&mut Sequence> = seqs.iter_mut().filter(|s| !s.is_finished()).collect();
        if running.is_empty() {
            break;
        }
        batch::step(e, &mut running, chunk, &|| false).unwrap();
        for (seq, trace) in seqs.iter_mut().zip(&mut traces) {
            record(seq, trace);
            if let Some(err) = seq.take_error() {
                panic!("{err}");
            }
        }
    }
    traces.into_iter().zip(&seqs).map(|(t, s)| (t, s.summary().expect("finished"))).collect()
}
