//! Replies written by hand from the harmony spec (openai/harmony docs/format.md), each
//! parsed whole, in pieces of every size, and split in two at every byte boundary.

use super::*;
use serde_json::json;

/// Reasoning, content, whole calls (name, parsed arguments), and whether a call was cut,
/// checking that each call's streamed fragments add up to its arguments and that its
/// name went out first.
#[derive(Debug, PartialEq)]
struct Reply {
    reasoning: String,
    content: String,
    calls: Vec<(String, Value)>,
    cut: bool,
}

fn settle(parts: &[Part], cut: bool) -> Reply {
    let mut reply = Reply { reasoning: String::new(), content: String::new(), calls: Vec::new(), cut };
    let mut streamed: Vec<(String, String)> = Vec::new();
    for p in parts {
        match p {
            Part::Reasoning(t) => reply.reasoning.push_str(t),
            Part::Tool(ToolEvent::Text(t)) => reply.content.push_str(t),
            Part::Tool(ToolEvent::Begin { index, id, name }) => {
                assert_eq!(*index, streamed.len());
                assert_eq!(id, &format!("call_{}_{index}", base36(7, 12)));
                streamed.push((name.clone(), String::new()));
            }
            Part::Tool(ToolEvent::Args { index, fragment }) => streamed[*index].1.push_str(fragment),
            Part::Tool(ToolEvent::End { index, call }) => {
                assert_eq!(streamed[*index], (call.name.clone(), call.arguments.clone()));
                reply.calls.push((call.name.clone(), serde_json::from_str(&call.arguments).unwrap()));
            }
        }
    }
    reply
}

fn feed(mut p: HarmonyParser, pieces: &[&str]) -> (Reply, HarmonyParser) {
    let mut parts = Vec::new();
    for piece in pieces {
        parts.extend(p.push(piece));
    }
    parts.extend(p.finish());
    let reply = settle(&parts, p.cut());
    assert_eq!(reply.calls.len(), p.calls().len());
    (reply, p)
}

/// `text`'s reply, the same whatever pieces it streams in: every piece size, and every
/// split in two.
fn parse_with(tools: bool, text: &str) -> Reply {
    let new = || HarmonyParser::new(tools, 7);
    let (whole, _) = feed(new(), &[text]);
    let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
    for &at in &bounds {
        let (split, _) = feed(new(), &[&text[..at], &text[at..]]);
        assert_eq!(split, whole, "split at byte {at} of {text:?}");
    }
    for step in 1..8 {
        let mut pieces = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            pieces.push(&text[i..j]);
            i = j;
        }
        let (stepped, _) = feed(new(), &pieces);
        assert_eq!(stepped, whole, "pieces of {step} bytes of {text:?}");
    }
    whole
}

fn parse(text: &str) -> Reply {
    parse_with(true, text)
}

fn reply(reasoning: &str, content: &str, calls: &[(&str, Value)], cut: bool) -> Reply {
    let calls = calls.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
    Reply { reasoning: reasoning.into(), content: content.into(), calls, cut }
}

#[test]
fn analysis_then_final() {
    // Generation ends at `<|return|>`, an end-of-generation token that never reaches
    // the text; where the vocabulary writes it as text, it ends the reply just the same.
    let text = "<|channel|>analysis<|message|>User says hi. Reply politely.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?";
    let want = reply("User says hi. Reply politely.", "Hello! How can I help?", &[], false);
    assert_eq!(parse(text), want);
    assert_eq!(parse(&format!("{text}<|return|>")), want);
    assert_eq!(parse(&format!("{text}<|return|>more<|start|>assistant")), want);
    // Non-ASCII text, split inside its characters' bytes only at their boundaries.
    let text =
        "<|channel|>analysis<|message|>Météo ☀<|end|><|start|>assistant<|channel|>final<|message|>Il fait beau ☀.";
    assert_eq!(parse(text), reply("Météo ☀", "Il fait beau ☀.", &[], false));
}

