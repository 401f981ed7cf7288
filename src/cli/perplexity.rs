//! `strata perplexity`: the model's log-probabilities on a text or on token ids.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::RunOpts;
use super::outln;
use crate::engine::sampler::log_softmax;
use crate::engine::session::{Engine, PREFILL_CHUNK};
use crate::model::decoder::SeqStep;

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["file", "tokens_file"])))]
pub struct PerplexityArgs {
    /// Model SPEC: a `.gguf` or `.cawsf` file, a directory (Hugging Face safetensors with
    /// config.json, or a flat layer directory with manifest.json), a name in the store
    /// (`strata list`), or `strata-demo` (the built-in demo model).
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
    /// Compare with this model (the same options, but `--sparse-ffn off` and no
    /// `--route-budget`): report the KL divergence from it, top-1 agreement and mean
    /// |Δ log-prob| per position (`"against"` in the JSON). Give the model itself to
    /// measure what `--sparse-ffn` costs.
    #[arg(long, value_name = "MODEL")]
    pub reference: Option<String>,
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
    /// A sparse FFN's setting and the fraction of neuron groups it kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_ffn: Option<SparseRun>,
    /// Against `--reference`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<Against>,
}

/// What `--sparse-ffn` did over the run.
#[derive(Debug, serde::Serialize)]
pub struct SparseRun {
    pub setting: String,
    /// Neuron groups computed, of all there were (over positions and layers).
    pub kept_fraction: f64,
}

/// Per-position differences from a reference model, averaged over the scored positions.
#[derive(Debug, Default, serde::Serialize)]
pub struct Against {
    pub reference: String,
    pub reference_ppl: f64,
    /// KL(reference ‖ model), nats per position.
    pub kl_mean: f64,
    /// Positions whose most likely next token is the reference's.
    pub top1_agreement: f64,
    /// Mean |log p(next) − log p_reference(next)|.
    pub mean_abs_dlogprob: f64,
}

/// Scores `tokens` with one causal pass, `chunk` tokens per forward pass.
pub fn score(engine: &Engine, tokens: &[u32], chunk: usize) -> anyhow::Result<Perplexity> {
    score_against(engine, None, tokens, chunk)
}

