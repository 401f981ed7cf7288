//! Job results → response bodies: whole completions, the chunks of a stream (a plain
//! state machine over the job's events), and log-probabilities in both OpenAI shapes.

use axum::response::{IntoResponse, Json, Response};
use serde_json::Value;

use super::SYSTEM_FINGERPRINT;
use super::plan::Api;
use super::types::*;
use crate::queue::{Event, JobDone, TokenLogprob};
use crate::server::error::{ApiError, ErrorKind};
use strata_engine::session::FinishReason as EngineFinish;
use strata_engine::toolcall::ToolEvent;

/// The logprob reported for an impossible token (JSON has no -inf; OpenAI uses this).
const IMPOSSIBLE_LOGPROB: f32 = -9999.0;

/// What every chunk of one response repeats.
#[derive(Clone, Debug)]
pub(super) struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// Turns a job's events into the `data:` payloads of one streamed response: for chat a
/// role chunk, content chunks, a chunk with an empty delta and the finish reason, the
/// usage chunk (with `include_usage`), then `[DONE]`; an error is a last
/// `{"error": {...}}` payload.
pub(super) struct ChunkWriter {
    api: Api,
    head: Head,
    include_usage: bool,
    logprobs: bool,
    /// Tokens whose text has not been sent yet (held back by detokenization or stop
    /// matching); their log-probabilities go out with the next text.
    pending: Vec<TokenStep>,
    /// Characters of completion text sent so far (legacy `text_offset`).
    text_offset: usize,
    finished: bool,
    failed: bool,
    /// The choice's index.
    index: u32,
    /// Whether this writer's choice is the response's only one, and so ends the stream
    /// (the usage chunk and `[DONE]`) when it ends; else [`ChunkWriter::end`] does.
    solo: bool,
}

impl ChunkWriter {
    pub fn new(api: Api, head: Head, include_usage: bool, logprobs: bool) -> Self {
        ChunkWriter {
            api,
            head,
            include_usage,
            logprobs,
            pending: Vec::new(),
            text_offset: 0,
            finished: false,
            failed: false,
            index: 0,
            solo: true,
        }
    }

    /// The writer of choice `index` of several: its chunks carry the index, and the
    /// stream ends with [`ChunkWriter::end`] once every choice has finished.
    pub fn for_choice(api: Api, head: Head, include_usage: bool, logprobs: bool, index: u32) -> Self {
        ChunkWriter { index, solo: false, ..ChunkWriter::new(api, head, include_usage, logprobs) }
    }

    /// The stream's last payloads: the usage chunk (with `include_usage`), then `[DONE]`.
    pub fn end(&self, usage: Usage) -> Vec<String> {
        let usage = match self.api {
            Api::Chat => usage,
            Api::Completion => usage.plain(),
        };
        let mut out = Vec::new();
        if self.include_usage {
            out.push(self.usage_chunk(usage));
        }
        out.push("[DONE]".to_string());
        out
    }

    /// What goes out before any event: the assistant role, for chat.
    pub fn start(&mut self) -> Vec<String> {
        match self.api {
            Api::Chat => {
                let delta = Delta { role: Some("assistant".into()), content: Some(String::new()), ..Delta::default() };
                vec![self.chunk(delta, None)]
            }
            Api::Completion => Vec::new(),
        }
    }

