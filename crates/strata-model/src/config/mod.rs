//! Model hyperparameters from a Hugging Face `config.json`, resolved once into a plain
//! runtime struct. Unsupported architectures and settings are errors that name them.

use serde_json::{Value, json};

use strata_backend::delta::DeltaShape;
use strata_backend::{Activation, RopeFreqs};

pub use super::spec::Arch;
use super::spec::ArchSpec;

mod json;

/// How RoPE frequencies are adjusted for longer contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (equivalently, frequencies).
    Linear {
        factor: f32,
    },
    /// Llama 3.1's piecewise frequency scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: f32,
    },
    /// YaRN (DeepSeek-V3, and others): each frequency between its original and its
    /// interpolated (divided by `factor`) value by where its wavelength falls between
    /// `beta_fast` and `beta_slow` rotations over `original_max_position`, and cos and
    /// sin scaled by `attention_factor`.
    Yarn {
        factor: f32,
        original_max_position: f32,
        beta_fast: f32,
        beta_slow: f32,
        /// Multiplier on cos and sin (from the config, or derived from `mscale`s).
        attention_factor: f32,
        /// The correction range rounded outwards to whole dimensions (transformers'
        /// `truncate`, on unless a config says otherwise).
        truncate: bool,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (qwen2, or llama with `attention_bias`).
    pub attention_bias: bool,
    /// The family's Q/K norms are there (GLM-4.5 makes them optional: `use_qk_norm`).
    pub qk_norm: bool,
    /// Per layer: its attention window and which RoPE it uses (`n_layers` entries).
    pub layers: Vec<LayerConfig>,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    /// The RoPE base of [`LayerRope::Local`] layers (unscaled; Gemma 3's local layers).
    pub rope_local_theta: f32,
    /// Dimensions of each head that RoPE rotates (`head_dim` unless RoPE is partial).
    pub rotary_dim: usize,
    /// Multiplier on the token embeddings (Gemma: `sqrt(hidden)`; Granite).
    pub embed_scale: f32,
    /// Multiplier on each block's output before the residual add (Granite).
    pub residual_scale: f32,
    /// Multiplier on q·k (`head_dim^-0.5` unless the family says otherwise).
    pub attn_scale: f32,
    /// The logits are divided by this (Granite's `logits_scaling`).
    pub logits_divisor: f32,
    /// Attention scores `s` become `cap * tanh(s / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits `z` become `cap * tanh(z / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The routed experts of a mixture-of-experts model (which layers use them:
    /// [`LayerConfig::ffn`]).
    pub moe: Option<MoeConfig>,
    /// The shape of the linear-attention layers (Qwen3-Next's gated delta rule; which
    /// layers: [`LayerConfig::mixer`]); `None` when the model has none.
    pub linear_attn: Option<LinearAttnConfig>,
    /// `q_proj` also gives a gate per head, and the attention output is multiplied by
    /// its sigmoid before `o_proj` (Qwen3-Next).
    pub attn_output_gate: bool,
    /// Neurons per group when the dense FFNs are stored as neuron-group bundles
    /// (`strata convert --sparse-ffn`): `up` and `down` come as
    /// `intermediate_size / group` units of `group` neurons each. Set from the tensors
    /// when a model is opened ([`ModelConfig::detect_neuron_groups`]).
    pub neuron_group: Option<usize>,
    /// The shape of multi-head latent attention ([`Mixer::Latent`] layers: DeepSeek-V3,
    /// Kimi-K2); `None` when the model has none.
    pub mla: Option<MlaConfig>,
    /// Multi-token-prediction layers stored after the last decoder layer
    /// (`num_nextn_predict_layers`): their tensors are skipped, not run.
    pub nextn_layers: usize,
}

