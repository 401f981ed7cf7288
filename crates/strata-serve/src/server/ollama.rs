//! The Ollama API (`/api/*`): generate and chat as NDJSON streams, embeddings, and the
//! model routes (`tags`, `show`, `ps`, `copy`, `delete`, `version`).
//!
//! Shapes follow Ollama's `docs/api.md` and what the ollama Python/JS libraries and Open
//! WebUI read. Each body is parsed ([`super::parse_json`], any Content-Type) and checked
//! here into a [`Work`] for the queue; features Ollama has and Strata does not yet
//! (`format`, `tools`, `images`, `suffix`, custom `template`, `think`) are refused with a
//! 400 naming the field rather than ignored.
//!
//! Sampling defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9, min_p 0,
//! repeat_penalty 1.1, repeat_last_n 64), overridden by the model's
//! `generation_config.json` (what `/api/show` lists as `parameters`, as a Modelfile's
//! `PARAMETER` lines would be), overridden by the request's `options`.

mod checks;
mod create;
mod embed;
mod models;
mod pull;
mod types;

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use tokio::sync::mpsc::UnboundedReceiver;
use utoipa::OpenApi;

pub use types::*;

use super::error::{ApiError, ErrorKind, OllamaError, OllamaErrorBody};
use super::{AppState, parse_json, streaming_body};
use crate::queue::models::ModelInfo;
use crate::queue::{Event, GenerateJob, JobDone, KeepAlive, PromptInput, TokenLogprob, Work};
use crate::server::speculative::{FlatKeys, spec_request};
use crate::server::tools::{history_calls, tool_choice, tool_definitions};
use checks::{Think, format_grammar, keep_alive, refuse_non_empty, require_model, resolve_options, think};
use create::{__path_blob_head, __path_blob_post, __path_create, CreateRequest, blob_head, blob_post, create};
use embed::{__path_embed, __path_embeddings, embed, embeddings};
use models::{
    __path_copy, __path_delete_model, __path_ps, __path_show, __path_tags, __path_version, copy, delete_model, ps,
    show, tags, version,
};
use pull::{__path_pull, PullRequest, PullStatus, pull};
use serde_json::Value;
use strata_engine::grammar::GrammarSpec;
use strata_engine::session::FinishReason;
use strata_engine::speculative::SpecRequest;
use strata_engine::template::ChatMessage;
use strata_engine::toolcall::{ToolCall, ToolEvent};

/// What `/api/version` reports. Clients compare it as a dotted version to gate features
/// (VS Code's Copilot, for one, wants at least 0.6.4), so it is a real, recent Ollama
/// release; features of that release Strata lacks are refused explicitly with a 400.
pub const OLLAMA_VERSION: &str = "0.12.0";

#[derive(OpenApi)]
#[openapi(
    paths(generate, chat, embed, embeddings, tags, show, ps, version, copy, delete_model, pull, create, blob_head, blob_post),
    components(schemas(
        GenerateRequest,
        GenerateResponse,
        ChatRequest,
        ChatMessageIn,
        ChatResponse,
        ChatMessageOut,
        Options,
        OneOrMany,
        Timings,
        KeepAliveValue,
        EmbedRequest,
        EmbedResponse,
        EmbeddingsRequest,
        EmbeddingsResponse,
        ModelRef,
        CopyRequest,
        PullRequest,
        PullStatus,
        CreateRequest,
        Logprob,
        TopLogprob,
        ModelDetails,
        TagModel,
        TagsResponse,
        ShowResponse,
        PsModel,
        PsResponse,
        VersionResponse,
        OllamaErrorBody
    )),
    tags((name = "ollama", description = "Ollama-compatible API (NDJSON streams, `{\"error\": ...}` bodies)"))
)]
pub struct Doc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/generate", post(generate))
        .route("/api/chat", post(chat))
        .route("/api/embed", post(embed))
        .route("/api/embeddings", post(embeddings))
        .route("/api/tags", get(tags))
        .route("/api/show", post(show))
        .route("/api/ps", get(ps))
        .route("/api/version", get(version))
        .route("/api/copy", post(copy))
        .route("/api/delete", delete(delete_model))
        .route("/api/pull", post(pull))
        .route("/api/create", post(create))
        .route("/api/blobs/{digest}", post(blob_post).head(blob_head))
}

