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
//! - [`ToolFormat::Generic`]: templates that do not show tools to the model. Strata adds a
//!   system message that lists them and asks for `{"tool_calls": [{"name", "arguments"}]}`
//!   as the whole reply ([`generic_system_prompt`]).
//!
//! Streaming follows OpenAI: a call's first event carries its index, id and name
//! ([`ToolEvent::Begin`]), later ones fragments of its arguments' JSON text
//! ([`ToolEvent::Args`]), then [`ToolEvent::End`] with the whole call. Text that could
//! still become the start of a call is held back until it cannot.

use serde_json::Value;

use super::grammar::GrammarSpec;

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    QwenXml,
    Llama3,
    Mistral,
    Generic,
}

impl ToolFormat {
    /// The format a chat template's own tool-call rendering shows.
    pub fn detect(template: &str) -> Self {
        if template.contains("<function=") && template.contains("<parameter=") && template.contains("<tool_call>") {
            ToolFormat::QwenXml
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
            ToolFormat::Generic => "generic_json",
        }
    }

    /// The text a call starts with (`None`: the reply itself is the call).
    fn trigger(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes | ToolFormat::QwenXml => Some("<tool_call>"),
            ToolFormat::Mistral => Some("[TOOL_CALLS]"),
            ToolFormat::Llama3 | ToolFormat::Generic => None,
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
    id_prefix: String,
}

/// The scan of one call's text so far.
#[derive(Debug, PartialEq)]
enum Scan {
    /// The call is not complete. `name` once known; `args` the arguments text so far
    /// that may be streamed (it only grows).
    Partial { name: Option<String>, args: String },
    /// Complete: name, arguments JSON text, and how many bytes of the text it used.
    Done { calls: Vec<(String, String)>, used: usize },
    /// Not a call.
    Invalid,
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
            id_prefix,
        }
    }

    pub fn format(&self) -> ToolFormat {
        self.format
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

    /// The generation ended: whatever is held back is settled. A call cut off before
    /// its end is kept when its JSON is complete, and becomes text otherwise.
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
                Mode::Call => {
                    let scan = self.scan(eof);
                    match scan {
                        Scan::Partial { name, args } => {
                            if let Some(name) = name {
                                self.begin(name, out);
                                if args.len() > self.args_sent && args.is_char_boundary(self.args_sent) {
                                    let index = self.calls.len() - 1;
                                    out.push(ToolEvent::Args { index, fragment: args[self.args_sent..].to_string() });
                                    self.calls[index].arguments.push_str(&args[self.args_sent..]);
                                    self.args_sent = args.len();
                                }
                            }
                            if eof {
                                // Cut off inside a call: what was not handed on is text.
                                self.begun = false;
                                if self.args_sent == 0 && self.calls.last().is_some_and(|c| c.arguments.is_empty()) {
                                    self.calls.pop();
                                }
                                self.mode = Mode::TextOnly;
                                continue;
                            }
                            return;
                        }
                        Scan::Done { calls, used } => {
                            for (name, args) in calls {
                                self.begin(name, out);
                                let index = self.calls.len() - 1;
                                let sent = &self.calls[index].arguments;
                                let fragment = match args.strip_prefix(sent.as_str()) {
                                    Some(rest) => rest.to_string(),
                                    // What was streamed is not a prefix of the final text
                                    // (never for well-formed JSON): send the rest anyway.
                                    None => args[sent.len().min(args.len())..].to_string(),
                                };
                                if !fragment.is_empty() {
                                    out.push(ToolEvent::Args { index, fragment });
                                }
                                self.calls[index].arguments = args;
                                out.push(ToolEvent::End { index, call: self.calls[index].clone() });
                                self.begun = false;
                                self.args_sent = 0;
                            }
                            self.buf.drain(..used.min(self.buf.len()));
                            self.mode = match self.format {
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
                            if self.begun {
                                self.begun = false;
                            }
                            out.push(ToolEvent::Text(text));
                            self.mode = Mode::TextOnly;
                        }
                    }
                }
            }
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

    /// Scans the current call's text (`buf`, after the trigger).
    fn scan(&self, eof: bool) -> Scan {
        match self.format {
            ToolFormat::Hermes => scan_tagged_json(&self.buf, "</tool_call>", eof),
            ToolFormat::QwenXml => scan_qwen_xml(&self.buf, &self.tools, eof),
            ToolFormat::Llama3 | ToolFormat::Generic => scan_reply_json(&self.buf, eof),
            ToolFormat::Mistral => scan_mistral(&self.buf, eof),
        }
    }
}

