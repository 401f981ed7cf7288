//! Tool calls in generated text: which format a model writes them in (read from its chat
//! template), and a streaming parser that splits the generated text into content and
//! calls as it arrives.
//!
//! The formats:
//! - [`ToolFormat::Hermes`] (Qwen2.5, Qwen3, Hermes, Granite 4, ...): each call is
//!   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
//! - [`ToolFormat::QwenXml`] (Qwen3-Coder, Qwen3.5, Nemotron 3): `<tool_call><function=NAME>`
//!   then `<parameter=KEY>VALUE</parameter>` per argument, `</function></tool_call>`.
//! - [`ToolFormat::Llama3`]: the reply is one JSON object
//!   `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`.
//! - [`ToolFormat::Mistral`]: `[TOOL_CALLS]` followed by a JSON list of
//!   `{"name", "arguments"}` (Nemo), or by `NAME[ARGS]{...}` per call (Small 3.2, Devstral).
//! - [`ToolFormat::DeepSeek`] (DeepSeek-V3, V3.1, R1): `<｜tool▁calls▁begin｜>`, then per call
//!   `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (R1:
//!   `function<｜tool▁sep｜>NAME` and the arguments in a json code block), then
//!   `<｜tool▁calls▁end｜>`.
//! - [`ToolFormat::Kimi`] (Kimi-K2): `<|tool_calls_section_begin|>`, then per call
//!   `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|>`,
//!   then `<|tool_calls_section_end|>`.
//! - [`ToolFormat::Glm`] (GLM-4.5, 4.6): `<tool_call>NAME` then
//!   `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` per argument, `</tool_call>`.
//! - [`ToolFormat::Harmony`] (gpt-oss): a call is a `commentary` message addressed to it,
//!   `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`,
//!   among the reply's reasoning (`analysis`) and answer (`final`) messages; its own parser
//!   ([`HarmonyParser`]) splits all three.
//! - [`ToolFormat::Generic`]: templates that do not show tools to the model. Strata adds a
//!   system message that lists them and asks for `{"tool_calls": [{"name", "arguments"}]}`
//!   as the whole reply ([`generic_system_prompt`]).
//!
//! Streaming follows OpenAI: a call's first event carries its index, id and name
//! ([`ToolEvent::Begin`]), later ones fragments of its arguments' JSON text
//! ([`ToolEvent::Args`]), then [`ToolEvent::End`] with the whole call. Text that could
//! still become the start of a call is held back until it cannot.

use serde_json::Value;

use super::grammar::{GrammarSpec, close_objects};

pub mod harmony;
mod scan;
mod sections;
pub use harmony::HarmonyParser;
use scan::{Scan, scan};

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    QwenXml,
    Llama3,
    Mistral,
    DeepSeek,
    Kimi,
    Glm,
    Harmony,
    Generic,
}

impl ToolFormat {
    /// The format a chat template's own tool-call rendering shows.
    pub fn detect(template: &str) -> Self {
        if harmony::is_harmony(template) {
            ToolFormat::Harmony
        } else if template.contains("<function=")
            && template.contains("<parameter=")
            && template.contains("<tool_call>")
        {
            ToolFormat::QwenXml
        } else if template.contains("tool▁calls▁begin") {
            ToolFormat::DeepSeek
        } else if template.contains("<|tool_calls_section_begin|>") {
            ToolFormat::Kimi
        } else if template.contains("<tool_call>") && template.contains("<arg_key>") {
            ToolFormat::Glm
        } else if template.contains("<tool_call>") && template.contains("\"arguments\"") {
            ToolFormat::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if template.contains("\"parameters\": dictionary") || template.contains("<|python_tag|>") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::QwenXml => "qwen_xml",
            ToolFormat::Llama3 => "llama3_json",
            ToolFormat::Mistral => "mistral",
            ToolFormat::DeepSeek => "deepseek",
            ToolFormat::Kimi => "kimi_k2",
            ToolFormat::Glm => "glm_xml",
            ToolFormat::Harmony => "harmony",
            ToolFormat::Generic => "generic_json",
        }
    }

