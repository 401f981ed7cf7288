//! `strata serve`, and `strata ps` / `strata stop`, which find running servers through
//! the PID files they write under `$STRATA_HOME/run`, one per address: several daemons
//! (one per GPU, say) share one store.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use super::{DraftOpts, RunOpts};
use super::{out, outln};
use crate::engine::session::RunOptions;
use crate::model::demo::DEMO_NAME;
use crate::queue::KeepAlive;
use crate::queue::worker::{WorkerConfig, WorkerStatus};
use crate::server::listen::ConnLimits;
use crate::server::{Access, ServeOptions, ServerConfig};
use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A model to offer: SPEC (a model file or directory, a name in the store, or
    /// `strata-demo`) or NAME=SPEC. Repeatable; the first is loaded at start. Default: the
    /// built-in demo model. The store's models (`strata list`) are offered too.
    #[arg(long = "model", short = 'm')]
    pub models: Vec<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Requests that may wait for the worker; more get 429 (OpenAI) / 503 (Ollama).
    #[arg(long = "queue-depth", default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub queue_depth: usize,
    /// Accepted bearer key (repeatable, or comma-separated). None: no authentication.
    #[arg(long = "api-key")]
    pub api_keys: Vec<String>,
    /// A browser origin allowed besides localhost and app shells (repeatable; `*` for all).
    #[arg(long = "allow-origin")]
    pub allow_origins: Vec<String>,
    /// Largest request body (bytes, or with K/M/G/KiB/MiB/GiB).
    #[arg(long = "body-limit", value_name = "SIZE", default_value = "16MiB", value_parser = parse_body_limit)]
    pub body_limit: u64,
    /// How long an idle model stays loaded (`5m`, `1h`, `-1` forever, `0` unload at once).
    #[arg(long = "keep-alive", default_value = "5m")]
    pub keep_alive: String,
    /// Models kept loaded at once.
    #[arg(long = "max-loaded-models", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_loaded: usize,
    /// Sequences each model generates at once (their decode steps share one forward pass
    /// and one read of the weights); more requests wait in the queue. 0: what KV memory
    /// allows, at most 8.
    #[arg(long, default_value_t = 0)]
    pub parallel: usize,
    /// Prompt tokens one step runs when no request is decoding, shared by the requests
    /// prefilling; while one decodes, a long prompt runs in smaller slices (about 64
    /// rows a step in all) between its tokens.
    #[arg(long = "prefill-chunk", default_value_t = crate::engine::session::PREFILL_CHUNK, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub prefill_chunk: usize,
    /// KV cache memory each model's running requests may claim at once (bytes, or with
    /// K/M/G/KiB/MiB/GiB); a request claims its prompt plus max tokens (or its whole
    /// context). Unset: 90% of what is free once the model has loaded.
    #[arg(long = "kv-memory", value_name = "SIZE", value_parser = parse_kv_memory)]
    pub kv_memory: Option<u64>,
    /// Cut prompts longer than the context on `/v1` too, as `/api/chat` and
    /// `/api/generate` always do (the oldest messages other than system ones first, then
    /// the middle); off, `/v1` refuses them with OpenAI's `context_length_exceeded`.
    #[arg(long = "truncate-prompts", value_name = "BOOL", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub truncate_prompts: bool,
    /// On SIGTERM/SIGINT, how long running requests may finish before they are cancelled.
    #[arg(long = "grace-period", default_value = "10s")]
    pub grace_period: String,
    /// How long a client may take to send a request's head (request line and headers),
    /// counted from connecting, or on a kept-alive connection from the request's first
    /// byte; then the connection is closed. `0`: no limit.
    #[arg(long = "header-timeout", value_name = "DURATION", default_value = "60s", value_parser = parse_timeout)]
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request; then it is
    /// closed. A request being answered (a long prefill, a long stream) is never cut.
    /// `0`: no limit.
    #[arg(long = "idle-timeout", value_name = "DURATION", default_value = "75s", value_parser = parse_timeout)]
    pub idle_timeout: Duration,
    /// Connections open at once. Over it, a new connection closes the one that has waited
    /// longest without a request in progress (or, when every one is answering a request,
    /// is closed itself). At most the open-file limit less 256.
    #[arg(long = "max-connections", default_value_t = 4096, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    #[command(flatten)]
    pub run: RunOpts,
    #[command(flatten)]
    pub draft: DraftOpts,
    /// Print the settings in force, and where each came from, then exit.
    #[arg(long = "print-config")]
    pub print_config: bool,
}

