//! A [`ModelSource`] from a llama.cpp GGUF file: the metadata becomes a
//! `config.json`-equivalent, llama.cpp tensor names become Hugging Face names (with the
//! Q/K row permutation of `convert_hf_to_gguf.py` undone for `llama`/`mistral`, so the
//! NEOX-layout model code runs unchanged), and the `tokenizer.ggml.*` vocabulary becomes
//! a `tokenizer.json` (byte-level BPE, `gpt2`, or SentencePiece, `llama`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::ModelSource;
use super::config::ModelConfig;
use crate::format::gguf::{GgufFile, GgufValue};
use crate::tensor::{AlignedBytes, HostTensor};

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;
/// Bound on the work of deriving SentencePiece merges, which hashes every prefix of every
/// piece: the sum over pieces of length². Real vocabularies need a few million; a
/// hostile file with one 1 MB piece would need 10¹² and hours.
const MAX_SPM_MERGE_WORK: u64 = 1 << 30;

/// Reads a `.gguf` file into a model source.
pub fn source_from_gguf(path: &Path) -> anyhow::Result<ModelSource> {
    let f = GgufFile::open(path)?;
    let shown = path.display();
    let arch = f.get_str("general.architecture").with_context(|| format!("{shown}: no `general.architecture`"))?;
    if !matches!(arch, "llama" | "mistral" | "qwen2" | "qwen3") {
        bail!("{shown}: architecture `{arch}` is not supported (supported: llama, mistral, qwen2, qwen3)");
    }
    let config = config_json(&f, arch).with_context(|| format!("{shown}: building the model config"))?;
    let cfg = ModelConfig::from_json(&config.to_string()).with_context(|| format!("{shown}: model config"))?;
    let tensors = hf_tensors(&f, arch, &cfg).with_context(|| format!("{shown}: mapping tensors"))?;
    let tok = tokenizer(&f).with_context(|| format!("{shown}: building the tokenizer"))?;
    let name = path.file_stem().map_or_else(|| shown.to_string(), |s| s.to_string_lossy().into_owned());
    Ok(ModelSource {
        name,
        config_json: config.to_string(),
        tokenizer_json: tok.tokenizer_json,
        tokenizer_config_json: Some(tok.tokenizer_config_json),
        generation_config_json: Some(tok.generation_config_json),
        chat_template: None,
        tensors,
    })
}

/// The `config.json` equivalent of the GGUF hyperparameters.
fn config_json(f: &GgufFile, arch: &str) -> anyhow::Result<Value> {
    let key = |k: &str| format!("{arch}.{k}");
    let u64_of = |k: &str| -> anyhow::Result<Option<u64>> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) => Ok(Some(x)),
                None => bail!("`{}` is {} {v:?}, expected one unsigned integer", key(k), v.type_name()),
            },
        }
    };
    let required = |k: &str| -> anyhow::Result<u64> { u64_of(k)?.with_context(|| format!("missing `{}`", key(k))) };
    let hidden = required("embedding_length")?;
    let n_heads = required("attention.head_count")?;
    let n_kv = u64_of("attention.head_count_kv")?.unwrap_or(n_heads);
    let head_dim = u64_of("attention.key_length")?.unwrap_or(hidden.checked_div(n_heads).unwrap_or(0));
    if let Some(v) = u64_of("attention.value_length")?.filter(|&v| v != head_dim) {
        bail!("`{}` {v} differs from the key length {head_dim}", key("attention.value_length"));
    }
    let embd = f.tensor("token_embd.weight").context("no `token_embd.weight` tensor")?;
    let vocab = embd.shape.first().copied().unwrap_or(0);
    let eps = f.get_f32(&key("attention.layer_norm_rms_epsilon")).context("missing or non-float rms epsilon")?;
    let mut c = json!({
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": required("feed_forward_length")?,
        "num_hidden_layers": required("block_count")?,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": eps,
        "max_position_embeddings": u64_of("context_length")?.unwrap_or(4096),
        "tie_word_embeddings": f.tensor("output.weight").is_none(),
        "attention_bias": f.tensor("blk.0.attn_q.bias").is_some(),
        "rope_theta": f.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
    });
    if let Some(n) = u64_of("rope.dimension_count")?.filter(|&n| n != head_dim) {
        bail!("partial RoPE (`{}` {n} of head dim {head_dim}) is not supported", key("rope.dimension_count"));
    }
    if arch == "mistral"
        && let Some(w) = u64_of("attention.sliding_window")?
    {
        c["sliding_window"] = json!(w);
    }
    if let Some(s) = rope_scaling(f, arch, &c)? {
        c["rope_scaling"] = s;
    }
    for (field, k) in [("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")]
    {
        if let Some(id) = f.get_u64(k) {
            c[field] = json!(id);
        }
    }
    Ok(c)
}

