//! Mixture-of-experts feed-forward blocks (Mixtral, Qwen2-MoE, Qwen3-MoE), in two
//! phases: the router, computed with the layer core, picks each token's experts; then
//! exactly those experts are fetched (from the expert cache, or from the layer when it
//! carries all of them) and run over the tokens routed to them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::config::{ModelConfig, MoeConfig};
use super::error::ModelError;
use strata_backend::{Backend, Rows};
use strata_sched::SchedError;
use strata_tensor::tensor::HostTensor;

/// A gated MLP: a dense layer's, the shared expert's, or one routed expert's.
pub struct Mlp<B: Backend> {
    pub width: usize,
    pub gate: B::Weight, // (width, hidden)
    pub up: B::Weight,   // (width, hidden)
    pub down: B::Weight, // (hidden, width)
}

/// What a MoE layer's core holds for its feed-forward block.
pub struct MoeWeights<B: Backend> {
    pub router: B::Weight, // (n_experts, hidden)
    /// The shared expert and its gate (`(1, hidden)`), Qwen2-MoE.
    pub shared: Option<(Mlp<B>, B::Weight)>,
    /// Every routed expert, when the layer is loaded whole (the baseline that reads
    /// every expert); `None` when they come from the expert cache.
    pub experts: Option<Vec<Arc<Mlp<B>>>>,
}

/// The expert layer-local names of expert `e`'s gate, up and down projections.
pub fn expert_names(c: &ModelConfig, e: usize) -> [String; 3] {
    use super::spec::Role;
    let spec = c.spec();
    let name = |role: Role| spec.tensor(role).map_or_else(String::new, |t| t.hf_for(e));
    [name(Role::ExpertGate), name(Role::ExpertUp), name(Role::ExpertDown)]
}

/// Host tensors of layer `layer` as backend weights, each `(name, tensor, shape it must
/// have)` checked first.
pub fn checked_weights<B: Backend, const N: usize>(
    be: &B,
    layer: usize,
    tensors: [(&str, &HostTensor, [usize; 2]); N],
) -> Result<[B::Weight; N], SchedError> {
    let mut out = Vec::with_capacity(N);
    for (name, t, want) in tensors {
        if t.shape != want {
            let msg = format!("tensor `{name}`: expected shape {want:?}, found {:?}", t.shape);
            return Err(SchedError::Build { layer, msg });
        }
        out.push(be.weight(t).map_err(|source| SchedError::Backend { layer, source })?);
    }
    <[B::Weight; N]>::try_from(out).map_err(|_| SchedError::Build { layer, msg: "weights".into() })
}

/// An MLP from its three host tensors, each checked against the shape it must have.
pub fn build_mlp<B: Backend>(
    be: &B,
    layer: usize,
    tensors: [(&str, &HostTensor); 3],
    width: usize,
    hidden: usize,
) -> Result<Mlp<B>, SchedError> {
    let [(g, gt), (u, ut), (d, dt)] = tensors;
    let [gate, up, down] =
        checked_weights(be, layer, [(g, gt, [width, hidden]), (u, ut, [width, hidden]), (d, dt, [hidden, width])])?;
    Ok(Mlp { width, gate, up, down })
}

/// What receives each unit read apart from its layer core (a routed expert's [`Mlp`], a
/// sparse FFN's neuron-group bundle): its position in the list asked for, and its weights.
pub type EachUnit<'a, U> = dyn FnMut(usize, &U) -> Result<(), ModelError> + 'a;

/// Where a layer's units read apart (routed experts, neuron groups) come from.
pub trait UnitSource<U> {
    /// Hands `each` the weights of units `ids` (distinct, ascending) of layer `layer`, in
    /// that order, each as soon as it is in memory (so that one computes while the next
    /// is still being read).
    fn units(&self, layer: usize, ids: &[usize], each: &mut EachUnit<'_, U>) -> Result<(), ModelError>;
}

/// Each row's experts and their weights, as transformers routes: softmax over every
/// expert's score, the `top_k` most probable (the lower index first on ties), and those
/// probabilities rescaled to sum to 1 when `norm_topk_prob`.
pub fn route(logits: &[f32], m: &MoeConfig) -> Vec<(Vec<u32>, Vec<f32>)> {
    logits
        .chunks_exact(m.n_experts)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = row.iter().map(|&z| (z - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            let mut order: Vec<u32> = (0..m.n_experts as u32).collect();
            // NaN scores sort last, so a broken router never picks them first.
            order.sort_by(|&a, &b| {
                let (pa, pb) = (exp[a as usize], exp[b as usize]);
                pb.partial_cmp(&pa).unwrap_or_else(|| pa.is_nan().cmp(&pb.is_nan())).then(a.cmp(&b))
            });
            order.truncate(m.top_k);
            let mut w: Vec<f32> = order.iter().map(|&e| exp[e as usize] / sum).collect();
            if m.norm_topk_prob {
                let total: f32 = w.iter().sum();
                w.iter_mut().for_each(|x| *x /= total);
            }
            (order, w)
        })
        .collect()
}

/// The experts each row would be routed to if layer `l`'s router were applied to the
/// stream entering the layer (layer `l - 1`'s output), before its attention: what a
/// speculative prefetch would read ahead. `normed` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn guess<B: Backend>(
    be: &B,
    c: &ModelConfig,
    w: &MoeWeights<B>,
    ffn_norm: &B::Weight,
    x: &B::Buf,
    rows: usize,
    normed: &mut B::Buf,
    moe: &mut MoeBufs<B>,
) -> Result<Vec<Vec<u32>>, ModelError> {
    let Some(m) = c.moe else { return Ok(Vec::new()) };
    be.rms_norm(x, rows, ffn_norm, c.rms_norm_eps, normed)?;
    be.matmul(normed, rows, &w.router, &mut moe.logits)?;
    Ok(route(&be.download(&moe.logits, rows * m.n_experts)?, &m).into_iter().map(|(ids, _)| ids).collect())
}

