//! The scanners of each format's call text: how much of it is calls, complete or in
//! progress.

use serde_json::Value;

use super::ToolFormat;

/// The scan of one call's text so far.
#[derive(Debug, PartialEq)]
pub(super) enum Scan {
    /// The text is not complete.
    Partial(Progress),
    /// Complete: each call's name and arguments JSON text, and how many bytes of the
    /// text they used.
    Done { calls: Vec<(String, String)>, used: usize },
    /// Not a call.
    Invalid,
}

/// An unfinished call text.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Progress {
    /// The calls it completed so far (a list's items), in order: name, arguments.
    pub done: Vec<(String, String)>,
    /// The call in progress after them: its name once known.
    pub name: Option<String>,
    /// Its arguments text so far that may be streamed (it only grows).
    pub args: String,
    /// Whether a call is in progress after `done` (its text has begun).
    pub pending: bool,
    /// Whether the text is known to be a call's (a trigger, the wrapper's key, a call's
    /// name): cut off here, it is a call the limit cut, not content.
    pub call: bool,
}

impl Progress {
    /// A call has begun, and nothing of it is known yet.
    fn begun() -> Scan {
        Scan::Partial(Progress { pending: true, call: true, ..Progress::default() })
    }

    /// Text that may become a call, or content.
    fn unknown() -> Scan {
        Scan::Partial(Progress { pending: true, ..Progress::default() })
    }
}

/// Scans the text after a format's trigger, or the whole reply for the formats without
/// one.
pub(super) fn scan(format: ToolFormat, buf: &str, tools: &[Value], eof: bool) -> Scan {
    match format {
        ToolFormat::Hermes => scan_tagged_json(buf, "</tool_call>", eof),
        ToolFormat::QwenXml => scan_qwen_xml(buf, tools, eof),
        ToolFormat::Llama3 | ToolFormat::Generic => scan_reply_json(buf),
        ToolFormat::Mistral => scan_mistral(buf),
        ToolFormat::DeepSeek => super::sections::scan_sections(buf, &super::sections::DEEPSEEK, eof),
        ToolFormat::Kimi => super::sections::scan_sections(buf, &super::sections::KIMI, eof),
        ToolFormat::Glm => super::sections::scan_glm(buf, tools, eof),
        // Read by `HarmonyParser`; the generic parser never opens a call in it.
        ToolFormat::Harmony => Scan::Invalid,
    }
}

/// Where the JSON value starting at `text[0]` ends: `Some(len)` when complete, `None`
/// when the text ends inside it, `Err` when it is not JSON there.
pub(super) fn json_value_len(text: &str) -> Result<Option<usize>, ()> {
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

/// A call object in progress: its name once its prefix is complete, and its arguments
/// so far when they are an object (a string is only known whole).
fn partial_object(text: &str) -> (Option<String>, String) {
    match call_prefix(text) {
        Err(()) | Ok(None) => (None, String::new()),
        Ok(Some((name, at))) => {
            let rest = &text[at..];
            let args = match (rest.starts_with('{'), json_value_len(rest)) {
                (true, Ok(Some(n))) => rest[..n].to_string(),
                (true, _) => rest.to_string(),
                _ => String::new(),
            };
            (Some(name), args)
        }
    }
}

/// [`partial_object`] as the scan of a call that has begun after `done`.
fn object_in_progress(text: &str, done: Vec<(String, String)>, call: bool) -> Scan {
    let (name, args) = partial_object(text);
    let call = call || name.is_some() || !done.is_empty();
    Scan::Partial(Progress { done, name, args, pending: true, call })
}

/// Hermes: one JSON call object, then `end`.
fn scan_tagged_json(buf: &str, end: &str, eof: bool) -> Scan {
    let body = buf.trim_start();
    let lead = buf.len() - body.len();
    if body.is_empty() {
        return Progress::begun();
    }
    match json_value_len(body) {
        Err(()) => Scan::Invalid,
        Ok(None) => object_in_progress(body, Vec::new(), true),
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
            } else if trimmed.is_empty() || end.starts_with(trimmed) {
                if eof {
                    // The limit cut the end tag: the call stands.
                    return Scan::Done { calls: vec![call], used: buf.len() };
                }
                // The end tag may still come: wait for it, streaming what is known.
                return object_in_progress(body, Vec::new(), true);
            } else {
                lead + n
            };
            Scan::Done { calls: vec![call], used }
        }
    }
}

