//! `strata perplexity`: the model's log-probabilities on a text or on token ids.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::RunOpts;
use crate::engine::sampler::log_softmax;
use crate::engine::session::{Engine, PREFILL_CHUNK};
use crate::model::decoder::SeqStep;

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["file", "tokens_file"])))]
pub struct PerplexityArgs {
    /// Model: a Hugging Face directory or `strata-demo`.
    pub model: String,
    /// A UTF-8 text file, tokenized with the model's tokenizer (special tokens added).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// A JSON array of token ids.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Print `{"tokens","ppl","nll_mean","logprobs","argmax"}` as JSON (and, for a
    /// mixture-of-experts model, `"experts"`: the expert cache's summary and hits).
    #[arg(long)]
    pub json: bool,
    /// Tokens per forward pass (default: prefill chunks); `1` feeds the text token by
    /// token as decoding does, which is what an expert cache sees when serving.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub chunk: Option<u64>,
    /// For an NDSQ .cawsf model: load only the R shards that rank best
    /// for the text (`strata route`) within this many bytes, or a percentage such as
    /// `50%` (see `strata run --route-budget`). Needs `--file`.
    #[arg(long = "route-budget", value_name = "SIZE", value_parser = crate::format::route::Budget::parse)]
    pub route_budget: Option<crate::format::route::Budget>,
    /// Route by this text instead of the scored one (a control for `--route-budget`).
    #[arg(long = "route-prompt", requires = "route_budget")]
    pub route_prompt: Option<String>,
    #[command(flatten)]
    pub run: RunOpts,
}

/// Per-position results: `logprobs[i]` = log p(tokens[i+1] | tokens[..=i]) and
/// `argmax[i]` = the most likely token after tokens[..=i].
#[derive(Debug, serde::Serialize)]
pub struct Perplexity {
    pub tokens: usize,
    pub ppl: f64,
    pub nll_mean: f64,
    pub logprobs: Vec<f64>,
    pub argmax: Vec<u32>,
    /// A MoE model's expert cache after the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<crate::sched::experts::ExpertSummary>,
    /// What `--route-budget` kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<crate::format::route::RouteSummary>,
}

/// Scores `tokens` with one causal pass, `chunk` tokens per forward pass.
pub fn score(engine: &Engine, tokens: &[u32], chunk: usize) -> anyhow::Result<Perplexity> {
    if tokens.is_empty() {
        anyhow::bail!("no tokens to score");
    }
    let vocab = engine.model.config().vocab_size;
    let mut cache = engine.model.new_cache(tokens.len().max(engine.context_len))?;
    let (mut logprobs, mut argmax) = (Vec::new(), Vec::new());
    let size = chunk.max(1);
    for (c, chunk) in tokens.chunks(size).enumerate() {
        let mut step = [SeqStep { tokens: chunk, cache: &mut cache, all_logits: true }];
        let logits = engine.model.forward(&mut step)?.pop().unwrap_or_default();
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let i = c * size + r;
            let best = row.iter().enumerate().fold(0, |b, (j, &v)| if v > row[b] { j } else { b });
            argmax.push(best as u32);
            if let Some(&next) = tokens.get(i + 1) {
                logprobs.push(log_softmax(row)[next as usize] as f64);
            }
        }
    }
    let nll_mean = match logprobs.len() {
        0 => 0.0,
        n => -logprobs.iter().sum::<f64>() / n as f64,
    };
    let experts = engine.model.scheduler().summary().experts;
    Ok(Perplexity { tokens: tokens.len(), ppl: nll_mean.exp(), nll_mean, logprobs, argmax, experts, route: None })
}

pub fn main(args: PerplexityArgs) -> anyhow::Result<()> {
    let opts = args.run.to_options()?;
    let (engine, route) = match args.route_budget {
        None => (Engine::load(&args.model, &opts)?, None),
        Some(budget) => {
            let mut source = crate::model::ModelSource::from_spec(&args.model)?;
            let prompt = match (&args.route_prompt, &args.file) {
                (Some(p), _) => p.clone(),
                (None, Some(path)) => {
                    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
                }
                (None, None) => anyhow::bail!("--route-budget routes by the text: give --file or --route-prompt"),
            };
            let summary = crate::format::route::apply_budget(&mut source, &prompt, budget)?;
            (Engine::from_source(source, &opts)?, Some(summary))
        }
    };
    let tokens: Vec<u32> = match (&args.file, &args.tokens_file) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            engine.tokenizer.encode(&text, true)?
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{}: expected a JSON array of token ids", path.display()))?
        }
        (None, None) => unreachable!("clap requires one input"),
    };
    let chunk = args.chunk.map_or(PREFILL_CHUNK, |c| c.min(usize::MAX as u64) as usize);
    let result = Perplexity { route, ..score(&engine, &tokens, chunk)? };
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("tokens {}  nll_mean {:.6}  ppl {:.4}", result.tokens, result.nll_mean, result.ppl);
    }
    Ok(())
}
