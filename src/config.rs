//! Settings: built-in defaults < config file (TOML) < environment `STRATA_*` < flags.
//!
//! A setting is a long option of `strata serve` or a global option. In the config file
//! its key is the flag's name (`memory-budget = "8GiB"`, `api-key = ["k1"]`) and its value
//! has the flag's type, uncoerced (`threads = 4`, `expert-guess = true`); in the
//! environment it is `STRATA_` and the name in capitals (`STRATA_MEMORY_BUDGET`; lists are
//! comma-separated). The one exception is the log level, `STRATA_LOG`. Other commands take
//! the settings they share with `serve` (`threads`, `memory-budget`, ...) from the same
//! places.
//!
//! The file is `--config FILE` (or `STRATA_CONFIG`), else `/etc/strata/strata.toml`, else
//! `$STRATA_HOME/strata.toml`; it is optional unless named. The file's values become
//! clap's defaults, so clap's own precedence (flag, then environment, then default) gives
//! the order above, and `--help` shows the defaults in force.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};

use crate::cli::Cli;
use crate::settings::{Settings, Source};

/// The command whose long options are the settings.
const DAEMON: &str = "serve";
/// Options that are not settings.
const NOT_SETTINGS: &[&str] = &["config", "help", "version", "print-config"];
/// Where a system-wide install keeps its config file.
pub const SYSTEM_CONFIG: &str = "/etc/strata/strata.toml";

/// The environment variable of a setting.
pub fn env_name(key: &str) -> String {
    match key {
        "log-level" => "STRATA_LOG".to_string(),
        _ => format!("STRATA_{}", key.to_uppercase().replace('-', "_")),
    }
}

/// A config file's keys, each as the string values clap parses.
type FileValues = BTreeMap<String, Vec<String>>;

/// Parses the command line with the config file and the environment under it. Errors are
/// clap's (usage, exit status 2) or name the config file and key.
pub fn parse<I, T>(args: I) -> Result<(Cli, Settings), clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let base = Cli::command();
    let (file, named) = locate(&args).map_err(config_error)?;
    let values = match &file {
        Some(path) => read_file(&base, path).map_err(config_error)?,
        None => FileValues::new(),
    };
    let cmd = with_settings(base, &values);
    let matches = cmd.clone().try_get_matches_from(&args)?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd.clone()))?;
    let mut settings = settings_of(&cmd, &matches, &values, file, named);
    settings.warnings.extend(settings.file.as_deref().and_then(|p| readable_keys(p, &values)));
    Ok((cli, settings))
}

fn config_error(message: String) -> clap::Error {
    clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{message}\n"))
}

/// The config file: `--config`, `STRATA_CONFIG`, the system one, the user's one.
fn locate(args: &[OsString]) -> Result<(Option<PathBuf>, bool), String> {
    let mut named = None;
    let mut it = args.iter().skip(1);
    while let Some(arg) = it.next() {
        let Some(s) = arg.to_str() else { continue };
        if s == "--" {
            break;
        }
        if s == "--config" {
            named = it.next().map(PathBuf::from);
        } else if let Some(v) = s.strip_prefix("--config=") {
            named = Some(PathBuf::from(v));
        }
    }
    let named = named.or_else(|| crate::env::CONFIG.get_os().map(PathBuf::from));
    if let Some(path) = named {
        // What it is, if not a file, is `read_file`'s to say.
        return Ok((Some(path), true));
    }
    let found = [PathBuf::from(SYSTEM_CONFIG), crate::store::strata_home().join("strata.toml")]
        .into_iter()
        .find(|p| p.is_file());
    Ok((found, false))
}

/// The settings: `serve`'s long options and the global ones.
fn setting_args(cmd: &Command) -> Vec<clap::Arg> {
    let serve = cmd.find_subcommand(DAEMON).expect("serve subcommand");
    cmd.get_arguments()
        .chain(serve.get_arguments())
        .filter(|a| a.get_long().is_some_and(|l| !NOT_SETTINGS.contains(&l)))
        .cloned()
        .collect()
}

