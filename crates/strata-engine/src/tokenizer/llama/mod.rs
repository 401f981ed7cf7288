//! GGUF vocabularies tokenized the way llama.cpp tokenizes them (`llama-vocab.cpp`,
//! `unicode.cpp`), so a GGUF model gets llama.cpp's ids for every text: SentencePiece
//! BPE, regex-pre-tokenized BPE (with its whitespace and hybrid-DNA sessions), WordPiece,
//! Unigram, RWKV and PLaMo-2.
//!
//! The input is a [`LlamaVocab`], the vocabulary as llama.cpp's loader leaves it
//! (`model::gguf_vocab` reads it from the GGUF). Special tokens are cut out of the text
//! first, longest first, as llama.cpp's `tokenizer_st_partition` does; each stretch of
//! text between them goes to the family's algorithm.

mod bpe;
mod category;
mod plamo2;
mod rwkv;
mod split;
mod spm;
mod ugm;
mod unicode;
mod unicode_table;
mod wpm;

use std::collections::HashMap;

use strata_model::gguf_vocab::{LlamaVocab, VocabKind, attr};

/// The token texts, attributes and scores, looked up by id and by text.
pub(super) struct Vocab {
    tokens: Vec<String>,
    attrs: Vec<u32>,
    scores: Vec<f32>,
    /// Text → id; a repeated text means its last id, as in llama.cpp.
    ids: HashMap<String, u32>,
}

impl Vocab {
    fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    fn attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// SentencePiece byte fallback: `<0xXX>`, else the byte itself as a token.
    fn byte_token(&self, b: u8) -> Result<u32, String> {
        self.id(&format!("<0x{b:02X}>"))
            .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| self.id(s)))
            .ok_or_else(|| format!("the vocabulary has no token for byte 0x{b:02X}"))
    }
}

enum Model {
    Spm,
    Bpe(bpe::Bpe),
    Wpm(wpm::Wpm),
    Ugm(ugm::Ugm),
    Rwkv(rwkv::Rwkv),
    Plamo2(Box<plamo2::Plamo2>),
}

/// A stretch of the text to tokenize, or a special token cut out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment {
    Text { start: usize, end: usize },
    Token(u32),
}

/// A GGUF vocabulary with llama.cpp's tokenizer for its family.
pub struct LlamaTokenizer {
    vocab: Vocab,
    model: Model,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    add_space_prefix: bool,
    escape_whitespaces: bool,
    add_bos: bool,
    add_eos: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    sep: Option<u32>,
}

impl std::fmt::Debug for LlamaTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaTokenizer").field("tokens", &self.vocab.tokens.len()).finish()
    }
}

impl LlamaTokenizer {
    pub fn new(spec: LlamaVocab) -> Result<Self, String> {
        let n = spec.tokens.len();
        if spec.attrs.len() != n {
            return Err(format!("{} token attributes for {n} tokens", spec.attrs.len()));
        }
        if !spec.scores.is_empty() && spec.scores.len() != n {
            return Err(format!("{} scores for {n} tokens", spec.scores.len()));
        }
        for (what, id) in [("bos", spec.bos), ("eos", spec.eos), ("unk", spec.unk), ("sep", spec.sep)] {
            if id.is_some_and(|id| id as usize >= n) {
                return Err(format!("the {what} id is outside the {n}-token vocabulary"));
            }
        }
        let model = match spec.kind {
            VocabKind::Spm => Model::Spm,
            VocabKind::Bpe => Model::Bpe(bpe::Bpe::new(&spec)?),
            VocabKind::Wpm => Model::Wpm(wpm::Wpm::new(&spec)),
            VocabKind::Ugm => Model::Ugm(ugm::Ugm::new(&spec)?),
            VocabKind::Rwkv => Model::Rwkv(rwkv::Rwkv::new(&spec)),
            VocabKind::Plamo2 => Model::Plamo2(Box::new(plamo2::Plamo2::new(&spec)?)),
        };
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in spec.tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        // Looked up by their texts as stored, matched in the text as shown (they differ
        // for `hybriddna` k-mers).
        let tokens = spec.shown_tokens();
        let special_bits = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut specials: Vec<u32> = (0..n as u32).filter(|&id| spec.attrs[id as usize] & special_bits != 0).collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(tokens[id as usize].len()));
        Ok(Self {
            vocab: Vocab { tokens, attrs: spec.attrs, scores: spec.scores, ids },
            model,
            specials,
            add_space_prefix: spec.add_space_prefix,
            escape_whitespaces: spec.escape_whitespaces,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
            bos: spec.bos,
            eos: spec.eos,
            sep: spec.sep,
        })
    }

    /// The ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`
    /// gives them: `add_special` adds the family's start and end tokens, `parse_special`
    /// also cuts control tokens out of the text (user-defined tokens always are).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, String> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let required = |id: Option<u32>, what: &str| id.ok_or_else(|| format!("the vocabulary has no {what} token"));
        let starts = match self.model {
            Model::Wpm(_) => add_special,
            Model::Rwkv(_) | Model::Plamo2(_) => false,
            _ => add_special && self.add_bos,
        };
        if starts {
            out.push(required(self.bos, "start (BOS)")?);
        }
        let mut prev_special = true;
        for fragment in fragments {
            let (start, end) = match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                    continue;
                }
                Fragment::Text { start, end } => (start, end),
            };
            let piece = &text[start..end];
            match &self.model {
                Model::Spm => {
                    let mut t = String::with_capacity(piece.len() + 3);
                    if self.add_space_prefix && prev_special {
                        t.push(' ');
                    }
                    t.push_str(piece);
                    spm::tokenize(&self.vocab, &t.replace(' ', "\u{2581}"), &mut out)?;
                }
                Model::Bpe(bpe) => match self.escape_whitespaces {
                    true => bpe.tokenize(&self.vocab, &piece.replace(' ', "\u{2581}"), &mut out)?,
                    false => bpe.tokenize(&self.vocab, piece, &mut out)?,
                },
                Model::Wpm(wpm) => wpm.tokenize(&self.vocab, piece, &mut out)?,
                Model::Ugm(ugm) => ugm.tokenize(&self.vocab, piece, &mut out)?,
                Model::Rwkv(rwkv) => rwkv.tokenize(piece, &mut out)?,
                Model::Plamo2(plamo2) => plamo2.tokenize(&self.vocab, piece, &mut out)?,
            }
            prev_special = false;
        }
        match self.model {
            Model::Wpm(_) if add_special => out.push(required(self.sep, "separator (SEP)")?),
            Model::Spm | Model::Bpe(_) | Model::Ugm(_) if add_special && self.add_eos => {
                out.push(required(self.eos, "end (EOS)")?)
            }
            _ => {}
        }
        Ok(out)
    }

    /// `text` cut at every special token, one token after another, longest first; with
    /// llama.cpp's strip flags, the ASCII whitespace next to a token goes with it.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text { start: 0, end: text.len() }];
        let bytes = text.as_bytes();
        let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0B' | b'\x0C' | b'\r');
        for &id in &self.specials {
            let a = self.vocab.attr(id);
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let token = self.vocab.tokens[id as usize].as_str();
            if !fragments
                .iter()
                .any(|f| matches!(*f, Fragment::Text { start, end } if text[start..end].contains(token)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text { start, end } = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut at = start;
                while let Some(found) = text[at..end].find(token) {
                    let hit = at + found;
                    let mut left_end = hit;
                    if a & attr::LSTRIP != 0 {
                        while left_end > at && space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > at {
                        next.push(Fragment::Text { start: at, end: left_end });
                    }
                    next.push(Fragment::Token(id));
                    at = hit + token.len();
                    if a & attr::RSTRIP != 0 {
                        while at < end && space(bytes[at]) {
                            at += 1;
                        }
                    }
                }
                if at < end {
                    next.push(Fragment::Text { start: at, end });
                }
            }
            fragments = next;
        }
        fragments
    }
}