/// Llama 3 and the generic format: the reply is one JSON value: a call object, a list
/// of them, or `{"tool_calls": [...]}`.
fn scan_reply_json(buf: &str) -> Scan {
    if buf.starts_with('[') {
        return scan_list(buf, false);
    }
    if let Some(scan) = scan_wrapper(buf) {
        return scan;
    }
    match json_value_len(buf) {
        Err(()) => Scan::Invalid,
        Ok(None) => match call_prefix(buf) {
            Err(()) => Scan::Invalid,
            Ok(_) => object_in_progress(buf, Vec::new(), false),
        },
        Ok(Some(n)) => {
            let Ok(v) = serde_json::from_str::<Value>(&buf[..n]) else { return Scan::Invalid };
            match call_from_text(&buf[..n], &v) {
                Some(c) => Scan::Done { calls: vec![c], used: n + ws_len(&buf[n..]) },
                None => Scan::Invalid,
            }
        }
    }
}

/// The generic format's `{"tool_calls": [...]}`, read call by call; `None` when the text
/// is not (the start of) one.
fn scan_wrapper(buf: &str) -> Option<Scan> {
    const KEY: &str = "\"tool_calls\"";
    let inner = buf.strip_prefix('{')?;
    let key = inner.trim_start();
    if key.len() < KEY.len() {
        return KEY.starts_with(key).then(Progress::unknown);
    }
    let after_key = key.strip_prefix(KEY)?.trim_start();
    let Some(list) = after_key.strip_prefix(':') else {
        return Some(if after_key.is_empty() { Progress::begun() } else { Scan::Invalid });
    };
    let list = list.trim_start();
    if list.is_empty() {
        return Some(Progress::begun());
    }
    if !list.starts_with('[') {
        return Some(Scan::Invalid);
    }
    let at = buf.len() - list.len();
    Some(match scan_list(list, true) {
        Scan::Done { calls, used } => {
            let after = &list[used..];
            let close = after.trim_start();
            let end = at + used + (after.len() - close.len());
            match close.as_bytes().first() {
                Some(b'}') => Scan::Done { calls, used: end + 1 + ws_len(&close[1..]) },
                None => Scan::Partial(Progress { done: calls, call: true, ..Progress::default() }),
                // Other keys follow: the object ends where its JSON does.
                Some(_) => match json_value_len(buf) {
                    Ok(Some(n)) => Scan::Done { calls, used: n + ws_len(&buf[n..]) },
                    Ok(None) => Scan::Partial(Progress { done: calls, call: true, ..Progress::default() }),
                    Err(()) => Scan::Done { calls, used: end },
                },
            }
        }
        other => other,
    })
}

/// A JSON list of call objects at the start of `text`, read item by item. The list ends
/// at its last good call when something else follows; `call`: the text is known to be
/// calls (after a trigger or the wrapper's key).
fn scan_list(text: &str, call: bool) -> Scan {
    let mut i = 1;
    let mut done = Vec::new();
    let mut last_end = 0;
    let ended = |done: Vec<(String, String)>, used: usize| match done.is_empty() {
        true => Scan::Invalid,
        false => Scan::Done { calls: done, used },
    };
    loop {
        i += ws_len(&text[i..]);
        let waiting = |done: Vec<(String, String)>| {
            let call = call || !done.is_empty();
            Scan::Partial(Progress { done, call, ..Progress::default() })
        };
        let Some(&next) = text.as_bytes().get(i) else { return waiting(done) };
        if next == b']' && !done.is_empty() {
            return Scan::Done { calls: done, used: i + 1 };
        }
        if !done.is_empty() {
            if next != b',' {
                return ended(done, last_end);
            }
            i += 1;
            i += ws_len(&text[i..]);
            if i >= text.len() {
                return waiting(done);
            }
        }
        let item = &text[i..];
        match json_value_len(item) {
            Ok(Some(n)) => {
                let parsed = serde_json::from_str::<Value>(&item[..n]).ok();
                match parsed.and_then(|v| call_from_text(&item[..n], &v)) {
                    Some(c) => done.push(c),
                    None => return ended(done, last_end),
                }
                i += n;
                last_end = i;
            }
            Ok(None) if item.starts_with('{') => return object_in_progress(item, done, call),
            Ok(None) if done.is_empty() => {
                return Scan::Partial(Progress { pending: true, call, ..Progress::default() });
            }
            _ => return ended(done, last_end),
        }
    }
}

