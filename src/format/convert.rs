//! `strata convert`: any model Strata reads (Hugging Face directory, GGUF, flat,
//! `.cawsf`) into a flat layer directory or a `.cawsf` file, quantizing on the way when
//! asked. The source is memory-mapped and the output written one group at a time (the
//! global tensors, then each layer), so memory stays O(one layer) and a model larger than
//! RAM converts. The writers keep the output under a temporary name until the end.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use super::{Group, ModelMeta, ModelWriter, cawsf, flat, layer_tensor, unit_tensor};
use crate::model::{ModelSource, sparse};
use crate::quant::ReadF32;
use crate::tensor::{AlignedBytes, DType, HostTensor};

/// The output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Flat,
    Cawsf(cawsf::Compression),
}

/// What to convert to.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub target: Target,
    /// Requantize weight matrices to this dtype (one of
    /// [`CONVERT_TARGETS`](crate::quant::CONVERT_TARGETS)); `None` keeps every tensor's
    /// bytes as they are (GGUF blocks stay blocks).
    pub quant: Option<DType>,
    /// Worker threads for quantizing (0: one per core).
    pub threads: usize,
    /// Decompose the layers' weight matrices with NDSQ (`.cawsf` only; `quant` still
    /// applies to the tensors NDSQ leaves: embeddings, head, routers).
    pub ndsq: Option<super::ndsq::NdsqParams>,
    /// Store each layer's `up` and `down` as neuron-group bundles for `--sparse-ffn`:
    /// `Some(neurons per group)`, `Some(0)` to choose the size from
    /// [`sparse::BUNDLE_BYTES`].
    pub sparse_ffn: Option<usize>,
}

/// The group size `--sparse-ffn` bundles a model's FFNs in: `asked` when it fits every
/// layer (a multiple of each `down`'s block that divides the width), else an error
/// saying why; with `asked == 0`, the size whose bundle is nearest
/// [`sparse::BUNDLE_BYTES`] as the tensors will be stored (after `quant`).
fn sparse_group(src: &ModelSource, asked: usize, quant: Option<DType>) -> anyhow::Result<usize> {
    let c = &src.config;
    let refuse = |why: String| Err(sparse::Refused(format!("--sparse-ffn: {why}")).into());
    if let Some(why) = sparse::unsupported(c) {
        return refuse(why);
    }
    if c.neuron_group.is_some() {
        return refuse(format!("`{}` is already stored with neuron-group bundles", src.name));
    }
    let (width, hidden) = (c.intermediate_size, c.hidden_size);
    let stored = |name: String| -> anyhow::Result<DType> {
        let t = src.tensors.get(&name).with_context(|| format!("--sparse-ffn: no tensor `{name}`"))?;
        Ok(target_dtype(&name, t, quant).unwrap_or(t.dtype))
    };
    let (mut block, mut per_neuron) = (1usize, 0usize);
    for l in 0..c.n_layers {
        let up = stored(format!("model.layers.{l}.{UP}"))?;
        let down = stored(format!("model.layers.{l}.{DOWN}"))?;
        block = lcm(block, down.block_size());
        let bytes = |d: DType, n: usize| d.bytes_for(n).unwrap_or(0);
        per_neuron = per_neuron.max(bytes(up, hidden) + bytes(down, hidden * width) / width.max(1));
    }
    let fits = |g: usize| g > 0 && width.is_multiple_of(g) && g.is_multiple_of(block);
    match asked {
        0 => match sparse::group_for(width, per_neuron, block, sparse::BUNDLE_BYTES) {
            Some(g) => Ok(g),
            None => refuse(format!("no group of whole {block}-column blocks of down divides the FFN width {width}")),
        },
        g if fits(g) => Ok(g),
        g => Err(sparse::Refused(format!(
            "--sparse-group {g}: a group must divide the FFN width {width} and be a multiple of {block} (down's block)"
        ))
        .into()),
    }
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b).max(1) * b
}