type Result<T> = std::result::Result<T, OllamaError>;

// ---------------------------------------------------------------------------------------
// Generate and chat

/// Generates a continuation of a prompt.
#[utoipa::path(post, path = "/api/generate", tag = "ollama",
    request_body(content = GenerateRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "An NDJSON stream of chunks ending with `done: true` (default), \
            or one object with `stream: false`. An empty prompt loads (`done_reason: load`) or, with \
            `keep_alive: 0`, unloads (`done_reason: unload`) the model.", content(
            (GenerateResponse = "application/x-ndjson"),
            (GenerateResponse = "application/json"))),
        (status = 400, description = "Invalid request (the message names the field)", body = OllamaErrorBody),
        (status = 404, description = "Unknown model", body = OllamaErrorBody),
        (status = 503, description = "The queue is full (with `Retry-After`)", body = OllamaErrorBody)))]
pub(crate) async fn generate(State(state): State<AppState>, body: Bytes) -> Result<Response> {
    let req: GenerateRequest = parse_json(&body)?;
    let call = generate_call(&state, req)?;
    Ok(call.run(&state).await?)
}

/// Answers a conversation.
#[utoipa::path(post, path = "/api/chat", tag = "ollama",
    request_body(content = ChatRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "An NDJSON stream of chunks, each with `message`, ending with \
            `done: true` (default), or one object with `stream: false`. No messages loads or, with \
            `keep_alive: 0`, unloads the model.", content(
            (ChatResponse = "application/x-ndjson"),
            (ChatResponse = "application/json"))),
        (status = 400, description = "Invalid request (the message names the field)", body = OllamaErrorBody),
        (status = 404, description = "Unknown model", body = OllamaErrorBody),
        (status = 503, description = "The queue is full (with `Retry-After`)", body = OllamaErrorBody)))]
pub(crate) async fn chat(State(state): State<AppState>, body: Bytes) -> Result<Response> {
    let req: ChatRequest = parse_json(&body)?;
    let call = chat_call(&state, req)?;
    Ok(call.run(&state).await?)
}

/// Which of the two generation routes answers: decides the shape of every line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Generate,
    Chat,
}

/// A checked `/api/generate` or `/api/chat` request.
struct Call {
    api: Api,
    /// The model as the client named it (echoed back).
    model: String,
    stream: bool,
    action: Action,
    /// Report log-probabilities.
    logprobs: bool,
}

enum Action {
    Load(Option<KeepAlive>),
    Unload,
    Generate(Box<GenerateJob>),
}

