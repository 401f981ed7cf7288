//! The spec applied to a config: which tensors each layer of a model holds, their
//! shapes, and the check that a source holds exactly those.

use std::collections::HashMap;

use super::config::{Ffn, LinearAttnConfig, Mixer, MlaConfig, ModelConfig, MoeConfig};
use super::spec::{ArchSpec, EMBED, OUTPUT, OUTPUT_NORM, QkNorm, Role};
use strata_tensor::tensor::HostTensor;

impl ArchSpec {
    /// The roles layer `l` of this model holds: the family's tensors, less the biases
    /// and Q/K norms this config does not use, and the dense MLP or the experts (and the
    /// shared expert) by the layer's kind. An expert role stands for one tensor per expert.
    pub fn layer_roles(&self, c: &ModelConfig, l: usize) -> impl Iterator<Item = Role> + '_ {
        let bias = c.attention_bias;
        let qk_norm = self.qk_norm != QkNorm::None && c.qk_norm;
        let moe = c.layers.get(l).is_some_and(|l| l.ffn == Ffn::Moe);
        let shared = moe && c.moe.is_some_and(|m| m.shared_expert_size.is_some());
        let shared_gated = shared && c.moe.is_some_and(|m| m.shared_gated);
        let choice_bias = moe && c.moe.is_some_and(|m| m.choice_bias);
        let latent = c.layers.get(l).is_some_and(|l| l.mixer == Mixer::Latent);
        let q_lora = latent && c.mla.is_some_and(|a| a.q_lora_rank.is_some());
        let split_kv_b = c.mla.is_some_and(|a| a.split_kv_b);
        let linear = c.layers.get(l).is_some_and(|l| l.mixer == Mixer::Linear);
        let gguf = c.linear_attn.is_some_and(|la| la.gguf_layout);
        // Qwen3.5 always holds its projections apart; Qwen3-Next only from a GGUF.
        let apart = gguf || self.tensor(Role::LinQkvz).is_none();
        self.tensors.iter().map(|t| t.role).filter(move |r| match r {
            Role::Q => !linear && !q_lora,
            Role::O => !linear,
            Role::K | Role::V | Role::Qkv => !linear && !latent,
            Role::QBias | Role::KBias | Role::VBias | Role::OBias => bias && !linear && !latent,
            Role::AttnSinks => !linear && !latent,
            Role::QNorm | Role::KNorm => qk_norm && !linear && !latent,
            Role::MlaQA | Role::MlaQANorm | Role::MlaQB => q_lora,
            Role::MlaKvA | Role::MlaKvANorm => latent,
            Role::MlaKvB => latent && !split_kv_b,
            Role::MlaKB | Role::MlaVB => latent && split_kv_b,
            Role::RouterBias => choice_bias,
            Role::LinQkvz | Role::LinALog => linear && !gguf,
            Role::LinNegA => linear && gguf,
            Role::LinQkv | Role::LinZ => linear && apart,
            Role::LinBa | Role::LinConv | Role::LinDtBias | Role::LinNorm | Role::LinOut | Role::LinB | Role::LinA => {
                linear
            }
            Role::Gate | Role::Up | Role::GateUp | Role::Down => !moe,
            Role::Router | Role::RouterLogitBias => moe,
            _ if r.is_expert() => moe,
            Role::SharedGate | Role::SharedUp | Role::SharedDown => shared,
            Role::SharedExpertGate => shared_gated,
            _ => true,
        })
    }

    /// The Hugging Face layer-local names of layer `l`'s tensors, with their roles
    /// (one name per expert for an expert role).
    pub fn layer_tensor_names(&self, c: &ModelConfig, l: usize) -> Vec<(Role, String)> {
        let n_experts = c.moe.map_or(0, |m| m.n_experts);
        let mut out = Vec::new();
        let groups = c.neuron_group.map_or(0, |g| c.intermediate_size / g.max(1));
        for role in self.layer_roles(c, l) {
            let Some(t) = self.tensor(role) else { continue };
            match role {
                _ if role.is_expert() => out.extend((0..n_experts).map(|e| (role, t.hf_for(e)))),
                // A sparse FFN's up rows and down columns, one bundle per neuron group.
                Role::Up | Role::Down if c.neuron_group.is_some() => {
                    let rest = if role == Role::Up { "up_proj.weight" } else { "down_proj.weight" };
                    out.extend((0..groups).map(|g| (role, format!("{}{g}.{rest}", strata_format::NEURON_PREFIX))));
                }
                _ => out.push((role, t.hf.to_string())),
            }
        }
        out
    }
}

