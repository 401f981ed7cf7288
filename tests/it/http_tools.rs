//! Tool calls, structured output and reasoning over HTTP, on the fixture models: `qwen3`
//! (Qwen3's real template: Hermes-style `<tool_call>` and `<think>` markers) and `llama3`
//! (a template without tools: Strata's generic JSON format). Random weights never call a
//! tool or think on their own, so the requests force it with `tool_choice` or a grammar;
//! what is checked is the path from generated text to each API's shape.

use crate::common;

use axum::http::StatusCode;
use common::{app_with_context, json, post_json, send};
use serde_json::{Value, json};

pub(crate) fn sse_payloads(body: &[u8]) -> Vec<Value> {
    std::str::from_utf8(body)
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

pub(crate) fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}})
}

pub(crate) fn chat(model: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "temperature": 0, "max_tokens": 120});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// A forced call to `model` (of `tool`, a get_weather) comes back in OpenAI's shape, whole
/// and streamed.
pub(crate) async fn forced_call_in_openai_shape(app: &axum::Router, model: &str, tool: Value) {
    let body = chat(model, json!({"tools": [tool], "tool_choice": "required", "parallel_tool_calls": false}));
    let (status, _, out) = send(app, post_json("/v1/chat/completions", body.clone())).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{model}: {v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{model}: {args}");
    assert!(choice["message"]["content"].is_null(), "{model}: only a call: {v}");

    // Streamed: the same call, in pieces.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _, out) = send(app, post_json("/v1/chat/completions", streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_payloads(&out);
    let deltas: Vec<&Value> =
        chunks.iter().flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten()).collect();
    assert!(deltas[0]["id"].is_string() && deltas[0]["function"]["name"] == "get_weather", "{deltas:?}");
    assert!(deltas[1..].iter().all(|d| d.get("id").is_none() && d["function"].get("name").is_none()));
    let joined: String = deltas.iter().filter_map(|d| d["function"]["arguments"].as_str()).collect();
    assert_eq!(joined, calls[0]["function"]["arguments"].as_str().unwrap(), "{model}: greedy, same arguments");
    let last = chunks.iter().rev().find(|c| !c["choices"].as_array().unwrap().is_empty()).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn forced_calls_come_back_in_openai_shape_for_both_formats() {
    let (app, _) = app_with_context(1024);
    for model in ["qwen3", "llama3"] {
        forced_call_in_openai_shape(&app, model, weather()).await;
    }
}

#[tokio::test]
async fn the_history_renders_calls_and_results() {
    let (app, _) = app_with_context(1024);
    for model in ["qwen3", "llama3"] {
        let body = json!({"model": model, "max_tokens": 4, "tools": [weather()], "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ]});
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
        assert_eq!(status, StatusCode::OK, "{model}: {}", String::from_utf8_lossy(&out));
        let body = json!({"model": model, "stream": false, "options": {"num_predict": 4}, "tools": [weather()],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18 C", "tool_name": "get_weather"},
        ]});
        let (status, _, out) = send(&app, post_json("/api/chat", body)).await;
        assert_eq!(status, StatusCode::OK, "{model}: {}", String::from_utf8_lossy(&out));
    }
}

#[tokio::test]
async fn reasoning_comes_apart_from_the_answer() {
    let (app, _) = app_with_context(1024);
    // The grammar makes the random model think, then answer.
    let grammar = r#"start: "<think>" /[a-z]{3,8}/ "</think>" /[a-z]{2,6}/"#;
    let body = chat("qwen3", json!({"grammar": grammar}));
    let (status, _, out) = send(&app, post_json("/v1/chat/completions", body.clone())).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    let msg = &v["choices"][0]["message"];
    let (reasoning, content) = (msg["reasoning_content"].as_str().unwrap(), msg["content"].as_str().unwrap());
    assert!((3..=8).contains(&reasoning.len()) && reasoning.chars().all(|c| c.is_ascii_lowercase()), "{v}");
    assert!((2..=6).contains(&content.len()) && content.chars().all(|c| c.is_ascii_lowercase()), "{v}");

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (_, _, out) = send(&app, post_json("/v1/chat/completions", streamed)).await;
    let chunks = sse_payloads(&out);
    let part = |key: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][key].as_str()).collect() };
    assert_eq!((part("reasoning_content").as_str(), part("content").as_str()), (reasoning, content));

    // A template without think markers keeps the text whole.
    let body = chat("llama3", json!({"grammar": grammar}));
    let v = json(&send(&app, post_json("/v1/chat/completions", body)).await.2);
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().starts_with("<think>"), "{v}");
    assert!(v["choices"][0]["message"].get("reasoning_content").is_none(), "{v}");
}

