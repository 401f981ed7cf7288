//! A [`ModelSource`] from a llama.cpp GGUF file: the metadata becomes the
//! [`ModelConfig`] directly (each family's keys as llama.cpp reads them), llama.cpp
//! tensor names become Hugging Face names through the architecture's spec (with the Q/K
//! row permutation of `convert_hf_to_gguf.py` undone for the families that have it, and
//! Gemma's `1 + w` norms stored as `w`), and the `tokenizer.ggml.*` vocabulary becomes
//! a `tokenizer.json` ([`super::gguf_vocab`]).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, bail};

use super::ModelSource;
use super::config::{
    Ffn, LayerConfig, LayerRope, LinearAttnConfig, MAX_EXPERTS, Mixer, MlaConfig, ModelConfig, MoeConfig, Names,
    RopeScaling, Scoring, yarn_mscale,
};
use super::gguf_vocab;
use super::spec::{Arch, ArchSpec, Role};
use strata_format::gguf::{GgufFile, GgufValue};
use strata_format::{Checkpoint, ConfigOrigin};
use strata_quant::ReadF32;
use strata_tensor::tensor::{Fixup, HostTensor};

/// Reads a `.gguf` file into a model source.
pub fn source_from_gguf(path: &Path) -> anyhow::Result<ModelSource> {
    let f = GgufFile::open(path)?;
    let shown = path.display();
    let name = f.get_str("general.architecture").with_context(|| format!("{shown}: no `general.architecture`"))?;
    let Some(mut arch) = Arch::from_gguf_arch(name) else {
        bail!("{shown}: architecture `{name}` is not supported (supported: {})", Arch::supported_gguf_archs());
    };
    // llama.cpp writes Mixtral as `llama` with experts.
    if arch == Arch::Llama && f.get("llama.expert_count").and_then(|v| v.as_u64()).is_some_and(|n| n > 0) {
        arch = Arch::Mixtral;
    }
    let config = config_from_gguf(&f, arch).with_context(|| format!("{shown}: model config"))?;
    let tensors = hf_tensors(&f, &config).with_context(|| format!("{shown}: mapping tensors"))?;
    let tokens = f.get_array("tokenizer.ggml.tokens").map_or(0, <[GgufValue]>::len);
    if tokens > config.vocab_size {
        bail!(
            "{shown}: `tokenizer.ggml.tokens` has {tokens} tokens but `token_embd.weight` has {} rows, one per token",
            config.vocab_size
        );
    }
    let tok = gguf_vocab::tokenizer(&f).with_context(|| format!("{shown}: building the tokenizer"))?;
    let name = path.file_stem().map_or_else(|| shown.to_string(), |s| s.to_string_lossy().into_owned());
    let checkpoint = Checkpoint {
        name,
        config_json: config.to_json().to_string(),
        config_origin: ConfigOrigin::Context(format!("{shown}: model config")),
        tokenizer_json: tok.tokenizer_json,
        tokenizer_config_json: Some(tok.tokenizer_config_json),
        generation_config_json: Some(tok.generation_config_json),
        chat_template: None,
        tensors,
        routing: None,
        sums: Default::default(),
    };
    Ok(ModelSource { checkpoint, config })
}

