//! GGUF: the reader against gguf-py's own view of the same files, and models loaded from
//! GGUF against the transformers references of the HF models they were converted from.
//!
//! Fixtures: `tests/fixtures/gguf/{llama3,qwen2}.gguf` and `<name>.view.json` (gguf-py's
//! `GGUFReader` view) are made by `tools/make_gguf_fixtures.py` from the HF fixtures,
//! converting the way llama.cpp's `convert_hf_to_gguf.py` does (Q/K rows permuted for
//! `llama`, Llama 3 rope scaling as `rope_freqs.weight`). References are
//! `tests/fixtures/ref/<name>.json` + `.logits.bin` from `tools/make_fixtures.py`.

use crate::common;
use crate::support;

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Value, json};
use strata::engine::session::{Engine, RunOptions};
use strata::engine::template::ChatMessage;
use strata::engine::tokenizer::TextTokenizer;
use strata::format::gguf::{GgufFile, GgufValue};
use strata::model::decoder::SeqStep;
use strata::model::gguf_source::source_from_gguf;
use strata::quant::ReadF32;

const MODELS: [&str; 2] = ["llama3", "qwen2"];
/// Same bound as `tests/it/model_parity.rs`: f32 on identical weights, only summation order differs.
const LOGIT_TOL: f32 = 1e-4;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn gguf_path(name: &str) -> PathBuf {
    root().join(format!("tests/fixtures/gguf/{name}.gguf"))
}

#[derive(Deserialize)]
struct View {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: serde_json::Map<String, Value>,
    tensors: Vec<ViewTensor>,
}

#[derive(Deserialize)]
struct ViewTensor {
    name: String,
    ne: Vec<u64>,
    type_id: u32,
    n_elements: u64,
    offset: u64,
    first: Vec<f64>,
    sum: f64,
}

/// gguf-py's type names (`GGUFValueType`) for a value: `["ARRAY", "STRING"]` for an
/// array of strings.
fn gguf_py_types(v: &GgufValue) -> Vec<String> {
    let name = match v {
        GgufValue::U8(_) => "UINT8",
        GgufValue::I8(_) => "INT8",
        GgufValue::U16(_) => "UINT16",
        GgufValue::I16(_) => "INT16",
        GgufValue::U32(_) => "UINT32",
        GgufValue::I32(_) => "INT32",
        GgufValue::F32(_) => "FLOAT32",
        GgufValue::Bool(_) => "BOOL",
        GgufValue::String(_) => "STRING",
        GgufValue::U64(_) => "UINT64",
        GgufValue::I64(_) => "INT64",
        GgufValue::F64(_) => "FLOAT64",
        GgufValue::Array(items) => {
            let mut out = vec!["ARRAY".to_string()];
            if let Some(first) = items.first() {
                out.extend(gguf_py_types(first));
            }
            return out;
        }
    };
    vec![name.to_string()]
}

fn to_json(v: &GgufValue) -> Value {
    match v {
        GgufValue::U8(x) => json!(x),
        GgufValue::I8(x) => json!(x),
        GgufValue::U16(x) => json!(x),
        GgufValue::I16(x) => json!(x),
        GgufValue::U32(x) => json!(x),
        GgufValue::I32(x) => json!(x),
        GgufValue::F32(x) => json!(f64::from(*x)),
        GgufValue::Bool(x) => json!(x),
        GgufValue::String(x) => json!(x),
        GgufValue::U64(x) => json!(x),
        GgufValue::I64(x) => json!(x),
        GgufValue::F64(x) => json!(x),
        GgufValue::Array(items) => Value::Array(items.iter().map(to_json).collect()),
    }
}

/// JSON equality, with numbers compared as f32 (serde_json parses floats to within an
/// ulp of f64 only, and GGUF floats here are f32).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q)),
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            x.as_f64().map(|v| v as f32) == y.as_f64().map(|v| v as f32)
        }
        _ => a == b,
    }
}