#[tokio::test]
async fn ollama_think_format_and_calls() {
    let (app, _) = app_with_context(1024);
    let show = |model: &str| json!({"model": model});
    let caps = |v: &Value| -> Vec<String> {
        v["capabilities"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect()
    };
    let v = json(&send(&app, post_json("/api/show", show("qwen3"))).await.2);
    assert_eq!(caps(&v), ["completion", "tools", "thinking", "embedding"]);
    let v = json(&send(&app, post_json("/api/show", show("llama3"))).await.2);
    assert_eq!(caps(&v), ["completion", "tools", "embedding"]);

    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let body =
        json!({"model": "qwen3", "messages": msgs, "think": true, "stream": false, "options": {"num_predict": 3}});
    let (status, _, out) = send(&app, post_json("/api/chat", body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let body = json!({"model": "llama3", "messages": msgs, "think": true, "stream": false});
    let (status, _, out) = send(&app, post_json("/api/chat", body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(json(&out)["error"].as_str().unwrap().contains("does not support thinking"));

    // `format` with a schema: the output validates.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": false});
    let body = json!({"model": "llama3", "messages": msgs, "format": schema, "stream": false,
        "options": {"num_predict": 40, "temperature": 0}});
    let v = json(&send(&app, post_json("/api/chat", body)).await.2);
    let doc: Value = serde_json::from_str(v["message"]["content"].as_str().unwrap()).unwrap();
    assert!(doc["n"].as_u64().unwrap() <= 9, "{v}");

    // llama3's template shows no tools: its calls are Strata's generic JSON reply. Made
    // to write one (with `format`), it comes back as Ollama's whole call objects, streamed
    // and not.
    let call_schema = json!({"type": "object", "properties": {"tool_calls": {"type": "array", "minItems": 1,
        "maxItems": 1, "items": {"type": "object", "properties": {"name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"], "additionalProperties": false}}, "required": ["name", "arguments"],
        "additionalProperties": false}}}, "required": ["tool_calls"], "additionalProperties": false,
        // llguidance's options are honoured: no room for the random model's whitespace.
        "x-guidance": {"whitespace_flexible": false, "whitespace_pattern": null}});
    let body = json!({"model": "llama3", "messages": msgs, "tools": [weather()], "format": call_schema,
        "stream": false, "options": {"num_predict": 100, "temperature": 0}});
    let v = json(&send(&app, post_json("/api/chat", body.clone())).await.2);
    let calls = v["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(calls[0]["function"]["name"], "get_weather", "{v}");
    assert!(calls[0]["function"]["arguments"]["city"].is_string(), "arguments as an object: {v}");
    assert_eq!(v["message"]["content"], "", "{v}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let out = send(&app, post_json("/api/chat", streamed)).await.2;
    let lines: Vec<Value> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(json).collect();
    let with_calls: Vec<&Value> = lines.iter().filter(|l| l["message"].get("tool_calls").is_some()).collect();
    assert_eq!(with_calls.len(), 1, "{lines:?}");
    // The same call (greedy), under a fresh id.
    let strip_id = |c: &Value| c["function"].clone();
    assert_eq!(strip_id(&with_calls[0]["message"]["tool_calls"][0]), strip_id(&calls[0]));
    assert_ne!(with_calls[0]["message"]["tool_calls"][0]["id"], calls[0]["id"], "ids are unique per request");
}

#[tokio::test]
async fn ollama_logprobs_stream_and_whole() {
    let (app, _) = app_with_context(256);
    for api in ["/api/generate", "/api/chat"] {
        let mut body = json!({"model": "llama3", "logprobs": true, "top_logprobs": 2, "stream": false,
            "options": {"num_predict": 6, "temperature": 0}});
        match api {
            "/api/generate" => body["prompt"] = json!("Hello"),
            _ => body["messages"] = json!([{"role": "user", "content": "Hello"}]),
        }
        let v = json(&send(&app, post_json(api, body.clone())).await.2);
        let lps = v["logprobs"].as_array().unwrap_or_else(|| panic!("{api}: {v}"));
        assert_eq!(lps.len() as u64, v["eval_count"].as_u64().unwrap(), "{api}: one per token: {v}");
        for lp in lps {
            assert!(lp["token"].is_string() && lp["logprob"].as_f64().unwrap() <= 0.0, "{lp}");
            assert!(lp["bytes"].is_array());
            assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 2, "{lp}");
        }
        let text_key = if api == "/api/generate" { "/response" } else { "/message/content" };
        let text: String = lps.iter().map(|l| l["token"].as_str().unwrap()).collect();
        assert!(text.starts_with(v.pointer(text_key).unwrap().as_str().unwrap()), "{text:?} {v}");
        // Streamed: each token's entry once, on the line that carries its text (or the last).
        body["stream"] = json!(true);
        let out = send(&app, post_json(api, body.clone())).await.2;
        let lines: Vec<Value> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(json).collect();
        let streamed: Vec<Value> =
            lines.iter().flat_map(|l| l["logprobs"].as_array().cloned().unwrap_or_default()).collect();
        assert_eq!(&streamed, lps, "{api}: the same entries, greedy");
        // Out of range.
        body["top_logprobs"] = json!(21);
        let (status, _, out) = send(&app, post_json(api, body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&out));
    }
}

#[tokio::test]
async fn completions_take_grammars_too() {
    let (app, _) = app_with_context(256);
    let body = json!({"model": "llama3", "prompt": "Answer:", "max_tokens": 10, "grammar": r#"start: "yes" | "no""#});
    let v = json(&send(&app, post_json("/v1/completions", body)).await.2);
    let text = v["choices"][0]["text"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(text == "yes" || text == "no", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": false});
    let body = json!({"model": "llama3", "prompt": "JSON:", "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}});
    let v = json(&send(&app, post_json("/v1/completions", body)).await.2);
    let doc: Value = serde_json::from_str(v["choices"][0]["text"].as_str().unwrap()).unwrap();
    assert!(doc["n"].as_u64().unwrap() <= 9);
    let body = json!({"model": "llama3", "prompt": "x", "grammar": "start: ("});
    let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&out)["error"]["param"], "grammar");
    // A special token the model lacks is only found when the grammar meets the model.
    let body = json!({"model": "llama3", "prompt": "x", "grammar": "start: <|no_such_token|>"});
    let (status, _, out) = send(&app, post_json("/v1/completions", body)).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "grammar", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("no_such_token"), "{v}");
}

/// A 400 naming `param`, as both APIs write errors (OpenAI's `{"error": {..., "param"}}`;
/// Ollama's `{"error": "..."}`, whose text names the field).
fn assert_refused(status: StatusCode, v: &Value, param: &str, what: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {v}");
    match &v["error"] {
        Value::String(msg) => assert!(msg.contains(param), "{what}: {v}"),
        e => assert_eq!(e["param"], param, "{what}: {v}"),
    }
}

#[tokio::test]
async fn schemas_and_grammars_no_text_completes_are_refused_up_front() {
    let (app, _) = app_with_context(1024);
    let empty = [
        json!({"$ref": "#"}),
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
        json!({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]}),
        json!({"type": "integer", "minimum": 1e300, "maximum": 1e301}),
    ];
    for schema in &empty {
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
        let body = chat("llama3", json!({"response_format": rf, "max_tokens": 8}));
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
        assert_refused(status, &json(&out), "response_format.json_schema.schema", &schema.to_string());
        let body = json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "format": schema,
            "stream": false, "options": {"num_predict": 8}});
        let (status, _, out) = send(&app, post_json("/api/chat", body)).await;
        assert_refused(status, &json(&out), "format", &schema.to_string());
    }
    for lark in ["start: start \"a\"\n", "start: a\na: a\n"] {
        let body = chat("llama3", json!({"grammar": lark, "max_tokens": 8}));
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
        assert_refused(status, &json(&out), "grammar", lark);
    }
    // Recursion with a base case still runs, and ends in JSON.
    let tree = json!({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["kids"], "additionalProperties": false});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}});
    let (status, _, out) =
        send(&app, post_json("/v1/chat/completions", chat("llama3", json!({"response_format": rf})))).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::OK, "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(serde_json::from_str::<Value>(text).is_ok(), "{text}");
    }
}

