//! Anthropic's Messages API (`POST /v1/messages`) over the fixture models, driven
//! in-process. Each conversation is checked against the same conversation through
//! `/v1/chat/completions`: greedy decoding gives the same text and prompt size when the
//! blocks became the same chat.

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{app_with, app_with_context, greedy_chat, json, post_json, send};
use serde_json::{Value, json};
use strata::server::ServerConfig;

/// A greedy Messages body of at most 8 tokens: the chat's own body, as it happens.
fn request(model: &str, messages: Value, extra: Value) -> Value {
    greedy_chat(model, messages, extra)
}

fn chat(model: &str, messages: Value, extra: Value) -> Value {
    greedy_chat(model, messages, extra)
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

async fn ok(app: &axum::Router, uri: &str, body: Value) -> Value {
    common::ok_json(app, uri, body).await
}

async fn streamed(app: &axum::Router, body: Value) -> Vec<(String, Value)> {
    common::ok_events(app, "/v1/messages", body).await
}

fn text_of(message: &Value) -> String {
    let blocks = message["content"].as_array().unwrap();
    blocks.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect()
}

fn weather() -> Value {
    json!({"name": "get_weather", "description": "Weather in a city", "input_schema": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}})
}

fn chat_weather() -> Value {
    let w = weather();
    json!({"type": "function", "function": {"name": w["name"], "description": w["description"], "parameters": w["input_schema"]}})
}

#[tokio::test]
async fn a_message_is_the_chat_reply_in_anthropic_s_shape() {
    let (app, _) = app_with_context(1024);
    let v = ok(&app, "/v1/messages", request("llama3", user("Hello there"), json!({"system": "Be brief."}))).await;
    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]);
    let c = ok(&app, "/v1/chat/completions", chat("llama3", messages, json!({}))).await;
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str(), v["model"].as_str()),
        (Some("message"), Some("assistant"), Some("llama3"))
    );
    assert_eq!(v["content"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(text_of(&v), c["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!((v["stop_reason"].as_str(), &v["stop_sequence"]), (Some("max_tokens"), &Value::Null));
    // The second request's prompt came partly from the first's cache: Anthropic counts
    // the input as uncached plus read from the cache.
    let u = &v["usage"];
    let input = u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input, c["usage"]["prompt_tokens"].as_u64().unwrap());
    assert_eq!((u["output_tokens"].as_u64(), u["cache_creation_input_tokens"].as_u64()), (Some(8), Some(0)));

    // System as text blocks is the same prompt.
    let blocks = json!({"system": [{"type": "text", "text": "Be brief."}]});
    let again = ok(&app, "/v1/messages", request("llama3", user("Hello there"), blocks)).await;
    assert_eq!(text_of(&again), text_of(&v));
    let u = &again["usage"];
    assert!(u["cache_read_input_tokens"].as_u64().unwrap() > 0, "{again}");
}

#[tokio::test]
async fn the_stream_builds_the_same_message() {
    let (app, _) = app_with_context(1024);
    let body = request("llama3", user("Hello there"), json!({}));
    let whole = ok(&app, "/v1/messages", body.clone()).await;
    let evs = streamed(&app, body).await;
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "content_block_start"]);
    assert_eq!(names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    assert!(names[2..names.len() - 3].iter().all(|n| *n == "content_block_delta"), "{names:?}");
    for (name, payload) in &evs {
        assert_eq!(payload["type"], name.as_str());
    }
    let start = &evs[0].1["message"];
    assert_eq!((start["content"].clone(), start["stop_reason"].clone()), (json!([]), Value::Null));
    let input = |u: &Value| u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input(&start["usage"]), input(&whole["usage"]), "message_start knows the prompt's size");
    assert_eq!(evs[1].1["content_block"], json!({"type": "text", "text": ""}));
    let text: String = evs
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .inspect(|(_, p)| assert_eq!((p["index"].as_u64(), p["delta"]["type"].as_str()), (Some(0), Some("text_delta"))))
        .map(|(_, p)| p["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, text_of(&whole));
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"], json!({"stop_reason": "max_tokens", "stop_sequence": null}));
    assert_eq!(delta["usage"]["output_tokens"], 8);
}

#[tokio::test]
async fn blocks_become_the_chat_history() {
    let (app, _) = app_with_context(1024);
    for model in ["qwen3", "llama3"] {
        let messages = json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Ask the tool.", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                {"type": "text", "text": "And tomorrow?"}]},
        ]);
        let chat_messages = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}], "reasoning_content": "Ask the tool."},
            {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "18 C"},
            {"role": "user", "content": "And tomorrow?"},
        ]);
        let v = ok(&app, "/v1/messages", request(model, messages, json!({"tools": [weather()]}))).await;
        let c = ok(&app, "/v1/chat/completions", chat(model, chat_messages, json!({"tools": [chat_weather()]}))).await;
        let u = &v["usage"];
        let input = u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
        assert_eq!(input, c["usage"]["prompt_tokens"].as_u64().unwrap(), "{model}");
        assert_eq!(text_of(&v), c["choices"][0]["message"]["content"].as_str().unwrap(), "{model}");
    }
}