/// The model config from the GGUF hyperparameters, read as llama.cpp reads each family's.
pub fn config_from_gguf(f: &GgufFile, arch: Arch) -> anyhow::Result<ModelConfig> {
    let spec = arch.spec();
    let key = |k: &str| format!("{}.{k}", spec.gguf_arch);
    let u64_of = |k: &str| -> anyhow::Result<Option<u64>> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) => Ok(Some(x)),
                None => bail!("`{}` is {} {v:?}, expected one unsigned integer", key(k), v.type_name()),
            },
        }
    };
    let f32_of = |k: &str| -> anyhow::Result<Option<f32>> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(_) => f.get_f32(&key(k)).map(Some).with_context(|| format!("`{}` is not a number", key(k))),
        }
    };
    // A size: an unsigned integer capped before anything is allocated from it.
    let size = |k: &str| -> anyhow::Result<Option<usize>> {
        let Some(v) = u64_of(k)? else { return Ok(None) };
        let fits = usize::try_from(v).ok().filter(|&v| v <= 1 << 40);
        fits.map(Some).with_context(|| format!("`{}` {v} is too large", key(k)))
    };
    let required = |k: &str| -> anyhow::Result<usize> { size(k)?.with_context(|| format!("missing `{}`", key(k))) };
    let hidden = required("embedding_length")?;
    let n_heads = required("attention.head_count")?;
    let blocks = required("block_count")?;
    if blocks > 1 << 16 {
        bail!("`{}` {blocks} is too large", key("block_count"));
    }
    // GLM's block count includes its multi-token-prediction layers (skipped).
    let nextn_layers = size("nextn_predict_layers")?.unwrap_or(0).min(blocks);
    let n_layers = blocks - nextn_layers;
    let n_kv_heads = size("attention.head_count_kv")?.unwrap_or(n_heads);
    let head_dim = size("attention.key_length")?.unwrap_or(hidden.checked_div(n_heads).unwrap_or(0));
    // Latent attention's cache rows: keys of the latent and the RoPE key, values the
    // latent alone.
    if let Some(v) = u64_of("attention.value_length")?.filter(|&v| v != head_dim as u64 && arch != Arch::DeepseekV3) {
        bail!("`{}` {v} differs from the key length {head_dim}", key("attention.value_length"));
    }
    let rotary_dim = size("rope.dimension_count")?.unwrap_or(head_dim);
    let embd = f.tensor("token_embd.weight").context("no `token_embd.weight` tensor")?;
    let vocab = embd.shape.first().copied().unwrap_or(0);
    let eps = f32_of("attention.layer_norm_rms_epsilon")?.context("missing or non-float rms epsilon")?;
    let rope_theta = f32_of("rope.freq_base")?.unwrap_or(10000.0);

    // Sliding windows, by llama.cpp's rules per family (it ignores Phi-3's window).
    let window = u64_of("attention.sliding_window")?.filter(|&w| w > 0).map(|w| w as usize);
    let (window, default_pattern) = match arch {
        Arch::Mistral => (window, 1),
        Arch::Gemma2 => (window.or(Some(4096)), 2),
        Arch::Gemma3 => (window, 6),
        Arch::Olmo2 => (window, 4),
        // llama.cpp's `gpt-oss`: the even layers slide.
        Arch::GptOss => (window, 2),
        _ => (None, 1),
    };
    let sliding = swa_layers(f, &key("attention.sliding_window_pattern"), n_layers, default_pattern)?;
    let moe = match arch {
        Arch::Mixtral | Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35Moe | Arch::GptOss => {
            let n_experts = required("expert_count")?;
            if n_experts == 0 || n_experts > MAX_EXPERTS {
                bail!("`{}` {n_experts} is not between 1 and {MAX_EXPERTS}", key("expert_count"));
            }
            let top_k = required("expert_used_count")?;
            if top_k == 0 || top_k > n_experts {
                bail!(
                    "`{}` {top_k} is not between 1 and `{}` {n_experts}",
                    key("expert_used_count"),
                    key("expert_count")
                );
            }
            let expert_size = match arch {
                Arch::Mixtral => required("feed_forward_length")?,
                Arch::GptOss => required("expert_feed_forward_length")?,
                _ => required("expert_feed_forward_length")?,
            };
            let shared_expert_size = match arch {
                Arch::Qwen2Moe | Arch::Qwen3Next | Arch::Qwen35Moe => {
                    match size("expert_shared_feed_forward_length")? {
                        Some(s) => Some(s),
                        None => f.tensor("blk.0.ffn_gate_shexp.weight").and_then(|t| t.shape.first().copied()),
                    }
                }
                _ => None,
            };
            // llama.cpp's graphs fix this per family (its `build_moe_ffn(..., norm_w)`).
            let norm_topk_prob = arch != Arch::Qwen2Moe;
            Some(MoeConfig { shared_expert_size, norm_topk_prob, ..MoeConfig::softmax(n_experts, top_k, expert_size) })
        }
        Arch::DeepseekV3 | Arch::Glm4Moe => deepseek_moe(f, &key, n_layers)?,
        _ => None,
    };
    let rope_off_everywhere = arch == Arch::Granite
        && f.get(&key("rope.scaling.finetuned")).is_some_and(|v| matches!(v, GgufValue::Bool(false)));
    let layers = (0..n_layers)
        .map(|i| {
            let sliding_window = window.filter(|_| sliding[i]);
            let rope = match arch {
                _ if rope_off_everywhere => LayerRope::None,
                Arch::SmolLM3 if (i + 1) % 4 == 0 => LayerRope::None,
                Arch::Gemma3 if sliding_window.is_some() => LayerRope::Local,
                _ => LayerRope::Global,
            };
            // A layer routes when it has a router (llama.cpp's MoE families route in
            // every layer; a dense layer would carry `ffn_gate` instead).
            let ffn = match moe.is_some() && f.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_some() {
                true => Ffn::Moe,
                false => Ffn::Dense,
            };
            let mixer = if arch == Arch::DeepseekV3 { Mixer::Latent } else { Mixer::Attention };
            LayerConfig { sliding_window, rope, ffn, mixer }
        })
        .collect();

    let gemma = matches!(arch, Arch::Gemma | Arch::Gemma2 | Arch::Gemma3);
    // llama.cpp scales Gemma's queries by the head width, except for the 27B models
    // (46 and 62 layers), whose `query_pre_attn_scalar` is hidden / heads.
    let gemma_27b = (arch == Arch::Gemma2 && n_layers == 46) || (arch == Arch::Gemma3 && n_layers == 62);
    let attn_scale = match arch {
        _ if gemma_27b => (hidden as f32 / n_heads.max(1) as f32).powf(-0.5),
        Arch::Granite => f32_of("attention.scale")?.filter(|&s| s != 0.0).unwrap_or((head_dim as f32).powf(-0.5)),
        _ => (head_dim as f32).powf(-0.5),
    };
    let granite = |k: &str| -> anyhow::Result<f32> {
        Ok(if arch == Arch::Granite { f32_of(k)?.filter(|&s| s != 0.0).unwrap_or(1.0) } else { 1.0 })
    };
    let (attn_softcap, final_softcap) = match arch {
        Arch::Gemma2 => (
            Some(f32_of("attn_logit_softcapping")?.unwrap_or(50.0)),
            Some(f32_of("final_logit_softcapping")?.unwrap_or(30.0)),
        ),
        Arch::Gemma3 => (None, f32_of("final_logit_softcapping")?),
        _ => (None, None),
    };
    let mut config = ModelConfig {
        arch,
        hidden_size: hidden,
        // Qwen3.5-MoE has no dense MLP (every layer routes), and no length for one.
        intermediate_size: match arch {
            Arch::Qwen35Moe => size("feed_forward_length")?.unwrap_or(0),
            _ => required("feed_forward_length")?,
        },
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        vocab_size: vocab,
        rms_norm_eps: eps,
        max_position_embeddings: u64_of("context_length")?.map_or(4096, |c| c.min(1 << 40) as usize),
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        attention_bias: f.tensor("blk.0.attn_q.bias").is_some(),
        layers,
        rope_theta,
        rope_scaling: RopeScaling::None,
        rope_local_theta: f32_of("rope.freq_base_swa")?.unwrap_or(10000.0),
        rotary_dim,
        embed_scale: if gemma { (hidden as f64).sqrt() as f32 } else { granite("embedding_scale")? },
        residual_scale: granite("residual_scale")?,
        attn_scale,
        logits_divisor: granite("logit_scale")?,
        attn_softcap: attn_softcap.filter(|&c| c > 0.0),
        final_softcap: final_softcap.filter(|&c| c > 0.0),
        moe,
        linear_attn: None,
        attn_output_gate: false,
        neuron_group: None,
        mla: None,
        nextn_layers,
        qk_norm: f.tensor("blk.0.attn_q_norm.weight").is_some() || arch != Arch::Glm4Moe,
    };
    if arch == Arch::DeepseekV3 {
        // llama.cpp stores latent attention as one KV head of the latent and the RoPE
        // key, with the heads' own widths under `*_mla`.
        let qk = required("attention.key_length_mla")?;
        let kv_lora_rank = required("attention.kv_lora_rank")?;
        let mla = MlaConfig {
            q_lora_rank: size("attention.q_lora_rank")?.filter(|&r| r > 0),
            kv_lora_rank,
            qk_nope_head_dim: qk.checked_sub(rotary_dim).with_context(|| {
                format!("`{}` {qk} is below the RoPE width {rotary_dim}", key("attention.key_length_mla"))
            })?,
            qk_rope_head_dim: rotary_dim,
            v_head_dim: required("attention.value_length_mla")?,
            rope_interleave: true,
            split_kv_b: f.tensor("blk.0.attn_k_b.weight").is_some(),
        };
        // The softmax scale, with YaRN's `mscale_all_dim` (stored times 0.1).
        let factor = f32_of("rope.scaling.factor")?.unwrap_or(1.0);
        let log_mul = f32_of("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0) / 0.1;
        let m = if log_mul != 0.0 { yarn_mscale(factor, log_mul) } else { 1.0 };
        config.attn_scale = (qk as f32).powf(-0.5) * m * m;
        config.mla = Some(mla);
    }
    if matches!(arch, Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe) {
        // The gated delta rule: `ssm.group_count` key heads of `ssm.state_size`,
        // `ssm.time_step_rank` value heads sharing `ssm.inner_size`; which layers are
        // recurrent by `attention.recurrent_layers`, else every layer but each
        // `full_attention_interval`-th (llama.cpp's rule).
        let n_v_heads = required("ssm.time_step_rank")?;
        let inner = required("ssm.inner_size")?;
        config.linear_attn = Some(LinearAttnConfig {
            n_k_heads: required("ssm.group_count")?,
            n_v_heads,
            k_head_dim: required("ssm.state_size")?,
            v_head_dim: inner.checked_div(n_v_heads).unwrap_or(0),
            conv_kernel: required("ssm.conv_kernel")?,
            gguf_layout: true,
            // llama.cpp's converter tiles Qwen3.5's value heads (not Qwen3-Next's).
            v_tiled: arch != Arch::Qwen3Next,
        });
        let recurrent = match f.get(&key("attention.recurrent_layers")) {
            Some(_) => swa_layers(f, &key("attention.recurrent_layers"), n_layers, 4)?,
            None => swa_layers(f, &key("full_attention_interval"), n_layers, 4)?,
        };
        for (l, r) in config.layers.iter_mut().zip(recurrent) {
            l.mixer = if r { Mixer::Linear } else { Mixer::Attention };
        }
        config.attn_output_gate = true;
    }
    config.rope_scaling = rope_scaling(f, spec, &config)?;
    config.validate_as(Names::Gguf(spec.gguf_arch))?;
    Ok(config)
}

