//! A [`ModelSource`] from a llama.cpp GGUF file: the metadata becomes a
//! `config.json`-equivalent, llama.cpp tensor names become Hugging Face names (with the
//! Q/K row permutation of `convert_hf_to_gguf.py` undone for `llama`/`mistral`, so the
//! NEOX-layout model code runs unchanged), and the `tokenizer.ggml.*` vocabulary becomes
//! a `tokenizer.json` ([`super::gguf_vocab`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::ModelSource;
use super::config::ModelConfig;
use super::gguf_vocab;
use crate::format::gguf::GgufFile;
use crate::tensor::{AlignedBytes, HostTensor};

/// Reads a `.gguf` file into a model source.
pub fn source_from_gguf(path: &Path) -> anyhow::Result<ModelSource> {
    let f = GgufFile::open(path)?;
    let shown = path.display();
    let arch = f.get_str("general.architecture").with_context(|| format!("{shown}: no `general.architecture`"))?;
    if !matches!(arch, "llama" | "mistral" | "qwen2" | "qwen3") {
        bail!("{shown}: architecture `{arch}` is not supported (supported: llama, mistral, qwen2, qwen3)");
    }
    let config = config_json(&f, arch).with_context(|| format!("{shown}: building the model config"))?;
    let cfg = ModelConfig::from_json(&config.to_string()).with_context(|| format!("{shown}: model config"))?;
    let tensors = hf_tensors(&f, arch, &cfg).with_context(|| format!("{shown}: mapping tensors"))?;
    let tok = gguf_vocab::tokenizer(&f).with_context(|| format!("{shown}: building the tokenizer"))?;
    let name = path.file_stem().map_or_else(|| shown.to_string(), |s| s.to_string_lossy().into_owned());
    Ok(ModelSource {
        name,
        config_json: config.to_string(),
        tokenizer_json: tok.tokenizer_json,
        tokenizer_config_json: Some(tok.tokenizer_config_json),
        generation_config_json: Some(tok.generation_config_json),
        chat_template: None,
        tensors,
    })
}

/// The `config.json` equivalent of the GGUF hyperparameters.
fn config_json(f: &GgufFile, arch: &str) -> anyhow::Result<Value> {
    let key = |k: &str| format!("{arch}.{k}");
    let u64_of = |k: &str| -> anyhow::Result<Option<u64>> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) => Ok(Some(x)),
                None => bail!("`{}` is {} {v:?}, expected one unsigned integer", key(k), v.type_name()),
            },
        }
    };
    let required = |k: &str| -> anyhow::Result<u64> { u64_of(k)?.with_context(|| format!("missing `{}`", key(k))) };
    let hidden = required("embedding_length")?;
    let n_heads = required("attention.head_count")?;
    let n_kv = u64_of("attention.head_count_kv")?.unwrap_or(n_heads);
    let head_dim = u64_of("attention.key_length")?.unwrap_or(hidden.checked_div(n_heads).unwrap_or(0));
    if let Some(v) = u64_of("attention.value_length")?.filter(|&v| v != head_dim) {
        bail!("`{}` {v} differs from the key length {head_dim}", key("attention.value_length"));
    }
    let embd = f.tensor("token_embd.weight").context("no `token_embd.weight` tensor")?;
    let vocab = embd.shape.first().copied().unwrap_or(0);
    let eps = f.get_f32(&key("attention.layer_norm_rms_epsilon")).context("missing or non-float rms epsilon")?;
    let mut c = json!({
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": required("feed_forward_length")?,
        "num_hidden_layers": required("block_count")?,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": eps,
        "max_position_embeddings": u64_of("context_length")?.unwrap_or(4096),
        "tie_word_embeddings": f.tensor("output.weight").is_none(),
        "attention_bias": f.tensor("blk.0.attn_q.bias").is_some(),
        "rope_theta": f.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
    });
    if let Some(n) = u64_of("rope.dimension_count")?.filter(|&n| n != head_dim) {
        bail!("partial RoPE (`{}` {n} of head dim {head_dim}) is not supported", key("rope.dimension_count"));
    }
    if arch == "mistral"
        && let Some(w) = u64_of("attention.sliding_window")?
    {
        c["sliding_window"] = json!(w);
    }
    if let Some(s) = rope_scaling(f, arch, &c)? {
        c["rope_scaling"] = s;
    }
    for (field, k) in [("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")]
    {
        if let Some(id) = f.get_u64(k) {
            c[field] = json!(id);
        }
    }
    Ok(c)
}

/// `rope_scaling` from `{arch}.rope.scaling.*`, or Llama 3 scaling recovered from the
/// `rope_freqs.weight` tensor that `convert_hf_to_gguf.py` writes instead of keys.
fn rope_scaling(f: &GgufFile, arch: &str, c: &Value) -> anyhow::Result<Option<Value>> {
    let kind = f.get_str(&format!("{arch}.rope.scaling.type")).unwrap_or("none");
    let factor = f.get_f32(&format!("{arch}.rope.scaling.factor"));
    let freqs = f.tensor("rope_freqs.weight");
    match (kind, freqs) {
        ("none", None) => Ok(None),
        ("linear", None) => {
            let factor = factor.context("rope scaling `linear` without `rope.scaling.factor`")?;
            Ok(Some(json!({"rope_type": "linear", "factor": factor})))
        }
        ("none" | "llama3", Some(t)) => {
            let orig_key = format!("{arch}.rope.scaling.original_context_length");
            llama3_from_factors(t, c, f.get_u64(&orig_key)).map(Some)
        }
        (other, _) => bail!("rope scaling `{other}` is not supported"),
    }
}