    /// The text a call starts with (`None`: the reply itself is the call).
    fn trigger(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Glm => Some("<tool_call>"),
            ToolFormat::Mistral => Some("[TOOL_CALLS]"),
            ToolFormat::DeepSeek => Some("<｜tool▁calls▁begin｜>"),
            ToolFormat::Kimi => Some("<|tool_calls_section_begin|>"),
            // Harmony's calls are read by [`HarmonyParser`], not by this parser.
            ToolFormat::Llama3 | ToolFormat::Harmony | ToolFormat::Generic => None,
        }
    }

    /// Special-token texts this format's calls contain: they must reach the parser, so
    /// the detokenizer keeps them.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>", "</tool_call>"],
            ToolFormat::QwenXml => &["<tool_call>", "</tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            ToolFormat::DeepSeek => &[
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁calls▁end｜>",
                "<｜tool▁call▁begin｜>",
                "<｜tool▁sep｜>",
                "<｜tool▁call▁end｜>",
            ],
            ToolFormat::Kimi => &[
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
            ],
            ToolFormat::Glm => {
                &["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]
            }
            ToolFormat::Harmony => &harmony::MARKERS,
            ToolFormat::Generic => &[],
        }
    }
}

/// The system message that shows a template without tool support the tools, and how to
/// call them ([`ToolFormat::Generic`]).
pub fn generic_system_prompt(tools: &[Value]) -> String {
    let mut s = String::from(
        "You can call the following tools. To call one or more of them, reply with only a JSON object \
         of the form {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]} \
         and nothing else. Otherwise, answer normally.\n\nTools:\n",
    );
    for t in tools {
        let f = t.get("function").unwrap_or(t);
        s.push_str(&serde_json::to_string(f).unwrap_or_default());
        s.push('\n');
    }
    s
}

/// One parsed call. `arguments` is JSON text (an object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What the parser hands on, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    /// Content text (not part of any call).
    Text(String),
    /// A call starts: its index among this reply's calls, id and function name.
    Begin { index: usize, id: String, name: String },
    /// More of call `index`'s arguments JSON text.
    Args { index: usize, fragment: String },
    /// Call `index` is complete.
    End { index: usize, call: ToolCall },
}

/// Where the parser is.
#[derive(Debug)]
enum Mode {
    /// Nothing but whitespace yet (for the formats whose whole reply is the call).
    Start,
    /// Plain text; calls may start at the trigger.
    Text,
    /// Inside a call's text (after the trigger, if the format has one).
    Call,
    /// After text that is not a call, for formats where calls only open the reply.
    TextOnly,
    /// The one call a reply may make has ended: the rest is dropped.
    Closed,
}

/// Splits generated text into content and tool calls as it streams ([`ToolEvent`]).
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    tools: Vec<Value>,
    mode: Mode,
    /// Text not yet handed on: a possible trigger's start, or the current call's text.
    buf: String,
    /// Calls begun so far (the last may be in progress).
    calls: Vec<ToolCall>,
    /// Bytes of the current call's arguments already handed on.
    args_sent: usize,
    /// Whether the current call's `Begin` went out.
    begun: bool,
    /// Calls of the current list (a reply's, or after Mistral's trigger) already ended.
    block_done: usize,
    /// Whether the text ended inside a call ([`ToolCallParser::cut`]).
    cut: bool,
    /// At most one call ([`ToolCallParser::single`]).
    single: bool,
    id_prefix: String,
}

impl ToolCallParser {
    /// `tools` are the request's tool definitions (their parameter schemas type the
    /// values of [`ToolFormat::QwenXml`]); `id_seed` makes call ids unique per request.
    pub fn new(format: ToolFormat, tools: &[Value], id_seed: u64) -> Self {
        let id_prefix = match format {
            // Mistral's templates want ids of exactly nine letters and digits.
            ToolFormat::Mistral => base36(id_seed, 6),
            _ => format!("call_{}", base36(id_seed, 12)),
        };
        let mode = match format {
            ToolFormat::Llama3 | ToolFormat::Generic => Mode::Start,
            _ => Mode::Text,
        };
        Self {
            format,
            tools: tools.to_vec(),
            mode,
            buf: String::new(),
            calls: Vec::new(),
            args_sent: 0,
            begun: false,
            block_done: 0,
            cut: false,
            single: false,
            id_prefix,
        }
    }

