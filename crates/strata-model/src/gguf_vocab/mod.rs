//! The tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes.
//!
//! Two views of the same vocabulary come out of it:
//! - [`LlamaVocab`]: the vocabulary as llama.cpp's `llama_vocab::load` leaves it (token
//!   attributes after its fix-ups, special ids, flags, the pre-tokenizer regexes of
//!   `tokenizer.ggml.pre`). Strata tokenizes GGUF models with it, by llama.cpp's own
//!   algorithms (`engine::tokenizer::llama`), so ids match llama.cpp exactly. It travels in
//!   `tokenizer_config.json` under [`LLAMA_VOCAB_KEY`].
//! - a Hugging Face `tokenizer.json` (byte-level BPE, SentencePiece-style BPE, WordPiece or
//!   Unigram) for decoding, and for any tool that reads the files without Strata.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod hf_json;

use hf_json::{
    byte_level_json, post_processor, sentencepiece_bpe_json, spm_json, unigram_json, wordlevel_json, wordpiece_json,
};
use strata_format::gguf::{GgufFile, GgufValue};

/// The `tokenizer_config.json` key that holds the [`LlamaVocab`].
pub const LLAMA_VOCAB_KEY: &str = "llama_cpp_vocab";

/// llama.cpp token attributes (`llama_token_attr`), as bits of [`LlamaVocab::attrs`].
pub mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_NORMAL: i64 = 1;
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;
const TOKEN_UNUSED: i64 = 5;
const TOKEN_BYTE: i64 = 6;
/// Bound on the work of deriving SentencePiece merges, which hashes every prefix of every
/// piece: the sum over pieces of length². Real vocabularies need a few million; a
/// hostile file with one 1 MB piece would need 10¹² and hours.
const MAX_SPM_MERGE_WORK: u64 = 1 << 30;
/// Biggest `tokenizer.ggml.precompiled_charsmap` accepted (real ones are ~250 kB).
const MAX_CHARSMAP_BYTES: usize = 64 << 20;

/// llama.cpp's tokenizer families (`llama_vocab_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VocabKind {
    /// SentencePiece BPE by piece scores (`tokenizer.ggml.model = "llama"`).
    Spm,
    /// Merge-ranked BPE after regex pre-tokenization (`gpt2`, `gemma4`, ...).
    Bpe,
    /// BERT WordPiece, greedy longest match (`bert`).
    Wpm,
    /// SentencePiece Unigram with its precompiled normalizer (`t5`).
    Ugm,
    /// RWKV's greedy longest byte match (`rwkv`).
    Rwkv,
    /// PLaMo-2's best-scoring cut with byte fallback (`plamo2`).
    Plamo2,
}

/// What a BPE vocabulary does around the merges (llama.cpp's session kinds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BpeSession {
    #[default]
    Plain,
    /// `tokenizer.ggml.model = "whitespace"`: whitespace separates words and is dropped.
    Whitespace,
    /// `tokenizer.ggml.model = "hybriddna"`: text inside `<dna>…</dna>` becomes uppercase
    /// 6-mers, each looked up as its text plus [`DNA_KMER_MARKER`] (`<oov>` when absent).
    HybridDna,
}

/// The suffix (U+E000) that keeps a `hybriddna` vocabulary's k-mer tokens apart from base
/// tokens of the same letters. [`LlamaVocab::tokens`] keeps it (it is how the tokenizer
/// finds them); llama.cpp drops it from the text of the tokens after `<oov>` when loading,
/// so they decode to the bare sequence ([`LlamaVocab::shown_tokens`]).
pub const DNA_KMER_MARKER: &str = "\u{E000}";

/// A GGUF vocabulary as llama.cpp holds it after loading: everything its tokenizers read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LlamaVocab {
    pub kind: VocabKind,
    /// Token texts by id (an empty text reads `[EMPTY_<id>]`, as in llama.cpp), as
    /// llama.cpp looks them up by text (`token_to_id`).
    pub tokens: Vec<String>,
    /// [`attr`] bits by id.
    pub attrs: Vec<u32>,
    /// Scores by id (empty: all zero).
    #[serde(default)]
    pub scores: Vec<f32>,
    /// BPE merges, `left right`, best first.
    #[serde(default)]
    pub merges: Vec<String>,
    #[serde(default)]
    pub bpe_session: BpeSession,
    /// BPE pre-tokenizer: llama.cpp's regexes for `tokenizer.ggml.pre`, applied in order.
    #[serde(default)]
    pub pre_regexes: Vec<String>,
    /// BPE: map bytes to GPT-2's byte alphabet before merging (else byte tokens are
    /// `<0xXX>`).
    #[serde(default)]
    pub byte_encode: bool,
    /// BPE: a pre-tokenized word that is itself a token is taken whole.
    #[serde(default)]
    pub ignore_merges: bool,
    /// BPE (Gemma 4): a run of newlines that is itself a token is taken whole.
    #[serde(default)]
    pub whole_newline_runs: bool,
    /// Spaces become `▁` before tokenizing.
    #[serde(default)]
    pub escape_whitespaces: bool,
    #[serde(default)]
    pub add_space_prefix: bool,
    #[serde(default)]
    pub remove_extra_whitespaces: bool,
    /// WordPiece normalization.
    #[serde(default)]
    pub lowercase: bool,
    #[serde(default)]
    pub strip_accents: bool,
    #[serde(default)]
    pub add_bos: bool,
    #[serde(default)]
    pub add_eos: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    /// Unigram: `tokenizer.ggml.precompiled_charsmap`, base64.
    #[serde(default)]
    pub precompiled_charsmap: Option<String>,
    /// The fill-in-the-middle tokens, as llama.cpp finds them.
    #[serde(default)]
    pub fim: FimIds,
    /// The tokens that end generation in llama.cpp (its end-of-generation set).
    #[serde(default)]
    pub eog: Vec<u32>,
}