/// `rope_scaling` from `{arch}.rope.scaling.*`, or Llama 3 scaling recovered from the
/// `rope_freqs.weight` tensor that `convert_hf_to_gguf.py` writes instead of keys.
fn rope_scaling(f: &GgufFile, arch: &str, c: &Value) -> anyhow::Result<Option<Value>> {
    let kind = f.get_str(&format!("{arch}.rope.scaling.type")).unwrap_or("none");
    let factor = f.get_f32(&format!("{arch}.rope.scaling.factor"));
    let freqs = f.tensor("rope_freqs.weight");
    match (kind, freqs) {
        ("none", None) => Ok(None),
        ("linear", None) => {
            let factor = factor.context("rope scaling `linear` without `rope.scaling.factor`")?;
            Ok(Some(json!({"rope_type": "linear", "factor": factor})))
        }
        ("none" | "llama3", Some(t)) => {
            let orig_key = format!("{arch}.rope.scaling.original_context_length");
            llama3_from_factors(t, c, f.get_u64(&orig_key)).map(Some)
        }
        (other, _) => bail!("rope scaling `{other}` is not supported"),
    }
}

/// Recovers Llama 3 rope scaling parameters from per-frequency divisors (1 for high
/// frequencies, `factor` for low ones, a smooth blend between), assuming the low/high
/// frequency factors every Llama 3.x release uses (1 and 4), then checks that the
/// recovered parameters reproduce every divisor.
fn llama3_from_factors(t: &HostTensor, c: &Value, orig_hint: Option<u64>) -> anyhow::Result<Value> {
    let divisors = t.to_f32_vec();
    let head_dim = c["head_dim"].as_u64().unwrap_or(0) as usize;
    if divisors.len() * 2 != head_dim {
        bail!("`rope_freqs.weight` has {} values; head dim {head_dim} needs {}", divisors.len(), head_dim / 2);
    }
    let theta = c["rope_theta"].as_f64().unwrap_or(10000.0) as f32;
    let factor = divisors.iter().copied().fold(1.0f32, f32::max);
    let (low, high) = (1.0f32, 4.0f32);
    let wavelen = |i: usize| 2.0 * std::f32::consts::PI * theta.powf((2 * i) as f32 / head_dim as f32);
    // A blended divisor d gives smooth = (factor / d - 1) / (factor - 1) =
    // (orig / wavelen - low) / (high - low), so orig = wavelen * (low + smooth * (high - low)).
    let from_blend =
        divisors.iter().enumerate().find(|&(_, &d)| d > 1.0 + 1e-4 && d < factor * (1.0 - 1e-4)).map(|(i, &d)| {
            let smooth = (factor / d - 1.0) / (factor - 1.0);
            (wavelen(i) * (low + smooth * (high - low))).round()
        });
    let orig = from_blend.or(orig_hint.map(|o| o as f32)).unwrap_or(8192.0);
    let scaling = json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
        "high_freq_factor": high, "original_max_position_embeddings": orig});
    let mut with = c.clone();
    with["rope_scaling"] = scaling.clone();
    let mut without = c.clone();
    without["rope_scaling"] = Value::Null;
    let scaled = ModelConfig::from_json(&with.to_string())?.rope_freqs().inv_freq;
    let plain = ModelConfig::from_json(&without.to_string())?.rope_freqs().inv_freq;
    for (i, ((s, p), d)) in scaled.iter().zip(&plain).zip(&divisors).enumerate() {
        let want = p / d;
        if (s - want).abs() > 1e-4 * want.abs() {
            bail!(
                "`rope_freqs.weight` value {i} ({d}) is not Llama 3 scaling (factor {factor}, low 1, high 4, \
                 original context {orig}); other per-frequency factors are not supported"
            );
        }
    }
    Ok(scaling)
}

