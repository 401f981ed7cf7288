//! `POST /api/create` and `/api/blobs/{digest}`: models made from an uploaded GGUF blob or
//! from another model, with a Modelfile's settings (template, system message, default
//! parameters, leading messages), kept in the model store.

use std::collections::BTreeMap;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use sha2::Digest;
use utoipa::ToSchema;

use super::{Options, Result, outcome};
use crate::queue::Work;
use crate::queue::models::{CreateFrom, canonical};
use crate::server::error::{ApiError, ErrorKind, OllamaErrorBody};
use crate::server::{AppState, parse_json};
use crate::store::Modelfile;
use strata_engine::template::{ChatMessage, ChatTemplate};
use strata_engine::tokenizer::TextError;

/// `POST /api/create`
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::CreateRequest, example = json!({"model": "terse", "from": "llama3", "system": "Answer in one sentence.", "parameters": {"temperature": 0.2}}))]
pub struct CreateRequest {
    /// The new model's name.
    pub model: Option<String>,
    /// Older clients' name for `model`.
    pub name: Option<String>,
    /// A model to start from: one in the store or one the server was started with.
    pub from: Option<String>,
    /// The weights: one GGUF file, `{"file.gguf": "sha256:<hex>"}`, uploaded first with
    /// `POST /api/blobs/sha256:<hex>`.
    pub files: Option<BTreeMap<String, String>>,
    /// LoRA adapters: not supported (must be empty).
    #[schema(value_type = Option<Object>)]
    pub adapters: Option<BTreeMap<String, String>>,
    /// A Jinja chat template (as in `tokenizer_config.json`) in place of the model's.
    /// Ollama's Go templates are refused.
    pub template: Option<String>,
    /// The system message of conversations that bring none.
    pub system: Option<String>,
    /// Default `options`, by Ollama's names.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<serde_json::Map<String, Value>>,
    /// Messages put before every conversation.
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<Vec<Value>>,
    /// A license text, or several.
    #[schema(value_type = Option<Object>)]
    pub license: Option<Value>,
    /// Quantizing on create: not supported (convert with `strata convert` or pull with
    /// `quantize`).
    pub quantize: Option<String>,
    /// A Modelfile as text: not supported (send its fields).
    pub modelfile: Option<String>,
    pub stream: Option<bool>,
}

/// The digest in a blob route: `sha256:<64 hex digits>`, as lower-case hex.
fn blob_hex(digest: &str) -> std::result::Result<String, ApiError> {
    let hex = digest.strip_prefix("sha256:").or_else(|| digest.strip_prefix("sha256-")).unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid("digest", format!("`{digest}` is not a digest (`sha256:` and 64 hex digits)")));
    }
    Ok(hex.to_ascii_lowercase())
}

fn no_store() -> ApiError {
    ApiError::invalid("model", "this server was started without a model store")
}

/// Whether a blob is here.
#[utoipa::path(head, path = "/api/blobs/{digest}", tag = "ollama",
    params(("digest" = String, Path, description = "`sha256:<hex>`")),
    responses((status = 200, description = "The blob is here"), (status = 404, description = "It is not"),
        (status = 400, description = "Not a digest", body = OllamaErrorBody)))]
pub(crate) async fn blob_head(State(state): State<AppState>, Path(digest): Path<String>) -> Result<StatusCode> {
    let hex = blob_hex(&digest)?;
    let store = state.registry.store().ok_or_else(no_store)?;
    Ok(match store.blob_path(&hex).is_file() {
        true => StatusCode::OK,
        false => StatusCode::NOT_FOUND,
    })
}

/// Uploads a blob (a GGUF file for `/api/create`); its SHA-256 must be the digest.
#[utoipa::path(post, path = "/api/blobs/{digest}", tag = "ollama",
    params(("digest" = String, Path, description = "`sha256:<hex>` of the body")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, description = "Stored"),
        (status = 400, description = "Not a digest, or the body's SHA-256 differs", body = OllamaErrorBody),
        (status = 507, description = "The disk (or the quota) is full; names the file", body = OllamaErrorBody)))]
