//! The tokenizer and chat template of an export: the source's vocabulary as llama.cpp's
//! `tokenizer.ggml.*` keys, checked to tokenize as the source does.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::Value;

use super::super::tokenizer::TextTokenizer;
use super::Metadata;
use strata_format::gguf::{GgufFile, GgufValue};
use strata_format::gguf_write;
use strata_model::ModelSource;
use strata_model::gguf_vocab::{self, LLAMA_VOCAB_KEY, LlamaVocab};
use strata_model::spec::Arch;
use strata_tensor::tensor::AlignedBytes;

/// `general.name`, the tokenizer's `tokenizer.ggml.*` keys, and `model/pre` for the
/// report: a GGUF source's vocabulary as llama.cpp read it, or a Hugging Face byte-level
/// BPE `tokenizer.json` with the llama.cpp pre-tokenizer that splits text as it does.
/// llama.cpp also sets token flags by `general.name` (Phi-3: special tokens strip the
/// spaces after them), so the name is chosen with the tokenizer: the model's own, marked
/// `phi3` for a Phi-3 whose tokenizer strips so, never `phi3` for a vocabulary without
/// the tokens llama.cpp then looks up (it fails to load).
#[allow(clippy::type_complexity)]
pub(super) fn tokenizer_keys(src: &ModelSource) -> anyhow::Result<(String, Metadata, String, Option<String>)> {
    let source_tok = TextTokenizer::for_model(src)?;
    let stored = src
        .tokenizer_config_json
        .as_deref()
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| v.get(LLAMA_VOCAB_KEY).cloned());
    // A SentencePiece tokenizer.json may treat text after a special token otherwise than
    // llama.cpp does (see `tokenizes_alike`): said in the report, not refused.
    let sentencepiece = stored.is_none() && is_sentencepiece_bpe(&src.tokenizer_json);
    let candidates: Vec<Metadata> = match stored {
        Some(v) => {
            let vocab: LlamaVocab = serde_json::from_value(v).context("the stored llama.cpp vocabulary")?;
            vec![gguf_vocab::gguf_keys(&vocab, None)?]
        }
        None if sentencepiece => vec![sentencepiece_bpe(src, &source_tok)?],
        None => byte_level_bpe(src, &source_tok)?,
    };
    let mut last = None;
    for keys in candidates {
        for name in names(src, &keys) {
            match tokenizes_alike(&name, &keys, &source_tok, !sentencepiece) {
                Ok(note) => {
                    let get = |k: &str| keys.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.as_str()).unwrap_or("");
                    let tok = format!("{}/{}", get("tokenizer.ggml.model"), get("tokenizer.ggml.pre"));
                    return Ok((name, keys, tok.trim_end_matches('/').to_string(), note));
                }
                Err(e) => last = Some(e),
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no tokenizer")))
        .context("no llama.cpp tokenizer reproduces this model's: the GGUF would tokenize differently")
}

/// The `general.name`s to try, in order (see [`tokenizer_keys`]).
fn names(src: &ModelSource, keys: &[(String, GgufValue)]) -> Vec<String> {
    let phi3 = |n: &str| n.to_lowercase().contains("phi3") || n.to_lowercase().contains("phi-3");
    let tokens: Vec<&str> = keys
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map(|a| a.iter().filter_map(GgufValue::as_str).collect())
        .unwrap_or_default();
    let loads_as_phi3 = ["</s>", "<unk>", "<s>", "<|endoftext|>"].iter().all(|t| tokens.contains(t));
    let plain =
        src.name.replace("phi3", "phi_3").replace("Phi3", "Phi_3").replace("phi-3", "phi_3").replace("Phi-3", "Phi_3");
    let mut out = Vec::new();
    if !phi3(&src.name) || loads_as_phi3 {
        out.push(src.name.clone());
    }
    if src.config.arch == Arch::Phi3 && loads_as_phi3 && !phi3(&src.name) {
        out.push(format!("phi3-{}", src.name));
    }
    if !phi3(&plain) && !out.contains(&plain) {
        out.push(plain);
    }
    out
}

/// A byte-level BPE `tokenizer.json` as `gpt2` vocabulary keys, once per llama.cpp
/// pre-tokenizer ([`gguf_vocab::PRE_NAMES`]): the caller keeps the first that tokenizes
/// as the source.
fn byte_level_bpe(src: &ModelSource, tok: &TextTokenizer) -> anyhow::Result<Vec<Metadata>> {
    let j: Value = serde_json::from_str(&src.tokenizer_json).context("tokenizer.json")?;
    let model = j.get("model").context("tokenizer.json has no `model`")?;
    let byte_level = src.tokenizer_json.contains("\"ByteLevel\"");
    if model.get("type").and_then(Value::as_str) != Some("BPE") || !byte_level {
        bail!(
            "exporting this tokenizer (`{}`, not byte-level BPE) from a Hugging Face directory is not supported yet",
            model.get("type").and_then(Value::as_str).unwrap_or("?")
        );
    }
    let vocab = model.get("vocab").and_then(Value::as_object).context("tokenizer.json has no BPE vocab")?;
    let mut by_id: BTreeMap<usize, (String, i32)> = BTreeMap::new();
    for (t, id) in vocab {
        let id = id.as_u64().context("a vocab id is not a number")? as usize;
        by_id.insert(id, (t.clone(), 1));
    }
    for a in j.get("added_tokens").and_then(Value::as_array).into_iter().flatten() {
        let (Some(id), Some(t)) = (a.get("id").and_then(Value::as_u64), a.get("content").and_then(Value::as_str))
        else {
            continue;
        };
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        by_id.insert(id as usize, (t.to_string(), if special { 3 } else { 4 }));
    }
    let n = src.config.vocab_size.max(by_id.keys().next_back().map_or(0, |&i| i + 1));
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        let (t, ty) = by_id.remove(&i).unwrap_or_else(|| (format!("[PAD{i}]"), 5));
        tokens.push(GgufValue::String(t));
        types.push(GgufValue::I32(ty));
    }
    let merges = merge_pairs(model)?.into_iter().map(|(a, b)| GgufValue::String(format!("{a} {b}"))).collect();
    let mut common = vec![
        ("tokenizer.ggml.model".to_string(), GgufValue::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), GgufValue::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types)),
        ("tokenizer.ggml.merges".into(), GgufValue::Array(merges)),
    ];
    common.extend(special_keys(tok, None));
    Ok(gguf_vocab::PRE_NAMES
        .iter()
        .map(|pre| {
            let mut keys = common.clone();
            keys.insert(1, ("tokenizer.ggml.pre".into(), GgufValue::String(pre.to_string())));
            keys
        })
        .collect())
}

