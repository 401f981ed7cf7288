use serde_json::json;

use super::*;
use crate::queue::{Event, JobDone, JobError};
use crate::server::openai::render::Head;
use crate::server::sse::EventWriter;
use strata_engine::session::FinishReason as EngineFinish;
use strata_engine::toolcall::{ToolCall, ToolEvent};

fn plan(body: Value) -> Result<ResponsePlan, ApiError> {
    serde_json::from_value::<ResponseRequest>(body).unwrap().into_plan()
}

fn messages(input: Value) -> Vec<Value> {
    let p = plan(json!({"model": "m", "input": input, "instructions": "Be kind."})).unwrap();
    let PromptInput::Chat(msgs) = p.job.prompt else { panic!("a chat") };
    msgs.iter().map(ChatMessage::to_json).collect()
}

#[test]
fn text_input_is_one_user_message_after_the_instructions() {
    assert_eq!(
        messages(json!("Hi")),
        [json!({"role": "system", "content": "Be kind."}), json!({"role": "user", "content": "Hi"})]
    );
    let p = plan(json!({"model": "m", "input": "Hi"})).unwrap();
    assert_eq!((p.job.messages_param, p.job.split_reasoning, p.stream, p.logprobs), ("input", true, false, false));
    assert_eq!(p.job.max_tokens, None);
    assert_eq!(p.job.sampling.temperature, 1.0);
}

#[test]
fn calls_join_the_assistant_turn_and_results_name_their_function() {
    let got = messages(json!([
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": ""},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": {"x": 3}},
    ]));
    let calls = |ids: &[(&str, &str, Value)]| -> Value {
        ids.iter()
            .map(
                |(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}),
            )
            .collect()
    };
    assert_eq!(
        got,
        [
            json!({"role": "system", "content": "Be kind."}),
            json!({"role": "user", "content": "a\nb"}),
            json!({"role": "assistant", "content": "Let me look.", "reasoning_content": "short",
                "tool_calls": calls(&[("c1", "f", json!({"x": 1})), ("c2", "g", json!({}))])}),
            json!({"role": "tool", "content": "two", "tool_call_id": "c2", "name": "g"}),
            json!({"role": "tool", "content": "one", "tool_call_id": "c1", "name": "f"}),
            json!({"role": "assistant", "content": "", "tool_calls": calls(&[("c3", "f", json!({"x": 3}))])}),
        ]
    );
}

#[test]
fn effort_and_template_kwargs_become_template_variables() {
    let vars = |extra: Value| {
        let mut body = json!({"model": "m", "input": "x"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        Value::Object(plan(body).unwrap().job.template_vars)
    };
    assert_eq!(vars(json!({})), json!({}));
    assert_eq!(vars(json!({"reasoning": {"effort": "none"}})), json!({"enable_thinking": false}));
    assert_eq!(
        vars(json!({"reasoning": {"effort": "low", "summary": "auto"}})),
        json!({"enable_thinking": true, "reasoning_effort": "low"})
    );
    assert_eq!(
        vars(json!({"reasoning": {"effort": "high"}, "chat_template_kwargs": {"enable_thinking": false}})),
        json!({"enable_thinking": false, "reasoning_effort": "high"})
    );
}

#[test]
fn flat_function_tools_reach_the_template_in_the_chat_shape() {
    let p = plan(json!({"model": "m", "input": "x", "parallel_tool_calls": false, "tools": [
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}]}))
    .unwrap();
    let tools = p.job.tools.unwrap();
    assert_eq!(
        tools.tools,
        [
            json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}})
        ]
    );
    assert!(!tools.parallel);
    assert_eq!(tools.choice, ToolChoice::Auto);
    // `none` offers no tools; the response still repeats them.
    let p =
        plan(json!({"model": "m", "input": "x", "tool_choice": "none", "tools": [{"type": "function", "name": "f"}]}))
            .unwrap();
    assert!(p.job.tools.is_none());
    assert_eq!(p.echo.tools.len(), 1);
}

fn head() -> Head {
    Head { id: "resp_abc".into(), created: 7, model: "m".into() }
}

fn writer(streaming: bool) -> Writer {
    let p = plan(json!({"model": "m", "input": "x"})).unwrap();
    Writer::new(head(), p.echo, false, streaming)
}

fn done(finish: EngineFinish, calls: Vec<ToolCall>) -> Event {
    Event::Done(JobDone { cached_tokens: 2, reasoning_tokens: 1, tool_calls: calls, ..JobDone::ended(finish, 5, 3) })
}

