//! Gate-predicted sparse FFN (seed 002, R2). In a SwiGLU block neuron `i` adds
//! `silu(gate_i · x) * (up_i · x) * down[:, i]`: when `silu(gate_i · x)` is near zero it
//! adds nearly nothing, whatever `up_i · x` is. The gate projection is computed in full;
//! `up` and `down` are stored as neuron-group bundles (`strata convert --sparse-ffn`:
//! group `g`'s rows of `up` and columns of `down`, side by side, one read), and each row
//! keeps the groups whose gate activity, weighted by each neuron's `‖up_i‖ · ‖down[:, i]‖`,
//! is largest. Only those groups are read (through
//! the neuron-group cache) and computed, each with the dense kernels over its own slice.
//!
//! Approximate by design: docs/benchmarks.md gives its cost on a real model.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::config::{Ffn, ModelConfig};
use super::error::ModelError;
use super::moe::{MlpBufs, MoeBufs, UnitSource};
use super::spec::NEURON_SCALE;
use strata_backend::{Activation, Backend, Fused, Rows};
use strata_quant::ReadF32;
use strata_sched::SchedError;
use strata_tensor::tensor::HostTensor;

pub use strata_sched::sparse::{AUTO_TOPK, Select, SparseFfn};

/// A `--sparse-ffn` asked of a model that cannot have it, or another setting a command
/// refuses before it starts (a `.cawsf` output not named `.cawsf`, `--prefetch-depth 0`,
/// a `--keep-alive` that is not a duration): the CLI exits with 2, as for a bad argument
/// (`cli::refused_in_chain`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Why model `name` (config `c`, stored without neuron-group bundles) cannot run a sparse
/// setting: its architecture, or how to convert it.
pub fn without_bundles(c: &ModelConfig, name: &str) -> String {
    unsupported(c).unwrap_or_else(|| {
        format!(
            "model `{name}` was converted without neuron-group bundles (convert it with `strata convert --sparse-ffn`)"
        )
    })
}

/// Why a model cannot be stored or run with a sparse FFN, or `None` when it can: a
/// dense gated FFN with SiLU (SwiGLU) and separate gate and up projections.
pub fn unsupported(c: &ModelConfig) -> Option<String> {
    use super::spec::Role;
    let spec = c.spec();
    let arch = spec.hf_type;
    if c.layers.iter().any(|l| l.ffn == Ffn::Moe) {
        return Some(format!("`{arch}` has mixture-of-experts FFNs; a sparse FFN needs a dense SwiGLU block"));
    }
    if spec.activation != Activation::Silu {
        return Some(format!("`{arch}` does not use a SwiGLU FFN (its activation is {:?})", spec.activation));
    }
    if spec.tensor(Role::Gate).is_none() || spec.tensor(Role::Up).is_none() {
        return Some(format!("`{arch}` stores gate and up fused; a sparse FFN needs them apart"));
    }
    None
}

/// Bytes of a neuron-group bundle `strata convert --sparse-ffn` aims at: where random
/// reads from 4 readers reach the plateau of the development VM's disk (1.22 GB/s at
/// 128 KiB, 0.77 at 32 KiB, 1.38 at 1 MiB; docs/formats.md, "Sparse FFN bundles").
pub const BUNDLE_BYTES: u64 = 128 << 10;

/// The group size whose bundle (`bytes_per_neuron` each: a neuron's row of `up` and
/// column of `down`, as stored) is nearest `target` bytes, among the sizes that divide
/// the FFN width and are whole blocks of `down` (`block` columns). `None` when no size
/// does.
pub fn group_for(width: usize, bytes_per_neuron: usize, block: usize, target: u64) -> Option<usize> {
    (1..=width)
        .filter(|g| width.is_multiple_of(*g) && g.is_multiple_of(block.max(1)))
        .min_by_key(|&g| ((g * bytes_per_neuron) as i64 - target as i64).unsigned_abs())
}

