//! The Responses API, `POST /v1/responses`, stateless as Ollama and llama.cpp's server
//! offer it. A request carries the whole conversation in `input`: a user message's text,
//! or items (messages, function calls and their outputs, reasoning). Nothing is stored,
//! so `previous_response_id`, `conversation` and item references are refused with a 400
//! that says to send the items themselves, and every response says `"store": false`.
//!
//! The conversation becomes a chat job ([`ResponseRequest::into_plan`]). The job's events
//! become the response's output items through one state machine ([`Writer`]), whole or as
//! the API's named Server-Sent Events, so that both hold the same items.

mod writer;

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::ToSchema;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};

pub(super) use writer::Writer;

use super::plan::{Knobs, MAX_TOP_LOGPROBS, effort_vars, job, knobs, positive, required, sparse_ffn};
use super::types::{ChatTokenLogprob, StopSpec};
use crate::queue::{GenerateJob, PromptInput, ToolChoice};
use crate::server::error::ApiError;
use crate::server::speculative::{FlatKeys, spec_request};
use crate::server::tools::{checked, tool_choice, tool_definitions};
use strata_engine::grammar::GrammarSpec;
use strata_engine::template::ChatMessage;

/// What `include` may name (OpenAI's list). Only `message.output_text.logprobs` changes
/// anything here; the others name output of tools Strata does not host, or encrypted
/// reasoning, which it does not produce.
const INCLUDABLE: [&str; 8] = [
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
];

/// Most entries of `metadata` (OpenAI's limit).
const MAX_METADATA: usize = 16;

/// `POST /v1/responses`. Unknown fields are ignored.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ResponseRequest {
    #[schema(required = true, value_type = String, example = "llama3")]
    pub model: Option<String>,
    /// A user message's text, or the conversation as items: messages (`{"role",
    /// "content"}`; roles `user`, `assistant`, `system`, `developer`; content a string or
    /// `input_text` / `output_text` parts), `function_call` items (`call_id`, `name`,
    /// `arguments`), `function_call_output` items (`call_id`, `output`) and `reasoning`
    /// items.
    #[schema(required = true, value_type = ResponseInput, example = "Say hello.")]
    pub input: Option<ResponseInput>,
    /// A system message put before the input.
    pub instructions: Option<String>,
    /// Most tokens to generate (≥ 1); absent: until the context is full.
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<i64>,
    /// In [0, 2]; default 1.
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// In (0, 1]; default 1.
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Alternatives reported per token in `output_text.logprobs`, 0..=20 (more than 0
    /// turns the log-probabilities on, as `include` does).
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// `message.output_text.logprobs` reports each generated token's log-probability.
    /// OpenAI's other values are accepted and add nothing (they name hosted tools'
    /// output or encrypted reasoning).
    pub include: Option<Vec<String>>,
    pub stream: Option<bool>,
    /// Functions the model may call: `{"type": "function", "name", "description",
    /// "parameters"}`. Calls come back as `function_call` output items.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"` (the default with tools), `"required"`, or `{"type":
    /// "function", "name": ...}`; the last two are enforced.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// Whether a reply may call several tools (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text"}}` (the default), `{"format": {"type":
    /// "json_object"}}` or `{"format": {"type": "json_schema", "name", "schema",
    /// "strict"}}`: the output is constrained to match, token by token. `verbosity` is
    /// repeated in the response and changes nothing.
    pub text: Option<TextConfig>,
    /// `effort` goes to the chat template: `none` sets `enable_thinking` false, the
    /// other levels set it true and `reasoning_effort` to the level. `summary` is
    /// repeated and changes nothing: reasoning comes back whole, in `reasoning` items.
    pub reasoning: Option<ReasoningConfig>,
    /// Refused: Strata stores no responses; send the conversation in `input`.
    pub previous_response_id: Option<String>,
    /// Refused, as `previous_response_id`.
    #[schema(value_type = Option<Object>)]
    pub conversation: Option<Value>,
    /// `false` only: a response is generated while the request waits (or streams).
    pub background: Option<bool>,
    /// Refused: stored prompt templates are OpenAI's.
    #[schema(value_type = Option<Object>)]
    pub prompt: Option<Value>,
    /// Accepted; nothing is stored, and the response says `"store": false`.
    pub store: Option<bool>,
    /// At most 16 string values, repeated in the response.
    #[schema(value_type = Option<std::collections::HashMap<String, String>>)]
    pub metadata: Option<Map<String, Value>>,
    /// `disabled` (the default): a conversation longer than the context is a 400.
    /// `auto` (dropping items from the start) is refused.
    #[schema(pattern = "^disabled$")]
    pub truncation: Option<String>,
    /// Repeated in the response.
    pub user: Option<String>,
    /// Nonstandard: keep only the `top_k` most likely tokens (0: off, the default).
    #[schema(minimum = 0)]
    pub top_k: Option<i64>,
    /// Nonstandard: drop tokens below `min_p` times the most likely one's probability.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f64>,
    /// Nonstandard: the sampler's seed.
    pub seed: Option<i64>,
    /// Nonstandard: in [-2, 2].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f64>,
    /// Nonstandard: in [-2, 2].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f64>,
    /// Nonstandard: up to 4 stop strings.
    pub stop: Option<StopSpec>,
    /// Nonstandard: token ids (decimal strings) to a bias in [-100, 100].
    #[schema(value_type = Option<std::collections::HashMap<String, f64>>)]
    pub logit_bias: Option<Map<String, Value>>,
    /// Nonstandard: a grammar in llguidance's Lark syntax the output must match (not
    /// with a JSON `text.format`).
    pub grammar: Option<String>,
    /// Strata: how a model converted with `--sparse-ffn` runs its FFNs for this request.
    pub sparse_ffn: Option<String>,
    /// Strata: this request's speculative decoding, as on `/v1/chat/completions`.
    pub speculative: Option<crate::server::speculative::SpeculativeOptions>,
    /// Nonstandard: more chat template variables (as vLLM's `chat_template_kwargs`);
    /// they win over what `reasoning.effort` sets.
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// A user message's text, or the conversation as a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or an array of items")]
pub enum ResponseInput {
    Text(String),
    Items(Vec<Value>),
}

impl utoipa::PartialSchema for ResponseInput {
    fn schema() -> RefOr<Schema> {
        let items = ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::Object));
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(items)
            .description(Some("A user message's text, or the conversation as a list of items"))
            .into()
    }
}

