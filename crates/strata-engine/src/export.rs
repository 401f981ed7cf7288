//! `strata export`: any model Strata reads (Hugging Face directory, GGUF, flat, `.cawsf`)
//! as a GGUF file that llama.cpp loads: its architecture's metadata, llama.cpp's tensor
//! names and layouts, the tokenizer and the chat template.
//!
//! Everything is the inverse of what Strata does when it reads a GGUF
//! (`model::gguf_source`, `model::gguf_vocab`), and the export checks itself against that
//! reading before it keeps the file: the GGUF read back must give the source's model
//! config, and its tokenizer must tokenize a test text as the source's does. A model with
//! something GGUF cannot say for its family (a setting llama.cpp fixes otherwise, a
//! tokenizer no llama.cpp pre-tokenizer reproduces) is refused, naming it, rather than
//! written wrong. Tensors are converted one at a time, so memory stays O(one tensor).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value;

use strata_format::gguf::GgufValue;
use strata_format::gguf_write::{self, TensorEntry};
use strata_format::requant::{self, QuantShortfall};
use strata_model::ModelSource;
use strata_model::config::{
    Ffn, GroupScore, LayerRope, Mixer, MlaConfig, ModelConfig, MoeConfig, RopeScaling, Scoring,
};
use strata_model::shapes;
use strata_model::spec::{self, Arch, ArchSpec, Role};
use strata_quant::ReadF32;
use strata_tensor::tensor::{DType, HostTensor};

mod vocab;
use vocab::{chat_template, tokenizer_keys};

/// What an export did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ExportReport {
    pub architecture: String,
    pub tensors: usize,
    /// Tensors whose dtype changed.
    pub converted: usize,
    /// Weight matrices not stored in the `quant` asked for, and what they were stored as.
    pub shortfall: QuantShortfall,
    pub bytes: u64,
    /// `tokenizer.ggml.model` and `tokenizer.ggml.pre`.
    pub tokenizer: String,
    /// What llama.cpp will do differently from Strata with this model, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// GGUF metadata: keys and values, in the order written.
type Metadata = Vec<(String, GgufValue)>;

/// Where one GGUF tensor's data comes from.
enum Source {
    /// A tensor of the source, under its Hugging Face name, with the changes it needs.
    One { hf: String, fix: Fix },
    /// Routed experts' tensors stacked, expert 0 first: matrices `[experts, rows, cols]`,
    /// biases (gpt-oss) `[experts, width]`.
    Stacked(Vec<String>),
    /// Values computed here (`rope_freqs.weight`).
    Values(Vec<f32>),
    /// A tensor of the source, through f32: the rows (first dimension) `rows` picks, in
    /// that order, then the columns `cols` picks, then `-exp` where `neg_exp` (how
    /// llama.cpp's converter lays out the gated-delta-rule layers; see [`hybrid`]).
    Mapped { hf: String, rows: Option<Vec<usize>>, cols: Option<Vec<usize>>, neg_exp: bool },
    /// Latent attention's `kv_b_proj` split as llama.cpp's converter splits it (see
    /// [`split_kv_b`]): each head's key rows transposed (`attn_k_b`), or its value rows
    /// (`attn_v_b`).
    KvB { hf: String, key: bool },
}

#[derive(Clone, Copy, PartialEq)]
enum Fix {
    None,
    /// llama.cpp's Q/K row order (`convert_hf_to_gguf.py`'s permutation) over this many
    /// heads.
    Permute(usize),
    /// Gemma's norms: GGUF holds `1 + w`.
    PlusOne,
}