/// Recovers Llama 3 rope scaling parameters from per-frequency divisors (1 for high
/// frequencies, `factor` for low ones, a smooth blend between), assuming the low/high
/// frequency factors every Llama 3.x release uses (1 and 4), then checks that the
/// recovered parameters reproduce every divisor.
fn llama3_from_factors(t: &HostTensor, c: &Value, orig_hint: Option<u64>) -> anyhow::Result<Value> {
    let divisors = t.to_f32_vec();
    let head_dim = c["head_dim"].as_u64().unwrap_or(0) as usize;
    if divisors.len() * 2 != head_dim {
        bail!("`rope_freqs.weight` has {} values; head dim {head_dim} needs {}", divisors.len(), head_dim / 2);
    }
    let theta = c["rope_theta"].as_f64().unwrap_or(10000.0) as f32;
    let factor = divisors.iter().copied().fold(1.0f32, f32::max);
    let (low, high) = (1.0f32, 4.0f32);
    let wavelen = |i: usize| 2.0 * std::f32::consts::PI * theta.powf((2 * i) as f32 / head_dim as f32);
    // A blended divisor d gives smooth = (factor / d - 1) / (factor - 1) =
    // (orig / wavelen - low) / (high - low), so orig = wavelen * (low + smooth * (high - low)).
    let from_blend =
        divisors.iter().enumerate().find(|&(_, &d)| d > 1.0 + 1e-4 && d < factor * (1.0 - 1e-4)).map(|(i, &d)| {
            let smooth = (factor / d - 1.0) / (factor - 1.0);
            (wavelen(i) * (low + smooth * (high - low))).round()
        });
    let orig = from_blend.or(orig_hint.map(|o| o as f32)).unwrap_or(8192.0);
    let scaling = json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
        "high_freq_factor": high, "original_max_position_embeddings": orig});
    let mut with = c.clone();
    with["rope_scaling"] = scaling.clone();
    let mut without = c.clone();
    without["rope_scaling"] = Value::Null;
    let scaled = ModelConfig::from_json(&with.to_string())?.rope_freqs().inv_freq;
    let plain = ModelConfig::from_json(&without.to_string())?.rope_freqs().inv_freq;
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

/// llama.cpp per-layer tensor name (after `blk.N.`) → Hugging Face (after `model.layers.N.`).
const LAYER_NAMES: [(&str, &str); 14] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Hugging Face name for a llama.cpp tensor name, if it has one.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL_NAMES.iter().find(|(g, _)| *g == gguf_name) {
        return Some(hf.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    layer.parse::<u32>().ok()?;
    let (_, hf) = LAYER_NAMES.iter().find(|(g, _)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{hf}"))
}

fn hf_tensors(f: &GgufFile, arch: &str, cfg: &ModelConfig) -> anyhow::Result<HashMap<String, HostTensor>> {
    let interleaved = matches!(arch, "llama" | "mistral");
    let mut out = HashMap::with_capacity(f.tensors.len());
    for (name, t) in &f.tensors {
        if name == "rope_freqs.weight" {
            continue; // folded into `rope_scaling`
        }
        let hf = hf_name(name).with_context(|| format!("tensor `{name}` has no Hugging Face equivalent"))?;
        let t = match (interleaved, name.rsplit('.').nth(1)) {
            (true, Some("attn_q")) => unpermute_rows(t, cfg.n_heads).with_context(|| format!("tensor `{name}`"))?,
            (true, Some("attn_k")) => unpermute_rows(t, cfg.n_kv_heads).with_context(|| format!("tensor `{name}`"))?,
            _ => t.clone(),
        };
        out.insert(hf, t);
    }
    Ok(out)
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
    let len = t.byte_len();
    let fixup = crate::tensor::Fixup::UnpermuteRows { n_heads };
    let origin = t.origin().map(|o| crate::tensor::TensorOrigin { fixup: Some(fixup), ..o.clone() });
    // Computed on first use: opening a model (or converting it one layer at a time)
    // does not hold a second copy of every Q/K matrix.
    let stored = t.clone();
    let lazy = crate::tensor::LazyBytes::new(len, move || {
        let mut buf = AlignedBytes::zeroed(len);
        fixup.apply(stored.bytes(), buf.bytes_mut(), rows);
        buf
    })
    .with_origin(origin);
    Ok(HostTensor::lazy(Arc::new(lazy), t.dtype, t.shape.clone()))
}

/// The `TemplateProcessing` post-processor that adds BOS/EOS as the GGUF asks
/// (`Null` when it adds neither); an error when a token it must add is missing.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hugging_face() {
        assert_eq!(hf_name("blk.12.attn_q.weight").as_deref(), Some("model.layers.12.self_attn.q_proj.weight"));
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.0.ffn_gate_exps.weight"), None);
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
