//! `strata convert`: any model Strata reads (Hugging Face directory, GGUF, flat,
//! `.cawsf`) into a flat layer directory or a `.cawsf` file, quantizing on the way when
//! asked. The source is memory-mapped and the output written one group at a time (the
//! global tensors, then each layer), so memory stays O(one layer) and a model larger than
//! RAM converts. The writers keep the output under a temporary name until the end.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use super::{ModelSource, sparse};
use strata_format::requant::{requantize, target_dtype};
use strata_format::{Group, ModelMeta, ModelWriter, cawsf, flat};
use strata_tensor::tensor::{DType, HostTensor};

pub use strata_format::requant::QuantShortfall;

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
    /// [`CONVERT_TARGETS`](strata_quant::CONVERT_TARGETS)); `None` keeps every tensor's
    /// bytes as they are (GGUF blocks stay blocks).
    pub quant: Option<DType>,
    /// Worker threads for quantizing (0: one per core).
    pub threads: usize,
    /// Decompose the layers' weight matrices with NDSQ (`.cawsf` only; `quant` still
    /// applies to the tensors NDSQ leaves: embeddings, head, routers).
    pub ndsq: Option<strata_format::ndsq::NdsqParams>,
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
    crate::shapes::check_tensors(&src.config, &src.tensors).with_context(|| format!("model `{}`", src.name))?;
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
                    Box::new(w.with_ndsq(p, pool.clone(), src.config.hidden_size)?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use strata_format::units::testing::assert_unit_layout;

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
            let spec = format!("{}/../../tests/fixtures/hf/{fixture}", env!("CARGO_MANIFEST_DIR"));
            let dir = std::env::temp_dir().join(format!("strata-convert-unit-{}-{fixture}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let out = dir.join("m");
            let src = ModelSource::from_path(&spec).unwrap();
            let experts = src.config.moe.as_ref().map_or(0, |m| m.n_experts);
            let opts = ConvertOptions {
                target: Target::Flat,
                quant: Some(DType::Q8_0),
                threads: 2,
                ndsq: None,
                sparse_ffn: None,
            };
            convert(ModelSource::from_path(&spec).unwrap(), &out, &opts, &mut |_| {}).unwrap();
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
