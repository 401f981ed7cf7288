//! The tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes, as the files a
//! Hugging Face tokenizer directory holds: byte-level BPE (`gpt2`) with each
//! pre-tokenizer type's regexes, or SentencePiece (`llama`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::format::gguf::{GgufFile, GgufValue};

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;
/// Bound on the work of deriving SentencePiece merges, which hashes every prefix of every
/// piece: the sum over pieces of length². Real vocabularies need a few million; a
/// hostile file with one 1 MB piece would need 10¹² and hours.
const MAX_SPM_MERGE_WORK: u64 = 1 << 30;

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
pub(super) fn tokenizer(f: &GgufFile) -> anyhow::Result<TokenizerFiles> {
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
}
