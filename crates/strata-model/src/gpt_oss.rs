//! gpt-oss's checkpoints as the rest of Strata names a MoE layer's tensors: one gate,
//! up and down projection (and bias) per expert.
//!
//! transformers saves a gpt-oss layer's experts stacked and transposed for `x @ W`:
//! `mlp.experts.gate_up_proj` `[experts, hidden, 2 · width]` with each expert's gate and
//! up columns interleaved (gate `2i`, up `2i + 1`), `gate_up_proj_bias` `[experts, 2 ·
//! width]` likewise, `down_proj` `[experts, width, hidden]` and `down_proj_bias`
//! `[experts, hidden]`. Each expert's tensors here are computed from its slice of those
//! on first use (f32), so nothing is converted before it is needed. OpenAI's own
//! checkpoints keep the experts in MXFP4 (see [`unstack_experts`]): their blocks stay MXFP4.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, bail};

use super::config::ModelConfig;
use strata_quant::ReadF32;
use strata_tensor::tensor::{AlignedBytes, DType, HostTensor, LazyBytes};

/// Replaces each layer's stacked expert tensors in `tensors` with per-expert ones
/// (`mlp.experts.{e}.{gate,up,down}_proj.{weight,bias}`); a source that already holds
/// those (a GGUF, a conversion) is left as it is.
///
/// OpenAI's published form (the safetensors reader makes GGML MXFP4 of its `_blocks` and
/// `_scales`) has `gate_up_proj` `[experts, 2 · width, hidden]`, each expert's rows gate
/// and up interleaved (gate `2i`, up `2i + 1`), and `down_proj` `[experts, hidden,
/// width]`: rows move whole, so the blocks stay as stored. The biases are the same in
/// both forms.
pub fn unstack_experts(tensors: &mut HashMap<String, HostTensor>, c: &ModelConfig) -> anyhow::Result<()> {
    let Some(m) = c.moe else { return Ok(()) };
    let (n, w, h) = (m.n_experts, m.expert_size, c.hidden_size);
    for l in 0..c.n_layers {
        let p = format!("model.layers.{l}.mlp.experts.");
        let Some(gate_up) = tensors.remove(&format!("{p}gate_up_proj")) else { continue };
        let mxfp4 = gate_up.dtype == DType::Mxfp4;
        let (gate_up_shape, down_shape) = match mxfp4 {
            true => ([n, 2 * w, h], [n, h, w]),
            false => ([n, h, 2 * w], [n, w, h]),
        };
        if gate_up.shape != gate_up_shape {
            bail!("tensor `{p}gate_up_proj`: expected shape {gate_up_shape:?}, found {:?}", gate_up.shape);
        }
        let down = take(tensors, &p, "down_proj", &down_shape)?;
        if mxfp4 && down.dtype != DType::Mxfp4 {
            bail!("tensor `{p}down_proj` is {}, its gate_up_proj MXFP4", down.dtype.name());
        }
        let gate_up_bias = take(tensors, &p, "gate_up_proj_bias", &[n, 2 * w])?;
        let down_bias = take(tensors, &p, "down_proj_bias", &[n, h])?;
        let row = DType::Mxfp4.bytes_for(h).unwrap_or(0);
        if mxfp4 && row == 0 {
            bail!("hidden size {h} is not whole MXFP4 blocks");
        }
        for e in 0..n {
            let name = |s: &str| format!("{p}{e}.{s}");
            for (which, first) in [("gate_proj", 0), ("up_proj", 1)] {
                let gu = expert_slice(&gate_up, e)?;
                let t = match mxfp4 {
                    true => {
                        let rows =
                            move || gu.bytes().chunks_exact(row).skip(first).step_by(2).flatten().copied().collect();
                        computed_bytes(vec![w, h], DType::Mxfp4, rows)
                    }
                    // Row i is column 2i (2i + 1) of `[hidden, 2 · width]`.
                    false => computed(vec![w, h], move || interleaved_columns(&gu, first)),
                };
                tensors.insert(name(&format!("{which}.weight")), t);
                let b = expert_slice(&gate_up_bias, e)?;
                tensors.insert(name(&format!("{which}.bias")), computed(vec![w], move || every_other(&b, first)));
            }
            let d = expert_slice(&down, e)?;
            let d = match mxfp4 {
                true => d,
                // `[width, hidden]` transposed to `[hidden, width]`.
                false => computed(vec![h, w], move || transpose(&d)),
            };
            tensors.insert(name("down_proj.weight"), d);
            let db = expert_slice(&down_bias, e)?;
            tensors.insert(name("down_proj.bias"), computed(vec![h], move || db.to_f32_vec()));
        }
    }
    Ok(())
}

/// Removes `{p}{name}` from `tensors`, checked to be `shape`.
fn take(tensors: &mut HashMap<String, HostTensor>, p: &str, name: &str, shape: &[usize]) -> anyhow::Result<HostTensor> {
    let t = tensors.remove(&format!("{p}{name}")).with_context(|| format!("no `{p}{name}`"))?;
    if t.shape != shape {
        bail!("tensor `{p}{name}`: expected shape {shape:?}, found {:?}", t.shape);
    }
    Ok(t)
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
    computed_bytes(shape, DType::F32, move || make().iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// A tensor of `shape` and `dtype` whose bytes `make` computes on first use.
fn computed_bytes(shape: Vec<usize>, dtype: DType, make: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> HostTensor {
    let len = dtype.bytes_for(shape.iter().product()).expect("whole blocks");
    let lazy = LazyBytes::new(len, move || AlignedBytes::from_slice(&make()));
    HostTensor::lazy(Arc::new(lazy), dtype, shape)
}
