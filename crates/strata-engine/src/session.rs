//! The generation loop: prefill, decode, sampling, stop strings and UTF-8-safe
//! detokenization, reported as a stream of [`TokenEvent`]s.

use std::sync::Arc;

use anyhow::Context;

use super::context::{ContextChoice, ContextInputs, choose_context};
use super::tokenizer::TextTokenizer;
use strata_backend::cpu::CpuBackend;
use strata_backend::device::{DeviceInfo, DeviceSpec};
use strata_backend::{Backend, KvType};
use strata_model::config::ModelConfig;
use strata_model::decoder::DecoderModel;
use strata_model::{LanguageModel, ModelSource};
use strata_sched::expert_policy::CachePolicy;
use strata_sched::plan::{RuntimeShape, default_budget, estimate_runtime_bytes, human_size};
use strata_sched::upload::StageFactory;
use strata_sched::{DEFAULT_PREFETCH_DEPTH, ExpertLoading, Policy, SchedOptions};

use std::time::Duration;

use super::grammar::{GrammarSpec, TokenEnv, TokenEnvCell};
use super::sampler::SamplingParams;
use super::speculative::{
    DraftModel, SpecCounts, SpecError, SpecKind, SpecRequest, SpecSettings, Speculation, check_vocab,
};
use super::text_error::TextError;
use strata_model::decoder::ModelError;

mod split;

/// Prompt tokens per forward pass during prefill (bounds activation memory).
pub const PREFILL_CHUNK: usize = 512;

/// A model refused at load: what it needs at least does not fit the device's free
/// memory (the sizes named). Like running out of GPU memory, a 503 from the server.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DeviceTooSmall(pub String);

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Stop at the model's end-of-sequence tokens (true unless a caller wants raw text).
    pub stop_at_eos: bool,
    /// Report this many most likely alternatives with every token (0: none).
    pub top_logprobs: usize,
    /// What the output must match (`None`: free text). The generation stops with
    /// [`FinishReason::Stop`] where the grammar is complete, or at an end-of-sequence
    /// token the grammar allows, whatever `stop_at_eos` says.
    pub grammar: Option<GrammarSpec>,
    /// Keep special tokens in the text (tool-call and reasoning markers such as Mistral's
    /// `[TOOL_CALLS]` are special tokens; the parsers need to see them).
    pub keep_special_tokens: bool,
    /// Its own speculative decoding settings (each unset one the model's).
    pub speculative: SpecRequest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
    /// The consumer asked to stop (the client went away).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// What a generation reports as it goes.
#[derive(Clone, Debug)]
pub enum TokenEvent {
    /// Text that is final (never half a character, never part of a stop string).
    Text(String),
    /// A sampled token id, its log-probability under the model and the
    /// `top_logprobs` most likely alternatives.
    Token { id: u32, logprob: f32, top: Vec<(u32, f32)> },
}