/// Of the experts `taken`, how many `guessed` named (row by row), and how many there were.
pub fn score_guess(guessed: &[Vec<u32>], taken: &[Vec<u32>]) -> (u64, u64) {
    guessed.iter().zip(taken).fold((0, 0), |(right, total), (g, t)| {
        (right + t.iter().filter(|e| g.contains(e)).count() as u64, total + t.len() as u64)
    })
}

/// Rows (ascending, given by index into `seq_of`, each row's sequence) as runs per
/// sequence: each sequence's rows as they would come alone (see
/// [`Backend::matmul_seqs`]).
pub fn runs_by_sequence(rows: &[u32], seq_of: &[usize]) -> Vec<usize> {
    let mut per_seq: Vec<usize> = Vec::new();
    let mut last = usize::MAX;
    for &r in rows {
        let s = seq_of.get(r as usize).copied().unwrap_or(0);
        match per_seq.last_mut() {
            Some(n) if s == last => *n += 1,
            _ => per_seq.push(1),
        }
        last = s;
    }
    per_seq
}

/// The buffers a MoE block (or a sparse FFN) needs beside the dense ones.
pub struct MoeBufs<B: Backend> {
    /// (rows, n_experts): the router's logits; in a sparse FFN (rows, group): one
    /// neuron group's activations.
    pub logits: B::Buf,
    pub xe: B::Buf, // (rows, hidden): the rows routed to one expert (or group)
    pub ye: B::Buf, // (rows, hidden): that expert's output
}

impl<B: Backend> MoeBufs<B> {
    pub fn new(be: &B, c: &ModelConfig, rows: usize) -> Result<Option<Self>, strata_backend::BackendError> {
        let width = match (c.moe, c.neuron_group) {
            (Some(m), _) => m.n_experts,
            (None, Some(group)) => group,
            (None, None) => return Ok(None),
        };
        let h = c.hidden_size;
        Ok(Some(MoeBufs { logits: be.alloc(rows * width)?, xe: be.alloc(rows * h)?, ye: be.alloc(rows * h)? }))
    }
}

/// The dense buffers the MLP uses: `gate` and `up` of `(rows, width)`.
pub struct MlpBufs<'a, B: Backend> {
    pub gate: &'a mut B::Buf,
    pub up: &'a mut B::Buf,
}

/// `out = mlp(x)` over `rows` rows.
pub fn mlp_forward<B: Backend>(
    be: &B,
    c: &ModelConfig,
    mlp: &Mlp<B>,
    x: &B::Buf,
    seq_rows: &[usize],
    bufs: &mut MlpBufs<'_, B>,
    out: &mut B::Buf,
) -> Result<(), ModelError> {
    let rows = seq_rows.iter().sum::<usize>();
    be.matmul_seqs_each(x, seq_rows, &mut [(&mlp.gate, bufs.gate), (&mlp.up, bufs.up)])?;
    be.glu(bufs.gate, bufs.up, rows * mlp.width, c.spec().activation)?;
    be.matmul_seqs(bufs.gate, seq_rows, &mlp.down, out)?;
    Ok(())
}

/// One MoE block's inputs: `rows` rows of `input` (normed) through layer `layer`.
pub struct MoeBlock<'a, B: Backend> {
    pub layer: usize,
    pub weights: &'a MoeWeights<B>,
    pub source: &'a dyn UnitSource<Mlp<B>>,
    pub input: &'a B::Buf,
    pub rows: usize,
    /// Rows per sequence of the batch, in order (see [`Backend::matmul_seqs`]).
    pub seq_rows: &'a [usize],
}

