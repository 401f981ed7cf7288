//! Structured output end to end: generation under a JSON schema, a JSON object or a Lark
//! grammar on the llama3 fixture model (random weights, made by
//! `tools/make_fixtures.py`), greedy and sampled, alone and batched with an
//! unconstrained sequence; and, when `STRATA_SMOLLM2` names the SmolLM2-135M-Instruct
//! GGUF, on a real model.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{Value, json};
use strata::engine::batch::Session;
use strata::engine::grammar::{Constraint, GrammarSpec};
use strata::engine::sampler::SamplingParams;
use strata::engine::session::{
    Engine, FinishReason, GenerateError, GenerateRequest, GenerationSummary, RunOptions, TokenEvent,
};
use strata::engine::template::ChatMessage;

use crate::support::steps::{self, Trace};

const CHUNK: usize = 16;

/// The repository: where this was built, or the working directory (a copy elsewhere).
fn root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match built.join("tests/fixtures").exists() {
        true => built,
        false => std::env::current_dir().unwrap(),
    }
}

fn engine() -> Engine {
    let path = root().join("tests/fixtures/hf/llama3");
    Engine::load(path.to_str().unwrap(), &RunOptions { threads: 2, context: 512, ..Default::default() }).unwrap()
}

fn request(e: &Engine, grammar: Option<GrammarSpec>, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt: e.tokenizer.encode("Describe a pet as JSON:", false).unwrap(),
        max_tokens: 300,
        sampling,
        stop: Vec::new(),
        stop_at_eos: false,
        top_logprobs: 3,
        grammar,
        keep_special_tokens: false,
        speculative: Default::default(),
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: Some(seed), ..SamplingParams::default() }
}

/// Runs `req` in a fresh session: its text and summary.
fn generate(e: &Engine, req: &GenerateRequest) -> Result<(String, GenerationSummary), GenerateError> {
    let mut text = String::new();
    let summary = Session::new(e).unwrap().generate(e, req, &|| false, |ev| {
        if let TokenEvent::Text(t) = ev {
            text.push_str(&t);
        }
        true
    })?;
    Ok((text, summary))
}

/// A schema whose every document is short: every key required, bounded strings,
/// numbers and arrays.
fn pet_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "kind": {"enum": ["cat", "dog", "fish"]},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
            "friendly": {"type": "boolean"},
            "toys": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "kind", "legs", "friendly", "toys"],
        "additionalProperties": false
    })
}

/// Whether `text` is a document of [`pet_schema`]; the error says what is wrong.
fn check_pet(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text:?}"))?;
    let obj = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort();
    if keys != ["friendly", "kind", "legs", "name", "toys"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = obj["name"].as_str().ok_or("name")?;
    let kind = obj["kind"].as_str().ok_or("kind")?;
    let legs = obj["legs"].as_i64().ok_or("legs")?;
    let toys = obj["toys"].as_array().ok_or("toys")?;
    let ok = name.chars().count() <= 10
        && ["cat", "dog", "fish"].contains(&kind)
        && (0..=8).contains(&legs)
        && obj["friendly"].is_boolean()
        && (1..=3).contains(&toys.len())
        && toys.iter().all(|t| t.as_str().is_some_and(|t| t.chars().count() <= 5));
    match ok {
        true => Ok(()),
        false => Err(format!("does not match the schema: {text}")),
    }
}

#[test]
fn a_json_schema_shapes_greedy_and_sampled_output() {
    let e = engine();
    let spec = GrammarSpec::JsonSchema(pet_schema());
    let runs = [SamplingParams::greedy(), sampled(1), sampled(2), sampled(3), sampled(4)];
    for sampling in runs {
        let (text, summary) = generate(&e, &request(&e, Some(spec.clone()), sampling.clone())).unwrap();
        assert_eq!(summary.finish, FinishReason::Stop, "{sampling:?}: {text}");
        check_pet(&text).unwrap_or_else(|err| panic!("{sampling:?}: {err}"));
    }
}