    pub fn push(&mut self, ev: Event) -> Vec<String> {
        if self.finished {
            return Vec::new();
        }
        match ev {
            Event::Token { sampled, top } => {
                if self.logprobs {
                    self.pending.push(TokenStep { sampled, top });
                }
                Vec::new()
            }
            Event::Text(text) if text.is_empty() => Vec::new(),
            Event::Text(text) => {
                let delta = Delta { content: Some(text), ..Delta::default() };
                vec![self.chunk(delta, None)]
            }
            Event::Tool(ToolEvent::Begin { index, id, name }) => {
                let call = ToolCallDelta {
                    index,
                    id: Some(id),
                    kind: Some("function".into()),
                    function: FunctionDelta { name: Some(name), arguments: Some(String::new()) },
                };
                vec![self.chunk(Delta { tool_calls: Some(vec![call]), ..Delta::default() }, None)]
            }
            Event::Tool(ToolEvent::Args { index, fragment }) => {
                let call = ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionDelta { name: None, arguments: Some(fragment) },
                };
                vec![self.chunk(Delta { tool_calls: Some(vec![call]), ..Delta::default() }, None)]
            }
            Event::Tool(_) => Vec::new(),
            Event::Reasoning(text) => {
                let delta = Delta { reasoning_content: Some(text), ..Delta::default() };
                vec![self.chunk(delta, None)]
            }
            Event::Done(done) => match finish_reason(&done) {
                Ok(finish) => {
                    self.finished = true;
                    let mut out = vec![self.chunk(Delta::default(), Some((finish, Timings::of(&done))))];
                    if self.solo {
                        out.extend(self.end(Usage::of(&done)));
                    }
                    out
                }
                Err(e) => self.error(e),
            },
            Event::Error(e) => self.error(e.into()),
            // Not events of a generation.
            Event::Started { .. } | Event::Embeddings { .. } | Event::Loaded { .. } | Event::Unloaded => Vec::new(),
        }
    }

    /// Whether the last payload went out (`[DONE]` or an error).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The channel closed before a final event.
    pub fn closed(&mut self) -> Vec<String> {
        match self.finished {
            true => Vec::new(),
            false => self.error(ApiError::worker_gone()),
        }
    }

    /// Whether the choice ended in an error payload (which ends the whole stream).
    pub fn failed(&self) -> bool {
        self.failed
    }

    fn error(&mut self, e: ApiError) -> Vec<String> {
        self.finished = true;
        self.failed = true;
        vec![serde_json::to_string(&e.openai_body()).unwrap_or_default()]
    }

    /// One chunk with a choice; it carries the log-probabilities of the tokens whose
    /// text it (or, for the last chunk, nothing) completes, and the last chunk its
    /// finish reason and the timings.
    fn chunk(&mut self, delta: Delta, end: Option<(FinishReason, Timings)>) -> String {
        let (finish, timings) = end.unzip();
        let steps = std::mem::take(&mut self.pending);
        let has_logprobs =
            self.logprobs && (!steps.is_empty() || delta.content.as_ref().is_some_and(|c| !c.is_empty()));
        // With `include_usage`, every chunk but the last says `"usage": null`.
        let usage = self.include_usage.then_some(None);
        match self.api {
            Api::Chat => {
                let logprobs = has_logprobs.then(|| chat_logprobs(&steps));
                let choice = ChunkChoice { index: self.index, delta, logprobs, finish_reason: finish };
                self.chat_chunk(vec![choice], usage, timings)
            }
            Api::Completion => {
                let logprobs = has_logprobs.then(|| completion_logprobs(&steps, &mut self.text_offset));
                let text = delta.content.unwrap_or_default();
                let choice = CompletionChoice { index: self.index, text, logprobs, finish_reason: finish };
                self.completion_chunk(vec![choice], usage, timings)
            }
        }
    }

    fn usage_chunk(&self, usage: Usage) -> String {
        match self.api {
            Api::Chat => self.chat_chunk(Vec::new(), Some(Some(usage)), None),
            Api::Completion => self.completion_chunk(Vec::new(), Some(Some(usage)), None),
        }
    }

    fn chat_chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Option<Usage>>, timings: Option<Timings>) -> String {
        let h = &self.head;
        serde_json::to_string(&ChatCompletionChunk {
            id: h.id.clone(),
            object: "chat.completion.chunk".into(),
            created: h.created,
            model: h.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT.into(),
            choices,
            usage,
            timings,
        })
        .unwrap_or_default()
    }

    fn completion_chunk(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<Usage>>,
        timings: Option<Timings>,
    ) -> String {
        let h = &self.head;
        serde_json::to_string(&CompletionResponse {
            id: h.id.clone(),
            object: "text_completion".into(),
            created: h.created,
            model: h.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT.into(),
            choices,
            usage,
            timings,
        })
        .unwrap_or_default()
    }
}