/// Multi-head latent attention: queries from the hidden state (directly, or through a
/// rank-`q_lora_rank` bottleneck with its norm); keys and values from one shared latent
/// of `kv_lora_rank` values per token (normed), and one RoPE key of `qk_rope_head_dim`
/// shared by every head. Each head's key is `qk_nope_head_dim` values up-projected from
/// the latent and the shared RoPE key; its value `v_head_dim` values up-projected from
/// the latent. The cache keeps the latent and the RoPE key only: `kv_lora_rank +
/// qk_rope_head_dim` values a token and layer, which is [`ModelConfig::head_dim`] (with
/// one KV head) for these models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaConfig {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// RoPE rotates pairs `(2i, 2i + 1)` of the RoPE parts (`rope_interleave`, the
    /// default), not the halves.
    pub rope_interleave: bool,
    /// The up-projection is stored as llama.cpp's converter leaves it: `k_b_proj` (each
    /// head's key part transposed, `(n_heads, kv_lora_rank, qk_nope_head_dim)`) and
    /// `v_b_proj` (`(n_heads, v_head_dim, kv_lora_rank)`) in place of `kv_b_proj`.
    /// Written to `config.json` as `strata_mla_split_kv_b`.
    pub split_kv_b: bool,
}

impl MlaConfig {
    /// Width of a head's query and key before absorption (`qk_nope + qk_rope`).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Values the cache keeps per token and layer: the latent and the RoPE key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// A gated-delta-rule (linear attention) layer: `n_k_heads` query/key heads of
/// `k_head_dim`, `n_v_heads` value heads of `v_head_dim` (each key head serves
/// `n_v_heads / n_k_heads` consecutive value heads), and a causal depthwise convolution
/// of `conv_kernel` taps over the queries, keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearAttnConfig {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    pub conv_kernel: usize,
    /// The tensors are laid out as llama.cpp's converter leaves them (a GGUF Qwen3-Next,
    /// or a conversion of one): queries, keys and values apart from `z`
    /// (`in_proj_qkv`, `in_proj_z`), and `-exp(A_log)` (`ssm_a`) in place of `A_log`.
    /// Written to `config.json` as `strata_gguf_linear_layout`.
    pub gguf_layout: bool,
    /// The value heads come in tiled order (a GGUF Qwen3.5: llama.cpp's converter puts
    /// value head `j` of key head `g` at `j * n_k_heads + g`, so that value head `h`
    /// reads key head `h % n_k_heads`), not grouped by key head (`h / (n_v / n_k)`).
    /// Written to `config.json` as `strata_linear_v_tiled`.
    pub v_tiled: bool,
}

impl LinearAttnConfig {
    /// The layer's sizes as the delta-rule op takes them, with both projections in head
    /// order (the layouts and `eps` are the weights' and the model's: set by the caller).
    pub fn delta_shape(&self) -> DeltaShape {
        DeltaShape {
            n_k_heads: self.n_k_heads,
            n_v_heads: self.n_v_heads,
            k_head_dim: self.k_head_dim,
            v_head_dim: self.v_head_dim,
            conv_kernel: self.conv_kernel,
            qkvz_grouped: false,
            ba_grouped: false,
            v_tiled: self.v_tiled,
            eps: 0.0,
        }
    }

    /// Width of the queries (and of the keys).
    pub fn key_dim(&self) -> usize {
        self.delta_shape().key_dim()
    }

    /// Width of the values (and of the output gate `z`).
    pub fn value_dim(&self) -> usize {
        self.delta_shape().value_dim()
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        self.delta_shape().conv_dim()
    }

    /// Floats of one sequence's state in one layer: the convolution's last
    /// `conv_kernel - 1` inputs and the recurrent `k_head_dim x v_head_dim` matrix of
    /// each value head.
    pub fn state_len(&self) -> usize {
        self.delta_shape().state_len()
    }
}

