//! The Ollama API's request and response bodies, as Ollama's `docs/api.md` and the
//! ollama Python/JS libraries define them. Requests accept `null` wherever a field may be
//! left out; responses leave out what Ollama leaves out.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// `options`: Ollama's runtime parameters. Unknown keys (`num_gpu`, `mirostat`, ...) are
/// accepted and ignored. Integers may also be written as integral floats (`40.0`), as
/// Ollama accepts them.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = ollama::Options)]
pub struct Options {
    /// Most tokens to generate; -1, -2, 0 or absent: until the context is full.
    #[serde(default, deserialize_with = "int")]
    pub num_predict: Option<i64>,
    /// Context length for this request (capped at the model's).
    #[serde(default, deserialize_with = "int")]
    pub num_ctx: Option<i64>,
    /// Tokens at the prompt's start kept when a prompt longer than the context is cut
    /// (default 4; the system messages and tools are kept whatever it says); -1: keep the
    /// whole prompt, so that one too long is refused.
    #[serde(default, deserialize_with = "int")]
    pub num_keep: Option<i64>,
    /// Default 0.8; 0 is greedy.
    pub temperature: Option<f32>,
    /// Default 40; 0 or less: off.
    #[serde(default, deserialize_with = "int")]
    pub top_k: Option<i64>,
    /// Default 0.9.
    pub top_p: Option<f32>,
    /// Default 0.0.
    pub min_p: Option<f32>,
    /// Default 1.1.
    pub repeat_penalty: Option<f32>,
    /// Default 64; -1: the whole context; 0: penalties off.
    #[serde(default, deserialize_with = "int")]
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Negative or absent: a random seed.
    #[serde(default, deserialize_with = "int")]
    pub seed: Option<i64>,
    /// Strings that end the generation (not included in the output). A single string is
    /// accepted too.
    #[serde(default, deserialize_with = "one_or_many")]
    #[schema(value_type = Option<OneOrMany>)]
    pub stop: Option<Vec<String>>,
    /// Strata: how a model converted with `--sparse-ffn` runs its FFNs for this request
    /// (`off`, `auto`, `topk=F`, `threshold=T`, optionally `,per=sequence`); absent: the
    /// server's `--sparse-ffn`.
    pub sparse_ffn: Option<String>,
}

impl Options {
    /// These options, with `defaults` filling what they leave unset (a Modelfile's
    /// `parameters` under a request's `options`).
    pub fn or(self, defaults: Options) -> Options {
        Options {
            num_predict: self.num_predict.or(defaults.num_predict),
            num_ctx: self.num_ctx.or(defaults.num_ctx),
            num_keep: self.num_keep.or(defaults.num_keep),
            sparse_ffn: self.sparse_ffn.or(defaults.sparse_ffn),
            temperature: self.temperature.or(defaults.temperature),
            top_k: self.top_k.or(defaults.top_k),
            top_p: self.top_p.or(defaults.top_p),
            min_p: self.min_p.or(defaults.min_p),
            repeat_penalty: self.repeat_penalty.or(defaults.repeat_penalty),
            repeat_last_n: self.repeat_last_n.or(defaults.repeat_last_n),
            presence_penalty: self.presence_penalty.or(defaults.presence_penalty),
            frequency_penalty: self.frequency_penalty.or(defaults.frequency_penalty),
            seed: self.seed.or(defaults.seed),
            stop: self.stop.or(defaults.stop),
        }
    }
}

/// An integer, also written as an integral float; values beyond `i64` saturate.
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else { return Ok(None) };
    if let Some(i) = n.as_i64() {
        return Ok(Some(i));
    }
    if let Some(u) = n.as_u64() {
        return Ok(Some(i64::try_from(u).unwrap_or(i64::MAX)));
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Ok(Some(f as i64)),
        _ => Err(D::Error::custom(format!("expected an integer, got {n}"))),
    }
}