/// Writes `src` to `out` (which must not exist) as GGUF, with weight matrices in `quant`
/// where given (else as stored, or F32 where llama.cpp does not read the stored type).
pub fn export(src: &ModelSource, out: &Path, quant: Option<DType>, threads: usize) -> anyhow::Result<ExportReport> {
    if out.exists() {
        bail!("{}: already exists; choose another output or remove it first", out.display());
    }
    let c = &src.config;
    let spec = c.spec();
    if c.neuron_group.is_some() {
        bail!(
            "model `{}` stores its FFNs as neuron-group bundles (`convert --sparse-ffn`), which GGUF has no \
             layout for; export the model it was converted from",
            src.name
        );
    }
    shapes::check_tensors(c, &src.tensors).with_context(|| format!("model `{}`", src.name))?;
    let (name, tok_keys, tok_name, tok_note) = tokenizer_keys(src)?;
    let mut meta = metadata(src, &name)?;
    meta.extend(tok_keys);
    if let Some(t) = chat_template(src) {
        meta.push(("tokenizer.chat_template".into(), GgufValue::String(t)));
    }

    let (entries, sources) = plan(src, spec, quant)?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("building a thread pool")?;
    let mut converted = 0;
    let data = |i: usize| -> anyhow::Result<Vec<u8>> {
        let e = &entries[i];
        let data = match &sources[i] {
            Source::Values(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Source::One { hf, fix } => {
                src.sums.check(hf)?;
                let t = &src.tensors[hf];
                converted += usize::from(t.dtype != e.dtype);
                let t = match fix {
                    Fix::PlusOne => HostTensor::from_f32(
                        &t.to_f32_vec().iter().map(|w| w + 1.0).collect::<Vec<_>>(),
                        t.shape.clone(),
                    ),
                    _ => t.clone(),
                };
                let bytes = in_dtype(&pool, hf, &t, e.dtype)?;
                match fix {
                    Fix::Permute(heads) => permute_rows(&bytes, t.shape[0], *heads)
                        .with_context(|| format!("tensor `{hf}`: {heads} heads"))?,
                    _ => bytes,
                }
            }
            Source::Mapped { hf, rows, cols, neg_exp } => {
                src.sums.check(hf)?;
                let t = &src.tensors[hf];
                converted += usize::from(t.dtype != e.dtype);
                let mapped = map_f32(t, rows.as_deref(), cols.as_deref(), *neg_exp, &e.shape);
                in_dtype(&pool, hf, &mapped, e.dtype)?
            }
            Source::KvB { hf, key } => {
                src.sums.check(hf)?;
                let t = &src.tensors[hf];
                converted += usize::from(t.dtype != e.dtype);
                let mla = c.mla.context("kv_b_proj outside latent attention")?;
                let split = split_kv_b(&t.to_f32_vec(), c.n_heads, &mla, *key);
                in_dtype(&pool, hf, &HostTensor::from_f32(&split, e.shape.clone()), e.dtype)?
            }
            Source::Stacked(names) => {
                let mut all = Vec::with_capacity(e.bytes()?);
                for hf in names {
                    src.sums.check(hf)?;
                    let t = &src.tensors[hf];
                    converted += usize::from(t.dtype != e.dtype);
                    all.extend(in_dtype(&pool, hf, t, e.dtype)?);
                }
                all
            }
        };
        Ok(data)
    };
    // Read it back as Strata reads any GGUF: the same model, or no file.
    let read_back = |tmp: &Path| {
        check(src, tmp).with_context(|| {
            format!("{}: the export does not read back as `{}`; nothing written", out.display(), src.name)
        })
    };
    let bytes = gguf_write::write(out, &meta, &entries, data, read_back)?;
    let window = c.layers.iter().find_map(|l| l.sliding_window).filter(|_| c.arch == Arch::Mistral);
    let window = window.map(|w| {
        format!("llama.cpp runs Mistral as `llama`, without its sliding window: past {w} tokens its outputs differ")
    });
    let notes: Vec<String> = window.into_iter().chain(yarn_note(c)).chain(routing_note(src)).chain(tok_note).collect();
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok(ExportReport {
        architecture: gguf_arch(c).into(),
        tensors: entries.len(),
        converted,
        shortfall: QuantShortfall::of(&src.tensors, quant),
        bytes,
        tokenizer: tok_name,
        note,
    })
}

/// The GGUF's `general.*` and architecture keys: the inverse of
/// `gguf_source::config_from_gguf`, family by family.
fn metadata(src: &ModelSource, name: &str) -> anyhow::Result<Metadata> {
    let c = &src.config;
    let a = gguf_arch(c);
    let mut m: Metadata = Vec::new();
    let mut put = |k: &str, v: GgufValue| m.push((k.to_string(), v));
    let u = |x: usize| GgufValue::U32(x as u32);
    put("general.architecture", GgufValue::String(a.into()));
    put("general.name", GgufValue::String(name.into()));
    put(&format!("{a}.context_length"), u(c.max_position_embeddings));
    put(&format!("{a}.embedding_length"), u(c.hidden_size));
    put(&format!("{a}.block_count"), u(c.n_layers));
    put(&format!("{a}.feed_forward_length"), u(c.intermediate_size));
    put(&format!("{a}.attention.head_count"), u(c.n_heads));
    // llama.cpp runs latent attention as one KV head of the latent and the RoPE key
    // (values: the latent), the heads' own widths under `*_mla`.
    let (kv_heads, key_len, value_len) = match c.mla {
        Some(a) => (1, a.cache_width(), a.kv_lora_rank),
        None => (c.n_kv_heads, c.head_dim, c.head_dim),
    };
    put(&format!("{a}.attention.head_count_kv"), u(kv_heads));
    put(&format!("{a}.attention.key_length"), u(key_len));
    put(&format!("{a}.attention.value_length"), u(value_len));
    put(&format!("{a}.rope.dimension_count"), u(c.rotary_dim));
    put(&format!("{a}.attention.layer_norm_rms_epsilon"), GgufValue::F32(c.rms_norm_eps));
    put(&format!("{a}.rope.freq_base"), GgufValue::F32(c.rope_theta));
    if let Some(w) = c.layers.iter().find_map(|l| l.sliding_window).filter(|_| c.arch != Arch::Mistral) {
        put(&format!("{a}.attention.sliding_window"), u(w));
        let pattern = c.layers.iter().map(|l| GgufValue::Bool(l.sliding_window.is_some())).collect();
        put(&format!("{a}.attention.sliding_window_pattern"), GgufValue::Array(pattern));
    }
    if c.arch == Arch::Gemma3 {
        put(&format!("{a}.rope.freq_base_swa"), GgufValue::F32(c.rope_local_theta));
    }
    if let Some(cap) = c.attn_softcap {
        put(&format!("{a}.attn_logit_softcapping"), GgufValue::F32(cap));
    }
    if let Some(cap) = c.final_softcap {
        put(&format!("{a}.final_logit_softcapping"), GgufValue::F32(cap));
    }
    if c.arch == Arch::Granite {
        put(&format!("{a}.attention.scale"), GgufValue::F32(c.attn_scale));
        put(&format!("{a}.embedding_scale"), GgufValue::F32(c.embed_scale));
        put(&format!("{a}.residual_scale"), GgufValue::F32(c.residual_scale));
        put(&format!("{a}.logit_scale"), GgufValue::F32(c.logits_divisor));
        if c.layers.iter().all(|l| l.rope == LayerRope::None) {
            put(&format!("{a}.rope.scaling.finetuned"), GgufValue::Bool(false));
        }
    }
    if let Some(moe) = c.moe {
        put(&format!("{a}.expert_count"), u(moe.n_experts));
        put(&format!("{a}.expert_used_count"), u(moe.top_k));
        if c.arch != Arch::Mixtral {
            put(&format!("{a}.expert_feed_forward_length"), u(moe.expert_size));
        }
        match c.arch {
            Arch::DeepseekV3 | Arch::Glm4Moe => {
                for (k, v) in deepseek_routing(c, &moe)? {
                    put(&format!("{a}.{k}"), v);
                }
            }
            _ => {
                if let Some(s) = moe.shared_expert_size {
                    put(&format!("{a}.expert_shared_feed_forward_length"), u(s));
                }
            }
        }
    }
    if let Some(mla) = c.mla {
        if !mla.rope_interleave {
            bail!("llama.cpp's `{a}` rotates interleaved pairs; this model rotates halves (`rope_interleave` false)");
        }
        // llama.cpp requires the key: 0 for queries without the bottleneck.
        put(&format!("{a}.attention.q_lora_rank"), u(mla.q_lora_rank.unwrap_or(0)));
        put(&format!("{a}.attention.kv_lora_rank"), u(mla.kv_lora_rank));
        put(&format!("{a}.attention.key_length_mla"), u(mla.qk_head_dim()));
        put(&format!("{a}.attention.value_length_mla"), u(mla.v_head_dim));
        if let Some(log_mul) = mla_log_multiplier(c, &mla)? {
            // Stored times 0.1, as llama.cpp's converter writes it.
            put(&format!("{a}.rope.scaling.yarn_log_multiplier"), GgufValue::F32(0.1 * log_mul));
        }
    }
    if let Some(la) = c.linear_attn {
        put(&format!("{a}.ssm.conv_kernel"), u(la.conv_kernel));
        put(&format!("{a}.ssm.state_size"), u(la.k_head_dim));
        put(&format!("{a}.ssm.group_count"), u(la.n_k_heads));
        put(&format!("{a}.ssm.time_step_rank"), u(la.n_v_heads));
        put(&format!("{a}.ssm.inner_size"), u(la.n_v_heads * la.v_head_dim));
        let recurrent = c.layers.iter().map(|l| GgufValue::Bool(l.mixer == Mixer::Linear)).collect();
        put(&format!("{a}.attention.recurrent_layers"), GgufValue::Array(recurrent));
        if c.arch != Arch::Qwen3Next {
            // Qwen3.5's interleaved multimodal RoPE, which llama.cpp requires: on text
            // (one position for every section) it is plain RoPE over the same dims.
            let sections = mrope_sections(src, c.rotary_dim / 2);
            put(&format!("{a}.rope.dimension_sections"), GgufValue::Array(sections.map(GgufValue::I32).to_vec()));
        }
    }
    match c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            put(&format!("{a}.rope.scaling.type"), GgufValue::String("linear".into()));
            put(&format!("{a}.rope.scaling.factor"), GgufValue::F32(factor));
        }
        // The per-frequency divisors go in `rope_freqs.weight` (see `plan`).
        RopeScaling::Llama3 { original_max_position, .. } => {
            put(&format!("{a}.rope.scaling.original_context_length"), u(original_max_position as usize));
        }
        RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow, attention_factor, .. } => {
            put(&format!("{a}.rope.scaling.type"), GgufValue::String("yarn".into()));
            put(&format!("{a}.rope.scaling.factor"), GgufValue::F32(factor));
            put(&format!("{a}.rope.scaling.original_context_length"), u(original_max_position as usize));
            put(&format!("{a}.rope.scaling.yarn_beta_fast"), GgufValue::F32(beta_fast));
            put(&format!("{a}.rope.scaling.yarn_beta_slow"), GgufValue::F32(beta_slow));
            // llama.cpp's DeepSeek scales cos and sin by nothing unless told otherwise.
            if c.mla.is_none() || attention_factor != 1.0 {
                put(&format!("{a}.rope.scaling.yarn_attn_factor"), GgufValue::F32(attention_factor));
            }
        }
    }
    Ok(m)
}

