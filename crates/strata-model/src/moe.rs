//! Mixture-of-experts feed-forward blocks (Mixtral, Qwen2-MoE, Qwen3-MoE), in two
//! phases: the router, computed with the layer core, picks each token's experts; then
//! exactly those experts are fetched (from the expert cache, or from the layer when it
//! carries all of them) and run over the tokens routed to them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::config::{GroupScore, ModelConfig, MoeConfig, Scoring};
use super::error::ModelError;
pub use super::split::{CpuSide, LayerSides};
use strata_backend::{Backend, Fused, Rows};
use strata_sched::SchedError;
use strata_tensor::tensor::HostTensor;

/// A gated MLP: a dense layer's, the shared expert's, or one routed expert's.
pub struct Mlp<B: Backend> {
    pub width: usize,
    pub gate: B::Weight, // (width, hidden)
    pub up: B::Weight,   // (width, hidden)
    pub down: B::Weight, // (hidden, width)
    /// The projections' biases (gpt-oss's experts): (width), (width), (hidden).
    pub bias: Option<[B::Weight; 3]>,
}

/// What a MoE layer's core holds for its feed-forward block.
pub struct MoeWeights<B: Backend> {
    pub router: B::Weight, // (n_experts, hidden)
    /// The router's own bias, added to its logits (gpt-oss), (n_experts).
    pub router_bias: Option<B::Weight>,
    /// The bias each expert's score gets to choose (`e_score_correction_bias`).
    pub choice_bias: Option<Vec<f32>>,
    /// The shared expert and its gate (`(1, hidden)`, Qwen2-MoE; none: added as it is).
    pub shared: Option<(Mlp<B>, Option<B::Weight>)>,
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
    Ok(Mlp { width, gate, up, down, bias: None })
}

/// The layer-local names of expert `e`'s biases, where the family has them.
pub fn expert_bias_names(c: &ModelConfig, e: usize) -> Option<[String; 3]> {
    use super::spec::Role;
    let spec = c.spec();
    let name = |role: Role| spec.tensor(role).map(|t| t.hf_for(e));
    Some([name(Role::ExpertGateBias)?, name(Role::ExpertUpBias)?, name(Role::ExpertDownBias)?])
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

/// Each row's experts and their weights, as transformers routes: the scores (softmax
/// over every expert's logit, or each one's sigmoid); the `top_k` best (the lower index
/// first on ties) of the scores plus `bias` when given, among the experts of the
/// `groups_used` groups that score highest when the experts are grouped (by their two
/// best biased scores' sum or their best, [`MoeConfig::group_score`]; the others count
/// as 0 or as minus infinity, [`MoeConfig::group_mask_zero`]); weighted by their
/// scores, rescaled to sum to 1 when `norm_topk_prob`, times `routed_scale`.
pub fn route(logits: &[f32], m: &MoeConfig, bias: Option<&[f32]>) -> Vec<(Vec<u32>, Vec<f32>)> {
    let n = m.n_experts;
    logits
        .chunks_exact(n)
        .map(|row| {
            // Softmax experts are ranked by their unnormalized scores (the same order),
            // so that one NaN logit spoils only its own expert's rank.
            let (scores, rank): (Vec<f32>, Vec<f32>) = match m.scoring {
                Scoring::Softmax => {
                    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let exp: Vec<f32> = row.iter().map(|&z| (z - max).exp()).collect();
                    let sum: f32 = exp.iter().sum();
                    (exp.iter().map(|&e| e / sum).collect(), exp)
                }
                Scoring::Sigmoid => {
                    let s: Vec<f32> = row.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect();
                    (s.clone(), s)
                }
            };
            let mut choice: Vec<f32> = match bias {
                Some(b) => rank.iter().zip(b).map(|(s, b)| s + b).collect(),
                None => rank,
            };
            if m.groups > 1 {
                let per = n / m.groups;
                let group_score = |g: usize| {
                    let group = &choice[g * per..(g + 1) * per];
                    match m.group_score {
                        GroupScore::TopTwoSum => most(group, 2).iter().map(|&i| group[i as usize]).sum::<f32>(),
                        GroupScore::Max => group[most(group, 1)[0] as usize],
                    }
                };
                let sums: Vec<f32> = (0..m.groups).map(group_score).collect();
                let kept = most(&sums, m.groups_used);
                let masked = if m.group_mask_zero { 0.0 } else { f32::NEG_INFINITY };
                for g in (0..m.groups).filter(|g| !kept.contains(&(*g as u32))) {
                    choice[g * per..(g + 1) * per].fill(masked);
                }
            }
            let order = most(&choice, m.top_k);
            let mut w: Vec<f32> = order.iter().map(|&e| scores[e as usize]).collect();
            if m.norm_topk_prob {
                // transformers adds 1e-20 to the sum of sigmoid scores (softmax ones are
                // never all zero).
                let total: f32 = w.iter().sum::<f32>() + if m.scoring == Scoring::Sigmoid { 1e-20 } else { 0.0 };
                w.iter_mut().for_each(|x| *x /= total);
            }
            if m.routed_scale != 1.0 {
                w.iter_mut().for_each(|x| *x *= m.routed_scale);
            }
            (order, w)
        })
        .collect()
}

/// The indices of the `k` largest values, largest first (the lower index first on
/// ties); NaN sorts last, so a broken router never picks it first.
fn most(values: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (values[a as usize], values[b as usize]);
        pb.partial_cmp(&pa).unwrap_or_else(|| pa.is_nan().cmp(&pb.is_nan())).then(a.cmp(&b))
    });
    order.truncate(k);
    order
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
    let routing = route(&be.download(&moe.logits, rows * m.n_experts)?, &m, w.choice_bias.as_deref());
    Ok(routing.into_iter().map(|(ids, _)| ids).collect())
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
    /// (rows, hidden): the CPU side's experts' sum, copied up (a MoE model's only).
    pub from_cpu: B::Buf,
}