pub use crate::sched::plan::parse_size;

/// `--body-limit`: at least 1 KiB (a smaller limit refuses every request).
fn parse_body_limit(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if n < 1024 {
        return Err(format!("{n} bytes is too small for any request; give at least 1KiB"));
    }
    Ok(n)
}

/// `--kv-memory`: above 0.
fn parse_kv_memory(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("0 bytes leaves no request any KV cache; leave it unset for 90% of what is free".into()),
        n => Ok(n),
    }
}

/// `--header-timeout`, `--idle-timeout`: a duration (`60s`, `2m`, seconds as a number);
/// `0` is no limit.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs = crate::queue::parse_duration(s)?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is not a duration of 0 or more"))
}

pub use crate::store::strata_home;

#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct PidFile {
    pid: u32,
    pub(crate) addr: String,
    /// When the process started (`/proc/PID/stat`'s start time, in clock ticks since
    /// boot): a PID the system has since given to another process is not the server's.
    /// Absent in files that older versions wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started: Option<u64>,
}

impl PidFile {
    /// This process, serving on `addr`.
    fn mine(addr: String) -> Self {
        let pid = std::process::id();
        PidFile { pid, addr, started: process_started(pid) }
    }

    /// Whether the process that wrote this file still runs: its PID is alive and is still
    /// that process (its start time matches; for a file without one, its command line is
    /// a `serve`). After a crash or a reboot the PID may be another program's, which
    /// `strata stop` must not signal.
    fn alive(&self) -> bool {
        if !process_alive(self.pid) {
            return false;
        }
        match self.started {
            Some(t) => process_started(self.pid) == Some(t),
            None => std::fs::read(format!("/proc/{}/cmdline", self.pid))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == b"serve")),
        }
    }
}

/// When process `pid` started, in clock ticks since boot (field 22 of `/proc/PID/stat`).
fn process_started(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the parenthesised command name, from the state (field 3) on.
    stat.rsplit_once(") ")?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Where servers write their PID files.
fn pid_dir() -> PathBuf {
    strata_home().join("run")
}

/// The PID file of the server listening on `addr`: `serve-127.0.0.1_8000.pid`.
fn pid_path(addr: &SocketAddr) -> PathBuf {
    let name: String =
        addr.to_string().chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
    pid_dir().join(format!("serve-{}.pid", name.trim_matches('_')))
}

/// Writes `pid`'s file at `path`, whole or not at all, unless a live server holds it:
/// the file is written aside and hard-linked into place, which fails if the name exists,
/// so of two servers starting at once exactly one takes it. A file whose process is gone
/// (or that is not a PID file) is replaced.
fn take_pid_file(path: &Path, pid: &PidFile) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}.{:?}", std::process::id(), std::thread::current().id()));
    std::fs::write(&tmp, serde_json::to_string(pid)?).with_context(|| format!("writing {}", tmp.display()))?;
    let taken = (|| {
        for _ in 0..3 {
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if let Ok(old) = read_pid_file(path)
                        && old.alive()
                    {
                        anyhow::bail!(
                            "another strata serve (pid {}) is running on {}; `strata stop --port {}` stops it",
                            old.pid,
                            old.addr,
                            old.addr.rsplit_once(':').map_or("", |(_, p)| p)
                        );
                    }
                    // Stale: remove it and try again (another server may win the retry).
                    let _ = std::fs::remove_file(path);
                }
                // A filesystem without hard links: create-if-absent, then write.
                Err(_) => {
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(path)
                        .with_context(|| format!("writing {}", path.display()))?;
                    return f
                        .write_all(serde_json::to_string(pid)?.as_bytes())
                        .with_context(|| format!("writing {}", path.display()));
                }
            }
        }
        anyhow::bail!("{} keeps changing under us: is another server starting?", path.display())
    })();
    let _ = std::fs::remove_file(&tmp);
    taken
}

fn read_pid_file(path: &Path) -> anyhow::Result<PidFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a Strata PID file", path.display()))
}

