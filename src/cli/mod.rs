//! Command-line subcommands, one file each.
//!
//! A command writes its output with [`outln!`] and [`out!`], not `println!`: a write that
//! fails (stdout on a full disk, or a closed pipe under `serve`, which ignores SIGPIPE)
//! is then an error the command returns (exit 1), not a panic.

pub mod bench;
pub mod convert;
pub mod doctor;
pub mod export;
pub mod import;
pub mod inspect;
pub mod perplexity;
pub mod pull;
pub mod route;
pub mod run;
pub mod serve;
pub mod store_cmds;
pub mod tokenize;
pub mod top;
pub mod verify;

use clap::{Args, Parser, Subcommand};

use crate::engine::session::RunOptions;

/// `println!` to stdout that returns `anyhow::Result<()>` instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to stdout that returns `anyhow::Result<()>` instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}

pub(crate) use {out, outln};

#[derive(Parser, Debug)]
#[command(name = "strata", version, about = "An inference server for large language models")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text or JSON (for machines).
    #[arg(long = "log-format", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which log lines to write: a level (`error`, `warn`, `info`, `debug`, `trace`) or
    /// `target=level` directives. Default: `info` for `serve`, `warn` for the others.
    #[arg(long = "log-level", global = true, value_name = "FILTER", value_parser = parse_log_filter)]
    pub log_level: Option<String>,
    /// The config file (default: /etc/strata/strata.toml, else $STRATA_HOME/strata.toml,
    /// where present). Settings: defaults < this file < STRATA_* variables < flags.
    #[arg(long, global = true, value_name = "FILE", env = crate::env::CONFIG.name)]
    pub config: Option<std::path::PathBuf>,
}

fn parse_log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s).map(|_| s.to_string()).map_err(|e| e.to_string())
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the OpenAI and Ollama HTTP APIs.
    Serve(serve::ServeArgs),
    /// Models the running server has loaded.
    Ps(serve::PsArgs),
    /// Stop the running server.
    Stop(serve::StopArgs),
    /// Chat with a model in the terminal, or print one streamed answer to -p.
    Run(run::RunArgs),
    /// Log-probabilities of a model on a text or on a list of token ids.
    Perplexity(perplexity::PerplexityArgs),
    /// The token ids (and pieces) a model's tokenizer gives a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Measure prefill and decode speed.
    Bench(bench::BenchArgs),
    /// Add a model file or directory, or an Ollama model, to the model store.
    Import(import::ImportArgs),
    /// The models in the store ($STRATA_HOME/models).
    #[command(alias = "ls")]
    List(store_cmds::ListArgs),
    /// What a model in the store is.
    Show(store_cmds::ShowArgs),
    /// Delete models from the store.
    Rm(store_cmds::RmArgs),
    /// Copy a model in the store to another name (hard links: no space taken).
    Cp(store_cmds::CpArgs),
    /// Convert a model into a flat layer directory or a `.cawsf` file, quantizing if asked.
    Convert(convert::ConvertArgs),
    /// Export a model as a GGUF file that llama.cpp (and Ollama) load, quantizing if asked.
    Export(export::ExportArgs),
    /// Watch a running server: where each model's weights are, tokens, storage and
    /// copy rates, the batch and KV memory, redrawn live.
    Top(top::TopArgs),
    /// Rank an NDSQ .cawsf model's shards by how well they match a prompt (seed 000's
    /// router), within an optional byte budget.
    Route(route::RouteArgs),
    /// Show what a model file or directory holds (any format Strata reads).
    Inspect(inspect::InspectArgs),
    /// Check every checksum of a flat layer directory or `.cawsf` file.
    Verify(verify::VerifyArgs),
    /// Download a Hugging Face model (`hf:ORG/REPO[@REV]`) into the store.
    Pull(pull::PullArgs),
    /// What this machine offers: CPU features, memory, O_DIRECT, GPUs and the CUDA
    /// driver/NVRTC/cuBLAS/cuFile; with --compile-kernels, compiles every CUDA kernel.
    Doctor(doctor::DoctorArgs),
}

