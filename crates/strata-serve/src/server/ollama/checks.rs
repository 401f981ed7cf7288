//! Request checks shared by the Ollama routes: the model, `keep_alive`, refused
//! features, and `options` resolved into sampling settings.

use std::sync::Arc;

use serde_json::Value;

use super::Options;
use crate::queue::models::ModelInfo;
use crate::queue::{GenerateJob, KeepAlive, PromptInput, Truncation};
use crate::server::AppState;
use crate::server::error::ApiError;
use crate::server::tools::checked;
use strata_engine::grammar::GrammarSpec;
use strata_engine::reasoning::ThinkMarkers;
use strata_engine::sampler::SamplingParams;
use strata_engine::tokenizer::TextError;
use strata_engine::toolcall::harmony;
use strata_model::sparse::SparseFfn;

pub(super) fn require_model(state: &AppState, name: &str) -> std::result::Result<Arc<ModelInfo>, ApiError> {
    if name.trim().is_empty() {
        return Err(ApiError::invalid("model", "`model` is required"));
    }
    state.model(name)
}

pub(super) fn refuse_non_empty(field: &str, value: Option<&str>, message: &str) -> std::result::Result<(), ApiError> {
    match value {
        Some(v) if !v.is_empty() => Err(ApiError::invalid(field, message)),
        _ => Ok(()),
    }
}

/// Ollama's `format`: `"json"` (any JSON object) or a JSON schema object.
pub(super) fn format_grammar(format: Option<&Value>) -> std::result::Result<Option<GrammarSpec>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(GrammarSpec::JsonObject)),
        Some(schema @ Value::Object(_)) => checked("format", GrammarSpec::JsonSchema(schema.clone())).map(Some),
        Some(_) => Err(ApiError::invalid("format", "`format` must be \"json\" or a JSON schema object")),
    }
}

/// What a request's `think` asks of the chat template and the reply.
#[derive(Debug, Default)]
pub(super) struct Think {
    /// Template variables (`enable_thinking`, `reasoning_effort`).
    pub vars: serde_json::Map<String, Value>,
    /// Return the reasoning apart (`thinking`) from the answer.
    pub split: bool,
}

/// Whether a model thinks: its chat template writes think markers, takes
/// `enable_thinking`, or writes harmony's `analysis` messages (gpt-oss: `think`'s levels
/// become its `reasoning_effort`, and `false` its lowest, `low`).
pub(super) fn thinks(info: &ModelInfo) -> bool {
    info.chat_template
        .as_deref()
        .is_some_and(|t| ThinkMarkers::detect(t).is_some() || t.contains("enable_thinking") || harmony::is_harmony(t))
}

/// Ollama's `think`: `true`/`false`, or `"high"`/`"medium"`/`"low"`. A model that does
/// not think refuses anything but `false`, with Ollama's message. Absent, a thinking
/// model thinks as its template defaults, and its reasoning comes apart.
pub(super) fn think(value: Option<&Value>, info: &ModelInfo, model: &str) -> std::result::Result<Think, ApiError> {
    let capable = thinks(info);
    let refuse = || ApiError::invalid("think", format!("\"{model}\" does not support thinking"));
    let mut out = Think { vars: serde_json::Map::new(), split: capable };
    match value {
        None | Some(Value::Null) => {}
        Some(Value::Bool(false)) => {
            if capable {
                out.vars.insert("enable_thinking".into(), Value::Bool(false));
            }
        }
        Some(Value::Bool(true)) if capable => {
            out.vars.insert("enable_thinking".into(), Value::Bool(true));
        }
        Some(Value::String(level)) if capable && matches!(level.as_str(), "high" | "medium" | "low") => {
            out.vars.insert("enable_thinking".into(), Value::Bool(true));
            out.vars.insert("reasoning_effort".into(), Value::String(level.clone()));
        }
        Some(Value::Bool(true)) | Some(Value::String(_)) if !capable => return Err(refuse()),
        Some(_) => {
            return Err(ApiError::invalid("think", "`think` must be true, false, \"high\", \"medium\" or \"low\""));
        }
    }
    Ok(out)
}

pub(super) fn keep_alive(value: Option<&Value>) -> std::result::Result<Option<KeepAlive>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => KeepAlive::parse(v)
            .map(Some)
            .map_err(|e| ApiError::invalid("keep_alive", format!("invalid `keep_alive`: {e}"))),
    }
}

