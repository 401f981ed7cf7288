//! `strata convert`: a model into a flat layer directory or a `.cawsf` file.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::outln;
use crate::format::cawsf::Compression;
use crate::model::convert::{ConvertOptions, Progress, Target, convert};
use crate::quant::convert_target;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Flat,
    Cawsf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Compress {
    None,
    Zstd,
    Lz4,
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The model to convert: a Hugging Face directory, a `.gguf` or `.cawsf` file, or a
    /// flat layer directory.
    pub src: String,
    /// Where to write it (must not exist; a `.cawsf` name for `--format cawsf`). It
    /// appears only when the conversion is done.
    pub out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "flat")]
    pub format: Format,
    /// Requantize weight matrices: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, mxfp4,
    /// affine_q4 or int8; f32, f16 and bf16 also dequantize quantized tensors (default: keep every
    /// tensor as it is stored). q4_k and q6_k store matrices whose rows are not whole
    /// 256-value blocks as q4_0 and q8_0 (a warning says how many).
    #[arg(long)]
    pub quant: Option<String>,
    /// Compress `.cawsf` shards (the file is then decompressed into memory on load).
    #[arg(long, value_enum, default_value = "none")]
    pub compress: Compress,
    /// Worker threads for quantizing (default: one per core).
    #[arg(long, default_value_t = 0, value_parser = super::parse_threads)]
    pub threads: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Decompose each layer's weight matrices with NDSQ (W = L + S + D + R, seed 000;
    /// `--format cawsf` only): lossy, see docs/benchmarks.md for its cost.
    #[arg(long)]
    pub ndsq: bool,
    /// NDSQ: rank of the low-rank part L.
    #[arg(long, default_value_t = 16, requires = "ndsq")]
    pub rank: usize,
    /// NDSQ: fraction of entries kept exactly as outliers (S).
    #[arg(long, default_value_t = 0.005, requires = "ndsq")]
    pub outlier_q: f64,
    /// NDSQ: values per product-quantisation vector of the residue R.
    #[arg(long, default_value_t = 8, requires = "ndsq")]
    pub pq_d: usize,
    /// NDSQ: codebooks (sub-vectors) per vector: R costs pq-m * log2(pq-k) / pq-d bits a weight.
    #[arg(long, default_value_t = 4, requires = "ndsq")]
    pub pq_m: usize,
    /// NDSQ: centroids per codebook (2 to 256).
    #[arg(long, default_value_t = 256, requires = "ndsq")]
    pub pq_k: usize,
    /// Store each layer's up and down projections as neuron-group bundles (a group's
    /// rows of up beside its columns of down, one read), for `--sparse-ffn` on serve,
    /// run, perplexity and bench. SwiGLU models only.
    #[arg(long = "sparse-ffn", conflicts_with = "ndsq")]
    pub sparse_ffn: bool,
    /// Neurons per bundle (default: the size nearest 128 KiB a bundle; a multiple of
    /// down's block that divides the FFN width).
    #[arg(long = "sparse-group", value_name = "NEURONS", requires = "sparse_ffn", value_parser = parse_sparse_group)]
    pub sparse_group: Option<usize>,
}

/// `--sparse-group`: at least one neuron. `0` is not a spelling of the default (which
/// leaving the flag out gives); the model's FFN width bounds it above when it converts.
fn parse_sparse_group(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("a group holds from 1 neuron up to the FFN width (leave the flag out for the default)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a number of neurons")),
    }
}

pub fn main(args: ConvertArgs) -> anyhow::Result<()> {
    let quant = args.quant.as_deref().map(convert_target).transpose().map_err(|e| anyhow::anyhow!("--quant: {e}"))?;
    if args.format == Format::Flat && args.compress != Compress::None {
        anyhow::bail!("--compress applies to --format cawsf only");
    }
    let target = match args.format {
        Format::Flat => Target::Flat,
        Format::Cawsf => Target::Cawsf(match args.compress {
            Compress::None => Compression::None,
            Compress::Zstd => Compression::Zstd,
            Compress::Lz4 => Compression::Lz4,
        }),
    };
    let src = crate::resolve::open(&args.src)?;
    let tty = std::io::stderr().is_terminal();
    let mut bar = |p: Progress| {
        if tty {
            let width = 30;
            let filled = width * p.done / p.total.max(1);
            eprint!(
                "\r[{}{}] {}/{} groups, {:.1} MB written",
                "#".repeat(filled),
                " ".repeat(width - filled),
                p.done,
                p.total,
                p.bytes as f64 / 1e6
            );
            let _ = std::io::stderr().flush();
        }
    };
    let ndsq = args.ndsq.then_some(crate::format::ndsq::NdsqParams {
        rank: args.rank,
        outlier_q: args.outlier_q,
        pq_d: args.pq_d,
        pq_m: args.pq_m,
        pq_k: args.pq_k,
    });
    let sparse_ffn = args.sparse_ffn.then_some(args.sparse_group.unwrap_or(0));
    let opts = ConvertOptions { target, quant, threads: args.threads, ndsq, sparse_ffn };
    let report = convert(src, &args.out, &opts, &mut bar)?;
    if tty {
        eprintln!();
    }
    if let Some(w) = quant.and_then(|q| report.shortfall.warning(q)) {
        eprintln!("warning: {w}");
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!(
            "{}: {} layers, {} tensors ({} converted), {:.1} MB read, {:.1} MB written",
            args.out.display(),
            report.layers,
            report.tensors,
            report.converted,
            report.bytes_in as f64 / 1e6,
            report.bytes_out as f64 / 1e6
        )?;
    }
    Ok(())
}