/// Lower-case base-36 digits of `n`, `len` of them.
fn base36(mut n: u64, len: usize) -> String {
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

/// Where the JSON value starting at `text[0]` ends: `Some(len)` when complete, `None`
/// when the text ends inside it, `Err` when it is not JSON there.
fn json_value_len(text: &str) -> Result<Option<usize>, ()> {
    let bytes = text.as_bytes();
    let Some(&first) = bytes.first() else { return Ok(None) };
    match first {
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut in_str = false;
            let mut escaped = false;
            for (i, &b) in bytes.iter().enumerate() {
                if in_str {
                    match (escaped, b) {
                        (true, _) => escaped = false,
                        (false, b'\\') => escaped = true,
                        (false, b'"') => in_str = false,
                        _ => {}
                    }
                    continue;
                }
                match b {
                    b'"' => in_str = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(Some(i + 1));
                        }
                    }
                    _ => {}
                }
            }
            Ok(None)
        }
        b'"' => {
            let mut escaped = false;
            for (i, &b) in bytes.iter().enumerate().skip(1) {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => return Ok(Some(i + 1)),
                    _ => {}
                }
            }
            Ok(None)
        }
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let end = bytes.iter().position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'));
            Ok(end)
        }
        _ => Err(()),
    }
}

/// A call object's name and arguments (`arguments` or `parameters`, given as an object
/// or as a string holding one) as JSON text.
fn call_from_value(v: &Value) -> Option<(String, String)> {
    let obj = v.as_object()?;
    let obj = match obj.get("function").and_then(Value::as_object) {
        Some(f) => f,
        None => obj,
    };
    let name = obj.get("name")?.as_str()?.to_string();
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => serde_json::to_string(&v).ok()?,
            _ => return None,
        },
        Some(v @ Value::Object(_)) => serde_json::to_string(v).ok()?,
        Some(_) => return None,
    };
    Some((name, args))
}

/// A call object's name and arguments, keeping the arguments' text as the model wrote it
/// when the object starts with `name` (so the streamed fragments are a prefix of it).
fn call_from_text(text: &str, value: &Value) -> Option<(String, String)> {
    if let Ok(Some((name, at))) = call_prefix(text)
        && text[at..].starts_with('{')
        && let Ok(Some(n)) = json_value_len(&text[at..])
    {
        return Some((name, text[at..at + n].to_string()));
    }
    call_from_value(value)
}

/// The streamable start of a call object: `{"name": "NAME", "arguments": ` (or
/// `parameters`), after which the arguments' own text follows. Returns the name and where
/// the arguments start; `Ok(None)` when the text is too short to tell.
fn call_prefix(text: &str) -> Result<Option<(String, usize)>, ()> {
    let mut i = 0;
    let b = text.as_bytes();
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Each step: Ok(false) when the text ran out, Err when it does not match.
    let lit = |i: &mut usize, s: &str| -> Result<bool, ()> {
        let have = &text[*i..];
        if have.len() < s.len() {
            return if s.starts_with(have) { Ok(false) } else { Err(()) };
        }
        if have.starts_with(s) {
            *i += s.len();
            Ok(true)
        } else {
            Err(())
        }
    };
    ws(&mut i);
    if !lit(&mut i, "{")? {
        return Ok(None);
    }
    ws(&mut i);
    if !lit(&mut i, "\"name\"")? {
        return Ok(None);
    }
    ws(&mut i);
    if !lit(&mut i, ":")? {
        return Ok(None);
    }
    ws(&mut i);
    let Some(len) = json_value_len(&text[i..])? else { return Ok(None) };
    let name: String = serde_json::from_str(&text[i..i + len]).map_err(|_| ())?;
    i += len;
    ws(&mut i);
    if !lit(&mut i, ",")? {
        return Ok(None);
    }
    ws(&mut i);
    let key_start = i;
    if lit(&mut i, "\"arguments\"").is_err() {
        i = key_start;
        if !lit(&mut i, "\"parameters\"")? {
            return Ok(None);
        }
    } else if i == key_start {
        // `"arguments"` ran out; `"parameters"` may still match.
        let have = &text[key_start..];
        return if "\"parameters\"".starts_with(have) || "\"arguments\"".starts_with(have) {
            Ok(None)
        } else {
            Err(())
        };
    }
    ws(&mut i);
    if !lit(&mut i, ":")? {
        return Ok(None);
    }
    ws(&mut i);
    if i >= text.len() {
        return Ok(None);
    }
    Ok(Some((name, i)))
}

