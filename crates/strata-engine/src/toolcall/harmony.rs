//! OpenAI's harmony format (gpt-oss): a reply is a series of messages,
//! `<|start|>{header}<|message|>{content}<|end|>`, the first one continuing the prompt's
//! `<|start|>assistant`. The header names a channel after `<|channel|>`: `analysis` is
//! reasoning, `final` the answer, `commentary` a tool call when the header addresses one
//! (`to=functions.NAME`, before or after `<|channel|>`, optionally followed by
//! `<|constrain|>json` or `json`), else a preamble shown to the user. `<|call|>` ends a
//! call and `<|return|>` the final answer: either ends the generation (both are
//! end-of-generation tokens of its vocabulary). `<|end|>` ends one message only.
//!
//! [`HarmonyParser`] reads the generated text as it streams: reasoning as
//! [`Part::Reasoning`], everything else as the [`ToolEvent`]s of [`super::ToolCallParser`]
//! (content as [`ToolEvent::Text`], calls streamed name first, then their arguments as
//! they come). Text that may be the start of a marker is held back until it cannot be.

use serde_json::Value;

use super::scan::json_value_len;
use super::{CallMarkers, ToolCall, ToolEvent, base36, compact_json, lark_str, partial_suffix};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";

/// The harmony markers the detokenizer must keep for the parser (special tokens).
pub const MARKERS: [&str; 7] = [START, CHANNEL, "<|constrain|>", MESSAGE, END, CALL, RETURN];

/// A header longer than this is not one: what was held as a header is content.
const MAX_HEADER: usize = 512;

/// Whether a chat template writes harmony messages.
pub fn is_harmony(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE) && template.contains(START)
}

/// Template variables as gpt-oss's template takes them: its `reasoning_effort` knows
/// `low`, `medium` and `high` (`minimal` becomes `low`, `xhigh` `high`), and it cannot
/// turn reasoning off: `enable_thinking: false` without a level asks for `low`.
pub fn effort_vars(vars: &mut serde_json::Map<String, Value>) {
    let level = match vars.get("reasoning_effort").and_then(Value::as_str) {
        Some("minimal") => "low",
        Some("xhigh") => "high",
        Some(_) => return,
        None if vars.get("enable_thinking") == Some(&Value::Bool(false)) => "low",
        None => return,
    };
    vars.insert("reasoning_effort".into(), Value::String(level.into()));
}

/// What the parser hands on, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// `analysis` text.
    Reasoning(String),
    /// Content (`final`, preambles) and calls.
    Tool(ToolEvent),
}

/// What a message's content is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call of this function; its arguments gather in [`HarmonyParser::args`].
    Call(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Before a message's `<|start|>`; `first`: at the reply's start, which is inside
    /// the prompt's `<|start|>assistant` header.
    Between {
        first: bool,
    },
    /// In a header, up to its `<|message|>`.
    Header,
    Body(Body),
    /// Text outside any message (a reply not in harmony): content, up to a `<|start|>`.
    Plain,
    /// Generation ended (`<|call|>`, `<|return|>`, or a single-call reply's call):
    /// whatever follows is dropped.
    Closed,
}

/// Splits a harmony reply into reasoning, content and tool calls as it streams.
#[derive(Debug)]
pub struct HarmonyParser {
    /// Whether the request offered tools: without them, a call's text is content.
    calls_offered: bool,
    state: State,
    /// Text not yet handed on.
    buf: String,
    /// The current call's arguments text so far (leading whitespace dropped).
    args: String,
    /// Calls begun so far (the last may be in progress).
    calls: Vec<ToolCall>,
    begun: bool,
    /// Bytes of the current call's arguments already handed on.
    args_sent: usize,
    cut: bool,
    single: bool,
    id_prefix: String,
}

impl HarmonyParser {
    /// `calls_offered`: the request offered tools; `id_seed` makes call ids unique per
    /// request.
    pub fn new(calls_offered: bool, id_seed: u64) -> Self {
        HarmonyParser {
            calls_offered,
            state: State::Between { first: true },
            buf: String::new(),
            args: String::new(),
            calls: Vec::new(),
            begun: false,
            args_sent: 0,
            cut: false,
            single: false,
            id_prefix: format!("call_{}", base36(id_seed, 12)),
        }
    }

    /// At most one call (`parallel_tool_calls: false`; a harmony generation ends at its
    /// first `<|call|>` anyway, unless the model ends the call with `<|end|>`).
    pub fn single(mut self) -> Self {
        self.single = true;
        self
    }

    /// Whether the reply has ended (`<|call|>`, `<|return|>`, or its one call): nothing
    /// it generates from here on reaches the client, so its generation may stop.
    pub fn closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Whether the text so far is inside an `analysis` message.
    pub fn thinking(&self) -> bool {
        self.state == State::Body(Body::Reasoning)
    }

    /// Whether the text ended inside a call ([`HarmonyParser::finish`] settles it).
    pub fn cut(&self) -> bool {
        self.cut
    }