/// The fill-in-the-middle tokens of a vocabulary: prefix, suffix and middle mark the
/// parts of a file; pad, repository and file separator frame repository-level prompts
/// (and end generation in llama.cpp).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FimIds {
    pub pre: Option<u32>,
    pub suf: Option<u32>,
    pub mid: Option<u32>,
    pub pad: Option<u32>,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
}

impl FimIds {
    /// Found by token text, as llama.cpp looks them up when no GGUF key names them
    /// (`lookup` gives a text's id, if it is a special token).
    pub fn by_text(lookup: impl Fn(&str) -> Option<u32>) -> Self {
        let find = |key: &str| {
            let (_, texts) = ROLE_TEXTS.iter().find(|(k, _)| *k == key).expect("a FIM role");
            texts.iter().find_map(|t| lookup(t))
        };
        FimIds {
            pre: find("tokenizer.ggml.fim_pre_token_id"),
            suf: find("tokenizer.ggml.fim_suf_token_id"),
            mid: find("tokenizer.ggml.fim_mid_token_id"),
            pad: find("tokenizer.ggml.fim_pad_token_id"),
            rep: find("tokenizer.ggml.fim_rep_token_id"),
            sep: find("tokenizer.ggml.fim_sep_token_id"),
        }
    }
}

impl LlamaVocab {
    /// The token texts as llama.cpp holds them by id (`id_to_token`), which special tokens
    /// are matched against and tokens decode to: for `hybriddna`, every token after `<oov>`
    /// (its last id) that ends in [`DNA_KMER_MARKER`] loses it.
    pub fn shown_tokens(&self) -> Vec<String> {
        let mut tokens = self.tokens.clone();
        if self.bpe_session != BpeSession::HybridDna {
            return tokens;
        }
        let Some(oov) = tokens.iter().rposition(|t| t == "<oov>") else { return tokens };
        for t in &mut tokens[oov + 1..] {
            if t.len() > DNA_KMER_MARKER.len() && t.ends_with(DNA_KMER_MARKER) {
                t.truncate(t.len() - DNA_KMER_MARKER.len());
            }
        }
        tokens
    }

    /// The precompiled charsmap's bytes.
    pub fn charsmap(&self) -> Result<Vec<u8>, String> {
        match &self.precompiled_charsmap {
            None => Ok(Vec::new()),
            Some(b) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| format!("`precompiled_charsmap` is not base64: {e}")),
        }
    }
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

/// `tokenizer.json`, `tokenizer_config.json` and `generation_config.json` from the
/// `tokenizer.*` metadata.
pub fn tokenizer(f: &GgufFile) -> anyhow::Result<TokenizerFiles> {
    let vocab = llama_vocab(f)?;
    let hf = match vocab.kind {
        VocabKind::Spm => spm_json(&vocab)?,
        VocabKind::Bpe if vocab.byte_encode => byte_level_json(&vocab)?,
        VocabKind::Bpe => sentencepiece_bpe_json(&vocab)?,
        VocabKind::Wpm => wordpiece_json(&vocab),
        VocabKind::Ugm => unigram_json(&vocab),
        VocabKind::Rwkv | VocabKind::Plamo2 => wordlevel_json(&vocab),
    };
    let token = |id: Option<u32>| id.map(|id| (u64::from(id), vocab.tokens[id as usize].as_str()));
    let (bos, eos, unk, sep) = (token(vocab.bos), token(vocab.eos), token(vocab.unk), token(vocab.sep));
    let eot = match f.get_u64("tokenizer.ggml.eot_token_id") {
        Some(id) if (id as usize) < vocab.tokens.len() => Some((id, vocab.tokens[id as usize].as_str())),
        _ => None,
    };
    let pad = match f.get_u64("tokenizer.ggml.padding_token_id") {
        Some(id) if (id as usize) < vocab.tokens.len() => Some((id, vocab.tokens[id as usize].as_str())),
        _ => None,
    };
    // The Hugging Face post-processor: BERT's start and end tokens are [CLS] and [SEP].
    let post = match vocab.kind {
        VocabKind::Wpm => post_processor(true, true, bos, sep)?,
        VocabKind::Rwkv | VocabKind::Plamo2 => Value::Null,
        _ => post_processor(vocab.add_bos, vocab.add_eos, bos, eos)?,
    };
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": hf.added,
        "normalizer": hf.normalizer,
        "pre_tokenizer": hf.pre_tokenizer,
        "post_processor": post,
        "decoder": hf.decoder,
        "model": hf.model,
    });

    let mut tok_cfg = json!({"add_bos_token": vocab.add_bos, "add_eos_token": vocab.add_eos,
        "clean_up_tokenization_spaces": false});
    for (field, tok) in [("bos_token", bos), ("eos_token", eos), ("pad_token", pad), ("unk_token", unk)] {
        if let Some((_, t)) = tok {
            tok_cfg[field] = json!(t);
        }
    }
    if let Some(v) = f.get("tokenizer.chat_template") {
        let GgufValue::String(t) = v else { bail!("`tokenizer.chat_template` is {}, not a string", v.type_name()) };
        tok_cfg["chat_template"] = json!(t);
    }
    tok_cfg[LLAMA_VOCAB_KEY] = serde_json::to_value(&vocab)?;
    // End of sequence and of turn first, then the rest of llama.cpp's end-of-generation
    // set (`</s>` and `<|im_end|>` by text, FIM pad, repository and file separator, ...).
    let mut stop: Vec<u64> = [eos, eot].iter().flatten().map(|&(id, _)| id).collect();
    stop.dedup();
    for id in vocab.eog.iter().map(|&id| u64::from(id)) {
        if !stop.contains(&id) {
            stop.push(id);
        }
    }
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