#[test]
fn a_single_call_as_the_spec_writes_it() {
    let text = "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>";
    let want =
        reply("Need to use function get_weather.", "", &[("get_weather", json!({"location": "San Francisco"}))], false);
    assert_eq!(parse(text), want);
    // `<|call|>` as an end-of-generation token: not in the text.
    assert_eq!(parse(text.strip_suffix("<|call|>").unwrap()), want);
    // The reply ends at `<|call|>`: what follows is dropped, and the parser is closed.
    let (after, p) = feed(HarmonyParser::new(true, 7), &[text, "<|start|>assistant<|channel|>final<|message|>x"]);
    assert_eq!(after, want);
    assert!(p.closed());
}

#[test]
fn the_recipient_before_or_after_the_channel() {
    let paris = json!({"city": "Paris", "unit": "celsius"});
    let want = reply("", "", &[("get_weather", paris.clone())], false);
    // As gpt-oss's template writes calls into the history: in the role part, right
    // after the prompt's `<|start|>assistant`, and a content type without `<|constrain|>`.
    assert_eq!(
        parse(
            " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>"
        ),
        want
    );
    // In the channel part, `<|constrain|>` with or without a space, or no content type.
    for header in [
        "<|channel|>commentary to=functions.get_weather <|constrain|>json",
        "<|channel|>commentary to=functions.get_weather<|constrain|> json",
        "<|channel|>commentary to=functions.get_weather",
    ] {
        assert_eq!(parse(&format!("{header}<|message|>{paris}<|call|>")), want, "{header}");
    }
    // Both after a message of reasoning.
    for header in [
        "assistant to=functions.get_weather<|channel|>commentary json",
        "assistant<|channel|>commentary to=functions.get_weather <|constrain|>json",
    ] {
        let text = format!("<|channel|>analysis<|message|>Paris.<|end|><|start|>{header}<|message|>{paris}<|call|>");
        assert_eq!(parse(&text), reply("Paris.", "", &[("get_weather", paris.clone())], false), "{header}");
    }
}

#[test]
fn two_calls_in_a_row_and_a_preamble() {
    // A preamble (commentary to nobody) is content; a call message the model ends with
    // `<|end|>` lets another follow before the `<|call|>` that ends the reply.
    let text = "<|channel|>analysis<|message|>Two cities.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking both cities.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\", \"days\": 2}<|call|>";
    let calls = [("get_weather", json!({"city": "Paris"})), ("get_weather", json!({"city": "Rome", "days": 2}))];
    assert_eq!(parse(text), reply("Two cities.", "Checking both cities.", &calls, false));
    // A single-call reply stops at its first.
    let (one, p) = feed(HarmonyParser::new(true, 7).single(), &[text]);
    assert_eq!(one, reply("Two cities.", "Checking both cities.", &calls[..1], false));
    assert!(p.closed());
}

#[test]
fn a_call_cut_inside_its_arguments_is_dropped() {
    let head = "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
    let args = "{\"city\": \"Paris\", \"days\": 3}";
    // Cut anywhere inside the arguments: the call was streamed as far as it got (its name
    // and fragments went out), then dropped, and the reply says it was cut.
    for at in 1..args.len() {
        let mut p = HarmonyParser::new(true, 7);
        let mut parts = p.push(head);
        parts.extend(p.push(&args[..at]));
        parts.extend(p.finish());
        assert!(p.cut(), "cut at {at}");
        assert!(p.calls().is_empty());
        assert!(parts.iter().all(|e| !matches!(e, Part::Tool(ToolEvent::End { .. }))));
        let begun =
            parts.iter().any(|e| matches!(e, Part::Tool(ToolEvent::Begin { name, .. }) if name == "get_weather"));
        assert!(begun, "the name went out with the arguments' first byte (cut at {at})");
    }
    // Cut inside the header of a call, or right after it.
    for text in [&head[..head.len() - 20], head] {
        assert_eq!(parse(text), reply("Weather.", "", &[], true), "{text:?}");
    }
    // A complete call before the cut stands.
    let text = format!(
        "{head}{args}<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{{\"city\": \"Ro"
    );
    assert_eq!(parse(&text), reply("Weather.", "", &[("get_weather", json!({"city": "Paris", "days": 3}))], true));
    // Arguments that are no JSON object: no call, and no cut.
    assert_eq!(parse(&format!("{head}not json<|call|>")), reply("Weather.", "", &[], false));
}

