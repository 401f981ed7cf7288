//! `strata serve`, and `strata ps` / `strata stop`, which find a running server through
//! the PID file it writes under `$STRATA_HOME`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use super::RunOpts;
use crate::config::Settings;
use crate::model::demo::DEMO_NAME;
use crate::queue::KeepAlive;
use crate::queue::worker::{WorkerConfig, WorkerStatus};
use crate::server::{Access, ServeOptions, ServerConfig};

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
    #[arg(long = "queue-depth", default_value_t = 64)]
    pub queue_depth: usize,
    /// Accepted bearer key (repeatable, or comma-separated). None: no authentication.
    #[arg(long = "api-key")]
    pub api_keys: Vec<String>,
    /// A browser origin allowed besides localhost and app shells (repeatable; `*` for all).
    #[arg(long = "allow-origin")]
    pub allow_origins: Vec<String>,
    /// Largest request body (bytes, or with K/M/G/KiB/MiB/GiB).
    #[arg(long = "body-limit", default_value = "16MiB", value_parser = parse_size)]
    pub body_limit: u64,
    /// How long an idle model stays loaded (`5m`, `1h`, `-1` forever, `0` unload at once).
    #[arg(long = "keep-alive", default_value = "5m")]
    pub keep_alive: String,
    /// Models kept loaded at once.
    #[arg(long = "max-loaded-models", default_value_t = 1)]
    pub max_loaded: usize,
    /// On SIGTERM/SIGINT, how long running requests may finish before they are cancelled.
    #[arg(long = "grace-period", default_value = "10s")]
    pub grace_period: String,
    #[command(flatten)]
    pub run: RunOpts,
    /// Print the settings in force, and where each came from, then exit.
    #[arg(long = "print-config")]
    pub print_config: bool,
}

pub use crate::sched::plan::parse_size;

pub use crate::store::strata_home;

#[derive(Serialize, Deserialize, Debug)]
struct PidFile {
    pid: u32,
    addr: String,
}

fn pid_path() -> PathBuf {
    strata_home().join("strata.pid")
}

fn read_pid_file() -> anyhow::Result<PidFile> {
    let path = pid_path();
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no running server found ({} is missing)", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a Strata PID file", path.display()))
}

/// Whether `pid` runs (a zombie that exited but was not yet reaped does not).
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state letter follows the parenthesised command name.
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Writes `contents` to `path` through a temporary file and a rename.
fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// `NAME=SPEC` or `SPEC` (named after its file or directory stem).
fn model_entry(arg: &str) -> (String, String) {
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
        print!("{}", settings.render());
        return Ok(());
    }
    let keep_alive = KeepAlive::parse(&serde_json::Value::String(args.keep_alive.clone()))
        .map_err(|e| anyhow::anyhow!("--keep-alive: {e}"))?;
    let grace = crate::queue::parse_duration(&args.grace_period).map_err(|e| anyhow::anyhow!("--grace-period: {e}"))?;
    let api_keys = clean_list(&args.api_keys);
    let models = match args.models.is_empty() {
        true => vec![(DEMO_NAME.to_string(), DEMO_NAME.to_string())],
        false => args.models.iter().map(|m| model_entry(m)).collect(),
    };
    // A GPU asked for by name must be usable before the server listens.
    if let crate::backend::device::DeviceSpec::Cuda(n) = args.run.device {
        crate::backend::cuda::CudaBackend::check(n).with_context(|| format!("--device cuda:{n}"))?;
    }
    let opts = ServeOptions {
        models,
        worker: WorkerConfig { run: args.run.to_options()?, keep_alive, max_loaded: args.max_loaded },
        server: ServerConfig {
            api_keys,
            allowed_origins: clean_list(&args.allow_origins),
            body_limit: args.body_limit as usize,
            store: Some(strata_home()),
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

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().worker_threads(2).build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr()?;
        let home = strata_home();
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        if let Ok(old) = read_pid_file()
            && old.pid != std::process::id()
            && process_alive(old.pid)
        {
            anyhow::bail!("another strata serve (pid {}) is running on {}; `strata stop` stops it", old.pid, old.addr);
        }
        let (router, state, _worker) = crate::server::start(opts)?;
        write_atomic(
            &pid_path(),
            &serde_json::to_string(&PidFile { pid: std::process::id(), addr: local.to_string() })?,
        )
        .with_context(|| format!("writing {}", pid_path().display()))?;
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
                let _ = std::fs::remove_file(pid_path());
                std::process::exit(0);
            });
        };
        axum::serve(listener, router).with_graceful_shutdown(shutdown).await?;
        state.status.shutting_down.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(pid_path());
        tracing::info!("stopped");
        Ok(())
    })
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
/// as needing a restart.
async fn reload_on_hangup(state: crate::server::AppState, mut settings: Settings) {
    let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
    while hangup.recv().await.is_some() {
        crate::server::systemd::notify("RELOADING=1");
        match settings.reload() {
            Err(e) => tracing::error!("config not reloaded: {e}"),
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
fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to the server at {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = std::env::var("STRATA_API_KEY")
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
pub struct PsArgs {}

/// `strata ps`: the models the running server has loaded.
pub fn ps(_: PsArgs) -> anyhow::Result<()> {
    let pid = read_pid_file()?;
    let body = http_get(&pid.addr, "/api/ps")?;
    let v: serde_json::Value = serde_json::from_str(&body).context("the server's /api/ps answer is not JSON")?;
    println!("{:<32} {:>12} {:>8}  UNTIL", "NAME", "SIZE", "CONTEXT");
    for m in v["models"].as_array().into_iter().flatten() {
        let size = m["size"].as_u64().unwrap_or(0) as f64 / 1048576.0;
        println!(
            "{:<32} {:>9.1} MiB {:>8}  {}",
            m["name"].as_str().unwrap_or("?"),
            size,
            m["context_length"].as_u64().unwrap_or(0),
            m["expires_at"].as_str().unwrap_or("forever")
        );
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct StopArgs {
    /// Seconds to wait for the server to exit.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

/// `strata stop`: SIGTERM to the running server, then wait for it to exit.
pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    let pid = read_pid_file()?;
    if !process_alive(pid.pid) {
        let _ = std::fs::remove_file(pid_path());
        anyhow::bail!("the server (pid {}) is not running; removed its stale PID file", pid.pid);
    }
    // SAFETY: kill(2) with a pid read from our own PID file and a plain signal number.
    if unsafe { libc::kill(pid.pid as libc::pid_t, libc::SIGTERM) } != 0 {
        anyhow::bail!("could not signal pid {}: {}", pid.pid, std::io::Error::last_os_error());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(args.timeout);
    while process_alive(pid.pid) {
        if std::time::Instant::now() > deadline {
            anyhow::bail!("the server (pid {}) did not exit within {} s", pid.pid, args.timeout);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("stopped the server (pid {}) on {}", pid.pid, pid.addr);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