/// DeepSeek's and GLM-4.5's routing as llama.cpp's `deepseek2` and `glm4moe` keys: the
/// leading dense layers, shared experts (a multiple of the expert width), the weights'
/// scale and normalization, expert groups and the gating function.
fn deepseek_routing(c: &ModelConfig, m: &MoeConfig) -> anyhow::Result<Metadata> {
    let u = |x: usize| GgufValue::U32(x as u32);
    let dense = c.layers.iter().take_while(|l| l.ffn == Ffn::Dense).count();
    if c.layers[dense..].iter().any(|l| l.ffn != Ffn::Moe) {
        bail!(
            "only the first layers may be dense in a `{}` GGUF; this model has a dense layer after a MoE one",
            gguf_arch(c)
        );
    }
    let shared = m.shared_expert_size.unwrap_or(0);
    if !shared.is_multiple_of(m.expert_size.max(1)) {
        bail!("the shared expert's width {shared} is not a multiple of the expert width {}", m.expert_size);
    }
    let mut keys: Metadata = vec![
        ("leading_dense_block_count".into(), u(dense)),
        ("expert_shared_count".into(), u(shared / m.expert_size.max(1))),
        ("expert_weights_scale".into(), GgufValue::F32(m.routed_scale)),
    ];
    if m.norm_topk_prob {
        keys.push(("expert_weights_norm".into(), GgufValue::Bool(true)));
    }
    keys.push(("expert_group_count".into(), u(m.groups)));
    keys.push(("expert_group_used_count".into(), u(m.groups_used)));
    let gating = match m.scoring {
        Scoring::Softmax => 1,
        Scoring::Sigmoid => 2,
    };
    keys.push(("expert_gating_func".into(), u(gating)));
    Ok(keys)
}