/// The length of the whitespace `text` starts with.
fn ws_len(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

/// Mistral, after `[TOOL_CALLS]`: a JSON list of calls, or `NAME[ARGS]{...}` (with an
/// optional `[CALL_ID]ID` before `[ARGS]`).
fn scan_mistral(buf: &str) -> Scan {
    let body = buf.trim_start();
    let lead = buf.len() - body.len();
    if body.starts_with('[') {
        return match scan_list(body, true) {
            Scan::Done { calls, used } => Scan::Done { calls, used: lead + used },
            other => other,
        };
    }
    let Some(args_at) = body.find("[ARGS]") else {
        let name_ok = body.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '[' | ']'));
        return if name_ok { Progress::begun() } else { Scan::Invalid };
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
        Ok(None) => in_progress(name.to_string(), rest.to_string()),
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
        return if OPEN.starts_with(body) { Progress::begun() } else { Scan::Invalid };
    }
    if !body.starts_with(OPEN) {
        return Scan::Invalid;
    }
    let Some(name_end) = body.find('>') else {
        return Progress::begun();
    };
    let name = body[OPEN.len()..name_end].trim().to_string();
    if name.is_empty() || name.contains(['<', '\n']) {
        return Scan::Invalid;
    }
    let schema = param_schema(tools, &name);
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
            } else if "</tool_call>".starts_with(tail) {
                if eof {
                    // The limit cut the end tag: the call stands.
                    return Scan::Done { calls: vec![(name, args)], used: buf.len() };
                }
                return in_progress(name, args[..args.len() - 1].to_string());
            } else {
                0
            };
            let used = lead + (body.len() - after.len()) + used_tail;
            return Scan::Done { calls: vec![(name, args)], used };
        }
        let Some(p) = trimmed.strip_prefix("<parameter=") else {
            if "<parameter=".starts_with(trimmed) || "</function>".starts_with(trimmed) {
                return in_progress(name, args);
            }
            return Scan::Invalid;
        };
        let (Some(key_end), Some(val_end)) = (p.find('>'), p.find("</parameter>")) else {
            return in_progress(name, args);
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
        push_arg(&mut args, n, key, &value);
        n += 1;
        rest = &p[val_end + "</parameter>".len()..];
    }
}

/// A call after a trigger, its name and arguments so far known.
fn in_progress(name: String, args: String) -> Scan {
    Scan::Partial(Progress { name: Some(name), args, pending: true, call: true, done: Vec::new() })
}

/// The `properties` of the parameters of the tool named `name`, when the request has it.
pub(super) fn param_schema<'a>(tools: &'a [Value], name: &str) -> Option<&'a Value> {
    tools
        .iter()
        .filter_map(|t| t.get("function").or(Some(t)))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|f| f.get("parameters"))
        .and_then(|p| p.get("properties"))
}

/// Appends `key: value` to an arguments object's text (`n` entries already in it).
pub(super) fn push_arg(args: &mut String, n: usize, key: &str, value: &Value) {
    if n > 0 {
        args.push_str(", ");
    }
    args.push_str(&serde_json::to_string(key).unwrap_or_default());
    args.push_str(": ");
    args.push_str(&serde_json::to_string(value).unwrap_or_default());
}
