//! Server-Sent Events: the response itself, and a job's events answered through a
//! writer (a state machine from the job's events to named events), whole or streamed.

use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::mpsc::UnboundedReceiver;

use super::AppState;
use super::error::ApiError;
use crate::queue::Event;

/// One named event: its name and JSON payload.
pub type Frame = (&'static str, String);

/// Server-Sent Events, with keep-alive comments and proxy buffering off.
pub fn sse(state: &AppState, events: impl futures_util::Stream<Item = SseEvent> + Send + 'static) -> Response {
    let events = events.map(Ok::<_, std::convert::Infallible>);
    let mut resp =
        Sse::new(events).keep_alive(KeepAlive::new().interval(state.config.keep_alive_interval)).into_response();
    resp.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// Turns a generation's events into an answer's parts, and the events of its stream.
pub trait EventWriter: Send + 'static {
    /// The stream's first events, before any of the job's.
    fn start(&mut self) -> Vec<Frame> {
        Vec::new()
    }
    /// The stream's events for `ev` (none when the writer builds a whole answer).
    fn push(&mut self, ev: Event) -> Vec<Frame>;
    /// The job's channel closed before its final event.
    fn closed(&mut self) -> Vec<Frame>;
    /// The final event went out.
    fn is_finished(&self) -> bool;
}

fn record(state: &AppState, ev: &Event) {
    if let Event::Done(d) = ev {
        state.metrics.record_generation(d.prompt_tokens, d.completion_tokens, d.prefill, d.decode);
    }
}

/// Feeds `writer` the job's events until it has its answer.
pub async fn whole<W: EventWriter>(state: &AppState, mut rx: UnboundedReceiver<Event>, writer: &mut W) {
    while let Some(ev) = rx.recv().await {
        record(state, &ev);
        writer.push(ev);
        if writer.is_finished() {
            return;
        }
    }
    writer.closed();
}

/// Streams the writer's events. The answer is a 200 stream only once the job has
/// started: an error before that (a prompt too long for the context) is returned.
pub async fn streamed<W: EventWriter>(
    state: &AppState,
    mut rx: UnboundedReceiver<Event>,
    mut writer: W,
) -> Result<Response, ApiError> {
    let first = match rx.recv().await {
        Some(Event::Error(e)) => return Err(e.into()),
        Some(ev) => ev,
        None => return Err(ApiError::worker_gone()),
    };
    record(state, &first);
    let mut opening = writer.start();
    opening.extend(writer.push(first));
    let st = state.clone();
    let rest = futures_util::stream::unfold((rx, writer, st), |(mut rx, mut writer, st)| async move {
        if writer.is_finished() {
            return None;
        }
        let frames = match rx.recv().await {
            Some(ev) => {
                record(&st, &ev);
                writer.push(ev)
            }
            None => writer.closed(),
        };
        Some((frames, (rx, writer, st)))
    });
    let events = futures_util::stream::iter([opening])
        .chain(rest)
        .flat_map(futures_util::stream::iter)
        .map(|(name, data)| SseEvent::default().event(name).data(data));
    Ok(sse(state, events))
}