/// DeepSeek-V3's and GLM-4.5's routing from `{arch}.expert_*` (llama.cpp's names):
/// the gating function, groups, weight scale and normalization, shared experts, and a
/// choice bias when the layers carry `exp_probs_b`.
fn deepseek_moe(f: &GgufFile, key: &dyn Fn(&str) -> String, n_layers: usize) -> anyhow::Result<Option<MoeConfig>> {
    let num = |k: &str| -> anyhow::Result<Option<u64>> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).with_context(|| format!("`{}` is not an unsigned integer", key(k))),
        }
    };
    let small = |k: &str| -> anyhow::Result<Option<usize>> {
        let Some(v) = num(k)? else { return Ok(None) };
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= MAX_EXPERTS)
            .map(Some)
            .with_context(|| format!("`{}` {v} is too large", key(k)))
    };
    let Some(n_experts) = small("expert_count")?.filter(|&n| n > 0) else { return Ok(None) };
    let top_k = small("expert_used_count")?.with_context(|| format!("missing `{}`", key("expert_used_count")))?;
    if top_k == 0 || top_k > n_experts {
        bail!("`{}` {top_k} is not between 1 and `{}` {n_experts}", key("expert_used_count"), key("expert_count"));
    }
    let expert_size = num("expert_feed_forward_length")?
        .and_then(|v| usize::try_from(v).ok().filter(|&v| v <= 1 << 30))
        .with_context(|| format!("missing or invalid `{}`", key("expert_feed_forward_length")))?;
    let shared = small("expert_shared_count")?.unwrap_or(0);
    let scoring = match num("expert_gating_func")? {
        None | Some(1) => Scoring::Softmax,
        Some(2) => Scoring::Sigmoid,
        Some(other) => bail!("`{}` {other} is not supported (1 softmax, 2 sigmoid)", key("expert_gating_func")),
    };
    let scale = match f.get(&key("expert_weights_scale")) {
        None => 1.0,
        Some(_) => f.get_f32(&key("expert_weights_scale")).context("`expert_weights_scale` is not a number")?,
    };
    let norm = matches!(f.get(&key("expert_weights_norm")), Some(GgufValue::Bool(true)));
    let choice_bias = (0..n_layers).any(|l| f.tensor(&format!("blk.{l}.exp_probs_b.bias")).is_some());
    Ok(Some(MoeConfig {
        shared_expert_size: Some(shared * expert_size).filter(|&s| s > 0),
        norm_topk_prob: norm,
        scoring,
        choice_bias,
        groups: small("expert_group_count")?.unwrap_or(1).max(1),
        groups_used: small("expert_group_used_count")?.unwrap_or(1).max(1),
        group_mask_zero: false,
        routed_scale: if scale == 0.0 { 1.0 } else { scale },
        shared_gated: false,
        ..MoeConfig::softmax(n_experts, top_k, expert_size)
    }))
}