/// `options` resolved against the defaults, as the queue takes them.
#[derive(Debug)]
pub(super) struct Resolved {
    sampling: SamplingParams,
    max_tokens: Option<usize>,
    stop: Vec<String>,
    num_ctx: Option<usize>,
    truncate: Option<Truncation>,
    sparse_ffn: Option<(SparseFfn, &'static str)>,
}

impl Resolved {
    /// The context the request asks for (`num_ctx`, capped at the model's).
    pub(super) fn num_ctx(&self) -> Option<usize> {
        self.num_ctx
    }

    pub(super) fn job(
        self,
        model: &str,
        prompt: PromptInput,
        context: Vec<u32>,
        keep_alive: Option<KeepAlive>,
    ) -> GenerateJob {
        GenerateJob {
            model: model.to_string(),
            prompt,
            context,
            max_tokens: self.max_tokens,
            sampling: self.sampling,
            stop: self.stop,
            top_logprobs: 0,
            num_ctx: self.num_ctx,
            keep_alive,
            tools: None,
            grammar: None,
            grammar_param: "grammar",
            messages_param: "messages",
            count_only: false,
            template_vars: serde_json::Map::new(),
            split_reasoning: false,
            sparse_ffn: self.sparse_ffn,
            truncate: self.truncate,
            speculative: Default::default(),
        }
    }
}

/// Ollama's default sampling, overridden by the model's `generation_config.json`.
pub(super) fn model_defaults(info: &ModelInfo) -> SamplingParams {
    let mut p = ollama_defaults();
    for (key, value) in generation_parameters(info) {
        let v = value as f32;
        match key {
            "temperature" => p.temperature = v,
            "top_k" => p.top_k = value.max(0.0) as usize,
            "top_p" => p.top_p = v,
            "min_p" => p.min_p = v,
            "repeat_penalty" => p.repeat_penalty = v,
            _ => {}
        }
    }
    p
}

/// Ollama's default sampling.
fn ollama_defaults() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.0,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: None,
        logit_bias: Vec::new(),
    }
}

/// The sampling settings `generation_config.json` gives, under Ollama's names.
pub(super) fn generation_parameters(info: &ModelInfo) -> Vec<(&'static str, f64)> {
    const KEYS: [(&str, &str); 5] = [
        ("temperature", "temperature"),
        ("top_k", "top_k"),
        ("top_p", "top_p"),
        ("min_p", "min_p"),
        ("repetition_penalty", "repeat_penalty"),
    ];
    let Some(gc) = info.generation_config.as_ref() else { return Vec::new() };
    KEYS.iter().filter_map(|(hf, ollama)| Some((*ollama, gc.get(*hf)?.as_f64().filter(|v| v.is_finite())?))).collect()
}

pub(super) fn resolve_options(options: Option<Options>, info: &ModelInfo) -> std::result::Result<Resolved, ApiError> {
    // A Modelfile's `parameters` (checked when the model was created) under the request's.
    let modelfile = info
        .modelfile
        .as_ref()
        .and_then(|m| serde_json::from_value::<Options>(Value::Object(m.parameters.clone())).ok())
        .unwrap_or_default();
    let o = options.unwrap_or_default().or(modelfile);
    resolve(o, model_defaults(info), info.context_length, "options")
}

/// A Modelfile's `parameters` (`POST /api/create`), checked as a request's `options` are,
/// so that a bad value is refused where it is given rather than blamed on every request.
pub(super) fn check_parameters(parameters: Options) -> std::result::Result<(), ApiError> {
    resolve(parameters, ollama_defaults(), usize::MAX, "parameters").map(|_| ())
}