impl ToSchema for ResponseInput {
    fn name() -> Cow<'static, str> {
        "ResponseInput".into()
    }
}

/// One Server-Sent Event of a streamed response: `event` names it, and `data` is a
/// [`ResponseStreamEvent`] as JSON.
pub struct ResponseEvent;

impl utoipa::PartialSchema for ResponseEvent {
    fn schema() -> RefOr<Schema> {
        let data = ObjectBuilder::new()
            .schema_type(Type::String)
            .content_media_type("application/json")
            .content_schema(Some(Ref::from_schema_name("ResponseStreamEvent")))
            .description(Some("A `ResponseStreamEvent` as JSON"));
        ObjectBuilder::new()
            .property("event", ObjectBuilder::new().schema_type(Type::String))
            .property("data", data)
            .required("event")
            .required("data")
            .into()
    }
}

impl ToSchema for ResponseEvent {
    fn name() -> Cow<'static, str> {
        "ResponseEvent".into()
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
pub struct TextConfig {
    #[schema(value_type = Option<Object>)]
    pub format: Option<Value>,
    pub verbosity: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
pub struct ReasoningConfig {
    /// `none`, `minimal`, `low`, `medium`, `high` or `xhigh`.
    pub effort: Option<String>,
    /// `auto`, `concise` or `detailed`.
    pub summary: Option<String>,
}

/// What a response repeats of its request.
#[derive(Clone, Debug)]
pub(super) struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: f64,
    pub top_p: f64,
    pub top_logprobs: i64,
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub text: Value,
    pub reasoning: ReasoningConfig,
    pub metadata: Map<String, Value>,
    pub user: Option<String>,
}

/// A validated Responses request.
#[derive(Debug)]
pub struct ResponsePlan {
    pub job: GenerateJob,
    pub stream: bool,
    /// Report log-probabilities in `output_text.logprobs`.
    pub logprobs: bool,
    pub(super) echo: Echo,
}

fn refuse_unless(field: &str, absent: bool, why: &str) -> Result<(), ApiError> {
    match absent {
        true => Ok(()),
        false => Err(ApiError::invalid(field, format!("`{field}` is not supported: {why}"))),
    }
}

impl ResponseRequest {
    pub fn into_plan(self) -> Result<ResponsePlan, ApiError> {
        let model = required(self.model, "model")?;
        let stateless = "Strata stores no responses; send the whole conversation in `input`";
        refuse_unless("previous_response_id", self.previous_response_id.is_none_or(|s| s.is_empty()), stateless)?;
        refuse_unless("conversation", self.conversation.is_none_or(|c| c.is_null()), stateless)?;
        refuse_unless("prompt", self.prompt.is_none_or(|p| p.is_null()), "stored prompts are OpenAI's")?;
        refuse_unless(
            "background",
            self.background != Some(true),
            "a response is generated while the request waits or streams",
        )?;
        match self.truncation.as_deref() {
            None | Some("disabled") => {}
            Some("auto") => {
                return Err(ApiError::invalid(
                    "truncation",
                    "`truncation` `auto` is not supported: Strata does not drop items; a conversation longer than the context is refused",
                ));
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "truncation",
                    format!("unknown `truncation` `{other}`; expected disabled"),
                ));
            }
        }
        let mut logprobs = false;
        for (i, what) in self.include.iter().flatten().enumerate() {
            if !INCLUDABLE.contains(&what.as_str()) {
                return Err(ApiError::invalid(
                    &format!("include[{i}]"),
                    format!("unknown `include` value `{what}`; expected one of {}", INCLUDABLE.join(", ")),
                ));
            }
            logprobs |= what == "message.output_text.logprobs";
        }
        let top_logprobs = match self.top_logprobs {
            None => 0,
            Some(n) if (0..=MAX_TOP_LOGPROBS).contains(&n) => n,
            Some(_) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("`top_logprobs` must be in [0, {MAX_TOP_LOGPROBS}]"),
                ));
            }
        };
        logprobs |= top_logprobs > 0;
        let metadata = self.metadata.unwrap_or_default();
        if metadata.len() > MAX_METADATA || metadata.values().any(|v| !v.is_string()) {
            return Err(ApiError::invalid(
                "metadata",
                format!("`metadata` must map at most {MAX_METADATA} keys to strings"),
            ));
        }

        let messages = conversation(self.instructions.clone(), required(self.input, "input")?)?;
        let tool_list = self.tools.unwrap_or_default();
        let tools = function_tools(&tool_list)?;
        if let Some(Value::Object(o)) = &self.tool_choice {
            match o.get("type").and_then(Value::as_str) {
                None | Some("function") => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "`tool_choice` of type `{other}` is not supported; expected none, auto, required or {{\"type\": \"function\", \"name\": ...}}"
                        ),
                    ));
                }
            }
        }
        let tools = tool_choice("tool_choice", tools, self.tool_choice.as_ref(), self.parallel_tool_calls)?;
        let grammar = match (text_format(self.text.as_ref())?, self.grammar) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("grammar", "give `grammar` or a JSON `text.format`, not both"));
            }
            (None, Some(lark)) => Some(checked("grammar", GrammarSpec::Lark(lark))?),
            (g, None) => g,
        };
        let from_format = grammar.as_ref().is_some_and(|g| !matches!(g, GrammarSpec::Lark(_)));
        if grammar.is_some() && tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto) {
            return Err(ApiError::invalid("tool_choice", "a forced tool call cannot be combined with `text.format`"));
        }
        let mut vars = effort_vars("reasoning.effort", self.reasoning.as_ref().and_then(|r| r.effort.as_deref()))?;
        vars.extend(self.chat_template_kwargs.unwrap_or_default());

        let knobs = knobs!(self);
        let max_tokens = positive("max_output_tokens", self.max_output_tokens)?;
        let mut job = job(model, PromptInput::Chat(messages), max_tokens, knobs, top_logprobs as usize)?;
        job.tools = tools;
        job.messages_param = "input";
        job.grammar_param = if from_format { "text.format" } else { "grammar" };
        job.grammar = grammar;
        job.sparse_ffn = sparse_ffn(self.sparse_ffn.as_deref())?;
        job.speculative = spec_request(self.speculative, FlatKeys::default())?;
        job.template_vars = vars;
        job.split_reasoning = true;
        let echo = Echo {
            instructions: self.instructions,
            max_output_tokens: self.max_output_tokens,
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_logprobs,
            tools: tool_list,
            tool_choice: self.tool_choice.filter(|c| !c.is_null()).unwrap_or_else(|| json!("auto")),
            parallel_tool_calls: self.parallel_tool_calls.unwrap_or(true),
            text: json!({
                "format": self.text.as_ref().and_then(|t| t.format.clone()).filter(|f| !f.is_null())
                    .unwrap_or_else(|| json!({"type": "text"})),
                "verbosity": self.text.as_ref().and_then(|t| t.verbosity.clone()),
            }),
            reasoning: self.reasoning.unwrap_or_default(),
            metadata,
            user: self.user,
        };
        Ok(ResponsePlan { job, stream: self.stream.unwrap_or(false), logprobs, echo })
    }
}

