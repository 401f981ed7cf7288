//! Model hyperparameters from a Hugging Face `config.json`, resolved once into a plain
//! runtime struct. Unsupported architectures and settings are errors that name them.

use serde_json::{Value, json};

use strata_backend::delta::DeltaShape;
use strata_backend::{Activation, RopeFreqs};

pub use super::spec::Arch;
use super::spec::ArchSpec;

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
/// router scores highest (softmax over all `n_experts`), weighted by those probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

fn usize_field(v: &Value, key: &'static str) -> Result<usize, ConfigError> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize).ok_or(ConfigError::Missing(key))
}

fn opt_usize(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize)
}

fn f32_of(v: &Value, key: &str) -> Option<f32> {
    v.get(key).and_then(Value::as_f64).map(|x| x as f32)
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

    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut v: Value = serde_json::from_str(text)?;
        let kind = match &v {
            Value::Object(_) => None,
            Value::Null => Some("null"),
            Value::Bool(_) => Some("a boolean"),
            Value::Number(_) => Some("a number"),
            Value::String(_) => Some("a string"),
            Value::Array(_) => Some("an array"),
        };
        if let Some(kind) = kind {
            return Err(ConfigError::NotAnObject(kind));
        }
        // A multimodal Gemma 3 or Qwen3.5 checkpoint: the language model's config is nested.
        let text_type = match v.get("model_type").and_then(Value::as_str) {
            Some("gemma3") => Some("gemma3_text"),
            Some("qwen3_5") => Some("qwen3_5_text"),
            Some("qwen3_5_moe") => Some("qwen3_5_moe_text"),
            _ => None,
        };
        if let Some(text_type) = text_type
            && let Some(text_config) = v.get("text_config").filter(|t| t.is_object())
        {
            let mut t = text_config.clone();
            t["model_type"] = json!(text_type);
            v = t;
        }
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = match Arch::from_hf_type(model_type) {
            Some(a) => a,
            None if model_type.is_empty() => {
                let first = v.pointer("/architectures/0").and_then(Value::as_str);
                return Err(first.map_or(ConfigError::NoArchitecture, |a| ConfigError::Architecture(a.to_string())));
            }
            None => return Err(ConfigError::Architecture(model_type.to_string())),
        };
        let spec = arch.spec();
        let hidden_size = usize_field(&v, "hidden_size")?;
        let n_heads = usize_field(&v, "num_attention_heads")?;
        let n_kv_heads = opt_usize(&v, "num_key_value_heads").unwrap_or(n_heads);
        let head_dim = opt_usize(&v, "head_dim").unwrap_or(hidden_size / n_heads.max(1));
        let n_layers = usize_field(&v, "num_hidden_layers")?;
        let flag = |key: &str| v.get(key).and_then(Value::as_bool).unwrap_or(false);
        if flag("mlp_bias") {
            return Err(ConfigError::Unsupported("`mlp_bias: true`".into()));
        }
        if let Some(act) = ["hidden_activation", "hidden_act"].iter().find_map(|k| v.get(*k).and_then(Value::as_str)) {
            let ok = match spec.activation {
                Activation::Silu => act == "silu",
                Activation::GeluTanh => matches!(act, "gelu_pytorch_tanh" | "gelu_tanh" | "gelu"),
                Activation::Sigmoid => false,
            };
            if !ok {
                return Err(ConfigError::Unsupported(format!("activation `{act}` for {}", spec.hf_type)));
            }
        }
        let (rope_theta, rope_scaling, local_theta) = parse_rope(&v)?;
        let partial = f32_of(&v, "partial_rotary_factor")
            .or_else(|| v.get("rope_parameters").and_then(|p| f32_of(p, "partial_rotary_factor")))
            .unwrap_or(1.0);
        let rotary_dim = (head_dim as f64 * partial as f64).round() as usize;
        let moe = moe_config(&v, arch)?;
        let hybrid = matches!(arch, Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe);
        let linear_attn = match hybrid {
            true => Some(LinearAttnConfig {
                n_k_heads: usize_field(&v, "linear_num_key_heads")?,
                n_v_heads: usize_field(&v, "linear_num_value_heads")?,
                k_head_dim: usize_field(&v, "linear_key_head_dim")?,
                v_head_dim: usize_field(&v, "linear_value_head_dim")?,
                conv_kernel: opt_usize(&v, "linear_conv_kernel_dim").unwrap_or(4),
                gguf_layout: flag("strata_gguf_linear_layout"),
                v_tiled: flag("strata_linear_v_tiled"),
            }),
            false => None,
        };
        let mut layers = layer_configs(&v, arch, n_layers)?;
        if moe.is_some() {
            let sparse = sparse_layers(&v, arch, n_layers)?;
            layers.iter_mut().zip(sparse).for_each(|(l, s)| l.ffn = if s { Ffn::Moe } else { Ffn::Dense });
        }
        let query_pre_attn_scalar = f32_of(&v, "query_pre_attn_scalar").unwrap_or(head_dim as f32);
        let granite = arch == Arch::Granite;
        let gemma = matches!(arch, Arch::Gemma | Arch::Gemma2 | Arch::Gemma3);
        let softcap = |key: &str| f32_of(&v, key).filter(|&c| c > 0.0);
        let config = ModelConfig {
            arch,
            hidden_size,
            // Qwen3.5-MoE's text config has none: every layer routes.
            intermediate_size: match (arch, opt_usize(&v, "intermediate_size")) {
                (Arch::Qwen35Moe, None) => 0,
                _ => usize_field(&v, "intermediate_size")?,
            },
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size: usize_field(&v, "vocab_size")?,
            rms_norm_eps: f32_of(&v, "rms_norm_eps").unwrap_or(1e-6),
            max_position_embeddings: opt_usize(&v, "max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(gemma),
            attention_bias: match arch {
                Arch::Qwen2 => true,
                Arch::Qwen2Moe => v.get("qkv_bias").and_then(Value::as_bool).unwrap_or(true),
                _ => flag("attention_bias"),
            },
            layers,
            rope_theta,
            rope_scaling,
            rope_local_theta: local_theta.or_else(|| f32_of(&v, "rope_local_base_freq")).unwrap_or(10000.0),
            rotary_dim,
            embed_scale: match (gemma, granite) {
                (true, _) => (hidden_size as f64).sqrt() as f32,
                (_, true) => f32_of(&v, "embedding_multiplier").unwrap_or(1.0),
                _ => 1.0,
            },
            residual_scale: if granite { f32_of(&v, "residual_multiplier").unwrap_or(1.0) } else { 1.0 },
            attn_scale: match (gemma, granite) {
                (true, _) => query_pre_attn_scalar.powf(-0.5),
                (_, true) => f32_of(&v, "attention_multiplier").unwrap_or(1.0),
                _ => (head_dim as f32).powf(-0.5),
            },
            logits_divisor: if granite { f32_of(&v, "logits_scaling").unwrap_or(1.0) } else { 1.0 },
            attn_softcap: if gemma { softcap("attn_logit_softcapping") } else { None },
            final_softcap: if gemma { softcap("final_logit_softcapping") } else { None },
            moe,
            linear_attn,
            attn_output_gate: hybrid,
            neuron_group: None,
        };
        config.validate()?;
        Ok(config)
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

    /// The `config.json` (Hugging Face form) that [`from_json`](Self::from_json) reads
    /// back into this config: what converting a GGUF model to another format stores.
    pub fn to_json(&self) -> Value {
        let mut c = json!({
            "model_type": self.arch.name(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "rope_theta": self.rope_theta,
        });
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => c["rope_scaling"] = json!({"rope_type": "linear", "factor": factor}),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                c["rope_scaling"] = json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
                    "high_freq_factor": high_freq_factor, "original_max_position_embeddings": original_max_position})
            }
        }
        if let Some(la) = &self.linear_attn {
            c["linear_num_key_heads"] = json!(la.n_k_heads);
            c["linear_num_value_heads"] = json!(la.n_v_heads);
            c["linear_key_head_dim"] = json!(la.k_head_dim);
            c["linear_value_head_dim"] = json!(la.v_head_dim);
            c["linear_conv_kernel_dim"] = json!(la.conv_kernel);
            if la.gguf_layout {
                c["strata_gguf_linear_layout"] = json!(true);
            }
            if la.v_tiled {
                c["strata_linear_v_tiled"] = json!(true);
            }
            let kinds: Vec<&str> = self
                .layers
                .iter()
                .map(|l| if l.mixer == Mixer::Linear { "linear_attention" } else { "full_attention" })
                .collect();
            c["layer_types"] = json!(kinds);
        }
        if let Some(w) = self.layers.iter().find_map(|l| l.sliding_window) {
            c["sliding_window"] = json!(w);
            let kinds: Vec<&str> = self
                .layers
                .iter()
                .map(|l| if l.sliding_window.is_some() { "sliding_attention" } else { "full_attention" })
                .collect();
            c["layer_types"] = json!(kinds);
        }
        if self.layers.iter().any(|l| l.rope == LayerRope::Local) {
            c["rope_local_base_freq"] = json!(self.rope_local_theta);
        }
        if self.arch == Arch::SmolLM3 {
            let uses: Vec<u8> = self.layers.iter().map(|l| u8::from(l.rope != LayerRope::None)).collect();
            c["no_rope_layers"] = json!(uses);
        }
        if self.rotary_dim != self.head_dim {
            c["partial_rotary_factor"] = json!(self.rotary_dim as f64 / self.head_dim as f64);
        }
        if let Some(m) = &self.moe {
            let dense: Vec<usize> = (0..self.n_layers).filter(|&i| self.layers[i].ffn == Ffn::Dense).collect();
            match self.arch {
                Arch::Mixtral => {
                    c["num_local_experts"] = json!(m.n_experts);
                    c["intermediate_size"] = json!(m.expert_size);
                }
                _ => {
                    c["num_experts"] = json!(m.n_experts);
                    c["moe_intermediate_size"] = json!(m.expert_size);
                    c["norm_topk_prob"] = json!(m.norm_topk_prob);
                    c["decoder_sparse_step"] = json!(1);
                    c["mlp_only_layers"] = json!(dense);
                }
            }
            c["num_experts_per_tok"] = json!(m.top_k);
            if self.arch == Arch::Qwen2Moe {
                c["shared_expert_intermediate_size"] = json!(m.shared_expert_size.unwrap_or(0));
                c["qkv_bias"] = json!(self.attention_bias);
            }
            if matches!(self.arch, Arch::Qwen3Next | Arch::Qwen35Moe) {
                c["shared_expert_intermediate_size"] = json!(m.shared_expert_size.unwrap_or(0));
            }
        }
        match self.arch {
            Arch::Gemma | Arch::Gemma2 | Arch::Gemma3 => {
                // `attn_scale` is `query_pre_attn_scalar^-0.5` of an integer scalar.
                c["query_pre_attn_scalar"] = json!((1.0 / (self.attn_scale as f64).powi(2)).round());
                c["attn_logit_softcapping"] = json!(self.attn_softcap);
                c["final_logit_softcapping"] = json!(self.final_softcap);
            }
            Arch::Granite => {
                c["embedding_multiplier"] = json!(self.embed_scale);
                c["residual_multiplier"] = json!(self.residual_scale);
                c["attention_multiplier"] = json!(self.attn_scale);
                c["logits_scaling"] = json!(self.logits_divisor);
            }
            _ => {}
        }
        c
    }

    /// The RoPE frequencies of layers that use `rope`, or `None` for NoPE layers.
    pub fn rope_for(&self, rope: LayerRope) -> Option<RopeFreqs> {
        match rope {
            LayerRope::Global => Some(self.rope_freqs()),
            LayerRope::Local => Some(inv_freqs(self.rope_local_theta, self.rotary_dim)),
            LayerRope::None => None,
        }
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
        }
        RopeFreqs { inv_freq, attention_factor: 1.0, interleaved: false }
    }
}

