//! llama.cpp's SentencePiece Unigram (`llm_tokenizer_ugm`): normalize with the model's
//! precompiled charsmap and its whitespace rules, then take the most probable cut into
//! tokens (Viterbi over token scores; an unknown codepoint costs the worst score less 10,
//! and runs of unknowns become one unknown token).

use std::collections::HashMap;

use super::{Vocab, utf8_len};
use strata_model::gguf_vocab::{LlamaVocab, attr};

/// A byte trie: `(node, byte) → child`, and the token that ends at each node.
#[derive(Default)]
struct Trie {
    children: HashMap<(u32, u8), u32>,
    values: Vec<Option<u32>>,
}

impl Trie {
    fn insert(&mut self, key: &[u8], value: u32) {
        if self.values.is_empty() {
            self.values.push(None);
        }
        let mut node = 0;
        for &b in key {
            let next = self.values.len() as u32;
            node = *self.children.entry((node, b)).or_insert(next);
            if node == next {
                self.values.push(None);
            }
        }
        self.values[node as usize] = Some(value);
    }

    fn child(&self, node: u32, b: u8) -> Option<u32> {
        self.children.get(&(node, b)).copied()
    }

    fn value(&self, node: u32) -> Option<u32> {
        self.values.get(node as usize).copied().flatten()
    }

    /// How far `key` can be followed down the trie, token or not (llama.cpp's
    /// `get_longest_prefix`).
    fn walk(&self, key: &[u8]) -> usize {
        let mut node = 0;
        for (i, &b) in key.iter().enumerate() {
            match self.child(node, b) {
                Some(n) => node = n,
                None => return i,
            }
        }
        key.len()
    }
}

/// SentencePiece's precompiled charsmap: a XOR-compressed double array over input bytes
/// whose leaves point at NUL-terminated replacement strings.
struct Charsmap {
    nodes: Vec<u32>,
    replacements: Vec<u8>,
}

impl Charsmap {
    fn parse(bytes: &[u8]) -> Result<Option<Self>, String> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let len = bytes.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
        let Some(len) = len.filter(|&len| len.saturating_add(4) < bytes.len()) else {
            return Err("the precompiled charsmap is shorter than its header says".into());
        };
        let nodes = bytes[4..4 + len].chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok(Some(Self { nodes, replacements: bytes[4 + len..].to_vec() }))
    }

    fn node(&self, i: usize) -> Result<u32, String> {
        self.nodes.get(i).copied().ok_or_else(|| format!("precompiled charsmap node {i} is out of bounds"))
    }

    fn base(&self, i: usize) -> Result<usize, String> {
        let n = self.node(i)?;
        Ok(((n >> 10) << ((n & (1 << 9)) >> 6)) as usize)
    }

    /// The longest prefix of `input` the charsmap rewrites: its length and replacement.
    fn longest(&self, input: &[u8]) -> Result<Option<(usize, &[u8])>, String> {
        let mut found = None;
        let mut node = self.base(0)?;
        for (i, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= usize::from(c);
            let n = self.node(node)?;
            if n & ((1 << 31) | 0xFF) != u32::from(c) {
                break;
            }
            let leaf = (n >> 8) & 1 == 1;
            node ^= self.base(node)?;
            if leaf {
                found = Some((i + 1, (self.node(node)? & ((1 << 31) - 1)) as usize));
            }
        }
        let Some((len, at)) = found else { return Ok(None) };
        let rest = self.replacements.get(at..).ok_or("a precompiled charsmap replacement is out of bounds")?;
        let end = rest.iter().position(|&b| b == 0).ok_or("a precompiled charsmap replacement is not terminated")?;
        Ok(Some((len, &rest[..end])))
    }
}

pub(super) struct Ugm {
    tokens: Trie,
    user_defined: Trie,
    charsmap: Option<Charsmap>,
    unknown_score: f64,
    unk: Option<u32>,
    add_space_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
}

impl Ugm {
    pub fn new(spec: &LlamaVocab) -> Result<Self, String> {
        let mut tokens = Trie::default();
        let mut user_defined = Trie::default();
        let mut min_score = f32::MAX;
        for (id, (text, &a)) in spec.tokens.iter().zip(&spec.attrs).enumerate() {
            let normal = a & attr::NORMAL != 0;
            if normal {
                min_score = min_score.min(spec.scores.get(id).copied().unwrap_or(0.0));
            }
            if normal || a & (attr::USER_DEFINED | attr::UNUSED) != 0 {
                tokens.insert(text.as_bytes(), id as u32);
            }
            if a & attr::USER_DEFINED != 0 {
                user_defined.insert(text.as_bytes(), id as u32);
            }
        }
        Ok(Self {
            tokens,
            user_defined,
            charsmap: Charsmap::parse(&spec.charsmap()?)?,
            unknown_score: f64::from(min_score - 10.0),
            unk: spec.unk,
            add_space_prefix: spec.add_space_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            escape_whitespaces: spec.escape_whitespaces,
        })
    }