#[tokio::test]
async fn forced_calls_are_tool_use_blocks() {
    let (app, _) = app_with_context(1024);
    for model in ["qwen3", "llama3"] {
        for choice in [json!({"type": "any"}), json!({"type": "tool", "name": "get_weather"})] {
            let mut choice = choice;
            choice["disable_parallel_tool_use"] = json!(true);
            let body = request(
                model,
                user("Weather?"),
                json!({"tools": [weather()], "tool_choice": choice, "max_tokens": 120}),
            );
            let v = ok(&app, "/v1/messages", body.clone()).await;
            assert_eq!(v["stop_reason"], "tool_use", "{model}: {v}");
            let blocks = v["content"].as_array().unwrap();
            assert_eq!(blocks.len(), 1, "only the call: {v}");
            let call = &blocks[0];
            assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("tool_use"), Some("get_weather")));
            assert!(call["id"].is_string() && call["input"]["city"].is_string(), "{call}");

            let evs = streamed(&app, body).await;
            let start = evs.iter().find(|(n, _)| n == "content_block_start").unwrap();
            assert_eq!(start.1["content_block"]["input"], json!({}));
            assert!(start.1["content_block"]["id"].is_string());
            let joined: String = evs
                .iter()
                .filter(|(n, _)| n == "content_block_delta")
                .map(|(_, p)| {
                    assert_eq!(p["delta"]["type"], "input_json_delta");
                    p["delta"]["partial_json"].as_str().unwrap()
                })
                .collect();
            assert_eq!(
                serde_json::from_str::<Value>(&joined).unwrap(),
                call["input"],
                "{model}: greedy, the same call"
            );
            let delta = evs.iter().find(|(n, _)| n == "message_delta").unwrap();
            assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
        }
    }
}

#[tokio::test]
async fn thinking_is_a_block_of_its_own() {
    let (app, _) = app_with_context(1024);
    let grammar = r#"start: "<think>" /[a-z]{3,8}/ "</think>" /[a-z]{2,6}/"#;
    let body = request("qwen3", user("Hi"), json!({"grammar": grammar, "max_tokens": 120}));
    let v = ok(&app, "/v1/messages", body.clone()).await;
    let c = ok(&app, "/v1/chat/completions", chat("qwen3", user("Hi"), json!({"grammar": grammar, "max_tokens": 120})))
        .await;
    let blocks = v["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{v}");
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[0]["thinking"], c["choices"][0]["message"]["reasoning_content"]);
    assert_eq!(blocks[0]["signature"], "");
    assert_eq!(blocks[1]["text"], c["choices"][0]["message"]["content"]);
    assert_eq!(v["stop_reason"], "end_turn");

    let evs = streamed(&app, body).await;
    let starts: Vec<&Value> =
        evs.iter().filter(|(n, _)| n == "content_block_start").map(|(_, p)| &p["content_block"]).collect();
    assert_eq!(
        starts,
        [&json!({"type": "thinking", "thinking": "", "signature": ""}), &json!({"type": "text", "text": ""})]
    );
    let thinking: String = evs
        .iter()
        .filter(|(n, p)| n == "content_block_delta" && p["delta"]["type"] == "thinking_delta")
        .map(|(_, p)| p["delta"]["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, blocks[0]["thinking"].as_str().unwrap());
}

#[tokio::test]
async fn a_stop_sequence_ends_the_reply_and_is_named() {
    let (app, _) = app_with_context(1024);
    let free = ok(&app, "/v1/messages", request("llama3", user("Hello"), json!({"max_tokens": 12}))).await;
    let text = text_of(&free);
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 6, "{text:?}");
    let stop: String = chars[3..5].iter().collect();
    let v =
        ok(&app, "/v1/messages", request("llama3", user("Hello"), json!({"max_tokens": 12, "stop_sequences": [stop]})))
            .await;
    assert_eq!((v["stop_reason"].as_str(), v["stop_sequence"].as_str()), (Some("stop_sequence"), Some(stop.as_str())));
    assert_eq!(text_of(&v), text[..text.find(&stop).unwrap()]);
}

