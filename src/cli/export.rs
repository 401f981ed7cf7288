//! `strata export`: a model as a GGUF file for llama.cpp.

use std::path::PathBuf;

use clap::Args;

use super::outln;
use crate::engine::export::export;
use crate::quant::convert_target;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The model to export: a Hugging Face directory, a `.gguf` or `.cawsf` file, a flat
    /// layer directory, or a model in the store.
    pub src: String,
    /// The GGUF file to write (must not exist). It appears only once the export is done
    /// and has read back as the source.
    pub out: PathBuf,
    /// Weight matrices in f32, f16, bf16, q8_0, q4_0, q4_k, q6_k or mxfp4 (default: as stored;
    /// formats llama.cpp does not read become f32). Norms and biases stay f32, and MoE
    /// routers as stored. q4_k and q6_k store matrices whose rows are not whole 256-value
    /// blocks as q4_0 and q8_0 (a warning says how many).
    #[arg(long)]
    pub quant: Option<String>,
    /// Worker threads for quantizing (default: one per core).
    #[arg(long, default_value_t = 0, value_parser = super::parse_threads)]
    pub threads: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: ExportArgs) -> anyhow::Result<()> {
    let quant = args.quant.as_deref().map(convert_target).transpose().map_err(|e| anyhow::anyhow!("--quant: {e}"))?;
    if let Some(q) = quant
        && crate::format::gguf_write::ggml_type(q).is_none()
    {
        anyhow::bail!(
            "--quant {}: llama.cpp does not read it (use f32, f16, bf16, q8_0, q4_0, q4_k, q6_k or mxfp4)",
            q.name()
        );
    }
    let src = crate::resolve::open(&args.src)?;
    let report = export(&src, &args.out, quant, args.threads)?;
    if let Some(w) = quant.and_then(|q| report.shortfall.warning(q)) {
        eprintln!("warning: {w}");
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!(
            "{}: {} ({} tensors, {} converted), tokenizer {}, {:.1} MB",
            args.out.display(),
            report.architecture,
            report.tensors,
            report.converted,
            report.tokenizer,
            report.bytes as f64 / 1e6
        )?;
        if let Some(note) = &report.note {
            outln!("note: {note}")?;
        }
    }
    Ok(())
}
