//! Chat templates render as transformers renders them: every template llama.cpp ships
//! (vendor/llama.cpp/models/templates in the llama-cpp-python sdist, read at test time and
//! never committed) over the conversations of tools/make_template_fixtures.py, against
//! transformers' renders in tests/fixtures/templates/renders.json. Where transformers
//! fails, Strata must fail too (with a 4xx-kind or render error, never a panic).
//!
//! tools/llamacpp_vocab.sh downloads the sdist and runs this with
//! STRATA_LLAMACPP_TEMPLATES_DIR set; without it the test says so and passes.

use serde_json::Value;
use strata::engine::template::ChatTemplate;

const FIXTURE: &str = include_str!("../fixtures/templates/renders.json");

/// Where jinja2 fails and minijinja renders, and that is kept: iterating over `None`
/// (minijinja iterates it as empty), and `tojson` of a `map(...)` result (a generator in
/// jinja2, a list in minijinja).
const LENIENT: [&str; 2] = ["'NoneType' object is not iterable", "Object of type generator is not JSON serializable"];

/// Renders that differ, on purpose. functionary v3.1 writes `"..."|safe + tool | tojson`;
/// jinja2's `Markup + str` HTML-escapes the JSON (`&#34;name&#34;`), which is the
/// template's bug, not a prompt the model saw in training. minijinja concatenates plainly.
const KNOWN_DIFFERENCES: [(&str, &str); 1] = [("meetkai-functionary-medium-v3.1.jinja", "&#34;")];

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn templates_render_as_transformers_does() {
    let Some(dir) = std::env::var_os("STRATA_LLAMACPP_TEMPLATES_DIR") else {
        eprintln!("STRATA_LLAMACPP_TEMPLATES_DIR is not set: skipped (tools/llamacpp_vocab.sh runs it)");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let now = fixture["fixed_now_unix"].as_i64().unwrap();
    let cases = fixture["cases"].as_object().unwrap();
    let templates = fixture["templates"].as_object().unwrap();
    assert!(templates.len() >= 70, "the fixture covers {} templates", templates.len());
    let mut failures = Vec::new();
    let mut compared = 0;
    for (name, entry) in templates {
        let path = dir.join(name);
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(sha256_hex(source.as_bytes()), entry["sha256"], "{name} differs from the fixture's; regenerate it");
        let template = match ChatTemplate::new(&source, Some("<s>".into()), Some("</s>".into())) {
            Ok(t) => t.with_fixed_now(now),
            Err(e) => {
                failures.push(format!("{name}: does not compile: {e}"));
                continue;
            }
        };
        for (case_name, case) in cases {
            let messages: Vec<Value> = case["messages"].as_array().unwrap().clone();
            let mut extra = case.get("extra").and_then(Value::as_object).cloned().unwrap_or_default();
            if let Some(tools) = case.get("tools") {
                extra.insert("tools".into(), tools.clone());
            }
            let add_generation_prompt = case.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(true);
            let want = &entry["renders"][case_name];
            let got = template.render_json(&messages, add_generation_prompt, &extra);
            compared += 1;
            match (want.get("text").and_then(Value::as_str), got) {
                (Some(w), Ok(g)) if w == g => {}
                (Some(w), Ok(_)) if KNOWN_DIFFERENCES.iter().any(|(n, mark)| n == name && w.contains(mark)) => {}
                (Some(w), Ok(g)) => {
                    let at = w.bytes().zip(g.bytes()).take_while(|(a, b)| a == b).count();
                    let from = at.saturating_sub(60);
                    let snip =
                        |s: &str| s.get(from..(at + 60).min(s.len())).unwrap_or("<non-char boundary>").to_string();
                    failures.push(format!(
                        "{name} / {case_name}: differs at byte {at}:\n  transformers: {:?}\n  strata:       {:?}",
                        snip(w),
                        snip(&g)
                    ));
                }
                (Some(_), Err(e)) => failures.push(format!("{name} / {case_name}: strata failed: {e}")),
                (None, Ok(_)) if LENIENT.iter().any(|m| want["error"].as_str().unwrap_or("").contains(m)) => {}
                (None, Ok(_)) => failures.push(format!(
                    "{name} / {case_name}: transformers failed ({}), strata rendered",
                    want["error"].as_str().unwrap_or("?")
                )),
                (None, Err(_)) => {}
            }
        }
    }
    eprintln!("{compared} renders compared over {} templates", templates.len());
    // The tool-call format read from each real template.
    use strata::engine::toolcall::ToolFormat;
    for (name, want) in [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::Hermes),
        ("Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes),
        ("Qwen-QwQ-32B.jinja", ToolFormat::Hermes),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolFormat::Hermes),
        ("ibm-granite-granite-4.0.jinja", ToolFormat::Hermes),
        ("Qwen3-Coder.jinja", ToolFormat::QwenXml),
        ("Qwen3.5-4B.jinja", ToolFormat::QwenXml),
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", ToolFormat::QwenXml),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::Llama3),
        ("meta-llama-Llama-3.3-70B-Instruct.jinja", ToolFormat::Llama3),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::Mistral),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolFormat::Mistral),
        ("unsloth-mistral-Devstral-Small-2507.jinja", ToolFormat::Mistral),
        ("google-gemma-2-2b-it.jinja", ToolFormat::Generic),
        ("openai-gpt-oss-120b.jinja", ToolFormat::Harmony),
    ] {
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(ToolFormat::detect(&source), want, "{name}");
    }
    assert!(failures.is_empty(), "{} of {compared} renders differ:\n{}", failures.len(), failures.join("\n"));
}

