//! Fill in the middle (`suffix` on `/api/generate` and `/v1/completions`): a GGUF whose
//! vocabulary names FIM tokens gets `[BOS] PRE prefix SUF suffix MID` as its prompt and
//! the `insert` capability; a model without them is a 400.

use crate::common;
use crate::support;

use axum::http::StatusCode;
use common::{json, post_json, send};
use serde_json::{Value, json};
use strata::engine::tokenizer::{Infill, TextTokenizer};
use strata::format::gguf::GgufValue;

const FIXTURE: &str = "tests/fixtures/gguf/llama3.gguf";
const PRE: u32 = 300;
const SUF: u32 = 301;
const MID: u32 = 302;

/// The fixture with three of its tokens named as the FIM tokens, written to `path`.
fn coder_gguf(path: &std::path::Path) {
    let mut parts = support::gguf::GgufParts::read(FIXTURE);
    for (role, id) in [("pre", PRE), ("suf", SUF), ("mid", MID)] {
        parts.set_meta(format!("tokenizer.ggml.fim_{role}_token_id"), GgufValue::U32(id));
    }
    std::fs::write(path, parts.write()).unwrap();
}

fn tokenizer(path: &std::path::Path) -> TextTokenizer {
    let files = strata::model::gguf_vocab::gguf_tokenizer(path).unwrap();
    TextTokenizer::from_sources(
        &files.tokenizer_json,
        Some(&files.tokenizer_config_json),
        Some(&files.generation_config_json),
        None,
    )
    .unwrap()
}

fn server(coder: &std::path::Path) -> axum::Router {
    let plain = format!("{}/{FIXTURE}", env!("CARGO_MANIFEST_DIR"));
    let opts = common::serve_options(&[("coder", coder.display().to_string()), ("plain", plain)], 256);
    strata::server::start(opts).expect("starting the server").0
}

#[tokio::test]
async fn a_suffix_fills_in_the_middle_with_the_vocabularys_fim_tokens() {
    let path = std::env::temp_dir().join(format!("strata-fim-{}.gguf", std::process::id()));
    coder_gguf(&path);
    let tok = tokenizer(&path);
    let (prefix, suffix) = ("Hello there", " world");
    let want = tok.encode_infill(&Infill { prefix: prefix.into(), suffix: suffix.into() }).unwrap();
    let mut laid_out: Vec<u32> = tok.bos_id().filter(|_| tok.add_bos_token()).into_iter().collect();
    laid_out.push(PRE);
    laid_out.extend(tok.encode(prefix, false).unwrap());
    laid_out.push(SUF);
    laid_out.extend(tok.encode(suffix, false).unwrap());
    laid_out.push(MID);
    assert_eq!(want, laid_out);
    assert!(want.len() > 6);

    let app = server(&path);
    let caps = |v: &Value| v["capabilities"].as_array().unwrap().iter().any(|c| c == "insert");
    let (_, _, out) = send(&app, post_json("/api/show", json!({"model": "coder"}))).await;
    assert!(caps(&json(&out)), "{}", json(&out));
    let (_, _, out) = send(&app, post_json("/api/show", json!({"model": "plain"}))).await;
    assert!(!caps(&json(&out)));

    // Ollama: the context is the prompt, then what was generated.
    let generate = |model: &str, extra: Value| {
        let mut body = json!({"model": model, "prompt": prefix, "suffix": suffix, "stream": false,
            "options": {"num_predict": 3, "temperature": 0}});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post_json("/api/generate", body)
    };
    let (status, _, out) = send(&app, generate("coder", json!({}))).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["prompt_eval_count"], want.len());
    let context: Vec<u32> = serde_json::from_value(v["context"].clone()).unwrap();
    assert_eq!(context[..want.len()], want[..]);

    // OpenAI: the same prompt, the same greedy text.
    let body = json!({"model": "coder", "prompt": prefix, "suffix": suffix, "max_tokens": 3, "temperature": 0});
    let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
    let o = json(&out);
    assert_eq!(status, StatusCode::OK, "{o}");
    assert_eq!(o["usage"]["prompt_tokens"], want.len());
    assert_eq!(o["choices"][0]["text"], v["response"]);

    // Refused: a model without FIM tokens, and what a FIM prompt cannot hold.
    let (status, _, out) = send(&app, generate("plain", json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(json(&out)["error"].as_str().unwrap().contains("does not support insert"), "{}", json(&out));
    let body = json!({"model": "plain", "prompt": prefix, "suffix": suffix, "max_tokens": 3});
    let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", json(&out));
    assert!(json(&out)["error"]["message"].as_str().unwrap().contains("no FIM"), "{}", json(&out));
    for (extra, field) in [
        (json!({"raw": true}), "raw"),
        (json!({"system": "be brief"}), "system"),
        (json!({"context": [1, 2]}), "context"),
    ] {
        let (status, _, out) = send(&app, generate("coder", extra.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}");
        assert!(json(&out)["error"].as_str().unwrap().contains(field), "{extra}: {}", json(&out));
    }
    let body = json!({"model": "coder", "prompt": [1, 2], "suffix": suffix, "max_tokens": 3});
    let (status, _, _) = send(&app, post_json("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    std::fs::remove_file(&path).ok();
}