fn generate_call(state: &AppState, req: GenerateRequest) -> std::result::Result<Call, ApiError> {
    let info = require_model(state, &req.model)?;
    refuse_non_empty("template", req.template.as_deref(), "custom templates (`template`) are not supported")?;
    if req.images.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::invalid("images", "images are not supported by this server"));
    }
    let mut asks =
        Asks::read(req.format.as_ref(), req.think.as_ref(), req.logprobs, req.top_logprobs, &info, &req.model)?;
    asks.speculative = spec_request(req.speculative, FlatKeys::default())?;
    let keep_alive = keep_alive(req.keep_alive.as_ref())?;
    let opts = resolve_options(req.options, &info)?;
    let stream = req.stream.unwrap_or(true);
    let prompt = req.prompt.unwrap_or_default();
    let context = req.context.unwrap_or_default();
    let suffix = req.suffix.unwrap_or_default();
    let action = if !suffix.is_empty() {
        // Fill in the middle: the prompt is the text before the cursor (maybe none).
        let refused = [
            ("raw", req.raw == Some(true)),
            ("system", req.system.as_ref().is_some_and(|s| !s.is_empty())),
            ("context", !context.is_empty()),
        ];
        if let Some((field, _)) = refused.into_iter().find(|(_, given)| *given) {
            return Err(ApiError::invalid(field, format!("`{field}` cannot be given with `suffix`")));
        }
        if !info.fills_in_middle {
            return Err(ApiError::invalid(
                "suffix",
                format!(
                    "\"{}\" does not support insert (`suffix`): its vocabulary has no fill-in-the-middle tokens",
                    req.model
                ),
            ));
        }
        let input = PromptInput::Infill(strata_engine::tokenizer::Infill { prefix: prompt, suffix });
        Action::Generate(Box::new(asks.apply(opts.job(&req.model, input, context, keep_alive))))
    } else if prompt.is_empty() {
        load_or_unload(keep_alive)
    } else {
        let system = req.system.unwrap_or_default();
        let input = if !req.raw.unwrap_or(false) && info.chat_template.is_some() {
            let mut messages = Vec::with_capacity(2);
            if !system.is_empty() {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", prompt));
            PromptInput::Chat(messages)
        } else {
            // No template (or `raw`): the text as it is; a system message goes first.
            let text = match req.raw.unwrap_or(false) || system.is_empty() {
                true => prompt,
                false => format!("{system}\n\n{prompt}"),
            };
            PromptInput::Text { text, special: context.is_empty() }
        };
        let mut job = asks.apply(opts.job(&req.model, input, context, keep_alive));
        job.truncate = job.truncate.filter(|_| req.truncate != Some(false));
        Action::Generate(Box::new(job))
    };
    Ok(Call { api: Api::Generate, model: req.model, stream, action, logprobs: asks.logprobs })
}

fn chat_call(state: &AppState, req: ChatRequest) -> std::result::Result<Call, ApiError> {
    let info = require_model(state, &req.model)?;
    let tools = tool_definitions("tools", req.tools.as_deref().unwrap_or_default())?;
    let tools = tool_choice("tools", tools, None, None)?;
    let mut asks =
        Asks::read(req.format.as_ref(), req.think.as_ref(), req.logprobs, req.top_logprobs, &info, &req.model)?;
    asks.speculative = spec_request(req.speculative, FlatKeys::default())?;
    let keep_alive = keep_alive(req.keep_alive.as_ref())?;
    let opts = resolve_options(req.options, &info)?;
    let stream = req.stream.unwrap_or(true);
    let messages = req.messages.unwrap_or_default();
    let action = if messages.is_empty() {
        load_or_unload(keep_alive)
    } else {
        if info.chat_template.is_none() {
            return Err(ApiError::invalid(
                "model",
                format!("model '{}' has no chat template; use /api/generate", req.model),
            ));
        }
        let messages =
            messages.into_iter().enumerate().map(|(i, m)| chat_message(i, m)).collect::<std::result::Result<_, _>>()?;
        let mut job = asks.apply(opts.job(&req.model, PromptInput::Chat(messages), Vec::new(), keep_alive));
        job.tools = tools;
        job.truncate = job.truncate.filter(|_| req.truncate != Some(false));
        Action::Generate(Box::new(job))
    };
    Ok(Call { api: Api::Chat, model: req.model, stream, action, logprobs: asks.logprobs })
}

/// What generate and chat requests ask for beyond the prompt and `options`: `format`,
/// `think`, `logprobs`, `top_logprobs` and `speculative`, checked.
struct Asks {
    grammar: Option<GrammarSpec>,
    think: Think,
    logprobs: bool,
    top_logprobs: usize,
    speculative: SpecRequest,
}

impl Asks {
    fn read(
        format: Option<&Value>,
        think_value: Option<&Value>,
        logprobs: Option<bool>,
        top_logprobs: Option<i64>,
        info: &ModelInfo,
        model: &str,
    ) -> std::result::Result<Self, ApiError> {
        let grammar = format_grammar(format)?;
        let think = think(think_value, info, model)?;
        let (logprobs, top_logprobs) = logprob_request(logprobs, top_logprobs)?;
        Ok(Asks { grammar, think, logprobs, top_logprobs, speculative: SpecRequest::default() })
    }

