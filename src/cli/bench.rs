//! `strata bench`: prefill and decode speed, next to the memory-bandwidth roofline
//! measured in the same run.

use std::time::Instant;

use clap::Args;
use serde::Serialize;

use super::outln;
use super::{DraftOpts, RunOpts};
use crate::backend::cpu::bandwidth;
use crate::draft::{SpeculationStatus, SpeculationView};
use crate::engine::batch::{self, Sequence};
use crate::engine::sampler::SamplingParams;
use crate::engine::session::{Engine, GenerateRequest, PREFILL_CHUNK};
use crate::engine::speculative::{SpecCounts, SpecKind};
use crate::model::decoder::SeqStep;
use crate::sched::io::proc_self_read_bytes;
use crate::sched::{SchedSummary, StatsSnapshot};

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

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub model: String,
    /// Where it ran: `cpu` or `cuda:N`.
    pub device: String,
    /// The processor or GPU.
    pub device_name: String,
    pub threads: usize,
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub concurrency: usize,
    pub runs: usize,
    /// Medians over the runs.
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Each run's, in order: their spread is the run-to-run noise.
    pub prefill_tok_s_runs: Vec<f64>,
    pub decode_tok_s_runs: Vec<f64>,
    pub weights_bytes: usize,
    pub streamable_bytes: usize,
    pub resident_bytes: usize,
    /// Bytes read from storage per decoded token, counted at each read.
    pub bytes_read_per_token: f64,
    /// The same from `/proc/self/io` (`read_bytes`, which counts what reached storage).
    pub proc_read_bytes_per_token: Option<f64>,
    /// Layer requests during decode served from memory.
    pub cache_hit_rate: f64,
    /// Of decode time, the part the compute waited for reads.
    pub io_stall_fraction: f64,
    /// Of decode time, the part the I/O thread was reading.
    pub io_busy_fraction: f64,
    /// Of decode time, the part during which any storage read was in flight (the layer
    /// streamer's and the expert readers' together): below 1, storage sat idle while
    /// the decode waited on compute, which no faster disk would fix.
    pub storage_busy_fraction: f64,
    /// Bytes read per second of that busy time: what storage delivered while it had
    /// work (compare with the roofline probe).
    pub storage_busy_bytes_s: Option<f64>,
    pub peak_rss_bytes: u64,
    /// GPU only: kernel launches per decode step, the measured cost of one empty launch,
    /// and their product as a fraction of the decode step's time (the share launch
    /// overhead could take at most).
    pub launches_per_token: Option<f64>,
    pub launch_latency_s: Option<f64>,
    pub launch_overhead_fraction: Option<f64>,
    /// GPU only: small host→device copies per decode step (positions, row lists, norms
    /// converted on the host), and the share of the decode's time the host thread spent
    /// inside them: large when the driver waits for the stream before each.
    pub host_copies_per_token: Option<f64>,
    pub host_copy_fraction: Option<f64>,
    /// Weight bytes one decode step touches (layers + output head).
    pub weight_bytes_per_token: usize,
    /// Memory read bandwidth measured in this run.
    pub mem_bandwidth_bytes_s: f64,
    /// How the CPU probe read at its best (`None` on a GPU, which copies device to device).
    pub mem_bandwidth_pattern: Option<String>,
    /// The buffer the CPU probe read again and again: the size of a decode step's weight
    /// reads (whole MiB per thread, at most 1 GiB), so a model that stays in the
    /// cache meets a probe that does too. (A MoE model's probe before the runs reads its
    /// dense size, the one after its routed bytes per token: the smaller is given.)
    pub mem_bandwidth_buffer_bytes: Option<usize>,
    /// Decode tok/s if every step only had to read its weights once at that bandwidth.
    pub decode_roofline_tok_s: f64,
    pub decode_fraction_of_roofline: f64,
    /// Sequential `O_DIRECT` read bandwidth of the model's streamed files into
    /// layer-sized (or expert-sized) buffers, measured in this run (streaming only), at
    /// the better of one and several reads in flight: the storage roofline.
    pub storage_bandwidth_bytes_s: Option<f64>,
    /// The same reads into one 8 MiB buffer that stays in cache (what `fio` or `dd`
    /// report). Higher where the kernel copies reads through bounce buffers.
    pub storage_bandwidth_small_buffer_bytes_s: Option<f64>,
    pub storage_direct_io: Option<bool>,
    /// Reads in flight when the storage roofline was measured (the better of 1 and
    /// [`STORAGE_PROBE_DEPTH`]).
    pub storage_queue_depth: Option<usize>,
    /// Decode tok/s if each token only had to read `bytes_read_per_token` at that bandwidth.
    pub storage_roofline_tok_s: Option<f64>,
    /// The median over runs of each run's decode against the better of the storage probes
    /// just before and after it (the storage bandwidth above is that run's).
    pub decode_fraction_of_storage_roofline: Option<f64>,
    /// The decode's own storage reads (the same files, offsets and lengths, in order)
    /// replayed right after each run with nothing else to do, at the better of one and
    /// [`STORAGE_PROBE_DEPTH`] in flight: the bound for exactly those reads on this
    /// storage, which a sequential probe over other bytes only approximates where a
    /// cache below the machine favours bytes read recently. Of the run with the median
    /// fraction.
    pub storage_replay_bytes_s: Option<f64>,
    pub storage_replay_depth: Option<usize>,
    /// The decode's storage rate (bytes its reads moved over its decode time) over that
    /// replay's: the share of the storage bound the decode reached, the median over runs.
    pub decode_fraction_of_replay: Option<f64>,
    /// Rooflines the decode beat: a probe that is not an upper bound, not a result.
    pub probe_errors: Vec<String>,
    /// GPU streaming: the upload pipeline's traffic during decode and its bound.
    pub upload: Option<UploadReport>,
    /// KV cache bytes one position takes in every layer together, at the run's
    /// `--kv-type` (a latent-attention layer keeps one latent row, an attention layer a
    /// key and a value row).
    pub kv_bytes_per_token: u64,
    /// Latent attention only: what a per-head cache (each head's key and value) of the
    /// same model would take at the same bytes per value.
    pub kv_bytes_per_token_per_head: Option<u64>,
    /// Which layers are resident (and the expert cache of a MoE model).
    pub plan: SchedSummary,
    /// A mixture-of-experts model's storage traffic during decode.
    pub moe: Option<MoeReport>,
    /// A sparse FFN's choices and storage traffic during decode (a model converted with
    /// `--sparse-ffn`).
    pub sparse_ffn: Option<SparseReport>,
    /// Speculative decoding (`--draft`): its setup, and what the measured decode drafted
    /// and kept (kind `off` without a draft).
    pub speculative: SpeculationStatus,
}

