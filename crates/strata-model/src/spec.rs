//! The declarative description of each architecture: which tensors a decoder layer
//! holds (their role, Hugging Face name and llama.cpp name), where the block normalizes,
//! its activation and the small differences between families. The loader, the shape
//! checks, GGUF import and the forward pass read this one table; adding a dense family
//! that fits these axes is an entry here plus its config keys in `config.rs`.
//!
//! Mixture-of-experts and hybrid layers extend the same idea: a router and stacked
//! experts are more [`Role`]s (with an expert axis), and a layer of another kind is a
//! different `LayerKind` in the per-layer list of `ModelConfig`, not a new model type.

use strata_backend::Activation;

/// A dense family. `SPECS` holds one entry per variant, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
    Olmo2,
    Granite,
    SmolLM3,
    Gemma,
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
    Qwen3Next,
    Qwen35,
    Qwen35Moe,
    DeepseekV3,
    Glm4Moe,
    GptOss,
}

/// What a tensor of a decoder layer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Norm before attention (hidden).
    AttnNorm,
    Q,
    K,
    V,
    /// Q, K and V stacked by rows (Phi-3).
    Qkv,
    QBias,
    KBias,
    VBias,
    O,
    QNorm,
    KNorm,
    /// Norm of the attention output before the residual add (sandwich or post-norm).
    AttnPostNorm,
    /// Norm before the MLP (hidden).
    FfnNorm,
    Gate,
    Up,
    /// Gate and up stacked by rows, gate first (Phi-3).
    GateUp,
    Down,
    /// Norm of the MLP output before the residual add.
    FfnPostNorm,
    /// The MoE router: one row of scores per expert.
    Router,
    /// A routed expert's gate, up and down projections (one tensor per expert, named
    /// with the expert's index in place of `*`).
    ExpertGate,
    ExpertUp,
    ExpertDown,
    /// The shared expert every token of a MoE layer goes through (Qwen2-MoE).
    SharedGate,
    SharedUp,
    SharedDown,
    /// One row scoring how much of the shared expert's output a token takes.
    SharedExpertGate,
    /// A linear-attention (gated delta rule) layer's input projection to queries, keys,
    /// values and the output gate `z`, grouped by key head (Qwen3-Next's `in_proj_qkvz`).
    LinQkvz,
    /// Its projection to each value head's `beta` and decay input `a`, grouped likewise.
    LinBa,
    /// Its causal depthwise convolution over queries, keys and values
    /// (`[channels, 1, taps]`).
    LinConv,
    /// Each value head's log decay rate (`A_log`).
    LinALog,
    /// `-exp(A_log)`, as llama.cpp stores it (`ssm_a`).
    LinNegA,
    /// Each value head's decay bias (`dt_bias`).
    LinDtBias,
    /// The gated RMS norm of each value head's output (a plain weight, never offset).
    LinNorm,
    /// Its output projection.
    LinOut,
    /// Qwen3.5's separate projections: queries, keys and values (all query heads, then
    /// all key heads, then all value heads), the output gate `z`, `beta` and `a`.
    LinQkv,
    LinZ,
    LinB,
    LinA,
    /// Multi-head latent attention (DeepSeek-V3): the query's down-projection to its
    /// rank, that rank's norm and the up-projection to every head's query (`Q` when the
    /// query has no bottleneck).
    MlaQA,
    MlaQANorm,
    MlaQB,
    /// The projection to the shared latent and the shared RoPE key, and the latent's norm.
    MlaKvA,
    MlaKvANorm,
    /// The latent's up-projection to each head's key (no RoPE part) and value, head by
    /// head (`(n_heads * (qk_nope + v), kv_lora)`).
    MlaKvB,
    /// The same as llama.cpp's converter splits it: each head's key part transposed
    /// (`(n_heads, kv_lora, qk_nope)`) and its value part (`(n_heads, v, kv_lora)`).
    MlaKB,
    MlaVB,
    /// A bias per routed expert added to its score to choose, not to weight
    /// (`e_score_correction_bias`).
    RouterBias,
    /// The output projection's bias (gpt-oss).
    OBias,
    /// A learned logit per query head that joins its softmax's denominator (gpt-oss).
    AttnSinks,
    /// A bias per routed expert added to the router's logit, to choose and to weight
    /// (gpt-oss).
    RouterLogitBias,
    /// A routed expert's projection biases (gpt-oss), one tensor per expert as the
    /// expert roles.
    ExpertGateBias,
    ExpertUpBias,
    ExpertDownBias,
}

