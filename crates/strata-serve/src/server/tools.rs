//! What both APIs share for tools and structured output: checking tool definitions,
//! `tool_choice`, assistant calls in the history, and schemas, each error naming its
//! field.

use serde_json::{Value, json};

use super::error::ApiError;
use crate::queue::{ChatTools, ToolChoice};
use strata_engine::grammar::GrammarSpec;

/// Checks tool definitions (`{"type": "function", "function": {"name", "description",
/// "parameters"}}`; a bare function definition, as the legacy `functions` field and some
/// clients send, is wrapped) and returns them in OpenAI's shape.
pub fn tool_definitions(field: &str, list: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(list.len());
    let mut names = std::collections::HashSet::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Some(obj) = t.as_object() else {
            return Err(ApiError::invalid(&at, format!("`{at}` must be an object")));
        };
        let function = match (obj.get("type").and_then(Value::as_str), obj.get("function")) {
            (Some("function"), Some(f)) => f,
            (Some(other), _) if other != "function" => {
                return Err(ApiError::invalid(
                    &format!("{at}.type"),
                    format!("`{at}.type` is `{other}`; only `function` tools are supported"),
                ));
            }
            (_, Some(f)) => f,
            // Bare, or flat as the Responses API sends it (`{"type": "function", "name", ...}`).
            (None | Some("function"), None) if obj.contains_key("name") => t,
            _ => return Err(ApiError::invalid(&format!("{at}.function"), format!("`{at}.function` is required"))),
        };
        let flat = std::ptr::eq(function, t);
        let fat = if flat { at.clone() } else { format!("{at}.function") };
        let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            return Err(ApiError::invalid(&format!("{fat}.name"), format!("`{fat}.name` must be a non-empty string")));
        }
        if !names.insert(name.to_string()) {
            return Err(ApiError::invalid(&format!("{fat}.name"), format!("`{fat}.name`: `{name}` is defined twice")));
        }
        match function.get("parameters") {
            None | Some(Value::Null) => {}
            // Shown to the model, and enforced only when the call is forced (where what
            // llguidance cannot enforce is refused when the job starts, naming
            // `tool_choice`); a schema no JSON Schema reader accepts is refused here.
            Some(schema @ Value::Object(_)) => {
                let pat = format!("{fat}.parameters");
                GrammarSpec::JsonSchema(schema.clone())
                    .check_shown()
                    .map_err(|e| ApiError::invalid(&pat, format!("`{pat}` cannot be used: {e}")))?;
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{fat}.parameters"),
                    format!("`{fat}.parameters` must be a JSON schema object"),
                ));
            }
        }
        let mut function = function.clone();
        if let (true, Some(f)) = (flat, function.as_object_mut()) {
            f.shift_remove("type");
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

/// `tool_choice` (or the legacy `function_call`): `None` when no tools apply.
pub fn tool_choice(
    field: &str,
    tools: Vec<Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ChatTools>, ApiError> {
    let named = |name: &str| -> Result<ToolChoice, ApiError> {
        let offered = tools.iter().any(|t| t["function"]["name"].as_str() == Some(name));
        match offered {
            true => Ok(ToolChoice::Function(name.to_string())),
            false => Err(ApiError::invalid(field, format!("`{field}` names `{name}`, which is not among the tools"))),
        }
    };
    let choice = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => ToolChoice::Auto,
            "required" | "any" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    field,
                    format!("unknown `{field}` `{other}`; expected none, auto, required or a function"),
                ));
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid(field, format!("`{field}` must name a function: {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")))?;
            named(name)?
        }
        Some(_) => return Err(ApiError::invalid(field, format!("`{field}` must be a string or an object"))),
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto => Ok(None),
            _ => Err(ApiError::invalid(field, format!("`{field}` asks for a tool call, but no tools are given"))),
        };
    }
    Ok(Some(ChatTools { tools, choice, parallel: parallel.unwrap_or(true) }))
}

/// An assistant message's `tool_calls` as templates expect them: `{"id", "type":
/// "function", "function": {"name", "arguments": {...}}}`, with arguments given as a JSON
/// string parsed to an object (as transformers' templates read them).
pub fn history_calls(field: &str, calls: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        let at = format!("{field}[{j}]");
        let function =
            c.get("function").ok_or_else(|| ApiError::invalid(&at, format!("`{at}.function` is required")))?;
        let name = function.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(&format!("{at}.function.name"), format!("`{at}.function.name` must be a string"))
        })?;
        let args = match function.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) if s.trim().is_empty() => json!({}),
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
                ApiError::invalid(
                    &format!("{at}.function.arguments"),
                    format!("`{at}.function.arguments` is not JSON: {e}"),
                )
            })?,
            Some(v) => v.clone(),
        };
        let mut call = serde_json::Map::new();
        if let Some(id) = c.get("id") {
            call.insert("id".into(), id.clone());
        }
        call.insert("type".into(), json!("function"));
        call.insert("function".into(), json!({"name": name, "arguments": args}));
        out.push(Value::Object(call));
    }
    Ok(out)
}

/// Checks a grammar before the job is queued, so that a schema or grammar that does not
/// compile is a 400 naming `field`.
pub fn checked(field: &str, spec: GrammarSpec) -> Result<GrammarSpec, ApiError> {
    spec.check().map_err(|e| ApiError::invalid(field, format!("`{field}` cannot be used: {e}")))?;
    Ok(spec)
}

/// OpenAI's `response_format` as a grammar (`None` for `text`).
pub fn response_format(kind: &str, json_schema: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let field = "response_format";
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let Some(js) = json_schema.filter(|js| !js.is_null()) else {
                return Err(ApiError::invalid(
                    "response_format.json_schema",
                    "`response_format.json_schema` is required with type `json_schema`",
                ));
            };
            // `{"name": ..., "schema": ...}`; without `schema`, any JSON (as OpenAI reads it).
            if !js.is_object() {
                return Err(ApiError::invalid(
                    "response_format.json_schema",
                    "`response_format.json_schema` must be an object: {\"name\": ..., \"schema\": {...}}",
                ));
            }
            let schema = match js.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                Some(Value::Bool(true)) | None => json!({}),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "`response_format.json_schema.schema` must be a JSON schema object",
                    ));
                }
            };
            checked("response_format.json_schema.schema", GrammarSpec::JsonSchema(schema)).map(Some)
        }
        other => Err(ApiError::invalid(
            field,
            format!("unknown `{field}` type `{other}`; expected text, json_object or json_schema"),
        )),
    }
}