/// Which layers use sliding-window attention: `{arch}.attention.sliding_window_pattern`
/// as an array of booleans, or as `n` (all but every `n`th layer slide), else `default`.
fn swa_layers(f: &GgufFile, key: &str, n_layers: usize, default: u64) -> anyhow::Result<Vec<bool>> {
    let n = match f.get(key) {
        Some(GgufValue::Array(items)) => {
            if items.len() != n_layers {
                bail!("`{key}` has {} entries for {n_layers} layers", items.len());
            }
            return items
                .iter()
                .map(|v| match v {
                    GgufValue::Bool(b) => Ok(*b),
                    other => bail!("`{key}` holds {}, not booleans", other.type_name()),
                })
                .collect();
        }
        Some(v) => v.as_u64().with_context(|| format!("`{key}` is {}, not a number or array", v.type_name()))?,
        None => default,
    };
    Ok((0..n_layers as u64).map(|i| n == 0 || i % n < n - 1).collect())
}

/// RoPE scaling from `{arch}.rope.scaling.*`, or Llama 3 scaling recovered from the
/// `rope_freqs.weight` tensor that `convert_hf_to_gguf.py` writes instead of keys.
fn rope_scaling(f: &GgufFile, spec: &ArchSpec, c: &ModelConfig) -> anyhow::Result<RopeScaling> {
    let arch = spec.gguf_arch;
    let kind = f.get_str(&format!("{arch}.rope.scaling.type")).unwrap_or("none");
    let factor = f.get_f32(&format!("{arch}.rope.scaling.factor"));
    let freqs = f.tensor("rope_freqs.weight");
    match (kind, freqs) {
        ("none", None) => Ok(RopeScaling::None),
        ("linear", None) => {
            let factor = factor.context("rope scaling `linear` without `rope.scaling.factor`")?;
            Ok(RopeScaling::Linear { factor })
        }
        ("yarn", None) => {
            let factor = factor.context("rope scaling `yarn` without `rope.scaling.factor`")?;
            let orig_key = format!("{arch}.rope.scaling.original_context_length");
            let original = f.get_u64(&orig_key).with_context(|| format!("rope scaling `yarn` without `{orig_key}`"))?;
            let get = |k: &str| f.get_f32(&format!("{arch}.rope.scaling.{k}")).filter(|&x| x != 0.0);
            // llama.cpp's DeepSeek takes `mscale` equal to `mscale_all_dim`: cos and sin
            // unscaled.
            let attention_factor = match (get("yarn_attn_factor"), c.mla.is_some()) {
                (Some(a), _) => a,
                (None, true) => 1.0,
                (None, false) => yarn_mscale(factor, 1.0),
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position: original as f32,
                beta_fast: get("yarn_beta_fast").unwrap_or(32.0),
                beta_slow: get("yarn_beta_slow").unwrap_or(1.0),
                attention_factor,
                truncate: true,
            })
        }
        ("none" | "llama3", Some(t)) => {
            let orig_key = format!("{arch}.rope.scaling.original_context_length");
            llama3_from_factors(t, c, f.get_u64(&orig_key))
        }
        (other, _) => bail!("rope scaling `{other}` is not supported"),
    }
}