fn is_list(arg: &clap::Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

/// Reads and checks a config file: every key a setting, every value one its flag takes.
pub fn read_file(cmd: &Command, path: &Path) -> Result<FileValues, String> {
    let failed = |why: String| format!("config file {}: {why}", path.display());
    regular_file(path).map_err(failed)?;
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| failed(e.to_string()))?;
    let args = setting_args(cmd);
    let mut out = FileValues::new();
    for (key, value) in table {
        let at = |msg: String| format!("config file {}: `{key}`: {msg}", path.display());
        let Some(arg) = args.iter().find(|a| a.get_long() == Some(key.as_str())) else {
            let known: Vec<&str> = args.iter().filter_map(|a| a.get_long()).collect();
            return Err(at(format!("not a setting (settings: {})", known.join(", "))));
        };
        let kind = Kind::of(arg);
        let values = match (value, is_list(arg)) {
            (toml::Value::Array(items), true) => {
                items.into_iter().map(|v| kind.value(v)).collect::<Result<Vec<_>, _>>().map_err(at)?
            }
            (toml::Value::Array(_), false) => return Err(at("expected one value, not a list".into())),
            (v, _) => vec![kind.value(v).map_err(at)?],
        };
        for v in &values {
            check_value(arg, v).map_err(at)?;
        }
        out.insert(key, values);
    }
    Ok(out)
}

/// Whether `path` is a file to read, from its metadata: opening a FIFO would wait for a
/// writer, and reading a directory fails with an error that does not say so.
fn regular_file(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) if m.is_dir() => Err("is a directory".into()),
        Ok(_) => Err("not a regular file".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("not found".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Parses `value` as the option's flag would, so the file gets the flag's checks.
fn check_value(arg: &clap::Arg, value: &str) -> Result<(), String> {
    let long = arg.get_long().unwrap_or_default();
    let one = Command::new("strata").no_binary_name(true).arg(arg.clone().required(false).env(None::<&str>));
    match one.try_get_matches_from([format!("--{long}={value}")]) {
        Ok(_) => Ok(()),
        Err(e) => {
            let text = e.to_string();
            Err(text.lines().next().unwrap_or("").trim_start_matches("error: ").to_string())
        }
    }
}

/// The TOML type a setting takes in the file, from what its flag parses to: a count is
/// an integer (not `"4"`, nor `1e3`), a switch `true` or `false`, the rest a string (not
/// `true`) or a number, as their flags take numbers too (`keep-alive = 300`, seconds).
/// Nothing else is coerced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Boolean,
    Integer,
    /// A flag whose value is a `SIZE`: bytes as an integer, or a string with a unit.
    Size,
    Text,
}

impl Kind {
    fn of(arg: &clap::Arg) -> Kind {
        use std::any::TypeId;
        let parses_to = arg.get_value_parser().type_id();
        let integers = [TypeId::of::<u16>(), TypeId::of::<u32>(), TypeId::of::<u64>(), TypeId::of::<usize>()];
        if arg.get_value_names().is_some_and(|names| names == ["SIZE"]) {
            Kind::Size
        } else if parses_to == TypeId::of::<bool>() {
            Kind::Boolean
        } else if integers.iter().any(|t| parses_to == *t) {
            Kind::Integer
        } else {
            Kind::Text
        }
    }

    /// `v` as the string its flag parses, if it has this kind's type.
    fn value(self, v: toml::Value) -> Result<String, String> {
        use toml::Value as V;
        match (self, v) {
            (Kind::Boolean, V::Boolean(b)) => Ok(b.to_string()),
            (Kind::Integer | Kind::Size, V::Integer(i)) => Ok(i.to_string()),
            (Kind::Size | Kind::Text, V::String(s)) => Ok(s),
            // Then the flag's own parser judges the number (`keep-alive = -1`, `300`).
            (Kind::Text, V::Integer(i)) => Ok(i.to_string()),
            (Kind::Text, V::Float(f)) => Ok(f.to_string()),
            (kind, other) => {
                let expected = match kind {
                    Kind::Boolean => "`true` or `false`",
                    Kind::Integer => "an integer",
                    Kind::Size => "a size (bytes as an integer, or a string such as \"8GiB\")",
                    Kind::Text => "a string or a number",
                };
                let found = match &other {
                    V::Array(_) => "an array".to_string(),
                    V::Table(_) => "a table".to_string(),
                    scalar => format!("the {} {scalar}", scalar.type_str()),
                };
                Err(format!("expected {expected}, found {found}"))
            }
        }
    }

    /// A value as the file would hold it, so that `--print-config` is a file that reads
    /// back.
    fn toml(self, v: &str) -> String {
        match (self, v.trim().parse::<i64>(), v.parse::<bool>()) {
            (Kind::Integer | Kind::Size, Ok(n), _) => n.to_string(),
            (Kind::Boolean, _, Ok(b)) => b.to_string(),
            _ => toml::Value::String(v.to_string()).to_string(),
        }
    }
}

/// API keys in a file others can read are not secret.
fn readable_keys(path: &Path, values: &FileValues) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    let has_keys = values.get("api-key").is_some_and(|keys| !keys.is_empty());
    (has_keys && mode & 0o004 != 0)
        .then(|| format!("{} holds API keys and every user can read it (chmod o-r)", path.display()))
}

