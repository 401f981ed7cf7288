//! The request and response bodies of the OpenAI API, as the SDKs send and read them.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};

use crate::queue::JobDone;
use crate::queue::models::ModelInfo;
pub use crate::server::speculative::SpeculativeOptions;

// Requests

/// `POST /v1/chat/completions`. Unknown fields are ignored.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    #[schema(required = true, value_type = String, example = "llama3")]
    pub model: Option<String>,
    /// The conversation; roles `system`, `developer` (treated as `system`), `user`, `assistant`.
    #[schema(required = true, value_type = Vec<ChatMessageIn>, min_items = 1)]
    pub messages: Option<Vec<ChatMessageIn>>,
    /// In [0, 2]; default 1.
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// In (0, 1]; default 1.
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Nonstandard: keep only the `top_k` most likely tokens (0: off, the default).
    #[schema(minimum = 0)]
    pub top_k: Option<i64>,
    /// Nonstandard: drop tokens below `min_p` times the most likely one's probability.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f64>,
    /// Most tokens to generate (≥ 1); absent: until the context is full.
    #[schema(minimum = 1)]
    pub max_tokens: Option<i64>,
    /// Same as `max_tokens`; the smaller wins when both are given.
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<i64>,
    pub stop: Option<StopSpec>,
    pub seed: Option<i64>,
    /// Strata: how a model converted with `--sparse-ffn` runs its FFNs for this request
    /// (`off`, `auto`, `topk=F`, `threshold=T`, optionally `,per=sequence`); absent: the
    /// server's `--sparse-ffn`.
    pub sparse_ffn: Option<String>,
    /// Strata: this request's speculative decoding, `{"type": "draft"|"ngram"|"off",
    /// "n_max", "n_min", "p_min"}`; what it leaves out is the model's (`--draft`).
    pub speculative: Option<SpeculativeOptions>,
    /// llama-server's flat form of `speculative.n_max` (not with it).
    #[serde(rename = "speculative.n_max")]
    #[schema(minimum = 0, maximum = 64)]
    pub speculative_n_max: Option<i64>,
    /// llama-server's flat form of `speculative.n_min`.
    #[serde(rename = "speculative.n_min")]
    #[schema(minimum = 0, maximum = 64)]
    pub speculative_n_min: Option<i64>,
    /// llama-server's flat form of `speculative.p_min`.
    #[serde(rename = "speculative.p_min")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub speculative_p_min: Option<f64>,
    /// In [-2, 2].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f64>,
    /// In [-2, 2].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f64>,
    /// Token ids (decimal strings) to a bias in [-100, 100] added to their logits before
    /// sampling: -100 bans a token, 100 all but forces it. Log-probabilities are reported
    /// before the bias.
    #[schema(value_type = Option<std::collections::HashMap<String, f64>>, example = json!({"29": -100}))]
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Report the log-probability of every generated token.
    pub logprobs: Option<bool>,
    /// Alternatives reported per token, 0..=20; needs `logprobs: true`.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// Choices to generate (for each prompt), each a generation of its own; at most 16
    /// in all. Choice `j` samples with `seed` + `j`.
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// `{"type": "text"}`, `{"type": "json_object"}` (any JSON object) or
    /// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`: the output
    /// is constrained to match, token by token.
    pub response_format: Option<ResponseFormat>,
    /// Nonstandard: a grammar in llguidance's Lark syntax the output must match (as
    /// llama.cpp's server `grammar`, in Lark rather than GBNF).
    pub grammar: Option<String>,
    /// Functions the model may call: `{"type": "function", "function": {"name",
    /// "description", "parameters"}}`. Calls come back in `message.tool_calls`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"` (the default with tools), `"required"`, or
    /// `{"type": "function", "function": {"name": ...}}`; the last two are enforced.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// Whether a reply may call several tools (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Legacy form of `tools` (a list of function definitions).
    #[schema(value_type = Option<Vec<Object>>)]
    pub functions: Option<Vec<Value>>,
    /// Legacy form of `tool_choice`: `"none"`, `"auto"` or `{"name": ...}`.
    #[schema(value_type = Option<Object>)]
    pub function_call: Option<Value>,
    /// Nonstandard: more chat template variables (as vLLM's `chat_template_kwargs`),
    /// e.g. `{"enable_thinking": false}`; they win over what `reasoning_effort` sets.
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `none` sets the chat template's `enable_thinking` false; `minimal`, `low`,
    /// `medium`, `high` or `xhigh` set it true and `reasoning_effort` to the level.
    #[schema(pattern = "^(none|minimal|low|medium|high|xhigh)$")]
    pub reasoning_effort: Option<String>,
    /// Accepted and ignored.
    pub user: Option<String>,
}