#[test]
fn a_json_object_is_an_object() {
    let e = engine();
    for sampling in [SamplingParams::greedy(), sampled(5), sampled(6)] {
        let req = GenerateRequest { max_tokens: 400, ..request(&e, Some(GrammarSpec::JsonObject), sampling.clone()) };
        let (text, summary) = generate(&e, &req).unwrap();
        match summary.finish {
            FinishReason::Stop => {
                // Only the syntax: a random model writes numbers such as 1E2857151, valid
                // JSON that serde_json will not hold in an f64.
                serde_json::from_str::<serde::de::IgnoredAny>(&text).unwrap_or_else(|err| panic!("{err}: {text:?}"));
                assert!(text.starts_with('{'), "{text}");
            }
            // A random model may write a long string: what it wrote is still an object's
            // beginning.
            _ => assert!(text.starts_with('{'), "{sampling:?}: {text:?}"),
        }
    }
}

#[test]
fn a_lark_grammar_may_end_with_a_special_token() {
    let e = engine();
    // The grammar names a special token; the generation ends where the grammar is
    // complete, with `stop_at_eos` off and no end-of-sequence token.
    let spec = GrammarSpec::Lark("start: (\"yes\" | \"no\") <|im_end|>\n".into());
    for sampling in [SamplingParams::greedy(), sampled(7)] {
        let (text, summary) = generate(&e, &request(&e, Some(spec.clone()), sampling)).unwrap();
        assert_eq!(summary.finish, FinishReason::Stop);
        assert!(text == "yes" || text == "no", "{text:?}");
        let im_end = e.tokenizer.token_to_id("<|im_end|>").unwrap();
        assert_eq!(summary.tokens.last(), Some(&im_end), "the grammar is complete after <|im_end|>");
    }
}

#[test]
fn a_grammar_that_does_not_compile_is_a_grammar_error() {
    let e = engine();
    let req = request(&e, Some(GrammarSpec::Lark("start: <|no_such_token|>\n".into())), SamplingParams::greedy());
    match generate(&e, &req) {
        Err(GenerateError::Grammar(msg)) => assert!(msg.contains("no_such_token"), "{msg}"),
        other => panic!("expected a grammar error, got {:?}", other.map(|r| r.0)),
    }
}

/// All of `reqs` through one step loop from the start.
fn together(e: &Engine, reqs: &[GenerateRequest]) -> Vec<Trace> {
    steps::together(e, reqs, CHUNK).into_iter().map(|(t, _)| t).collect()
}