/// `o` over the defaults `d`, for a model with `context_length` tokens; errors name
/// `{prefix}.{field}`.
fn resolve(
    o: Options,
    d: SamplingParams,
    context_length: usize,
    prefix: &str,
) -> std::result::Result<Resolved, ApiError> {
    let bad =
        |field: &str, msg: &str| ApiError::invalid(&format!("{prefix}.{field}"), format!("`{prefix}.{field}` {msg}"));
    let num_ctx = match o.num_ctx {
        None => None,
        Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX).min(context_length.max(1))),
        Some(_) => return Err(bad("num_ctx", "must be at least 1")),
    };
    let max_tokens = match o.num_predict {
        None | Some(-2..=0) => None,
        Some(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(_) => return Err(bad("num_predict", "must be positive, or -1 (until the context is full)")),
    };
    let repeat_last_n = match o.repeat_last_n {
        None => d.repeat_last_n,
        Some(-1) => num_ctx.unwrap_or(context_length),
        Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(_) => return Err(bad("repeat_last_n", "must be -1 (the whole context), 0 (off) or positive")),
    };
    let sampling = SamplingParams {
        temperature: o.temperature.unwrap_or(d.temperature),
        top_k: o.top_k.map_or(d.top_k, |k| usize::try_from(k).unwrap_or(0)),
        top_p: o.top_p.unwrap_or(d.top_p),
        min_p: o.min_p.unwrap_or(d.min_p),
        repeat_penalty: o.repeat_penalty.unwrap_or(d.repeat_penalty),
        repeat_last_n,
        presence_penalty: o.presence_penalty.unwrap_or(d.presence_penalty),
        frequency_penalty: o.frequency_penalty.unwrap_or(d.frequency_penalty),
        seed: o.seed.and_then(|s| u64::try_from(s).ok()),
        logit_bias: Vec::new(),
    };
    sampling.validate().map_err(|e| match e {
        TextError::InvalidSampling { field, msg } => bad(field, &msg),
        other => ApiError::invalid(prefix, other.to_string()),
    })?;
    let stop = o.stop.unwrap_or_default().into_iter().filter(|s| !s.is_empty()).collect();
    let sparse_ffn = match o.sparse_ffn.as_deref().map(SparseFfn::parse) {
        None => None,
        Some(Ok(s)) => Some((s, "options.sparse_ffn")),
        Some(Err(e)) => return Err(bad("sparse_ffn", &e)),
    };
    let truncate = match o.num_keep {
        None => Some(Truncation::default()),
        Some(-1) => None,
        Some(n) if n >= 0 => Some(Truncation { num_keep: usize::try_from(n).unwrap_or(usize::MAX) }),
        Some(_) => return Err(bad("num_keep", "must be -1 (keep the whole prompt) or at least 0")),
    };
    Ok(Resolved { sampling, max_tokens, stop, num_ctx, truncate, sparse_ffn })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ModelInfo {
        ModelInfo::read("strata-demo", "strata-demo").expect("the demo model")
    }

    #[test]
    fn options_resolve_with_ollama_defaults() {
        let r = resolve_options(None, &info()).unwrap();
        assert_eq!(r.sampling.temperature, 0.8);
        assert_eq!((r.sampling.top_k, r.sampling.top_p, r.sampling.repeat_penalty), (40, 0.9, 1.1));
        assert_eq!((r.max_tokens, r.num_ctx), (None, None));
        let o: Options = serde_json::from_value(serde_json::json!({
            "num_predict": 4, "top_k": 5.0, "seed": -1, "stop": "x", "repeat_last_n": -1,
            "num_ctx": 1_000_000_000, "mirostat": 2
        }))
        .unwrap();
        let r = resolve_options(Some(o), &info()).unwrap();
        assert_eq!(r.max_tokens, Some(4));
        assert_eq!(r.sampling.top_k, 5);
        assert_eq!(r.sampling.seed, None);
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert_eq!(r.num_ctx, Some(info().context_length), "num_ctx is capped at the model's");
        assert_eq!(r.sampling.repeat_last_n, info().context_length);
        for n in [-1, -2, 0] {
            let o: Options = serde_json::from_value(serde_json::json!({"num_predict": n})).unwrap();
            assert_eq!(resolve_options(Some(o), &info()).unwrap().max_tokens, None);
        }
    }

    #[test]
    fn bad_options_name_the_field() {
        let o: Options = serde_json::from_value(serde_json::json!({"top_p": 0.0})).unwrap();
        let e = resolve_options(Some(o), &info()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.top_p"));
        let o: Options = serde_json::from_value(serde_json::json!({"num_predict": -3})).unwrap();
        assert_eq!(resolve_options(Some(o), &info()).unwrap_err().param.as_deref(), Some("options.num_predict"));
        assert!(serde_json::from_value::<Options>(serde_json::json!({"top_k": 1.5})).is_err());
    }
}
