//! Speculative decoding as `--draft` asks for it (DESIGN.md §5b): which model each draft
//! serves, the draft model loaded beside its target (on its device, with its context
//! and threads, resident whatever the target's `--memory-budget`), and what `/api/ps`,
//! the status page, `/metrics` and `bench` show of it.

use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use strata_engine::session::{Engine, RunOptions};
use strata_engine::speculative::{SpecCounts, SpecKind, SpecSettings, SpecStats};

use crate::queue::models::canonical;

/// The word `--draft` takes for drafting from the context instead of from a model.
pub const NGRAM: &str = "ngram";

/// Where a model's drafts come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftSource {
    /// The context: n-gram lookup, no second model.
    Ngram,
    /// A draft model: a path or a store name, as `--model` takes them.
    Model(String),
}

impl DraftSource {
    pub fn parse(spec: &str) -> Self {
        match spec {
            NGRAM => DraftSource::Ngram,
            model => DraftSource::Model(model.to_string()),
        }
    }
}

/// What `--draft` and `--draft-max`/`--draft-min`/`--draft-p-min` say: each model's
/// draft, and how much every model drafts (a request may ask for other settings).
#[derive(Clone, Debug, Default)]
pub struct Drafts {
    /// (canonical model name, its draft).
    by_model: Vec<(String, DraftSource)>,
    pub settings: SpecSettings,
}

impl Drafts {
    /// `entries` as `--draft` gives them: `NAME=SPEC` for the model `NAME`, a bare `SPEC`
    /// for `default_model`. A model given two drafts is refused, and so are settings out
    /// of range; the errors name the flags.
    pub fn parse(entries: &[String], default_model: &str, settings: SpecSettings) -> Result<Self, String> {
        if settings.min > settings.max {
            return Err(format!("--draft-min {} is more than --draft-max {}", settings.min, settings.max));
        }
        settings.validate().map_err(|e| format!("--draft-max/--draft-min/--draft-p-min: {e}"))?;
        let mut by_model: Vec<(String, DraftSource)> = Vec::new();
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (model, spec) = match entry.split_once('=') {
                Some((name, spec)) if !name.is_empty() && !name.contains('/') => (name, spec),
                _ => (default_model, entry),
            };
            if spec.is_empty() {
                return Err(format!("--draft {entry}: no draft model after `=` (a SPEC or `{NGRAM}`)"));
            }
            let key = canonical(model);
            if let Some((_, first)) = by_model.iter().find(|(k, _)| *k == key) {
                return Err(format!("--draft: model `{model}` is given two drafts ({first:?} and `{spec}`)"));
            }
            by_model.push((key, DraftSource::parse(spec)));
        }
        Ok(Drafts { by_model, settings })
    }

    /// The models given a draft (canonical names), with their drafts.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &DraftSource)> {
        self.by_model.iter().map(|(name, source)| (name.as_str(), source))
    }

    /// The draft of the model `name`, if it has one.
    pub fn for_model(&self, name: &str) -> Option<&DraftSource> {
        let key = canonical(name);
        self.by_model.iter().find(|(k, _)| *k == key).map(|(_, source)| source)
    }

    /// Gives `engine` (the model `name`, loaded with `opts`) its draft: the n-gram
    /// lookup, or the draft model loaded beside it. A draft model whose vocabulary
    /// differs fails, naming both models. Every model takes the drafting settings, for
    /// the requests that ask for speculation themselves.
    pub fn attach(&self, name: &str, engine: &mut Engine, opts: &RunOptions) -> anyhow::Result<()> {
        engine.speculation.settings = self.settings;
        match self.for_model(name) {
            None => Ok(()),
            Some(DraftSource::Ngram) => engine.set_ngram(self.settings).map_err(anyhow::Error::msg),
            Some(DraftSource::Model(spec)) => {
                let draft = crate::resolve::load(spec, &draft_options(engine, opts))
                    .with_context(|| format!("draft model `{spec}` for `{}`", engine.name))?;
                if draft.model.scheduler().is_streaming() {
                    tracing::warn!(
                        draft = %draft.name,
                        model = %engine.name,
                        "the draft model does not fit in free memory: part of it streams, which slows every draft"
                    );
                }
                engine.set_draft(draft, self.settings).map_err(anyhow::Error::msg)
            }
        }
    }
}

/// How a draft model loads beside `target` (loaded with `opts`): on the device the
/// target runs on, with its context length, threads and KV type, but with a default
/// memory budget, so that it stays resident (free memory allowing) while the target
/// streams at `--memory-budget 0`; dense, whatever `--sparse-ffn` says; its experts (a
/// MoE draft) placed as auto places them, whatever `--cpu-moe` or `--n-cpu-moe` say.
pub fn draft_options(target: &Engine, opts: &RunOptions) -> RunOptions {
    RunOptions {
        context: target.context_len,
        device: target.device.device.parse().unwrap_or(opts.device),
        memory_budget: None,
        host_budget: None,
        expert_guess: false,
        expert_split: strata_sched::placement::Mode::Auto,
        sparse_ffn: Default::default(),
        ..opts.clone()
    }
}

/// A loaded model's speculation, as the worker publishes it: its setup, and the running
/// totals it shares with the engine.
#[derive(Clone, Debug)]
pub struct SpeculationView {
    pub kind: SpecKind,
    pub draft: Option<String>,
    pub settings: SpecSettings,
    pub stats: Arc<SpecStats>,
}