#[test]
fn arguments_stream_before_the_call_ends() {
    let mut p = HarmonyParser::new(true, 7);
    let head = p.push("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
    assert!(head.is_empty());
    let first = p.push("{\"city\": ");
    assert_eq!(
        first,
        vec![
            Part::Tool(ToolEvent::Begin {
                index: 0,
                id: format!("call_{}_0", base36(7, 12)),
                name: "get_weather".into()
            }),
            Part::Tool(ToolEvent::Args { index: 0, fragment: "{\"city\":".into() }),
        ]
    );
    let more = p.push("\"Paris\"}<|ca");
    assert_eq!(more, vec![Part::Tool(ToolEvent::Args { index: 0, fragment: " \"Paris\"}".into() })]);
    assert!(!p.closed());
    let end = p.push("ll|>");
    assert!(
        matches!(&end[..], [Part::Tool(ToolEvent::End { index: 0, call })] if call.arguments == "{\"city\": \"Paris\"}")
    );
    assert!(p.closed());
}

#[test]
fn reasoning_streams_and_markers_are_held_back() {
    let mut p = HarmonyParser::new(false, 7);
    assert_eq!(p.push("<|chan"), vec![]);
    assert_eq!(p.push("nel|>analysis<|message|>Think"), vec![Part::Reasoning("Think".into())]);
    assert!(p.thinking());
    assert_eq!(p.push("ing<|e"), vec![Part::Reasoning("ing".into())]);
    assert_eq!(
        p.push("nd|><|start|>assistant<|channel|>final<|message|>Hi <"),
        vec![Part::Tool(ToolEvent::Text("Hi ".into()))]
    );
    assert!(!p.thinking());
    assert_eq!(p.push("3"), vec![Part::Tool(ToolEvent::Text("<3".into()))]);
    assert_eq!(p.finish(), vec![]);
}

#[test]
fn without_tools_a_call_is_content_and_plain_text_passes() {
    let text =
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    assert_eq!(parse_with(false, text), reply("", "{\"city\": \"Paris\"}", &[], false));
    // A reply not in harmony is content, without the markers that end it.
    assert_eq!(parse("Just text, no channels."), reply("", "Just text, no channels.", &[], false));
    assert_eq!(parse("Just text.<|return|>"), reply("", "Just text.", &[], false));
    assert_eq!(parse("Hi.<|end|><|start|>assistant<|channel|>final<|message|>Bye."), reply("", "Hi.Bye.", &[], false));
}

#[test]
fn detects_harmony_and_sets_its_effort() {
    let template = "{{- \"<|start|>system<|message|>\" }}{{- \"Reasoning: \" + reasoning_effort }}<|start|>assistant<|channel|>final<|message|>";
    assert!(is_harmony(template));
    assert!(!is_harmony("<|im_start|>assistant\n"));
    let effort = |vars: Value| {
        let mut vars = vars.as_object().unwrap().clone();
        effort_vars(&mut vars);
        Value::Object(vars)
    };
    assert_eq!(effort(json!({"enable_thinking": false})), json!({"enable_thinking": false, "reasoning_effort": "low"}));
    assert_eq!(effort(json!({"reasoning_effort": "high"})), json!({"reasoning_effort": "high"}));
    assert_eq!(effort(json!({"reasoning_effort": "minimal"})), json!({"reasoning_effort": "low"}));
    assert_eq!(effort(json!({"reasoning_effort": "xhigh"})), json!({"reasoning_effort": "high"}));
    assert_eq!(effort(json!({"enable_thinking": true})), json!({"enable_thinking": true}));
    assert_eq!(effort(json!({})), json!({}));
}
