//! The worker thread: owns the loaded engines, runs one job at a time, unloads idle
//! models when their keep-alive runs out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::models::{Registry, canonical};
use super::{
    Admission, EmbedInput, EmbedJob, Event, GenerateJob, Job, JobDone, JobError, KeepAlive, PromptInput, QueueHandle,
    TokenLogprob, Work,
};
use crate::engine::session::{Engine, GenerateError, GenerateRequest, RunOptions, Session, TokenEvent};
use crate::engine::tokenizer::TextError;
use crate::model::decoder::ModelError;

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// How models load: threads, context length of a session unless a request asks for
    /// another (0: the model's, capped), memory budget.
    pub run: RunOptions,
    pub keep_alive: KeepAlive,
    /// Models kept loaded at once; loading another unloads the least recently used.
    pub max_loaded: usize,
}

/// A loaded model as `/api/ps` shows it.
#[derive(Clone, Debug)]
pub struct LoadedModel {
    pub name: String,
    pub size_bytes: u64,
    pub context_length: usize,
    /// `None`: kept forever.
    pub expires_at: Option<SystemTime>,
    /// Its layers' residency and storage counters.
    pub sched: crate::sched::SchedMonitor,
    /// Where it runs.
    pub device: crate::backend::device::DeviceInfo,
    /// Bytes of GPU memory it holds (weights, KV cache, activations); 0 on the CPU.
    pub size_vram: u64,
}

/// State the worker shares with the HTTP side.
#[derive(Clone, Default)]
pub struct WorkerStatus {
    pub loaded: Arc<Mutex<Vec<LoadedModel>>>,
    /// False while the startup model loads.
    pub ready: Arc<AtomicBool>,
    /// Set on shutdown: running work stops, queued work is refused.
    pub shutting_down: Arc<AtomicBool>,
    /// The device the most recently loaded model runs on (`None` before the first).
    pub device: Arc<Mutex<Option<crate::backend::device::DeviceInfo>>>,
}

struct Slot {
    name: String,
    engine: Engine,
    session: Session,
    keep_alive: KeepAlive,
    expires: Option<Instant>,
    size_bytes: u64,
}

struct Worker {
    registry: Registry,
    config: WorkerConfig,
    status: WorkerStatus,
    slots: Vec<Slot>, // least recently used first
}