/// A whole generation.
pub(super) struct Generation {
    pub text: String,
    /// Reasoning split from the answer (empty when there was none).
    pub reasoning: String,
    pub steps: Vec<TokenStep>,
    pub done: JobDone,
}

/// One generated token with its alternatives.
#[derive(Clone, Debug)]
pub(super) struct TokenStep {
    pub sampled: TokenLogprob,
    pub top: Vec<TokenLogprob>,
}

/// The finish reason: `length` when the token limit cut the text or a call
/// ([`JobDone::cut_short`]), else `tool_calls` when the reply called tools.
fn finish_reason(done: &JobDone) -> Result<FinishReason, ApiError> {
    match done.finish {
        EngineFinish::Stop | EngineFinish::Length if done.cut_short() => Ok(FinishReason::Length),
        EngineFinish::Stop | EngineFinish::Length if !done.tool_calls.is_empty() => Ok(FinishReason::ToolCalls),
        EngineFinish::Stop | EngineFinish::Length => Ok(FinishReason::Stop),
        EngineFinish::Cancelled => {
            Err(ApiError::new(ErrorKind::Unavailable, "the generation was cancelled: the server is shutting down"))
        }
    }
}

/// The whole response to a request whose choices generated `gens`, in choice order, `n`
/// to a prompt.
pub(super) fn whole_response(
    head: &Head,
    api: Api,
    logprobs: bool,
    gens: Vec<Generation>,
    n: usize,
) -> Result<Response, ApiError> {
    let usage = Usage::of_choices(gens.iter().map(|g| &g.done), n);
    let timings = Timings::of_choices(gens.iter().map(|g| &g.done), n);
    let finishes = gens.iter().map(|g| finish_reason(&g.done)).collect::<Result<Vec<_>, _>>()?;
    let indexed = gens.into_iter().zip(finishes).zip(0u32..);
    let resp = match api {
        Api::Chat => Json(ChatCompletionResponse {
            id: head.id.clone(),
            object: "chat.completion".into(),
            created: head.created,
            model: head.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT.into(),
            choices: indexed
                .map(|((g, finish), index)| ChatChoice {
                    index,
                    logprobs: logprobs.then(|| chat_logprobs(&g.steps)),
                    message: assistant_message(g.text, g.reasoning, &g.done),
                    finish_reason: finish,
                })
                .collect(),
            usage,
            timings,
        })
        .into_response(),
        Api::Completion => Json(CompletionResponse {
            id: head.id.clone(),
            object: "text_completion".into(),
            created: head.created,
            model: head.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT.into(),
            choices: indexed
                .map(|((g, finish), index)| CompletionChoice {
                    index,
                    logprobs: logprobs.then(|| completion_logprobs(&g.steps, &mut 0)),
                    text: g.text,
                    finish_reason: Some(finish),
                })
                .collect(),
            usage: Some(Some(usage.plain())),
            timings: Some(timings),
        })
        .into_response(),
    };
    Ok(resp)
}

/// The reply as a message: its text (null when it only called tools) and its calls.
fn assistant_message(text: String, reasoning: String, done: &JobDone) -> AssistantMessage {
    let reasoning_content = (!reasoning.is_empty()).then_some(reasoning);
    if done.tool_calls.is_empty() {
        return AssistantMessage { role: "assistant".into(), content: Some(text), reasoning_content, tool_calls: None };
    }
    let calls = done
        .tool_calls
        .iter()
        .map(|c| ToolCallOut {
            id: c.id.clone(),
            kind: "function".into(),
            function: FunctionCallOut { name: c.name.clone(), arguments: c.arguments.clone() },
        })
        .collect();
    let content = (!text.trim().is_empty()).then_some(text);
    AssistantMessage { role: "assistant".into(), content, reasoning_content, tool_calls: Some(calls) }
}

fn finite(lp: f32) -> f32 {
    if lp.is_finite() { lp } else { IMPOSSIBLE_LOGPROB }
}

