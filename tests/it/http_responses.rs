//! The Responses API (`POST /v1/responses`) over the fixture models, driven in-process.
//! Each conversation is checked against the same conversation through
//! `/v1/chat/completions`: greedy decoding gives the same text and prompt size when the
//! items became the same chat.

use crate::common;

use axum::http::StatusCode;
use common::{app_with_context, json, post_json, send};
use serde_json::{Value, json};

/// A response request to `model`, with `extra` fields.
fn request(model: &str, input: Value, extra: Value) -> Value {
    common::merged(json!({"model": model, "input": input, "temperature": 0, "max_output_tokens": 8}), extra)
}

fn chat(model: &str, messages: Value, extra: Value) -> Value {
    common::greedy_chat(model, messages, extra)
}

async fn ok(app: &axum::Router, uri: &str, body: Value) -> Value {
    common::ok_json(app, uri, body).await
}

async fn streamed(app: &axum::Router, body: Value) -> Vec<(String, Value)> {
    common::ok_events(app, "/v1/responses", body).await
}

fn output_text(response: &Value) -> String {
    let items = response["output"].as_array().unwrap();
    let messages = items.iter().filter(|i| i["type"] == "message");
    messages.flat_map(|m| m["content"].as_array().unwrap()).filter_map(|p| p["text"].as_str()).collect()
}

fn weather() -> Value {
    json!({"type": "function", "name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}})
}

#[tokio::test]
async fn a_response_is_the_chat_reply_in_the_responses_shape() {
    let (app, _) = app_with_context(1024);
    let v =
        ok(&app, "/v1/responses", request("llama3", json!("Hello there"), json!({"instructions": "Be brief."}))).await;
    let c = ok(
        &app,
        "/v1/chat/completions",
        chat(
            "llama3",
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]),
            json!({}),
        ),
    )
    .await;
    assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
    assert_eq!((v["object"].as_str(), v["model"].as_str()), (Some("response"), Some("llama3")));
    assert_eq!(v["output"].as_array().unwrap().len(), 1, "{v}");
    let msg = &v["output"][0];
    assert_eq!((msg["type"].as_str(), msg["role"].as_str()), (Some("message"), Some("assistant")));
    assert!(msg["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(msg["content"][0]["type"], "output_text");
    assert_eq!(output_text(&v), c["choices"][0]["message"]["content"].as_str().unwrap(), "{v}\n{c}");
    // Random weights run to the limit: incomplete, as OpenAI says of max_output_tokens.
    assert_eq!(c["choices"][0]["finish_reason"], "length");
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(msg["status"], "incomplete");
    let usage = &v["usage"];
    assert_eq!(usage["input_tokens"], c["usage"]["prompt_tokens"]);
    assert_eq!(usage["output_tokens"], 8);
    assert_eq!(usage["total_tokens"], c["usage"]["total_tokens"]);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    // What the request set comes back; nothing is stored.
    assert_eq!((v["instructions"].as_str(), v["max_output_tokens"].as_u64()), (Some("Be brief."), Some(8)));
    assert_eq!((v["temperature"].as_f64(), v["top_p"].as_f64()), (Some(0.0), Some(1.0)));
    assert_eq!((v["store"].as_bool(), v["tool_choice"].as_str()), (Some(false), Some("auto")));
    assert_eq!(v["text"]["format"], json!({"type": "text"}));

    // The same prompt again: its keys and values come from the first request's cache.
    let again =
        ok(&app, "/v1/responses", request("llama3", json!("Hello there"), json!({"instructions": "Be brief."}))).await;
    let cached = again["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached <= again["usage"]["input_tokens"].as_u64().unwrap(), "{again}");
    assert_eq!(output_text(&again), output_text(&v));
}

#[tokio::test]
async fn the_stream_builds_the_same_response() {
    let (app, _) = app_with_context(1024);
    let body = request("llama3", json!([{"role": "user", "content": "Hello there"}]), json!({}));
    let whole = ok(&app, "/v1/responses", body.clone()).await;
    let evs = streamed(&app, body).await;
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..4],
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    );
    assert_eq!(
        names[names.len() - 4..],
        ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]
    );
    assert!(names[4..names.len() - 4].iter().all(|n| *n == "response.output_text.delta"), "{names:?}");
    for (i, (name, payload)) in evs.iter().enumerate() {
        assert_eq!(
            (payload["type"].as_str(), payload["sequence_number"].as_u64()),
            (Some(name.as_str()), Some(i as u64))
        );
    }
    let id = evs[0].1["response"]["id"].as_str().unwrap();
    assert_eq!(evs[0].1["response"]["status"], "in_progress");
    assert_eq!(evs[0].1["response"]["output"], json!([]));
    let added = &evs[2].1;
    assert_eq!(added["item"]["content"], json!([]), "{added}");
    let item_id = added["item"]["id"].as_str().unwrap();
    let deltas: String = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .inspect(|(_, p)| assert_eq!(p["item_id"], item_id))
        .map(|(_, p)| p["delta"].as_str().unwrap())
        .collect();
    let last = &evs.last().unwrap().1["response"];
    assert_eq!(last["id"], id);
    assert_eq!(deltas, output_text(&whole));
    assert_eq!(output_text(last), deltas);
    for key in ["input_tokens", "output_tokens", "total_tokens"] {
        assert_eq!(last["usage"][key], whole["usage"][key]);
    }
    assert_eq!(last["status"], whole["status"]);
}

