//! llama.cpp's RWKV tokenizer (`llm_tokenizer_rwkv`): token texts are escaped byte
//! strings; the text is cut greedily into the longest tokens from the left.

use std::collections::HashMap;

use strata_model::gguf_vocab::LlamaVocab;

pub(super) struct Rwkv {
    /// Unescaped token bytes → id (a repeated text means its last id).
    ids: HashMap<Vec<u8>, u32>,
    max_len: usize,
    unk: Option<u32>,
}

impl Rwkv {
    pub fn new(spec: &LlamaVocab) -> Self {
        let mut ids = HashMap::with_capacity(spec.tokens.len());
        for (id, t) in spec.tokens.iter().enumerate() {
            ids.insert(unescape(t), id as u32);
        }
        let max_len = ids.keys().map(Vec::len).max().unwrap_or(0);
        Self { ids, max_len, unk: spec.unk }
    }

    pub fn tokenize(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let bytes = text.as_bytes();
        let mut at = 0;
        while at < bytes.len() {
            let longest = (at + 1..=bytes.len().min(at + self.max_len))
                .rev()
                .find_map(|end| Some((end, *self.ids.get(&bytes[at..end])?)));
            match longest {
                Some((end, id)) => {
                    out.push(id);
                    at = end;
                }
                None => {
                    out.push(self.unk.ok_or_else(|| format!("no RWKV token starts with byte 0x{:02X}", bytes[at]))?);
                    at += 1;
                }
            }
        }
        Ok(())
    }
}

/// An RWKV token text: `\t`, `\n`, `\r`, `\xHH` and `\<char>` escapes.
fn unescape(escaped: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b't') => out.push(b'\t'),
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b'x') => {
                let hex = |b: Option<u8>| {
                    b.map_or(0, |b| if b >= b'a' { b.wrapping_sub(b'a' - 10) } else { b.wrapping_sub(b'0') })
                };
                let hi = hex(bytes.next());
                let lo = hex(bytes.next());
                out.push(hi.wrapping_shl(4).wrapping_add(lo));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::gguf_vocab::{VocabKind, attr};

    #[test]
    fn escaped_tokens_and_greedy_longest_match() {
        assert_eq!(unescape(r"a\tb\n\x41\\"), b"a\tb\nA\\");
        let tokens = ["<unk>", "a", "ab", "abc", "\\n", "b"];
        let spec = LlamaVocab {
            kind: VocabKind::Rwkv,
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            attrs: vec![attr::NORMAL; tokens.len()],
            scores: Vec::new(),
            merges: Vec::new(),
            bpe_session: Default::default(),
            pre_regexes: Vec::new(),
            byte_encode: false,
            ignore_merges: false,
            whole_newline_runs: false,
            escape_whitespaces: false,
            add_space_prefix: false,
            remove_extra_whitespaces: false,
            lowercase: false,
            strip_accents: false,
            add_bos: false,
            add_eos: false,
            bos: None,
            eos: None,
            unk: Some(0),
            sep: None,
            precompiled_charsmap: None,
            fim: Default::default(),
            eog: Vec::new(),
        };
        let rwkv = Rwkv::new(&spec);
        let mut out = Vec::new();
        rwkv.tokenize("abcab\nz", &mut out).unwrap();
        assert_eq!(out, [3, 2, 4, 0]);
    }
}
