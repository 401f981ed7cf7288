//! `GET /api/strata/status`: where every loaded model's weights are (unit by unit, by
//! tier), its storage and copy counters, its batch and KV memory, and the server's token
//! totals: what the status page and `strata top` draw. `GET /api/strata/status/events`
//! sends the same JSON as server-sent events, once a second (or `?interval_ms=`).

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Query, State};
use axum::http::{HeaderValue, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, routing::get};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use crate::draft::SpeculationStatus;
use crate::queue::worker::Batching;
use strata_backend::device::DeviceInfo;
use strata_sched::{SchedSummary, StatsSnapshot, Tier, UnitStatus};

/// The whole server's state now.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct StatusResponse {
    /// When this was taken, in seconds since the Unix epoch.
    pub time: f64,
    /// False while the startup model loads.
    pub ready: bool,
    /// Tokens since the server started, over every model.
    pub tokens: TokenTotals,
    pub models: Vec<ModelStatus>,
}

/// Token counts and the time spent on them since the server started.
#[derive(Clone, Copy, Debug, Default, Serialize, ToSchema)]
pub struct TokenTotals {
    pub prompt: u64,
    pub generated: u64,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// One loaded model.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ModelStatus {
    pub name: String,
    pub device: DeviceInfo,
    pub context_length: usize,
    /// Bytes of GPU memory it holds (weights, KV cache, activations); 0 on the CPU.
    pub size_vram: u64,
    /// Running and waiting sequences, KV memory in use and its limit.
    pub batching: Batching,
    /// Units and bytes in each tier, every tier listed (`vram`, `pinned`, `ram`, `storage`).
    pub tiers: Vec<TierTotal>,
    /// Every unit: the layers in order, then each MoE layer's routed experts.
    pub units: Vec<UnitStatus>,
    /// Storage, cache and copy counters since it loaded (subtract two for a rate).
    #[schema(value_type = Object)]
    pub counters: StatsSnapshot,
    /// The residency plan, as `/api/ps` shows it.
    #[schema(value_type = Object)]
    pub residency: SchedSummary,
    /// Its speculative decoding and what was drafted and kept, as `/api/ps` shows it.
    pub speculative: SpeculationStatus,
}

/// How many units, of how many bytes, are in one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct TierTotal {
    pub tier: Tier,
    pub units: usize,
    pub bytes: u64,
}

/// The state now.
pub fn status(state: &AppState) -> StatusResponse {
    let loaded = state.status.loaded.lock().expect("status lock").clone();
    let models = loaded
        .into_iter()
        .map(|m| {
            let residency = m.sched.summary();
            let units = m.sched.units(&residency, m.device.device != "cpu");
            let tiers = Tier::ALL
                .iter()
                .map(|&tier| {
                    let of = units.iter().filter(|u| u.tier == tier);
                    TierTotal { tier, units: of.clone().count(), bytes: of.map(|u| u.bytes).sum() }
                })
                .collect();
            ModelStatus {
                name: m.name,
                device: m.device,
                context_length: m.context_length,
                size_vram: m.size_vram,
                batching: m.batching,
                tiers,
                units,
                counters: m.sched.stats.snapshot(),
                residency,
                speculative: m.speculation.status(),
            }
        })
        .collect();
    StatusResponse {
        time: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
        ready: state.status.ready.load(std::sync::atomic::Ordering::SeqCst),
        tokens: state.metrics.tokens(),
        models,
    }
}

/// Where every loaded model's weights are, its counters, batch and KV memory.
#[utoipa::path(get, path = "/api/strata/status", tag = "strata",
    responses((status = 200, description = "The server's state now", body = StatusResponse)))]
pub(crate) async fn get_status(State(state): State<AppState>) -> Json<StatusResponse> {
    Json(status(&state))
}

#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct EventsQuery {
    /// Milliseconds between events (100 to 60000; default 1000).
    interval_ms: Option<u64>,
}

/// The same JSON as `/api/strata/status`, as server-sent events (`data: {...}`), the
/// first at once and then every `interval_ms`.
#[utoipa::path(get, path = "/api/strata/status/events", tag = "strata", params(EventsQuery),
    responses(
        (status = 200, description = "A stream of `StatusResponse` objects", body = StatusResponse,
            content_type = "text/event-stream"),
        (status = 400, description = "`interval_ms` out of range")))]
pub(crate) async fn events(State(state): State<AppState>, Query(q): Query<EventsQuery>) -> Response {
    let ms = q.interval_ms.unwrap_or(1000);
    if !(100..=60_000).contains(&ms) {
        return super::error::ApiError::invalid(
            "interval_ms",
            format!("interval_ms {ms} is not between 100 and 60000"),
        )
        .into_response_for(super::error::Family::Ollama);
    }
    let mut tick = tokio::time::interval(Duration::from_millis(ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = futures_util::stream::unfold((tick, state), |(mut tick, state)| async move {
        tick.tick().await;
        let data = serde_json::to_string(&status(&state)).unwrap_or_else(|_| "{}".into());
        Some((Ok::<_, Infallible>(Event::default().data(data)), (tick, state)))
    })
    .boxed();
    let mut resp = Sse::new(stream).keep_alive(KeepAlive::default()).into_response();
    resp.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// The status page: a residency map, charts and a chat box drawn from
/// `/api/strata/status/events`, with no external assets (it works offline). Served
/// without a key; it asks for one when the data needs it.
#[utoipa::path(get, path = "/ui", tag = "strata",
    responses((status = 200, description = "The status page", body = String, content_type = "text/html")))]
pub(crate) async fn ui() -> Response {
    let headers = [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")];
    (headers, include_str!("ui.html")).into_response()
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(ui, get_status, events),
    components(schemas(StatusResponse, TokenTotals, ModelStatus, TierTotal, UnitStatus, Tier, SpeculationStatus))
)]
pub struct Doc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(ui))
        .route("/api/strata/status", get(get_status))
        .route("/api/strata/status/events", get(events))
}
