use serde_json::json;

use super::*;

fn chat(extra: Value) -> Result<Plan, ApiError> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    serde_json::from_value::<ChatCompletionRequest>(body).unwrap().into_plan()
}

fn completion(extra: Value) -> Result<Plan, ApiError> {
    let mut body = json!({"model": "m", "prompt": "hi"});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    serde_json::from_value::<CompletionRequest>(body).unwrap().into_plan()
}

fn param(r: Result<Plan, ApiError>) -> String {
    r.expect_err("an error").param.unwrap_or_default()
}

#[test]
fn chat_uses_openai_defaults() {
    let plan = chat(json!({})).unwrap();
    assert_eq!(plan.api, Api::Chat);
    assert!(!plan.stream && !plan.include_usage && !plan.logprobs);
    let s = &plan.job.sampling;
    assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty), (1.0, 1.0, 0, 0.0, 1.0));
    assert_eq!((s.presence_penalty, s.frequency_penalty, s.seed), (0.0, 0.0, None));
    assert_eq!(plan.job.max_tokens, None, "until the context is full");
    assert!(plan.job.stop.is_empty());
    assert_eq!(plan.job.top_logprobs, 0);
}

#[test]
fn reasoning_effort_becomes_template_variables() {
    let vars = |extra: Value| Value::Object(chat(extra).unwrap().job.template_vars);
    assert_eq!(vars(json!({})), json!({}));
    assert_eq!(vars(json!({"reasoning_effort": "low"})), json!({"enable_thinking": true, "reasoning_effort": "low"}));
    assert_eq!(vars(json!({"reasoning_effort": "none"})), json!({"enable_thinking": false}));
    assert_eq!(
        vars(json!({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": false}})),
        json!({"enable_thinking": false, "reasoning_effort": "high"})
    );
    assert_eq!(param(chat(json!({"reasoning_effort": "max"}))), "reasoning_effort");
}

#[test]
fn chat_maps_fields() {
    let plan = chat(json!({
        "messages": [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null},
            {"role": "user"},
        ],
        "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.1, "seed": -1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "max_tokens": 50, "max_completion_tokens": 20, "stop": ["x", ""],
        "logprobs": true, "top_logprobs": 4, "stream": true, "stream_options": {"include_usage": true},
        "n": 1, "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "user": "u",
    }))
    .unwrap();
    let PromptInput::Chat(messages) = &plan.job.prompt else { panic!("{:?}", plan.job.prompt) };
    assert_eq!(
        messages,
        &[
            ChatMessage::new("system", "rules"),
            ChatMessage::new("user", "a\nb"),
            ChatMessage::new("assistant", ""),
            ChatMessage::new("user", "")
        ]
    );
    let s = &plan.job.sampling;
    assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p), (0.5, 0.9, 7, 0.1));
    assert_eq!((s.presence_penalty, s.frequency_penalty, s.seed), (0.5, -0.5, Some(u64::MAX)));
    assert_eq!(plan.job.max_tokens, Some(20), "the smaller of the two");
    assert_eq!(plan.job.stop, ["x"], "empty stop strings are dropped");
    assert_eq!(plan.job.top_logprobs, 4);
    assert!(plan.stream && plan.include_usage && plan.logprobs);
    assert_eq!(chat(json!({"stop": "end"})).unwrap().job.stop, ["end"]);
    assert_eq!(chat(json!({"max_completion_tokens": 3})).unwrap().job.max_tokens, Some(3));
}

#[test]
fn tools_and_formats_become_the_job() {
    let tool = json!({"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}});
    let plan = chat(json!({
        "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get"}}, "parallel_tool_calls": false,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
    }))
    .unwrap();
    let tools = plan.job.tools.as_ref().unwrap();
    assert_eq!((tools.choice.clone(), tools.parallel), (ToolChoice::Function("get".into()), false));
    let PromptInput::Chat(messages) = &plan.job.prompt else { panic!() };
    assert_eq!(messages[1].fields["tool_calls"][0]["function"]["arguments"], json!({"a": 1}), "arguments as an object");
    assert_eq!((messages[2].role.as_str(), &messages[2].fields["tool_call_id"]), ("tool", &json!("c1")));
    // `tool_choice: none` offers no tools.
    assert!(chat(json!({"tools": [tool], "tool_choice": "none"})).unwrap().job.tools.is_none());
    // The legacy `functions`.
    let legacy = chat(json!({"functions": [{"name": "get"}]})).unwrap().job.tools.unwrap();
    assert_eq!(legacy.tools[0]["function"]["name"], "get");
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let plan =
        chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}));
    assert_eq!(plan.unwrap().job.grammar, Some(GrammarSpec::JsonSchema(schema)));
    let plan = chat(json!({"response_format": {"type": "json_object"}})).unwrap();
    assert_eq!(plan.job.grammar, Some(GrammarSpec::JsonObject));
    let plan = chat(json!({"grammar": "start: \"yes\" | \"no\""})).unwrap();
    assert!(matches!(plan.job.grammar, Some(GrammarSpec::Lark(_))));
    let plan = chat(json!({"chat_template_kwargs": {"enable_thinking": false}})).unwrap();
    assert_eq!(plan.job.template_vars["enable_thinking"], json!(false));
}