#[tokio::test]
async fn a_dead_end_while_generating_is_an_error_naming_the_grammar() {
    let (app, _) = app_with_context(1024);
    // The check lets this through (the first alternative completes), but once the model
    // writes `b`, no token can follow: that is a 400 naming `grammar`, never a "stop".
    let lark = "start: \"a\" | \"b\" c\nc: c \"c\"\n";
    let (mut stops, mut dead) = (0, 0);
    for seed in 1..=16 {
        let extra = json!({"grammar": lark, "temperature": 1.0, "seed": seed, "max_tokens": 8});
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", chat("llama3", extra.clone()))).await;
        let v = json(&out);
        if status == StatusCode::OK {
            assert_eq!(v["choices"][0]["message"]["content"], "a", "seed {seed}: {v}");
            stops += 1;
            continue;
        }
        assert_refused(status, &v, "grammar", &format!("seed {seed}"));
        assert!(v["error"]["message"].as_str().unwrap().contains("dead end"), "{v}");
        dead += 1;
        // Streamed, the same seed ends in an error event, not a finish_reason (the stream
        // has begun: the model's `b` came first).
        let mut streamed = chat("llama3", extra);
        streamed["stream"] = json!(true);
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", streamed)).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
        let events = sse_payloads(&out);
        let last = events.last().unwrap();
        assert_eq!(last["error"]["param"], "grammar", "{events:?}");
        assert!(events.iter().all(|e| e["choices"][0]["finish_reason"].is_null()), "{events:?}");
    }
    assert!(stops > 0 && dead > 0, "both alternatives were taken: {stops} stops, {dead} dead ends");
}

