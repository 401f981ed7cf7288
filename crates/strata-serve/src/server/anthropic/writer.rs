//! A job's events → a reply's content blocks, and Anthropic's stream events on the way.

use serde_json::{Value, json};

use super::{AnthropicUsage, ContentBlock, MessageResponse};
use crate::queue::{Event, JobDone};
use crate::server::error::{ApiError, ErrorKind};
use strata_engine::session::FinishReason as EngineFinish;
use strata_engine::toolcall::ToolEvent;

use crate::server::sse::{EventWriter, Frame};

/// Builds a reply's content blocks from its job's events: reasoning, text and tool calls,
/// each a block of its own in the order they come. Streaming, each change is also an
/// event (`push` returns them): `message_start` once the job started, then per block
/// `content_block_start`, its deltas and `content_block_stop`, and last `message_delta`
/// (the stop reason and the usage) and `message_stop`; or an `error` event.
pub struct Writer {
    message: MessageResponse,
    /// Build the events (off for a whole reply).
    streaming: bool,
    started: bool,
    /// The block being written.
    open: Option<usize>,
    /// Each tool call's block and arguments text, by the call's index.
    calls: Vec<(usize, usize, String)>,
    /// Whitespace that came while no text block was open: it opens none by itself.
    held: String,
    end: Option<Result<(), ApiError>>,
}

impl Writer {
    pub fn new(id: String, model: String, streaming: bool) -> Self {
        Writer {
            message: MessageResponse {
                id,
                kind: "message".into(),
                role: "assistant".into(),
                model,
                content: Vec::new(),
                stop_reason: None,
                stop_sequence: None,
                usage: AnthropicUsage::default(),
            },
            streaming,
            started: false,
            open: None,
            calls: Vec::new(),
            held: String::new(),
            end: None,
        }
    }

    /// The whole reply, once the job has ended.
    pub fn into_message(self) -> Result<MessageResponse, ApiError> {
        match self.end {
            Some(Ok(())) => Ok(self.message),
            Some(Err(e)) => Err(e),
            None => Err(ApiError::worker_gone()),
        }
    }

    fn start(&mut self, out: &mut Vec<Frame>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!(self.message);
        self.event(out, "message_start", json!({ "message": message }));
    }

    fn done(&mut self, done: &JobDone, mut out: Vec<Frame>) -> Vec<Frame> {
        if done.finish == EngineFinish::Cancelled {
            return self.fail(ApiError::new(
                ErrorKind::Unavailable,
                "the generation was cancelled: the server is shutting down",
            ));
        }
        self.close(&mut out);
        let reason = match (done.finish, &done.stop_sequence) {
            _ if done.cut_short() => "max_tokens",
            _ if !done.tool_calls.is_empty() => "tool_use",
            (_, Some(_)) => "stop_sequence",
            _ => "end_turn",
        };
        let usage = &mut self.message.usage;
        usage.input_tokens = done.prompt_tokens.saturating_sub(done.cached_tokens);
        usage.cache_read_input_tokens = done.cached_tokens;
        usage.output_tokens = done.completion_tokens;
        self.message.stop_reason = Some(reason.into());
        self.message.stop_sequence = done.stop_sequence.clone();
        let usage = json!(self.message.usage);
        self.event(
            &mut out,
            "message_delta",
            json!({"delta": {"stop_reason": reason, "stop_sequence": done.stop_sequence}, "usage": usage}),
        );
        self.event(&mut out, "message_stop", json!({}));
        self.end = Some(Ok(()));
        out
    }

    fn text(&mut self, text: String, out: &mut Vec<Frame>) {
        if text.is_empty() {
            return;
        }
        let text = match self.open.map(|at| &self.message.content[at]) {
            Some(ContentBlock::Text { .. }) => text,
            _ if text.trim().is_empty() => {
                self.held.push_str(&text);
                return;
            }
            _ => {
                self.close(out);
                self.open_block(ContentBlock::Text { text: String::new() }, out);
                std::mem::take(&mut self.held) + &text
            }
        };
        let at = self.open.expect("a text block is open");
        if let ContentBlock::Text { text: all } = &mut self.message.content[at] {
            all.push_str(&text);
        }
        self.event(out, "content_block_delta", json!({"index": at, "delta": {"type": "text_delta", "text": text}}));
    }

