//! Prometheus metrics: requests by route and status, tokens, prefill and decode time,
//! queue depth and in-flight jobs.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use strata_sched::StatsSnapshot;
use strata_sched::experts::ExpertSummary;
use strata_sched::placement::Mode;
use strata_sched::placement::split::SplitSummary;

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    prefill_micros: AtomicU64,
    decode_micros: AtomicU64,
}

impl Metrics {
    /// Counts one finished generation.
    pub fn record_generation(&self, prompt_tokens: usize, generated: usize, prefill: Duration, decode: Duration) {
        self.prompt_tokens.fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.generated_tokens.fetch_add(generated as u64, Ordering::Relaxed);
        self.prefill_micros.fetch_add(prefill.as_micros() as u64, Ordering::Relaxed);
        self.decode_micros.fetch_add(decode.as_micros() as u64, Ordering::Relaxed);
    }

    /// Tokens and their time since the server started.
    pub fn tokens(&self) -> super::status::TokenTotals {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        super::status::TokenTotals {
            prompt: get(&self.prompt_tokens),
            generated: get(&self.generated_tokens),
            prefill_seconds: get(&self.prefill_micros) as f64 / 1e6,
            decode_seconds: get(&self.decode_micros) as f64 / 1e6,
        }
    }

    fn record_request(&self, route: String, status: u16) {
        *self.requests.lock().expect("metrics lock").entry((route, status)).or_default() += 1;
    }
}

/// Middleware: counts every request by its route pattern and status.
pub async fn record(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route =
        req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let resp = next.run(req).await;
    state.metrics.record_request(route, resp.status().as_u16());
    resp
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "server", responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn render(State(state): State<AppState>) -> Response {
    let m = &state.metrics;
    let mut out = String::new();
    let _ = writeln!(out, "# HELP strata_requests_total HTTP requests by route and status.");
    let _ = writeln!(out, "# TYPE strata_requests_total counter");
    for ((route, status), n) in m.requests.lock().expect("metrics lock").iter() {
        let route = route.replace('\\', "\\\\").replace('"', "\\\"");
        let _ = writeln!(out, "strata_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
    }
    let counters = [
        ("strata_prompt_tokens_total", "Prompt tokens processed.", m.prompt_tokens.load(Ordering::Relaxed) as f64),
        ("strata_generated_tokens_total", "Tokens generated.", m.generated_tokens.load(Ordering::Relaxed) as f64),
        (
            "strata_prefill_seconds_total",
            "Time spent in prefill.",
            m.prefill_micros.load(Ordering::Relaxed) as f64 / 1e6,
        ),
        ("strata_decode_seconds_total", "Time spent decoding.", m.decode_micros.load(Ordering::Relaxed) as f64 / 1e6),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
    }
    let (waiting, running) = state.queue.depth();
    let _ = writeln!(
        out,
        "# HELP strata_queue_depth Requests waiting for the worker.\n# TYPE strata_queue_depth gauge\nstrata_queue_depth {waiting}"
    );
    let _ = writeln!(
        out,
        "# HELP strata_in_flight Requests the worker is running.\n# TYPE strata_in_flight gauge\nstrata_in_flight {running}"
    );
    let loaded = state.status.loaded.lock().expect("status lock").clone();
    let _ = writeln!(
        out,
        "# HELP strata_loaded_models Models in memory.\n# TYPE strata_loaded_models gauge\nstrata_loaded_models {}",
        loaded.len()
    );
    write_layer_metrics(&mut out, &loaded);
    write_expert_metrics(&mut out, &loaded);
    write_sparse_metrics(&mut out, &loaded);
    write_upload_metrics(&mut out, &loaded);
    write_split_metrics(&mut out, &loaded);
    write_speculative_metrics(&mut out, &loaded);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], out).into_response()
}