/// The events' names and the whole response.
fn run(events: Vec<Event>) -> (Vec<&'static str>, Result<ResponseObject, ApiError>) {
    let mut w = writer(true);
    let mut names: Vec<&'static str> = w.start().into_iter().map(|(n, _)| n).collect();
    for ev in events {
        names.extend(w.push(ev).into_iter().map(|(n, _)| n));
    }
    names.extend(w.closed().into_iter().map(|(n, _)| n));
    (names, w.into_response())
}

#[test]
fn whitespace_before_a_call_opens_no_message() {
    let call = ToolCall { id: "call_1".into(), name: "f".into(), arguments: "{}".into() };
    let (names, r) = run(vec![
        Event::Text("\n ".into()),
        Event::Tool(ToolEvent::Begin { index: 0, id: "call_1".into(), name: "f".into() }),
        Event::Tool(ToolEvent::Args { index: 0, fragment: "{".into() }),
        Event::Tool(ToolEvent::Args { index: 0, fragment: "}".into() }),
        Event::Tool(ToolEvent::End { index: 0, call: call.clone() }),
        done(EngineFinish::Stop, vec![call]),
    ]);
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let r = json!(r.unwrap());
    assert_eq!(
        r["output"],
        json!([{"type": "function_call", "id": "fc_abc00", "call_id": "call_1", "name": "f",
        "arguments": "{}", "status": "completed"}])
    );
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 8})
    );
}

#[test]
fn an_empty_reply_is_an_empty_message() {
    let (names, r) = run(vec![done(EngineFinish::Stop, Vec::new())]);
    assert_eq!(names.len(), 2 + 2 + 3 + 1, "{names:?}");
    let r = json!(r.unwrap());
    assert_eq!(r["status"], "completed");
    assert_eq!(
        r["output"][0]["content"],
        json!([{"type": "output_text", "text": "", "annotations": [], "logprobs": []}])
    );
    assert_eq!(r["output"][0]["status"], "completed");
}

#[test]
fn errors_fail_the_response() {
    let (names, r) = run(vec![Event::Text("a".into()), Event::Error(JobError::Internal("boom".into()))]);
    assert_eq!(names[names.len() - 2..], ["error", "response.failed"]);
    assert_eq!(r.unwrap_err().message, "boom");

    // The worker went away without a result.
    let (names, r) = run(vec![Event::Text("a".into())]);
    assert_eq!(names.last(), Some(&"response.failed"));
    assert!(r.is_err());

    // Shutdown cancelled it.
    let (names, r) = run(vec![done(EngineFinish::Cancelled, Vec::new())]);
    assert_eq!(names[2..], ["error", "response.failed"]);
    assert!(r.unwrap_err().message.contains("shutting down"));
}

#[test]
fn a_whole_response_builds_no_events() {
    let mut w = writer(false);
    assert!(w.start().is_empty());
    assert!(w.push(Event::Text("Hi".into())).is_empty());
    assert!(w.push(done(EngineFinish::Length, Vec::new())).is_empty());
    let r = json!(w.into_response().unwrap());
    assert_eq!((r["status"].as_str(), r["output"][0]["content"][0]["text"].as_str()), (Some("incomplete"), Some("Hi")));
}

#[test]
fn a_call_the_limit_cut_is_left_out_of_the_whole_response() {
    let call = ToolCall { id: "call_1".into(), name: "f".into(), arguments: "{}".into() };
    let events = |cut: bool| {
        let mut evs = vec![
            Event::Tool(ToolEvent::Begin { index: 0, id: "call_1".into(), name: "f".into() }),
            Event::Tool(ToolEvent::Args { index: 0, fragment: "{}".into() }),
            Event::Tool(ToolEvent::End { index: 0, call: call.clone() }),
        ];
        if cut {
            evs.push(Event::Tool(ToolEvent::Begin { index: 1, id: "call_2".into(), name: "f".into() }));
            evs.push(Event::Tool(ToolEvent::Args { index: 1, fragment: "{\"a".into() }));
        }
        let done =
            JobDone { tool_calls: vec![call.clone()], tool_cut: cut, ..JobDone::ended(EngineFinish::Length, 5, 3) };
        evs.push(Event::Done(done));
        evs
    };
    // Cut inside the second call: incomplete, the first call alone.
    let (names, r) = run(events(true));
    assert_eq!(names.last(), Some(&"response.incomplete"));
    let r = json!(r.unwrap());
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["output"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["output"][0]["call_id"], "call_1");
    // Cut after the call, where only the wrapper's brackets were to come: completed.
    let (names, r) = run(events(false));
    assert_eq!(names.last(), Some(&"response.completed"));
    assert_eq!(json!(r.unwrap())["status"], "completed");
}