#[tokio::test]
async fn input_items_become_the_chat_history() {
    let (app, _) = app_with_context(1024);
    let chat_tool =
        json!({"type": "function", "function": {"name": "get_weather", "parameters": weather()["parameters"]}});
    for model in ["qwen3", "llama3"] {
        let items = json!([
            {"role": "developer", "content": "Answer from tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 18 C.", "annotations": []}]},
            {"role": "user", "content": "And tomorrow?"},
        ]);
        let messages = json!([
            {"role": "system", "content": "Answer from tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Ask the tool.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"},
            {"role": "assistant", "content": "It is 18 C."},
            {"role": "user", "content": "And tomorrow?"},
        ]);
        let v = ok(&app, "/v1/responses", request(model, items, json!({"tools": [weather()]}))).await;
        let c = ok(&app, "/v1/chat/completions", chat(model, messages, json!({"tools": [chat_tool]}))).await;
        assert_eq!(v["usage"]["input_tokens"], c["usage"]["prompt_tokens"], "{model}");
        assert_eq!(output_text(&v), c["choices"][0]["message"]["content"].as_str().unwrap(), "{model}");
        assert_eq!(v["tools"], json!([weather()]), "the tools as sent");
    }
}

#[tokio::test]
async fn forced_calls_are_function_call_items() {
    let (app, _) = app_with_context(1024);
    for model in ["qwen3", "llama3"] {
        let body = request(
            model,
            json!("Weather in Paris?"),
            json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 120}),
        );
        let v = ok(&app, "/v1/responses", body.clone()).await;
        assert_eq!(v["status"], "completed", "{model}: {v}");
        let calls: Vec<&Value> =
            v["output"].as_array().unwrap().iter().filter(|i| i["type"] == "function_call").collect();
        assert_eq!(calls.len(), 1, "{v}");
        assert!(v["output"].as_array().unwrap().iter().all(|i| i["type"] == "function_call"), "only the call: {v}");
        let call = calls[0];
        assert_eq!((call["name"].as_str(), call["status"].as_str()), (Some("get_weather"), Some("completed")));
        assert!(call["id"].as_str().unwrap().starts_with("fc_") && call["call_id"].is_string(), "{call}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(args["city"].is_string(), "{model}: {args}");

        // Streamed: the same arguments in pieces, then the item done.
        let evs = streamed(&app, body).await;
        let added = evs.iter().find(|(n, _)| n == "response.output_item.added").unwrap();
        assert_eq!(added.1["item"]["type"], "function_call");
        assert_eq!(added.1["item"]["arguments"], "");
        let joined: String = evs
            .iter()
            .filter(|(n, _)| n == "response.function_call_arguments.delta")
            .map(|(_, p)| p["delta"].as_str().unwrap())
            .collect();
        assert_eq!(joined, call["arguments"].as_str().unwrap(), "{model}: greedy, same arguments");
        let done = evs.iter().find(|(n, _)| n == "response.function_call_arguments.done").unwrap();
        assert_eq!(done.1["arguments"], call["arguments"]);
        assert_eq!(evs.last().unwrap().0, "response.completed");
        assert_eq!(evs.last().unwrap().1["response"]["output"][0]["arguments"], call["arguments"]);

        // Naming the function forces it too.
        let named = request(
            model,
            json!("Weather?"),
            json!({"tools": [weather()], "tool_choice": {"type": "function", "name": "get_weather"},
                "parallel_tool_calls": false, "max_output_tokens": 120}),
        );
        let v = ok(&app, "/v1/responses", named).await;
        assert_eq!(v["output"][0]["name"], "get_weather", "{v}");
        assert_eq!(v["tool_choice"], json!({"type": "function", "name": "get_weather"}));
    }
}