    /// A parser for a reply that may make one call (`parallel_tool_calls: false`): once
    /// it ends, whatever follows is dropped, calls and text alike ([`ToolCallParser::closed`]).
    pub fn single(mut self) -> Self {
        self.single = true;
        self
    }

    /// Whether the reply's one call has ended, so that nothing it generates from here on
    /// can reach the client: its generation may stop.
    pub fn closed(&self) -> bool {
        matches!(self.mode, Mode::Closed)
    }

    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// Whether the text ended inside a call ([`ToolCallParser::finish`] settles it): the
    /// token limit cut one. The calls completed before it stand.
    pub fn cut(&self) -> bool {
        self.cut
    }

    /// The calls completed so far.
    pub fn calls(&self) -> &[ToolCall] {
        let done = if self.begun { self.calls.len().saturating_sub(1) } else { self.calls.len() };
        &self.calls[..done]
    }

    fn next_id(&self) -> String {
        let n = self.calls.len();
        match self.format {
            ToolFormat::Mistral => format!("{}{:03}", self.id_prefix, n % 1000),
            _ => format!("{}_{n}", self.id_prefix),
        }
    }

    /// Takes the next piece of generated text.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.advance(false, &mut out);
        out
    }

    /// The generation ended: whatever is held back is settled. A call cut off before its
    /// end is kept when its JSON is complete (a list's or the wrapper's closing brackets
    /// may be missing) and dropped otherwise ([`ToolCallParser::cut`]); text that never
    /// became a call is content.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.advance(true, &mut out);
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            out.push(ToolEvent::Text(rest));
        }
        out
    }

    fn advance(&mut self, eof: bool, out: &mut Vec<ToolEvent>) {
        loop {
            match self.mode {
                Mode::Closed => {
                    self.buf.clear();
                    return;
                }
                Mode::TextOnly => {
                    if !self.buf.is_empty() {
                        out.push(ToolEvent::Text(std::mem::take(&mut self.buf)));
                    }
                    return;
                }
                Mode::Start => {
                    let trimmed = self.buf.trim_start();
                    if trimmed.is_empty() {
                        if eof {
                            self.mode = Mode::TextOnly;
                            continue;
                        }
                        return;
                    }
                    let rest = trimmed.strip_prefix("<|python_tag|>").unwrap_or(trimmed);
                    if rest.is_empty() && !eof {
                        return;
                    }
                    if rest.starts_with('{') || rest.starts_with('[') {
                        self.buf = rest.to_string();
                        self.mode = Mode::Call;
                    } else if !eof && "<|python_tag|>".starts_with(trimmed) {
                        return;
                    } else {
                        self.mode = Mode::TextOnly;
                    }
                }
                Mode::Text => {
                    let trigger = self.format.trigger().unwrap_or("\u{0}");
                    if let Some(at) = self.buf.find(trigger) {
                        if at > 0 {
                            out.push(ToolEvent::Text(self.buf[..at].to_string()));
                        }
                        self.buf.drain(..at + trigger.len());
                        self.mode = Mode::Call;
                        continue;
                    }
                    // Hold back a suffix that may be the trigger's start.
                    let keep = if eof { 0 } else { partial_suffix(&self.buf, trigger) };
                    let cut = self.buf.len() - keep;
                    if cut > 0 {
                        out.push(ToolEvent::Text(self.buf[..cut].to_string()));
                        self.buf.drain(..cut);
                    }
                    return;
                }
                Mode::Call => match scan(self.format, &self.buf, &self.tools, eof) {
                    Scan::Partial(p) => {
                        let call = p.call || !p.done.is_empty() || self.begun || self.block_done > 0;
                        for (name, args) in p.done.into_iter().skip(self.block_done) {
                            self.end_call(name, args, out);
                            self.block_done += 1;
                        }
                        if self.closed() {
                            continue;
                        }
                        if let Some(name) = p.name {
                            self.begin(name, out);
                            let args = p.args;
                            if args.len() > self.args_sent && args.is_char_boundary(self.args_sent) {
                                let index = self.calls.len() - 1;
                                out.push(ToolEvent::Args { index, fragment: args[self.args_sent..].to_string() });
                                self.calls[index].arguments.push_str(&args[self.args_sent..]);
                                self.args_sent = args.len();
                            }
                        }
                        if !eof {
                            return;
                        }
                        self.mode = Mode::TextOnly;
                        if call {
                            // Cut off inside calls: those complete stand, the one in
                            // progress (streamed as far as it got) is dropped.
                            self.cut = p.pending;
                            self.drop_begun();
                            self.buf.clear();
                        }
                    }
                    Scan::Done { calls, used } => {
                        for (name, args) in calls.into_iter().skip(self.block_done) {
                            self.end_call(name, args, out);
                        }
                        self.block_done = 0;
                        self.buf.drain(..used.min(self.buf.len()));
                        self.mode = match self.format {
                            _ if self.closed() => Mode::Closed,
                            ToolFormat::Llama3 | ToolFormat::Generic => Mode::TextOnly,
                            _ => Mode::Text,
                        };
                    }
                    Scan::Invalid => {
                        // Not a call after all: it is content, and so is the rest.
                        let text = match self.format.trigger() {
                            Some(t) if !self.begun => format!("{t}{}", self.buf),
                            _ => std::mem::take(&mut self.buf),
                        };
                        self.buf.clear();
                        self.drop_begun();
                        out.push(ToolEvent::Text(text));
                        self.mode = Mode::TextOnly;
                    }
                },
            }
        }
    }

    /// Ends the call in progress (or begins and ends one) with its whole arguments. A
    /// single-call parser closes at its first.
    fn end_call(&mut self, name: String, args: String, out: &mut Vec<ToolEvent>) {
        if self.closed() {
            return;
        }
        self.begin(name, out);
        let index = self.calls.len() - 1;
        let sent = &self.calls[index].arguments;
        let fragment = match args.strip_prefix(sent.as_str()) {
            Some(rest) => rest.to_string(),
            // What was streamed is not a prefix of the final text (never for
            // well-formed JSON): send the rest anyway.
            None => args[sent.len().min(args.len())..].to_string(),
        };
        if !fragment.is_empty() {
            out.push(ToolEvent::Args { index, fragment });
        }
        self.calls[index].arguments = args;
        out.push(ToolEvent::End { index, call: self.calls[index].clone() });
        self.begun = false;
        self.args_sent = 0;
        if self.single {
            self.mode = Mode::Closed;
        }
    }

    /// Forgets the call in progress: it never ended.
    fn drop_begun(&mut self) {
        if self.begun {
            self.calls.pop();
            self.begun = false;
            self.args_sent = 0;
        }
    }

    fn begin(&mut self, name: String, out: &mut Vec<ToolEvent>) {
        if self.begun {
            return;
        }
        let id = self.next_id();
        let index = self.calls.len();
        out.push(ToolEvent::Begin { index, id: id.clone(), name: name.clone() });
        self.calls.push(ToolCall { id, name, arguments: String::new() });
        self.begun = true;
        self.args_sent = 0;
    }
}

