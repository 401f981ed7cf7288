use strata::cli::{Command, LogFormat};

fn main() -> std::process::ExitCode {
    let (cli, settings) = match strata::config::parse(std::env::args_os()) {
        Ok(parsed) => parsed,
        Err(e) => e.exit(),
    };
    // A one-shot command whose output is closed (`strata list | head -1`) ends quietly,
    // as Unix tools do, instead of failing on the write. The server keeps Rust's ignored
    // SIGPIPE: a client that hangs up must not end it.
    if !matches!(cli.command, Command::Serve(_)) {
        // SAFETY: signal(2) with a valid signal number and SIG_DFL, before any thread
        // that could be writing has started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // The server logs its requests; one-shot commands only warnings.
    let default_level = if matches!(cli.command, Command::Serve(_)) { "info" } else { "warn" };
    let level = cli.log_level.clone().unwrap_or_else(|| default_level.to_string());
    strata::server::logging::init(&level, cli.log_format == LogFormat::Json);
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    match strata::cli::dispatch(cli, settings) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", strata::errors::chain(&e));
            // A setting out of range, or one the model cannot take, is a usage error, as
            // clap's are.
            match strata::cli::refused_in_chain(&e) {
                true => std::process::ExitCode::from(2),
                false => std::process::ExitCode::FAILURE,
            }
        }
    }
}
