//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
//! `/v1/models`, `/v1/models/{id}` and `/v1/embeddings`, in the shapes the OpenAI SDKs
//! (and LangChain, Continue, Open WebUI) read.
//!
//! Each request body is turned into a [`Plan`] (a validated [`crate::queue::GenerateJob`]
//! plus how to answer) in one place, [`plan`]; errors name the field. Streams are
//! Server-Sent Events whose payloads come from `render::ChunkWriter`, a plain state
//! machine over the job's [`Event`]s; the SSE body owns the job's receiver, so a client
//! that goes away cancels the job.

pub(super) mod plan;
mod render;
mod responses;
mod types;

use std::time::SystemTime;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use futures_util::StreamExt;
use tokio::sync::mpsc::UnboundedReceiver;
use utoipa::OpenApi;

pub use plan::{Api, EmbedPlan, Plan};
pub use responses::{
    IncompleteDetails, InputTokensDetails, OutputItem, OutputText, OutputTokensDetails, ReasoningConfig, ReasoningText,
    ResponseError, ResponseEvent, ResponseInput, ResponseObject, ResponsePlan, ResponseRequest, ResponseStreamEvent,
    ResponseUsage, TextConfig,
};
pub use types::*;

use super::error::{ApiError, OpenAiError, OpenAiErrorBody, OpenAiErrorDetail};
use super::metrics::Metrics;
use super::sse::{self, sse};
use super::{AppState, new_id, parse_json};
use crate::queue::{Event, JobDone, Work};
use render::{ChunkWriter, Generation, Head, TokenStep, whole_response};

#[derive(OpenApi)]
#[openapi(
    paths(chat_completions, completions, responses, list_models, get_model, embeddings),
    components(schemas(
        ChatCompletionRequest,
        ChatMessageIn,
        MessageContent,
        ContentPart,
        StopSpec,
        StreamOptions,
        ResponseFormat,
        CompletionRequest,
        PromptSpec,
        EmbeddingRequest,
        EmbeddingInputSpec,
        ChatCompletionResponse,
        ChatChoice,
        AssistantMessage,
        ToolCallOut,
        FunctionCallOut,
        ToolCallDelta,
        FunctionDelta,
        ChatCompletionChunk,
        ChatCompletionEvent,
        CompletionEvent,
        ChunkChoice,
        Delta,
        ChatLogprobs,
        ChatTokenLogprob,
        TopLogprob,
        CompletionResponse,
        CompletionChoice,
        CompletionLogprobs,
        PromptTokensDetails,
        CompletionTokensDetails,
        ResponseRequest,
        ResponseInput,
        TextConfig,
        ReasoningConfig,
        ResponseObject,
        ResponseError,
        IncompleteDetails,
        ResponseUsage,
        InputTokensDetails,
        OutputTokensDetails,
        OutputItem,
        OutputText,
        ReasoningText,
        ResponseStreamEvent,
        ResponseEvent,
        FinishReason,
        Usage,
        Timings,
        SpeculativeOptions,
        EmbeddingResponse,
        EmbeddingData,
        EmbeddingVector,
        EmbeddingUsage,
        ModelList,
        ModelObject,
        OpenAiErrorBody,
        OpenAiErrorDetail,
    )),
    tags((name = "openai", description = "OpenAI-compatible API"))
)]
pub struct Doc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/v1/models", get(list_models))
        // A catch-all, so names with a slash (`org/model`) work too.
        .route("/v1/models/{*id}", get(get_model))
        .route("/v1/embeddings", post(embeddings))
}

/// `system_fingerprint` of every completion.
pub const SYSTEM_FINGERPRINT: &str = concat!("strata-", env!("CARGO_PKG_VERSION"));