#[test]
fn an_unconstrained_sequence_gets_what_it_gets_alone_beside_a_constrained_one() {
    let e = engine();
    let constrained = request(&e, Some(GrammarSpec::JsonSchema(pet_schema())), sampled(9));
    // Greedy with a one-token cut, and top-k sampling: both sample from a cut of the
    // logits alone, and from every logit beside a grammar.
    let top_k = SamplingParams { temperature: 0.8, top_k: 5, seed: Some(3), ..SamplingParams::greedy() };
    for sampling in [SamplingParams::greedy(), top_k] {
        let free = GenerateRequest { max_tokens: 40, ..request(&e, None, sampling) };
        let alone = together(&e, std::slice::from_ref(&free)).remove(0);
        let both = together(&e, &[constrained.clone(), free.clone()]);
        assert!(both[1] == alone, "batched:\n{:?}\nalone:\n{alone:?}", both[1]);
        check_pet(&both[0].1).unwrap();
        // The reported log-probs are the model's own: the constrained sequence's first
        // token has the same alternatives as the unconstrained one's (the same prompt;
        // one computed from every logit, the other from the device's top entries).
        let (a, b) = (&both[0].0[0].2, &alone.0[0].2);
        assert_eq!(a.iter().map(|t| t.0).collect::<Vec<_>>(), b.iter().map(|t| t.0).collect::<Vec<_>>());
        for (x, y) in a.iter().zip(b) {
            assert!((f32::from_bits(x.1) - f32::from_bits(y.1)).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }
}

/// SmolLM2-135M-Instruct (49152 tokens) at `STRATA_SMOLLM2`: a chat answer under a
/// schema is a document of it, and every token of a valid document passes its mask.
/// Prints the time a mask takes (not asserted: timing is for benchmarks).
#[test]
fn a_real_model_answers_in_the_schema() {
    let Some(path) = std::env::var_os("STRATA_SMOLLM2") else {
        eprintln!("skipped: set STRATA_SMOLLM2 to SmolLM2-135M-Instruct's GGUF to run this test");
        return;
    };
    let e =
        Engine::load(path.to_str().unwrap(), &RunOptions { threads: 2, context: 1024, ..Default::default() }).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "kind": {"enum": ["cat", "dog", "fish"]},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
            "friendly": {"type": "boolean"},
            "toys": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "kind", "legs", "friendly", "toys"],
        "additionalProperties": false
    });
    let spec = GrammarSpec::JsonSchema(schema);

    let t = Instant::now();
    let env = e.token_env().unwrap();
    eprintln!("token trie of {} tokens built in {:.0?}", env.vocab_size(), t.elapsed());
    let doc = r#"{"name": "Rex", "kind": "dog", "legs": 4, "friendly": true, "toys": ["ball", "stick"]}"#;
    let ids = e.tokenizer.encode(doc, false).unwrap();
    let t = Instant::now();
    let mut c = Constraint::new(&spec, env).unwrap();
    let compile = t.elapsed();
    let t = Instant::now();
    for &id in &ids {
        assert!(strata::engine::grammar::allows(c.allowed().unwrap(), id), "token {id} of {doc}");
        c.commit(id).unwrap();
    }
    let per_token = t.elapsed() / ids.len() as u32;
    assert!(c.is_done(), "the document is complete");
    eprintln!("schema compiled in {compile:.1?}; mask and commit: {per_token:.1?} per token over {} tokens", ids.len());

    let messages =
        [ChatMessage::new("user", "Describe a pet dog as JSON with its name, kind, legs, friendliness and toys.")];
    let prompt = e.tokenizer.encode_chat(&messages, true).unwrap();
    for sampling in [SamplingParams::greedy(), sampled(1), sampled(2)] {
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: 200,
            sampling: sampling.clone(),
            stop: Vec::new(),
            stop_at_eos: true,
            top_logprobs: 0,
            grammar: Some(spec.clone()),
            keep_special_tokens: false,
            speculative: Default::default(),
        };
        let (text, summary) = generate(&e, &req).unwrap();
        eprintln!("{sampling:?}: {text}");
        assert_eq!(summary.finish, FinishReason::Stop, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{err}: {text}"));
        assert!(["cat", "dog", "fish"].contains(&v["kind"].as_str().unwrap()), "{text}");
        assert!(v["toys"].as_array().is_some_and(|t| (1..=3).contains(&t.len())), "{text}");
    }
}

