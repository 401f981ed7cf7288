//! A job's events → a response's output items, and the stream's events on the way.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::{
    Echo, IncompleteDetails, InputTokensDetails, OutputItem, OutputText, OutputTokensDetails, ReasoningText,
    ResponseError, ResponseObject, ResponseUsage,
};
use crate::queue::{Event, JobDone};
use crate::server::error::{ApiError, ErrorKind};
use crate::server::openai::render::{Head, TokenStep, chat_logprobs};
use crate::server::openai::types::unix_seconds;
use strata_engine::session::FinishReason as EngineFinish;
use strata_engine::toolcall::ToolEvent;

use crate::server::sse::{EventWriter, Frame};

/// Builds a response's output items from its job's events: reasoning, message text and
/// function calls, each an item of its own in the order they come. Streaming, each
/// change is also an event (`push` returns them).
pub struct Writer {
    head: Head,
    echo: Echo,
    logprobs: bool,
    /// Build the events (off for a whole response).
    streaming: bool,
    sequence: u64,
    items: Vec<OutputItem>,
    /// The item being written, by output index.
    open: Option<usize>,
    /// The output index of each tool call, by the call's index.
    calls: Vec<(usize, usize)>,
    /// Tokens whose text has not come yet; their log-probabilities go with it.
    pending: Vec<TokenStep>,
    /// Whitespace that came while no message was open: it opens none by itself.
    held: String,
    end: Option<End>,
}

enum End {
    Done(Box<JobDone>),
    Failed(ApiError),
}

/// `incomplete` when the token limit cut the text or a call ([`JobDone::cut_short`]).
fn status_word(done: &JobDone) -> &'static str {
    match done.cut_short() {
        true => "incomplete",
        false => "completed",
    }
}

impl Writer {
    pub fn new(head: Head, echo: Echo, logprobs: bool, streaming: bool) -> Self {
        Writer {
            head,
            echo,
            logprobs,
            streaming,
            sequence: 0,
            items: Vec::new(),
            open: None,
            calls: Vec::new(),
            pending: Vec::new(),
            held: String::new(),
            end: None,
        }
    }

    /// The whole response, once the job has ended. A call the token limit cut (its
    /// item never completed) is left out: only complete calls are answers.
    pub fn into_response(mut self) -> Result<ResponseObject, ApiError> {
        let cut = |item: &OutputItem| matches!(item, OutputItem::FunctionCall { status, .. } if status != "completed");
        self.items.retain(|item| !cut(item));
        match &self.end {
            Some(End::Done(done)) => Ok(self.snapshot(status_word(done))),
            Some(End::Failed(e)) => Err(e.clone()),
            None => Err(ApiError::worker_gone()),
        }
    }

    fn text(&mut self, text: String, out: &mut Vec<Frame>) {
        if text.is_empty() {
            return;
        }
        let open_message = matches!(self.open.map(|at| &self.items[at]), Some(OutputItem::Message { .. }));
        let text = if open_message {
            text
        } else {
            if text.trim().is_empty() {
                self.held.push_str(&text);
                return;
            }
            self.close(out, "completed");
            self.open_message(out);
            std::mem::take(&mut self.held) + &text
        };
        let steps = std::mem::take(&mut self.pending);
        let logprobs = chat_logprobs(&steps).content;
        let at = self.open.expect("a message is open");
        if let OutputItem::Message { id, content, .. } = &mut self.items[at] {
            content[0].text.push_str(&text);
            content[0].logprobs.extend(logprobs.iter().cloned());
            let id = id.clone();
            self.event(
                out,
                "response.output_text.delta",
                json!({"item_id": id, "output_index": at, "content_index": 0, "delta": text, "logprobs": logprobs}),
            );
        }
    }

    fn reasoning(&mut self, text: String, out: &mut Vec<Frame>) {
        // Reasoning tokens' log-probabilities are not reported.
        self.pending.clear();
        if text.is_empty() {
            return;
        }
        if !matches!(self.open.map(|at| &self.items[at]), Some(OutputItem::Reasoning { .. })) {
            self.close(out, "completed");
            self.held.clear();
            let at = self.items.len();
            let item = OutputItem::Reasoning {
                id: self.item_id("rs", at),
                status: "in_progress".into(),
                summary: Vec::new(),
                content: vec![ReasoningText { kind: "reasoning_text".into(), text: String::new() }],
            };
            self.open_item(item, out);
        }
        let at = self.open.expect("a reasoning item is open");
        if let OutputItem::Reasoning { id, content, .. } = &mut self.items[at] {
            content[0].text.push_str(&text);
            let id = id.clone();
            self.event(
                out,
                "response.reasoning_text.delta",
                json!({"item_id": id, "output_index": at, "content_index": 0, "delta": text}),
            );
        }
    }