pub(super) fn chat_logprobs(steps: &[TokenStep]) -> ChatLogprobs {
    let content = steps
        .iter()
        .map(|s| ChatTokenLogprob {
            token: s.sampled.text.clone(),
            logprob: finite(s.sampled.logprob),
            bytes: s.sampled.bytes.clone(),
            top_logprobs: s
                .top
                .iter()
                .map(|t| TopLogprob { token: t.text.clone(), logprob: finite(t.logprob), bytes: t.bytes.clone() })
                .collect(),
        })
        .collect();
    ChatLogprobs { content }
}

/// The legacy shape; `offset` is where the first token starts in the generated text and
/// moves past the last one.
fn completion_logprobs(steps: &[TokenStep], offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for s in steps {
        out.tokens.push(s.sampled.text.clone());
        out.token_logprobs.push(finite(s.sampled.logprob));
        let mut top = serde_json::Map::new();
        for t in s.top.iter().chain(std::iter::once(&s.sampled)) {
            top.entry(t.text.clone()).or_insert_with(|| Value::from(finite(t.logprob)));
        }
        out.top_logprobs.push(top);
        out.text_offset.push(*offset);
        *offset += s.sampled.text.chars().count();
    }
    out
}

#[cfg(test)]
mod tests {

    use serde_json::json;

    use super::*;
    use crate::queue::JobError;
    use strata_engine::toolcall::ToolCall;

    fn head() -> Head {
        Head { id: "chatcmpl-1".into(), created: 7, model: "m".into() }
    }

    fn token(id: u32, text: &str, logprob: f32) -> Event {
        let t =
            |id, text: &str, logprob| TokenLogprob { id, text: text.into(), bytes: text.as_bytes().to_vec(), logprob };
        Event::Token { sampled: t(id, text, logprob), top: vec![t(id, text, logprob), t(99, "alt", -3.0)] }
    }

    fn done(finish: EngineFinish) -> Event {
        Event::Done(JobDone::ended(finish, 4, 3))
    }

