//! The three tiers behind a device with memory of its own (DESIGN.md §5), run on the CPU
//! through a loopback copy engine: "device" slots are host memory, filled by a copy
//! thread of their own, late, and checked against the staged bytes before the compute
//! may go on. A GPU runs the same scheduler code with CUDA's engine.
//!
//! Checked: log-probs identical to the resident run at device budgets of 100%, 50%, 25%
//! and 0, with and without a host tier; bytes from storage per token are the layers in
//! neither tier, bytes copied to the device are every layer not resident there; the
//! slots never exceed the ring; a budget above free memory is clamped, and a model that
//! cannot fit at all is refused at load with the sizes named.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use strata::backend::BackendError;
use strata::backend::cpu::CpuBackend;
use strata::engine::session::{Memory, RunOptions, memory_budget};
use strata::model::ModelSource;
use strata::model::config::ModelConfig;
use strata::model::convert::{ConvertOptions, Target, convert};
use strata::model::decoder::{DecoderModel, SeqStep};
use strata::model::demo::demo_source;
use strata::sched::experts::CacheSize;
use strata::sched::upload::{CopyEngine, DeviceRead, StageFactory, TransferStats, Uploader};
use strata::sched::{Policy, SchedOptions};
use support::TempDir;
use support::decode::{PROMPT, decode_window, logit_bits as run};

#[derive(Default)]
struct Done {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    fn wait(&self) {
        let mut d = self.done.lock().unwrap();
        while !*d {
            d = self.cv.wait(d).unwrap();
        }
    }
}

type Slot = Arc<Mutex<Vec<u8>>>;

/// A copy's completion, the slot it filled, and the length and checksum of what it was
/// given.
struct Event {
    done: Arc<Done>,
    check: Option<(Slot, usize, u64)>,
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

type Job = Box<dyn FnOnce() + Send>;

/// Copies on a thread of their own, each a little late; the CPU compute is synchronous,
/// so waiting for a copy blocks, and every compute mark is already complete.
struct Loopback {
    tx: Mutex<mpsc::Sender<Job>>,
    fail_alloc: AtomicBool,
    mismatches: AtomicU64,
    /// Reads storage straight into slots (as GPUDirect Storage does), and fails them.
    direct: AtomicBool,
    fail_direct: AtomicBool,
    direct_reads: AtomicU64,
    /// Copies enqueued, and compute waits for one.
    copies: AtomicU64,
    waits: AtomicU64,
}

impl Loopback {
    fn new() -> Arc<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for job in rx {
                std::thread::sleep(Duration::from_micros(200));
                job();
            }
        });
        Arc::new(Loopback {
            tx: Mutex::new(tx),
            fail_alloc: AtomicBool::new(false),
            mismatches: AtomicU64::new(0),
            direct: AtomicBool::new(false),
            fail_direct: AtomicBool::new(false),
            direct_reads: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        })
    }
}

impl CopyEngine for Loopback {
    type Event = Event;
    type Slot = Slot;

    fn alloc_slot(&self, len: usize, _direct: bool) -> Result<Self::Slot, BackendError> {
        if self.fail_alloc.load(Ordering::Relaxed) {
            return Err(BackendError::OutOfMemory {
                what: "a streaming slot".into(),
                bytes: len as u64,
                msg: "loopback".into(),
            });
        }
        Ok(Arc::new(Mutex::new(vec![0; len])))
    }

    unsafe fn copy(&self, src: &[u8], dst: &Self::Slot, after: Option<&Event>) -> Result<Event, BackendError> {
        if let Some(a) = after {
            a.done.wait();
        }
        let done = Arc::new(Done::default());
        let (addr, len, slot, d) = (src.as_ptr() as usize, src.len(), dst.clone(), done.clone());
        let job: Job = Box::new(move || {
            // SAFETY: the pipeline keeps `src` alive and unchanged until `done` is set.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            slot.lock().unwrap()[..len].copy_from_slice(bytes);
            *d.done.lock().unwrap() = true;
            d.cv.notify_all();
        });
        self.tx.lock().unwrap().send(job).unwrap();
        self.copies.fetch_add(1, Ordering::Relaxed);
        Ok(Event { done, check: Some((dst.clone(), src.len(), checksum(src))) })
    }

