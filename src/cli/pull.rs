//! `strata pull hf:ORG/REPO[@REV]`: a Hugging Face repository into the model store.

use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;

use clap::Args;

use super::outln;
use crate::hub::{HubClient, Phase};
use crate::quant::convert_target;
use crate::store::Store;
use crate::store::pull::{PullEvent, pull_hf};

#[derive(Args, Debug)]
pub struct PullArgs {
    /// `hf:ORG/REPO` or `hf:ORG/REPO@REVISION` (a branch, tag or commit). The hub is
    /// `$HF_ENDPOINT` (default https://huggingface.co); `$HF_TOKEN` is sent when set.
    pub spec: String,
    /// Convert to a flat layer directory quantized to this format (q8_0, q4_0, q4_k,
    /// q6_k, ...); by default the safetensors are stored as they are.
    #[arg(long)]
    pub quant: Option<String>,
    /// The name in the store (default: the repository id, tagged with the quantization
    /// or `latest`).
    #[arg(long)]
    pub name: Option<String>,
    /// Replace a model that already has this name.
    #[arg(long)]
    pub force: bool,
}

pub fn main(args: PullArgs) -> anyhow::Result<()> {
    if !args.spec.starts_with("hf:") {
        anyhow::bail!(
            "{}: only Hugging Face repositories can be pulled (`hf:ORG/REPO`); use `strata import` for files and `strata import ollama:NAME` for Ollama's models",
            args.spec
        );
    }
    let quant = args.quant.as_deref().map(convert_target).transpose().map_err(|e| anyhow::anyhow!("--quant: {e}"))?;
    let store = Store::default();
    let client = HubClient::from_env()?;
    let tty = std::io::stderr().is_terminal();
    let mut on = |e: PullEvent<'_>| {
        match e {
            PullEvent::Listing(r) => eprintln!("pulling {}@{} from {}", r.repo, r.revision, client.endpoint()),
            PullEvent::Download(p) if tty || p.phase != Phase::Downloading => {
                let pct = (100 * p.completed).checked_div(p.total).unwrap_or(100);
                let end = if p.phase == Phase::Downloading { "" } else { "\n" };
                eprint!(
                    "\r[{}/{}] {:<40} {:>5.1} MB {pct:>3}% {:?}{end}",
                    p.index + 1,
                    p.count,
                    p.file.path,
                    p.completed as f64 / 1e6,
                    p.phase
                );
                let _ = std::io::stderr().flush();
            }
            PullEvent::Download(_) => {}
            PullEvent::Convert(p) => {
                if tty || p.done == p.total {
                    eprint!("\rconverting: {}/{} groups", p.done, p.total);
                    if p.done == p.total {
                        eprintln!();
                    }
                }
            }
            PullEvent::Importing => eprintln!("importing into {}", store.models_dir().display()),
        }
        ControlFlow::Continue(())
    };
    let model = pull_hf(&store, &client, &args.spec, quant, args.name.as_deref(), args.force, &mut on)?;
    outln!("{}", model.name)?;
    Ok(())
}