/// The grammars that force a tool call accept each format's canonical call, token by
/// token (as the fixture's tokenizer spells it), end there, and the parser reads the call
/// back; they refuse a call to a function not offered.
#[test]
fn forced_call_grammars_accept_canonical_calls() {
    use strata::engine::toolcall::{CallMarkers, ToolCallParser, ToolEvent, ToolFormat, call_grammar};
    let e = engine();
    let env = e.token_env().unwrap();
    let f = |name: &str| {
        json!({"name": name, "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}})
    };
    let (weather, search) = (f("get_weather"), f("search"));
    let cases = [
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
        ),
        (
            ToolFormat::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        ),
        (ToolFormat::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}"),
        (
            ToolFormat::Generic,
            "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]}",
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolFormat::Kimi,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 2}<|tool_call_end|><|tool_calls_section_end|>",
        ),
        (
            ToolFormat::Glm,
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        ),
    ];
    let accepts = |spec: &GrammarSpec, text: &str| -> Result<bool, String> {
        let mut c = Constraint::new(spec, env)?;
        for id in e.tokenizer.encode(text, false).unwrap() {
            if !strata::engine::grammar::allows(c.allowed()?, id) {
                return Ok(false);
            }
            c.commit(id)?;
        }
        // Complete: only an end-of-sequence token may follow.
        Ok(c.is_done()
            || e.tokenizer.eos_ids().iter().any(|&eos| strata::engine::grammar::allows(c.allowed().unwrap(), eos)))
    };
    for (format, text) in cases {
        // The shape of the call as the template would show it (DeepSeek-R1's json code block).
        let markers = CallMarkers::of(format, text, |_| None);
        for parallel in [false, true] {
            let spec = call_grammar(format, &[&weather, &search], parallel, &markers).unwrap();
            assert!(accepts(&spec, text).unwrap(), "{format:?} parallel {parallel}: {text}\n{spec:?}");
            let only_search = call_grammar(format, &[&search], parallel, &markers).unwrap();
            assert!(!accepts(&only_search, text).unwrap(), "{format:?}: a function not offered");
        }
        if format == ToolFormat::Glm {
            // GLM's arguments are pairs, the required ones always there.
            let spec = call_grammar(format, &[&weather], false, &markers).unwrap();
            let no_city = "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
            assert!(!accepts(&spec, no_city).unwrap(), "a call without its required argument");
        }
        let mut p = ToolCallParser::new(format, &[json!({"type": "function", "function": weather.clone()})], 3);
        let mut events = p.push(text);
        events.extend(p.finish());
        let call = events.iter().find_map(|ev| match ev {
            ToolEvent::End { call, .. } => Some(call.clone()),
            _ => None,
        });
        let call = call.unwrap_or_else(|| panic!("{format:?}: {events:?}"));
        assert_eq!(call.name, "get_weather");
        assert_eq!(serde_json::from_str::<Value>(&call.arguments).unwrap(), json!({"city": "Paris", "days": 2}));
    }
    // Harmony (gpt-oss): the call is the reply's first message, read by its own parser.
    let text = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 2}<|call|>";
    let markers = CallMarkers::of(ToolFormat::Harmony, text, |_| None);
    for parallel in [false, true] {
        let spec = call_grammar(ToolFormat::Harmony, &[&weather, &search], parallel, &markers).unwrap();
        assert!(accepts(&spec, text).unwrap(), "harmony parallel {parallel}: {text}\n{spec:?}");
        let only_search = call_grammar(ToolFormat::Harmony, &[&search], parallel, &markers).unwrap();
        assert!(!accepts(&only_search, text).unwrap(), "harmony: a function not offered");
    }
    let mut p = strata::engine::toolcall::HarmonyParser::new(true, 3);
    let mut parts = p.push(text);
    parts.extend(p.finish());
    assert!(p.closed());
    assert_eq!(p.calls().len(), 1, "{parts:?}");
    assert_eq!(p.calls()[0].name, "get_weather");
    assert_eq!(serde_json::from_str::<Value>(&p.calls()[0].arguments).unwrap(), json!({"city": "Paris", "days": 2}));
}

