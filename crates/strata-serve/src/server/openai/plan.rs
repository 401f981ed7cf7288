//! Request bodies → validated [`Plan`]s: every range and unsupported feature is checked
//! here, and every error names its field.

use serde_json::Value;
use strata_model::sparse::SparseFfn;

use super::types::*;
use crate::queue::{EmbedInput, EmbedJob, GenerateJob, PromptInput, ToolChoice};
use crate::server::error::ApiError;
use crate::server::speculative::{FlatKeys, spec_request};
use crate::server::tools::{checked, history_calls, response_format, tool_choice, tool_definitions};
use strata_engine::grammar::GrammarSpec;
use strata_engine::sampler::SamplingParams;
use strata_engine::template::ChatMessage;
use strata_engine::tokenizer::TextError;

/// Most `stop` strings a request may give (OpenAI's limit).
const MAX_STOP: usize = 4;
/// Most alternatives per token (OpenAI's limit for chat).
pub(in crate::server) const MAX_TOP_LOGPROBS: i64 = 20;
/// Most inputs in one embeddings request (OpenAI's limit).
const MAX_EMBED_INPUTS: usize = 2048;

/// Which endpoint a generation answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
}

/// A validated generation request: the job and how to answer it.
#[derive(Debug)]
pub struct Plan {
    pub api: Api,
    /// The first choice's job; the others differ in their prompt and seed ([`Plan::jobs`]).
    pub job: GenerateJob,
    /// Choices per prompt (`n`).
    pub n: usize,
    /// `/v1/completions`' prompts after the first.
    pub more_prompts: Vec<PromptInput>,
    pub stream: bool,
    pub include_usage: bool,
    /// Report log-probabilities.
    pub logprobs: bool,
}

/// The most choices one request may ask for: `n` times its prompts. Each is a generation
/// of its own in the queue.
pub const MAX_CHOICES: usize = 16;

impl Plan {
    /// One job per choice, in choice order: each prompt's `n` choices in turn. A
    /// prompt's choice `j` samples with the request's seed plus `j`, so that the choices
    /// differ and each can be had again alone (with that seed and `n` 1).
    pub fn jobs(&self) -> Vec<GenerateJob> {
        let prompts = std::iter::once(&self.job.prompt).chain(&self.more_prompts);
        prompts
            .flat_map(|prompt| {
                (0..self.n).map(move |j| {
                    let mut job = self.job.clone();
                    job.prompt = prompt.clone();
                    job.sampling.seed = job.sampling.seed.map(|s| s.wrapping_add(j as u64));
                    job
                })
            })
            .collect()
    }
}

/// `n`, checked: 1 to [`MAX_CHOICES`] over `prompts` prompts.
fn choices(n: Option<i64>, prompts: usize) -> Result<usize, ApiError> {
    let n = n.unwrap_or(1);
    if n < 1 || (n as u64).saturating_mul(prompts as u64) > MAX_CHOICES as u64 {
        let over = if prompts > 1 { format!(" over {prompts} prompts") } else { String::new() };
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be at least 1, and at most {MAX_CHOICES} choices in all{over}"),
        ));
    }
    Ok(n as usize)
}

/// A `/v1` request's speculative decoding: its `speculative` object and llama-server's
/// flat keys.
macro_rules! speculative {
    ($request:expr) => {
        spec_request(
            $request.speculative,
            FlatKeys {
                n_max: $request.speculative_n_max,
                n_min: $request.speculative_n_min,
                p_min: $request.speculative_p_min,
            },
        )
    };
}

/// A request's [`Knobs`]: the fields every generation request names alike.
macro_rules! knobs {
    ($request:expr) => {
        Knobs {
            temperature: $request.temperature,
            top_p: $request.top_p,
            top_k: $request.top_k,
            min_p: $request.min_p,
            seed: $request.seed,
            presence_penalty: $request.presence_penalty,
            frequency_penalty: $request.frequency_penalty,
            stop: $request.stop,
            logit_bias: $request.logit_bias,
        }
    };
}
pub(in crate::server) use knobs;

/// The generation settings chat, completions and responses share, as the client sent them.
pub(in crate::server) struct Knobs {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub stop: Option<StopSpec>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
}

pub(in crate::server) fn required<T>(value: Option<T>, field: &str) -> Result<T, ApiError> {
    value.ok_or_else(|| ApiError::invalid(field, format!("`{field}` is required")))
}