/// The function tools; OpenAI's hosted tools (`web_search`, `file_search`, ...) are
/// refused by name.
fn function_tools(list: &[Value]) -> Result<Vec<Value>, ApiError> {
    for (i, t) in list.iter().enumerate() {
        if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "function") {
            let field = format!("tools[{i}].type");
            return Err(ApiError::invalid(
                &field,
                format!("`{field}` is `{kind}`; only `function` tools are supported (hosted tools are OpenAI's)"),
            ));
        }
        if t.is_object() && t.get("function").is_none() && t.get("name").is_none() {
            let field = format!("tools[{i}].name");
            return Err(ApiError::invalid(&field, format!("`{field}` must be a non-empty string")));
        }
    }
    tool_definitions("tools", list)
}

/// `text.format` as the output's grammar (`None` for text).
fn text_format(text: Option<&TextConfig>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(format) = text.and_then(|t| t.format.as_ref()).filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "text.format.type",
            "`text.format` must be an object with a `type`: text, json_object or json_schema",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => match format.get("schema") {
            Some(schema @ Value::Object(_)) => {
                checked("text.format.schema", GrammarSpec::JsonSchema(schema.clone())).map(Some)
            }
            _ => Err(ApiError::invalid(
                "text.format.schema",
                "`text.format.schema` must be a JSON schema object with type `json_schema`",
            )),
        },
        other => Err(ApiError::invalid(
            "text.format.type",
            format!("unknown `text.format.type` `{other}`; expected text, json_object or json_schema"),
        )),
    }
}

