//! Tokenizer glue: a Hugging Face `tokenizers::Tokenizer` plus what transformers reads from
//! `tokenizer_config.json`, `generation_config.json` and the chat template.
//!
//! The goal is transformers parity (`AutoTokenizer.from_pretrained` in transformers 5):
//! - named special tokens (`bos_token`, `eos_token`, `unk_token`, ...) may be strings or
//!   AddedToken objects (`{"content": ...}`); transformers (re)registers them as special
//!   tokens, and so do we;
//! - an explicit `add_bos_token` / `add_eos_token` in the config replaces the post-processor
//!   with `[bos] $A [eos]` (transformers' `update_post_processor`);
//! - `tokenizer_class: LlamaTokenizer` with a SentencePiece-style (non byte-level)
//!   tokenizer.json is rebuilt the way transformers' `LlamaTokenizer` class builds it
//!   (Metaspace pre-tokenizer, no normalizer) unless the model type makes AutoTokenizer use
//!   the plain tokenizer.json (Mistral and friends; see [`TokenizerSources::model_config_json`]);
//! - `clean_up_tokenization_spaces` is honoured on decode for non-BPE models only, as in
//!   transformers 5;
//! - eos ids are the union of the config's eos token and generation_config `eos_token_id`.
//!
//! Chat-rendered text is tokenized with `add_special_tokens = false`, as
//! `apply_chat_template` does.
//!
//! A tokenizer made from a GGUF file (its `tokenizer_config.json` holds the llama.cpp
//! vocabulary, see [`strata_model::gguf_vocab`]) encodes with llama.cpp's own algorithms
//! ([`llama`]) instead, so its ids are llama.cpp's; decoding still goes through the
//! Hugging Face tokenizer built from the same vocabulary.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;
use tokenizers::{AddedToken, DecoderWrapper, ModelWrapper, PreTokenizerWrapper, Tokenizer};

use self::llama::LlamaTokenizer;
use super::template::{ChatMessage, ChatTemplate};
use strata_model::gguf_vocab::{FimIds, LLAMA_VOCAB_KEY, LlamaVocab};

pub mod llama;

/// The markers that end a harmony reply (gpt-oss): after a tool call, and after the answer.
const HARMONY_ENDS: [&str; 2] = ["<|call|>", "<|return|>"];

/// Whether a chat template writes harmony messages (as `toolcall::harmony::is_harmony`
/// reads it; not imported from there, which imports this module through the grammar).
fn is_harmony(template: &str) -> bool {
    ["<|start|>", "<|channel|>", "<|message|>"].iter().all(|m| template.contains(m))
}

pub use super::text_error::TextError;

/// Everything a tokenizer is made from, as file contents.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenizerSources<'a> {
    /// tokenizer.json
    pub tokenizer_json: &'a str,
    /// tokenizer_config.json
    pub tokenizer_config_json: Option<&'a str>,
    /// generation_config.json
    pub generation_config_json: Option<&'a str>,
    /// chat_template.jinja; wins over tokenizer_config's `chat_template`.
    pub chat_template: Option<&'a str>,
    /// The model's config.json. Only `model_type` is read: AutoTokenizer loads models of
    /// some types (mistral, mixtral, ...) with the plain tokenizer.json even when the
    /// config names `LlamaTokenizer`. Without it, the named class is trusted.
    pub model_config_json: Option<&'a str>,
}

/// Biggest file accepted by [`TextTokenizer::from_dir`].
const MAX_FILE_BYTES: u64 = 512 << 20;