/// RoPE settings from either `rope_theta` + `rope_scaling` (Hub checkpoints) or
/// `rope_parameters` (transformers 5, which nests them per layer type when the types
/// differ: `{"full_attention": {...}, "sliding_attention": {...}}`). Returns the global
/// base and scaling, and the sliding layers' base when it is given separately.
fn parse_rope(v: &Value) -> Result<(f32, RopeScaling, Option<f32>), ConfigError> {
    let mut params = v.get("rope_parameters").filter(|p| p.is_object());
    let mut local = None;
    if let Some(p) = params
        && let Some(full) = p.get("full_attention").filter(|f| f.is_object())
    {
        if let Some(sliding) = p.get("sliding_attention") {
            let kind = sliding.get("rope_type").and_then(Value::as_str).unwrap_or("default");
            if kind != "default" {
                return Err(ConfigError::Unsupported(format!("rope type `{kind}` on sliding-window layers")));
            }
            local = f32_of(sliding, "rope_theta");
        }
        params = Some(full);
    }
    let scaling = params.or_else(|| v.get("rope_scaling").filter(|s| s.is_object()));
    let theta = params.and_then(|p| f32_of(p, "rope_theta")).or_else(|| f32_of(v, "rope_theta")).unwrap_or(10000.0);
    let Some(s) = scaling else {
        return Ok((theta, RopeScaling::None, local));
    };
    let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
    let factor = || f32_of(s, "factor").ok_or(ConfigError::Missing("rope_scaling.factor"));
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: f32_of(s, "low_freq_factor")
                .ok_or(ConfigError::Missing("rope_scaling.low_freq_factor"))?,
            high_freq_factor: f32_of(s, "high_freq_factor")
                .ok_or(ConfigError::Missing("rope_scaling.high_freq_factor"))?,
            original_max_position: f32_of(s, "original_max_position_embeddings")
                .ok_or(ConfigError::Missing("rope_scaling.original_max_position_embeddings"))?,
        },
        other => return Err(ConfigError::Unsupported(format!("rope scaling type `{other}`"))),
    };
    Ok((theta, scaling, local))
}