/// Whether `tokenizer.json` is a SentencePiece model as Hugging Face converts one (Llama
/// 2, Mistral 7B): BPE over `▁`-escaped text with byte fallback.
fn is_sentencepiece_bpe(json: &str) -> bool {
    let Ok(j) = serde_json::from_str::<Value>(json) else { return false };
    let m = &j["model"];
    m["type"] == "BPE" && m["byte_fallback"] == true && !json.contains("\"ByteLevel\"")
}

/// A SentencePiece-style `tokenizer.json` as llama.cpp's `llama` (SPM) vocabulary: the
/// tokens by id, byte tokens (`<0xXX>`) as bytes, added tokens as control (special) or
/// user-defined ones, and scores from the merges. llama.cpp's SPM tokenizer merges the
/// adjacent pair whose joined text is the token of highest score; Hugging Face's BPE
/// merges the pair of lowest rank, and its SentencePiece conversion lists every pair
/// that joins into a token, ordered by that token's score: so a token's score here is
/// minus the rank of the first merge that makes it (tokens no merge makes score below
/// every merge). The read-back check then confirms both split the test text alike.
fn sentencepiece_bpe(src: &ModelSource, tok: &TextTokenizer) -> anyhow::Result<Metadata> {
    let j: Value = serde_json::from_str(&src.tokenizer_json).context("tokenizer.json")?;
    let model = &j["model"];
    let vocab = model["vocab"].as_object().context("tokenizer.json has no BPE vocab")?;
    let merges: Vec<String> = merge_pairs(model)?.into_iter().map(|(a, b)| a + &b).collect();
    let mut first_merge: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (rank, joined) in merges.iter().enumerate() {
        first_merge.entry(joined.as_str()).or_insert(rank);
    }
    let unk = model["unk_token"].as_str();
    // (text, score, type): llama.cpp's token types 1 normal, 2 unknown, 3 control,
    // 4 user-defined, 5 unused, 6 byte.
    let mut by_id: BTreeMap<usize, (String, f32, i32)> = BTreeMap::new();
    let below = -(merges.len() as f32) - 1.0;
    for (t, id) in vocab {
        let id = id.as_u64().context("a vocab id is not a number")? as usize;
        let is_byte = t.len() == 6 && t.starts_with("<0x") && t.ends_with('>');
        let ty = match () {
            _ if Some(t.as_str()) == unk => 2,
            _ if is_byte => 6,
            _ => 1,
        };
        let score = first_merge.get(t.as_str()).map_or(below, |&r| -(r as f32));
        by_id.insert(id, (t.clone(), score, ty));
    }
    for a in j["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(t)) = (a["id"].as_u64(), a["content"].as_str()) else { continue };
        let ty = match () {
            _ if Some(t) == unk => 2,
            _ if a["special"] == true => 3,
            _ => 4,
        };
        by_id.insert(id as usize, (t.to_string(), below, ty));
    }
    let n = src.config.vocab_size.max(by_id.keys().next_back().map_or(0, |&i| i + 1));
    let (mut tokens, mut scores, mut types) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let (t, score, ty) = by_id.remove(&i).unwrap_or_else(|| (format!("[PAD{i}]"), below, 5));
        tokens.push(GgufValue::String(t));
        scores.push(GgufValue::F32(score));
        types.push(GgufValue::I32(ty));
    }
    // A leading `▁` on the first word: Metaspace's `prepend_scheme` (or the older
    // `Prepend("▁")` normalizer).
    let prepend = j["pre_tokenizer"]["prepend_scheme"].as_str().is_some_and(|p| p != "never")
        || j["pre_tokenizer"]["add_prefix_space"] == true
        || src.tokenizer_json.contains("\"Prepend\"");
    let mut keys = vec![
        ("tokenizer.ggml.model".to_string(), GgufValue::String("llama".into())),
        ("tokenizer.ggml.tokens".into(), GgufValue::Array(tokens)),
        ("tokenizer.ggml.scores".into(), GgufValue::Array(scores)),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types)),
        ("tokenizer.ggml.add_space_prefix".into(), GgufValue::Bool(prepend)),
    ];
    keys.extend(special_keys(tok, unk));
    Ok(keys)
}

