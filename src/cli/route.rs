//! `strata route`: ranks an NDSQ `.cawsf` file's shards against a prompt (seed 000's
//! router; `format::route` says how keys are made).

use clap::Args;

use super::outln;
use crate::engine::tokenizer::TextTokenizer;
use crate::format::route::{Budget, routing_key, select};
use crate::model::ModelSource;

#[derive(Args, Debug)]
pub struct RouteArgs {
    /// An NDSQ `.cawsf` model (`strata convert --format cawsf --ndsq`).
    pub model: String,
    /// The prompt to rank shards for.
    #[arg(short, long)]
    pub prompt: String,
    /// Keep shards in rank order while they fit in this many bytes (with
    /// K/M/G/KiB/MiB/GiB, or a percentage of the ranked shards' bytes such as `50%`).
    #[arg(long, value_parser = Budget::parse)]
    pub budget: Option<Budget>,
    /// Rank only these components (`L`, `S`, `D`, `R`; comma-separated). Default: all.
    #[arg(long, value_delimiter = ',', value_parser = ["L", "S", "D", "R"])]
    pub components: Vec<String>,
    /// Show this many shards of the ranking (0: all).
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Print the summary and the whole ranking as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `prompt`'s tokens as `source`'s tokenizer encodes it without special tokens: what
/// [`routing_key`] and `--route-budget` route by.
pub fn prompt_ids(source: &ModelSource, prompt: &str) -> anyhow::Result<Vec<u32>> {
    Ok(TextTokenizer::for_model(source)?.encode(prompt, false)?)
}

pub fn main(args: RouteArgs) -> anyhow::Result<()> {
    let source = crate::resolve::open(&args.model)?;
    let Some(routing) = source.routing.clone() else {
        anyhow::bail!("{}: no ROUTING section (NDSQ .cawsf files have one: strata convert --ndsq)", args.model);
    };
    let key = routing_key(&source, &routing, &prompt_ids(&source, &args.prompt)?)?;
    let components: Vec<&str> = args.components.iter().map(String::as_str).collect();
    let sel = select(&routing, &key, &components, args.budget);
    if args.json {
        outln!("{}", serde_json::to_string(&sel)?)?;
        return Ok(());
    }
    outln!("{:>5} {:>6} {:>4} {:>5} {:>10} {:>8}  tensor", "rank", "shard", "part", "layer", "bytes", "score")?;
    let shown = match args.top {
        0 => sel.shards.len(),
        n => n.min(sel.shards.len()),
    };
    for r in &sel.shards[..shown] {
        let mark = if r.kept { "" } else { "  (over budget)" };
        outln!(
            "{:>5} {:>6} {:>4} {:>5} {:>10} {:>8.5}  {}{mark}",
            r.rank,
            r.entry.shard,
            r.entry.component,
            r.entry.layer,
            r.entry.cost,
            r.score,
            r.entry.tensor
        )?;
    }
    let s = &sel.summary;
    let budget = s.budget_bytes.map_or_else(|| "no budget".to_string(), |b| format!("budget {b} bytes"));
    outln!("kept {} of {} shards, {} of {} bytes ({budget})", s.kept, s.candidates, s.kept_bytes, s.candidate_bytes)?;
    Ok(())
}