#[derive(Clone, Debug)]
pub struct GenerationSummary {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values a cache already held (a previous exchange's).
    pub cached_tokens: usize,
    /// The stop string that ended it, if one did.
    pub stop_sequence: Option<String>,
    pub prefill: Duration,
    pub decode: Duration,
    /// Every generated token id (including an end-of-sequence token if one ended it).
    pub tokens: Vec<u32>,
    /// What speculative decoding drafted and kept for it.
    pub speculative: SpecCounts,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens; the context holds {context} (prompt plus at least one generated token)")]
    PromptTooLong { tokens: usize, context: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Text(#[from] TextError),
    /// The request's grammar does not compile for this model, or generation under it
    /// failed (the request's fault: a 400).
    #[error("{0}")]
    Grammar(String),
    /// The request's speculative decoding settings are out of range, or ask for a draft
    /// model the model was loaded without (a 400).
    #[error(transparent)]
    Speculative(#[from] SpecError),
}

/// Where and how a model runs (the options serve, run, perplexity and bench share).
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Worker threads (0: one per core).
    pub threads: usize,
    /// Context length in tokens (0: the model's trained length, shortened only where
    /// memory cannot hold it: see [`choose_context`]).
    pub context: usize,
    /// Sequences whose full-context KV caches the default context leaves room for
    /// (serve's `--parallel`; 1 otherwise).
    pub sequences: usize,
    /// Where the model runs (`auto`: the first GPU that initialises, else the CPU).
    pub device: DeviceSpec,
    /// Bytes of layer weights kept resident (`None`: what fits in free memory, see
    /// [`memory_budget`]); the rest stream from storage.
    pub memory_budget: Option<u64>,
    /// Bytes of streamed layers kept in page-locked host memory behind a GPU (`None`:
    /// what free RAM holds, see [`host_budget`]); not used on the CPU.
    pub host_budget: Option<u64>,
    /// Layers read ahead while streaming.
    pub prefetch_depth: usize,
    pub policy: Policy,
    /// Bytes of routed experts a MoE model keeps cached (`None`: what the budget
    /// leaves after the layer cores).
    pub expert_cache: Option<strata_sched::experts::CacheSize>,
    pub expert_policy: CachePolicy,
    pub expert_loading: ExpertLoading,
    /// Which MoE layers' routed experts the CPU computes beside a GPU (`--cpu-moe`,
    /// `--n-cpu-moe N`; `Auto`: the plan chooses where the layers do not fit the
    /// budget). Not used on the CPU device.
    pub expert_split: strata_sched::placement::Mode,
    /// Score a speculative guess of each MoE layer's experts.
    pub expert_guess: bool,
    /// How a model stored with neuron-group bundles runs its FFNs.
    pub sparse_ffn: strata_model::sparse::SparseFfn,
    /// How KV caches store keys and values (`None`: [`DEFAULT_KV_TYPE`] where the
    /// device stores it, else f32). `RunOptions::default()` asks for f32, as parity with
    /// a reference needs.
    pub kv_type: Option<KvType>,
}

/// How KV caches store keys and values unless told: on SmolLM2 with f32 weights its
/// log-probs stay within 0.007 of an f32 cache, for half the memory (see
/// docs/benchmarks.md, "KV cache types").
pub const DEFAULT_KV_TYPE: KvType = KvType::F16;

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: 0,
            context: 0,
            sequences: 1,
            device: DeviceSpec::Auto,
            memory_budget: None,
            host_budget: None,
            prefetch_depth: DEFAULT_PREFETCH_DEPTH,
            policy: Policy::Pinned,
            expert_cache: None,
            expert_policy: CachePolicy::default(),
            expert_loading: ExpertLoading::Routed,
            expert_split: strata_sched::placement::Mode::Auto,
            expert_guess: false,
            kv_type: Some(KvType::F32),
            sparse_ffn: Default::default(),
        }
    }
}

/// Of free memory, the fraction the default budget leaves unused (for the allocator, the
/// page cache of the always-resident weights, and everything else).
pub const BUDGET_HEADROOM: f64 = 0.1;

/// Where a model's weights go: the memory the compute reads, and behind it, on a GPU,
/// page-locked host memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Memory {
    /// Free memory the compute reads (VRAM on a GPU, RAM on the CPU), if known.
    pub free: Option<u64>,
    /// Free host RAM behind a GPU (`None` on the CPU, or unknown).
    pub host_free: Option<u64>,
    /// `cpu` or `cuda:N`, for messages.
    pub device: String,
}

