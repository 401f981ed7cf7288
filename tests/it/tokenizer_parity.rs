//! Tokenizer, detokenizer and chat-template parity against transformers.
//!
//! The reference data in tests/fixtures/ref/<name>.json and the model directories it
//! points to (`"dir"`) are produced by tools/make_fixtures.py with transformers
//! (`AutoTokenizer` / `apply_chat_template`); re-run that script to regenerate them. For
//! every fixture this checks that `TextTokenizer` gives the same ids (with and without
//! special tokens), the same decoded text, the same rendered chat strings and chat ids, and
//! that `IncrementalDecoder` streams pieces that concatenate to the reference decode.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use strata::engine::detok::IncrementalDecoder;
use strata::engine::template::ChatMessage;
use strata::engine::tokenizer::TextTokenizer;

#[derive(Deserialize)]
struct Reference {
    dir: String,
    vocab_size: usize,
    prompts: Vec<Prompt>,
    tokenization: Vec<Tokenization>,
    chat: Vec<Chat>,
}

#[derive(Deserialize)]
struct Prompt {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Tokenization {
    text: String,
    ids: Vec<u32>,
    ids_with_special: Vec<u32>,
    decoded: String,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
    ids: Vec<u32>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load_reference(name: &str) -> Reference {
    let path = root().join("tests/fixtures/ref").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (generate the fixtures with tools/make_fixtures.py)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Streams `ids` through an IncrementalDecoder; returns the pieces (flush last).
fn stream(tok: &TextTokenizer, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
    let mut dec = IncrementalDecoder::new(tok, skip_special_tokens);
    let mut pieces: Vec<String> = ids.iter().map(|&id| dec.push(id).expect("incremental decode")).collect();
    pieces.push(dec.flush().expect("flush"));
    pieces
}

fn check_fixture(name: &str) {
    let reference = load_reference(name);
    let dir = root().join(&reference.dir);
    let tok =
        TextTokenizer::from_dir(Path::new(&dir)).unwrap_or_else(|e| panic!("{name}: loading {}: {e}", dir.display()));
    let mut failures: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };

    assert!(
        tok.vocab_size() <= reference.vocab_size,
        "{name}: tokenizer has {} ids, model vocab is {}",
        tok.vocab_size(),
        reference.vocab_size
    );

    for (i, t) in reference.tokenization.iter().enumerate() {
        let ids = tok.encode(&t.text, false).expect("encode");
        check(ids == t.ids, format!("{name} tokenization[{i}] {:?}: ids {ids:?} != {:?}", t.text, t.ids));
        let ids_ws = tok.encode(&t.text, true).expect("encode");
        check(
            ids_ws == t.ids_with_special,
            format!("{name} tokenization[{i}] {:?}: ids with special {ids_ws:?} != {:?}", t.text, t.ids_with_special),
        );
        let decoded = tok.decode(&t.ids, false).expect("decode");
        check(decoded == t.decoded, format!("{name} tokenization[{i}]: decoded {decoded:?} != {:?}", t.decoded));

        let pieces = stream(&tok, &t.ids, false);
        let streamed = pieces.concat();
        check(streamed == t.decoded, format!("{name} tokenization[{i}]: streamed {streamed:?} != {:?}", t.decoded));
        if !t.decoded.contains('\u{FFFD}') {
            check(
                pieces.iter().all(|p| !p.contains('\u{FFFD}')),
                format!("{name} tokenization[{i}]: a piece holds half a character: {pieces:?}"),
            );
        }
        // Skipping special tokens streams the same as a skipping full decode.
        let skipped = stream(&tok, &t.ids, true).concat();
        let skipped_full = tok.decode(&t.ids, true).expect("decode");
        check(
            skipped == skipped_full,
            format!("{name} tokenization[{i}]: skip-special stream {skipped:?} != {skipped_full:?}"),
        );
    }

    for (i, p) in reference.prompts.iter().enumerate() {
        let ids = tok.encode(&p.text, true).expect("encode");
        check(ids == p.ids, format!("{name} prompts[{i}] {:?}: ids {ids:?} != {:?}", p.text, p.ids));
    }

    assert!(
        reference.chat.is_empty() || tok.chat_template().is_some(),
        "{name}: reference has chats but no chat template was found"
    );
    for (i, c) in reference.chat.iter().enumerate() {
        match tok.apply_chat_template(&c.messages, c.add_generation_prompt) {
            Ok(rendered) => {
                check(rendered == c.rendered, format!("{name} chat[{i}]: rendered {rendered:?} != {:?}", c.rendered))
            }
            Err(e) => check(false, format!("{name} chat[{i}]: render failed: {e}")),
        }
        match tok.encode_chat(&c.messages, c.add_generation_prompt) {
            Ok(ids) => check(ids == c.ids, format!("{name} chat[{i}]: ids {ids:?} != {:?}", c.ids)),
            Err(e) => check(false, format!("{name} chat[{i}]: encode failed: {e}")),
        }
    }

    // Every eos id of generation_config.json stops generation.
    if let Ok(gen_text) = std::fs::read_to_string(dir.join("generation_config.json")) {
        let gen_cfg: serde_json::Value = serde_json::from_str(&gen_text).expect("generation_config.json");
        let eos: Vec<u32> = match &gen_cfg["eos_token_id"] {
            serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
            x => x.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        };
        for id in eos {
            check(tok.is_eos(id), format!("{name}: eos id {id} not recognised"));
        }
        if let Some(bos) = gen_cfg["bos_token_id"].as_u64() {
            check(tok.bos_id() == Some(bos as u32), format!("{name}: bos id {:?} != {bos}", tok.bos_id()));
        }
    }

    assert!(failures.is_empty(), "{} mismatch(es):\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn llama3_matches_transformers() {
    check_fixture("llama3");
}

#[test]
fn mistral_matches_transformers() {
    check_fixture("mistral");
}

#[test]
fn qwen2_matches_transformers() {
    check_fixture("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check_fixture("qwen3");
}

#[test]
fn llama_f16_matches_transformers() {
    check_fixture("llama_f16");
}

#[test]
fn llama_bf16_256_matches_transformers() {
    check_fixture("llama_bf16_256");
}

/// The architectures of tools/make_arch_fixtures.py, each with its real chat template.
#[test]
fn arch_fixtures_match_transformers() {
    for name in ["gemma", "gemma2", "gemma3", "phi3", "phi3_partial", "olmo2", "granite", "smollm3"] {
        check_fixture(name);
    }
}

/// The bytes of a text's tokens, joined, are the text's UTF-8 bytes (OpenAI's logprobs
/// `bytes`), even where a token holds only part of a character.
#[test]
fn token_bytes_join_up_to_the_text() {
    for name in ["llama3", "qwen3", "mistral"] {
        let dir = root().join(load_reference(name).dir);
        let tok = TextTokenizer::from_dir(&dir).unwrap();
        for text in ["héllo wörld 🎉 日本語", " leading\tand\n\nnewlines", "<|im_start|>user\nhi"] {
            let ids = tok.encode(text, false).unwrap();
            let joined: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
            assert_eq!(String::from_utf8_lossy(&joined), text, "{name}");
        }
    }
}
