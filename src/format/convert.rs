//! `strata convert`: any model Strata reads (Hugging Face directory, GGUF, flat,
//! `.cawsf`) into a flat layer directory or a `.cawsf` file, quantizing on the way when
//! asked. The source is memory-mapped and the output written one group at a time (the
//! global tensors, then each layer), so memory stays O(one layer) and a model larger than
//! RAM converts. The writers keep the output under a temporary name until the end.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use super::{Group, ModelMeta, ModelWriter, cawsf, flat};
use crate::model::ModelSource;
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

/// The dtype `name` is converted to under `quant`, or `None` to keep it: float targets
/// convert every float tensor; block targets convert weight matrices whose rows are
/// whole blocks (norms, biases and odd shapes keep their dtype).
fn target_dtype(t: &HostTensor, quant: Option<DType>) -> Option<DType> {
    let q = quant?;
    if t.dtype == q {
        return None;
    }
    if q.is_float() {
        return t.dtype.is_float().then_some(q);
    }
    let cols = *t.shape.last()?;
    (t.shape.len() == 2 && cols.is_multiple_of(q.block_size())).then_some(q)
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
    crate::model::spec::check_tensors(&src.config, &src.tensors).with_context(|| format!("model `{}`", src.name))?;
    let mut groups: std::collections::BTreeMap<Group, Vec<String>> = Default::default();
    for name in src.tensors.keys() {
        groups.entry(Group::of(name)).or_default().push(name.clone());
    }
    let layers = groups.keys().filter(|g| matches!(g, Group::Layer(_))).count();
    for i in 0..layers {
        if !groups.contains_key(&Group::Layer(i)) {
            anyhow::bail!("{}: layer {i} has no tensors (layers must be 0..{layers})", src.name);
        }
    }
    let meta = meta_of(&src);
    let mut writer: Box<dyn ModelWriter> = match opts.target {
        Target::Flat => Box::new(flat::create(out, &meta, layers)?),
        Target::Cawsf(c) => Box::new(cawsf::CawsfWriter::create(out, &meta, layers, c)?),
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(opts.threads).build().context("building a thread pool")?;
    let mut report = ConvertReport { layers, ..Default::default() };
    let total = groups.len();
    for (done, (group, mut names)) in groups.into_iter().enumerate() {
        names.sort_unstable();
        let mut tensors = Vec::with_capacity(names.len());
        for name in names {
            let t = src.tensors.remove(&name).expect("grouped from the source's own names");
            report.bytes_in += t.bytes().len() as u64;
            let t = match target_dtype(&t, opts.quant) {
                None => t,
                Some(dtype) => {
                    report.converted += 1;
                    requantize(&pool, &name, &t, dtype)?
                }
            };
            report.bytes_out += t.bytes().len() as u64;
            tensors.push((name, t));
        }
        report.tensors += tensors.len();
        writer.write_group(group, &tensors)?;
        drop(tensors);
        progress(Progress { done: done + 1, total, bytes: report.bytes_out });
    }
    writer.finish()?;
    Ok(report)
}

/// `t` in `dtype`, through f32.
fn requantize(pool: &rayon::ThreadPool, name: &str, t: &HostTensor, dtype: DType) -> anyhow::Result<HostTensor> {
    let x = t.to_f32_vec();
    let cols = *t.shape.last().unwrap_or(&1);
    let rows = x.len() / cols.max(1);
    let bytes: AlignedBytes = crate::quant::quantize_matrix(pool, dtype, &x, rows, cols)
        .with_context(|| format!("quantizing {name} to {}", dtype.name()))?;
    let len = crate::tensor::ByteSource::bytes(&bytes).len();
    Ok(HostTensor::new(Arc::new(bytes), 0, len, dtype, t.shape.clone()))
}