#[test]
fn reader_agrees_with_gguf_py() {
    for name in MODELS {
        let path = gguf_path(name);
        let view: View =
            serde_json::from_str(&std::fs::read_to_string(path.with_extension("view.json")).unwrap()).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!((f.version, f.alignment, f.data_start), (view.version, view.alignment, view.data_offset), "{name}");

        let ours: Vec<&String> = f.metadata.keys().collect();
        let mut theirs: Vec<&String> = view.metadata.keys().collect();
        theirs.sort();
        assert_eq!(ours, theirs, "{name}: metadata keys");
        for (key, v) in &f.metadata {
            let want = &view.metadata[key];
            assert_eq!(json!(gguf_py_types(v)), want["types"], "{name} {key}: types");
            assert!(same_value(&to_json(v), &want["value"]), "{name} {key}: {v:?} vs {}", want["value"]);
        }

        let names: Vec<&str> = f.infos.iter().map(|i| i.name.as_str()).collect();
        let want_names: Vec<&str> = view.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, want_names, "{name}: tensors in file order");
        for (info, want) in f.infos.iter().zip(&view.tensors) {
            let t = &f.tensors[&info.name];
            let n = &info.name;
            assert_eq!(info.ne, want.ne, "{name} {n}");
            assert_eq!(info.ggml_type, want.type_id, "{name} {n}");
            assert_eq!(t.numel() as u64, want.n_elements, "{name} {n}");
            assert_eq!(f.data_start + info.offset, want.offset, "{name} {n}");
            let shape: Vec<usize> = want.ne.iter().rev().map(|&d| d as usize).collect();
            assert_eq!(t.shape, shape, "{name} {n}: row-major shape");
            let vals = t.to_f32_vec();
            // serde_json parses floats to within an ulp of f64 only; the values are f32s.
            let want_first: Vec<f32> = want.first.iter().map(|&x| x as f32).collect();
            assert_eq!(&vals[..want_first.len()], &want_first[..], "{name} {n}");
            let sum: f64 = vals.iter().map(|&x| f64::from(x)).sum();
            assert!((sum - want.sum).abs() <= 1e-9 * want.sum.abs().max(1.0), "{name} {n}: sum {sum} vs {}", want.sum);
        }
    }
}

#[derive(Deserialize)]
struct Reference {
    vocab_size: usize,
    prompts: Vec<Prompt>,
    tokenization: Vec<Tokenization>,
    chat: Vec<Chat>,
}

#[derive(Deserialize)]
struct Prompt {
    text: String,
    ids: Vec<u32>,
    logits_offset: usize,
    n_positions: usize,
}

#[derive(Deserialize)]
struct Tokenization {
    text: String,
    ids: Vec<u32>,
    ids_with_special: Vec<u32>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
    ids: Vec<u32>,
}

fn reference(name: &str) -> (Reference, Vec<f32>) {
    let dir = root().join("tests/fixtures/ref");
    let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("reference json");
    let bin = std::fs::read(dir.join(format!("{name}.logits.bin"))).expect("reference logits");
    let logits = bin.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    (serde_json::from_str(&json).expect("reference schema"), logits)
}

fn engine(name: &str) -> Engine {
    let source = source_from_gguf(&gguf_path(name)).expect("gguf source");
    Engine::from_source(source, &RunOptions { threads: 2, ..Default::default() }).expect("load gguf model")
}

#[test]
fn gguf_models_match_transformers_logits() {
    for name in MODELS {
        let (r, all) = reference(name);
        let e = engine(name);
        assert_eq!(e.model.config().vocab_size, r.vocab_size, "{name}");
        for (pi, p) in r.prompts.iter().enumerate() {
            let mut cache = e.model.new_cache(64).unwrap();
            let got = e
                .model
                .forward(&mut [SeqStep { tokens: &p.ids, cache: &mut cache, all_logits: true, verify: false }])
                .unwrap();
            let want = &all[p.logits_offset..p.logits_offset + p.n_positions * r.vocab_size];
            assert_eq!(got[0].len(), want.len(), "{name} prompt {pi}");
            let worst = got[0].iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            eprintln!("{name} (gguf) prompt {pi}: max |Δ logit| = {worst:.2e}");
            assert!(worst <= LOGIT_TOL, "{name} (gguf) prompt {pi}: |Δ logit| {worst}");
        }
    }
}

