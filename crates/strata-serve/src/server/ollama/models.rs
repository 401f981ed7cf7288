//! The model routes: `/api/tags`, `/api/show`, `/api/ps`, `/api/version`, `/api/copy`,
//! `/api/delete`. The models are those the server was started with, their `/api/copy`
//! aliases, and the model store's (see [`crate::queue::models::Registry`]).

use std::time::{Duration, SystemTime};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::Value;

use super::checks::{generation_parameters, require_model, thinks};
use super::{
    CopyRequest, ModelDetails, ModelRef, OLLAMA_VERSION, PsModel, PsResponse, Result, ShowResponse, TagModel,
    TagsResponse, VersionResponse, outcome, rfc3339,
};
use crate::queue::Work;
use crate::queue::models::{Listing, ModelInfo, canonical, parameter_size};
use crate::server::error::{ApiError, OllamaErrorBody};
use crate::server::{AppState, parse_json};

/// Lists the models this server offers: those it was started with and the store's.
#[utoipa::path(get, path = "/api/tags", tag = "ollama",
    responses((status = 200, description = "The models", body = TagsResponse)))]
pub(crate) async fn tags(State(state): State<AppState>) -> Result<Json<TagsResponse>> {
    let registry = state.registry.clone();
    let listed = tokio::task::spawn_blocking(move || registry.list()).await.map_err(internal)?;
    let models = listed
        .iter()
        .map(|m| TagModel {
            name: canonical(&m.name),
            model: canonical(&m.name),
            modified_at: rfc3339(m.modified_at),
            size: m.size_bytes,
            digest: m.digest.clone(),
            details: details(m),
        })
        .collect();
    Ok(Json(TagsResponse { models }))
}

fn internal(e: tokio::task::JoinError) -> ApiError {
    ApiError::new(crate::server::error::ErrorKind::Internal, format!("internal error: {e}"))
}

/// Describes a model: its template, parameters and architecture.
#[utoipa::path(post, path = "/api/show", tag = "ollama",
    request_body(content = ModelRef, content_type = "application/json"),
    responses(
        (status = 200, description = "The model", body = ShowResponse),
        (status = 400, description = "No model named", body = OllamaErrorBody),
        (status = 404, description = "Unknown model", body = OllamaErrorBody)))]
pub(crate) async fn show(State(state): State<AppState>, body: Bytes) -> Result<Json<ShowResponse>> {
    let req: ModelRef = parse_json(&body)?;
    let name = named(&req)?.to_string();
    let sparse_ffn = state.config.sparse_ffn;
    let loaded = state.status.loaded.clone();
    // A store model is read from its files the first time.
    let info = tokio::task::spawn_blocking(move || require_model(&state, &name)).await.map_err(internal)??;
    // Loaded, its context is known: what its requests get unless they say `num_ctx`.
    let key = canonical(&info.name);
    let context = loaded.lock().expect("status lock").iter().find(|m| m.name == key).map(|m| m.context_length);
    Ok(Json(describe(&info, sparse_ffn, context)))
}

/// Lists the models in memory.
#[utoipa::path(get, path = "/api/ps", tag = "ollama",
    responses((status = 200, description = "The loaded models", body = PsResponse)))]
pub(crate) async fn ps(State(state): State<AppState>) -> Json<PsResponse> {
    let loaded = state.status.loaded.lock().expect("status lock").clone();
    // Kept forever: a date far enough ahead that clients show "Forever".
    let forever = SystemTime::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let models = loaded
        .into_iter()
        .map(|m| {
            let info = state.registry.get(&m.name);
            PsModel {
                model: m.name.clone(),
                name: m.name,
                size: m.size_bytes,
                digest: info.as_ref().map(|i| i.digest.clone()).unwrap_or_default(),
                details: info.as_deref().map(|i| details(&Listing::of(i))).unwrap_or_default(),
                expires_at: rfc3339(m.expires_at.unwrap_or(forever)),
                size_vram: m.size_vram,
                device: m.device,
                context_length: m.context_length,
                residency: m.sched.summary(),
                batching: m.batching,
                speculative: m.speculation.status(),
            }
        })
        .collect();
    Json(PsResponse { models })
}