/// The servers that wrote PID files under this `$STRATA_HOME` (live or not), by address:
/// `run/serve-*.pid`, and the single `strata.pid` older versions wrote.
fn pid_files() -> Vec<(PathBuf, PidFile)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(pid_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pid"))
        .collect();
    paths.push(strata_home().join("strata.pid"));
    paths.sort();
    paths.into_iter().filter_map(|p| read_pid_file(&p).ok().map(|f| (p, f))).collect()
}

/// The live servers, optionally only the one on `port`; an error says what was looked for.
pub(crate) fn running(port: Option<u16>) -> anyhow::Result<Vec<(PathBuf, PidFile)>> {
    let (live, stale): (Vec<_>, Vec<_>) = pid_files().into_iter().partition(|(_, f)| f.alive());
    for (path, _) in &stale {
        let _ = std::fs::remove_file(path);
    }
    let on_port = |f: &PidFile| port.is_none_or(|p| f.addr.rsplit_once(':').is_some_and(|(_, q)| q == p.to_string()));
    let live: Vec<_> = live.into_iter().filter(|(_, f)| on_port(f)).collect();
    if live.is_empty() {
        match port {
            Some(p) => anyhow::bail!("no running server on port {p} (no live PID file in {})", pid_dir().display()),
            None => anyhow::bail!("no running server found (no live PID file in {})", pid_dir().display()),
        }
    }
    Ok(live)
}

/// Whether `pid` runs (a zombie that exited but was not yet reaped does not).
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state letter follows the parenthesised command name.
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// `NAME=SPEC` or `SPEC` (named after its file or directory stem).
pub(crate) fn model_entry(arg: &str) -> (String, String) {
    if let Some((name, spec)) = arg.split_once('=')
        && !name.is_empty()
        && !name.contains('/')
    {
        return (name.to_string(), spec.to_string());
    }
    let path = Path::new(arg.trim_end_matches('/'));
    // A name in the store keeps its namespace and tag.
    if !path.exists() && crate::store::ModelName::parse(arg).is_ok() {
        return (arg.to_string(), arg.to_string());
    }
    // A model file is named without its extension; a directory keeps its whole name
    // (`llama-3.2-1b` is not `llama-3` with an extension).
    let is_model_file = matches!(path.extension().and_then(|e| e.to_str()), Some("gguf" | "cawsf" | "safetensors"));
    let name = match is_model_file {
        true => path.file_stem(),
        false => path.file_name(),
    };
    let name = name.map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| arg.to_string());
    (name, arg.to_string())
}

