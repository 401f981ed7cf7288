//! Model hyperparameters from a Hugging Face `config.json`, resolved once into a plain
//! runtime struct. Unsupported architectures and settings are errors that name them.

use serde_json::Value;

use crate::backend::RopeFreqs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

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

#[derive(Clone, Debug)]
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
    /// RMS norms over each head of q and k before RoPE (qwen3).
    pub qk_norm: bool,
    pub sliding_window: Option<usize>,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config.json: missing or invalid `{0}`")]
    Missing(&'static str),
    #[error("unsupported architecture `{0}` (supported: llama, mistral, qwen2, qwen3)")]
    Architecture(String),
    #[error("config.json: unsupported setting {0}")]
    Unsupported(String),
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
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_str(text)?;
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = match model_type {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "" => {
                let first = v.pointer("/architectures/0").and_then(Value::as_str).unwrap_or("(none)");
                return Err(ConfigError::Architecture(first.to_string()));
            }
            other => return Err(ConfigError::Architecture(other.to_string())),
        };
        let hidden_size = usize_field(&v, "hidden_size")?;
        let n_heads = usize_field(&v, "num_attention_heads")?;
        let n_kv_heads = opt_usize(&v, "num_key_value_heads").unwrap_or(n_heads);
        let head_dim = opt_usize(&v, "head_dim").unwrap_or(hidden_size / n_heads.max(1));
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(ConfigError::Unsupported(format!(
                "num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}"
            )));
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(ConfigError::Unsupported(format!("head_dim {head_dim} (must be even)")));
        }
        let flag = |key: &str| v.get(key).and_then(Value::as_bool).unwrap_or(false);
        if flag("mlp_bias") {
            return Err(ConfigError::Unsupported("`mlp_bias: true`".into()));
        }
        if matches!(arch, Arch::Qwen2 | Arch::Qwen3) && flag("use_sliding_window") {
            return Err(ConfigError::Unsupported("`use_sliding_window: true` for qwen models".into()));
        }
        let sliding_window = match arch {
            Arch::Mistral => opt_usize(&v, "sliding_window"),
            _ => None,
        };
        if let Some(f) = f32_of(&v, "partial_rotary_factor").filter(|&f| f != 1.0) {
            return Err(ConfigError::Unsupported(format!("`partial_rotary_factor: {f}`")));
        }
        let (rope_theta, rope_scaling) = parse_rope(&v)?;
        Ok(ModelConfig {
            arch,
            hidden_size,
            intermediate_size: usize_field(&v, "intermediate_size")?,
            n_layers: usize_field(&v, "num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size: usize_field(&v, "vocab_size")?,
            rms_norm_eps: f32_of(&v, "rms_norm_eps").unwrap_or(1e-6),
            max_position_embeddings: opt_usize(&v, "max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            attention_bias: arch == Arch::Qwen2 || flag("attention_bias"),
            qk_norm: arch == Arch::Qwen3,
            sliding_window,
            rope_theta,
            rope_scaling,
        })
    }

    /// RoPE frequencies for this model, computed in f32 as transformers does.
    pub fn rope_freqs(&self) -> RopeFreqs {
        let dim = self.head_dim;
        let mut inv_freq: Vec<f32> =
            (0..dim / 2).map(|i| 1.0 / self.rope_theta.powf((2 * i) as f32 / dim as f32)).collect();
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
/// `rope_parameters` (transformers 5).
fn parse_rope(v: &Value) -> Result<(f32, RopeScaling), ConfigError> {
    let params = v.get("rope_parameters").filter(|p| p.is_object());
    let scaling = params.or_else(|| v.get("rope_scaling").filter(|s| s.is_object()));
    let theta = params.and_then(|p| f32_of(p, "rope_theta")).or_else(|| f32_of(v, "rope_theta")).unwrap_or(10000.0);
    let Some(s) = scaling else {
        return Ok((theta, RopeScaling::None));
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
    Ok((theta, scaling))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
        "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100"#;

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
    }
}
