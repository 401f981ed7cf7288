//! `/api/embed` and the legacy `/api/embeddings`.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;

use super::checks::{keep_alive, require_model, resolve_options};
use super::{
    EmbedRequest, EmbedResponse, EmbeddingsRequest, EmbeddingsResponse, OneOrMany, Result, nanos, outcome, unexpected,
};
use crate::queue::{EmbedInput, EmbedJob, Event, KeepAlive, Work};
use crate::server::error::{ApiError, OllamaErrorBody};
use crate::server::{AppState, parse_json};

/// Embeds one text or a list of texts.
#[utoipa::path(post, path = "/api/embed", tag = "ollama",
    request_body(content = EmbedRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One L2-normalized vector per input", body = EmbedResponse),
        (status = 400, description = "Invalid request", body = OllamaErrorBody),
        (status = 404, description = "Unknown model", body = OllamaErrorBody),
        (status = 503, description = "The queue is full (with `Retry-After`)", body = OllamaErrorBody)))]
pub(crate) async fn embed(State(state): State<AppState>, body: Bytes) -> Result<Json<EmbedResponse>> {
    let req: EmbedRequest = parse_json(&body)?;
    let info = require_model(&state, &req.model)?;
    let keep_alive = keep_alive(req.keep_alive.as_ref())?;
    // Checked as the generate routes check them; only `num_ctx` changes an embedding.
    let num_ctx = resolve_options(req.options, &info)?.num_ctx();
    let dimensions = match req.dimensions {
        None => None,
        Some(d) if d >= 1 => Some(usize::try_from(d).unwrap_or(usize::MAX)),
        Some(_) => return Err(ApiError::invalid("dimensions", "`dimensions` must be at least 1").into()),
    };
    // An empty string alone (as Ollama takes it) only loads the model; an empty string
    // in a list is an input like the others, refused below as `["a", ""]`'s is.
    let inputs: Vec<String> = match req.input {
        Some(OneOrMany::One(s)) if s.is_empty() => Vec::new(),
        other => other.map(OneOrMany::into_vec).unwrap_or_default(),
    };
    let model = req.model;
    if inputs.is_empty() {
        let (load, total) = load_only(&state, &model, keep_alive).await?;
        let (total_duration, load_duration) = (nanos(total), nanos(load));
        return Ok(Json(EmbedResponse {
            model,
            embeddings: Vec::new(),
            total_duration,
            load_duration,
            prompt_eval_count: 0,
        }));
    }
    let job = EmbedJob {
        model: model.clone(),
        inputs: inputs.into_iter().map(EmbedInput::Text).collect(),
        truncate: req.truncate.unwrap_or(true),
        num_ctx,
        keep_alive,
    };
    let (mut vectors, prompt_tokens, load, total) = run_embed(&state, job).await?;
    if let Some(d) = dimensions {
        vectors.iter_mut().for_each(|v| shorten(v, d));
    }
    Ok(Json(EmbedResponse {
        model,
        embeddings: vectors,
        total_duration: nanos(total),
        load_duration: nanos(load),
        prompt_eval_count: prompt_tokens,
    }))
}

/// Embeds one text (the legacy form of `/api/embed`). The vector is `/api/embed`'s, L2-normalized
/// (Ollama's legacy route answers it before normalization; the direction is the same).
#[utoipa::path(post, path = "/api/embeddings", tag = "ollama",
    request_body(content = EmbeddingsRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The embedding", body = EmbeddingsResponse),
        (status = 400, description = "Invalid request", body = OllamaErrorBody),
        (status = 404, description = "Unknown model", body = OllamaErrorBody),
        (status = 503, description = "The queue is full (with `Retry-After`)", body = OllamaErrorBody)))]
pub(crate) async fn embeddings(State(state): State<AppState>, body: Bytes) -> Result<Json<EmbeddingsResponse>> {
    let req: EmbeddingsRequest = parse_json(&body)?;
    let info = require_model(&state, &req.model)?;
    let keep_alive = keep_alive(req.keep_alive.as_ref())?;
    let num_ctx = resolve_options(req.options, &info)?.num_ctx();
    let prompt = req.prompt.unwrap_or_default();
    if prompt.is_empty() {
        load_only(&state, &req.model, keep_alive).await?;
        return Ok(Json(EmbeddingsResponse { embedding: Vec::new() }));
    }
    let job =
        EmbedJob { model: req.model, inputs: vec![EmbedInput::Text(prompt)], truncate: true, num_ctx, keep_alive };
    let (vectors, ..) = run_embed(&state, job).await?;
    Ok(Json(EmbeddingsResponse { embedding: vectors.into_iter().next().unwrap_or_default() }))
}

/// Loads `model`; returns (load time, total time).
async fn load_only(
    state: &AppState,
    model: &str,
    keep_alive: Option<KeepAlive>,
) -> std::result::Result<(Duration, Duration), ApiError> {
    let start = std::time::Instant::now();
    match outcome(state, Work::Load { model: model.to_string(), keep_alive }).await? {
        Event::Loaded { load } => Ok((load, start.elapsed())),
        other => Err(unexpected(&other)),
    }
}

/// (vectors, prompt tokens, load time, total time)
async fn run_embed(
    state: &AppState,
    job: EmbedJob,
) -> std::result::Result<(Vec<Vec<f32>>, usize, Duration, Duration), ApiError> {
    match outcome(state, Work::Embed(job)).await? {
        Event::Embeddings { vectors, prompt_tokens, load, total } => Ok((vectors, prompt_tokens, load, total)),
        other => Err(unexpected(&other)),
    }
}

/// Keeps the first `dims` values of a normalized vector and normalizes them again.
fn shorten(v: &mut Vec<f32>, dims: usize) {
    if dims >= v.len() {
        return;
    }
    v.truncate(dims);
    let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortened_embeddings_stay_normalized() {
        let mut v = vec![0.6, 0.8, 0.0];
        shorten(&mut v, 1);
        assert_eq!(v, vec![1.0]);
    }
}
