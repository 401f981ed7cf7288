//! Which dtype `--quant` stores each tensor in, and requantizing a tensor to it: shared
//! by `convert` (flat and `.cawsf` outputs) and `export` (GGUF).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;

use super::layer_tensor;
use strata_quant::ReadF32;
use strata_tensor::tensor::{AlignedBytes, DType, HostTensor};

/// Layer-local names of the tensors that route tokens: the MoE router (`[n_experts,
/// hidden]`) and the shared expert's gate (`[1, hidden]`). Every `--quant` keeps them in
/// their source dtype, as llama.cpp keeps `ffn_gate_inp` in F32: a small error there
/// changes which experts run.
pub const ROUTING_TENSORS: [&str; 3] =
    ["mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.shared_expert_gate.weight"];

/// The dtype tensor `name` is converted to under `quant`, or `None` to keep it: float
/// targets convert every tensor (quantized ones are dequantized: `--quant f32` turns a
/// Q8_0 model into the exact F32 model its blocks stand for); block targets convert
/// weight matrices whose rows are whole blocks (norms, biases and odd shapes keep their
/// dtype), a K-quant's matrices whose rows are not whole 256-value blocks go to its
/// [`block_fallback`] when their rows are whole blocks of that. Routing tensors
/// ([`ROUTING_TENSORS`]) are never converted.
pub fn target_dtype(name: &str, t: &HostTensor, quant: Option<DType>) -> Option<DType> {
    target_dtype_for(name, t.dtype, &t.shape, quant)
}

/// [`target_dtype`] of a tensor stored as `stored` in `shape` (a matrix: two
/// dimensions).
pub fn target_dtype_for(name: &str, stored: DType, shape: &[usize], quant: Option<DType>) -> Option<DType> {
    let q = quant?;
    if stored == q || layer_tensor(name).is_some_and(|(_, local)| ROUTING_TENSORS.contains(&local)) {
        return None;
    }
    if q.is_float() {
        return Some(q);
    }
    let cols = *shape.last()?;
    if shape.len() != 2 {
        return None;
    }
    std::iter::once(q).chain(block_fallback(q)).find(|d| cols.is_multiple_of(d.block_size())).filter(|&d| d != stored)
}

/// The 32-value block format a K-quant falls back to for a matrix whose rows are not
/// whole 256-value blocks, as llama.cpp's quantizer does (`llama-quant.cpp`,
/// `convert_incompatible_tensor`): Q6_K to Q8_0, as there; Q4_K to Q4_0, where llama.cpp
/// takes Q5_0, which Strata does not write (Q4_0 costs the 4.5 bits a weight Q4_K does).
pub fn block_fallback(q: DType) -> Option<DType> {
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

/// `t` in `dtype`, through f32.
pub fn requantize(pool: &rayon::ThreadPool, name: &str, t: &HostTensor, dtype: DType) -> anyhow::Result<HostTensor> {
    let x = t.to_f32_vec();
    let cols = *t.shape.last().unwrap_or(&1);
    let rows = x.len() / cols.max(1);
    let bytes: AlignedBytes = strata_quant::quantize_matrix(pool, dtype, &x, rows, cols)
        .with_context(|| format!("quantizing {name} to {}", dtype.name()))?;
    let len = strata_tensor::tensor::ByteSource::bytes(&bytes).len();
    Ok(HostTensor::new(Arc::new(bytes), 0, len, dtype, t.shape.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::testing::{EXPERTS, filled};

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
        let bytes = strata_quant::quantize_matrix(&pool, DType::Q8_0, &x, 2, 64).unwrap();
        let len = strata_tensor::tensor::ByteSource::bytes(&bytes).len();
        let q8 = HostTensor::new(Arc::new(bytes), 0, len, DType::Q8_0, vec![2, 64]);
        let name = "model.layers.0.mlp.up_proj.weight";
        assert_eq!(target_dtype(name, &q8, Some(DType::F32)), Some(DType::F32));
        assert_eq!(target_dtype(name, &q8, Some(DType::F16)), Some(DType::F16));
        let f32 = requantize(&pool, name, &q8, DType::F32).unwrap();
        assert_eq!(f32.dtype, DType::F32);
        assert_eq!(f32.to_f32_vec(), q8.to_f32_vec(), "dequantized value for value");
        assert_eq!(target_dtype("model.norm.weight", &filled(vec![64], 1), Some(DType::Q8_0)), None);
    }
}