/// The named special-token attributes transformers passes to chat templates.
const SPECIAL_TOKEN_NAMES: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// Model types that AutoTokenizer (transformers 5.23, without mistral_common) loads with
/// the generic backend, i.e. tokenizer.json as is, whatever `tokenizer_class` says.
/// Regenerate with `TOKENIZER_MAPPING_NAMES` when bumping transformers.
const GENERIC_BACKEND_MODEL_TYPES: &[&str] = &[
    "arctic",
    "aria",
    "chatlm",
    "ernie4_5",
    "ernie4_5_moe",
    "flex_olmo",
    "fuyu",
    "glm",
    "glm4",
    "glm4_moe",
    "glm4_moe_lite",
    "glm4v",
    "glm4v_moe",
    "gpt_bigcode",
    "granite",
    "granitemoe",
    "granitemoehybrid",
    "granitemoeshared",
    "internlm2",
    "internlm3",
    "jamba",
    "kimi_k25",
    "kimi_linear",
    "llava",
    "llava_next",
    "minicpm3",
    "minicpmv",
    "minimax_m2",
    "ministral",
    "ministral3",
    "mistral",
    "mistral3",
    "mistral_large4",
    "mixtral",
    "molmo",
    "molmo2",
    "nemotron",
    "olmo2",
    "olmo3",
    "olmo_hybrid",
    "persimmon",
    "phi3",
    "phi3_v",
    "phimoe",
    "pixtral",
    "smolvlm",
    "stablelm",
    "step3_vl",
    "vipllava",
    "voxtral",
];

/// A Hugging Face tokenizer with the model's special tokens and chat template.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// llama.cpp's tokenizer for a GGUF vocabulary; encodes in place of `inner`.
    llama: Option<LlamaTokenizer>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    clean_up_spaces: bool,
    chat_template: Option<ChatTemplate>,
    named_templates: BTreeMap<String, ChatTemplate>,
    fim: FimIds,
}

/// A fill-in-the-middle request: the text before and after the cursor (Ollama's and
/// OpenAI's `suffix`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Infill {
    pub prefix: String,
    pub suffix: String,
}

/// Whether a model's tokenizer files hold the fill-in-the-middle tokens (prefix, suffix
/// and middle) that [`TextTokenizer::encode_infill`] needs, read without building the
/// tokenizer: a GGUF's from the vocabulary it was converted with, a Hugging Face
/// tokenizer's among its special added tokens.
pub fn fills_in_middle(tokenizer_json: &str, tokenizer_config_json: Option<&str>) -> bool {
    // The key is `LLAMA_VOCAB_KEY` (serde's `rename` takes a literal only).
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(rename = "llama_cpp_vocab")]
        vocab: Option<VocabFim>,
    }
    #[derive(serde::Deserialize)]
    struct VocabFim {
        #[serde(default)]
        fim: FimIds,
    }
    #[derive(serde::Deserialize)]
    struct Added {
        #[serde(default)]
        id: u32,
        content: String,
        #[serde(default)]
        special: bool,
    }
    #[derive(serde::Deserialize)]
    struct Tok {
        #[serde(default)]
        added_tokens: Vec<Added>,
    }
    let whole = |f: FimIds| f.pre.is_some() && f.suf.is_some() && f.mid.is_some();
    if let Some(Config { vocab: Some(v) }) = tokenizer_config_json.and_then(|t| serde_json::from_str(t).ok()) {
        return whole(v.fim);
    }
    let Ok(tok) = serde_json::from_str::<Tok>(tokenizer_json) else { return false };
    whole(FimIds::by_text(|t| tok.added_tokens.iter().find(|a| a.special && a.content == t).map(|a| a.id)))
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// A special token as written in tokenizer_config.json.
#[derive(Clone, Debug)]
struct ConfigToken {
    content: String,
    /// Set when the config gave an AddedToken object rather than a string.
    added: Option<AddedToken>,
}

fn parse_config_token(v: &Json) -> Option<ConfigToken> {
    match v {
        Json::String(s) => Some(ConfigToken { content: s.clone(), added: None }),
        Json::Object(m) => {
            let content = m.get("content")?.as_str()?.to_string();
            let flag = |k: &str, default: bool| m.get(k).and_then(Json::as_bool).unwrap_or(default);
            let special = flag("special", true);
            let added = AddedToken {
                content: content.clone(),
                single_word: flag("single_word", false),
                lstrip: flag("lstrip", false),
                rstrip: flag("rstrip", false),
                normalized: flag("normalized", !special),
                special,
            };
            Some(ConfigToken { content, added: Some(added) })
        }
        _ => None,
    }
}

