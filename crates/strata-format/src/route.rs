//! Seed 000's semantic router over an NDSQ `.cawsf` file's ROUTING section: each NDSQ
//! shard has a key in the model's hidden space and a cost (its stored bytes); a prompt
//! has a key in the same space; shards rank by how well the two align.
//!
//! - A shard's key is the dominant singular vector of the component it decodes to, on
//!   the side of the matrix whose length is the hidden size ([`Ndsq::component_keys`]):
//!   the input direction the component amplifies most (output direction for matrices
//!   whose input is not the hidden state, such as `down_proj`).
//! - The prompt's key is the mean of its tokens' input embeddings (the vectors the first
//!   layer reads), unit length.
//! - The score is `|cos|`, since a singular vector's sign is arbitrary; ties rank by
//!   shard number, so a ranking is deterministic.
//!
//! The seed derives prompt keys from a hashed bag of words; keys from the model's own
//! embedding and weights are at least in the same space as what the weights act on.
//! Whether that predicts which shards matter is measured, not assumed
//! (docs/benchmarks.md, "NDSQ routing").
//!
//! [`Ndsq::component_keys`]: crate::ndsq::Ndsq::component_keys

use anyhow::{Context, bail};
use serde::Serialize;

use std::collections::HashSet;

use crate::Checkpoint;
pub use crate::cawsf::RoutingTable;
use crate::cawsf::{RouteEntry, Routing, normalise};
use strata_quant::ReadF32;

/// Greedy selection in rank order: each entry whose cost still fits in `budget` is
/// taken, the others skipped (so a lower-ranked shard never displaces a higher one, and
/// the total never exceeds the budget).
pub fn within_budget(ranked: &[(usize, f32)], costs: &[f32], budget: u64) -> Vec<usize> {
    let mut left = budget as f64;
    let mut out = Vec::new();
    for &(i, _) in ranked {
        let c = f64::from(costs[i]);
        if c <= left {
            left -= c;
            out.push(i);
        }
    }
    out
}

/// The prompt's key: the mean of its tokens' input embeddings, unit length. `ids` are
/// the prompt's tokens, as the model's tokenizer encodes it (without special tokens).
pub fn prompt_key(source: &Checkpoint, ids: &[u32]) -> anyhow::Result<Vec<f32>> {
    if ids.is_empty() {
        bail!("the prompt has no tokens to route by");
    }
    let emb = source.tensors.get("model.embed_tokens.weight").context("the model has no input embedding")?;
    let [vocab, hidden] = emb.shape[..] else { bail!("the input embedding is not a matrix: {:?}", emb.shape) };
    let mut key = vec![0.0f32; hidden];
    let mut row = vec![0.0f32; hidden];
    for &id in ids {
        let id = id as usize;
        if id >= vocab {
            bail!("token {id} is outside the embedding's {vocab} rows");
        }
        emb.read_f32(id * hidden, &mut row);
        key.iter_mut().zip(&row).for_each(|(k, x)| *k += x);
    }
    normalise(&mut key);
    Ok(key)
}

/// Components that `--route-budget` may leave out: R, the residue, most of the bytes.
/// L and D always load, and so does S: the outliers are the largest entries in few
/// bytes, so leaving one out costs much and saves little.
pub const OPTIONAL: [&str; 1] = ["R"];

/// How many candidate shards there were and how many a budget kept.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteSummary {
    pub candidates: usize,
    pub candidate_bytes: u64,
    pub budget_bytes: Option<u64>,
    pub kept: usize,
    pub kept_bytes: u64,
}

/// One ranked shard.
#[derive(Clone, Debug, Serialize)]
pub struct Ranked {
    pub rank: usize,
    #[serde(flatten)]
    pub entry: RouteEntry,
    pub score: f32,
    pub kept: bool,
}

/// A ranking of a file's routed shards of some components, and what a budget keeps.
#[derive(Clone, Debug, Serialize)]
pub struct Selection {
    #[serde(flatten)]
    pub summary: RouteSummary,
    pub shards: Vec<Ranked>,
}

/// Ranks the shards of `components` (all when empty) against `key`, keeping those
/// that fit `budget` in rank order ([`within_budget`]; all without a budget).
pub fn select(routing: &Routing, key: &[f32], components: &[&str], budget: Option<Budget>) -> Selection {
    let t = &routing.table;
    let wanted = |i: usize| components.is_empty() || components.contains(&routing.entries[i].component);
    let ranked: Vec<(usize, f32)> = t.rank(key).into_iter().filter(|&(i, _)| wanted(i)).collect();
    let total: u64 = ranked.iter().map(|&(i, _)| routing.entries[i].cost).sum();
    let budget_bytes = budget.map(|b| b.bytes(total as f64));
    let kept: HashSet<usize> = match budget_bytes {
        Some(b) => within_budget(&ranked, &t.costs, b).into_iter().collect(),
        None => ranked.iter().map(|&(i, _)| i).collect(),
    };
    let shards: Vec<Ranked> = ranked
        .iter()
        .enumerate()
        .map(|(rank, &(i, score))| Ranked {
            rank: rank + 1,
            entry: routing.entries[i].clone(),
            score,
            kept: kept.contains(&i),
        })
        .collect();
    let kept_bytes = shards.iter().filter(|r| r.kept).map(|r| r.entry.cost).sum();
    let summary =
        RouteSummary { candidates: shards.len(), candidate_bytes: total, budget_bytes, kept: kept.len(), kept_bytes };
    Selection { summary, shards }
}