fn in_range(field: &str, value: Option<f64>, lo: f64, hi: f64, lo_open: bool) -> Result<(), ApiError> {
    let Some(v) = value else { return Ok(()) };
    let lo_ok = if lo_open { v > lo } else { v >= lo };
    if v.is_finite() && lo_ok && v <= hi {
        return Ok(());
    }
    let open = if lo_open { '(' } else { '[' };
    Err(ApiError::invalid(field, format!("`{field}` must be in {open}{lo}, {hi}]")))
}

/// At least 1 when given.
pub(in crate::server) fn positive(field: &str, value: Option<i64>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v >= 1 => Ok(Some(usize::try_from(v).unwrap_or(usize::MAX))),
        Some(_) => Err(ApiError::invalid(field, format!("`{field}` must be at least 1"))),
    }
}

fn only_one(field: &str, value: Option<i64>) -> Result<(), ApiError> {
    match value {
        None | Some(1) => Ok(()),
        Some(_) => Err(ApiError::invalid(field, format!("`{field}` must be 1; several choices are not supported"))),
    }
}

/// OpenAI's `logit_bias`, in id order: token ids (decimal strings) to a bias in
/// [-100, 100]. -100 becomes -inf, a ban whatever the logits, as OpenAI documents it ("a
/// ban"); other values are added as they are. Whether the ids are in the vocabulary is
/// checked once the model is known.
fn logit_bias(map: Option<serde_json::Map<String, Value>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |msg: String| ApiError::invalid("logit_bias", msg);
    let mut bias = Vec::with_capacity(map.as_ref().map_or(0, serde_json::Map::len));
    for (key, value) in map.into_iter().flatten() {
        let id = Some(&key)
            .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|k| k.parse::<u32>().ok())
            .ok_or_else(|| bad(format!("`logit_bias` keys must be token ids (decimal integers), not `{key:.24}`")))?;
        let b = value.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
            bad(format!("`logit_bias` values must be numbers in [-100, 100]; token {id} has {:.24}", value.to_string()))
        })?;
        bias.push((id, if b == -100.0 { f32::NEG_INFINITY } else { b as f32 }));
    }
    bias.sort_by_key(|&(id, _)| id);
    if let Some(w) = bias.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(format!("`logit_bias` names token {} twice", w[0].0)));
    }
    Ok(bias)
}

impl Knobs {
    /// OpenAI's defaults: temperature 1, top_p 1, no top_k, no repeat penalty.
    fn resolve(self) -> Result<(SamplingParams, Vec<String>), ApiError> {
        in_range("temperature", self.temperature, 0.0, 2.0, false)?;
        in_range("top_p", self.top_p, 0.0, 1.0, true)?;
        in_range("min_p", self.min_p, 0.0, 1.0, false)?;
        in_range("presence_penalty", self.presence_penalty, -2.0, 2.0, false)?;
        in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, false)?;
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
            Some(_) => return Err(ApiError::invalid("top_k", "`top_k` must be at least 0 (0: off)")),
        };
        // The ranges are checked in f64, as sent; a top_p too small for f32 stays above 0.
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0) as f32,
            top_k,
            top_p: (self.top_p.unwrap_or(1.0) as f32).max(f32::MIN_POSITIVE),
            min_p: self.min_p.unwrap_or(0.0) as f32,
            repeat_penalty: 1.0,
            presence_penalty: self.presence_penalty.unwrap_or(0.0) as f32,
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0) as f32,
            // OpenAI's seed is any integer; its bits are the seed.
            seed: self.seed.map(|s| s as u64),
            logit_bias: logit_bias(self.logit_bias)?,
            ..SamplingParams::default()
        };
        if let Err(e) = sampling.validate() {
            let field = match &e {
                TextError::InvalidSampling { field, .. } => field,
                _ => "body",
            };
            return Err(ApiError::invalid(field, e.to_string()));
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(StopSpec::One(s)) => vec![s],
            Some(StopSpec::Many(list)) if list.len() <= MAX_STOP => list,
            Some(StopSpec::Many(_)) => {
                return Err(ApiError::invalid("stop", format!("`stop` may hold at most {MAX_STOP} strings")));
            }
        };
        Ok((sampling, stop.into_iter().filter(|s| !s.is_empty()).collect()))
    }
}