    fn thinking(&mut self, text: String, out: &mut Vec<Frame>) {
        if text.is_empty() {
            return;
        }
        if !matches!(self.open.map(|at| &self.message.content[at]), Some(ContentBlock::Thinking { .. })) {
            self.close(out);
            self.held.clear();
            self.open_block(ContentBlock::Thinking { thinking: String::new(), signature: String::new() }, out);
        }
        let at = self.open.expect("a thinking block is open");
        if let ContentBlock::Thinking { thinking, .. } = &mut self.message.content[at] {
            thinking.push_str(&text);
        }
        let delta = json!({"type": "thinking_delta", "thinking": text});
        self.event(out, "content_block_delta", json!({"index": at, "delta": delta}));
    }

    fn open_block(&mut self, block: ContentBlock, out: &mut Vec<Frame>) {
        let at = self.message.content.len();
        let start = json!(block);
        self.message.content.push(block);
        self.open = Some(at);
        self.event(out, "content_block_start", json!({"index": at, "content_block": start}));
    }

    /// Ends the open block; a tool call's input becomes its arguments, parsed (a call cut
    /// short keeps `{}`).
    fn close(&mut self, out: &mut Vec<Frame>) {
        let Some(at) = self.open.take() else { return };
        if let Some((_, _, args)) = self.calls.iter().find(|(_, a, _)| *a == at)
            && let (ContentBlock::ToolUse { input, .. }, Ok(parsed)) =
                (&mut self.message.content[at], serde_json::from_str::<Value>(args))
        {
            *input = parsed;
        }
        self.event(out, "content_block_stop", json!({ "index": at }));
    }

    fn fail(&mut self, e: ApiError) -> Vec<Frame> {
        let mut out = Vec::new();
        let body = json!(e.anthropic_body());
        self.event(&mut out, "error", body);
        self.end = Some(Err(e));
        out
    }

    fn event(&mut self, out: &mut Vec<Frame>, name: &'static str, mut body: Value) {
        if !self.streaming {
            return;
        }
        if let Some(obj) = body.as_object_mut() {
            obj.insert("type".into(), json!(name));
        }
        out.push((name, body.to_string()));
    }
}

impl EventWriter for Writer {
    fn push(&mut self, ev: Event) -> Vec<Frame> {
        let mut out = Vec::new();
        if self.end.is_some() {
            return out;
        }
        if let Event::Started { prompt_tokens, cached_tokens } = ev {
            self.message.usage.input_tokens = prompt_tokens.saturating_sub(cached_tokens);
            self.message.usage.cache_read_input_tokens = cached_tokens;
            self.start(&mut out);
            return out;
        }
        // An error before anything else is the stream's only event.
        if !matches!(ev, Event::Error(_)) {
            self.start(&mut out);
        }
        match ev {
            Event::Text(text) => self.text(text, &mut out),
            Event::Reasoning(text) => self.thinking(text, &mut out),
            Event::Tool(ToolEvent::Begin { index, id, name }) => {
                self.close(&mut out);
                self.held.clear();
                let at = self.message.content.len();
                self.calls.push((index, at, String::new()));
                self.open_block(ContentBlock::ToolUse { id, name, input: json!({}) }, &mut out);
            }
            Event::Tool(ToolEvent::Args { index, fragment }) => {
                if let Some((_, at, args)) = self.calls.iter_mut().find(|(i, _, _)| *i == index) {
                    args.push_str(&fragment);
                    let at = *at;
                    self.event(
                        &mut out,
                        "content_block_delta",
                        json!({"index": at, "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                    );
                }
            }
            Event::Tool(ToolEvent::End { index, call }) => {
                if let Some((_, at, args)) = self.calls.iter_mut().find(|(i, _, _)| *i == index) {
                    *args = call.arguments;
                    if self.open == Some(*at) {
                        self.close(&mut out);
                    }
                }
            }
            Event::Tool(ToolEvent::Text(text)) => self.text(text, &mut out),
            Event::Done(done) => return self.done(&done, out),
            Event::Error(e) => return self.fail(e.into()),
            Event::Token { .. }
            | Event::Started { .. }
            | Event::Embeddings { .. }
            | Event::Loaded { .. }
            | Event::Unloaded => {}
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
