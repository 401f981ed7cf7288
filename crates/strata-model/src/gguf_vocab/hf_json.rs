//! The Hugging Face `tokenizer.json` view of a [`LlamaVocab`]: the model, normalizer,
//! pre-tokenizer and decoder each llama.cpp tokenizer family amounts to (what decoding
//! and tools that read the files without Strata use).

use super::*;

/// The parts of a Hugging Face `tokenizer.json` that differ by family.
pub(super) struct HfParts {
    pub added: Vec<Value>,
    pub normalizer: Value,
    pub pre_tokenizer: Value,
    pub decoder: Value,
    pub model: Value,
}

pub(super) fn post_processor(
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

/// Control, user-defined (and, where `unknown` is set, unknown) tokens as Hugging Face
/// added tokens, and every token in the text → id vocabulary (the first id of a repeated
/// text), so that merges producing an added token's text stay valid.
fn split_vocab(v: &LlamaVocab, unknown: bool) -> (Vec<Value>, serde_json::Map<String, Value>) {
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    let added_bits = attr::CONTROL | attr::USER_DEFINED | if unknown { attr::UNKNOWN } else { 0 };
    for (id, (tok, &a)) in v.tokens.iter().zip(&v.attrs).enumerate() {
        if a & added_bits != 0 {
            added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": a & attr::USER_DEFINED == 0}));
        }
        if !vocab.contains_key(tok) {
            vocab.insert(tok.clone(), json!(id));
        }
    }
    (added, vocab)
}

fn merge_pairs(v: &LlamaVocab) -> anyhow::Result<Vec<Value>> {
    v.merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !b.contains(' ') => Ok(json!([a, b])),
            _ => bail!("merge {i} `{m}` is not two tokens separated by one space"),
        })
        .collect()
}

/// The Hugging Face `Split` regex closest to one of llama.cpp's: where llama.cpp runs its
/// own code, the pattern that code implements.
fn hf_split_regex(r: &str) -> String {
    match r {
        // llama.cpp's GPT-2 code also takes the final `\s+` of the original pattern.
        GPT2 => format!(r"{GPT2}|\s+"),
        KIMI_K2 => r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^\p{Han}]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+".into(),
        AFMOE_DIGITS | TINY_AYA_DIGITS => r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))".into(),
        other => other.into(),
    }
}

/// Byte-level BPE (`gpt2` and friends).
pub(super) fn byte_level_json(v: &LlamaVocab) -> anyhow::Result<HfParts> {
    let (added, vocab) = split_vocab(v, false);
    let mut steps: Vec<Value> = v
        .pre_regexes
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": hf_split_regex(r)}, "behavior": "Isolated", "invert": false}))
        .collect();
    steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
    Ok(HfParts {
        added,
        // No Unicode normalization, as llama.cpp does none, not even for `qwen2`, whose
        // transformers tokenizer applies NFC.
        normalizer: Value::Null,
        pre_tokenizer: json!({"type": "Sequence", "pretokenizers": steps}),
        decoder: drop_kmer_marker(
            v,
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
        ),
        model: json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": v.ignore_merges, "vocab": vocab, "merges": merge_pairs(v)?}),
    })
}

/// SentencePiece-style BPE over raw UTF-8 with `<0xXX>` byte tokens (`gemma4`).
pub(super) fn sentencepiece_bpe_json(v: &LlamaVocab) -> anyhow::Result<HfParts> {
    let (added, vocab) = split_vocab(v, false);
    let steps: Vec<Value> = v
        .pre_regexes
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": hf_split_regex(r)}, "behavior": "Isolated", "invert": false}))
        .collect();
    let normalizer = match v.escape_whitespaces {
        true => json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
        false => Value::Null,
    };
    Ok(HfParts {
        added,
        normalizer,
        pre_tokenizer: json!({"type": "Sequence", "pretokenizers": steps}),
        decoder: drop_kmer_marker(v, sentencepiece_decoder(false)),
        model: json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": true,
            "ignore_merges": v.ignore_merges, "vocab": vocab, "merges": merge_pairs(v)?}),
    })
}

/// `decoder`, after dropping [`DNA_KMER_MARKER`] from each token of a `hybriddna`
/// vocabulary, so its k-mers decode to the bare sequence as in llama.cpp. The vocabulary
/// keeps the marked texts, which stay distinct from base tokens of the same letters.
/// (Only marker tokens hold the literal character: byte-level tokens spell U+E000 in the
/// text as three byte characters.)
fn drop_kmer_marker(v: &LlamaVocab, decoder: Value) -> Value {
    match v.bpe_session {
        BpeSession::HybridDna => json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": DNA_KMER_MARKER}, "content": ""},
            decoder,
        ]}),
        BpeSession::Plain | BpeSession::Whitespace => decoder,
    }
}