/// A BPE model's merges as pairs (`"a b"` strings or `["a", "b"]` arrays), best first.
fn merge_pairs(model: &Value) -> anyhow::Result<Vec<(String, String)>> {
    let merges = model.get("merges").and_then(Value::as_array).context("tokenizer.json has no merges")?;
    merges
        .iter()
        .map(|m| match m {
            Value::String(s) => match s.split_once(' ') {
                Some((a, b)) => Ok((a.to_string(), b.to_string())),
                None => bail!("a merge is {s:?}, not `a b`"),
            },
            Value::Array(p) if p.len() == 2 => {
                Ok((p[0].as_str().unwrap_or("").to_string(), p[1].as_str().unwrap_or("").to_string()))
            }
            other => bail!("a merge is {other}, not `a b` or [a, b]"),
        })
        .collect()
}

/// `add_bos_token`, `add_eos_token` (never: chat templates add what they need) and the
/// special tokens' ids the source's tokenizer names.
fn special_keys(tok: &TextTokenizer, unk: Option<&str>) -> Metadata {
    let mut keys = vec![
        ("tokenizer.ggml.add_bos_token".to_string(), GgufValue::Bool(tok.add_bos_token())),
        ("tokenizer.ggml.add_eos_token".into(), GgufValue::Bool(false)),
    ];
    let id_of = |t: Option<&str>| t.and_then(|t| tok.token_to_id(t));
    for (key, id) in
        [("bos_token_id", tok.bos_id()), ("eos_token_id", id_of(tok.eos_token())), ("unknown_token_id", id_of(unk))]
    {
        if let Some(id) = id {
            keys.push((format!("tokenizer.ggml.{key}"), GgufValue::U32(id)));
        }
    }
    keys
}