    /// The calls completed so far.
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls[..self.calls.len() - self.begun as usize]
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.advance(false, &mut out);
        out
    }

    /// The generation ended (at `<|call|>` or `<|return|>` as end-of-generation tokens,
    /// or cut off): a call whose arguments are a complete JSON object stands; one cut
    /// inside its arguments is dropped ([`HarmonyParser::cut`]).
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        self.advance(true, &mut out);
        out
    }

    fn advance(&mut self, eof: bool, out: &mut Vec<Part>) {
        loop {
            match self.state.clone() {
                State::Closed => {
                    self.buf.clear();
                    return;
                }
                State::Between { first } => {
                    let opens: &[&str] = if first { &[START, CHANNEL, " to=", "to="] } else { &[START] };
                    if !first {
                        // Whitespace between messages is nobody's.
                        let ws = self.buf.len() - self.buf.trim_start().len();
                        self.buf.drain(..ws);
                    }
                    if self.buf.starts_with(START) {
                        self.buf.drain(..START.len());
                        self.state = State::Header;
                    } else if opens.iter().any(|o| self.buf.starts_with(o)) {
                        self.state = State::Header;
                    } else if self.buf.is_empty() || (!eof && opens.iter().any(|o| o.starts_with(self.buf.as_str()))) {
                        if eof {
                            self.state = State::Closed;
                        }
                        return;
                    } else {
                        self.state = State::Plain;
                    }
                }
                State::Header => {
                    let Some(at) = self.buf.find(MESSAGE) else {
                        let ended = [END, CALL, RETURN].iter().any(|m| self.buf.contains(m));
                        if ended || self.buf.len() > MAX_HEADER {
                            self.state = State::Plain;
                            continue;
                        }
                        if eof {
                            // Cut inside a call's header: a call the limit cut.
                            self.cut = self.calls_offered && recipient(&self.buf).is_some();
                            self.state = State::Closed;
                        }
                        return;
                    };
                    let body = self.body(&self.buf[..at]);
                    self.buf.drain(..at + MESSAGE.len());
                    self.args.clear();
                    self.state = State::Body(body);
                }
                State::Body(body) => {
                    let found = [END, CALL, RETURN].into_iter().filter_map(|m| Some((self.buf.find(m)?, m))).min();
                    let (upto, ends) = match found {
                        Some((at, m)) => (at, Some(m)),
                        None if eof => (self.buf.len(), None),
                        None => (self.buf.len() - held(&self.buf, &[END, CALL, RETURN]), None),
                    };
                    let text: String = self.buf.drain(..upto).collect();
                    self.body_text(&body, text, out);
                    if let Some(m) = ends {
                        self.buf.drain(..m.len());
                    }
                    if ends.is_none() && !eof {
                        return;
                    }
                    if let Body::Call(name) = body {
                        self.end_call(name, ends.is_none(), out);
                    }
                    self.state = match ends {
                        _ if self.closed() => State::Closed,
                        Some(END) => State::Between { first: false },
                        _ => State::Closed,
                    };
                }
                State::Plain => {
                    let found = MARKERS.into_iter().filter_map(|m| Some((self.buf.find(m)?, m))).min();
                    let upto = match found {
                        Some((at, _)) => at,
                        None if eof => self.buf.len(),
                        None => self.buf.len() - held(&self.buf, &MARKERS),
                    };
                    if upto > 0 {
                        out.push(Part::Tool(ToolEvent::Text(self.buf.drain(..upto).collect())));
                    }
                    let Some((_, m)) = found else { return };
                    if m == CHANNEL {
                        // A header without its `<|start|>`.
                        self.state = State::Header;
                        continue;
                    }
                    self.buf.drain(..m.len());
                    self.state = match m {
                        START => State::Header,
                        CALL | RETURN => State::Closed,
                        // `<|end|>`, or a marker out of place: dropped.
                        _ => State::Plain,
                    };
                }
            }
        }
    }

    /// What a message with this header holds.
    fn body(&self, header: &str) -> Body {
        if let Some(to) = recipient(header).filter(|_| self.calls_offered) {
            return Body::Call(to.strip_prefix("functions.").unwrap_or(to).to_string());
        }
        let channel = header.split_once(CHANNEL).map(|(_, c)| word(c));
        match channel {
            Some("analysis") => Body::Reasoning,
            _ => Body::Content,
        }
    }

    /// Hands on text of a message's content.
    fn body_text(&mut self, body: &Body, text: String, out: &mut Vec<Part>) {
        if text.is_empty() {
            return;
        }
        match body {
            Body::Reasoning => out.push(Part::Reasoning(text)),
            Body::Content => out.push(Part::Tool(ToolEvent::Text(text))),
            Body::Call(name) => {
                if self.args.is_empty() {
                    self.args.push_str(text.trim_start());
                } else {
                    self.args.push_str(&text);
                }
                self.stream_args(name, out);
            }
        }
    }

    /// Streams the arguments so far: the name once they look like an object, then what
    /// there is of them (trailing whitespace held back; nothing past the object).
    fn stream_args(&mut self, name: &str, out: &mut Vec<Part>) {
        if !self.args.starts_with('{') {
            return;
        }
        let upto = match json_value_len(&self.args) {
            Ok(Some(n)) => n,
            Ok(None) => self.args.trim_end().len(),
            Err(()) => return,
        };
        self.begin(name, out);
        if upto > self.args_sent && self.args.is_char_boundary(self.args_sent) {
            let fragment = self.args[self.args_sent..upto].to_string();
            let index = self.calls.len() - 1;
            self.calls[index].arguments.push_str(&fragment);
            self.args_sent = upto;
            out.push(Part::Tool(ToolEvent::Args { index, fragment }));
        }
    }

    fn begin(&mut self, name: &str, out: &mut Vec<Part>) {
        if self.begun {
            return;
        }
        let index = self.calls.len();
        let id = format!("{}_{index}", self.id_prefix);
        out.push(Part::Tool(ToolEvent::Begin { index, id: id.clone(), name: name.to_string() }));
        self.calls.push(ToolCall { id, name: name.to_string(), arguments: String::new() });
        self.begun = true;
        self.args_sent = 0;
    }

    /// The call's message ended (at its marker, or with the text: `cut_off`): it stands
    /// when its arguments are a JSON object, and is dropped otherwise (cut, when the text
    /// ended inside them).
    fn end_call(&mut self, name: String, cut_off: bool, out: &mut Vec<Part>) {
        let whole = match json_value_len(&self.args) {
            Ok(Some(n)) => Some(&self.args[..n]).filter(|a| matches!(serde_json::from_str(a), Ok(Value::Object(_)))),
            _ => None,
        };
        let Some(args) = whole.map(str::to_string) else {
            self.cut |= cut_off;
            if self.begun {
                self.calls.pop();
                self.begun = false;
            }
            return;
        };
        self.begin(&name, out);
        let index = self.calls.len() - 1;
        if args.len() > self.args_sent {
            let fragment = args[self.args_sent..].to_string();
            self.calls[index].arguments.push_str(&fragment);
            out.push(Part::Tool(ToolEvent::Args { index, fragment }));
        }
        out.push(Part::Tool(ToolEvent::End { index, call: self.calls[index].clone() }));
        self.begun = false;
        self.args_sent = 0;
        if self.single {
            self.state = State::Closed;
        }
    }
}