/// YaRN's `mscale_all_dim` of latent attention, recovered from the softmax scale
/// (`qk_head_dim^-0.5 · mscale²`, `mscale = 0.1 · mscale_all_dim · ln factor + 1`), or
/// `None` for the plain scale; a scale GGUF cannot say is refused.
fn mla_log_multiplier(c: &ModelConfig, mla: &MlaConfig) -> anyhow::Result<Option<f32>> {
    let plain = (mla.qk_head_dim() as f32).powf(-0.5);
    if (c.attn_scale / plain - 1.0).abs() < 1e-6 {
        return Ok(None);
    }
    let factor = match c.rope_scaling {
        RopeScaling::Yarn { factor, .. } if factor > 1.0 => factor,
        _ => bail!(
            "the attention scale {} is not qk_head_dim^-0.5 = {plain} and there is no YaRN factor to explain it: \
             GGUF cannot say it",
            c.attn_scale
        ),
    };
    let mscale = (c.attn_scale / plain).sqrt();
    Ok(Some((mscale - 1.0) / (0.1 * factor.ln())))
}

/// Qwen3.5's `mrope_section` from its config (padded with a zero), or the three
/// sections Hugging Face's default split gives `half` rotary pairs ([11, 11, 10] of 32).
fn mrope_sections(src: &ModelSource, half: usize) -> [i32; 4] {
    let j: Value = serde_json::from_str(&src.config_json).unwrap_or(Value::Null);
    let text = j.get("text_config").unwrap_or(&j);
    let given = ["rope_parameters", "rope_scaling"]
        .iter()
        .find_map(|k| text.get(*k)?.get("mrope_section")?.as_array().cloned())
        .map(|a| a.iter().filter_map(Value::as_i64).map(|x| x as i32).collect::<Vec<_>>())
        .filter(|v| v.len() == 3 && v.iter().sum::<i32>() as usize == half);
    match given {
        Some(v) => [v[0], v[1], v[2], 0],
        None => {
            let (s, rem) = ((half / 3) as i32, (half % 3) as i32);
            [s + i32::from(rem > 0), s + i32::from(rem > 1), s, 0]
        }
    }
}

/// The `general.architecture` llama.cpp runs the model as: its family's, except Mistral,
/// which llama.cpp (like its converter) runs as `llama`, without a sliding window.
fn gguf_arch(c: &ModelConfig) -> &'static str {
    match c.arch {
        Arch::Mistral => "llama",
        _ => c.spec().gguf_arch,
    }
}

