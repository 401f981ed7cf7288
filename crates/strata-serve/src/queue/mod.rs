//! Admission and the worker thread. One worker owns every loaded engine and batches the
//! running generations of each model step by step (see [`worker`]); a bounded FIFO sits
//! in front. A job's events go back on its own channel: when the receiver is dropped (the
//! client went away), the worker retires that generation at the next step.

pub mod models;
mod prepare;
pub mod truncate;
pub mod worker;

pub use truncate::Truncation;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use strata_engine::grammar::GrammarSpec;
use strata_engine::sampler::SamplingParams;
use strata_engine::session::FinishReason;
use strata_engine::speculative::{SpecCounts, SpecRequest};
use strata_engine::template::ChatMessage;
use strata_engine::toolcall::{ToolCall, ToolEvent};

/// How long a model stays loaded after its last use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAlive {
    Forever,
    For(Duration),
}

impl KeepAlive {
    /// Parses Ollama's forms: a duration string (`"5m"`, `"1h30m"`, `"10s"`, `"-1m"`), or
    /// a number of seconds; negative means forever, zero unloads right after the request.
    pub fn parse(v: &serde_json::Value) -> Result<Self, String> {
        let secs = match v {
            serde_json::Value::Number(n) => n.as_f64().ok_or("not a number")?,
            serde_json::Value::String(s) => parse_duration(s)?,
            _ => return Err("must be a duration string such as \"5m\" or a number of seconds".into()),
        };
        if secs < 0.0 {
            Ok(KeepAlive::Forever)
        } else if secs.is_finite() && secs < 1e10 {
            Ok(KeepAlive::For(Duration::from_secs_f64(secs)))
        } else {
            Err(format!("{secs} seconds is out of range"))
        }
    }
}

/// Seconds in a Go-style duration string: `300`, `1.5h`, `1h30m`, `-1m`, `250ms`.
pub fn parse_duration(s: &str) -> Result<f64, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return Ok(secs);
    }
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return Err(format!("`{s}` is not a duration"));
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let value: f64 = rest[..num_len].parse().map_err(|_| format!("`{s}` is not a duration"))?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(format!("`{s}` is not a duration (units: h, m, s, ms, us, ns)")),
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Ok(sign * total)
}

/// What a generation starts from.
#[derive(Clone, Debug)]
pub enum PromptInput {
    /// Plain text; `special` adds the tokenizer's special tokens (BOS).
    Text { text: String, special: bool },
    /// A conversation rendered with the model's chat template (with the generation
    /// prompt appended).
    Chat(Vec<ChatMessage>),
    /// Token ids as they are.
    Tokens(Vec<u32>),
    /// Fill in the middle between a prefix and a suffix, with the model's FIM tokens.
    Infill(strata_engine::tokenizer::Infill),
}

/// Which tool calls a chat asks for (`tool_choice`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The reply must call at least one tool.
    Required,
    /// The reply must call this function.
    Function(String),
}

/// The tools a chat offers the model.
#[derive(Clone, Debug)]
pub struct ChatTools {
    /// Tool definitions in OpenAI's shape, `{"type": "function", "function": {name,
    /// description, parameters}}`, passed to the chat template as transformers passes them.
    pub tools: Vec<serde_json::Value>,
    pub choice: ToolChoice,
    /// Several calls in one reply (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ChatTools {
    /// Whether a reply makes one call at most: `parallel_tool_calls: false`, or a named
    /// function. Any choice holds to it, `auto` too (the reply ends with its first call).
    pub fn one_call(&self) -> bool {
        !self.parallel || matches!(self.choice, ToolChoice::Function(_))
    }

    /// The definition of the function `name`, if offered.
    pub fn function(&self, name: &str) -> Option<&serde_json::Value> {
        self.tools
            .iter()
            .filter_map(|t| t.get("function"))
            .find(|f| f.get("name").and_then(|n| n.as_str()) == Some(name))
    }
}

