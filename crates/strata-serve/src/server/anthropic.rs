//! Anthropic's Messages API, `POST /v1/messages`, as Ollama and llama.cpp's server offer
//! it to clients written against Anthropic's SDK (Claude Code among them). `system` and
//! `messages` become a chat job: text, `tool_use`, `tool_result` and `thinking` blocks
//! become the chat's messages, tool calls and results, and reasoning. The job's events
//! become the reply's content blocks (`thinking`, `text`, `tool_use`) through one
//! state machine ([`Writer`]), whole or as Anthropic's named stream events.
//!
//! Errors have Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.

mod writer;

use std::collections::HashMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::{OpenApi, ToSchema};

use super::error::{AnthropicError, AnthropicErrorBody, AnthropicErrorDetail, ApiError};
use super::openai::StopSpec;
use super::openai::plan::{Knobs, job, positive, required};
use super::speculative::{FlatKeys, spec_request};
use super::sse;
use super::tools::{checked, tool_choice, tool_definitions};
use super::{AppState, new_id, parse_json};
use crate::queue::{Event, GenerateJob, PromptInput, ToolChoice, Work};
use strata_engine::grammar::GrammarSpec;
use strata_engine::template::ChatMessage;
use writer::Writer;

#[derive(OpenApi)]
#[openapi(
    paths(messages, count_tokens),
    components(schemas(MessagesRequest, MessageResponse, TokenCount, ContentBlock, AnthropicUsage, AnthropicErrorBody, AnthropicErrorDetail)),
    tags((name = "anthropic", description = "Anthropic-compatible Messages API"))
)]
pub struct Doc;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/messages", post(messages)).route("/v1/messages/count_tokens", post(count_tokens))
}

/// Most stop sequences a request may give.
const MAX_STOP_SEQUENCES: usize = 4;

/// `POST /v1/messages`. Unknown fields are ignored.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct MessagesRequest {
    #[schema(required = true, value_type = String, example = "llama3")]
    pub model: Option<String>,
    /// Most tokens to generate (≥ 1).
    #[schema(required = true, minimum = 1, value_type = i64)]
    pub max_tokens: Option<i64>,
    /// The conversation: `{"role": "user" | "assistant", "content"}`, content a string or
    /// blocks: `text`; an assistant's `tool_use` (`id`, `name`, `input`) and `thinking`;
    /// a user's `tool_result` (`tool_use_id`, `content`).
    #[schema(required = true, value_type = Vec<Object>)]
    pub messages: Option<Vec<Value>>,
    /// The system prompt: a string or `text` blocks.
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    /// In [0, 1]; default 1.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub temperature: Option<f64>,
    /// In (0, 1]; default 1.
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Keep only the `top_k` most likely tokens.
    #[schema(minimum = 1)]
    pub top_k: Option<i64>,
    /// Up to 4 strings that end the reply (not included in it); the one that did is
    /// `stop_sequence`.
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    /// Tools the model may call: `{"name", "description", "input_schema"}`. Calls come back
    /// as `tool_use` blocks.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "tool" | "none"}`, `"name"` with `tool`, and
    /// `disable_parallel_tool_use`; `any` and `tool` are enforced.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`: sets the chat
    /// template's `enable_thinking` (the budget is not enforced). A thinking model's
    /// reasoning comes back in `thinking` blocks either way.
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
    /// `{"format": {"type": "json_schema", "schema": {...}}}`: the text is constrained to
    /// match, token by token; `effort` (`low` … `max`) goes to the chat template as
    /// `reasoning_effort`.
    #[schema(value_type = Option<Object>)]
    pub output_config: Option<Value>,
    /// Accepted (`user_id`).
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Nonstandard: the sampler's seed.
    pub seed: Option<i64>,
    /// Nonstandard: a grammar in llguidance's Lark syntax the output must match (not
    /// with `output_config.format`).
    pub grammar: Option<String>,
    /// Strata: this request's speculative decoding, as on `/v1/chat/completions`.
    pub speculative: Option<crate::server::speculative::SpeculativeOptions>,
}