    fn open_message(&mut self, out: &mut Vec<Frame>) {
        let at = self.items.len();
        let part = OutputText {
            kind: "output_text".into(),
            text: String::new(),
            annotations: Vec::new(),
            logprobs: Vec::new(),
        };
        let item = OutputItem::Message {
            id: self.item_id("msg", at),
            status: "in_progress".into(),
            role: "assistant".into(),
            content: vec![part],
        };
        self.open_item(item, out);
    }

    /// Adds an item and makes it the open one: `output_item.added` (with its content
    /// empty) and, for text, `content_part.added`.
    fn open_item(&mut self, item: OutputItem, out: &mut Vec<Frame>) {
        let at = self.items.len();
        let (added, part) = match &item {
            OutputItem::Message { id, status, role, content } => (
                OutputItem::Message { id: id.clone(), status: status.clone(), role: role.clone(), content: Vec::new() },
                Some((id.clone(), json!(content[0]))),
            ),
            OutputItem::Reasoning { id, status, summary, content } => (
                OutputItem::Reasoning {
                    id: id.clone(),
                    status: status.clone(),
                    summary: summary.clone(),
                    content: Vec::new(),
                },
                Some((id.clone(), json!(content[0]))),
            ),
            call => (call.clone(), None),
        };
        self.items.push(item);
        self.open = Some(at);
        self.event(out, "response.output_item.added", json!({"output_index": at, "item": added}));
        if let Some((id, part)) = part {
            self.event(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": at, "content_index": 0, "part": part}),
            );
        }
    }

    /// Ends the open item with `status`: its `….done` events and `output_item.done`.
    fn close(&mut self, out: &mut Vec<Frame>, status: &str) {
        let Some(at) = self.open.take() else { return };
        match &mut self.items[at] {
            OutputItem::Message { id, status: s, content, .. } => {
                *s = status.into();
                let (id, part) = (id.clone(), content[0].clone());
                let body = json!({"item_id": id, "output_index": at, "content_index": 0, "text": part.text, "logprobs": part.logprobs});
                self.event(out, "response.output_text.done", body);
                let body = json!({"item_id": id, "output_index": at, "content_index": 0, "part": part});
                self.event(out, "response.content_part.done", body);
            }
            OutputItem::Reasoning { id, status: s, content, .. } => {
                *s = status.into();
                let (id, part) = (id.clone(), content[0].clone());
                let body = json!({"item_id": id, "output_index": at, "content_index": 0, "text": part.text});
                self.event(out, "response.reasoning_text.done", body);
                let body = json!({"item_id": id, "output_index": at, "content_index": 0, "part": part});
                self.event(out, "response.content_part.done", body);
            }
            OutputItem::FunctionCall { id, name, arguments, status: s, .. } => {
                *s = status.into();
                let body = json!({"item_id": id, "output_index": at, "name": name, "arguments": arguments});
                self.event(out, "response.function_call_arguments.done", body);
            }
        }
        let item = json!(self.items[at]);
        self.event(out, "response.output_item.done", json!({"output_index": at, "item": item}));
    }

    fn fail(&mut self, e: ApiError) -> Vec<Frame> {
        let mut out = Vec::new();
        let code = match e.kind {
            ErrorKind::InvalidRequest => "invalid_prompt",
            ErrorKind::ContextLength => "context_length_exceeded",
            _ => "server_error",
        };
        self.event(&mut out, "error", json!({"code": code, "message": e.message, "param": e.param}));
        let mut response = self.snapshot("failed");
        response.error = Some(ResponseError { code: code.into(), message: e.message.clone() });
        self.event(&mut out, "response.failed", json!({ "response": response }));
        self.end = Some(End::Failed(e));
        out
    }

    fn call_at(&self, index: usize) -> Option<usize> {
        self.calls.iter().find(|(i, _)| *i == index).map(|&(_, at)| at)
    }

    /// `msg_…`, `rs_…`, `fc_…`: the response id's digits and the output index.
    fn item_id(&self, prefix: &str, at: usize) -> String {
        let digits = self.head.id.strip_prefix("resp_").unwrap_or(&self.head.id);
        format!("{prefix}_{digits}{at:02x}")
    }

