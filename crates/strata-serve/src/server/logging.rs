//! Log output: text for people, JSON for machines, and for the journal text with syslog
//! priority prefixes (`<6>`) and no timestamps or colours, which journald adds or drops
//! itself. The level filter can be changed while running (SIGHUP).

use std::sync::OnceLock;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, format::Format};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

type FilterHandle = reload::Handle<EnvFilter, Registry>;

static FILTER: OnceLock<FilterHandle> = OnceLock::new();

/// Installs the global logger writing to stderr. `level` is an `EnvFilter` directive
/// (checked by the command line parser; a bad one falls back to `info`).
pub fn init(level: &str, json: bool) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    use std::io::IsTerminal;
    let installed = if json {
        registry.with(layer.json()).try_init()
    } else if super::systemd::stderr_is_journal() {
        registry
            .with(layer.with_ansi(false).event_format(Journal(format().without_time().with_level(false))))
            .try_init()
    } else {
        registry.with(layer.with_ansi(std::io::stderr().is_terminal())).try_init()
    };
    if installed.is_ok() {
        let _ = FILTER.set(handle);
    }
}

fn format() -> Format {
    format::format()
}

/// Replaces the level filter; an error names what is wrong with `level`.
pub fn set_level(level: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
    match FILTER.get() {
        Some(handle) => handle.reload(filter).map_err(|e| e.to_string()),
        None => Err("no logger installed".into()),
    }
}

/// Prefixes each line with its syslog priority, as sd-daemon(3) describes.
struct Journal<F>(F);

impl<S, N, F> FormatEvent<S, N> for Journal<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}