/// How a model's layers are held under `opts`: the budget given, or else the default
/// (what free memory holds once the KV cache of one full-context sequence, prefill
/// activations, the always-resident weights and the prefetch ring have theirs). The KV
/// cache of one full-context sequence is the runtime allowance: caches beyond it press
/// on the budget.
///
/// A budget above the free memory it draws on is clamped to it, with a warning naming
/// both. Behind a GPU (`mem.host_free` known), the host tier's budget is `--host-budget`
/// or what free RAM holds; and a model whose always-resident weights, runtime memory and
/// streaming ring do not fit in free VRAM is refused here, with the sizes named, rather
/// than failing mid-request.
pub fn memory_budget(
    source: &ModelSource,
    config: &ModelConfig,
    context: usize,
    opts: &RunOptions,
    mem: &Memory,
) -> anyhow::Result<SchedOptions> {
    let runtime = estimate_runtime_bytes(&runtime_shape(config, context, 1, opts));
    let WeightSizes { always_resident, streamable, ring, .. } = weight_sizes(source, config, opts);
    let gpu = mem.host_free.is_some();
    if gpu && let Some(free) = mem.free {
        // The slots are needed only by what streams: never more than the layers.
        let ring = ring.min(streamable);
        let need = always_resident + runtime.total() + ring;
        if need > free {
            return Err(DeviceTooSmall(format!(
                "the model cannot run on {}: it needs {} of device memory at least ({} of embeddings, output head \
                 and norms, {} of KV cache and activations for a {context}-token context, {} of streaming \
                 slots), and {} is free; try a smaller --ctx-size or --prefetch-depth, or --device cpu",
                mem.device,
                human_size(need),
                human_size(always_resident),
                human_size(runtime.total()),
                human_size(ring),
                human_size(free)
            ))
            .into());
        }
    }
    let budget = match (opts.memory_budget, mem.free) {
        (Some(asked), Some(free)) if asked > free && streamable > free => {
            tracing::warn!(
                asked,
                free,
                device = mem.device,
                "--memory-budget {} is more than the {} free on {}: using {}",
                human_size(asked),
                human_size(free),
                mem.device,
                human_size(free)
            );
            Some(free)
        }
        (Some(asked), _) => Some(asked),
        (None, free) => free.map(|free| {
            let budget = default_budget(free, &runtime, always_resident + ring, BUDGET_HEADROOM);
            if runtime.total() > free {
                // The context alone takes what the layers could have had: every one streams.
                tracing::warn!(
                    "a {context}-token context needs {} of KV cache and activations, more than the {} free: every \
                     layer streams from storage; a smaller --ctx-size leaves memory for them",
                    human_size(runtime.total()),
                    human_size(free)
                );
            } else if budget < streamable {
                tracing::info!(
                    budget,
                    streamable,
                    free,
                    "the model's layers do not fit in free memory: streaming the rest"
                );
            }
            budget
        }),
    };
    let host_budget = match (gpu, opts.host_budget, mem.host_free) {
        (false, Some(_), _) => {
            tracing::warn!("--host-budget is not used on the CPU, where --memory-budget is RAM");
            0
        }
        (false, None, _) => 0,
        (true, Some(asked), Some(free)) if asked > free => {
            tracing::warn!(
                asked,
                free,
                "--host-budget {} is more than the {} of free RAM: using {}",
                human_size(asked),
                human_size(free),
                human_size(free)
            );
            free
        }
        (true, Some(asked), _) => asked,
        (true, None, free) => {
            let free = free.unwrap_or(0);
            // The staging ring is host memory too.
            free.saturating_sub((free as f64 * BUDGET_HEADROOM) as u64).saturating_sub(ring)
        }
    };
    Ok(SchedOptions {
        budget,
        policy: opts.policy,
        prefetch_depth: opts.prefetch_depth,
        runtime_allowance: runtime.kv_cache,
        buffered: false,
        expert_cache: opts.expert_cache,
        expert_policy: opts.expert_policy,
        expert_loading: opts.expert_loading,
        expert_guess: opts.expert_guess,
        sparse_ffn: opts.sparse_ffn,
        host_budget,
        split: None,
        stage: None,
        repack: false,
    })
}

/// The shape of `sequences` full-`context` KV caches and a prefill chunk's activations.
fn runtime_shape(config: &ModelConfig, context: usize, sequences: usize, opts: &RunOptions) -> RuntimeShape {
    RuntimeShape {
        hidden: config.hidden_size as u64,
        intermediate: config.intermediate_size as u64,
        kv_rows: config.layers.iter().map(|l| l.mixer.cached_rows() as u64).sum(),
        n_heads: config.n_heads as u64,
        n_kv_heads: config.n_kv_heads as u64,
        head_dim: config.head_dim as u64,
        vocab: config.vocab_size as u64,
        context: context as u64,
        sequences: sequences as u64,
        rows: PREFILL_CHUNK.min(context.max(1)) as u64,
        // Bytes per value, rounded up (q8_0 takes 1.125).
        kv_dtype_bytes: match opts.kv_type.unwrap_or(DEFAULT_KV_TYPE) {
            KvType::F32 => 4,
            KvType::F16 | KvType::Q8_0 => 2,
        },
    }
}

/// A model's weights as the memory plan sees them.
struct WeightSizes {
    /// Embeddings, output head, norms: never streamed.
    always_resident: u64,
    /// The layers' weights.
    streamable: u64,
    /// Of them, the routed experts' (MoE layers).
    routed: u64,
    /// The prefetch ring's slots: `prefetch_depth + 2` of the largest layer (a MoE
    /// layer's core only, when its routed experts are read on their own).
    ring: u64,
}