#[test]
fn gguf_tokenizers_match_transformers() {
    for name in MODELS {
        let (r, _) = reference(name);
        let e = engine(name);
        let tok = &e.tokenizer;
        for p in &r.prompts {
            assert_eq!(tok.encode(&p.text, true).unwrap(), p.ids, "{name}: {:?}", p.text);
        }
        for t in &r.tokenization {
            // transformers' Qwen2 tokenizer composes combining marks (NFC); llama.cpp, the
            // reference for GGUF files, does not, and neither does Strata's GGUF tokenizer
            // (tests/it/llamacpp_parity.rs checks those strings against llama.cpp).
            let decomposed = t.text.chars().any(|c| ('\u{300}'..='\u{36f}').contains(&c));
            if name == "qwen2" && decomposed {
                continue;
            }
            assert_eq!(tok.encode(&t.text, false).unwrap(), t.ids, "{name}: {:?}", t.text);
            assert_eq!(tok.encode(&t.text, true).unwrap(), t.ids_with_special, "{name} (special): {:?}", t.text);
        }
        for (i, c) in r.chat.iter().enumerate() {
            let rendered = tok.apply_chat_template(&c.messages, c.add_generation_prompt).unwrap();
            assert_eq!(rendered, c.rendered, "{name} chat[{i}]");
            assert_eq!(tok.encode_chat(&c.messages, c.add_generation_prompt).unwrap(), c.ids, "{name} chat[{i}]");
        }
    }
}