pub(in crate::server) fn job(
    model: String,
    prompt: PromptInput,
    max_tokens: Option<usize>,
    knobs: Knobs,
    top_logprobs: usize,
) -> Result<GenerateJob, ApiError> {
    let (sampling, stop) = knobs.resolve()?;
    Ok(GenerateJob {
        model,
        prompt,
        context: Vec::new(),
        max_tokens,
        sampling,
        stop,
        top_logprobs,
        num_ctx: None,
        keep_alive: None,
        tools: None,
        grammar: None,
        grammar_param: "grammar",
        messages_param: "messages",
        count_only: false,
        template_vars: serde_json::Map::new(),
        split_reasoning: false,
        sparse_ffn: None,
        truncate: None,
        speculative: Default::default(),
    })
}

/// A reasoning effort (`reasoning_effort` on chat, `reasoning.effort` on responses) as
/// chat template variables: `none` sets `enable_thinking` false; a level sets it true and
/// `reasoning_effort` to the level (gpt-oss's and Granite's templates read it).
pub(in crate::server) fn effort_vars(
    field: &str,
    effort: Option<&str>,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut vars = serde_json::Map::new();
    match effort {
        None => {}
        Some("none") => {
            vars.insert("enable_thinking".into(), Value::Bool(false));
        }
        Some(level @ ("minimal" | "low" | "medium" | "high" | "xhigh")) => {
            vars.insert("enable_thinking".into(), Value::Bool(true));
            vars.insert("reasoning_effort".into(), Value::String(level.into()));
        }
        Some(other) => {
            return Err(ApiError::invalid(
                field,
                format!("unknown `{field}` `{other}`; expected none, minimal, low, medium, high or xhigh"),
            ));
        }
    }
    Ok(vars)
}

/// A request's `sparse_ffn`, checked.
pub(in crate::server) fn sparse_ffn(value: Option<&str>) -> Result<Option<(SparseFfn, &'static str)>, ApiError> {
    match value.map(SparseFfn::parse) {
        None => Ok(None),
        Some(Ok(s)) => Ok(Some((s, "sparse_ffn"))),
        Some(Err(e)) => Err(ApiError::invalid("sparse_ffn", format!("`sparse_ffn` {e}"))),
    }
}

/// The field a request's grammar came from.
fn grammar_param(from_response_format: bool) -> &'static str {
    if from_response_format { "response_format" } else { "grammar" }
}

/// `response_format` and `grammar` as the output's grammar (at most one of them).
fn output_grammar(format: Option<&ResponseFormat>, lark: Option<String>) -> Result<Option<GrammarSpec>, ApiError> {
    let grammar = match format {
        Some(rf) => response_format(&rf.kind, rf.json_schema.as_ref())?,
        None => None,
    };
    match (grammar, lark) {
        (Some(_), Some(_)) => Err(ApiError::invalid("grammar", "give `grammar` or a JSON `response_format`, not both")),
        (g, None) => Ok(g),
        (None, Some(l)) => Ok(Some(checked("grammar", GrammarSpec::Lark(l))?)),
    }
}

