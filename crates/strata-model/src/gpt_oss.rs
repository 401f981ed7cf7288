//! gpt-oss's checkpoints as the rest of Strata names a MoE layer's tensors: one gate,
//! up and down projection (and bias) per expert.
//!
//! transformers saves a gpt-oss layer's experts stacked and transposed for `x @ W`:
//! `mlp.experts.gate_up_proj` `[experts, hidden, 2 · width]` with each expert's gate and
//! up columns interleaved (gate `2i`, up `2i + 1`), `gate_up_proj_bias` `[experts, 2 ·
//! width]` likewise, `down_proj` `[experts, width, hidden]` and `down_proj_bias`
//! `[experts, hidden]`. Each expert's tensors here are computed from its slice of those
//! on first use (f32), so nothing is converted before it is needed.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, bail};

use super::config::ModelConfig;
use strata_quant::ReadF32;
use strata_tensor::tensor::{AlignedBytes, DType, HostTensor, LazyBytes};

/// Replaces each layer's stacked expert tensors in `tensors` with per-expert ones
/// (`mlp.experts.{e}.{gate,up,down}_proj.{weight,bias}`); a source that already holds
/// those (a GGUF, a conversion) is left as it is.
pub fn unstack_experts(tensors: &mut HashMap<String, HostTensor>, c: &ModelConfig) -> anyhow::Result<()> {
    let Some(m) = c.moe else { return Ok(()) };
    let (n, w, h) = (m.n_experts, m.expert_size, c.hidden_size);
    for l in 0..c.n_layers {
        let p = format!("model.layers.{l}.mlp.experts.");
        if tensors.contains_key(&format!("{p}gate_up_proj_blocks")) {
            bail!(
                "layer {l}: the experts are MXFP4 blocks (`gate_up_proj_blocks`); this build reads gpt-oss from its \
                 GGUF conversion or a checkpoint saved in F32/BF16"
            );
        }
        let Some(gate_up) = tensors.remove(&format!("{p}gate_up_proj")) else { continue };
        let mut take = |name: &str, shape: &[usize]| -> anyhow::Result<HostTensor> {
            let t = tensors.remove(&format!("{p}{name}")).with_context(|| format!("layer {l}: no `{p}{name}`"))?;
            if t.shape != shape {
                bail!("tensor `{p}{name}`: expected shape {shape:?}, found {:?}", t.shape);
            }
            Ok(t)
        };
        if gate_up.shape != [n, h, 2 * w] {
            bail!("tensor `{p}gate_up_proj`: expected shape {:?}, found {:?}", [n, h, 2 * w], gate_up.shape);
        }
        let gate_up_bias = take("gate_up_proj_bias", &[n, 2 * w])?;
        let down = take("down_proj", &[n, w, h])?;
        let down_bias = take("down_proj_bias", &[n, h])?;
        for e in 0..n {
            let gu = expert_slice(&gate_up, e)?;
            let gub = expert_slice(&gate_up_bias, e)?;
            let d = expert_slice(&down, e)?;
            let db = expert_slice(&down_bias, e)?;
            let name = |s: &str| format!("{p}{e}.{s}");
            // Gate row i is column 2i of `[hidden, 2 · width]`, up row i column 2i + 1.
            let g = gu.clone();
            tensors.insert(name("gate_proj.weight"), computed(vec![w, h], move || interleaved_columns(&g, 0)));
            tensors.insert(name("up_proj.weight"), computed(vec![w, h], move || interleaved_columns(&gu, 1)));
            let b = gub.clone();
            tensors.insert(name("gate_proj.bias"), computed(vec![w], move || every_other(&b, 0)));
            tensors.insert(name("up_proj.bias"), computed(vec![w], move || every_other(&gub, 1)));
            // `[width, hidden]` transposed to `[hidden, width]`.
            tensors.insert(name("down_proj.weight"), computed(vec![h, w], move || transpose(&d)));
            tensors.insert(name("down_proj.bias"), computed(vec![h], move || db.to_f32_vec()));
        }
    }
    Ok(())
}

/// Expert `e`'s slice of a stacked tensor `[experts, ...]`, as a view.
fn expert_slice(t: &HostTensor, e: usize) -> anyhow::Result<HostTensor> {
    let per: usize = t.shape[1..].iter().product();
    let mut flat = t.clone();
    flat.shape = vec![t.shape[0], per];
    let mut one = flat.rows(e, 1).with_context(|| format!("expert {e} of {t:?}"))?;
    one.shape = t.shape[1..].to_vec();
    Ok(one)
}

/// Columns `first, first + 2, …` of a `[rows, cols]` tensor as rows: `cols / 2` rows
/// of `rows` values.
fn interleaved_columns(t: &HostTensor, first: usize) -> Vec<f32> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let v = t.to_f32_vec();
    (first..cols).step_by(2).flat_map(|j| (0..rows).map(move |i| i * cols + j)).map(|at| v[at]).collect()
}

/// A `[rows, cols]` tensor's transpose, `[cols, rows]`.
fn transpose(t: &HostTensor) -> Vec<f32> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let v = t.to_f32_vec();
    (0..cols).flat_map(|j| (0..rows).map(move |i| i * cols + j)).map(|at| v[at]).collect()
}

/// Values `first, first + 2, …` of a vector.
fn every_other(t: &HostTensor, first: usize) -> Vec<f32> {
    t.to_f32_vec().into_iter().skip(first).step_by(2).collect()
}

/// An f32 tensor of `shape` computed by `make` on first use.
fn computed(shape: Vec<usize>, make: impl Fn() -> Vec<f32> + Send + Sync + 'static) -> HostTensor {
    let len = shape.iter().product::<usize>() * 4;
    let lazy = LazyBytes::new(len, move || {
        AlignedBytes::from_slice(&make().iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    });
    HostTensor::lazy(Arc::new(lazy), DType::F32, shape)
}