fn sentencepiece_decoder(strip_prefix: bool) -> Value {
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if strip_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({"type": "Sequence", "decoders": decoders})
}

/// A SentencePiece BPE vocabulary (`llama`) as a Hugging Face BPE model over the whole
/// vocabulary with byte fallback, its merges derived from the piece scores the way
/// transformers' `SentencePieceExtractor` does (every split of a piece into two pieces of
/// the vocabulary, ranked by the merged piece's score, best first).
pub(super) fn spm_json(v: &LlamaVocab) -> anyhow::Result<HfParts> {
    let n = v.tokens.len();
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(n);
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (tok, &a)) in v.tokens.iter().zip(&v.attrs).enumerate() {
        ids.insert(tok, id);
        vocab.insert(tok.clone(), json!(id));
        if a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
            added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": a & attr::USER_DEFINED == 0}));
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
    let score = |id: usize| v.scores.get(id).copied().unwrap_or(0.0);
    let mut merges: Vec<(f32, usize, usize, &str, &str)> = Vec::new();
    for (&piece, &id) in &ids {
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&il), Some(&ir)) = (ids.get(l), ids.get(r)) {
                merges.push((score(id), il, ir, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<Value> = merges.iter().map(|&(_, _, _, l, r)| json!([l, r])).collect();

    let mut normalizers = Vec::new();
    if v.add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let unk = v.unk.map(|id| v.tokens[id as usize].as_str());
    Ok(HfParts {
        added,
        normalizer: json!({"type": "Sequence", "normalizers": normalizers}),
        pre_tokenizer: Value::Null,
        decoder: sentencepiece_decoder(v.add_space_prefix),
        model: json!({"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges}),
    })
}

/// BERT WordPiece (`bert`): llama.cpp's GGUF writes word-initial pieces as `▁piece` and
/// continuations bare, so this is a WordPiece model over `▁`-prefixed words with no
/// continuation prefix, which is llama.cpp's greedy longest match.
pub(super) fn wordpiece_json(v: &LlamaVocab) -> HfParts {
    let (added, vocab) = split_vocab(v, true);
    let unk = v.unk.map_or("[UNK]", |id| v.tokens[id as usize].as_str());
    HfParts {
        added,
        normalizer: json!({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
            "strip_accents": v.strip_accents, "lowercase": v.lowercase}),
        pre_tokenizer: json!({"type": "Sequence", "pretokenizers": [
            {"type": "BertPreTokenizer"},
            {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": false},
        ]}),
        decoder: json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": false}),
        model: json!({"type": "WordPiece", "unk_token": unk, "continuing_subword_prefix": "",
            "max_input_chars_per_word": u32::MAX, "vocab": vocab}),
    }
}

/// SentencePiece Unigram (`t5`) with its precompiled normalizer.
pub(super) fn unigram_json(v: &LlamaVocab) -> HfParts {
    let (added, _) = split_vocab(v, true);
    let pieces: Vec<Value> =
        v.tokens.iter().enumerate().map(|(i, t)| json!([t, v.scores.get(i).copied().unwrap_or(0.0)])).collect();
    let mut normalizers = Vec::new();
    if let Some(map) = &v.precompiled_charsmap {
        normalizers.push(json!({"type": "Precompiled", "precompiled_charsmap": map}));
    }
    if v.remove_extra_whitespaces {
        normalizers.push(json!({"type": "Strip", "strip_left": true, "strip_right": true}));
        normalizers.push(json!({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}));
    }
    let scheme = if v.add_space_prefix || v.remove_extra_whitespaces { "always" } else { "never" };
    HfParts {
        added,
        normalizer: json!({"type": "Sequence", "normalizers": normalizers}),
        pre_tokenizer: json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": scheme, "split": true}),
        decoder: json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": scheme, "split": true}),
        model: json!({"type": "Unigram", "unk_id": v.unk, "vocab": pieces, "byte_fallback": false}),
    }
}

/// Any other vocabulary: its texts by id, for decoding (`<0xXX>` tokens as bytes).
pub(super) fn wordlevel_json(v: &LlamaVocab) -> HfParts {
    let (added, vocab) = split_vocab(v, true);
    let unk = v.unk.map_or_else(|| v.tokens[0].clone(), |id| v.tokens[id as usize].clone());
    HfParts {
        added,
        normalizer: Value::Null,
        pre_tokenizer: Value::Null,
        decoder: json!({"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}),
        model: json!({"type": "WordLevel", "vocab": vocab, "unk_token": unk}),
    }
}
