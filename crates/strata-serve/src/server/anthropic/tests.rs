use serde_json::json;

use super::*;
use crate::queue::Event;
use crate::server::sse::EventWriter;

fn plan(body: Value) -> Result<MessagesPlan, ApiError> {
    serde_json::from_value::<MessagesRequest>(body).unwrap().into_plan()
}

fn chat_of(messages: Value) -> Vec<Value> {
    let p = plan(json!({"model": "m", "max_tokens": 4, "system": "S", "messages": messages})).unwrap();
    let PromptInput::Chat(msgs) = p.job.prompt else { panic!("a chat") };
    msgs.iter().map(ChatMessage::to_json).collect()
}

#[test]
fn tool_results_come_before_the_turn_s_text_and_name_their_tool() {
    let got = chat_of(json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "t2", "name": "v"}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t2", "content": "two"},
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "one"}], "is_error": true},
            {"type": "text", "text": "Thanks"}]},
        {"role": "user", "content": []},
    ]));
    let call = |id: &str, name: &str, args: Value| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    assert_eq!(
        got,
        [
            json!({"role": "system", "content": "S"}),
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": "Looking.", "tool_calls": [call("t1", "w", json!({"city": "Oslo"})), call("t2", "v", json!({}))]}),
            json!({"role": "tool", "content": "two", "tool_call_id": "t2", "name": "v"}),
            json!({"role": "tool", "content": "one", "tool_call_id": "t1", "name": "w"}),
            json!({"role": "user", "content": "Thanks"}),
            json!({"role": "user", "content": ""}),
        ]
    );
}

#[test]
fn choices_map_to_the_chat_s() {
    let tools = json!([{"name": "w", "description": "d", "input_schema": {"type": "object"}}]);
    let offer = |choice: Value| {
        plan(json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": choice}))
            .unwrap()
            .job
            .tools
    };
    let t = offer(json!({"type": "auto"})).unwrap();
    assert_eq!((t.choice, t.parallel), (ToolChoice::Auto, true));
    assert_eq!(
        t.tools,
        [json!({"type": "function", "function": {"name": "w", "description": "d", "parameters": {"type": "object"}}})]
    );
    let t = offer(json!({"type": "any", "disable_parallel_tool_use": true})).unwrap();
    assert_eq!((t.choice, t.parallel), (ToolChoice::Required, false));
    assert_eq!(offer(json!({"type": "tool", "name": "w"})).unwrap().choice, ToolChoice::Function("w".into()));
    assert!(offer(json!({"type": "none"})).is_none());
}

#[test]
fn thinking_and_effort_become_template_variables() {
    let vars = |extra: Value| {
        let mut body = json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        Value::Object(plan(body).unwrap().job.template_vars)
    };
    assert_eq!(vars(json!({})), json!({}));
    assert_eq!(vars(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})), json!({"enable_thinking": true}));
    assert_eq!(vars(json!({"thinking": {"type": "disabled"}})), json!({"enable_thinking": false}));
    assert_eq!(vars(json!({"output_config": {"effort": "low"}})), json!({"reasoning_effort": "low"}));
}

#[test]
fn a_whole_reply_builds_no_events_and_an_error_is_one() {
    use crate::queue::JobError;
    let mut w = Writer::new("msg_1".into(), "m".into(), false);
    assert!(w.push(Event::Started { prompt_tokens: 9, cached_tokens: 4 }).is_empty());
    assert!(w.push(Event::Text("Hi".into())).is_empty());
    let mut w = Writer::new("msg_1".into(), "m".into(), true);
    let frames = w.push(Event::Error(JobError::Internal("boom".into())));
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, "error");
    let v: Value = serde_json::from_str(&frames[0].1).unwrap();
    assert_eq!(v, json!({"type": "error", "error": {"type": "api_error", "message": "boom"}}));
    assert!(w.into_message().is_err());
}
