//! Chat templates: the Jinja templates that ship with Hugging Face models, rendered the way
//! transformers renders them.
//!
//! transformers compiles templates with jinja2's `ImmutableSandboxedEnvironment(
//! trim_blocks=True, lstrip_blocks=True)` plus the `loopcontrols` extension, and adds
//! `raise_exception(msg)`, `strftime_now(fmt)` and a `tojson` filter that is plain
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`
//! (not jinja2's HTML-escaping one). The context holds the tokenizer's named special tokens
//! (`bos_token`, `eos_token`, ...), the caller's extra variables, `messages`, `tools`
//! (None unless given), `documents` (None unless given) and `add_generation_prompt`.
//! Python string and dict methods (`.strip()`, `.split()`, `.items()`, ...) come from
//! minijinja-contrib's pycompat layer, and `{{ value }}` prints floats, lists and dicts the
//! way Python's `str()` does.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

use super::text_error::TextError;

/// One chat message as the template sees it: `{"role": ..., "content": ..., ...}`.
///
/// `fields` holds the message's other keys in the order given (`tool_calls`,
/// `tool_call_id`, `name`, `reasoning_content`, ...); templates see them after `role` and
/// `content`, as transformers passes the caller's dict.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), fields: serde_json::Map::new() }
    }

    /// Adds another key (`tool_calls`, `tool_call_id`, `name`, `reasoning_content`, ...).
    pub fn with_field(mut self, key: &str, value: serde_json::Value) -> Self {
        self.fields.insert(key.to_string(), value);
        self
    }

    /// The message as a JSON object: `role`, `content`, then `fields` in order.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::with_capacity(2 + self.fields.len());
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone().into());
        for (k, v) in &self.fields {
            if k != "role" && k != "content" {
                m.insert(k.clone(), v.clone());
            }
        }
        serde_json::Value::Object(m)
    }
}

/// The keys transformers reads a message's reasoning from, in the order it tries them.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers' reasoning aliasing: a message with reasoning under any of
/// [`REASONING_FIELDS`] gets it as `thinking` (first, unless already there; gpt-oss
/// templates read that) and as `reasoning_content` (Qwen's name).
fn alias_reasoning(message: &serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(m) = message else { return message.clone() };
    let Some(reasoning) = REASONING_FIELDS.iter().find_map(|k| m.get(*k).filter(|v| !v.is_null())) else {
        return message.clone();
    };
    let mut out = serde_json::Map::with_capacity(m.len() + 2);
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in m {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), reasoning.clone());
    serde_json::Value::Object(out)
}

/// Name the template is stored under inside its environment (no `.html`: no autoescape).
const TEMPLATE_NAME: &str = "chat_template";

/// Nesting limit for values converted from JSON and for `tojson`.
const MAX_DEPTH: usize = 128;

/// A compiled chat template plus the special-token variables it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// Named special tokens (`bos_token`, `eos_token`, `unk_token`, ...) put in the context.
    special_tokens: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

/// The error `raise_exception` attaches, so that render can tell it from engine errors.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

impl ChatTemplate {
    /// Compiles `source`. Syntax errors are reported here, not at render time.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self, TextError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| TextError::TemplateSyntax(e.to_string()))?,
        );
        // jinja2's default `Undefined`: printing it gives "", touching its attributes fails.
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_test("iterable", is_iterable);

        let source = strip_generation_tags(source);
        env.add_template_owned(TEMPLATE_NAME, source.clone()).map_err(|e| TextError::TemplateSyntax(describe(&e)))?;

        let mut special_tokens = BTreeMap::new();
        if let Some(b) = bos_token {
            special_tokens.insert("bos_token".to_string(), b);
        }
        if let Some(e) = eos_token {
            special_tokens.insert("eos_token".to_string(), e);
        }
        Ok(Self { env, source, special_tokens })
    }

    /// Another template rendered with the same special-token variables.
    pub fn with_source(&self, source: &str) -> Result<Self, TextError> {
        let mut t = ChatTemplate::new(source, None, None)?;
        t.special_tokens = self.special_tokens.clone();
        Ok(t)
    }

    /// Adds another named special token variable (`unk_token`, `pad_token`, ...).
    pub fn with_special_token(mut self, name: &str, value: String) -> Self {
        self.special_tokens.insert(name.to_string(), value);
        self
    }

    /// The template text (after `{% generation %}` tags were dropped).
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TextError> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Renders with extra context variables (`tools`, `documents`, `enable_thinking`, ...).
    /// `messages` and `add_generation_prompt` always come from the arguments.
    ///
    /// Key order inside `extra` is whatever `serde_json::Map` keeps: sorted unless
    /// serde_json's `preserve_order` feature is on, and `tojson` prints maps in that order.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TextError> {
        let messages: Vec<serde_json::Value> = messages.iter().map(ChatMessage::to_json).collect();
        self.render_json(&messages, add_generation_prompt, extra)
    }

    /// Renders messages given as JSON objects, exactly as transformers'
    /// `apply_chat_template` passes the caller's dicts (a `null` content stays `None`),
    /// after its reasoning aliasing ([`REASONING_FIELDS`]).
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TextError> {
        self.render_as_given(messages, add_generation_prompt, extra).map_err(|e| match e {
            // A template that renders a plain chat but not this one fails on what the
            // request sent (a tool call's arguments as a string where it iterates them, a
            // role it does not know): the request's fault, not the model's.
            TextError::TemplateRender(msg) if self.renders_plain_chat() => TextError::TemplateConversation(msg),
            e => e,
        })
    }

    /// Whether the template renders one user message, as `/api/create` requires of a
    /// template before it stores one.
    pub fn renders_plain_chat(&self) -> bool {
        let hello = [ChatMessage::new("user", "Hello").to_json()];
        self.render_as_given(&hello, true, &serde_json::Map::new()).is_ok()
    }

    /// [`render_json`](Self::render_json), with every engine error a `TemplateRender`.
    fn render_as_given(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TextError> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in &self.special_tokens {
            ctx.insert(k.clone(), Value::from(v.as_str()));
        }
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        for (k, v) in extra {
            ctx.insert(k.clone(), json_to_value(v, 0)?);
        }
        let messages = messages.iter().map(|m| json_to_value(&alias_reasoning(m), 1)).collect::<Result<Vec<_>, _>>()?;
        ctx.insert("messages".into(), Value::from(messages));
        ctx.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));

        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(|e| TextError::TemplateRender(describe(&e)))?;
        tmpl.render(Value::from(ctx)).map_err(|e| match raised_message(&e) {
            Some(msg) => TextError::TemplateRaised(msg),
            None => TextError::TemplateRender(describe(&e)),
        })
    }

    /// Pins `strftime_now` to a moment (Unix seconds, UTC), for reproducible renders.
    pub fn with_fixed_now(mut self, unix_seconds: i64) -> Self {
        self.env.add_function("strftime_now", move |state: &State, format: String| {
            strftime_at(state, Value::from(unix_seconds as f64), format)
        });
        self
    }
}

/// One-line description of a minijinja error including the template line.
fn describe(err: &Error) -> String {
    let mut s = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        let _ = write!(s, ": {inner}");
        source = inner.source();
    }
    s
}

fn raised_message(err: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(r) = e.downcast_ref::<RaisedException>() {
            return Some(r.0.clone());
        }
        source = e.source();
    }
    None
}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let msg = match message.as_str() {
        Some(s) => s.to_string(),
        None => message.to_string(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception called").with_source(RaisedException(msg)))
}

/// `strftime_now(fmt)`: the current time (UTC) formatted with a strftime pattern.
fn strftime_now(state: &State, format: String) -> Result<String, Error> {
    strftime_at(state, minijinja_contrib::globals::now(), format)
}

fn strftime_at(state: &State, time: Value, format: String) -> Result<String, Error> {
    // datetimeformat treats a few names as presets; Python would print them literally.
    if matches!(format.as_str(), "short" | "medium" | "long" | "full" | "iso" | "unix") {
        return Ok(format);
    }
    let kwargs = Kwargs::from_iter([("format", Value::from(format))]);
    minijinja_contrib::filters::datetimeformat(state, time, kwargs)
}

/// jinja2's `iterable` test: whether `iter(value)` works. minijinja would also call none
/// and undefined iterable (they iterate as empty), which breaks the common guard
/// `tools is iterable and tools | length > 0` when there are no tools.
fn is_iterable(value: &Value) -> bool {
    !matches!(value.kind(), ValueKind::None | ValueKind::Undefined) && value.try_iter().is_ok()
}

/// Removes transformers' `{% generation %}` / `{% endgeneration %}` markers (its
/// AssistantTracker extension, only used for assistant masks). Whitespace control marks
/// are kept by turning the tags into an always-true `if`.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => {
                let _ = write!(out, "{{%{lead} if true {trail}%}}");
            }
            "endgeneration" => {
                let _ = write!(out, "{{%{lead} endif {trail}%}}");
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// serde_json value → template value. Map order is the map's iteration order.
pub(crate) fn json_to_value(v: &serde_json::Value, depth: usize) -> Result<Value, TextError> {
    if depth > MAX_DEPTH {
        return Err(TextError::TemplateRender(format!("template variable nested deeper than {MAX_DEPTH} levels")));
    }
    Ok(match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => {
            Value::from(items.iter().map(|x| json_to_value(x, depth + 1)).collect::<Result<Vec<_>, _>>()?)
        }
        serde_json::Value::Object(map) => {
            let mut pairs = Vec::with_capacity(map.len());
            for (k, x) in map {
                pairs.push((Value::from(k.as_str()), json_to_value(x, depth + 1)?));
            }
            Value::from_pairs(pairs)
        }
    })
}

// ---------------------------------------------------------------------------------------
// Python-compatible printing and JSON
// ---------------------------------------------------------------------------------------

/// `{{ value }}` the way jinja2 prints it: `str(value)`.
fn python_formatter(out: &mut minijinja::Output, _state: &mut State, value: &Value) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::Number if !value.is_integer() => py_str(value, 0)?,
        ValueKind::Seq | ValueKind::Map => py_str(value, 0)?,
        _ => {
            return write!(out, "{value}").map_err(|_| Error::from(ErrorKind::WriteFailure));
        }
    };
    out.write_str(&text).map_err(|_| Error::from(ErrorKind::WriteFailure))
}

fn too_deep() -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("value nested deeper than {MAX_DEPTH} levels"))
}

/// Python `str(x)`.
fn py_str(value: &Value, depth: usize) -> Result<String, Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_string()),
        _ => py_repr(value, depth),
    }
}

/// Python `repr(x)` for the JSON-like values templates handle.
fn py_repr(value: &Value, depth: usize) -> Result<String, Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => {
            if value.is_integer() {
                value.to_string()
            } else {
                let f = f64::try_from(value.clone())?;
                py_float_repr(f, false)
            }
        }
        ValueKind::String => py_quote(value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let mut s = String::from("[");
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                s.push_str(&py_repr(&item, depth + 1)?);
            }
            s.push(']');
            s
        }
        ValueKind::Map => {
            let mut s = String::from("{");
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                let item = value.get_item(&key)?;
                s.push_str(&py_repr(&key, depth + 1)?);
                s.push_str(": ");
                s.push_str(&py_repr(&item, depth + 1)?);
            }
            s.push('}');
            s
        }
        _ => value.to_string(),
    })
}

/// Python's repr of a str: single quotes unless the text has `'` and no `"`.
fn py_quote(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) || c == '\u{ad}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            '\u{2028}' | '\u{2029}' | '\u{200b}'..='\u{200f}' | '\u{feff}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr(float)` (shortest round-trip digits; exponent form below 1e-4 and from
/// 1e16). With `json`, non-finite values use JSON's spelling (`NaN`, `Infinity`).
fn py_float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let sign = if f < 0.0 { "-" } else { "" };
        return format!("{sign}{}", if json { "Infinity" } else { "inf" });
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    } else if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        format!("{sign}0.{zeros}{digits}")
    } else {
        let point = exp as usize + 1;
        if digits.len() <= point {
            let zeros = "0".repeat(point - digits.len());
            format!("{sign}{digits}{zeros}.0")
        } else {
            format!("{sign}{}.{}", &digits[..point], &digits[point..])
        }
    }
}

/// How `json.dumps` lays out its output.
struct JsonStyle {
    /// `None`: everything on one line.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, i.e.
/// Python's `json.dumps` with those arguments (`separators` and `sort_keys` by keyword).
fn tojson_filter(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let pick = |pos: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        match pos {
            Some(v) => Ok(Some(v)),
            None => kwargs.get::<Option<Value>>(name),
        }
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            ValueKind::Bool => Some(if v.is_true() { " " } else { "" }.to_string()),
            ValueKind::Number => {
                let n = i64::try_from(v.clone())?;
                Some(" ".repeat(n.clamp(0, 64) as usize))
            }
            _ => {
                return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string"));
            }
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !(v.is_none() || v.is_undefined()) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or_default().to_string(), b.as_str().unwrap_or_default().to_string())
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ));
                }
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let sort_keys = kwargs.get::<Option<Value>>("sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle { indent, item_sep, key_sep, sort_keys, ensure_ascii };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

/// `json.dumps(value, ensure_ascii=False)` exactly as Python prints it (`", "` and `": "`
/// separators, map order kept), e.g. for tool-call arguments shown back to a template.
pub fn python_json_dumps(value: &serde_json::Value) -> Result<String, TextError> {
    let value = json_to_value(value, 0)?;
    let style =
        JsonStyle { indent: None, item_sep: ", ".into(), key_sep: ": ".into(), sort_keys: false, ensure_ascii: false };
    let mut out = String::new();
    write_json(&mut out, &value, &style, 0).map_err(|e| TextError::TemplateRender(describe(&e)))?;
    Ok(out)
}

fn write_newline_indent(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_json(out: &mut String, value: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Undefined => {
            return Err(Error::new(ErrorKind::InvalidOperation, "Object of type Undefined is not JSON serializable"));
        }
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                out.push_str(&py_float_repr(f64::try_from(value.clone())?, true));
            }
        }
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                write_newline_indent(out, style, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            write_newline_indent(out, style, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                write_newline_indent(out, style, depth + 1);
                write_json_str(out, k, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_json(out, item, style, depth + 1)?;
            }
            write_newline_indent(out, style, depth);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {other} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

/// Keys the way `json.dumps` converts them: str as is, numbers, bools and None spelled out.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => py_float_repr(f64::try_from(key.clone())?, true),
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {other}"),
            ));
        }
    })
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests;
