//! gpt-oss's harmony format over HTTP: the `qwen3` fixture's weights and tokenizer with
//! gpt-oss's real chat template (tests/fixtures/templates/openai-gpt-oss-120b.jinja, from
//! llama.cpp's models/templates, as transformers renders it: renders.json), so that its
//! markers are text in this vocabulary, not tokens. Random weights write no harmony on
//! their own: grammars and `tool_choice` make them, and what is checked is the path from
//! the generated text to each API's shape: reasoning apart, calls as calls, no markers.

use crate::common;
use crate::http_tools::{chat, forced_call_in_openai_shape, sse_payloads};

use axum::http::StatusCode;
use common::{json, ok_json, post_json, send};
use serde_json::{Value, json};

/// get_weather, with the description gpt-oss's template requires (it adds `"// " +
/// tool.description`, an error without one, in transformers too).
fn weather() -> Value {
    let mut tool = crate::http_tools::weather();
    tool["function"]["description"] = json!("Get the current weather in a city.");
    tool
}

const TEMPLATE: &str = include_str!("../fixtures/templates/openai-gpt-oss-120b.jinja");

/// A copy of the `qwen3` fixture with gpt-oss's template, served as `harmony`.
fn harmony_app() -> axum::Router {
    // One directory per server: the tests run at once.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("strata-it-harmony-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::path::PathBuf::from(common::fixture("qwen3"));
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), TEMPLATE).unwrap();
    let models = [("harmony", dir.to_string_lossy().into_owned())];
    let (app, _, _worker) = strata::server::start(common::serve_options(&models, 1024)).expect("starting the server");
    app
}

/// The grammar of a reply that thinks (3 to 8 letters), then answers (2 to 6) and returns;
/// `after`: what the grammar would allow past `<|return|>`.
fn think_then_answer(after: &str) -> String {
    format!(
        r#"start: "<|channel|>analysis<|message|>" /[a-z]{{3,8}}/ "<|end|><|start|>assistant<|channel|>final<|message|>" /[a-z]{{2,6}}/ "<|return|>" {after}"#
    )
}

/// Thinks, then calls get_weather with a capitalised city.
const THINK_THEN_CALL: &str = r#"start: "<|channel|>analysis<|message|>" /[a-z]{3,8}/ "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"" /[A-Z][a-z]{2,8}/ "\"}<|call|>""#;

fn letters(s: &str, range: std::ops::RangeInclusive<usize>) -> bool {
    range.contains(&s.len()) && s.chars().all(|c| c.is_ascii_lowercase())
}

