//! `POST /api/pull`: a Hugging Face repository (`hf:ORG/REPO[@REV]`) into the model
//! store, with Ollama's progress lines (`pulling manifest`, one `pulling <digest>` line
//! per file with `total`/`completed`, `writing manifest`, `success`). Only `hf:` names
//! can be pulled: Ollama's own registry is not Strata's (`strata import ollama:NAME`
//! takes models Ollama has already pulled). The hub is `$HF_ENDPOINT` of the server's
//! environment, with `$HF_TOKEN`.

use std::convert::Infallible;
use std::ops::ControlFlow;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use super::Result;
use crate::hub::{HubClient, Phase};
use crate::server::error::{ApiError, ErrorKind, OllamaErrorBody};
use crate::server::{AppState, parse_json, streaming_body};
use crate::store::pull::{PullEvent, pull_hf};
use strata_quant::convert_target;

/// `POST /api/pull`
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = ollama::PullRequest, example = json!({"model": "hf:example-org/example-model", "quantize": "q8_0"}))]
pub struct PullRequest {
    /// `hf:ORG/REPO` or `hf:ORG/REPO@REVISION`.
    #[serde(default)]
    pub model: Option<String>,
    /// The older spelling of `model`.
    #[serde(default)]
    pub name: Option<String>,
    /// Accepted and ignored (the hub is reached over HTTPS).
    #[serde(default)]
    #[allow(dead_code, reason = "Ollama clients send it; it means nothing for the hub")]
    pub insecure: Option<bool>,
    /// Progress lines as NDJSON (default), or one final object.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Convert to a flat layer directory quantized to this format (`q8_0`, `q4_0`,
    /// `q4_k`, `q6_k`, ...); by default the safetensors are stored as they are.
    #[serde(default)]
    pub quantize: Option<String>,
}

/// One progress line (or the final object without streaming).
#[derive(Clone, Debug, Default, Serialize, ToSchema)]
#[schema(as = ollama::PullStatus)]
pub struct PullStatus {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

impl PullStatus {
    fn status(s: impl Into<String>) -> PullStatus {
        PullStatus { status: s.into(), ..Default::default() }
    }
}

/// Downloads a Hugging Face model into the store.
#[utoipa::path(post, path = "/api/pull", tag = "ollama",
    request_body(content = PullRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Progress lines (NDJSON), or the final status", body = PullStatus,
            content((PullStatus = "application/x-ndjson"), (PullStatus = "application/json"))),
        (status = 400, description = "Not an `hf:` name, a bad quantization, or no model store", body = OllamaErrorBody),
        (status = 404, description = "No such repository or revision", body = OllamaErrorBody)))]
pub(crate) async fn pull(State(state): State<AppState>, body: Bytes) -> Result<Response> {
    let req: PullRequest = parse_json(&body)?;
    let model = req.model.or(req.name).map(|m| m.trim().to_owned()).unwrap_or_default();
    if model.is_empty() {
        return Err(ApiError::invalid("model", "`model` is required").into());
    }
    if !model.starts_with("hf:") {
        return Err(ApiError::invalid(
            "model",
            format!(
                "`{model}`: only Hugging Face repositories can be pulled here (`hf:ORG/REPO`); use `strata import ollama:NAME` for models Ollama has pulled"
            ),
        )
        .into());
    }
    if let Err(e) = crate::hub::parse_spec(&model) {
        return Err(ApiError::invalid("model", e.to_string()).into());
    }
    let quant =
        req.quantize.as_deref().map(convert_target).transpose().map_err(|e| ApiError::invalid("quantize", e))?;
    let Some(store) = state.registry.store().cloned() else {
        return Err(ApiError::invalid("model", "this server was started without a model store").into());
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<PullStatus>();
    let task = tokio::task::spawn_blocking(move || {
        let client = HubClient::from_env()?;
        let mut on = |e: PullEvent<'_>| {
            let line = match e {
                PullEvent::Listing(_) => PullStatus::status("pulling manifest"),
                PullEvent::Download(p) => {
                    let digest = p.file.digest.to_string();
                    let status = match p.phase {
                        Phase::Checking => format!("verifying {digest}"),
                        _ => format!("pulling {}", p.file.digest.hex().get(..12).unwrap_or(p.file.digest.hex())),
                    };
                    PullStatus { status, digest: Some(digest), total: Some(p.total), completed: Some(p.completed) }
                }
                PullEvent::Convert(p) => PullStatus {
                    status: "converting".into(),
                    total: Some(p.total as u64),
                    completed: Some(p.done as u64),
                    ..Default::default()
                },
                PullEvent::Importing => PullStatus::status("writing manifest"),
            };
            // A client that went away stops the pull (the download resumes next time).
            if tx.send(line).is_err() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        };
        pull_hf(&store, &client, &model, quant, None, true, &mut on)
    });
    let done = async move {
        match task.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(classify(&e)),
            Err(e) => Err(ApiError::new(ErrorKind::Internal, format!("the pull failed: {e}"))),
        }
    };
    if req.stream == Some(false) {
        // Drain the progress; answer with the outcome.
        let drain = async { while rx.recv().await.is_some() {} };
        let (_, result) = tokio::join!(drain, done);
        result?;
        return Ok(axum::Json(PullStatus::status("success")).into_response());
    }
    let lines = async_stream_lines(rx, done);
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], streaming_body(lines)).into_response())
}