/// Each layer's window and RoPE: `layer_types` when the config lists them, else the
/// family's pattern (Mistral and Phi-3 slide everywhere, Gemma 2 on even layers, Gemma 3
/// on five of every six; SmolLM3 drops RoPE on every fourth layer unless
/// `no_rope_layers` says otherwise).
fn layer_configs(v: &Value, arch: Arch, n_layers: usize) -> Result<Vec<LayerConfig>, ConfigError> {
    let window = opt_usize(v, "sliding_window").filter(|&w| w > 0);
    // (sliding, linear) per listed layer.
    let hybrid = matches!(arch, Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe);
    let listed: Option<Vec<(bool, bool)>> = match v.get("layer_types").and_then(Value::as_array) {
        None => None,
        Some(types) => {
            if types.len() != n_layers {
                return Err(ConfigError::Unsupported(format!("{} layer_types for {n_layers} layers", types.len())));
            }
            let kinds = types.iter().map(|t| match t.as_str() {
                Some("full_attention") => Ok((false, false)),
                Some("sliding_attention") if !hybrid => Ok((true, false)),
                Some("linear_attention") if hybrid => Ok((false, true)),
                _ => Err(ConfigError::Unsupported(format!("layer type {t} for {}", arch.name()))),
            });
            Some(kinds.collect::<Result<_, _>>()?)
        }
    };
    // Qwen3-Next without `layer_types`: full attention every `full_attention_interval`.
    let interval = opt_usize(v, "full_attention_interval").unwrap_or(4).max(1);
    let linear = |i: usize| match &listed {
        Some(kinds) => kinds[i].1,
        None => hybrid && !(i + 1).is_multiple_of(interval),
    };
    let use_sliding = v.get("use_sliding_window").and_then(Value::as_bool).unwrap_or(false);
    if matches!(arch, Arch::Qwen2 | Arch::Qwen3) && use_sliding {
        return Err(ConfigError::Unsupported("`use_sliding_window: true` for qwen models".into()));
    }
    let pattern = opt_usize(v, "sliding_window_pattern").unwrap_or(6).max(1);
    let sliding = |i: usize| match &listed {
        Some(kinds) => kinds[i].0,
        None => match arch {
            Arch::Mistral | Arch::Phi3 => true,
            Arch::Gemma2 => i.is_multiple_of(2),
            Arch::Gemma3 => !(i + 1).is_multiple_of(pattern),
            _ => false,
        },
    };
    let rope_flags: Option<Vec<bool>> = match (arch, v.get("no_rope_layers").and_then(Value::as_array)) {
        (Arch::SmolLM3, Some(flags)) => {
            if flags.len() != n_layers {
                return Err(ConfigError::Unsupported(format!("{} no_rope_layers for {n_layers} layers", flags.len())));
            }
            Some(flags.iter().map(|f| f.as_u64() != Some(0)).collect())
        }
        (Arch::SmolLM3, None) => {
            let every = opt_usize(v, "no_rope_layer_interval").unwrap_or(4).max(1);
            Some((0..n_layers).map(|i| (i + 1) % every != 0).collect())
        }
        _ => None,
    };
    let mut layers = Vec::with_capacity(n_layers.min(1 << 16));
    for i in 0..n_layers {
        let slides = sliding(i);
        if slides && window.is_none() && listed.is_some() {
            return Err(ConfigError::Missing("sliding_window"));
        }
        let sliding_window = if slides { window } else { None };
        let rope = match &rope_flags {
            Some(flags) if !flags[i] => LayerRope::None,
            _ if arch == Arch::Gemma3 && sliding_window.is_some() => LayerRope::Local,
            _ => LayerRope::Global,
        };
        let mixer = if linear(i) { Mixer::Linear } else { Mixer::Attention };
        layers.push(LayerConfig { sliding_window, rope, ffn: Ffn::Dense, mixer });
    }
    Ok(layers)
}