/// Starts the worker thread. `preload` names a model to load before `ready` is set.
pub fn spawn(
    registry: Registry,
    config: WorkerConfig,
    status: WorkerStatus,
    queue_depth: usize,
    preload: Option<String>,
) -> (QueueHandle, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let admission = Arc::new(Mutex::new(Admission::new(queue_depth)));
    let handle = QueueHandle { tx, admission: admission.clone() };
    let thread = std::thread::Builder::new()
        .name("strata-worker".into())
        .spawn(move || {
            let mut w = Worker { registry, config, status, slots: Vec::new() };
            if let Some(name) = preload
                && let Err(e) = w.slot(&name)
            {
                tracing::error!(model = %name, error = %e, "loading the model failed");
            }
            w.status.ready.store(true, Ordering::SeqCst);
            loop {
                let next_expiry = w.slots.iter().filter_map(|s| s.expires).min();
                let wait =
                    next_expiry.map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(Instant::now()));
                match rx.recv_timeout(wait) {
                    Ok(job) => {
                        admission.lock().expect("admission lock").start();
                        w.run(job);
                        admission.lock().expect("admission lock").finish();
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
                w.unload_expired();
            }
        })
        .expect("spawning the worker thread");
    (handle, thread)
}

fn invalid(param: Option<&'static str>, message: impl ToString) -> JobError {
    JobError::Invalid { param, message: message.to_string() }
}

fn text_error(param: &'static str, e: TextError) -> JobError {
    match e.is_client_error() {
        true => invalid(Some(param), e),
        false => JobError::Internal(e.to_string()),
    }
}

impl Worker {
    fn run(&mut self, job: Job) {
        let Job { work, events, admitted } = job;
        if events.is_closed() {
            return; // the client left while the job waited
        }
        if self.status.shutting_down.load(Ordering::SeqCst) {
            let _ = events.send(Event::Error(JobError::ShuttingDown));
            return;
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.dispatch(work, &events, admitted)));
        let outcome = match result {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                tracing::error!(panic = ?msg, "a job panicked");
                Err(JobError::Internal(format!("internal error: {}", msg.unwrap_or_default())))
            }
        };
        if let Err(e) = outcome {
            let _ = events.send(Event::Error(e));
        }
        self.publish();
    }

    fn dispatch(
        &mut self,
        work: Work,
        events: &tokio::sync::mpsc::UnboundedSender<Event>,
        admitted: Instant,
    ) -> Result<(), JobError> {
        let shutting_down = self.status.shutting_down.clone();
        let cancelled = || events.is_closed() || shutting_down.load(Ordering::Relaxed);
        match work {
            Work::Generate(job) => self.generate(job, events, &cancelled, admitted),
            Work::Embed(job) => self.embed(job, events, &cancelled, admitted),
            Work::Load { model, keep_alive } => {
                let start = Instant::now();
                let i = self.slot(&model)?;
                self.touch(i, keep_alive);
                self.publish(); // before the reply, so that /api/ps right after it is current
                let _ = events.send(Event::Loaded { load: start.elapsed() });
                Ok(())
            }
            Work::Unload { model } => {
                if self.registry.get(&model).is_none() {
                    return Err(JobError::ModelNotFound(model));
                }
                let key = canonical(&model);
                self.slots.retain(|s| s.name != key);
                self.publish();
                let _ = events.send(Event::Unloaded);
                Ok(())
            }
        }
    }

    /// The index of the loaded model `name`, loading it (and unloading the least recently
    /// used beyond `max_loaded`) when needed.
    fn slot(&mut self, name: &str) -> Result<usize, JobError> {
        let info = self.registry.get(name).ok_or_else(|| JobError::ModelNotFound(name.to_string()))?;
        let key = canonical(name);
        if let Some(i) = self.slots.iter().position(|s| s.name == key) {
            let slot = self.slots.remove(i);
            self.slots.push(slot);
            return Ok(self.slots.len() - 1);
        }
        while self.slots.len() >= self.config.max_loaded.max(1) {
            self.slots.remove(0);
        }
        let opts = self.config.run.clone();
        let started = Instant::now();
        let engine = Engine::load(&info.spec, &opts).map_err(|e| {
            let msg = format!("loading `{name}`: {e:#}");
            match is_device_error(&e) {
                true => JobError::Device(msg),
                false => JobError::Internal(msg),
            }
        })?;
        tracing::info!(
            model = %key,
            device = %engine.device.device,
            seconds = started.elapsed().as_secs_f64(),
            "model loaded"
        );
        *self.status.device.lock().unwrap_or_else(|e| e.into_inner()) = Some(engine.device.clone());
        let session = Session::new(&engine).map_err(|e| model_error(name, e))?;
        self.slots.push(Slot {
            name: key,
            engine,
            session,
            keep_alive: self.config.keep_alive,
            expires: None,
            size_bytes: info.size_bytes,
        });
        self.publish();
        Ok(self.slots.len() - 1)
    }

    /// Marks slot `i` used now, with its keep-alive (the request's, else the default).
    fn touch(&mut self, i: usize, keep_alive: Option<KeepAlive>) {
        let slot = &mut self.slots[i];
        slot.keep_alive = keep_alive.unwrap_or(self.config.keep_alive);
        slot.expires = match slot.keep_alive {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => Some(Instant::now() + d),
        };
    }

    fn unload_expired(&mut self) {
        let now = Instant::now();
        let before = self.slots.len();
        self.slots.retain(|s| s.expires.is_none_or(|t| t > now));
        if self.slots.len() != before {
            tracing::info!(unloaded = before - self.slots.len(), "idle models unloaded");
            self.publish();
        }
    }

    fn publish(&self) {
        let now = (Instant::now(), SystemTime::now());
        let list = self
            .slots
            .iter()
            .map(|s| LoadedModel {
                name: s.name.clone(),
                size_bytes: s.size_bytes,
                context_length: s.session.context_len(),
                expires_at: s.expires.map(|t| now.1 + t.saturating_duration_since(now.0)),
                sched: s.engine.model.scheduler().monitor(),
                device: s.engine.device.clone(),
                size_vram: s.engine.model.device_bytes(),
            })
            .collect();
        *self.status.loaded.lock().expect("status lock") = list;
    }

    fn generate(
        &mut self,
        job: GenerateJob,
        events: &tokio::sync::mpsc::UnboundedSender<Event>,
        cancelled: &(dyn Fn() -> bool + Sync),
        admitted: Instant,
    ) -> Result<(), JobError> {
        let load_start = Instant::now();
        let i = self.slot(&job.model)?;
        let load = load_start.elapsed();
        self.touch(i, job.keep_alive);
        let slot = &mut self.slots[i];
        let engine = &slot.engine;
        let tok = &engine.tokenizer;
        let vocab = engine.model.config().vocab_size;
        let mut prompt = job.context.clone();
        let new_ids = match &job.prompt {
            PromptInput::Text { text, special } => tok.encode(text, *special).map_err(|e| text_error("prompt", e))?,
            PromptInput::Chat(messages) => tok.encode_chat(messages, true).map_err(|e| text_error("messages", e))?,
            PromptInput::Tokens(ids) => ids.clone(),
        };
        // A continuation of an earlier exchange already starts with BOS.
        let skip_bos = !prompt.is_empty() && new_ids.first().is_some_and(|&t| Some(t) == tok.bos_id());
        prompt.extend(&new_ids[skip_bos as usize..]);
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(invalid(Some("prompt"), format!("token id {bad} is outside the vocabulary ({vocab} tokens)")));
        }
        let ctx = job.num_ctx.unwrap_or(slot.engine.context_len).max(1);
        if slot.session.context_len() != ctx {
            slot.session = Session::with_capacity(&slot.engine, ctx).map_err(|e| model_error(&job.model, e))?;
        }
        let param = match job.prompt {
            PromptInput::Chat(_) => "messages",
            _ => "prompt",
        };
        if prompt.is_empty() {
            return Err(invalid(Some(param), "the prompt is empty"));
        }
        if prompt.len() >= ctx {
            return Err(invalid(
                Some(param),
                format!(
                    "the prompt is {} tokens long; the context holds {ctx} (prompt plus at least one generated token)",
                    prompt.len()
                ),
            ));
        }
        let req = GenerateRequest {
            max_tokens: job.max_tokens.unwrap_or(usize::MAX),
            prompt,
            sampling: job.sampling.clone(),
            stop: job.stop.clone(),
            stop_at_eos: true,
            top_logprobs: job.top_logprobs,
        };
        let piece = |id: u32| TokenLogprob {
            id,
            text: tok.decode(&[id], false).unwrap_or_default(),
            bytes: tok.token_bytes(id),
            logprob: 0.0,
        };
        let summary = slot
            .session
            .generate(engine, &req, cancelled, |ev| {
                let ev = match ev {
                    TokenEvent::Text(t) => Event::Text(t),
                    TokenEvent::Token { id, logprob, top } => Event::Token {
                        sampled: TokenLogprob { logprob, ..piece(id) },
                        top: top.into_iter().map(|(id, logprob)| TokenLogprob { logprob, ..piece(id) }).collect(),
                    },
                };
                events.send(ev).is_ok()
            })
            .map_err(|e| match e {
                GenerateError::EmptyPrompt | GenerateError::PromptTooLong { .. } => invalid(Some(param), e),
                GenerateError::Model(ModelError::BadToken { .. }) => invalid(Some(param), e),
                GenerateError::Text(t) => text_error(param, t),
                GenerateError::Model(e) => model_error(&job.model, e),
            })?;
        let mut context = req.prompt;
        context.extend(&summary.tokens);
        let done = JobDone {
            finish: summary.finish,
            prompt_tokens: summary.prompt_tokens,
            completion_tokens: summary.completion_tokens,
            context,
            load,
            prefill: summary.prefill,
            decode: summary.decode,
            total: admitted.elapsed(),
        };
        if slot.keep_alive == KeepAlive::For(Duration::ZERO) {
            self.slots.remove(i);
        }
        self.publish();
        let _ = events.send(Event::Done(done));
        Ok(())
    }

    fn embed(
        &mut self,
        job: EmbedJob,
        events: &tokio::sync::mpsc::UnboundedSender<Event>,
        cancelled: &(dyn Fn() -> bool + Sync),
        admitted: Instant,
    ) -> Result<(), JobError> {
        let load_start = Instant::now();
        let i = self.slot(&job.model)?;
        let load = load_start.elapsed();
        self.touch(i, job.keep_alive);
        let engine = &self.slots[i].engine;
        let (vocab, ctx) = (engine.model.config().vocab_size, engine.context_len);
        let mut vectors = Vec::with_capacity(job.inputs.len());
        let mut prompt_tokens = 0;
        for (n, input) in job.inputs.iter().enumerate() {
            let mut ids = match input {
                EmbedInput::Text(t) => engine.tokenizer.encode(t, true).map_err(|e| text_error("input", e))?,
                EmbedInput::Tokens(ids) => ids.clone(),
            };
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(invalid(
                    Some("input"),
                    format!("token id {bad} is outside the vocabulary ({vocab} tokens)"),
                ));
            }
            if ids.is_empty() {
                return Err(invalid(Some("input"), format!("input {n} is empty")));
            }
            if ids.len() > ctx {
                if !job.truncate {
                    return Err(invalid(
                        Some("input"),
                        format!("input {n} is {} tokens long; the context holds {ctx}", ids.len()),
                    ));
                }
                ids.truncate(ctx);
            }
            prompt_tokens += ids.len();
            match engine.model.embed(&ids, cancelled) {
                Ok(v) => vectors.push(v),
                Err(ModelError::Cancelled) => return Ok(()),
                Err(e) => return Err(model_error(&job.model, e)),
            }
        }
        if self.slots[i].keep_alive == KeepAlive::For(Duration::ZERO) {
            self.slots.remove(i);
        }
        self.publish();
        let _ = events.send(Event::Embeddings { vectors, prompt_tokens, load, total: admitted.elapsed() });
        Ok(())
    }
}