/// A dense layer's FFN as neuron-group bundles: `up` `(width, hidden)` and `down`
/// `(hidden, width)` → per group `g`, `up` rows and `down` columns `g·group..(g+1)·group`,
/// under their bundle names ([`strata_format::NEURON_PREFIX`]). The bytes are the
/// stored blocks, copied (no requantization): `group` must be a multiple of `down`'s
/// block size and divide `width`.
pub fn bundle(up: &HostTensor, down: &HostTensor, group: usize) -> Result<Vec<(String, HostTensor)>, String> {
    let (&[width, hidden], &[h2, w2]) = (&up.shape[..], &down.shape[..]) else {
        return Err(format!("up {:?} and down {:?} are not matrices", up.shape, down.shape));
    };
    let block = down.dtype.block_size();
    if h2 != hidden || w2 != width {
        return Err(format!("up {:?} and down {:?} do not fit together", up.shape, down.shape));
    }
    if group == 0 || !width.is_multiple_of(group) || !group.is_multiple_of(block) {
        return Err(format!(
            "a group of {group} neurons must divide the FFN width {width} and be a multiple of down's block of {block} ({})",
            down.dtype.name()
        ));
    }
    let down_row = down.byte_len() / hidden;
    let slice = down_row / (width / group); // one group's share of a down row
    let mut out = Vec::with_capacity(2 * width / group + 1);
    out.push((NEURON_SCALE.to_string(), HostTensor::from_f32(&neuron_scale(up, down), vec![width])));
    for g in 0..width / group {
        let up_g = up.rows(g * group, group).ok_or_else(|| format!("cannot take rows of {up:?}"))?;
        let mut bytes = strata_tensor::tensor::AlignedBytes::zeroed(hidden * slice);
        let src = down.bytes();
        for r in 0..hidden {
            let from = r * down_row + g * slice;
            bytes.bytes_mut()[r * slice..(r + 1) * slice].copy_from_slice(&src[from..from + slice]);
        }
        let down_g = HostTensor::new(Arc::new(bytes), 0, hidden * slice, down.dtype, vec![hidden, group]);
        let p = strata_format::NEURON_PREFIX;
        out.push((format!("{p}{g}.up_proj.weight"), up_g));
        out.push((format!("{p}{g}.down_proj.weight"), down_g));
    }
    Ok(out)
}

/// Per neuron `i`, `‖up_i‖ · ‖down[:, i]‖` (the values the stored blocks stand for): how
/// much the neuron's output can weigh per unit of `act(gate_i · x)`, since `|up_i · x| ≤
/// ‖up_i‖ ‖x‖` and `x` is the same for every neuron of a row. Gate activity times this
/// ranks the groups; without it a group of rarely active neurons with large weights
/// (SmolLM2 has such) is dropped as if it did not matter.
pub fn neuron_scale(up: &HostTensor, down: &HostTensor) -> Vec<f32> {
    let (u, d) = (up.to_f32_vec(), down.to_f32_vec());
    let width = up.shape[0];
    let hidden = up.shape.get(1).copied().unwrap_or(0);
    let mut col = vec![0f64; width];
    for row in d.chunks_exact(width.max(1)) {
        col.iter_mut().zip(row).for_each(|(c, &v)| *c += (v as f64) * (v as f64));
    }
    u.chunks_exact(hidden.max(1))
        .zip(&col)
        .map(|(r, &c)| (r.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt() * c.sqrt()) as f32)
        .collect()
}

/// One neuron group's weights: its rows of `up` `(group, hidden)` and columns of `down`
/// `(hidden, group)`.
pub struct Bundle<B: Backend> {
    pub up: B::Weight,
    pub down: B::Weight,
}

/// What a sparse layer's core holds for its FFN.
pub struct NeuronWeights<B: Backend> {
    pub gate: B::Weight, // (width, hidden)
    /// [`neuron_scale`] of each neuron, on the host (the choice is made there).
    pub scale: Vec<f32>,
    pub group: usize,
    /// Every group, when the layer is loaded whole; `None` when they come from the
    /// neuron-group cache.
    pub groups: Option<Vec<Arc<Bundle<B>>>>,
}

/// Per row, the groups it keeps (ascending), from the gate's pre-activations `gate`
/// (`(rows, width)`, rows by sequence as `seq_rows` says, each sequence with its own
/// setting) and each neuron's [`neuron_scale`].
pub fn choose(gate: &[f32], scale: &[f32], seq_rows: &[usize], group: usize, settings: &[SparseFfn]) -> Vec<Vec<u32>> {
    let width = scale.len();
    let mut out = Vec::with_capacity(gate.len() / width.max(1));
    let mut at = 0;
    for (&len, &s) in seq_rows.iter().zip(settings) {
        out.extend(choose_one(&gate[at * width..(at + len) * width], scale, group, s));
        at += len;
    }
    out
}

