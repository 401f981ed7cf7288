//! The worker thread: owns the loaded engines and runs the step loop of DESIGN.md §5b.
//! Waiting generations are admitted while their model's `--parallel` and KV memory
//! allow; every step runs one forward pass over each model's running sequences (their
//! prompt chunks and decode tokens together) and retires those that finished or whose
//! client went away. Other work (embeddings, loads, unloads) runs between steps. Idle
//! models are unloaded when their keep-alive runs out.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::models::{Registry, canonical};
use super::prepare::{ChatTraits, Kit, Prepared, Preparers, Ready, bounded_encode, invalid, panic_message, text_error};
use super::{
    Admission, EmbedInput, EmbedJob, Event, GenerateJob, Job, JobDone, JobError, KeepAlive, QueueHandle, TokenLogprob,
    Work,
};
use strata_engine::batch::{self, Sequence};
use strata_engine::reasoning::{Piece, ReasoningSplitter};
use strata_engine::session::{Engine, GenerateError, GenerateRequest, RunOptions, TokenEvent};
use strata_engine::toolcall::harmony::Part;
use strata_engine::toolcall::{HarmonyParser, ToolCall, ToolCallParser, ToolEvent};
use strata_model::decoder::{KvCache, ModelError};
use strata_sched::plan::human_size;
use strata_tensor::mapped::{FileChange, FileSet};

mod run;

/// Running sequences per model when memory allows more and `--parallel` is not given.
pub const DEFAULT_PARALLEL: usize = 8;

/// How often an otherwise idle worker looks for requests that finished being prepared.
const PREPARED_POLL: Duration = Duration::from_millis(2);

/// Of the device memory free once a model has loaded, the part its KV caches may use.
const KV_MEMORY_SHARE: f64 = 0.9;

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// How models load: threads, context length of a session unless a request asks for
    /// another (0: the model's, capped), memory budget.
    pub run: RunOptions,
    pub keep_alive: KeepAlive,
    /// Models kept loaded at once; loading another unloads the least recently used.
    pub max_loaded: usize,
    /// Running sequences per model (`None`: what KV memory allows, at most
    /// [`DEFAULT_PARALLEL`]).
    pub parallel: Option<usize>,
    /// Prompt tokens one step runs when no sequence decodes, over every sequence
    /// prefilling ([`batch::plan`](strata_engine::batch::plan)).
    pub prefill_chunk: usize,
    /// Bytes of KV cache each model's running requests may claim at once (`None`:
    /// [`KV_MEMORY_SHARE`] of the memory free once the model has loaded, and at least one
    /// full-context cache).
    pub kv_memory: Option<u64>,
    /// Each model's draft (`--draft`) and how much every model drafts.
    pub drafts: crate::draft::Drafts,
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
    pub sched: strata_sched::SchedMonitor,
    /// Where it runs.
    pub device: strata_backend::device::DeviceInfo,
    /// Bytes of GPU memory it holds (weights, KV cache, activations); 0 on the CPU.
    pub size_vram: u64,
    pub batching: Batching,
    /// Its speculative decoding: the draft, the settings, the running totals.
    pub speculation: crate::draft::SpeculationView,
}

/// A loaded model's continuous batching, as `/api/ps` and `/metrics` show it.
#[derive(Clone, Debug, Default, serde::Serialize, utoipa::ToSchema)]
pub struct Batching {
    /// Sequences generating now.
    pub running: usize,
    /// Requests for it waiting for a place (or for KV memory).
    pub waiting: usize,
    /// The most sequences it runs at once (`--parallel`).
    pub parallel: usize,
    /// Bytes its KV caches hold now (running, and kept for a follow-up request).
    pub kv_cache_bytes: u64,
    /// Bytes of KV cache its running requests may claim at once.
    pub kv_cache_limit_bytes: u64,
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
    pub device: Arc<Mutex<Option<strata_backend::device::DeviceInfo>>>,
}

