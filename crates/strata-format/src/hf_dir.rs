//! A Hugging Face model directory: `config.json`, the tokenizer files and the
//! memory-mapped safetensors weights ([`super::safetensors`]).

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use super::{Checkpoint, ConfigOrigin};
use strata_tensor::tensor::HostTensor;

/// Reads a Hugging Face model directory: config, tokenizer files and the
/// memory-mapped safetensors weights.
pub fn open(dir: &Path) -> anyhow::Result<Checkpoint> {
    let read = |name: &str| -> anyhow::Result<String> {
        let path = dir.join(name);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let optional = |name: &str| -> anyhow::Result<Option<String>> {
        match dir.join(name).is_file() {
            true => read(name).map(Some),
            false => Ok(None),
        }
    };
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string());
    let config_json = read("config.json")?;
    let tensors = text_tensors(&config_json, super::safetensors::load_dir(dir)?);
    Ok(Checkpoint {
        name,
        config_json,
        config_origin: ConfigOrigin::Context(format!("{}", dir.join("config.json").display())),
        tokenizer_json: read("tokenizer.json")?,
        tokenizer_config_json: optional("tokenizer_config.json")?,
        generation_config_json: optional("generation_config.json")?,
        chat_template: optional("chat_template.jinja")?,
        tensors,
        routing: None,
        sums: Default::default(),
    })
}

/// The language model's tensors of a multimodal Qwen3.5 checkpoint (`model_type`
/// `qwen3_5` or `qwen3_5_moe`, its text model's config nested, see `config.rs`), named as
/// the text model's: `model.language_model.*` becomes `model.*`; the vision tower
/// (`model.visual.*`) and the multi-token-prediction head (`mtp.*`) are left out. Other
/// checkpoints' tensors are returned as they are.
fn text_tensors(config_json: &str, tensors: HashMap<String, HostTensor>) -> HashMap<String, HostTensor> {
    let model_type = serde_json::from_str::<serde_json::Value>(config_json)
        .ok()
        .and_then(|v| v.get("model_type").and_then(|t| t.as_str()).map(str::to_owned));
    if !matches!(model_type.as_deref(), Some("qwen3_5" | "qwen3_5_moe")) {
        return tensors;
    }
    tensors
        .into_iter()
        .filter(|(name, _)| !name.starts_with("model.visual.") && !name.starts_with("mtp."))
        .map(|(name, t)| match name.strip_prefix("model.language_model.") {
            Some(rest) => (format!("model.{rest}"), t),
            None => (name, t),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multimodal_qwen3_5_checkpoint_gives_its_text_model_tensors() {
        let t = || HostTensor::from_f32(&[0.0], vec![1]);
        let names = [
            "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
            "model.language_model.embed_tokens.weight",
            "model.visual.blocks.0.attn.qkv.weight",
            "mtp.fc.weight",
            "lm_head.weight",
        ];
        let tensors: HashMap<String, HostTensor> = names.iter().map(|n| (n.to_string(), t())).collect();
        let mut got: Vec<String> =
            text_tensors(r#"{"model_type":"qwen3_5_moe"}"#, tensors.clone()).into_keys().collect();
        got.sort();
        assert_eq!(
            got,
            ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.linear_attn.in_proj_qkv.weight"]
        );
        // Any other checkpoint keeps its names.
        assert_eq!(text_tensors(r#"{"model_type":"qwen3_next"}"#, tensors.clone()).len(), names.len());
    }
}
