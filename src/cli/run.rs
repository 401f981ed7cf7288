//! `strata run`: chat with a model in the terminal, or one streamed answer to `-p`.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::Context;
use clap::Args;

use super::{DraftOpts, RunOpts};
use crate::draft::SpeculationStatus;
use crate::engine::batch::Session;
use crate::engine::sampler::SamplingParams;
use crate::engine::session::{Engine, GenerateRequest, TokenEvent};
use crate::engine::speculative::SpecKind;
use crate::engine::template::ChatMessage;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model SPEC: a `.gguf` or `.cawsf` file, a directory (Hugging Face safetensors with
    /// config.json, or a flat layer directory with manifest.json), a name in the store
    /// (`strata list`), or `strata-demo` (the built-in demo model).
    pub model: String,
    /// Answer this prompt and exit (otherwise: an interactive chat).
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// A system message for the chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Send the prompt as it is, without the chat template (and so without `--system`).
    #[arg(long)]
    pub raw: bool,
    /// Most tokens per answer.
    #[arg(long = "max-tokens", short = 'n', default_value_t = 512)]
    pub max_tokens: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.9)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed for sampling (same seed, same answer).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// For an NDSQ .cawsf model: load only the R shards (the residue) that rank best
    /// for the prompt (`strata route`) within this many bytes, or a percentage of them
    /// such as `50%`; the rest count as zero. Approximate: its cost is measured in
    /// docs/benchmarks.md. Needs `--prompt`.
    #[arg(long = "route-budget", value_name = "SIZE", value_parser = crate::format::route::Budget::parse)]
    pub route_budget: Option<crate::format::route::Budget>,
    #[command(flatten)]
    pub run: RunOpts,
    #[command(flatten)]
    pub draft: DraftOpts,
}

impl RunArgs {
    fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            logit_bias: Vec::new(),
        }
    }
}

/// Token ids for a conversation: the chat template when the model has one and `raw`
/// is off, else the last message's text with the tokenizer's special tokens.
fn prompt_ids(engine: &Engine, messages: &[ChatMessage], raw: bool) -> anyhow::Result<Vec<u32>> {
    let tok = &engine.tokenizer;
    if raw {
        let text = messages.last().map(|m| m.content.as_str()).unwrap_or("");
        return Ok(tok.encode(text, true)?);
    }
    if tok.chat_template().is_none() {
        return Ok(tok.encode(&untemplated(messages), true)?);
    }
    let text = tok.apply_chat_template(messages, true)?;
    Ok(tok.encode(&text, false)?)
}

/// The text sent to a model without a chat template, as the server sends it: the last
/// message, after the system message and a blank line when there is one.
fn untemplated(messages: &[ChatMessage]) -> String {
    let last = messages.last().map(|m| m.content.as_str()).unwrap_or("");
    match messages.first().filter(|m| m.role == "system" && messages.len() > 1) {
        Some(system) if !system.content.is_empty() => format!("{}\n\n{last}", system.content),
        _ => last.to_string(),
    }
}

/// Streams one answer to stdout and returns its text.
fn answer(engine: &Engine, session: &mut Session, args: &RunArgs, messages: &[ChatMessage]) -> anyhow::Result<String> {
    let req = GenerateRequest {
        prompt: prompt_ids(engine, messages, args.raw)?,
        max_tokens: args.max_tokens,
        sampling: args.sampling(),
        stop: args.stop.clone(),
        stop_at_eos: true,
        top_logprobs: 0,
        grammar: None,
        keep_special_tokens: false,
        speculative: Default::default(),
    };
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    let draft_before = engine.speculation.stats.draft_seconds();
    let summary = session.generate(engine, &req, &|| false, |ev| {
        if let TokenEvent::Text(t) = ev {
            text.push_str(&t);
            // A closed stdout (`strata run ... | head`) ends the answer.
            return write!(out, "{t}").and_then(|_| out.flush()).is_ok();
        }
        true
    })?;
    writeln!(out).context("writing to stdout")?;
    // What speculation drafted and kept, beside the answer (not in it).
    if engine.speculation.kind != SpecKind::Off {
        let view = crate::draft::SpeculationView::of(engine);
        let drafting = view.stats.draft_seconds() - draft_before;
        eprintln!("{}", SpeculationStatus::new(&view, summary.speculative, drafting).line());
    }
    tracing::info!(
        prompt_tokens = summary.prompt_tokens,
        completion_tokens = summary.completion_tokens,
        finish = summary.finish.as_str(),
        decode_tok_s = summary.completion_tokens as f64 / summary.decode.as_secs_f64().max(1e-9),
        "done"
    );
    Ok(text)
}

pub fn main(args: RunArgs) -> anyhow::Result<()> {
    args.sampling().validate()?;
    // A raw prompt is the last message's text alone (see `prompt_ids`): a system message
    // would be dropped without a word.
    if args.raw && args.system.is_some() {
        return Err(crate::model::sparse::Refused(
            "--system has no effect with --raw (a raw prompt is sent as it is, without the chat template)".into(),
        )
        .into());
    }
    let opts = args.run.to_options()?;
    let name = super::serve::model_entry(&args.model).0;
    let drafts = args.draft.drafts(&name)?;
    let mut engine = match (args.route_budget, &args.prompt) {
        (None, _) => crate::resolve::load(&args.model, &opts)?,
        (Some(_), None) => anyhow::bail!("--route-budget routes by the prompt: give one with --prompt"),
        (Some(budget), Some(prompt)) => {
            let mut source = crate::resolve::open(&args.model)?;
            let ids = super::route::prompt_ids(&source, prompt)?;
            crate::format::route::apply_budget(&mut source, &ids, budget)?;
            Engine::from_source(source, &opts)?
        }
    };
    drafts.attach(&name, &mut engine, &opts)?;
    let mut session = Session::new(&engine)?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.clone()));
    }
    if let Some(prompt) = &args.prompt {
        messages.push(ChatMessage::new("user", prompt.clone()));
        answer(&engine, &mut session, &args, &messages)?;
        return Ok(());
    }

    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "Chatting with {} ({}). /clear forgets the conversation, /bye or Ctrl-D ends it.",
            engine.name,
            engine.model.backend_name()
        );
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!(">>> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        match line.trim() {
            "" => continue,
            "/bye" | "/exit" => break,
            "/clear" => {
                messages.retain(|m| m.role == "system");
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line));
        let reply = answer(&engine, &mut session, &args, &messages)?;
        messages.push(ChatMessage::new("assistant", reply));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_without_a_template_gets_the_system_message_before_the_prompt() {
        let m = |role: &str, text: &str| ChatMessage::new(role, text);
        assert_eq!(untemplated(&[m("system", "Be brief."), m("user", "Hi")]), "Be brief.\n\nHi");
        assert_eq!(untemplated(&[m("user", "Hi")]), "Hi");
        assert_eq!(untemplated(&[m("system", ""), m("user", "Hi")]), "Hi");
        // Later turns: the system message, then the newest turn.
        let turns = [m("system", "S"), m("user", "a"), m("assistant", "b"), m("user", "c")];
        assert_eq!(untemplated(&turns), "S\n\nc");
        assert_eq!(untemplated(&[]), "");
    }
}