/// Forced calls name a format's marker tokens by id: with a vocabulary that has them (the
/// fixture's, with each format's markers added as special tokens), the calls of Mistral,
/// DeepSeek, Kimi-K2 and GLM are accepted token by token, markers as the special tokens,
/// and a marker spelled out as text is refused.
#[test]
fn forced_calls_use_the_marker_tokens() {
    use strata::engine::grammar::TokenEnv;
    use strata::engine::tokenizer::TextTokenizer;
    use strata::engine::toolcall::{CallMarkers, ToolFormat, call_grammar};
    let dir = root().join("tests/fixtures/hf/llama3");
    let base: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
    let weather = json!({"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}});
    // (format, the template's text that shows its markers, a call as pieces, parallel)
    let cases: &[(ToolFormat, &str, &[&str], bool)] = &[
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS] [ARGS] [CALL_ID]",
            &["[TOOL_CALLS]", "get_weather", "[CALL_ID]", "abc123xyz", "[ARGS]", "{\"city\": \"Paris\"}"],
            false,
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS]",
            &["[TOOL_CALLS]", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"],
            true,
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜><｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            &[
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁call▁begin｜>",
                "get_weather",
                "<｜tool▁sep｜>",
                "{\"city\": \"Paris\"}",
                "<｜tool▁call▁end｜>",
                "<｜tool▁call▁begin｜>",
                "get_weather",
                "<｜tool▁sep｜>",
                "{\"city\": \"Rome\"}",
                "<｜tool▁call▁end｜>",
                "<｜tool▁calls▁end｜>",
            ],
            true,
        ),
        (
            ToolFormat::Kimi,
            "<|tool_calls_section_begin|><|tool_call_begin|><|tool_call_argument_begin|><|tool_call_end|><|tool_calls_section_end|>",
            &[
                "<|tool_calls_section_begin|>",
                "<|tool_call_begin|>",
                "functions.get_weather:0",
                "<|tool_call_argument_begin|>",
                "{\"city\": \"Paris\"}",
                "<|tool_call_end|>",
                "<|tool_calls_section_end|>",
            ],
            false,
        ),
        (
            ToolFormat::Glm,
            "<tool_call></tool_call><arg_key></arg_key><arg_value></arg_value>",
            &[
                "<tool_call>",
                "get_weather\n",
                "<arg_key>",
                "city",
                "</arg_key>",
                "\n",
                "<arg_value>",
                "Paris",
                "</arg_value>",
                "\n",
                "</tool_call>",
            ],
            false,
        ),
    ];
    for &(format, template, pieces, parallel) in cases {
        let mut json = base.clone();
        let added = json["added_tokens"].as_array_mut().unwrap();
        let first = added.iter().map(|t| t["id"].as_u64().unwrap()).max().unwrap() as u32 + 1;
        for (i, marker) in format.markers().iter().enumerate() {
            added.push(json!({"id": first + i as u32, "content": marker, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}));
        }
        let tok = TextTokenizer::from_sources(&json.to_string(), None, None, None).unwrap();
        let env = TokenEnv::new(&tok, first as usize + format.markers().len()).unwrap();
        let is_marker = |id: u32| id >= first;
        let ids: Vec<u32> = pieces
            .iter()
            .flat_map(|p| match tok.token_to_id(p).filter(|&id| is_marker(id)) {
                Some(id) => vec![id],
                None => tok.encode(p, false).unwrap(),
            })
            .collect();
        let accepts = |spec: &GrammarSpec, ids: &[u32]| -> bool {
            let mut c = Constraint::new(spec, &env).unwrap();
            for &id in ids {
                if !strata::engine::grammar::allows(c.allowed().unwrap(), id) {
                    return false;
                }
                c.commit(id).unwrap();
            }
            c.is_done() || tok.eos_ids().iter().any(|&e| strata::engine::grammar::allows(c.allowed().unwrap(), e))
        };
        let markers = CallMarkers::of(format, template, |m| tok.token_to_id(m));
        let spec = call_grammar(format, &[&weather], parallel, &markers).unwrap();
        assert!(accepts(&spec, &ids), "{format:?} {pieces:?}\n{spec:?}");
        // The first marker spelled out as text is not the marker.
        let marker = pieces[0];
        let half = (1..marker.len()).find(|&i| i >= marker.len() / 2 && marker.is_char_boundary(i)).unwrap();
        let spelled =
            [tok.encode(&marker[..half], false).unwrap(), tok.encode(&marker[half..], false).unwrap()].concat();
        assert!(spelled.len() > 1 && !spelled.iter().any(|&id| is_marker(id)), "{format:?}: {spelled:?}");
        assert!(!accepts(&spec, &[spelled, ids[1..].to_vec()].concat()), "{format:?}: spelled out");
    }
}