/// A source's tensors against what its config says the model holds.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("missing tensor `{0}`")]
    Missing(String),
    #[error("tensor `{name}`: expected shape {want:?}, found {got:?}")]
    Shape { name: String, want: Vec<usize>, got: Vec<usize> },
    #[error("tensor `{name}` has no place in a `{arch}` model with this config")]
    Unexpected { name: String, arch: &'static str },
}

/// Checks that `tensors` hold exactly what a model with config `c` is made of, each
/// shaped as the spec says (the loader and conversion both call this, so a file that
/// does not fit is refused up front, naming the tensor).
pub fn check_tensors(c: &ModelConfig, tensors: &HashMap<String, HostTensor>) -> Result<(), TensorError> {
    let spec = c.spec();
    let (h, vocab) = (c.hidden_size, c.vocab_size);
    let mut want: HashMap<String, Vec<usize>> = HashMap::new();
    want.insert(EMBED.0.into(), vec![vocab, h]);
    want.insert(OUTPUT_NORM.0.into(), vec![h]);
    if !c.tie_word_embeddings {
        want.insert(OUTPUT.0.into(), vec![vocab, h]);
    }
    for l in 0..c.n_layers {
        for (role, hf) in spec.layer_tensor_names(c, l) {
            want.insert(format!("model.layers.{l}.{hf}"), role.shape(c));
        }
        // A sparse FFN's per-neuron scale, beside its bundles.
        if c.neuron_group.is_some() {
            want.insert(format!("model.layers.{l}.{}", super::spec::NEURON_SCALE), vec![c.intermediate_size]);
        }
    }
    for (name, shape) in &want {
        let t = tensors.get(name).ok_or_else(|| TensorError::Missing(name.clone()))?;
        if t.shape != *shape {
            return Err(TensorError::Shape { name: name.clone(), want: shape.clone(), got: t.shape.clone() });
        }
    }
    // Tolerated extras: a head saved beside tied embeddings, and the RoPE tables old
    // checkpoints carry (recomputed from the config).
    // And the multi-token-prediction layers stored after the last decoder layer.
    let nextn = |name: &str| {
        let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        layer.is_some_and(|l| l >= c.n_layers && l < c.n_layers + c.nextn_layers)
    };
    let tolerated = |name: &str| {
        (name == OUTPUT.0 && c.tie_word_embeddings) || name.ends_with("rotary_emb.inv_freq") || nextn(name)
    };
    match tensors.keys().find(|n| !want.contains_key(*n) && !tolerated(n)) {
        Some(name) => Err(TensorError::Unexpected { name: name.clone(), arch: spec.hf_type }),
        None => Ok(()),
    }
}