/// Options shared by every command that runs a model.
#[derive(Args, Debug, Clone)]
pub struct RunOpts {
    /// Where to run: `auto` (the first GPU that initialises, else the CPU), `cpu`,
    /// `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto", value_parser = parse_device_arg)]
    pub device: crate::backend::device::DeviceSpec,
    /// Worker threads (default: one per core; more than one per core is taken as one
    /// per core, with a warning).
    #[arg(long, default_value_t = 0, value_parser = parse_threads)]
    pub threads: usize,
    /// Context length in tokens (default: the length the model was trained for, shortened
    /// only where memory cannot hold the KV caches of `--parallel` sequences at it).
    #[arg(long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// Memory for layer weights (bytes, or with K/M/G/KiB/MiB/GiB); layers beyond it
    /// stream from storage, `0` streams them all. Default: what free memory holds after
    /// the KV cache, activations, embeddings and output head.
    #[arg(long = "memory-budget", value_name = "SIZE", value_parser = parse_size_arg)]
    pub memory_budget: Option<u64>,
    /// Page-locked host memory for streamed layers behind a GPU (bytes, or with
    /// K/M/G/KiB/MiB/GiB): those layers are copied to the GPU on every use instead of
    /// read from storage. Default: what free RAM holds after a tenth is left free. Not
    /// used on the CPU, where `--memory-budget` is RAM.
    #[arg(long = "host-budget", value_name = "SIZE", value_parser = parse_size_arg)]
    pub host_budget: Option<u64>,
    /// Layers read ahead of the one computing while streaming.
    #[arg(long = "prefetch-depth", default_value_t = crate::sched::DEFAULT_PREFETCH_DEPTH)]
    pub prefetch_depth: usize,
    /// How layers beyond the budget are handled (`lru` and `reload` are baselines for
    /// benchmarks).
    #[arg(long = "stream-policy", value_enum, default_value_t = crate::sched::Policy::Pinned)]
    pub stream_policy: crate::sched::Policy,
    /// Memory for a mixture-of-experts model's routed experts, cached between uses
    /// (bytes, with K/M/G/KiB/MiB/GiB, or a percentage of all experts such as `25%`).
    /// Default: what the memory budget leaves after the layer cores (attention, norms,
    /// router, shared expert).
    #[arg(long = "expert-cache", value_name = "SIZE", value_parser = crate::sched::experts::CacheSize::parse)]
    pub expert_cache: Option<crate::sched::experts::CacheSize>,
    /// Which experts the expert cache keeps: `lru`, `lfu` or `freq` (frequency-weighted
    /// recency).
    #[arg(long = "expert-policy", value_enum, default_value_t = crate::sched::expert_policy::CachePolicy::default())]
    pub expert_policy: crate::sched::expert_policy::CachePolicy,
    /// How a MoE layer's experts are loaded: `routed` (only those the router chose) or
    /// `all` (every expert with its layer: a baseline for benchmarks).
    #[arg(long = "experts", value_enum, default_value_t = crate::sched::ExpertLoading::Routed)]
    pub experts: crate::sched::ExpertLoading,
    /// A mixture-of-experts model on a GPU computes every routed expert on the CPU, from
    /// RAM, beside the GPU (llama.cpp's `--cpu-moe`): only hidden rows cross to the CPU
    /// and back. Neither this nor `--n-cpu-moe` (auto, the default on a GPU): where the
    /// routed experts and layer cores do not fit the memory budget, a plan made from
    /// measured rates keeps the most used experts in VRAM and splits the rest between the
    /// CPU and uploads. On the CPU device it changes nothing.
    #[arg(long = "cpu-moe", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set,
          conflicts_with = "n_cpu_moe")]
    pub cpu_moe: bool,
    /// A mixture-of-experts model on a GPU computes the routed experts of its first N MoE
    /// layers on the CPU, from RAM, and the others' on the GPU. N counts MoE layers, not
    /// all layers as llama.cpp's `--n-cpu-moe` does (a model's leading dense layers are
    /// not counted); 0 computes them all on the GPU. Default: auto (see `--cpu-moe`). On
    /// the CPU device it changes nothing.
    #[arg(long = "n-cpu-moe", value_name = "N")]
    pub n_cpu_moe: Option<u32>,
    /// Measure how often each MoE layer's router, applied to the previous layer's
    /// output, guesses the experts the layer takes (what a speculative prefetch would
    /// read); shown by `bench --json` as `moe.guess_accuracy`. Costs one router product
    /// per MoE layer.
    #[arg(long = "expert-guess", value_name = "BOOL", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub expert_guess: bool,
    /// How KV caches store keys and values: `f32`, `f16` (half the memory) or `q8_0`
    /// (9/32 of it). Default: f16 (the CPU and CUDA store all three).
    #[arg(long = "kv-type", value_enum)]
    pub kv_type: Option<crate::backend::KvType>,
    /// How a model converted with `--sparse-ffn` runs its FFNs: `off` (every neuron
    /// group), `topk=F` (per token, the fraction F of groups with the most gate
    /// activity), `threshold=T` (the groups whose mean |silu(gate)|·‖up‖·‖down‖ is at
    /// least T) or `auto` (the sparsest topk measured to cost at most 2% perplexity on
    /// SmolLM2: there, every group); add `,per=sequence` to choose once per sequence of a
    /// forward pass. Approximate: docs/benchmarks.md gives its cost.
    #[arg(long = "sparse-ffn", value_name = "SETTING", default_value = "off",
          value_parser = crate::model::sparse::SparseFfn::parse)]
    pub sparse_ffn: crate::model::sparse::SparseFfn,
}