fn chat_messages(messages: Vec<ChatMessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` must hold at least one message"));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                // The legacy `function` role is a tool result; Llama 3's templates also
                // read results under `ipython`.
                "tool" | "function" => "tool",
                "ipython" => "ipython",
                other => {
                    let field = format!("messages[{i}].role");
                    return Err(ApiError::invalid(
                        &field,
                        format!(
                            "`{field}`: unknown role `{other}`; expected system, developer, user, assistant, tool or ipython"
                        ),
                    ));
                }
            };
            let content = match m.content {
                Some(MessageContent::Text(t)) => t,
                Some(MessageContent::Parts(parts)) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for (j, part) in parts.into_iter().enumerate() {
                        let field = format!("messages[{i}].content[{j}]");
                        match (part.kind.as_str(), part.text) {
                            ("text", Some(text)) => texts.push(text),
                            ("text", None) => {
                                return Err(ApiError::invalid(
                                    &field,
                                    format!("`{field}` is a text part without `text`"),
                                ));
                            }
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    &field,
                                    format!(
                                        "`{field}`: `{kind}` content parts are not supported; only `text` parts are"
                                    ),
                                ));
                            }
                        }
                    }
                    texts.join("\n")
                }
                // An assistant turn that only called tools has no content; for other
                // roles, none is the same as "".
                None => String::new(),
            };
            let mut msg = ChatMessage::new(role, content);
            if let Some(calls) = m.tool_calls.filter(|c| !c.is_empty()) {
                if role != "assistant" {
                    let field = format!("messages[{i}].tool_calls");
                    return Err(ApiError::invalid(
                        &field,
                        format!("`{field}`: only assistant messages carry tool calls"),
                    ));
                }
                let calls = history_calls(&format!("messages[{i}].tool_calls"), &calls)?;
                msg = msg.with_field("tool_calls", Value::Array(calls));
            }
            if let Some(id) = m.tool_call_id {
                msg = msg.with_field("tool_call_id", Value::String(id));
            }
            if let Some(name) = m.name {
                msg = msg.with_field("name", Value::String(name));
            }
            if let Some(r) = m.reasoning_content {
                msg = msg.with_field("reasoning_content", Value::String(r));
            }
            Ok(msg)
        })
        .collect()
}

impl ChatCompletionRequest {
    pub fn into_plan(self) -> Result<Plan, ApiError> {
        let model = required(self.model, "model")?;
        let messages = chat_messages(required(self.messages, "messages")?)?;
        let tools = match (&self.tools, &self.functions) {
            (Some(t), Some(f)) if !t.is_empty() && !f.is_empty() => {
                return Err(ApiError::invalid("functions", "give `tools` or the legacy `functions`, not both"));
            }
            (Some(t), _) if !t.is_empty() => {
                let defs = tool_definitions("tools", t)?;
                tool_choice("tool_choice", defs, self.tool_choice.as_ref(), self.parallel_tool_calls)?
            }
            (_, Some(f)) if !f.is_empty() => {
                let defs = tool_definitions("functions", f)?;
                tool_choice("function_call", defs, self.function_call.as_ref(), Some(false))?
            }
            _ => tool_choice("tool_choice", Vec::new(), self.tool_choice.as_ref(), None)?,
        };
        let grammar = output_grammar(self.response_format.as_ref(), self.grammar)?;
        if grammar.is_some() && tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto) {
            return Err(ApiError::invalid(
                "tool_choice",
                "a forced tool call cannot be combined with `response_format` or `grammar`",
            ));
        }
        let logprobs = self.logprobs.unwrap_or(false);
        let top_logprobs = match self.top_logprobs {
            None => 0,
            Some(n) if !(0..=MAX_TOP_LOGPROBS).contains(&n) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("`top_logprobs` must be in [0, {MAX_TOP_LOGPROBS}]"),
                ));
            }
            Some(n) if n > 0 && !logprobs => {
                return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs` set to true"));
            }
            Some(n) => n as usize,
        };
        let max_tokens = match (
            positive("max_tokens", self.max_tokens)?,
            positive("max_completion_tokens", self.max_completion_tokens)?,
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let knobs = knobs!(self);
        let n = choices(self.n, 1)?;
        let mut job = job(model, PromptInput::Chat(messages), max_tokens, knobs, top_logprobs)?;
        job.tools = tools;
        job.grammar_param = grammar_param(self.response_format.is_some());
        job.grammar = grammar;
        job.sparse_ffn = sparse_ffn(self.sparse_ffn.as_deref())?;
        job.speculative = speculative!(self)?;
        // `chat_template_kwargs` win over what `reasoning_effort` sets.
        job.template_vars = effort_vars("reasoning_effort", self.reasoning_effort.as_deref())?;
        job.template_vars.extend(self.chat_template_kwargs.unwrap_or_default());
        // A thinking model's reasoning comes back in `reasoning_content`, as llama.cpp's
        // server and vLLM's reasoning parsers return it.
        job.split_reasoning = true;
        Ok(Plan {
            api: Api::Chat,
            job,
            n,
            more_prompts: Vec::new(),
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            logprobs,
        })
    }
}