/// `instructions` and `input` as chat messages.
fn conversation(instructions: Option<String>, input: ResponseInput) -> Result<Vec<ChatMessage>, ApiError> {
    let mut history = History::default();
    if let Some(text) = instructions.filter(|t| !t.is_empty()) {
        history.messages.push(ChatMessage::new("system", text));
    }
    match input {
        ResponseInput::Text(text) => history.messages.push(ChatMessage::new("user", text)),
        ResponseInput::Items(items) if items.is_empty() => {
            return Err(ApiError::invalid("input", "`input` must hold at least one item"));
        }
        ResponseInput::Items(items) => {
            for (i, item) in items.iter().enumerate() {
                history.item(i, item)?;
            }
        }
    }
    if history.messages.iter().all(|m| m.role == "system") {
        return Err(ApiError::invalid("input", "`input` holds no message to answer"));
    }
    Ok(history.messages)
}

/// Input items becoming chat messages.
#[derive(Default)]
struct History {
    messages: Vec<ChatMessage>,
    /// Reasoning waiting for the assistant turn it belongs to.
    reasoning: Option<String>,
    /// Whether the last message is an assistant turn that later calls may join.
    assistant_open: bool,
    /// Function names by call id, for the tool messages that answer them.
    names: HashMap<String, String>,
}

fn string_field<'a>(item: &'a Value, at: &str, key: &str) -> Result<&'a str, ApiError> {
    item.get(key).and_then(Value::as_str).ok_or_else(|| {
        let field = format!("{at}.{key}");
        ApiError::invalid(&field, format!("`{field}` must be a string"))
    })
}

