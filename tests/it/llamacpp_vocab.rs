//! Tokenization against llama.cpp on its own test vocabularies: the vocabulary-only GGUFs
//! in llama.cpp's `models/` (`ggml-vocab-NAME.gguf`), checked
//! - against the `.inp` texts and `.out` token ids that llama.cpp's tokenizer test writes,
//!   where the sdist has them;
//! - against tests/fixtures/vocab/llamacpp_strings.json (written by
//!   tools/make_vocab_fixtures.py with llama-cpp-python 0.3.36): our own texts, for every
//!   vocabulary and for variants of them with other tokenizer metadata (every
//!   pre-tokenizer type llama.cpp knows, other normalizer flags), made here by the same
//!   metadata changes.
//!
//! The GGUFs ship in the llama-cpp-python sdist (`vendor/llama.cpp/models`), which is not
//! committed: set `STRATA_LLAMACPP_VOCAB_DIR` to that directory to run these tests
//! (tools/llamacpp_vocab.sh downloads it). Without it the tests say so and pass.

use std::path::{Path, PathBuf};

use serde_json::Value;
use strata::engine::tokenizer::{TextTokenizer, TokenizerSources};
use strata::format::gguf::{GgufFile, GgufValue};
use strata::model::gguf_vocab;

/// Every vocabulary in the sdist; each must match llama.cpp exactly.
const SUPPORTED: &[&str] = &[
    "aquila",
    "baichuan",
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "gpt-neox",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "nomic-bert-moe",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vocab/llamacpp_strings.json");

fn vocab_dir() -> Option<PathBuf> {
    match std::env::var("STRATA_LLAMACPP_VOCAB_DIR") {
        Ok(dir) => Some(PathBuf::from(dir)),
        Err(_) => {
            eprintln!("STRATA_LLAMACPP_VOCAB_DIR is not set: skipping");
            None
        }
    }
}

fn gguf_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("ggml-vocab-{name}.gguf"))
}

fn tokenizer(f: &GgufFile) -> Result<TextTokenizer, String> {
    let files = gguf_vocab::tokenizer(f).map_err(|e| format!("{e:#}"))?;
    TextTokenizer::from_parts(TokenizerSources {
        tokenizer_json: &files.tokenizer_json,
        tokenizer_config_json: Some(&files.tokenizer_config_json),
        generation_config_json: Some(&files.generation_config_json),
        chat_template: None,
        model_config_json: None,
    })
    .map_err(|e| e.to_string())
}

#[test]
fn every_vocabulary_in_the_sdist_is_supported() {
    let Some(dir) = vocab_dir() else { return };
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf")?.to_string())
        })
        .collect();
    found.sort();
    assert_eq!(found, SUPPORTED, "the sdist's vocabularies and SUPPORTED differ");
}