/// One message of the conversation.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatMessageIn {
    #[schema(example = "user", pattern = "^(system|developer|user|assistant|tool|function|ipython)$")]
    pub role: String,
    /// A string or a list of `{"type": "text", "text": ...}` parts (joined by newlines);
    /// absent or null: empty (an assistant turn that only called tools has none).
    pub content: Option<MessageContent>,
    /// The tool's name, on `tool` messages; passed to the template.
    pub name: Option<String>,
    /// An assistant turn's calls: `{"id", "type": "function", "function": {"name",
    /// "arguments"}}`, arguments as a JSON string (or object).
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
    /// On `tool` messages: the id of the call this answers.
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, passed to templates that show it.
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or an array of content parts")]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part; only `text` parts are supported.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    #[schema(example = "text", pattern = "^text$")]
    pub kind: String,
    pub text: Option<String>,
}

/// A stop string or a list of at most 4.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or an array of up to 4 strings")]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send one more chunk with `"choices": []` and the usage before `[DONE]`.
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    #[schema(pattern = "^(text|json_object|json_schema)$")]
    pub kind: String,
    /// With `json_schema`: `{"name", "schema", "strict", "description"}`.
    #[schema(value_type = Option<Object>)]
    pub json_schema: Option<Value>,
}

/// `POST /v1/completions`. Unknown fields are ignored.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct CompletionRequest {
    #[schema(required = true, value_type = String, example = "llama3")]
    pub model: Option<String>,
    #[schema(required = true, value_type = PromptSpec)]
    pub prompt: Option<PromptSpec>,
    /// Most tokens to generate (≥ 1); absent: until the context is full.
    #[schema(minimum = 1)]
    pub max_tokens: Option<i64>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Nonstandard, as in chat.
    #[schema(minimum = 0)]
    pub top_k: Option<i64>,
    /// Nonstandard, as in chat.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f64>,
    pub stop: Option<StopSpec>,
    pub seed: Option<i64>,
    /// Strata: how a model converted with `--sparse-ffn` runs its FFNs for this request
    /// (`off`, `auto`, `topk=F`, `threshold=T`, optionally `,per=sequence`); absent: the
    /// server's `--sparse-ffn`.
    pub sparse_ffn: Option<String>,
    /// Strata: this request's speculative decoding, `{"type": "draft"|"ngram"|"off",
    /// "n_max", "n_min", "p_min"}`; what it leaves out is the model's (`--draft`).
    pub speculative: Option<SpeculativeOptions>,
    /// llama-server's flat form of `speculative.n_max` (not with it).
    #[serde(rename = "speculative.n_max")]
    #[schema(minimum = 0, maximum = 64)]
    pub speculative_n_max: Option<i64>,
    /// llama-server's flat form of `speculative.n_min`.
    #[serde(rename = "speculative.n_min")]
    #[schema(minimum = 0, maximum = 64)]
    pub speculative_n_min: Option<i64>,
    /// llama-server's flat form of `speculative.p_min`.
    #[serde(rename = "speculative.p_min")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub speculative_p_min: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f64>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f64>,
    /// Token ids (decimal strings) to a bias in [-100, 100] added to their logits before
    /// sampling: -100 bans a token, 100 all but forces it. Log-probabilities are reported
    /// before the bias.
    #[schema(value_type = Option<std::collections::HashMap<String, f64>>, example = json!({"29": -100}))]
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Alternatives reported per token (0..=20); absent: no log-probabilities.
    #[schema(minimum = 0, maximum = 20)]
    pub logprobs: Option<i64>,
    /// Not supported yet: must be absent or false.
    pub echo: Option<bool>,
    /// Fill in the middle: the text after the cursor (the `prompt`, as text, is the text
    /// before it), for models whose vocabulary has FIM tokens.
    pub suffix: Option<String>,
    /// Choices to generate (for each prompt), each a generation of its own; at most 16
    /// in all. Choice `j` samples with `seed` + `j`.
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<i64>,
    /// Only 1 is supported.
    #[schema(minimum = 1, maximum = 1)]
    pub best_of: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Nonstandard (as vLLM): `json_object` or `json_schema`, as in chat.
    pub response_format: Option<ResponseFormat>,
    /// Nonstandard: a Lark grammar the output must match, as in chat.
    pub grammar: Option<String>,
    /// Accepted and ignored.
    pub user: Option<String>,
}