// Pre-tokenizer regexes of llama.cpp (`llama-vocab.cpp`), applied in order: each splits
// the pieces the previous one left, keeping both the matches and the text between them.
// llama.cpp runs some of them, recognised by their exact text, with code of its own that
// differs from the regex in places (`unicode.cpp`); `engine::tokenizer::llama` does the
// same, so these strings must stay byte for byte llama.cpp's.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const JAIS2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
const DEEPSEEK3: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const SPARK2_5: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+";
const YOUTU_CJK: &str = "[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";
const YOUTU: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const FALCON_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|`]+";
const BLOOM: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GRANITE_EMB_MULTI: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TINY_AYA_DIGITS: &str = r"\d{1,3}(?=(?:\d{3})*\b)";
const TINY_AYA: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILING: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA: &str = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const AFMOE_CJK: &str = "[\u{4E00}-\u{9FFF}\u{3400}-\u{4DBF}\u{8C48}-\u{FAFF}\u{3040}-\u{309F}\u{30A0}-\u{30FF}\u{FF65}-\u{FF9F}\u{2F00}-\u{2FDF}\u{E40}-\u{E7F}\u{E80}-\u{EFF}\u{1780}-\u{17FF}\u{1000}-\u{109F}\u{AA60}-\u{AA7F}\u{A9E0}-\u{A9FF}\u{AC00}-\u{D7AF}\u{1100}-\u{11FF}]+";
const EXAONE_MOE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const MINICPM5: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Runs of newlines and runs of anything else (llama.cpp splits these with its own code).
const NEWLINE_RUNS: &str = r"[^\n]+|[\n]+";
/// Triggers llama.cpp's hand-written Kimi-K2 splitter (the whole K2 pattern).
const KIMI_K2: &str = r"\p{Han}+";
/// Triggers llama.cpp's hand-written AFMoE digit grouping.
const AFMOE_DIGITS: &str = r"\p{AFMoE_digits}";

/// What `tokenizer.ggml.pre` selects for a BPE vocabulary in llama.cpp.
#[derive(Default)]
struct BpePre {
    regexes: Vec<&'static str>,
    ignore_merges: bool,
    add_bos: bool,
    /// Words stay UTF-8 (byte tokens are `<0xXX>`) rather than GPT-2's byte alphabet.
    raw_utf8: bool,
    /// Spaces become `▁` first (SentencePiece-style BPE).
    escape_whitespaces: bool,
    /// Gemma 4's whole newline runs.
    whole_newline_runs: bool,
    no_bos: bool,
    no_lowercase: bool,
}

/// llama.cpp's reading of a `tokenizer.ggml.pre` value (`llama_vocab::impl::load` and
/// the `llm_tokenizer_bpe` constructor). An unknown value is an error naming it, as in
/// llama.cpp.
fn bpe_pre(pre: &str) -> anyhow::Result<BpePre> {
    let r = |regexes: &[&'static str]| BpePre { regexes: regexes.to_vec(), ..BpePre::default() };
    let gpt2_rest = |first: &'static str| r(&[first, GPT2]);
    Ok(match pre {
        "default" => r(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => BpePre { ignore_merges: true, add_bos: true, ..r(&[LLAMA3]) },
        "minicpm5" => BpePre { ignore_merges: true, ..r(&[r"\p{N}{1,3}", MINICPM5]) },
        "jais-2" => r(&[JAIS2]),
        "dbrx" | "smaug-bpe" => r(&[LLAMA3]),
        "chatglm-bpe" => BpePre { no_bos: true, ..r(&[LLAMA3]) },
        "glm4" | "glm5" => BpePre { no_bos: true, ignore_merges: true, ..r(&[LLAMA3]) },
        "deepseek-llm" => r(&[
            "[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
            r"\s+$",
            "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
            r"\p{N}+",
        ]),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
            r(&[r"\p{N}{1,3}", "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+", DEEPSEEK3])
        }
        "spark2_5" => r(&[r"\p{N}{1,3}", "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+", SPARK2_5, r"\p{N}"]),
        "youtu" => BpePre { ignore_merges: true, ..r(&[YOUTU_CJK, YOUTU]) },
        "deepseek-coder" => r(&[
            "[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
            r"\p{N}",
        ]),
        "falcon" => r(&[FALCON_PUNCT, GPT2, "[0-9][0-9][0-9]"]),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            gpt2_rest(r"\p{N}")
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo" | "jais"
        | "trillion" | "granite-docling" => r(&[GPT2]),
        "gemma4" | "granite-embed-multi-311m" => {
            BpePre { raw_utf8: true, escape_whitespaces: true, whole_newline_runs: true, ..r(&[NEWLINE_RUNS]) }
        }
        "sarvam-moe" => BpePre { raw_utf8: true, escape_whitespaces: true, ..r(&[NEWLINE_RUNS]) },
        "whitespace" => BpePre { raw_utf8: true, no_lowercase: true, ..r(&[r"\S+"]) },
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" | "solar-open"
        | "grok-2" => r(&[QWEN2]),
        "qwen35" => r(&[QWEN35]),
        "poro-chat" | "bloom" | "gpt3-finnish" => r(&[BLOOM]),
        "viking" => r(&[BLOOM, r"\p{N}"]),
        "tekken" => BpePre { ignore_merges: true, add_bos: true, ..r(&[TEKKEN]) },
        "exaone-moe" => r(&[EXAONE_MOE]),
        "chameleon" => BpePre {
            add_bos: true,
            ..r(&[
                "<sentinel:[0-9]+>",
                "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                "([\\t\\n]|    |  )",
                r"\p{N}",
                r"[\p{P}!-/:-@\[-`{-~]",
                GPT2,
            ])
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => r(&[GPT4O]),
        "granite-embed-multi-97m" => BpePre { ignore_merges: true, ..r(&[GRANITE_EMB_MULTI]) },
        "tiny_aya" | "cohere2moe" => r(&[TINY_AYA_DIGITS, TINY_AYA]),
        "superbpe" => r(&[r"\p{N}+", r"(?=(\d{3})+(?!\d))"]),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => r(&[BAILING]),
        "seed-coder" => r(&[SEED_CODER]),
        "kimi-k2" => r(&[KIMI_K2]),
        "ufakzeka" => r(&[UFAKZEKA]),
        "afmoe" => r(&[AFMOE_DIGITS, AFMOE_CJK, DEEPSEEK3]),
        "laguna" => r(&[NEWLINE_RUNS, QWEN2]),
        other => bail!("tokenizer.ggml.pre `{other}` is not supported: llama.cpp does not know it either"),
    })
}