/// Where a block's norms sit around attention and the MLP (`f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormPlacement {
    /// `x += f(norm(x))` (Llama).
    Pre,
    /// `x += norm(f(x))` (OLMo 2).
    Post,
    /// `x += norm_after(f(norm_before(x)))` (Gemma 2 and 3).
    Sandwich,
}

/// RMS norms of the queries and keys before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over each head (`head_dim` weights; Qwen3, Gemma 3).
    PerHead,
    /// Over all heads at once (`n_heads * head_dim` weights; OLMo 2).
    Whole,
}

/// One layer tensor: its role and its names after `model.layers.N.` (Hugging Face) and
/// after `blk.N.` (llama.cpp).
pub struct TensorName {
    pub role: Role,
    pub hf: &'static str,
    pub gguf: &'static str,
}

impl TensorName {
    /// The Hugging Face layer-local name of expert `e`'s tensor (an expert role's name
    /// has `*` where the index goes; other names are returned as they are).
    pub fn hf_for(&self, e: usize) -> String {
        self.hf.replacen('*', &e.to_string(), 1)
    }
}

const fn t(role: Role, hf: &'static str, gguf: &'static str) -> TensorName {
    TensorName { role, hf, gguf }
}

macro_rules! attention_and_mlp {
    ($($extra:expr),* $(,)?) => {
        [
            $($extra,)*
            t(Role::Q, "self_attn.q_proj.weight", "attn_q.weight"),
            t(Role::K, "self_attn.k_proj.weight", "attn_k.weight"),
            t(Role::V, "self_attn.v_proj.weight", "attn_v.weight"),
            t(Role::O, "self_attn.o_proj.weight", "attn_output.weight"),
            t(Role::QNorm, "self_attn.q_norm.weight", "attn_q_norm.weight"),
            t(Role::KNorm, "self_attn.k_norm.weight", "attn_k_norm.weight"),
            t(Role::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"),
            t(Role::Up, "mlp.up_proj.weight", "ffn_up.weight"),
            t(Role::Down, "mlp.down_proj.weight", "ffn_down.weight"),
        ]
    };
}

/// Llama and the families that name their layers as Llama does.
static LLAMA: [TensorName; 14] = attention_and_mlp!(
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::FfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight"),
    t(Role::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    t(Role::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    t(Role::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
);

/// Gemma 2 and 3: sandwich norms (`post_attention_layernorm` is the norm *after* attention).
static GEMMA: [TensorName; 13] = attention_and_mlp!(
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::AttnPostNorm, "post_attention_layernorm.weight", "post_attention_norm.weight"),
    t(Role::FfnNorm, "pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    t(Role::FfnPostNorm, "post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
);

/// OLMo 2: norms after attention and after the MLP only.
static OLMO2: [TensorName; 11] = attention_and_mlp!(
    t(Role::AttnPostNorm, "post_attention_layernorm.weight", "post_attention_norm.weight"),
    t(Role::FfnPostNorm, "post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
);

/// Phi-3: fused QKV and gate-up (llama.cpp keeps them fused too).
static PHI3: [TensorName; 6] = [
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::Qkv, "self_attn.qkv_proj.weight", "attn_qkv.weight"),
    t(Role::O, "self_attn.o_proj.weight", "attn_output.weight"),
    t(Role::FfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight"),
    t(Role::GateUp, "mlp.gate_up_proj.weight", "ffn_up.weight"),
    t(Role::Down, "mlp.down_proj.weight", "ffn_down.weight"),
];

/// Mixtral: Llama's attention and routed experts (`w1` gate, `w3` up, `w2` down); its
/// layers all route, so the dense MLP's names never apply. llama.cpp stores each layer's
/// experts stacked (`ffn_*_exps`, expert-major).
static MIXTRAL: [TensorName; 18] = attention_and_mlp!(
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::FfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight"),
    t(Role::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    t(Role::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    t(Role::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
    t(Role::Router, "block_sparse_moe.gate.weight", "ffn_gate_inp.weight"),
    t(Role::ExpertGate, "block_sparse_moe.experts.*.w1.weight", "ffn_gate_exps.weight"),
    t(Role::ExpertUp, "block_sparse_moe.experts.*.w3.weight", "ffn_up_exps.weight"),
    t(Role::ExpertDown, "block_sparse_moe.experts.*.w2.weight", "ffn_down_exps.weight"),
);

/// Llama's attention and MLP names with Qwen-MoE's router, routed experts under
/// `mlp.experts.*` and shared expert, and `$extra` entries.
macro_rules! qwen_moe {
    ($($extra:expr),* $(,)?) => {
        attention_and_mlp!(
            t(Role::Router, "mlp.gate.weight", "ffn_gate_inp.weight"),
            t(Role::ExpertGate, "mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight"),
            t(Role::ExpertUp, "mlp.experts.*.up_proj.weight", "ffn_up_exps.weight"),
            t(Role::ExpertDown, "mlp.experts.*.down_proj.weight", "ffn_down_exps.weight"),
            t(Role::SharedGate, "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
            t(Role::SharedUp, "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
            t(Role::SharedDown, "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
            t(Role::SharedExpertGate, "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
            $($extra,)*
        )
    };
}

/// Qwen2-MoE and Qwen3-MoE: Llama's names, routed experts under `mlp.experts.*`, a
/// shared expert (Qwen2-MoE), and dense MLPs in the layers that do not route.
static QWEN_MOE: [TensorName; 22] = qwen_moe!(
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::FfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight"),
    t(Role::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    t(Role::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    t(Role::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
);

/// The hybrid families' names: `$base`'s (attention and MLP, with or without Qwen-MoE's
/// experts), their norms, the gated-delta-rule layers' (`linear_attn.*`) as Qwen3.5's
/// checkpoints and every GGUF name them, and `$extra` entries. llama.cpp's converter
/// splits Qwen3-Next's `in_proj_qkvz` into `attn_qkv` and `attn_gate` and stores
/// `-exp(A_log)` as `ssm_a`: a GGUF model keeps those
/// ([`crate::config::LinearAttnConfig::gguf_layout`], [`crate::config::LinearAttnConfig::v_tiled`]), under names of
/// Strata's making (`A_log` has no llama.cpp name).
macro_rules! hybrid {
    ($base:ident; $($extra:expr),* $(,)?) => {
        $base!(
            t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
            t(Role::FfnNorm, "post_attention_layernorm.weight", "post_attention_norm.weight"),
            t(Role::LinQkv, "linear_attn.in_proj_qkv.weight", "attn_qkv.weight"),
            t(Role::LinZ, "linear_attn.in_proj_z.weight", "attn_gate.weight"),
            t(Role::LinConv, "linear_attn.conv1d.weight", "ssm_conv1d.weight"),
            t(Role::LinALog, "linear_attn.A_log", ""),
            t(Role::LinNegA, "linear_attn.ssm_a", "ssm_a"),
            t(Role::LinDtBias, "linear_attn.dt_bias", "ssm_dt.bias"),
            t(Role::LinNorm, "linear_attn.norm.weight", "ssm_norm.weight"),
            t(Role::LinOut, "linear_attn.out_proj.weight", "ssm_out.weight"),
            $($extra,)*
        )
    };
}

/// Qwen3-Next: its checkpoints group the linear-attention projections by key head
/// (`in_proj_qkvz`, `in_proj_ba`); every layer routes.
static QWEN3_NEXT: [TensorName; 32] = hybrid!(qwen_moe;
    t(Role::LinQkvz, "linear_attn.in_proj_qkvz.weight", "ssm_in.weight"),
    t(Role::LinBa, "linear_attn.in_proj_ba.weight", "ssm_ba.weight"),
    t(Role::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    t(Role::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    t(Role::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
);

/// Qwen3.5 (dense and MoE): the linear-attention projections apart (`in_proj_qkv`,
/// `in_proj_z`, `in_proj_b`, `in_proj_a`).
static QWEN35: [TensorName; 21] = hybrid!(attention_and_mlp;
    t(Role::LinB, "linear_attn.in_proj_b.weight", "ssm_beta.weight"),
    t(Role::LinA, "linear_attn.in_proj_a.weight", "ssm_alpha.weight"),
);

static QWEN35_MOE: [TensorName; 29] = hybrid!(qwen_moe;
    t(Role::LinB, "linear_attn.in_proj_b.weight", "ssm_beta.weight"),
    t(Role::LinA, "linear_attn.in_proj_a.weight", "ssm_alpha.weight"),
);

/// DeepSeek-V3 (and Kimi-K2, which shares its architecture): latent attention, dense
/// MLPs in the first `first_k_dense_replace` layers, then routed experts beside shared
/// ones, chosen with a bias.
static DEEPSEEK: [TensorName; 24] = [
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::Q, "self_attn.q_proj.weight", "attn_q.weight"),
    t(Role::MlaQA, "self_attn.q_a_proj.weight", "attn_q_a.weight"),
    t(Role::MlaQANorm, "self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"),
    t(Role::MlaQB, "self_attn.q_b_proj.weight", "attn_q_b.weight"),
    t(Role::MlaKvA, "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"),
    t(Role::MlaKvANorm, "self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"),
    t(Role::MlaKvB, "self_attn.kv_b_proj.weight", "attn_kv_b.weight"),
    t(Role::MlaKB, "self_attn.k_b_proj.weight", "attn_k_b.weight"),
    t(Role::MlaVB, "self_attn.v_b_proj.weight", "attn_v_b.weight"),
    t(Role::O, "self_attn.o_proj.weight", "attn_output.weight"),
    t(Role::FfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight"),
    t(Role::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"),
    t(Role::Up, "mlp.up_proj.weight", "ffn_up.weight"),
    t(Role::Down, "mlp.down_proj.weight", "ffn_down.weight"),
    t(Role::Router, "mlp.gate.weight", "ffn_gate_inp.weight"),
    t(Role::RouterBias, "mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
    t(Role::ExpertGate, "mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight"),
    t(Role::ExpertUp, "mlp.experts.*.up_proj.weight", "ffn_up_exps.weight"),
    t(Role::ExpertDown, "mlp.experts.*.down_proj.weight", "ffn_down_exps.weight"),
    t(Role::SharedGate, "mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"),
    t(Role::SharedUp, "mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"),
    t(Role::SharedDown, "mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"),
    // Never in a checkpoint of this family: here so that the shared expert's roles are
    // complete (a layer holds it only when the config gates the shared expert).
    t(Role::SharedExpertGate, "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
];

/// GLM-4.5 and 4.6: Llama's attention with biases and optional Q/K norms, DeepSeek's
/// routing (a choice bias, groups, shared experts) after `first_k_dense_replace` dense
/// layers; llama.cpp names its pre-MLP norm `post_attention_norm`.
static GLM4_MOE: [TensorName; 23] = attention_and_mlp!(
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::FfnNorm, "post_attention_layernorm.weight", "post_attention_norm.weight"),
    t(Role::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    t(Role::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    t(Role::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
    t(Role::Router, "mlp.gate.weight", "ffn_gate_inp.weight"),
    t(Role::RouterBias, "mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
    t(Role::ExpertGate, "mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight"),
    t(Role::ExpertUp, "mlp.experts.*.up_proj.weight", "ffn_up_exps.weight"),
    t(Role::ExpertDown, "mlp.experts.*.down_proj.weight", "ffn_down_exps.weight"),
    t(Role::SharedGate, "mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"),
    t(Role::SharedUp, "mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"),
    t(Role::SharedDown, "mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"),
    t(Role::SharedExpertGate, "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
);

/// gpt-oss: Llama's attention with biases on all four projections and a sink per head;
/// every layer routes, with a bias on the router and on each expert's projections
/// (its checkpoints stack the experts: see `gpt_oss`). llama.cpp names its pre-MLP norm
/// `post_attention_norm`.
static GPT_OSS: [TensorName; 19] = [
    t(Role::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    t(Role::Q, "self_attn.q_proj.weight", "attn_q.weight"),
    t(Role::K, "self_attn.k_proj.weight", "attn_k.weight"),
    t(Role::V, "self_attn.v_proj.weight", "attn_v.weight"),
    t(Role::O, "self_attn.o_proj.weight", "attn_output.weight"),
    t(Role::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    t(Role::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    t(Role::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
    t(Role::OBias, "self_attn.o_proj.bias", "attn_output.bias"),
    t(Role::AttnSinks, "self_attn.sinks", "attn_sinks.weight"),
    t(Role::FfnNorm, "post_attention_layernorm.weight", "post_attention_norm.weight"),
    t(Role::Router, "mlp.router.weight", "ffn_gate_inp.weight"),
    t(Role::RouterLogitBias, "mlp.router.bias", "ffn_gate_inp.bias"),
    t(Role::ExpertGate, "mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight"),
    t(Role::ExpertUp, "mlp.experts.*.up_proj.weight", "ffn_up_exps.weight"),
    t(Role::ExpertDown, "mlp.experts.*.down_proj.weight", "ffn_down_exps.weight"),
    t(Role::ExpertGateBias, "mlp.experts.*.gate_proj.bias", "ffn_gate_exps.bias"),
    t(Role::ExpertUpBias, "mlp.experts.*.up_proj.bias", "ffn_up_exps.bias"),
    t(Role::ExpertDownBias, "mlp.experts.*.down_proj.bias", "ffn_down_exps.bias"),
];

/// The tensors outside the layers: (Hugging Face name, llama.cpp name).
pub const EMBED: (&str, &str) = ("model.embed_tokens.weight", "token_embd.weight");
pub const OUTPUT_NORM: (&str, &str) = ("model.norm.weight", "output_norm.weight");
pub const OUTPUT: (&str, &str) = ("lm_head.weight", "output.weight");
/// The layer-local name of a sparse FFN's per-neuron scale (`sparse::neuron_scale`), F32
/// `[width]`, in the layer core beside its neuron-group bundles.
pub const NEURON_SCALE: &str = "mlp.neuron_scale";

/// Everything that distinguishes one dense family from another.
pub struct ArchSpec {
    pub arch: Arch,
    /// `model_type` in `config.json`.
    pub hf_type: &'static str,
    /// Other `model_type`s read as this family (their differences are in the config,
    /// which says them).
    pub hf_aliases: &'static [&'static str],
    /// `general.architecture` in GGUF.
    pub gguf_arch: &'static str,
    pub tensors: &'static [TensorName],
    pub norms: NormPlacement,
    pub activation: Activation,
    pub qk_norm: QkNorm,
    /// Hugging Face stores RMS norm weights as `w - 1` (Gemma): the loader adds 1.
    /// (`convert_hf_to_gguf.py` already did for GGUF.)
    pub hf_norm_offset: bool,
    /// GGUF stores Q/K rows permuted for GGML's interleaved RoPE (`llama`, `mistral`);
    /// the loader undoes it.
    pub gguf_qk_permuted: bool,
    /// Embeddings are multiplied by `sqrt(hidden)` (Gemma).
    pub embed_scale_sqrt_hidden: bool,
}

const fn spec(arch: Arch, hf_type: &'static str, gguf_arch: &'static str, tensors: &'static [TensorName]) -> ArchSpec {
    ArchSpec {
        arch,
        hf_type,
        hf_aliases: &[],
        gguf_arch,
        tensors,
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
        qk_norm: QkNorm::None,
        hf_norm_offset: false,
        gguf_qk_permuted: false,
        embed_scale_sqrt_hidden: false,
    }
}

const GEMMA2: ArchSpec = ArchSpec {
    norms: NormPlacement::Sandwich,
    activation: Activation::GeluTanh,
    hf_norm_offset: true,
    embed_scale_sqrt_hidden: true,
    ..spec(Arch::Gemma2, "gemma2", "gemma2", &GEMMA)
};

pub static SPECS: [ArchSpec; 20] = [
    ArchSpec { gguf_qk_permuted: true, ..spec(Arch::Llama, "llama", "llama", &LLAMA) },
    ArchSpec { gguf_qk_permuted: true, ..spec(Arch::Mistral, "mistral", "mistral", &LLAMA) },
    spec(Arch::Qwen2, "qwen2", "qwen2", &LLAMA),
    ArchSpec { qk_norm: QkNorm::PerHead, ..spec(Arch::Qwen3, "qwen3", "qwen3", &LLAMA) },
    GEMMA2,
    ArchSpec { qk_norm: QkNorm::PerHead, arch: Arch::Gemma3, hf_type: "gemma3_text", gguf_arch: "gemma3", ..GEMMA2 },
    spec(Arch::Phi3, "phi3", "phi3", &PHI3),
    ArchSpec { norms: NormPlacement::Post, qk_norm: QkNorm::Whole, ..spec(Arch::Olmo2, "olmo2", "olmo2", &OLMO2) },
    // llama.cpp's `granite` permutes Q/K as `llama` does.
    ArchSpec { gguf_qk_permuted: true, ..spec(Arch::Granite, "granite", "granite", &LLAMA) },
    ArchSpec { gguf_qk_permuted: true, ..spec(Arch::SmolLM3, "smollm3", "smollm3", &LLAMA) },
    // Gemma 1: Gemma 2 without the sandwich norms, soft-capping or local layers.
    ArchSpec {
        norms: NormPlacement::Pre,
        arch: Arch::Gemma,
        hf_type: "gemma",
        gguf_arch: "gemma",
        tensors: &LLAMA,
        ..GEMMA2
    },
    // llama.cpp converts Mixtral to its `llama` architecture with stacked experts; the
    // loader tells them apart by `llama.expert_count`.
    ArchSpec { gguf_qk_permuted: true, ..spec(Arch::Mixtral, "mixtral", "llama", &MIXTRAL) },
    spec(Arch::Qwen2Moe, "qwen2_moe", "qwen2moe", &QWEN_MOE),
    ArchSpec { qk_norm: QkNorm::PerHead, ..spec(Arch::Qwen3Moe, "qwen3_moe", "qwen3moe", &QWEN_MOE) },
    // Its RMS norms scale by `1 + w` (the gated norm of the linear layers excepted).
    ArchSpec {
        qk_norm: QkNorm::PerHead,
        hf_norm_offset: true,
        ..spec(Arch::Qwen3Next, "qwen3_next", "qwen3next", &QWEN3_NEXT)
    },
    // The text models of Qwen3.5 (a multimodal checkpoint's `text_config`, config.rs).
    ArchSpec {
        qk_norm: QkNorm::PerHead,
        hf_norm_offset: true,
        ..spec(Arch::Qwen35, "qwen3_5_text", "qwen35", &QWEN35)
    },
    ArchSpec {
        qk_norm: QkNorm::PerHead,
        hf_norm_offset: true,
        ..spec(Arch::Qwen35Moe, "qwen3_5_moe_text", "qwen35moe", &QWEN35_MOE)
    },
    // The keys' and queries' RoPE parts come interleaved (`rope_interleave`, GGML's
    // "normal" RoPE in llama.cpp's `deepseek2`). DeepSeek-V2 and V2-Lite have the same
    // layers and tensors; their routing (softmax, `greedy` or `group_limited_greedy`) is
    // in their config.
    ArchSpec { hf_aliases: &["deepseek_v2"], ..spec(Arch::DeepseekV3, "deepseek_v3", "deepseek2", &DEEPSEEK) },
    ArchSpec { qk_norm: QkNorm::PerHead, ..spec(Arch::Glm4Moe, "glm4_moe", "glm4moe", &GLM4_MOE) },
    // Its SwiGLU clamps at the published 7 (transformers' default; llama.cpp fixes it).
    ArchSpec {
        activation: Activation::SwigluOai { alpha: 1.702, limit: 7.0 },
        ..spec(Arch::GptOss, "gpt_oss", "gpt-oss", &GPT_OSS)
    },
];

impl Arch {
    pub fn spec(self) -> &'static ArchSpec {
        // `SPECS` lists the families in `Arch`'s order (checked by a test).
        &SPECS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.spec().hf_type
    }

    pub fn from_hf_type(model_type: &str) -> Option<Arch> {
        SPECS.iter().find(|s| s.hf_type == model_type || s.hf_aliases.contains(&model_type)).map(|s| s.arch)
    }

    pub fn from_gguf_arch(arch: &str) -> Option<Arch> {
        SPECS.iter().find(|s| s.gguf_arch == arch).map(|s| s.arch)
    }

    /// The supported names, for error messages.
    pub fn supported_hf_types() -> String {
        SPECS.iter().map(|s| s.hf_type).collect::<Vec<_>>().join(", ")
    }

    pub fn supported_gguf_archs() -> String {
        let mut archs: Vec<&str> = SPECS.iter().map(|s| s.gguf_arch).collect();
        archs.dedup();
        archs.join(", ")
    }
}

impl ArchSpec {
    pub fn tensor(&self, role: Role) -> Option<&'static TensorName> {
        self.tensors.iter().find(|t| t.role == role)
    }

    /// The Hugging Face layer-local name for a llama.cpp layer-local name.
    pub fn hf_from_gguf(&self, gguf: &str) -> Option<&'static str> {
        self.tensors.iter().find(|t| t.gguf == gguf).map(|t| t.hf)
    }

    /// The Hugging Face name of a tensor outside the layers, by its llama.cpp name.
    pub fn global_hf_from_gguf(gguf: &str) -> Option<&'static str> {
        [EMBED, OUTPUT_NORM, OUTPUT].iter().find(|(_, g)| *g == gguf).map(|(hf, _)| *hf)
    }
}

impl Role {
    /// One tensor per routed expert.
    pub fn is_expert(self) -> bool {
        matches!(
            self,
            Role::ExpertGate
                | Role::ExpertUp
                | Role::ExpertDown
                | Role::ExpertGateBias
                | Role::ExpertUpBias
                | Role::ExpertDownBias
        )
    }

    /// An RMS norm weight (which Gemma's checkpoints store as `w - 1`).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            Role::AttnNorm
                | Role::AttnPostNorm
                | Role::FfnNorm
                | Role::FfnPostNorm
                | Role::QNorm
                | Role::KNorm
                | Role::MlaQANorm
                | Role::MlaKvANorm
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_within_each_family() {
        for (i, s) in SPECS.iter().enumerate() {
            assert_eq!(s.arch as usize, i, "SPECS is in Arch's order");
            for (i, a) in s.tensors.iter().enumerate() {
                for b in &s.tensors[i + 1..] {
                    assert!(a.role != b.role && a.hf != b.hf && a.gguf != b.gguf, "{}: {}", s.hf_type, a.hf);
                }
            }
            assert_eq!(Arch::from_hf_type(s.hf_type), Some(s.arch));
            for alias in s.hf_aliases {
                assert_eq!(Arch::from_hf_type(alias), Some(s.arch), "{alias}");
            }
            // llama.cpp's `llama` is also Mixtral's (told apart by its expert count).
            // (Qwen3-Next's names are unique but only stand for reshaped tensors.)
            let gguf = if s.arch == Arch::Mixtral { Arch::Llama } else { s.arch };
            assert_eq!(Arch::from_gguf_arch(s.gguf_arch), Some(gguf));
        }
    }

    #[test]
    fn the_same_hugging_face_name_means_different_roles_in_different_families() {
        let role = |a: Arch, hf: &str| a.spec().tensors.iter().find(|t| t.hf == hf).map(|t| t.role);
        assert_eq!(role(Arch::Llama, "post_attention_layernorm.weight"), Some(Role::FfnNorm));
        assert_eq!(role(Arch::Gemma2, "post_attention_layernorm.weight"), Some(Role::AttnPostNorm));
        assert_eq!(Arch::Phi3.spec().hf_from_gguf("ffn_up.weight"), Some("mlp.gate_up_proj.weight"));
        assert_eq!(ArchSpec::global_hf_from_gguf("output.weight"), Some("lm_head.weight"));
    }
}