/// A string, a list of one string, a list of token ids, or a list of one list of ids.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "a string, an array of strings, an array of token ids or an array of arrays of token ids"
)]
pub enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings`. Unknown fields are ignored.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    #[schema(required = true, value_type = String, example = "llama3")]
    pub model: Option<String>,
    #[schema(required = true, value_type = EmbeddingInputSpec)]
    pub input: Option<EmbeddingInputSpec>,
    /// `float` (the default) or `base64` (little-endian f32 bytes).
    #[schema(pattern = "^(float|base64)$")]
    pub encoding_format: Option<String>,
    /// Must equal the model's embedding size when given.
    #[schema(minimum = 1)]
    pub dimensions: Option<i64>,
    /// Accepted and ignored.
    pub user: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "a string, an array of strings, an array of token ids or an array of arrays of token ids"
)]
pub enum EmbeddingInputSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

// Responses

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
    /// The reply called tools (see `tool_calls`).
    ToolCalls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Chat only: how many prompt tokens a cache held (a previous exchange's keys and
    /// values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Chat only: how many generated tokens were reasoning (from the token that opened it
    /// to the one that closed it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: usize,
}

impl Usage {
    pub(super) fn of(done: &JobDone) -> Self {
        Usage::of_choices([done], 1)
    }

    /// Of a request's choices, in choice order, `n` to a prompt: each prompt counted once
    /// (as OpenAI counts it, its cached tokens with it), every choice's completion.
    pub(super) fn of_choices<'a>(dones: impl IntoIterator<Item = &'a JobDone>, n: usize) -> Self {
        let (mut prompt_tokens, mut completion_tokens, mut cached_tokens, mut reasoning_tokens) = (0, 0, 0, 0);
        for (i, done) in dones.into_iter().enumerate() {
            if i % n.max(1) == 0 {
                prompt_tokens += done.prompt_tokens;
                cached_tokens += done.cached_tokens;
            }
            completion_tokens += done.completion_tokens;
            reasoning_tokens += done.reasoning_tokens;
        }
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
            completion_tokens_details: Some(CompletionTokensDetails { reasoning_tokens }),
        }
    }

    /// Without the chat's details (the legacy completions API has none).
    pub(super) fn plain(self) -> Self {
        Usage { prompt_tokens_details: None, completion_tokens_details: None, ..self }
    }
}

/// llama-server's `timings`: the prompt tokens run and the tokens generated, with their
/// times, and what speculative decoding drafted and kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, ToSchema)]
pub struct Timings {
    /// Prompt tokens a cache already held (not run again).
    pub cache_n: usize,
    /// Prompt tokens run.
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
    /// Tokens speculative decoding drafted and verified (0 without it).
    pub draft_n: u64,
    /// Of those, the tokens kept: the model generated them too.
    pub draft_n_accepted: u64,
}

impl Timings {
    pub(super) fn of(done: &JobDone) -> Self {
        Timings::of_choices([done], 1)
    }

    /// Of a request's choices, `n` to a prompt: each prompt counted once, as
    /// [`Usage::of_choices`] counts it, every choice's generation.
    pub(super) fn of_choices<'a>(dones: impl IntoIterator<Item = &'a JobDone>, n: usize) -> Self {
        let (mut cache_n, mut prompt_n, mut prompt_s, mut predicted_n, mut predicted_s) = (0, 0, 0.0, 0, 0.0);
        let (mut draft_n, mut draft_n_accepted) = (0, 0);
        for (i, done) in dones.into_iter().enumerate() {
            if i % n.max(1) == 0 {
                cache_n += done.cached_tokens;
                prompt_n += done.prompt_tokens.saturating_sub(done.cached_tokens);
                prompt_s += done.prefill.as_secs_f64();
            }
            predicted_n += done.completion_tokens;
            predicted_s += done.decode.as_secs_f64();
            draft_n += done.speculative.drafted;
            draft_n_accepted += done.speculative.accepted;
        }
        let per_token_ms = |s: f64, n: usize| if n > 0 { 1e3 * s / n as f64 } else { 0.0 };
        let per_second = |s: f64, n: usize| if s > 0.0 { n as f64 / s } else { 0.0 };
        Timings {
            cache_n,
            prompt_n,
            prompt_ms: 1e3 * prompt_s,
            prompt_per_token_ms: per_token_ms(prompt_s, prompt_n),
            prompt_per_second: per_second(prompt_s, prompt_n),
            predicted_n,
            predicted_ms: 1e3 * predicted_s,
            predicted_per_token_ms: per_token_ms(predicted_s, predicted_n),
            predicted_per_second: per_second(predicted_s, predicted_n),
            draft_n,
            draft_n_accepted,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletionResponse {
    #[schema(example = "chatcmpl-18f2a3b4c5d000001")]
    pub id: String,
    #[schema(example = "chat.completion")]
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// llama-server's timings, with what speculative decoding drafted and kept.
    pub timings: Timings,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    #[schema(example = "assistant")]
    pub role: String,
    /// The reply's text; null when it only called tools.
    pub content: Option<String>,
    /// The reply's reasoning (between the template's think markers), when split off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A call in a reply.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    #[schema(example = "function")]
    pub kind: String,
    pub function: FunctionCallOut,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FunctionCallOut {
    pub name: String,
    /// JSON text of an object.
    pub arguments: String,
}

/// A piece of a call in a stream: the first carries `id`, `type` and `function.name`,
/// later ones only `index` and `function.arguments` fragments.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionDelta,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One `data:` event of a streamed chat completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    #[schema(example = "chat.completion.chunk")]
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    /// Empty in the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// With `stream_options.include_usage`: null, except in the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Usage>)]
    pub usage: Option<Option<Usage>>,
    /// In the chunk with the finish reason only: llama-server's timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// What a chunk adds: the role (first chunk), content, or nothing (the last chunk).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One Server-Sent Event of a streamed chat completion: `data` is a
/// [`ChatCompletionChunk`] as JSON, a last `{"error": ...}`, or `[DONE]`.
pub struct ChatCompletionEvent;

/// One Server-Sent Event of a streamed completion: `data` is a [`CompletionResponse`]
/// as JSON, a last `{"error": ...}`, or `[DONE]`.
pub struct CompletionEvent;

impl utoipa::PartialSchema for ChatCompletionEvent {
    fn schema() -> RefOr<Schema> {
        sse_event_schema("ChatCompletionChunk")
    }
}

impl ToSchema for ChatCompletionEvent {
    fn name() -> Cow<'static, str> {
        "ChatCompletionEvent".into()
    }
}

impl utoipa::PartialSchema for CompletionEvent {
    fn schema() -> RefOr<Schema> {
        sse_event_schema("CompletionResponse")
    }
}

impl ToSchema for CompletionEvent {
    fn name() -> Cow<'static, str> {
        "CompletionEvent".into()
    }
}

/// An SSE event (`{"event", "data"}`, as OpenAPI describes `text/event-stream` items) whose
/// data is the JSON schema `payload` or an error body, or the literal `[DONE]`.
fn sse_event_schema(payload: &str) -> RefOr<Schema> {
    let done = ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["[DONE]"]));
    let json = ObjectBuilder::new().schema_type(Type::String).content_media_type("application/json").content_schema(
        Some(OneOfBuilder::new().item(Ref::from_schema_name(payload)).item(Ref::from_schema_name("OpenAiErrorBody"))),
    );
    let data = AnyOfBuilder::new()
        .item(done)
        .item(json)
        .description(Some(format!("A `{payload}` as JSON, a last `{{\"error\": ...}}`, or `[DONE]`")));
    ObjectBuilder::new()
        .property("event", ObjectBuilder::new().schema_type(Type::String))
        .property("data", data)
        .required("data")
        .into()
}