/// How a sparse FFN's decode steps chose and read their neuron groups.
#[derive(Debug, Serialize)]
pub struct SparseReport {
    /// `--sparse-ffn` (`off` computes every group).
    pub setting: String,
    /// Neuron groups computed, of all there were (over tokens and layers).
    pub kept_fraction: f64,
    /// Bytes per decoded token read for the layer cores (attention, norms, gate) and
    /// for neuron groups; and the bytes of the groups kept (read or cached).
    pub core_bytes_per_token: f64,
    pub group_bytes_per_token: f64,
    pub kept_group_bytes_per_token: f64,
    /// Layers and neuron groups read from storage per decoded token (one read each).
    pub reads_per_token: f64,
    /// Neuron groups asked for served from the neuron-group cache.
    pub neuron_cache_hit_rate: f64,
}

/// How a GPU's decode steps got their streamed layers: from the host tier or storage,
/// through the copy engine.
#[derive(Debug, Serialize)]
pub struct UploadReport {
    /// Bytes copied host → device per decoded token.
    pub h2d_bytes_per_token: f64,
    /// Host→device bandwidth from page-locked memory, measured at load.
    pub h2d_bandwidth_bytes_s: Option<f64>,
    /// How streamed layers came from storage: `direct` (GPUDirect Storage, NVMe to GPU
    /// memory), `compat` (cuFile's compatibility mode, through its own host buffers), or
    /// `null` (page-locked host memory and the copy engine).
    pub gds: Option<String>,
    /// Of decode time, the part the copy engine was copying, and the part the GPU's
    /// compute waited for a copy.
    pub copy_busy_fraction: f64,
    pub copy_stall_fraction: f64,
    /// Layer requests served from the host tier.
    pub host_hit_rate: f64,
    /// Copies from memory the OS would not page-lock.
    pub pageable_copies: u64,
    /// Device memory the streaming slots held at the end (they are never freed while
    /// the model runs, so this is their peak), and what the ring was sized for.
    pub slot_bytes_in_use: u64,
    pub ring_bytes: u64,
    /// Decode tok/s if a token only had to read `bytes_read_per_token` from storage and
    /// copy `h2d_bytes_per_token` to the device, the two overlapping: the bound
    /// min(storage, H2D), each bandwidth measured in this run.
    pub roofline_tok_s: Option<f64>,
    pub decode_fraction_of_roofline: Option<f64>,
}