/// The prompt's key ([`prompt_key`] of its token `ids`), checked against the ROUTING
/// section's key space.
pub fn routing_key(source: &Checkpoint, routing: &Routing, ids: &[u32]) -> anyhow::Result<Vec<f32>> {
    let key = prompt_key(source, ids)?;
    if key.len() != routing.table.dim {
        bail!("the ROUTING keys have {} values, the model's embedding {}", routing.table.dim, key.len());
    }
    Ok(key)
}

/// `--route-budget`: ranks `source`'s optional NDSQ shards ([`OPTIONAL`]) against the
/// prompt (its token `ids`) and rebuilds its tensors without those beyond `budget`.
pub fn apply_budget(source: &mut Checkpoint, ids: &[u32], budget: Budget) -> anyhow::Result<RouteSummary> {
    let routing = source.routing.clone().with_context(|| {
        format!(
            "model `{}` has no ROUTING section: --route-budget needs an NDSQ .cawsf model (strata convert --ndsq)",
            source.name
        )
    })?;
    let key = routing_key(source, &routing, ids)?;
    let sel = select(&routing, &key, &OPTIONAL, Some(budget));
    let drop: HashSet<u32> = sel.shards.iter().filter(|r| !r.kept).map(|r| r.entry.shard).collect();
    routing.drop_shards(source, &drop)?;
    tracing::info!(
        kept = sel.summary.kept,
        candidates = sel.summary.candidates,
        kept_bytes = sel.summary.kept_bytes,
        candidate_bytes = sel.summary.candidate_bytes,
        "route budget: NDSQ R shards kept"
    );
    Ok(sel.summary)
}

/// A size as `route` and `--route-budget` take it: bytes (with K/M/G/KiB/MiB/GiB) or a
/// percentage of the candidates' total cost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Budget {
    Bytes(u64),
    Percent(f64),
}

impl Budget {
    pub fn parse(s: &str) -> Result<Budget, String> {
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| format!("`{s}` is not a percentage"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!("`{s}`: a percentage between 0 and 100"));
            }
            return Ok(Budget::Percent(p));
        }
        strata_tensor::sizes::parse_size(s).map(Budget::Bytes)
    }

    /// Bytes out of `total`.
    pub fn bytes(self, total: f64) -> u64 {
        match self {
            Budget::Bytes(b) => b,
            Budget::Percent(p) => (total * p / 100.0).floor() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RoutingTable {
        let mut keys = vec![1.0, 0.0, 0.0, 1.0, 3.0, 4.0, 0.0, 0.0];
        keys.chunks_exact_mut(2).for_each(normalise);
        RoutingTable { dim: 2, shards: vec![3, 5, 9, 12], costs: vec![100.0, 50.0, 80.0, 10.0], keys }
    }

    #[test]
    fn the_section_round_trips_and_refuses_damage() {
        let t = table();
        let b = t.encode();
        assert_eq!(RoutingTable::parse(&b).unwrap(), t);
        assert!(RoutingTable::parse(&b[..b.len() - 1]).is_err());
        let mut bad = b.clone();
        bad[6..10].copy_from_slice(&7u32.to_le_bytes()); // 7 then 5: not increasing
        assert!(RoutingTable::parse(&bad).unwrap_err().to_string().contains("increasing"));
        let mut bad = b.clone();
        let cost_at = 6 + 4 * 4;
        bad[cost_at..cost_at + 4].copy_from_slice(&(-1.0f32).to_le_bytes());
        assert!(RoutingTable::parse(&bad).unwrap_err().to_string().contains("cost -1"));
        let mut bad = b;
        let key_at = 6 + 8 * 4;
        bad[key_at..key_at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(RoutingTable::parse(&bad).unwrap_err().to_string().contains("not finite"));
    }

    #[test]
    fn ranking_is_by_absolute_cosine_then_shard_and_the_budget_holds() {
        let t = table();
        // Against (0.6, -0.8): |cos| is 0.6, 0.8, 0.28 (3,4 · 0.6,-0.8 = -0.28), 0.
        let ranked = t.rank(&[0.6, -0.8]);
        let order: Vec<u32> = ranked.iter().map(|&(i, _)| t.shards[i]).collect();
        assert_eq!(order, [5, 3, 9, 12]);
        // Equal scores rank by shard number.
        let ranked = t.rank(&[0.0, 0.0]);
        assert_eq!(ranked.iter().map(|&(i, _)| t.shards[i]).collect::<Vec<_>>(), [3, 5, 9, 12]);
        // 135 bytes: shard 5 (50) fits, shard 3 (100) not after it, shard 9 (80) does,
        // then shard 12 (10) not in the 5 left.
        let ranked = t.rank(&[0.6, -0.8]);
        let got = within_budget(&ranked, &t.costs, 135);
        assert_eq!(got.iter().map(|&i| t.shards[i]).collect::<Vec<_>>(), [5, 9]);
        let got = within_budget(&ranked, &t.costs, 140);
        assert_eq!(got.iter().map(|&i| t.shards[i]).collect::<Vec<_>>(), [5, 9, 12]);
        assert_eq!(within_budget(&ranked, &t.costs, 0), Vec::<usize>::new());
        assert_eq!(within_budget(&ranked, &t.costs, 240).len(), 4);
    }

    #[test]
    fn budgets_parse_as_sizes_or_percentages() {
        assert_eq!(Budget::parse("2MiB"), Ok(Budget::Bytes(2 << 20)));
        assert_eq!(Budget::parse("25%"), Ok(Budget::Percent(25.0)));
        assert_eq!(Budget::Percent(25.0).bytes(1000.0), 250);
        assert!(Budget::parse("120%").is_err());
        assert!(Budget::parse("lots").is_err());
    }
}