/// How a mixture-of-experts layer routes: each token goes to the `top_k` experts the
/// router scores highest (softmax over all `n_experts`, or each score's sigmoid), weighted
/// by those scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub top_k: usize,
    /// Width of each routed expert's MLP.
    pub expert_size: usize,
    /// Width of the shared expert every token also goes through, scaled by
    /// `sigmoid(shared_expert_gate · x)` (Qwen2-MoE); `None` when there is none.
    pub shared_expert_size: Option<usize>,
    /// The `top_k` probabilities are rescaled to sum to 1 (Mixtral always; Qwen by
    /// `norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// How the router's logits become scores.
    pub scoring: Scoring,
    /// A learned bias per expert (`e_score_correction_bias`) is added to the scores to
    /// choose the experts, but not to weight them (DeepSeek-V3's `noaux_tc`).
    pub choice_bias: bool,
    /// The experts come in `groups` groups of consecutive indices; a token chooses its
    /// experts from the `groups_used` groups that score highest by [`Self::group_score`]
    /// (1 and 1: no grouping).
    pub groups: usize,
    pub groups_used: usize,
    /// How a group of experts is scored to choose the `groups_used` groups.
    pub group_score: GroupScore,
    /// The experts of the groups not chosen score 0 for the choice (transformers'
    /// DeepSeek-V3), not minus infinity (its GLM-4.5, llama.cpp): the two differ only
    /// when a biased score is negative. Written to `config.json` as
    /// `strata_group_mask_zero`.
    pub group_mask_zero: bool,
    /// The routed experts' weights are multiplied by this (`routed_scaling_factor`).
    pub routed_scale: f32,
    /// The shared expert's output is scaled by `sigmoid(shared_expert_gate · x)`
    /// (Qwen2-MoE); DeepSeek's and GLM's shared experts are added as they are.
    pub shared_gated: bool,
}

/// How a group of experts is scored when a router keeps only its best groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupScore {
    /// The sum of the group's two best scores (DeepSeek-V3's `noaux_tc`, GLM-4.5,
    /// every grouped router of llama.cpp).
    TopTwoSum,
    /// The group's best score (DeepSeek-V2's `group_limited_greedy`).
    Max,
}

/// How a router's logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// Softmax over all experts (Mixtral, Qwen).
    Softmax,
    /// Each logit's sigmoid (DeepSeek-V3, GLM-4.5).
    Sigmoid,
}

impl MoeConfig {
    /// Plain softmax routing with no groups, bias or scaling: what the Mixtral and Qwen
    /// families do.
    pub fn softmax(n_experts: usize, top_k: usize, expert_size: usize) -> Self {
        MoeConfig {
            n_experts,
            top_k,
            expert_size,
            shared_expert_size: None,
            norm_topk_prob: false,
            scoring: Scoring::Softmax,
            choice_bias: false,
            groups: 1,
            groups_used: 1,
            group_score: GroupScore::TopTwoSum,
            group_mask_zero: false,
            routed_scale: 1.0,
            shared_gated: true,
        }
    }
}

/// What differs from one layer to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerConfig {
    /// Keys this far back and nearer only (sliding-window attention).
    pub sliding_window: Option<usize>,
    pub rope: LayerRope,
    pub ffn: Ffn,
    pub mixer: Mixer,
}

/// How a layer mixes tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// Softmax attention over a KV cache.
    Attention,
    /// The gated delta rule ([`ModelConfig::linear_attn`]): a fixed-size state per
    /// sequence instead of a KV cache.
    Linear,
    /// Multi-head latent attention ([`ModelConfig::mla`]): a cache of one latent and one
    /// RoPE key per token.
    Latent,
}

impl Mixer {
    /// Rows of [`ModelConfig::n_kv_heads`] ` * ` [`ModelConfig::head_dim`] values the
    /// KV cache keeps per token: keys and values (2), the latent and RoPE key read as
    /// both (1), or none (a fixed-size state instead).
    pub fn cached_rows(self) -> usize {
        match self {
            Mixer::Attention => 2,
            Mixer::Latent => 1,
            Mixer::Linear => 0,
        }
    }
}

/// A layer's feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ffn {
    /// The gated MLP of width `intermediate_size`.
    Dense,
    /// Routed experts ([`ModelConfig::moe`]), and the shared expert if the model has one.
    Moe,
}

/// Which rotary embedding a layer applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerRope {
    /// `rope_theta` with `rope_scaling`.
    Global,
    /// `rope_local_theta`, unscaled.
    Local,
    /// None at all (SmolLM3's NoPE layers).
    None,
}

