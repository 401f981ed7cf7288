//! Routed experts computed by the CPU beside a device (`--cpu-moe`, `--n-cpu-moe N`,
//! auto), on a stand-in device whose buffers and weights are its own and whose every
//! crossing is counted (`support::device`): the logits equal the CPU's and the device's
//! alone on every MoE family (hybrid and latent attention among them, F32 and Q8_0), the
//! device is given no routed expert the CPU computes, one copy down and one up cross per
//! layer whose experts the CPU computes, the plan moves the experts in use into VRAM as
//! use shifts, and experts RAM cannot hold are read from storage.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use strata::backend::cpu::CpuBackend;
use strata::model::decoder::DecoderModel;
use strata::model::{LanguageModel, ModelSource};
use strata::sched::expert_policy::ExpertId;
use strata::sched::placement::split::{SplitInfo, SplitOptions};
use strata::sched::placement::{Budgets, Mode, Rates, RouterStats, Side};
use strata::sched::{SchedOptions, Tier};

use crate::support::decode::PROMPT;
use crate::support::device::Device;

const GB: u64 = 1 << 30;

fn fixture(rel: &str) -> ModelSource {
    ModelSource::from_path(&format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The CPU backend as the loader makes it for `source`.
fn cpu(source: &ModelSource) -> CpuBackend {
    match source.config.linear_attn {
        Some(_) => CpuBackend::new(2).row_invariant(),
        None => CpuBackend::new(2),
    }
}

/// Bytes of the routed experts' tensors, and of the layers' other tensors (their cores),
/// in the layers the model runs (a multi-token-prediction layer's are not).
fn expert_and_core_bytes(source: &ModelSource) -> (u64, u64) {
    let mut bytes = (0, 0);
    for (name, t) in &source.tensors {
        match strata::format::layer_tensor(name).filter(|&(i, _)| i < source.config.n_layers) {
            Some((_, local)) if strata::format::unit_tensor(local).is_some() => bytes.0 += t.byte_len() as u64,
            Some(_) => bytes.1 += t.byte_len() as u64,
            None => {}
        }
    }
    bytes
}

/// A PCIe 4.0 box: uploads at 25 GB/s, an NVMe at 3 GB/s, the CPU computing an expert
/// from RAM at 40 GB/s, the GPU at 800 GB/s from VRAM.
fn pcie4(h: usize) -> Rates {
    Rates {
        h2d: 25e9,
        storage: 3e9,
        cpu: 40e9,
        gpu: 800e9,
        cpu_gemm: 1.4e11,
        gpu_gemm: 2.8e13,
        crossing_s: 30e-6,
        row_bytes: 2 * 4 * h as u64,
    }
}

/// `mode` within `vram` and `ram`, with the rates measured at load (`rates: None`).
fn split(mode: Mode, vram: u64, ram: u64, rates: Option<Rates>) -> SplitOptions {
    SplitOptions {
        mode,
        budgets: Budgets { vram_free: vram, vram_reserve: 0, ram_free: ram, ram_reserve: 0, pinned_max: u64::MAX },
        h2d: 25e9,
        storage: 3e9,
        replan_every: 0,
        threads: 2,
        rates,
    }
}

fn on_device(source: &ModelSource, split: Option<SplitOptions>) -> (DecoderModel<Device>, Arc<Device>) {
    let device = Arc::new(Device::new(cpu(source)));
    let sched = SchedOptions { split, ..Default::default() };
    let model = DecoderModel::with_options(source.config.clone(), source, device.clone(), &sched).unwrap();
    (model, device)
}

/// Logits of every prompt position and of greedy decode steps.
fn logits(model: &dyn LanguageModel, steps: usize) -> Vec<f32> {
    use strata::model::decoder::SeqStep;
    let mut cache = model.new_cache(64).unwrap();
    let vocab = model.config().vocab_size;
    let prompt: Vec<u32> = PROMPT.iter().map(|&t| t % vocab as u32).collect();
    let mut out =
        model.forward(&mut [SeqStep { tokens: &prompt, cache: &mut cache, all_logits: true, verify: false }]).unwrap();
    let mut all = out[0].clone();
    for _ in 0..steps {
        let last = &out[0][out[0].len() - vocab..];
        let next = (0..vocab).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        let step = SeqStep { tokens: &[next], cache: &mut cache, all_logits: false, verify: false };
        out = model.forward(&mut [step]).unwrap();
        all.extend_from_slice(&out[0]);
    }
    all
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

const FIXTURES: [&str; 9] = [
    "hf/mixtral",
    "hf/qwen2_moe",
    "hf/qwen3_moe",
    "hf/qwen3_5_moe",
    "hf/qwen3_next",
    "hf/deepseek_v3",
    "hf/glm4_moe",
    "hf/gpt_oss",
    "gguf/qwen3_moe.q8_0.gguf",
];

#[test]
fn split_models_give_the_logits_of_the_cpu_and_of_the_device_alone() {
    for rel in FIXTURES {
        let source = fixture(rel);
        let reference = logits(&DecoderModel::new(source.config.clone(), &source, Arc::new(cpu(&source))).unwrap(), 4);
        let (alone, _) = on_device(&source, None);
        let device_alone = logits(&alone, 4);
        let (experts, cores) = expert_and_core_bytes(&source);
        // Auto with VRAM for about a third of the experts: with the rates measured here
        // (the stand-in computes as the CPU does) and with a PCIe 4.0 box's.
        let h = source.config.hidden_size;
        let modes = [
            (Mode::CpuMoe, 64 * GB, None),
            (Mode::NCpuMoe(1), 64 * GB, None),
            (Mode::Auto, cores + experts / 3, None),
            // (The fixtures' experts are so small that a crossing costing anything keeps
            // them on the device.)
            (Mode::Auto, cores + experts / 3, Some(Rates { crossing_s: 0.0, ..pcie4(h) })),
        ];
        for (mode, vram, rates) in modes {
            let (model, _) = on_device(&source, Some(split(mode, vram, 64 * GB, rates)));
            let side = model.cpu_side().expect("a CPU side");
            let got = logits(&model, 4);
            let (cpu_d, dev_d) = (max_diff(&got, &reference), max_diff(&got, &device_alone));
            assert!(cpu_d < 1e-4 && dev_d < 1e-4, "{rel} {mode:?}: {cpu_d} from the CPU's, {dev_d} from the device's");
            let steps = SplitInfo::summary(side).steps;
            if mode != Mode::Auto || rates.is_some() {
                let plan = SplitInfo::summary(side).plan;
                assert!(steps.cpu_experts > 0, "{rel} {mode:?}: the CPU computed no expert: {plan:?}");
            }
            if mode == Mode::CpuMoe {
                // Only a prompt the plan uploaded for runs routed experts on the device.
                let ok = steps.gpu_experts == 0 || steps.uploaded_layers > 0;
                assert!(ok, "{rel}: the device computed routed experts with --cpu-moe: {steps:?}");
            }
        }
    }
}

#[test]
fn each_tensor_crosses_where_the_plan_says() {
    use strata::model::decoder::SeqStep;
    let source = fixture("hf/qwen3_moe");
    let c = source.config.clone();
    let (h, m) = (c.hidden_size, c.moe.unwrap());
    let layers = c.n_layers as u32;
    let (experts, _) = expert_and_core_bytes(&source);
    let one_expert = experts / (u64::from(layers) * m.n_experts as u64);
    let (_, alone) = on_device(&source, None);
    let all_weights = alone.log.weight_bytes.load(Ordering::SeqCst);
    for n in [layers, 1, 0] {
        let mode = if n == layers { Mode::CpuMoe } else { Mode::NCpuMoe(n) };
        let (model, device) = on_device(&source, Some(split(mode, 64 * GB, 64 * GB, Some(pcie4(h)))));
        let side = model.cpu_side().unwrap();
        // At load the device gets every tensor but the routed experts (its expert cache
        // reads those of its layers when routed to).
        let at_load = device.log.weight_bytes.load(Ordering::SeqCst);
        // With no layer on the CPU, VRAM holds every expert, as without a split.
        let want = if n == 0 { all_weights } else { all_weights - experts };
        assert_eq!(at_load, want, "{mode:?}: weight bytes given the device at load");
        for l in &SplitInfo::summary(side).plan.layers {
            let on_cpu = if (l.layer as u32) < n { m.n_experts as u32 } else { 0 };
            assert_eq!(l.on_cpu, on_cpu, "{mode:?}: layer {}", l.layer);
        }
        let mut cache = model.new_cache(64).unwrap();
        let prompt = SeqStep { tokens: &PROMPT[..3], cache: &mut cache, all_logits: false, verify: false };
        model.forward(&mut [prompt]).unwrap();
        let before = SplitInfo::summary(side).steps;
        let made = device.log.weight_bytes.load(Ordering::SeqCst);
        device.log.clear();
        for t in 0..5u32 {
            let step = SeqStep { tokens: &[t + 10], cache: &mut cache, all_logits: false, verify: false };
            model.forward(&mut [step]).unwrap();
        }
        // A decode step moves each CPU layer's row down and its experts' sum up, once each.
        let crossings = 5 * n as usize;
        assert_eq!(device.log.of_len(h), (crossings, crossings), "{mode:?}: rows crossed");
        let after = SplitInfo::summary(side).steps;
        let k = m.top_k as u64;
        assert_eq!(after.cpu_experts - before.cpu_experts, 5 * u64::from(n) * k, "{mode:?}");
        assert_eq!(after.gpu_experts - before.gpu_experts, 5 * u64::from(layers - n) * k, "{mode:?}");
        assert_eq!(after.crossings - before.crossings, crossings as u64, "{mode:?}");
        assert_eq!(after.bytes_down - before.bytes_down, crossings as u64 * 4 * h as u64, "{mode:?}");
        assert_eq!(after.bytes_up - before.bytes_up, crossings as u64 * 4 * h as u64, "{mode:?}");
        // Decoding, the device was given experts of its own layers only, never one the CPU
        // computes (the prompt may upload them: a_long_prompt_uploads_...).
        let given = device.log.weight_bytes.load(Ordering::SeqCst) - made;
        assert!(given <= u64::from(layers - n) * m.n_experts as u64 * one_expert, "{mode:?}: {given} bytes");
        if n == layers {
            assert_eq!(given, 0, "{mode:?}: expert bytes given the device");
        }
    }
}

#[test]
fn a_long_prompt_uploads_the_layers_experts_where_that_is_faster() {
    use strata::model::decoder::SeqStep;
    let source = fixture("hf/qwen3_moe");
    let h = source.config.hidden_size;
    // Copies that cost nothing and a GPU that computes a batch far faster than the CPU.
    let free_copies = Rates { h2d: f64::INFINITY, ..pcie4(h) };
    let (model, device) = on_device(&source, Some(split(Mode::CpuMoe, 64 * GB, 64 * GB, Some(free_copies))));
    let side = model.cpu_side().unwrap();
    let mut cache = model.new_cache(64).unwrap();
    device.log.clear();
    let prompt = SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false };
    model.forward(&mut [prompt]).unwrap();
    let steps = SplitInfo::summary(side).steps;
    assert_eq!(steps.uploaded_layers, source.config.n_layers as u64, "every layer's experts uploaded for the prompt");
    assert_eq!((steps.crossings, steps.cpu_experts), (0, 0));
    assert_eq!(device.log.of_len(PROMPT.len() * h), (0, 0), "the prompt's rows crossed");
    // A decode step still computes on the CPU.
    model.forward(&mut [SeqStep { tokens: &[3], cache: &mut cache, all_logits: false, verify: false }]).unwrap();
    assert_eq!(SplitInfo::summary(side).steps.crossings, source.config.n_layers as u64);
    let reference = logits(&DecoderModel::new(source.config.clone(), &source, Arc::new(cpu(&source))).unwrap(), 3);
    let d = max_diff(&logits(&model, 3), &reference);
    assert!(d < 1e-4, "{d} from the CPU's");
}

#[test]
fn the_plan_moves_the_experts_in_use_into_vram() {
    let source = fixture("hf/qwen3_moe");
    let c = source.config.clone();
    let n = c.moe.unwrap().n_experts;
    let (experts, cores) = expert_and_core_bytes(&source);
    let one_expert = experts / (c.n_layers * n) as u64;
    // VRAM for the cores and two experts a layer.
    let vram = cores + 2 * c.n_layers as u64 * one_expert;
    let (model, _) = on_device(&source, Some(split(Mode::Auto, vram, 64 * GB, Some(pcie4(c.hidden_size)))));
    let side = model.cpu_side().unwrap();
    let reference = logits(&DecoderModel::new(c.clone(), &source, Arc::new(cpu(&source))).unwrap(), 3);
    for hot in [[n - 1, n - 2], [0, 3]] {
        let weights =
            (0..c.n_layers).map(|_| (0..n).map(|e| if hot.contains(&e) { 100.0 } else { 1.0 }).collect()).collect();
        side.replan(RouterStats { weights });
        for l in 0..c.n_layers {
            for e in 0..n {
                let p = side.placement(ExpertId::new(l as u32, e as u32)).unwrap();
                match hot.contains(&e) {
                    true => assert_eq!((p.home, p.compute), (Tier::Vram, Side::Gpu), "layer {l} expert {e}"),
                    false => assert_ne!(p.home, Tier::Vram, "layer {l} expert {e}: a cold expert in VRAM"),
                }
            }
        }
        let d = max_diff(&logits(&model, 3), &reference);
        assert!(d < 1e-4, "after the plan for {hot:?}: {d} from the CPU's");
    }
    assert_eq!(SplitInfo::summary(side).steps.replans, 2);
}

#[test]
fn the_router_statistics_replan_every_few_passes() {
    let source = fixture("hf/qwen2_moe");
    let rates = Some(pcie4(source.config.hidden_size));
    let opts = SplitOptions { replan_every: 3, ..split(Mode::Auto, 1, 64 * GB, rates) };
    let (model, _) = on_device(&source, Some(opts));
    let _ = logits(&model, 8); // 9 passes
    assert_eq!(SplitInfo::summary(model.cpu_side().unwrap()).steps.replans, 3);
}

#[test]
fn experts_ram_cannot_hold_are_read_from_storage() {
    for rel in ["hf/qwen3_moe", "gguf/qwen3_moe.q8_0.gguf"] {
        let source = fixture(rel);
        let reference = logits(&DecoderModel::new(source.config.clone(), &source, Arc::new(cpu(&source))).unwrap(), 4);
        let (experts, _) = expert_and_core_bytes(&source);
        let rates = Some(pcie4(source.config.hidden_size));
        let (model, _) = on_device(&source, Some(split(Mode::CpuMoe, 64 * GB, experts / 4, rates)));
        let summary = SplitInfo::summary(model.cpu_side().unwrap());
        assert!(summary.plan.totals.storage_bytes > 0, "{rel}: nothing planned on storage");
        let read = model.scheduler().stats().snapshot().bytes_read;
        let d = max_diff(&logits(&model, 4), &reference);
        assert!(d < 1e-4, "{rel}: {d} from the CPU's");
        assert!(model.scheduler().stats().snapshot().bytes_read > read, "{rel}: no expert was read from storage");
    }
}

/// A sequence's rows come out of a split pass as they do when it runs alone (batched
/// with another, or as a verifying sequence's rows each computed as its own step), bit
/// for bit: the sides of a row's experts depend on nothing else in the pass.
#[test]
fn batched_and_verifying_rows_compute_as_they_do_alone() {
    use strata::model::decoder::SeqStep;
    let source = fixture("hf/qwen3_moe");
    let rates = Some(Rates { crossing_s: 0.0, ..pcie4(source.config.hidden_size) });
    let (experts, cores) = expert_and_core_bytes(&source);
    let (model, _) = on_device(&source, Some(split(Mode::Auto, cores + experts / 3, 64 * GB, rates)));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let (a, b) = ([5u32, 17, 99], [250u32, 42]);
    let alone = |tokens: &[u32]| {
        let mut cache = model.new_cache(16).unwrap();
        let step = SeqStep { tokens, cache: &mut cache, all_logits: false, verify: false };
        bits(&model.forward(&mut [step]).unwrap()[0])
    };
    let (want_a, want_b) = (alone(&a), alone(&b));
    let (mut ca, mut cb) = (model.new_cache(16).unwrap(), model.new_cache(16).unwrap());
    let out = model
        .forward(&mut [
            SeqStep { tokens: &a, cache: &mut ca, all_logits: false, verify: false },
            SeqStep { tokens: &b, cache: &mut cb, all_logits: false, verify: false },
        ])
        .unwrap();
    assert_eq!((bits(&out[0]), bits(&out[1])), (want_a, want_b), "batched");
    // Three decode steps one by one, and the same three tokens verified in one pass.
    let steps = [7u32, 64, 3];
    let mut one = Vec::new();
    for t in steps {
        let step = SeqStep { tokens: &[t], cache: &mut ca, all_logits: false, verify: false };
        one.extend(bits(&model.forward(&mut [step]).unwrap()[0]));
    }
    assert!(SplitInfo::summary(model.cpu_side().unwrap()).steps.cpu_experts > 0, "the CPU computed no expert");
    let mut cv = model.new_cache(16).unwrap();
    model.forward(&mut [SeqStep { tokens: &a, cache: &mut cv, all_logits: false, verify: false }]).unwrap();
    let out =
        model.forward(&mut [SeqStep { tokens: &steps, cache: &mut cv, all_logits: false, verify: true }]).unwrap();
    assert_eq!(bits(&out[0]), one, "verified rows");
}

/// The layer cores streamed through the prefetch ring (`--memory-budget 0`) while the
/// CPU computes the experts: the same logits as the CPU alone.
#[test]
fn streamed_cores_and_split_experts_give_the_cpus_logits() {
    for rel in ["hf/qwen3_5_moe", "gguf/qwen3_moe.q8_0.gguf"] {
        let source = fixture(rel);
        let reference = logits(&DecoderModel::new(source.config.clone(), &source, Arc::new(cpu(&source))).unwrap(), 4);
        let rates = Some(Rates { crossing_s: 0.0, ..pcie4(source.config.hidden_size) });
        let sched =
            SchedOptions { budget: Some(0), split: Some(split(Mode::Auto, 1, 64 * GB, rates)), ..Default::default() };
        let device = Arc::new(Device::new(cpu(&source)));
        let model = DecoderModel::with_options(source.config.clone(), &source, device, &sched).unwrap();
        assert!(model.scheduler().is_streaming(), "{rel}: the cores do not stream");
        let d = max_diff(&logits(&model, 4), &reference);
        assert!(d < 1e-4, "{rel}: {d} from the CPU's");
        assert!(SplitInfo::summary(model.cpu_side().unwrap()).steps.cpu_experts > 0, "{rel}: no expert on the CPU");
    }
}

/// `--expert-cache` caps the VRAM the plan gives experts (here none: every expert
/// outside VRAM, all computed on the CPU or uploaded).
#[test]
fn the_expert_cache_size_caps_the_experts_vram() {
    let source = fixture("hf/qwen3_moe");
    let rates = Some(pcie4(source.config.hidden_size));
    let split = Some(split(Mode::Auto, 64 * GB, 64 * GB, rates));
    let cache = Some(strata::sched::experts::CacheSize::Bytes(0));
    let sched = SchedOptions { split, expert_cache: cache, ..Default::default() };
    let device = Arc::new(Device::new(cpu(&source)));
    let model = DecoderModel::with_options(source.config.clone(), &source, device, &sched).unwrap();
    let plan = SplitInfo::summary(model.cpu_side().unwrap()).plan;
    assert_eq!(plan.totals.vram_expert_bytes, 0, "{plan:?}");
    assert!(plan.layers.iter().all(|l| l.in_vram == 0), "{plan:?}");
}

/// Experts the plan uploads from host memory are read from storage once: evicted from
/// the device's small cache, they come back from the host tier behind it.
#[test]
fn experts_uploaded_from_ram_are_read_once() {
    use strata::model::decoder::SeqStep;
    let source = fixture("hf/qwen3_moe");
    let c = source.config.clone();
    let (experts, cores) = expert_and_core_bytes(&source);
    let one_expert = experts / (c.n_layers * c.moe.unwrap().n_experts) as u64;
    // VRAM for one expert a layer; the CPU so slow that the device computes them all,
    // uploading from RAM.
    let slow_cpu = Rates { cpu: 1e3, cpu_gemm: 1e3, ..pcie4(c.hidden_size) };
    let opts = split(Mode::Auto, cores + c.n_layers as u64 * one_expert, 64 * GB, Some(slow_cpu));
    let (model, _) = on_device(&source, Some(opts));
    let side = model.cpu_side().unwrap();
    let plan = SplitInfo::summary(side).plan;
    assert!(plan.layers.iter().all(|l| l.on_cpu == 0 && l.streamed > 0), "{plan:?}");
    let mut cache = model.new_cache(64).unwrap();
    let mut step = |t: u32| {
        let s = SeqStep { tokens: &[t], cache: &mut cache, all_logits: false, verify: false };
        model.forward(&mut [s]).unwrap();
    };
    for t in 0..8 {
        step(t % 4 + 3); // every expert used at least once, most evicted from VRAM since
    }
    let read = model.scheduler().stats().snapshot().bytes_read;
    let e = model.scheduler().summary().experts.unwrap();
    assert!(e.host_tier_bytes > 0, "{e:?}");
    for t in 0..8 {
        step(t % 4 + 3);
    }
    let e = model.scheduler().summary().experts.unwrap();
    assert_eq!(model.scheduler().stats().snapshot().bytes_read, read, "experts read again: {e:?}");
    assert!(e.host_hits > 0, "{e:?}");
}

/// Prints the rates the plan would be made from for the model `STRATA_SPLIT_PROBE` names
/// (the stand-in device computes as the CPU does, so its figures are the CPU's twice):
/// `STRATA_SPLIT_PROBE=MODEL.gguf cargo test --release --test it split::rates_probe --
/// --ignored --nocapture`.
#[test]
#[ignore = "a measurement, run by hand"]
fn rates_probe() {
    let path = std::env::var("STRATA_SPLIT_PROBE").expect("STRATA_SPLIT_PROBE=MODEL");
    let source = ModelSource::from_path(&path).unwrap();
    let (model, _) = on_device(&source, Some(split(Mode::CpuMoe, 64 * GB, 64 * GB, None)));
    let s = SplitInfo::summary(model.cpu_side().unwrap());
    println!("{}", serde_json::to_string_pretty(&s.rates).unwrap());
}