#[tokio::test]
async fn harmony_reasoning_answers_and_calls_in_openai_shape() {
    let app = harmony_app();
    let body = chat("harmony", json!({"grammar": think_then_answer("")}));
    let v = ok_json(&app, "/v1/chat/completions", body.clone()).await;
    let choice = &v["choices"][0];
    let msg = &choice["message"];
    let (reasoning, content) = (msg["reasoning_content"].as_str().unwrap(), msg["content"].as_str().unwrap());
    assert!(letters(reasoning, 3..=8) && letters(content, 2..=6), "no markers in either: {v}");
    assert_eq!(choice["finish_reason"], "stop", "{v}");
    let reasoning_tokens = v["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    assert!(reasoning_tokens >= 3 && reasoning_tokens < v["usage"]["completion_tokens"].as_u64().unwrap(), "{v}");

    // Streamed, the same pieces.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let chunks = sse_payloads(&send(&app, post_json("/v1/chat/completions", streamed)).await.2);
    let part = |key: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][key].as_str()).collect() };
    assert_eq!((part("reasoning_content").as_str(), part("content").as_str()), (reasoning, content));

    // `<|return|>` (text in this vocabulary) ends the generation: a grammar that would go
    // on past it gives the same reply, in as many tokens.
    let longer = ok_json(
        &app,
        "/v1/chat/completions",
        chat("harmony", json!({"grammar": think_then_answer(r#"/[a-z]{20,30}/"#)})),
    )
    .await;
    assert_eq!(longer["choices"][0]["message"], v["choices"][0]["message"], "{longer}");
    assert_eq!(longer["usage"]["completion_tokens"], v["usage"]["completion_tokens"], "{longer}");

    // A forced call, whole and streamed, in the shape of every other format.
    forced_call_in_openai_shape(&app, "harmony", weather()).await;

    // Reasoning, then a call: both apart, and no content.
    let v = ok_json(
        &app,
        "/v1/chat/completions",
        chat("harmony", json!({"grammar": THINK_THEN_CALL, "tools": [weather()], "max_tokens": 400})),
    )
    .await;
    let msg = &v["choices"][0]["message"];
    assert!(msg["reasoning_content"].as_str().is_some_and(|r| letters(r, 3..=8)), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert!(msg["content"].is_null(), "{v}");
    assert_eq!(msg["tool_calls"][0]["function"]["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(msg["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].as_str().is_some_and(|c| c.starts_with(|x: char| x.is_ascii_uppercase())), "{v}");

    // Without tools, the call's text is no call: it is the content.
    let v =
        ok_json(&app, "/v1/chat/completions", chat("harmony", json!({"grammar": THINK_THEN_CALL, "max_tokens": 400})))
            .await;
    let msg = &v["choices"][0]["message"];
    assert!(msg.get("tool_calls").is_none_or(Value::is_null), "{v}");
    assert!(msg["content"].as_str().is_some_and(|c| c.starts_with("{\"city\": \"")), "{v}");
}

#[tokio::test]
async fn harmony_thinking_and_calls_in_ollama_shape() {
    let app = harmony_app();
    let v = ok_json(&app, "/api/show", json!({"model": "harmony"})).await;
    assert!(v["capabilities"].as_array().unwrap().contains(&json!("thinking")), "{v}");
    let msgs = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let options = json!({"num_predict": 120, "temperature": 0});

    // Ollama's API takes no grammar (its `format` writes JSON, not harmony's markers), so
    // random weights write no harmony here: what is checked is that `think` levels are
    // taken for this template (above, the prompt they render) and that the reply comes
    // back whole and streamed alike.
    let body = json!({"model": "harmony", "messages": msgs, "think": "high", "stream": false, "options": options,
        "tools": [weather()]});
    let (status, _, out) = send(&app, post_json("/api/chat", body.clone())).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    let content = v["message"]["content"].as_str().unwrap();
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let out = send(&app, post_json("/api/chat", streamed)).await.2;
    let lines: Vec<Value> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(json).collect();
    let joined: String = lines.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
    assert_eq!(joined, content, "greedy: the same content streamed");
}

#[tokio::test]
async fn reasoning_effort_and_think_reach_the_harmony_template() {
    let app = harmony_app();
    let openai = |extra: Value| {
        let app = app.clone();
        async move {
            let body = chat("harmony", common::merged(json!({"max_tokens": 1}), extra));
            ok_json(&app, "/v1/chat/completions", body).await["usage"]["prompt_tokens"].as_u64().unwrap()
        }
    };
    let ollama = |think: Value| {
        let app = app.clone();
        async move {
            let body = json!({"model": "harmony", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "think": think, "stream": false, "options": {"num_predict": 1}});
            ok_json(&app, "/api/chat", body).await["prompt_eval_count"].as_u64().unwrap()
        }
    };
    // "Reasoning: low", "medium" or "high" in the system message: the fixture's
    // tokenizer spells medium in more tokens than the others (low and high in as many).
    let (low, medium, high) = (
        openai(json!({"reasoning_effort": "low"})).await,
        openai(json!({"reasoning_effort": "medium"})).await,
        openai(json!({"reasoning_effort": "high"})).await,
    );
    assert!(low < medium && high < medium, "{low} {medium} {high}");
    // The template's default is medium; it cannot turn reasoning off, so `none` is its
    // lowest, and `minimal` and `xhigh` the levels it knows nearest.
    assert_eq!(openai(json!({})).await, medium);
    assert_eq!(openai(json!({"reasoning_effort": "none"})).await, low);
    assert_eq!(openai(json!({"reasoning_effort": "minimal"})).await, low);
    assert_eq!(openai(json!({"reasoning_effort": "xhigh"})).await, high);
    // The Responses API's `reasoning.effort`.
    let responses = ok_json(
        &app,
        "/v1/responses",
        json!({"model": "harmony", "input": "Weather in Paris?", "max_output_tokens": 1, "reasoning": {"effort": "high"}}),
    )
    .await;
    assert_eq!(responses["usage"]["input_tokens"].as_u64().unwrap(), high, "{responses}");
    // Ollama's `think`: its levels, and false as the lowest.
    assert_eq!(ollama(json!("high")).await, high);
    assert_eq!(ollama(json!("low")).await, low);
    assert_eq!(ollama(json!(false)).await, low);
    assert_eq!(ollama(json!(true)).await, medium);
}

#[tokio::test]
async fn harmony_reasoning_is_a_responses_item_of_its_own() {
    let app = harmony_app();
    let body = json!({"model": "harmony", "input": "Weather in Paris?", "temperature": 0, "max_output_tokens": 120,
        "grammar": think_then_answer("")});
    let v = ok_json(&app, "/v1/responses", body.clone()).await;
    let items = v["output"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{v}");
    assert_eq!((items[0]["type"].as_str(), items[1]["type"].as_str()), (Some("reasoning"), Some("message")), "{v}");
    assert_eq!(items[0]["summary"], json!([]));
    assert_eq!(items[0]["content"][0]["type"], "reasoning_text");
    let reasoning = items[0]["content"][0]["text"].as_str().unwrap();
    let answer = items[1]["content"][0]["text"].as_str().unwrap();
    assert!(letters(reasoning, 3..=8) && letters(answer, 2..=6), "{v}");
    assert!(v["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() >= 3, "{v}");

    let evs = common::ok_events(&app, "/v1/responses", body).await;
    let deltas = |name: &str| -> String {
        evs.iter().filter(|(n, _)| n == name).map(|(_, p)| p["delta"].as_str().unwrap()).collect()
    };
    assert_eq!(deltas("response.reasoning_text.delta"), reasoning);
    assert_eq!(deltas("response.output_text.delta"), answer);
    let done: Vec<u64> = evs
        .iter()
        .filter(|(n, _)| n == "response.output_item.done")
        .map(|(_, p)| p["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(done, [0, 1], "the reasoning item ends before the message starts");

    // A call after reasoning: a reasoning item, then a function_call item.
    let body = json!({"model": "harmony", "input": "Weather in Paris?", "temperature": 0, "max_output_tokens": 400,
        "grammar": THINK_THEN_CALL, "tools": [{"type": "function", "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": weather()["function"]["parameters"].clone()}]});
    let v = ok_json(&app, "/v1/responses", body).await;
    let kinds: Vec<&str> = v["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "function_call"], "{v}");
    assert_eq!(v["output"][1]["name"], "get_weather");
}