impl SpeculationView {
    pub fn of(engine: &Engine) -> Self {
        let s = &engine.speculation;
        SpeculationView {
            kind: s.kind,
            draft: s.draft.as_ref().map(|d| d.name.clone()),
            settings: s.settings,
            stats: s.stats.clone(),
        }
    }

    /// Its setup and its totals since the model loaded.
    pub fn status(&self) -> SpeculationStatus {
        SpeculationStatus::new(self, self.stats.counts(), self.stats.draft_seconds())
    }
}

/// A model's speculative decoding: what a request that does not say speculates with, the
/// drafting settings, and what was drafted and kept (since the model loaded; in `bench`,
/// over the measured decode).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SpeculationStatus {
    /// `draft` (the draft model), `ngram` (from the context) or `off`.
    #[schema(example = "draft")]
    pub kind: String,
    /// The draft model's name; null without one.
    pub draft: Option<String>,
    /// Tokens drafted at most per step (`--draft-max`).
    pub n_max: usize,
    /// Fewer drafted tokens than this are not verified (`--draft-min`).
    pub n_min: usize,
    /// A draft model stops where its most likely token is less likely than this
    /// (`--draft-p-min`); `null`: `auto`, where drafting more is no longer worth its
    /// time.
    pub p_min: Option<f32>,
    /// Verifying passes: steps that ran drafted tokens.
    pub steps: u64,
    /// Tokens drafted and verified.
    pub drafted: u64,
    /// Drafted tokens kept (the model generated them too).
    pub accepted: u64,
    /// `accepted` over `drafted` (0 before anything was drafted).
    pub acceptance_rate: f64,
    /// Tokens a verifying pass gave on average: its kept drafts and the one it sampled.
    pub tokens_per_step: f64,
    /// Seconds spent drafting (the draft model's passes, the n-gram lookups).
    pub draft_seconds: f64,
}

impl SpeculationStatus {
    /// `view`'s setup with `counts` drafted and kept in `draft_seconds`.
    pub fn new(view: &SpeculationView, counts: SpecCounts, draft_seconds: f64) -> Self {
        SpeculationStatus {
            kind: view.kind.as_str().to_string(),
            draft: view.draft.clone(),
            n_max: view.settings.max,
            n_min: view.settings.min,
            p_min: view.settings.p_min,
            steps: counts.steps,
            drafted: counts.drafted,
            accepted: counts.accepted,
            acceptance_rate: counts.acceptance_rate(),
            tokens_per_step: counts.tokens_per_step(),
            draft_seconds,
        }
    }

    /// One line for people: the setup, and what was drafted and kept.
    pub fn line(&self) -> String {
        let draft = self.draft.as_deref().map_or(String::new(), |d| format!(" `{d}`"));
        format!(
            "speculative {}{draft} (n_max {}, n_min {}, p_min {}): {} drafted, {} accepted ({:.0}%) in {} verifying \
             passes, {:.2} tokens per pass, {:.3} s drafting",
            self.kind,
            self.n_max,
            self.n_min,
            self.p_min.map_or("auto".to_string(), |p| p.to_string()),
            self.drafted,
            self.accepted,
            100.0 * self.acceptance_rate,
            self.steps,
            self.tokens_per_step,
            self.draft_seconds
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_bare_draft_serves_the_default_model_and_a_named_one_its_model() {
        let d = Drafts::parse(&entries(&["/m/small.gguf", "big=ngram"]), "first", SpecSettings::default()).unwrap();
        assert_eq!(d.for_model("first"), Some(&DraftSource::Model("/m/small.gguf".into())));
        assert_eq!(d.for_model("Big:latest"), Some(&DraftSource::Ngram));
        assert_eq!(d.for_model("other"), None);
        // A path with `=` in a directory name is a path.
        let d = Drafts::parse(&entries(&["/m/a=b/draft"]), "m", SpecSettings::default()).unwrap();
        assert_eq!(d.for_model("m"), Some(&DraftSource::Model("/m/a=b/draft".into())));
    }

    #[test]
    fn bad_drafts_and_settings_are_refused_naming_the_flag() {
        let err = Drafts::parse(&entries(&["ngram", "m=x"]), "m", SpecSettings::default()).unwrap_err();
        assert!(err.contains("`m` is given two drafts"), "{err}");
        let err = Drafts::parse(&entries(&["m="]), "m", SpecSettings::default()).unwrap_err();
        assert!(err.contains("--draft m="), "{err}");
        let settings = SpecSettings { max: 4, min: 5, p_min: Some(0.5) };
        let err = Drafts::parse(&[], "m", settings).unwrap_err();
        assert!(err.contains("--draft-min 5 is more than --draft-max 4"), "{err}");
    }

    #[test]
    fn a_status_line_says_what_was_drafted_and_kept() {
        let view = SpeculationView {
            kind: SpecKind::Draft,
            draft: Some("small".into()),
            settings: SpecSettings::default(),
            stats: Arc::default(),
        };
        view.stats.add(SpecCounts { steps: 2, drafted: 8, accepted: 6 }, 500_000_000);
        let s = view.status();
        assert_eq!((s.kind.as_str(), s.drafted, s.accepted, s.acceptance_rate), ("draft", 8, 6, 0.75));
        assert_eq!((s.tokens_per_step, s.draft_seconds), (4.0, 0.5));
        let line = s.line();
        assert!(
            line.starts_with("speculative draft `small` (n_max 16, n_min 0, p_min auto): 8 drafted, 6 accepted (75%)")
        );
    }
}