/// The layer-local names of a dense SwiGLU FFN's up and down projections (every family
/// `--sparse-ffn` accepts names them so).
const UP: &str = "mlp.up_proj.weight";
const DOWN: &str = "mlp.down_proj.weight";

/// Layer `layer`'s tensors with `up` and `down` replaced by their neuron-group bundles.
fn bundle_layer(layer: usize, tensors: &mut Vec<(String, HostTensor)>, group: usize) -> anyhow::Result<()> {
    let mut take = |local: &str| -> anyhow::Result<HostTensor> {
        let name = format!("model.layers.{layer}.{local}");
        let at = tensors.iter().position(|(n, _)| *n == name).with_context(|| format!("no tensor `{name}`"))?;
        Ok(tensors.remove(at).1)
    };
    let (up, down) = (take(UP)?, take(DOWN)?);
    let bundles = sparse::bundle(&up, &down, group).map_err(|e| anyhow::anyhow!("layer {layer}: {e}"))?;
    tensors.extend(bundles.into_iter().map(|(local, t)| (format!("model.layers.{layer}.{local}"), t)));
    Ok(())
}

/// Where a conversion stands, for a progress bar: groups written of the total, and bytes
/// written so far.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
    pub bytes: u64,
}

/// What a conversion did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConvertReport {
    pub layers: usize,
    pub tensors: usize,
    /// Tensors whose dtype changed.
    pub converted: usize,
    /// Weight matrices not stored in the `quant` asked for, and what they were stored as.
    pub shortfall: QuantShortfall,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// The non-weight fields of `src`.
pub fn meta_of(src: &ModelSource) -> ModelMeta {
    ModelMeta {
        name: src.name.clone(),
        config_json: src.config_json.clone(),
        tokenizer_json: src.tokenizer_json.clone(),
        tokenizer_config_json: src.tokenizer_config_json.clone(),
        generation_config_json: src.generation_config_json.clone(),
        chat_template: src.chat_template.clone(),
    }
}

/// Layer-local names of the tensors that route tokens: the MoE router (`[n_experts,
/// hidden]`) and the shared expert's gate (`[1, hidden]`). Every `--quant` keeps them in
/// their source dtype, as llama.cpp keeps `ffn_gate_inp` in F32: a small error there
/// changes which experts run.
pub(crate) const ROUTING_TENSORS: [&str; 3] =
    ["mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.shared_expert_gate.weight"];

/// The dtype tensor `name` is converted to under `quant`, or `None` to keep it: float
/// targets convert every tensor (quantized ones are dequantized: `--quant f32` turns a
/// Q8_0 model into the exact F32 model its blocks stand for); block targets convert
/// weight matrices whose rows are whole blocks (norms, biases and odd shapes keep their
/// dtype), a K-quant's matrices whose rows are not whole 256-value blocks go to its
/// [`block_fallback`] when their rows are whole blocks of that. Routing tensors
/// ([`ROUTING_TENSORS`]) are never converted.
pub(crate) fn target_dtype(name: &str, t: &HostTensor, quant: Option<DType>) -> Option<DType> {
    let q = quant?;
    if t.dtype == q || layer_tensor(name).is_some_and(|(_, local)| ROUTING_TENSORS.contains(&local)) {
        return None;
    }
    if q.is_float() {
        return Some(q);
    }
    let cols = *t.shape.last()?;
    if t.shape.len() != 2 {
        return None;
    }
    std::iter::once(q).chain(block_fallback(q)).find(|d| cols.is_multiple_of(d.block_size())).filter(|&d| d != t.dtype)
}