/// What reading the export back must give: the source's config, Mistral's as llama.cpp
/// runs it ([`gguf_arch`]).
fn expected_config(c: &ModelConfig) -> ModelConfig {
    let mut c = c.clone();
    if let Some(la) = &mut c.linear_attn {
        // Laid out as llama.cpp's converter leaves it (see `hybrid`).
        la.gguf_layout = true;
        la.v_tiled = c.arch != Arch::Qwen3Next;
    }
    if c.arch == Arch::Mistral {
        c.arch = Arch::Llama;
        c.layers.iter_mut().for_each(|l| l.sliding_window = None);
    }
    if let Some(mla) = &mut c.mla {
        mla.split_kv_b = true;
    }
    if let Some(m) = c.moe.as_mut().filter(|_| matches!(c.arch, Arch::DeepseekV3 | Arch::Glm4Moe)) {
        // As llama.cpp routes (see `routing_note`).
        m.group_mask_zero = false;
        m.group_score = GroupScore::TopTwoSum;
    }
    // Multi-token-prediction layers are not exported.
    c.nextn_layers = 0;
    // GGUF has no key for YaRN without rounding: llama.cpp always rounds the correction
    // range to whole dimensions (see `yarn_note`).
    if let RopeScaling::Yarn { truncate, .. } = &mut c.rope_scaling {
        *truncate = true;
    }
    c
}

/// What llama.cpp's YaRN does differently from this model's, if anything: it rounds the
/// correction range to whole dimensions (transformers' `truncate`, on by default), which
/// gpt-oss turns off (`truncate: false`). Said only when that moves a frequency.
fn yarn_note(c: &ModelConfig) -> Option<String> {
    let RopeScaling::Yarn { truncate: false, .. } = c.rope_scaling else { return None };
    let own = c.rope_freqs().inv_freq;
    let rounded = expected_config(c).rope_freqs().inv_freq;
    let moved = own.iter().zip(&rounded).filter(|(a, b)| a != b).count();
    let worst = own.iter().zip(&rounded).map(|(a, b)| (a / b - 1.0).abs()).fold(0.0f32, f32::max);
    (moved > 0).then(|| {
        format!(
            "llama.cpp rounds YaRN's correction range to whole dimensions, which this model does not (`truncate` \
             false): {moved} of its {} RoPE frequencies differ, by up to {:.1}%",
            own.len(),
            100.0 * worst
        )
    })
}

/// How llama.cpp's grouped routing differs from this model's, if it can: it scores a
/// group by its two best experts (DeepSeek-V2's `group_limited_greedy` by its best), and
/// leaves the groups not chosen at minus infinity (transformers' DeepSeek-V3 at 0, which
/// differs only when a biased score is below 0, so only with a negative choice bias).
fn routing_note(src: &ModelSource) -> Option<String> {
    let m = src.config.moe.filter(|m| m.groups_used < m.groups)?;
    if m.group_score == GroupScore::Max {
        return Some(format!(
            "llama.cpp ranks expert groups by the sum of their two best scores, this model by its best: \
             where they differ, it keeps other groups of the {}",
            m.groups
        ));
    }
    let negative = src
        .tensors
        .iter()
        .filter(|(n, _)| n.ends_with("mlp.gate.e_score_correction_bias"))
        .any(|(_, t)| t.to_f32_vec().iter().any(|&b| b < 0.0));
    (m.group_mask_zero && m.choice_bias && negative).then(|| {
        "llama.cpp leaves the expert groups not chosen at minus infinity, where this model counts them as 0: with \
         its negative choice biases, a token whose biased scores fall below 0 may take other experts"
            .to_string()
    })
}