/// Scores `tokens` as [`score`] does, and with a reference engine beside it (the same
/// chunks), compares each position's distribution with the reference's.
pub fn score_against(
    engine: &Engine,
    reference: Option<(&str, &Engine)>,
    tokens: &[u32],
    chunk: usize,
) -> anyhow::Result<Perplexity> {
    if tokens.len() < 2 {
        anyhow::bail!("no tokens to score: {} token(s), and scoring starts at the second", tokens.len());
    }
    let vocab = engine.model.config().vocab_size;
    if let Some((name, r)) = reference
        && r.model.config().vocab_size != vocab
    {
        anyhow::bail!("--reference {name}: a vocabulary of {} against {vocab}", r.model.config().vocab_size);
    }
    // A text longer than the context is scored in windows of the context's length, each
    // from an empty cache (positions past the context are ones the model never saw); the
    // last row of a window still predicts the next window's first token.
    let window = engine.context_len.max(1);
    let (mut logprobs, mut argmax) = (Vec::new(), Vec::new());
    let (mut ref_logprobs, mut kl, mut agree) = (Vec::new(), 0f64, 0usize);
    let before = engine.model.scheduler().stats().snapshot();
    let size = chunk.max(1);
    let argmax_of = |row: &[f32]| row.iter().enumerate().fold(0, |b, (j, &v)| if v > row[b] { j } else { b });
    let chunks = tokens.chunks(window).enumerate().flat_map(|(w, part)| {
        part.chunks(size).enumerate().map(move |(c, chunk)| (w * window + c * size, c == 0, chunk))
    });
    let capacity = tokens.len().min(window);
    let mut cache = engine.model.new_cache(capacity)?;
    let mut ref_cache = reference.map(|(_, r)| r.model.new_cache(capacity)).transpose()?;
    for (start, fresh, chunk) in chunks {
        if fresh && start > 0 {
            cache = engine.model.new_cache(capacity)?;
            ref_cache = reference.map(|(_, r)| r.model.new_cache(capacity)).transpose()?;
        }
        let mut step = [SeqStep { tokens: chunk, cache: &mut cache, all_logits: true, verify: false }];
        let logits = engine.model.forward(&mut step)?.pop().unwrap_or_default();
        let ref_logits = match (reference, ref_cache.as_mut()) {
            (Some((_, r)), Some(rc)) => {
                let mut step = [SeqStep { tokens: chunk, cache: rc, all_logits: true, verify: false }];
                Some(r.model.forward(&mut step)?.pop().unwrap_or_default())
            }
            _ => None,
        };
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let i = start + r;
            let best = argmax_of(row);
            argmax.push(best as u32);
            let lp = log_softmax(row);
            if let Some(&next) = tokens.get(i + 1) {
                logprobs.push(lp[next as usize] as f64);
            }
            if let Some(all) = &ref_logits {
                let rrow = &all[r * vocab..(r + 1) * vocab];
                agree += usize::from(argmax_of(rrow) == best);
                let rlp = log_softmax(rrow);
                kl += rlp.iter().zip(&lp).map(|(&q, &p)| (q as f64).exp() * (q as f64 - p as f64)).sum::<f64>();
                if let Some(&next) = tokens.get(i + 1) {
                    ref_logprobs.push(rlp[next as usize] as f64);
                }
            }
        }
    }
    let nll = |lp: &[f64]| match lp.len() {
        0 => 0.0,
        n => -lp.iter().sum::<f64>() / n as f64,
    };
    let nll_mean = nll(&logprobs);
    let against = reference.map(|(name, _)| Against {
        reference: name.to_string(),
        reference_ppl: nll(&ref_logprobs).exp(),
        kl_mean: kl / tokens.len() as f64,
        top1_agreement: agree as f64 / tokens.len() as f64,
        mean_abs_dlogprob: logprobs.iter().zip(&ref_logprobs).map(|(a, b)| (a - b).abs()).sum::<f64>()
            / logprobs.len().max(1) as f64,
    });
    let ran = engine.model.scheduler().stats().snapshot() - before;
    let summary = engine.model.scheduler().summary();
    let sparse_ffn = (ran.neuron_groups_total > 0).then(|| SparseRun {
        setting: engine.sparse_ffn.to_string(),
        kept_fraction: ran.neuron_groups_kept as f64 / ran.neuron_groups_total as f64,
    });
    let experts = summary.experts;
    Ok(Perplexity {
        tokens: tokens.len(),
        ppl: nll_mean.exp(),
        nll_mean,
        logprobs,
        argmax,
        experts,
        route: None,
        sparse_ffn,
        against,
    })
}

pub fn main(args: PerplexityArgs) -> anyhow::Result<()> {
    let opts = args.run.to_options()?;
    let (engine, route) = match args.route_budget {
        None => (crate::resolve::load(&args.model, &opts)?, None),
        Some(budget) => {
            let mut source = crate::resolve::open(&args.model)?;
            let prompt = match (&args.route_prompt, &args.file) {
                (Some(p), _) => p.clone(),
                (None, Some(path)) => {
                    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
                }
                (None, None) => anyhow::bail!("--route-budget routes by the text: give --file or --route-prompt"),
            };
            let ids = super::route::prompt_ids(&source, &prompt)?;
            let summary = crate::format::route::apply_budget(&mut source, &ids, budget)?;
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
    let reference = match &args.reference {
        Some(spec) => {
            let opts = crate::engine::session::RunOptions { sparse_ffn: Default::default(), ..opts.clone() };
            Some(crate::resolve::load(spec, &opts).with_context(|| format!("--reference {spec}"))?)
        }
        None => None,
    };
    let reference = args.reference.as_deref().zip(reference.as_ref());
    let result = Perplexity { route, ..score_against(&engine, reference, &tokens, chunk)? };
    if args.json {
        outln!("{}", serde_json::to_string(&result)?)?;
    } else {
        outln!("tokens {}  nll_mean {:.6}  ppl {:.4}", result.tokens, result.nll_mean, result.ppl)?;
        if let Some(s) = &result.sparse_ffn {
            outln!("sparse-ffn {}  kept {:.3} of the neuron groups", s.setting, s.kept_fraction)?;
        }
        if let Some(a) = &result.against {
            outln!(
                "against {}: ppl {:.4}  KL {:.5}  top-1 agreement {:.4}  mean |Δ log-prob| {:.5}",
                a.reference,
                a.reference_ppl,
                a.kl_mean,
                a.top1_agreement,
                a.mean_abs_dlogprob
            )?;
        }
    }
    Ok(())
}