fn strings(f: &GgufFile, key: &str) -> anyhow::Result<Vec<String>> {
    let arr = f.get_array(key).with_context(|| format!("missing array `{key}`"))?;
    arr.iter()
        .enumerate()
        .map(|(i, v)| v.as_str().map(str::to_owned).with_context(|| format!("`{key}`[{i}] is not a string")))
        .collect()
}

fn flag(f: &GgufFile, key: &str) -> anyhow::Result<Option<bool>> {
    match f.get(key) {
        None => Ok(None),
        Some(GgufValue::Bool(b)) => Ok(Some(*b)),
        Some(v) => bail!("`{key}` is {}, not a bool", v.type_name()),
    }
}

/// Token texts whose ids llama.cpp looks up by text when no GGUF key names them, and
/// marks as control tokens: end of turn ([`EOT_TEXTS`]), then by the key of each role
/// ([`ROLE_TEXTS`]) end of message and the fill-in-the-middle set.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const ROLE_TEXTS: &[(&str, &[&str])] = &[
    ("tokenizer.ggml.eom_token_id", &["<|eom_id|>"]),
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    ("tokenizer.ggml.fim_pad_token_id", &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"]),
    ("tokenizer.ggml.fim_rep_token_id", &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];
/// Token texts that end generation in llama.cpp (and so become control tokens).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The vocabulary as llama.cpp's `llama_vocab::impl::load` reads it, with its defaults,
/// its overrides of token attributes, and the same errors for unknown types.
pub fn llama_vocab(f: &GgufFile) -> anyhow::Result<LlamaVocab> {
    let model = f.get_str("tokenizer.ggml.model").context("no `tokenizer.ggml.model`")?;
    let gguf_pre = f.get_str("tokenizer.ggml.pre");
    let mut tokens = strings(f, "tokenizer.ggml.tokens")?;
    let n = tokens.len();
    if n == 0 || n > i32::MAX as usize {
        bail!("`tokenizer.ggml.tokens` has {n} tokens");
    }

    // Defaults by family: (kind, bos, eos, unk, sep).
    let (kind, defaults): (VocabKind, [Option<u32>; 4]) = match model {
        "llama" => (VocabKind::Spm, [Some(1), Some(2), Some(0), None]),
        "bert" => (VocabKind::Wpm, [Some(101), None, Some(100), Some(102)]),
        "gpt2" | "whitespace" | "hybriddna" => (VocabKind::Bpe, [Some(11), Some(11), None, None]),
        "gemma4" => (VocabKind::Bpe, [None; 4]),
        "t5" => (VocabKind::Ugm, [None, Some(1), Some(2), None]),
        "rwkv" => (VocabKind::Rwkv, [None; 4]),
        "plamo2" => (VocabKind::Plamo2, [Some(1), Some(2), Some(0), None]),
        other => bail!(
            "tokenizer.ggml.model `{other}` is not supported (this build reads llama, gpt2, gemma4, whitespace, \
             hybriddna, bert, t5, rwkv and plamo2 vocabularies)"
        ),
    };
    let mut vocab = LlamaVocab {
        kind,
        tokens: Vec::new(),
        attrs: Vec::new(),
        scores: Vec::new(),
        merges: Vec::new(),
        bpe_session: match model {
            "whitespace" => BpeSession::Whitespace,
            "hybriddna" => BpeSession::HybridDna,
            _ => BpeSession::Plain,
        },
        pre_regexes: Vec::new(),
        byte_encode: false,
        ignore_merges: false,
        whole_newline_runs: false,
        escape_whitespaces: true,
        add_space_prefix: false,
        remove_extra_whitespaces: false,
        lowercase: true,
        strip_accents: true,
        add_bos: false,
        add_eos: false,
        bos: None,
        eos: None,
        unk: None,
        sep: None,
        precompiled_charsmap: None,
        fim: Default::default(),
        eog: Vec::new(),
    };
    let mut no_bos = false;
    match kind {
        VocabKind::Bpe => {
            let pre = if model == "gemma4" { "gemma4" } else { gguf_pre.unwrap_or("default") };
            let bpe = bpe_pre(pre)?;
            vocab.pre_regexes = bpe.regexes.iter().map(|r| r.to_string()).collect();
            vocab.byte_encode = !bpe.raw_utf8;
            vocab.escape_whitespaces = bpe.escape_whitespaces;
            vocab.ignore_merges = bpe.ignore_merges;
            vocab.whole_newline_runs = bpe.whole_newline_runs;
            vocab.add_bos = bpe.add_bos;
            vocab.lowercase = !bpe.no_lowercase;
            no_bos = bpe.no_bos;
            vocab.merges = match f.get_array("tokenizer.ggml.merges") {
                Some(_) => strings(f, "tokenizer.ggml.merges")?,
                // llama.cpp's Kimi-K2 tokenizer works without merges.
                None if pre == "kimi-k2" => Vec::new(),
                None => bail!("missing array `tokenizer.ggml.merges`"),
            };
        }
        VocabKind::Spm => {
            vocab.add_space_prefix = true;
            vocab.add_bos = true;
        }
        VocabKind::Wpm => vocab.add_bos = true,
        VocabKind::Ugm => {
            vocab.add_eos = true;
            if let Some(v) = f.get("tokenizer.ggml.precompiled_charsmap") {
                const KEY: &str = "tokenizer.ggml.precompiled_charsmap";
                let items = v.as_array().with_context(|| format!("`{KEY}` is {}, not an array", v.type_name()))?;
                if items.len() > MAX_CHARSMAP_BYTES {
                    bail!("`{KEY}` has {} bytes, more than the {MAX_CHARSMAP_BYTES} accepted", items.len());
                }
                let bytes: Vec<u8> = items
                    .iter()
                    .map(|b| match b {
                        GgufValue::U8(b) => Ok(*b),
                        GgufValue::I8(b) => Ok(*b as u8),
                        other => bail!("`{KEY}` holds {}, not bytes", other.type_name()),
                    })
                    .collect::<anyhow::Result<_>>()?;
                let blob = bytes.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                match blob {
                    Some(len) if len.saturating_add(4) < bytes.len() => {}
                    _ => bail!("`{KEY}` is too short for the length its header gives"),
                }
                vocab.precompiled_charsmap = Some(base64::engine::general_purpose::STANDARD.encode(&bytes));
            }
        }
        VocabKind::Rwkv | VocabKind::Plamo2 => {}
    }
    if let Some(v) = flag(f, "tokenizer.ggml.add_space_prefix")? {
        vocab.add_space_prefix = v;
    }
    if let Some(v) = flag(f, "tokenizer.ggml.remove_extra_whitespaces")? {
        vocab.remove_extra_whitespaces = v;
    }

    // Token texts, scores and attributes.
    for (i, t) in tokens.iter_mut().enumerate() {
        if t.is_empty() {
            *t = format!("[EMPTY_{i}]");
        }
    }
    vocab.scores = scores(f, n)?;
    let mut attrs = token_attrs(f, n)?;
    // llama.cpp looks tokens up by text; a repeated text means its last id.
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        ids.insert(t, i as u32);
    }
    // The ids llama.cpp holds by text (`token_to_id`), lowest first, for the by-text
    // look-ups below (llama.cpp walks a hash map; the order only matters for a vocabulary
    // with two texts of one list).
    let mut by_text: Vec<(u32, &str)> = ids.iter().map(|(t, &id)| (id, *t)).collect();
    by_text.sort_unstable();

    // Special ids: the family's defaults (dropped when outside the vocabulary), then the
    // GGUF keys that name an id inside it.
    let key_id = |key: &str| -> Option<u32> { f.get_u64(key).filter(|&id| id < n as u64).map(|id| id as u32) };
    let inside = |id: Option<u32>| id.filter(|&id| (id as usize) < n);
    let [bos, eos, unk, sep] = defaults;
    vocab.bos = key_id("tokenizer.ggml.bos_token_id").or(if no_bos { None } else { inside(bos) });
    vocab.eos = key_id("tokenizer.ggml.eos_token_id").or(inside(eos));
    vocab.unk = key_id("tokenizer.ggml.unknown_token_id").or(inside(unk));
    vocab.sep = key_id("tokenizer.ggml.seperator_token_id").or(inside(sep));
    let eot_key = key_id("tokenizer.ggml.eot_token_id");
    if let Some(v) = flag(f, "tokenizer.ggml.add_bos_token")? {
        vocab.add_bos = v;
    }
    if let Some(v) = flag(f, "tokenizer.ggml.add_eos_token")? {
        vocab.add_eos = v;
    }
    if vocab.whole_newline_runs {
        // llama.cpp forces BOS on for Gemma 4.
        vocab.add_bos = true;
    }
    if let Some(v) = flag(f, "tokenizer.ggml.normalizer.lowercase")? {
        vocab.lowercase = v;
    }
    vocab.strip_accents = vocab.lowercase;
    if let Some(v) = flag(f, "tokenizer.ggml.normalizer.strip_accents")? {
        vocab.strip_accents = v;
    }

    let roles: Vec<Option<u32>> = ROLE_TEXTS.iter().map(|(key, _)| key_id(key)).collect();
    let (found, eog) = mark_by_text(&tokens, &by_text, &mut attrs, eot_key, &roles, vocab.eos);
    vocab.eog = eog;
    // `found` is end of turn, then each role of `ROLE_TEXTS`: end of message, then FIM.
    if let [_, _, pre, suf, mid, pad, rep, sep] = found[..] {
        vocab.fim = FimIds { pre, suf, mid, pad, rep, sep };
    }

    set_strip_flags(f, gguf_pre.unwrap_or(""), &ids, &mut attrs);
    vocab.tokens = tokens;
    vocab.attrs = attrs;
    Ok(vocab)
}