/// Speculative decoding, for every command that generates (llama-server's flags).
#[derive(Args, Debug, Clone)]
pub struct DraftOpts {
    /// Speculative decoding: a draft model (a file, directory or store name, with the
    /// model's vocabulary) proposes the next tokens and one pass of the model verifies
    /// them all, or `ngram` drafts from the context itself (no second model). The text is
    /// what the model writes without it. Repeatable: `NAME=SPEC` gives the model NAME its
    /// draft (serve with several --model); a bare SPEC serves the first (or only) model. A
    /// draft model runs on its model's device with its context, resident (as free memory
    /// allows) whatever --memory-budget says, and loads and unloads with it.
    #[arg(long = "draft", value_name = "SPEC")]
    pub drafts: Vec<String>,
    /// Tokens drafted at most per step (0 to 64).
    #[arg(long = "draft-max", value_name = "N", default_value_t = crate::engine::speculative::DEFAULT_DRAFT_MAX,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=crate::engine::speculative::MAX_DRAFT as u64))]
    pub draft_max: usize,
    /// Fewer drafted tokens than this are not verified (the step decodes one token).
    #[arg(long = "draft-min", value_name = "N", default_value_t = crate::engine::speculative::DEFAULT_DRAFT_MIN,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=crate::engine::speculative::MAX_DRAFT as u64))]
    pub draft_min: usize,
    /// A draft model stops proposing where its most likely token is less likely than P
    /// (0 to 1). `auto` (the default): where the chance that all it drafted so far is
    /// kept is worth less of the model's time than another draft pass and verifying row
    /// cost (measured as it runs), so a model that streams its weights gets long drafts
    /// and a resident one beside a draft of its own size short ones.
    #[arg(long = "draft-p-min", value_name = "P", default_value = "auto", value_parser = parse_p_min)]
    pub draft_p_min: PMin,
}

/// `--draft-p-min`: `auto` or a probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PMin(pub Option<f32>);

fn parse_p_min(s: &str) -> Result<PMin, String> {
    match s.trim() {
        "auto" => Ok(PMin(None)),
        t => match t.parse::<f32>() {
            Ok(p) if (0.0..=1.0).contains(&p) => Ok(PMin(Some(p))),
            _ => Err(format!("`{s}` is not `auto` or a probability in [0, 1]")),
        },
    }
}

impl DraftOpts {
    /// Each model's draft, `default_model` taking a bare `--draft`; settings out of range
    /// are refused (exit 2).
    pub fn drafts(&self, default_model: &str) -> anyhow::Result<crate::draft::Drafts> {
        let settings = crate::engine::speculative::SpecSettings {
            max: self.draft_max,
            min: self.draft_min,
            p_min: self.draft_p_min.0,
        };
        crate::draft::Drafts::parse(&self.drafts, default_model, settings)
            .map_err(|e| crate::model::sparse::Refused(e).into())
    }
}

/// Writes to stdout and flushes, so that a full disk is seen here, not lost at exit.
pub fn write_stdout(text: std::fmt::Arguments) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_fmt(text).and_then(|()| stdout.flush()).context("writing to stdout")
}