/// Lower-case base-36 digits of `n`, `len` of them.
pub(crate) fn base36(mut n: u64, len: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = Vec::with_capacity(len);
    for _ in 0..len {
        s.push(DIGITS[(n % 36) as usize]);
        n /= 36;
    }
    String::from_utf8(s).unwrap_or_default()
}

/// The length of the longest suffix of `text` that is a proper prefix of `pat`.
pub(crate) fn partial_suffix(text: &str, pat: &str) -> usize {
    (1..pat.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && pat.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// llguidance's JSON options for tool calls: `{"name": "f", "arguments": {"k": 1}}`,
/// separators as models are trained to write them, no other whitespace.
fn compact_json() -> Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "whitespace_pattern": null})
}

/// What a forced call's grammar needs of the model beyond its format: which of the
/// format's markers its vocabulary holds as single tokens (a grammar names those by id,
/// `<[5]>`, since special tokens are not text), and the shape its template writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallMarkers {
    /// The markers the template uses that are tokens of the vocabulary, with their ids.
    ids: Vec<(&'static str, u32)>,
    /// DeepSeek: the template writes R1's `function<｜tool▁sep｜>NAME` and the arguments
    /// in a json code block, not V3.1's `NAME<｜tool▁sep｜>{...}`.
    fenced: bool,
}

