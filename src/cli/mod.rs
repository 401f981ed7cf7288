//! Command-line subcommands, one file each.

pub mod bench;
pub mod perplexity;
pub mod run;
pub mod serve;

use clap::{Args, Parser, Subcommand};

use crate::engine::session::RunOptions;

#[derive(Parser, Debug)]
#[command(name = "strata", version, about = "An inference server for large language models")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text or JSON (for machines); the level comes from STRATA_LOG.
    #[arg(long = "log-format", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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
    /// Measure prefill and decode speed.
    Bench(bench::BenchArgs),
}

/// Options shared by every command that runs a model.
#[derive(Args, Debug, Clone)]
pub struct RunOpts {
    /// Where to run: `cpu` (this build has no GPU backend yet).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Worker threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Context length in tokens (default: the model's, at most 4096).
    #[arg(long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
}

impl RunOpts {
    pub fn to_options(&self) -> RunOptions {
        RunOptions { threads: self.threads, context: self.ctx_size, device: Some(self.device.clone()) }
    }
}

pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => serve::main(a),
        Command::Ps(a) => serve::ps(a),
        Command::Stop(a) => serve::stop(a),
        Command::Run(a) => run::main(a),
        Command::Perplexity(a) => perplexity::main(a),
        Command::Bench(a) => bench::main(a),
    }
}