/// `cmd` with each setting's environment variable and the file's values as defaults, in
/// every subcommand that has the option.
fn with_settings(cmd: Command, file: &FileValues) -> Command {
    let keys: Vec<(String, bool)> =
        setting_args(&cmd).iter().map(|a| (a.get_long().unwrap().to_string(), is_list(a))).collect();
    let apply = |mut arg: clap::Arg| {
        let Some(long) = arg.get_long().map(str::to_string) else { return arg };
        let Some(&(_, list)) = keys.iter().find(|(k, _)| *k == long) else { return arg };
        // Keys must not show in `--help`.
        arg = arg.env(env_name(&long)).hide_env_values(long == "api-key");
        if list {
            arg = arg.value_delimiter(',');
        }
        if let Some(values) = file.get(&long) {
            arg = arg.default_values(values.iter().cloned());
        }
        arg
    };
    let globals: Vec<String> = cmd.get_arguments().map(|a| a.get_id().to_string()).collect();
    let mut cmd = cmd;
    for id in globals {
        cmd = cmd.mut_arg(id, apply);
    }
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, |mut sub| {
            let ids: Vec<String> = sub.get_arguments().map(|a| a.get_id().to_string()).collect();
            for id in ids {
                sub = sub.mut_arg(id, apply);
            }
            sub
        });
    }
    cmd
}

/// The values `serve` runs with, each with its source. Empty unless the command is `serve`.
fn settings_of(
    cmd: &Command,
    matches: &ArgMatches,
    file_values: &FileValues,
    file: Option<PathBuf>,
    named: bool,
) -> Settings {
    let mut values = BTreeMap::new();
    if let Some(serve) = matches.subcommand_matches(DAEMON) {
        for arg in setting_args(cmd) {
            let long = arg.get_long().unwrap().to_string();
            let id = arg.get_id().as_str();
            let m = if serve.try_contains_id(id).is_ok() { serve } else { matches };
            let raw: Vec<String> =
                m.get_raw(id).map(|vals| vals.map(|v| v.to_string_lossy().into_owned()).collect()).unwrap_or_default();
            let source = match m.value_source(id) {
                Some(ValueSource::CommandLine) => Source::Flag,
                Some(ValueSource::EnvVariable) => Source::Env(env_name(&long)),
                _ if file_values.contains_key(&long) => Source::File(file.clone().unwrap()),
                _ => Source::Default,
            };
            values.insert(long, (raw, source));
        }
    }
    Settings { file, named, values, warnings: Vec::new() }
}

/// Whether `values` hold an API key (an empty string is none).
fn has_keys(values: &BTreeMap<String, (Vec<String>, Source)>) -> bool {
    values.get("api-key").is_some_and(|(keys, _)| keys.iter().any(|k| !k.trim().is_empty()))
}

impl Settings {
    /// The settings as a config file, each line commented with where it came from.
    pub fn render(&self) -> String {
        let mut out = String::new();
        match &self.file {
            Some(p) => writeln!(out, "# config file: {}", p.display()),
            None => writeln!(out, "# config file: none ({SYSTEM_CONFIG} and $STRATA_HOME/strata.toml are absent)"),
        }
        .unwrap();
        let cmd = Cli::command();
        let args = setting_args(&cmd);
        for (key, (values, source)) in &self.values {
            let arg = args.iter().find(|a| a.get_long() == Some(key.as_str()));
            let list = arg.is_some_and(is_list);
            let kind = arg.map_or(Kind::Text, Kind::of);
            let quoted: Vec<String> = values.iter().map(|v| kind.toml(v)).collect();
            let line = match (list, quoted.as_slice()) {
                (true, q) => format!("{key} = [{}]", q.join(", ")),
                (false, [one]) => format!("{key} = {one}"),
                (false, _) => format!("# {key} is not set"),
            };
            writeln!(out, "{line:<40} # {source}").unwrap();
        }
        out
    }