impl CallMarkers {
    /// The markers of `format` that `template` writes, looked up with `id_of`.
    pub fn of(format: ToolFormat, template: &str, id_of: impl Fn(&str) -> Option<u32>) -> Self {
        let ids = format.markers().iter().filter(|m| template.contains(**m)).filter_map(|&m| Some((m, id_of(m)?)));
        CallMarkers { ids: ids.collect(), fenced: format == ToolFormat::DeepSeek && template.contains("```json") }
    }

    fn id(&self, marker: &str) -> Option<u32> {
        self.ids.iter().find(|(m, _)| *m == marker).map(|&(_, id)| id)
    }

    /// `marker` in a Lark grammar: its token, or its text where the vocabulary has no
    /// such token.
    fn lark(&self, marker: &str) -> String {
        match self.id(marker) {
            Some(id) => format!("<[{id}]>"),
            None => lark_str(marker),
        }
    }
}

/// `text` as a Lark string literal.
fn lark_str(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// The grammar that makes a reply call one of `functions` (function definitions:
/// `{"name", "description", "parameters"}`) in `format`: one call, or with `parallel`
/// one or more, in the shape `markers` describes.
pub fn call_grammar(
    format: ToolFormat,
    functions: &[&Value],
    parallel: bool,
    markers: &CallMarkers,
) -> Result<GrammarSpec, String> {
    if functions.is_empty() {
        return Err("`tool_choice` asks for a tool call, but `tools` holds no functions".into());
    }
    // Arguments hold only the declared parameters unless the schema says otherwise
    // ([`close_objects`]); the schemas inside Lark grammars are closed here.
    let params = |f: &Value| {
        close_objects(f.get("parameters").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})))
    };
    let name = |f: &Value| f.get("name").and_then(|n| n.as_str()).unwrap_or_default().to_string();
    let call_schema = |args_key: &str| -> Value {
        let each: Vec<Value> = functions
            .iter()
            .map(|f| {
                serde_json::json!({
                    "type": "object",
                    "properties": {"name": {"const": name(f)}, args_key: params(f)},
                    "required": ["name", args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut schema = if each.len() == 1 { each[0].clone() } else { serde_json::json!({"anyOf": each}) };
        // Calls are written compactly (`{"name": "f", "arguments": {...}}`), as models
        // are trained to write them, with no room to wander in whitespace.
        schema["x-guidance"] = compact_json();
        schema
    };
    let most = if parallel { Value::Null } else { serde_json::json!(1) };
    match format {
        ToolFormat::Generic => {
            let mut list = serde_json::json!({"type": "array", "items": call_schema("arguments"), "minItems": 1});
            if !most.is_null() {
                list["maxItems"] = most;
            }
            Ok(GrammarSpec::JsonSchema(serde_json::json!({
                "type": "object",
                "properties": {"tool_calls": list},
                "required": ["tool_calls"],
                "additionalProperties": false,
                "x-guidance": compact_json(),
            })))
        }
        ToolFormat::Llama3 => Ok(GrammarSpec::JsonSchema(call_schema("parameters"))),
        ToolFormat::DeepSeek | ToolFormat::Kimi | ToolFormat::Glm => {
            Ok(GrammarSpec::Lark(marked_grammar(format, functions, parallel, markers, params)))
        }
        // One call: `<|call|>` ends the generation.
        ToolFormat::Harmony => Ok(GrammarSpec::Lark(harmony::call_grammar(functions, markers, params))),
        ToolFormat::Hermes => {
            let schema = serde_json::to_string(&call_schema("arguments")).map_err(|e| e.to_string())?;
            let repeat = if parallel { "(\"\\n\" call)*" } else { "" };
            Ok(GrammarSpec::Lark(format!(
                "start: call {repeat}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {schema}\n"
            )))
        }
        ToolFormat::QwenXml => {
            let mut rules = String::new();
            let mut alts = Vec::new();
            for (i, f) in functions.iter().enumerate() {
                let props = params(f).get("properties").and_then(|p| p.as_object()).cloned().unwrap_or_default();
                let mut params_alt: Vec<String> = props
                    .keys()
                    .map(|k| {
                        let lit = serde_json::to_string(&format!("<parameter={k}>")).unwrap_or_default();
                        format!("{lit} VALUE \"</parameter>\\n\"")
                    })
                    .collect();
                if params_alt.is_empty() {
                    params_alt.push("\"\"".into());
                }
                let head = serde_json::to_string(&format!("<function={}>\n", name(f))).unwrap_or_default();
                rules.push_str(&format!("f{i}: {head} (p{i})* \"</function>\"\np{i}: {}\n", params_alt.join(" | ")));
                alts.push(format!("f{i}"));
            }
            let repeat = if parallel { "(\"\\n\" call)*" } else { "" };
            Ok(GrammarSpec::Lark(format!(
                "start: call {repeat}\ncall: \"<tool_call>\\n\" func \"\\n</tool_call>\"\nfunc: {}\n{rules}VALUE: /\\n[^<]*\\n/\n",
                alts.join(" | ")
            )))
        }
        ToolFormat::Mistral => {
            let Some(tc) = markers.id("[TOOL_CALLS]") else {
                return Err(
                    "`tool_choice` asks for a tool call, but this model's vocabulary has no [TOOL_CALLS] token".into(),
                );
            };
            let calls = if parallel { "call+" } else { "call" };
            match markers.id("[ARGS]") {
                // `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}` per call.
                Some(args) => {
                    let id = match markers.id("[CALL_ID]") {
                        Some(cid) => format!(" <[{cid}]> /[a-zA-Z0-9]{{9}}/"),
                        None => String::new(),
                    };
                    let mut rules = String::new();
                    let mut alts = Vec::new();
                    for (i, f) in functions.iter().enumerate() {
                        let lit = serde_json::to_string(&name(f)).map_err(|e| e.to_string())?;
                        let mut schema = params(f);
                        schema["x-guidance"] = compact_json();
                        let schema = serde_json::to_string(&schema).map_err(|e| e.to_string())?;
                        rules.push_str(&format!("f{i}: {lit}{id} <[{args}]> a{i}\na{i}: %json {schema}\n"));
                        alts.push(format!("f{i}"));
                    }
                    Ok(GrammarSpec::Lark(format!(
                        "start: {calls}\ncall: <[{tc}]> func\nfunc: {}\n{rules}",
                        alts.join(" | ")
                    )))
                }
                // `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
                None => {
                    let mut list =
                        serde_json::json!({"type": "array", "items": call_schema("arguments"), "minItems": 1});
                    if !most.is_null() {
                        list["maxItems"] = most;
                    }
                    list["x-guidance"] = compact_json();
                    let schema = serde_json::to_string(&list).map_err(|e| e.to_string())?;
                    Ok(GrammarSpec::Lark(format!("start: <[{tc}]> calls\ncalls: %json {schema}\n")))
                }
            }
        }
    }
}

/// The forced-call grammar of the formats whose calls sit between markers: DeepSeek's and
/// Kimi-K2's sections of calls with JSON arguments, GLM's `<tool_call>` with one
/// `<arg_key>`/`<arg_value>` pair per argument (the required ones always, all in the
/// schema's order; a string as it is, anything else as JSON, as its template writes them).
fn marked_grammar(
    format: ToolFormat,
    functions: &[&Value],
    parallel: bool,
    m: &CallMarkers,
    params: impl Fn(&Value) -> Value,
) -> String {
    let name = |f: &Value| f.get("name").and_then(|n| n.as_str()).unwrap_or_default().to_string();
    let json = |schema: &Value| {
        let mut schema = schema.clone();
        schema["x-guidance"] = compact_json();
        format!("%json {}", serde_json::to_string(&schema).unwrap_or_default())
    };
    let mut rules = String::new();
    let mut alts = Vec::new();
    for (i, f) in functions.iter().enumerate() {
        let (n, schema) = (name(f), params(f));
        let head = match format {
            ToolFormat::DeepSeek if m.fenced => {
                format!(
                    "\"function\" {} {} a{i} \"\\n```\"",
                    m.lark("<｜tool▁sep｜>"),
                    lark_str(&format!("{n}\n```json\n"))
                )
            }
            ToolFormat::DeepSeek => format!("{} {} a{i}", lark_str(&n), m.lark("<｜tool▁sep｜>")),
            ToolFormat::Kimi => format!(
                "{} /[0-9]+/ {} a{i}",
                lark_str(&format!("functions.{n}:")),
                m.lark("<|tool_call_argument_begin|>")
            ),
            _ => {
                let props = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
                let required = |k: &str| {
                    schema.get("required").and_then(Value::as_array).is_some_and(|r| r.iter().any(|x| x == k))
                };
                let mut seq = vec![lark_str(&n)];
                for (j, (k, prop)) in props.iter().enumerate() {
                    let value = match prop.get("type").and_then(Value::as_str) {
                        Some("string") => glm_string(prop),
                        _ => json(prop),
                    };
                    rules.push_str(&format!(
                        "v{i}_{j}: \"\\n\" {} {} {} \"\\n\" {} {value} {}\n",
                        m.lark("<arg_key>"),
                        lark_str(k),
                        m.lark("</arg_key>"),
                        m.lark("<arg_value>"),
                        m.lark("</arg_value>"),
                    ));
                    seq.push(if required(k) { format!("v{i}_{j}") } else { format!("v{i}_{j}?") });
                }
                alts.push(format!("f{i}"));
                rules.push_str(&format!("f{i}: {}\n", seq.join(" ")));
                continue;
            }
        };
        rules.push_str(&format!("f{i}: {head}\na{i}: {}\n", json(&schema)));
        alts.push(format!("f{i}"));
    }
    let (open, call_open, call_close, close, between) = match format {
        ToolFormat::DeepSeek => (
            m.lark("<｜tool▁calls▁begin｜>"),
            m.lark("<｜tool▁call▁begin｜>"),
            m.lark("<｜tool▁call▁end｜>"),
            m.lark("<｜tool▁calls▁end｜>"),
            String::new(),
        ),
        ToolFormat::Kimi => (
            m.lark("<|tool_calls_section_begin|>"),
            m.lark("<|tool_call_begin|>"),
            m.lark("<|tool_call_end|>"),
            m.lark("<|tool_calls_section_end|>"),
            String::new(),
        ),
        _ => (
            String::new(),
            m.lark("<tool_call>"),
            format!("\"\\n\" {}", m.lark("</tool_call>")),
            String::new(),
            "\"\\n\"".into(),
        ),
    };
    let repeat = if parallel { format!("({between} call)*") } else { String::new() };
    format!(
        "start: {open} call {repeat} {close}\ncall: {call_open} func {call_close}\nfunc: {}\n{rules}",
        alts.join(" | ")
    )
}

/// A GLM string argument, written as it is between `<arg_value>` and `</arg_value>`: one of
/// its `enum` (or its `const`), else any text without a `<` of the length its schema allows
/// (`pattern` and `format` are not enforced in this format).
fn glm_string(schema: &Value) -> String {
    let listed = match (schema.get("enum").and_then(Value::as_array), schema.get("const")) {
        (_, Some(c)) => Some(vec![c.clone()]),
        (Some(e), None) => Some(e.clone()),
        (None, None) => None,
    };
    if let Some(values) = listed {
        let alts: Vec<String> = values.iter().filter_map(Value::as_str).map(lark_str).collect();
        if !alts.is_empty() {
            return format!("({})", alts.join(" | "));
        }
    }
    let bound = |k: &str| schema.get(k).and_then(Value::as_u64);
    match (bound("minLength"), bound("maxLength")) {
        (None, None) => "/[^<]*/".into(),
        (min, max) => format!("/[^<]{{{},{}}}/", min.unwrap_or(0), max.map(|m| m.to_string()).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests;