#[test]
fn every_supported_vocabulary_tokenizes_as_llama_cpp_does() {
    let Some(dir) = vocab_dir() else { return };
    let mut failures = Vec::new();
    for name in SUPPORTED {
        let gguf = gguf_path(&dir, name);
        let (inp, out) = (gguf.with_extension("gguf.inp"), gguf.with_extension("gguf.out"));
        if !inp.exists() {
            // Checked on our own texts only (see the fixture test).
            continue;
        }
        let tok = match GgufFile::open(&gguf).map_err(|e| e.to_string()).and_then(|f| tokenizer(&f)) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let inp = std::fs::read_to_string(&inp).unwrap();
        let out = std::fs::read_to_string(&out).unwrap();
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let want: Vec<&str> = out.lines().collect();
        let mut bad = 0;
        for (text, want) in texts.iter().zip(&want) {
            let want: Vec<u32> = want.split_whitespace().map(|t| t.parse().unwrap()).collect();
            let got = tok.encode(text, false).unwrap();
            if got != want {
                if bad < 3 {
                    failures.push(format!("{name}: {text:?}: got {got:?}, llama.cpp {want:?}"));
                }
                bad += 1;
            }
        }
        let n = want.len().min(texts.len());
        eprintln!("{name}: {} of {n} texts match", n - bad);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn own_texts_tokenize_as_llama_cpp_does_for_every_vocabulary_and_variant() {
    let Some(dir) = vocab_dir() else { return };
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let strings = |key: &str| -> Vec<String> {
        fixture[key].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
    };
    let (texts, special_texts) = (strings("texts"), strings("special_texts"));
    let ids = |v: &Value| -> Vec<Vec<u32>> {
        v.as_array().unwrap().iter().map(|ids| serde_json::from_value(ids.clone()).unwrap()).collect()
    };
    let cases = fixture["cases"].as_array().unwrap();
    let covered: Vec<&str> = cases.iter().map(|c| c["vocab"].as_str().unwrap()).collect();
    let mut failures: Vec<String> = SUPPORTED
        .iter()
        .filter(|name| !covered.contains(name))
        .map(|name| format!("{name}: not in the fixture; rerun tools/make_vocab_fixtures.py"))
        .collect();
    // Variants with added tokens are the `hybriddna` test's.
    for case in cases.iter().filter(|c| c.get("added").is_none()) {
        let name = case["name"].as_str().unwrap();
        let mut f = GgufFile::open(&gguf_path(&dir, case["vocab"].as_str().unwrap())).unwrap();
        for (key, value) in case["metadata"].as_object().unwrap() {
            let value = match value {
                Value::Bool(b) => GgufValue::Bool(*b),
                Value::String(s) => GgufValue::String(s.clone()),
                other => panic!("{name}: metadata value {other}"),
            };
            f.metadata.insert(key.clone(), value);
        }
        let tok = match tokenizer(&f) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let runs = [(&texts, false, &case["ids"]), (&special_texts, true, &case["with_special"])];
        let mut bad = 0;
        for (texts, add_special, want) in runs {
            for (text, want) in texts.iter().zip(ids(want)) {
                let got = tok.encode(text, add_special).unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
                if got != want {
                    if bad < 2 {
                        failures.push(format!(
                            "{name}: {text:?} (add_special {add_special}): got {got:?}, llama.cpp {want:?}"
                        ));
                    }
                    bad += 1;
                }
            }
        }
        eprintln!(
            "{name}: {} of {} texts match",
            texts.len() + special_texts.len() - bad,
            texts.len() + special_texts.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Generation ends where llama.cpp's ends (`llama_vocab_is_eog`), and the
/// fill-in-the-middle tokens are llama.cpp's (tests/fixtures/vocab/llamacpp_eog.json,
/// written by tools/make_eog_fixture.py).
#[test]
fn end_of_generation_and_fim_tokens_are_llama_cpps() {
    let Some(dir) = vocab_dir() else { return };
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vocab/llamacpp_eog.json");
    let want: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut failures = Vec::new();
    for name in SUPPORTED {
        let expect = &want["vocabs"][name];
        assert!(expect.is_object(), "{name} is in the fixture");
        let tok = tokenizer(&GgufFile::open(&gguf_path(&dir, name)).unwrap()).unwrap();
        let mut eog = tok.eos_ids().to_vec();
        eog.sort_unstable();
        let eog_want: Vec<u32> = serde_json::from_value(expect["eog"].clone()).unwrap();
        if eog != eog_want {
            failures.push(format!("{name}: ends generation at {eog:?}, llama.cpp at {eog_want:?}"));
        }
        let fim = tok.fim();
        let got = [fim.pre, fim.suf, fim.mid, fim.pad, fim.rep, fim.sep];
        let fim_want: Vec<Option<u32>> = ["pre", "suf", "mid", "pad", "rep", "sep"]
            .iter()
            .map(|r| expect["fim"][r].as_u64().map(|v| v as u32))
            .collect();
        if got[..] != fim_want[..] {
            failures.push(format!("{name}: FIM tokens {got:?}, llama.cpp's {fim_want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn decoding_gives_the_text_back() {
    let Some(dir) = vocab_dir() else { return };
    let text = "Hello world, 123 éh!";
    for name in SUPPORTED {
        let tok = tokenizer(&GgufFile::open(&gguf_path(&dir, name)).unwrap()).unwrap();
        let ids = tok.encode(text, false).unwrap();
        let back = tok.decode(&ids, true).unwrap();
        // WordPiece lowercases, strips accents and spaces punctuation.
        let want = match *name {
            "bert-bge" => "hello world , 123 eh !",
            _ => text,
        };
        assert_eq!(back.trim(), want, "{name}: {ids:?}");
    }
}

/// Control tokens written in a chat template's output are the control tokens, not their
/// text split into pieces (a regression: `<|im_start|>` once became ` Siri`-like pieces
/// because control tokens were left out of the vocabulary), through the chat path too.
#[test]
fn control_tokens_in_chat_text_are_single_ids() {
    let Some(dir) = vocab_dir() else { return };
    let tok = tokenizer(&GgufFile::open(&gguf_path(&dir, "qwen2")).unwrap()).unwrap();
    let (start, end) = (151644, 151645); // <|im_start|>, <|im_end|> in Qwen2's vocabulary
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n", false).unwrap();
    assert_eq!((ids[0], ids.iter().filter(|&&i| i == end).count()), (start, 1), "{ids:?}");
    let messages = [strata::engine::template::ChatMessage::new("user", "hi")];
    let chat = tok.encode_chat(&messages, true).unwrap();
    // Qwen2's template adds a default system turn: system, user, and the assistant prompt.
    assert_eq!(chat.iter().filter(|&&i| i == start).count(), 3, "{chat:?}");
}

/// The fixture's `hybriddna` variants: llama-bpe with `<dna>`, `</dna>`, `<oov>` and every
/// 6-mer over an alphabet (with the k-mer marker) appended, as
/// tools/make_vocab_fixtures.py appends them; DNA texts with and without special-token
/// parsing, and the k-mers decode to the bare sequence.
#[test]
fn hybriddna_vocabularies_tokenize_as_llama_cpp_does() {
    use strata::engine::tokenizer::llama::LlamaTokenizer;
    let Some(dir) = vocab_dir() else { return };
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let texts: Vec<&str> = fixture["dna_texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let cases: Vec<&Value> = fixture["cases"].as_array().unwrap().iter().filter(|c| c.get("added").is_some()).collect();
    assert_eq!(cases.len(), 3, "rerun tools/make_vocab_fixtures.py");
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut f = GgufFile::open(&gguf_path(&dir, case["vocab"].as_str().unwrap())).unwrap();
        for (key, value) in case["metadata"].as_object().unwrap() {
            f.metadata.insert(key.clone(), GgufValue::String(value.as_str().unwrap().to_string()));
        }
        let added = &case["added"];
        let mut new: Vec<(String, i32)> = added["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t[0].as_str().unwrap().to_string(), t[1].as_i64().unwrap() as i32))
            .collect();
        let alphabet: Vec<char> = added["kmer_alphabet"].as_str().unwrap().chars().collect();
        let marker = added["kmer_marker"].as_str().unwrap();
        for i in 0..alphabet.len().pow(6) {
            // itertools.product order: the last letter varies fastest.
            let kmer: String = (0..6).rev().map(|d| alphabet[i / alphabet.len().pow(d) % alphabet.len()]).collect();
            new.push((format!("{kmer}{marker}"), 1));
        }
        let push = |f: &mut GgufFile, key: &str, items: Vec<GgufValue>| match f.metadata.get_mut(key) {
            Some(GgufValue::Array(a)) => a.extend(items),
            _ => panic!("{name}: no `{key}` array"),
        };
        push(&mut f, "tokenizer.ggml.tokens", new.iter().map(|(t, _)| GgufValue::String(t.clone())).collect());
        push(&mut f, "tokenizer.ggml.token_type", new.iter().map(|&(_, k)| GgufValue::I32(k)).collect());

        let tok = LlamaTokenizer::new(gguf_vocab::llama_vocab(&f).unwrap()).unwrap();
        for (key, parse_special) in [("dna_ids", true), ("dna_ids_plain", false)] {
            for (text, want) in texts.iter().zip(case[key].as_array().unwrap()) {
                let want: Vec<u32> = serde_json::from_value(want.clone()).unwrap();
                let got = tok.encode(text, false, parse_special).unwrap();
                if got != want {
                    failures.push(format!(
                        "{name}: {text:?} (parse_special {parse_special}): got {got:?}, llama.cpp {want:?}"
                    ));
                }
            }
        }
        // The marker is gone from the k-mers' text: each decodes to its letters.
        let text_tok = tokenizer(&f).unwrap();
        for (text, pieces) in texts.iter().zip(case["dna_pieces"].as_array().unwrap()) {
            let ids = text_tok.encode(text, false).unwrap();
            let got: Vec<String> = ids.iter().map(|&id| text_tok.decode(&[id], true).unwrap()).collect();
            let want: Vec<String> = serde_json::from_value(pieces.clone()).unwrap();
            if got != want {
                failures.push(format!("{name}: {text:?} decodes to {got:?}, llama.cpp {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
