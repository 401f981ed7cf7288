//! `config.json` as Hugging Face writes it, read into a [`ModelConfig`] and written back.

use super::*;

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
        let mla = match arch {
            Arch::DeepseekV3 => Some(mla_config(&v)?),
            _ => None,
        };
        // Latent attention caches one latent and RoPE key per token: one KV head as
        // wide as both.
        let n_kv_heads = match mla {
            Some(_) => 1,
            None => opt_usize(&v, "num_key_value_heads").unwrap_or(n_heads),
        };
        let head_dim = match mla {
            Some(a) => a.cache_width(),
            None => opt_usize(&v, "head_dim").unwrap_or(hidden_size / n_heads.max(1)),
        };
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
                // gpt-oss says `silu` for its clamped SwiGLU.
                Activation::SwigluOai { .. } => act == "silu",
            };
            if !ok {
                return Err(ConfigError::Unsupported(format!("activation `{act}` for {}", spec.hf_type)));
            }
        }
        if arch == Arch::GptOss {
            // The clamped SwiGLU's constants are the spec's (llama.cpp fixes them too).
            for (key, fixed) in [("swiglu_limit", 7.0), ("swiglu_alpha", 1.702)] {
                if let Some(x) = f32_of(&v, key).filter(|&x| x != fixed) {
                    return Err(ConfigError::Unsupported(format!("`{key}` {x} (this build runs gpt-oss's {fixed})")));
                }
            }
        }
        let (rope_theta, rope_scaling, local_theta) = parse_rope(&v)?;
        let partial = f32_of(&v, "partial_rotary_factor")
            .or_else(|| v.get("rope_parameters").and_then(|p| f32_of(p, "partial_rotary_factor")))
            .unwrap_or(1.0);
        let rotary_dim = match mla {
            Some(a) => a.qk_rope_head_dim,
            None => (head_dim as f64 * partial as f64).round() as usize,
        };
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
        if mla.is_some() {
            layers.iter_mut().for_each(|l| l.mixer = Mixer::Latent);
            if flag("attention_bias") {
                return Err(ConfigError::Unsupported("`attention_bias: true` for latent attention".into()));
            }
        }
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
            qk_norm: arch != Arch::Glm4Moe || flag("use_qk_norm"),
            attention_bias: match arch {
                Arch::Qwen2 => true,
                Arch::Qwen2Moe => v.get("qkv_bias").and_then(Value::as_bool).unwrap_or(true),
                Arch::GptOss => v.get("attention_bias").and_then(Value::as_bool).unwrap_or(true),
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
            attn_scale: match (gemma, granite, mla) {
                (true, ..) => query_pre_attn_scalar.powf(-0.5),
                (_, true, _) => f32_of(&v, "attention_multiplier").unwrap_or(1.0),
                (.., Some(a)) => f32_of(&v, "strata_attention_scale").unwrap_or_else(|| mla_scale(&v, a)),
                _ => (head_dim as f32).powf(-0.5),
            },
            logits_divisor: if granite { f32_of(&v, "logits_scaling").unwrap_or(1.0) } else { 1.0 },
            attn_softcap: if gemma { softcap("attn_logit_softcapping") } else { None },
            final_softcap: if gemma { softcap("final_logit_softcapping") } else { None },
            moe,
            linear_attn,
            attn_output_gate: hybrid,
            neuron_group: None,
            mla,
            nextn_layers: opt_usize(&v, "num_nextn_predict_layers").unwrap_or(0).min(64),
        };
        config.validate()?;
        Ok(config)
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
            RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow, attention_factor, truncate } => {
                c["rope_scaling"] = json!({"rope_type": "yarn", "factor": factor,
                    "original_max_position_embeddings": original_max_position, "beta_fast": beta_fast,
                    "beta_slow": beta_slow, "attention_factor": attention_factor, "truncate": truncate})
            }
        }
        if let Some(a) = &self.mla {
            c["q_lora_rank"] = json!(a.q_lora_rank);
            c["kv_lora_rank"] = json!(a.kv_lora_rank);
            c["qk_nope_head_dim"] = json!(a.qk_nope_head_dim);
            c["qk_rope_head_dim"] = json!(a.qk_rope_head_dim);
            c["v_head_dim"] = json!(a.v_head_dim);
            c["rope_interleave"] = json!(a.rope_interleave);
            if a.split_kv_b {
                c["strata_mla_split_kv_b"] = json!(true);
            }
            // The scale as it is (YaRN's `mscale_all_dim` already in it).
            c["strata_attention_scale"] = json!(self.attn_scale);
            c.as_object_mut().map(|o| o.remove("head_dim"));
        }
        if self.arch == Arch::Glm4Moe {
            c["use_qk_norm"] = json!(self.qk_norm);
        }
        if self.nextn_layers > 0 {
            c["num_nextn_predict_layers"] = json!(self.nextn_layers);
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
                Arch::Mixtral | Arch::GptOss => {
                    c["num_local_experts"] = json!(m.n_experts);
                    c["intermediate_size"] = json!(m.expert_size);
                }
                Arch::DeepseekV3 | Arch::Glm4Moe => {
                    c["strata_group_mask_zero"] = json!(m.group_mask_zero);
                    c["n_routed_experts"] = json!(m.n_experts);
                    c["moe_intermediate_size"] = json!(m.expert_size);
                    c["norm_topk_prob"] = json!(m.norm_topk_prob);
                    c["n_shared_experts"] = json!(m.shared_expert_size.unwrap_or(0) / m.expert_size.max(1));
                    c["scoring_func"] = json!(if m.scoring == Scoring::Sigmoid { "sigmoid" } else { "softmax" });
                    c["topk_method"] = json!(match (m.choice_bias, m.group_score) {
                        (true, _) => "noaux_tc",
                        (false, GroupScore::Max) => "group_limited_greedy",
                        (false, GroupScore::TopTwoSum) => "greedy",
                    });
                    c["n_group"] = json!(m.groups);
                    c["topk_group"] = json!(m.groups_used);
                    c["routed_scaling_factor"] = json!(m.routed_scale);
                    c["first_k_dense_replace"] = json!(dense.len());
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
}

/// Latent attention's softmax scale: `qk_head_dim^-0.5`, times `mscale²` of YaRN's
/// `mscale_all_dim` when the context is extended (DeepSeek-V3).
fn mla_scale(v: &Value, a: MlaConfig) -> f32 {
    let base = (a.qk_head_dim() as f32).powf(-0.5);
    let Some(s) = rope_scaling_params(v) else { return base };
    let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
    match (kind, f32_of(s, "factor"), f32_of(s, "mscale_all_dim").filter(|&m| m != 0.0)) {
        ("default", ..) | (_, None, _) | (.., None) => base,
        (_, Some(factor), Some(all)) => {
            let m = yarn_mscale(factor, all);
            base * m * m
        }
    }
}

/// The object holding a config's RoPE scaling: `rope_parameters` (its full-attention
/// entry when nested per layer type) or `rope_scaling`.
fn rope_scaling_params(v: &Value) -> Option<&Value> {
    let params = v.get("rope_parameters").filter(|p| p.is_object());
    let params = match params.and_then(|p| p.get("full_attention")).filter(|f| f.is_object()) {
        Some(full) => Some(full),
        None => params,
    };
    params.or_else(|| v.get("rope_scaling").filter(|s| s.is_object()))
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
        "yarn" => {
            let factor = factor()?;
            let original = f32_of(s, "original_max_position_embeddings")
                .ok_or(ConfigError::Missing("rope_scaling.original_max_position_embeddings (yarn)"))?;
            let attention_factor =
                match (f32_of(s, "attention_factor"), f32_of(s, "mscale"), f32_of(s, "mscale_all_dim")) {
                    (Some(a), ..) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, all)
                    }
                    _ => yarn_mscale(factor, 1.0),
                };
            RopeScaling::Yarn {
                factor,
                original_max_position: original,
                beta_fast: f32_of(s, "beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: f32_of(s, "beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
                attention_factor,
                truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            }
        }
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
        // gpt-oss: the softmax over the top-k logits, which is the top-k of the softmax
        // renormalized.
        Arch::Mixtral | Arch::GptOss => {
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
        Arch::DeepseekV3 | Arch::Glm4Moe => return deepseek_moe(v, arch),
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
    Ok(Some(MoeConfig { shared_expert_size, norm_topk_prob, ..MoeConfig::softmax(n_experts, top_k, expert_size) }))
}

/// DeepSeek-V3's routing: sigmoid scores, `e_score_correction_bias` to choose,
/// `n_group` groups of which `topk_group` are chosen from, `routed_scaling_factor`, and
/// `n_shared_experts` shared experts (one MLP of that many times the expert width).
/// DeepSeek-V2 (`model_type` `deepseek_v2`, read as DeepSeek-V3) routes by softmax with
/// no bias and no normalization unless its config says otherwise: `greedy` (no groups,
/// whatever `n_group` says, as transformers) or `group_limited_greedy` (groups scored
/// by their best expert).
fn deepseek_moe(v: &Value, arch: Arch) -> Result<Option<MoeConfig>, ConfigError> {
    let Some(n_experts) = opt_usize(v, "n_routed_experts").filter(|&n| n > 0) else { return Ok(None) };
    let v2 = v.get("model_type").and_then(Value::as_str) == Some("deepseek_v2");
    let scoring = match v.get("scoring_func").and_then(Value::as_str).unwrap_or(if v2 { "softmax" } else { "sigmoid" })
    {
        "sigmoid" => Scoring::Sigmoid,
        "softmax" => Scoring::Softmax,
        other => return Err(ConfigError::Unsupported(format!("`scoring_func` `{other}`"))),
    };
    let (choice_bias, group_score, grouped) =
        match v.get("topk_method").and_then(Value::as_str).unwrap_or(if v2 { "greedy" } else { "noaux_tc" }) {
            "noaux_tc" => (true, GroupScore::TopTwoSum, true),
            "greedy" => (false, GroupScore::TopTwoSum, !v2),
            "group_limited_greedy" => (false, GroupScore::Max, true),
            other => return Err(ConfigError::Unsupported(format!("`topk_method` `{other}`"))),
        };
    let groups = if grouped { opt_usize(v, "n_group").unwrap_or(1).max(1) } else { 1 };
    let groups_used = if grouped { opt_usize(v, "topk_group").unwrap_or(1).max(1) } else { 1 };
    if n_experts % groups != 0 || groups_used > groups {
        return Err(ConfigError::Unsupported(format!(
            "`n_group` {groups} with `topk_group` {groups_used} and `n_routed_experts` {n_experts} (groups must \
             divide the experts, and at most `n_group` be kept)"
        )));
    }
    let expert_size = usize_field(v, "moe_intermediate_size")?;
    let shared = opt_usize(v, "n_shared_experts").unwrap_or(0);
    let top_k = usize_field(v, "num_experts_per_tok")?;
    if n_experts > MAX_EXPERTS {
        return Err(ConfigError::Unsupported(format!("`n_routed_experts` {n_experts} (at most {MAX_EXPERTS})")));
    }
    Ok(Some(MoeConfig {
        shared_expert_size: Some(shared * expert_size).filter(|&s| s > 0),
        norm_topk_prob: v.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(!v2),
        scoring,
        choice_bias,
        groups,
        groups_used,
        group_score,
        // transformers' DeepSeek-V3 masks the groups not chosen with 0, its GLM-4.5 with
        // minus infinity.
        group_mask_zero: v.get("strata_group_mask_zero").and_then(Value::as_bool).unwrap_or(arch == Arch::DeepseekV3),
        routed_scale: f32_of(v, "routed_scaling_factor").unwrap_or(1.0),
        shared_gated: false,
        ..MoeConfig::softmax(n_experts, top_k, expert_size)
    }))
}

/// DeepSeek-V3's latent attention from its `config.json`.
fn mla_config(v: &Value) -> Result<MlaConfig, ConfigError> {
    Ok(MlaConfig {
        q_lora_rank: opt_usize(v, "q_lora_rank"),
        kv_lora_rank: usize_field(v, "kv_lora_rank")?,
        qk_nope_head_dim: usize_field(v, "qk_nope_head_dim")?,
        qk_rope_head_dim: usize_field(v, "qk_rope_head_dim")?,
        v_head_dim: usize_field(v, "v_head_dim")?,
        rope_interleave: v.get("rope_interleave").and_then(Value::as_bool).unwrap_or(true),
        split_kv_b: v.get("strata_mla_split_kv_b").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// Which layers of a MoE model route to experts: every layer of Mixtral; for the Qwen
/// families, as transformers decides, layer `i` unless it is in `mlp_only_layers` or
/// `i + 1` is not a multiple of `decoder_sparse_step`.
fn sparse_layers(v: &Value, arch: Arch, n_layers: usize) -> Result<Vec<bool>, ConfigError> {
    if matches!(arch, Arch::Mixtral | Arch::GptOss) {
        return Ok(vec![true; n_layers]);
    }
    if matches!(arch, Arch::DeepseekV3 | Arch::Glm4Moe) {
        // The first `first_k_dense_replace` layers are dense (`moe_layer_freq` 1).
        if opt_usize(v, "moe_layer_freq").is_some_and(|f| f != 1) {
            return Err(ConfigError::Unsupported("`moe_layer_freq` other than 1".into()));
        }
        let dense = opt_usize(v, "first_k_dense_replace").unwrap_or(0);
        return Ok((0..n_layers).map(|i| i >= dense).collect());
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