/// A content list's text: `input_text`, `output_text` and `text` parts (a refusal's
/// text too), joined by newlines.
fn parts_text(content: &Value, at: &str) -> Result<String, ApiError> {
    let parts = match content {
        Value::Null => return Ok(String::new()),
        Value::String(s) => return Ok(s.clone()),
        Value::Array(parts) => parts,
        _ => {
            return Err(ApiError::invalid(at, format!("`{at}` must be a string or an array of content parts")));
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let pat = format!("{at}[{j}]");
        let (kind, key) = match part.get("type").and_then(Value::as_str) {
            Some(k @ ("input_text" | "output_text" | "text")) => (k, "text"),
            Some(k @ "refusal") => (k, "refusal"),
            Some(other) => {
                return Err(ApiError::invalid(
                    &pat,
                    format!("`{pat}`: `{other}` parts are not supported; only text parts are"),
                ));
            }
            None => return Err(ApiError::invalid(&pat, format!("`{pat}` must be an object with a `type`"))),
        };
        let text = part.get(key).and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(&format!("{pat}.{key}"), format!("`{pat}` is a `{kind}` part without `{key}`"))
        })?;
        texts.push(text);
    }
    Ok(texts.join("\n"))
}

impl History {
    fn item(&mut self, i: usize, item: &Value) -> Result<(), ApiError> {
        let at = format!("input[{i}]");
        if !item.is_object() {
            return Err(ApiError::invalid(&at, format!("`{at}` must be an object")));
        }
        let kind = match item.get("type").and_then(Value::as_str) {
            Some(k) => k,
            None if item.get("role").is_some() => "message",
            None => return Err(ApiError::invalid(&format!("{at}.type"), format!("`{at}` needs a `type` or a `role`"))),
        };
        match kind {
            "message" => self.message(item, &at),
            "function_call" => self.call(item, &at),
            "function_call_output" => {
                let call_id = string_field(item, &at, "call_id")?;
                let output = parts_text(item.get("output").unwrap_or(&Value::Null), &format!("{at}.output"))?;
                let mut msg =
                    ChatMessage::new("tool", output).with_field("tool_call_id", Value::String(call_id.into()));
                if let Some(name) = self.names.get(call_id) {
                    msg = msg.with_field("name", Value::String(name.clone()));
                }
                self.push(msg, false);
                Ok(())
            }
            "reasoning" => {
                // The reasoning text, or else its summary.
                let text = ["content", "summary"]
                    .into_iter()
                    .map(|key| {
                        let list = item.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                        list.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
                    })
                    .find(|t| !t.is_empty());
                if let Some(text) = text {
                    let held = self.reasoning.get_or_insert_with(String::new);
                    if !held.is_empty() {
                        held.push('\n');
                    }
                    held.push_str(&text);
                }
                Ok(())
            }
            "item_reference" => Err(ApiError::invalid(
                &at,
                format!("`{at}` is an item reference; Strata stores no items: send the item itself"),
            )),
            other => Err(ApiError::invalid(
                &format!("{at}.type"),
                format!(
                    "`{at}.type` `{other}` is not supported; expected message, function_call, function_call_output or reasoning"
                ),
            )),
        }
    }

    fn message(&mut self, item: &Value, at: &str) -> Result<(), ApiError> {
        let role = match string_field(item, at, "role")? {
            "system" | "developer" => "system",
            r @ ("user" | "assistant") => r,
            other => {
                let field = format!("{at}.role");
                return Err(ApiError::invalid(
                    &field,
                    format!("`{field}`: unknown role `{other}`; expected user, assistant, system or developer"),
                ));
            }
        };
        let content = parts_text(item.get("content").unwrap_or(&Value::Null), &format!("{at}.content"))?;
        let assistant = role == "assistant";
        let mut msg = ChatMessage::new(role, content);
        if let Some(r) = self.reasoning.take().filter(|_| assistant) {
            msg = msg.with_field("reasoning_content", Value::String(r));
        }
        self.push(msg, assistant);
        Ok(())
    }

