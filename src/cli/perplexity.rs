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
    /// Print `{"tokens","ppl","nll_mean","logprobs","argmax"}` as JSON.
    #[arg(long)]
    pub json: bool,
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
}

/// Scores `tokens` with one causal pass (prompt chunks of [`PREFILL_CHUNK`]).
pub fn score(engine: &Engine, tokens: &[u32]) -> anyhow::Result<Perplexity> {
    if tokens.is_empty() {
        anyhow::bail!("no tokens to score");
    }
    let vocab = engine.model.config().vocab_size;
    let mut cache = engine.model.new_cache(tokens.len().max(engine.context_len))?;
    let (mut logprobs, mut argmax) = (Vec::new(), Vec::new());
    for (c, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
        let mut step = [SeqStep { tokens: chunk, cache: &mut cache, all_logits: true }];
        let logits = engine.model.forward(&mut step)?.pop().unwrap_or_default();
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let i = c * PREFILL_CHUNK + r;
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
    Ok(Perplexity { tokens: tokens.len(), ppl: nll_mean.exp(), nll_mean, logprobs, argmax })
}

pub fn main(args: PerplexityArgs) -> anyhow::Result<()> {
    let engine = Engine::load(&args.model, &args.run.to_options()?)?;
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
    let result = score(&engine, &tokens)?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("tokens {}  nll_mean {:.6}  ppl {:.4}", result.tokens, result.nll_mean, result.ppl);
    }
    Ok(())
}
