//! The rates a placement plan is made from that only the model can measure: one of its
//! own experts through each side (one row, decode; a batch of rows, prefill), and one
//! layer's rows down to the host and back up.

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
/// Passes through the expert in one timed run.
const REPEATS: usize = 8;

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

/// Seconds of one row and of [`BATCH`] rows through `expert` on `be`: [`REPEATS`] runs
/// queued together and then a copy of one value back (so that a device has finished
/// without its launch and copy latency counting as if each run waited for it, as a
/// decoding layer's queued experts do not).
fn expert_times<B: Backend>(be: &B, c: &ModelConfig, expert: &Mlp<B>) -> Result<(f64, f64), ModelError> {
    let h = c.hidden_size;
    let x = be.upload(&(0..BATCH * h).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect::<Vec<f32>>())?;
    let (mut gate, mut up) = (be.alloc(BATCH * expert.width)?, be.alloc(BATCH * expert.width)?);
    let mut out = be.alloc(BATCH * h)?;
    let mut time = |rows: usize| {
        median_s(|| {
            for _ in 0..REPEATS {
                let mut bufs = MlpBufs { gate: &mut gate, up: &mut up };
                mlp_forward(be, c, expert, &x, &[rows], &mut bufs, &mut out)?;
            }
            be.download(&out, 1)?;
            Ok(())
        })
    };
    let one = time(1)? / REPEATS as f64;
    Ok((one, time(BATCH)? / REPEATS as f64))
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

/// Every rate of a plan: the CPU's and the device's on `unit` (an expert of the model),
/// the crossing, and the loader's bandwidths from `opts`.
pub(super) fn rates<B: Backend>(
    device: &B,
    cpu: &CpuBackend,
    c: &ModelConfig,
    unit: &ExpertUnit,
    opts: &SplitOptions,
) -> Result<Rates, ModelError> {
    let e = unit.id.expert as usize;
    let bytes = unit.tensors.bytes() as f64;
    let on_cpu = build_expert(c, cpu, &unit.tensors, e)?;
    let (cpu_one, cpu_batch) = cpu.on_workers(|| expert_times(cpu, c, &on_cpu))?;
    let (gpu_one, gpu_batch) = {
        let on_device = build_expert(c, device, &unit.tensors, e)?;
        device.on_workers(|| expert_times(device, c, &on_device))?
    };
    let crossing = device.on_workers(|| crossing_s(device, c.hidden_size))?;
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
    tracing::debug!(?rates, expert_bytes = bytes, "the experts' rates measured");
    Ok(rates)
}
