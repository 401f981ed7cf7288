//! The OpenAI-compatible API over the fixture models, driven in-process.

use crate::common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use common::{app, app_with, get, json, post_json, send};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use strata::server::ServerConfig;
use tower::ServiceExt;

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "llama3",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        "temperature": 0,
        "max_tokens": 8,
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// The `data:` payloads of an SSE body, in order (comments skipped).
fn sse_data(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("SSE is UTF-8");
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// Asserts an OpenAI error body and returns it.
async fn expect_error(app: &axum::Router, req: Request<Body>, status: StatusCode) -> Value {
    let (got, _, body) = send(app, req).await;
    let v = json(&body);
    assert_eq!(got, status, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v
}

#[tokio::test]
async fn models_are_listed_and_found() {
    let (app, _) = app();
    let (status, _, body) = send(&app, get("/v1/models")).await;
    assert_eq!(status, StatusCode::OK);
    let v = json(&body);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&"llama3") && ids.contains(&"qwen3") && ids.contains(&"strata-demo"), "{ids:?}");
    for m in v["data"].as_array().unwrap() {
        assert_eq!(m["object"], "model");
        assert!(m["created"].as_u64().unwrap() > 0);
        assert_eq!(m["owned_by"], "strata");
    }

    let (status, _, body) = send(&app, get("/v1/models/llama3")).await;
    assert_eq!(status, StatusCode::OK);
    let v = json(&body);
    assert_eq!((v["id"].as_str(), v["object"].as_str()), (Some("llama3"), Some("model")));

    let v = expect_error(&app, get("/v1/models/nope"), StatusCode::NOT_FOUND).await;
    assert_eq!(v["error"]["code"], "model_not_found");
}