fn scores(f: &GgufFile, n: usize) -> anyhow::Result<Vec<f32>> {
    let Some(a) = f.get_array("tokenizer.ggml.scores") else { return Ok(Vec::new()) };
    if a.len() < n {
        bail!("`tokenizer.ggml.scores` has {} entries for {n} tokens", a.len());
    }
    a[..n]
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            GgufValue::F32(x) => Ok(*x),
            GgufValue::I32(x) => Ok(*x as f32),
            other => bail!("`tokenizer.ggml.scores`[{i}] is {}, not f32 or i32", other.type_name()),
        })
        .collect()
}

/// [`attr`] bits from `tokenizer.ggml.token_type` (normal without it).
fn token_attrs(f: &GgufFile, n: usize) -> anyhow::Result<Vec<u32>> {
    let Some(a) = f.get_array("tokenizer.ggml.token_type") else { return Ok(vec![attr::NORMAL; n]) };
    if a.len() < n {
        bail!("`tokenizer.ggml.token_type` has {} entries for {n} tokens", a.len());
    }
    a[..n]
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let t = v.as_i64().with_context(|| format!("`tokenizer.ggml.token_type`[{i}] is not an integer"))?;
            Ok(match t {
                TOKEN_UNKNOWN => attr::UNKNOWN,
                TOKEN_UNUSED => attr::UNUSED,
                TOKEN_NORMAL => attr::NORMAL,
                TOKEN_CONTROL => attr::CONTROL,
                TOKEN_USER_DEFINED => attr::USER_DEFINED,
                TOKEN_BYTE => attr::BYTE,
                _ => 0,
            })
        })
        .collect()
}