/// The 32-value block format a K-quant falls back to for a matrix whose rows are not
/// whole 256-value blocks, as llama.cpp's quantizer does (`llama-quant.cpp`,
/// `convert_incompatible_tensor`): Q6_K to Q8_0, as there; Q4_K to Q4_0, where llama.cpp
/// takes Q5_0, which Strata does not write (Q4_0 costs the 4.5 bits a weight Q4_K does).
pub(crate) fn block_fallback(q: DType) -> Option<DType> {
    match q {
        DType::Q4_K => Some(DType::Q4_0),
        DType::Q6_K => Some(DType::Q8_0),
        _ => None,
    }
}

/// Where `--quant` could not store weight matrices (2-D tensors other than the routing
/// tensors) in the dtype asked for, because their rows are not whole blocks of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QuantShortfall {
    /// Matrices stored in the K-quant's [`block_fallback`] instead, by its name.
    pub fallback: BTreeMap<String, usize>,
    /// Matrices whose rows are whole blocks of neither, left in their stored dtype, by
    /// its name.
    pub kept: BTreeMap<String, usize>,
}

impl QuantShortfall {
    /// The shortfall of converting `tensors` under `quant`.
    pub fn of<'a>(tensors: impl IntoIterator<Item = (&'a String, &'a HostTensor)>, quant: Option<DType>) -> Self {
        let mut s = QuantShortfall::default();
        let Some(q) = quant.filter(|q| !q.is_float()) else { return s };
        for (name, t) in tensors {
            let routing = layer_tensor(name).is_some_and(|(_, local)| ROUTING_TENSORS.contains(&local));
            if t.shape.len() != 2 || routing || t.dtype == q {
                continue;
            }
            match target_dtype(name, t, quant) {
                Some(d) if d == q => {}
                Some(d) => *s.fallback.entry(d.name().to_owned()).or_default() += 1,
                None => *s.kept.entry(t.dtype.name().to_owned()).or_default() += 1,
            }
        }
        s
    }

    /// A warning for stderr, or `None` when every matrix is stored as asked.
    pub fn warning(&self, quant: DType) -> Option<String> {
        let list =
            |m: &BTreeMap<String, usize>| m.iter().map(|(d, n)| format!("{n} as {d}")).collect::<Vec<_>>().join(", ");
        let block = quant.block_size();
        let mut parts = Vec::new();
        if !self.fallback.is_empty() {
            parts.push(format!("{} (their rows are not whole {block}-value blocks)", list(&self.fallback)));
        }
        if !self.kept.is_empty() {
            parts.push(format!("{} kept as stored (rows not whole blocks of any fallback)", list(&self.kept)));
        }
        let n: usize = self.fallback.values().chain(self.kept.values()).sum();
        (!parts.is_empty())
            .then(|| format!("--quant {}: {n} weight matrices not in {0}: {}", quant.name(), parts.join("; ")))
    }
}

/// One read unit of a decoder layer as the writers lay it out: the layer core
/// (attention, norms, router, shared expert, a sparse FFN's gate) or one routed expert
/// or neuron group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerUnit {
    /// `None` for the core, `Some(e)` for routed expert (or neuron group) `e`.
    pub expert: Option<usize>,
    /// Indices into the group's tensors, in the order they are written.
    pub tensors: Vec<usize>,
}

/// An expert's tensors in the order they are written, per naming (Qwen MoE, Mixtral):
/// gate, up, down (a neuron group has no gate: up, down).
const EXPERT_ORDER: [[&str; 3]; 2] =
    [["gate_proj.weight", "up_proj.weight", "down_proj.weight"], ["w1.weight", "w3.weight", "w2.weight"]];