#[derive(Clone, Debug)]
pub struct GenerateJob {
    pub model: String,
    pub prompt: PromptInput,
    /// Ollama's `context`: token ids of an earlier exchange to continue from.
    pub context: Vec<u32>,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Alternatives reported with every token (0: only the sampled token's).
    pub top_logprobs: usize,
    /// Context length for this request (`num_ctx`); `None`: the server default.
    pub num_ctx: Option<usize>,
    pub keep_alive: Option<KeepAlive>,
    /// Tools offered to a chat (`None`: none, or `tool_choice: none`). The reply's calls
    /// come as [`Event::Tool`]s.
    pub tools: Option<ChatTools>,
    /// What the output must match (`response_format`, Ollama's `format`, `grammar`).
    pub grammar: Option<GrammarSpec>,
    /// The request field `grammar` came from, for a 400 when it does not compile for the
    /// model.
    pub grammar_param: &'static str,
    /// Only count the prompt's tokens: the job answers [`Event::Started`] and ends
    /// (Anthropic's `count_tokens`).
    pub count_only: bool,
    /// The request field a chat's messages came from (`messages`; `input` in the
    /// Responses API), for a 400 about them.
    pub messages_param: &'static str,
    /// More chat template variables (`enable_thinking`, ...).
    pub template_vars: serde_json::Map<String, serde_json::Value>,
    /// Split a chat reply's reasoning (between the template's think markers) from its
    /// answer: it comes as [`Event::Reasoning`].
    pub split_reasoning: bool,
    /// This request's `--sparse-ffn` setting and the field it came from (`None`: the
    /// model's).
    pub sparse_ffn: Option<(strata_model::sparse::SparseFfn, &'static str)>,
    /// How a prompt longer than the context is cut (`None`: it is refused with
    /// [`JobError::ContextLength`]).
    pub truncate: Option<Truncation>,
    /// This request's speculative decoding settings (each unset one the model's).
    pub speculative: SpecRequest,
}

#[derive(Clone, Debug)]
pub enum EmbedInput {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct EmbedJob {
    pub model: String,
    pub inputs: Vec<EmbedInput>,
    /// Cut inputs longer than the context instead of failing.
    pub truncate: bool,
    /// The context an input must fit (Ollama's `num_ctx`), at most the server's; `None`:
    /// the server's.
    pub num_ctx: Option<usize>,
    pub keep_alive: Option<KeepAlive>,
}

// One `Work` per request, moved a few times on its way to the worker: its size does not
// matter next to the generation it asks for.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Work {
    Generate(GenerateJob),
    Embed(EmbedJob),
    /// Load a model (an empty Ollama prompt) and keep it for `keep_alive`.
    Load {
        model: String,
        keep_alive: Option<KeepAlive>,
    },
    /// Unload a model now (an empty Ollama prompt with `keep_alive: 0`).
    Unload {
        model: String,
    },
}

/// A token as the API shows it: its text and log-probability.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub id: u32,
    pub text: String,
    /// The bytes the token stands for (may be part of a UTF-8 character).
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

#[derive(Clone, Debug)]
pub struct JobDone {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens a cache already held (a previous exchange's keys and values).
    pub cached_tokens: usize,
    /// Generated tokens from the one that opened the reasoning to the one that closed
    /// it (0 without [`GenerateJob::split_reasoning`]).
    pub reasoning_tokens: usize,
    /// The stop string that ended it, if one did.
    pub stop_sequence: Option<String>,
    /// Prompt ids followed by the generated ids (Ollama's `context`).
    pub context: Vec<u32>,
    pub load: Duration,
    pub prefill: Duration,
    pub decode: Duration,
    /// From admission to the end.
    pub total: Duration,
    /// The tool calls of the reply, in order: those it completed.
    pub tool_calls: Vec<ToolCall>,
    /// Whether the reply ended inside a tool call (the token limit cut it; the calls it
    /// completed before are in `tool_calls`).
    pub tool_cut: bool,
    /// What speculative decoding drafted for it, and kept.
    pub speculative: SpecCounts,
}

impl JobDone {
    /// Whether the token limit cut the reply short: its text, or a call. A limit that
    /// falls after the last complete call, where only a list's closing brackets were to
    /// come, cut nothing: the calls stand as the answer.
    pub fn cut_short(&self) -> bool {
        self.finish == FinishReason::Length && (self.tool_calls.is_empty() || self.tool_cut)
    }
}

#[cfg(test)]
impl JobDone {
    /// A generation that ended with `finish` after these counts; no time, context or calls.
    pub fn ended(finish: FinishReason, prompt_tokens: usize, completion_tokens: usize) -> Self {
        JobDone {
            finish,
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            reasoning_tokens: 0,
            stop_sequence: None,
            context: Vec::new(),
            load: Duration::ZERO,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            total: Duration::ZERO,
            tool_calls: Vec::new(),
            tool_cut: false,
            speculative: SpecCounts::default(),
        }
    }
}

/// What a job reports, in order: for a generation `Started` (once admitted), then
/// `Text`/`Token` events; then exactly one of `Done`, `Embeddings`, `Loaded`, `Unloaded`
/// or `Error`. A count-only generation ([`GenerateJob::count_only`]) reports `Started`
/// (or `Error`) and nothing more.
#[derive(Clone, Debug)]
pub enum Event {
    /// A generation was admitted: its prompt's size, and how much of it a cache held.
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Text(String),
    Token {
        sampled: TokenLogprob,
        top: Vec<TokenLogprob>,
    },
    /// A tool call starts, grows or ends (never [`ToolEvent::Text`]: that is `Text`).
    Tool(ToolEvent),
    /// Reasoning text, apart from the answer (`GenerateJob::split_reasoning`).
    Reasoning(String),
    Done(JobDone),
    Embeddings {
        vectors: Vec<Vec<f32>>,
        prompt_tokens: usize,
        load: Duration,
        total: Duration,
    },
    Loaded {
        load: Duration,
    },
    Unloaded,
    Error(JobError),
}

/// Why a job failed; the HTTP layer maps each kind to a status.
#[derive(Clone, Debug, thiserror::Error)]
pub enum JobError {
    #[error("model `{0}` not found")]
    ModelNotFound(String),
    /// A client mistake found only once the model is known (prompt too long, template
    /// error, token id out of range, ...): 400.
    #[error("{message}")]
    Invalid { param: Option<&'static str>, message: String },
    /// The prompt does not fit the context, and the request may not cut it: 400, with
    /// OpenAI's `context_length_exceeded`.
    #[error("{message}")]
    ContextLength { param: &'static str, message: String },
    #[error("{0}")]
    Internal(String),
    /// The device could not run the job (GPU memory exhausted, a failed launch): 503,
    /// and the server keeps serving.
    #[error("{0}")]
    Device(String),
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Pure admission state: how many jobs wait, how many run, and the bound.
#[derive(Debug)]
pub struct Admission {
    capacity: usize,
    waiting: usize,
    running: usize,
}

impl Admission {
    pub fn new(capacity: usize) -> Self {
        Admission { capacity, waiting: 0, running: 0 }
    }

    /// Takes a place in the queue, or refuses when `capacity` jobs already wait.
    pub fn admit(&mut self) -> bool {
        if self.waiting >= self.capacity {
            return false;
        }
        self.waiting += 1;
        true
    }

    /// The worker took a job (a generation joined the running ones, or other work began).
    pub fn start(&mut self) {
        self.waiting = self.waiting.saturating_sub(1);
        self.running += 1;
    }

    /// A job the worker took goes back to the front of the queue.
    pub fn wait_again(&mut self) {
        self.running = self.running.saturating_sub(1);
        self.waiting += 1;
    }

    /// The worker finished a job (a generation retired).
    pub fn finish(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    pub fn waiting(&self) -> usize {
        self.waiting
    }

    pub fn running(&self) -> usize {
        self.running
    }
}

pub(crate) struct Job {
    pub work: Work,
    pub events: UnboundedSender<Event>,
    pub admitted: std::time::Instant,
}

/// The HTTP side's handle on the worker.
#[derive(Clone)]
pub struct QueueHandle {
    tx: std::sync::mpsc::Sender<Job>,
    admission: Arc<Mutex<Admission>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue is full; retry shortly")]
    Full,
    #[error("the server is shutting down")]
    Closed,
}

impl QueueHandle {
    /// Queues `work`; its events arrive on the returned receiver. Dropping the receiver
    /// cancels the job.
    pub fn submit(&self, work: Work) -> Result<tokio::sync::mpsc::UnboundedReceiver<Event>, SubmitError> {
        if !self.admission.lock().expect("admission lock").admit() {
            return Err(SubmitError::Full);
        }
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let job = Job { work, events, admitted: std::time::Instant::now() };
        if self.tx.send(job).is_err() {
            // The worker is gone: give the place back.
            let mut admission = self.admission.lock().expect("admission lock");
            admission.start();
            admission.finish();
            return Err(SubmitError::Closed);
        }
        Ok(rx)
    }

    /// (waiting, running)
    pub fn depth(&self) -> (usize, usize) {
        let a = self.admission.lock().expect("admission lock");
        (a.waiting(), a.running())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_is_bounded_and_counts_running_jobs() {
        let mut a = Admission::new(2);
        assert!(a.admit() && a.admit());
        assert!(!a.admit(), "a third waiting job is refused");
        a.start();
        assert_eq!((a.waiting(), a.running()), (1, 1));
        assert!(a.admit(), "taking a job frees a place");
        a.finish();
        assert_eq!((a.waiting(), a.running()), (2, 0));
    }

    #[test]
    fn durations_parse_like_ollama() {
        assert_eq!(parse_duration("5m").unwrap(), 300.0);
        assert_eq!(parse_duration("1h30m").unwrap(), 5400.0);
        assert_eq!(parse_duration("-1m").unwrap(), -60.0);
        assert_eq!(parse_duration("250ms").unwrap(), 0.25);
        assert_eq!(parse_duration("42").unwrap(), 42.0);
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("").is_err());
        let ka = |v: serde_json::Value| KeepAlive::parse(&v);
        assert_eq!(ka(serde_json::json!(-1)).unwrap(), KeepAlive::Forever);
        assert_eq!(ka(serde_json::json!("10s")).unwrap(), KeepAlive::For(Duration::from_secs(10)));
        assert_eq!(ka(serde_json::json!(0)).unwrap(), KeepAlive::For(Duration::ZERO));
        assert!(ka(serde_json::json!(true)).is_err());
    }
}