/// llama.cpp's load-time fixes of token attributes by token text: the first token of
/// each role list ([`EOT_TEXTS`], [`ROLE_TEXTS`]) whose role no key names, and every
/// end-of-generation text, become control tokens; control tokens named "unused" are
/// unused; and a few model-specific exceptions. `by_text` is every (id, text) llama.cpp
/// looks up by text, lowest id first; `roles` the ids the [`ROLE_TEXTS`] keys name.
/// Returns the id found for end of turn and for each role, by key or by text, and the
/// end-of-generation ids (in the order found, without repeats).
fn mark_by_text(
    tokens: &[String],
    by_text: &[(u32, &str)],
    attrs: &mut [u32],
    eot: Option<u32>,
    roles: &[Option<u32>],
    eos: Option<u32>,
) -> (Vec<Option<u32>>, Vec<u32>) {
    let lists = std::iter::once((eot, EOT_TEXTS)).chain(roles.iter().zip(ROLE_TEXTS).map(|(&id, (_, t))| (id, *t)));
    let mut eog: Vec<u32> = Vec::new();
    let mut all = Vec::new();
    for (i, (named, texts)) in lists.enumerate() {
        let found = named.or_else(|| {
            let &(id, _) = by_text.iter().find(|(_, t)| texts.contains(t))?;
            attrs[id as usize] |= attr::CONTROL;
            Some(id)
        });
        // End of turn, end of message, and FIM pad, repo and file separator end generation.
        let ends_generation = !matches!(i, 2..=4);
        eog.extend(found.filter(|_| ends_generation));
        all.push(found);
    }
    for &(id, t) in by_text {
        let a = &mut attrs[id as usize];
        if *a & attr::CONTROL != 0 && t.contains("unused") {
            *a |= attr::UNUSED;
        }
    }
    for &(id, t) in by_text {
        if EOG_TEXTS.contains(&t) {
            eog.push(id);
            attrs[id as usize] |= attr::CONTROL;
        }
        // llama.cpp's gpt-oss fix: these are always rendered.
        if matches!(t, "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>") {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend(eos);
    // Tokens that look like ends but are not, in some vocabularies: out of the set again.
    let mut ordinary = Vec::new();
    let find = |text: &str| eog.iter().copied().find(|&id| tokens[id as usize] == text);
    let has_call = find("<|call|>").is_some() || find("<|calls|>").is_some();
    if let Some(end) = find("<|end|>")
        && has_call
        && (find("<|return|>").is_some() || find("<|flush|>").is_some())
    {
        // o200k_harmony and solar-open: `<|end|>` is an ordinary user-defined token.
        attrs[end as usize] = attr::USER_DEFINED;
        ordinary.push(end);
    }
    if (find("<|tool_response>").is_some() || find("<|plamo:eos|>").is_some())
        && let Some(s) = find("</s>")
    {
        // Gemma 4 and PLaMo: `</s>` is an ordinary token.
        attrs[s as usize] = attr::NORMAL;
        ordinary.push(s);
    }
    let mut unique = Vec::with_capacity(eog.len());
    for id in eog {
        if !unique.contains(&id) && !ordinary.contains(&id) {
            unique.push(id);
        }
    }
    (all, unique)
}

/// The strip flags llama.cpp sets by model name, architecture or pre-tokenizer: the
/// whitespace before `<mask>` goes with it (jina, nomic), or after special tokens (Phi-3).
fn set_strip_flags(f: &GgufFile, pre: &str, ids: &HashMap<&str, u32>, attrs: &mut [u32]) {
    let name = f.get_str("general.name").unwrap_or("").to_lowercase();
    let arch = f.get_str("general.architecture").unwrap_or("");
    let set = |attrs: &mut [u32], text: &str, bit: u32, on: bool| {
        if let Some(&id) = ids.get(text) {
            let a = &mut attrs[id as usize];
            *a = if on { *a | bit } else { *a & !bit };
        }
    };
    if ["jina-v2-de", "jina-v2-es", "jina-v2-code"].iter().any(|p| pre.contains(p))
        || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|a| arch.contains(a))
    {
        set(attrs, "<mask>", attr::LSTRIP, true);
    } else if name.contains("phi-3") || name.contains("phi3") {
        for a in attrs.iter_mut() {
            if *a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
                *a |= attr::RSTRIP;
            }
        }
        set(attrs, "</s>", attr::RSTRIP, true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set(attrs, t, attr::RSTRIP, false);
        }
    } else if name.contains("modern-bert") {
        set(attrs, "[MASK]", attr::LSTRIP, true);
    }
}

