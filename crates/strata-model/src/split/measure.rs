//! The rates a placement plan is made from that only the model can measure: its own
//! experts through each side (one row, decode; a batch of rows, prefill), and one layer's
//! rows down to the host and back up.

use std::time::Instant;

use super::super::config::ModelConfig;
use super::super::decoder::build::build_expert;
use super::super::error::ModelError;
use super::super::moe::{Mlp, MlpBufs, mlp_forward};
use strata_backend::cpu::CpuBackend;
use strata_backend::{Backend, HostCopy};
use strata_sched::experts::ExpertUnit;
use strata_sched::placement::Rates;
use strata_sched::placement::split::SplitOptions;

/// Rows of the batch the GEMM rates are measured with.
const BATCH: usize = 64;
/// Timed runs of each measurement (after one untimed): the median counts.
const RUNS: usize = 5;
/// Bytes of distinct experts a measurement goes through (more than a CPU's or a GPU's
/// last-level cache holds, so that their weights come from memory, as each expert's
/// do in a decode step), when the model has that many.
const PROBE_BYTES: u64 = 256 << 20;

/// The median seconds of `f` over [`RUNS`] runs after a first untimed one.
fn median_s(mut f: impl FnMut() -> Result<(), ModelError>) -> Result<f64, ModelError> {
    f()?;
    let mut t = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[RUNS / 2])
}

/// Seconds of one row and of [`BATCH`] rows through every one of `experts` on `be`, one
/// after another and then a copy of one value back (so that a device has finished, its
/// launch and copy latency counted once, not once per expert, as a decoding layer's
/// queued experts wait for it).
fn expert_times<B: Backend>(be: &B, c: &ModelConfig, experts: &[Mlp<B>]) -> Result<(f64, f64), ModelError> {
    let h = c.hidden_size;
    let width = experts.iter().map(|e| e.width).max().unwrap_or(0);
    let x = be.upload(&(0..BATCH * h).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect::<Vec<f32>>())?;
    let (mut gate, mut up) = (be.alloc(BATCH * width)?, be.alloc(BATCH * width)?);
    let mut out = be.alloc(BATCH * h)?;
    let mut time = |rows: usize| {
        median_s(|| {
            for expert in experts {
                let mut bufs = MlpBufs { gate: &mut gate, up: &mut up };
                mlp_forward(be, c, expert, &x, &[rows], &mut bufs, &mut out)?;
            }
            be.download(&out, 1)?;
            Ok(())
        })
    };
    let one = time(1)?;
    Ok((one, time(BATCH)?))
}

/// Seconds of a layer's row crossing: one row down, one row up, the device waited for.
fn crossing_s<B: Backend>(be: &B, h: usize) -> Result<f64, ModelError> {
    let x = be.upload(&vec![0.5f32; h])?;
    let mut y = be.alloc(h)?;
    median_s(|| {
        let host = be.download(&x, h)?;
        y.write_host(&host)?;
        be.download(&y, 1)?;
        Ok(())
    })
}

/// Every rate of a plan: the CPU's and the device's on the first of `units` (experts of
/// the model) up to [`PROBE_BYTES`], the crossing, and the loader's bandwidths from `opts`.
pub(super) fn rates<B: Backend>(
    device: &B,
    cpu: &CpuBackend,
    c: &ModelConfig,
    units: &[ExpertUnit],
    opts: &SplitOptions,
) -> Result<Rates, ModelError> {
    let mut probe = Vec::new();
    let mut bytes = 0u64;
    for u in units {
        if bytes >= PROBE_BYTES {
            break;
        }
        bytes += u.tensors.bytes() as u64;
        probe.push(u);
    }
    let on_cpu: Vec<Mlp<CpuBackend>> =
        probe.iter().map(|u| build_expert(c, cpu, &u.tensors, u.id.expert as usize)).collect::<Result<_, _>>()?;
    let (cpu_one, cpu_batch) = cpu.on_workers(|| expert_times(cpu, c, &on_cpu))?;
    drop(on_cpu);
    let (gpu_one, gpu_batch) = {
        let on_device: Vec<Mlp<B>> = probe
            .iter()
            .map(|u| build_expert(c, device, &u.tensors, u.id.expert as usize))
            .collect::<Result<_, _>>()?;
        device.on_workers(|| expert_times(device, c, &on_device))?
    };
    let crossing = device.on_workers(|| crossing_s(device, c.hidden_size))?;
    let bytes = bytes as f64;
    let per_s = |bytes: f64, s: f64| if s > 0.0 { bytes / s } else { f64::INFINITY };
    let rates = Rates {
        h2d: opts.h2d,
        storage: opts.storage,
        cpu: per_s(bytes, cpu_one),
        gpu: per_s(bytes, gpu_one),
        cpu_gemm: per_s(bytes * BATCH as f64, cpu_batch),
        gpu_gemm: per_s(bytes * BATCH as f64, gpu_batch),
        crossing_s: crossing,
        row_bytes: 2 * 4 * c.hidden_size as u64,
    };
    tracing::debug!(?rates, experts = probe.len(), bytes, "the experts' rates measured");
    Ok(rates)
}
