//! The scanners of the formats whose calls sit between marker tokens: DeepSeek's and
//! Kimi-K2's sections of calls with JSON arguments, and GLM-4.5's `<tool_call>` with one
//! `<arg_key>`/`<arg_value>` pair per argument.

use serde_json::Value;

use super::scan::{Progress, Scan, json_value_len, param_schema, push_arg};

/// The markers of a sectioned format, after the section's opening one (the trigger).
pub(super) struct Markers {
    pub end: &'static str,
    pub call_begin: &'static str,
    pub sep: &'static str,
    pub call_end: &'static str,
    pub kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `NAME<｜tool▁sep｜>{args}` (V3.1), or `function<｜tool▁sep｜>NAME` then the
    /// arguments in a json code block (R1).
    DeepSeek,
    /// `functions.NAME:INDEX<|tool_call_argument_begin|>{args}`.
    Kimi,
}

pub(super) const DEEPSEEK: Markers = Markers {
    end: "<｜tool▁calls▁end｜>",
    call_begin: "<｜tool▁call▁begin｜>",
    sep: "<｜tool▁sep｜>",
    call_end: "<｜tool▁call▁end｜>",
    kind: Kind::DeepSeek,
};

pub(super) const KIMI: Markers = Markers {
    end: "<|tool_calls_section_end|>",
    call_begin: "<|tool_call_begin|>",
    sep: "<|tool_call_argument_begin|>",
    call_end: "<|tool_call_end|>",
    kind: Kind::Kimi,
};

/// Whether `text` could still grow into `pat` (a proper prefix of it, or empty).
fn may_become(text: &str, pat: &str) -> bool {
    text.len() < pat.len() && pat.starts_with(text)
}

/// The calls of one section, after its opening marker. At the end of the text (`eof`), a
/// call whose arguments are complete stands without its closing markers.
pub(super) fn scan_sections(buf: &str, m: &Markers, eof: bool) -> Scan {
    let mut done: Vec<(String, String)> = Vec::new();
    let mut rest = buf;
    let partial = |done: Vec<(String, String)>, name: Option<String>, args: String, pending: bool| {
        Scan::Partial(Progress { done, name, args, pending, call: true })
    };
    loop {
        let t = rest.trim_start();
        if let Some(after) = t.strip_prefix(m.end) {
            return Scan::Done { calls: done, used: buf.len() - after.len() };
        }
        if may_become(t, m.end) || may_become(t, m.call_begin) {
            if eof && !done.is_empty() {
                return Scan::Done { calls: done, used: buf.len() };
            }
            return partial(done, None, String::new(), t.is_empty() || may_become(t, m.call_begin));
        }
        let Some(after_begin) = t.strip_prefix(m.call_begin) else {
            // Text after the calls without the closing marker: the calls stand.
            return match done.is_empty() {
                true => Scan::Invalid,
                false => Scan::Done { calls: done, used: buf.len() - rest.len() },
            };
        };
        let Some(sep_at) = after_begin.find(m.sep) else {
            if after_begin.contains('\n') && m.kind == Kind::Kimi {
                return Scan::Invalid;
            }
            return partial(done, None, String::new(), true);
        };
        let head = after_begin[..sep_at].trim();
        let mut body = &after_begin[sep_at + m.sep.len()..];
        let mut fenced = false;
        let name = match (m.kind, head) {
            (Kind::DeepSeek, "function") => {
                // R1: the name on its own line, then the arguments in a json code block.
                let Some(nl) = body.find('\n') else { return partial(done, None, String::new(), true) };
                let name = body[..nl].trim().to_string();
                let after = &body[nl + 1..];
                match after.strip_prefix("```json\n").or_else(|| after.strip_prefix("```json")) {
                    Some(b) => {
                        body = b;
                        fenced = true;
                    }
                    None if may_become(after, "```json\n") => return partial(done, Some(name), String::new(), true),
                    None => return Scan::Invalid,
                }
                name
            }
            (Kind::DeepSeek, name) => name.to_string(),
            (Kind::Kimi, id) => {
                let id = id.strip_prefix("functions.").unwrap_or(id);
                id.rsplit_once(':').map_or(id, |(name, _)| name).to_string()
            }
        };
        if name.is_empty() || name.contains(['<', '\n']) {
            return Scan::Invalid;
        }
        let json = body.trim_start();
        if !json.is_empty() && !json.starts_with('{') {
            return Scan::Invalid;
        }
        let n = match json_value_len(json) {
            Err(()) => return Scan::Invalid,
            // The name goes out with the arguments' first byte, once they look like an object.
            Ok(None) if json.is_empty() => return partial(done, None, String::new(), true),
            Ok(None) => return partial(done, Some(name), json.to_string(), true),
            Ok(Some(n)) => n,
        };
        let args = &json[..n];
        if !matches!(serde_json::from_str::<Value>(args), Ok(Value::Object(_))) {
            return Scan::Invalid;
        }
        let mut after = json[n..].trim_start();
        if fenced {
            match after.strip_prefix("```") {
                Some(a) => after = a.trim_start(),
                None if eof && may_become(after, "```") => {
                    done.push((name, args.to_string()));
                    return Scan::Done { calls: done, used: buf.len() };
                }
                None if may_become(after, "```") => return partial(done, Some(name), args.to_string(), true),
                None => return Scan::Invalid,
            }
        }
        match after.strip_prefix(m.call_end) {
            Some(a) => {
                done.push((name, args.to_string()));
                rest = a;
            }
            None if eof && may_become(after, m.call_end) => {
                done.push((name, args.to_string()));
                return Scan::Done { calls: done, used: buf.len() };
            }
            None if may_become(after, m.call_end) => return partial(done, Some(name), args.to_string(), true),
            None => return Scan::Invalid,
        }
    }
}