/// Per loaded model: the residency plan (gauges) and the layer scheduler's counters.
fn write_layer_metrics(out: &mut String, loaded: &[crate::queue::worker::LoadedModel]) {
    type Metric = (
        &'static str,
        &'static str,
        &'static str,
        fn(&strata_sched::SchedSummary, &strata_sched::StatsSnapshot) -> f64,
    );
    let metrics: [Metric; 10] = [
        ("strata_layer_budget_bytes", "gauge", "Memory budget for layer weights.", |s, _| s.plan.budget_bytes as f64),
        ("strata_layer_resident_bytes", "gauge", "Layer weights kept resident.", |s, _| s.plan.resident_bytes as f64),
        ("strata_layer_streamable_bytes", "gauge", "All layer weights (what the budget governs).", |s, _| {
            s.plan.streamable_bytes as f64
        }),
        ("strata_layers_resident", "gauge", "Layers kept resident.", |s, _| s.plan.resident_count as f64),
        ("strata_layers_streamed", "gauge", "Layers streamed from storage.", |s, _| s.plan.streamed_count as f64),
        ("strata_layer_requests_total", "counter", "Layer weights asked for by the forward pass.", |_, c| {
            c.layer_requests as f64
        }),
        ("strata_layer_hits_total", "counter", "Layer requests served from memory.", |_, c| c.layer_hits as f64),
        ("strata_storage_read_bytes_total", "counter", "Bytes of weights read from storage.", |_, c| {
            c.bytes_read as f64
        }),
        ("strata_io_stall_seconds_total", "counter", "Time the forward pass waited for layer reads.", |_, c| {
            c.stall_ns as f64 / 1e9
        }),
        ("strata_io_busy_seconds_total", "counter", "Time the prefetch thread spent reading.", |_, c| {
            c.io_ns as f64 / 1e9
        }),
    ];
    let rows: Vec<_> = loaded.iter().map(|m| (escape(&m.name), m.sched.summary(), m.sched.stats.snapshot())).collect();
    let _ = writeln!(
        out,
        "# HELP strata_model_device Where each loaded model runs (always 1).\n# TYPE strata_model_device gauge"
    );
    for m in loaded {
        let (model, device, gpu) = (escape(&m.name), escape(&m.device.device), escape(&m.device.name));
        let _ = writeln!(out, "strata_model_device{{model=\"{model}\",device=\"{device}\",name=\"{gpu}\"}} 1");
    }
    let _ = writeln!(
        out,
        "# HELP strata_model_vram_bytes GPU memory each loaded model holds.\n# TYPE strata_model_vram_bytes gauge"
    );
    for m in loaded {
        let _ = writeln!(out, "strata_model_vram_bytes{{model=\"{}\"}} {}", escape(&m.name), m.size_vram);
    }
    type Gauge = (&'static str, &'static str, fn(&crate::queue::worker::Batching) -> u64);
    let batching: [Gauge; 5] = [
        ("strata_running_sequences", "Sequences each model is generating.", |b| b.running as u64),
        ("strata_waiting_requests", "Requests waiting for a place among a model's sequences.", |b| b.waiting as u64),
        ("strata_parallel_limit", "The most sequences a model runs at once.", |b| b.parallel as u64),
        ("strata_kv_cache_bytes", "Bytes a model's KV caches hold.", |b| b.kv_cache_bytes),
        ("strata_kv_cache_limit_bytes", "Bytes of KV cache a model's requests may claim.", |b| b.kv_cache_limit_bytes),
    ];
    for (name, help, value) in batching {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for m in loaded {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(&m.name), value(&m.batching));
        }
    }
    for (name, kind, help, value) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (model, summary, stats) in &rows {
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", value(summary, stats));
        }
    }
}

/// Per model that streams into GPU memory: its host tier (gauges), what the upload
/// pipeline copied host → device, and the bandwidth it measured at load.
fn write_upload_metrics(out: &mut String, loaded: &[crate::queue::worker::LoadedModel]) {
    let rows: Vec<_> = loaded
        .iter()
        .filter(|m| m.sched.summary().upload.is_some())
        .map(|m| (escape(&m.name), m.sched.summary(), m.sched.stats.snapshot()))
        .collect();
    write_upload_rows(out, &rows);
}