/// The grammar of a forced call: the reply's first message is the call, in the spec's
/// shape, `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
/// (markers by token id where the vocabulary has them). It is one call whatever
/// `parallel_tool_calls` says: `<|call|>` ends the generation.
pub(super) fn call_grammar(functions: &[&Value], m: &CallMarkers, params: impl Fn(&Value) -> Value) -> String {
    let mut rules = String::new();
    let mut alts = Vec::new();
    for (i, f) in functions.iter().enumerate() {
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let mut schema = params(f);
        schema["x-guidance"] = compact_json();
        let schema = serde_json::to_string(&schema).unwrap_or_default();
        rules.push_str(&format!(
            "f{i}: {} {} \"json\" {} a{i} {}\na{i}: %json {schema}\n",
            lark_str(&format!("{name} ")),
            m.lark("<|constrain|>"),
            m.lark(MESSAGE),
            m.lark(CALL)
        ));
        alts.push(format!("f{i}"));
    }
    format!("start: {} \"commentary to=functions.\" func\nfunc: {}\n{rules}", m.lark(CHANNEL), alts.join(" | "))
}

/// The grammar of a structured reply (`response_format`, Ollama's `format`) in harmony:
/// the model may first think (an `analysis` message, any text without a marker), then
/// its `final` message is the JSON `schema` allows (a [`GrammarSpec::json_schema`]), then
/// `<|return|>`, so that the schema constrains the answer and not the reasoning.
///
/// [`GrammarSpec::json_schema`]: crate::grammar::GrammarSpec::json_schema
pub fn final_grammar(schema: &Value, m: &CallMarkers) -> String {
    let schema = serde_json::to_string(schema).unwrap_or_default();
    format!(
        "start: analysis? {ch} \"final\" {msg} body {ret}\nanalysis: {ch} \"analysis\" {msg} /([^<]|<[^|])*/ {end} {start} \"assistant\"\nbody: %json {schema}\n",
        ch = m.lark(CHANNEL),
        msg = m.lark(MESSAGE),
        ret = m.lark(RETURN),
        end = m.lark(END),
        start = m.lark(START),
    )
}

/// The recipient a header addresses (`to=functions.NAME`), if any.
fn recipient(header: &str) -> Option<&str> {
    let at = header.find("to=")?;
    Some(word(&header[at + 3..])).filter(|w| !w.is_empty())
}

/// The text up to the first whitespace or marker.
fn word(text: &str) -> &str {
    let text = text.trim_start();
    let end = text.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(text.len());
    &text[..end]
}

/// How many bytes at the end of `text` may be the start of one of `markers`.
fn held(text: &str, markers: &[&str]) -> usize {
    markers.iter().map(|m| partial_suffix(text, m)).max().unwrap_or(0)
}

#[cfg(test)]
mod tests;