/// One value as an NDJSON line.
fn ndjson<T: Serialize>(v: &T) -> Bytes {
    Bytes::from(format!("{}\n", serde_json::to_string(v).unwrap_or_default()))
}

/// The progress lines, then `success` or an `{"error": ...}` line.
fn async_stream_lines(
    rx: mpsc::UnboundedReceiver<PullStatus>,
    done: impl std::future::Future<Output = std::result::Result<(), ApiError>> + Send + 'static,
) -> impl futures_util::Stream<Item = std::result::Result<Bytes, Infallible>> + Send {
    enum St<F> {
        Lines(mpsc::UnboundedReceiver<PullStatus>, std::pin::Pin<Box<F>>),
        End,
    }
    futures_util::stream::unfold(St::Lines(rx, Box::pin(done)), |st| async move {
        match st {
            St::Lines(mut rx, done) => match rx.recv().await {
                Some(s) => Some((Ok(ndjson(&s)), St::Lines(rx, done))),
                None => {
                    let last = match done.await {
                        Ok(()) => ndjson(&PullStatus::status("success")),
                        Err(e) => ndjson(&serde_json::json!({ "error": e.message })),
                    };
                    Some((Ok(last), St::End))
                }
            },
            St::End => None,
        }
    })
}

/// The HTTP status of a failed pull: the hub's "not found" is a 404; a refused token, a
/// bad name or a model this build cannot load a 400; the hub unreachable or answering
/// wrongly a 502; another pull of the same files a 503; the rest (the disk) a 500.
fn classify(e: &anyhow::Error) -> ApiError {
    let msg = crate::errors::chain(e);
    if let Some(crate::store::StoreError::Unsupported { .. }) = e.downcast_ref::<crate::store::StoreError>() {
        return ApiError::new(ErrorKind::InvalidRequest, msg);
    }
    let kind = match e.downcast_ref::<crate::hub::HubError>().map(|h| h.error_type()) {
        Some("not_found") => ErrorKind::ModelNotFound,
        Some("unauthorized" | "invalid_spec" | "missing_files") => ErrorKind::InvalidRequest,
        Some("network" | "http" | "bad_response" | "integrity") => ErrorKind::BadGateway,
        Some("busy") => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    };
    ApiError::new(kind, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::HubError;
    use crate::server::error::Family;

    #[test]
    fn failed_pulls_get_the_status_of_whoever_failed() {
        let status = |e: anyhow::Error| classify(&e).status(Family::Ollama).as_u16();
        let url = || "https://hub.example/api/models/org/m".to_string();
        assert_eq!(status(HubError::NotFound { what: "org/m".into(), url: url() }.into()), 404);
        assert_eq!(status(HubError::InvalidSpec { spec: "hf:x".into(), msg: "bad".into() }.into()), 400);
        assert_eq!(status(HubError::Network { url: url(), msg: "no route to host".into() }.into()), 502);
        assert_eq!(status(HubError::Http { url: url(), status: 500, msg: String::new() }.into()), 502);
        assert_eq!(status(HubError::BadResponse { url: url(), msg: "not JSON".into() }.into()), 502);
        assert_eq!(status(HubError::Busy { dir: "/tmp/d".into() }.into()), 503);
        let unloadable = crate::store::StoreError::Unsupported { path: "/tmp/m".into(), msg: "no".into() };
        assert_eq!(status(anyhow::Error::from(unloadable).context("importing")), 400);
        let disk = HubError::Io { path: "/tmp/d".into(), source: std::io::Error::other("disk full") };
        assert_eq!(status(disk.into()), 500);
    }
}