/// A string or a list of strings.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Option::<OneOrMany>::deserialize(d)?.map(OneOrMany::into_vec))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or a list of strings")]
#[schema(as = ollama::OneOrMany)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `keep_alive`: a duration string (`"5m"`, `"1h30m"`, `"-1m"`) or a number of seconds;
/// negative keeps the model forever, 0 unloads it after the request.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::KeepAlive)]
#[serde(untagged)]
pub enum KeepAliveValue {
    Duration(String),
    Seconds(f64),
}

/// `POST /api/generate`
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::GenerateRequest, example = json!({"model": "strata-demo", "prompt": "Why is the sky blue?", "stream": false, "options": {"temperature": 0, "num_predict": 8}}))]
pub struct GenerateRequest {
    /// The model's name; `llama3` means `llama3:latest`.
    pub model: String,
    /// The text to continue. Empty: load the model (unload it with `keep_alive: 0`).
    pub prompt: Option<String>,
    /// Fill in the middle: the text after the cursor (the prompt is the text before it),
    /// for models whose vocabulary has FIM tokens (`insert` in `/api/show`'s
    /// capabilities). Not with `raw`, `system` or `context`.
    pub suffix: Option<String>,
    /// A system message, rendered with the model's chat template before the prompt.
    pub system: Option<String>,
    /// A custom prompt template: not supported (must be empty).
    pub template: Option<String>,
    /// Token ids returned by an earlier response, to continue that exchange.
    pub context: Option<Vec<u32>>,
    /// Use the prompt as it is, without the chat template.
    pub raw: Option<bool>,
    /// Images: not supported (must be empty).
    pub images: Option<Vec<String>>,
    /// NDJSON stream of chunks (default) or one object.
    pub stream: Option<bool>,
    /// How long the model stays loaded: `"5m"`, seconds, negative = forever, 0 = unload
    /// after this request.
    #[schema(value_type = Option<KeepAliveValue>)]
    pub keep_alive: Option<Value>,
    pub options: Option<Options>,
    /// Structured output: `"json"` (any JSON object) or a JSON schema; the output is
    /// constrained to match, token by token.
    #[schema(value_type = Option<Object>)]
    pub format: Option<Value>,
    /// Thinking, for models whose template thinks: `true`, `false`, or `"high"`,
    /// `"medium"`, `"low"`; the reasoning comes back in `thinking`.
    #[schema(value_type = Option<Object>)]
    pub think: Option<Value>,
    /// Report each generated token's log-probability (in `logprobs`).
    pub logprobs: Option<bool>,
    /// Alternatives reported per token, 0..=20 (with `logprobs`).
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// Cut a prompt longer than the context (the default): the oldest messages other
    /// than system ones go first, then the middle of what is left; `false`: refuse it.
    pub truncate: Option<bool>,
    /// Strata: this request's speculative decoding, `{"type": "draft"|"ngram"|"off",
    /// "n_max", "n_min", "p_min"}`; what it leaves out is the model's (`--draft`).
    pub speculative: Option<crate::server::speculative::SpeculativeOptions>,
}

/// A message of `POST /api/chat`.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::ChatMessageIn)]
pub struct ChatMessageIn {
    /// `system`, `user`, `assistant` or `tool` (a tool's result).
    pub role: String,
    pub content: Option<String>,
    /// Not supported (must be empty).
    pub images: Option<Vec<String>>,
    /// An assistant turn's calls: `{"function": {"name", "arguments": {...}}}`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
    /// On `tool` messages: the tool's name.
    pub tool_name: Option<String>,
    /// The reasoning of an earlier assistant turn, passed to templates that show it.
    pub thinking: Option<String>,
}