    fn event(&mut self, out: &mut Vec<Frame>, name: &'static str, mut body: Value) {
        if !self.streaming {
            return;
        }
        if let Some(obj) = body.as_object_mut() {
            obj.insert("type".into(), json!(name));
            obj.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence += 1;
        out.push((name, body.to_string()));
    }

    fn snapshot(&self, status: &str) -> ResponseObject {
        let done = match &self.end {
            Some(End::Done(d)) => Some(d),
            _ => None,
        };
        let echo = self.echo.clone();
        ResponseObject {
            id: self.head.id.clone(),
            object: "response".into(),
            created_at: self.head.created,
            completed_at: done.map(|_| unix_seconds(SystemTime::now())),
            status: status.into(),
            background: false,
            error: None,
            incomplete_details: (status == "incomplete")
                .then(|| IncompleteDetails { reason: "max_output_tokens".into() }),
            instructions: echo.instructions,
            max_output_tokens: echo.max_output_tokens,
            model: self.head.model.clone(),
            output: self.items.clone(),
            parallel_tool_calls: echo.parallel_tool_calls,
            previous_response_id: None,
            reasoning: echo.reasoning,
            store: false,
            temperature: echo.temperature,
            text: echo.text,
            tool_choice: echo.tool_choice,
            tools: echo.tools,
            top_logprobs: echo.top_logprobs,
            top_p: echo.top_p,
            truncation: "disabled".into(),
            usage: done.map(|d| ResponseUsage {
                input_tokens: d.prompt_tokens,
                input_tokens_details: InputTokensDetails { cached_tokens: d.cached_tokens },
                output_tokens: d.completion_tokens,
                output_tokens_details: OutputTokensDetails { reasoning_tokens: d.reasoning_tokens },
                total_tokens: d.prompt_tokens + d.completion_tokens,
            }),
            user: echo.user,
            metadata: echo.metadata,
        }
    }
}

impl EventWriter for Writer {
    /// The response created and in progress.
    fn start(&mut self) -> Vec<Frame> {
        let mut out = Vec::new();
        for name in ["response.created", "response.in_progress"] {
            let response = self.snapshot("in_progress");
            self.event(&mut out, name, json!({ "response": response }));
        }
        out
    }

    fn push(&mut self, ev: Event) -> Vec<Frame> {
        let mut out = Vec::new();
        if self.end.is_some() {
            return out;
        }
        match ev {
            Event::Token { sampled, top } => {
                if self.logprobs {
                    self.pending.push(TokenStep { sampled, top });
                }
            }
            Event::Text(text) => self.text(text, &mut out),
            Event::Reasoning(text) => self.reasoning(text, &mut out),
            Event::Tool(ToolEvent::Begin { index, id, name }) => {
                self.close(&mut out, "completed");
                self.held.clear();
                self.pending.clear();
                let at = self.items.len();
                let item = OutputItem::FunctionCall {
                    id: self.item_id("fc", at),
                    call_id: id,
                    name,
                    arguments: String::new(),
                    status: "in_progress".into(),
                };
                self.calls.push((index, at));
                self.open_item(item, &mut out);
            }
            Event::Tool(ToolEvent::Args { index, fragment }) => {
                let Some(at) = self.call_at(index) else { return out };
                if let OutputItem::FunctionCall { id, arguments, .. } = &mut self.items[at] {
                    arguments.push_str(&fragment);
                    let id = id.clone();
                    self.event(
                        &mut out,
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": at, "delta": fragment}),
                    );
                }
            }
            Event::Tool(ToolEvent::End { index, call }) => {
                let Some(at) = self.call_at(index) else { return out };
                if let OutputItem::FunctionCall { arguments, .. } = &mut self.items[at] {
                    *arguments = call.arguments;
                }
                if self.open == Some(at) {
                    self.close(&mut out, "completed");
                }
            }
            Event::Tool(ToolEvent::Text(text)) => self.text(text, &mut out),
            Event::Done(done) => {
                if done.finish == EngineFinish::Cancelled {
                    let e = ApiError::new(
                        ErrorKind::Unavailable,
                        "the generation was cancelled: the server is shutting down",
                    );
                    return self.fail(e);
                }
                let status = status_word(&done);
                if let Some(OutputItem::Message { content, .. }) = self.open.map(|at| &mut self.items[at]) {
                    let steps = std::mem::take(&mut self.pending);
                    content[0].logprobs.extend(chat_logprobs(&steps).content);
                }
                self.close(&mut out, status);
                if self.items.is_empty() {
                    // Nothing was generated but the end: an empty message.
                    self.open_message(&mut out);
                    self.close(&mut out, status);
                }
                let name = if status == "completed" { "response.completed" } else { "response.incomplete" };
                self.end = Some(End::Done(Box::new(done)));
                let response = self.snapshot(status);
                self.event(&mut out, name, json!({ "response": response }));
            }
            Event::Error(e) => return self.fail(e.into()),
            Event::Started { .. } | Event::Embeddings { .. } | Event::Loaded { .. } | Event::Unloaded => {}
        }
        out
    }

    fn closed(&mut self) -> Vec<Frame> {
        match self.end {
            Some(_) => Vec::new(),
            None => self.fail(ApiError::worker_gone()),
        }
    }

    fn is_finished(&self) -> bool {
        self.end.is_some()
    }
}