/// The order in which both writers store a group's tensors, as units: the core first,
/// its tensors in the order handed over; then each routed expert by ascending index
/// (expert 10 after expert 9), its tensors gate, up, down ([`EXPERT_ORDER`]), then any
/// others of the expert by name. Units without tensors are left out, so a group without
/// experts is one unit in the order handed over (dense layers are written as before).
/// The one place this order is decided.
pub fn layer_units(tensors: &[(String, HostTensor)]) -> Vec<LayerUnit> {
    let mut core = Vec::new();
    let mut experts: BTreeMap<usize, Vec<(usize, &str, usize)>> = BTreeMap::new();
    for (i, (name, _)) in tensors.iter().enumerate() {
        match layer_tensor(name).and_then(|(_, local)| unit_tensor(local)) {
            None => core.push(i),
            Some((e, rest)) => {
                let rank = EXPERT_ORDER.iter().find_map(|o| o.iter().position(|n| *n == rest));
                experts.entry(e).or_default().push((rank.unwrap_or(EXPERT_ORDER[0].len()), rest, i));
            }
        }
    }
    let core = (!core.is_empty()).then_some(LayerUnit { expert: None, tensors: core });
    let experts = experts.into_iter().map(|(e, mut ts)| {
        ts.sort_unstable();
        LayerUnit { expert: Some(e), tensors: ts.into_iter().map(|(_, _, i)| i).collect() }
    });
    core.into_iter().chain(experts).collect()
}