/// A model name matches whatever its case and surrounding spaces, on the OpenAI, Anthropic
/// and Ollama routes alike (as store names do), and every spelling runs the one loaded
/// copy.
#[tokio::test]
async fn model_names_match_whatever_their_case_on_every_route() {
    let (app, _) = app();
    let messages = json!([{"role": "user", "content": "Hi"}]);
    for (uri, body) in [
        ("/v1/chat/completions", json!({"model": "LLaMA3", "messages": messages, "max_tokens": 1})),
        ("/v1/messages", json!({"model": " Llama3 ", "messages": messages, "max_tokens": 1})),
        (
            "/api/chat",
            json!({"model": "LLAMA3:Latest", "messages": messages, "stream": false, "options": {"num_predict": 1}}),
        ),
        ("/v1/chat/completions", json!({"model": "llama3", "messages": messages, "max_tokens": 1})),
    ] {
        let (status, _, out) = send(&app, post_json(uri, body.clone())).await;
        assert_eq!(status, StatusCode::OK, "{uri} {body}: {}", String::from_utf8_lossy(&out));
    }
    assert_eq!(send(&app, get("/v1/models/LLAMA3")).await.0, StatusCode::OK);
    let (_, _, ps) = send(&app, get("/api/ps")).await;
    let loaded: Vec<String> =
        json(&ps)["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(loaded, ["llama3:latest"], "one copy, whatever the spelling");
}

#[tokio::test]
async fn chat_completion_has_the_openai_shape() {
    let (app, _) = app();
    let (status, _, body) = send(&app, post_json("/v1/chat/completions", chat(json!({})))).await;
    let v = json(&body);
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"), "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["model"], "llama3");
    assert!(v["system_fingerprint"].as_str().unwrap().starts_with("strata-"));
    let choice = &v["choices"][0];
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert!(choice.get("logprobs").is_some_and(Value::is_null), "{v}");
    assert!(matches!(choice["finish_reason"].as_str(), Some("stop" | "length")));
    let u = &v["usage"];
    assert!(u["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(u["completion_tokens"].as_u64().unwrap() <= 8);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );

    assert_eq!(u["prompt_tokens_details"], json!({"cached_tokens": 0}), "a fresh server: {v}");
    assert_eq!(u["completion_tokens_details"], json!({"reasoning_tokens": 0}));

    // A second request gets another id, its prompt's keys and values came from the
    // first's cache, and the generation was counted.
    let (_, _, body) = send(&app, post_json("/v1/chat/completions", chat(json!({})))).await;
    let again = json(&body);
    assert_ne!(again["id"], v["id"]);
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached <= u["prompt_tokens"].as_u64().unwrap(), "{again}");
    let (_, _, metrics) = send(&app, get("/metrics")).await;
    let metrics = String::from_utf8(metrics).unwrap();
    let prompt_line = metrics.lines().find(|l| l.starts_with("strata_prompt_tokens_total ")).unwrap();
    assert_ne!(prompt_line, "strata_prompt_tokens_total 0", "{metrics}");
}

#[tokio::test]
async fn content_parts_and_developer_role_are_accepted() {
    let (app, _) = app();
    let body = json!({
        "model": "llama3", "temperature": 0, "max_tokens": 3,
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
        ],
        "response_format": {"type": "text"}, "tool_choice": "none", "tools": [], "user": "u-1", "n": 1,
        "some_future_field": {"x": 1},
    });
    let (status, _, body) = send(&app, post_json("/v1/chat/completions", body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
}

#[tokio::test]
async fn chat_stream_sends_role_content_finish_usage_and_done() {
    let (app, _) = app();
    let req = post_json(
        "/v1/chat/completions",
        chat(json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 6})),
    );
    let (status, headers, body) = send(&app, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    assert_eq!(headers["x-accel-buffering"], "no");

    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| json(d.as_bytes())).collect();
    assert!(chunks.len() >= 3, "{chunks:?}");
    let (id, created) = (&chunks[0]["id"], &chunks[0]["created"]);
    assert!(id.as_str().unwrap().starts_with("chatcmpl-"));
    for c in &chunks {
        assert_eq!(&c["id"], id);
        assert_eq!(&c["created"], created);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], "llama3");
    }
    // The role first, with empty content.
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert!(chunks[0]["choices"][0]["finish_reason"].is_null());
    // Then content only.
    let n = chunks.len();
    let mut text = String::new();
    for c in &chunks[1..n - 2] {
        let delta = &c["choices"][0]["delta"];
        assert_eq!(delta.as_object().unwrap().keys().collect::<Vec<_>>(), ["content"], "{c}");
        assert!(c["choices"][0]["finish_reason"].is_null());
        assert!(c["usage"].is_null(), "usage is null until the last chunk: {c}");
        text.push_str(delta["content"].as_str().unwrap());
    }
    // An empty delta with the reason.
    let finish = &chunks[n - 2];
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    let reason = finish["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(reason == "stop" || reason == "length", "{finish}");
    // The usage chunk.
    let usage = &chunks[n - 1];
    assert_eq!(usage["choices"], json!([]));
    let completion_tokens = usage["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=6).contains(&completion_tokens));
    assert_eq!(
        usage["usage"]["total_tokens"].as_u64().unwrap(),
        usage["usage"]["prompt_tokens"].as_u64().unwrap() + completion_tokens
    );

    // The same text as without streaming.
    let (_, _, whole) = send(&app, post_json("/v1/chat/completions", chat(json!({"max_tokens": 6})))).await;
    let whole = json(&whole);
    assert_eq!(whole["choices"][0]["message"]["content"].as_str().unwrap(), text);
    assert_eq!(whole["choices"][0]["finish_reason"].as_str().unwrap(), reason);
}

/// `n` choices are each a generation of their own: choice `j` is what the request alone
/// gives with the seed plus `j`; the prompt is counted once in the usage.
#[tokio::test]
async fn several_choices_are_each_the_request_alone_with_its_seed() {
    let (app, _) = app();
    let sampled = json!({"temperature": 1, "seed": 11, "max_tokens": 6});
    let with = |extra: Value| {
        let mut body = chat(sampled.clone());
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post_json("/v1/chat/completions", body)
    };
    let (status, _, body) = send(&app, with(json!({"n": 3}))).await;
    let three = json(&body);
    assert_eq!(status, StatusCode::OK, "{three}");
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let mut completion_tokens = 0;
    for (j, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], j);
        let (_, _, alone) = send(&app, with(json!({"seed": 11 + j}))).await;
        let alone = json(&alone);
        assert_eq!(choice["message"], alone["choices"][0]["message"], "choice {j}");
        assert_eq!(three["usage"]["prompt_tokens"], alone["usage"]["prompt_tokens"]);
        completion_tokens += alone["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_eq!(three["usage"]["completion_tokens"], completion_tokens);
    let texts: Vec<&Value> = choices.iter().map(|c| &c["message"]["content"]).collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "three seeds, three samples: {texts:?}");

    // Streamed: every choice's chunks under its index, one finish each, then one usage
    // chunk for all and one [DONE].
    let (status, _, body) =
        send(&app, with(json!({"n": 3, "stream": true, "stream_options": {"include_usage": true}}))).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&body);
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| json(d.as_bytes())).collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    // The same counts; the stream's prompt came from the whole request's cache.
    for key in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage["usage"][key], three["usage"][key]);
    }
    let mut streamed = vec![String::new(); 3];
    let mut finishes = [0; 3];
    for c in &chunks[..chunks.len() - 1] {
        let choice = &c["choices"][0];
        let j = choice["index"].as_u64().unwrap() as usize;
        streamed[j].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        finishes[j] += choice["finish_reason"].is_string() as usize;
    }
    assert_eq!(finishes, [1, 1, 1]);
    for (j, text) in streamed.iter().enumerate() {
        assert_eq!(Some(text.as_str()), choices[j]["message"]["content"].as_str(), "choice {j}");
    }

    // Completions: each prompt's choices in turn.
    let body = json!({"model": "llama3", "prompt": ["Hello", "Once upon"], "n": 2, "seed": 3,
        "temperature": 1, "max_tokens": 4});
    let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
    let both = json(&out);
    assert_eq!(status, StatusCode::OK, "{both}");
    assert_eq!(both["choices"].as_array().unwrap().len(), 4);
    let body = json!({"model": "llama3", "prompt": "Once upon", "seed": 4, "temperature": 1, "max_tokens": 4});
    let alone = json(&send(&app, post_json("/v1/completions", body)).await.2);
    assert_eq!(both["choices"][3]["text"], alone["choices"][0]["text"]);
    assert_eq!(both["choices"][3]["index"], 3);
}