    pub fn tokenize(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let input = self.normalize(text)?;
        if input.is_empty() {
            return Ok(());
        }
        // Without an unknown token, only a text that needs none tokenizes.
        let unk = self.unk.unwrap_or(u32::MAX);
        // best[i]: the best cut of input[..i]: (last token, where it starts, total score).
        let mut best = vec![(unk, 0usize, f64::MIN); input.len() + 1];
        best[0] = (unk, 0, 0.0);
        let mut at = 0;
        while at < input.len() {
            let char_len = utf8_len(input[at]).min(input.len() - at);
            let here = best[at].2;
            let mut whole_char = false;
            let mut node = 0;
            for (end, &b) in input.iter().enumerate().skip(at) {
                let Some(next) = self.tokens.child(node, b) else { break };
                node = next;
                if let Some(id) = self.tokens.value(node) {
                    whole_char |= end + 1 - at == char_len;
                    let score = match vocab.attr(id) & attr::USER_DEFINED != 0 {
                        true => 0.0,
                        false => f64::from(vocab.score(id)),
                    };
                    if here + score > best[end + 1].2 {
                        best[end + 1] = (id, at, here + score);
                    }
                }
            }
            if !whole_char && here + self.unknown_score > best[at + char_len].2 {
                best[at + char_len] = (unk, at, here + self.unknown_score);
            }
            at += char_len;
        }
        let mut cut = Vec::new();
        let mut end = input.len();
        let mut prev_unknown = false;
        loop {
            let (id, start, _) = best[end];
            let unknown = id == unk;
            if !(prev_unknown && unknown) {
                cut.push(id);
            }
            if start == 0 {
                break;
            }
            prev_unknown = unknown;
            end = start;
        }
        if cut.contains(&u32::MAX) {
            return Err("the text needs the unknown token and the vocabulary has none".into());
        }
        out.extend(cut.iter().rev());
        Ok(())
    }

    /// The charsmap rewrite, with spaces as `▁`, a `▁` in front where asked, and
    /// whitespace runs collapsed to one `▁` before each word with `remove_extra_whitespaces`.
    fn normalize(&self, text: &str) -> Result<Vec<u8>, String> {
        let space: &[u8] = if self.escape_whitespaces { "\u{2581}".as_bytes() } else { b" " };
        let merge_spaces = self.remove_extra_whitespaces;
        let input = text.as_bytes();
        let mut out = Vec::with_capacity(input.len() * 3);
        let mut prepended = false;
        let mut in_word = false;
        let mut at = 0;
        while at < input.len() {
            let (piece, consumed) = self.normalize_prefix(&input[at..])?;
            for &c in piece {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (self.add_space_prefix && !prepended) || merge_spaces {
                            out.extend_from_slice(space);
                            prepended = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge_spaces {
                        out.extend_from_slice(space);
                    }
                }
            }
            at += consumed;
        }
        Ok(out)
    }

    /// The normalized form of the start of `input` and how many bytes it stands for:
    /// as far as the user-defined tokens' trie goes, as is; else the charsmap's longest
    /// rewrite; else one codepoint as is (U+FFFD for a byte that starts none).
    fn normalize_prefix<'a>(&'a self, input: &'a [u8]) -> Result<(&'a [u8], usize), String> {
        let user = self.user_defined.walk(input);
        if user > 0 {
            return Ok((&input[..user], user));
        }
        if let Some(map) = &self.charsmap
            && let Some((len, replacement)) = map.longest(input)?
        {
            return Ok((replacement, len));
        }
        Ok(match codepoint_len(input) {
            Some(len) => (&input[..len], len),
            None => ("\u{FFFD}".as_bytes(), 1),
        })
    }
}

/// The length of the UTF-8 sequence `input` starts with, if it is one (llama.cpp's
/// `unicode_cpt_from_utf8` checks: a lead byte and enough continuation bytes).
fn codepoint_len(input: &[u8]) -> Option<usize> {
    let lead = *input.first()?;
    let len = match lead {
        _ if lead & 0x80 == 0 => 1,
        _ if lead & 0x40 == 0 => return None,
        _ if lead & 0x20 == 0 => 2,
        _ if lead & 0x10 == 0 => 3,
        _ if lead & 0x08 == 0 => 4,
        _ => return None,
    };
    let rest = input.get(1..len)?;
    rest.iter().all(|&b| b & 0xC0 == 0x80).then_some(len)
}
