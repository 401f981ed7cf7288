//! `strata bench`: prefill and decode speed, next to the memory-bandwidth roofline
//! measured in the same run.

use std::time::Instant;

use clap::Args;

use super::outln;
use super::{DraftOpts, RunOpts};
use crate::backend::cpu::bandwidth;
use crate::draft::{SpeculationStatus, SpeculationView};
use crate::engine::batch::{self, Sequence};
use crate::engine::sampler::SamplingParams;
use crate::engine::session::{Engine, GenerateRequest, PREFILL_CHUNK};
use crate::engine::speculative::{SpecCounts, SpecKind};
use crate::model::decoder::SeqStep;
use crate::sched::StatsSnapshot;
use crate::sched::io::proc_self_read_bytes;

mod report;

use report::{BenchReport, moe_report, print_plan, print_streaming, print_summary, sparse_report, upload_report};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Model SPEC: a `.gguf` or `.cawsf` file, a directory (Hugging Face safetensors with
    /// config.json, or a flat layer directory with manifest.json), a name in the store
    /// (`strata list`), or `strata-demo` (the built-in demo model).
    pub model: String,
    #[arg(long = "prompt-tokens", default_value_t = 128)]
    pub prompt_tokens: usize,
    #[arg(long = "gen-tokens", default_value_t = 32)]
    pub gen_tokens: usize,
    /// Sequences decoded together in one batch.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Repetitions; the report gives medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Feed each decode step a pseudo-random token instead of the model's own argmax
    /// (random-weight models repeat a few tokens when greedy, which would flatter an
    /// expert cache with the same few experts).
    #[arg(long = "feed-random")]
    pub feed_random: bool,
    #[command(flatten)]
    pub run: RunOpts,
    #[command(flatten)]
    pub draft: DraftOpts,
}

/// Passes of each storage probe, and the most bytes each reads.
const PROBE_PASSES: u64 = 5;
const PROBE_BYTES: u64 = 64 << 20;

/// Reads in flight in the deep storage probe.
pub const STORAGE_PROBE_DEPTH: usize = 8;

/// How far a decode may read above its own reads replayed before that is a probe error.
/// Both are timed apart, over seconds; on a disk that holds still (or one held to a rate
/// by the kernel's block-I/O throttle) a decode that keeps storage busy reads at its
/// replay's rate, and the two timings differ by up to 1%.
const REPLAY_SLACK: f64 = 1.02;

/// One timed run.
struct RunResult {
    prefill_tok_s: f64,
    decode_tok_s: f64,
    decode_secs: f64,
    /// Tokens the decode steps generated (several a step where drafts were kept).
    decode_tokens: u64,
    /// Forward passes of the model during decode: steps, each reading the weights once.
    decode_passes: u64,
    /// What speculation drafted and kept during decode, and its seconds drafting.
    spec: (SpecCounts, f64),
    /// Scheduler counters over the decode steps.
    stats: StatsSnapshot,
    proc_read_bytes: Option<u64>,
    /// Kernel launches during the decode steps (GPU only), and the graphs among them.
    launches: Option<u64>,
    graphs: Option<u64>,
    graph_replays: Option<u64>,
    /// Small host→device copies during the decode steps, and the host's seconds in them
    /// (GPU only).
    host_copies: Option<(u64, f64)>,
    /// The storage reads the decode steps made (streaming only), to replay.
    reads: Vec<crate::sched::io::TracedRead>,
}

/// A roofline is an upper bound: a decode above one says the probe is wrong, and is
/// reported as such rather than as a result.
fn probe_errors(mem_fraction: f64, storage_fraction: Option<f64>) -> Vec<String> {
    let mut errors = Vec::new();
    if mem_fraction > 1.0 {
        errors.push(format!(
            "decode read its weights at {:.0}% of the measured memory bandwidth: the memory probe is not an upper bound here",
            100.0 * mem_fraction
        ));
    }
    if let Some(f) = storage_fraction.filter(|&f| f > 1.0) {
        errors.push(format!(
            "decode read storage at {:.0}% of the storage probe's bandwidth: the probe is not an upper bound here \
             (a drifting disk, or a host cache the probe missed)",
            100.0 * f
        ));
    }
    errors
}