fn weight_sizes(source: &ModelSource, config: &ModelConfig, opts: &RunOptions) -> WeightSizes {
    let (mut layers, mut ring_layers) = (vec![0u64; config.n_layers], vec![0u64; config.n_layers]);
    let (mut always_resident, mut routed) = (0u64, 0u64);
    for (name, t) in &source.tensors {
        let bytes = t.byte_len() as u64;
        match strata_format::layer_tensor(name).filter(|&(i, _)| i < config.n_layers) {
            Some((i, local)) => {
                layers[i] += bytes;
                if strata_format::expert_tensor(local).is_some() {
                    routed += bytes;
                }
                let routed = opts.expert_loading == ExpertLoading::Routed;
                if !(routed && strata_format::unit_tensor(local).is_some()) {
                    ring_layers[i] += bytes;
                }
            }
            None => always_resident += bytes,
        }
    }
    let ring = (opts.prefetch_depth as u64 + 2) * ring_layers.iter().copied().max().unwrap_or(0);
    WeightSizes { always_resident, streamable: layers.iter().sum(), routed, ring }
}

/// The context a model runs with under `opts` on memory `mem` (see [`choose_context`]).
pub fn model_context(source: &ModelSource, config: &ModelConfig, opts: &RunOptions, mem: &Memory) -> ContextChoice {
    let WeightSizes { always_resident, streamable, ring, .. } = weight_sizes(source, config, opts);
    let sequences = opts.sequences.max(1);
    let inputs = ContextInputs {
        asked: opts.context,
        trained: config.max_position_embeddings,
        sequences,
        free: mem.free,
        headroom: BUDGET_HEADROOM,
        always_resident,
        layers: streamable,
        ring: ring.min(streamable),
        memory_budget: opts.memory_budget,
    };
    choose_context(&inputs, |tokens| estimate_runtime_bytes(&runtime_shape(config, tokens, sequences, opts)))
}

/// A loaded model with its tokenizer, ready to run.
pub struct Engine {
    pub name: String,
    pub model: Box<dyn LanguageModel>,
    /// Shared with the threads that turn requests into tokens.
    pub tokenizer: Arc<TextTokenizer>,
    pub context_len: usize,
    /// Where the model runs.
    pub device: DeviceInfo,
    /// How it runs its FFNs when stored with neuron-group bundles (`off` otherwise).
    pub sparse_ffn: strata_model::sparse::SparseFfn,
    /// The vocabulary as grammars see it, built on the first constrained request
    /// (see [`Engine::token_env`]).
    token_env: TokenEnvCell,
    /// Its speculative decoding: the draft model, the default settings, the totals.
    pub speculation: Speculation,
}

/// A model built on its backend, and the context it runs with.
struct Built {
    model: Box<dyn LanguageModel>,
    device: DeviceInfo,
    context: ContextChoice,
}

/// The model on the backend `--device` chooses: `auto` tries the first GPU and falls
/// back to the CPU.
fn build_model(source: &ModelSource, config: ModelConfig, opts: &RunOptions) -> anyhow::Result<Built> {
    use strata_backend::cuda::CudaBackend;
    /// On a GPU, its upload pipeline and its host-to-device bandwidth; host RAM is
    /// behind it.
    struct Gpu<'a> {
        stage: StageFactory,
        h2d: &'a dyn Fn() -> Option<f64>,
    }
    fn on<B: Backend>(
        be: Arc<B>,
        device: DeviceInfo,
        gpu: Option<Gpu<'_>>,
        (source, config, opts): (&ModelSource, ModelConfig, &RunOptions),
    ) -> anyhow::Result<Built> {
        let host_free = gpu.as_ref().map(|_| strata_backend::device::available_memory().unwrap_or(0));
        let mem = Memory { free: be.free_memory(), host_free, device: device.device.clone() };
        let kv_type = opts.kv_type.unwrap_or(match be.kv_types().contains(&DEFAULT_KV_TYPE) {
            true => DEFAULT_KV_TYPE,
            false => KvType::F32,
        });
        let opts = RunOptions { kv_type: Some(kv_type), ..opts.clone() };
        let context = model_context(source, &config, &opts, &mem);
        let mut sched = memory_budget(source, &config, context.tokens, &opts, &mem)?;
        match gpu {
            Some(gpu) => {
                let rates = split::GpuRates { vram_free: mem.free, h2d: gpu.h2d };
                sched.split = split::resolve(source, &config, &opts, &sched, &rates);
                sched.stage = Some(gpu.stage);
            }
            None if opts.expert_split != strata_sched::placement::Mode::Auto => {
                tracing::info!(
                    "--cpu-moe and --n-cpu-moe change nothing on the CPU device, which computes every expert"
                )
            }
            None => {}
        }
        let model = DecoderModel::with_options(config, source, be, &sched)
            .and_then(|m| m.with_kv_type(kv_type))
            .with_context(|| format!("model `{}` on {}", source.name, device.device))?;
        Ok(Built { model: Box::new(model), device, context })
    }
    let cuda = |b: CudaBackend| {
        // A recurrent state accumulates the GEMM's other rounding, as on the CPU below.
        let b = match config.linear_attn {
            Some(_) => b.row_invariant(),
            None => b,
        };
        let device = DeviceInfo { device: format!("cuda:{}", b.ordinal()), name: b.gpu_name().to_string() };
        let be = Arc::new(b);
        let up = be.clone();
        let stage = StageFactory(Arc::new(move |slot_len, ring, stats| up.stage(slot_len, ring, stats)));
        let probe = be.clone();
        let h2d = move || probe.h2d_bandwidth();
        on(be, device, Some(Gpu { stage, h2d: &h2d }), (source, config.clone(), opts))
    };
    let cpu = || {
        let be = match config.linear_attn {
            // A recurrent state accumulates the decode kernel's other rounding.
            Some(_) => CpuBackend::new(opts.threads).row_invariant(),
            None => CpuBackend::new(opts.threads),
        };
        let be = Arc::new(be);
        on(be, DeviceInfo::cpu(), None, (source, config.clone(), opts))
    };
    match opts.device {
        DeviceSpec::Cpu => cpu(),
        DeviceSpec::Cuda(n) => cuda(CudaBackend::new(n).with_context(|| format!("--device cuda:{n}"))?),
        DeviceSpec::Auto => match CudaBackend::new(0) {
            Ok(b) => cuda(b),
            Err(e) => {
                tracing::info!(reason = %e, "no usable GPU: running on the CPU");
                cpu()
            }
        },
    }
}