    fn compute_wait(&self, event: &Event) -> Result<(), BackendError> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        event.done.wait();
        if let Some((slot, len, want)) = &event.check
            && checksum(&slot.lock().unwrap()[..*len]) != *want
        {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn compute_mark(&self) -> Result<Event, BackendError> {
        let done = Arc::new(Done::default());
        *done.done.lock().unwrap() = true;
        Ok(Event { done, check: None })
    }

    fn synchronize(&self, event: &Event) -> Result<(), BackendError> {
        event.done.wait();
        Ok(())
    }

    fn read_into(&self, dst: &Slot, reads: &[DeviceRead<'_>]) -> Option<Result<u64, BackendError>> {
        use std::os::unix::fs::FileExt;
        self.direct.load(Ordering::Relaxed).then_some(())?;
        if self.fail_direct.load(Ordering::Relaxed) {
            return Some(Err(BackendError::Device { op: "direct read".into(), msg: "loopback".into() }));
        }
        let mut slot = dst.lock().unwrap();
        let mut total = 0;
        for r in reads {
            let file = std::fs::File::open(r.path).unwrap();
            let mut got = 0;
            while got < r.len {
                let n = file.read_at(&mut slot[r.dst + got..r.dst + r.len], r.offset + got as u64).unwrap();
                if n == 0 {
                    break;
                }
                got += n;
            }
            assert!(got >= r.min, "{}: {got} of {} bytes", r.path.display(), r.min);
            total += got as u64;
        }
        self.direct_reads.fetch_add(1, Ordering::Relaxed);
        Some(Ok(total))
    }

    fn direct_mode(&self) -> Option<&'static str> {
        self.direct.load(Ordering::Relaxed).then_some("direct")
    }

    fn download(&self, slot: &Slot, len: usize) -> Result<Vec<u8>, BackendError> {
        Ok(slot.lock().unwrap()[..len].to_vec())
    }
}

fn stage(engine: &Arc<Loopback>) -> StageFactory {
    let engine = engine.clone();
    StageFactory(Arc::new(move |slot_len, ring, stats: Arc<TransferStats>| {
        let up = Uploader::new(engine.clone(), slot_len, ring, None, stats).expect("reaper thread");
        Ok(Arc::new(up) as Arc<dyn strata::sched::upload::Stage>)
    }))
}

fn demo_flat(dir: &TempDir) -> (ModelSource, ModelConfig) {
    let out = dir.path("demo-flat");
    let opts = ConvertOptions { target: Target::Flat, quant: None, threads: 2, ndsq: None, sparse_ffn: None };
    convert(demo_source().unwrap(), &out, &opts, &mut |_| {}).unwrap();
    let source = ModelSource::from_path(out.to_str().unwrap()).unwrap();
    let config = ModelConfig::from_json(&source.config_json).unwrap();
    (source, config)
}

/// The demo model as a flat directory, and the read-buffer bytes of each of its layers
/// (all equal) as a streaming scheduler counts them.
fn demo_flat_per_layer(dir: &TempDir) -> (ModelSource, ModelConfig, u64) {
    let (source, config) = demo_flat(dir);
    let opts = SchedOptions { budget: Some(0), ..Default::default() };
    let probe = DecoderModel::with_options(config.clone(), &source, Arc::new(CpuBackend::new(1)), &opts).unwrap();
    let per_layer = probe.scheduler().streamable_bytes() as u64 / config.n_layers as u64;
    (source, config, per_layer)
}

/// A staged scheduler with `device` layers resident on the "device" and `host` in the
/// host tier.
fn tiered(engine: &Arc<Loopback>, per_layer: u64, device: u64, host: u64) -> SchedOptions {
    SchedOptions {
        budget: Some(device * per_layer),
        host_budget: host * per_layer,
        stage: Some(stage(engine)),
        ..Default::default()
    }
}

#[test]
fn every_tier_split_gives_the_resident_logits_and_moves_the_planned_bytes() {
    let dir = TempDir::new("tiers");
    let (source, config, per_layer) = demo_flat_per_layer(&dir);
    let backend = Arc::new(CpuBackend::new(2));
    let want = run(&DecoderModel::new(config.clone(), &source, backend.clone()).unwrap());
    let n = config.n_layers as u64;
    let steps = 12u64;
    // (layers on the device, layers in the host tier)
    for (device, host) in [(2, 0), (2, 1), (2, 2), (1, 0), (1, 3), (0, 0), (0, 2), (0, 4)] {
        let engine = Loopback::new();
        let opts = tiered(&engine, per_layer, device, host);
        let model = DecoderModel::with_options(config.clone(), &source, backend.clone(), &opts).unwrap();
        let case = format!("{device} layers on the device, {host} in the host tier");
        assert!(run(&model) == want, "{case}: logits differ from the resident run");
        let summary = model.scheduler().summary();
        assert_eq!(summary.plan.resident_count as u64, device, "{case}");
        let tier = summary.host_tier.clone().expect("a staged scheduler reports its host tier");
        assert_eq!(tier.count as u64, host, "{case}: {tier:?}");
        assert_eq!(tier.resident_bytes, host * per_layer, "{case}");

        let w = decode_window(&model, steps as usize);
        let streamed = n - device - host;
        assert_eq!(w.bytes_read, steps * streamed * per_layer, "{case}: bytes from storage");
        assert_eq!(w.transfer.h2d_bytes, steps * (n - device) * per_layer, "{case}: bytes to the device");
        assert_eq!(w.transfer.copies, steps * (n - device), "{case}");
        assert_eq!(w.host_hits, steps * host, "{case}");
        assert_eq!(w.layer_hits, steps * (device + host), "{case}");
        let ring = (strata::sched::DEFAULT_PREFETCH_DEPTH as u64 + 2) * per_layer;
        assert!(w.transfer.slot_bytes <= ring, "{case}: {} bytes of slots, ring {ring}", w.transfer.slot_bytes);
        assert_eq!(engine.mismatches.load(Ordering::Relaxed), 0, "{case}: a slot held other bytes than staged");
    }
}

/// Host-tier layers are uploaded `--prefetch-depth` layers ahead of their use (the last
/// layers of a pass upload the next pass's first), and the compute waits for each copy
/// only when it uses the layer, so the copy engine never waits for the host thread.
#[test]
fn host_tier_layers_are_uploaded_ahead_and_waited_for_at_use() {
    let dir = TempDir::new("tiers-ahead");
    let (source, config, per_layer) = demo_flat_per_layer(&dir);
    let backend = Arc::new(CpuBackend::new(2));
    let want = run(&DecoderModel::new(config.clone(), &source, backend.clone()).unwrap());
    let n = config.n_layers as u64;
    for depth in [1usize, 2, 3] {
        let engine = Loopback::new();
        let opts = SchedOptions { prefetch_depth: depth, ..tiered(&engine, per_layer, 0, n) };
        let model = DecoderModel::with_options(config.clone(), &source, backend.clone(), &opts).unwrap();
        let mut cache = model.new_cache(16).unwrap();
        model.forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }]).unwrap();
        let ahead = depth.min(n as usize - 1) as u64;
        let (copies, waits) = (engine.copies.load(Ordering::Relaxed), engine.waits.load(Ordering::Relaxed));
        assert_eq!((copies, waits), (n + ahead, n), "depth {depth}: one pass's copies and the compute's waits");
        let w = decode_window(&model, 6);
        assert_eq!(w.transfer.copies, 6 * n, "depth {depth}: a copy per layer and pass, in the steady state");
        let ring = (depth as u64 + 2) * per_layer;
        assert!(w.transfer.slot_bytes <= ring, "depth {depth}: {} bytes of slots, ring {ring}", w.transfer.slot_bytes);
        assert_eq!(engine.mismatches.load(Ordering::Relaxed), 0, "depth {depth}: a slot held other bytes");
        let fresh = DecoderModel::with_options(config.clone(), &source, backend.clone(), &opts).unwrap();
        assert!(run(&fresh) == want, "depth {depth}: logits differ from the resident run");
    }
}