impl<B: Backend> MoeBufs<B> {
    pub fn new(be: &B, c: &ModelConfig, rows: usize) -> Result<Option<Self>, strata_backend::BackendError> {
        let width = match (c.moe, c.neuron_group) {
            (Some(m), _) => m.n_experts,
            (None, Some(group)) => group,
            (None, None) => return Ok(None),
        };
        let h = c.hidden_size;
        let from_cpu = be.alloc(if c.moe.is_some() { rows * h } else { 0 })?;
        Ok(Some(MoeBufs {
            logits: be.alloc(rows * width)?,
            xe: be.alloc(rows * h)?,
            ye: be.alloc(rows * h)?,
            from_cpu,
        }))
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
    mlp_hidden(be, c, mlp, x, seq_rows, bufs)?;
    be.matmul_seqs(bufs.gate, seq_rows, &mlp.down, out)?;
    if let Some([_, _, bd]) = &mlp.bias {
        be.add_bias(out, seq_rows.iter().sum(), bd)?;
    }
    Ok(())
}

/// `residual += mlp(x)` over `rows` rows: the down product added straight into the
/// residual stream where the backend fuses that ([`Fused::MatmulAdd`]) and the MLP has
/// no biases; else computed into `scratch` and added, as [`mlp_forward`] then
/// `add_rows` give it.
#[allow(clippy::too_many_arguments)]
pub fn mlp_forward_add<B: Backend>(
    be: &B,
    c: &ModelConfig,
    mlp: &Mlp<B>,
    x: &B::Buf,
    seq_rows: &[usize],
    bufs: &mut MlpBufs<'_, B>,
    residual: &mut B::Buf,
    scratch: &mut B::Buf,
) -> Result<(), ModelError> {
    mlp_hidden(be, c, mlp, x, seq_rows, bufs)?;
    let rows = seq_rows.iter().sum::<usize>();
    if mlp.bias.is_none() {
        let mut add = Fused::MatmulAdd { x: &*bufs.gate, seq_rows, w: &mlp.down, out: &mut *residual };
        if let Some(done) = be.fused(&mut add) {
            return Ok(done?);
        }
    }
    be.matmul_seqs(bufs.gate, seq_rows, &mlp.down, scratch)?;
    if let Some([_, _, bd]) = &mlp.bias {
        be.add_bias(scratch, rows, bd)?;
    }
    Ok(be.add_rows(residual, scratch, c.hidden_size, Rows::first(rows), None)?)
}

/// `bufs.gate = act(x · gateᵀ) ⊙ (x · upᵀ)` (with the biases), an MLP's hidden rows.
fn mlp_hidden<B: Backend>(
    be: &B,
    c: &ModelConfig,
    mlp: &Mlp<B>,
    x: &B::Buf,
    seq_rows: &[usize],
    bufs: &mut MlpBufs<'_, B>,
) -> Result<(), ModelError> {
    let rows = seq_rows.iter().sum::<usize>();
    let act = c.spec().activation;
    // Without biases the backend may fuse gate, up and the activation (one launch on
    // CUDA's packed weights), with the same bits as the three ops below.
    let fused = match &mlp.bias {
        None => be.fused(&mut Fused::Glu { x, seq_rows, gate: &mlp.gate, up: &mlp.up, act, out: &mut *bufs.gate }),
        Some(_) => None,
    };
    match fused {
        Some(done) => done?,
        None => {
            be.matmul_seqs_each(x, seq_rows, &mut [(&mlp.gate, bufs.gate), (&mlp.up, bufs.up)])?;
            if let Some([bg, bu, _]) = &mlp.bias {
                be.add_bias(bufs.gate, rows, bg)?;
                be.add_bias(bufs.up, rows, bu)?;
            }
            be.glu(bufs.gate, bufs.up, rows * mlp.width, act)?;
        }
    }
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
    /// The routed experts the CPU computes beside the device, when it computes some
    /// ([`CpuSide`]). An entry of `seq_rows` of more than one row is a prompt chunk
    /// (a verifying sequence's rows come one by one), which the plan may run wholly on
    /// the device.
    pub cpu: Option<&'a CpuSide>,
}

/// The rows routed to each expert, with their routing weights, by expert (ascending).
type ByExpert = BTreeMap<usize, (Vec<u32>, Vec<f32>)>;

/// Expert `expert` over the rows routed to it (`rows_of` of `input`, with their
/// `weights`), added into `out`; `xe` and `ye` are scratch. Each sequence's rows go
/// through it as they would alone (`seq_of`: each row's sequence).
#[allow(clippy::too_many_arguments)]
pub fn run_expert<B: Backend>(
    be: &B,
    c: &ModelConfig,
    expert: &Mlp<B>,
    input: &B::Buf,
    (rows_of, weights): (&[u32], &[f32]),
    seq_of: &[usize],
    bufs: &mut MlpBufs<'_, B>,
    (xe, ye): (&mut B::Buf, &mut B::Buf),
    out: &mut B::Buf,
) -> Result<(), ModelError> {
    let h = c.hidden_size;
    be.copy_rows(input, Rows::List(rows_of), h, xe, 0)?;
    let per_seq = runs_by_sequence(rows_of, seq_of);
    mlp_forward(be, c, expert, xe, &per_seq, bufs, ye)?;
    Ok(be.add_rows(out, ye, h, Rows::List(rows_of), Some(weights))?)
}

/// A MoE layer's feed-forward output for `rows` rows of `input` into `out` (`(rows,
/// hidden)`): the shared expert (scaled by its sigmoid gate), plus each routed expert
/// over its rows, weighted. Returns the routing (each row's experts). Every product runs
/// per sequence ([`Backend::matmul_seqs`]): a sequence's routing and its rows through
/// each expert come out as they do when it runs alone, whatever shares the batch.
///
/// With a CPU side, the experts it computes for this layer get their rows on the host
/// (one copy down of the layer's input), run there while the device runs the shared
/// expert and its own experts, and come back summed (one copy up).
pub fn moe_forward<B: Backend>(
    be: &B,
    c: &ModelConfig,
    block: MoeBlock<'_, B>,
    bufs: &mut MlpBufs<'_, B>,
    moe: &mut MoeBufs<B>,
    out: &mut B::Buf,
) -> Result<Vec<Vec<u32>>, ModelError> {
    let MoeBlock { layer, weights: w, source, input, rows, seq_rows, cpu } = block;
    let Some(m) = c.moe else { return Ok(Vec::new()) };
    let h = c.hidden_size;
    // The sequence each row belongs to.
    let seq_of: Vec<usize> = seq_rows.iter().enumerate().flat_map(|(s, &n)| std::iter::repeat_n(s, n)).collect();
    // Phase 1: the router, on the host (its choice drives what is read).
    be.matmul_seqs(input, seq_rows, &w.router, &mut moe.logits)?;
    if let Some(b) = &w.router_bias {
        be.add_bias(&mut moe.logits, rows, b)?;
    }
    let routing = route(&be.download(&moe.logits, rows * m.n_experts)?, &m, w.choice_bias.as_deref());
    // Each row's expert goes to the side that computes it.
    let sides = cpu.and_then(|side| side.sides(layer, seq_rows));
    let on_cpu = |s: usize, e: usize| sides.as_ref().is_some_and(|v| v.on_cpu(s, e));
    let (mut on_device, mut on_host) = (ByExpert::new(), ByExpert::new());
    for (row, (ids, weights)) in routing.iter().enumerate() {
        for (&e, &wt) in ids.iter().zip(weights) {
            let side = if on_cpu(seq_of[row], e as usize) { &mut on_host } else { &mut on_device };
            let entry = side.entry(e as usize).or_default();
            entry.0.push(row as u32);
            entry.1.push(wt);
        }
    }
    if let Some(side) = cpu {
        let uploaded = sides.as_ref().is_some_and(LayerSides::uploads);
        side.record(layer, &routing, on_device.len(), on_host.len(), uploaded);
    }
    // The rows the CPU needs cross first, and its experts start on its own thread, so
    // that it runs while the device's work is queued and runs.
    let pending = match (cpu, on_host.is_empty()) {
        (Some(side), false) => {
            let host_in = side.rows_down(be, input, rows * h)?;
            Some(side.start(layer, host_in, seq_of.clone(), std::mem::take(&mut on_host)))
        }
        _ => None,
    };

    be.unary(out, rows * h, strata_backend::Unary::Scale(0.0))?;
    if let Some((shared, gate)) = &w.shared {
        let scale = match gate {
            Some(gate) => {
                be.matmul_seqs(input, seq_rows, gate, &mut moe.logits)?;
                Some(be.download(&moe.logits, rows)?.iter().map(|&g| 1.0 / (1.0 + (-g).exp())).collect::<Vec<f32>>())
            }
            None => None,
        };
        mlp_forward(be, c, shared, input, seq_rows, bufs, &mut moe.ye)?;
        be.add_rows(out, &moe.ye, h, Rows::first(rows), scale.as_deref())?;
    }
    // Phase 2: exactly the routed experts (all reads issued together), each computed
    // over its rows as it arrives, in expert order (so the sum is the same whatever the
    // order the reads complete in).
    let wanted: Vec<usize> = on_device.keys().copied().collect();
    let groups: Vec<&(Vec<u32>, Vec<f32>)> = on_device.values().collect();
    let mut run = |i: usize, expert: &Mlp<B>| -> Result<(), ModelError> {
        let (rows_of, weights) = groups[i];
        let scratch = (&mut moe.xe, &mut moe.ye);
        run_expert(be, c, expert, input, (rows_of, weights), &seq_of, bufs, scratch, out)
    };
    match &w.experts {
        Some(all) => wanted.iter().enumerate().try_for_each(|(i, &e)| run(i, &all[e]))?,
        None => source.units(layer, &wanted, &mut run)?,
    }
    // The CPU's experts' sum, up and into the output.
    if let (Some(side), Some(pending)) = (cpu, pending) {
        side.rows_up(be, &pending.wait()?, &mut moe.from_cpu, out, rows, h)?;
    }
    Ok(routing.into_iter().map(|(ids, _)| ids).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(top_k: usize, norm: bool) -> MoeConfig {
        MoeConfig { norm_topk_prob: norm, ..MoeConfig::softmax(4, top_k, 8) }
    }

    #[test]
    fn routing_takes_the_most_probable_experts() {
        let logits = [0.0, 2.0, 1.0, 2.0, /* row 2 */ 5.0, 0.0, 0.0, 0.0];
        let r = route(&logits, &cfg(2, false), None);
        // Ties go to the lower index.
        assert_eq!(r[0].0, vec![1, 3]);
        let p = (2.0f32).exp() / (1.0 + 2.0 * (2.0f32).exp() + 1.0f32.exp());
        assert!((r[0].1[0] - p).abs() < 1e-6 && (r[0].1[1] - p).abs() < 1e-6);
        assert_eq!(r[1].0[0], 0);
        let n = route(&logits, &cfg(2, true), None);
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
        let r = route(&[f32::NAN, 1.0, 0.0, -1.0], &cfg(1, true), None);
        assert_eq!(r[0].0, vec![1]);
    }

    /// DeepSeek-V3's routing: the bias moves the choice, not the weights; only experts
    /// of the best groups are chosen; the weights are renormalized, then scaled.
    #[test]
    fn grouped_sigmoid_routing_chooses_by_bias_and_group() {
        let m = MoeConfig {
            scoring: Scoring::Sigmoid,
            choice_bias: true,
            groups: 2,
            groups_used: 1,
            norm_topk_prob: true,
            routed_scale: 2.0,
            ..MoeConfig::softmax(4, 2, 8)
        };
        // Group 0 = experts 0, 1; group 1 = experts 2, 3.
        let logits = [2.0, -1.0, 1.0, 0.5];
        let sig = |z: f32| 1.0 / (1.0 + (-z).exp());
        // Unbiased, group 1 scores higher (0.73 + 0.62 against 0.88 + 0.27).
        let (ids, w) = route(&logits, &m, Some(&[0.0; 4])).remove(0);
        assert_eq!(ids, vec![2, 3]);
        let total = sig(1.0) + sig(0.5);
        assert!((w[0] - 2.0 * sig(1.0) / total).abs() < 1e-6 && (w[1] - 2.0 * sig(0.5) / total).abs() < 1e-6);
        // A bias on expert 1 brings group 0 ahead; the weights are still the plain scores.
        let (ids, w) = route(&logits, &m, Some(&[0.0, 0.5, 0.0, 0.0])).remove(0);
        assert_eq!(ids, vec![0, 1]);
        let total = sig(2.0) + sig(-1.0);
        assert!((w[0] - 2.0 * sig(2.0) / total).abs() < 1e-6 && (w[1] - 2.0 * sig(-1.0) / total).abs() < 1e-6);
    }

    /// DeepSeek-V2's `group_limited_greedy`: a group counts by its best expert, not by
    /// its two best; the weights are softmax probabilities times the scale, unnormalized.
    #[test]
    fn group_limited_greedy_scores_a_group_by_its_best_expert() {
        let m = MoeConfig { groups: 2, groups_used: 1, routed_scale: 2.0, ..MoeConfig::softmax(4, 2, 8) };
        // Group 0 = experts 0, 1 (probabilities ∝ 7.39, 6.69: best 7.39, sum 14.08); group 1 =
        // experts 2, 3 (∝ 12.18, 1: best 12.18, sum 13.18).
        let logits = [2.0, 1.9, 2.5, 0.0];
        let (ids, _) = route(&logits, &m, None).remove(0);
        assert_eq!(ids, vec![0, 1], "the sum of the two best keeps group 0");
        let max = MoeConfig { group_score: GroupScore::Max, ..m };
        let (ids, w) = route(&logits, &max, None).remove(0);
        assert_eq!(ids, vec![2, 3], "the best keeps group 1");
        let sum: f32 = logits.iter().map(|z| z.exp()).sum();
        assert!((w[0] - 2.0 * 2.5f32.exp() / sum).abs() < 1e-6 && (w[1] - 2.0 / sum).abs() < 1e-6);
    }
}