    /// Runs a writer over `events`: every payload, JSON-decoded (`[DONE]` as a string).
    fn run(mut w: ChunkWriter, events: Vec<Event>) -> Vec<Value> {
        let mut out = w.start();
        for ev in events {
            out.extend(w.push(ev));
        }
        out.extend(w.closed());
        out.iter().map(|s| serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))).collect()
    }

    #[test]
    fn a_limit_that_cut_a_call_is_length_and_one_after_the_calls_is_tool_calls() {
        let call = ToolCall { id: "call_1".into(), name: "f".into(), arguments: "{}".into() };
        let reason = |finish, calls: Vec<ToolCall>, cut| {
            let done = JobDone { tool_calls: calls, tool_cut: cut, ..JobDone::ended(finish, 4, 3) };
            finish_reason(&done).unwrap()
        };
        assert_eq!(reason(EngineFinish::Length, vec![call.clone()], true), FinishReason::Length);
        assert_eq!(reason(EngineFinish::Length, vec![call.clone()], false), FinishReason::ToolCalls);
        assert_eq!(reason(EngineFinish::Length, Vec::new(), true), FinishReason::Length);
        assert_eq!(reason(EngineFinish::Length, Vec::new(), false), FinishReason::Length);
        assert_eq!(reason(EngineFinish::Stop, vec![call], false), FinishReason::ToolCalls);
        assert_eq!(reason(EngineFinish::Stop, Vec::new(), false), FinishReason::Stop);
    }

    #[test]
    fn chat_stream_sequence() {
        let w = ChunkWriter::new(Api::Chat, head(), true, false);
        let events = vec![
            token(1, "Hel", -0.5),
            Event::Text("Hel".into()),
            token(2, "lo", -0.25),
            Event::Text("lo".into()),
            token(3, "<eos>", -0.1),
            done(EngineFinish::Stop),
        ];
        let out = run(w, events);
        assert_eq!(out.len(), 6, "{out:?}");
        assert_eq!(out[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(out[1]["choices"][0]["delta"], json!({"content": "Hel"}));
        assert_eq!(out[2]["choices"][0]["delta"], json!({"content": "lo"}));
        assert_eq!(out[3]["choices"][0], json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}));
        assert_eq!(out[4]["choices"], json!([]));
        assert_eq!(
            out[4]["usage"],
            json!({"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}})
        );
        assert_eq!(out[5], "[DONE]");
        // The finish chunk alone carries llama-server's timings.
        let t = &out[3]["timings"];
        assert_eq!(
            (t["prompt_n"].as_u64(), t["predicted_n"].as_u64(), t["draft_n"].as_u64()),
            (Some(4), Some(3), Some(0))
        );
        assert!(out.iter().enumerate().all(|(i, c)| i == 3 || c.get("timings").is_none()), "{out:?}");
        for c in &out[..5] {
            assert_eq!((c["id"].as_str(), c["created"].as_u64()), (Some("chatcmpl-1"), Some(7)));
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["system_fingerprint"], SYSTEM_FINGERPRINT);
        }
        for c in &out[..4] {
            assert!(c.get("usage").is_some_and(Value::is_null), "{c}");
        }
    }

    #[test]
    fn chat_stream_logprobs_follow_the_text() {
        let w = ChunkWriter::new(Api::Chat, head(), false, true);
        let events = vec![
            token(1, "a", -0.5),
            token(2, "b", -0.25), // held back, then sent with one piece of text
            Event::Text("ab".into()),
            token(3, "<eos>", f32::NEG_INFINITY),
            done(EngineFinish::Stop),
        ];
        let out = run(w, events);
        assert!(out[0]["choices"][0]["logprobs"].is_null());
        let content = out[1]["choices"][0]["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[0]["token"], "a");
        assert_eq!(content[0]["bytes"], json!([97]));
        assert_eq!(content[1]["top_logprobs"][1], json!({"token": "alt", "logprob": -3.0, "bytes": [97, 108, 116]}));
        // The eos token, which has no text, goes out with the last chunk; -inf is finite in JSON.
        let last = &out[2]["choices"][0];
        assert_eq!(last["finish_reason"], "stop");
        assert_eq!(last["logprobs"]["content"][0]["logprob"], json!(IMPOSSIBLE_LOGPROB));
        assert!(out[2].get("usage").is_none());
        assert_eq!(out[3], "[DONE]");
    }

    #[test]
    fn completion_stream_sequence_and_offsets() {
        let w = ChunkWriter::new(Api::Completion, Head { id: "cmpl-1".into(), ..head() }, false, true);
        let events = vec![
            token(1, "héllo", -0.5),
            Event::Text("héllo".into()),
            token(2, " w", -0.25),
            Event::Text(" w".into()),
            done(EngineFinish::Length),
        ];
        let out = run(w, events);
        assert_eq!(out.len(), 4, "no role chunk for completions: {out:?}");
        assert_eq!(out[0]["object"], "text_completion");
        assert_eq!(out[0]["choices"][0]["text"], "héllo");
        let lp = &out[1]["choices"][0]["logprobs"];
        assert_eq!(lp["tokens"], json!([" w"]));
        assert_eq!(lp["token_logprobs"], json!([-0.25]));
        assert_eq!(lp["text_offset"], json!([5]), "characters, not bytes");
        assert_eq!(lp["top_logprobs"], json!([{" w": -0.25, "alt": -3.0}]));
        assert_eq!(out[2]["choices"][0]["text"], "");
        assert_eq!(out[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(out[3], "[DONE]");
    }

    #[test]
    fn errors_end_the_stream() {
        let w = ChunkWriter::new(Api::Chat, head(), true, false);
        let err = Event::Error(JobError::Internal("boom".into()));
        let out = run(w, vec![Event::Text("a".into()), err, Event::Text("late".into()), done(EngineFinish::Stop)]);
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[2], json!({"error": {"message": "boom", "type": "server_error", "param": null, "code": null}}));

        // The worker went away without a result.
        let out = run(ChunkWriter::new(Api::Chat, head(), false, false), vec![Event::Text("a".into())]);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2]["error"]["type"], "server_error");

        // A generation cut short by shutdown is not a normal finish.
        let out = run(ChunkWriter::new(Api::Completion, head(), false, false), vec![done(EngineFinish::Cancelled)]);
        assert_eq!(out.len(), 1);
        assert!(out[0]["error"]["message"].as_str().unwrap().contains("shutting down"));
    }
}
