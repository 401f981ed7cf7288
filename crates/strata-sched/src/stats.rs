//! The counters a scheduler keeps, which `strata bench` and `/metrics` report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::{experts, io, upload};

/// Counters the benchmarks and `/metrics` report.
#[derive(Debug, Default)]
pub struct SchedStats {
    /// Layer weights asked for.
    pub layer_requests: AtomicU64,
    /// Of those, served from memory (resident or cached) rather than read.
    pub layer_hits: AtomicU64,
    /// Bytes read from storage (counted at each `pread`, including the probe when a file
    /// is opened and the widening of direct reads to the alignment).
    pub bytes_read: Arc<AtomicU64>,
    /// Time the compute waited for a layer to be read.
    pub stall_ns: AtomicU64,
    /// Time the I/O thread spent reading.
    pub io_ns: AtomicU64,
    /// Reads redirected because layers were asked for out of the cyclic order.
    pub seeks: AtomicU64,
    /// Routed experts asked for (MoE models), and of those, served from memory.
    pub expert_requests: AtomicU64,
    pub expert_hits: AtomicU64,
    /// Of the misses, those the host tier behind the device held (copied, not read).
    pub expert_host_hits: AtomicU64,
    /// Bytes of routed experts read from storage (included in `bytes_read`'s total by
    /// [`SchedStats::snapshot`], and shown apart).
    pub expert_bytes_read: Arc<AtomicU64>,
    /// Bytes of the experts asked for (hits and misses), as stored: what reading
    /// exactly the routed experts would cost.
    pub expert_routed_bytes: AtomicU64,
    /// Of the experts routed, how many a speculative guess from the previous layer's
    /// output named (`--expert-guess`), and how many were scored.
    pub expert_guess_right: AtomicU64,
    pub expert_guess_total: AtomicU64,
    /// A sparse FFN's neuron groups kept, and those there were (over rows and layers).
    pub neuron_groups_kept: AtomicU64,
    pub neuron_groups_total: AtomicU64,
    /// Expert hits and misses by layer.
    pub expert_layers: std::sync::Mutex<Vec<experts::LayerExpertStats>>,
    /// Streamed layers served from the host tier (page-locked RAM behind a GPU) rather
    /// than read from storage.
    pub host_hits: AtomicU64,
    /// What the upload pipeline copied host → device (GPU streaming).
    pub transfer: Arc<upload::TransferStats>,
}

impl SchedStats {
    /// A copy of the counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let expert_bytes_read = get(&self.expert_bytes_read);
        StatsSnapshot {
            layer_requests: get(&self.layer_requests),
            layer_hits: get(&self.layer_hits),
            bytes_read: get(&self.bytes_read) + expert_bytes_read,
            stall_ns: get(&self.stall_ns),
            io_ns: get(&self.io_ns),
            storage_busy_ns: io::storage_busy_ns(),
            seeks: get(&self.seeks),
            expert_requests: get(&self.expert_requests),
            expert_hits: get(&self.expert_hits),
            expert_bytes_read,
            expert_routed_bytes: get(&self.expert_routed_bytes),
            expert_guess_right: get(&self.expert_guess_right),
            expert_guess_total: get(&self.expert_guess_total),
            neuron_groups_kept: get(&self.neuron_groups_kept),
            neuron_groups_total: get(&self.neuron_groups_total),
            host_hits: get(&self.host_hits),
            transfer: self.transfer.snapshot(),
        }
    }
}

/// [`SchedStats`] at one moment; subtract two for a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct StatsSnapshot {
    pub layer_requests: u64,
    pub layer_hits: u64,
    /// Every byte read from storage: layers (or layer cores) and experts.
    pub bytes_read: u64,
    pub stall_ns: u64,
    pub io_ns: u64,
    /// Time any storage read of this process was in flight ([`io::storage_busy_ns`]; a
    /// clock of the process, not of this model: meaningful as a window's difference).
    pub storage_busy_ns: u64,
    pub seeks: u64,
    pub expert_requests: u64,
    pub expert_hits: u64,
    /// Of `bytes_read`, the routed experts' bytes.
    pub expert_bytes_read: u64,
    /// Bytes of the experts asked for, as stored.
    pub expert_routed_bytes: u64,
    pub expert_guess_right: u64,
    pub expert_guess_total: u64,
    /// A sparse FFN's neuron groups kept, of those there were (over rows and layers).
    pub neuron_groups_kept: u64,
    pub neuron_groups_total: u64,
    /// Streamed layers served from the host tier.
    pub host_hits: u64,
    /// Host → device copies of streamed units.
    #[serde(flatten)]
    pub transfer: upload::TransferSnapshot,
}

impl std::ops::Add for StatsSnapshot {
    type Output = StatsSnapshot;
    fn add(self, o: StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            layer_requests: self.layer_requests + o.layer_requests,
            layer_hits: self.layer_hits + o.layer_hits,
            bytes_read: self.bytes_read + o.bytes_read,
            stall_ns: self.stall_ns + o.stall_ns,
            io_ns: self.io_ns + o.io_ns,
            storage_busy_ns: self.storage_busy_ns + o.storage_busy_ns,
            seeks: self.seeks + o.seeks,
            expert_requests: self.expert_requests + o.expert_requests,
            expert_hits: self.expert_hits + o.expert_hits,
            expert_bytes_read: self.expert_bytes_read + o.expert_bytes_read,
            expert_routed_bytes: self.expert_routed_bytes + o.expert_routed_bytes,
            expert_guess_right: self.expert_guess_right + o.expert_guess_right,
            expert_guess_total: self.expert_guess_total + o.expert_guess_total,
            neuron_groups_kept: self.neuron_groups_kept + o.neuron_groups_kept,
            neuron_groups_total: self.neuron_groups_total + o.neuron_groups_total,
            host_hits: self.host_hits + o.host_hits,
            transfer: self.transfer + o.transfer,
        }
    }
}

impl std::ops::Sub for StatsSnapshot {
    type Output = StatsSnapshot;
    fn sub(self, o: StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            layer_requests: self.layer_requests.saturating_sub(o.layer_requests),
            layer_hits: self.layer_hits.saturating_sub(o.layer_hits),
            bytes_read: self.bytes_read.saturating_sub(o.bytes_read),
            stall_ns: self.stall_ns.saturating_sub(o.stall_ns),
            io_ns: self.io_ns.saturating_sub(o.io_ns),
            storage_busy_ns: self.storage_busy_ns.saturating_sub(o.storage_busy_ns),
            seeks: self.seeks.saturating_sub(o.seeks),
            expert_requests: self.expert_requests.saturating_sub(o.expert_requests),
            expert_hits: self.expert_hits.saturating_sub(o.expert_hits),
            expert_bytes_read: self.expert_bytes_read.saturating_sub(o.expert_bytes_read),
            expert_routed_bytes: self.expert_routed_bytes.saturating_sub(o.expert_routed_bytes),
            expert_guess_right: self.expert_guess_right.saturating_sub(o.expert_guess_right),
            expert_guess_total: self.expert_guess_total.saturating_sub(o.expert_guess_total),
            neuron_groups_kept: self.neuron_groups_kept.saturating_sub(o.neuron_groups_kept),
            neuron_groups_total: self.neuron_groups_total.saturating_sub(o.neuron_groups_total),
            host_hits: self.host_hits.saturating_sub(o.host_hits),
            transfer: self.transfer - o.transfer,
        }
    }
}