/// A generation in the step loop, with what its reply needs.
struct Running {
    seq: Sequence,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    /// The request field its prompt came from (for a 400's `param`).
    param: &'static str,
    /// The request field its grammar came from: a dead end the grammar reaches while
    /// generating is that field's 400.
    grammar_param: &'static str,
    admitted: Instant,
    load: Duration,
    /// KV bytes set aside for it: every position its request may reach.
    kv_claim: u64,
    /// Splits tool calls from the text, when the chat offered tools.
    tools: Option<ToolCallParser>,
    /// Splits reasoning from the answer, when asked and the template has think markers.
    reasoning: Option<ReasoningSplitter>,
    /// Splits a harmony reply (gpt-oss) into reasoning, content and tool calls, in place
    /// of the two above.
    harmony: Option<HarmonyParser>,
    /// Generated tokens counted so far, and how many of them were reasoning.
    counted: usize,
    reasoning_tokens: usize,
}

struct Slot {
    name: String,
    engine: Engine,
    running: Vec<Running>,
    /// Caches of finished sequences and the tokens they hold, for a follow-up request
    /// to continue from (least recently used first).
    idle: Vec<(KvCache, Vec<u32>)>,
    keep_alive: KeepAlive,
    expires: Option<Instant>,
    size_bytes: u64,
    /// KV bytes one position takes.
    position_bytes: u64,
    /// KV bytes its sequences may claim at once.
    kv_limit: u64,
    parallel: usize,
    /// What preparing its requests needs, read once at load.
    kit: Arc<Kit>,
    /// When each of its requests being prepared was admitted: they count against
    /// `parallel`, keep it loaded, and start in that order.
    preparing: Vec<Instant>,
    /// The files its load mapped, watched for changes on disk.
    files: FileSet,
}

impl Slot {
    /// Whether it is generating or preparing to: it may not be unloaded.
    fn in_use(&self) -> bool {
        !self.running.is_empty() || !self.preparing.is_empty()
    }

    fn claimed(&self) -> u64 {
        self.running.iter().map(|r| r.kv_claim).sum::<u64>()
            + self.idle.iter().map(|(c, _)| c.allocated_bytes()).sum::<u64>()
    }
}

struct Worker {
    registry: Registry,
    config: WorkerConfig,
    status: WorkerStatus,
    slots: Vec<Slot>, // least recently used first
    waiting: VecDeque<Job>,
    /// Generations prepared, first in line: they left `waiting` from its front.
    ready: VecDeque<Ready>,
    preparers: Preparers,
    admission: Arc<Mutex<Admission>>,
}

/// What starting a job came to.
enum Began {
    /// A generation went to be prepared ([`Preparers`]).
    Preparing,
    /// A generation joined the running ones.
    Running,
    /// The job finished (answered, or failed and was answered).
    Done,
    /// A generation whose claim on KV memory, known once its prompt is tokenized, does
    /// not fit beside the running ones: it waits.
    Wait(Box<Ready>),
}

/// Whether a waiting job could start.
enum Admit {
    /// It started (or finished, or failed and was answered).
    Done,
    /// It waits for a running sequence to finish (a place, KV memory, or a model).
    Later,
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
            let mut w = Worker {
                registry,
                config,
                status,
                slots: Vec::new(),
                waiting: VecDeque::new(),
                ready: VecDeque::new(),
                preparers: Preparers::new(),
                admission,
            };
            if let Some(name) = preload
                && let Err(e) = w.slot(&name)
            {
                tracing::error!(model = %name, error = %e, "loading the model failed");
            }
            w.status.ready.store(true, Ordering::SeqCst);
            let mut open = true;
            while open || !w.waiting.is_empty() || w.busy() || w.preparers.in_flight > 0 || !w.ready.is_empty() {
                let mut arrived = false;
                if !w.busy() && w.preparers.in_flight > 0 {
                    // Only requests being prepared: their results, or new jobs, are looked
                    // for every few milliseconds.
                    if let Some(r) = w.preparers.next(PREPARED_POLL) {
                        arrived |= w.prepared(r);
                    }
                } else if !w.busy() && w.waiting.is_empty() && w.ready.is_empty() {
                    let next_expiry = w.slots.iter().filter_map(|s| s.expires).min();
                    let wait =
                        next_expiry.map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(Instant::now()));
                    match rx.recv_timeout(wait) {
                        Ok(job) => w.waiting.push_back(job),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => open = false,
                    }
                }
                let before = w.waiting.len();
                loop {
                    match rx.try_recv() {
                        Ok(job) => w.waiting.push_back(job),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                }
                while let Some(r) = w.preparers.next(Duration::ZERO) {
                    arrived |= w.prepared(r);
                }
                w.admit(arrived || w.waiting.len() != before);
                w.step();
                w.unload_expired();
            }
        })
        .expect("spawning the worker thread");
    (handle, thread)
}