/// The lines of [`write_upload_metrics`] for `(model, summary, counters)` rows.
fn write_upload_rows(out: &mut String, rows: &[(String, strata_sched::SchedSummary, StatsSnapshot)]) {
    type Metric = (&'static str, &'static str, &'static str, fn(&strata_sched::SchedSummary, &StatsSnapshot) -> f64);
    let metrics: [Metric; 10] = [
        (
            "strata_host_tier_budget_bytes",
            "gauge",
            "Page-locked host memory for streamed layers behind the GPU.",
            |s, _| s.host_tier.as_ref().map_or(0.0, |h| h.budget_bytes as f64),
        ),
        ("strata_host_tier_bytes", "gauge", "Streamed layers held in the host tier.", |s, _| {
            s.host_tier.as_ref().map_or(0.0, |h| h.resident_bytes as f64)
        }),
        ("strata_host_tier_layers", "gauge", "Layers held in the host tier.", |s, _| {
            s.host_tier.as_ref().map_or(0.0, |h| h.count as f64)
        }),
        ("strata_upload_slot_bytes", "gauge", "GPU memory the streaming slots hold.", |_, c| {
            c.transfer.slot_bytes as f64
        }),
        ("strata_h2d_bandwidth_bytes_per_second", "gauge", "Host-to-device bandwidth measured at load.", |s, _| {
            s.upload.as_ref().and_then(|u| u.h2d_bandwidth_bytes_s).unwrap_or(0.0)
        }),
        ("strata_host_tier_hits_total", "counter", "Layer requests served from the host tier.", |_, c| {
            c.host_hits as f64
        }),
        ("strata_h2d_bytes_total", "counter", "Bytes of streamed weights copied host to device.", |_, c| {
            c.transfer.h2d_bytes as f64
        }),
        ("strata_h2d_pageable_copies_total", "counter", "Copies from memory the OS would not page-lock.", |_, c| {
            c.transfer.pageable_copies as f64
        }),
        ("strata_h2d_copy_seconds_total", "counter", "Time the copy engine spent on streamed weights.", |_, c| {
            c.transfer.copy_ns as f64 / 1e9
        }),
        ("strata_h2d_stall_seconds_total", "counter", "Time the GPU's compute waited for copies.", |_, c| {
            c.transfer.copy_stall_ns as f64 / 1e9
        }),
    ];
    for (name, kind, help, value) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (model, summary, stats) in rows {
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", value(summary, stats));
        }
    }
}