#[tokio::test]
async fn stream_without_include_usage_has_no_usage() {
    let (app, _) = app();
    let (status, _, body) = send(&app, post_json("/v1/chat/completions", chat(json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    for d in &data[..data.len() - 1] {
        let c = json(d.as_bytes());
        assert!(c.get("usage").is_none(), "{c}");
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn max_tokens_ends_with_length() {
    let (app, _) = app();
    for body in [
        chat(json!({"max_tokens": 5})),
        chat(json!({"max_tokens": 50, "max_completion_tokens": 5})),
        chat(json!({"max_completion_tokens": 5})),
    ] {
        let (status, _, body) = send(&app, post_json("/v1/chat/completions", body)).await;
        let v = json(&body);
        assert_eq!(status, StatusCode::OK, "{v}");
        // The fixture model does not produce eos this early with these prompts.
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    }
}

#[tokio::test]
async fn a_seed_makes_sampling_reproducible() {
    let (app, _) = app();
    let body = chat(json!({"temperature": 1.0, "seed": 1234, "max_tokens": 24}));
    let mut replies = Vec::new();
    for _ in 0..2 {
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", body.clone())).await;
        assert_eq!(status, StatusCode::OK);
        replies.push(json(&out)["choices"][0]["message"]["content"].as_str().unwrap().to_string());
    }
    assert_eq!(replies[0], replies[1]);
}

#[tokio::test]
async fn logprobs_report_sorted_alternatives() {
    let (app, _) = app();
    let body = chat(json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 5}));
    let (status, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    for entry in content {
        let lp = entry["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{entry}");
        let token = entry["token"].as_str().unwrap();
        let bytes: Vec<u8> = entry["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        // The real bytes: a token holding part of a character shows as U+FFFD in `token`.
        assert_eq!(String::from_utf8_lossy(&bytes), token);
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{entry}");
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        // Greedy: the sampled token is the most likely one.
        assert!((lps[0] - lp).abs() < 1e-5, "{entry}");
        assert!(top.iter().all(|t| t["token"].is_string() && t["bytes"].is_array()));
    }

    // Streamed: the same entries, spread over the chunks.
    let body = chat(json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 5, "stream": true}));
    let (_, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
    let data = sse_data(&out);
    let streamed: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| json(d.as_bytes()))
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), content.len());
    // The same tokens; logprobs agree up to the rounding of a reused KV cache.
    for (a, b) in streamed.iter().zip(content) {
        assert_eq!(a["token"], b["token"]);
        assert!((a["logprob"].as_f64().unwrap() - b["logprob"].as_f64().unwrap()).abs() < 1e-4, "{a} vs {b}");
        let tokens =
            |v: &Value| v["top_logprobs"].as_array().unwrap().iter().map(|t| t["token"].clone()).collect::<Vec<_>>();
        assert_eq!(tokens(a), tokens(b));
    }
}

#[tokio::test]
async fn completions_take_text_and_token_prompts() {
    let (app, _) = app();
    let mut texts = Vec::new();
    for prompt in [json!("Once upon a time"), json!(["Once upon a time"])] {
        let body = json!({"model": "llama3", "prompt": prompt, "max_tokens": 5, "temperature": 0});
        let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::OK, "{v}");
        assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["index"], 0);
        assert!(v["choices"][0]["logprobs"].is_null());
        assert_eq!(v["usage"]["completion_tokens"], 5);
        assert!(v["usage"].get("prompt_tokens_details").is_none(), "chat's details only: {v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        texts.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    assert_eq!(texts[0], texts[1]);

    for prompt in [json!([480, 10, 20, 30]), json!([[480, 10, 20, 30]])] {
        let body = json!({"model": "llama3", "prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 2});
        let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], 4);
        let lp = &v["choices"][0]["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
        assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(lp["text_offset"][0], 0);
        for top in lp["top_logprobs"].as_array().unwrap() {
            let n = top.as_object().unwrap().len();
            assert!((1..=3).contains(&n), "{top}");
        }
    }

    let body = json!({"model": "llama3", "prompt": [[1, 2], []]});
    let v = expect_error(&app, post_json("/v1/completions", body), StatusCode::BAD_REQUEST).await;
    assert_eq!(v["error"]["param"], "prompt");
}

#[tokio::test]
async fn completions_stream() {
    let (app, _) = app();
    let body = json!({"model": "llama3", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&out);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| json(d.as_bytes())).collect();
    let n = chunks.len();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion" && c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 5);
    let text: String = chunks[..n - 1].iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();

    let body = json!({"model": "llama3", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0});
    let (_, _, whole) = send(&app, post_json("/v1/completions", body)).await;
    assert_eq!(json(&whole)["choices"][0]["text"].as_str().unwrap(), text);
}

#[tokio::test]
async fn embeddings_as_floats_and_base64() {
    let (app, _) = app();
    let body = json!({"model": "llama3", "input": ["hello world", "goodbye"], "encoding_format": "float"});
    let (status, _, out) = send(&app, post_json("/v1/embeddings", body)).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "llama3");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let floats: Vec<Vec<f32>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        })
        .collect();
    for e in &floats {
        assert_eq!(e.len(), 64, "the fixture's hidden size");
        let norm: f32 = e.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-3, "{norm}");
    }
    assert_ne!(floats[0], floats[1]);
    let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens >= 2);
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(tokens));

    // The SDK's default: base64 of little-endian f32.
    let body = json!({"model": "llama3", "input": ["hello world", "goodbye"], "encoding_format": "base64"});
    let (status, _, out) = send(&app, post_json("/v1/embeddings", body)).await;
    assert_eq!(status, StatusCode::OK);
    let v = json(&out);
    for (d, expected) in v["data"].as_array().unwrap().iter().zip(&floats) {
        let bytes = base64::engine::general_purpose::STANDARD.decode(d["embedding"].as_str().unwrap()).unwrap();
        let decoded: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(&decoded, expected);
    }

    // A single string, token ids, and the right `dimensions`.
    for input in [json!("hello world"), json!([480, 5, 6]), json!([[480, 5, 6]])] {
        let body = json!({"model": "llama3", "input": input, "dimensions": 64});
        let (status, _, out) = send(&app, post_json("/v1/embeddings", body)).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["data"].as_array().unwrap().len(), 1);
    }

    let body = json!({"model": "llama3", "input": "x", "dimensions": 32});
    let v = expect_error(&app, post_json("/v1/embeddings", body), StatusCode::BAD_REQUEST).await;
    assert_eq!(v["error"]["param"], "dimensions");
    let body = json!({"model": "llama3", "input": "x", "encoding_format": "int8"});
    let v = expect_error(&app, post_json("/v1/embeddings", body), StatusCode::BAD_REQUEST).await;
    assert_eq!(v["error"]["param"], "encoding_format");
    let body = json!({"model": "nope", "input": "x"});
    let v = expect_error(&app, post_json("/v1/embeddings", body), StatusCode::NOT_FOUND).await;
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn invalid_requests_name_the_field() {
    let (app, _) = app();
    let cases = [
        (chat(json!({"n": 0})), "n"),
        (chat(json!({"n": 17})), "n"),
        (chat(json!({"tools": [{"type": "function", "function": {"name": ""}}]})), "tools[0].function.name"),
        (chat(json!({"tool_choice": "required"})), "tool_choice"),
        (chat(json!({"response_format": {"type": "json_schema"}})), "response_format.json_schema"),
        (chat(json!({"response_format": {"type": "xml"}})), "response_format"),
        (chat(json!({"top_p": 1.5})), "top_p"),
        (chat(json!({"top_p": 0})), "top_p"),
        (chat(json!({"temperature": 2.5})), "temperature"),
        (chat(json!({"temperature": "hot"})), "temperature"),
        (chat(json!({"presence_penalty": -3})), "presence_penalty"),
        (chat(json!({"max_tokens": 0})), "max_tokens"),
        (chat(json!({"top_logprobs": 3})), "top_logprobs"),
        (chat(json!({"logprobs": true, "top_logprobs": 21})), "top_logprobs"),
        (chat(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop"),
        (chat(json!({"stop": 5})), "stop"),
        (chat(json!({"messages": []})), "messages"),
        (chat(json!({"messages": [{"role": "wizard", "content": "hi"}]})), "messages[0].role"),
        (
            chat(json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})),
            "messages[0].content[1]",
        ),
        (json!({"model": "llama3"}), "messages"),
        (json!({"messages": [{"role": "user", "content": "hi"}]}), "model"),
    ];
    for (body, param) in cases {
        let v = expect_error(&app, post_json("/v1/chat/completions", body.clone()), StatusCode::BAD_REQUEST).await;
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(param.split('[').next().unwrap()), "{v}");
    }
    let v = expect_error(&app, post_json("/v1/chat/completions", chat(json!({"top_p": 1.5}))), StatusCode::BAD_REQUEST)
        .await;
    assert_eq!(v["error"]["message"], "`top_p` must be in (0, 1]");

    // Not JSON at all, whatever the content type says.
    let req = Request::post("/v1/chat/completions").header("content-type", "text/plain").body(Body::from("{")).unwrap();
    expect_error(&app, req, StatusCode::BAD_REQUEST).await;
    // Valid JSON without a content type works.
    let req =
        Request::post("/v1/chat/completions").body(Body::from(chat(json!({"max_tokens": 1})).to_string())).unwrap();
    let (status, _, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::OK);
}