    /// The job, with what was asked (`Asks::logprobs` is the response's business).
    fn apply(&self, mut job: GenerateJob) -> GenerateJob {
        job.grammar = self.grammar.clone();
        job.grammar_param = "format";
        job.top_logprobs = self.top_logprobs;
        job.template_vars = self.think.vars.clone();
        job.split_reasoning = self.think.split;
        job.speculative = self.speculative;
        job
    }
}

fn chat_message(i: usize, m: ChatMessageIn) -> std::result::Result<ChatMessage, ApiError> {
    match m.role.as_str() {
        "system" | "user" | "assistant" | "tool" | "ipython" => {}
        other => {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!("`messages[{i}].role` must be system, user, assistant, tool or ipython, not {other:?}"),
            ));
        }
    }
    if m.images.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::invalid(&format!("messages[{i}].images"), "images are not supported by this server"));
    }
    let mut msg = ChatMessage::new(m.role.clone(), m.content.unwrap_or_default());
    if let Some(calls) = m.tool_calls.filter(|c| !c.is_empty()) {
        let field = format!("messages[{i}].tool_calls");
        if m.role != "assistant" {
            return Err(ApiError::invalid(&field, format!("`{field}`: only assistant messages carry tool calls")));
        }
        msg = msg.with_field("tool_calls", Value::Array(history_calls(&field, &calls)?));
    }
    if let Some(name) = m.tool_name {
        msg = msg.with_field("name", Value::String(name));
    }
    if let Some(t) = m.thinking {
        msg = msg.with_field("reasoning_content", Value::String(t));
    }
    Ok(msg)
}

fn load_or_unload(keep_alive: Option<KeepAlive>) -> Action {
    match keep_alive {
        Some(KeepAlive::For(d)) if d.is_zero() => Action::Unload,
        other => Action::Load(other),
    }
}

impl Call {
    async fn run(self, state: &AppState) -> std::result::Result<Response, ApiError> {
        let Call { api, model, stream, action, logprobs } = self;
        let job = match action {
            Action::Load(keep_alive) => {
                let work = Work::Load { model: model.clone(), keep_alive };
                return match outcome(state, work).await? {
                    Event::Loaded { .. } => Ok(json_line(api.line(&model, String::new(), Some(End::reason("load"))))),
                    other => Err(unexpected(&other)),
                };
            }
            Action::Unload => {
                return match outcome(state, Work::Unload { model: model.clone() }).await? {
                    Event::Unloaded => Ok(json_line(api.line(&model, String::new(), Some(End::reason("unload"))))),
                    other => Err(unexpected(&other)),
                };
            }
            Action::Generate(job) => job,
        };
        let rx = state.queue.submit(Work::Generate(*job))?;
        let mut lines =
            Lines { rx, api, model, state: state.clone(), pending: None, finished: false, logprobs, steps: Vec::new() };
        if !stream {
            return lines.collect().await;
        }
        // Wait for the first event before answering 200, so that an early error (prompt too
        // long, template failure) gets its status; past the keep-alive interval (a long
        // queue), commit and keep the connection alive with empty chunks instead.
        lines.pending = match wait(state.config.keep_alive_interval, lines.rx.recv()).await {
            Some(Some(Event::Error(e))) => return Err(e.into()),
            Some(None) => return Err(ApiError::new(ErrorKind::Internal, "the job ended without a result")),
            Some(Some(ev)) => Some(ev),
            None => None,
        };
        let body = futures_util::stream::unfold(lines, |mut lines| async move {
            let line = lines.next_line().await?;
            Some((Ok::<_, Infallible>(line), lines))
        });
        Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], streaming_body(body)).into_response())
    }
}

/// How a generation ended, for the final line.
#[derive(Clone, Copy)]
struct End<'a> {
    reason: &'static str,
    job: Option<&'a JobDone>,
}