/// One `tokenizer.ggml.pre` name for each pre-tokenizer llama.cpp distinguishes (the
/// names [`bpe_pre`] reads that behave alike are represented once), most common first:
/// the names an export may write.
pub const PRE_NAMES: &[&str] = &[
    "qwen2",
    "llama-bpe",
    "smollm",
    "gpt-2",
    "qwen35",
    "gpt-4o",
    "tekken",
    "deepseek-v3",
    "default",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "dbrx",
    "chatglm-bpe",
    "glm4",
    "minicpm5",
    "jais-2",
    "spark2_5",
    "youtu",
    "gemma4",
    "sarvam-moe",
    "whitespace",
    "bloom",
    "viking",
    "exaone-moe",
    "chameleon",
    "granite-embed-multi-97m",
    "tiny_aya",
    "superbpe",
    "bailingmoe",
    "seed-coder",
    "kimi-k2",
    "ufakzeka",
    "afmoe",
    "laguna",
];

/// The `tokenizer.ggml.pre` of [`PRE_NAMES`] whose reading gives this BPE vocabulary's
/// pre-tokenizer (its regexes and flags), if any.
pub fn pre_name(v: &LlamaVocab) -> Option<&'static str> {
    PRE_NAMES.iter().copied().find(|name| {
        bpe_pre(name).is_ok_and(|b| {
            b.regexes.iter().map(|r| r.to_string()).eq(v.pre_regexes.iter().cloned())
                && b.raw_utf8 != v.byte_encode
                && b.escape_whitespaces == v.escape_whitespaces
                && b.ignore_merges == v.ignore_merges
                && b.whole_newline_runs == v.whole_newline_runs
        })
    })
}