/// The faster of reads at one in flight and at [`STORAGE_PROBE_DEPTH`], with its depth.
fn better_depth(
    one: crate::sched::io::ReadBandwidth,
    deep: crate::sched::io::ReadBandwidth,
) -> (crate::sched::io::ReadBandwidth, usize) {
    if deep.bytes_per_sec > one.bytes_per_sec { (deep, STORAGE_PROBE_DEPTH) } else { (one, 1) }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Restarts the kernel's peak-RSS count at the present RSS (Linux; elsewhere nothing).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn main(args: BenchArgs) -> anyhow::Result<()> {
    let opts = args.run.to_options()?;
    let name = super::serve::model_entry(&args.model).0;
    let drafts = args.draft.drafts(&name)?;
    let mut engine = crate::resolve::load(&args.model, &opts)?;
    drafts.attach(&name, &mut engine, &opts)?;
    if args.feed_random && engine.speculation.kind != SpecKind::Off {
        return Err(crate::model::sparse::Refused(
            "--feed-random feeds its own tokens to the forward pass, which drafts nothing: it cannot run with --draft"
                .into(),
        )
        .into());
    }
    let engine = engine;
    let model = &engine.model;
    let vocab = model.config().vocab_size as u32;
    let threads = crate::backend::cpu::threads_for(args.run.threads);
    let (n_seq, runs) = (args.concurrency.max(1), args.runs.max(1));
    let needed = args.prompt_tokens + args.gen_tokens + 1;
    if needed > engine.context_len {
        return Err(crate::model::sparse::Refused(format!(
            "--prompt-tokens {} and --gen-tokens {} need {needed} positions, more than the context of {} \
             (--ctx-size)",
            args.prompt_tokens, args.gen_tokens, engine.context_len
        ))
        .into());
    }
    let prompts = prompts(vocab, n_seq, args.prompt_tokens.max(1));

    let sched = model.scheduler();
    let runner = Runner {
        engine: &engine,
        prompts: &prompts,
        prompt_tokens: args.prompt_tokens,
        positions: needed + 1,
        feed_random: args.feed_random,
        feed: std::cell::Cell::new(0x2545_f491_4f6c_dd1d),
    };
    let run = |steps: usize| runner.run(steps);
    // Two slots per probe point (one read in flight, and several), one per run and one
    // more, and one for the small-buffer probe.
    let slots = 2 * (runs as u64 + 1) + 1;
    let storage_probe = StorageProbe::new(sched, slots);
    let probe = |dest_len: usize, streams: usize, slot: u64| storage_probe.probe(dest_len, streams, slot);
    let probe_streaming = |side: u64| storage_probe.streaming(side);
    // An untimed warm-up run first (as llama-bench does): the first pass over a
    // memory-mapped model pays its page faults, and a streaming one fills its ring.
    run(1)?;
    // The CPU's memory probe takes half its passes now and half after the runs, each
    // pattern's better half counting, as a shared VM's memory speed drifts too. Its buffer is
    // freed before the runs, and the peak RSS reported is the larger of the peak so far
    // and the runs' own.
    let cpu_probe = model.memory_bandwidth().is_none();
    let dense_bytes = sched.streamable_bytes() + model.lm_head_bytes();
    let peak_before = peak_rss_bytes();
    let memory_before = cpu_probe.then(|| bandwidth::measure(threads, dense_bytes, bandwidth::PASSES / 2));
    reset_peak_rss();
    // The second bound: each run's own reads replayed with nothing else to do, at one
    // and at several in flight, right after it (its decode-time storage rate over the
    // better replay is the fraction).
    let replay_run = |reads: &[crate::sched::io::TracedRead]| -> anyhow::Result<Option<(f64, usize)>> {
        if reads.is_empty() {
            return Ok(None);
        }
        let one = crate::sched::io::replay_reads(reads, 1)?;
        let deep = crate::sched::io::replay_reads(reads, STORAGE_PROBE_DEPTH)?;
        let (best, depth) = better_depth(one, deep);
        Ok(Some((best.bytes_per_sec, depth)))
    };
    let mut probes = vec![probe_streaming(0)?];
    let mut results = Vec::new();
    let mut replays = Vec::new();
    for i in 0..runs {
        let mut r = run(args.gen_tokens)?;
        let reads = std::mem::take(&mut r.reads);
        let traced: u64 = reads.iter().map(|t| t.len as u64).sum();
        replays.push(replay_run(&reads)?.map(|(bw, depth)| (traced as f64 / r.decode_secs / bw, bw, depth)));
        results.push(r);
        probes.push(probe_streaming(i as u64 + 1)?);
    }
    // The run with the median fraction of its replay.
    let replay = {
        let mut v: Vec<(f64, f64, usize)> = replays.iter().flatten().copied().collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v.get(v.len() / 2).copied()
    };
    // Per run, the better of the probes on either side of it.
    let storage_per_run: Vec<Option<(crate::sched::io::ReadBandwidth, usize)>> = probes
        .windows(2)
        .map(|w| match (w[0], w[1]) {
            (Some(a), Some(b)) => Some(if a.0.bytes_per_sec >= b.0.bytes_per_sec { a } else { b }),
            (a, b) => a.or(b),
        })
        .collect();

    // Storage counters over every timed decode window together.
    let tokens = results.iter().map(|r| r.decode_tokens).sum::<u64>().max(1) as f64;
    let window = results.iter().fold(StatsSnapshot::default(), |acc, r| acc + r.stats);
    let decode_secs: f64 = results.iter().map(|r| r.decode_secs).sum();
    let proc_read: Option<u64> = results.iter().map(|r| r.proc_read_bytes).sum();
    let bytes_read_per_token = window.bytes_read as f64 / tokens;

    let launches: Option<u64> = results.iter().map(|r| r.launches).sum();
    let launches_per_token = launches.map(|l| l as f64 / tokens);
    let graphs: Option<u64> = results.iter().map(|r| r.graphs).sum();
    let graph_replays: Option<u64> = results.iter().map(|r| r.graph_replays).sum();
    let launch_latency_s = model.launch_stats().map(|l| l.latency_s);
    let launch_overhead_fraction =
        launches_per_token.zip(launch_latency_s).map(|(n, lat)| n * lat / (decode_secs / tokens).max(1e-12));
    let host_copies: Option<(u64, f64)> =
        results.iter().map(|r| r.host_copies).try_fold((0, 0.0), |(n, t), c| c.map(|(cn, ct)| (n + cn, t + ct)));
    let peak_rss = peak_rss_bytes().max(peak_before); // before the second memory probe
    let summary = sched.summary(); // now, with the runs' hits and misses
    let moe = summary.experts.as_ref().filter(|e| e.unit == "expert").map(|_| moe_report(&window, tokens));
    let sparse_ffn = (window.neuron_groups_total > 0).then(|| sparse_report(&window, tokens, &engine.sparse_ffn));
    // A MoE step touches its cores and its routed experts, not every expert (a sparse
    // FFN, its cores and the groups kept).
    let weight_bytes_per_token = match &summary.experts {
        None => sched.streamable_bytes() + model.lm_head_bytes(),
        Some(e) => {
            let routed = window.expert_routed_bytes as f64 / tokens;
            sched.streamable_bytes() - e.expert_bytes as usize + routed as usize + model.lm_head_bytes()
        }
    };
    // On a GPU the roofline is device memory: a device-to-device copy, bytes read plus
    // bytes written, measured now.
    let (bandwidth, bandwidth_pattern, bandwidth_buffer) = match (model.memory_bandwidth(), memory_before) {
        (Some(b), _) => (b, None, None),
        (None, before) => {
            let m = bandwidth::measure(threads, weight_bytes_per_token, bandwidth::PASSES - bandwidth::PASSES / 2);
            let m = match before {
                Some(before) => m.or_better(before),
                None => m,
            };
            (m.bytes_per_sec, Some(m.pattern), Some(m.buffer_bytes))
        }
    };
    let roofline = bandwidth / weight_bytes_per_token as f64;
    let decode_tok_s = median(results.iter().map(|r| r.decode_tok_s).collect());
    // The storage bound of the median run (by its own fraction of its adjacent probes);
    // also the same reads into one small buffer, for comparison.
    let fractions: Vec<(f64, usize)> = results
        .iter()
        .zip(&storage_per_run)
        .enumerate()
        .filter_map(|(i, (r, p))| {
            let per_token = r.stats.bytes_read as f64 / r.decode_tokens.max(1) as f64;
            p.map(|(bw, _)| (r.decode_tok_s / (bw.bytes_per_sec / per_token.max(1.0)), i))
        })
        .collect();
    let median_run = {
        let mut f = fractions.clone();
        f.sort_by(|a, b| a.0.total_cmp(&b.0));
        f.get(f.len() / 2).map(|&(_, i)| i)
    };
    let (storage, storage_depth) = median_run.and_then(|i| storage_per_run[i]).unzip();
    let storage_fraction = median_run.and_then(|i| fractions.iter().find(|f| f.1 == i)).map(|f| f.0);
    let storage_small = match sched.is_streaming() {
        true => Some(probe(0, 1, slots - 1)?),
        false => None,
    };
    let storage_roofline = storage.map(|s| s.bytes_per_sec / bytes_read_per_token.max(1.0));
    let upload = summary.upload.as_ref().map(|u| {
        upload_report(
            u,
            &window,
            tokens,
            decode_secs,
            decode_tok_s,
            storage.map(|s| s.bytes_per_sec),
            bytes_read_per_token,
            sched,
        )
    });
    // Each pass reads the weights once, whatever it generated (several tokens a pass
    // where drafts were kept): the memory bound is on the passes.
    let pass_rate = median(results.iter().map(|r| r.decode_passes as f64 / r.decode_secs.max(1e-9)).collect());
    let mut probe_errors = probe_errors(pass_rate / roofline, storage_fraction);
    if let Some((f, _, _)) = replay.filter(|r| r.0 > REPLAY_SLACK) {
        probe_errors.push(format!(
            "decode read storage at {:.0}% of the rate its own reads replayed at: the replay is not an upper bound here",
            100.0 * f
        ));
    }
    let kv_bytes_per_token = model.new_cache(1)?.position_bytes();
    let kv_bytes_per_token_per_head = model.config().mla.map(|a| {
        let c = model.config();
        let per_head = c.n_heads * (a.qk_head_dim() + a.v_head_dim);
        kv_bytes_per_token * per_head as u64 / a.cache_width() as u64
    });
    let report = BenchReport {
        model: engine.name.clone(),
        device: engine.device.device.clone(),
        device_name: engine.device.name.clone(),
        threads,
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        concurrency: n_seq,
        runs,
        prefill_tok_s: median(results.iter().map(|r| r.prefill_tok_s).collect()),
        prefill_tok_s_runs: results.iter().map(|r| r.prefill_tok_s).collect(),
        decode_tok_s_runs: results.iter().map(|r| r.decode_tok_s).collect(),
        decode_tok_s,
        weights_bytes: model.weights_bytes(),
        streamable_bytes: sched.streamable_bytes(),
        resident_bytes: sched.resident_bytes(),
        bytes_read_per_token,
        proc_read_bytes_per_token: proc_read.map(|b| b as f64 / tokens),
        cache_hit_rate: window.layer_hits as f64 / window.layer_requests.max(1) as f64,
        io_stall_fraction: window.stall_ns as f64 / 1e9 / decode_secs.max(1e-9),
        io_busy_fraction: window.io_ns as f64 / 1e9 / decode_secs.max(1e-9),
        storage_busy_fraction: window.storage_busy_ns as f64 / 1e9 / decode_secs.max(1e-9),
        storage_busy_bytes_s: (window.storage_busy_ns > 0)
            .then(|| window.bytes_read as f64 / (window.storage_busy_ns as f64 / 1e9)),
        peak_rss_bytes: peak_rss,
        launches_per_token,
        graphs_per_token: graphs.map(|g| g as f64 / tokens),
        graph_replays_per_token: graph_replays.map(|g| g as f64 / tokens),
        launch_latency_s,
        launch_overhead_fraction,
        host_copies_per_token: host_copies.map(|(n, _)| n as f64 / tokens),
        host_copy_fraction: host_copies.map(|(_, t)| t / decode_secs.max(1e-9)),
        weight_bytes_per_token,
        mem_bandwidth_bytes_s: bandwidth,
        mem_bandwidth_pattern: bandwidth_pattern,
        mem_bandwidth_buffer_bytes: bandwidth_buffer,
        decode_roofline_tok_s: roofline,
        kv_bytes_per_token,
        kv_bytes_per_token_per_head,
        decode_fraction_of_roofline: pass_rate / n_seq as f64 / roofline,
        storage_bandwidth_bytes_s: storage.map(|s| s.bytes_per_sec),
        storage_bandwidth_small_buffer_bytes_s: storage_small.map(|s| s.bytes_per_sec),
        storage_direct_io: storage.map(|s| s.direct),
        storage_queue_depth: storage_depth,
        storage_roofline_tok_s: storage_roofline,
        decode_fraction_of_storage_roofline: storage_fraction,
        storage_replay_bytes_s: replay.map(|r| r.1),
        storage_replay_depth: replay.map(|r| r.2),
        decode_fraction_of_replay: replay.map(|r| r.0),
        probe_errors,
        upload,
        split: summary.split.clone(),
        plan: summary,
        moe,
        sparse_ffn,
        speculative: {
            let (counts, drafting) = results.iter().fold((SpecCounts::default(), 0.0), |(mut c, d), r| {
                c.add(r.spec.0);
                (c, d + r.spec.1)
            });
            SpeculationStatus::new(&SpeculationView::of(&engine), counts, drafting)
        },
    };
    match args.json {
        true => outln!("{}", serde_json::to_string_pretty(&report)?)?,
        false => {
            print_summary(&report)?;
            print_plan(&report)?;
            print_streaming(&report)?;
        }
    }
    Ok(())
}