#[tokio::test]
async fn a_json_schema_format_that_is_not_an_object_is_refused() {
    let (app, _) = app_with_context(1024);
    for js in [json!("x"), json!(5), json!([1])] {
        let rf = json!({"type": "json_schema", "json_schema": js});
        let body = chat("llama3", json!({"response_format": rf, "max_tokens": 4}));
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
        assert_refused(status, &json(&out), "response_format.json_schema", &js.to_string());
    }
    // Without `schema`, any JSON (as OpenAI reads it).
    let rf = json!({"type": "json_schema", "json_schema": {"name": "any"}});
    let (status, _, out) =
        send(&app, post_json("/v1/chat/completions", chat("llama3", json!({"response_format": rf, "max_tokens": 4}))))
            .await;
    assert_eq!(status, StatusCode::OK, "{}", json(&out));
}

#[tokio::test]
async fn a_tool_with_a_bad_schema_is_refused_whatever_the_choice() {
    let (app, _) = app_with_context(1024);
    let bad = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}});
    for choice in
        [Value::Null, json!("auto"), json!("required"), json!({"type": "function", "function": {"name": "f"}})]
    {
        let mut extra = json!({"tools": [weather(), bad], "max_tokens": 4});
        if !choice.is_null() {
            extra["tool_choice"] = choice.clone();
        }
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", chat("qwen3", extra))).await;
        let v = json(&out);
        assert_refused(status, &v, "tools[1].function.parameters", &choice.to_string());
        assert!(v["error"]["message"].as_str().unwrap().contains("nonsense"), "{v}");
    }
    let body = json!({"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "tools": [bad],
        "stream": false, "options": {"num_predict": 4}});
    let (status, _, out) = send(&app, post_json("/api/chat", body)).await;
    assert_refused(status, &json(&out), "tools[0].function.parameters", "ollama");
    // A keyword llguidance cannot enforce is fine in a tool that is only offered.
    let unique = json!({"type": "function", "function": {"name": "g", "parameters": {"type": "object",
        "properties": {"xs": {"type": "array", "uniqueItems": true}}}}});
    let (status, _, out) =
        send(&app, post_json("/v1/chat/completions", chat("qwen3", json!({"tools": [unique], "max_tokens": 4})))).await;
    assert_eq!(status, StatusCode::OK, "{}", json(&out));
}