/// `POST /api/chat`
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::ChatRequest, example = json!({"model": "strata-demo", "messages": [{"role": "user", "content": "Hello!"}], "stream": false, "options": {"num_predict": 8}}))]
pub struct ChatRequest {
    pub model: String,
    /// The conversation. Empty: load the model (unload it with `keep_alive: 0`).
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Functions the model may call: `{"type": "function", "function": {"name",
    /// "description", "parameters"}}`. Calls come back in `message.tool_calls`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    pub stream: Option<bool>,
    #[schema(value_type = Option<KeepAliveValue>)]
    pub keep_alive: Option<Value>,
    pub options: Option<Options>,
    /// Structured output: `"json"` or a JSON schema.
    #[schema(value_type = Option<Object>)]
    pub format: Option<Value>,
    /// Thinking, for models whose template thinks: `true`, `false`, or `"high"`,
    /// `"medium"`, `"low"`; the reasoning comes back in `message.thinking`.
    #[schema(value_type = Option<Object>)]
    pub think: Option<Value>,
    /// Report each generated token's log-probability (in `logprobs`).
    pub logprobs: Option<bool>,
    /// Alternatives reported per token, 0..=20 (with `logprobs`).
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// Cut a prompt longer than the context (the default): the oldest messages other
    /// than system ones go first, then the middle of what is left; `false`: refuse it.
    pub truncate: Option<bool>,
    /// Strata: this request's speculative decoding, `{"type": "draft"|"ngram"|"off",
    /// "n_max", "n_min", "p_min"}`; what it leaves out is the model's (`--draft`).
    pub speculative: Option<crate::server::speculative::SpeculativeOptions>,
}

/// The counters of a finished generation, on the final line only (durations in
/// nanoseconds).
#[derive(Clone, Debug, Default, Serialize, ToSchema)]
#[schema(as = ollama::Timings)]
pub struct Timings {
    /// From admission to the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_duration: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_duration: Option<u64>,
    /// Every prompt token, those a cache held included (as Ollama counts them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_eval_count: Option<usize>,
    /// Of those, the tokens a kept cache already held (absent when none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_eval_cached_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_eval_duration: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_duration: Option<u64>,
    /// Strata's addition (llama-server's names): tokens speculative decoding drafted and
    /// verified (0 without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n: Option<u64>,
    /// Of those, the tokens kept: the model generated them too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n_accepted: Option<u64>,
}

/// One line of the `/api/generate` stream, or the whole answer with `stream: false`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::GenerateResponse)]
pub struct GenerateResponse {
    pub model: String,
    /// RFC 3339, UTC, nanoseconds.
    pub created_at: String,
    /// The text of this chunk (the whole text with `stream: false`).
    pub response: String,
    /// Reasoning, apart from the answer (models that think).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    pub done: bool,
    /// On the final line: `stop`, `length`, `load` or `unload`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    /// On the final line: the prompt and generated token ids, to continue from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<u32>>,
    /// With `logprobs`: the tokens whose text this line carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
    #[serde(flatten)]
    pub timings: Timings,
}

/// The assistant's message in a chat response.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::ChatMessageOut)]
pub struct ChatMessageOut {
    pub role: String,
    pub content: String,
    /// Reasoning, apart from the answer (models that think).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The reply's calls, each whole: `{"function": {"index", "name", "arguments": {...}}}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
}

/// One line of the `/api/chat` stream, or the whole answer with `stream: false`. Every
/// line carries `message` (empty on the final line of a stream).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::ChatResponse)]
pub struct ChatResponse {
    pub model: String,
    pub created_at: String,
    pub message: ChatMessageOut,
    pub done: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    /// With `logprobs`: the tokens whose text this line carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
    #[serde(flatten)]
    pub timings: Timings,
}

/// A generated token's log-probability, with the most likely alternatives.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::Logprob)]
pub struct Logprob {
    pub token: String,
    pub logprob: f32,
    /// The token's bytes (it may hold part of a UTF-8 character).
    pub bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::TopLogprob)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `POST /api/embed`
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::EmbedRequest, example = json!({"model": "strata-demo", "input": ["Hello", "world"]}))]
pub struct EmbedRequest {
    pub model: String,
    /// A text or a list of texts. Empty: load the model and return no embeddings.
    #[schema(value_type = Option<OneOrMany>)]
    pub input: Option<OneOrMany>,
    /// Cut inputs longer than the context instead of failing (default true).
    pub truncate: Option<bool>,
    /// Keep only the first N dimensions (re-normalized).
    pub dimensions: Option<i64>,
    #[schema(value_type = Option<KeepAliveValue>)]
    pub keep_alive: Option<Value>,
    /// Checked as the generate routes check them; only `num_ctx` (the most tokens an
    /// input may have, at most the server's context) changes an embedding.
    pub options: Option<Options>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::EmbedResponse)]