/// The storage roofline: the model's streamed files read sequentially with O_DIRECT
/// where the filesystem allows it (otherwise buffered after dropping their cached
/// pages), in 8 MiB reads landing across buffers of one layer's (or one expert's)
/// size, as streamed reads do: the median of five passes of up to 64 MiB. Every pass
/// of every probe reads its own part of the files (`slot`): re-reading the same bytes
/// would time a VM host's page cache, not the disk. Storage whose speed drifts is
/// probed between the runs, and each run is judged against the better of the probes
/// just before and just after it.
struct StorageProbe<'a> {
    sched: &'a dyn crate::sched::SchedInfo,
    /// Bytes of the files each pass of each slot has to itself.
    region: u64,
    /// The size of the reads that dominate: a layer, or a routed expert. (A sparse FFN
    /// reads both its cores and its smaller groups; the layer size bounds it.)
    layer_len: usize,
}

impl<'a> StorageProbe<'a> {
    /// Probes of `sched`'s streamed files, cut into `slots` parts.
    fn new(sched: &'a dyn crate::sched::SchedInfo, slots: u64) -> Self {
        let files_len: u64 = sched.files().iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        let layer_len = match &sched.summary().experts {
            Some(e) if e.unit == "expert" => {
                (e.expert_bytes / (e.experts_per_layer * e.moe_layers).max(1) as u64) as usize
            }
            _ => sched.streamable_bytes().div_ceil(sched.n_layers().max(1)),
        };
        StorageProbe { sched, region: files_len / (slots * PROBE_PASSES), layer_len }
    }