fn generate_error(model: &str, param: &'static str, e: GenerateError) -> JobError {
    match e {
        GenerateError::EmptyPrompt | GenerateError::PromptTooLong { .. } => invalid(Some(param), e),
        GenerateError::Model(ModelError::BadToken { .. }) => invalid(Some(param), e),
        GenerateError::Text(t) => text_error(param, t),
        GenerateError::Model(e) => model_error(model, e),
        GenerateError::Grammar(_) => invalid(Some(param), e),
        GenerateError::Speculative(s) => invalid(Some(s.field), s),
    }
}

impl Running {
    /// Generated text on its way out: reasoning apart, then tool calls apart.
    fn text(&mut self, text: String, out: &mut Vec<Event>) {
        if let Some(h) = &mut self.harmony {
            out.extend(h.push(&text).into_iter().map(harmony_event));
            return;
        }
        let pieces = match &mut self.reasoning {
            Some(split) => split.push(&text),
            None => vec![Piece::Answer(text)],
        };
        self.pieces(pieces, out);
    }

    /// The generation ended: what the splitters held back goes out.
    fn finish_text(&mut self, out: &mut Vec<Event>) {
        if let Some(split) = &mut self.reasoning {
            let pieces = split.finish();
            self.pieces(pieces, out);
        }
        if let Some(parser) = &mut self.tools {
            out.extend(parser.finish().into_iter().map(tool_event));
        }
        if let Some(h) = &mut self.harmony {
            out.extend(h.finish().into_iter().map(harmony_event));
        }
    }

    /// Whether the text so far leaves it inside reasoning.
    fn thinking(&self) -> bool {
        self.reasoning.as_ref().is_some_and(ReasoningSplitter::thinking)
            || self.harmony.as_ref().is_some_and(HarmonyParser::thinking)
    }

    /// Whether nothing more it generates can reach the client (its one call, or a
    /// harmony reply's end, came): it may stop.
    /// Counts a generated token: reasoning when the reasoning was open before or after
    /// its text.
    fn count_token(&mut self, thinking_before: bool) {
        if thinking_before || self.thinking() {
            self.reasoning_tokens += 1;
        }
        self.counted += 1;
    }

    fn closed(&self) -> bool {
        self.tools.as_ref().is_some_and(ToolCallParser::closed)
            || self.harmony.as_ref().is_some_and(HarmonyParser::closed)
    }

    /// The tool calls it completed, and whether the end cut one.
    fn calls(&self) -> (Vec<ToolCall>, bool) {
        match (&self.tools, &self.harmony) {
            (Some(p), _) => (p.calls().to_vec(), p.cut()),
            (None, Some(h)) => (h.calls().to_vec(), h.cut()),
            (None, None) => (Vec::new(), false),
        }
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Event>) {
        for piece in pieces {
            match (piece, &mut self.tools) {
                (Piece::Reasoning(t), _) => out.push(Event::Reasoning(t)),
                (Piece::Answer(t), Some(parser)) => out.extend(parser.push(&t).into_iter().map(tool_event)),
                (Piece::Answer(t), None) => out.push(Event::Text(t)),
            }
        }
    }
}

/// A harmony parser's event as a job event.
fn harmony_event(part: Part) -> Event {
    match part {
        Part::Reasoning(t) => Event::Reasoning(t),
        Part::Tool(ev) => tool_event(ev),
    }
}

/// A parser's event as a job event.
fn tool_event(ev: ToolEvent) -> Event {
    match ev {
        ToolEvent::Text(t) => Event::Text(t),
        other => Event::Tool(other),
    }
}