/// The most routed experts a layer may have (Qwen3-235B and DeepSeek-V3 have 128 and
/// 256): a cap checked before anything is sized from a file's claim.
pub const MAX_EXPERTS: usize = 1 << 12;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// serde's message says where (line and column).
    #[error("config.json does not parse as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config.json holds {0}, not a JSON object")]
    NotAnObject(&'static str),
    #[error("config.json names no architecture: it has neither `model_type` nor `architectures`")]
    NoArchitecture,
    #[error("config.json: missing or invalid `{0}`")]
    Missing(&'static str),
    #[error("unsupported architecture `{0}` (supported: {supported})", supported = Arch::supported_hf_types())]
    Architecture(String),
    #[error("config.json: unsupported setting {0}")]
    Unsupported(String),
    /// A GGUF file's setting, named by its key.
    #[error("unsupported setting {0}")]
    GgufSetting(String),
}

/// How a source names a config's settings in errors: `config.json`'s keys, or a GGUF
/// file's (`llama.embedding_length`).
#[derive(Clone, Copy, Debug)]
pub enum Names<'a> {
    ConfigJson,
    /// A GGUF file whose keys start with this architecture name.
    Gguf(&'a str),
}

impl Names<'_> {
    /// The name of the setting `config.json` calls `field`.
    fn of(self, field: &'static str) -> String {
        let Names::Gguf(arch) = self else { return field.to_string() };
        let key = match field {
            "hidden_size" => "embedding_length",
            "intermediate_size" => "feed_forward_length",
            "num_hidden_layers" => "block_count",
            "vocab_size" => return "the rows of `token_embd.weight` (the vocabulary)".into(),
            "max_position_embeddings" => "context_length",
            "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
            "rope_theta" => "rope.freq_base",
            "local rope_theta" => "rope.freq_base_swa",
            "rope_scaling" => "rope.scaling.factor",
            "num_attention_heads" => "attention.head_count",
            "num_key_value_heads" => "attention.head_count_kv",
            "head_dim" => "attention.key_length",
            "rotary dimensions" => "rope.dimension_count",
            "num_experts" => "expert_count",
            "num_experts_per_tok" => "expert_used_count",
            "moe_intermediate_size" => "expert_feed_forward_length",
            "embedding multiplier" => "embedding_scale",
            "residual multiplier" => "residual_scale",
            "attention scale" => "attention.scale",
            "logits scaling" => "logit_scale",
            "linear attention" => "ssm.*",
            other => return other.to_string(),
        };
        format!("`{arch}.{key}`")
    }
}

impl ModelConfig {
    /// Sets [`ModelConfig::neuron_group`] from the tensors: the rows of layer 0's first
    /// neuron-group bundle, when the FFNs are stored as bundles.
    pub fn detect_neuron_groups(
        &mut self,
        tensors: &std::collections::HashMap<String, strata_tensor::tensor::HostTensor>,
    ) {
        let name = format!("model.layers.0.{}0.up_proj.weight", strata_format::NEURON_PREFIX);
        self.neuron_group = tensors.get(&name).and_then(|t| t.shape.first().copied()).filter(|&g| g > 0);
    }

