//! On-disk layouts.
//!
//! Readers turn a file or directory into a [`Checkpoint`];
//! Strata's own formats (flat layer directory, `.cawsf`) are written through
//! [`ModelWriter`], one group of tensors at a time, so a conversion holds one layer in
//! memory, never the model.

pub mod cawsf;
pub mod checkpoint;
pub mod checksum;
pub mod flat;
pub mod gguf;
pub mod gguf_write;
pub mod hf_dir;
pub mod ndsq;
pub mod requant;
pub mod route;
pub mod safetensors;
pub mod table_budget;
pub mod temp;
pub mod units;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use checkpoint::{Checkpoint, ConfigOrigin};

use strata_tensor::tensor::HostTensor;

/// A problem with a weight file: always names the file, and the byte offset when one
/// applies.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: at byte {offset}: {msg}")]
    Corrupt { path: PathBuf, offset: u64, msg: String },
    #[error("{path}: {msg}")]
    Invalid { path: PathBuf, msg: String },
}

/// Everything a model holds besides its weights: the [`Checkpoint`] text fields
/// (`config.json` in Hugging Face form, the tokenizer, the chat template), stored
/// verbatim by the writers and handed back verbatim by the readers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelMeta {
    pub name: String,
    pub config_json: String,
    pub tokenizer_json: String,
    #[serde(default)]
    pub tokenizer_config_json: Option<String>,
    #[serde(default)]
    pub generation_config_json: Option<String>,
    #[serde(default)]
    pub chat_template: Option<String>,
}

/// Which group a tensor belongs to: the always-resident tensors (embeddings, final
/// norm, output head) or one decoder layer, whose weights a streaming reader fetches
/// together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Group {
    Global,
    Layer(usize),
}

impl Group {
    /// The group of a tensor by its Hugging Face name: `model.layers.N.` is layer N,
    /// everything else is global.
    pub fn of(name: &str) -> Group {
        layer_tensor(name).map_or(Group::Global, |(i, _)| Group::Layer(i))
    }
}

/// A layer tensor's layer and its name inside the layer (`model.layers.N.REST` → `(N,
/// REST)`); `None` for the tensors outside the layers. The one place this naming is read.
pub fn layer_tensor(name: &str) -> Option<(usize, &str)> {
    let (index, local) = name.strip_prefix("model.layers.")?.split_once('.')?;
    Some((index.parse().ok()?, local))
}

/// A routed expert's tensor inside a layer: the layer-local name `mlp.experts.E.REST`
/// (Qwen MoE) or `block_sparse_moe.experts.E.REST` (Mixtral) → `(E, REST)`; `None` for
/// the layer core (attention, norms, router, shared expert). The one place this naming
/// is read.
pub fn expert_tensor(local: &str) -> Option<(usize, &str)> {
    let rest = local.strip_prefix("mlp.experts.").or_else(|| local.strip_prefix("block_sparse_moe.experts."))?;
    let (e, rest) = rest.split_once('.')?;
    Some((e.parse().ok()?, rest))
}

/// The prefix of a sparse-FFN layer's neuron-group bundles: `mlp.neurons.G.up_proj.weight`
/// (the group's rows of `up`) and `mlp.neurons.G.down_proj.weight` (its columns of `down`).
pub const NEURON_PREFIX: &str = "mlp.neurons.";

/// A neuron-group bundle's tensor inside a layer: `mlp.neurons.G.REST` → `(G, REST)`;
/// `None` for every other tensor. The one place this naming is read.
pub fn neuron_tensor(local: &str) -> Option<(usize, &str)> {
    let (g, rest) = local.strip_prefix(NEURON_PREFIX)?.split_once('.')?;
    Some((g.parse().ok()?, rest))
}

/// A tensor of a unit read on its own, apart from the layer core: a routed expert's
/// ([`expert_tensor`]) or a neuron group's ([`neuron_tensor`]) → `(unit index, REST)`.
pub fn unit_tensor(local: &str) -> Option<(usize, &str)> {
    expert_tensor(local).or_else(|| neuron_tensor(local))
}

/// A streaming writer of one of Strata's formats. The caller hands over the global
/// tensors once, then each layer once in order (`0, 1, ...`), each as tensors in their
/// final dtype, and calls [`finish`](ModelWriter::finish). Until `finish` returns the
/// output exists only under a temporary name, so a killed conversion never leaves
/// something that looks like a valid model.
pub trait ModelWriter {
    /// Writes one group's tensors (Hugging Face names).
    fn write_group(&mut self, group: Group, tensors: &[(String, HostTensor)]) -> anyhow::Result<()>;
    /// Writes what remains (index, checksums) and renames the output into place.
    fn finish(self: Box<Self>) -> anyhow::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::Group;

    #[test]
    fn groups_follow_hugging_face_names() {
        assert_eq!(Group::of("model.layers.12.mlp.up_proj.weight"), Group::Layer(12));
        assert_eq!(Group::of("model.embed_tokens.weight"), Group::Global);
        assert_eq!(Group::of("lm_head.weight"), Group::Global);
        assert_eq!(super::expert_tensor("mlp.experts.12.up_proj.weight"), Some((12, "up_proj.weight")));
        assert_eq!(super::expert_tensor("block_sparse_moe.experts.0.w2.weight"), Some((0, "w2.weight")));
        assert_eq!(super::expert_tensor("mlp.shared_expert.up_proj.weight"), None);
        assert_eq!(super::expert_tensor("mlp.gate.weight"), None);
        assert_eq!(super::neuron_tensor("mlp.neurons.3.down_proj.weight"), Some((3, "down_proj.weight")));
        assert_eq!(super::neuron_tensor("mlp.experts.3.down_proj.weight"), None);
        assert_eq!(super::unit_tensor("mlp.neurons.11.up_proj.weight"), Some((11, "up_proj.weight")));
        assert_eq!(super::unit_tensor("mlp.up_proj.weight"), None);
        assert_eq!(Group::of("model.layers.x.y"), Group::Global);
    }
}