/// A structured reply in harmony (gpt-oss): the schema constrains the `final` message,
/// which may follow an `analysis` message of free text, and `<|return|>` ends it; the
/// markers are the gpt_oss fixture's special tokens.
#[test]
fn harmony_structured_replies_constrain_the_final_message() {
    use strata::engine::toolcall::{CallMarkers, ToolFormat, harmony};
    let path = root().join("tests/fixtures/hf/gpt_oss");
    let e =
        Engine::load(path.to_str().unwrap(), &RunOptions { threads: 2, context: 512, ..Default::default() }).unwrap();
    let env = e.token_env().unwrap();
    let template = std::fs::read_to_string(root().join("tests/fixtures/templates/openai-gpt-oss-120b.jinja")).unwrap();
    let markers = CallMarkers::of(ToolFormat::Harmony, &template, |m| e.tokenizer.token_to_id(m));
    let schema = GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "integer"}},
        "required": ["a"], "additionalProperties": false}));
    let spec = GrammarSpec::Lark(harmony::final_grammar(&schema.json_schema().unwrap(), &markers));
    let accepts = |text: &str| -> bool {
        let mut c = Constraint::new(&spec, env).unwrap();
        for id in e.tokenizer.encode(text, false).unwrap() {
            if !strata::engine::grammar::allows(c.allowed().unwrap(), id) {
                return false;
            }
            c.commit(id).unwrap();
        }
        c.is_done()
            || e.tokenizer.eos_ids().iter().any(|&eos| strata::engine::grammar::allows(c.allowed().unwrap(), eos))
    };
    assert!(accepts("<|channel|>final<|message|>{\"a\": 1}<|return|>"));
    assert!(accepts(
        "<|channel|>analysis<|message|>An integer, then. Say 12.<|end|><|start|>assistant<|channel|>final<|message|>{\"a\": 12}<|return|>"
    ));
    assert!(!accepts("<|channel|>final<|message|>{\"a\": \"one\"}<|return|>"), "the schema holds");
    assert!(!accepts("{\"a\": 1}"), "the header comes first");
    assert!(!accepts("<|channel|>commentary<|message|>{\"a\": 1}<|return|>"), "only analysis, then final");
}

/// Under a grammar, speculation (n-gram drafts, a draft model's) gives the tokens,
/// log-probabilities and document that decoding one token a step gives: each drafted
/// row is sampled among the tokens the grammar allows after the ones kept before it.
#[test]
fn speculation_keeps_what_a_grammar_gives() {
    use strata::engine::speculative::{SpecKind, SpecRequest, SpecSettings};
    let mut e = engine();
    let draft = root().join("tests/fixtures/gguf/llama3.q4_0.gguf");
    let opts = RunOptions { threads: 2, context: 512, ..Default::default() };
    e.set_draft(Engine::load(draft.to_str().unwrap(), &opts).unwrap(), SpecSettings::default()).unwrap();
    let off = SpecRequest { kind: Some(SpecKind::Off), ..SpecRequest::default() };
    for sampling in [SamplingParams::greedy(), sampled(9)] {
        let plain = request(&e, Some(GrammarSpec::JsonSchema(pet_schema())), sampling);
        let want = together(&e, &[GenerateRequest { speculative: off, ..plain.clone() }]).remove(0);
        check_pet(&want.1).unwrap();
        for kind in [SpecKind::Ngram, SpecKind::Draft] {
            let spec = SpecRequest { kind: Some(kind), p_min: Some(0.0), ..SpecRequest::default() };
            let (got, summary) =
                steps::together(&e, &[GenerateRequest { speculative: spec, ..plain.clone() }], CHUNK).remove(0);
            assert!(got == want, "{kind:?} under a grammar:\n{got:?}\n{want:?}");
            assert!(summary.speculative.drafted > 0, "{kind:?}: nothing drafted");
        }
    }
}