pub(crate) async fn blob_post(
    State(state): State<AppState>,
    Path(digest): Path<String>,
    body: Body,
) -> Result<StatusCode> {
    let hex = blob_hex(&digest)?;
    let store = state.registry.store().cloned().ok_or_else(no_store)?;
    let partial = store.blob_partial().map_err(|e| match e {
        crate::store::StoreError::Io { path, err } => write_error(&path, &err),
        other => ApiError::new(ErrorKind::Internal, other.to_string()),
    })?;
    // A writer thread takes the chunks (bounded: the upload waits for the disk), hashing
    // as it writes; the partial file goes away unless it is renamed into place.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let writer = tokio::task::spawn_blocking(move || {
        let got = write_chunks(&mut || rx.blocking_recv(), &mut partial.file());
        (partial, got)
    });
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid("body", format!("reading the upload: {e}")))?;
        if tx.send(chunk).await.is_err() {
            break;
        }
    }
    drop(tx);
    let (partial, got) =
        writer.await.map_err(|e| ApiError::new(ErrorKind::Internal, format!("internal error: {e}")))?;
    let got = got.map_err(|e| write_error(partial.path(), &e))?;
    if got != hex {
        return Err(ApiError::invalid("digest", format!("the body's digest is sha256:{got}, not sha256:{hex}")).into());
    }
    let to = store.blob_path(&hex);
    tokio::task::spawn_blocking(move || {
        let from = partial.path().to_owned();
        partial.persist(&to).map_err(|e| write_error(&from, &e))
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("internal error: {e}")))??;
    Ok(StatusCode::CREATED)
}

/// Writes every chunk `next` gives to `out`; returns their SHA-256 in hex. It stops at
/// the first failed write (the upload's remaining chunks are then dropped unread).
fn write_chunks(next: &mut dyn FnMut() -> Option<Bytes>, out: &mut dyn std::io::Write) -> std::io::Result<String> {
    let mut hasher = sha2::Sha256::new();
    while let Some(chunk) = next() {
        hasher.update(&chunk);
        out.write_all(&chunk)?;
    }
    out.flush()?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A failed write of the blob file `path`: 507 naming the file when the disk or the
/// quota is full, else 500.
fn write_error(path: &std::path::Path, e: &std::io::Error) -> ApiError {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => ApiError::new(
            ErrorKind::InsufficientStorage,
            format!("writing the blob {}: {e}; free space there and upload it again", path.display()),
        ),
        _ => ApiError::new(ErrorKind::Internal, format!("writing the blob {}: {e}", path.display())),
    }
}

/// A Go template (Ollama's `{{ .Prompt }}` syntax) rather than Jinja.
fn is_go_template(t: &str) -> bool {
    let go = ["{{ .", "{{- .", "{{ if .", "{{- if .", "{{ range .", "{{- range ."];
    go.iter().any(|m| t.contains(m)) && !t.contains("{%")
}

/// The request's Modelfile, checked.
fn modelfile(req: &CreateRequest) -> std::result::Result<Modelfile, ApiError> {
    let mut m = Modelfile::default();
    if let Some(t) = req.template.as_deref().filter(|t| !t.is_empty()) {
        if is_go_template(t) {
            return Err(ApiError::invalid(
                "template",
                "`template` is an Ollama Go template; Strata renders Jinja chat templates (as in \
                 tokenizer_config.json), so give the model's Jinja template",
            ));
        }
        let template =
            ChatTemplate::new(t, None, None).map_err(|e| ApiError::invalid("template", format!("`template`: {e}")))?;
        // It must render a plain conversation (it may refuse one with `raise_exception`):
        // what fails here would fail every request to the model.
        let hello = [ChatMessage::new("user", "Hello")];
        if let Err(e @ TextError::TemplateRender(_)) = template.render(&hello, true) {
            return Err(ApiError::invalid("template", format!("`template` does not render a one-message chat: {e}")));
        }
        m.template = Some(t.to_string());
    }
    m.system = req.system.clone().filter(|s| !s.is_empty());
    if let Some(p) = &req.parameters {
        let parameters = serde_json::from_value::<Options>(Value::Object(p.clone()))
            .map_err(|e| ApiError::invalid("parameters", format!("`parameters`: {e}")))?;
        super::checks::check_parameters(parameters)?;
        m.parameters = p.clone();
    }
    for (i, msg) in req.messages.iter().flatten().enumerate() {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or_default();
        if !matches!(role, "system" | "user" | "assistant") || !msg.get("content").is_some_and(Value::is_string) {
            return Err(ApiError::invalid(
                &format!("messages[{i}]"),
                format!("`messages[{i}]` must be {{\"role\": system|user|assistant, \"content\": \"...\"}}"),
            ));
        }
        m.messages.push(serde_json::json!({"role": role, "content": msg["content"]}));
    }
    m.license = match &req.license {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(items)) => Some(items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n\n")),
        Some(_) => return Err(ApiError::invalid("license", "`license` must be a string or a list of strings")),
    };
    Ok(m)
}

/// Creates a model in the store from an uploaded GGUF blob or another model, with a
/// Modelfile's settings. An existing store model of that name is replaced.
#[utoipa::path(post, path = "/api/create", tag = "ollama",
    request_body(content = CreateRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "NDJSON `{\"status\": ...}` lines ending with `success` (default), or one \
            `{\"status\": \"success\"}` with `stream: false`"),
        (status = 400, description = "Invalid request (names the field)", body = OllamaErrorBody),
        (status = 404, description = "Unknown `from` model", body = OllamaErrorBody)))]