    /// The median of the passes of slot `slot`, into buffers of `dest_len` bytes with
    /// `streams` reads in flight.
    fn probe(&self, dest_len: usize, streams: usize, slot: u64) -> anyhow::Result<crate::sched::io::ReadBandwidth> {
        let files = self.sched.files();
        let region = self.region;
        let mut passes = (0..PROBE_PASSES)
            .map(|i| {
                let (skip, bytes) = ((slot * PROBE_PASSES + i) * region, region.clamp(8 << 20, PROBE_BYTES));
                crate::sched::io::measure_parallel_read_into(&files, skip, bytes, dest_len, streams)
            })
            .collect::<Result<Vec<_>, _>>()?;
        passes.sort_by(|a, b| a.bytes_per_sec.total_cmp(&b.bytes_per_sec));
        Ok(passes[passes.len() / 2])
    }

    /// The device's limit at probe point `side`: its best at one read in flight or at
    /// several (NVMe and virtio serve requests in parallel; the streamers keep 2 to 4 in
    /// flight). `None` when nothing streams.
    fn streaming(&self, side: u64) -> anyhow::Result<Option<(crate::sched::io::ReadBandwidth, usize)>> {
        if !self.sched.is_streaming() {
            return Ok(None);
        }
        let one = self.probe(self.layer_len, 1, 2 * side)?;
        let deep = self.probe(self.layer_len, STORAGE_PROBE_DEPTH, 2 * side + 1)?;
        Ok(Some(better_depth(one, deep)))
    }
}