#[tokio::test]
async fn output_config_format_constrains_the_text() {
    let (app, _) = app_with_context(1024);
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": false});
    let body = request(
        "llama3",
        user("A number?"),
        json!({"output_config": {"format": {"type": "json_schema", "schema": schema}}, "max_tokens": 40}),
    );
    let v = ok(&app, "/v1/messages", body).await;
    let doc: Value = serde_json::from_str(&text_of(&v)).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(doc["n"].as_u64().unwrap() <= 9, "{v}");
    assert_eq!(v["stop_reason"], "end_turn");
}

#[tokio::test]
async fn bad_requests_are_anthropic_400s_naming_the_field() {
    let (app, _) = app_with_context(1024);
    let cases = [
        (json!({"model": "llama3", "max_tokens": 8}), "messages"),
        (json!({"model": "llama3", "messages": user("x")}), "max_tokens"),
        (request("llama3", user("x"), json!({"max_tokens": 0})), "max_tokens"),
        (request("llama3", json!([]), json!({})), "messages"),
        (request("llama3", json!(["x"]), json!({})), "messages[0]"),
        (request("llama3", json!([{"role": "system", "content": "x"}]), json!({})), "messages[0].role"),
        (request("llama3", json!([{"role": "user", "content": 5}]), json!({})), "messages[0].content"),
        (
            request("llama3", json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]), json!({})),
            "messages[0].content[0]",
        ),
        (
            request("llama3", json!([{"role": "user", "content": [{"type": "tool_result"}]}]), json!({})),
            "messages[0].content[0].tool_use_id",
        ),
        (
            request(
                "llama3",
                json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 3}]}]),
                json!({}),
            ),
            "messages[0].content[0].input",
        ),
        (request("llama3", user("x"), json!({"system": 7})), "system"),
        (request("llama3", user("x"), json!({"temperature": 1.5})), "temperature"),
        (request("llama3", user("x"), json!({"top_k": 0})), "top_k"),
        (request("llama3", user("x"), json!({"stop_sequences": ["a", "b", "c", "d", "e"]})), "stop_sequences"),
        (
            request("llama3", user("x"), json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            "tools[0].type",
        ),
        (request("llama3", user("x"), json!({"tools": [{"name": "f"}]})), "tools[0].input_schema"),
        (
            request("llama3", user("x"), json!({"tools": [weather()], "tool_choice": {"type": "tool"}})),
            "tool_choice.name",
        ),
        (
            request(
                "llama3",
                user("x"),
                json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "nope"}}),
            ),
            "tool_choice",
        ),
        (request("llama3", user("x"), json!({"tool_choice": {"type": "any"}})), "tool_choice"),
        (request("llama3", user("x"), json!({"thinking": {"type": "sometimes"}})), "thinking.type"),
        (
            request("llama3", user("x"), json!({"output_config": {"format": {"type": "json_schema"}}})),
            "output_config.format.schema",
        ),
        (request("llama3", user("x"), json!({"output_config": {"effort": "huge"}})), "output_config.effort"),
    ];
    for (body, field) in cases {
        let (status, _, out) = send(&app, post_json("/v1/messages", body.clone())).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some("invalid_request_error")),
            "{v}"
        );
        assert!(v["error"]["message"].as_str().unwrap().contains(&format!("`{field}`")), "{field}: {v}");
    }
    let (status, _, out) = send(&app, post_json("/v1/messages", request("nope", user("x"), json!({})))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json(&out)["error"]["type"], "not_found_error");
    // Not JSON at all, and a wrong method: the same shape.
    let req = Request::post("/v1/messages").header("content-type", "application/json").body(Body::from("{")).unwrap();
    let (status, _, out) = send(&app, req).await;
    assert_eq!((status, json(&out)["type"].as_str()), (StatusCode::BAD_REQUEST, Some("error")));
    let (status, _, out) = send(&app, Request::get("/v1/messages").body(Body::empty()).unwrap()).await;
    assert_eq!(
        (status, json(&out)["error"]["type"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("invalid_request_error"))
    );

    // Too long for the context: a plain 400 even when streaming.
    let long = "word ".repeat(2000);
    for stream in [false, true] {
        let (status, _, out) =
            send(&app, post_json("/v1/messages", request("llama3", user(&long), json!({"stream": stream})))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&out));
        assert!(
            json(&out)["error"]["message"].as_str().unwrap().contains("context"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
}

#[tokio::test]
async fn the_key_may_come_as_x_api_key() {
    let server = ServerConfig { api_keys: vec!["sk-test".into()], ..ServerConfig::default() };
    let (app, _) = app_with(server, 8);
    let body = request("llama3", user("Hi"), json!({"max_tokens": 2}));
    let (status, _, out) = send(&app, post_json("/v1/messages", body.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(json(&out)["error"]["type"], "authentication_error");
    let mut req = post_json("/v1/messages", body.clone());
    req.headers_mut().insert("x-api-key", "sk-test".parse().unwrap());
    assert_eq!(send(&app, req).await.0, StatusCode::OK);
    let mut req = post_json("/v1/messages", body);
    req.headers_mut().insert("x-api-key", "wrong".parse().unwrap());
    assert_eq!(send(&app, req).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn openapi_covers_the_messages_route() {
    let (app, _) = common::app();
    let (status, _, body) = send(&app, common::get("/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    let doc = json(&body);
    assert_eq!(doc["paths"]["/v1/messages"]["post"]["tags"][0], "anthropic");
    assert_eq!(doc["paths"]["/v1/messages/count_tokens"]["post"]["tags"][0], "anthropic");
    for schema in ["MessagesRequest", "MessageResponse", "ContentBlock", "AnthropicErrorBody"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema} is missing");
    }
}

#[tokio::test]
async fn count_tokens_is_the_prompt_s_size() {
    let (app, _) = app_with_context(1024);
    for (model, extra) in [("llama3", json!({})), ("qwen3", json!({"tools": [weather()], "system": "Be brief."}))] {
        let v = ok(&app, "/v1/messages", request(model, user("Weather in Paris?"), extra.clone())).await;
        let mut body = common::merged(json!({"model": model, "messages": user("Weather in Paris?")}), extra);
        let n = ok(&app, "/v1/messages/count_tokens", body.clone()).await;
        let u = &v["usage"];
        let input = u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
        assert_eq!(n, json!({"input_tokens": input}), "{model}");
        // `max_tokens` may be given too.
        body["max_tokens"] = json!(8);
        assert_eq!(ok(&app, "/v1/messages/count_tokens", body).await, n);
    }
    // A prompt longer than the context is still counted.
    let long = "word ".repeat(2000);
    let n = ok(&app, "/v1/messages/count_tokens", json!({"model": "llama3", "messages": user(&long)})).await;
    assert!(n["input_tokens"].as_u64().unwrap() > 1024, "{n}");
    let (status, _, out) = send(&app, post_json("/v1/messages/count_tokens", json!({"model": "llama3"}))).await;
    assert_eq!(
        (status, json(&out)["error"]["type"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request_error"))
    );
    let (status, _, out) =
        send(&app, post_json("/v1/messages/count_tokens", json!({"model": "nope", "messages": user("x")}))).await;
    assert_eq!((status, json(&out)["error"]["type"].as_str()), (StatusCode::NOT_FOUND, Some("not_found_error")));
}