impl Role {
    /// The tensor's shape in a model with config `c`.
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let (q, kv) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let whole = c.spec().qk_norm == QkNorm::Whole;
        let moe = c.moe.unwrap_or(MoeConfig::softmax(0, 0, 0));
        let mla = c.mla.unwrap_or(MlaConfig {
            q_lora_rank: None,
            kv_lora_rank: 0,
            qk_nope_head_dim: 0,
            qk_rope_head_dim: 0,
            v_head_dim: 0,
            rope_interleave: false,
            split_kv_b: false,
        });
        let mla_q = c.n_heads * mla.qk_head_dim();
        let q_rank = mla.q_lora_rank.unwrap_or(0);
        let shared = moe.shared_expert_size.unwrap_or(0);
        let la = c.linear_attn.unwrap_or(LinearAttnConfig {
            n_k_heads: 0,
            n_v_heads: 0,
            k_head_dim: 0,
            v_head_dim: 0,
            conv_kernel: 0,
            gguf_layout: false,
            v_tiled: false,
        });
        // Queries and a gate per head, interleaved head by head.
        let q_rows = if c.attn_output_gate { 2 * q } else { q };
        match self {
            Role::AttnNorm | Role::AttnPostNorm | Role::FfnNorm | Role::FfnPostNorm => vec![h],
            Role::Q if c.mla.is_some() => vec![mla_q, h],
            Role::Q => vec![q_rows, h],
            Role::K | Role::V => vec![kv, h],
            Role::Qkv => vec![q + 2 * kv, h],
            Role::QBias => vec![q],
            Role::KBias | Role::VBias => vec![kv],
            Role::O if c.mla.is_some() => vec![h, c.n_heads * mla.v_head_dim],
            Role::O => vec![h, q],
            Role::MlaQA => vec![q_rank, h],
            Role::MlaQANorm => vec![q_rank],
            Role::MlaQB => vec![mla_q, q_rank],
            Role::MlaKvA => vec![mla.cache_width(), h],
            Role::MlaKvANorm => vec![mla.kv_lora_rank],
            Role::MlaKvB => vec![c.n_heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank],
            Role::MlaKB => vec![c.n_heads, mla.kv_lora_rank, mla.qk_nope_head_dim],
            Role::MlaVB => vec![c.n_heads, mla.v_head_dim, mla.kv_lora_rank],
            Role::RouterBias | Role::RouterLogitBias => vec![moe.n_experts],
            Role::OBias => vec![h],
            Role::AttnSinks => vec![c.n_heads],
            Role::ExpertGateBias | Role::ExpertUpBias => vec![moe.expert_size],
            Role::ExpertDownBias => vec![h],
            Role::QNorm => vec![if whole { q } else { c.head_dim }],
            Role::KNorm => vec![if whole { kv } else { c.head_dim }],
            Role::Gate => vec![i, h],
            // A neuron group's rows of `up` and columns of `down` (sparse FFN bundles).
            Role::Up => vec![c.neuron_group.unwrap_or(i), h],
            Role::GateUp => vec![2 * i, h],
            Role::Down => vec![h, c.neuron_group.unwrap_or(i)],
            Role::Router => vec![moe.n_experts, h],
            Role::ExpertGate | Role::ExpertUp => vec![moe.expert_size, h],
            Role::ExpertDown => vec![h, moe.expert_size],
            Role::SharedGate | Role::SharedUp => vec![shared, h],
            Role::SharedDown => vec![h, shared],
            Role::SharedExpertGate => vec![1, h],
            Role::LinQkvz => vec![2 * la.key_dim() + 2 * la.value_dim(), h],
            Role::LinBa => vec![2 * la.n_v_heads, h],
            Role::LinConv => vec![la.conv_dim(), 1, la.conv_kernel],
            Role::LinALog | Role::LinNegA | Role::LinDtBias => vec![la.n_v_heads],
            Role::LinNorm => vec![la.v_head_dim],
            Role::LinOut => vec![h, la.value_dim()],
            Role::LinQkv => vec![la.conv_dim(), h],
            Role::LinZ => vec![la.value_dim(), h],
            Role::LinB | Role::LinA => vec![la.n_v_heads, h],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_checked_against_the_spec() {
        let c = ModelConfig::from_json(
            r#"{"model_type":"phi3","hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":2,"num_key_value_heads":1,"vocab_size":5,"tie_word_embeddings":true}"#,
        )
        .unwrap();
        let t = |shape: Vec<usize>| HostTensor::from_f32(&vec![0.0; shape.iter().product()], shape);
        let mut tensors: HashMap<String, HostTensor> = [
            ("model.embed_tokens.weight", vec![5, 8]),
            ("model.norm.weight", vec![8]),
            ("model.layers.0.input_layernorm.weight", vec![8]),
            ("model.layers.0.self_attn.qkv_proj.weight", vec![16, 8]),
            ("model.layers.0.self_attn.o_proj.weight", vec![8, 8]),
            ("model.layers.0.post_attention_layernorm.weight", vec![8]),
            ("model.layers.0.mlp.gate_up_proj.weight", vec![32, 8]),
            ("model.layers.0.mlp.down_proj.weight", vec![8, 16]),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), t(s)))
        .collect();
        check_tensors(&c, &tensors).unwrap();
        tensors.insert("model.layers.0.self_attn.qkv_proj.weight".into(), t(vec![24, 8]));
        let e = check_tensors(&c, &tensors).unwrap_err().to_string();
        assert!(e.contains("qkv_proj") && e.contains("[16, 8]"), "{e}");
        tensors.remove("model.layers.0.self_attn.qkv_proj.weight");
        let e = check_tensors(&c, &tensors).unwrap_err().to_string();
        assert!(e.contains("missing tensor `model.layers.0.self_attn.qkv_proj.weight`"), "{e}");
        tensors.insert("model.layers.0.self_attn.qkv_proj.weight".into(), t(vec![16, 8]));
        tensors.insert("model.layers.0.self_attn.q_proj.weight".into(), t(vec![8, 8]));
        let e = check_tensors(&c, &tensors).unwrap_err().to_string();
        assert!(e.contains("q_proj") && e.contains("`phi3`"), "{e}");
    }
}