#[test]
fn chat_errors_name_the_field() {
    let cases = [
        (json!({"n": 0}), "n"),
        (json!({"n": 17}), "n"),
        (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
        (json!({"tools": [{"type": "function", "function": {"name": ""}}]}), "tools[0].function.name"),
        (json!({"tools": [{"type": "code_interpreter"}]}), "tools[0].type"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
            "tools[0].function.parameters",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}), "tool_choice"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"}), "tool_choice"),
        (
            json!({"functions": [{"name": "f"}], "tools": [{"type": "function", "function": {"name": "f"}}]}),
            "functions",
        ),
        (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"response_format": {"type": "yaml"}}), "response_format"),
        (json!({"grammar": "start: ("}), "grammar"),
        (json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}), "grammar"),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
            "messages[0].tool_calls",
        ),
        (json!({"temperature": -0.1}), "temperature"),
        (json!({"temperature": 2.01}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"top_k": -1}), "top_k"),
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_completion_tokens": -5}), "max_completion_tokens"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": [{"role": "robot", "content": "1"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}), "messages[0].content[0]"),
        (json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}), "messages[0].content[0]"),
    ];
    for (extra, field) in cases {
        assert_eq!(param(chat(extra.clone())), field, "{extra}");
    }
    let e = chat(json!({"top_p": 1.5})).unwrap_err();
    assert_eq!(e.message, "`top_p` must be in (0, 1]");
    let e = chat(json!({"temperature": 3})).unwrap_err();
    assert_eq!(e.message, "`temperature` must be in [0, 2]");
    // Logprobs without alternatives, and top_logprobs 0 alone, are fine.
    assert!(chat(json!({"logprobs": true})).unwrap().logprobs);
    assert!(chat(json!({"top_logprobs": 0})).is_ok());
    let missing = serde_json::from_value::<ChatCompletionRequest>(json!({"model": "m"})).unwrap().into_plan();
    assert_eq!(param(missing), "messages");
    let missing = serde_json::from_value::<ChatCompletionRequest>(json!({"messages": []})).unwrap().into_plan();
    assert_eq!(param(missing), "model");
}