/// The tool calls that transformers rendered into assistant turns (the fixture's
/// `two_calls_empty_content` and `tool_round_trip` conversations) parse back into the
/// same calls, in the format detected from each template: the real output shapes.
#[test]
fn rendered_tool_calls_parse_back() {
    use strata::engine::toolcall::{ToolCallParser, ToolEvent, ToolFormat};
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let paris = serde_json::json!({"city": "Paris", "unit": "celsius"});
    let rome = serde_json::json!({"city": "Rome"});
    let two = "two_calls_empty_content";
    let chatml = ("Paris and Rome?<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>");
    // (template, conversation, (text before the reply, text after it), format, calls)
    type Case<'a> = (&'a str, &'a str, (&'a str, &'a str), ToolFormat, Vec<&'a Value>);
    let cases: [Case; 9] = [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", two, chatml, ToolFormat::Hermes, vec![&paris, &rome]),
        ("Qwen-Qwen3-0.6B.jinja", two, chatml, ToolFormat::Hermes, vec![&paris, &rome]),
        ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", two, chatml, ToolFormat::Hermes, vec![&paris, &rome]),
        ("Qwen3-Coder.jinja", two, chatml, ToolFormat::QwenXml, vec![&paris, &rome]),
        (
            "ibm-granite-granite-4.0.jinja",
            two,
            ("Paris and Rome?<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>", "<|end_of_text|>"),
            ToolFormat::Hermes,
            vec![&paris, &rome],
        ),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "tool_round_trip",
            ("in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
            ToolFormat::Llama3,
            vec![&paris],
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            two,
            ("Paris and Rome?[/INST]", "</s>"),
            ToolFormat::Mistral,
            vec![&paris, &rome],
        ),
        (
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            two,
            ("Paris and Rome?[/INST]", "</s>"),
            ToolFormat::Mistral,
            vec![&paris, &rome],
        ),
        (
            "unsloth-mistral-Devstral-Small-2507.jinja",
            two,
            ("Paris and Rome?[/INST]", "</s>"),
            ToolFormat::Mistral,
            vec![&paris, &rome],
        ),
    ];
    for (name, case, (after, before), format, want) in cases {
        let text =
            fixture["templates"][name]["renders"][case]["text"].as_str().unwrap_or_else(|| panic!("{name} {case}"));
        let start = text.find(after).unwrap_or_else(|| panic!("{name}: no {after:?}")) + after.len();
        let end = start + text[start..].find(before).unwrap();
        let reply = &text[start..end];
        let mut parser = ToolCallParser::new(format, &[], 1);
        let mut events = Vec::new();
        for ch in reply.chars() {
            events.extend(parser.push(&ch.to_string()));
        }
        events.extend(parser.finish());
        let calls: Vec<Value> = events
            .iter()
            .filter_map(|e| match e {
                ToolEvent::End { call, .. } => {
                    assert_eq!(call.name, "get_weather", "{name}");
                    Some(serde_json::from_str(&call.arguments).unwrap())
                }
                _ => None,
            })
            .collect();
        let content: String = events
            .iter()
            .filter_map(|e| match e {
                ToolEvent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(calls.iter().collect::<Vec<_>>(), want, "{name}: calls parsed from {reply:?}");
        assert!(content.trim().is_empty(), "{name}: content {content:?}");
    }
}

/// gpt-oss's template, committed (tests/fixtures/templates/openai-gpt-oss-120b.jinja, the
/// sdist's file, its sha256 the fixture's): every conversation renders as transformers
/// rendered it, harmony's markers included; `reasoning_effort` reaches its system
/// message; and the call it writes into the history parses back as that call.
#[test]
fn gpt_oss_renders_as_transformers_does_and_its_calls_parse_back() {
    use strata::engine::toolcall::harmony::Part;
    use strata::engine::toolcall::{HarmonyParser, ToolEvent, ToolFormat};
    const NAME: &str = "openai-gpt-oss-120b.jinja";
    let source = include_str!("../fixtures/templates/openai-gpt-oss-120b.jinja");
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let entry = &fixture["templates"][NAME];
    assert_eq!(sha256_hex(source.as_bytes()), entry["sha256"]);
    assert_eq!(ToolFormat::detect(source), ToolFormat::Harmony);
    let now = fixture["fixed_now_unix"].as_i64().unwrap();
    let template = ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into())).unwrap().with_fixed_now(now);
    let render = |case: &Value, vars: &serde_json::Map<String, Value>| {
        let mut extra = case.get("extra").and_then(Value::as_object).cloned().unwrap_or_default();
        if let Some(tools) = case.get("tools") {
            extra.insert("tools".into(), tools.clone());
        }
        extra.extend(vars.clone());
        let add = case.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(true);
        template.render_json(case["messages"].as_array().unwrap(), add, &extra)
    };
    let mut rendered = 0;
    for (case_name, case) in fixture["cases"].as_object().unwrap() {
        let want = &entry["renders"][case_name];
        match (want["text"].as_str(), render(case, &serde_json::Map::new())) {
            (Some(w), Ok(g)) => {
                assert_eq!(g, w, "{case_name}");
                rendered += 1;
            }
            (None, got) => assert!(got.is_err(), "{case_name}: transformers failed, strata rendered"),
            (Some(_), Err(e)) => panic!("{case_name}: {e}"),
        }
    }
    assert!(rendered >= 6, "{rendered}");
    let chat = &fixture["cases"]["chat"];
    let want = entry["renders"]["chat"]["text"].as_str().unwrap();
    for level in ["low", "high"] {
        let vars = serde_json::json!({"reasoning_effort": level}).as_object().unwrap().clone();
        assert_eq!(render(chat, &vars).unwrap(), want.replace("Reasoning: medium", &format!("Reasoning: {level}")));
    }

    let text = entry["renders"]["two_calls_empty_content"]["text"].as_str().unwrap();
    let after = "Weather in Paris and Rome?<|end|><|start|>assistant";
    let start = text.find(after).unwrap() + after.len();
    let end = start + text[start..].find("<|start|>functions.").unwrap();
    let mut parser = HarmonyParser::new(true, 1);
    let mut parts = Vec::new();
    for ch in text[start..end].chars() {
        parts.extend(parser.push(&ch.to_string()));
    }
    parts.extend(parser.finish());
    let calls: Vec<(String, Value)> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Tool(ToolEvent::End { call, .. }) => {
                Some((call.name.clone(), serde_json::from_str(&call.arguments).unwrap()))
            }
            Part::Tool(ToolEvent::Text(t)) => panic!("content {t:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(calls, [("get_weather".to_string(), serde_json::json!({"city": "Paris", "unit": "celsius"}))]);
    assert!(parser.closed(), "<|call|> ends the reply");
}