/// A partial scan of a JSON call object: the name once its prefix is complete, and its
/// arguments so far when they are an object (a string is only known whole).
fn partial_object(text: &str) -> Scan {
    match call_prefix(text) {
        Err(()) => Scan::Partial { name: None, args: String::new() },
        Ok(None) => Scan::Partial { name: None, args: String::new() },
        Ok(Some((name, at))) => {
            let rest = &text[at..];
            let args = match (rest.starts_with('{'), json_value_len(rest)) {
                (true, Ok(Some(n))) => rest[..n].to_string(),
                (true, _) => rest.to_string(),
                _ => String::new(),
            };
            Scan::Partial { name: Some(name), args }
        }
    }
}

/// Hermes: one JSON call object, then `end`.
fn scan_tagged_json(buf: &str, end: &str, eof: bool) -> Scan {
    let body = buf.trim_start();
    let lead = buf.len() - body.len();
    if body.is_empty() {
        return if eof { Scan::Invalid } else { Scan::Partial { name: None, args: String::new() } };
    }
    match json_value_len(body) {
        Err(()) => Scan::Invalid,
        Ok(None) if eof => Scan::Invalid,
        Ok(None) => partial_object(body),
        Ok(Some(n)) => {
            let Some(call) =
                serde_json::from_str::<Value>(&body[..n]).ok().and_then(|v| call_from_text(&body[..n], &v))
            else {
                return Scan::Invalid;
            };
            let after = &body[n..];
            let trimmed = after.trim_start();
            let used = if trimmed.starts_with(end) {
                lead + n + (after.len() - trimmed.len()) + end.len()
            } else if !eof && (trimmed.is_empty() || end.starts_with(trimmed)) {
                // The end tag may still come: wait for it, streaming what is known.
                return partial_object(body);
            } else {
                lead + n
            };
            Scan::Done { calls: vec![call], used }
        }
    }
}

/// Llama 3 and the generic format: the reply is one JSON value: a call object, a list
/// of them, or `{"tool_calls": [...]}`.
fn scan_reply_json(buf: &str, eof: bool) -> Scan {
    match json_value_len(buf) {
        Err(()) => Scan::Invalid,
        Ok(None) if eof => Scan::Invalid,
        Ok(None) => match call_prefix(buf) {
            Err(()) if buf.starts_with('{') && !buf.trim_start_matches('{').trim_start().starts_with("\"name\"") => {
                // `{"tool_calls": [...]}` and lists are only known whole.
                let head = buf.trim_start_matches(['{', '[', ' ', '\n']);
                if head.is_empty() || "\"tool_calls\"".starts_with(head) || head.starts_with("\"tool_calls\"") {
                    Scan::Partial { name: None, args: String::new() }
                } else {
                    Scan::Invalid
                }
            }
            _ if buf.starts_with('[') => Scan::Partial { name: None, args: String::new() },
            Err(()) => Scan::Invalid,
            _ => partial_object(buf),
        },
        Ok(Some(n)) => {
            let Ok(v) = serde_json::from_str::<Value>(&buf[..n]) else { return Scan::Invalid };
            let calls: Option<Vec<_>> = match &v {
                Value::Array(a) => a.iter().map(call_from_value).collect(),
                Value::Object(o) => match o.get("tool_calls") {
                    Some(Value::Array(a)) => a.iter().map(call_from_value).collect(),
                    Some(_) => return Scan::Invalid,
                    None => call_from_text(&buf[..n], &v).map(|c| vec![c]),
                },
                _ => return Scan::Invalid,
            };
            match calls {
                Some(c) if !c.is_empty() && buf[n..].trim().is_empty() => Scan::Done { calls: c, used: buf.len() },
                Some(_) if !eof && buf[n..].trim().is_empty() => Scan::Partial { name: None, args: String::new() },
                _ => Scan::Invalid,
            }
        }
    }
}