/// Bytes in the UTF-8 sequence a lead byte starts (llama.cpp's `unicode_len_utf8`).
/// One piece of a word being merged (BPE, SPM): a byte range and its neighbours in a
/// linked list over the pieces still alive.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// The characters of `bytes` as linked symbols (an invalid lead byte counts as one).
fn utf8_symbols(bytes: &[u8]) -> Vec<Symbol> {
    let mut symbols = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let len = utf8_len(bytes[at]).min(bytes.len() - at);
        let i = symbols.len();
        symbols.push(Symbol {
            start: at,
            len,
            prev: i.checked_sub(1),
            next: (at + len < bytes.len()).then_some(i + 1),
        });
        at += len;
    }
    symbols
}

fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spm_vocab(tokens: &[&str], attrs: &[u32]) -> LlamaVocab {
        LlamaVocab {
            kind: VocabKind::Spm,
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            attrs: attrs.to_vec(),
            scores: (0..tokens.len()).map(|i| -(i as f32)).collect(),
            merges: Vec::new(),
            bpe_session: Default::default(),
            pre_regexes: Vec::new(),
            byte_encode: false,
            ignore_merges: false,
            whole_newline_runs: false,
            escape_whitespaces: true,
            add_space_prefix: true,
            remove_extra_whitespaces: false,
            lowercase: false,
            strip_accents: false,
            add_bos: true,
            add_eos: false,
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            sep: None,
            precompiled_charsmap: None,
            fim: Default::default(),
            eog: Vec::new(),
        }
    }

    #[test]
    fn specials_are_cut_out_longest_first_and_strip_their_spaces() {
        let n = attr::NORMAL;
        let c = attr::CONTROL;
        let tokens = ["<unk>", "<s>", "</s>", "<|a|>", "<|a|>b", "\u{2581}x", "x", "\u{2581}", "y"];
        let mut attrs = [attr::UNKNOWN, c, c, c | attr::RSTRIP, attr::USER_DEFINED, n, n, n, n];
        let tok = LlamaTokenizer::new(spm_vocab(&tokens, &attrs)).unwrap();
        // `<|a|>b` (user-defined) is longer, so it goes first, even without parse_special.
        assert_eq!(tok.encode("x<|a|>b", false, false).unwrap(), [5, 4]);
        // Control tokens only with parse_special; RSTRIP takes the spaces after it.
        assert_eq!(tok.encode("x<|a|>  y", true, true).unwrap(), [1, 5, 3, 7, 8]);
        attrs[3] = c;
        let tok = LlamaTokenizer::new(spm_vocab(&tokens, &attrs)).unwrap();
        assert_eq!(tok.encode("x<|a|> y", false, true).unwrap(), [5, 3, 7, 7, 8]);
        assert_eq!(tok.encode("", true, true).unwrap(), [1]);
    }

    #[test]
    fn missing_start_token_is_an_error_not_a_panic() {
        let mut v = spm_vocab(&["<unk>", "a"], &[attr::UNKNOWN, attr::NORMAL]);
        (v.bos, v.eos) = (None, None);
        let tok = LlamaTokenizer::new(v).unwrap();
        assert!(tok.encode("a", true, false).unwrap_err().contains("no start (BOS) token"));
        let mut v = spm_vocab(&["<unk>", "a"], &[attr::UNKNOWN, attr::NORMAL]);
        (v.bos, v.eos) = (Some(7), None);
        assert!(LlamaTokenizer::new(v).unwrap_err().contains("bos id is outside"));
    }
}