#[test]
fn the_baselines_and_the_cpu_do_not_stage() {
    let dir = TempDir::new("tiers-baselines");
    let (source, config) = demo_flat(&dir);
    let backend = Arc::new(CpuBackend::new(2));
    let want = run(&DecoderModel::new(config.clone(), &source, backend.clone()).unwrap());
    for policy in [Policy::Lru, Policy::Reload] {
        let engine = Loopback::new();
        let opts = SchedOptions {
            budget: Some(0),
            policy,
            prefetch_depth: 0,
            host_budget: u64::MAX,
            stage: Some(stage(&engine)),
            ..Default::default()
        };
        let model = DecoderModel::with_options(config.clone(), &source, backend.clone(), &opts).unwrap();
        assert!(run(&model) == want, "{policy:?}");
        let w = decode_window(&model, 4);
        assert_eq!((w.transfer.copies, w.host_hits), (0, 0), "{policy:?} copies each tensor as it builds");
        assert!(model.scheduler().summary().host_tier.is_none());
    }
    // Without a stage there is no host tier, whatever its budget.
    let opts = SchedOptions { budget: Some(0), host_budget: u64::MAX, ..Default::default() };
    let model = DecoderModel::with_options(config, &source, backend, &opts).unwrap();
    assert!(run(&model) == want);
    assert!(model.scheduler().summary().host_tier.is_none());
    assert_eq!(decode_window(&model, 4).host_hits, 0);
}