pub fn main(args: ServeArgs, settings: Settings) -> anyhow::Result<()> {
    if args.print_config {
        out!("{}", settings.render())?;
        return Ok(());
    }
    let keep_alive = KeepAlive::parse(&serde_json::Value::String(args.keep_alive.clone()))
        .map_err(|e| crate::model::sparse::Refused(format!("--keep-alive: {e}")))?;
    let grace = crate::queue::parse_duration(&args.grace_period)
        .map_err(|e| crate::model::sparse::Refused(format!("--grace-period: {e}")))?;
    let api_keys = clean_list(&args.api_keys);
    if api_keys.is_empty() && !args.api_keys.is_empty() {
        tracing::warn!("the API keys given are empty: they are ignored, and requests need no key");
    }
    let models = match args.models.is_empty() {
        true => vec![(DEMO_NAME.to_string(), DEMO_NAME.to_string())],
        false => args.models.iter().map(|m| model_entry(m)).collect(),
    };
    let drafts = args.draft.drafts(&models[0].0)?;
    check_drafts(&drafts, &models)?;
    // A GPU asked for by name must be usable before the server listens.
    if let crate::backend::device::DeviceSpec::Cuda(n) = args.run.device {
        crate::backend::cuda::CudaBackend::check(n).with_context(|| format!("--device cuda:{n}"))?;
    }
    let opts = ServeOptions {
        models,
        worker: WorkerConfig {
            run: RunOptions { sequences: args.parallel.max(1), ..args.run.to_options()? },
            keep_alive,
            max_loaded: args.max_loaded,
            parallel: (args.parallel > 0).then_some(args.parallel),
            prefill_chunk: args.prefill_chunk,
            kv_memory: args.kv_memory,
            drafts,
        },
        server: ServerConfig {
            api_keys,
            allowed_origins: clean_list(&args.allow_origins),
            body_limit: args.body_limit as usize,
            store: Some(strata_home()),
            sparse_ffn: args.run.sparse_ffn,
            truncate_prompts: args.truncate_prompts,
            ..ServerConfig::default()
        },
        queue_depth: args.queue_depth,
        preload: true,
    };
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .or_else(|_| {
            use std::net::ToSocketAddrs;
            (args.host.as_str(), args.port).to_socket_addrs()?.next().ok_or_else(|| std::io::Error::other("no address"))
        })
        .with_context(|| format!("--host {}: not an address", args.host))?;
    if opts.server.api_keys.is_empty() && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "listening beyond this machine without API keys: whoever reaches it can use it and change its \
             store (--api-key or STRATA_API_KEY sets keys)"
        );
    }

    let open_files = crate::server::listen::raise_open_files_limit();
    let limits = ConnLimits {
        header_timeout: (!args.header_timeout.is_zero()).then_some(args.header_timeout),
        idle_timeout: (!args.idle_timeout.is_zero()).then_some(args.idle_timeout),
        max_connections: crate::server::listen::connection_cap(args.max_connections, open_files),
    };
    if limits.max_connections < args.max_connections {
        tracing::warn!(
            open_files = open_files.unwrap_or(0),
            max_connections = limits.max_connections,
            "--max-connections lowered to fit the open-file limit (RLIMIT_NOFILE); raise it (LimitNOFILE= under systemd) for more"
        );
    }

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().worker_threads(2).build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr()?;
        let run_dir = pid_dir();
        std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
        let pid_file = pid_path(&local);
        take_pid_file(&pid_file, &PidFile::mine(local.to_string()))?;
        let (router, state, _worker) = match crate::server::start(opts) {
            Ok(started) => started,
            Err(e) => {
                let _ = std::fs::remove_file(&pid_file);
                return Err(e);
            }
        };
        tracing::info!(%local, config = %settings.file.as_deref().map(|p| p.display().to_string()).unwrap_or("none".into()), "Strata listening");
        if !crate::server::systemd::stderr_is_journal() {
            eprintln!("Strata listening on http://{local}");
        }
        tokio::spawn(notify_when_ready(state.status.clone(), local));
        tokio::spawn(reload_on_hangup(state.clone(), settings));

        let status = state.status.clone();
        let shutdown = async move {
            wait_for_signal().await;
            crate::server::systemd::notify("STOPPING=1");
            tracing::info!(grace_seconds = grace, "shutting down: finishing requests in flight");
            // After the grace period, running work is cancelled and queued work refused.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs_f64(grace.max(0.0))).await;
                status.shutting_down.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(5)).await;
                tracing::warn!("connections still open after the grace period; exiting");
                let _ = std::fs::remove_file(pid_path(&local));
                std::process::exit(0);
            });
        };
        crate::server::listen::serve(listener, router, limits, shutdown).await?;
        state.status.shutting_down.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&pid_file);
        tracing::info!("stopped");
        Ok(())
    })
}

/// Refuses, before the server listens, a `--draft NAME=SPEC` whose NAME is no model the
/// server offers (a `--model` or a store model) and a draft SPEC that is neither a file
/// or directory nor a store name. Whether its vocabulary fits is known when it loads.
fn check_drafts(drafts: &crate::draft::Drafts, models: &[(String, String)]) -> anyhow::Result<()> {
    use crate::queue::models::canonical;
    let store = crate::store::Store::default();
    for (name, source) in drafts.entries() {
        let offered = models.iter().any(|(n, _)| canonical(n) == name) || store.get(name).is_ok();
        if !offered {
            return Err(crate::model::sparse::Refused(format!(
                "--draft {name}=...: no model named `{name}` (a --model NAME, or a model in the store)"
            ))
            .into());
        }
        if let crate::draft::DraftSource::Model(spec) = source
            && spec != DEMO_NAME
        {
            let (path, _) = crate::resolve::spec_path(Path::new(spec)).with_context(|| format!("--draft {spec}"))?;
            if !path.exists() {
                anyhow::bail!("--draft {spec}: no such file or directory");
            }
        }
    }
    Ok(())
}