/// Generates the assistant's reply to a conversation.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The completion, or with `stream: true` a stream of chunks ending in `data: [DONE]`",
            content((ChatCompletionResponse = "application/json"), (ChatCompletionEvent = "text/event-stream"))),
        (status = 400, description = "Invalid request (names the field)", body = OpenAiErrorBody),
        (status = 404, description = "Unknown model (`model_not_found`)", body = OpenAiErrorBody),
        (status = 429, description = "The queue is full; retry after `Retry-After` seconds", body = OpenAiErrorBody),
        (status = 503, description = "Shutting down", body = OpenAiErrorBody),
    ))]
pub async fn chat_completions(State(state): State<AppState>, body: Bytes) -> Result<Response, OpenAiError> {
    let plan = parse_json::<ChatCompletionRequest>(&body)?.into_plan()?;
    Ok(generate(&state, plan).await?)
}

/// Continues a prompt (the legacy completions API).
#[utoipa::path(post, path = "/v1/completions", tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion, or with `stream: true` a stream of chunks ending in `data: [DONE]`",
            content((CompletionResponse = "application/json"), (CompletionEvent = "text/event-stream"))),
        (status = 400, description = "Invalid request (names the field)", body = OpenAiErrorBody),
        (status = 404, description = "Unknown model (`model_not_found`)", body = OpenAiErrorBody),
        (status = 429, description = "The queue is full; retry after `Retry-After` seconds", body = OpenAiErrorBody),
        (status = 503, description = "Shutting down", body = OpenAiErrorBody),
    ))]
pub async fn completions(State(state): State<AppState>, body: Bytes) -> Result<Response, OpenAiError> {
    let plan = parse_json::<CompletionRequest>(&body)?.into_plan()?;
    Ok(generate(&state, plan).await?)
}

/// Generates a response (the Responses API). Stateless: `input` carries the whole
/// conversation, nothing is stored, and `previous_response_id` is refused.
#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    request_body = ResponseRequest,
    responses(
        (status = 200, description = "The response, or with `stream: true` its events (`event:` names each; the last is `response.completed`, `response.incomplete` or `response.failed`)",
            content((ResponseObject = "application/json"), (ResponseEvent = "text/event-stream"))),
        (status = 400, description = "Invalid request (names the field)", body = OpenAiErrorBody),
        (status = 404, description = "Unknown model (`model_not_found`)", body = OpenAiErrorBody),
        (status = 429, description = "The queue is full; retry after `Retry-After` seconds", body = OpenAiErrorBody),
        (status = 503, description = "Shutting down", body = OpenAiErrorBody),
    ))]
pub async fn responses(State(state): State<AppState>, body: Bytes) -> Result<Response, OpenAiError> {
    let mut plan = parse_json::<ResponseRequest>(&body)?.into_plan()?;
    state.model(&plan.job.model)?;
    plan.job.truncate = state.config.v1_truncation();
    let head = Head { id: new_id("resp_"), created: unix_seconds(SystemTime::now()), model: plan.job.model.clone() };
    let rx = state.queue.submit(Work::Generate(plan.job)).map_err(ApiError::from)?;
    let mut writer = responses::Writer::new(head, plan.echo, plan.logprobs, plan.stream);
    if plan.stream {
        return Ok(sse::streamed(&state, rx, writer).await?);
    }
    sse::whole(&state, rx, &mut writer).await;
    Ok(Json(writer.into_response()?).into_response())
}

/// The models this server offers.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, description = "Every model", body = ModelList)))]
pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    let data = state
        .registry
        .list()
        .into_iter()
        .map(|m| ModelObject {
            id: m.name,
            object: "model".into(),
            created: unix_seconds(m.modified_at),
            owned_by: "strata".into(),
        })
        .collect();
    Json(ModelList { object: "list".into(), data })
}

/// One model.
#[utoipa::path(get, path = "/v1/models/{id}", tag = "openai",
    params(("id" = String, Path, description = "The model's name")),
    responses(
        (status = 200, description = "The model", body = ModelObject),
        (status = 404, description = "Unknown model (`model_not_found`)", body = OpenAiErrorBody),
    ))]