/// Recovers Llama 3 rope scaling parameters from per-frequency divisors (1 for high
/// frequencies, `factor` for low ones, a smooth blend between), assuming the low/high
/// frequency factors every Llama 3.x release uses (1 and 4), then checks that the
/// recovered parameters reproduce every divisor.
fn llama3_from_factors(t: &HostTensor, c: &ModelConfig, orig_hint: Option<u64>) -> anyhow::Result<RopeScaling> {
    let divisors = t.to_f32_vec();
    let dim = c.rotary_dim;
    if divisors.len() * 2 != dim {
        bail!("`rope_freqs.weight` has {} values; {dim} rotary dimensions need {}", divisors.len(), dim / 2);
    }
    let theta = c.rope_theta;
    let factor = divisors.iter().copied().fold(1.0f32, f32::max);
    let (low, high) = (1.0f32, 4.0f32);
    let wavelen = |i: usize| 2.0 * std::f32::consts::PI * theta.powf((2 * i) as f32 / dim as f32);
    // A blended divisor d gives smooth = (factor / d - 1) / (factor - 1) =
    // (orig / wavelen - low) / (high - low), so orig = wavelen * (low + smooth * (high - low)).
    let from_blend =
        divisors.iter().enumerate().find(|&(_, &d)| d > 1.0 + 1e-4 && d < factor * (1.0 - 1e-4)).map(|(i, &d)| {
            let smooth = (factor / d - 1.0) / (factor - 1.0);
            (wavelen(i) * (low + smooth * (high - low))).round()
        });
    let orig = from_blend.or(orig_hint.map(|o| o as f32)).unwrap_or(8192.0);
    let scaling =
        RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_max_position: orig };
    let scaled = ModelConfig { rope_scaling: scaling.clone(), ..c.clone() }.rope_freqs().inv_freq;
    let plain = ModelConfig { rope_scaling: RopeScaling::None, ..c.clone() }.rope_freqs().inv_freq;
    for (i, ((s, p), d)) in scaled.iter().zip(&plain).zip(&divisors).enumerate() {
        let want = p / d;
        if (s - want).abs() > 1e-4 * want.abs() {
            bail!(
                "`rope_freqs.weight` value {i} ({d}) is not Llama 3 scaling (factor {factor}, low 1, high 4, \
                 original context {orig}); other per-frequency factors are not supported"
            );
        }
    }
    Ok(scaling)
}