/// `tokenizer.ggml.*` metadata that [`llama_vocab`] reads back as `v`: the inverse of the
/// reading, for `strata export`. `pre` overrides the pre-tokenizer's name (else
/// [`pre_name`] finds it).
pub fn gguf_keys(v: &LlamaVocab, pre: Option<&str>) -> anyhow::Result<Vec<(String, GgufValue)>> {
    let model = match (v.kind, v.bpe_session) {
        (VocabKind::Spm, _) => "llama",
        (VocabKind::Bpe, BpeSession::Whitespace) => "whitespace",
        (VocabKind::Bpe, BpeSession::HybridDna) => "hybriddna",
        (VocabKind::Bpe, BpeSession::Plain) if v.whole_newline_runs => "gemma4",
        (VocabKind::Bpe, BpeSession::Plain) => "gpt2",
        (VocabKind::Wpm, _) => "bert",
        (VocabKind::Ugm, _) => "t5",
        (VocabKind::Rwkv, _) => "rwkv",
        (VocabKind::Plamo2, _) => "plamo2",
    };
    let s = |x: &str| GgufValue::String(x.to_string());
    let mut keys = vec![("tokenizer.ggml.model".to_string(), s(model))];
    if model == "gpt2" {
        let pre = match pre {
            Some(p) => p,
            None => pre_name(v).context("no llama.cpp pre-tokenizer name reads as this vocabulary's")?,
        };
        keys.push(("tokenizer.ggml.pre".into(), s(pre)));
    }
    let strings = |items: &[String]| GgufValue::Array(items.iter().map(|t| s(t)).collect());
    keys.push(("tokenizer.ggml.tokens".into(), strings(&v.tokens)));
    if !v.scores.is_empty() {
        keys.push((
            "tokenizer.ggml.scores".into(),
            GgufValue::Array(v.scores.iter().map(|&x| GgufValue::F32(x)).collect()),
        ));
    }
    let types = v.attrs.iter().map(|&a| {
        GgufValue::I32(match a {
            a if a & attr::CONTROL != 0 => TOKEN_CONTROL,
            a if a & attr::USER_DEFINED != 0 => TOKEN_USER_DEFINED,
            a if a & attr::UNKNOWN != 0 => TOKEN_UNKNOWN,
            a if a & attr::UNUSED != 0 => TOKEN_UNUSED,
            a if a & attr::BYTE != 0 => TOKEN_BYTE,
            _ => TOKEN_NORMAL,
        } as i32)
    });
    keys.push(("tokenizer.ggml.token_type".into(), GgufValue::Array(types.collect())));
    if v.kind == VocabKind::Bpe {
        keys.push(("tokenizer.ggml.merges".into(), strings(&v.merges)));
    }
    for (key, id) in
        [("bos_token_id", v.bos), ("eos_token_id", v.eos), ("unknown_token_id", v.unk), ("seperator_token_id", v.sep)]
    {
        if let Some(id) = id {
            keys.push((format!("tokenizer.ggml.{key}"), GgufValue::U32(id)));
        }
    }
    for (key, on) in [
        ("add_bos_token", v.add_bos),
        ("add_eos_token", v.add_eos),
        ("add_space_prefix", v.add_space_prefix),
        ("remove_extra_whitespaces", v.remove_extra_whitespaces),
    ] {
        keys.push((format!("tokenizer.ggml.{key}"), GgufValue::Bool(on)));
    }
    if v.kind == VocabKind::Wpm {
        keys.push(("tokenizer.ggml.normalizer.lowercase".into(), GgufValue::Bool(v.lowercase)));
    }
    let charsmap = v.charsmap().map_err(anyhow::Error::msg)?;
    if !charsmap.is_empty() {
        let bytes = charsmap.into_iter().map(GgufValue::U8).collect();
        keys.push(("tokenizer.ggml.precompiled_charsmap".into(), GgufValue::Array(bytes)));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_pre_tokenizer_is_read_and_unknown_ones_are_named() {
        let known = [
            "default",
            "gpt-2",
            "llama-bpe",
            "qwen2",
            "qwen35",
            "starcoder",
            "falcon",
            "deepseek-llm",
            "deepseek-v3",
            "kimi-k2",
            "afmoe",
            "superbpe",
            "minicpm5",
            "gemma4",
            "tiny_aya",
            "chameleon",
            "whitespace",
        ];
        for pre in known {
            let p = bpe_pre(pre).unwrap();
            assert!(!p.regexes.is_empty(), "{pre}");
        }
        assert!(bpe_pre("llama-bpe").unwrap().ignore_merges && !bpe_pre("qwen2").unwrap().ignore_merges);
        let err = bpe_pre("no-such-pre").err().unwrap().to_string();
        assert!(err.contains("`no-such-pre` is not supported"), "{err}");
    }
}