fn parse_device_arg(s: &str) -> Result<crate::backend::device::DeviceSpec, String> {
    s.parse()
}

/// The most worker threads `--threads` takes: far more than any machine has cores, but
/// not what a slip of the keyboard asks for (each is a thread with its own stack).
pub const MAX_THREADS: usize = 1024;

/// `--threads`: 0 (one per core) up to [`MAX_THREADS`].
pub fn parse_threads(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| format!("`{s}` is not a thread count"))?;
    match n <= MAX_THREADS {
        true => Ok(n),
        false => Err(format!("{n} threads is more than the {MAX_THREADS} allowed (0 means one per core)")),
    }
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    crate::sched::plan::parse_size(s)
}

impl RunOpts {
    pub fn to_options(&self) -> anyhow::Result<RunOptions> {
        if self.prefetch_depth == 0 && self.stream_policy == crate::sched::Policy::Pinned {
            return Err(crate::model::sparse::Refused(
                "--prefetch-depth must be at least 1 (use --stream-policy reload for no prefetch)".into(),
            )
            .into());
        }
        Ok(RunOptions {
            threads: self.threads,
            context: self.ctx_size,
            sequences: 1,
            device: self.device,
            memory_budget: self.memory_budget,
            host_budget: self.host_budget,
            prefetch_depth: self.prefetch_depth,
            policy: self.stream_policy,
            expert_cache: self.expert_cache,
            expert_policy: self.expert_policy,
            expert_loading: self.experts,
            expert_split: self.expert_split()?,
            expert_guess: self.expert_guess,
            kv_type: self.kv_type,
            sparse_ffn: self.sparse_ffn,
        })
    }

    /// `--cpu-moe`, `--n-cpu-moe N` or neither. The two together are refused: clap
    /// refuses them on one command line, this where a config file or the environment
    /// sets one of them.
    fn expert_split(&self) -> anyhow::Result<crate::sched::placement::Mode> {
        use crate::sched::placement::Mode;
        match (self.cpu_moe, self.n_cpu_moe) {
            (true, Some(n)) => Err(crate::model::sparse::Refused(format!(
                "--cpu-moe and --n-cpu-moe {n} cannot both be set (one of them may come from the config file or a \
                 STRATA_* variable)"
            ))
            .into()),
            (true, None) => Ok(Mode::CpuMoe),
            (false, Some(n)) => Ok(Mode::NCpuMoe(n)),
            (false, None) => Ok(Mode::Auto),
        }
    }
}

/// Whether `e`, or what caused it, is a refused setting: a
/// [`Refused`](crate::model::sparse::Refused), a sparse setting the model refused, or
/// sampling settings out of range. `main` exits with 2 for these, as for a bad argument.
pub fn refused_in_chain(e: &anyhow::Error) -> bool {
    use crate::engine::tokenizer::TextError;
    use crate::model::decoder::ModelError;
    use crate::model::sparse::Refused;
    e.chain().any(|c| {
        c.is::<Refused>()
            || matches!(c.downcast_ref::<ModelError>(), Some(ModelError::Sparse { .. }))
            || matches!(c.downcast_ref::<TextError>(), Some(TextError::InvalidSampling { .. }))
    })
}

/// Runs the command; `settings` are what `serve` runs with (see [`crate::config`]).
pub fn dispatch(cli: Cli, settings: crate::settings::Settings) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => serve::main(a, settings),
        Command::Ps(a) => serve::ps(a),
        Command::Stop(a) => serve::stop(a),
        Command::Run(a) => run::main(a),
        Command::Perplexity(a) => perplexity::main(a),
        Command::Tokenize(a) => tokenize::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Import(a) => import::main(a),
        Command::List(a) => store_cmds::list(a),
        Command::Show(a) => store_cmds::show(a),
        Command::Rm(a) => store_cmds::rm(a),
        Command::Cp(a) => store_cmds::cp(a),
        Command::Convert(a) => convert::main(a),
        Command::Export(a) => export::main(a),
        Command::Route(a) => route::main(a),
        Command::Top(a) => top::main(a),
        Command::Inspect(a) => inspect::main(a),
        Command::Verify(a) => verify::main(a),
        Command::Pull(a) => pull::main(a),
        Command::Doctor(a) => doctor::main(a),
    }
}