fn parse_json(file: &str, text: &str) -> Result<Json, TextError> {
    serde_json::from_str(text).map_err(|e| TextError::Load { file: file.to_string(), msg: e.to_string() })
}

fn token_ids_field(v: Option<&Json>) -> Result<Vec<u32>, String> {
    let as_id = |x: &Json| -> Result<u32, String> {
        x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("expected a token id, got {x}"))
    };
    match v {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items.iter().map(as_id).collect(),
        Some(x) => Ok(vec![as_id(x)?]),
    }
}

impl TextTokenizer {
    /// Builds the tokenizer from file contents (see [`TokenizerSources`]).
    pub fn from_sources(
        tokenizer_json: &str,
        tokenizer_config_json: Option<&str>,
        generation_config_json: Option<&str>,
        chat_template_file: Option<&str>,
    ) -> Result<Self, TextError> {
        Self::from_parts(TokenizerSources {
            tokenizer_json,
            tokenizer_config_json,
            generation_config_json,
            chat_template: chat_template_file,
            model_config_json: None,
        })
    }

    /// Reads `tokenizer.json`, and if present `tokenizer_config.json`,
    /// `generation_config.json`, `chat_template.jinja` and `config.json`, from a model
    /// directory.
    pub fn from_dir(dir: &Path) -> Result<Self, TextError> {
        let read = |name: &str, required: bool| -> Result<Option<String>, TextError> {
            let path = dir.join(name);
            let err = |msg: String| TextError::Load { file: path.display().to_string(), msg };
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                    return Ok(None);
                }
                Err(e) => return Err(err(e.to_string())),
            };
            if meta.len() > MAX_FILE_BYTES {
                return Err(err(format!("file is {} bytes, more than the {MAX_FILE_BYTES} accepted", meta.len())));
            }
            std::fs::read_to_string(&path).map(Some).map_err(|e| err(e.to_string()))
        };
        let tokenizer_json = read("tokenizer.json", true)?.unwrap_or_default();
        let tokenizer_config = read("tokenizer_config.json", false)?;
        let generation_config = read("generation_config.json", false)?;
        let chat_template = read("chat_template.jinja", false)?;
        let model_config = read("config.json", false)?;
        Self::from_parts(TokenizerSources {
            tokenizer_json: &tokenizer_json,
            tokenizer_config_json: tokenizer_config.as_deref(),
            generation_config_json: generation_config.as_deref(),
            chat_template: chat_template.as_deref(),
            model_config_json: model_config.as_deref(),
        })
    }

    pub fn from_parts(src: TokenizerSources<'_>) -> Result<Self, TextError> {
        let mut inner: Tokenizer = src
            .tokenizer_json
            .parse()
            .map_err(|e: tokenizers::Error| TextError::Load { file: "tokenizer.json".into(), msg: e.to_string() })?;

        let mut config = match src.tokenizer_config_json {
            Some(t) => parse_json("tokenizer_config.json", t)?,
            None => Json::Object(Default::default()),
        };
        let mut fim = FimIds::default();
        let llama = match config.as_object_mut().and_then(|m| m.remove(LLAMA_VOCAB_KEY)) {
            None => None,
            Some(v) => {
                let err = |msg: String| TextError::InvalidConfig {
                    file: "tokenizer_config.json",
                    field: LLAMA_VOCAB_KEY.into(),
                    msg,
                };
                let spec: LlamaVocab = serde_json::from_value(v).map_err(|e| err(e.to_string()))?;
                fim = spec.fim;
                Some(LlamaTokenizer::new(spec).map_err(err)?)
            }
        };
        let gen_config = match src.generation_config_json {
            Some(t) => parse_json("generation_config.json", t)?,
            None => Json::Object(Default::default()),
        };
        let model_type = match src.model_config_json {
            Some(t) => parse_json("config.json", t)?.get("model_type").and_then(Json::as_str).map(str::to_string),
            None => None,
        };
        let cfg_bool = |k: &str| config.get(k).and_then(Json::as_bool);

        // Named special tokens, in transformers' attribute order.
        let mut named: Vec<(&'static str, ConfigToken)> = Vec::new();
        for name in SPECIAL_TOKEN_NAMES {
            if let Some(tok) = config.get(name).and_then(parse_config_token) {
                named.push((name, tok));
            }
        }
        let named_content = |name: &str| named.iter().find(|(n, _)| *n == name).map(|(_, t)| t.content.clone());
        let bos_token = named_content("bos_token");
        let eos_token = named_content("eos_token");

        // transformers' LlamaTokenizer class rebuilds the pipeline around the vocabulary.
        let class = config.get("tokenizer_class").and_then(Json::as_str).unwrap_or("");
        let llama_class = matches!(class, "LlamaTokenizer" | "LlamaTokenizerFast");
        let generic_model_type = model_type.as_deref().is_some_and(|t| GENERIC_BACKEND_MODEL_TYPES.contains(&t));
        if llama_class
            && !generic_model_type
            && !src.tokenizer_json.contains("\"ByteLevel\"")
            && matches!(inner.get_model(), ModelWrapper::BPE(_))
        {
            let add_prefix_space = cfg_bool("add_prefix_space").unwrap_or(true);
            let legacy = cfg_bool("legacy").unwrap_or(false);
            rebuild_as_llama_class(&mut inner, add_prefix_space, legacy)?;
        }

        // Register the named special tokens (adds missing ones, marks existing ones special).
        let to_add: Vec<AddedToken> = named
            .iter()
            .map(|(_, t)| {
                t.added.clone().unwrap_or_else(|| {
                    let mut a = AddedToken::from(t.content.clone(), true);
                    a.normalized = false;
                    a
                })
            })
            .collect();
        if !to_add.is_empty() {
            inner.add_special_tokens(to_add).map_err(|e| TextError::Load {
                file: "tokenizer_config.json".into(),
                msg: format!("cannot add special tokens: {e}"),
            })?;
        }

        // Explicit add_bos_token / add_eos_token rebuild the post-processor.
        let add_bos_cfg = cfg_bool("add_bos_token");
        let add_eos_cfg = cfg_bool("add_eos_token");
        if config.get("add_bos_token").is_some() || config.get("add_eos_token").is_some() {
            let bos = bos_token.as_ref().and_then(|t| inner.token_to_id(t).map(|id| (t.clone(), id)));
            let eos = eos_token.as_ref().and_then(|t| inner.token_to_id(t).map(|id| (t.clone(), id)));
            let bos = bos.filter(|_| add_bos_cfg.unwrap_or(false));
            let eos = eos.filter(|_| add_eos_cfg.unwrap_or(false));
            inner.with_post_processor(Some(template_processing(bos, eos)?));
        }

        let token_id = |t: &Option<String>| t.as_ref().and_then(|t| inner.token_to_id(t));
        let gen_eos = token_ids_field(gen_config.get("eos_token_id")).map_err(|msg| TextError::InvalidConfig {
            file: "generation_config.json",
            field: "eos_token_id".into(),
            msg,
        })?;
        let mut eos_ids: Vec<u32> = Vec::new();
        for id in token_id(&eos_token).into_iter().chain(gen_eos) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let gen_bos = token_ids_field(gen_config.get("bos_token_id")).map_err(|msg| TextError::InvalidConfig {
            file: "generation_config.json",
            field: "bos_token_id".into(),
            msg,
        })?;
        let bos_id = gen_bos.first().copied().or_else(|| token_id(&bos_token));

        let model_is_bpe = matches!(inner.get_model(), ModelWrapper::BPE(_));
        let clean_up_spaces = cfg_bool("clean_up_tokenization_spaces").unwrap_or(false)
            && (!model_is_bpe
                || cfg_bool("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")
                    .unwrap_or(false));

        // Chat templates: chat_template.jinja wins; the config may hold a string or a list
        // of {name, template}.
        let special_map: Vec<(&'static str, String)> = named.iter().map(|(n, t)| (*n, t.content.clone())).collect();
        let compile = |source: &str| -> Result<ChatTemplate, TextError> {
            let mut t = ChatTemplate::new(source, bos_token.clone(), eos_token.clone())?;
            for (name, value) in &special_map {
                if !matches!(*name, "bos_token" | "eos_token") {
                    t = t.with_special_token(name, value.clone());
                }
            }
            Ok(t)
        };
        let mut named_templates = BTreeMap::new();
        let chat_template = if let Some(src) = src.chat_template {
            Some(compile(src)?)
        } else {
            match config.get("chat_template") {
                None | Some(Json::Null) => None,
                Some(Json::String(s)) => Some(compile(s)?),
                Some(Json::Array(items)) => {
                    for item in items {
                        let (Some(name), Some(tmpl)) =
                            (item.get("name").and_then(Json::as_str), item.get("template").and_then(Json::as_str))
                        else {
                            return Err(TextError::InvalidConfig {
                                file: "tokenizer_config.json",
                                field: "chat_template".into(),
                                msg: "list entries must be {\"name\": ..., \"template\": ...}".into(),
                            });
                        };
                        named_templates.insert(name.to_string(), compile(tmpl)?);
                    }
                    named_templates.remove("default")
                }
                Some(_) => {
                    return Err(TextError::InvalidConfig {
                        file: "tokenizer_config.json",
                        field: "chat_template".into(),
                        msg: "must be a string or a list of named templates".into(),
                    });
                }
            }
        };

        // gpt-oss's harmony template: `<|return|>` and `<|call|>` end generation, as
        // llama.cpp counts them (its GGUF vocabularies list them already), even where a
        // generation_config.json does not name them.
        if chat_template.as_ref().is_some_and(|t| is_harmony(t.source())) {
            for id in HARMONY_ENDS.iter().filter_map(|t| inner.token_to_id(t)) {
                if !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        }
        if llama.is_none() {
            // A Hugging Face tokenizer's FIM tokens are special added tokens.
            let added = inner.get_added_tokens_decoder();
            fim = FimIds::by_text(|t| inner.token_to_id(t).filter(|id| added.get(id).is_some_and(|a| a.special)));
        }
        let mut tok = Self {
            fim,
            inner,
            llama,
            bos_token,
            eos_token,
            bos_id,
            eos_ids,
            add_bos: false,
            clean_up_spaces,
            chat_template,
            named_templates,
        };
        tok.add_bos = tok.detect_add_bos();
        Ok(tok)
    }

    /// Whether `encode(_, true)` puts the BOS token in front.
    fn detect_add_bos(&self) -> bool {
        let Some(bos) = self.bos_id else { return false };
        let with = self.encode("a", true).unwrap_or_default();
        let without = self.encode("a", false).unwrap_or_default();
        with.first() == Some(&bos) && without.first() != Some(&bos)
    }

    /// The ids of `text`; special tokens written in it are always recognised.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        if let Some(llama) = &self.llama {
            return llama.encode(text, add_special_tokens, true).map_err(TextError::Encode);
        }
        self.inner
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TextError::Encode(e.to_string()))
    }

    /// Decodes like transformers' `decode` (including its space clean-up where it applies).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        let text = self.decode_raw(ids, skip_special_tokens)?;
        Ok(if self.clean_up_spaces { clean_up_tokenization(&text) } else { text })
    }

    /// The backend's decode without transformers' clean-up step.
    pub fn decode_raw(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| TextError::Decode(e.to_string()))
    }

    /// Whether decode applies `clean_up_tokenization` (non-BPE models whose config asks).
    pub fn cleans_up_tokenization_spaces(&self) -> bool {
        self.clean_up_spaces
    }

    /// Every id that ends generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Whether `encode(text, true)` prepends BOS.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Number of ids, added tokens included (`len(tokenizer)` in transformers).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes token `id` stands for (OpenAI's logprobs `bytes`): byte-level BPE pieces
    /// map back through GPT-2's byte alphabet, SentencePiece byte tokens `<0xNN>` are that
    /// byte, `▁` is a space, added tokens are their text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.inner.id_to_token(id) else { return Vec::new() };
        if self.inner.get_added_tokens_decoder().contains_key(&id) {
            return piece.into_bytes();
        }
        if let Some(hex) = piece.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'))
            && let (2, Ok(b)) = (hex.len(), u8::from_str_radix(hex, 16))
        {
            return vec![b];
        }
        let byte_level = self
            .inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|d| d.contains("\"ByteLevel\""));
        if !byte_level {
            return piece.replace('\u{2581}', " ").into_bytes();
        }
        let mut out = Vec::with_capacity(piece.len());
        for c in piece.chars() {
            match byte_level_byte(c) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out
    }

    /// The default chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Puts `source` in place of the default chat template (a Modelfile's `TEMPLATE`),
    /// with the same special-token variables.
    pub fn set_chat_template(&mut self, source: &str) -> Result<(), TextError> {
        let t = match &self.chat_template {
            Some(old) => old.with_source(source)?,
            None => ChatTemplate::new(source, self.bos_token.clone(), self.eos_token.clone())?,
        };
        self.chat_template = Some(t);
        Ok(())
    }

    /// A named template from a list-form `chat_template` (`tool_use`, `rag`, ...).
    pub fn named_chat_template(&self, name: &str) -> Option<&ChatTemplate> {
        if name == "default" {
            return self.chat_template.as_ref();
        }
        self.named_templates.get(name)
    }

    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.chat_template.as_ref().ok_or(TextError::NoChatTemplate)?.render(messages, add_generation_prompt)
    }

    /// Renders the chat and tokenizes it without adding special tokens (the template
    /// writes them), as `apply_chat_template(..., tokenize=True)` does.
    /// The vocabulary's fill-in-the-middle tokens.
    pub fn fim(&self) -> FimIds {
        self.fim
    }

    /// A fill-in-the-middle prompt, `PRE prefix SUF suffix MID` after BOS where the model
    /// adds one: llama-server's `/infill` layout for a vocabulary without repository and
    /// file-separator tokens (with them, llama-server also puts a placeholder project and
    /// file name first; Strata does not, as Ollama's templates do not). The prefix and
    /// suffix are text: special tokens written in them are not parsed (a GGUF
    /// vocabulary; a Hugging Face tokenizer parses its added tokens, as transformers does).
    pub fn encode_infill(&self, infill: &Infill) -> Result<Vec<u32>, TextError> {
        let FimIds { pre: Some(pre), suf: Some(suf), mid: Some(mid), .. } = self.fim else {
            let missing: Vec<&str> = [("prefix", self.fim.pre), ("suffix", self.fim.suf), ("middle", self.fim.mid)]
                .into_iter()
                .filter_map(|(what, id)| id.is_none().then_some(what))
                .collect();
            return Err(TextError::NoInfill(missing.join(", ")));
        };
        let text = |t: &str| -> Result<Vec<u32>, TextError> {
            match &self.llama {
                Some(llama) => llama.encode(t, false, false).map_err(TextError::Encode),
                None => self.encode(t, false),
            }
        };
        let mut out: Vec<u32> = self.bos_id.filter(|_| self.add_bos).into_iter().collect();
        out.push(pre);
        out.extend(text(&infill.prefix)?);
        out.push(suf);
        out.extend(text(&infill.suffix)?);
        out.push(mid);
        Ok(out)
    }

    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>, TextError> {
        let text = self.apply_chat_template(messages, add_generation_prompt)?;
        self.encode(&text, false)
    }

    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}