impl CompletionRequest {
    pub fn into_plan(self) -> Result<Plan, ApiError> {
        let model = required(self.model, "model")?;
        let empty = || ApiError::invalid("prompt", "`prompt` is empty");
        let text = |text| PromptInput::Text { text, special: true };
        let mut prompts: Vec<PromptInput> = match required(self.prompt, "prompt")? {
            PromptSpec::Text(t) => vec![text(t)],
            PromptSpec::Texts(list) => list.into_iter().map(text).collect(),
            PromptSpec::Tokens(ids) => vec![PromptInput::Tokens(ids)],
            PromptSpec::TokenLists(lists) => lists.into_iter().map(PromptInput::Tokens).collect(),
        };
        if prompts.is_empty() || prompts.iter().any(|p| matches!(p, PromptInput::Tokens(ids) if ids.is_empty())) {
            return Err(empty());
        }
        let n = choices(self.n, prompts.len())?;
        only_one("best_of", self.best_of)?;
        if self.echo == Some(true) {
            return Err(ApiError::invalid("echo", "`echo` is not supported yet"));
        }
        if let Some(suffix) = self.suffix.filter(|s| !s.is_empty()) {
            // Fill in the middle: each prompt is the text before the cursor.
            for prompt in &mut prompts {
                let PromptInput::Text { text: prefix, .. } = std::mem::replace(prompt, PromptInput::Tokens(Vec::new()))
                else {
                    return Err(ApiError::invalid("suffix", "`suffix` needs a text `prompt`, not token ids"));
                };
                let suffix = suffix.clone();
                *prompt = PromptInput::Infill(strata_engine::tokenizer::Infill { prefix, suffix });
            }
        }
        let more_prompts = prompts.split_off(1);
        let prompt = prompts.pop().expect("one prompt at least");
        let top_logprobs = match self.logprobs {
            None => None,
            Some(n) if (0..=MAX_TOP_LOGPROBS).contains(&n) => Some(n as usize),
            Some(_) => {
                return Err(ApiError::invalid("logprobs", format!("`logprobs` must be in [0, {MAX_TOP_LOGPROBS}]")));
            }
        };
        let knobs = knobs!(self);
        let max_tokens = positive("max_tokens", self.max_tokens)?;
        let grammar = output_grammar(self.response_format.as_ref(), self.grammar)?;
        let mut job = job(model, prompt, max_tokens, knobs, top_logprobs.unwrap_or(0))?;
        job.grammar_param = grammar_param(self.response_format.is_some());
        job.grammar = grammar;
        job.sparse_ffn = sparse_ffn(self.sparse_ffn.as_deref())?;
        job.speculative = speculative!(self)?;
        Ok(Plan {
            api: Api::Completion,
            job,
            n,
            more_prompts,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            logprobs: top_logprobs.is_some(),
        })
    }
}

/// A validated embeddings request.
#[derive(Debug)]
pub struct EmbedPlan {
    pub job: EmbedJob,
    pub base64: bool,
    pub dimensions: Option<usize>,
}

impl EmbeddingRequest {
    pub fn into_plan(self) -> Result<EmbedPlan, ApiError> {
        let model = required(self.model, "model")?;
        let inputs: Vec<EmbedInput> = match required(self.input, "input")? {
            EmbeddingInputSpec::Text(t) => vec![EmbedInput::Text(t)],
            EmbeddingInputSpec::Texts(list) => list.into_iter().map(EmbedInput::Text).collect(),
            EmbeddingInputSpec::Tokens(ids) => vec![EmbedInput::Tokens(ids)],
            EmbeddingInputSpec::TokenLists(lists) => lists.into_iter().map(EmbedInput::Tokens).collect(),
        };
        if inputs.is_empty() {
            return Err(ApiError::invalid("input", "`input` is empty"));
        }
        if inputs.len() > MAX_EMBED_INPUTS {
            return Err(ApiError::invalid("input", format!("`input` may hold at most {MAX_EMBED_INPUTS} entries")));
        }
        if let Some(i) = inputs.iter().position(|x| matches!(x, EmbedInput::Tokens(ids) if ids.is_empty())) {
            return Err(ApiError::invalid("input", format!("input {i} is an empty list of token ids")));
        }
        let base64 = match self.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("unknown `encoding_format` `{other}`; expected float or base64"),
                ));
            }
        };
        let dimensions = positive("dimensions", self.dimensions)?;
        Ok(EmbedPlan {
            job: EmbedJob { model, inputs, truncate: false, num_ctx: None, keep_alive: None },
            base64,
            dimensions,
        })
    }
}

#[cfg(test)]
mod tests;
