//! A model's [`Details`] from its metadata, without reading its weights: GGUF header
//! keys, or a directory's `config.json` and tensor headers.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use super::{Details, Format};
use strata_format::gguf::GgufFile;
use strata_model::ModelSource;

/// Architecture, parameter count, quantization and context length of the model at `path`.
pub fn inspect(path: &Path, format: Format) -> anyhow::Result<Details> {
    let source = match format {
        Format::Gguf => return gguf_details(path),
        Format::Safetensors => ModelSource::from_hf_dir(path)?,
        Format::Flat => ModelSource::from_checkpoint(strata_format::flat::open(path)?)?,
        Format::Cawsf => ModelSource::from_checkpoint(strata_format::cawsf::open(path)?)?,
    };
    let config: Value = serde_json::from_str(&source.config_json).context("config.json")?;
    let mut by_dtype: BTreeMap<&'static str, u64> = BTreeMap::new();
    for t in source.tensors.values() {
        *by_dtype.entry(t.dtype.name()).or_default() += t.numel() as u64;
    }
    Ok(Details {
        architecture: config.get("model_type").and_then(Value::as_str).unwrap_or("unknown").to_string(),
        parameter_count: by_dtype.values().sum(),
        quantization: by_dtype.iter().max_by_key(|(_, n)| **n).map_or("unknown", |(d, _)| d).to_string(),
        context_length: config.get("max_position_embeddings").and_then(Value::as_u64),
    })
}

/// Opens the model at `path` as loading it does, short of reading its weights: the
/// file's structure, its config against what this build runs, every tensor's presence
/// and shape, and its tokenizer. Imports check this, so that the store never holds a
/// model that fails at its first request.
pub fn check_loadable(path: &Path, format: Format) -> anyhow::Result<()> {
    let source = match format {
        Format::Gguf => strata_model::gguf_source::source_from_gguf(path)?,
        Format::Safetensors => ModelSource::from_hf_dir(path)?,
        Format::Flat => ModelSource::from_checkpoint(strata_format::flat::open(path)?)?,
        Format::Cawsf => ModelSource::from_checkpoint(strata_format::cawsf::open(path)?)?,
    };
    strata_model::shapes::check_tensors(&source.config, &source.tensors)?;
    strata_engine::tokenizer::TextTokenizer::for_model(&source)?;
    Ok(())
}

fn gguf_details(path: &Path) -> anyhow::Result<Details> {
    let f = GgufFile::open(path)?;
    let arch = f.get_str("general.architecture").context("no `general.architecture`")?.to_string();
    let parameter_count = f.infos.iter().map(|t| t.ne.iter().product::<u64>()).sum();
    let mut by_dtype: BTreeMap<&'static str, u64> = BTreeMap::new();
    for t in &f.infos {
        *by_dtype.entry(t.dtype.name()).or_default() += t.ne.iter().product::<u64>();
    }
    let dominant = by_dtype.iter().max_by_key(|(_, n)| **n).map_or("unknown", |(d, _)| d);
    let quantization = f.get_u64("general.file_type").and_then(file_type_name).unwrap_or(dominant).to_string();
    Ok(Details {
        context_length: f.get_u64(&format!("{arch}.context_length")),
        architecture: arch,
        parameter_count,
        quantization,
    })
}

/// llama.cpp's `llama_ftype` names, as Ollama shows them.
fn file_type_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}