/// The routed experts of a MoE family's `config.json` (`None` for dense families, and
/// for a Qwen MoE config with `num_experts: 0`).
fn moe_config(v: &Value, arch: Arch) -> Result<Option<MoeConfig>, ConfigError> {
    let (experts_key, n_experts, expert_size, shared_expert_size, norm_topk_prob) = match arch {
        Arch::Mixtral => {
            let n = usize_field(v, "num_local_experts")?;
            ("num_local_experts", n, usize_field(v, "intermediate_size")?, None, true)
        }
        Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35Moe => {
            // transformers 5 saves Qwen3-MoE's count under Mixtral's name.
            let (key, n) = ["num_experts", "num_local_experts"]
                .into_iter()
                .find_map(|k| opt_usize(v, k).map(|n| (k, n)))
                .ok_or(ConfigError::Missing("num_experts"))?;
            if n == 0 {
                return Ok(None);
            }
            let shared = match arch {
                Arch::Qwen2Moe | Arch::Qwen3Next | Arch::Qwen35Moe => {
                    Some(usize_field(v, "shared_expert_intermediate_size")?).filter(|&s| s > 0)
                }
                _ => None,
            };
            // Qwen3.5's router always renormalizes its top-k.
            let norm = arch == Arch::Qwen35Moe || v.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(false);
            (key, n, usize_field(v, "moe_intermediate_size")?, shared, norm)
        }
        _ => return Ok(None),
    };
    let top_k = usize_field(v, "num_experts_per_tok")?;
    if n_experts > MAX_EXPERTS {
        return Err(ConfigError::Unsupported(format!("`{experts_key}` {n_experts} (at most {MAX_EXPERTS})")));
    }
    if top_k == 0 || top_k > n_experts {
        return Err(ConfigError::Unsupported(format!(
            "`num_experts_per_tok` {top_k} with `{experts_key}` {n_experts} (must be between 1 and the expert count)"
        )));
    }
    Ok(Some(MoeConfig { n_experts, top_k, expert_size, shared_expert_size, norm_topk_prob }))
}

/// Which layers of a MoE model route to experts: every layer of Mixtral; for the Qwen
/// families, as transformers decides, layer `i` unless it is in `mlp_only_layers` or
/// `i + 1` is not a multiple of `decoder_sparse_step`.
fn sparse_layers(v: &Value, arch: Arch, n_layers: usize) -> Result<Vec<bool>, ConfigError> {
    if arch == Arch::Mixtral {
        return Ok(vec![true; n_layers]);
    }
    let step = opt_usize(v, "decoder_sparse_step").unwrap_or(1);
    if step == 0 {
        return Err(ConfigError::Unsupported("`decoder_sparse_step: 0`".into()));
    }
    let dense: Vec<usize> = match v.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_u64().map(|i| i as usize).ok_or(ConfigError::Missing("mlp_only_layers")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ConfigError::Missing("mlp_only_layers")),
    };
    Ok((0..n_layers).map(|i| !dense.contains(&i) && (i + 1).is_multiple_of(step)).collect())
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
}