/// One GLM-4.5 call after `<tool_call>`: `NAME`, then `<arg_key>K</arg_key>` and
/// `<arg_value>V</arg_value>` per argument (a value as it is for a string parameter, JSON
/// otherwise, as its template writes them), then `</tool_call>`.
pub(super) fn scan_glm(buf: &str, tools: &[Value], eof: bool) -> Scan {
    const END: &str = "</tool_call>";
    let body = buf.trim_start();
    let name_end = [body.find('\n'), body.find("<arg_key>"), body.find(END)].into_iter().flatten().min();
    let Some(name_end) = name_end else {
        // The name so far, perhaps followed by the start of a marker.
        let tail = body.find('<').map_or("", |lt| &body[lt..]);
        return match tail.is_empty() || may_become(tail, "<arg_key>") || may_become(tail, END) {
            true => Scan::Partial(Progress { pending: true, call: true, ..Progress::default() }),
            false => Scan::Invalid,
        };
    };
    let name = body[..name_end].trim().to_string();
    if name.is_empty() || name.contains(['<', '>', '{']) {
        return Scan::Invalid;
    }
    let schema = param_schema(tools, &name);
    let in_progress = |args: String| {
        Scan::Partial(Progress { name: Some(name.clone()), args, pending: true, call: true, ..Progress::default() })
    };
    let mut args = String::from("{");
    let mut rest = &body[name_end..];
    let mut n = 0;
    loop {
        let t = rest.trim_start();
        if let Some(after) = t.strip_prefix(END) {
            args.push('}');
            return Scan::Done { calls: vec![(name, args)], used: buf.len() - after.len() };
        }
        if may_become(t, END) || may_become(t, "<arg_key>") {
            if eof && n > 0 && may_become(t, END) {
                args.push('}');
                return Scan::Done { calls: vec![(name, args)], used: buf.len() };
            }
            return in_progress(args);
        }
        let Some(p) = t.strip_prefix("<arg_key>") else { return Scan::Invalid };
        let Some(key_end) = p.find("</arg_key>") else { return in_progress(args) };
        let key = p[..key_end].trim();
        let v = p[key_end + "</arg_key>".len()..].trim_start();
        if may_become(v, "<arg_value>") {
            return in_progress(args);
        }
        let Some(v) = v.strip_prefix("<arg_value>") else { return Scan::Invalid };
        let Some(val_end) = v.find("</arg_value>") else { return in_progress(args) };
        let raw = &v[..val_end];
        let ty = schema.and_then(|s| s.get(key)).and_then(|s| s.get("type")).and_then(Value::as_str);
        let value = match ty {
            Some("string") => Value::String(raw.to_string()),
            _ => serde_json::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.to_string())),
        };
        push_arg(&mut args, n, key, &value);
        n += 1;
        rest = &v[val_end + "</arg_value>".len()..];
    }
}