/// Mistral, after `[TOOL_CALLS]`: a JSON list of calls, or `NAME[ARGS]{...}` (with an
/// optional `[CALL_ID]ID` before `[ARGS]`).
fn scan_mistral(buf: &str, eof: bool) -> Scan {
    let body = buf.trim_start();
    let lead = buf.len() - body.len();
    if body.starts_with('[') {
        return match json_value_len(body) {
            Err(()) => Scan::Invalid,
            Ok(None) if eof => Scan::Invalid,
            Ok(None) => Scan::Partial { name: None, args: String::new() },
            Ok(Some(n)) => {
                let Ok(Value::Array(items)) = serde_json::from_str::<Value>(&body[..n]) else { return Scan::Invalid };
                match items.iter().map(call_from_value).collect::<Option<Vec<_>>>() {
                    Some(calls) if !calls.is_empty() => Scan::Done { calls, used: lead + n },
                    _ => Scan::Invalid,
                }
            }
        };
    }
    let Some(args_at) = body.find("[ARGS]") else {
        let name_ok = body.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '[' | ']'));
        return if eof || !name_ok { Scan::Invalid } else { Scan::Partial { name: None, args: String::new() } };
    };
    let name = match body[..args_at].find("[CALL_ID]") {
        Some(c) => &body[..c],
        None => &body[..args_at],
    };
    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        return Scan::Invalid;
    }
    let rest = &body[args_at + "[ARGS]".len()..];
    match json_value_len(rest) {
        Err(()) => Scan::Invalid,
        Ok(None) if eof => Scan::Invalid,
        Ok(None) => Scan::Partial { name: Some(name.to_string()), args: rest.to_string() },
        Ok(Some(n)) => match serde_json::from_str::<Value>(&rest[..n]) {
            Ok(Value::Object(_)) => Scan::Done {
                calls: vec![(name.to_string(), rest[..n].to_string())],
                used: lead + args_at + "[ARGS]".len() + n,
            },
            _ => Scan::Invalid,
        },
    }
}

/// Qwen3-Coder's XML: `<function=NAME>` then `<parameter=KEY>\nVALUE\n</parameter>`s,
/// `</function>`, `</tool_call>`. Values become JSON by the tool's parameter schema:
/// strings stay strings, other types are parsed as JSON (and kept as strings if they
/// are not JSON).
fn scan_qwen_xml(buf: &str, tools: &[Value], eof: bool) -> Scan {
    let body = buf.trim_start();
    let lead = buf.len() - body.len();
    const OPEN: &str = "<function=";
    if body.len() < OPEN.len() {
        return if OPEN.starts_with(body) && !eof {
            Scan::Partial { name: None, args: String::new() }
        } else {
            Scan::Invalid
        };
    }
    if !body.starts_with(OPEN) {
        return Scan::Invalid;
    }
    let Some(name_end) = body.find('>') else {
        return if eof { Scan::Invalid } else { Scan::Partial { name: None, args: String::new() } };
    };
    let name = body[OPEN.len()..name_end].trim().to_string();
    if name.is_empty() || name.contains(['<', '\n']) {
        return Scan::Invalid;
    }
    let schema = tools
        .iter()
        .filter_map(|t| t.get("function").or(Some(t)))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(name.as_str()))
        .and_then(|f| f.get("parameters"))
        .and_then(|p| p.get("properties"));
    let mut args = String::from("{");
    let mut rest = &body[name_end + 1..];
    let mut n = 0;
    loop {
        let trimmed = rest.trim_start();
        if let Some(after) = trimmed.strip_prefix("</function>") {
            args.push('}');
            let tail = after.trim_start();
            let used_tail = if let Some(t) = tail.strip_prefix("</tool_call>") {
                after.len() - t.len()
            } else if !eof && "</tool_call>".starts_with(tail) {
                return Scan::Partial { name: Some(name), args: args[..args.len() - 1].to_string() };
            } else {
                0
            };
            let used = lead + (body.len() - after.len()) + used_tail;
            return Scan::Done { calls: vec![(name, args)], used };
        }
        let Some(p) = trimmed.strip_prefix("<parameter=") else {
            if !eof && ("<parameter=".starts_with(trimmed) || "</function>".starts_with(trimmed)) {
                return Scan::Partial { name: Some(name), args };
            }
            return Scan::Invalid;
        };
        let (Some(key_end), Some(val_end)) = (p.find('>'), p.find("</parameter>")) else {
            return if eof { Scan::Invalid } else { Scan::Partial { name: Some(name), args } };
        };
        if key_end > val_end {
            return Scan::Invalid;
        }
        let key = p[..key_end].trim();
        let raw = &p[key_end + 1..val_end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let ty = schema.and_then(|s| s.get(key)).and_then(|s| s.get("type")).and_then(Value::as_str);
        let value = match ty {
            Some("string") | None => match serde_json::from_str::<Value>(raw) {
                Ok(v) if ty.is_none() && !v.is_string() => v,
                _ => Value::String(raw.to_string()),
            },
            _ => serde_json::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.to_string())),
        };
        if n > 0 {
            args.push_str(", ");
        }
        args.push_str(&serde_json::to_string(key).unwrap_or_default());
        args.push_str(": ");
        args.push_str(&serde_json::to_string(&value).unwrap_or_default());
        n += 1;
        rest = &p[val_end + "</parameter>".len()..];
    }
}