impl Engine {
    /// Loads a model SPEC that is a path or the demo (see [`ModelSource::from_path`];
    /// `resolve::load` takes store names too).
    pub fn load(spec: &str, opts: &RunOptions) -> anyhow::Result<Self> {
        let source = ModelSource::from_path(spec)?;
        Self::from_source(source, opts)
    }

    pub fn from_source(source: ModelSource, opts: &RunOptions) -> anyhow::Result<Self> {
        let config = source.config.clone();
        let tokenizer = Arc::new(TextTokenizer::for_model(&source)?);
        let trained = config.max_position_embeddings;
        let Built { model, device, context } = build_model(&source, config, opts)?;
        let context_len = context.tokens;
        tracing::info!(model = %source.name, context = context_len, trained, "context: {context}");
        if context_len > trained {
            tracing::warn!(
                model = %source.name,
                context = context_len,
                trained,
                "the context asked for is longer than the model was trained on: what it writes past its trained \
                 length may be garbage"
            );
        }
        let sparse_ffn = opts.sparse_ffn;
        let token_env = TokenEnvCell::default();
        let speculation = Speculation::default();
        Ok(Engine {
            name: source.checkpoint.name,
            model,
            tokenizer,
            context_len,
            device,
            sparse_ffn,
            token_env,
            speculation,
        })
    }

    /// The vocabulary as llguidance's token trie, for compiling grammars. Built once, on
    /// first use (a fraction of a second for a 50k vocabulary); later calls share it.
    pub fn token_env(&self) -> Result<&TokenEnv, GenerateError> {
        self.token_env.get(&self.tokenizer, self.model.config().vocab_size).map_err(GenerateError::Grammar)
    }

    /// Speculates with `draft` (another loaded model, kept as it was loaded) by default,
    /// drafting as `settings` say. Refused, saying why, when the two vocabularies differ
    /// (see [`check_vocab`]).
    pub fn set_draft(&mut self, draft: Engine, settings: SpecSettings) -> Result<(), String> {
        check_vocab(&self.tokenizer, &draft.tokenizer)
            .map_err(|e| format!("draft model `{}` cannot draft for `{}`: {e}", draft.name, self.name))?;
        settings.validate().map_err(|e| e.to_string())?;
        self.speculation.draft = Some(DraftModel { name: draft.name, model: draft.model });
        self.speculation.kind = SpecKind::Draft;
        self.speculation.settings = settings;
        Ok(())
    }

    /// Speculates by n-gram lookup in the context by default ([`SpecKind::Ngram`]).
    pub fn set_ngram(&mut self, settings: SpecSettings) -> Result<(), String> {
        settings.validate().map_err(|e| e.to_string())?;
        self.speculation.kind = SpecKind::Ngram;
        self.speculation.settings = settings;
        Ok(())
    }

    /// The cell [`Engine::token_env`] reads, for compiling grammars on another thread.
    pub fn token_env_cell(&self) -> TokenEnvCell {
        self.token_env.clone()
    }
}
