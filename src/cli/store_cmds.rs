//! `strata list`, `strata show`, `strata rm` and `strata cp`: the model store from the
//! terminal. A running server sees every change at its next request.

use std::time::SystemTime;

use clap::Args;
use serde_json::{Value, json};

use super::outln;
use crate::queue::models::parameter_size;
pub use crate::sched::plan::human_size;
use crate::store::{ModelName, Store, StoreError, StoredModel};

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print a JSON array.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// `NAME[:TAG]`
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// `NAME[:TAG]`, one or more.
    #[arg(required = true)]
    pub names: Vec<String>,
}

#[derive(Args, Debug)]
pub struct CpArgs {
    /// The model to copy, `NAME[:TAG]`.
    pub source: String,
    /// Its new name, `NAME[:TAG]`.
    pub destination: String,
    /// Replace a model that already has the new name.
    #[arg(long)]
    pub force: bool,
}

/// A store error for the terminal, with what to do next.
pub fn explain(store: &Store, e: StoreError, forced: bool) -> anyhow::Error {
    match e {
        StoreError::NotFound(name) => anyhow::anyhow!(
            "model `{name}` is not in the store ({}); `strata list` shows the models there",
            store.models_dir().display()
        ),
        StoreError::Exists(name) if !forced => {
            anyhow::anyhow!("model `{name}` already exists; `--force` replaces it, `strata rm {name}` removes it")
        }
        other => other.into(),
    }
}

pub fn list(args: ListArgs) -> anyhow::Result<()> {
    let store = Store::default();
    let models = store.list()?;
    if args.json {
        let all: Vec<Value> = models.iter().map(to_json).collect();
        outln!("{}", serde_json::to_string_pretty(&all)?)?;
        return Ok(());
    }
    outln!("{:<40} {:<12} {:<11} {:>10}  MODIFIED", "NAME", "ID", "FORMAT", "SIZE")?;
    let now = SystemTime::now();
    for m in &models {
        let id = m.entry.digest_hex();
        outln!(
            "{:<40} {:<12} {:<11} {:>10}  {}",
            m.name.to_string(),
            &id[..12.min(id.len())],
            m.entry.format.name(),
            human_size(m.entry.size),
            ago(now, m.entry.modified())
        )?;
    }
    if models.is_empty() {
        eprintln!("no models in {}; `strata import PATH --name NAME` adds one", store.models_dir().display());
    }
    Ok(())
}

pub fn show(args: ShowArgs) -> anyhow::Result<()> {
    let store = Store::default();
    let m = store.show(&args.name).map_err(|e| explain(&store, e, false))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&to_json(&m))?)?;
        return Ok(());
    }
    let e = &m.entry;
    let mut rows = vec![("name", m.name.to_string()), ("format", e.format.name().to_string())];
    if let Some(d) = &e.details {
        rows.push(("architecture", d.architecture.clone()));
        rows.push(("parameters", format!("{} ({})", parameter_size(d.parameter_count), d.parameter_count)));
        rows.push(("quantization", d.quantization.clone()));
        if let Some(n) = d.context_length {
            rows.push(("context length", n.to_string()));
        }
    }
    rows.push(("size", format!("{} ({} bytes)", human_size(e.size), e.size)));
    rows.push(("source", e.source.clone()));
    rows.push(("imported", e.imported_at.clone()));
    rows.push(("digest", e.digest.clone().unwrap_or_else(|| e.digest_hex())));
    rows.push(("path", m.path().display().to_string()));
    for (k, v) in rows {
        outln!("  {k:<16}{v}")?;
    }
    Ok(())
}

pub fn rm(args: RmArgs) -> anyhow::Result<()> {
    let store = Store::default();
    let mut failed = 0;
    for name in &args.names {
        match store.remove(name) {
            Ok(removed) => outln!("deleted '{removed}'")?,
            Err(e) => {
                eprintln!("error: {}", crate::errors::chain(&explain(&store, e, false)));
                failed += 1;
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => anyhow::bail!("{n} of {} models not deleted", args.names.len()),
    }
}

pub fn cp(args: CpArgs) -> anyhow::Result<()> {
    let store = Store::default();
    let from = store.get(&args.source).map_err(|e| explain(&store, e, false))?;
    // `a` and `a:latest` are one model; copying it onto itself would copy nothing.
    if ModelName::parse(&args.destination).is_ok_and(|to| to == from.name) {
        anyhow::bail!("`{}` and `{}` are the same model, `{}`", args.source, args.destination, from.name);
    }
    let copied = store.copy(&args.source, &args.destination, args.force).map_err(|e| explain(&store, e, args.force))?;
    outln!("copied '{}' to '{}'", from.name, copied.name)?;
    Ok(())
}

fn to_json(m: &StoredModel) -> Value {
    let mut v = json!({
        "name": m.name.to_string(),
        "id": m.entry.digest_hex(),
        "path": m.path(),
    });
    if let (Some(obj), Ok(Value::Object(entry))) = (v.as_object_mut(), serde_json::to_value(&m.entry)) {
        obj.extend(entry);
    }
    v
}

/// `just now`, `5 minutes ago`, `3 days ago`.
fn ago(now: SystemTime, then: SystemTime) -> String {
    let secs = now.duration_since(then).map_or(0, |d| d.as_secs());
    let (n, unit) = match secs {
        0..60 => return "just now".into(),
        60..3600 => (secs / 60, "minute"),
        3600..86400 => (secs / 3600, "hour"),
        86400..2_592_000 => (secs / 86400, "day"),
        2_592_000..31_536_000 => (secs / 2_592_000, "month"),
        _ => (secs / 31_536_000, "year"),
    };
    format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sizes_and_ages_read_well() {
        assert_eq!(human_size(12), "12 B");
        assert_eq!(human_size(113_056), "110.4 KiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
        let now = SystemTime::now();
        assert_eq!(ago(now, now), "just now");
        assert_eq!(ago(now, now - Duration::from_secs(120)), "2 minutes ago");
        assert_eq!(ago(now, now - Duration::from_secs(3600)), "1 hour ago");
    }
}
