use super::*;
use serde_json::json;

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

fn render_src(src: &str, ctx: serde_json::Value) -> Result<String, TextError> {
    let t = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into()))?;
    let extra = match ctx {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    t.render_with(&[], false, &extra)
}

// Llama 3.1 Instruct (abridged to the non-tool-call paths, otherwise verbatim).
const LLAMA31: &str = r#"{{- bos_token }}
{%- if custom_tools is defined %}
{%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
{%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
{%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
{%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
{%- set system_message = messages[0]['content']|trim %}
{%- set messages = messages[1:] %}
{%- else %}
{%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
{{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
{{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
{{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{{- "Do not use variables.\n\n" }}
{%- for t in tools %}
    {{- t | tojson(indent=4) }}
    {{- "\n\n" }}
{%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
{#- Extract the first user message so we can plug it in here #}
{%- if messages | length != 0 %}
    {%- set first_user_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
{{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
{{- "Given the following functions, please respond with a JSON for a function call " }}
{{- "with its proper arguments that best answers the given prompt.\n\n" }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{{- "Do not use variables.\n\n" }}
{%- for t in tools %}
    {{- t | tojson(indent=4) }}
    {{- "\n\n" }}
{%- endfor %}
{{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- elif message.role == "tool" or message.role == "ipython" %}
    {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
    {%- if message.content is mapping or message.content is iterable %}
        {{- message.content | tojson }}
    {%- else %}
        {{- message.content }}
    {%- endif %}
    {{- "<|eot_id|>" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

// Qwen2.5 Instruct (verbatim apart from the tool-call branches for assistant messages).
const QWEN25: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}
    {{- messages[0]['content'] }}
{%- else %}
    {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
{%- endif %}
{{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}
    {{- "\n" }}
    {{- tool | tojson }}
{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- elif message.role == "tool" %}
    {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
        {{- '<|im_start|>user' }}
    {%- endif %}
    {{- '\n<tool_response>\n' }}
    {{- message.content }}
    {{- '\n</tool_response>' }}
    {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

// Mistral 7B Instruct v0.1.
const MISTRAL: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

// Gemma (1/2) instruct.
const GEMMA: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

#[test]
fn llama31_renders_system_user_and_generation_prompt() {
    let t = ChatTemplate::new(LLAMA31, Some("<|begin_of_text|>".into()), None).unwrap();
    let out = t.render(&msgs(&[("system", "  Be brief. "), ("user", "Hi there\n")]), true).unwrap();
    let expected = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>\
<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>\
<|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_eq!(out, expected);
}

#[test]
fn llama31_tools_in_user_message_use_python_json_indent() {
    let t = ChatTemplate::new(LLAMA31, Some("<|begin_of_text|>".into()), None).unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert(
        "tools".into(),
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "Zürich <x>", "n": [1, 2.5]}}}]),
    );
    extra.insert("date_string".into(), json!("01 Jan 2025"));
    let out = t.render_with(&msgs(&[("user", "Weather?")]), false, &extra).unwrap();
    // serde_json without preserve_order sorts keys; tojson keeps what it is given.
    let tool = "{\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"parameters\": {\n            \"city\": \"Zürich <x>\",\n            \"n\": [\n                1,\n                2.5\n            ]\n        }\n    },\n    \"type\": \"function\"\n}";
    let tool_po = "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"parameters\": {\n            \"city\": \"Zürich <x>\",\n            \"n\": [\n                1,\n                2.5\n            ]\n        }\n    }\n}";
    assert!(out.contains("Environment: ipython\n"), "{out}");
    assert!(out.contains("Today Date: 01 Jan 2025"), "{out}");
    assert!(
        out.contains(&format!("{tool}\n\nWeather?<|eot_id|>"))
            || out.contains(&format!("{tool_po}\n\nWeather?<|eot_id|>")),
        "{out}"
    );
    // Without a user message after the system one, the template raises.
    let err = t.render_with(&msgs(&[("system", "S")]), false, &extra).unwrap_err();
    assert!(matches!(&err, TextError::TemplateRaised(m) if m.contains("no first user message")), "{err}");
}

#[test]
fn qwen25_chatml_default_system_and_tools() {
    let t = ChatTemplate::new(QWEN25, None, Some("<|im_end|>".into())).unwrap();
    let out = t.render(&msgs(&[("user", "Hello"), ("assistant", "Hi!"), ("user", "Bye")]), true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>\n\
<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
    let mut extra = serde_json::Map::new();
    extra.insert("tools".into(), json!([{"name": "f", "description": "say \"hi\" & <wave>", "parameters": {}}]));
    let out = t.render_with(&msgs(&[("system", "Sys"), ("user", "Q")]), false, &extra).unwrap();
    assert!(out.starts_with("<|im_start|>system\nSys\n\n# Tools\n"), "{out}");
    // Python json.dumps: ", " and ": " separators, no HTML escaping, quotes escaped.
    assert!(
        out.contains(
            "<tools>\n{\"description\": \"say \\\"hi\\\" & <wave>\", \"name\": \"f\", \"parameters\": {}}\n</tools>"
        ) || out.contains(
            "<tools>\n{\"name\": \"f\", \"description\": \"say \\\"hi\\\" & <wave>\", \"parameters\": {}}\n</tools>"
        ),
        "{out}"
    );
    assert!(out.ends_with("</tool_call><|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"), "{out}");
}

#[test]
fn mistral_alternation_and_raise_exception() {
    let t = ChatTemplate::new(MISTRAL, Some("<s>".into()), Some("</s>".into())).unwrap();
    let out = t.render(&msgs(&[("user", "A"), ("assistant", "B"), ("user", "C")]), true).unwrap();
    assert_eq!(out, "<s>[INST] A [/INST]B</s>[INST] C [/INST]");
    let err = t.render(&msgs(&[("user", "A"), ("user", "B")]), true).unwrap_err();
    match err {
        TextError::TemplateRaised(m) => {
            assert_eq!(m, "Conversation roles must alternate user/assistant/user/assistant/...")
        }
        other => panic!("expected a raised exception, got {other:?}"),
    }
}

#[test]
fn gemma_maps_assistant_to_model_and_rejects_system() {
    let t = ChatTemplate::new(GEMMA, Some("<bos>".into()), Some("<eos>".into())).unwrap();
    let out = t.render(&msgs(&[("user", " Hi "), ("assistant", "Hello\n")]), true).unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>model\n"
    );
    let err = t.render(&msgs(&[("system", "x")]), false).unwrap_err();
    assert!(matches!(err, TextError::TemplateRaised(ref m) if m == "System role not supported"));
}

#[test]
fn trim_blocks_lstrip_blocks_and_trailing_newline() {
    let src =
        "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    let t = ChatTemplate::new(src, None, None).unwrap();
    let out = t.render(&msgs(&[("user", "a"), ("user", "b")]), false).unwrap();
    // jinja2 (trim_blocks, lstrip_blocks) gives "U:a\nU:b\n"; the final newline of the
    // source is dropped (keep_trailing_newline=False).
    assert_eq!(out, "U:a\nU:b\n");
    let t = ChatTemplate::new("x\n", None, None).unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "x");
}

#[test]
fn tojson_matches_python_json_dumps() {
    let out =
        render_src(r#"{{ {"b": 1, "a": [true, none, 1.5, "é\n\"<&>'"], "c": {}} | tojson }}"#, json!({})).unwrap();
    assert_eq!(out, r#"{"b": 1, "a": [true, null, 1.5, "é\n\"<&>'"], "c": {}}"#);
    let out = render_src(r#"{{ x | tojson(indent=2) }}"#, json!({"x": {"k": [1, {}], "e": []}})).unwrap();
    assert!(
        out == "{\n  \"e\": [],\n  \"k\": [\n    1,\n    {}\n  ]\n}"
            || out == "{\n  \"k\": [\n    1,\n    {}\n  ],\n  \"e\": []\n}",
        "{out}"
    );
    let out =
        render_src(r#"{{ {"b": 1, "a": 2} | tojson(sort_keys=true, separators=(",", ":")) }}"#, json!({})).unwrap();
    assert_eq!(out, r#"{"a":2,"b":1}"#);
    let out = render_src(r#"{{ "é😀\u0001" | tojson(ensure_ascii=true) }}"#, json!({})).unwrap();
    assert_eq!(out, r#""\u00e9\ud83d\ude00\u0001""#);
    let out = render_src(r#"{{ [1e16, 0.0001, 1e-05, 123.0, -0.5, 1e100] | tojson }}"#, json!({})).unwrap();
    assert_eq!(out, "[1e+16, 0.0001, 1e-05, 123.0, -0.5, 1e+100]");
    assert!(render_src("{{ nothing | tojson }}", json!({})).is_err());
}

#[test]
fn printing_values_follows_python_str() {
    let out = render_src(
        "{{ none }}|{{ true }}|{{ 2.5 }}|{{ 1e20 }}|{{ ['a', \"it's\", 1] }}|{{ {'k': none} }}|{{ missing }}",
        json!({}),
    )
    .unwrap();
    assert_eq!(out, "None|True|2.5|1e+20|['a', \"it's\", 1]|{'k': None}|");
}

#[test]
fn pycompat_methods_loop_and_namespace() {
    let src = "{% set ns = namespace(n=0, last='') %}\
{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.content.strip().upper() %}\
{% if loop.last %}{{ loop.index }}/{{ loop.length }}{% endif %}{% endfor %}\
|{{ ns.n }}|{{ ns.last }}|{{ 'a,b'.split(',') | join('+') }}|{{ 'Hello'.startswith('He') }}\
|{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }};{% endfor %}\
|{{ messages[-1]['content'] }}|{{ 'abc'.endswith('bc') }}|{{ 'x y'.replace(' ', '_') }}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    let out = t.render(&msgs(&[("user", " one "), ("user", " two ")]), false).unwrap();
    assert_eq!(out, "2/2|2|TWO|a+b|True|x=1;y=2;| two |True|x_y");
}

#[test]
fn loop_controls_work() {
    let src = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{% if m.content == 'stop' %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    let out = t.render(&msgs(&[("system", "s"), ("user", "a"), ("user", "stop"), ("user", "b")]), false).unwrap();
    assert_eq!(out, "a");
}

#[test]
fn strftime_now_formats_the_current_date() {
    let out = render_src("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('short') }}", json!({})).unwrap();
    let (date, literal) = out.split_once('|').unwrap();
    assert_eq!(literal, "short");
    let parts: Vec<&str> = date.split('-').collect();
    assert_eq!(parts.len(), 3, "{out}");
    let year: i32 = parts[0].parse().unwrap();
    assert!(year >= 2024, "{out}");
    assert_eq!(parts[1].len(), 2);
}

#[test]
fn context_has_tools_none_and_special_tokens() {
    let t = ChatTemplate::new(
        "{{ tools is none }}|{{ documents is none }}|{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ add_generation_prompt }}",
        Some("<s>".into()),
        Some("</s>".into()),
    )
    .unwrap()
    .with_special_token("unk_token", "<unk>".into());
    assert_eq!(t.render(&[], true).unwrap(), "True|True|<s>|</s>|<unk>|True");
    let t = ChatTemplate::new("[{{ bos_token }}]{{ bos_token is defined }}", None, None).unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "[]False");
}

#[test]
fn extra_cannot_override_messages() {
    let t = ChatTemplate::new("{{ messages | length }}{{ enable_thinking }}", None, None).unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert("messages".into(), json!([1, 2, 3]));
    extra.insert("enable_thinking".into(), json!(false));
    assert_eq!(t.render_with(&msgs(&[("user", "x")]), false, &extra).unwrap(), "1False");
}

#[test]
fn syntax_and_render_errors_are_reported() {
    let err = ChatTemplate::new("{% for x in %}", None, None).unwrap_err();
    assert!(matches!(err, TextError::TemplateSyntax(_)), "{err:?}");
    let t = ChatTemplate::new("{{ messages[0].content.nope.deeper }}", None, None).unwrap();
    let err = t.render(&msgs(&[("user", "x")]), false).unwrap_err();
    assert!(matches!(err, TextError::TemplateRender(_)), "{err:?}");
    assert!(!err.is_client_error());
}

/// A template that renders a plain chat but fails on what a request sent is the
/// request's fault (a 400); one that fails on every chat is the model's (a 500).
#[test]
fn a_render_error_only_this_conversation_meets_is_the_requests_fault() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ m.content.nope.deeper }}{% endif %}{{ m.content }}{% endfor %}",
        None,
        None,
    )
    .unwrap();
    assert!(t.renders_plain_chat());
    assert_eq!(t.render(&msgs(&[("user", "x")]), false).unwrap(), "x");
    let err = t.render(&msgs(&[("user", "x"), ("tool", "y")]), false).unwrap_err();
    assert!(matches!(err, TextError::TemplateConversation(_)), "{err:?}");
    assert!(err.is_client_error());
    assert!(err.to_string().contains("cannot render this conversation"), "{err}");
    // Alone, the same message still fails on the request.
    let err = t.render(&msgs(&[("tool", "y")]), false).unwrap_err();
    assert!(matches!(err, TextError::TemplateConversation(_)), "{err:?}");

    let broken = ChatTemplate::new("{{ messages[0].content.nope.deeper }}", None, None).unwrap();
    assert!(!broken.renders_plain_chat());
    let err = broken.render(&msgs(&[("user", "x"), ("assistant", "y")]), false).unwrap_err();
    assert!(matches!(err, TextError::TemplateRender(_)), "{err:?}");
}

#[test]
fn generation_tags_are_accepted() {
    let src = "{% for m in messages %}{% if m.role == 'assistant' %}{%- generation %}{{ m.content }}{% endgeneration -%}{% else %}{{ m.content }}{% endif %}\n{% endfor %}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    let out = t.render(&msgs(&[("user", "u"), ("assistant", "a")]), false).unwrap();
    // jinja2 with transformers' AssistantTracker gives "ua" (trim_blocks eats the
    // newline after `{% endif %}`).
    assert_eq!(out, "ua");
    assert_eq!(strip_generation_tags("{%- generation -%}x{% endgeneration %}"), "{%- if true -%}x{% endif %}");
    assert_eq!(strip_generation_tags("{% if a %}{{ '%}' }}"), "{% if a %}{{ '%}' }}");
}

#[test]
fn python_float_repr() {
    assert_eq!(py_float_repr(1.0, false), "1.0");
    assert_eq!(py_float_repr(0.1, false), "0.1");
    assert_eq!(py_float_repr(1e15, false), "1000000000000000.0");
    assert_eq!(py_float_repr(1e16, false), "1e+16");
    assert_eq!(py_float_repr(1.5e16, false), "1.5e+16");
    assert_eq!(py_float_repr(0.0001, false), "0.0001");
    assert_eq!(py_float_repr(0.00012, false), "0.00012");
    assert_eq!(py_float_repr(1e-5, false), "1e-05");
    assert_eq!(py_float_repr(-2.5e-7, false), "-2.5e-07");
    assert_eq!(py_float_repr(123456.789, false), "123456.789");
    assert_eq!(py_float_repr(-0.0, false), "-0.0");
    assert_eq!(py_float_repr(f64::NAN, true), "NaN");
    assert_eq!(py_float_repr(f64::NEG_INFINITY, true), "-Infinity");
    assert_eq!(py_float_repr(f64::INFINITY, false), "inf");
}

#[test]
fn python_quote_picks_quotes_like_repr() {
    assert_eq!(py_quote("a"), "'a'");
    assert_eq!(py_quote("it's"), "\"it's\"");
    assert_eq!(py_quote("'\""), "'\\'\"'");
    assert_eq!(py_quote("a\nb\\"), "'a\\nb\\\\'");
    assert_eq!(py_quote("\u{1}"), "'\\x01'");
}

#[test]
fn json_dumps_helper_is_compact_python_style() {
    let v = json!({"a": [1, "x", 0.5, null]});
    assert_eq!(python_json_dumps(&v).unwrap(), r#"{"a": [1, "x", 0.5, null]}"#);
    // Hostile nesting is an error, not a stack overflow.
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    assert!(json_to_value(&deep, 0).is_err());
}