/// Per loaded mixture-of-experts model: the expert cache (gauges), its hits and misses
/// by layer, and the bytes of experts read (the rest of the storage reads are the layer
/// cores'). A sparse FFN's neuron-group cache, likewise, as `strata_neuron_group_*`.
fn write_expert_metrics(out: &mut String, loaded: &[crate::queue::worker::LoadedModel]) {
    for (unit, prefix, noun) in
        [("expert", "expert", "routed experts"), ("neuron_group", "neuron_group", "neuron groups")]
    {
        let rows: Vec<_> = loaded
            .iter()
            .filter_map(|m| {
                let e = m.sched.summary().experts.filter(|e| e.unit == unit)?;
                Some((escape(&m.name), e, m.sched.stats.snapshot()))
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        let label = if unit == "expert" { "moe_layer" } else { "layer" };
        type Value = fn(&ExpertSummary, &StatsSnapshot) -> f64;
        let metrics: [(&str, &str, String, Value); 6] = [
            ("cache_budget_bytes", "gauge", format!("Memory for cached {noun}."), |e, _| e.cache_budget_bytes as f64),
            ("cache_bytes", "gauge", format!("{noun} cached now."), |e, _| e.cached_bytes as f64),
            ("requests_total", "counter", format!("{noun} asked for by the forward pass."), |_, c| {
                c.expert_requests as f64
            }),
            ("hits_total", "counter", format!("{noun} served from memory."), |_, c| c.expert_hits as f64),
            ("read_bytes_total", "counter", format!("Bytes of {noun} read from storage."), |_, c| {
                c.expert_bytes_read as f64
            }),
            ("routed_bytes_total", "counter", format!("Bytes of the {noun} asked for (read or not)."), |_, c| {
                c.expert_routed_bytes as f64
            }),
        ];
        for (name, kind, help, value) in metrics {
            let _ = writeln!(out, "# HELP strata_{prefix}_{name} {help}\n# TYPE strata_{prefix}_{name} {kind}");
            for (model, e, stats) in &rows {
                let _ = writeln!(out, "strata_{prefix}_{name}{{model=\"{model}\"}} {}", value(e, stats));
            }
        }
        for (name, help, pick) in [
            ("layer_hits_total", format!("{noun} served from memory, by layer."), true),
            ("layer_misses_total", format!("{noun} read from storage, by layer."), false),
        ] {
            let _ = writeln!(out, "# HELP strata_{prefix}_{name} {help}\n# TYPE strata_{prefix}_{name} counter");
            for (model, e, _) in &rows {
                for (i, l) in e.layers.iter().enumerate() {
                    let n = if pick { l.hits } else { l.misses };
                    let _ = writeln!(out, "strata_{prefix}_{name}{{model=\"{model}\",{label}=\"{i}\"}} {n}");
                }
            }
        }
    }
}

/// Per loaded MoE model whose CPU computes routed experts beside the GPU: its mode (an
/// info gauge), what each side computed and the rows' trips between them (counters), the
/// plan's predicted expert time per token, and where each MoE layer's experts are.
fn write_split_metrics(out: &mut String, loaded: &[crate::queue::worker::LoadedModel]) {
    let rows: Vec<_> = loaded.iter().filter_map(|m| Some((escape(&m.name), m.sched.summary().split?))).collect();
    write_split_rows(out, &rows);
}

/// The lines of [`write_split_metrics`] for `(model, split)` rows (none without rows).
fn write_split_rows(out: &mut String, rows: &[(String, SplitSummary)]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP strata_split_info How a model places its routed experts: auto, cpu_moe or n_cpu_moe=N (always 1).\n\
         # TYPE strata_split_info gauge"
    );
    for (model, s) in rows {
        let mode = match s.mode {
            Mode::Auto => "auto".to_string(),
            Mode::CpuMoe => "cpu_moe".to_string(),
            Mode::NCpuMoe(n) => format!("n_cpu_moe={n}"),
        };
        let _ = writeln!(out, "strata_split_info{{model=\"{model}\",mode=\"{mode}\"}} 1");
    }
    type Labelled = (&'static str, &'static str, &'static str, [(&'static str, fn(&SplitSummary) -> f64); 2]);
    let labelled: [Labelled; 2] = [
        (
            "strata_split_experts_total",
            "side",
            "Routed experts computed on each side (one per expert and pass).",
            [("gpu", |s| s.steps.gpu_experts as f64), ("cpu", |s| s.steps.cpu_experts as f64)],
        ),
        (
            "strata_split_bytes_total",
            "direction",
            "Bytes of hidden rows copied to the CPU (down) and its sums back (up).",
            [("down", |s| s.steps.bytes_down as f64), ("up", |s| s.steps.bytes_up as f64)],
        ),
    ];
    for (name, label, help, values) in labelled {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (model, s) in rows {
            for (v, value) in &values {
                let _ = writeln!(out, "{name}{{model=\"{model}\",{label}=\"{v}\"}} {}", value(s));
            }
        }
    }
    type Metric = (&'static str, &'static str, &'static str, fn(&SplitSummary) -> f64);
    let metrics: [Metric; 7] = [
        ("strata_split_crossings_total", "counter", "Layers whose rows went to the CPU and back.", |s| {
            s.steps.crossings as f64
        }),
        ("strata_split_cpu_seconds_total", "counter", "Time the CPU spent on its experts.", |s| s.steps.cpu_s),
        (
            "strata_split_gpu_wait_seconds_total",
            "counter",
            "Time the forward pass waited for the GPU after the CPU was done.",
            |s| s.steps.gpu_wait_s,
        ),
        (
            "strata_split_uploaded_layers_total",
            "counter",
            "Layers whose CPU experts a large batch uploaded to the GPU instead.",
            |s| s.steps.uploaded_layers as f64,
        ),
        ("strata_split_replans_total", "counter", "Plans made from the router's choices after the first.", |s| {
            s.steps.replans as f64
        }),
        ("strata_split_moved_experts_total", "counter", "Experts those plans moved from one side to the other.", |s| {
            s.steps.moved as f64
        }),
        (
            "strata_split_predicted_seconds_per_token",
            "gauge",
            "The plan's predicted routed-expert time per decoded token.",
            |s| s.plan.decode.total_s,
        ),
    ];
    for (name, kind, help, value) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (model, s) in rows {
            // A plan through a rate not measured predicts infinity.
            let v = match value(s) {
                v if v.is_infinite() => "+Inf".to_string(),
                v => v.to_string(),
            };
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {v}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP strata_split_layer_experts A MoE layer's routed experts by place: in VRAM, computed on the CPU, \
         uploaded to the GPU on use (streamed), living on storage.\n# TYPE strata_split_layer_experts gauge"
    );
    for (model, s) in rows {
        for l in &s.plan.layers {
            let places =
                [("vram", l.in_vram), ("cpu", l.on_cpu), ("streamed", l.streamed), ("storage", l.from_storage)];
            for (place, n) in places {
                let _ = writeln!(
                    out,
                    "strata_split_layer_experts{{model=\"{model}\",layer=\"{}\",place=\"{place}\"}} {n}",
                    l.layer
                );
            }
        }
    }
}