    /// The architecture's declarative description.
    pub fn spec(&self) -> &'static ArchSpec {
        self.arch.spec()
    }

    /// Checks what every source must satisfy, naming settings as `config.json` does.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as(Names::ConfigJson)
    }

    /// Checks what every source (config.json or GGUF metadata) must satisfy; an error
    /// names each setting as the source does.
    pub fn validate_as(&self, names: Names<'_>) -> Result<(), ConfigError> {
        let n = |field: &'static str| names.of(field);
        let bad = |msg: String| match names {
            Names::ConfigJson => ConfigError::Unsupported(msg),
            Names::Gguf(_) => ConfigError::GgufSetting(msg),
        };
        // Only dense layers have that width: a model whose every layer routes has none.
        let dense = self.layers.iter().any(|l| l.ffn == Ffn::Dense);
        for (name, v) in [
            (n("hidden_size"), self.hidden_size),
            (n("intermediate_size"), if dense { self.intermediate_size } else { 1 }),
            (n("num_hidden_layers"), self.n_layers),
            (n("vocab_size"), self.vocab_size),
            (n("max_position_embeddings"), self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(bad(format!("{name} 0 (must be at least 1)")));
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(bad(format!(
                "normalization epsilon {} {} (must be finite and not negative)",
                n("rms_norm_eps"),
                self.rms_norm_eps
            )));
        }
        for (name, theta) in [(n("rope_theta"), self.rope_theta), (n("local rope_theta"), self.rope_local_theta)] {
            if !(theta.is_finite() && theta > 0.0) {
                return Err(bad(format!("{name} {theta} (must be finite and above 0)")));
            }
        }
        let scaling = match self.rope_scaling {
            RopeScaling::None => vec![],
            RopeScaling::Linear { factor } => vec![factor],
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, .. } => {
                vec![factor, low_freq_factor, high_freq_factor]
            }
            RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow, attention_factor, .. } => {
                vec![factor, original_max_position, beta_fast, beta_slow, attention_factor]
            }
        };
        if let Some(x) = scaling.into_iter().find(|x| !(x.is_finite() && *x > 0.0)) {
            return Err(bad(format!("{} factor {x} (must be finite and above 0)", n("rope_scaling"))));
        }
        let (h, kv) = (self.n_heads, self.n_kv_heads);
        if h == 0 || kv == 0 || h % kv != 0 {
            return Err(bad(format!(
                "{} {h} is not a multiple of {} {kv}",
                n("num_attention_heads"),
                n("num_key_value_heads")
            )));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(bad(format!("{} {} (must be even)", n("head_dim"), self.head_dim)));
        }
        if self.rotary_dim == 0 || self.rotary_dim > self.head_dim || !self.rotary_dim.is_multiple_of(2) {
            return Err(bad(format!(
                "{} {} of {} {} (must be even, non-zero and at most the head width)",
                n("rotary dimensions"),
                self.rotary_dim,
                n("head_dim"),
                self.head_dim
            )));
        }
        if self.layers.len() != self.n_layers {
            return Err(bad(format!("{} per-layer entries for {} layers", self.layers.len(), self.n_layers)));
        }
        if let Some(m) = &self.moe {
            if m.n_experts == 0 || m.top_k == 0 || m.top_k > m.n_experts {
                return Err(bad(format!(
                    "{} {} of {} {} (must be between 1 and the expert count)",
                    n("num_experts_per_tok"),
                    m.top_k,
                    n("num_experts"),
                    m.n_experts
                )));
            }
            let per_group = m.n_experts / m.groups.max(1);
            if m.groups == 0
                || !m.n_experts.is_multiple_of(m.groups)
                || m.groups_used == 0
                || m.groups_used > m.groups
                || m.top_k > m.groups_used * per_group
                || (m.groups > 1 && per_group < 2)
            {
                return Err(bad(format!(
                    "{} expert groups, {} of them used, for {} experts and top-{} (groups must divide the \
                     experts, at least two in each, and the groups used hold at least top-k)",
                    m.groups, m.groups_used, m.n_experts, m.top_k
                )));
            }
            if !(m.routed_scale.is_finite() && m.routed_scale > 0.0) {
                return Err(bad(format!(
                    "routed expert scaling factor {} (must be finite and above 0)",
                    m.routed_scale
                )));
            }
            if m.n_experts > MAX_EXPERTS || m.expert_size == 0 {
                return Err(bad(format!(
                    "{} {} of {} {} (at most {MAX_EXPERTS}, width above 0)",
                    n("num_experts"),
                    m.n_experts,
                    n("moe_intermediate_size"),
                    m.expert_size
                )));
            }
        }
        let linear_layers = self.layers.iter().any(|l| l.mixer == Mixer::Linear);
        match (&self.linear_attn, linear_layers) {
            (None, true) => {
                return Err(bad("a linear-attention layer in a model without its shape".into()));
            }
            (Some(la), _) => {
                let dims = [la.n_k_heads, la.n_v_heads, la.k_head_dim, la.v_head_dim];
                if dims.contains(&0)
                    || !la.n_v_heads.is_multiple_of(la.n_k_heads)
                    || !(2..=16).contains(&la.conv_kernel)
                {
                    return Err(bad(format!(
                        "linear attention ({}) with {} key heads of {}, {} value heads of {} and a convolution of {} \
                         (value heads a multiple of key heads, widths above 0, 2 to 16 taps)",
                        n("linear attention"),
                        la.n_k_heads,
                        la.k_head_dim,
                        la.n_v_heads,
                        la.v_head_dim,
                        la.conv_kernel
                    )));
                }
            }
            (None, false) => {}
        }
        let latent_layers = self.layers.iter().any(|l| l.mixer == Mixer::Latent);
        match (&self.mla, latent_layers) {
            (None, true) => return Err(bad("a latent-attention layer in a model without its shape".into())),
            (Some(a), _) => {
                let dims = [a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim];
                if dims.contains(&0)
                    || a.q_lora_rank == Some(0)
                    || !a.qk_rope_head_dim.is_multiple_of(2)
                    || self.n_kv_heads != 1
                    || self.head_dim != a.cache_width()
                {
                    return Err(bad(format!(
                        "latent attention with latent rank {}, query rank {:?}, head widths {}+{} (keys) and {} \
                         (values) (widths above 0, the RoPE part even)",
                        a.kv_lora_rank, a.q_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
                    )));
                }
            }
            (None, false) => {}
        }
        if self.moe.is_none() && self.layers.iter().any(|l| l.ffn == Ffn::Moe) {
            return Err(bad("a mixture-of-experts layer in a model without experts".into()));
        }
        for (name, x) in [
            (n("embedding multiplier"), self.embed_scale),
            (n("residual multiplier"), self.residual_scale),
            (n("attention scale"), self.attn_scale),
            (n("logits scaling"), self.logits_divisor),
        ] {
            if !x.is_finite() || x == 0.0 {
                return Err(bad(format!("{name} {x}")));
            }
        }
        Ok(())
    }

    /// The RoPE frequencies of layers that use `rope`, or `None` for NoPE layers.
    pub fn rope_for(&self, rope: LayerRope) -> Option<RopeFreqs> {
        let freqs = match rope {
            LayerRope::Global => self.rope_freqs(),
            LayerRope::Local => inv_freqs(self.rope_local_theta, self.rotary_dim),
            LayerRope::None => return None,
        };
        // Latent attention's RoPE parts rotate interleaved pairs unless told otherwise.
        let interleaved = self.mla.is_some_and(|a| a.rope_interleave);
        Some(RopeFreqs { interleaved, ..freqs })
    }

    /// RoPE frequencies for this model, computed in f32 as transformers does.
    pub fn rope_freqs(&self) -> RopeFreqs {
        let RopeFreqs { mut inv_freq, .. } = inv_freqs(self.rope_theta, self.rotary_dim);
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                let low_freq_wavelen = original_max_position / low_freq_factor;
                let high_freq_wavelen = original_max_position / high_freq_factor;
                for f in &mut inv_freq {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_freq_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_freq_wavelen {
                        let smooth =
                            (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow, attention_factor, truncate } => {
                let dim = self.rotary_dim as f64;
                let base = self.rope_theta as f64;
                // The dimension at which a wavelength makes `rotations` turns over the
                // original context.
                let at = |rotations: f64| {
                    dim * (original_max_position as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (at(beta_fast as f64), at(beta_slow as f64));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, high) = (low.max(0.0) as f32, high.min(dim - 1.0) as f32);
                let high = if low == high { high + 0.001 } else { high };
                // In f32 and in transformers' order, so that the frequencies are its bits.
                for (i, f) in inv_freq.iter_mut().enumerate() {
                    let pos = self.rope_theta.powf((2 * i) as f32 / self.rotary_dim as f32);
                    let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolate = 1.0 - ramp;
                    *f = (1.0 / (factor * pos)) * (1.0 - extrapolate) + (1.0 / pos) * extrapolate;
                }
                return RopeFreqs { inv_freq, attention_factor, interleaved: false };
            }
        }
        RopeFreqs { inv_freq, attention_factor: 1.0, interleaved: false }
    }
}

/// YaRN's attention scale for a context `scale` times the original (DeepSeek's
/// `yarn_get_mscale`): `0.1 · mscale · ln(scale) + 1`, or 1 when not extended.
pub fn yarn_mscale(scale: f32, mscale: f32) -> f32 {
    if scale <= 1.0 { 1.0 } else { 0.1 * mscale * scale.ln() + 1.0 }
}

/// Plain RoPE frequencies over `dim` rotated dimensions, computed in f32 as
/// transformers does.
fn inv_freqs(theta: f32, dim: usize) -> RopeFreqs {
    let inv_freq = (0..dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32)).collect();
    RopeFreqs { inv_freq, attention_factor: 1.0, interleaved: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
        "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100"#;

    /// A damaged `config.json` says what is wrong with it, and where.
    #[test]
    fn a_damaged_config_says_why() {
        let err = |text: &str| ModelConfig::from_json(text).unwrap_err().to_string();
        let e = err("{\"model_type\": \"llama\",\n x");
        assert!(e.starts_with("config.json does not parse as JSON: key must be a string at line 2 column 2"), "{e}");
        assert_eq!(err("[1]"), "config.json holds an array, not a JSON object");
        assert_eq!(err("{}"), "config.json names no architecture: it has neither `model_type` nor `architectures`");
        assert!(err(r#"{"architectures": ["NopeForCausalLM"]}"#).contains("`NopeForCausalLM`"));
    }

    #[test]
    fn both_rope_styles_agree() {
        let legacy = format!(
            r#"{{"model_type":"llama",{BASE},"rope_theta":500000.0,"rope_scaling":{{"rope_type":"llama3",
            "factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}}}}"#
        );
        let v5 = format!(
            r#"{{"model_type":"llama",{BASE},"rope_parameters":{{"rope_type":"llama3","rope_theta":500000.0,
            "factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}}}}"#
        );
        let a = ModelConfig::from_json(&legacy).unwrap();
        let b = ModelConfig::from_json(&v5).unwrap();
        assert_eq!(a.rope_theta, 500000.0);
        assert_eq!(a.rope_scaling, b.rope_scaling);
        assert_eq!(a.rope_freqs().inv_freq, b.rope_freqs().inv_freq);
        let plain =
            ModelConfig::from_json(&format!(r#"{{"model_type":"llama",{BASE},"rope_theta":500000.0}}"#)).unwrap();
        // The highest frequency is untouched, the lowest is divided by the factor.
        let (s, p) = (a.rope_freqs().inv_freq, plain.rope_freqs().inv_freq);
        assert_eq!(s[0], p[0]);
        assert!((s[7] - p[7] / 8.0).abs() < 1e-12);
    }

    #[test]
    fn unsupported_settings_are_named() {
        let err = |json: String| ModelConfig::from_json(&json).unwrap_err().to_string();
        assert!(err(format!(r#"{{"model_type":"gpt_neox",{BASE}}}"#)).contains("gpt_neox"));
        assert!(
            err(format!(r#"{{"model_type":"llama",{BASE},"rope_scaling":{{"type":"yarn","factor":4}}}}"#))
                .contains("yarn")
        );
        assert!(err(r#"{"model_type":"llama","hidden_size":64}"#.into()).contains("num_attention_heads"));
        // Values no model can run with (crafted metadata), refused when read.
        for (extra, named) in [
            (r#""max_position_embeddings":0"#, "max_position_embeddings"),
            (r#""rope_theta":0.0"#, "rope_theta"),
            (r#""rope_theta":-1.0"#, "rope_theta"),
            (r#""rms_norm_eps":-1e-5"#, "epsilon"),
            (r#""rope_scaling":{"rope_type":"linear","factor":0.0}"#, "rope_scaling"),
        ] {
            let e = err(format!(r#"{{"model_type":"llama",{BASE},{extra}}}"#));
            assert!(e.contains(named), "{extra}: {e}");
        }
        let e = err(format!(r#"{{"model_type":"llama",{}}}"#, BASE.replace("\"hidden_size\":64", "\"hidden_size\":0")));
        assert!(e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn every_fixture_config_survives_its_own_json() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path().join("config.json")).unwrap();
            let c = ModelConfig::from_json(&text).unwrap();
            assert_eq!(ModelConfig::from_json(&c.to_json().to_string()).unwrap(), c, "{}", c.arch.name());
            seen += 1;
        }
        assert!(seen >= 13);
    }

    #[test]
    fn families_fill_in_their_layer_patterns() {
        let layers = |json: String| ModelConfig::from_json(&json).unwrap().layers;
        let six = BASE.replace(r#""num_hidden_layers":2"#, r#""num_hidden_layers":6"#);
        // Gemma 2 slides on even layers, Gemma 3 on five of six (with its local RoPE base).
        let g2 = layers(format!(r#"{{"model_type":"gemma2",{six},"sliding_window":8}}"#));
        assert_eq!(
            g2.iter().map(|l| l.sliding_window.is_some()).collect::<Vec<_>>(),
            [true, false, true, false, true, false]
        );
        let g3 = layers(format!(r#"{{"model_type":"gemma3_text",{six},"sliding_window":8}}"#));
        assert_eq!(g3.iter().filter(|l| l.rope == LayerRope::Local && l.sliding_window == Some(8)).count(), 5);
        assert_eq!((g3[5].sliding_window, g3[5].rope), (None, LayerRope::Global));
        // SmolLM3 drops RoPE on every fourth layer unless told otherwise.
        let s3 = layers(format!(r#"{{"model_type":"smollm3",{six}}}"#));
        assert_eq!(
            s3.iter().map(|l| l.rope == LayerRope::None).collect::<Vec<_>>(),
            [false, false, false, true, false, false]
        );
        let bad = format!(r#"{{"model_type":"gemma2",{six},"layer_types":["full_attention"]}}"#);
        assert!(ModelConfig::from_json(&bad).unwrap_err().to_string().contains("layer_types"));
    }

    /// DeepSeek-V2 is read as DeepSeek-V3 with its own routing defaults: softmax, no
    /// bias, no normalization; `greedy` ignores `n_group`, `group_limited_greedy` scores a
    /// group by its best expert. Both survive the JSON Strata writes.
    #[test]
    fn deepseek_v2_routes_as_its_config_says() {
        let v2 = |extra: &str| {
            let c = ModelConfig::from_json(&format!(
                r#"{{"model_type":"deepseek_v2",{BASE},"kv_lora_rank":16,"qk_nope_head_dim":8,
                "qk_rope_head_dim":8,"v_head_dim":8,"n_routed_experts":8,"num_experts_per_tok":2,
                "moe_intermediate_size":16,"n_shared_experts":1,"first_k_dense_replace":1,
                "routed_scaling_factor":16.0,"n_group":4,"topk_group":2{extra}}}"#
            ))
            .unwrap();
            assert_eq!(ModelConfig::from_json(&c.to_json().to_string()).unwrap(), c);
            (c.arch, c.moe.unwrap())
        };
        let (arch, m) = v2("");
        assert_eq!(arch, Arch::DeepseekV3);
        assert_eq!((m.scoring, m.choice_bias, m.norm_topk_prob), (Scoring::Softmax, false, false));
        assert_eq!((m.groups, m.groups_used, m.routed_scale), (1, 1, 16.0), "greedy by default: no groups");
        let (_, m) = v2(r#","topk_method":"group_limited_greedy","norm_topk_prob":true"#);
        assert_eq!((m.groups, m.groups_used, m.group_score, m.norm_topk_prob), (4, 2, GroupScore::Max, true));
        let e = ModelConfig::from_json(&format!(
            r#"{{"model_type":"deepseek_v2",{BASE},"kv_lora_rank":16,"qk_nope_head_dim":8,"qk_rope_head_dim":8,
            "v_head_dim":8,"n_routed_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,
            "topk_method":"group_limited_greedy","n_group":3,"topk_group":2}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("n_group"), "{e}");
    }
}
