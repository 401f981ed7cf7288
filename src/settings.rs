//! The settings in force and where each came from. `config.rs` makes them from the
//! command line, the config file and the environment, renders and reloads them.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    Env(String),
    Flag,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Env(name) => f.write_str(name),
            Source::Flag => f.write_str("command line"),
        }
    }
}

/// The settings in force for `serve`, with where each came from; what SIGHUP reloads
/// against.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The config file read, if any.
    pub file: Option<PathBuf>,
    /// Whether the file was named (`--config`, `STRATA_CONFIG`) rather than found.
    pub named: bool,
    /// Key → (values as written, source).
    pub values: BTreeMap<String, (Vec<String>, Source)>,
    /// Problems worth a warning once logging is up.
    pub warnings: Vec<String>,
}