pub async fn get_model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, OpenAiError> {
    let info = state.registry.get(&id).ok_or_else(|| ApiError::model_not_found(&id).with_param("id"))?;
    Ok(Json(ModelObject::of(&info)))
}

/// Embeds one or more inputs (mean-pooled, unit length).
#[utoipa::path(post, path = "/v1/embeddings", tag = "openai",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "One embedding per input, in order", body = EmbeddingResponse),
        (status = 400, description = "Invalid request (names the field)", body = OpenAiErrorBody),
        (status = 404, description = "Unknown model (`model_not_found`)", body = OpenAiErrorBody),
        (status = 429, description = "The queue is full; retry after `Retry-After` seconds", body = OpenAiErrorBody),
        (status = 503, description = "Shutting down", body = OpenAiErrorBody),
    ))]
pub async fn embeddings(State(state): State<AppState>, body: Bytes) -> Result<Json<EmbeddingResponse>, OpenAiError> {
    let plan = parse_json::<EmbeddingRequest>(&body)?.into_plan()?;
    let info = state.model(&plan.job.model)?;
    if let Some(d) = plan.dimensions.filter(|&d| d != info.embedding_length) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("`dimensions` is {d}, but `{}` embeds into {} dimensions", info.name, info.embedding_length),
        )
        .into());
    }
    let model = plan.job.model.clone();
    let mut rx = state.queue.submit(Work::Embed(plan.job)).map_err(ApiError::from)?;
    let (vectors, prompt_tokens) = loop {
        match rx.recv().await {
            Some(Event::Embeddings { vectors, prompt_tokens, .. }) => break (vectors, prompt_tokens),
            Some(Event::Error(e)) => return Err(ApiError::from(e).into()),
            Some(_) => continue,
            None => return Err(ApiError::worker_gone().into()),
        }
    };
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingData {
            object: "embedding".into(),
            index,
            embedding: match plan.base64 {
                true => EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(f32_le_bytes(&v))),
                false => EmbeddingVector::Float(v),
            },
        })
        .collect();
    Ok(Json(EmbeddingResponse {
        object: "list".into(),
        data,
        model,
        usage: EmbeddingUsage { prompt_tokens, total_tokens: prompt_tokens },
    }))
}

fn f32_le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Queues a request's generations, one per choice, and answers them whole or as a
/// stream.
async fn generate(state: &AppState, mut plan: Plan) -> Result<Response, ApiError> {
    state.model(&plan.job.model)?;
    plan.job.truncate = state.config.v1_truncation();
    let prefix = match plan.api {
        Api::Chat => "chatcmpl-",
        Api::Completion => "cmpl-",
    };
    let head = Head { id: new_id(prefix), created: unix_seconds(SystemTime::now()), model: plan.job.model.clone() };
    // Every choice is queued before any is awaited; a receiver dropped (an error, the
    // client gone) cancels its generation.
    let mut rxs = Vec::new();
    for job in plan.jobs() {
        rxs.push(state.queue.submit(Work::Generate(job))?);
    }
    if !plan.stream {
        let gens = futures_util::future::try_join_all(rxs.iter_mut().map(|rx| collect(rx, &state.metrics))).await?;
        return whole_response(&head, plan.api, plan.logprobs, gens, plan.n);
    }
    // Commit to a 200 stream only once the first choice has started: a prompt that does
    // not fit (or any other early failure) is still a plain JSON error with its status.
    let first = match rxs[0].recv().await {
        Some(Event::Error(e)) => return Err(e.into()),
        Some(ev) => ev,
        None => return Err(ApiError::worker_gone()),
    };
    let writers = match rxs.len() {
        1 => vec![ChunkWriter::new(plan.api, head, plan.include_usage, plan.logprobs)],
        n => (0..n as u32)
            .map(|i| ChunkWriter::for_choice(plan.api, head.clone(), plan.include_usage, plan.logprobs, i))
            .collect(),
    };
    let streams = Streams { writers: writers.into_iter().map(|w| (w, None)).collect(), n: plan.n, ended: false };
    Ok(sse_response(state, rxs, first, streams))
}