/// Per loaded model that runs a sparse FFN: the neuron groups its rows kept, of those
/// there were.
fn write_sparse_metrics(out: &mut String, loaded: &[crate::queue::worker::LoadedModel]) {
    let rows: Vec<_> = loaded
        .iter()
        .map(|m| (escape(&m.name), m.sched.stats.snapshot()))
        .filter(|(_, c)| c.neuron_groups_total > 0)
        .collect();
    if rows.is_empty() {
        return;
    }
    for (name, help, kept) in [
        ("strata_sparse_ffn_groups_kept_total", "Neuron groups the sparse FFN computed, over rows and layers.", true),
        ("strata_sparse_ffn_groups_total", "Neuron groups there were, over rows and layers.", false),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (model, c) in &rows {
            let n = if kept { c.neuron_groups_kept } else { c.neuron_groups_total };
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {n}");
        }
    }
}

/// Per loaded model: its speculative decoding (kind and draft as labels of an info
/// gauge), what it drafted and kept, the time spent drafting, and the acceptance rate.
fn write_speculative_metrics(out: &mut String, loaded: &[crate::queue::worker::LoadedModel]) {
    let rows: Vec<_> = loaded.iter().map(|m| (escape(&m.name), m.speculation.status())).collect();
    write_speculative_rows(out, &rows);
}

/// The lines of [`write_speculative_metrics`] for `(model, status)` rows.
fn write_speculative_rows(out: &mut String, rows: &[(String, crate::draft::SpeculationStatus)]) {
    let _ = writeln!(
        out,
        "# HELP strata_speculative_info A model's speculative decoding: its default kind and draft model (always 1).\n\
         # TYPE strata_speculative_info gauge"
    );
    for (model, s) in rows {
        let draft = escape(s.draft.as_deref().unwrap_or(""));
        let _ = writeln!(out, "strata_speculative_info{{model=\"{model}\",kind=\"{}\",draft=\"{draft}\"}} 1", s.kind);
    }
    type Metric = (&'static str, &'static str, &'static str, fn(&crate::draft::SpeculationStatus) -> f64);
    let metrics: [Metric; 5] = [
        ("strata_speculative_steps_total", "counter", "Verifying passes (steps that ran drafted tokens).", |s| {
            s.steps as f64
        }),
        ("strata_speculative_drafted_tokens_total", "counter", "Tokens drafted and verified.", |s| s.drafted as f64),
        ("strata_speculative_accepted_tokens_total", "counter", "Drafted tokens kept.", |s| s.accepted as f64),
        ("strata_speculative_draft_seconds_total", "counter", "Time spent drafting.", |s| s.draft_seconds),
        (
            "strata_speculative_acceptance_rate",
            "gauge",
            "Drafted tokens kept, of those drafted, since the model loaded.",
            |s| s.acceptance_rate,
        ),
    ];
    for (name, kind, help, value) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (model, s) in rows {
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", value(s));
        }
    }
}