/// The Ollama version this server is compatible with.
#[utoipa::path(get, path = "/api/version", tag = "ollama",
    responses((status = 200, description = "A dotted version", body = VersionResponse,
        example = json!({"version": OLLAMA_VERSION}))))]
pub(crate) async fn version() -> Json<VersionResponse> {
    Json(VersionResponse { version: OLLAMA_VERSION.to_string() })
}

/// Copies a model: within the store (hard links, replacing `destination` as Ollama
/// does), or, for a model the server was started with, as a name that lasts until the
/// server stops.
#[utoipa::path(post, path = "/api/copy", tag = "ollama",
    request_body(content = CopyRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Copied (empty body)"),
        (status = 400, description = "Invalid request, or a `destination` that cannot be written \
            (an invalid store name, a name given to `strata serve`)", body = OllamaErrorBody),
        (status = 404, description = "Unknown source model", body = OllamaErrorBody)))]
pub(crate) async fn copy(State(state): State<AppState>, body: Bytes) -> Result<StatusCode> {
    let req: CopyRequest = parse_json(&body)?;
    let (source, destination) = (req.source.trim().to_string(), req.destination.trim().to_string());
    if destination.is_empty() {
        return Err(ApiError::invalid("destination", "`destination` is required").into());
    }
    if source.is_empty() {
        return Err(ApiError::invalid("source", "`source` is required").into());
    }
    let registry = state.registry.clone();
    let dst = destination.clone();
    tokio::task::spawn_blocking(move || registry.copy(&source, &dst)).await.map_err(internal)?.map_err(|e| {
        match ApiError::from(e) {
            e if e.param.as_deref() == Some("model") => e.with_param("source"),
            e => e,
        }
    })?;
    // A replaced destination that is loaded would keep answering with the old weights.
    let key = canonical(&destination);
    if state.status.loaded.lock().expect("status lock").iter().any(|m| m.name == key)
        && let Err(e) = outcome(&state, Work::Unload { model: destination }).await
    {
        tracing::warn!(model = %key, error = %e.message, "unloading a replaced model failed");
    }
    Ok(StatusCode::OK)
}

/// Deletes a store model (its files), or forgets an `/api/copy` name of a model the
/// server was started with; either is unloaded first. The models given to `strata serve`
/// themselves cannot be deleted (400).
#[utoipa::path(delete, path = "/api/delete", tag = "ollama",
    request_body(content = ModelRef, content_type = "application/json"),
    responses(
        (status = 200, description = "Deleted (empty body)"),
        (status = 400, description = "No model named, or a model given to `strata serve`", body = OllamaErrorBody),
        (status = 404, description = "Unknown model", body = OllamaErrorBody)))]
pub(crate) async fn delete_model(State(state): State<AppState>, body: Bytes) -> Result<StatusCode> {
    let req: ModelRef = parse_json(&body)?;
    let name = named(&req)?.to_string();
    let registry = state.registry.clone();
    let lookup = name.clone();
    // Refused before anything is unloaded.
    tokio::task::spawn_blocking(move || registry.check_removable(&lookup))
        .await
        .map_err(internal)?
        .map_err(ApiError::from)?;
    let key = canonical(&name);
    let loaded = state.status.loaded.lock().expect("status lock").iter().any(|m| m.name == key);
    if loaded {
        // Best effort: a model that cannot be unloaded now still expires with its keep-alive.
        if let Err(e) = outcome(&state, Work::Unload { model: name.to_string() }).await {
            tracing::warn!(model = %key, error = %e.message, "unloading a deleted model failed");
        }
    }
    let registry = state.registry.clone();
    tokio::task::spawn_blocking(move || registry.remove(&name)).await.map_err(internal)?.map_err(ApiError::from)?;
    Ok(StatusCode::OK)
}

/// `model`, or its alias `name`.
fn named(req: &ModelRef) -> std::result::Result<&str, ApiError> {
    [req.model.as_deref(), req.name.as_deref()]
        .into_iter()
        .flatten()
        .find(|s| !s.trim().is_empty())
        .ok_or_else(|| ApiError::invalid("model", "`model` is required"))
}