/// The GGUF tensor table, in llama.cpp's order (token embedding, output norm, output,
/// then the layers), and where each one's data comes from.
fn plan(src: &ModelSource, spec: &ArchSpec, quant: Option<DType>) -> anyhow::Result<(Vec<TensorEntry>, Vec<Source>)> {
    let c = &src.config;
    let mut entries = Vec::new();
    let mut sources = Vec::new();
    let dtype_for = |hf: &str, t: &HostTensor| -> DType {
        // llama.cpp reads 1-D tensors (norms, biases) as F32, as its converter writes them.
        if t.shape.len() == 1 {
            return DType::F32;
        }
        match requant::target_dtype(hf, t, quant) {
            Some(d) => d,
            None if gguf_write::ggml_type(t.dtype).is_some() => t.dtype,
            None => DType::F32,
        }
    };
    for (hf, gguf) in [spec::EMBED, spec::OUTPUT_NORM, spec::OUTPUT] {
        if let Some(t) = src.tensors.get(hf) {
            let fix = if spec.hf_norm_offset && hf == spec::OUTPUT_NORM.0 { Fix::PlusOne } else { Fix::None };
            entries.push(TensorEntry { name: gguf.into(), shape: t.shape.clone(), dtype: dtype_for(hf, t) });
            sources.push(Source::One { hf: hf.into(), fix });
        }
    }
    if let RopeScaling::Llama3 { .. } = c.rope_scaling {
        // llama.cpp divides each frequency by its factor from `rope_freqs.weight`.
        let scaled = c.rope_freqs().inv_freq;
        let plain = ModelConfig { rope_scaling: RopeScaling::None, ..c.clone() }.rope_freqs().inv_freq;
        let divisors: Vec<f32> = plain.iter().zip(&scaled).map(|(p, s)| p / s).collect();
        entries.push(TensorEntry { name: "rope_freqs.weight".into(), shape: vec![divisors.len()], dtype: DType::F32 });
        sources.push(Source::Values(divisors));
    }
    for l in 0..c.n_layers {
        let prefix = format!("model.layers.{l}.");
        let mut names: Vec<&String> = src.tensors.keys().filter(|n| n.starts_with(&prefix)).collect();
        names.sort();
        let mut stacks: BTreeMap<&'static str, Vec<(usize, String)>> = BTreeMap::new();
        for hf in names {
            let local = &hf[prefix.len()..];
            let t = &src.tensors[hf];
            let found = spec.tensors.iter().find_map(|n| match n.hf.split_once('*') {
                None => (n.hf == local).then_some((n, None)),
                Some((pre, post)) => {
                    let e = local.strip_prefix(pre)?.strip_suffix(post)?.parse::<usize>().ok()?;
                    Some((n, Some(e)))
                }
            });
            let Some((name, expert)) = found else {
                bail!("tensor `{hf}` has no llama.cpp name in a `{}` model", spec.gguf_arch);
            };
            if let Some(e) = expert {
                stacks.entry(name.gguf).or_default().push((e, hf.clone()));
                continue;
            }
            if name.role == Role::MlaKvB {
                let mla = c.mla.context("kv_b_proj outside latent attention")?;
                let (h, r) = (c.n_heads, mla.kv_lora_rank);
                let want = [h * (mla.qk_nope_head_dim + mla.v_head_dim), r];
                if t.shape != want {
                    bail!("tensor `{hf}` is {:?}, not the {want:?} of {h} heads", t.shape);
                }
                for (gguf, key, shape) in [
                    ("attn_k_b.weight", true, [h, r, mla.qk_nope_head_dim]),
                    ("attn_v_b.weight", false, [h, mla.v_head_dim, r]),
                ] {
                    let as_matrix = [shape[0] * shape[1], shape[2]];
                    let dtype = match requant::target_dtype_for(hf, t.dtype, &as_matrix, quant) {
                        Some(d) => d,
                        None if gguf_write::ggml_type(t.dtype).is_some() => t.dtype,
                        None => DType::F32,
                    };
                    entries.push(TensorEntry { name: format!("blk.{l}.{gguf}"), shape: shape.to_vec(), dtype });
                    sources.push(Source::KvB { hf: hf.clone(), key });
                }
                continue;
            }
            if let Some(mapped) = hybrid(c, name.role, hf, t)? {
                for (gguf, shape, source) in mapped {
                    let dtype = if shape.len() == 1 || f32_only(&gguf) { DType::F32 } else { dtype_for(hf, t) };
                    entries.push(TensorEntry { name: format!("blk.{l}.{gguf}"), shape, dtype });
                    sources.push(source);
                }
                continue;
            }
            let gguf = format!("blk.{l}.{}", name.gguf);
            let stem = name.gguf.rsplit_once('.').map_or(name.gguf, |(s, _)| s);
            let fix = match (spec.gguf_qk_permuted, stem) {
                (true, "attn_q") => Fix::Permute(c.n_heads),
                (true, "attn_k") => Fix::Permute(c.n_kv_heads),
                _ if spec.hf_norm_offset && name.role.is_norm() => Fix::PlusOne,
                _ => Fix::None,
            };
            // llama.cpp holds the shared expert's gate as a vector.
            let shape = match (name.role, &t.shape[..]) {
                (Role::SharedExpertGate, &[1, h]) => vec![h],
                _ => t.shape.clone(),
            };
            let dtype = if shape.len() == 1 || f32_only(&gguf) { DType::F32 } else { dtype_for(hf, t) };
            entries.push(TensorEntry { name: gguf, shape, dtype });
            sources.push(Source::One { hf: hf.clone(), fix });
        }
        for (gguf, mut experts) in stacks {
            experts.sort();
            let n = c.moe.map_or(0, |m| m.n_experts);
            if experts.len() != n || experts.iter().enumerate().any(|(i, (e, _))| *e != i) {
                bail!("layer {l}: `{gguf}` has {} of the {n} experts", experts.len());
            }
            let first = &src.tensors[&experts[0].1];
            // Every expert's bytes follow the first's (in its dtype), so each must be its shape.
            if let Some((_, hf)) = experts.iter().find(|(_, hf)| src.tensors[hf].shape != first.shape) {
                bail!(
                    "layer {l}: `{hf}` is {:?}, expert 0's `{}` {:?}: `{gguf}` stacks them alike",
                    src.tensors[hf].shape,
                    experts[0].1,
                    first.shape
                );
            }
            // A vector per expert (gpt-oss's biases) stacks into `[experts, width]`, F32.
            let dtype = dtype_for(&experts[0].1, first);
            let mut shape = vec![n];
            shape.extend(&first.shape);
            entries.push(TensorEntry { name: format!("blk.{l}.{gguf}"), shape, dtype });
            sources.push(Source::Stacked(experts.into_iter().map(|(_, hf)| hf).collect()));
        }
        if c.layers[l].ffn == Ffn::Moe && c.moe.is_none() {
            bail!("layer {l} routes, but the model has no experts");
        }
    }
    Ok((entries, sources))
}