/// llama.cpp per-layer tensor name (after `blk.N.`) → Hugging Face (after `model.layers.N.`).
const LAYER_NAMES: [(&str, &str); 14] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Hugging Face name for a llama.cpp tensor name, if it has one.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL_NAMES.iter().find(|(g, _)| *g == gguf_name) {
        return Some(hf.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    layer.parse::<u32>().ok()?;
    let (_, hf) = LAYER_NAMES.iter().find(|(g, _)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{hf}"))
}

fn hf_tensors(f: &GgufFile, arch: &str, cfg: &ModelConfig) -> anyhow::Result<HashMap<String, HostTensor>> {
    let interleaved = matches!(arch, "llama" | "mistral");
    let mut out = HashMap::with_capacity(f.tensors.len());
    for (name, t) in &f.tensors {
        if name == "rope_freqs.weight" {
            continue; // folded into `rope_scaling`
        }
        let hf = hf_name(name).with_context(|| format!("tensor `{name}` has no Hugging Face equivalent"))?;
        let t = match (interleaved, name.rsplit('.').nth(1)) {
            (true, Some("attn_q")) => unpermute_rows(t, cfg.n_heads).with_context(|| format!("tensor `{name}`"))?,
            (true, Some("attn_k")) => unpermute_rows(t, cfg.n_kv_heads).with_context(|| format!("tensor `{name}`"))?,
            _ => t.clone(),
        };
        out.insert(hf, t);
    }
    Ok(out)
}

/// Undoes `convert_hf_to_gguf.py`'s `LlamaModel.permute` on the rows of a Q or K
/// projection (weight or bias): within each head, stored row `2i + j` is Hugging Face
/// row `j * head_dim / 2 + i`. Whole rows move, so this works for every block type.
pub fn unpermute_rows(t: &HostTensor, n_heads: usize) -> anyhow::Result<HostTensor> {
    let rows = t.shape.first().copied().unwrap_or(0);
    if rows == 0 || n_heads.checked_mul(2).is_none_or(|h| h == 0 || !rows.is_multiple_of(h)) {
        bail!("{rows} rows do not split into {n_heads} heads of even, non-zero size");
    }
    if t.shape.len() == 1 && !t.dtype.is_float() {
        bail!("a 1-D {} tensor cannot be permuted by rows", t.dtype.name());
    }
    let len = t.byte_len();
    let fixup = crate::tensor::Fixup::UnpermuteRows { n_heads };
    let origin = t.origin().map(|o| crate::tensor::TensorOrigin { fixup: Some(fixup), ..o.clone() });
    // Computed on first use: opening a model (or converting it one layer at a time)
    // does not hold a second copy of every Q/K matrix.
    let stored = t.clone();
    let lazy = crate::tensor::LazyBytes::new(len, move || {
        let mut buf = AlignedBytes::zeroed(len);
        fixup.apply(stored.bytes(), buf.bytes_mut(), rows);
        buf
    })
    .with_origin(origin);
    Ok(HostTensor::lazy(Arc::new(lazy), t.dtype, t.shape.clone()))
}

/// The `TemplateProcessing` post-processor that adds BOS/EOS as the GGUF asks
/// (`Null` when it adds neither); an error when a token it must add is missing.
fn post_processor(
    add_bos: bool,
    add_eos: bool,
    bos: Option<(u64, &str)>,
    eos: Option<(u64, &str)>,
) -> anyhow::Result<Value> {
    let mut single = Vec::new();
    let mut special = serde_json::Map::new();
    for (on, tok, what) in [(add_bos, bos, "bos"), (false, None, ""), (add_eos, eos, "eos")] {
        if what.is_empty() {
            single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        } else if on {
            let (id, t) = tok.with_context(|| format!("add_{what}_token is set but there is no {what} token"))?;
            single.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
            special.insert(t.to_owned(), json!({"id": t, "ids": [id], "tokens": [t]}));
        }
    }
    Ok(match add_bos || add_eos {
        true => json!({"type": "TemplateProcessing", "single": single, "pair": single, "special_tokens": special}),
        false => Value::Null,
    })
}

/// `tokenizer_config.json` (the special tokens by role, BOS/EOS flags, the chat
/// template) and `generation_config.json` (BOS, and EOS plus EOT as stop ids) for a
/// tokenizer built from GGUF metadata.
fn tokenizer_files(
    f: &GgufFile,
    tokenizer_json: Value,
    add_bos: bool,
    add_eos: bool,
    roles: &[(&str, Option<(u64, &str)>)],
    [bos, eos, eot]: [Option<(u64, &str)>; 3],
) -> anyhow::Result<TokenizerFiles> {
    let mut tok_cfg =
        json!({"add_bos_token": add_bos, "add_eos_token": add_eos, "clean_up_tokenization_spaces": false});
    for (field, tok) in roles {
        if let Some((_, t)) = tok {
            tok_cfg[*field] = json!(t);
        }
    }
    if let Some(v) = f.get("tokenizer.chat_template") {
        let GgufValue::String(t) = v else { bail!("`tokenizer.chat_template` is {}, not a string", v.type_name()) };
        tok_cfg["chat_template"] = json!(t);
    }
    let mut stop: Vec<u64> = [eos, eot].iter().flatten().map(|&(id, _)| id).collect();
    stop.dedup();
    let mut gen_cfg = json!({"eos_token_id": stop});
    if let Some((id, _)) = bos {
        gen_cfg["bos_token_id"] = json!(id);
    }
    Ok(TokenizerFiles {
        tokenizer_json: tokenizer_json.to_string(),
        tokenizer_config_json: tok_cfg.to_string(),
        generation_config_json: gen_cfg.to_string(),
    })
}

/// The tokenizer files a GGUF's `tokenizer.*` metadata amounts to.
pub struct TokenizerFiles {
    pub tokenizer_json: String,
    pub tokenizer_config_json: String,
    pub generation_config_json: String,
}

/// The tokenizer of a GGUF file alone: neither its architecture nor its tensors are read,
/// so vocabulary-only files (llama.cpp's `ggml-vocab-*.gguf`) work.
pub fn gguf_tokenizer(path: &Path) -> anyhow::Result<TokenizerFiles> {
    let f = GgufFile::open(path)?;
    tokenizer(&f).with_context(|| format!("{}: building the tokenizer", path.display()))
}

// Pre-tokenizer regexes of llama.cpp (`llama-vocab.cpp`), applied in order: each splits
// the pieces the previous one left, keeping both the matches and the text between them.
// GPT-2's, which llama.cpp runs with a hand-written matcher that also takes the final
// `\s+` alternative of the original (as the `ByteLevel` pre-tokenizer's regex does).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA: &str = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILING: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK3: &str = r"[!\x22#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Whether llama.cpp takes a pre-tokenized word that is itself in the vocabulary as one
/// token without applying merges (`ignore_merges`), for this `tokenizer.ggml.pre`.
fn ignores_merges(pre: &str) -> bool {
    matches!(
        pre,
        "llama3"
            | "llama-v3"
            | "llama-bpe"
            | "falcon3"
            | "falcon-h1"
            | "pixtral"
            | "midm-2.0"
            | "lfm2"
            | "jina-v5-nano"
            | "glm4"
            | "glm5"
            | "tekken"
    )
}

/// The pre-tokenizer of a `tokenizer.ggml.pre` value: `None` for GPT-2's own regex
/// (the `ByteLevel` pre-tokenizer), else llama.cpp's regexes for that type, in order.
/// Types llama.cpp splits with hand-written code rather than regexes are refused.
fn pre_tokenizer_regexes(pre: &str) -> anyhow::Result<Option<Vec<&'static str>>> {
    Ok(Some(match pre {
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo" | "jais"
        | "trillion" | "granite-docling" | "default" => return Ok(None),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" | "glm5" => vec![LLAMA3],
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "megrez" | "hunyuan" | "solar-open"
        | "grok-2" => vec![QWEN2],
        "qwen35" => vec![QWEN35],
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            vec![r"\p{N}", GPT2]
        }
        "falcon" => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
        "deepseek-llm" => vec![
            r"[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
        "deepseek-coder" => vec![r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
            vec![r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3]
        }
        "poro-chat" | "bloom" | "gpt3-finnish" => vec![BLOOM],
        "viking" => vec![BLOOM, r"\p{N}"],
        "tekken" => vec![TEKKEN],
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => vec![GPT4O],
        "seed-coder" => vec![SEED_CODER],
        "ufakzeka" => vec![UFAKZEKA],
        "bailingmoe" | "bailingmoe2" | "llada-moe" => vec![BAILING],
        "laguna" => vec![r"[^\n]+|[\n]+", QWEN2],
        other => bail!(
            "tokenizer.ggml.pre `{other}` is not supported: llama.cpp splits it with code of its own, or this \
             build does not know it"
        ),
    }))
}

fn strings(f: &GgufFile, key: &str) -> anyhow::Result<Vec<String>> {
    let arr = f.get_array(key).with_context(|| format!("missing array `{key}`"))?;
    arr.iter()
        .enumerate()
        .map(|(i, v)| v.as_str().map(str::to_owned).with_context(|| format!("`{key}`[{i}] is not a string")))
        .collect()
}

/// `tokenizer.json`, `tokenizer_config.json` and `generation_config.json` from the
/// `tokenizer.*` metadata.
fn tokenizer(f: &GgufFile) -> anyhow::Result<TokenizerFiles> {
    let model = f.get_str("tokenizer.ggml.model").context("no `tokenizer.ggml.model`")?;
    if model == "llama" {
        return spm_tokenizer(f);
    }
    if model != "gpt2" {
        bail!(
            "tokenizer.ggml.model `{model}` is not supported (this build reads byte-level BPE, `gpt2`, \
             and SentencePiece, `llama`)"
        );
    }
    let pre = f.get_str("tokenizer.ggml.pre").unwrap_or("gpt-2");
    let regexes = pre_tokenizer_regexes(pre)?;
    let tokens = strings(f, "tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match f.get_array("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
    };
    if types.len() != tokens.len() {
        bail!("{} token types for {} tokens", types.len(), tokens.len());
    }
    let merges: Vec<Value> = strings(f, "tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !b.contains(' ') => Ok(json!([a, b])),
            _ => bail!("merge {i} `{m}` is not two tokens separated by one space"),
        })
        .collect::<anyhow::Result<_>>()?;

    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        if ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED {
            let special = ty == TOKEN_CONTROL;
            added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": special}));
        } else if !vocab.contains_key(tok) {
            vocab.insert(tok.clone(), json!(id));
        }
    }

    let token_at = |key: &str| -> anyhow::Result<Option<(u64, &str)>> {
        match f.get_u64(key) {
            None => Ok(None),
            Some(id) => match tokens.get(id as usize) {
                Some(t) => Ok(Some((id, t.as_str()))),
                None => bail!("`{key}` {id} is outside the {}-token vocabulary", tokens.len()),
            },
        }
    };
    let bos = token_at("tokenizer.ggml.bos_token_id")?;
    let eos = token_at("tokenizer.ggml.eos_token_id")?;
    let eot = token_at("tokenizer.ggml.eot_token_id")?;
    let pad = token_at("tokenizer.ggml.padding_token_id")?;
    let add_bos = f.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(false);
    let add_eos = f.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);

    let post_processor = post_processor(add_bos, add_eos, bos, eos)?;
    let pre_tokenizer = match regexes {
        None => json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
        Some(rs) => {
            let mut steps: Vec<Value> = rs
                .iter()
                .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
                .collect();
            steps.push(
                json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}),
            );
            json!({"type": "Sequence", "pretokenizers": steps})
        }
    };
    // No Unicode normalization, as llama.cpp (the reference for GGUF files) does none,
    // not even for `qwen2`, whose transformers tokenizer applies NFC.
    let normalizer = Value::Null;
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignores_merges(pre),
            "vocab": vocab, "merges": merges},
    });

    tokenizer_files(
        f,
        tokenizer_json,
        add_bos,
        add_eos,
        &[("bos_token", bos), ("eos_token", eos), ("pad_token", pad)],
        [bos, eos, eot],
    )
}