impl Worker {
    /// Whether any sequence is running.
    fn busy(&self) -> bool {
        self.slots.iter().any(|s| !s.running.is_empty())
    }

    /// Takes the prepared generations, then waiting jobs, first come first served, until
    /// one has to wait.
    fn admit(&mut self, arrived: bool) {
        let (mut changed, blocked) = self.admit_ready();
        changed |= arrived;
        while let Some(job) = self.waiting.front().filter(|_| !blocked) {
            let gone = job.events.is_closed();
            let shutting_down = self.status.shutting_down.load(Ordering::SeqCst);
            if !gone && !shutting_down && matches!(self.ready_to_run(job), Admit::Later) {
                break;
            }
            let job = self.waiting.pop_front().expect("a waiting job");
            self.admission.lock().expect("admission lock").start();
            changed = true;
            let mut began = Began::Done;
            if gone {
                // The client left while the job waited.
            } else if shutting_down {
                let _ = job.events.send(Event::Error(JobError::ShuttingDown));
            } else {
                let Job { work, events, admitted } = job;
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match work {
                    Work::Generate(g) => self.start_preparing(g, &events, admitted),
                    other => self.dispatch(other, &events, admitted).map(|()| Began::Done),
                }));
                began = result.unwrap_or_else(|p| Err(JobError::Internal(panic_message(&*p)))).unwrap_or_else(|e| {
                    let _ = events.send(Event::Error(e));
                    Began::Done
                });
            }
            if matches!(began, Began::Done) {
                self.admission.lock().expect("admission lock").finish();
            }
        }
        if changed {
            self.publish();
        }
    }

    /// Starts the prepared generations in order; one whose KV claim does not fit yet
    /// stays first in line (`blocked`), and so does everything behind it.
    fn admit_ready(&mut self) -> (bool, bool) {
        let mut changed = false;
        while let Some(r) = self.ready.pop_front() {
            // A request admitted before it, for the same model, is still being prepared:
            // first come, first served.
            let slot = self.slots.iter().find(|s| Arc::ptr_eq(&s.kit, &r.kit));
            if slot.is_some_and(|s| s.preparing.iter().any(|&t| t < r.admitted)) {
                self.ready.push_front(r);
                return (changed, true);
            }
            changed = true;
            let began = match (r.events.is_closed(), self.status.shutting_down.load(Ordering::SeqCst)) {
                // The client left while it was prepared.
                (true, _) => Ok(Began::Done),
                (_, true) => Err((r.events.clone(), JobError::ShuttingDown)),
                _ => {
                    let events = r.events.clone();
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.start_generation(r)));
                    result.unwrap_or_else(|p| Err(JobError::Internal(panic_message(&*p)))).map_err(|e| (events, e))
                }
            };
            match began {
                Ok(Began::Wait(r)) => {
                    self.ready.push_front(*r);
                    return (changed, true);
                }
                Ok(Began::Running | Began::Preparing) => {}
                Ok(Began::Done) => self.admission.lock().expect("admission lock").finish(),
                Err((events, e)) => {
                    let _ = events.send(Event::Error(e));
                    self.admission.lock().expect("admission lock").finish();
                }
            }
        }
        (changed, false)
    }

    /// A generation back from being prepared: its model's place is free again, and it is
    /// next in line.
    fn prepared(&mut self, r: Ready) -> bool {
        if let Some(slot) = self.slots.iter_mut().find(|s| Arc::ptr_eq(&s.kit, &r.kit))
            && let Some(n) = slot.preparing.iter().position(|&t| t == r.admitted)
        {
            slot.preparing.remove(n);
        }
        // In the order they were admitted.
        let at = self.ready.iter().position(|q| q.admitted > r.admitted).unwrap_or(self.ready.len());
        self.ready.insert(at, r);
        true
    }

    /// Whether `job` can start now: a generation needs a place among its model's
    /// running sequences and the KV memory its request may reach; an unload waits for
    /// the model's sequences to finish; loading a model that would unload another waits
    /// for that one's sequences.
    fn ready_to_run(&self, job: &Job) -> Admit {
        let model = match &job.work {
            Work::Generate(g) => &g.model,
            Work::Embed(e) => &e.model,
            Work::Load { model, .. } => model,
            Work::Unload { model } => {
                let key = canonical(model);
                return match self.slots.iter().any(|s| s.name == key && s.in_use()) {
                    true => Admit::Later,
                    false => Admit::Done,
                };
            }
        };
        let key = canonical(model);
        let Some(slot) = self.slots.iter().find(|s| s.name == key) else {
            let full = self.slots.len() >= self.config.max_loaded.max(1);
            return match full && self.slots.iter().all(Slot::in_use) {
                true => Admit::Later,
                false => Admit::Done,
            };
        };
        let Work::Generate(g) = &job.work else { return Admit::Done };
        // Counting a prompt's tokens runs nothing.
        if g.count_only {
            return Admit::Done;
        }
        let ready = self.ready.iter().filter(|r| Arc::ptr_eq(&r.kit, &slot.kit)).count();
        if slot.running.len() + slot.preparing.len() + ready >= slot.parallel {
            return Admit::Later;
        }
        // A request that can never fit is answered (400) when it starts; one that fits
        // once others finish waits. Caches kept for reuse give way.
        let ctx = g.num_ctx.unwrap_or(slot.engine.context_len).max(1);
        let claim = kv_claim(slot, ctx, g.max_tokens, 0);
        let running: u64 = slot.running.iter().map(|r| r.kv_claim).sum();
        match claim <= slot.kv_limit && running + claim > slot.kv_limit {
            true => Admit::Later,
            false => Admit::Done,
        }
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
            Work::Generate(_) => unreachable!("generations start in the step loop"),
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
    /// used idle model beyond `max_loaded`) when needed.
    fn slot(&mut self, name: &str) -> Result<usize, JobError> {
        let info = self.registry.get(name).ok_or_else(|| JobError::ModelNotFound(name.to_string()))?;
        let key = canonical(name);
        if let Some(i) = self.slots.iter().position(|s| s.name == key) {
            match self.slots[i].files.changed() {
                Some(change) => self.unload_changed(i, change),
                None => {
                    let slot = self.slots.remove(i);
                    self.slots.push(slot);
                    return Ok(self.slots.len() - 1);
                }
            }
        }
        while self.slots.len() >= self.config.max_loaded.max(1) {
            match self.slots.iter().position(|s| !s.in_use()) {
                Some(i) => drop(self.slots.remove(i)),
                None => return Err(JobError::Internal("every loaded model is busy".into())),
            }
        }
        let mut opts = self.config.run.clone();
        // The server's `--sparse-ffn` applies to the models stored with neuron-group
        // bundles; the others run dense (a request that asks them for it gets a 400).
        if info.neuron_group.is_none() {
            opts.sparse_ffn = Default::default();
        }
        let started = Instant::now();
        // The draft model loads with it (its files watched too) and goes with it.
        let drafts = &self.config.drafts;
        let (loaded, files) = strata_tensor::mapped::watch(|| {
            let mut engine = crate::resolve::load(&info.spec, &opts)?;
            drafts.attach(&key, &mut engine, &opts)?;
            Ok(engine)
        });
        let mut engine = loaded.map_err(|e| {
            let msg = format!("loading `{name}`: {}", crate::errors::chain(&e));
            match is_device_error(&e) {
                true => JobError::Device(msg),
                false => JobError::Internal(msg),
            }
        })?;
        // A template `POST /api/create` gave (checked when it was created).
        if let Some(template) = info.modelfile.as_ref().and_then(|m| m.template.as_deref()) {
            let tok = Arc::get_mut(&mut engine.tokenizer).expect("a model just loaded shares its tokenizer with none");
            tok.set_chat_template(template).map_err(|e| text_error("template", e))?;
        }
        let kit = Arc::new(Kit {
            tokenizer: engine.tokenizer.clone(),
            chat: ChatTraits::of(&engine.tokenizer, info.modelfile.clone()),
            token_env: engine.token_env_cell(),
            vocab: engine.model.config().vocab_size,
            context_len: engine.context_len,
        });
        *self.status.device.lock().unwrap_or_else(|e| e.into_inner()) = Some(engine.device.clone());
        // A draft model keeps a cache of its own beside each sequence's.
        let mut position_bytes = engine.model.new_cache(1).map_err(|e| model_error(name, e))?.position_bytes();
        if let Some(d) = &engine.speculation.draft {
            position_bytes += d.model.new_cache(1).map_err(|e| model_error(name, e))?.position_bytes();
        }
        let full = position_bytes * engine.context_len as u64;
        let free = engine.model.free_memory().map(|f| (f as f64 * KV_MEMORY_SHARE) as u64);
        let kv_limit = match self.config.kv_memory {
            Some(bytes) => bytes,
            None => free.unwrap_or(full * DEFAULT_PARALLEL as u64).max(full),
        };
        let parallel =
            self.config.parallel.unwrap_or((kv_limit / full.max(1)).clamp(1, DEFAULT_PARALLEL as u64) as usize);
        tracing::info!(
            model = %key,
            device = %engine.device.device,
            seconds = started.elapsed().as_secs_f64(),
            parallel,
            kv_memory = %human_size(kv_limit),
            "model loaded"
        );
        self.slots.push(Slot {
            name: key,
            engine,
            running: Vec::new(),
            idle: Vec::new(),
            keep_alive: self.config.keep_alive,
            expires: None,
            size_bytes: info.size_bytes,
            position_bytes,
            kv_limit,
            parallel: parallel.max(1),
            kit,
            preparing: Vec::new(),
            files,
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

    /// Unloads slot `i`, one of whose files changed on disk since it loaded: its running
    /// requests fail naming the file (their passes may have read the new bytes, or zeros
    /// past a new end of file), and the next request loads the file as it is now.
    fn unload_changed(&mut self, i: usize, change: FileChange) {
        let slot = self.slots.remove(i);
        tracing::error!(model = %slot.name, running = slot.running.len(), "{change}: unloading the model");
        let error = JobError::Internal(format!("model `{}`: {change}", slot.name));
        for r in slot.running {
            self.admission.lock().expect("admission lock").finish();
            let _ = r.events.send(Event::Error(error.clone()));
        }
        self.publish();
    }

    fn unload_expired(&mut self) {
        let now = Instant::now();
        let before = self.slots.len();
        self.slots.retain(|s| s.in_use() || s.expires.is_none_or(|t| t > now));
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
                context_length: s.engine.context_len,
                expires_at: s.expires.map(|t| now.1 + t.saturating_duration_since(now.0)),
                sched: s.engine.model.scheduler().monitor(),
                device: s.engine.device.clone(),
                size_vram: s.engine.model.device_bytes(),
                batching: Batching {
                    running: s.running.len(),
                    waiting: self
                        .waiting
                        .iter()
                        .filter(|j| job_model(&j.work).is_some_and(|m| canonical(m) == s.name))
                        .count(),
                    parallel: s.parallel,
                    kv_cache_bytes: s.running.iter().map(|r| r.seq.cache_bytes()).sum::<u64>()
                        + s.idle.iter().map(|(c, _)| c.allocated_bytes()).sum::<u64>(),
                    kv_cache_limit_bytes: s.kv_limit,
                },
                speculation: crate::draft::SpeculationView::of(&s.engine),
            })
            .collect();
        *self.status.loaded.lock().expect("status lock") = list;
    }

    /// Loads a generation's model and hands the request to a thread that prepares it
    /// ([`prepare`]); it comes back to [`Worker::start_generation`].
    fn start_preparing(
        &mut self,
        job: GenerateJob,
        events: &tokio::sync::mpsc::UnboundedSender<Event>,
        admitted: Instant,
    ) -> Result<Began, JobError> {
        let load_start = Instant::now();
        let i = self.slot(&job.model)?;
        let load = load_start.elapsed();
        self.touch(i, job.keep_alive);
        let slot = &mut self.slots[i];
        self.preparers.start(slot.kit.clone(), job, events.clone(), admitted, load)?;
        slot.preparing.push(admitted);
        Ok(Began::Preparing)
    }
}

/// A model file of `slot` that shrank while a pass read it (the pass read zeros there,
/// see [`strata_tensor::mapped`]): its sequences end without that pass's output, with an error
/// naming the file, and it unloads once they retire (this step), so that the next
/// request loads the file as it is now.
fn file_fault(slot: &mut Slot) -> Option<JobError> {
    let change = slot.files.faulted()?;
    tracing::error!(model = %slot.name, running = slot.running.len(), "{change}: unloading the model");
    for r in &mut slot.running {
        r.seq.cancel();
        r.seq.drain_events().for_each(drop);
    }
    slot.keep_alive = KeepAlive::For(Duration::ZERO);
    Some(JobError::Internal(format!("model `{}`: {change}", slot.name)))
}

/// The model a job is for.
fn job_model(work: &Work) -> Option<&str> {
    match work {
        Work::Generate(g) => Some(&g.model),
        Work::Embed(e) => Some(&e.model),
        Work::Load { model, .. } | Work::Unload { model } => Some(model),
    }
}

/// KV bytes a request may reach: its prompt and `max_tokens` (or the whole context).
fn kv_claim(slot: &Slot, ctx: usize, max_tokens: Option<usize>, prompt: usize) -> u64 {
    let positions = max_tokens.map_or(ctx, |m| prompt.saturating_add(m).min(ctx));
    positions as u64 * slot.position_bytes
}

/// Whether loading failed for want of a device or its memory (a 503, not a 500).
fn is_device_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<strata_backend::BackendError>()
            || c.is::<strata_backend::cuda::CudaInitError>()
            || c.is::<strata_engine::session::DeviceTooSmall>()
            || c.downcast_ref::<ModelError>().is_some_and(|m| {
                matches!(m, ModelError::Backend(_) | ModelError::Sched(strata_sched::SchedError::Backend { .. }))
            })
    })
}