/// One half of `kv_b_proj` (`[heads · (qk_nope + v_head), kv_lora]`, each head's key
/// rows then its value rows) as llama.cpp's converter writes it: the key rows of each
/// head transposed, `[heads, kv_lora, qk_nope]`, or the value rows, `[heads, v_head,
/// kv_lora]`.
fn split_kv_b(kv_b: &[f32], heads: usize, mla: &MlaConfig, key: bool) -> Vec<f32> {
    let (nope, v, r) = (mla.qk_nope_head_dim, mla.v_head_dim, mla.kv_lora_rank);
    let row = |h: usize, i: usize| &kv_b[(h * (nope + v) + i) * r..(h * (nope + v) + i + 1) * r];
    let mut out = Vec::with_capacity(kv_b.len());
    for h in 0..heads {
        match key {
            true => (0..r).for_each(|j| out.extend((0..nope).map(|i| row(h, i)[j]))),
            false => (0..v).for_each(|i| out.extend_from_slice(row(h, nope + i))),
        }
    }
    out
}

/// A gated-delta-rule tensor of a Hugging Face checkpoint as llama.cpp's converter
/// writes it (`convert_hf_to_gguf.py`, Qwen3-Next and Qwen3.5), or `None` for a tensor
/// exported as it is (every tensor of a source already in that layout, a GGUF):
/// - Qwen3-Next's `in_proj_qkvz`, grouped by key head (`[q, k, v, z]` per head), becomes
///   `attn_qkv` (every q, every k, every v) and `attn_gate` (every z);
/// - `A_log` becomes `ssm_a = -exp(A_log)`, the convolution `[channels, 1, taps]`
///   becomes `[channels, taps]`;
/// - Qwen3.5's value heads, grouped by key head (head `g · r + j`, `r` value heads per
///   key head), are put in tiled order (head `j · n_k + g`) wherever they appear: the
///   value rows of `in_proj_qkv` and of the convolution, `in_proj_z`, `in_proj_b`,
///   `in_proj_a`, `A_log`, `dt_bias`, and the columns of `out_proj`.
///
/// Each result: the llama.cpp name after `blk.N.`, the shape, and where the data comes from.
#[allow(clippy::type_complexity)]
fn hybrid(
    c: &ModelConfig,
    role: Role,
    hf: &str,
    t: &HostTensor,
) -> anyhow::Result<Option<Vec<(String, Vec<usize>, Source)>>> {
    let Some(la) = c.linear_attn.filter(|la| !la.gguf_layout) else { return Ok(None) };
    let (nk, nv, dk, dv) = (la.n_k_heads, la.n_v_heads, la.k_head_dim, la.v_head_dim);
    let r = nv / nk.max(1);
    let tile = c.arch != Arch::Qwen3Next && !la.v_tiled;
    // `base..` plus heads of `hd` rows put in tiled order (or left as they are).
    let heads = |base: usize, hd: usize| -> Vec<usize> {
        let order: Vec<usize> = match tile {
            true => (0..r).flat_map(|j| (0..nk).map(move |g| g * r + j)).collect(),
            false => (0..nv).collect(),
        };
        order.into_iter().flat_map(|h| base + h * hd..base + (h + 1) * hd).collect()
    };
    let qk = 2 * nk * dk;
    let with_qk = |hd: usize| -> Vec<usize> { (0..qk).chain(heads(qk, hd)).collect() };
    let mapped = |rows: Option<Vec<usize>>, cols: Option<Vec<usize>>, neg_exp: bool| Source::Mapped {
        hf: hf.to_string(),
        rows,
        cols,
        neg_exp,
    };
    let shape = t.shape.clone();
    let out = match role {
        Role::LinQkvz => {
            let blk = 2 * dk + 2 * r * dv;
            let part = |from: usize, len: usize| -> Vec<usize> {
                (0..nk).flat_map(|g| g * blk + from..g * blk + from + len).collect()
            };
            let qkv: Vec<usize> = [part(0, dk), part(dk, dk), part(2 * dk, r * dv)].concat();
            let z = part(2 * dk + r * dv, r * dv);
            let cols = shape[1];
            vec![
                ("attn_qkv.weight".into(), vec![qkv.len(), cols], mapped(Some(qkv), None, false)),
                ("attn_gate.weight".into(), vec![z.len(), cols], mapped(Some(z), None, false)),
            ]
        }
        Role::LinALog => vec![("ssm_a".into(), shape, mapped(Some(heads(0, 1)), None, true))],
        Role::LinConv => {
            let (channels, taps) = (shape[0], shape.iter().skip(1).product::<usize>());
            vec![("ssm_conv1d.weight".into(), vec![channels, taps], mapped(Some(with_qk(dv)), None, false))]
        }
        Role::LinQkv if tile => vec![("attn_qkv.weight".into(), shape, mapped(Some(with_qk(dv)), None, false))],
        Role::LinZ if tile => vec![("attn_gate.weight".into(), shape, mapped(Some(heads(0, dv)), None, false))],
        Role::LinB if tile => vec![("ssm_beta.weight".into(), shape, mapped(Some(heads(0, 1)), None, false))],
        Role::LinA if tile => vec![("ssm_alpha.weight".into(), shape, mapped(Some(heads(0, 1)), None, false))],
        Role::LinDtBias if tile => vec![("ssm_dt.bias".into(), shape, mapped(Some(heads(0, 1)), None, false))],
        Role::LinOut if tile => vec![("ssm_out.weight".into(), shape, mapped(None, Some(heads(0, dv)), false))],
        _ => return Ok(None),
    };
    for (gguf, shape, source) in &out {
        if let Source::Mapped { rows, cols, .. } = source {
            let (n_rows, n_cols) = (t.shape[0], t.numel() / t.shape[0].max(1));
            let bad = rows.as_ref().is_some_and(|r| r.len() != shape[0] || r.iter().any(|&i| i >= n_rows))
                || cols.as_ref().is_some_and(|c| c.len() != n_cols || c.iter().any(|&i| i >= n_cols));
            if bad {
                bail!(
                    "tensor `{hf}` {:?} does not hold the heads `{gguf}` needs ({nk} key, {nv} value heads)",
                    t.shape
                );
            }
        }
    }
    Ok(Some(out))
}

