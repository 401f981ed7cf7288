//! llama.cpp's PLaMo-2 tokenizer (`llm_tokenizer_plamo2`): the best-scoring cut of the
//! text into tokens by dynamic programming from the end, over a table of every suffix of
//! every token; a codepoint no token covers becomes its UTF-8 byte tokens.
//!
//! The table: each distinct token suffix, in the order of the reversed strings, gets a
//! block of rows, one per prefix of it that is itself a suffix of some token (longest
//! first), then a sentinel row; `to_suffix` maps (codepoint, id of a suffix) to the id of
//! the suffix one codepoint longer.

use std::collections::HashMap;

use super::Vocab;
use strata_model::gguf_vocab::{LlamaVocab, attr};

const INVALID_SCORE: i32 = -20_000_000;
const UNKNOWN_SCORE: i32 = -10_000_000;

#[derive(Clone, Copy)]
struct Row {
    /// In codepoints.
    len: usize,
    token: Option<u32>,
    score: i32,
    piece: u32,
}

pub(super) struct Plamo2 {
    /// `<0xXX>` token of each byte.
    bytes: [u32; 256],
    to_suffix: HashMap<(char, u32), u32>,
    table: Vec<Row>,
}

impl Plamo2 {
    pub fn new(spec: &LlamaVocab) -> Result<Self, String> {
        let mut bytes = [0u32; 256];
        let mut scores: HashMap<&str, f32> = HashMap::new();
        let mut ids: HashMap<&str, u32> = HashMap::new();
        for (id, text) in spec.tokens.iter().enumerate() {
            ids.insert(text, id as u32);
            if spec.attrs[id] & attr::BYTE != 0 {
                let hex = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'));
                let hex = hex.filter(|h| h.len() == 2 && h.bytes().all(|c| c.is_ascii_hexdigit()));
                if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    bytes[b as usize] = id as u32;
                }
                continue;
            }
            scores.insert(text, spec.scores.get(id).copied().unwrap_or(0.0));
            for (at, _) in text.char_indices().skip(1) {
                scores.entry(&text[at..]).or_insert(f32::NAN);
            }
        }
        // As in llama.cpp, a byte whose token is id 0 counts as missing.
        if let Some(b) = bytes.iter().position(|&id| id == 0) {
            return Err(format!("the vocabulary has no byte token <0x{b:02X}>"));
        }

        let mut suffixes: Vec<&str> = scores.keys().copied().chain([""]).collect();
        suffixes.sort_by(|a, b| a.bytes().rev().cmp(b.bytes().rev()));
        let prefixes = |s: &'_ str| -> Vec<usize> {
            // Byte ends of the prefixes that are suffixes of a token, longest first.
            let mut ends: Vec<usize> = s.char_indices().skip(1).map(|(i, _)| i).chain([s.len()]).collect();
            ends.retain(|&e| scores.contains_key(&s[..e]));
            ends.reverse();
            ends
        };
        let mut suffix_id: HashMap<&str, u32> = HashMap::with_capacity(suffixes.len());
        let mut to_suffix = HashMap::with_capacity(suffixes.len());
        let mut n = 0u32;
        for &s in &suffixes {
            suffix_id.insert(s, n);
            if let Some(first) = s.chars().next() {
                let rest = suffix_id.get(&s[first.len_utf8()..]).copied().unwrap_or(0);
                to_suffix.insert((first, rest), n);
            }
            n += 1 + prefixes(s).len() as u32;
        }
        let mut table = Vec::with_capacity(n as usize);
        for &s in &suffixes {
            for end in prefixes(s) {
                let piece = &s[..end];
                let score = scores[piece];
                table.push(Row {
                    len: piece.chars().count(),
                    token: ids.get(piece).copied(),
                    score: if score.is_finite() { (f64::from(score) * 1e4).round() as i32 } else { INVALID_SCORE },
                    piece: suffix_id.get(piece).copied().unwrap_or(0),
                });
            }
            table.push(Row { len: 1, token: None, score: UNKNOWN_SCORE, piece: 0 });
        }
        Ok(Self { bytes, to_suffix, table })
    }

    pub fn tokenize(&self, _vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let mut cpts: Vec<char> = text.chars().collect();
        if cpts.first() == Some(&'\u{FEFF}') {
            cpts.remove(0);
        }
        let n = cpts.len();
        // best[i]: (score of the best cut of cpts[i..], its first piece's length, token).
        let mut best: Vec<(i64, usize, Option<u32>)> = vec![(1 << 60, 0, None); n + 1];
        best[n].0 = 0;
        let mut suffix = 0usize;
        for i in (0..n).rev() {
            let c = cpts[i];
            for row in &self.table[suffix.min(self.table.len())..] {
                suffix = self.to_suffix.get(&(c, row.piece)).map_or(0, |&s| s as usize);
                if suffix > 0 || row.score == UNKNOWN_SCORE {
                    break;
                }
            }
            for row in &self.table[suffix.min(self.table.len())..] {
                if row.score > INVALID_SCORE && i + row.len <= n {
                    let s = best[i + row.len].0 - i64::from(row.score);
                    if s < best[i].0 {
                        best[i] = (s, row.len, row.token);
                    }
                }
                if row.score == UNKNOWN_SCORE {
                    break;
                }
            }
        }
        let mut i = 0;
        while i < n {
            let (_, len, token) = best[i];
            match token {
                Some(id) => out.push(id),
                None => out.extend(cpts[i].encode_utf8(&mut [0; 4]).bytes().map(|b| self.bytes[b as usize])),
            }
            if len == 0 {
                return Err("PLaMo-2 tokenization found no cut of the text".into());
            }
            i += len;
        }
        Ok(())
    }
}
