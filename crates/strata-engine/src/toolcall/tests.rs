use super::*;
use serde_json::json;

fn tools() -> Vec<Value> {
    vec![json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string"}}}}})]
}

/// Feeds `text` in pieces of `step` bytes (on char boundaries) and collects the events.
fn run(format: ToolFormat, text: &str, step: usize) -> Vec<ToolEvent> {
    feed(ToolCallParser::new(format, &tools(), 7), text, step)
}

fn feed(mut p: ToolCallParser, text: &str, step: usize) -> Vec<ToolEvent> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let mut j = (i + step).min(text.len());
        while !text.is_char_boundary(j) {
            j += 1;
        }
        out.extend(p.push(&text[i..j]));
        i = j;
    }
    out.extend(p.finish());
    out
}

/// Content text and whole calls (name, parsed arguments) from events, checking that the
/// streamed fragments add up to each call's arguments and that Begin comes first.
fn settle(events: &[ToolEvent]) -> (String, Vec<(String, Value)>) {
    let mut text = String::new();
    let mut streamed: Vec<(String, String)> = Vec::new();
    let mut calls = Vec::new();
    for e in events {
        match e {
            ToolEvent::Text(t) => text.push_str(t),
            ToolEvent::Begin { index, name, id } => {
                assert_eq!(*index, streamed.len());
                assert!(!id.is_empty());
                streamed.push((name.clone(), String::new()));
            }
            ToolEvent::Args { index, fragment } => streamed[*index].1.push_str(fragment),
            ToolEvent::End { index, call } => {
                assert_eq!(streamed[*index].1, call.arguments, "fragments add up to the arguments");
                assert_eq!(streamed[*index].0, call.name);
                calls.push((call.name.clone(), serde_json::from_str(&call.arguments).unwrap()));
            }
        }
    }
    assert_eq!(calls.len(), streamed.len(), "every begun call ended");
    (text, calls)
}

fn check(format: ToolFormat, text: &str, want_text: &str, want: &[(&str, Value)]) {
    for step in [1, 2, 3, 5, 8, 1000] {
        let events = run(format, text, step);
        let (got_text, calls) = settle(&events);
        assert_eq!(got_text, want_text, "{format:?} step {step}: content");
        let want: Vec<(String, Value)> = want.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
        assert_eq!(calls, want, "{format:?} step {step}: calls");
    }
}