/// A model error as the client sees it: device trouble (GPU memory, a failed launch) is
/// 503 and names the device; anything else is an internal error.
fn model_error(model: &str, e: ModelError) -> JobError {
    let device = matches!(e, ModelError::Backend(_) | ModelError::Sched(strata_sched::SchedError::Backend { .. }));
    match device {
        true => JobError::Device(format!("model `{model}`: {e}")),
        false => JobError::Internal(format!("model `{model}`: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_backend::BackendError;

    /// Device errors are [`JobError::Device`] (a 503, see the server's error tests), naming
    /// GPU memory; others are [`JobError::Internal`] (a 500).
    #[test]
    fn device_errors_are_503_naming_gpu_memory_and_others_500() {
        let oom = BackendError::OutOfMemory { what: "a weight".into(), bytes: 1 << 30, msg: "OOM".into() };
        let e = model_error("m", ModelError::Backend(oom));
        let message = match e {
            JobError::Device(m) => m,
            other => panic!("not a device error: {other:?}"),
        };
        assert!(message.contains("GPU memory"), "{message}");
        let launch = BackendError::Device { op: "matvec".into(), msg: "CUDA_ERROR_LAUNCH_FAILED".into() };
        let in_layer = ModelError::Sched(strata_sched::SchedError::Backend { layer: 3, source: launch });
        assert!(matches!(model_error("m", in_layer), JobError::Device(_)));
        let other = model_error("m", ModelError::Tensors(strata_model::shapes::TensorError::Missing("x".into())));
        assert!(matches!(other, JobError::Internal(_)));
        // A model that fails to load for want of GPU memory is a 503 as well.
        let load = anyhow::Error::new(ModelError::Backend(BackendError::OutOfMemory {
            what: "w".into(),
            bytes: 1,
            msg: "OOM".into(),
        }))
        .context("model `m` on cuda:0");
        assert!(is_device_error(&load));
        // So is one whose context, with its weights, can never fit the GPU's free memory.
        let refused = anyhow::Error::new(strata_engine::session::DeviceTooSmall("needs 309 GiB".into()));
        assert!(is_device_error(&refused.context("model `m`")));
        assert!(!is_device_error(&anyhow::anyhow!("no such file")));
    }
}