#[test]
fn logit_bias_is_checked_and_sorted() {
    let bias = |b: Value| chat(json!({"logit_bias": b})).map(|p| p.job.sampling.logit_bias);
    assert_eq!(
        bias(json!({"30": 2.5, "7": -100, "12": 100, "0": 0})).unwrap(),
        [(0, 0.0), (7, f32::NEG_INFINITY), (12, 100.0), (30, 2.5)]
    );
    assert_eq!(bias(json!({"29": -99.5})).unwrap(), [(29, -99.5)], "only -100 is a ban");
    assert!(bias(Value::Null).unwrap().is_empty());
    let plan = completion(json!({"logit_bias": {"5": 1}})).unwrap();
    assert_eq!(plan.job.sampling.logit_bias, [(5, 1.0)]);
    for bad in [
        json!({"a": 1}),
        json!({"-1": 1}),
        json!({"+1": 1}),
        json!({" 1": 1}),
        json!({"": 1}),
        json!({"4294967296": 1}),
        json!({"1": 100.01}),
        json!({"1": "1"}),
        json!({"1": null}),
        json!({"1": [1]}),
        json!({"01": 1, "1": 2}),
    ] {
        let e = bias(bad.clone()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"), "{bad}");
        assert!(e.message.contains("`logit_bias`"), "{bad}: {}", e.message);
    }
}

#[test]
fn completion_prompts() {
    let prompt = |p: Value| completion(json!({"prompt": p})).map(|plan| plan.job.prompt);
    let text = |t: &str| PromptInput::Text { text: t.into(), special: true };
    assert!(matches!(prompt(json!("hi")).unwrap(), p if format!("{p:?}") == format!("{:?}", text("hi"))));
    assert!(matches!(prompt(json!(["hi"])).unwrap(), p if format!("{p:?}") == format!("{:?}", text("hi"))));
    assert!(matches!(prompt(json!([1, 2, 3])).unwrap(), PromptInput::Tokens(ids) if ids == [1, 2, 3]));
    assert!(matches!(prompt(json!([[4, 5]])).unwrap(), PromptInput::Tokens(ids) if ids == [4, 5]));
    for bad in [json!([]), json!([[]]), json!([[1], []])] {
        assert_eq!(param(prompt(bad.clone()).map(|_| unreachable!())), "prompt", "{bad}");
    }
    // Several prompts and several choices: each prompt's `n` choices in turn, choice
    // `j` with the seed plus `j`.
    let plan = completion(json!({"prompt": ["a", "b"], "n": 2, "seed": 7})).unwrap();
    let jobs: Vec<_> = plan.jobs().into_iter().map(|j| (format!("{:?}", j.prompt), j.sampling.seed)).collect();
    let (a, b) = (format!("{:?}", text("a")), format!("{:?}", text("b")));
    assert_eq!(jobs, [(a.clone(), Some(7)), (a, Some(8)), (b.clone(), Some(7)), (b, Some(8))]);
    let plan = completion(json!({"prompt": [[1], [2, 3]]})).unwrap();
    assert_eq!(plan.jobs().len(), 2);
    assert_eq!(plan.jobs()[0].sampling.seed, None);
    let plan = completion(json!({"prompt": ["a", "b"], "suffix": "z"})).unwrap();
    assert!(plan.jobs().iter().all(|j| matches!(&j.prompt, PromptInput::Infill(i) if i.suffix == "z")));
    // At most `MAX_CHOICES` in all.
    assert!(completion(json!({"n": MAX_CHOICES})).is_ok());
    for bad in [json!({"n": 0}), json!({"n": MAX_CHOICES + 1}), json!({"prompt": ["a", "b"], "n": 9})] {
        assert_eq!(param(completion(bad.clone())), "n", "{bad}");
    }
}

#[test]
fn completion_fields() {
    let plan = completion(json!({"logprobs": 3, "max_tokens": 16, "stream": true})).unwrap();
    assert_eq!(plan.api, Api::Completion);
    assert!(plan.logprobs && plan.stream);
    assert_eq!((plan.job.top_logprobs, plan.job.max_tokens), (3, Some(16)));
    let plan = completion(json!({"logprobs": 0})).unwrap();
    assert!(plan.logprobs, "0 alternatives still reports the sampled tokens");
    assert!(!completion(json!({})).unwrap().logprobs);
    for (extra, field) in [
        (json!({"logprobs": 21}), "logprobs"),
        (json!({"echo": true}), "echo"),
        (json!({"suffix": "end", "prompt": [1, 2]}), "suffix"),
        (json!({"best_of": 2}), "best_of"),
        (json!({"n": -1}), "n"),
        (json!({"max_tokens": 0}), "max_tokens"),
    ] {
        assert_eq!(param(completion(extra.clone())), field, "{extra}");
    }
    assert!(completion(json!({"echo": false, "suffix": "", "best_of": 1})).is_ok());
    let plan = completion(json!({"prompt": "def f(", "suffix": "return x"})).unwrap();
    let want = strata_engine::tokenizer::Infill { prefix: "def f(".into(), suffix: "return x".into() };
    assert!(matches!(plan.job.prompt, PromptInput::Infill(ref i) if *i == want), "{:?}", plan.job.prompt);
}

#[test]
fn embedding_inputs() {
    let plan = |v: Value| serde_json::from_value::<EmbeddingRequest>(v).unwrap().into_plan();
    let p = plan(json!({"model": "m", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8})).unwrap();
    assert_eq!(p.job.inputs.len(), 2);
    assert!(p.base64);
    assert_eq!(p.dimensions, Some(8));
    assert!(!p.job.truncate);
    let p = plan(json!({"model": "m", "input": [[1, 2], [3]]})).unwrap();
    assert!(matches!(&p.job.inputs[..], [EmbedInput::Tokens(a), EmbedInput::Tokens(b)] if a == &[1, 2] && b == &[3]));
    assert!(!p.base64);
    let err = |v: Value| plan(v).unwrap_err().param.unwrap_or_default();
    assert_eq!(err(json!({"model": "m", "input": []})), "input");
    assert_eq!(err(json!({"model": "m", "input": [[]]})), "input");
    assert_eq!(err(json!({"model": "m"})), "input");
    assert_eq!(err(json!({"model": "m", "input": "a", "encoding_format": "int8"})), "encoding_format");
    assert_eq!(err(json!({"model": "m", "input": "a", "dimensions": 0})), "dimensions");
}

#[test]
fn shapes_that_do_not_fit_name_the_field() {
    let e = crate::server::parse_json::<ChatCompletionRequest>(br#"{"model": "m", "stop": 5}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("stop"));
    assert!(e.message.contains("up to 4 strings"), "{}", e.message);
    let body = br#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#;
    let e = crate::server::parse_json::<ChatCompletionRequest>(body).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].content"));
    let e = crate::server::parse_json::<CompletionRequest>(br#"{"model": "m", "prompt": [-1]}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("prompt"));
    let e = crate::server::parse_json::<ChatCompletionRequest>(br#"{"model": "m", "temperature": "x"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("temperature"));
}