/// How a MoE model's decode steps used storage and the expert cache.
#[derive(Debug, Serialize)]
pub struct MoeReport {
    /// Bytes per decoded token read for the layer cores (attention, norms, router,
    /// shared expert) and for routed experts.
    pub core_bytes_per_token: f64,
    pub expert_bytes_per_token: f64,
    /// Bytes per token of exactly the experts the routers chose (hits included).
    pub routed_expert_bytes_per_token: f64,
    /// Core bytes plus routed-expert bytes: what reading only the routed experts costs
    /// with nothing cached, and `bytes_read_per_token` over it.
    pub routed_limit_bytes_per_token: f64,
    pub fraction_of_routed_limit: f64,
    /// Experts asked for per token, and the share served from the cache.
    pub experts_per_token: f64,
    pub expert_hit_rate: f64,
    /// With `--expert-guess`: of the experts routed, the share that layer `l`'s router
    /// applied to layer `l - 1`'s output named.
    pub guess_accuracy: Option<f64>,
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
    /// Kernel launches during the decode steps (GPU only).
    launches: Option<u64>,
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
        decode_fraction_of_roofline: decode_tok_s / n_seq as f64 / roofline,
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
        let host_copies =
            launch1.zip(launch0).map(|(a, b)| (a.host_copies - b.host_copies, a.host_copy_s - b.host_copy_s));
        Ok(RunResult {
            launches,
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

/// The upload pipeline's report (a GPU with streamed layers): what went to the device per
/// token over the decode windows `w` of `tokens` tokens in `decode_secs`, and the bound
/// the slower of storage (`storage_bytes_s`) and the host-to-device copies puts on decode.
#[allow(clippy::too_many_arguments, reason = "the measurements spelled out")]
fn upload_report(
    u: &crate::sched::upload::UploadSummary,
    window: &StatsSnapshot,
    tokens: f64,
    decode_secs: f64,
    decode_tok_s: f64,
    storage_bytes_s: Option<f64>,
    bytes_read_per_token: f64,
    sched: &dyn crate::sched::SchedInfo,
) -> UploadReport {
    let h2d_per_token = window.transfer.h2d_bytes as f64 / tokens;
    // Seconds per token each leg needs at its measured bandwidth; they overlap, so
    // the slower one bounds the step.
    let storage_s = storage_bytes_s.map_or(0.0, |s| bytes_read_per_token / s);
    let h2d_s = u.h2d_bandwidth_bytes_s.map(|b| h2d_per_token / b);
    let roofline = h2d_s.map(|h| 1.0 / h.max(storage_s).max(1e-12));
    UploadReport {
        h2d_bytes_per_token: h2d_per_token,
        h2d_bandwidth_bytes_s: u.h2d_bandwidth_bytes_s,
        gds: u.gds.clone(),
        copy_busy_fraction: window.transfer.copy_ns as f64 / 1e9 / decode_secs.max(1e-9),
        copy_stall_fraction: window.transfer.copy_stall_ns as f64 / 1e9 / decode_secs.max(1e-9),
        host_hit_rate: window.host_hits as f64 / window.layer_requests.max(1) as f64,
        pageable_copies: window.transfer.pageable_copies,
        slot_bytes_in_use: sched.stats().snapshot().transfer.slot_bytes,
        ring_bytes: u.ring_slots as u64 * u.slot_bytes,
        roofline_tok_s: roofline,
        decode_fraction_of_roofline: roofline.map(|r| decode_tok_s / r),
    }
}

/// What a MoE model's decode read per token, over the decode windows `w` of `tokens`.
fn moe_report(w: &StatsSnapshot, tokens: f64) -> MoeReport {
    let (read, routed) = (w.expert_bytes_read as f64 / tokens, w.expert_routed_bytes as f64 / tokens);
    let core = (w.bytes_read - w.expert_bytes_read) as f64 / tokens;
    MoeReport {
        core_bytes_per_token: core,
        expert_bytes_per_token: read,
        routed_expert_bytes_per_token: routed,
        routed_limit_bytes_per_token: core + routed,
        fraction_of_routed_limit: (w.bytes_read as f64 / tokens) / (core + routed).max(1.0),
        experts_per_token: w.expert_requests as f64 / tokens,
        expert_hit_rate: w.expert_hits as f64 / w.expert_requests.max(1) as f64,
        guess_accuracy: (w.expert_guess_total > 0).then(|| w.expert_guess_right as f64 / w.expert_guess_total as f64),
    }
}

/// What a sparse FFN kept and read per token, over the decode windows `w` of `tokens`.
fn sparse_report(w: &StatsSnapshot, tokens: f64, setting: &impl std::fmt::Display) -> SparseReport {
    SparseReport {
        setting: setting.to_string(),
        kept_fraction: w.neuron_groups_kept as f64 / w.neuron_groups_total.max(1) as f64,
        core_bytes_per_token: (w.bytes_read - w.expert_bytes_read) as f64 / tokens,
        group_bytes_per_token: w.expert_bytes_read as f64 / tokens,
        kept_group_bytes_per_token: w.expert_routed_bytes as f64 / tokens,
        reads_per_token: ((w.layer_requests - w.layer_hits) + (w.expert_requests - w.expert_hits)) as f64 / tokens,
        neuron_cache_hit_rate: w.expert_hits as f64 / w.expert_requests.max(1) as f64,
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

/// The text report's first lines: speeds against the roofline, memory, launches.
fn print_summary(r: &BenchReport) -> anyhow::Result<()> {
    outln!(
        "model {}  device {} ({})  threads {}  concurrency {}",
        r.model,
        r.device,
        r.device_name,
        r.threads,
        r.concurrency
    )?;
    outln!("prefill {:.1} tok/s ({} prompt tokens)", r.prefill_tok_s, r.prompt_tokens)?;
    outln!(
        "decode  {:.2} tok/s ({} tokens); roofline {:.2} tok/s at {:.1} GB/s measured read bandwidth{} ({:.0}% of it)",
        r.decode_tok_s,
        r.gen_tokens,
        r.decode_roofline_tok_s,
        r.mem_bandwidth_bytes_s / 1e9,
        r.mem_bandwidth_buffer_bytes.map_or(String::new(), |b| format!(" over {} MiB", b >> 20)),
        100.0 * r.decode_fraction_of_roofline
    )?;
    if r.speculative.kind != SpecKind::Off.as_str() {
        outln!("{}", r.speculative.line())?;
    }
    for e in &r.probe_errors {
        outln!("PROBE ERROR: {e}")?;
    }
    outln!(
        "weights {:.1} MiB; peak RSS {:.1} MiB",
        r.weights_bytes as f64 / 1048576.0,
        r.peak_rss_bytes as f64 / 1048576.0
    )?;
    if let (Some(n), Some(lat), Some(frac)) = (r.launches_per_token, r.launch_latency_s, r.launch_overhead_fraction) {
        outln!("launches {n:.0} per token at {:.1} µs each: at most {:.0}% of a decode step", lat * 1e6, 100.0 * frac)?;
    }
    if let (Some(n), Some(frac)) = (r.host_copies_per_token, r.host_copy_fraction) {
        outln!("small host-to-device copies {n:.0} per token, the host in them {:.0}% of a decode step", 100.0 * frac)?;
    }
    Ok(())
}

/// The text report's residency lines: layers, experts, sparse FFN groups.
fn print_plan(r: &BenchReport) -> anyhow::Result<()> {
    let p = &r.plan;
    outln!(
        "layers {} ({}): {} of {} resident [{}], {:.1} of {:.1} MiB, budget {:.1} MiB",
        p.mode,
        serde_json::to_value(p.policy)?.as_str().unwrap_or_default(),
        p.plan.resident_count,
        p.plan.layers,
        p.plan.resident_layers,
        p.plan.resident_bytes as f64 / 1048576.0,
        p.plan.streamable_bytes as f64 / 1048576.0,
        p.plan.budget_bytes as f64 / 1048576.0,
    )?;
    if let (Some(m), Some(e)) = (&r.moe, &p.experts) {
        outln!(
            "experts {} ({}): cache {:.1} of {:.1} MiB budget, {} cached; {:.1} experts/token, hit rate {:.2}; per token {:.1} MiB cores + {:.1} MiB experts read, routed-only limit {:.1} MiB ({:.0}% of it read)",
            e.mode,
            serde_json::to_value(e.policy)?.as_str().unwrap_or_default(),
            e.cached_bytes as f64 / 1048576.0,
            e.cache_budget_bytes as f64 / 1048576.0,
            e.cached_experts,
            m.experts_per_token,
            m.expert_hit_rate,
            m.core_bytes_per_token / 1048576.0,
            m.expert_bytes_per_token / 1048576.0,
            m.routed_limit_bytes_per_token / 1048576.0,
            100.0 * m.fraction_of_routed_limit
        )?;
    }
    if let Some(s) = &r.sparse_ffn {
        outln!(
            "sparse FFN {}: kept {:.2} of the neuron groups; per token {:.1} MiB cores + {:.1} MiB groups read ({:.1} MiB kept), {:.0} reads, neuron-cache hit rate {:.2}",
            s.setting,
            s.kept_fraction,
            s.core_bytes_per_token / 1048576.0,
            s.group_bytes_per_token / 1048576.0,
            s.kept_group_bytes_per_token / 1048576.0,
            s.reads_per_token,
            s.neuron_cache_hit_rate
        )?;
    }
    Ok(())
}

/// The text report's storage and upload lines.
fn print_streaming(r: &BenchReport) -> anyhow::Result<()> {
    if let (Some(bw), Some(roof)) = (r.storage_bandwidth_bytes_s, r.storage_roofline_tok_s) {
        outln!(
            "streaming: {:.1} MiB read per token, hit rate {:.2}, stall {:.0}%, I/O busy {:.0}%, storage busy {:.0}% at {:.2} GB/s; storage roofline {:.2} tok/s at {:.2} GB/s{} ({:.0}% of it; {:.2} GB/s into a small buffer)",
            r.bytes_read_per_token / 1048576.0,
            r.cache_hit_rate,
            100.0 * r.io_stall_fraction,
            100.0 * r.io_busy_fraction,
            100.0 * r.storage_busy_fraction,
            r.storage_busy_bytes_s.unwrap_or(0.0) / 1e9,
            roof,
            bw / 1e9,
            if r.storage_direct_io == Some(true) { " O_DIRECT" } else { " buffered" },
            100.0 * r.decode_fraction_of_storage_roofline.unwrap_or(r.decode_tok_s / roof),
            r.storage_bandwidth_small_buffer_bytes_s.unwrap_or(0.0) / 1e9
        )?;
    }
    if let (Some(bw), Some(f)) = (r.storage_replay_bytes_s, r.decode_fraction_of_replay) {
        outln!(
            "storage bound for these reads: {:.2} GB/s replaying them ({} in flight, nothing else to do); decode read at {:.0}% of it",
            bw / 1e9,
            r.storage_replay_depth.unwrap_or(1),
            100.0 * f
        )?;
    }
    if let Some(u) = &r.upload {
        let bound = match (u.roofline_tok_s, u.decode_fraction_of_roofline) {
            (Some(r), Some(f)) => format!("; bound min(storage, H2D) {r:.2} tok/s ({:.0}% of it)", 100.0 * f),
            _ => String::new(),
        };
        outln!(
            "upload: storage reads {}, {:.1} MiB to the GPU per token at {:.1} GB/s H2D, copy engine busy {:.0}%, compute waiting on copies {:.0}%, host-tier hit rate {:.2}{}{bound}",
            match u.gds.as_deref() {
                Some("direct") => "straight into GPU memory (GPUDirect Storage)",
                Some(_) => "through cuFile's compatibility mode (host bounce buffers, no P2P)",
                None => "through page-locked host memory",
            },
            u.h2d_bytes_per_token / 1048576.0,
            u.h2d_bandwidth_bytes_s.unwrap_or(0.0) / 1e9,
            100.0 * u.copy_busy_fraction,
            100.0 * u.copy_stall_fraction,
            u.host_hit_rate,
            if u.pageable_copies > 0 { format!(", {} pageable copies", u.pageable_copies) } else { String::new() },
        )?;
    }
    Ok(())
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