/// Empty entries dropped (`STRATA_API_KEY=""` means no keys, not an empty key).
fn clean_list(items: &[String]) -> Vec<String> {
    items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// Tells systemd the server is ready once the startup model has loaded.
async fn notify_when_ready(status: WorkerStatus, local: SocketAddr) {
    while !status.ready.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::info!("ready");
    crate::server::systemd::notify(&format!("READY=1\nSTATUS=serving on http://{local}"));
}

/// SIGHUP: rereads the config file. API keys, allowed origins and the log level change
/// at once; the other settings are read at start only, so a change to them is logged
/// as needing a restart. A file that is refused (see [`Settings::reload`]) changes
/// nothing and is logged as an error.
async fn reload_on_hangup(state: crate::server::AppState, mut settings: Settings) {
    let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
    while hangup.recv().await.is_some() {
        crate::server::systemd::notify("RELOADING=1");
        match settings.reload() {
            Err(e) => tracing::error!("config not reloaded, the settings in force stay: {e}"),
            Ok((new, changed)) => {
                for warning in &new.warnings {
                    tracing::warn!("{warning}");
                }
                let mut applied = Vec::new();
                let mut restart = Vec::new();
                for key in &changed {
                    match key.as_str() {
                        "api-key" | "allow-origin" => applied.push(key.as_str()),
                        "log-level" => {
                            let level = new.get(key).first().cloned().unwrap_or_else(|| "info".to_string());
                            match crate::server::logging::set_level(&level) {
                                Ok(()) => applied.push(key.as_str()),
                                Err(e) => tracing::error!("log-level `{level}` not applied: {e}"),
                            }
                        }
                        _ => restart.push(key.as_str()),
                    }
                }
                state.set_access(Access {
                    api_keys: clean_list(new.get("api-key")),
                    allowed_origins: clean_list(new.get("allow-origin")),
                });
                let file = new.file.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "none".into());
                tracing::info!(config = %file, applied = ?applied, "config reloaded");
                if !restart.is_empty() {
                    tracing::warn!(settings = ?restart, "changed settings take effect at the next restart");
                }
                if new.open_access() && !settings.open_access() {
                    tracing::warn!(config = %file, "`api-key = []`: authentication is off, every route is open");
                }
                settings = new;
            }
        }
        crate::server::systemd::notify("READY=1");
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

/// A GET to the running server; returns the body.
pub(crate) fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to the server at {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = std::env::var(crate::config::env_name("api-key"))
        .ok()
        .and_then(|k| k.split(',').next().map(|k| format!("Authorization: Bearer {}\r\n", k.trim())))
        .unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").context("malformed HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") {
        anyhow::bail!("{path}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

#[derive(Args, Debug)]
pub struct PsArgs {
    /// Only the server listening on this port (default: every server using this
    /// `$STRATA_HOME`).
    #[arg(long)]
    pub port: Option<u16>,
}

/// `strata ps`: each running server, and the models it has loaded.
pub fn ps(args: PsArgs) -> anyhow::Result<()> {
    for (_, pid) in running(args.port)? {
        outln!("server pid {} on {}", pid.pid, pid.addr)?;
        let body = http_get(&pid.addr, "/api/ps")?;
        let v: serde_json::Value = serde_json::from_str(&body).context("the server's /api/ps answer is not JSON")?;
        outln!("  {:<32} {:>12} {:>8}  UNTIL", "NAME", "SIZE", "CONTEXT")?;
        for m in v["models"].as_array().into_iter().flatten() {
            let size = m["size"].as_u64().unwrap_or(0) as f64 / 1048576.0;
            outln!(
                "  {:<32} {:>9.1} MiB {:>8}  {}",
                m["name"].as_str().unwrap_or("?"),
                size,
                m["context_length"].as_u64().unwrap_or(0),
                m["expires_at"].as_str().unwrap_or("forever")
            )?;
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct StopArgs {
    /// Only the server listening on this port (default: every server using this
    /// `$STRATA_HOME`).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds to wait for each server to exit.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

/// `strata stop`: SIGTERM to the running servers (or the one on `--port`), then wait for
/// them to exit.
pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    let servers = running(args.port)?;
    for (_, pid) in &servers {
        // SAFETY: kill(2) with a pid read from a PID file of ours and a plain signal number.
        if unsafe { libc::kill(pid.pid as libc::pid_t, libc::SIGTERM) } != 0 {
            anyhow::bail!("could not signal pid {}: {}", pid.pid, std::io::Error::last_os_error());
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(args.timeout);
    for (path, pid) in &servers {
        while pid.alive() {
            if std::time::Instant::now() > deadline {
                anyhow::bail!("the server (pid {}) did not exit within {} s", pid.pid, args.timeout);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(path);
        eprintln!("stopped the server (pid {}) on {}", pid.pid, pid.addr);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_servers_taking_one_pid_file_at_once_exactly_one_wins_and_a_stale_one_is_replaced() {
        let dir = std::env::temp_dir().join(format!("strata-pid-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve-127.0.0.1_1.pid");
        let me = std::process::id();
        let barrier = std::sync::Barrier::new(8);
        let wins: usize = std::thread::scope(|s| {
            let tries: Vec<_> = (0..8)
                .map(|i| {
                    let (path, barrier) = (&path, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        take_pid_file(path, &PidFile::mine(format!("127.0.0.1:{i}"))).is_ok()
                    })
                })
                .collect();
            tries.into_iter().map(|t| t.join().unwrap() as usize).sum()
        });
        assert_eq!(wins, 1, "exactly one of eight racing servers takes the PID file");
        let held = read_pid_file(&path).unwrap();
        assert_eq!(held.pid, me);
        let err = take_pid_file(&path, &PidFile::mine("127.0.0.1:9".into())).unwrap_err().to_string();
        assert!(err.contains(&format!("pid {me}")) && err.contains(&held.addr), "{err}");
        // A PID file whose process is gone, or that is not a PID file, is taken over.
        for stale in [r#"{"pid": 4000000000, "addr": "127.0.0.1:1"}"#, "garbage"] {
            std::fs::write(&path, stale).unwrap();
            take_pid_file(&path, &PidFile::mine("127.0.0.1:2".into())).unwrap();
            assert_eq!(read_pid_file(&path).unwrap().addr, "127.0.0.1:2");
            std::fs::remove_file(&path).unwrap();
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no temporary file is left behind");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_pid_file_names_its_process_not_whoever_has_the_pid_now() {
        assert!(PidFile::mine("127.0.0.1:1".into()).alive(), "this process, as it wrote itself");
        let me = std::process::id();
        let started = process_started(me).expect("a start time");
        // The PID given since to another process (another start time) is not the server.
        assert!(!PidFile { pid: me, addr: "127.0.0.1:1".into(), started: Some(started + 1) }.alive());
        // An old file without a start time: the PID must be a `serve` (a test binary is not).
        let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!PidFile { pid: other.id(), addr: "127.0.0.1:1".into(), started: None }.alive());
        other.kill().unwrap();
        other.wait().unwrap();
        let old: PidFile = serde_json::from_str(r#"{"pid": 1, "addr": "127.0.0.1:1"}"#).unwrap();
        assert_eq!(old.started, None);
    }

    #[test]
    fn pid_files_are_named_by_address() {
        let name = |a: &str| pid_path(&a.parse().unwrap()).file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name("127.0.0.1:8000"), "serve-127.0.0.1_8000.pid");
        assert_eq!(name("[::1]:11434"), "serve-1__11434.pid");
        assert_ne!(name("127.0.0.1:8000"), name("127.0.0.1:8001"));
    }

    #[test]
    fn sizes_and_model_names() {
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert!(parse_size("lots").is_err());
        assert_eq!(model_entry("tiny=/m/x"), ("tiny".into(), "/m/x".into()));
        assert_eq!(model_entry("/models/llama-3.2-1b/"), ("llama-3.2-1b".into(), "/models/llama-3.2-1b/".into()));
        assert_eq!(model_entry("strata-demo"), ("strata-demo".into(), "strata-demo".into()));
        assert_eq!(model_entry("/m/tiny.gguf"), ("tiny".into(), "/m/tiny.gguf".into()));
        assert_eq!(model_entry("team/llama3:q4"), ("team/llama3:q4".into(), "team/llama3:q4".into()));
    }
}