pub(crate) async fn create(State(state): State<AppState>, body: Bytes) -> Result<Response> {
    let req: CreateRequest = parse_json(&body)?;
    let name = req.model.clone().or(req.name.clone()).map(|m| m.trim().to_string()).unwrap_or_default();
    if name.is_empty() {
        return Err(ApiError::invalid("model", "`model` is required").into());
    }
    if req.modelfile.as_deref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::invalid(
            "modelfile",
            "`modelfile`: a Modelfile as text is not supported; send its fields (`from`, `files`, `template`, `system`, \
             `parameters`, `messages`)",
        )
        .into());
    }
    if req.adapters.as_ref().is_some_and(|a| !a.is_empty()) {
        return Err(ApiError::invalid("adapters", "`adapters`: LoRA adapters are not supported").into());
    }
    if req.quantize.as_deref().is_some_and(|q| !q.is_empty()) {
        return Err(ApiError::invalid(
            "quantize",
            "`quantize`: quantizing on create is not supported; use `strata convert` or `/api/pull` with `quantize`",
        )
        .into());
    }
    let files = req.files.clone().unwrap_or_default();
    let from = match (req.from.as_deref().map(str::trim).filter(|f| !f.is_empty()), files.len()) {
        (Some(_), n) if n > 0 => {
            return Err(ApiError::invalid("files", "`files`: give `from` or `files`, not both").into());
        }
        (Some(f), _) => CreateFrom::Model(f.to_string()),
        (None, 1) => CreateFrom::Blob(
            blob_hex(files.values().next().expect("one file"))
                .map_err(|e| ApiError::invalid("files", format!("`files`: {}", e.message)))?,
        ),
        (None, 0) => return Err(ApiError::invalid("from", "`from` or `files` is required").into()),
        (None, _) => {
            return Err(ApiError::invalid(
                "files",
                "`files` must hold one GGUF file (several files are not supported)",
            )
            .into());
        }
    };
    let modelfile = modelfile(&req)?;
    let registry = state.registry.clone();
    let target = name.clone();
    tokio::task::spawn_blocking(move || registry.create(&target, &from, modelfile))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("internal error: {e}")))?
        .map_err(ApiError::from)?;
    // A redefined model that is loaded would keep its old settings.
    let key = canonical(&name);
    if state.status.loaded.lock().expect("status lock").iter().any(|m| m.name == key)
        && let Err(e) = outcome(&state, Work::Unload { model: name.clone() }).await
    {
        tracing::warn!(model = %key, error = %e.message, "unloading a redefined model failed");
    }
    if req.stream == Some(false) {
        return Ok(Json(serde_json::json!({"status": "success"})).into_response());
    }
    let lines: String = ["reading model metadata", "creating model", "writing manifest", "success"]
        .iter()
        .map(|s| format!("{}\n", serde_json::json!({"status": s})))
        .collect();
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], lines).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::error::Family;

    /// A disk that takes `room` bytes, then is full.
    struct Disk {
        room: usize,
        taken: Vec<u8>,
    }

    impl std::io::Write for Disk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.room - self.taken.len());
            if n == 0 && !buf.is_empty() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.taken.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_disk_is_507_naming_the_file() {
        let mut chunks = vec![Bytes::from_static(b"abcd"), Bytes::from_static(b"efgh")].into_iter();
        let mut disk = Disk { room: 6, taken: Vec::new() };
        let e = write_chunks(&mut || chunks.next(), &mut disk).unwrap_err();
        let path = std::path::Path::new("/store/blobs/blob-1-0-0.partial");
        let api = write_error(path, &e);
        assert_eq!(api.status(Family::Ollama), StatusCode::INSUFFICIENT_STORAGE);
        assert!(api.message.contains("blob-1-0-0.partial") && api.message.contains("No space left"), "{}", api.message);
        let quota = write_error(path, &std::io::Error::from_raw_os_error(libc::EDQUOT));
        assert_eq!(quota.status(Family::Ollama), StatusCode::INSUFFICIENT_STORAGE);
        let other = write_error(path, &std::io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(other.status(Family::Ollama), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(other.message.contains("blob-1-0-0.partial"), "{}", other.message);

        let mut chunks = vec![Bytes::from_static(b"abc")].into_iter();
        let mut disk = Disk { room: 3, taken: Vec::new() };
        let hex = write_chunks(&mut || chunks.next(), &mut disk).unwrap();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(disk.taken, b"abc");
    }
}