fn details(m: &Listing) -> ModelDetails {
    ModelDetails {
        parent_model: String::new(),
        format: m.format.clone(),
        family: m.family.clone(),
        families: vec![m.family.clone()],
        parameter_size: parameter_size(m.parameters),
        quantization_level: m.quantization.clone(),
    }
}

/// What a model can do, as Ollama names it: every model completes and embeds; a chat
/// model takes tools (through its template's own format, or Strata's generic one);
/// `thinking` when its template thinks; `insert` (a `suffix`) when its vocabulary has
/// the fill-in-the-middle tokens.
fn capabilities(info: &ModelInfo) -> Vec<String> {
    let mut caps = vec!["completion".to_string()];
    if info.fills_in_middle {
        caps.push("insert".into());
    }
    if info.chat_template.is_some() {
        caps.push("tools".into());
    }
    if thinks(info) {
        caps.push("thinking".into());
    }
    caps.push("embedding".into());
    caps
}

/// `context`: the context it runs with, when loaded (a `num_ctx` parameter line unless
/// its Modelfile sets one).
fn describe(info: &ModelInfo, sparse_ffn: strata_model::sparse::SparseFfn, context: Option<usize>) -> ShowResponse {
    let mut parameters: String = generation_parameters(info).iter().map(|(k, v)| format!("{k:<30} {v}\n")).collect();
    let modelfile = info.modelfile.clone().unwrap_or_default();
    for (k, v) in &modelfile.parameters {
        let values: Vec<String> = match v {
            Value::Array(items) => items.iter().map(|x| x.to_string()).collect(),
            other => vec![other.to_string()],
        };
        for v in values {
            parameters.push_str(&format!("{k:<30} {v}\n"));
        }
    }
    if let Some(n) = context.filter(|_| !modelfile.parameters.contains_key("num_ctx")) {
        parameters.push_str(&format!("{:<30} {n}\n", "num_ctx"));
    }
    let template = info.chat_template.clone().unwrap_or_default();
    let mut text = format!(
        "# Modelfile generated by \"strata show\"\n# To build a new Modelfile based on this, replace FROM with:\n# FROM {}\n\nFROM {}\n",
        canonical(&info.name),
        info.spec
    );
    if !template.is_empty() {
        text.push_str(&format!("TEMPLATE \"\"\"{template}\"\"\"\n"));
    }
    if let Some(system) = &modelfile.system {
        text.push_str(&format!("SYSTEM \"\"\"{system}\"\"\"\n"));
    }
    for line in parameters.lines() {
        text.push_str(&format!("PARAMETER {line}\n"));
    }
    for m in &modelfile.messages {
        let (role, content) = (m["role"].as_str().unwrap_or_default(), m["content"].as_str().unwrap_or_default());
        text.push_str(&format!("MESSAGE {role} \"\"\"{content}\"\"\"\n"));
    }
    let arch = &info.arch;
    let mut model_info = serde_json::Map::new();
    let mut put = |k: String, v: Value| {
        model_info.insert(k, v);
    };
    put("general.architecture".into(), arch.clone().into());
    put("general.parameter_count".into(), info.parameters.into());
    put(format!("{arch}.context_length"), info.context_length.into());
    put(format!("{arch}.embedding_length"), info.embedding_length.into());
    put(format!("{arch}.block_count"), info.n_layers.into());
    put(format!("{arch}.attention.head_count"), info.n_heads.into());
    put(format!("{arch}.attention.head_count_kv"), info.n_kv_heads.into());
    put(format!("{arch}.vocab_size"), info.vocab_size.into());
    // Stored with neuron-group bundles: how requests run its FFNs unless they say.
    if let Some(g) = info.neuron_group {
        put("strata.sparse_ffn".into(), sparse_ffn.to_string().into());
        put("strata.sparse_ffn.group_size".into(), g.into());
        put("strata.sparse_ffn.groups_per_layer".into(), (info.intermediate_size / g.max(1)).into());
    }
    ShowResponse {
        license: modelfile.license.clone().unwrap_or_default(),
        modelfile: text,
        parameters,
        template,
        details: details(&Listing::of(info)),
        model_info,
        capabilities: capabilities(info),
        modified_at: rfc3339(info.modified_at),
    }
}