async fn collect(rx: &mut UnboundedReceiver<Event>, metrics: &Metrics) -> Result<Generation, ApiError> {
    let (mut text, mut reasoning, mut steps) = (String::new(), String::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Reasoning(t) => reasoning.push_str(&t),
            Event::Token { sampled, top } => steps.push(TokenStep { sampled, top }),
            Event::Done(done) => {
                record(metrics, &done);
                return Ok(Generation { text, reasoning, steps, done });
            }
            Event::Error(e) => return Err(e.into()),
            _ => {}
        }
    }
    Err(ApiError::worker_gone())
}

fn record(metrics: &Metrics, done: &JobDone) {
    metrics.record_generation(done.prompt_tokens, done.completion_tokens, done.prefill, done.decode);
}

/// A stream's choices: each one's writer and how it finished, `n` to a prompt.
struct Streams {
    writers: Vec<(ChunkWriter, Option<JobDone>)>,
    n: usize,
    /// The last payload went out.
    ended: bool,
}

impl Streams {
    /// The payloads for choice `i`'s event (`None`: its channel closed). An error ends
    /// the stream; so does the last choice's end, with the usage of all (a single
    /// choice's writer ends the stream itself).
    fn take(&mut self, i: usize, ev: Option<Event>, metrics: &Metrics) -> Vec<String> {
        let solo = self.writers.len() == 1;
        let (writer, done) = &mut self.writers[i];
        let Some(ev) = ev else {
            let frames = writer.closed();
            self.ended |= writer.failed();
            return frames;
        };
        if let Event::Done(d) = &ev {
            record(metrics, d);
            *done = Some(d.clone());
        }
        let mut frames = writer.push(ev);
        if writer.failed() || solo {
            self.ended = writer.is_finished();
            return frames;
        }
        if self.writers.iter().all(|(w, _)| w.is_finished()) {
            let usage = Usage::of_choices(self.writers.iter().filter_map(|(_, d)| d.as_ref()), self.n);
            frames.extend(self.writers[0].0.end(usage));
            self.ended = true;
        }
        frames
    }
}

/// The SSE response. The body owns the receivers: when the client goes away the body is
/// dropped, the receivers with it, and the worker stops the jobs.
fn sse_response(state: &AppState, rxs: Vec<UnboundedReceiver<Event>>, first: Event, mut streams: Streams) -> Response {
    let metrics = state.metrics.clone();
    let mut opening: Vec<String> = streams.writers.iter_mut().flat_map(|(w, _)| w.start()).collect();
    opening.extend(streams.take(0, Some(first), &metrics));
    // Each choice's events, tagged with its index; `None` once its channel closed.
    let each = rxs.into_iter().enumerate().map(|(i, rx)| {
        futures_util::stream::unfold(Some(rx), move |rx| async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(ev) => Some(((i, Some(ev)), Some(rx))),
                None => Some(((i, None), None)),
            }
        })
        .boxed()
    });
    let merged = futures_util::stream::select_all(each);
    let rest =
        futures_util::stream::unfold((merged, streams, metrics), |(mut merged, mut streams, metrics)| async move {
            if streams.ended {
                return None;
            }
            let frames = match merged.next().await {
                Some((i, ev)) => streams.take(i, ev, &metrics),
                None => {
                    streams.ended = true;
                    Vec::new()
                }
            };
            Some((frames, (merged, streams, metrics)))
        });
    let events = futures_util::stream::iter([opening])
        .chain(rest)
        .flat_map(futures_util::stream::iter)
        .map(|data| SseEvent::default().data(data));
    sse(state, events)
}
