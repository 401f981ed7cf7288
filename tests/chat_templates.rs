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

const FIXTURE: &str = include_str!("fixtures/templates/renders.json");

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
    assert!(failures.is_empty(), "{} of {compared} renders differ:\n{}", failures.len(), failures.join("\n"));
}