/// The Hugging Face name of a llama.cpp tensor name in a model of this family, if it
/// has one.
pub fn hf_name(spec: &ArchSpec, gguf_name: &str) -> Option<String> {
    if let Some(hf) = ArchSpec::global_hf_from_gguf(gguf_name) {
        return Some(hf.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    layer.parse::<u32>().ok()?;
    Some(format!("model.layers.{layer}.{}", spec.hf_from_gguf(suffix)?))
}

fn hf_tensors(f: &GgufFile, cfg: &ModelConfig) -> anyhow::Result<HashMap<String, HostTensor>> {
    let spec = cfg.spec();
    let mut out = HashMap::with_capacity(f.tensors.len());
    for (name, t) in &f.tensors {
        if name == "rope_freqs.weight" {
            continue; // folded into `rope_scaling`
        }
        // Multi-token-prediction layers after the last decoder layer are not run.
        let layer = name.strip_prefix("blk.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        if layer.is_some_and(|l| l >= cfg.n_layers && l < cfg.n_layers + cfg.nextn_layers) {
            continue;
        }
        let hf = hf_name(spec, name)
            .with_context(|| format!("tensor `{name}` has no place in a `{}` model", spec.gguf_arch))?;
        let local = name.rsplit('.').nth(1);
        let role = spec.tensors.iter().find(|n| name.ends_with(&format!(".{}", n.gguf))).map(|n| n.role);
        if role.is_some_and(Role::is_expert) {
            for (e, expert) in split_experts(name, t, cfg)?.into_iter().enumerate() {
                out.insert(hf.replacen('*', &e.to_string(), 1), expert);
            }
            continue;
        }
        if role == Some(Role::LinConv) && t.shape.len() == 2 {
            // llama.cpp squeezes the convolution's `[channels, 1, taps]` to two dimensions.
            let mut conv = t.clone();
            conv.shape = vec![t.shape[0], 1, t.shape[1]];
            out.insert(hf, conv);
            continue;
        }
        if role == Some(Role::SharedExpertGate) && t.shape.len() == 1 {
            // llama.cpp stores the shared expert's gate as a vector; it is one row.
            let mut row = t.clone();
            row.shape = vec![1, t.shape[0]];
            out.insert(hf, row);
            continue;
        }
        let t = match (spec.gguf_qk_permuted, local) {
            (true, Some("attn_q")) => unpermute_rows(t, cfg.n_heads).with_context(|| format!("tensor `{name}`"))?,
            (true, Some("attn_k")) => unpermute_rows(t, cfg.n_kv_heads).with_context(|| format!("tensor `{name}`"))?,
            // Gemma's (and Qwen3-Next's) norms: GGUF holds `1 + w`, the Hugging Face form
            // `w` (not the gated norm of a linear-attention layer, which is plain).
            _ if spec.hf_norm_offset && name.ends_with("norm.weight") && role.is_none_or(Role::is_norm) => {
                if t.dtype != strata_tensor::tensor::DType::F32 {
                    bail!("tensor `{name}` is {}, expected F32", t.dtype.name());
                }
                t.with_fixup(Fixup::MinusOneF32)
            }
            _ => t.clone(),
        };
        out.insert(hf, t);
    }
    Ok(out)
}

/// A stacked expert tensor (`ffn_{gate,up,down}_exps`: `[n_experts, rows, cols]`,
/// expert-major) as one `[rows, cols]` view per expert, each a contiguous range of the
/// file. Its expert count and shape must be what the metadata says.
fn split_experts(name: &str, t: &HostTensor, cfg: &ModelConfig) -> anyhow::Result<Vec<HostTensor>> {
    let Some(moe) = cfg.moe else { bail!("tensor `{name}`: experts in a model without `expert_count`") };
    // The experts' biases (gpt-oss): `[experts, rows]`, a vector each.
    if let (&[n, rows], true) = (&t.shape[..], name.ends_with(".bias")) {
        let want = if name.contains("ffn_down_exps") { cfg.hidden_size } else { moe.expert_size };
        if n != moe.n_experts || rows != want {
            bail!(
                "tensor `{name}` has shape {:?}; {} expert biases of {want} are [experts, {want}]",
                t.shape,
                moe.n_experts
            );
        }
        let mut flat = t.clone();
        flat.shape = vec![n, rows];
        return (0..n)
            .map(|e| {
                let mut b = flat.rows(e, 1).with_context(|| format!("tensor `{name}`: expert {e}"))?;
                b.shape = vec![rows];
                Ok(b)
            })
            .collect();
    }
    let &[n, rows, cols] = &t.shape[..] else {
        bail!("tensor `{name}` has shape {:?}; stacked experts are [experts, rows, columns]", t.shape)
    };
    if n != moe.n_experts {
        bail!("tensor `{name}` holds {n} experts; `expert_count` is {}", moe.n_experts);
    }
    let down = name.contains("ffn_down_exps");
    let want = if down { [cfg.hidden_size, moe.expert_size] } else { [moe.expert_size, cfg.hidden_size] };
    if [rows, cols] != want {
        bail!(
            "tensor `{name}`: each expert is {rows}x{cols}; hidden size {} and expert width {} make it {}x{}",
            cfg.hidden_size,
            moe.expert_size,
            want[0],
            want[1]
        );
    }
    let mut flat = t.clone();
    flat.shape = vec![n * rows, cols];
    (0..n).map(|e| flat.rows(e * rows, rows).with_context(|| format!("tensor `{name}`: expert {e}"))).collect()
}

/// Undoes `convert_hf_to_gguf.py`'s `LlamaModel.permute` on the rows of a Q or K
/// projection (weight or bias): within each head, stored row `2i + j` is Hugging Face
/// row `j * head_dim / 2 + i`. Whole rows move, so this works for every block type.
pub fn unpermute_rows(t: &HostTensor, n_heads: usize) -> anyhow::Result<HostTensor> {
    let rows = t.shape.first().copied().unwrap_or(0);
    if rows == 0 || n_heads.checked_mul(2).is_none_or(|h| h == 0 || !rows.is_multiple_of(h)) {
        bail!("{rows} rows do not split into {n_heads} heads of even, non-zero size");
    }
    if t.shape.len() == 1 && !t.dtype.is_float() {
        bail!("a 1-D {} tensor cannot be permuted by rows", t.dtype.name());
    }
    // Computed on first use: opening a model (or converting it one layer at a time)
    // does not hold a second copy of every Q/K matrix.
    Ok(t.with_fixup(strata_tensor::tensor::Fixup::UnpermuteRows { n_heads }))
}

/// The `TemplateProcessing` post-processor that adds BOS/EOS as the GGUF asks
/// (`Null` when it adds neither); an error when a token it must add is missing.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hugging_face() {
        let llama = Arch::Llama.spec();
        assert_eq!(hf_name(llama, "blk.12.attn_q.weight").as_deref(), Some("model.layers.12.self_attn.q_proj.weight"));
        assert_eq!(hf_name(llama, "output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name(llama, "blk.x.attn_q.weight"), None);
        assert_eq!(hf_name(llama, "blk.0.ffn_gate_exps.weight"), None);
        let gemma = Arch::Gemma2.spec();
        assert_eq!(
            hf_name(gemma, "blk.1.post_attention_norm.weight").as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_name(gemma, "blk.1.ffn_norm.weight").as_deref(),
            Some("model.layers.1.pre_feedforward_layernorm.weight")
        );
    }

    #[test]
    fn unpermute_inverts_the_llama_cpp_permutation() {
        // 2 heads of dim 4, 3 columns; HF row r holds values 10*r + c.
        let (heads, hd, cols) = (2, 4, 3);
        let hf: Vec<f32> = (0..heads * hd).flat_map(|r| (0..cols).map(move |c| (10 * r + c) as f32)).collect();
        // permute: reshape(n_head, 2, hd/2, cols).swapaxes(1, 2): stored row h*hd + 2i + j = HF row h*hd + j*hd/2 + i.
        let mut stored = vec![0.0; hf.len()];
        for h in 0..heads {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    let (s, o) = (h * hd + 2 * i + j, h * hd + j * hd / 2 + i);
                    stored[s * cols..(s + 1) * cols].copy_from_slice(&hf[o * cols..(o + 1) * cols]);
                }
            }
        }
        let t = HostTensor::from_f32(&stored, vec![heads * hd, cols]);
        assert_eq!(unpermute_rows(&t, heads).unwrap().as_f32(), &hf[..]);
        assert!(unpermute_rows(&t, 3).is_err());
        // A hostile file's zero-row projection is refused, not divided by.
        assert!(unpermute_rows(&HostTensor::from_f32(&[], vec![0, cols]), heads).is_err());
        assert!(unpermute_rows(&t, usize::MAX / 2 + 1).is_err());
    }
}