/// The byte GPT-2's byte-level alphabet writes as `c`: printable bytes stand for
/// themselves, the other 68 are shifted to U+0100.. in order.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let code = c as u32;
    if code < 256 {
        return printable(code).then_some(code as u8);
    }
    let n = code.checked_sub(256)? as usize;
    (0u32..256).filter(|&b| !printable(b)).nth(n).map(|b| b as u8)
}

/// transformers' `LlamaTokenizer.__init__`: no normalizer, a Metaspace pre-tokenizer whose
/// prepend scheme follows `add_prefix_space` and `legacy`, and the SentencePiece decoder.
fn rebuild_as_llama_class(tok: &mut Tokenizer, add_prefix_space: bool, legacy: bool) -> Result<(), TextError> {
    let scheme = match (add_prefix_space, legacy) {
        (false, _) => "never",
        (true, true) => "always",
        (true, false) => "first",
    };
    let fail = |e: String| TextError::Load {
        file: "tokenizer.json".into(),
        msg: format!("cannot rebuild as LlamaTokenizer: {e}"),
    };
    let pre: PreTokenizerWrapper = serde_json::from_value(serde_json::json!({
        "type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": scheme, "split": false
    }))
    .map_err(|e| fail(e.to_string()))?;
    let mut steps = vec![
        serde_json::json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        serde_json::json!({"type": "ByteFallback"}),
        serde_json::json!({"type": "Fuse"}),
    ];
    if add_prefix_space {
        steps.push(serde_json::json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let dec: DecoderWrapper = serde_json::from_value(serde_json::json!({"type": "Sequence", "decoders": steps}))
        .map_err(|e| fail(e.to_string()))?;
    tok.with_normalizer(None::<tokenizers::NormalizerWrapper>).map_err(|e| fail(e.to_string()))?;
    tok.with_pre_tokenizer(Some(pre));
    tok.with_decoder(Some(dec));
    Ok(())
}

/// transformers' `update_post_processor`: `[bos:0] $A:0 [eos:0]` (and the pair form).
fn template_processing(
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
) -> Result<tokenizers::PostProcessorWrapper, TextError> {
    use serde_json::json;
    let piece = |id: &str, type_id: u32| json!({"SpecialToken": {"id": id, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut special = serde_json::Map::new();
    if let Some((t, id)) = &bos {
        single.push(piece(t, 0));
        special.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    single.push(seq("A", 0));
    if let Some((t, id)) = &eos {
        single.push(piece(t, 0));
        special.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    pair.extend(single.iter().cloned());
    if let Some((t, _)) = &bos {
        pair.push(piece(t, 1));
    }
    pair.push(seq("B", 1));
    if let Some((t, _)) = &eos {
        pair.push(piece(t, 1));
    }
    serde_json::from_value(json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": special,
    }))
    .map_err(|e| TextError::Load {
        file: "tokenizer_config.json".into(),
        msg: format!("cannot build the post-processor: {e}"),
    })
}

/// transformers' `clean_up_tokenization`: drops the space before some punctuation and
/// English contractions. Applied in this order, like the chained `str.replace` calls.
pub fn clean_up_tokenization(text: &str) -> String {
    const RULES: [(&str, &str); 10] = [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ];
    let mut s = text.to_string();
    for (from, to) in RULES {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

impl TextTokenizer {
    /// `source`'s tokenizer and chat template, checked against the model: every token
    /// has a row in the embedding, and the template renders a one-message chat. Loads and
    /// imports go through here, so a model that would fail each request is refused once.
    pub fn for_model(source: &strata_model::ModelSource) -> anyhow::Result<TextTokenizer> {
        use anyhow::Context;
        let tok = TextTokenizer::from_parts(TokenizerSources {
            tokenizer_json: &source.tokenizer_json,
            tokenizer_config_json: source.tokenizer_config_json.as_deref(),
            generation_config_json: source.generation_config_json.as_deref(),
            chat_template: source.chat_template.as_deref(),
            model_config_json: Some(&source.config_json),
        })
        .with_context(|| format!("model `{}`: loading the tokenizer", source.name))?;
        let (tokens, rows) = (tok.vocab_size(), source.config.vocab_size);
        if tokens > rows {
            let embed = ["model.embed_tokens.weight", "model.embed_tokens"]
                .into_iter()
                .find(|n| source.tensors.contains_key(*n))
                .unwrap_or("the token embedding");
            anyhow::bail!(
                "model `{}`: the tokenizer has {tokens} tokens but `{embed}` has {rows} rows (vocab_size), one per token",
                source.name
            );
        }
        if let Some(t) = tok.chat_template() {
            let hello = [ChatMessage::new("user", "Hello")];
            t.render(&hello, true).with_context(|| {
                format!("model `{}`: its chat template cannot render a one-message chat", source.name)
            })?;
        }
        Ok(tok)
    }
}

#[cfg(test)]
pub(crate) mod tests;