/// A one-token greedy completion of "Hello" with `extra` fields: (text, the sampled
/// token's logprob, its alternatives `{token: logprob}`).
async fn hello(app: &axum::Router, extra: Value) -> (String, f64, serde_json::Map<String, Value>) {
    let mut body = json!({"model": "llama3", "prompt": "Hello", "max_tokens": 1, "temperature": 0, "logprobs": 5});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (status, _, out) = send(app, post_json("/v1/completions", body)).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    (text, lp["token_logprobs"][0].as_f64().unwrap(), lp["top_logprobs"][0].as_object().unwrap().clone())
}

/// `logit_bias` (OpenAI's): -100 bans a token, +100 forces it, even one far outside the
/// few most likely tokens a greedy request otherwise computes; the reported
/// log-probabilities stay the model's, before the bias.
#[tokio::test]
async fn logit_bias_bans_and_forces_tokens() {
    let (app, _) = app();
    // The fixture's greedy token after "Hello" is id 332, `12`.
    let (plain, plain_lp, plain_top) = hello(&app, json!({})).await;
    assert_eq!(plain, "12");
    // Banned, greedy picks another token; a small bias on it changes nothing.
    let (banned, _, banned_top) = hello(&app, json!({"logit_bias": {"332": -100}})).await;
    assert_ne!(banned, plain);
    assert!(!banned.is_empty());
    let (nudged, ..) = hello(&app, json!({"logit_bias": {"332": -0.0001, "300": 0.0001}})).await;
    assert_eq!(nudged, plain);
    // The alternatives reported are the model's own: the banned token is still the most
    // likely, with the log-probability it had without the bias.
    assert_eq!(banned_top.len(), plain_top.len());
    let banned_lp = banned_top["12"].as_f64().unwrap();
    assert!((banned_lp - plain_lp).abs() < 1e-4, "{banned_lp} vs {plain_lp}");

    // +100 on id 300 (` d`), which the model does not rank in its top 5 here: every
    // token is that one.
    assert!(!plain_top.contains_key(" d"), "{plain_top:?}");
    let body = json!({"model": "llama3", "prompt": "Hello", "max_tokens": 3, "temperature": 0, "logprobs": 1,
        "logit_bias": {"300": 100}});
    let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["choices"][0]["text"], " d d d");
    // Its logprob is the model's (far below 0), not the biased distribution's (about 0).
    let lp = v["choices"][0]["logprobs"]["token_logprobs"][0].as_f64().unwrap();
    assert!(lp < -1.0, "{lp}");
    // Sampling too: +100 leaves nothing else to draw, whatever the seed.
    for seed in 0..4 {
        let (forced, ..) = hello(&app, json!({"temperature": 1.0, "seed": seed, "logit_bias": {"300": 100}})).await;
        assert_eq!(forced, " d");
    }

    // Chat too.
    let first_token = |out: &[u8]| json(out)["choices"][0]["logprobs"]["content"][0]["token"].clone();
    let body = chat(json!({"max_tokens": 1, "logprobs": true}));
    let (_, _, plain) = send(&app, post_json("/v1/chat/completions", body)).await;
    assert_ne!(first_token(&plain), " d");
    let body = chat(json!({"max_tokens": 1, "logprobs": true, "logit_bias": {"300": 100}}));
    let (status, _, forced) = send(&app, post_json("/v1/chat/completions", body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&forced));
    assert_eq!(first_token(&forced), " d");
}