/// `tokenizer.json` (and configs) for a SentencePiece vocabulary (`tokenizer.ggml.model =
/// "llama"`), tokenizing as llama.cpp's SPM tokenizer does: a BPE model over the whole
/// vocabulary with byte fallback, its merges derived from the piece scores the way
/// transformers' `SentencePieceExtractor` does (every split of a piece into two pieces of
/// the vocabulary, ranked by the merged piece's score, best first); spaces become `▁` and,
/// with `add_space_prefix`, each stretch of text gets a `▁` in front (llama.cpp prefixes the
/// text and every stretch that follows a special or user-defined token).
fn spm_tokenizer(f: &GgufFile) -> anyhow::Result<TokenizerFiles> {
    const TOKEN_UNKNOWN: i64 = 2;
    let tokens = strings(f, "tokenizer.ggml.tokens")?;
    let n = tokens.len();
    let types: Vec<i64> = match f.get_array("tokenizer.ggml.token_type") {
        None => vec![1; n],
        Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
    };
    let scores: Vec<f64> = match f.get_array("tokenizer.ggml.scores") {
        None => vec![0.0; n],
        Some(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_f64().with_context(|| format!("`tokenizer.ggml.scores`[{i}] is not a float")))
            .collect::<anyhow::Result<_>>()?,
    };
    if types.len() != n || scores.len() != n {
        bail!("{} token types and {} scores for {n} tokens", types.len(), scores.len());
    }
    let token_at = |key: &str| -> anyhow::Result<Option<(u64, &str)>> {
        match f.get_u64(key) {
            None => Ok(None),
            Some(id) => match tokens.get(id as usize) {
                Some(t) => Ok(Some((id, t.as_str()))),
                None => bail!("`{key}` {id} is outside the {n}-token vocabulary"),
            },
        }
    };
    let bos = token_at("tokenizer.ggml.bos_token_id")?;
    let eos = token_at("tokenizer.ggml.eos_token_id")?;
    let eot = token_at("tokenizer.ggml.eot_token_id")?;
    let pad = token_at("tokenizer.ggml.padding_token_id")?;
    let unk = match token_at("tokenizer.ggml.unknown_token_id")? {
        Some(u) => Some(u),
        None => types.iter().position(|&t| t == TOKEN_UNKNOWN).map(|i| (i as u64, tokens[i].as_str())),
    };
    let add_bos = f.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(true);
    let add_eos = f.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);
    let add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);

    // llama.cpp looks pieces up by text (the last id of a repeated text wins).
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(n);
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        ids.insert(tok, id);
        vocab.insert(tok.clone(), json!(id));
        if ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED || ty == TOKEN_UNKNOWN {
            added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty != TOKEN_USER_DEFINED}));
        }
    }
    let work = ids.keys().fold(0u64, |acc, p| acc.saturating_add((p.len() as u64).saturating_pow(2)));
    if work > MAX_SPM_MERGE_WORK {
        let longest = ids.keys().map(|p| p.len()).max().unwrap_or(0);
        bail!(
            "`tokenizer.ggml.tokens` pieces are too long to derive merges from (sum of squared lengths {work}, \
             limit {MAX_SPM_MERGE_WORK}; the longest is {longest} bytes)"
        );
    }
    let mut merges: Vec<(f64, usize, usize, &str, &str)> = Vec::new();
    for (&piece, &id) in &ids {
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&il), Some(&ir)) = (ids.get(l), ids.get(r)) {
                merges.push((scores[id], il, ir, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<Value> = merges.iter().map(|&(_, _, _, l, r)| json!([l, r])).collect();

    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let post_processor = post_processor(add_bos, add_eos, bos, eos)?;
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": null, "unk_token": unk.map(|(_, t)| t), "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges},
    });

    tokenizer_files(
        f,
        tokenizer_json,
        add_bos,
        add_eos,
        &[("bos_token", bos), ("eos_token", eos), ("pad_token", pad), ("unk_token", unk)],
        [bos, eos, eot],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_pre_tokenizer_compiles_and_unknown_ones_are_named() {
        use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
        use tokenizers::tokenizer::SplitDelimiterBehavior;
        let known = [
            "gpt-2",
            "mpt",
            "olmo",
            "llama-bpe",
            "llama3",
            "dbrx",
            "glm4",
            "qwen2",
            "stablelm2",
            "qwen35",
            "starcoder",
            "smollm",
            "command-r",
            "falcon",
            "deepseek-coder",
            "deepseek-llm",
            "deepseek-v3",
            "poro-chat",
            "viking",
            "tekken",
            "gpt-4o",
            "seed-coder",
            "ufakzeka",
            "bailingmoe",
            "laguna",
        ];
        for pre in known {
            for r in pre_tokenizer_regexes(pre).unwrap().unwrap_or_default() {
                Split::new(SplitPattern::Regex(r.to_string()), SplitDelimiterBehavior::Isolated, false)
                    .unwrap_or_else(|e| panic!("{pre}: {r}: {e}"));
            }
        }
        assert!(ignores_merges("llama-bpe") && !ignores_merges("qwen2"));
        let err = pre_tokenizer_regexes("kimi-k2").unwrap_err().to_string();
        assert!(err.contains("`kimi-k2` is not supported"), "{err}");
    }

    #[test]
    fn names_map_to_hugging_face() {
        assert_eq!(hf_name("blk.12.attn_q.weight").as_deref(), Some("model.layers.12.self_attn.q_proj.weight"));
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.0.ffn_gate_exps.weight"), None);
    }

    #[test]
    fn unpermute_inverts_the_llama_cpp_permutation() {
        // 2 heads of dim 4, 3 columns; HF row r holds values 10*r + c.
        let (heads, hd, cols) = (2, 4, 3);
        let hf: Vec<f32> = (0..heads * hd).flat_map(|r| (0..cols).map(move |c| (10 * r + c) as f32)).collect();
        // permute: reshape(n_head, 2, hd/2, cols).swapaxes(1, 2): stored row h*hd + 2i + j = HF row h*hd + j*hd/2 + i.
        let mut stored = vec![0.0; hf.len()];
        for h in 0..heads {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    let (s, o) = (h * hd + 2 * i + j, h * hd + j * hd / 2 + i);
                    stored[s * cols..(s + 1) * cols].copy_from_slice(&hf[o * cols..(o + 1) * cols]);
                }
            }
        }
        let t = HostTensor::from_f32(&stored, vec![heads * hd, cols]);
        assert_eq!(unpermute_rows(&t, heads).unwrap().as_f32(), &hf[..]);
        assert!(unpermute_rows(&t, 3).is_err());
        // A hostile file's zero-row projection is refused, not divided by.
        assert!(unpermute_rows(&HostTensor::from_f32(&[], vec![0, cols]), heads).is_err());
        assert!(unpermute_rows(&t, usize::MAX / 2 + 1).is_err());
    }
}
