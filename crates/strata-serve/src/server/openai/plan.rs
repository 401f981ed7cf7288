//! Request bodies → validated [`Plan`]s: every range and unsupported feature is checked
//! here, and every error names its field.

use serde_json::Value;
use strata_model::sparse::SparseFfn;

use super::types::*;
use crate::queue::{EmbedInput, EmbedJob, GenerateJob, PromptInput, ToolChoice};
use crate::server::error::ApiError;
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
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(extra: Value) -> Result<Plan, ApiError> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value::<ChatCompletionRequest>(body).unwrap().into_plan()
    }

    fn completion(extra: Value) -> Result<Plan, ApiError> {
        let mut body = json!({"model": "m", "prompt": "hi"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value::<CompletionRequest>(body).unwrap().into_plan()
    }

    fn param(r: Result<Plan, ApiError>) -> String {
        r.expect_err("an error").param.unwrap_or_default()
    }

    #[test]
    fn chat_uses_openai_defaults() {
        let plan = chat(json!({})).unwrap();
        assert_eq!(plan.api, Api::Chat);
        assert!(!plan.stream && !plan.include_usage && !plan.logprobs);
        let s = &plan.job.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty), (1.0, 1.0, 0, 0.0, 1.0));
        assert_eq!((s.presence_penalty, s.frequency_penalty, s.seed), (0.0, 0.0, None));
        assert_eq!(plan.job.max_tokens, None, "until the context is full");
        assert!(plan.job.stop.is_empty());
        assert_eq!(plan.job.top_logprobs, 0);
    }

    #[test]
    fn reasoning_effort_becomes_template_variables() {
        let vars = |extra: Value| Value::Object(chat(extra).unwrap().job.template_vars);
        assert_eq!(vars(json!({})), json!({}));
        assert_eq!(
            vars(json!({"reasoning_effort": "low"})),
            json!({"enable_thinking": true, "reasoning_effort": "low"})
        );
        assert_eq!(vars(json!({"reasoning_effort": "none"})), json!({"enable_thinking": false}));
        assert_eq!(
            vars(json!({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": false}})),
            json!({"enable_thinking": false, "reasoning_effort": "high"})
        );
        assert_eq!(param(chat(json!({"reasoning_effort": "max"}))), "reasoning_effort");
    }

    #[test]
    fn chat_maps_fields() {
        let plan = chat(json!({
            "messages": [
                {"role": "developer", "content": "rules"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null},
                {"role": "user"},
            ],
            "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.1, "seed": -1,
            "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "max_tokens": 50, "max_completion_tokens": 20, "stop": ["x", ""],
            "logprobs": true, "top_logprobs": 4, "stream": true, "stream_options": {"include_usage": true},
            "n": 1, "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "user": "u",
        }))
        .unwrap();
        let PromptInput::Chat(messages) = &plan.job.prompt else { panic!("{:?}", plan.job.prompt) };
        assert_eq!(
            messages,
            &[
                ChatMessage::new("system", "rules"),
                ChatMessage::new("user", "a\nb"),
                ChatMessage::new("assistant", ""),
                ChatMessage::new("user", "")
            ]
        );
        let s = &plan.job.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p), (0.5, 0.9, 7, 0.1));
        assert_eq!((s.presence_penalty, s.frequency_penalty, s.seed), (0.5, -0.5, Some(u64::MAX)));
        assert_eq!(plan.job.max_tokens, Some(20), "the smaller of the two");
        assert_eq!(plan.job.stop, ["x"], "empty stop strings are dropped");
        assert_eq!(plan.job.top_logprobs, 4);
        assert!(plan.stream && plan.include_usage && plan.logprobs);
        assert_eq!(chat(json!({"stop": "end"})).unwrap().job.stop, ["end"]);
        assert_eq!(chat(json!({"max_completion_tokens": 3})).unwrap().job.max_tokens, Some(3));
    }

    #[test]
    fn tools_and_formats_become_the_job() {
        let tool = json!({"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}});
        let plan = chat(json!({
            "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get"}}, "parallel_tool_calls": false,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        }))
        .unwrap();
        let tools = plan.job.tools.as_ref().unwrap();
        assert_eq!((tools.choice.clone(), tools.parallel), (ToolChoice::Function("get".into()), false));
        let PromptInput::Chat(messages) = &plan.job.prompt else { panic!() };
        assert_eq!(
            messages[1].fields["tool_calls"][0]["function"]["arguments"],
            json!({"a": 1}),
            "arguments as an object"
        );
        assert_eq!((messages[2].role.as_str(), &messages[2].fields["tool_call_id"]), ("tool", &json!("c1")));
        // `tool_choice: none` offers no tools.
        assert!(chat(json!({"tools": [tool], "tool_choice": "none"})).unwrap().job.tools.is_none());
        // The legacy `functions`.
        let legacy = chat(json!({"functions": [{"name": "get"}]})).unwrap().job.tools.unwrap();
        assert_eq!(legacy.tools[0]["function"]["name"], "get");
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let plan =
            chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}));
        assert_eq!(plan.unwrap().job.grammar, Some(GrammarSpec::JsonSchema(schema)));
        let plan = chat(json!({"response_format": {"type": "json_object"}})).unwrap();
        assert_eq!(plan.job.grammar, Some(GrammarSpec::JsonObject));
        let plan = chat(json!({"grammar": "start: \"yes\" | \"no\""})).unwrap();
        assert!(matches!(plan.job.grammar, Some(GrammarSpec::Lark(_))));
        let plan = chat(json!({"chat_template_kwargs": {"enable_thinking": false}})).unwrap();
        assert_eq!(plan.job.template_vars["enable_thinking"], json!(false));
    }

    #[test]
    fn chat_errors_name_the_field() {
        let cases = [
            (json!({"n": 0}), "n"),
            (json!({"n": 17}), "n"),
            (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
            (json!({"tools": [{"type": "function", "function": {"name": ""}}]}), "tools[0].function.name"),
            (json!({"tools": [{"type": "code_interpreter"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
                "tools[0].function.parameters",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}), "tool_choice"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"}),
                "tool_choice",
            ),
            (
                json!({"functions": [{"name": "f"}], "tools": [{"type": "function", "function": {"name": "f"}}]}),
                "functions",
            ),
            (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}),
                "response_format.json_schema.schema",
            ),
            (json!({"response_format": {"type": "yaml"}}), "response_format"),
            (json!({"grammar": "start: ("}), "grammar"),
            (json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}), "grammar"),
            (
                json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}]}),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!({"messages": [{"role": "user", "content": "a", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
                "messages[0].tool_calls",
            ),
            (json!({"temperature": -0.1}), "temperature"),
            (json!({"temperature": 2.01}), "temperature"),
            (json!({"top_p": 0.0}), "top_p"),
            (json!({"top_p": 1.5}), "top_p"),
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"top_k": -1}), "top_k"),
            (json!({"presence_penalty": 2.5}), "presence_penalty"),
            (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_completion_tokens": -5}), "max_completion_tokens"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"role": "robot", "content": "1"}]}), "messages[0].role"),
            (json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}), "messages[0].content[0]"),
            (json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}), "messages[0].content[0]"),
        ];
        for (extra, field) in cases {
            assert_eq!(param(chat(extra.clone())), field, "{extra}");
        }
        let e = chat(json!({"top_p": 1.5})).unwrap_err();
        assert_eq!(e.message, "`top_p` must be in (0, 1]");
        let e = chat(json!({"temperature": 3})).unwrap_err();
        assert_eq!(e.message, "`temperature` must be in [0, 2]");
        // Logprobs without alternatives, and top_logprobs 0 alone, are fine.
        assert!(chat(json!({"logprobs": true})).unwrap().logprobs);
        assert!(chat(json!({"top_logprobs": 0})).is_ok());
        let missing = serde_json::from_value::<ChatCompletionRequest>(json!({"model": "m"})).unwrap().into_plan();
        assert_eq!(param(missing), "messages");
        let missing = serde_json::from_value::<ChatCompletionRequest>(json!({"messages": []})).unwrap().into_plan();
        assert_eq!(param(missing), "model");
    }

    #[test]
    fn logit_bias_is_checked_and_sorted() {
        let bias = |b: Value| chat(json!({"logit_bias": b})).map(|p| p.job.sampling.logit_bias);
        assert_eq!(
            bias(json!({"30": 2.5, "7": -100, "12": 100, "0": 0})).unwrap(),
            [(0, 0.0), (7, f32::NEG_INFINITY), (12, 100.0), (30, 2.5)]
        );
        assert_eq!(bias(json!({"29": -99.5})).unwrap(), [(29, -99.5)], "only -100 is a ban");
        assert!(bias(Value::Null).unwrap().is_empty());
        let plan = completion(json!({"logit_bias": {"5": 1}})).unwrap();
        assert_eq!(plan.job.sampling.logit_bias, [(5, 1.0)]);
        for bad in [
            json!({"a": 1}),
            json!({"-1": 1}),
            json!({"+1": 1}),
            json!({" 1": 1}),
            json!({"": 1}),
            json!({"4294967296": 1}),
            json!({"1": 100.01}),
            json!({"1": "1"}),
            json!({"1": null}),
            json!({"1": [1]}),
            json!({"01": 1, "1": 2}),
        ] {
            let e = bias(bad.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("logit_bias"), "{bad}");
            assert!(e.message.contains("`logit_bias`"), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn completion_prompts() {
        let prompt = |p: Value| completion(json!({"prompt": p})).map(|plan| plan.job.prompt);
        let text = |t: &str| PromptInput::Text { text: t.into(), special: true };
        assert!(matches!(prompt(json!("hi")).unwrap(), p if format!("{p:?}") == format!("{:?}", text("hi"))));
        assert!(matches!(prompt(json!(["hi"])).unwrap(), p if format!("{p:?}") == format!("{:?}", text("hi"))));
        assert!(matches!(prompt(json!([1, 2, 3])).unwrap(), PromptInput::Tokens(ids) if ids == [1, 2, 3]));
        assert!(matches!(prompt(json!([[4, 5]])).unwrap(), PromptInput::Tokens(ids) if ids == [4, 5]));
        for bad in [json!([]), json!([[]]), json!([[1], []])] {
            assert_eq!(param(prompt(bad.clone()).map(|_| unreachable!())), "prompt", "{bad}");
        }
        // Several prompts and several choices: each prompt's `n` choices in turn, choice
        // `j` with the seed plus `j`.
        let plan = completion(json!({"prompt": ["a", "b"], "n": 2, "seed": 7})).unwrap();
        let jobs: Vec<_> = plan.jobs().into_iter().map(|j| (format!("{:?}", j.prompt), j.sampling.seed)).collect();
        let (a, b) = (format!("{:?}", text("a")), format!("{:?}", text("b")));
        assert_eq!(jobs, [(a.clone(), Some(7)), (a, Some(8)), (b.clone(), Some(7)), (b, Some(8))]);
        let plan = completion(json!({"prompt": [[1], [2, 3]]})).unwrap();
        assert_eq!(plan.jobs().len(), 2);
        assert_eq!(plan.jobs()[0].sampling.seed, None);
        let plan = completion(json!({"prompt": ["a", "b"], "suffix": "z"})).unwrap();
        assert!(plan.jobs().iter().all(|j| matches!(&j.prompt, PromptInput::Infill(i) if i.suffix == "z")));
        // At most `MAX_CHOICES` in all.
        assert!(completion(json!({"n": MAX_CHOICES})).is_ok());
        for bad in [json!({"n": 0}), json!({"n": MAX_CHOICES + 1}), json!({"prompt": ["a", "b"], "n": 9})] {
            assert_eq!(param(completion(bad.clone())), "n", "{bad}");
        }
    }

    #[test]
    fn completion_fields() {
        let plan = completion(json!({"logprobs": 3, "max_tokens": 16, "stream": true})).unwrap();
        assert_eq!(plan.api, Api::Completion);
        assert!(plan.logprobs && plan.stream);
        assert_eq!((plan.job.top_logprobs, plan.job.max_tokens), (3, Some(16)));
        let plan = completion(json!({"logprobs": 0})).unwrap();
        assert!(plan.logprobs, "0 alternatives still reports the sampled tokens");
        assert!(!completion(json!({})).unwrap().logprobs);
        for (extra, field) in [
            (json!({"logprobs": 21}), "logprobs"),
            (json!({"echo": true}), "echo"),
            (json!({"suffix": "end", "prompt": [1, 2]}), "suffix"),
            (json!({"best_of": 2}), "best_of"),
            (json!({"n": -1}), "n"),
            (json!({"max_tokens": 0}), "max_tokens"),
        ] {
            assert_eq!(param(completion(extra.clone())), field, "{extra}");
        }
        assert!(completion(json!({"echo": false, "suffix": "", "best_of": 1})).is_ok());
        let plan = completion(json!({"prompt": "def f(", "suffix": "return x"})).unwrap();
        let want = strata_engine::tokenizer::Infill { prefix: "def f(".into(), suffix: "return x".into() };
        assert!(matches!(plan.job.prompt, PromptInput::Infill(ref i) if *i == want), "{:?}", plan.job.prompt);
    }

    #[test]
    fn embedding_inputs() {
        let plan = |v: Value| serde_json::from_value::<EmbeddingRequest>(v).unwrap().into_plan();
        let p = plan(json!({"model": "m", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8})).unwrap();
        assert_eq!(p.job.inputs.len(), 2);
        assert!(p.base64);
        assert_eq!(p.dimensions, Some(8));
        assert!(!p.job.truncate);
        let p = plan(json!({"model": "m", "input": [[1, 2], [3]]})).unwrap();
        assert!(
            matches!(&p.job.inputs[..], [EmbedInput::Tokens(a), EmbedInput::Tokens(b)] if a == &[1, 2] && b == &[3])
        );
        assert!(!p.base64);
        let err = |v: Value| plan(v).unwrap_err().param.unwrap_or_default();
        assert_eq!(err(json!({"model": "m", "input": []})), "input");
        assert_eq!(err(json!({"model": "m", "input": [[]]})), "input");
        assert_eq!(err(json!({"model": "m"})), "input");
        assert_eq!(err(json!({"model": "m", "input": "a", "encoding_format": "int8"})), "encoding_format");
        assert_eq!(err(json!({"model": "m", "input": "a", "dimensions": 0})), "dimensions");
    }

    #[test]
    fn shapes_that_do_not_fit_name_the_field() {
        let e = crate::server::parse_json::<ChatCompletionRequest>(br#"{"model": "m", "stop": 5}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        assert!(e.message.contains("up to 4 strings"), "{}", e.message);
        let body = br#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#;
        let e = crate::server::parse_json::<ChatCompletionRequest>(body).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        let e = crate::server::parse_json::<CompletionRequest>(br#"{"model": "m", "prompt": [-1]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e =
            crate::server::parse_json::<ChatCompletionRequest>(br#"{"model": "m", "temperature": "x"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
    }
}
