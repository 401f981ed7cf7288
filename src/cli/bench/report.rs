//! `bench`'s report: the JSON it prints with `--json` (each field documented), the text
//! it prints otherwise, and the parts of it computed from the decode's counters.

use serde::Serialize;

use crate::cli::outln;
use crate::draft::SpeculationStatus;
use crate::engine::speculative::SpecKind;
use crate::sched::{SchedSummary, StatsSnapshot};

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
    /// GPU only: decode steps launched as one CUDA graph, per token (`STRATA_CUDA_GRAPHS`),
    /// and those of them replayed (an earlier step's graph launched again, the changed
    /// kernels updated in it). A captured step's kernels count in `launches_per_token`, a
    /// replayed one's do not.
    pub graphs_per_token: Option<f64>,
    pub graph_replays_per_token: Option<f64>,
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
    /// Decode passes a second over that roofline (a pass that keeps drafted tokens gives
    /// several tokens for its one read of the weights: passes, not tokens, are bound).
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
    /// A MoE model on a GPU whose CPU computes routed experts beside it (`--cpu-moe`,
    /// `--n-cpu-moe N`, auto): the mode, the measured rates, the plan in force (per MoE
    /// layer, experts in VRAM, on the CPU, streamed, on storage; the predicted decode
    /// time) and what each side did since the model loaded (the runs' warm-up and
    /// prefill included). `null` without one.
    pub split: Option<crate::sched::placement::split::SplitSummary>,
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

/// The upload pipeline's report (a GPU with streamed layers): what went to the device per
/// token over the decode windows `w` of `tokens` tokens in `decode_secs`, and the bound
/// the slower of storage (`storage_bytes_s`) and the host-to-device copies puts on decode.
#[allow(clippy::too_many_arguments, reason = "the measurements spelled out")]
pub(super) fn upload_report(
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
pub(super) fn moe_report(w: &StatsSnapshot, tokens: f64) -> MoeReport {
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
pub(super) fn sparse_report(w: &StatsSnapshot, tokens: f64, setting: &impl std::fmt::Display) -> SparseReport {
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

/// The text report's first lines: speeds against the roofline, memory, launches.
pub(super) fn print_summary(r: &BenchReport) -> anyhow::Result<()> {
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
    if let Some(g) = r.graphs_per_token.filter(|&g| g > 0.0) {
        let replays = r.graph_replays_per_token.unwrap_or(0.0);
        outln!(
            "CUDA graphs {g:.2} per token (each a decode step's kernels in one launch), {replays:.2} of them replayed"
        )?;
    }
    if let (Some(n), Some(frac)) = (r.host_copies_per_token, r.host_copy_fraction) {
        outln!("small host-to-device copies {n:.0} per token, the host in them {:.0}% of a decode step", 100.0 * frac)?;
    }
    Ok(())
}

/// The text report's residency lines: layers, experts, sparse FFN groups.
pub(super) fn print_plan(r: &BenchReport) -> anyhow::Result<()> {
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
    if let Some(s) = &r.split {
        outln!("{}", split_line(s))?;
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
pub(super) fn print_streaming(r: &BenchReport) -> anyhow::Result<()> {
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

/// The text report's line for a split: where the experts are, what the plan predicts,
/// what each side computed and the bytes the rows moved.
pub(super) fn split_line(s: &crate::sched::placement::split::SplitSummary) -> String {
    use crate::sched::placement::Mode;
    let sum = |f: fn(&crate::sched::placement::LayerSummary) -> u32| s.plan.layers.iter().map(f).sum::<u32>();
    let mode = match s.mode {
        Mode::Auto => "auto".to_string(),
        Mode::CpuMoe => "--cpu-moe".to_string(),
        Mode::NCpuMoe(n) => format!("--n-cpu-moe {n}"),
    };
    let t = &s.steps;
    format!(
        "split {mode}: experts {} in VRAM, {} on the CPU, {} streamed, {} on storage; predicted {:.2} ms/token; \
         computed {} on the GPU and {} on the CPU, {:.1} MiB down + {:.1} MiB up in {} crossings, {} replans",
        sum(|l| l.in_vram),
        sum(|l| l.on_cpu),
        sum(|l| l.streamed),
        sum(|l| l.from_storage),
        s.plan.decode.total_s * 1e3,
        t.gpu_experts,
        t.cpu_experts,
        t.bytes_down as f64 / 1048576.0,
        t.bytes_up as f64 / 1048576.0,
        t.crossings,
        t.replans
    )
}

#[cfg(test)]
mod tests {
    use crate::sched::placement::split::{RatesSummary, SplitSteps, SplitSummary};
    use crate::sched::placement::{DecodeTime, LayerSummary, Mode, PlacementSummary};

    #[test]
    fn the_split_line_sums_the_layers_and_says_what_each_side_did() {
        let layer = |in_vram, on_cpu, streamed, from_storage| LayerSummary {
            in_vram,
            on_cpu,
            streamed,
            from_storage,
            ..LayerSummary::default()
        };
        let s = SplitSummary {
            mode: Mode::NCpuMoe(2),
            replan_every: 128,
            rates: RatesSummary::default(),
            plan: PlacementSummary {
                mode: Mode::NCpuMoe(2),
                decode: DecodeTime { total_s: 0.0125, ..DecodeTime::default() },
                layers: vec![layer(0, 7, 0, 1), layer(5, 0, 3, 0)],
                ..PlacementSummary::default()
            },
            steps: SplitSteps {
                gpu_experts: 40,
                cpu_experts: 24,
                bytes_down: 3 << 20,
                bytes_up: 1 << 20,
                crossings: 12,
                replans: 1,
                ..SplitSteps::default()
            },
        };
        assert_eq!(
            super::split_line(&s),
            "split --n-cpu-moe 2: experts 5 in VRAM, 7 on the CPU, 3 streamed, 1 on storage; predicted 12.50 ms/token; \
             computed 40 on the GPU and 24 on the CPU, 3.0 MiB down + 1.0 MiB up in 12 crossings, 1 replans"
        );
    }
}
