//! What one step runs (DESIGN.md §5b), planned from what each sequence needs and the
//! step's budget, as vLLM's chunked-prefill scheduler budgets a step's tokens: decode
//! rows first, then slices of the prompts, shortest remaining first.
//!
//! A step's time on the CPU grows with its rows, and every sequence that decodes waits
//! for the whole step: while one does (or a prompt is about to give its first token),
//! the step is kept to [`StepBudget::waiting`] rows, so that a long prompt advances in
//! slices between their tokens instead of holding each of them behind a whole chunk.
//! A prompt alone runs whole chunks, at full speed.

use strata_model::config::ModelConfig;

/// Rows a step runs while a sequence waits on it (see [`StepBudget::waiting`]): an
/// eighth of the default prefill chunk. SmolLM2-135M on 2 EPYC cores runs 64 rows in
/// about 0.11 s, against about 5 ms for a decode step alone (docs/benchmarks.md).
pub const WAITING_STEP_TOKENS: usize = 64;

/// The rows one step may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBudget {
    /// Prompt tokens a step runs when no sequence waits on it; where the backend's rows
    /// depend on how a prompt is cut, the chunks every prompt is cut into.
    pub prefill_chunk: usize,
    /// The step's cost while a sequence waits on it (one decodes, or a prompt ends in
    /// this step), in rows at position 0 (see [`attention_break_even`](Self::attention_break_even)).
    pub waiting: usize,
    /// Whether a prompt keeps its chunks whatever else runs (the backend's rows depend
    /// on the cut: [`Backend::chunking_changes_rows`](strata_backend::Backend::chunking_changes_rows)):
    /// then the budget only chooses which chunks run.
    pub fixed_chunks: bool,
    /// Positions of attention that cost as much as one row's matmuls: a row at position
    /// `p` costs `1 + p / attention_break_even` rows at position 0.
    pub attention_break_even: usize,
}

impl StepBudget {
    /// The budget for `config`'s model with prompts cut into `prefill_chunk` tokens, on
    /// a backend whose rows depend on the cut when `backend_fixed`. A mixture-of-experts
    /// layer (or a sparse FFN's neuron groups) runs each expert's rows of a sequence by
    /// their count, and one row takes the decode kernel: its prompts keep their chunks
    /// too, since another cut routes other rows together.
    pub fn new(config: &ModelConfig, prefill_chunk: usize, backend_fixed: bool) -> Self {
        StepBudget {
            prefill_chunk: prefill_chunk.max(1),
            waiting: WAITING_STEP_TOKENS.min(prefill_chunk.max(1)),
            fixed_chunks: backend_fixed || config.moe.is_some() || config.neuron_group.is_some(),
            attention_break_even: attention_break_even(config),
        }
    }

    /// What `n` rows from position `at` cost, in rows at position 0.
    fn cost(&self, at: usize, n: usize) -> u64 {
        let (at, n, k) = (at as u64, n as u64, self.attention_break_even.max(1) as u64);
        n + (n * at + n * n.saturating_sub(1) / 2) / k
    }

    /// The most rows, up to `most`, from position `at` that cost no more than `room`.
    fn rows_within(&self, at: usize, most: usize, room: u64) -> usize {
        let (mut lo, mut hi) = (0, most);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.cost(at, mid) <= room { lo = mid } else { hi = mid - 1 }
        }
        lo
    }
}

/// Positions of attention whose multiply-adds match one row's matmuls (q, k, v, o and
/// the gated FFN, per layer, against a query's dot products and weighted sum over one
/// cached position), halved: on the CPU attention's multiply-adds run at about half the
/// GEMM's rate (SmolLM2-135M on 2 EPYC cores: a 512-token chunk at position 7,000 takes
/// about 5× what the first one takes; the formula gives 1,536 here, the chunk times
/// about 1,500).
pub fn attention_break_even(config: &ModelConfig) -> usize {
    let (h, q, kv) = (config.hidden_size, config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim);
    let weights = h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size;
    match 2 * q {
        0 => usize::MAX,
        attention => (weights / attention / 2).max(1),
    }
}

/// What a sequence asks of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing (finished, or waiting for its sampled token to come out).
    Nothing,
    /// Its last sampled token, at position `at`.
    Decode { at: usize },
    /// The rest of its prompt: `left` tokens from position `at`.
    Prompt { at: usize, left: usize },
}