pub struct EmbedResponse {
    pub model: String,
    /// One L2-normalized vector per input.
    pub embeddings: Vec<Vec<f32>>,
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
}

/// `POST /api/embeddings` (the legacy form of `/api/embed`).
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::EmbeddingsRequest, example = json!({"model": "strata-demo", "prompt": "Hello"}))]
pub struct EmbeddingsRequest {
    pub model: String,
    /// Empty: load the model and return an empty embedding.
    pub prompt: Option<String>,
    #[schema(value_type = Option<KeepAliveValue>)]
    pub keep_alive: Option<Value>,
    /// As in `/api/embed`: checked, and `num_ctx` cuts the prompt.
    pub options: Option<Options>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::EmbeddingsResponse)]
pub struct EmbeddingsResponse {
    pub embedding: Vec<f32>,
}

/// A request that names one model: `model`, or its older alias `name`.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::ModelRef, example = json!({"model": "strata-demo"}))]
pub struct ModelRef {
    pub model: Option<String>,
    /// Alias of `model`.
    pub name: Option<String>,
    /// Accepted and ignored.
    pub verbose: Option<bool>,
}

/// `POST /api/copy`
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::CopyRequest, example = json!({"source": "strata-demo", "destination": "strata-demo-copy"}))]
pub struct CopyRequest {
    pub source: String,
    pub destination: String,
}

/// What a model is, as `/api/tags`, `/api/show` and `/api/ps` describe it.
#[derive(Clone, Debug, Default, Serialize, ToSchema)]
#[schema(as = ollama::ModelDetails)]
pub struct ModelDetails {
    pub parent_model: String,
    /// `safetensors`.
    pub format: String,
    /// The architecture (`llama`, `qwen3`, ...).
    pub family: String,
    pub families: Vec<String>,
    /// e.g. `1.1B`.
    pub parameter_size: String,
    /// The stored dtype of the weights (`F32`, `F16`, `BF16`).
    pub quantization_level: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::TagModel)]
pub struct TagModel {
    /// `name:tag`.
    pub name: String,
    pub model: String,
    pub modified_at: String,
    /// Bytes of weights.
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
}

/// `GET /api/tags`
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::TagsResponse)]
pub struct TagsResponse {
    pub models: Vec<TagModel>,
}

/// `POST /api/show`
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::ShowResponse)]
pub struct ShowResponse {
    pub license: String,
    pub modelfile: String,
    /// `key value` lines: the model's default sampling settings.
    pub parameters: String,
    /// The chat template (Jinja, as the model ships it; empty if none).
    pub template: String,
    pub details: ModelDetails,
    /// GGUF-style keys: `general.architecture`, `llama.context_length`, ...
    #[schema(value_type = Object)]
    pub model_info: serde_json::Map<String, Value>,
    /// `completion` and `embedding`.
    pub capabilities: Vec<String>,
    pub modified_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::PsModel)]
pub struct PsModel {
    pub name: String,
    pub model: String,
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
    /// When the model unloads (about a century ahead when it is kept forever).
    pub expires_at: String,
    /// Bytes of GPU memory the model holds (weights, KV cache, activations); 0 when
    /// it runs on the CPU.
    pub size_vram: u64,
    /// Strata's addition: where the model runs (`cpu` or `cuda:N`, and its name).
    pub device: strata_backend::device::DeviceInfo,
    pub context_length: usize,
    /// Strata's addition: which layers are resident and which stream from storage.
    pub residency: strata_sched::SchedSummary,
    /// Strata's addition: its running and waiting requests and their KV caches.
    pub batching: crate::queue::worker::Batching,
    /// Strata's addition: its speculative decoding (the draft, the settings) and what
    /// was drafted and kept since it loaded.
    pub speculative: crate::draft::SpeculationStatus,
}

/// `GET /api/ps`
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::PsResponse)]
pub struct PsResponse {
    pub models: Vec<PsModel>,
}

/// `GET /api/version`
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ollama::VersionResponse)]
pub struct VersionResponse {
    pub version: String,
}