#[test]
fn a_device_that_cannot_give_a_slot_is_an_error_not_a_panic() {
    let dir = TempDir::new("tiers-oom");
    let (source, config) = demo_flat(&dir);
    let engine = Loopback::new();
    engine.fail_alloc.store(true, Ordering::Relaxed);
    let opts = SchedOptions { budget: Some(0), stage: Some(stage(&engine)), ..Default::default() };
    let model = DecoderModel::with_options(config, &source, Arc::new(CpuBackend::new(2)), &opts).unwrap();
    let mut cache = model.new_cache(16).unwrap();
    let err = model
        .forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }])
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("streaming slot") && msg.contains("layer 0"), "{msg}");
}

#[test]
fn budgets_beyond_free_memory_are_clamped_and_a_model_that_cannot_fit_is_refused() {
    let dir = TempDir::new("tiers-budget");
    let (source, config) = demo_flat(&dir);
    let opts = |budget: Option<u64>, host: Option<u64>| RunOptions {
        memory_budget: budget,
        host_budget: host,
        ..Default::default()
    };
    let gpu =
        |free: u64, host_free: u64| Memory { free: Some(free), host_free: Some(host_free), device: "cuda:0".into() };
    let cpu = |free: u64| Memory { free: Some(free), host_free: None, device: "cpu".into() };
    let streamable: u64 = source
        .tensors
        .iter()
        .filter(|(name, _)| strata::format::layer_tensor(name).is_some())
        .map(|(_, t)| t.byte_len() as u64)
        .sum();

    // A budget above free memory, for a model that does not fit it, is clamped to it.
    let s = memory_budget(&source, &config, 64, &opts(Some(10 << 30), None), &cpu(streamable / 2)).unwrap();
    assert_eq!(s.budget, Some(streamable / 2));
    assert_eq!(s.host_budget, 0, "no host tier on the CPU");
    // One the model fits is kept (everything stays resident either way).
    let s = memory_budget(&source, &config, 64, &opts(Some(10 << 30), None), &cpu(10 * streamable)).unwrap();
    assert_eq!(s.budget, Some(10 << 30));

    // Behind a GPU: the host budget defaults to free RAM less headroom and the ring, and
    // one above free RAM is clamped to it.
    let s = memory_budget(&source, &config, 64, &opts(Some(0), None), &gpu(1 << 30, 1000 << 20)).unwrap();
    assert!(s.host_budget > 0 && s.host_budget < 900 << 20, "{}", s.host_budget);
    let s = memory_budget(&source, &config, 64, &opts(Some(0), Some(1 << 40)), &gpu(1 << 30, 1 << 30)).unwrap();
    assert_eq!(s.host_budget, 1 << 30);

    // Free VRAM below the embeddings, head, KV cache and ring: refused, sizes named.
    let err = memory_budget(&source, &config, 4096, &opts(None, None), &gpu(1 << 20, 1 << 30)).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("cannot run on cuda:0") && msg.contains("KV cache") && msg.contains("is free"), "{msg}");
}

