//! The forward pass on a backend that fuses (`Backend::fused`), as CUDA's fused decode
//! path does: on a stand-in device that takes `Fused::Glu`, `Fused::MatmulAdd` and
//! `Fused::RopeStore` as one op each (computed by the ops each stands for, and counted),
//! every family's logits are the CPU's bit for bit, for each KV cache type, over a
//! prompt, decode steps and a batch of sequences; and a decode step takes exactly the
//! fused ops its layers allow: RoPE and the stores once per sequence and attention layer
//! that rotates, the output and down products added into the residual stream where
//! nothing (a bias, a post-norm, a residual scale) comes between, the gated MLP in one op
//! where it has no biases. A decode step of a dense model whose weights are resident goes
//! to the backend as one piece (`Backend::graphed`, a CUDA graph), which may run it twice:
//! the logits stay the CPU's; prompt passes and MoE models do not.

use std::sync::Arc;

use strata::backend::KvType;
use strata::backend::cpu::CpuBackend;
use strata::model::decoder::{DecoderModel, SeqStep};
use strata::model::{LanguageModel, ModelSource};

use crate::support::decode::{PROMPT, logit_bits_for};
use crate::support::device::Device;

fn fixture(rel: &str) -> ModelSource {
    ModelSource::from_path(&format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn cpu(source: &ModelSource) -> CpuBackend {
    match source.config.linear_attn {
        Some(_) => CpuBackend::new(2).row_invariant(),
        None => CpuBackend::new(2),
    }
}

/// Every family the fusions meet differently: plain llama (GGUF, quantized), biases on
/// q/k/v (Qwen2), Q/K norms (Qwen3), post-norms and softcaps (Gemma 2), norms only after
/// (OLMo 2), a residual scale (Granite), partial RoPE (Phi-3), layers without RoPE
/// (SmolLM3), MoE (Mixtral), attention sinks and windows (gpt-oss), latent attention
/// (DeepSeek-V3: none of these fusions) and a hybrid (Qwen3-Next).
const FIXTURES: [&str; 12] = [
    "gguf/llama3.q8_0.gguf",
    "hf/qwen2",
    "hf/qwen3",
    "hf/gemma2",
    "hf/olmo2",
    "hf/granite",
    "hf/phi3_partial",
    "hf/smollm3",
    "hf/mixtral",
    "hf/gpt_oss",
    "hf/deepseek_v3",
    "hf/qwen3_next",
];

/// The bits of the logits of every prompt position and of greedy decode steps
/// ([`logit_bits_for`]), then of a two-sequence batch step: one sequence's decode row
/// beside another's prompt chunk.
fn logits(model: &dyn LanguageModel, steps: usize) -> Vec<u32> {
    let mut bits = logit_bits_for(model, steps);
    let vocab = model.config().vocab_size as u32;
    let prompt: Vec<u32> = PROMPT.iter().map(|&t| t % vocab).collect();
    let (mut cache, mut other) = (model.new_cache(64).unwrap(), model.new_cache(64).unwrap());
    model.forward(&mut [SeqStep { tokens: &prompt, cache: &mut cache, all_logits: false, verify: false }]).unwrap();
    let batch = model
        .forward(&mut [
            SeqStep { tokens: &[1], cache: &mut cache, all_logits: false, verify: false },
            SeqStep { tokens: &prompt[..3], cache: &mut other, all_logits: true, verify: false },
        ])
        .unwrap();
    bits.extend(batch.concat().iter().map(|v| v.to_bits()));
    bits
}

#[test]
fn fused_ops_give_every_family_the_cpus_logits_bit_for_bit() {
    for rel in FIXTURES {
        let source = fixture(rel);
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let reference = DecoderModel::new(source.config.clone(), &source, Arc::new(cpu(&source))).unwrap();
            let want = logits(&reference.with_kv_type(ty).unwrap(), 3);
            let device = Arc::new(Device::new(cpu(&source)).fusing());
            let model = DecoderModel::new(source.config.clone(), &source, device.clone()).unwrap();
            let got = logits(&model.with_kv_type(ty).unwrap(), 3);
            assert!(got == want, "{rel} {ty:?}: the fused ops changed the logits");
            let ran = device.log.fused("RopeStore") + device.log.fused("MatmulAdd") + device.log.fused("Glu");
            assert!(ran > 0, "{rel}: no fused op ran");
        }
    }
}

/// The fused ops one decode step of `batch` sequences should take on a dense model:
/// (RopeStore, MatmulAdd, Glu).
fn expected(source: &ModelSource, batch: usize) -> (usize, usize, usize) {
    use strata::model::config::{Ffn, LayerRope, Mixer};
    use strata::model::spec::NormPlacement;
    let c = &source.config;
    // Pre-norm only: Gemma's sandwich and OLMo's post-norms come between.
    let plain = c.spec().norms == NormPlacement::Pre && c.residual_scale == 1.0;
    let (mut rope, mut add, mut glu) = (0, 0, 0);
    for (l, layer) in c.layers.iter().enumerate() {
        assert_eq!(layer.ffn, Ffn::Dense, "a dense model");
        let attention = layer.mixer == Mixer::Attention;
        rope += batch * usize::from(attention && layer.rope != LayerRope::None);
        let o_bias = source.tensors.keys().any(|n| n.starts_with(&format!("model.layers.{l}.self_attn.o_proj.bias")));
        add += usize::from(attention && plain && !o_bias) + usize::from(plain);
        glu += 1;
    }
    (rope, add, glu)
}

#[test]
fn a_decode_step_takes_the_fused_ops_its_layers_allow() {
    for rel in
        ["gguf/llama3.q8_0.gguf", "hf/qwen2", "hf/gemma2", "hf/olmo2", "hf/granite", "hf/smollm3", "hf/phi3_partial"]
    {
        let source = fixture(rel);
        let device = Arc::new(Device::new(cpu(&source)).fusing());
        let model = DecoderModel::new(source.config.clone(), &source, device.clone()).unwrap();
        let vocab = source.config.vocab_size as u32;
        let (mut a, mut b) = (model.new_cache(16).unwrap(), model.new_cache(16).unwrap());
        let prompt = [3 % vocab, 5 % vocab];
        for cache in [&mut a, &mut b] {
            model.forward(&mut [SeqStep { tokens: &prompt, cache, all_logits: false, verify: false }]).unwrap();
        }
        device.log.clear();
        model
            .forward(&mut [
                SeqStep { tokens: &[7 % vocab], cache: &mut a, all_logits: false, verify: false },
                SeqStep { tokens: &[9 % vocab], cache: &mut b, all_logits: false, verify: false },
            ])
            .unwrap();
        let log = &device.log;
        let got = (log.fused("RopeStore"), log.fused("MatmulAdd"), log.fused("Glu"));
        assert_eq!(got, expected(&source, 2), "{rel}: (RopeStore, MatmulAdd, Glu) in one decode step of two sequences");
    }
}

#[test]
fn decode_steps_go_to_the_backend_as_one_piece_that_may_run_twice() {
    for (rel, dense) in [("gguf/llama3.q8_0.gguf", true), ("hf/gemma2", true), ("hf/mixtral", false)] {
        let source = fixture(rel);
        let reference = DecoderModel::new(source.config.clone(), &source, Arc::new(cpu(&source))).unwrap();
        let want = logits(&reference.with_kv_type(KvType::F16).unwrap(), 3);
        let device = Arc::new(Device::new(cpu(&source)).fusing().graphing());
        let model = DecoderModel::new(source.config.clone(), &source, device.clone()).unwrap();
        let got = logits(&model.with_kv_type(KvType::F16).unwrap(), 3);
        assert!(got == want, "{rel}: a pass run twice changed the logits");
        // Three one-sequence decode steps; the prompts and the batch beside a prompt are not.
        let graphed = device.log.graphed.lock().unwrap().clone();
        assert_eq!(graphed, if dense { vec![1, 1, 1] } else { vec![] }, "{rel}: the passes handed over as one piece");
    }
}