#[tokio::test]
async fn reasoning_effort_reaches_the_template() {
    let (app, _) = app_with_context(1024);
    let prompt_tokens = |v: Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut sizes = Vec::new();
    for extra in
        [json!({}), json!({"reasoning_effort": "none"}), json!({"chat_template_kwargs": {"enable_thinking": false}})]
    {
        let body = chat("qwen3", common::merged(json!({"max_tokens": 1}), extra));
        let (status, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
        sizes.push(prompt_tokens(json(&out)));
    }
    // Qwen3's template closes an empty reasoning block in the prompt when thinking is off.
    assert_eq!(sizes[1], sizes[2], "{sizes:?}");
    assert!(sizes[1] > sizes[0], "{sizes:?}");
}

#[tokio::test]
async fn a_forced_call_cut_by_max_tokens_keeps_its_complete_calls() {
    let (app, _) = app_with_context(1024);
    let mut seen = Vec::new();
    for model in ["qwen3", "llama3"] {
        for max_tokens in [24, 48, 96] {
            for seed in 0..4 {
                let body = chat(
                    model,
                    json!({"tools": [weather()], "tool_choice": "required", "temperature": 1,
                    "seed": seed, "max_tokens": max_tokens}),
                );
                let (status, _, out) = send(&app, post_json("/v1/chat/completions", body)).await;
                let v = json(&out);
                assert_eq!(status, StatusCode::OK, "{v}");
                let choice = &v["choices"][0];
                let content = choice["message"]["content"].as_str().unwrap_or_default();
                assert!(content.trim().is_empty(), "{model} {max_tokens} {seed}: call text as content: {v}");
                let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
                for c in &calls {
                    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                    assert!(args["city"].is_string(), "{v}");
                }
                let finish = choice["finish_reason"].as_str().unwrap().to_string();
                assert!(finish == "length" || (finish == "tool_calls" && !calls.is_empty()), "{v}");
                seen.push((finish, calls.len()));
            }
        }
    }
    // Some replies the limit cut inside a later call still carry the calls before it.
    assert!(seen.iter().any(|(f, n)| f == "length" && *n > 0), "{seen:?}");
}

/// DeepSeek-V3.1's template (its tool markers tokens of the fixture's vocabulary) and
/// GLM-4.5's (its markers text there): forced calls come back in OpenAI's shape, whole
/// and streamed; a reply that thinks and then calls a tool gives both apart.
#[tokio::test]
async fn deepseek_and_glm_calls_and_reasoning_reach_openai_shape() {
    let models = [("deepseek", common::fixture("deepseek_v3")), ("glm", common::fixture("glm4_moe"))];
    let (app, _, _worker) = strata::server::start(common::serve_options(&models, 1024)).expect("starting the server");
    for model in ["deepseek", "glm"] {
        forced_call_in_openai_shape(&app, model, weather()).await;
    }

    // DeepSeek-V3.1 thinking: its prompt ends inside `<think>`, so the reply starts there.
    let grammar = r#"start: /[a-z]{3,8}/ "</think>" /[a-z]{2,6}/"#;
    let body = chat("deepseek", json!({"grammar": grammar, "chat_template_kwargs": {"thinking": true}}));
    let v = json(&send(&app, post_json("/v1/chat/completions", body)).await.2);
    let msg = &v["choices"][0]["message"];
    assert!(msg["reasoning_content"].as_str().is_some_and(|r| (3..=8).contains(&r.len())), "{v}");
    assert!(msg["content"].as_str().is_some_and(|c| (2..=6).contains(&c.len())), "{v}");

    // GLM thinks, then calls (its calls are text in this vocabulary, so a grammar writes one).
    let grammar = r#"start: "<think>" /[a-z]{3,8}/ "</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>" /[A-Z][a-z]{2,8}/ "</arg_value>\n</tool_call>""#;
    let body = chat("glm", json!({"grammar": grammar, "tools": [weather()]}));
    let v = json(&send(&app, post_json("/v1/chat/completions", body)).await.2);
    let msg = &v["choices"][0]["message"];
    assert!(msg["reasoning_content"].as_str().is_some_and(|r| (3..=8).contains(&r.len())), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let args: Value = serde_json::from_str(msg["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].as_str().is_some_and(|c| c.starts_with(|x: char| x.is_ascii_uppercase())), "{v}");
}