/// A Prometheus label value: backslashes and quotes escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_sched::plan::{HostTierSummary, PlanSummary};
    use strata_sched::upload::{TransferSnapshot, UploadSummary};
    use strata_sched::{Policy, SchedSummary};

    #[test]
    fn upload_metrics_show_the_host_tier_and_the_copies() {
        let summary = SchedSummary {
            mode: "streaming",
            policy: Policy::Pinned,
            prefetch_depth: 2,
            direct_io: Some(true),
            plan: PlanSummary::default(),
            host_tier: Some(HostTierSummary {
                budget_bytes: 1000,
                resident_bytes: 800,
                layers: "1-2".into(),
                count: 2,
                pinned: true,
            }),
            upload: Some(UploadSummary {
                ring_slots: 4,
                slot_bytes: 400,
                h2d_bandwidth_bytes_s: Some(2.5e10),
                gds: None,
            }),
            experts: None,
            split: None,
        };
        let stats = StatsSnapshot {
            host_hits: 6,
            transfer: TransferSnapshot {
                h2d_bytes: 123,
                copies: 9,
                pageable_copies: 1,
                copy_ns: 2_000_000_000,
                copy_stall_ns: 500_000_000,
                slot_bytes: 1600,
            },
            ..Default::default()
        };
        let mut out = String::new();
        write_upload_rows(&mut out, &[("m".into(), summary, stats)]);
        for line in [
            "strata_host_tier_budget_bytes{model=\"m\"} 1000",
            "strata_host_tier_bytes{model=\"m\"} 800",
            "strata_host_tier_layers{model=\"m\"} 2",
            "strata_upload_slot_bytes{model=\"m\"} 1600",
            "strata_h2d_bandwidth_bytes_per_second{model=\"m\"} 25000000000",
            "strata_host_tier_hits_total{model=\"m\"} 6",
            "strata_h2d_bytes_total{model=\"m\"} 123",
            "strata_h2d_pageable_copies_total{model=\"m\"} 1",
            "strata_h2d_copy_seconds_total{model=\"m\"} 2",
            "strata_h2d_stall_seconds_total{model=\"m\"} 0.5",
            "# TYPE strata_h2d_bytes_total counter",
        ] {
            assert!(out.lines().any(|l| l == line), "missing `{line}` in:\n{out}");
        }
    }

    #[test]
    fn speculative_metrics_count_what_was_drafted_and_kept() {
        use strata_engine::speculative::{SpecCounts, SpecKind, SpecSettings};
        let view = crate::draft::SpeculationView {
            kind: SpecKind::Draft,
            draft: Some("small".into()),
            settings: SpecSettings::default(),
            stats: Default::default(),
        };
        view.stats.add(SpecCounts { steps: 3, drafted: 12, accepted: 9 }, 250_000_000);
        let mut out = String::new();
        write_speculative_rows(&mut out, &[("m".into(), view.status())]);
        for line in [
            "strata_speculative_info{model=\"m\",kind=\"draft\",draft=\"small\"} 1",
            "strata_speculative_steps_total{model=\"m\"} 3",
            "strata_speculative_drafted_tokens_total{model=\"m\"} 12",
            "strata_speculative_accepted_tokens_total{model=\"m\"} 9",
            "strata_speculative_draft_seconds_total{model=\"m\"} 0.25",
            "strata_speculative_acceptance_rate{model=\"m\"} 0.75",
            "# TYPE strata_speculative_acceptance_rate gauge",
        ] {
            assert!(out.lines().any(|l| l == line), "missing `{line}` in:\n{out}");
        }
    }
}