/// Hostile or unsupported GGUF files are errors naming the file, never panics.
#[test]
fn broken_gguf_files_are_named_errors() {
    let bytes = std::fs::read(gguf_path("qwen2")).unwrap();
    let dir = std::env::temp_dir().join(format!("strata-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = format!("{:#}", source_from_gguf(&cut).err().expect("truncated file loads"));
    assert!(err.contains("cut.gguf") && err.contains("past the end"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Every tensor maps back to its Hugging Face name with the same bytes (Q/K un-permuted
/// for `llama`), and the rebuilt config resolves to the HF one (Llama 3 rope scaling
/// recovered from `rope_freqs.weight`).
#[test]
fn gguf_sources_equal_the_hf_fixtures() {
    use strata::format::safetensors;
    use strata::model::config::ModelConfig;
    for name in MODELS {
        let hf_dir = root().join(format!("tests/fixtures/hf/{name}"));
        let hf = safetensors::load_dir(&hf_dir).unwrap();
        let src = source_from_gguf(&gguf_path(name)).unwrap();
        let mut got: Vec<&String> = src.tensors.keys().collect();
        let mut want: Vec<&String> = hf.keys().collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{name}: tensor names");
        for (n, t) in &hf {
            assert_eq!(src.tensors[n].shape, t.shape, "{name} {n}");
            assert!(src.tensors[n].bytes() == t.bytes(), "{name} {n}: bytes differ");
        }
        let ours = ModelConfig::from_json(&src.config_json).unwrap();
        let theirs = ModelConfig::from_json(&std::fs::read_to_string(hf_dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{name}: config");
    }
}

/// An HTTP/1.1 request to a spawned server; returns the status code and the body.
fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
    let len = body.len();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}").unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let code = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// `strata serve --model` on a GGUF truncated while a request runs on it, then rewritten
/// in place: the server stays up (the pages past the new end read as zeros, see
/// `strata::mapped`), that request fails naming the file and its size now, the other model
/// keeps answering, a request while the file is broken gets the load's error naming it,
/// and once the file is whole again the model loads from it.
#[test]
fn a_served_gguf_changed_on_disk_fails_its_requests_not_the_server() {
    use std::io::{Read, Write};
    let dir = std::env::temp_dir().join(format!("strata-gguf-changed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let a = dir.join("a.gguf");
    let original = std::fs::read(gguf_path("llama3")).unwrap();
    std::fs::write(&a, &original).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--port", &port.to_string(), "--threads", "1", "--max-loaded-models", "2"])
        .args(["--model", &format!("a={}", a.display()), "--model", &format!("b={}", gguf_path("qwen2").display())])
        .env("STRATA_HOME", dir.join("home"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() || request(port, "GET", "/health", "").0 != 200 {
        assert!(std::time::Instant::now() < deadline, "the server did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let complete = |model: &str| {
        request(port, "POST", "/v1/completions", &json!({"model": model, "prompt": "hi", "max_tokens": 2}).to_string())
    };
    assert_eq!(complete("a").0, 200);
    assert_eq!(complete("b").0, 200);

    // A long reply (its grammar allows no end for a thousand letters) under way.
    let body = json!({"model": "a", "prompt": "hi", "max_tokens": 3000, "stream": true,
        "grammar": "start: /[a-z]{1000}/"})
    .to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    std::fs::File::options().write(true).open(&a).unwrap().set_len(4096).unwrap();
    let mut rest = String::new();
    let _ = s.read_to_string(&mut rest);
    assert!(server.try_wait().unwrap().is_none(), "the server died; the stream's rest: {rest}");
    assert!(
        rest.contains("changed on disk while being served (now 4096 bytes") && rest.contains("a.gguf"),
        "the stream's rest: {rest}"
    );
    assert_eq!(request(port, "GET", "/health", "").0, 200);
    assert_eq!(complete("b").0, 200, "the other model keeps answering");

    // Still truncated: the model loads again from the file as it is, which fails.
    let (code, text) = complete("a");
    assert!(code == 500 && text.contains("loading `a`: ") && text.contains("a.gguf: at byte"), "{code} {text}");
    // Rewritten in place (`open(path, "wb")`): it loads and answers.
    std::fs::write(&a, &original).unwrap();
    assert_eq!(complete("a").0, 200);
    // Rewritten in place again while loaded, same size: no fault, but the next request
    // sees the change (modification time) and loads the file again.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&a, &original).unwrap();
    assert_eq!(complete("a").0, 200);
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert_eq!(log.matches("unloading the model").count(), 2, "{log}");
    let _ = server.kill();
    let _ = server.wait();
    std::fs::remove_dir_all(&dir).ok();
}

/// GGUF files whose parts disagree are refused when they load, naming what disagrees;
/// one whose weights hold NaN loads, and its requests fail naming the model (a 500, not a
/// client's 400).
#[tokio::test]
async fn inconsistent_gguf_models_are_refused_or_fail_naming_the_model() {
    use support::gguf::GgufParts;
    let dir = support::TempDir::new("gguf-inconsistent");
    let fixture = "tests/fixtures/gguf/llama3.gguf";
    let write = |name: &str, parts: &GgufParts| {
        let p = dir.path(name);
        std::fs::write(&p, parts.write()).unwrap();
        p
    };
    let err = |p: &std::path::Path| match source_from_gguf(p).and_then(|s| TextTokenizer::for_model(&s)) {
        Ok(_) => panic!("{} loads", p.display()),
        Err(e) => format!("{e:#}"),
    };

    // An embedding one row short of the vocabulary.
    let mut short = GgufParts::read(fixture);
    let embd = short.infos.iter_mut().find(|t| t.name == "token_embd.weight").unwrap();
    embd.ne[1] -= 1;
    let rows = embd.ne[1];
    let e = err(&write("short.gguf", &short));
    assert!(e.contains(&format!("`token_embd.weight` has {rows} rows")) && e.contains("tokenizer.ggml.tokens"), "{e}");

    // A chat template that cannot render.
    let mut tmpl = GgufParts::read(fixture);
    tmpl.set_meta("tokenizer.chat_template".into(), GgufValue::String("{{ raise_exception('broken') }}".into()));
    let e = err(&write("template.gguf", &tmpl));
    assert!(e.contains("chat template cannot render a one-message chat") && e.contains("broken"), "{e}");

    // A setting the model cannot have is named by its GGUF key.
    let mut heads = GgufParts::read(fixture);
    heads.set_meta("llama.attention.head_count_kv".into(), GgufValue::U32(3));
    let e = err(&write("heads.gguf", &heads));
    assert!(e.contains("is not a multiple of `llama.attention.head_count_kv` 3") && !e.contains("config.json"), "{e}");

    // NaN weights: the final norm's.
    let mut nan = GgufParts::read(fixture);
    let norm = nan.infos.iter().find(|t| t.name == "output_norm.weight").unwrap();
    let (at, n) = (norm.offset as usize, norm.ne[0] as usize);
    nan.data[at..at + 4 * n].copy_from_slice(&f32::NAN.to_le_bytes().repeat(n));
    let path = write("nan.gguf", &nan);
    let opts = common::serve_options(&[("nan", path.display().to_string())], 64);
    let (app, _state, _worker) = strata::server::start(opts).expect("starting the server");
    let body = json!({"model": "nan", "prompt": "hi", "max_tokens": 3});
    let (status, _, reply) = common::send(&app, common::post_json("/v1/completions", body)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert_eq!(status.as_u16(), 500, "{reply}");
    assert!(reply.contains("model `nan:latest`: the model produced non-finite logits"), "{reply}");
}