    /// Rereads the config file (SIGHUP): the settings that come from it or from the
    /// defaults take the file's new values; flags and the environment still win. Returns
    /// the new settings and the keys whose value changed. A file that fails to read or
    /// parse is an error, and so is one that would take the API keys from some to none
    /// without saying `api-key = []` (an emptied or truncated file must not open the API).
    pub fn reload(&self) -> Result<(Settings, Vec<String>), String> {
        let cmd = Cli::command();
        let (file, named) = match self.named {
            true => (self.file.clone(), true),
            false => locate(&[]).map(|(f, _)| (f, false))?,
        };
        let file_values = match &file {
            Some(path) => read_file(&cmd, path)?,
            None => FileValues::new(),
        };
        let args = setting_args(&cmd);
        let mut values = self.values.clone();
        let mut changed = Vec::new();
        for (key, (vals, source)) in values.iter_mut() {
            if matches!(source, Source::Flag | Source::Env(_)) {
                continue;
            }
            let (new_vals, new_source) = match file_values.get(key) {
                Some(v) => (v.clone(), Source::File(file.clone().unwrap())),
                None => {
                    let arg = args.iter().find(|a| a.get_long() == Some(key.as_str()));
                    let defaults = arg
                        .map(|a| a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect())
                        .unwrap_or_default();
                    (defaults, Source::Default)
                }
            };
            if new_vals != *vals {
                changed.push(key.clone());
            }
            *vals = new_vals;
            *source = new_source;
        }
        if has_keys(&self.values) && !has_keys(&values) && file_values.get("api-key").is_none_or(|k| !k.is_empty()) {
            let file = match &file {
                Some(path) => format!("config file {}", path.display()),
                None => "no config file is found, and so it".to_string(),
            };
            return Err(format!(
                "{file} names no API key, which would turn authentication off; the keys in force stay (a file \
                 that means it says `api-key = []`)"
            ));
        }
        let warnings = file.as_deref().and_then(|p| readable_keys(p, &file_values)).into_iter().collect();
        Ok((Settings { file, named, values, warnings }, changed))
    }

    /// Whether these settings leave the API open: no key.
    pub fn open_access(&self) -> bool {
        !has_keys(&self.values)
    }

    /// A setting's values.
    pub fn get(&self, key: &str) -> &[String] {
        self.values.get(key).map(|(v, _)| v.as_slice()).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert_eq!(env_name("memory-budget"), "STRATA_MEMORY_BUDGET");
        assert_eq!(env_name("port"), "STRATA_PORT");
        assert_eq!(env_name("log-level"), "STRATA_LOG");
    }

    #[test]
    fn file_values_are_checked() {
        let dir = std::env::temp_dir().join(format!("strata-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("strata.toml");
        let cmd = Cli::command();
        let check = |text: &str| {
            std::fs::write(&path, text).unwrap();
            read_file(&cmd, &path)
        };
        let ok = check("port = 9000\napi-key = [\"a\", \"b\"]\nmemory-budget = \"2GiB\"\n").unwrap();
        assert_eq!(ok["port"], ["9000"]);
        assert_eq!(ok["api-key"], ["a", "b"]);
        let err = check("port = \"lots\"\n").unwrap_err();
        assert!(err.contains("strata.toml") && err.contains("`port`"), "{err}");
        let err = check("colour = \"blue\"\n").unwrap_err();
        assert!(err.contains("`colour`: not a setting"), "{err}");
        let err = check("port = [1, 2]\n").unwrap_err();
        assert!(err.contains("not a list"), "{err}");
        let err = check("port = \n").unwrap_err();
        assert!(err.contains("strata.toml"), "{err}");
        let err = check("stream-policy = \"fifo\"\n").unwrap_err();
        assert!(err.contains("`stream-policy`"), "{err}");
        // Each key takes its flag's type, and nothing else.
        let ok = check("expert-guess = true\nmemory-budget = 0\nbody-limit = \"1MiB\"\nkeep-alive = \"-1\"\n").unwrap();
        assert_eq!(ok["expert-guess"], ["true"]);
        assert_eq!(ok["memory-budget"], ["0"]);
        assert_eq!(ok["keep-alive"], ["-1"]);
        assert_eq!(check("keep-alive = -1\n").unwrap()["keep-alive"], ["-1"]);
        assert_eq!(check("keep-alive = 300\n").unwrap()["keep-alive"], ["300"]);
        for (text, want) in [
            ("host = true\n", "`host`: expected a string or a number, found the boolean true"),
            ("threads = 1e3\n", "`threads`: expected an integer, found the float 1000.0"),
            ("threads = 4.0\n", "`threads`: expected an integer, found the float 4.0"),
            ("threads = \"4\"\n", "`threads`: expected an integer, found the string \"4\""),
            ("keep-alive = true\n", "`keep-alive`: expected a string or a number, found the boolean true"),
            ("expert-guess = 1\n", "`expert-guess`: expected `true` or `false`, found the integer 1"),
            ("memory-budget = 1.5\n", "`memory-budget`: expected a size"),
            ("api-key = [\"a\", true]\n", "`api-key`: expected a string or a number, found the boolean true"),
            ("model = [{ a = 1 }]\n", "`model`: expected a string or a number, found a table"),
        ] {
            let err = check(text).unwrap_err();
            assert!(err.contains("strata.toml") && err.contains(want), "{text}: {err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
