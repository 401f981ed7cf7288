//! `strata inspect`: what a model file or directory holds, for every format Strata reads.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{Value, json};

use super::out;
use crate::format::Group;
use crate::format::gguf::{GgufFile, GgufValue};
use crate::tensor::HostTensor;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A `.gguf` or `.cawsf` file, a flat layer directory or a Hugging Face directory, or
    /// a name in the store.
    pub path: PathBuf,
    /// Print everything as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: InspectArgs) -> anyhow::Result<()> {
    let (path, _) = crate::resolve::spec_path(&args.path)?;
    let report = inspect(&path)?;
    let text = if args.json { serde_json::to_string_pretty(&report)? + "\n" } else { render_text(&report) };
    out!("{text}")
}

/// The report for any supported path, as JSON with at least `format`, `tensors` (name,
/// dtype, shape, bytes) and `layer_bytes`.
pub fn inspect(p: &Path) -> anyhow::Result<Value> {
    let ext = |e: &str| p.extension().is_some_and(|x| x.eq_ignore_ascii_case(e));
    if p.is_dir() && p.join("manifest.json").is_file() {
        crate::format::flat::inspect(p)
    } else if p.is_file() && ext("cawsf") {
        crate::format::cawsf::inspect(p)
    } else if p.is_file() && ext("gguf") {
        inspect_gguf(p)
    } else if p.is_dir() && p.join("config.json").is_file() {
        inspect_hf(p)
    } else if p.exists() {
        anyhow::bail!("{}: not a model Strata reads (.gguf, .cawsf, a flat or a Hugging Face directory)", p.display())
    } else {
        anyhow::bail!("{}: no such file or directory", p.display())
    }
}

fn tensor_row(name: &str, t: &HostTensor) -> Value {
    json!({ "name": name, "dtype": t.dtype.name(), "shape": t.shape, "bytes": t.byte_len() })
}

/// Bytes per layer (`layer_of` maps a tensor name to its layer) and of the rest.
fn layer_bytes<'a>(tensors: impl Iterator<Item = (&'a str, usize)>, layer_of: impl Fn(&str) -> Option<usize>) -> Value {
    let mut layers: Vec<u64> = Vec::new();
    let mut global = 0u64;
    for (name, bytes) in tensors {
        match layer_of(name) {
            Some(i) => {
                if layers.len() <= i {
                    layers.resize(i + 1, 0);
                }
                layers[i] += bytes as u64;
            }
            None => global += bytes as u64,
        }
    }
    json!({ "global": global, "layers": layers })
}

fn gguf_value(v: &GgufValue) -> Value {
    match v {
        GgufValue::String(s) => json!(s),
        GgufValue::Bool(b) => json!(b),
        GgufValue::Array(a) if a.len() > 16 => {
            json!(format!("[{} × {}]", a.len(), a.first().map_or("?", |x| x.type_name())))
        }
        GgufValue::Array(a) => Value::Array(a.iter().map(gguf_value).collect()),
        other => other
            .as_i64()
            .map(|i| json!(i))
            .or_else(|| other.as_u64().map(|u| json!(u)))
            .or_else(|| other.as_f64().map(|f| json!(f)))
            .unwrap_or(Value::Null),
    }
}

fn inspect_gguf(p: &Path) -> anyhow::Result<Value> {
    let f = GgufFile::open(p)?;
    let tensors: Vec<Value> = f.infos.iter().map(|i| tensor_row(&i.name, &f.tensors[&i.name])).collect();
    let metadata: serde_json::Map<String, Value> = f.metadata.iter().map(|(k, v)| (k.clone(), gguf_value(v))).collect();
    let blk = |n: &str| n.strip_prefix("blk.")?.split('.').next()?.parse().ok();
    Ok(json!({
        "format": "gguf",
        "path": p.display().to_string(),
        "version": f.version,
        "alignment": f.alignment,
        "data_start": f.data_start,
        "metadata": metadata,
        "tensors": tensors,
        "layer_bytes": layer_bytes(f.infos.iter().map(|i| (i.name.as_str(), f.tensors[&i.name].bytes().len())), blk),
    }))
}

fn inspect_hf(p: &Path) -> anyhow::Result<Value> {
    let config: Value = serde_json::from_str(&std::fs::read_to_string(p.join("config.json"))?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.join("config.json").display()))?;
    let tensors = crate::format::safetensors::load_dir(p)?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let layer = |n: &str| match Group::of(n) {
        Group::Layer(i) => Some(i),
        Group::Global => None,
    };
    Ok(json!({
        "format": "safetensors",
        "path": p.display().to_string(),
        "config": config,
        "tensors": names.iter().map(|n| tensor_row(n, &tensors[*n])).collect::<Vec<_>>(),
        "layer_bytes": layer_bytes(names.iter().map(|n| (n.as_str(), tensors[*n].bytes().len())), layer),
    }))
}

/// A readable summary: the scalar fields, the tensor table and the per-layer bytes.
fn render_text(r: &Value) -> String {
    let mut o = String::new();
    let Some(obj) = r.as_object() else { return format!("{r}\n") };
    for (k, v) in obj {
        match (k.as_str(), v) {
            ("tensors" | "layer_bytes", _) => {}
            (_, Value::Object(m)) => {
                let _ = writeln!(o, "{k}:");
                for (kk, vv) in m {
                    let s = vv.to_string();
                    let s = if s.len() > 100 { format!("{}…", &s[..s.floor_char_boundary(100)]) } else { s };
                    let _ = writeln!(o, "  {kk}: {s}");
                }
            }
            _ => {
                let _ = writeln!(o, "{k}: {v}");
            }
        }
    }
    if let Some(ts) = r["tensors"].as_array() {
        let _ = writeln!(o, "tensors ({}):", ts.len());
        for t in ts {
            let bytes = if t["bytes"].is_null() { &t["size"] } else { &t["bytes"] };
            let _ = writeln!(
                o,
                "  {:<48} {:<9} {:<18} {:>12}",
                t["name"].as_str().unwrap_or(""),
                t["dtype"].as_str().unwrap_or(""),
                t["shape"].to_string(),
                bytes
            );
        }
    }
    let lb = &r["layer_bytes"];
    if let Some(layers) = lb["layers"].as_array() {
        let _ = writeln!(o, "global tensors: {} bytes", lb["global"]);
        for (i, b) in layers.iter().enumerate() {
            let _ = writeln!(o, "  layer {i:>3}: {b} bytes");
        }
    }
    o
}