/// [`choose`] for the rows of one sequence.
fn choose_one(gate: &[f32], scale: &[f32], group: usize, s: SparseFfn) -> Vec<Vec<u32>> {
    let width = scale.len();
    let n = width / group.max(1);
    let rows = gate.len() / width.max(1);
    if s.is_off() {
        return vec![(0..n as u32).collect(); rows];
    }
    // Each row's activity per group: the sum over its neurons of |silu(gate)| · scale.
    let silu = |x: f32| x / (1.0 + (-x).exp());
    let scores: Vec<Vec<f32>> = gate
        .chunks_exact(width)
        .map(|row| {
            row.chunks_exact(group)
                .zip(scale.chunks_exact(group))
                .map(|(g, sc)| g.iter().zip(sc).map(|(&x, &k)| silu(x).abs() * k).sum())
                .collect()
        })
        .collect();
    let keep = |score: &[f32]| -> Vec<u32> {
        match s.select {
            Select::Off => (0..n as u32).collect(),
            Select::Threshold(t) => (0..n as u32).filter(|&g| score[g as usize] as f64 >= t * group as f64).collect(),
            Select::TopK(f) => {
                // ⌈F·n⌉, not fooled by F's rounding (0.6 · 5 is 3.0000000000000004).
                let k = ((f * n as f64 - 1e-9).ceil() as usize).clamp(1, n);
                let mut order: Vec<u32> = (0..n as u32).collect();
                // Largest first, the lower index on ties (NaN last).
                order.sort_by(|&a, &b| {
                    let (x, y) = (score[a as usize], score[b as usize]);
                    y.partial_cmp(&x).unwrap_or_else(|| x.is_nan().cmp(&y.is_nan())).then(a.cmp(&b))
                });
                order.truncate(k);
                order.sort_unstable();
                order
            }
        }
    };
    match s.per_sequence {
        false => scores.iter().map(|sc| keep(sc)).collect(),
        true => {
            let mut total = vec![0f32; n];
            for sc in &scores {
                total.iter_mut().zip(sc).for_each(|(t, x)| *t += x);
            }
            // The threshold applies to the sequence's mean activity.
            total.iter_mut().for_each(|t| *t /= rows.max(1) as f32);
            vec![keep(&total); rows]
        }
    }
}

/// One sparse FFN's inputs: `rows` rows of `input` (normed) through layer `layer`.
pub struct SparseBlock<'a, B: Backend> {
    pub layer: usize,
    pub weights: &'a NeuronWeights<B>,
    pub source: &'a dyn UnitSource<Bundle<B>>,
    pub input: &'a B::Buf,
    /// Rows per sequence of the batch, in order (see [`Backend::matmul_seqs`]).
    pub seq_rows: &'a [usize],
    /// Each sequence's setting.
    pub settings: &'a [SparseFfn],
}