/// The runs of a benchmark: every prompt's prefill, then greedy decode steps.
struct Runner<'a> {
    engine: &'a Engine,
    prompts: &'a [Vec<u32>],
    /// Tokens a prompt counts for the prefill speed.
    prompt_tokens: usize,
    /// Each sequence's cache capacity.
    positions: usize,
    /// Whether decode feeds pseudo-random tokens through the batched forward pass itself
    /// (`--feed-random`), rather than stepping the serving loop.
    feed_random: bool,
    feed: std::cell::Cell<u64>,
}

impl Runner<'_> {
    /// The next pseudo-random token fed to decode.
    fn next_feed(&self) -> u32 {
        let state = self.feed.get().wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.feed.set(state);
        ((state >> 33) % self.engine.model.config().vocab_size as u64) as u32
    }

    /// Prefill then `steps` greedy decode steps, through the serving step loop (the argmax
    /// taken on the device as serving does), or, with `feed_random`, the batched forward
    /// pass fed pseudo-random tokens.
    fn run(&self, steps: usize) -> anyhow::Result<RunResult> {
        let n_seq = self.prompts.len();
        let mut caches =
            (0..n_seq).map(|_| self.engine.model.new_cache(self.positions)).collect::<Result<Vec<_>, _>>()?;
        let mut seqs = Vec::new();
        let mut last = Vec::new();
        let t = Instant::now();
        if self.feed_random {
            for (p, cache) in self.prompts.iter().zip(caches.iter_mut()) {
                let mut step = [SeqStep { tokens: p, cache, all_logits: false, verify: false }];
                last.extend(self.engine.model.forward_top_k(&mut step, 1, &|| false)?);
            }
        } else {
            for (p, cache) in self.prompts.iter().zip(caches.drain(..)) {
                let req = GenerateRequest {
                    prompt: p.clone(),
                    max_tokens: steps + 1,
                    sampling: SamplingParams::greedy(),
                    stop: Vec::new(),
                    stop_at_eos: false,
                    top_logprobs: 0,
                    grammar: None,
                    keep_special_tokens: false,
                    speculative: Default::default(),
                };
                seqs.push(Sequence::new(self.engine, cache, Vec::new(), req)?);
            }
            while seqs.iter().any(|s| s.prompt_left() > 0) {
                batch::step(self.engine, &mut seqs.iter_mut().collect::<Vec<_>>(), PREFILL_CHUNK, &|| false)?;
            }
        }
        let prefill = (n_seq * self.prompt_tokens) as f64 / t.elapsed().as_secs_f64();

        let (stats0, proc0) = (self.engine.model.scheduler().stats().snapshot(), proc_self_read_bytes());
        let launch0 = self.engine.model.launch_stats();
        if self.engine.model.scheduler().is_streaming() {
            crate::sched::io::start_read_trace();
        }
        let generated = |seqs: &[Sequence]| seqs.iter().map(|s| s.generated_len() as u64).sum::<u64>();
        let spec_stats = &self.engine.speculation.stats;
        let (spec0, drafting0, generated0) = (spec_stats.counts(), spec_stats.draft_seconds(), generated(&seqs));
        let mut passes = 0;
        let t = Instant::now();
        // Each sequence generates `steps` tokens after its first: one a step, or several
        // where drafted tokens are kept.
        while !self.feed_random && seqs.iter().any(|s| !s.is_finished()) {
            batch::step(self.engine, &mut seqs.iter_mut().collect::<Vec<_>>(), PREFILL_CHUNK, &|| false)?;
            passes += 1;
        }
        for _ in 0..steps {
            if !self.feed_random {
                break;
            }
            passes += 1;
            let ids: Vec<u32> = last.iter().map(|_| self.next_feed()).collect();
            let mut batch: Vec<SeqStep<'_>> = ids
                .iter()
                .zip(caches.iter_mut())
                .map(|(id, cache)| SeqStep {
                    tokens: std::slice::from_ref(id),
                    cache,
                    all_logits: false,
                    verify: false,
                })
                .collect();
            last = self.engine.model.forward_top_k(&mut batch, 1, &|| false)?;
        }
        let decode_secs = t.elapsed().as_secs_f64();
        let decode_tokens = match self.feed_random {
            true => (n_seq * steps) as u64,
            false => generated(&seqs) - generated0,
        };
        let spec1 = spec_stats.counts();
        let spec = SpecCounts {
            steps: spec1.steps - spec0.steps,
            drafted: spec1.drafted - spec0.drafted,
            accepted: spec1.accepted - spec0.accepted,
        };
        let reads = match self.engine.model.scheduler().is_streaming() {
            true => crate::sched::io::take_read_trace(),
            false => Vec::new(),
        };
        let launch1 = self.engine.model.launch_stats();
        let launches = launch1.as_ref().zip(launch0.as_ref()).map(|(a, b)| a.launches - b.launches);
        let graphs = launch1.as_ref().zip(launch0.as_ref()).map(|(a, b)| a.graphs - b.graphs);
        let graph_replays = launch1.as_ref().zip(launch0.as_ref()).map(|(a, b)| a.graph_replays - b.graph_replays);
        let host_copies =
            launch1.zip(launch0).map(|(a, b)| (a.host_copies - b.host_copies, a.host_copy_s - b.host_copy_s));
        Ok(RunResult {
            launches,
            graphs,
            graph_replays,
            host_copies,
            prefill_tok_s: prefill,
            decode_tok_s: decode_tokens as f64 / decode_secs,
            decode_secs,
            decode_tokens,
            decode_passes: passes,
            spec: (spec, spec_stats.draft_seconds() - drafting0),
            stats: self.engine.model.scheduler().stats().snapshot() - stats0,
            proc_read_bytes: proc_self_read_bytes().zip(proc0).map(|(a, b)| a.saturating_sub(b)),
            reads,
        })
    }
}

/// `n` pseudo-random prompts of `len` ids below `vocab`, the same on every run.
fn prompts(vocab: u32, n: usize, len: usize) -> Vec<Vec<u32>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_id = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % vocab as u64) as u32
    };
    (0..n).map(|_| (0..len).map(|_| next_id()).collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_above_a_roofline_is_a_probe_error() {
        assert!(probe_errors(0.97, Some(0.99)).is_empty());
        assert!(probe_errors(0.5, None).is_empty());
        let e = probe_errors(1.07, Some(1.16));
        assert_eq!(e.len(), 2);
        assert!(e[0].contains("107%") && e[0].contains("memory probe"), "{e:?}");
        assert!(e[1].contains("116%") && e[1].contains("storage probe"), "{e:?}");
    }
}