/// Each request in a batch keeps its own bias: run side by side, a biased and an
/// unbiased request give what each gives alone.
#[tokio::test]
async fn logit_bias_is_per_request_in_a_batch() {
    let (app, _) = app();
    let body = |bias: Value| json!({"model": "llama3", "prompt": "Hello", "max_tokens": 6, "temperature": 0, "logit_bias": bias});
    let text = |out: &[u8]| json(out)["choices"][0]["text"].as_str().unwrap().to_string();
    let (_, _, alone_plain) = send(&app, post_json("/v1/completions", body(json!({})))).await;
    let (_, _, alone_biased) = send(&app, post_json("/v1/completions", body(json!({"332": -100, "300": 1})))).await;
    assert_ne!(text(&alone_plain), text(&alone_biased));
    for _ in 0..3 {
        let ((_, _, plain), (_, _, biased)) = tokio::join!(
            send(&app, post_json("/v1/completions", body(json!({})))),
            send(&app, post_json("/v1/completions", body(json!({"332": -100, "300": 1})))),
        );
        assert_eq!(text(&plain), text(&alone_plain));
        assert_eq!(text(&biased), text(&alone_biased));
    }
}

#[tokio::test]
async fn bad_logit_bias_is_a_400_naming_it() {
    let (app, _) = app();
    let bad = [
        json!({"x": 1}),
        json!({"-1": 1}),
        json!({"1.5": 1}),
        json!({"": 1}),
        json!({"4294967296": 1}),
        json!({"496": 1}),
        json!({"29": 100.5}),
        json!({"29": -101}),
        json!({"29": "5"}),
        json!({"29": null}),
        json!({"29": false}),
        json!([[29, 1]]),
        json!("29"),
    ];
    for bias in bad {
        for (uri, body) in [
            ("/v1/completions", json!({"model": "llama3", "prompt": "Hello", "max_tokens": 1, "logit_bias": bias})),
            ("/v1/chat/completions", chat(json!({"logit_bias": bias}))),
        ] {
            let v = expect_error(&app, post_json(uri, body), StatusCode::BAD_REQUEST).await;
            assert_eq!(v["error"]["param"], "logit_bias", "{uri} {bias}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().contains("logit_bias"), "{v}");
        }
    }
    // The ends of the range, the vocabulary's last id, an empty map and null are fine.
    for bias in [json!({"495": -50, "0": -100, "300": 100}), json!({}), Value::Null] {
        let body = json!({"model": "llama3", "prompt": "Hello", "max_tokens": 1, "logit_bias": bias});
        let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
        assert_eq!(status, StatusCode::OK, "{bias}: {}", String::from_utf8_lossy(&out));
    }
}

#[tokio::test]
async fn unknown_model_is_404_model_not_found() {
    let (app, _) = app();
    for (uri, body) in [
        ("/v1/chat/completions", chat(json!({"model": "gpt-9"}))),
        ("/v1/chat/completions", chat(json!({"model": "gpt-9", "stream": true}))),
        ("/v1/completions", json!({"model": "gpt-9", "prompt": "hi"})),
    ] {
        let v = expect_error(&app, post_json(uri, body), StatusCode::NOT_FOUND).await;
        assert_eq!(v["error"]["code"], "model_not_found", "{v}");
        assert_eq!(v["error"]["param"], "model", "{v}");
    }
}

#[tokio::test]
async fn a_prompt_longer_than_the_context_is_400_even_when_streaming() {
    let (app, _) = app();
    let long = "the quick brown fox jumps over the lazy dog ".repeat(100);
    for stream in [false, true] {
        let body = chat(json!({"messages": [{"role": "user", "content": long}], "stream": stream}));
        let v = expect_error(&app, post_json("/v1/chat/completions", body), StatusCode::BAD_REQUEST).await;
        assert_eq!(v["error"]["param"], "messages", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("context"), "{v}");
    }
    let body = json!({"model": "llama3", "prompt": long, "stream": true});
    let v = expect_error(&app, post_json("/v1/completions", body), StatusCode::BAD_REQUEST).await;
    assert_eq!(v["error"]["param"], "prompt", "{v}");
}

#[tokio::test]
async fn wrong_method_is_a_json_405() {
    let (app, _) = app();
    let v = expect_error(&app, get("/v1/chat/completions"), StatusCode::METHOD_NOT_ALLOWED).await;
    assert_eq!(v["error"]["code"], "method_not_allowed");
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let (app, _) = app_with(ServerConfig { body_limit: 1024, ..ServerConfig::default() }, 8);
    let body = chat(json!({"messages": [{"role": "user", "content": "x".repeat(4096)}]}));
    let v = expect_error(&app, post_json("/v1/chat/completions", body), StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(v["error"]["code"], "request_too_large");
}

#[tokio::test]
async fn a_full_queue_is_429_with_retry_after() {
    let (app, _) = app_with(ServerConfig::default(), 0);
    for (uri, body) in [
        ("/v1/chat/completions", chat(json!({}))),
        ("/v1/completions", json!({"model": "llama3", "prompt": "hi"})),
        ("/v1/embeddings", json!({"model": "llama3", "input": "hi"})),
    ] {
        let (status, headers, body) = send(&app, post_json(uri, body)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{uri}");
        assert!(headers.get("retry-after").is_some(), "{uri}");
        let v = json(&body);
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    }
}

#[tokio::test]
async fn a_dropped_stream_cancels_the_job() {
    let (app, state) = app();
    // No max_tokens: it would run until the context is full.
    let body = chat(json!({"stream": true, "max_tokens": null, "temperature": 1.0, "seed": 7}));
    let resp = app.clone().oneshot(post_json("/v1/chat/completions", body)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let frame = body.frame().await.expect("a first chunk").expect("no body error");
    let first = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    assert!(first.starts_with("data: "), "{first}");
    drop(body);

    // The worker notices and takes the next request.
    let next = async {
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", chat(json!({"max_tokens": 2})))).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    };
    tokio::time::timeout(Duration::from_secs(60), next).await.expect("the next request is served");
    // The worker's bookkeeping for that request ends just after its last event.
    let idle = async {
        while state.queue.depth() != (0, 0) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), idle).await.expect("the queue drains");
}

#[tokio::test]
async fn openapi_covers_every_openai_route() {
    let (app, _) = app();
    let (status, _, body) = send(&app, get("/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    let doc = json(&body);
    for (path, method) in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/responses", "post"),
        ("/v1/models", "get"),
        ("/v1/models/{id}", "get"),
        ("/v1/embeddings", "post"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{path} {method} is missing");
        assert_eq!(doc["paths"][path][method]["tags"][0], "openai");
    }
    for schema in [
        "ChatCompletionRequest",
        "ChatCompletionResponse",
        "ChatCompletionChunk",
        "ResponseRequest",
        "ResponseObject",
        "OutputItem",
        "ResponseStreamEvent",
        "OpenAiErrorBody",
    ] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema} is missing");
    }
}