/// A sparse FFN's output for `rows` rows of `input` into `out` (`(rows, hidden)`): the
/// gate in full, then each kept group over the rows that keep it, in group order.
/// Returns the row-groups kept, of those there were.
pub fn sparse_forward<B: Backend>(
    be: &B,
    c: &ModelConfig,
    block: SparseBlock<'_, B>,
    bufs: &mut MlpBufs<'_, B>,
    nb: &mut MoeBufs<B>,
    out: &mut B::Buf,
) -> Result<(u64, u64), ModelError> {
    let SparseBlock { layer, weights: w, source, input, seq_rows, settings } = block;
    let rows: usize = seq_rows.iter().sum();
    let (h, width, group) = (c.hidden_size, c.intermediate_size, w.group);
    let n = width / group.max(1);
    if n == 0 || !width.is_multiple_of(group) {
        return Err(SchedError::Build { layer, msg: format!("groups of {group} in an FFN of {width}") }.into());
    }
    be.matmul_seqs(input, seq_rows, &w.gate, bufs.gate)?;
    let kept = match settings.iter().all(SparseFfn::is_off) {
        true => vec![(0..n as u32).collect::<Vec<u32>>(); rows],
        false => choose(&be.download(bufs.gate, rows * width)?, &w.scale, seq_rows, group, settings),
    };
    let mut by_group: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for (row, gs) in kept.iter().enumerate() {
        for &g in gs {
            by_group.entry(g as usize).or_default().push(row as u32);
        }
    }
    let wanted: Vec<usize> = by_group.keys().copied().collect();
    let row_lists: Vec<&Vec<u32>> = by_group.values().collect();
    let seq_of: Vec<usize> = seq_rows.iter().enumerate().flat_map(|(s, &k)| std::iter::repeat_n(s, k)).collect();
    let act = c.spec().activation;
    let kept_total: u64 = kept.iter().map(|k| k.len() as u64).sum();
    be.unary(out, rows * h, strata_backend::Unary::Scale(0.0))?;
    // A decode row over groups already in memory: all of them in one op where the
    // backend fuses it (the same bits as group by group).
    if let (Some(all), 1) = (&w.groups, rows) {
        let items: Vec<(usize, &B::Weight, &B::Weight)> =
            wanted.iter().map(|&g| (g, &all[g].up, &all[g].down)).collect();
        let mut op = Fused::SparseGroupsRow { x: input, gate: bufs.gate, groups: &items, group, act, out: &mut *out };
        if let Some(done) = be.fused(&mut op) {
            done?;
            return Ok((kept_total, (rows * n) as u64));
        }
    }
    let mut run = |i: usize, b: &Bundle<B>| -> Result<(), ModelError> {
        let rows_of = row_lists[i];
        let g = wanted[i];
        let whole = rows_of.len() == rows;
        let x = match whole {
            true => input,
            false => {
                be.copy_rows(input, Rows::List(rows_of), h, &mut nb.xe, 0)?;
                &nb.xe
            }
        };
        let per_seq = super::moe::runs_by_sequence(rows_of, &seq_of);
        be.matmul_seqs(x, &per_seq, &b.up, bufs.up)?;
        // The gate's pre-activations of this group, row by row: viewed as rows of
        // `group` values, row r's group g is row `r * n + g`.
        let at: Vec<u32> = rows_of.iter().map(|&r| r * n as u32 + g as u32).collect();
        be.copy_rows(bufs.gate, Rows::List(&at), group, &mut nb.logits, 0)?;
        be.glu(&mut nb.logits, bufs.up, rows_of.len() * group, act)?;
        be.matmul_seqs(&nb.logits, &per_seq, &b.down, &mut nb.ye)?;
        let dst = if whole { Rows::first(rows) } else { Rows::List(rows_of) };
        Ok(be.add_rows(out, &nb.ye, h, dst, None)?)
    };
    match &w.groups {
        Some(all) => wanted.iter().enumerate().try_for_each(|(i, &g)| run(i, &all[g]))?,
        None => source.units(layer, &wanted, &mut run)?,
    }
    Ok((kept_total, (rows * n) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_the_most_active_groups() {
        // 2 rows, 4 groups of 2: row 0 most active in groups 2 then 0; row 1 in 3 then 1.
        let gate = [1.0, 1.0, 0.0, 0.0, 3.0, 3.0, -5.0, 0.0, /* row 1 */ 0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 4.0, 4.0];
        let s = |x: &str| SparseFfn::parse(x).unwrap();
        let one = |x: &str| choose(&gate, &[1.0; 8], &[2], 2, &[s(x)]);
        assert_eq!(one("topk=0.5"), [vec![0, 2], vec![1, 3]]);
        assert_eq!(one("topk=0.1"), [vec![2], vec![3]]);
        assert_eq!(one("topk=1"), [vec![0, 1, 2, 3], vec![0, 1, 2, 3]]);
        // Per sequence: one choice for both rows, from their summed activity.
        assert_eq!(one("topk=0.5,per=sequence"), [vec![2, 3], vec![2, 3]]);
        // Two sequences of one row each choose apart, each by its own setting.
        assert_eq!(choose(&gate, &[1.0; 8], &[1, 1], 2, &[s("topk=0.25,per=sequence"); 2]), [vec![2], vec![3]]);
        assert_eq!(choose(&gate, &[1.0; 8], &[1, 1], 2, &[s("off"), s("topk=0.25")]), [vec![0, 1, 2, 3], vec![3]]);
        // A threshold on the mean |silu| of the group's neurons: silu(1) = 0.731.
        assert_eq!(one("threshold=0.7"), [vec![0, 2], vec![1, 3]]);
        assert_eq!(one("threshold=100"), [Vec::<u32>::new(), vec![]]);
    }

    #[test]
    fn bundles_are_the_stored_rows_and_column_blocks() {
        use strata_tensor::tensor::DType;
        let (width, hidden) = (64, 32);
        let up: Vec<f32> = (0..width * hidden).map(|k| (k % 13) as f32 - 6.0).collect();
        let down: Vec<f32> = (0..hidden * width).map(|k| (k % 7) as f32 * 0.5).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let q = |x: &[f32], r: usize, c: usize| {
            let b = strata_quant::quantize_matrix(&pool, DType::Q8_0, x, r, c).unwrap();
            let len = strata_tensor::tensor::ByteSource::bytes(&b).len();
            HostTensor::new(Arc::new(b), 0, len, DType::Q8_0, vec![r, c])
        };
        let (up_t, down_t) = (q(&up, width, hidden), q(&down, hidden, width));
        assert!(bundle(&up_t, &down_t, 16).unwrap_err().contains("block of 32"));
        let b = bundle(&up_t, &down_t, 32).unwrap();
        assert_eq!(b.len(), 5);
        // The scale first: ‖up_i‖ · ‖down[:, i]‖ of the values the blocks stand for.
        assert_eq!(b[0].0, NEURON_SCALE);
        let (scale, upf, downf) = (b[0].1.to_f32_vec(), up_t.to_f32_vec(), down_t.to_f32_vec());
        let norm = |v: Vec<f32>| v.iter().map(|x| (x * x) as f64).sum::<f64>().sqrt();
        let want =
            norm(upf[5 * hidden..6 * hidden].to_vec()) * norm((0..hidden).map(|r| downf[r * width + 5]).collect());
        assert!((scale[5] as f64 - want).abs() < 1e-4 * want, "{} against {want}", scale[5]);
        let b = &b[1..];
        let (up_full, down_full) = (up_t.to_f32_vec(), down_t.to_f32_vec());
        for g in 0..2 {
            let (u, d) = (b[2 * g].1.to_f32_vec(), b[2 * g + 1].1.to_f32_vec());
            assert_eq!(b[2 * g].0, format!("mlp.neurons.{g}.up_proj.weight"));
            assert_eq!(u[..], up_full[g * 32 * hidden..(g + 1) * 32 * hidden]);
            for r in 0..hidden {
                assert_eq!(d[r * 32..(r + 1) * 32], down_full[r * width + g * 32..r * width + (g + 1) * 32]);
            }
        }
        let per_neuron = (up_t.byte_len() + down_t.byte_len()) / width;
        assert_eq!(group_for(width, per_neuron, 32, 1 << 20), Some(64));
        assert_eq!(group_for(width, per_neuron, 32, 0), Some(32));
        assert_eq!(group_for(width, per_neuron, 256, 0), None);
    }

    /// A random matrix of `dtype`, and the f32 values its blocks stand for.
    fn random(rows: usize, cols: usize, dtype: strata_tensor::tensor::DType, seed: u64) -> HostTensor {
        let mut state = seed;
        let x: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let b = strata_quant::quantize_matrix(&pool, dtype, &x, rows, cols).unwrap();
        let len = strata_tensor::tensor::ByteSource::bytes(&b).len();
        HostTensor::new(Arc::new(b), 0, len, dtype, vec![rows, cols])
    }

    struct Groups(Vec<Arc<Bundle<strata_backend::cpu::CpuBackend>>>);
    impl UnitSource<Bundle<strata_backend::cpu::CpuBackend>> for Groups {
        fn units(
            &self,
            _: usize,
            groups: &[usize],
            each: &mut crate::moe::EachUnit<'_, Bundle<strata_backend::cpu::CpuBackend>>,
        ) -> Result<(), ModelError> {
            groups.iter().enumerate().try_for_each(|(i, &g)| each(i, &self.0[g]))
        }
    }

    /// A one-layer llama config of `h` and `width` with neuron groups of `group`.
    fn grouped_config(h: usize, width: usize, group: usize) -> ModelConfig {
        let json = format!(
            r#"{{"model_type":"llama","hidden_size":{h},"intermediate_size":{width},"num_hidden_layers":1,
               "num_attention_heads":2,"vocab_size":8}}"#
        );
        let mut c = ModelConfig::from_json(&json).unwrap();
        c.neuron_group = Some(group);
        c
    }

    /// `up` and `down` as bundles of `group`: each neuron's scale, and the groups.
    type CpuGroups = Vec<Arc<Bundle<strata_backend::cpu::CpuBackend>>>;
    fn grouped(up: &HostTensor, down: &HostTensor, group: usize) -> (Vec<f32>, CpuGroups) {
        let bundles = bundle(up, down, group).unwrap();
        let scale = bundles[0].1.to_f32_vec();
        let groups =
            bundles[1..].chunks(2).map(|b| Arc::new(Bundle { up: b[0].1.clone(), down: b[1].1.clone() })).collect();
        (scale, groups)
    }

    /// The sparse FFN over the groups each row keeps equals the dense MLP whose gate, up
    /// and down are cut down to those groups' neurons (each row alone), and with every
    /// group it equals the dense MLP.
    #[test]
    fn the_sparse_ffn_is_the_dense_one_restricted_to_the_kept_groups() {
        use strata_backend::cpu::CpuBackend;
        use strata_tensor::tensor::DType;
        let (h, width, group, rows) = (64, 256, 64, 3);
        let c = grouped_config(h, width, group);
        let be = CpuBackend::new(2);
        for dtype in [DType::Q8_0, DType::Q4_0, DType::F32] {
            let (gate, up, down) = (random(width, h, dtype, 1), random(width, h, dtype, 2), random(h, width, dtype, 3));
            let (scale, groups) = grouped(&up, &down, group);
            let x: Vec<f32> = random(rows, h, DType::F32, 4).to_f32_vec();
            let w = NeuronWeights { gate: gate.clone(), scale, group, groups: None };
            for setting in ["topk=0.5", "topk=0.25,per=sequence", "off"] {
                let setting = SparseFfn::parse(setting).unwrap();
                let (mut g_buf, mut u_buf, mut out) =
                    (vec![0f32; rows * width], vec![0f32; rows * width], vec![0f32; rows * h]);
                let mut nb = MoeBufs::new(&be, &c, rows).unwrap().unwrap();
                let source = Groups(groups.clone());
                let settings = [setting];
                let block = SparseBlock {
                    layer: 0,
                    weights: &w,
                    source: &source,
                    input: &x,
                    seq_rows: &[rows],
                    settings: &settings,
                };
                let mut bufs = MlpBufs { gate: &mut g_buf, up: &mut u_buf };
                let (kept, total) = sparse_forward(&be, &c, block, &mut bufs, &mut nb, &mut out).unwrap();
                assert_eq!(total, (rows * width / group) as u64);
                // The groups kept, as `choose` picks them from the gate.
                let mut pre = vec![0f32; rows * width];
                be.matmul(&x, rows, &gate, &mut pre).unwrap();
                let chosen = choose(&pre, &w.scale, &[rows], group, &[setting]);
                assert_eq!(kept, chosen.iter().map(|k| k.len() as u64).sum::<u64>());
                for (r, keep) in chosen.iter().enumerate() {
                    // The dense MLP over this row with only the kept neurons.
                    let take_rows = |t: &HostTensor| {
                        let parts: Vec<HostTensor> =
                            keep.iter().map(|&g| t.rows(g as usize * group, group).unwrap()).collect();
                        let f: Vec<f32> = parts.iter().flat_map(|p| p.to_f32_vec()).collect();
                        HostTensor::from_f32(&f, vec![keep.len() * group, h])
                    };
                    let (gk, uk) = (take_rows(&gate), take_rows(&up));
                    let full_down = down.to_f32_vec();
                    let dk: Vec<f32> = (0..h)
                        .flat_map(|o| {
                            let row = &full_down[o * width..(o + 1) * width];
                            keep.iter().flat_map(move |&g| row[g as usize * group..(g as usize + 1) * group].to_vec())
                        })
                        .collect();
                    let dk = HostTensor::from_f32(&dk, vec![h, keep.len() * group]);
                    let xr = x[r * h..(r + 1) * h].to_vec();
                    let n = keep.len() * group;
                    let (mut a, mut b, mut y) = (vec![0f32; n], vec![0f32; n], vec![0f32; h]);
                    let xq = |w: &HostTensor, x: &[f32], out: &mut Vec<f32>| {
                        // Quantized weights meet the activation as the kernels do.
                        let w = if dtype == DType::F32 { w.clone() } else { requant(w, dtype) };
                        be.matmul(&x.to_vec(), 1, &w, out).unwrap();
                    };
                    xq(&gk, &xr, &mut a);
                    xq(&uk, &xr, &mut b);
                    be.glu(&mut a, &b, n, Activation::Silu).unwrap();
                    xq(&dk, &a, &mut y);
                    let got = &out[r * h..(r + 1) * h];
                    let err = got.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
                    let scale = y.iter().map(|v| v.abs()).fold(0f32, f32::max);
                    assert!(err <= 1e-5 * scale.max(1.0), "{dtype:?} {setting}: row {r} off by {err} (of {scale})");
                }
            }
        }
    }

    /// A decode row over groups in memory (one fused op on the CPU) gives the bits the
    /// same groups give one by one from a unit source, kept or all.
    #[test]
    fn a_row_over_groups_in_memory_gives_the_group_by_group_bits() {
        use strata_backend::cpu::CpuBackend;
        use strata_tensor::tensor::DType;
        let (h, width, group) = (128, 512, 64);
        let c = grouped_config(h, width, group);
        let be = CpuBackend::new(2);
        for dtype in [DType::Q8_0, DType::Q4_0, DType::F32] {
            let (gate, up, down) = (random(width, h, dtype, 5), random(width, h, dtype, 6), random(h, width, dtype, 7));
            let (scale, groups) = grouped(&up, &down, group);
            let x: Vec<f32> = random(1, h, DType::F32, 8).to_f32_vec();
            // The CPU fuses quantized groups (so the in-memory runs below take that op).
            let items: Vec<_> = groups.iter().enumerate().map(|(g, b)| (g, &b.up, &b.down)).collect();
            let (gate0, mut out0) = (vec![0f32; width], vec![0f32; h]);
            let mut op = strata_backend::Fused::SparseGroupsRow {
                x: &x,
                gate: &gate0,
                groups: &items,
                group,
                act: Activation::Silu,
                out: &mut out0,
            };
            let fused = be.fused(&mut op);
            assert_eq!(fused.is_some(), dtype != DType::F32, "{dtype:?}");
            for setting in ["off", "topk=0.5", "topk=0.25"] {
                let settings = [SparseFfn::parse(setting).unwrap()];
                let run = |in_memory: bool| {
                    let w = NeuronWeights {
                        gate: gate.clone(),
                        scale: scale.clone(),
                        group,
                        groups: in_memory.then(|| groups.clone()),
                    };
                    let (mut g_buf, mut u_buf, mut out) = (vec![0f32; width], vec![0f32; width], vec![f32::NAN; h]);
                    let mut nb = MoeBufs::new(&be, &c, 1).unwrap().unwrap();
                    let source = Groups(groups.clone());
                    let block = SparseBlock {
                        layer: 0,
                        weights: &w,
                        source: &source,
                        input: &x,
                        seq_rows: &[1],
                        settings: &settings,
                    };
                    let mut bufs = MlpBufs { gate: &mut g_buf, up: &mut u_buf };
                    let kept = sparse_forward(&be, &c, block, &mut bufs, &mut nb, &mut out).unwrap();
                    (kept, out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
                };
                let (fused, apart) = (run(true), run(false));
                assert_eq!(fused.0, apart.0, "{dtype:?} {setting}: groups kept");
                assert!(fused.1.iter().any(|&b| b != 0), "{dtype:?} {setting}: an output of zeros");
                assert_eq!(fused.1, apart.1, "{dtype:?} {setting}");
            }
        }
    }

    /// `t` (whose values are exactly representable in `dtype`'s blocks) back in `dtype`.
    fn requant(t: &HostTensor, dtype: strata_tensor::tensor::DType) -> HostTensor {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let (r, c) = (t.shape[0], t.shape[1]);
        let b = strata_quant::quantize_matrix(&pool, dtype, &t.to_f32_vec(), r, c).unwrap();
        let len = strata_tensor::tensor::ByteSource::bytes(&b).len();
        HostTensor::new(Arc::new(b), 0, len, dtype, vec![r, c])
    }
}