    /// A call joins the assistant turn before it, or starts one.
    fn call(&mut self, item: &Value, at: &str) -> Result<(), ApiError> {
        let call_id = string_field(item, at, "call_id")?;
        let name = string_field(item, at, "name")?;
        let arguments = match item.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) if s.trim().is_empty() => json!({}),
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
                let field = format!("{at}.arguments");
                ApiError::invalid(&field, format!("`{field}` is not JSON: {e}"))
            })?,
            Some(v) => v.clone(),
        };
        self.names.insert(call_id.to_string(), name.to_string());
        let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
        if !self.assistant_open {
            let mut msg = ChatMessage::new("assistant", "");
            if let Some(r) = self.reasoning.take() {
                msg = msg.with_field("reasoning_content", Value::String(r));
            }
            self.push(msg, true);
        }
        let turn = self.messages.last_mut().expect("an assistant turn");
        match turn.fields.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(call),
            _ => {
                turn.fields.insert("tool_calls".into(), Value::Array(vec![call]));
            }
        }
        Ok(())
    }

    fn push(&mut self, msg: ChatMessage, assistant: bool) {
        self.messages.push(msg);
        self.assistant_open = assistant;
    }
}

// Responses

/// The response object, whole or as a stream's snapshot.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ResponseObject {
    #[schema(example = "resp_18f2a3b4c5d000001")]
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub created_at: u64,
    pub completed_at: Option<u64>,
    /// `in_progress` (in a stream's first events), `completed`, `incomplete` (it hit
    /// `max_output_tokens` or the context's end) or `failed`.
    #[schema(pattern = "^(in_progress|completed|incomplete|failed)$")]
    pub status: String,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: ReasoningConfig,
    /// Always false: nothing is stored.
    pub store: bool,
    pub temperature: f64,
    #[schema(value_type = Object)]
    pub text: Value,
    /// As the request gave it: `"auto"` (the default), `"none"`, `"required"`, or
    /// `{"type": "function", "name": ...}`.
    #[schema(value_type = Value)]
    pub tool_choice: Value,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    pub top_logprobs: i64,
    pub top_p: f64,
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub metadata: Map<String, Value>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ResponseError {
    /// `server_error`, or `invalid_prompt` for what the request asked that could not be
    /// done (a grammar's dead end).
    pub code: String,
    pub message: String,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub struct InputTokensDetails {
    /// Prompt tokens whose keys and values a cache already held.
    pub cached_tokens: usize,
}

#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    /// Tokens from the one that opened the reasoning to the one that closed it.
    pub reasoning_tokens: usize,
}

/// An output item.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The reply's text.
    Message {
        id: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: String,
        /// Always `assistant`.
        role: String,
        content: Vec<OutputText>,
    },
    /// Reasoning, split from the reply at the chat template's think markers.
    Reasoning {
        id: String,
        status: String,
        /// Always empty: the reasoning is not summarised.
        #[schema(value_type = Vec<Object>)]
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
    },
    /// A call of one of the request's functions.
    FunctionCall {
        id: String,
        /// The id a `function_call_output` item answers.
        call_id: String,
        name: String,
        /// A JSON object, as text.
        arguments: String,
        status: String,
    },
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
    /// With `include` `message.output_text.logprobs` (or `top_logprobs`): each token of
    /// the text.
    pub logprobs: Vec<ChatTokenLogprob>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ReasoningText {
    /// Always `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

/// One event of a streamed response (`event:` is its `type`). In order:
/// `response.created`, `response.in_progress`; per output item `response.output_item.added`,
/// its content (`response.content_part.added`, `response.output_text.delta` /
/// `response.reasoning_text.delta` …, `….done`, `response.content_part.done`, or
/// `response.function_call_arguments.delta` … `.done`), `response.output_item.done`;
/// then `response.completed`, `response.incomplete`, or `error` and `response.failed`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResponseStreamEvent {
    #[serde(rename = "type")]
    #[schema(example = "response.output_text.delta")]
    pub kind: String,
    pub sequence_number: u64,
    /// With the lifecycle events.
    pub response: Option<ResponseObject>,
    pub output_index: Option<usize>,
    pub item_id: Option<String>,
    pub content_index: Option<usize>,
    /// With `response.output_text.delta`, `response.reasoning_text.delta` and
    /// `response.function_call_arguments.delta`.
    pub delta: Option<String>,
}

#[cfg(test)]
mod tests;