impl End<'_> {
    fn reason(reason: &'static str) -> Self {
        End { reason, job: None }
    }
}

impl<'a> End<'a> {
    fn done(job: &'a JobDone) -> Self {
        let reason = match job.finish {
            FinishReason::Length if job.cut_short() => "length",
            FinishReason::Stop | FinishReason::Cancelled | FinishReason::Length => "stop",
        };
        End { reason, job: Some(job) }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Api {
    /// One response object (without the newline): a chunk of `text`, or the final object
    /// when `end` is given.
    fn line(self, model: &str, text: String, end: Option<End<'_>>) -> Vec<u8> {
        self.line_with(model, Extra { text, ..Extra::default() }, end)
    }

    /// [`Api::line`] with reasoning or tool calls.
    fn line_with(self, model: &str, extra: Extra, end: Option<End<'_>>) -> Vec<u8> {
        let Extra { text, thinking, calls, logprobs } = extra;
        let created_at = now();
        let done = end.is_some();
        let done_reason = end.map(|e| e.reason.to_string());
        let job = end.and_then(|e| e.job);
        let timings = job.map_or_else(Timings::default, |j| Timings {
            total_duration: Some(nanos(j.total)),
            load_duration: Some(nanos(j.load)),
            prompt_eval_count: Some(j.prompt_tokens),
            prompt_eval_cached_count: Some(j.cached_tokens).filter(|&n| n > 0),
            prompt_eval_duration: Some(nanos(j.prefill)),
            eval_count: Some(j.completion_tokens),
            eval_duration: Some(nanos(j.decode)),
            draft_n: Some(j.speculative.drafted),
            draft_n_accepted: Some(j.speculative.accepted),
        });
        let model = model.to_string();
        let out = match self {
            Api::Generate => {
                let context = job.map(|j| j.context.clone());
                serde_json::to_vec(&GenerateResponse {
                    model,
                    created_at,
                    response: text,
                    thinking,
                    logprobs,
                    done,
                    done_reason,
                    context,
                    timings,
                })
            }
            Api::Chat => serde_json::to_vec(&ChatResponse {
                model,
                created_at,
                message: ChatMessageOut { role: "assistant".into(), content: text, thinking, tool_calls: calls },
                logprobs,
                done,
                done_reason,
                timings,
            }),
        };
        out.expect("response objects serialize")
    }
}

fn json_line(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The events of one generation, turned into response lines. Owns the receiver: when
/// the response body is dropped (the client left), the job is cancelled.
struct Lines {
    rx: UnboundedReceiver<Event>,
    api: Api,
    model: String,
    state: AppState,
    /// An event already taken from `rx` (the first one).
    pending: Option<Event>,
    finished: bool,
    /// Report log-probabilities.
    logprobs: bool,
    /// Tokens whose text has not gone out yet; their log-probabilities go with it.
    steps: Vec<Logprob>,
}

impl Lines {
    fn done(&mut self, job: &JobDone) -> Vec<u8> {
        self.state.metrics.record_generation(job.prompt_tokens, job.completion_tokens, job.prefill, job.decode);
        let extra = Extra { logprobs: self.take_steps(), ..Extra::default() };
        self.api.line_with(&self.model, extra, Some(End::done(job)))
    }

    /// The log-probabilities waiting for text, when asked for and any wait.
    fn take_steps(&mut self) -> Option<Vec<Logprob>> {
        (self.logprobs && !self.steps.is_empty()).then(|| std::mem::take(&mut self.steps))
    }

    /// The next NDJSON line, or `None` after the final one.
    async fn next_line(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        let interval = self.state.config.keep_alive_interval;
        let mut line = loop {
            let event = match self.pending.take() {
                Some(ev) => Some(ev),
                None => match wait(interval, self.rx.recv()).await {
                    Some(ev) => ev,
                    // Silent for a while (a long prefill): an empty chunk keeps proxies and
                    // clients from timing out, and every client ignores it.
                    None => break self.api.line(&self.model, String::new(), None),
                },
            };
            match event {
                Some(Event::Text(text)) => {
                    let extra = Extra { text, logprobs: self.take_steps(), ..Extra::default() };
                    break self.api.line_with(&self.model, extra, None);
                }
                Some(Event::Token { sampled, top }) => {
                    if self.logprobs {
                        self.steps.push(logprob(sampled, top));
                    }
                    continue;
                }
                // Ollama sends each call whole, once complete.
                Some(Event::Tool(ToolEvent::End { index, call })) => {
                    let extra = Extra { calls: Some(vec![ollama_call(index, &call)]), ..Extra::default() };
                    break self.api.line_with(&self.model, extra, None);
                }
                Some(Event::Reasoning(t)) => {
                    let extra = Extra { thinking: Some(t), logprobs: self.take_steps(), ..Extra::default() };
                    break self.api.line_with(&self.model, extra, None);
                }
                Some(Event::Tool(_) | Event::Started { .. }) => continue,
                Some(Event::Done(job)) => {
                    self.finished = true;
                    break self.done(&job);
                }
                Some(Event::Error(e)) => {
                    self.finished = true;
                    break error_line(ApiError::from(e));
                }
                Some(other) => {
                    self.finished = true;
                    break error_line(unexpected(&other));
                }
                None => {
                    self.finished = true;
                    break error_line(ApiError::new(ErrorKind::Internal, "the job ended without a result"));
                }
            }
        };
        line.push(b'\n');
        Some(Bytes::from(line))
    }

    /// The whole answer as one object (`stream: false`).
    async fn collect(mut self) -> std::result::Result<Response, ApiError> {
        let (mut text, mut thinking) = (String::new(), String::new());
        loop {
            match self.rx.recv().await {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Reasoning(t)) => thinking.push_str(&t),
                Some(Event::Token { sampled, top }) => {
                    if self.logprobs {
                        self.steps.push(logprob(sampled, top));
                    }
                }
                Some(Event::Tool(_) | Event::Started { .. }) => {}
                Some(Event::Done(job)) => {
                    self.state.metrics.record_generation(
                        job.prompt_tokens,
                        job.completion_tokens,
                        job.prefill,
                        job.decode,
                    );
                    let calls = (!job.tool_calls.is_empty())
                        .then(|| job.tool_calls.iter().enumerate().map(|(i, c)| ollama_call(i, c)).collect());
                    let thinking = (!thinking.is_empty()).then_some(thinking);
                    let extra = Extra { text, thinking, calls, logprobs: self.take_steps() };
                    return Ok(json_line(self.api.line_with(&self.model, extra, Some(End::done(&job)))));
                }
                Some(Event::Error(e)) => return Err(e.into()),
                Some(other) => return Err(unexpected(&other)),
                None => return Err(ApiError::new(ErrorKind::Internal, "the job ended without a result")),
            }
        }
    }
}

/// What a line carries besides its place in the stream.
#[derive(Debug, Default)]
struct Extra {
    text: String,
    /// Reasoning (`thinking`).
    thinking: Option<String>,
    /// Whole tool calls, in Ollama's shape.
    calls: Option<Vec<Value>>,
    logprobs: Option<Vec<Logprob>>,
}

/// The logprob reported for an impossible token (JSON has no -inf).
const IMPOSSIBLE_LOGPROB: f32 = -9999.0;

fn logprob(sampled: TokenLogprob, top: Vec<TokenLogprob>) -> Logprob {
    let finite = |lp: f32| if lp.is_finite() { lp } else { IMPOSSIBLE_LOGPROB };
    Logprob {
        token: sampled.text,
        logprob: finite(sampled.logprob),
        bytes: sampled.bytes,
        top_logprobs: top
            .into_iter()
            .map(|t| TopLogprob { token: t.text, logprob: finite(t.logprob), bytes: t.bytes })
            .collect(),
    }
}

/// `logprobs` and `top_logprobs` (0..=20; alternatives imply `logprobs`): whether to
/// report, and how many alternatives.
fn logprob_request(logprobs: Option<bool>, top: Option<i64>) -> std::result::Result<(bool, usize), ApiError> {
    match top {
        None => Ok((logprobs.unwrap_or(false), 0)),
        Some(n @ 0..=20) => Ok((logprobs.unwrap_or(false) || n > 0, n as usize)),
        Some(_) => Err(ApiError::invalid("top_logprobs", "`top_logprobs` must be in [0, 20]")),
    }
}

/// A call in Ollama's shape: arguments as an object.
fn ollama_call(index: usize, call: &ToolCall) -> Value {
    let arguments: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| Value::Object(Default::default()));
    serde_json::json!({"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments}})
}

fn error_line(e: ApiError) -> Vec<u8> {
    if e.kind == ErrorKind::Internal {
        tracing::error!(message = %e.message, "generation failed");
    }
    serde_json::to_vec(&e.ollama_body()).expect("error bodies serialize")
}

fn unexpected(event: &Event) -> ApiError {
    ApiError::new(ErrorKind::Internal, format!("unexpected event from the worker: {event:?}"))
}

/// `fut`, or `None` once `interval` passes (never, for a zero interval).
async fn wait<F: std::future::Future>(interval: Duration, fut: F) -> Option<F::Output> {
    if interval.is_zero() {
        return Some(fut.await);
    }
    tokio::time::timeout(interval, fut).await.ok()
}

/// Runs `work` and returns its final event (`Loaded`, `Unloaded`, `Embeddings`, ...);
/// a job error becomes the error.
async fn outcome(state: &AppState, work: Work) -> std::result::Result<Event, ApiError> {
    let mut rx = state.queue.submit(work)?;
    loop {
        match rx.recv().await {
            Some(
                Event::Started { .. } | Event::Text(_) | Event::Token { .. } | Event::Tool(_) | Event::Reasoning(_),
            ) => {}
            Some(Event::Error(e)) => return Err(e.into()),
            Some(ev) => return Ok(ev),
            None => return Err(ApiError::new(ErrorKind::Internal, "the job ended without a result")),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Time

/// RFC 3339 in UTC with nanoseconds, as Ollama writes times.
fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map(|ts| format!("{ts:.9}")).unwrap_or_else(|_| now())
}

fn now() -> String {
    format!("{:.9}", jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn lines_have_ollama_shapes() {
        let job = JobDone {
            finish: FinishReason::Length,
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 0,
            reasoning_tokens: 0,
            stop_sequence: None,
            context: vec![1, 2, 3, 4, 5],
            load: Duration::from_millis(1),
            prefill: Duration::from_millis(2),
            decode: Duration::from_millis(3),
            total: Duration::from_millis(7),
            tool_calls: Vec::new(),
            tool_cut: false,
            speculative: strata_engine::speculative::SpecCounts { steps: 1, drafted: 4, accepted: 3 },
        };
        let v: Value = serde_json::from_slice(&Api::Generate.line("m", "hi".into(), None)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model": "m", "created_at": v["created_at"], "response": "hi", "done": false})
        );
        let v: Value = serde_json::from_slice(&Api::Generate.line("m", String::new(), Some(End::done(&job)))).unwrap();
        assert_eq!(v["done_reason"], "length");
        assert_eq!(v["context"], serde_json::json!([1, 2, 3, 4, 5]));
        assert_eq!(v["total_duration"], 7_000_000);
        assert_eq!(v["eval_count"], 2);
        assert_eq!((v["draft_n"].as_u64(), v["draft_n_accepted"].as_u64()), (Some(4), Some(3)));
        let v: Value = serde_json::from_slice(&Api::Chat.line("m", String::new(), Some(End::reason("load")))).unwrap();
        assert_eq!(v["message"], serde_json::json!({"role": "assistant", "content": ""}));
        assert!(v.get("context").is_none() && v.get("total_duration").is_none());
        let t = v["created_at"].as_str().unwrap();
        assert!(t.ends_with('Z') && t.split('.').nth(1).is_some_and(|f| f.len() == 10), "{t}");
    }
}