/// A reply.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct MessageResponse {
    #[schema(example = "msg_18f2a3b4c5d000001")]
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always `assistant`.
    pub role: String,
    pub model: String,
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens` (the limit or the context's end), `stop_sequence` or
    /// `tool_use`; null in a stream's `message_start`.
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: AnthropicUsage,
}

/// A content block of a reply.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Reasoning, split from the reply at the chat template's think markers.
    Thinking {
        thinking: String,
        /// Always empty: nothing is signed.
        signature: String,
    },
    Text {
        text: String,
    },
    /// A call of one of the request's tools.
    ToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

/// Anthropic counts input in three parts: `input_tokens` (not from a cache),
/// `cache_read_input_tokens` (whose keys and values a cache held) and
/// `cache_creation_input_tokens` (always 0 here).
#[derive(Clone, Copy, Debug, Default, Serialize, ToSchema)]
pub struct AnthropicUsage {
    pub input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
    pub output_tokens: usize,
}

/// A validated Messages request.
#[derive(Debug)]
pub struct MessagesPlan {
    pub job: GenerateJob,
    pub stream: bool,
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

impl MessagesRequest {
    pub fn into_plan(self) -> Result<MessagesPlan, ApiError> {
        let model = required(self.model, "model")?;
        let max_tokens = positive("max_tokens", Some(required(self.max_tokens, "max_tokens")?))?;
        if let Some(t) = self.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
            return Err(invalid("temperature", format!("`temperature` must be in [0, 1], not {t}")));
        }
        if self.top_k.is_some_and(|k| k < 1) {
            return Err(invalid("top_k", "`top_k` must be at least 1"));
        }
        let stops = self.stop_sequences.unwrap_or_default();
        if stops.len() > MAX_STOP_SEQUENCES {
            return Err(invalid(
                "stop_sequences",
                format!("`stop_sequences` may hold at most {MAX_STOP_SEQUENCES} strings"),
            ));
        }
        let messages = conversation(self.system, required(self.messages, "messages")?)?;
        let tools = tools(self.tools.as_deref().unwrap_or_default(), self.tool_choice.as_ref())?;
        let mut vars = Map::new();
        match self.thinking.as_ref().filter(|t| !t.is_null()) {
            None => {}
            Some(t) => match t.get("type").and_then(Value::as_str) {
                Some("enabled" | "adaptive") => {
                    vars.insert("enable_thinking".into(), Value::Bool(true));
                }
                Some("disabled") => {
                    vars.insert("enable_thinking".into(), Value::Bool(false));
                }
                _ => {
                    return Err(invalid("thinking.type", "`thinking.type` must be enabled, adaptive or disabled"));
                }
            },
        }
        let mut grammar = None;
        if let Some(config) = self.output_config.as_ref().filter(|c| !c.is_null()) {
            if !config.is_object() {
                return Err(invalid("output_config", "`output_config` must be an object"));
            }
            match config.get("effort") {
                None | Some(Value::Null) => {}
                Some(Value::String(level)) if ["low", "medium", "high", "xhigh", "max"].contains(&level.as_str()) => {
                    vars.insert("reasoning_effort".into(), json!(level));
                }
                Some(_) => {
                    return Err(invalid(
                        "output_config.effort",
                        "`output_config.effort` must be low, medium, high, xhigh or max",
                    ));
                }
            }
            grammar = output_format(config.get("format"))?;
        }
        let grammar_param = match (grammar.is_some(), self.grammar) {
            (true, Some(_)) => {
                return Err(invalid("grammar", "give `grammar` or `output_config.format`, not both"));
            }
            (false, Some(lark)) => {
                grammar = Some(checked("grammar", GrammarSpec::Lark(lark))?);
                "grammar"
            }
            _ => "output_config.format",
        };
        if grammar.is_some() && tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto) {
            return Err(invalid("tool_choice", "a forced tool call cannot be combined with `output_config.format`"));
        }
        let knobs = Knobs {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: None,
            seed: self.seed,
            presence_penalty: None,
            frequency_penalty: None,
            stop: Some(StopSpec::Many(stops)),
            logit_bias: None,
        };
        let mut job = job(model, PromptInput::Chat(messages), max_tokens, knobs, 0)?;
        job.messages_param = "messages";
        job.tools = tools;
        job.grammar = grammar;
        job.grammar_param = grammar_param;
        job.template_vars = vars;
        job.split_reasoning = true;
        job.speculative = spec_request(self.speculative, FlatKeys::default())?;
        Ok(MessagesPlan { job, stream: self.stream.unwrap_or(false) })
    }
}

/// `output_config.format` as the output's grammar.
fn output_format(format: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => match format.get("schema") {
            Some(schema @ Value::Object(_)) => {
                checked("output_config.format.schema", GrammarSpec::JsonSchema(schema.clone())).map(Some)
            }
            _ => Err(invalid(
                "output_config.format.schema",
                "`output_config.format.schema` must be a JSON schema object",
            )),
        },
        _ => Err(invalid("output_config.format.type", "`output_config.format.type` must be json_schema")),
    }
}

/// The tools in the chat shape, with the choice.
fn tools(list: &[Value], choice: Option<&Value>) -> Result<Option<crate::queue::ChatTools>, ApiError> {
    let mut defs = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            let field = format!("{at}.type");
            return Err(invalid(
                &field,
                format!("`{field}` is `{kind}`; only custom tools (`name`, `input_schema`) are supported"),
            ));
        }
        let name = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let name =
            name.ok_or_else(|| invalid(&format!("{at}.name"), format!("`{at}.name` must be a non-empty string")))?;
        let schema = match t.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            _ => {
                let field = format!("{at}.input_schema");
                return Err(invalid(&field, format!("`{field}` must be a JSON schema object")));
            }
        };
        // In the order chat clients send a function's fields: templates show them as given.
        let mut function = Map::new();
        function.insert("name".into(), json!(name));
        if let Some(d) = t.get("description").and_then(Value::as_str) {
            function.insert("description".into(), json!(d));
        }
        function.insert("parameters".into(), schema);
        defs.push(json!({"type": "function", "function": function}));
    }
    let defs = tool_definitions("tools", &defs)?;
    // Anthropic's choice in the chat's terms.
    let (choice, parallel) = match choice.filter(|c| !c.is_null()) {
        None => (None, true),
        Some(c) => {
            let parallel = !c.get("disable_parallel_tool_use").and_then(Value::as_bool).unwrap_or(false);
            let chat = match c.get("type").and_then(Value::as_str) {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => match c.get("name").and_then(Value::as_str) {
                    Some(name) => json!({"name": name}),
                    None => {
                        return Err(invalid("tool_choice.name", "`tool_choice.name` is required with type `tool`"));
                    }
                },
                _ => {
                    return Err(invalid("tool_choice.type", "`tool_choice.type` must be auto, any, tool or none"));
                }
            };
            (Some(chat), parallel)
        }
    };
    tool_choice("tool_choice", defs, choice.as_ref(), Some(parallel))
}

/// A block list's text: `text` blocks joined by newlines; `what` names other blocks'
/// field for the error.
fn blocks_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let bat = format!("{at}[{j}]");
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(text)) => texts.push(text),
                    (Some(other), _) if other != "text" => {
                        return Err(invalid(
                            &bat,
                            format!("`{bat}`: `{other}` blocks are not supported here; only text"),
                        ));
                    }
                    _ => return Err(invalid(&bat, format!("`{bat}` must be a text block with `text`"))),
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(invalid(at, format!("`{at}` must be a string or an array of blocks"))),
    }
}

/// `system` and `messages` as chat messages.
fn conversation(system: Option<Value>, messages: Vec<Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system.filter(|s| !s.is_null()) {
        let text = blocks_text(&system, "system")?;
        if !text.is_empty() {
            out.push(ChatMessage::new("system", text));
        }
    }
    if messages.is_empty() {
        return Err(invalid("messages", "`messages` must hold at least one message"));
    }
    // Tool names by call id, for the results that answer them.
    let mut names: HashMap<String, String> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        if !m.is_object() {
            return Err(invalid(&at, format!("`{at}` must be an object")));
        }
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let content = m.get("content").unwrap_or(&Value::Null);
        let cat = format!("{at}.content");
        let text;
        let blocks: &[Value] = match content {
            Value::String(s) => {
                text = [json!({"type": "text", "text": s})];
                &text
            }
            Value::Array(blocks) => blocks,
            _ => return Err(invalid(&cat, format!("`{cat}` must be a string or an array of blocks"))),
        };
        match role {
            "user" => user_turn(blocks, &cat, &names, &mut out)?,
            "assistant" => out.push(assistant_turn(blocks, &cat, &mut names)?),
            other => {
                let field = format!("{at}.role");
                return Err(invalid(&field, format!("`{field}`: unknown role `{other}`; expected user or assistant")));
            }
        }
    }
    Ok(out)
}

fn block_str<'a>(b: &'a Value, at: &str, key: &str) -> Result<&'a str, ApiError> {
    b.get(key).and_then(Value::as_str).ok_or_else(|| {
        let field = format!("{at}.{key}");
        invalid(&field, format!("`{field}` must be a string"))
    })
}

/// A user turn: its tool results as tool messages, in order, and its text as one user
/// message.
fn user_turn(
    blocks: &[Value],
    at: &str,
    names: &HashMap<String, String>,
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    let mut texts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bat = format!("{at}[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => texts.push(block_str(b, &bat, "text")?.to_string()),
            Some("tool_result") => {
                let id = block_str(b, &bat, "tool_use_id")?;
                let text = blocks_text(b.get("content").unwrap_or(&Value::Null), &format!("{bat}.content"))?;
                let mut msg = ChatMessage::new("tool", text).with_field("tool_call_id", json!(id));
                if let Some(name) = names.get(id) {
                    msg = msg.with_field("name", json!(name));
                }
                out.push(msg);
            }
            Some(other) => {
                return Err(invalid(
                    &bat,
                    format!("`{bat}`: `{other}` blocks are not supported in a user turn; expected text or tool_result"),
                ));
            }
            None => return Err(invalid(&bat, format!("`{bat}` must be a block with a `type`"))),
        }
    }
    if !texts.is_empty() || blocks.is_empty() {
        out.push(ChatMessage::new("user", texts.join("\n")));
    }
    Ok(())
}

/// An assistant turn: its text, reasoning and calls as one message.
fn assistant_turn(blocks: &[Value], at: &str, names: &mut HashMap<String, String>) -> Result<ChatMessage, ApiError> {
    let (mut texts, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let bat = format!("{at}[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => texts.push(block_str(b, &bat, "text")?.to_string()),
            Some("thinking") => thinking.push(block_str(b, &bat, "thinking")?.to_string()),
            // Encrypted reasoning means nothing to this model.
            Some("redacted_thinking") => {}
            Some("tool_use") => {
                let id = block_str(b, &bat, "id")?;
                let name = block_str(b, &bat, "name")?;
                let input = match b.get("input") {
                    None | Some(Value::Null) => json!({}),
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(_) => {
                        let field = format!("{bat}.input");
                        return Err(invalid(&field, format!("`{field}` must be an object")));
                    }
                };
                names.insert(id.to_string(), name.to_string());
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
            }
            Some(other) => {
                return Err(invalid(
                    &bat,
                    format!(
                        "`{bat}`: `{other}` blocks are not supported in an assistant turn; expected text, thinking or tool_use"
                    ),
                ));
            }
            None => return Err(invalid(&bat, format!("`{bat}` must be a block with a `type`"))),
        }
    }
    let mut msg = ChatMessage::new("assistant", texts.join("\n"));
    if !calls.is_empty() {
        msg = msg.with_field("tool_calls", Value::Array(calls));
    }
    if !thinking.is_empty() {
        msg = msg.with_field("reasoning_content", json!(thinking.join("\n")));
    }
    Ok(msg)
}

/// Generates the assistant's reply (Anthropic's Messages API).
#[utoipa::path(post, path = "/v1/messages", tag = "anthropic",
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "The reply, or with `stream: true` Anthropic's events (`message_start`, content blocks, `message_delta`, `message_stop`)",
            body = MessageResponse),
        (status = 400, description = "Invalid request (the message names the field)", body = AnthropicErrorBody),
        (status = 404, description = "Unknown model", body = AnthropicErrorBody),
        (status = 429, description = "The queue is full; retry after `Retry-After` seconds", body = AnthropicErrorBody),
        (status = 503, description = "Shutting down", body = AnthropicErrorBody),
    ))]
pub async fn messages(State(state): State<AppState>, body: Bytes) -> Result<Response, AnthropicError> {
    let mut plan = parse_json::<MessagesRequest>(&body)?.into_plan()?;
    state.model(&plan.job.model)?;
    plan.job.truncate = state.config.v1_truncation();
    let model = plan.job.model.clone();
    let rx = state.queue.submit(Work::Generate(plan.job)).map_err(ApiError::from)?;
    let mut writer = Writer::new(new_id("msg_"), model, plan.stream);
    if plan.stream {
        return Ok(sse::streamed(&state, rx, writer).await?);
    }
    sse::whole(&state, rx, &mut writer).await;
    Ok(Json(writer.into_message()?).into_response())
}

/// `POST /v1/messages/count_tokens`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCount {
    /// The prompt's tokens: the system prompt, the messages and the tools, as the model's
    /// chat template renders them.
    pub input_tokens: usize,
}

/// Counts the tokens a Messages request's prompt would take (`max_tokens` may be left
/// out). The model is loaded to render and tokenize it; nothing is generated.
#[utoipa::path(post, path = "/v1/messages/count_tokens", tag = "anthropic",
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "The prompt's size", body = TokenCount),
        (status = 400, description = "Invalid request (the message names the field)", body = AnthropicErrorBody),
        (status = 404, description = "Unknown model", body = AnthropicErrorBody),
    ))]
pub async fn count_tokens(State(state): State<AppState>, body: Bytes) -> Result<Json<TokenCount>, AnthropicError> {
    let mut request = parse_json::<MessagesRequest>(&body)?;
    request.max_tokens.get_or_insert(1);
    let mut plan = request.into_plan()?;
    state.model(&plan.job.model)?;
    plan.job.count_only = true;
    let mut rx = state.queue.submit(Work::Generate(plan.job)).map_err(ApiError::from)?;
    loop {
        match rx.recv().await {
            Some(Event::Started { prompt_tokens, .. }) => return Ok(Json(TokenCount { input_tokens: prompt_tokens })),
            Some(Event::Error(e)) => return Err(ApiError::from(e).into()),
            Some(_) => {}
            None => return Err(ApiError::worker_gone().into()),
        }
    }
}

#[cfg(test)]
mod tests;