#[tokio::test]
async fn reasoning_is_an_item_of_its_own() {
    let (app, _) = app_with_context(1024);
    // The grammar makes the random model think, then answer.
    let grammar = r#"start: "<think>" /[a-z]{3,8}/ "</think>" /[a-z]{2,6}/"#;
    let body = request("qwen3", json!("Weather in Paris?"), json!({"grammar": grammar, "max_output_tokens": 120}));
    let v = ok(&app, "/v1/responses", body.clone()).await;
    let c = ok(
        &app,
        "/v1/chat/completions",
        chat(
            "qwen3",
            json!([{"role": "user", "content": "Weather in Paris?"}]),
            json!({"grammar": grammar, "max_tokens": 120}),
        ),
    )
    .await;
    let items = v["output"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{v}");
    assert_eq!((items[0]["type"].as_str(), items[1]["type"].as_str()), (Some("reasoning"), Some("message")));
    assert!(items[0]["id"].as_str().unwrap().starts_with("rs_"));
    assert_eq!(items[0]["summary"], json!([]));
    let reasoning = items[0]["content"][0]["text"].as_str().unwrap();
    assert_eq!(items[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(reasoning, c["choices"][0]["message"]["reasoning_content"].as_str().unwrap());
    assert_eq!(output_text(&v), c["choices"][0]["message"]["content"].as_str().unwrap());
    // `<think>`, the letters and `</think>` are reasoning; the answer's tokens and the end are not.
    let (reasoning_tokens, output_tokens) = (
        v["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap(),
        v["usage"]["output_tokens"].as_u64().unwrap(),
    );
    assert!(reasoning_tokens >= 3 && reasoning_tokens < output_tokens, "{v}");
    assert_eq!(reasoning_tokens, c["usage"]["completion_tokens_details"]["reasoning_tokens"], "as chat counts them");

    let evs = streamed(&app, body).await;
    let deltas = |name: &str| -> String {
        evs.iter().filter(|(n, _)| n == name).map(|(_, p)| p["delta"].as_str().unwrap()).collect()
    };
    assert_eq!(deltas("response.reasoning_text.delta"), reasoning);
    assert_eq!(deltas("response.output_text.delta"), output_text(&v));
    let done: Vec<usize> = evs
        .iter()
        .filter(|(n, _)| n == "response.output_item.done")
        .map(|(_, p)| p["output_index"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(done, [0, 1], "the reasoning item ends before the message starts");
    assert_eq!(
        evs.last().unwrap().1["response"]["usage"]["output_tokens_details"],
        v["usage"]["output_tokens_details"]
    );
}

#[tokio::test]
async fn text_format_constrains_the_output() {
    let (app, _) = app_with_context(1024);
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": false});
    let body = request(
        "llama3",
        json!("A number?"),
        json!({"text": {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": true}}, "max_output_tokens": 40}),
    );
    let v = ok(&app, "/v1/responses", body).await;
    let doc: Value = serde_json::from_str(&output_text(&v)).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(doc["n"].as_u64().unwrap() <= 9, "{v}");
    assert_eq!(v["text"]["format"]["type"], "json_schema");
}

#[tokio::test]
async fn logprobs_are_the_chat_logprobs() {
    let (app, _) = app_with_context(1024);
    let v = ok(
        &app,
        "/v1/responses",
        request("llama3", json!("Hello"), json!({"include": ["message.output_text.logprobs"], "top_logprobs": 2})),
    )
    .await;
    let c = ok(
        &app,
        "/v1/chat/completions",
        chat("llama3", json!([{"role": "user", "content": "Hello"}]), json!({"logprobs": true, "top_logprobs": 2})),
    )
    .await;
    let got = &v["output"][0]["content"][0]["logprobs"];
    assert_eq!(got.as_array().unwrap().len(), 8, "{v}");
    assert_eq!(got, &c["choices"][0]["logprobs"]["content"]);
    assert_eq!(got[0]["top_logprobs"].as_array().unwrap().len(), 2);

    // Without asking: none.
    let v = ok(&app, "/v1/responses", request("llama3", json!("Hello"), json!({}))).await;
    assert_eq!(v["output"][0]["content"][0]["logprobs"], json!([]));
}

#[tokio::test]
async fn bad_requests_are_400s_naming_the_field() {
    let (app, _) = app_with_context(1024);
    let cases = [
        (json!({"model": "llama3"}), "input"),
        (json!({"input": "x"}), "model"),
        (request("llama3", json!([]), json!({})), "input"),
        (request("llama3", json!(7), json!({})), "input"),
        (request("llama3", json!([{"role": "system", "content": "x"}]), json!({})), "input"),
        (request("llama3", json!("x"), json!({"previous_response_id": "resp_1"})), "previous_response_id"),
        (request("llama3", json!("x"), json!({"conversation": "conv_1"})), "conversation"),
        (request("llama3", json!("x"), json!({"background": true})), "background"),
        (request("llama3", json!("x"), json!({"truncation": "auto"})), "truncation"),
        (request("llama3", json!("x"), json!({"include": ["everything"]})), "include[0]"),
        (request("llama3", json!("x"), json!({"top_logprobs": 21})), "top_logprobs"),
        (request("llama3", json!("x"), json!({"max_output_tokens": 0})), "max_output_tokens"),
        (request("llama3", json!("x"), json!({"temperature": 3})), "temperature"),
        (request("llama3", json!("x"), json!({"metadata": {"a": 1}})), "metadata"),
        (request("llama3", json!("x"), json!({"reasoning": {"effort": "max"}})), "reasoning.effort"),
        (request("llama3", json!("x"), json!({"tools": [{"type": "web_search"}]})), "tools[0].type"),
        (request("llama3", json!("x"), json!({"tools": [{"type": "function"}]})), "tools[0].name"),
        (request("llama3", json!("x"), json!({"tool_choice": "required"})), "tool_choice"),
        (
            request(
                "llama3",
                json!("x"),
                json!({"tools": [weather()], "tool_choice": {"type": "function", "name": "other"}}),
            ),
            "tool_choice",
        ),
        (
            request("llama3", json!("x"), json!({"tools": [weather()], "tool_choice": {"type": "allowed_tools"}})),
            "tool_choice",
        ),
        (
            request("llama3", json!("x"), json!({"text": {"format": {"type": "json_schema", "name": "a"}}})),
            "text.format.schema",
        ),
        (request("llama3", json!("x"), json!({"text": {"format": {"type": "yaml"}}})), "text.format.type"),
        (
            request(
                "llama3",
                json!("x"),
                json!({"text": {"format": {"type": "json_object"}}, "grammar": "start: \"a\""}),
            ),
            "grammar",
        ),
        (request("llama3", json!([{"type": "item_reference", "id": "msg_1"}]), json!({})), "input[0]"),
        (request("llama3", json!([{"type": "web_search_call"}]), json!({})), "input[0].type"),
        (request("llama3", json!([{"content": "x"}]), json!({})), "input[0].type"),
        (request("llama3", json!(["x"]), json!({})), "input[0]"),
        (request("llama3", json!([{"role": "tool", "content": "x"}]), json!({})), "input[0].role"),
        (
            request(
                "llama3",
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                json!({}),
            ),
            "input[0].content[0]",
        ),
        (
            request("llama3", json!([{"role": "user", "content": [{"type": "input_text"}]}]), json!({})),
            "input[0].content[0].text",
        ),
        (
            request("llama3", json!([{"type": "function_call", "name": "f", "arguments": "{}"}]), json!({})),
            "input[0].call_id",
        ),
        (
            request(
                "llama3",
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]),
                json!({}),
            ),
            "input[0].arguments",
        ),
        (request("llama3", json!([{"type": "function_call_output", "output": "x"}]), json!({})), "input[0].call_id"),
    ];
    for (body, param) in cases {
        let (status, _, out) = send(&app, post_json("/v1/responses", body.clone())).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    let (status, _, out) = send(&app, post_json("/v1/responses", request("nope", json!("x"), json!({})))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json(&out)["error"]["code"], "model_not_found");

    // Too long for the context: a plain 400 even when streaming, never a 200 stream.
    let long = "word ".repeat(2000);
    for stream in [false, true] {
        let (status, _, out) =
            send(&app, post_json("/v1/responses", request("llama3", json!(long), json!({"stream": stream})))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&out));
        assert_eq!(json(&out)["error"]["param"], "input");
    }
}