/// Text every export's tokenizer must split as the source's does: words, numbers of
/// every length, contractions, whitespace runs, newlines, code, accents, CJK, emoji.
const CHECK_TEXT: &str = "Hello world! It's 2026-11-26; we've 3 cats, they'll run 12345678 m in 1.5 s.\n\n\
    \tIndented   code: fn main() { println!(\"héllo wörld\"); } // über café naïve\r\n\
    日本語のテキスト、中文字符。 Ünïcödé — “quotes” ‘single’ 🙂🚀 x²+y² ≤ 10³\n    trailing   \n";

/// Whether the GGUF tokenizer `keys` describe tokenizes [`CHECK_TEXT`] (with and without
/// special tokens) and a few of the source's own special tokens as `source` does, read
/// back as Strata reads a GGUF's vocabulary.
/// Whether `keys`, read as llama.cpp reads them, tokenize the check texts as `source`
/// does. Text after special tokens, and text that starts with spaces, must match too
/// when `strict_specials`; otherwise differences there are returned as a note
/// (llama.cpp's SPM tokenizer puts `▁` before every text that follows a special token,
/// and before text that already starts with a space, which a `tokenizer.json` whose
/// Metaspace prepends to the first word only, and only when it has none, does not).
fn tokenizes_alike(
    name: &str,
    keys: &[(String, GgufValue)],
    source: &TextTokenizer,
    strict_specials: bool,
) -> anyhow::Result<Option<String>> {
    let mut meta = vec![
        ("general.architecture".to_string(), GgufValue::String("llama".into())),
        ("general.name".to_string(), GgufValue::String(name.into())),
    ];
    meta.extend(keys.iter().cloned());
    let bytes = gguf_write::encode_metadata(&meta)?;
    let f = GgufFile::parse(Arc::new(AlignedBytes::from_slice(&bytes)), Path::new("export.gguf"))?;
    let files = gguf_vocab::tokenizer(&f)?;
    let back = TextTokenizer::from_sources(
        &files.tokenizer_json,
        Some(&files.tokenizer_config_json),
        Some(&files.generation_config_json),
        None,
    )?;
    let specials: String = [source.bos_token(), source.eos_token()].into_iter().flatten().collect();
    let texts = [CHECK_TEXT.to_string(), format!("{specials} a{specials}b"), "  two leading spaces".to_string()];
    let mut notes: Vec<String> = Vec::new();
    for (i, text) in texts.into_iter().enumerate() {
        for special in [false, true] {
            let (want, got) = (source.encode(&text, special)?, back.encode(&text, special)?);
            if want != got && i > 0 && !strict_specials {
                let what = ["", "text that follows a special token", "text that starts with spaces"][i];
                notes.push(format!("{what} ({text:?}: {got:?} against {want:?})"));
                break;
            }
            if want != got {
                let at = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(want.len().min(got.len()));
                bail!(
                    "tokenizer {:?}: token {at} of {:?} is {:?}, the source's {:?}",
                    keys.iter().find(|(k, _)| k == "tokenizer.ggml.pre").map(|(_, v)| v),
                    text.chars().take(40).collect::<String>(),
                    got.get(at),
                    want.get(at)
                );
            }
        }
    }
    Ok((!notes.is_empty()).then(|| {
        format!(
            "llama.cpp's SentencePiece tokenizer adds a space this tokenizer does not, before {}: prompts like \
             these tokenize differently",
            notes.join(" and before ")
        )
    }))
}

/// The chat template, as transformers would pick it: `chat_template.jinja`, else
/// `tokenizer_config.json`'s (a string, or the one named `default`).
pub(super) fn chat_template(src: &ModelSource) -> Option<String> {
    if let Some(t) = &src.chat_template {
        return Some(t.clone());
    }
    let cfg: Value = serde_json::from_str(src.tokenizer_config_json.as_deref()?).ok()?;
    match cfg.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}