/// llguidance's JSON options for tool calls: `{"name": "f", "arguments": {"k": 1}}`,
/// separators as models are trained to write them, no other whitespace.
fn compact_json() -> Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "whitespace_pattern": null})
}

/// Mistral's markers are special tokens, which a grammar names by id (`<[5]>`): the ids
/// of this vocabulary's, those the template uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MistralTokens {
    /// `[TOOL_CALLS]`.
    pub tool_calls: Option<u32>,
    /// `[ARGS]`, when calls are `NAME[ARGS]{...}` (Small 3.2, Devstral); `None`: a JSON
    /// list follows `[TOOL_CALLS]` (Nemo).
    pub args: Option<u32>,
    /// `[CALL_ID]`, when the call's id comes between its name and `[ARGS]`.
    pub call_id: Option<u32>,
}

impl MistralTokens {
    /// The markers `template` writes, looked up with `id_of`.
    pub fn of(template: &str, id_of: impl Fn(&str) -> Option<u32>) -> Self {
        let used = |m: &str| if template.contains(m) { id_of(m) } else { None };
        MistralTokens { tool_calls: used("[TOOL_CALLS]"), args: used("[ARGS]"), call_id: used("[CALL_ID]") }
    }
}

/// The grammar that makes a reply call one of `functions` (function definitions:
/// `{"name", "description", "parameters"}`) in `format`: one call, or with `parallel`
/// one or more. Mistral's needs its marker tokens' ids (`mistral`).
pub fn call_grammar(
    format: ToolFormat,
    functions: &[&Value],
    parallel: bool,
    mistral: MistralTokens,
) -> Result<GrammarSpec, String> {
    if functions.is_empty() {
        return Err("`tool_choice` asks for a tool call, but `tools` holds no functions".into());
    }
    // Arguments hold only the declared parameters unless the schema says otherwise (as
    // OpenAI's strict mode and llama.cpp's grammars do): a small model otherwise runs on
    // inventing keys.
    let params = |f: &Value| {
        let mut p = f.get("parameters").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"}));
        if let Some(o) = p.as_object_mut()
            && o.contains_key("properties")
        {
            o.entry("additionalProperties").or_insert(Value::Bool(false));
        }
        p
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
            let Some(tc) = mistral.tool_calls else {
                return Err(
                    "`tool_choice` asks for a tool call, but this model's vocabulary has no [TOOL_CALLS] token".into(),
                );
            };
            let calls = if parallel { "call+" } else { "call" };
            match mistral.args {
                // `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}` per call.
                Some(args) => {
                    let id = match mistral.call_id {
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

#[cfg(test)]
mod tests;
