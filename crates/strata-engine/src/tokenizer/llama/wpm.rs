//! llama.cpp's WordPiece (`llm_tokenizer_wpm`): BERT-style normalization and word
//! splitting, then each word, with `▁` in front, is cut greedily into the longest tokens
//! from the left; a word that cannot be cut completely is the unknown token.

use super::Vocab;
use super::unicode::{Flags, nfd_first, to_lower};
use strata_model::gguf_vocab::LlamaVocab;

pub(super) struct Wpm {
    lowercase: bool,
    strip_accents: bool,
    unk: Option<u32>,
    /// The longest token text, in bytes.
    max_token_len: usize,
}

impl Wpm {
    pub fn new(spec: &LlamaVocab) -> Self {
        Self {
            lowercase: spec.lowercase,
            strip_accents: spec.strip_accents,
            unk: spec.unk,
            max_token_len: spec.tokens.iter().map(String::len).max().unwrap_or(0),
        }
    }

    pub fn tokenize(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        for word in self.words(text) {
            let word = format!("\u{2581}{word}");
            let bytes = word.as_bytes();
            let before = out.len();
            let mut i = 0;
            while i < bytes.len() {
                let longest = (i + 1..=bytes.len().min(i + self.max_token_len + 1))
                    .rev()
                    .find_map(|j| std::str::from_utf8(&bytes[i..j]).ok().and_then(|s| vocab.id(s)).map(|id| (j, id)));
                let Some((j, id)) = longest else {
                    out.truncate(before);
                    break;
                };
                out.push(id);
                i = j;
            }
            if out.len() == before {
                out.push(self.unk.ok_or("the vocabulary has no unknown token")?);
            }
        }
        Ok(())
    }

    /// llama.cpp's BERT pre-processing: whitespace splits words; NUL, U+FFFD and control
    /// characters go; with `strip_accents` each codepoint becomes its decomposition's
    /// first and marks go; punctuation, ASCII symbols and CJK ideographs stand alone.
    fn words(&self, text: &str) -> Vec<String> {
        let mut words = vec![String::new()];
        for c in text.chars() {
            let c = if self.strip_accents { nfd_first(c) } else { c };
            let f = Flags::of(c);
            if f.whitespace() {
                if !words.last().is_some_and(String::is_empty) {
                    words.push(String::new());
                }
                continue;
            }
            if c == '\0' || c == '\u{FFFD}' || f.control() || (self.strip_accents && f.mark()) {
                continue;
            }
            let s = if self.lowercase { to_lower(c) } else { c };
            if f.punctuation() || ((c as u32) < 0x7F && f.symbol()) || is_chinese(c) {
                if !words.last().is_some_and(String::is_empty) {
                    words.push(String::new());
                }
                if let Some(w) = words.last_mut() {
                    w.push(s);
                }
                words.push(String::new());
            } else if let Some(w) = words.last_mut() {
                w.push(s);
            }
        }
        words.retain(|w| !w.is_empty());
        words
    }
}

/// CJK ideographs as BERT (and llama.cpp) define them.
fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}