/// Converts `src` into `out` (which must not exist), calling `progress` after each group.
/// Each group's tensors are dropped once written, so weights that a source computes on
/// first use (GGUF llama Q/K) are held one layer at a time.
pub fn convert(
    mut src: ModelSource,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<ConvertReport> {
    if out.exists() {
        anyhow::bail!("{}: already exists; choose another output or remove it first", out.display());
    }
    // Every reader (`run`, `inspect`, `import`, `verify`) knows a `.cawsf` file by its name.
    let cawsf_named = out.extension().is_some_and(|e| e.eq_ignore_ascii_case("cawsf"));
    if matches!(opts.target, Target::Cawsf(_)) && !cawsf_named {
        let why =
            format!("{}: a --format cawsf output must end in `.cawsf` (readers know it by the name)", out.display());
        return Err(sparse::Refused(why).into());
    }
    crate::model::spec::check_tensors(&src.config, &src.tensors).with_context(|| format!("model `{}`", src.name))?;
    let mut groups: BTreeMap<Group, Vec<String>> = Default::default();
    for name in src.tensors.keys() {
        groups.entry(Group::of(name)).or_default().push(name.clone());
    }
    let layers = groups.keys().filter(|g| matches!(g, Group::Layer(_))).count();
    for i in 0..layers {
        if !groups.contains_key(&Group::Layer(i)) {
            anyhow::bail!("{}: layer {i} has no tensors (layers must be 0..{layers})", src.name);
        }
    }
    let group = match opts.sparse_ffn {
        Some(asked) => Some(sparse_group(&src, asked, opts.quant)?),
        None => None,
    };
    if group.is_some() && opts.ndsq.is_some() {
        let why = "--sparse-ffn and --ndsq do not combine (NDSQ decomposes the whole up and down)";
        return Err(sparse::Refused(why.into()).into());
    }
    let meta = meta_of(&src);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(opts.threads).build().context("building a thread pool")?;
    let pool = Arc::new(pool);
    let mut writer: Box<dyn ModelWriter> = match (opts.target, opts.ndsq) {
        (Target::Flat, None) => Box::new(flat::create(out, &meta, layers)?),
        (Target::Flat, Some(_)) => anyhow::bail!("NDSQ is written to .cawsf files only (--format cawsf)"),
        (Target::Cawsf(c), ndsq) => {
            let w = cawsf::CawsfWriter::create(out, &meta, layers, c)?;
            match ndsq {
                Some(p) => {
                    p.check()?;
                    Box::new(w.with_ndsq(p, pool.clone())?)
                }
                None => Box::new(w),
            }
        }
    };
    let shortfall = QuantShortfall::of(&src.tensors, opts.quant);
    let mut report = ConvertReport { layers, shortfall, ..Default::default() };
    let total = groups.len();
    for (done, (grp, mut names)) in groups.into_iter().enumerate() {
        names.sort_unstable();
        let mut tensors = Vec::with_capacity(names.len());
        for name in names {
            let t = src.tensors.remove(&name).expect("grouped from the source's own names");
            // A flat or `.cawsf` source's bytes against the checksums it records.
            src.sums.check(&name)?;
            report.bytes_in += t.bytes().len() as u64;
            let t = match target_dtype(&name, &t, opts.quant) {
                None => t,
                Some(dtype) => {
                    report.converted += 1;
                    requantize(&pool, &name, &t, dtype)?
                }
            };
            report.bytes_out += t.bytes().len() as u64;
            tensors.push((name, t));
        }
        if let (Some(g), Group::Layer(l)) = (group, grp) {
            bundle_layer(l, &mut tensors, g)?;
        }
        report.tensors += tensors.len();
        writer.write_group(grp, &tensors)?;
        drop(tensors);
        progress(Progress { done: done + 1, total, bytes: report.bytes_out });
    }
    writer.finish()?;
    Ok(report)
}

/// `t` in `dtype`, through f32.
pub(crate) fn requantize(
    pool: &rayon::ThreadPool,
    name: &str,
    t: &HostTensor,
    dtype: DType,
) -> anyhow::Result<HostTensor> {
    let x = t.to_f32_vec();
    let cols = *t.shape.last().unwrap_or(&1);
    let rows = x.len() / cols.max(1);
    let bytes: AlignedBytes = crate::quant::quantize_matrix(pool, dtype, &x, rows, cols)
        .with_context(|| format!("quantizing {name} to {}", dtype.name()))?;
    let len = crate::tensor::ByteSource::bytes(&bytes).len();
    Ok(HostTensor::new(Arc::new(bytes), 0, len, dtype, t.shape.clone()))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Routed experts of [`moe_layer`]: enough that string order (`10` before `2`) would
    /// show.
    pub(in crate::format) const EXPERTS: usize = 12;
    const HIDDEN: usize = 64;

    /// A meta whose config the readers parse (the writers do not check tensors against it).
    pub(in crate::format) fn tiny_meta() -> ModelMeta {
        ModelMeta {
            name: "tiny-moe".into(),
            config_json: r#"{"model_type":"llama","hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
                "num_attention_heads":2,"vocab_size":4}"#
                .into(),
            tokenizer_json: "{}".into(),
            tokenizer_config_json: None,
            generation_config_json: None,
            chat_template: None,
        }
    }

    /// An F32 tensor whose values repeat (so zstd shrinks it) and differ per `seed`.
    fn filled(shape: Vec<usize>, seed: usize) -> HostTensor {
        let data: Vec<f32> = (0..shape.iter().product::<usize>()).map(|k| (seed * 8 + k % 7) as f32).collect();
        HostTensor::from_f32(&data, shape)
    }

    /// Layer 0 of a synthetic MoE model: attention, norms, the router, for Qwen naming
    /// the shared expert and its gate, and [`EXPERTS`] routed experts whose tensors span
    /// one to three pages. Sorted by name, as `convert` hands them over: expert 10 comes
    /// before expert 2, Mixtral's `w2` before `w3`.
    pub(in crate::format) fn moe_layer(mixtral: bool) -> Vec<(String, HostTensor)> {
        let h = HIDDEN;
        let mut core = vec![
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![h / 2, h]),
            ("self_attn.v_proj.weight", vec![h / 2, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
        ];
        let (prefix, names) = match mixtral {
            true => ("block_sparse_moe", EXPERT_ORDER[1]),
            false => ("mlp", EXPERT_ORDER[0]),
        };
        match mixtral {
            true => core.push(("block_sparse_moe.gate.weight", vec![EXPERTS, h])),
            false => core.extend([
                ("mlp.gate.weight", vec![EXPERTS, h]),
                ("mlp.shared_expert.gate_proj.weight", vec![32, h]),
                ("mlp.shared_expert.up_proj.weight", vec![32, h]),
                ("mlp.shared_expert.down_proj.weight", vec![h, 32]),
                ("mlp.shared_expert_gate.weight", vec![1, h]),
            ]),
        }
        let mut out: Vec<(String, Vec<usize>)> =
            core.into_iter().map(|(n, shape)| (format!("model.layers.0.{n}"), shape)).collect();
        for e in 0..EXPERTS {
            let rows = (e % 5 + 1) * 8; // 2 to 10 KiB per tensor in F32
            for (name, shape) in names.iter().zip([vec![rows, h], vec![rows, h], vec![h, rows]]) {
                out.push((format!("model.layers.0.{prefix}.experts.{e}.{name}"), shape));
            }
        }
        out.sort_unstable();
        out.into_iter().enumerate().map(|(seed, (name, shape))| (name, filled(shape, seed))).collect()
    }

    /// Checks the MoE layout of one written layer from each tensor's byte span `[start,
    /// end)` in its file: the core first, at `layer_start`; then experts `0..experts` in
    /// order; each unit's tensors back to back (less than a page apart) with nothing of
    /// another unit between them; each unit starting on a page; each expert's tensors
    /// gate, up, down.
    pub(in crate::format) fn assert_unit_layout(spans: &[(String, u64, u64)], layer_start: u64, experts: usize) {
        let mut spans = spans.to_vec();
        spans.sort_by_key(|s| s.1);
        let mut units: Vec<(Option<usize>, Vec<&str>)> = Vec::new();
        for (i, (name, start, _)) in spans.iter().enumerate() {
            let (unit, rest) = match layer_tensor(name).and_then(|(_, local)| unit_tensor(local)) {
                Some((e, rest)) => (Some(e), rest),
                None => (None, name.as_str()),
            };
            match units.last_mut() {
                Some((u, rests)) if *u == unit => {
                    let gap = start.checked_sub(spans[i - 1].2);
                    assert!(
                        gap.is_some_and(|g| g < flat::ALIGN),
                        "`{name}` is {gap:?} bytes after its unit's previous tensor"
                    );
                    rests.push(rest);
                }
                _ => {
                    assert_eq!(start % flat::ALIGN, 0, "unit {unit:?} (`{name}`) starts at {start}, not on a page");
                    units.push((unit, vec![rest]));
                }
            }
        }
        assert_eq!(spans.first().map(|s| s.1), Some(layer_start), "the layer starts with its core");
        let order: Vec<Option<usize>> = units.iter().map(|u| u.0).collect();
        let want: Vec<Option<usize>> = std::iter::once(None).chain((0..experts).map(Some)).collect();
        assert_eq!(order, want, "units split or out of order");
        for (e, rests) in &units[1..] {
            assert!(EXPERT_ORDER.iter().any(|o| o[..] == rests[..]), "expert {e:?} holds {rests:?}");
        }
    }

    #[test]
    fn experts_follow_the_core_in_numeric_order() {
        for mixtral in [false, true] {
            let layer = moe_layer(mixtral);
            let units = layer_units(&layer);
            assert_eq!(units.len(), 1 + EXPERTS, "mixtral: {mixtral}");
            let core: Vec<usize> = (0..layer.len()).filter(|&i| !layer[i].0.contains(".experts.")).collect();
            assert_eq!(units[0], LayerUnit { expert: None, tensors: core }, "the core keeps the order handed over");
            for (e, unit) in units[1..].iter().enumerate() {
                assert_eq!(unit.expert, Some(e));
                let names: Vec<&str> = unit.tensors.iter().map(|&i| layer[i].0.as_str()).collect();
                let order = EXPERT_ORDER[usize::from(mixtral)];
                assert!(names.iter().zip(order).all(|(n, o)| n.ends_with(&format!(".experts.{e}.{o}"))), "{names:?}");
            }
        }
    }

    #[test]
    fn a_dense_layer_is_one_unit_in_the_order_handed_over() {
        let names = ["self_attn.v_proj.weight", "mlp.gate_proj.weight", "input_layernorm.weight", "mlp.gate.bias"];
        let layer: Vec<_> = names.iter().map(|n| (format!("model.layers.3.{n}"), filled(vec![4], 0))).collect();
        assert_eq!(layer_units(&layer), [LayerUnit { expert: None, tensors: vec![0, 1, 2, 3] }]);
        let global = [("model.embed_tokens.weight".to_string(), filled(vec![4], 0))];
        assert_eq!(layer_units(&global), [LayerUnit { expert: None, tensors: vec![0] }]);
        assert_eq!(layer_units(&[]), []);
    }

    #[test]
    fn routing_tensors_keep_their_dtype_under_every_quant() {
        let t = |shape: Vec<usize>| filled(shape, 1);
        for q in [DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::F16] {
            for router in ["mlp.gate.weight", "block_sparse_moe.gate.weight"] {
                let name = format!("model.layers.1.{router}");
                assert_eq!(target_dtype(&name, &t(vec![EXPERTS, 256]), Some(q)), None, "{name} {q:?}");
            }
            let name = "model.layers.1.mlp.shared_expert_gate.weight";
            assert_eq!(target_dtype(name, &t(vec![1, 256]), Some(q)), None, "{name} {q:?}");
            for weight in [
                "mlp.experts.10.gate_proj.weight",
                "block_sparse_moe.experts.0.w2.weight",
                "mlp.shared_expert.down_proj.weight",
                "mlp.gate_proj.weight",
            ] {
                let name = format!("model.layers.1.{weight}");
                assert_eq!(target_dtype(&name, &t(vec![8, 256]), Some(q)), Some(q), "{name} {q:?}");
            }
        }
        // Rows that are not whole blocks keep their dtype, expert or not.
        assert_eq!(
            target_dtype("model.layers.0.mlp.experts.1.up_proj.weight", &t(vec![8, 40]), Some(DType::Q8_0)),
            None
        );
        assert_eq!(target_dtype("model.layers.0.mlp.gate.weight", &t(vec![8, 256]), None), None);
        // A K-quant falls back to 32-value blocks (llama.cpp's Q6_K -> Q8_0; Q4_K -> Q4_0)
        // for rows that are not whole 256-value blocks, and keeps rows that fit neither.
        let up = "model.layers.0.mlp.up_proj.weight";
        assert_eq!(target_dtype(up, &t(vec![8, 576]), Some(DType::Q4_K)), Some(DType::Q4_0));
        assert_eq!(target_dtype(up, &t(vec![8, 576]), Some(DType::Q6_K)), Some(DType::Q8_0));
        assert_eq!(target_dtype(up, &t(vec![8, 40]), Some(DType::Q6_K)), None);
        let shortfall = QuantShortfall::of([(&up.to_string(), &t(vec![8, 576]))], Some(DType::Q4_K));
        assert_eq!(shortfall.fallback.get("Q4_0"), Some(&1));
        assert!(shortfall.warning(DType::Q4_K).is_some_and(|w| w.contains("1 as Q4_0")));
        assert_eq!(
            QuantShortfall::of([(&up.to_string(), &t(vec![8, 256]))], Some(DType::Q4_K)).warning(DType::Q4_K),
            None
        );
    }

    /// A float target dequantizes quantized tensors (a Q8_0 model to the F32 model its
    /// blocks stand for, value for value); a block target does not requantize a float
    /// vector.
    #[test]
    fn float_targets_dequantize_blocks() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let x: Vec<f32> = (0..2 * 64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
        let bytes = crate::quant::quantize_matrix(&pool, DType::Q8_0, &x, 2, 64).unwrap();
        let len = crate::tensor::ByteSource::bytes(&bytes).len();
        let q8 = HostTensor::new(Arc::new(bytes), 0, len, DType::Q8_0, vec![2, 64]);
        let name = "model.layers.0.mlp.up_proj.weight";
        assert_eq!(target_dtype(name, &q8, Some(DType::F32)), Some(DType::F32));
        assert_eq!(target_dtype(name, &q8, Some(DType::F16)), Some(DType::F16));
        let f32 = requantize(&pool, name, &q8, DType::F32).unwrap();
        assert_eq!(f32.dtype, DType::F32);
        assert_eq!(f32.to_f32_vec(), q8.to_f32_vec(), "dequantized value for value");
        assert_eq!(target_dtype("model.norm.weight", &filled(vec![64], 1), Some(DType::Q8_0)), None);
    }

    /// `tests/fixtures/hf/{qwen2_moe,mixtral}` (from `tools/make_moe_fixtures.py`) through
    /// `convert --quant q8_0`: routers and the shared expert's gate stay F32 and
    /// bit-identical, expert and shared-expert matrices whose rows are whole blocks become
    /// Q8_0 (`down` rows of 8 or 16 do not fit a block and stay F32), and layer 0 is laid
    /// out core first, then one aligned range per expert.
    #[test]
    fn q8_0_conversion_keeps_the_router_f32() {
        let f32 = |local: &'static str| (local, DType::F32);
        let q8 = |local: &'static str| (local, DType::Q8_0);
        let cases = [
            (
                "qwen2_moe",
                vec![
                    f32("mlp.gate.weight"),
                    f32("mlp.shared_expert_gate.weight"),
                    q8("mlp.experts.7.gate_proj.weight"),
                    q8("mlp.experts.0.up_proj.weight"),
                    f32("mlp.experts.0.down_proj.weight"),
                    q8("mlp.shared_expert.gate_proj.weight"),
                    q8("mlp.shared_expert.down_proj.weight"),
                ],
            ),
            (
                "mixtral",
                vec![
                    f32("block_sparse_moe.gate.weight"),
                    q8("block_sparse_moe.experts.7.w1.weight"),
                    q8("block_sparse_moe.experts.0.w3.weight"),
                    f32("block_sparse_moe.experts.0.w2.weight"),
                ],
            ),
        ];
        for (fixture, want) in cases {
            let spec = format!("{}/tests/fixtures/hf/{fixture}", env!("CARGO_MANIFEST_DIR"));
            let dir = std::env::temp_dir().join(format!("strata-convert-unit-{}-{fixture}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let out = dir.join("m");
            let src = ModelSource::from_spec(&spec).unwrap();
            let experts = src.config.moe.as_ref().map_or(0, |m| m.n_experts);
            let opts = ConvertOptions {
                target: Target::Flat,
                quant: Some(DType::Q8_0),
                threads: 2,
                ndsq: None,
                sparse_ffn: None,
            };
            convert(ModelSource::from_spec(&spec).unwrap(), &out, &opts, &mut |_| {}).unwrap();
            let copy = flat::open(&out).unwrap();
            for layer in 0..src.config.n_layers {
                for (local, dtype) in &want {
                    let name = format!("model.layers.{layer}.{local}");
                    let (a, b) = (&src.tensors[&name], &copy.tensors[&name]);
                    assert_eq!(b.dtype, *dtype, "{fixture}: {name}");
                    if *dtype == DType::F32 {
                        assert_eq!(b.bytes(), a.bytes(), "{fixture}: {name}");
                    }
                }
            }
            let manifest = flat::inspect(&out).unwrap();
            let spans: Vec<(String, u64, u64)> = manifest["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["file"] == flat::layer_file_name(0))
                .map(|t| {
                    let (offset, size) = (t["offset"].as_u64().unwrap(), t["size"].as_u64().unwrap());
                    (t["name"].as_str().unwrap().to_owned(), offset, offset + size)
                })
                .collect();
            assert_unit_layout(&spans, 0, experts);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