/// Whether loading failed for want of a device or its memory (a 503, not a 500).
fn is_device_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<crate::backend::BackendError>()
            || c.is::<crate::backend::cuda::CudaInitError>()
            || c.downcast_ref::<ModelError>().is_some_and(|m| {
                matches!(m, ModelError::Backend(_) | ModelError::Sched(crate::sched::SchedError::Backend { .. }))
            })
    })
}

/// A model error as the client sees it: device trouble (GPU memory, a failed launch) is
/// 503 and names the device; anything else is an internal error.
fn model_error(model: &str, e: ModelError) -> JobError {
    let device = matches!(e, ModelError::Backend(_) | ModelError::Sched(crate::sched::SchedError::Backend { .. }));
    match device {
        true => JobError::Device(format!("model `{model}`: {e}")),
        false => JobError::Internal(format!("model `{model}`: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendError;
    use crate::server::error::{ApiError, Family};

    #[test]
    fn device_errors_are_503_naming_gpu_memory_and_others_500() {
        let oom = BackendError::OutOfMemory { what: "a weight".into(), bytes: 1 << 30, msg: "OOM".into() };
        let e = model_error("m", ModelError::Backend(oom));
        assert!(matches!(e, JobError::Device(_)));
        let api = ApiError::from(e);
        assert_eq!(api.status(Family::OpenAi), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(api.message.contains("GPU memory"), "{}", api.message);
        let launch = BackendError::Device { op: "matvec".into(), msg: "CUDA_ERROR_LAUNCH_FAILED".into() };
        let in_layer = ModelError::Sched(crate::sched::SchedError::Backend { layer: 3, source: launch });
        assert!(matches!(model_error("m", in_layer), JobError::Device(_)));
        let other = model_error("m", ModelError::Tensors(crate::model::spec::TensorError::Missing("x".into())));
        assert_eq!(ApiError::from(other).status(Family::Ollama), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        // A model that fails to load for want of GPU memory is a 503 as well.
        let load = anyhow::Error::new(ModelError::Backend(BackendError::OutOfMemory {
            what: "w".into(),
            bytes: 1,
            msg: "OOM".into(),
        }))
        .context("model `m` on cuda:0");
        assert!(is_device_error(&load));
        assert!(!is_device_error(&anyhow::anyhow!("no such file")));
    }
}