/// A completion, or one `data:` event of a streamed one.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionResponse {
    #[schema(example = "cmpl-18f2a3b4c5d000001")]
    pub id: String,
    #[schema(example = "text_completion")]
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    /// Always present in a whole completion; in a stream, only with
    /// `stream_options.include_usage` (null except in the last chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Usage>)]
    pub usage: Option<Option<Usage>>,
    /// In a whole completion, and in a stream's chunk with the finish reason:
    /// llama-server's timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// The legacy completions log-probabilities.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Per token: the alternatives and the sampled token, `{token: logprob}`.
    #[schema(value_type = Vec<std::collections::HashMap<String, f32>>)]
    pub top_logprobs: Vec<serde_json::Map<String, Value>>,
    /// Character offset of each token in the generated text.
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingResponse {
    #[schema(example = "list")]
    pub object: String,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingData {
    #[schema(example = "embedding")]
    pub object: String,
    pub index: usize,
    pub embedding: EmbeddingVector,
}

/// Floats, or base64 of their little-endian f32 bytes.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    #[schema(example = "list")]
    pub object: String,
    pub data: Vec<ModelObject>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelObject {
    #[schema(example = "llama3")]
    pub id: String,
    #[schema(example = "model")]
    pub object: String,
    /// Unix seconds (when the model's files last changed).
    pub created: u64,
    #[schema(example = "strata")]
    pub owned_by: String,
}

impl ModelObject {
    pub(super) fn of(info: &ModelInfo) -> Self {
        ModelObject {
            id: info.name.clone(),
            object: "model".into(),
            created: unix_seconds(info.modified_at),
            owned_by: "strata".into(),
        }
    }
}

pub(super) fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