/// What one step feeds a sequence: a prompt slice (`true` when it ends the prompt) or
/// its last sampled token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    Prompt { n: usize, last: bool },
    Decode,
}

/// Never one row of a longer prompt, nor a last slice of one row: one row takes the
/// decode kernel, which computes other values than a prompt's rows.
fn whole_rows(n: usize, left: usize) -> usize {
    let n = n.clamp(left.min(2), left);
    match left - n {
        1 if n > 2 => n - 1,
        1 => left,
        _ => n,
    }
}

/// What each sequence runs this step, by `needs`' order: every decoding one its token;
/// the prompts, shortest remaining first, as many rows as the budget leaves.
///
/// While a sequence waits on the step (one decodes, or the shortest prompt ends within
/// `budget.waiting` tokens), the step costs about `budget.waiting` rows: decodes first,
/// then prompt slices cut to what is left (at least a quarter of it each step, so that
/// prompts advance however many decode). Otherwise prompts run `prefill_chunk` tokens
/// in all. Where prompts keep their chunks (`fixed_chunks`), each runs its next whole
/// chunk or waits, and the first always runs.
pub fn plan(needs: &[Need], budget: &StepBudget) -> Vec<Option<Feed>> {
    let chunk = budget.prefill_chunk.max(1);
    let mut feeds: Vec<Option<Feed>> =
        needs.iter().map(|n| matches!(n, Need::Decode { .. }).then_some(Feed::Decode)).collect();
    let mut prompts: Vec<(usize, usize, usize)> = needs
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match *n {
            Need::Prompt { at, left } if left > 0 => Some((i, at, left)),
            _ => None,
        })
        .collect();
    prompts.sort_by_key(|&(_, _, left)| left);
    let decoding: Vec<usize> = needs
        .iter()
        .filter_map(|n| match *n {
            Need::Decode { at } => Some(at),
            _ => None,
        })
        .collect();
    let waiting = !decoding.is_empty() || prompts.first().is_some_and(|&(_, _, left)| left <= budget.waiting);
    let mut feed = |i: usize, n: usize, left: usize| feeds[i] = Some(Feed::Prompt { n, last: n == left });
    if budget.fixed_chunks {
        let mut room = chunk;
        for (i, _, left) in prompts {
            let n = whole_rows(left.min(chunk), left);
            if n > room && room < chunk {
                continue;
            }
            feed(i, n, left);
            room = room.saturating_sub(n);
        }
    } else if waiting {
        let whole = budget.waiting as u64;
        let decodes: u64 = decoding.iter().map(|&at| budget.cost(at, 1)).sum();
        let mut room = whole.saturating_sub(decodes).max(whole / 4);
        for (i, at, left) in prompts {
            let n = budget.rows_within(at, left.min(chunk), room);
            if n == 0 {
                break;
            }
            let n = whole_rows(n, left);
            feed(i, n, left);
            room = room.saturating_sub(budget.cost(at, n));
        }
    } else {
        let mut room = chunk;
        for (i, _, left) in prompts {
            if room == 0 {
                break;
            }
            let n = whole_rows(left.min(room), left);
            feed(i, n, left);
            room = room.saturating_sub(n);
        }
    }
    feeds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs counted in rows (attention free), chunks of 512, 64 rows while waited on.
    fn flat(fixed_chunks: bool) -> StepBudget {
        StepBudget { prefill_chunk: 512, waiting: 64, fixed_chunks, attention_break_even: usize::MAX }
    }

    fn rows(feeds: &[Option<Feed>]) -> Vec<usize> {
        feeds
            .iter()
            .map(|f| match f {
                None => 0,
                Some(Feed::Decode) => 1,
                Some(Feed::Prompt { n, .. }) => *n,
            })
            .collect()
    }

    #[test]
    fn a_prompt_alone_runs_whole_chunks() {
        let feeds = plan(&[Need::Prompt { at: 0, left: 8000 }], &flat(false));
        assert_eq!(feeds, [Some(Feed::Prompt { n: 512, last: false })]);
        let feeds = plan(&[Need::Prompt { at: 7680, left: 320 }], &flat(false));
        assert_eq!(feeds, [Some(Feed::Prompt { n: 320, last: true })]);
    }

    #[test]
    fn beside_a_decode_a_long_prompt_runs_a_slice() {
        let needs = [Need::Decode { at: 40 }, Need::Prompt { at: 512, left: 7488 }];
        assert_eq!(rows(&plan(&needs, &flat(false))), [1, 63]);
        // Four decoding: the prompt gets what they leave.
        let needs = [Need::Decode { at: 40 }; 4].into_iter().chain([Need::Prompt { at: 512, left: 7488 }]);
        assert_eq!(rows(&plan(&needs.collect::<Vec<_>>(), &flat(false))), [1, 1, 1, 1, 60]);
        // However many decode, a prompt still advances by a quarter of the budget.
        let needs = [Need::Decode { at: 40 }; 100].into_iter().chain([Need::Prompt { at: 512, left: 7488 }]);
        assert_eq!(rows(&plan(&needs.collect::<Vec<_>>(), &flat(false)))[100], 16);
    }

    #[test]
    fn a_short_prompt_runs_first_and_the_long_one_fills_the_step() {
        let needs = [Need::Prompt { at: 512, left: 7488 }, Need::Prompt { at: 0, left: 42 }];
        let feeds = plan(&needs, &flat(false));
        assert_eq!(feeds, [Some(Feed::Prompt { n: 22, last: false }), Some(Feed::Prompt { n: 42, last: true })]);
        // A prompt longer than the waiting budget does not make the step wait: both run
        // up to a chunk in all.
        let needs = [Need::Prompt { at: 512, left: 7488 }, Need::Prompt { at: 0, left: 300 }];
        assert_eq!(rows(&plan(&needs, &flat(false))), [212, 300]);
    }

    #[test]
    fn rows_far_into_a_prompt_cost_more() {
        // Attention over 1,536 positions costs as much as a row's matmuls.
        let budget = StepBudget { attention_break_even: 1536, ..flat(false) };
        let at = |at| rows(&plan(&[Need::Decode { at: 40 }, Need::Prompt { at, left: 100_000 }], &budget))[1];
        assert_eq!((at(0), at(1536), at(6144)), (62, 31, 12));
        // The decode itself counts: one at 6,144 positions costs five rows.
        let needs = [Need::Decode { at: 6144 }, Need::Prompt { at: 0, left: 8000 }];
        assert_eq!(rows(&plan(&needs, &budget)), [1, 58]);
    }

    #[test]
    fn no_slice_of_one_row_and_none_leaves_one() {
        // 63 rows fit; the prompt has 64 left: 62 run, then the last 2.
        let needs = [Need::Decode { at: 40 }, Need::Prompt { at: 0, left: 64 }];
        assert_eq!(rows(&plan(&needs, &flat(false))), [1, 62]);
        // A prompt of one token runs its one row.
        assert_eq!(rows(&plan(&[Need::Prompt { at: 0, left: 1 }], &flat(false))), [1]);
        // The whole budget gone, a 3-token prompt still runs whole (never 1 + 2).
        let needs = [Need::Decode { at: 0 }; 100].into_iter().chain([Need::Prompt { at: 0, left: 3 }]);
        let budget = StepBudget { waiting: 4, ..flat(false) };
        assert_eq!(rows(&plan(&needs.collect::<Vec<_>>(), &budget))[100], 3);
    }

    #[test]
    fn fixed_chunks_run_whole_or_wait() {
        let needs = [Need::Decode { at: 40 }, Need::Prompt { at: 512, left: 7488 }, Need::Prompt { at: 0, left: 42 }];
        // The short prompt runs; the long one's chunk does not fit beside it and waits.
        assert_eq!(rows(&plan(&needs, &flat(true))), [1, 0, 42]);
        // Alone beside a decode, the long one runs its whole chunk.
        assert_eq!(rows(&plan(&needs[..2], &flat(true))), [1, 512]);
    }

    #[test]
    fn finished_and_waiting_sequences_run_nothing() {
        let needs = [Need::Nothing, Need::Prompt { at: 0, left: 0 }];
        assert_eq!(plan(&needs, &flat(false)), [None, None]);
    }

    #[test]
    fn smollm2s_break_even() {
        // SmolLM2-135M: 576 wide, 9 heads of 64 (3 for keys and values), FFN 1,536.
        let config = ModelConfig::from_json(
            r#"{"model_type":"llama","hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
               "num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152}"#,
        )
        .unwrap();
        assert_eq!(attention_break_even(&config), 1536);
    }
}