/// A MoE layer's feed-forward output for `rows` rows of `input` into `out` (`(rows,
/// hidden)`): the shared expert (scaled by its sigmoid gate), plus each routed expert
/// over its rows, weighted. Returns the routing (each row's experts). Every product runs
/// per sequence ([`Backend::matmul_seqs`]): a sequence's routing and its rows through
/// each expert come out as they do when it runs alone, whatever shares the batch.
pub fn moe_forward<B: Backend>(
    be: &B,
    c: &ModelConfig,
    block: MoeBlock<'_, B>,
    bufs: &mut MlpBufs<'_, B>,
    moe: &mut MoeBufs<B>,
    out: &mut B::Buf,
) -> Result<Vec<Vec<u32>>, ModelError> {
    let MoeBlock { layer, weights: w, source, input, rows, seq_rows } = block;
    let Some(m) = c.moe else { return Ok(Vec::new()) };
    let h = c.hidden_size;
    // The sequence each row belongs to.
    let seq_of: Vec<usize> = seq_rows.iter().enumerate().flat_map(|(s, &n)| std::iter::repeat_n(s, n)).collect();
    // Phase 1: the router, on the host (its choice drives what is read).
    be.matmul_seqs(input, seq_rows, &w.router, &mut moe.logits)?;
    let routing = route(&be.download(&moe.logits, rows * m.n_experts)?, &m);
    let mut by_expert: BTreeMap<usize, (Vec<u32>, Vec<f32>)> = BTreeMap::new();
    for (row, (ids, weights)) in routing.iter().enumerate() {
        for (&e, &wt) in ids.iter().zip(weights) {
            let entry = by_expert.entry(e as usize).or_default();
            entry.0.push(row as u32);
            entry.1.push(wt);
        }
    }
    let wanted: Vec<usize> = by_expert.keys().copied().collect();
    let groups: Vec<&(Vec<u32>, Vec<f32>)> = by_expert.values().collect();

    be.unary(out, rows * h, strata_backend::Unary::Scale(0.0))?;
    if let Some((shared, gate)) = &w.shared {
        be.matmul_seqs(input, seq_rows, gate, &mut moe.logits)?;
        let scale: Vec<f32> = be.download(&moe.logits, rows)?.iter().map(|&g| 1.0 / (1.0 + (-g).exp())).collect();
        mlp_forward(be, c, shared, input, seq_rows, bufs, &mut moe.ye)?;
        be.add_rows(out, &moe.ye, h, Rows::first(rows), Some(&scale))?;
    }
    // Phase 2: exactly the routed experts (all reads issued together), each computed
    // over its rows as it arrives, in expert order (so the sum is the same whatever the
    // order the reads complete in).
    let mut run = |i: usize, expert: &Mlp<B>| -> Result<(), ModelError> {
        let (rows_of, weights) = groups[i];
        be.copy_rows(input, Rows::List(rows_of), h, &mut moe.xe, 0)?;
        let per_seq = runs_by_sequence(rows_of, &seq_of);
        mlp_forward(be, c, expert, &moe.xe, &per_seq, bufs, &mut moe.ye)?;
        Ok(be.add_rows(out, &moe.ye, h, Rows::List(rows_of), Some(weights))?)
    };
    match &w.experts {
        Some(all) => wanted.iter().enumerate().try_for_each(|(i, &e)| run(i, &all[e]))?,
        None => source.units(layer, &wanted, &mut run)?,
    }
    Ok(routing.into_iter().map(|(ids, _)| ids).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(top_k: usize, norm: bool) -> MoeConfig {
        MoeConfig { n_experts: 4, top_k, expert_size: 8, shared_expert_size: None, norm_topk_prob: norm }
    }

    #[test]
    fn routing_takes_the_most_probable_experts() {
        let logits = [0.0, 2.0, 1.0, 2.0, /* row 2 */ 5.0, 0.0, 0.0, 0.0];
        let r = route(&logits, &cfg(2, false));
        // Ties go to the lower index.
        assert_eq!(r[0].0, vec![1, 3]);
        let p = (2.0f32).exp() / (1.0 + 2.0 * (2.0f32).exp() + 1.0f32.exp());
        assert!((r[0].1[0] - p).abs() < 1e-6 && (r[0].1[1] - p).abs() < 1e-6);
        assert_eq!(r[1].0[0], 0);
        let n = route(&logits, &cfg(2, true));
        assert!((n[0].1.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((n[0].1[0] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn guesses_are_scored_against_the_routing_taken() {
        let guessed = vec![vec![1, 2], vec![0, 3]];
        let taken = vec![vec![2, 5], vec![3, 0]];
        assert_eq!(score_guess(&guessed, &taken), (3, 4));
    }

    #[test]
    fn a_nan_score_is_never_chosen_first() {
        let r = route(&[f32::NAN, 1.0, 0.0, -1.0], &cfg(1, true));
        assert_eq!(r[0].0, vec![1]);
    }
}