/// Tensors llama.cpp computes with in F32 only, whatever `--quant` says (its
/// convolution kernel asserts F32 weights).
fn f32_only(gguf: &str) -> bool {
    gguf.ends_with("ssm_conv1d.weight")
}

/// `t` through f32 with [`Source::Mapped`]'s changes, as a tensor of `shape`.
fn map_f32(
    t: &HostTensor,
    rows: Option<&[usize]>,
    cols: Option<&[usize]>,
    neg_exp: bool,
    shape: &[usize],
) -> HostTensor {
    let v = t.to_f32_vec();
    let n_rows = t.shape[0].max(1);
    let width = v.len() / n_rows;
    let mut out: Vec<f32> = match rows {
        Some(rows) => rows.iter().flat_map(|&i| v[i * width..(i + 1) * width].iter().copied()).collect(),
        None => v,
    };
    if let Some(cols) = cols {
        out = out.chunks_exact(width).flat_map(|row| cols.iter().map(|&j| row[j])).collect();
    }
    if neg_exp {
        out.iter_mut().for_each(|x| *x = -x.exp());
    }
    HostTensor::from_f32(&out, shape.to_vec())
}

/// `t`'s bytes in `dtype` (through f32 when it changes, as `strata convert` does).
fn in_dtype(pool: &rayon::ThreadPool, name: &str, t: &HostTensor, dtype: DType) -> anyhow::Result<Vec<u8>> {
    match t.dtype == dtype {
        true => Ok(t.bytes().to_vec()),
        false => Ok(requant::requantize(pool, name, t, dtype)?.bytes().to_vec()),
    }
}

/// `convert_hf_to_gguf.py`'s Q/K row permutation, which
/// [`unpermute_rows`](strata_model::gguf_source::unpermute_rows) undoes: within each
/// head, stored row `2i + j` is Hugging Face row `j * head_dim / 2 + i`. Whole rows of
/// `bytes` (`rows` of them) move, so any block type works.
fn permute_rows(bytes: &[u8], rows: usize, n_heads: usize) -> anyhow::Result<Vec<u8>> {
    if rows == 0 || n_heads == 0 || !rows.is_multiple_of(2 * n_heads) || !bytes.len().is_multiple_of(rows) {
        bail!("{rows} rows do not split into {n_heads} heads of even size");
    }
    let (hd, row) = (rows / n_heads, bytes.len() / rows);
    let mut out = vec![0u8; bytes.len()];
    for h in 0..n_heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let (s, o) = (h * hd + 2 * i + j, h * hd + j * hd / 2 + i);
                out[s * row..(s + 1) * row].copy_from_slice(&bytes[o * row..(o + 1) * row]);
            }
        }
    }
    Ok(out)
}

/// The exported file read back as Strata reads a GGUF gives the source's config.
fn check(src: &ModelSource, out: &Path) -> anyhow::Result<()> {
    let back = strata_model::gguf_source::source_from_gguf(out)?;
    let (a, b) = (&expected_config(&src.config), &back.config);
    if a != b {
        let (a, b) = (format!("{a:#?}"), format!("{b:#?}"));
        let diff: Vec<String> = a
            .lines()
            .zip(b.lines())
            .filter(|(x, y)| x != y)
            .map(|(x, y)| format!("{} (GGUF: {})", x.trim(), y.trim()))
            .collect();
        bail!("its model config differs: {}", diff.join("; "));
    }
    Ok(())
}
