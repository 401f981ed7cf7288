//! `strata tokenize MODEL TEXT [--json]`: the token ids (and pieces) a model gives a
//! text, as its tokenizer and chat template see it. A `.gguf` file is read for its
//! vocabulary only, so llama.cpp's vocabulary-only files work too.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::outln;
use crate::engine::tokenizer::{TextTokenizer, TokenizerSources};

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Model: a `.gguf` file, a model directory, a name in the store or `strata-demo`.
    pub model: String,
    /// The text to tokenize (`-` reads standard input).
    pub text: String,
    /// Add the model's special tokens (BOS/EOS) as a prompt would have them.
    #[arg(long)]
    pub special: bool,
    /// Print `{"ids": [...], "pieces": [...]}` instead of one `id<TAB>piece` line per token.
    #[arg(long)]
    pub json: bool,
}

/// The tokenizer of a model SPEC, without loading weights where the format allows.
pub fn load_tokenizer(spec: &str) -> anyhow::Result<TextTokenizer> {
    let path = Path::new(spec);
    let is_gguf = path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf {
        let f = crate::model::gguf_vocab::gguf_tokenizer(path)?;
        return TextTokenizer::from_parts(TokenizerSources {
            tokenizer_json: &f.tokenizer_json,
            tokenizer_config_json: Some(&f.tokenizer_config_json),
            generation_config_json: Some(&f.generation_config_json),
            chat_template: None,
            model_config_json: None,
        })
        .with_context(|| format!("{spec}: loading the tokenizer"));
    }
    TextTokenizer::for_model(&crate::resolve::open(spec)?)
}

pub fn main(args: TokenizeArgs) -> anyhow::Result<()> {
    let text = match args.text.as_str() {
        "-" => std::io::read_to_string(std::io::stdin()).context("reading standard input")?,
        t => t.to_string(),
    };
    let tok = load_tokenizer(&args.model)?;
    let ids = tok.encode(&text, args.special)?;
    let pieces: Vec<String> =
        ids.iter().map(|&id| String::from_utf8_lossy(&tok.token_bytes(id)).into_owned()).collect();
    if args.json {
        outln!("{}", json!({"ids": ids, "pieces": pieces}))?;
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            outln!("{id}\t{}", piece.escape_debug())?;
        }
    }
    Ok(())
}