#[test]
fn routed_experts_upload_into_memory_of_their_own_and_give_the_resident_logits() {
    let spec = format!("{}/tests/fixtures/gguf/qwen3_moe.f32.gguf", env!("CARGO_MANIFEST_DIR"));
    let source = ModelSource::from_path(&spec).unwrap();
    let config = ModelConfig::from_json(&source.config_json).unwrap();
    let backend = Arc::new(CpuBackend::new(2));
    let want = run(&DecoderModel::new(config.clone(), &source, backend.clone()).unwrap());
    for cache in [CacheSize::Bytes(0), CacheSize::Fraction(0.5)] {
        let engine = Loopback::new();
        let opts = SchedOptions {
            budget: Some(0),
            expert_cache: Some(cache),
            stage: Some(stage(&engine)),
            ..Default::default()
        };
        let model = DecoderModel::with_options(config.clone(), &source, backend.clone(), &opts).unwrap();
        assert!(run(&model) == want, "cache {cache:?}: logits differ from the resident run");
        let w = decode_window(&model, 8);
        let misses = w.expert_requests - w.expert_hits;
        assert!(misses > 0, "cache {cache:?}");
        // Every layer core (none on the device) and every expert read is one copy.
        assert_eq!(w.transfer.copies, w.layer_requests + misses, "cache {cache:?}");
        assert_eq!(engine.mismatches.load(Ordering::Relaxed), 0, "cache {cache:?}");
    }
}

#[test]
fn storage_read_straight_into_device_slots_gives_the_resident_logits() {
    let dir = TempDir::new("tiers-direct");
    let (source, config, per_layer) = demo_flat_per_layer(&dir);
    let backend = Arc::new(CpuBackend::new(2));
    let want = run(&DecoderModel::new(config.clone(), &source, backend.clone()).unwrap());
    let n = config.n_layers as u64;
    for (device, host) in [(0u64, 0u64), (1, 1), (2, 0)] {
        let engine = Loopback::new();
        engine.direct.store(true, Ordering::Relaxed);
        let opts = tiered(&engine, per_layer, device, host);
        let model = DecoderModel::with_options(config.clone(), &source, backend.clone(), &opts).unwrap();
        let case = format!("direct reads, {device} layers on the device, {host} in the host tier");
        assert_eq!(model.scheduler().summary().upload.and_then(|u| u.gds).as_deref(), Some("direct"), "{case}");
        // The compute here reads host bytes, which for a direct read are copied back
        // from the slot: the logits check what the direct reads put there.
        assert!(run(&model) == want, "{case}: logits differ from the resident run");
        let w = decode_window(&model, 8);
        let streamed = n - device - host;
        assert_eq!(w.bytes_read, 8 * streamed * per_layer, "{case}: bytes from storage");
        // Only the host tier's layers pass through the copy engine.
        assert_eq!(w.transfer.h2d_bytes, 8 * host * per_layer, "{case}: bytes copied");
        assert!(engine.direct_reads.load(Ordering::Relaxed) >= 8 * streamed, "{case}");
    }

    // A direct read that fails: said once, and every layer goes through host memory.
    let engine = Loopback::new();
    engine.direct.store(true, Ordering::Relaxed);
    engine.fail_direct.store(true, Ordering::Relaxed);
    let opts = SchedOptions { budget: Some(0), stage: Some(stage(&engine)), ..Default::default() };
    let model = DecoderModel::with_options(config, &source, backend, &opts).unwrap();
    assert!(run(&model) == want, "after a failed direct read");
    assert_eq!(model.scheduler().summary().upload.and_then(|u| u.gds), None, "no longer reading directly");
    assert_eq!(engine.direct_reads.load(Ordering::Relaxed), 0);
    assert!(decode_window(&model, 4).transfer.copies >= 4 * n, "layers copied through host memory instead");
}