#[test]
fn detects_formats_from_real_template_fragments() {
    assert_eq!(
        ToolFormat::detect(
            "<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>"
        ),
        ToolFormat::Hermes
    );
    assert_eq!(
        ToolFormat::detect("<tool_call>\n<function=' + tool_call.name + '>\n<parameter=' + k"),
        ToolFormat::QwenXml
    );
    assert_eq!(ToolFormat::detect("{{- '[TOOL_CALLS]' }}"), ToolFormat::Mistral);
    assert_eq!(
        ToolFormat::detect(
            "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name"
        ),
        ToolFormat::Llama3
    );
    assert_eq!(ToolFormat::detect("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolFormat::Generic);
    // DeepSeek-V3.1 and R1, Kimi-K2, GLM-4.5/4.6 as their templates write a call.
    assert_eq!(
        ToolFormat::detect(
            "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>'"
        ),
        ToolFormat::DeepSeek
    );
    assert_eq!(
        ToolFormat::detect("{{- '<|tool_calls_section_begin|>' -}}{%- for tool_call in message['tool_calls'] -%}"),
        ToolFormat::Kimi
    );
    assert_eq!(
        ToolFormat::detect(
            "{{ '\n<tool_call>' + tc.name }}{% for k, v in _args.items() %}\n<arg_key>{{ k }}</arg_key>"
        ),
        ToolFormat::Glm
    );
    // gpt-oss: harmony messages, a call addressed in the header.
    assert_eq!(
        ToolFormat::detect(
            "{{- \"<|start|>assistant to=\" }}{{- \"functions.\" + tool_call.name + \"<|channel|>commentary \" }}{{- \"<|message|>\" }}"
        ),
        ToolFormat::Harmony
    );
}

/// DeepSeek-V3.1's calls: `NAME<｜tool▁sep｜>{json}` inside a section of calls.
const DEEPSEEK_TWO: &str = "Checking both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

#[test]
fn deepseek_calls_in_both_shapes() {
    let both = [("get_weather", json!({"city": "Paris", "days": 2})), ("get_weather", json!({"city": "Rome"}))];
    check(ToolFormat::DeepSeek, DEEPSEEK_TWO, "Checking both.", &both);
    // R1 (and V3): `function<｜tool▁sep｜>NAME`, the arguments in a json code block.
    let r1 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Rome\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    check(ToolFormat::DeepSeek, r1, "", &both);
    // Arguments that are not an object, or a name with markup in it, are content.
    let bad = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>[1, 2]<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    check(ToolFormat::DeepSeek, bad, bad, &[]);
    // Text after the calls without the closing marker: the calls stand, the text is content.
    let open = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜> done";
    check(ToolFormat::DeepSeek, open, " done", &[("get_weather", json!({"city": "Rome"}))]);
}

#[test]
fn kimi_calls_carry_their_index_in_the_id_and_parse_to_the_name() {
    let out = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Rome\", \"unit\": \"celsius\"}<|tool_call_end|><|tool_calls_section_end|>";
    check(
        ToolFormat::Kimi,
        out,
        "",
        &[("get_weather", json!({"city": "Paris"})), ("get_weather", json!({"city": "Rome", "unit": "celsius"}))],
    );
    // A call id on its own line before the argument marker is not Kimi's format.
    let bad = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0\nhello<|tool_call_end|>";
    check(ToolFormat::Kimi, bad, bad, &[]);
}

#[test]
fn glm_arguments_follow_the_schema() {
    let out = "<think>Two cities.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>1984</arg_value>\n</tool_call>";
    check(
        ToolFormat::Glm,
        out,
        "<think>Two cities.</think>\n\n",
        &[("get_weather", json!({"city": "Paris", "days": 3})), ("get_weather", json!({"city": "1984"}))],
    );
    // A call without arguments, and a value with a `<` in it.
    check(ToolFormat::Glm, "<tool_call>get_weather\n</tool_call>", "", &[("get_weather", json!({}))]);
    check(
        ToolFormat::Glm,
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>a<b</arg_value></tool_call>",
        "",
        &[("get_weather", json!({"city": "a<b"}))],
    );
    // A tool the request did not declare: values are JSON where they parse.
    check(
        ToolFormat::Glm,
        "<tool_call>other\n<arg_key>n</arg_key>\n<arg_value>[1, 2]</arg_value>\n<arg_key>s</arg_key>\n<arg_value>x y</arg_value>\n</tool_call>",
        "",
        &[("other", json!({"n": [1, 2], "s": "x y"}))],
    );
    check(ToolFormat::Glm, "<tool_call>\n{\"name\": 1}</tool_call>", "<tool_call>\n{\"name\": 1}</tool_call>", &[]);
}

#[test]
fn hermes_calls_stream_with_text_around() {
    let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    check(
        ToolFormat::Hermes,
        out,
        "Let me check.\n\n",
        &[("get_weather", json!({"city": "Paris", "days": 2})), ("get_weather", json!({"city": "Rome"}))],
    );
    // Plain text with a `<` that is not a call passes through whole.
    check(ToolFormat::Hermes, "a < b and <tool> stays", "a < b and <tool> stays", &[]);
    // A broken call is content.
    check(ToolFormat::Hermes, "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", &[]);
    // Cut off at the end of the call, before the end tag: the call stands.
    check(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}",
        "",
        &[("get_weather", json!({}))],
    );
}

#[test]
fn hermes_arguments_stream_before_the_call_ends() {
    let mut p = ToolCallParser::new(ToolFormat::Hermes, &tools(), 1);
    let mut ev = p.push("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa");
    assert!(matches!(&ev[0], ToolEvent::Begin { index: 0, name, .. } if name == "get_weather"), "{ev:?}");
    assert_eq!(ev[1], ToolEvent::Args { index: 0, fragment: "{\"city\": \"Pa".into() });
    ev = p.push("ris\"}}\n</tool_call>");
    assert_eq!(ev[0], ToolEvent::Args { index: 0, fragment: "ris\"}".into() });
    assert!(matches!(&ev[1], ToolEvent::End { index: 0, call } if call.arguments == "{\"city\": \"Paris\"}"));
    assert_eq!(p.calls().len(), 1);
}

#[test]
fn qwen_xml_values_follow_the_schema() {
    let out = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    check(ToolFormat::QwenXml, out, "", &[("get_weather", json!({"city": "Paris", "days": 3}))]);
    // A number-looking string stays a string when the schema says string.
    let out = "<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n</function>\n</tool_call>";
    check(ToolFormat::QwenXml, out, "", &[("get_weather", json!({"city": "1984"}))]);
}

#[test]
fn llama3_reply_is_the_call() {
    let out = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    check(ToolFormat::Llama3, out, "", &[("get_weather", json!({"city": "Paris"}))]);
    check(ToolFormat::Llama3, &format!("<|python_tag|>{out}"), "", &[("get_weather", json!({"city": "Paris"}))]);
    check(ToolFormat::Llama3, "The weather is {nice}.", "The weather is {nice}.", &[]);
    check(ToolFormat::Llama3, "{\"answer\": 42}", "{\"answer\": 42}", &[]);
}

#[test]
fn mistral_both_shapes() {
    let nemo = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123xyz\"}]";
    check(ToolFormat::Mistral, nemo, "", &[("get_weather", json!({"city": "Paris"}))]);
    let small = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}";
    check(
        ToolFormat::Mistral,
        small,
        "",
        &[("get_weather", json!({"city": "Paris", "unit": "celsius"})), ("get_weather", json!({"city": "Rome"}))],
    );
    let events = run(ToolFormat::Mistral, small, 1000);
    for e in events {
        if let ToolEvent::Begin { id, .. } = e {
            assert_eq!(id.len(), 9, "Mistral's templates want nine-character ids: {id}");
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }
}

#[test]
fn generic_json_forms() {
    let out = "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]}";
    check(
        ToolFormat::Generic,
        out,
        "",
        &[("get_weather", json!({"city": "Paris"})), ("get_weather", json!({"city": "Rome"}))],
    );
    check(ToolFormat::Generic, "  Hello there", "  Hello there", &[]);
    // Arguments given as a JSON string are unpacked.
    check(
        ToolFormat::Generic,
        "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}",
        "",
        &[("get_weather", json!({"city": "Oslo"}))],
    );
    // Cut inside its first call, the wrapper is neither a call nor content.
    check(ToolFormat::Generic, "{\"tool_calls\": [{\"name\": \"get_", "", &[]);
    // An unfinished object that never looked like a call is content.
    check(ToolFormat::Generic, "{\"answer\": 4", "{\"answer\": 4", &[]);
    check(ToolFormat::Generic, "{\"name\": 4", "{\"name\": 4", &[]);
}

/// Feeds all of `text` and finishes: the events, the calls and whether a call was cut.
fn cut_at(format: ToolFormat, text: &str) -> (String, Vec<(String, Value)>, bool) {
    let mut p = ToolCallParser::new(format, &tools(), 3);
    let mut events = p.push(text);
    events.extend(p.finish());
    let (content, _) = settle_begun(&events);
    let calls = p.calls().iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect();
    (content, calls, p.cut())
}

/// Content text and the number of calls begun (a cut call begins and never ends).
fn settle_begun(events: &[ToolEvent]) -> (String, usize) {
    let text = events.iter().filter_map(|e| if let ToolEvent::Text(t) = e { Some(t.as_str()) } else { None }).collect();
    (text, events.iter().filter(|e| matches!(e, ToolEvent::Begin { .. })).count())
}

#[test]
fn a_cut_keeps_the_complete_calls_in_every_format() {
    let paris = || ("get_weather".to_string(), json!({"city": "Paris"}));
    // A call whose end tag the limit cut stands.
    let (text, calls, cut) = cut_at(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_",
    );
    assert_eq!((text.as_str(), calls, cut), ("", vec![paris()], false));
    let cases: &[(ToolFormat, &str, &str)] = &[
        // (format, one complete call, the start of a second one)
        (
            ToolFormat::Generic,
            "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            ", {\"name\": \"get_weather\", \"arguments\": {\"ci",
        ),
        (
            ToolFormat::Llama3,
            "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            ", {\"name\": \"get_we",
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ro",
        ),
        (
            ToolFormat::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
            "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRo",
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            ", {\"name\": \"get_weather\", \"argu",
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
            "[TOOL_CALLS]get_weather[ARGS]{\"ci",
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"ci",
        ),
        (
            ToolFormat::Kimi,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>",
            "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"ci",
        ),
        (
            ToolFormat::Glm,
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
            "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Ro",
        ),
    ];
    for &(format, first, second) in cases {
        // Cut after the complete call (only closing brackets missing): it stands, and
        // no call was cut.
        let (text, calls, cut) = cut_at(format, first);
        assert_eq!((text.trim(), calls.clone(), cut), ("", vec![paris()], false), "{format:?}: {first}");
        // Cut inside the second: the first stands, the second is dropped, nothing is
        // content.
        let whole = format!("{first}{second}");
        let (text, calls, cut) = cut_at(format, &whole);
        assert_eq!((text.trim(), calls, cut), ("", vec![paris()], true), "{format:?}: {whole}");
        // Cut inside the first: no calls, still no content.
        let short = &first[..first.find("Paris").unwrap() + 2];
        let (text, calls, cut) = cut_at(format, short);
        assert_eq!((text.trim(), calls.len(), cut), ("", 0, true), "{format:?}: {short}");
    }
}

#[test]
fn generic_wrapper_calls_stream_as_they_generate() {
    let mut p = ToolCallParser::new(ToolFormat::Generic, &tools(), 1);
    let ev = p.push("{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa");
    assert!(matches!(&ev[0], ToolEvent::Begin { index: 0, name, .. } if name == "get_weather"), "{ev:?}");
    assert_eq!(ev[1], ToolEvent::Args { index: 0, fragment: "{\"city\": \"Pa".into() });
    let ev = p.push("ris\"}}, {\"name\": \"get_weather\", \"arguments\": {");
    assert_eq!(ev[0], ToolEvent::Args { index: 0, fragment: "ris\"}".into() });
    assert!(matches!(&ev[1], ToolEvent::End { index: 0, call } if call.arguments == "{\"city\": \"Paris\"}"));
    assert!(matches!(&ev[2], ToolEvent::Begin { index: 1, .. }), "{ev:?}");
    assert_eq!(p.calls().len(), 1, "the second call is not complete");
    let ev = p.push("\"city\": \"Rome\"}}]}");
    assert!(matches!(ev.last(), Some(ToolEvent::End { index: 1, .. })), "{ev:?}");
    assert!(p.finish().is_empty());
    assert_eq!((p.calls().len(), p.cut()), (2, false));
}

#[test]
fn ids_are_unique_within_a_reply() {
    let out = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    let ids: Vec<String> = run(ToolFormat::Hermes, out, 4)
        .into_iter()
        .filter_map(|e| match e {
            ToolEvent::Begin { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn a_single_call_parser_ends_the_reply_at_its_first_call() {
    let paris = ("get_weather", json!({"city": "Paris"}));
    let replies = [
        (
            ToolFormat::Hermes,
            "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call> and text",
            "Sure.",
        ),
        (
            ToolFormat::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
            "",
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
            "",
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}",
            "",
        ),
        (
            ToolFormat::Generic,
            "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]}",
            "",
        ),
        (
            ToolFormat::Llama3,
            "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}]",
            "",
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "",
        ),
        (
            ToolFormat::Kimi,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Rome\"}<|tool_call_end|><|tool_calls_section_end|>",
            "",
        ),
        (
            ToolFormat::Glm,
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>",
            "",
        ),
    ];
    for (format, reply, want_text) in replies {
        // Both calls without the limit: the reply makes two.
        assert_eq!(settle(&run(format, reply, 1000)).1.len(), 2, "{format:?}: {reply}");
        for step in [1, 3, 7, 1000] {
            let (text, calls) = settle(&feed(ToolCallParser::new(format, &tools(), 7).single(), reply, step));
            assert_eq!(
                (text.as_str(), calls),
                (want_text, vec![(paris.0.to_string(), paris.1.clone())]),
                "{format:?} step {step}"
            );
        }
        // It closes as the first call ends, before the second has begun.
        let mut p = ToolCallParser::new(format, &tools(), 7).single();
        let mut closed_at = None;
        for (i, c) in reply.char_indices() {
            p.push(&c.to_string());
            if p.closed() {
                closed_at = Some(i);
                break;
            }
        }
        let at = closed_at.unwrap_or_else(|| panic!("{format:?}: never closed"));
        assert!(!reply[..=at].contains("Rome"), "{format:?}: closed at {at}, after the second call began");
        assert!(p.finish().is_empty());
        assert_eq!((p.calls().len(), p.cut()), (1, false), "{format:?}");
    }
}
