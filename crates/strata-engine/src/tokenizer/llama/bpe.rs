//! llama.cpp's BPE (`llm_tokenizer_bpe_session`): pre-tokenize into words, then in each
//! word keep merging the adjacent pair with the best (lowest) merge rank, leftmost on ties;
//! a symbol that is not a token at the end becomes byte tokens.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::split::PreTokenizer;
use super::unicode::{is_whitespace, to_lower};
use super::{Symbol, Vocab, utf8_symbols};
use strata_model::gguf_vocab::{BpeSession, DNA_KMER_MARKER, LlamaVocab};

pub(super) struct Bpe {
    /// `left right` → rank (the first of a repeated merge wins, as in llama.cpp).
    ranks: HashMap<String, u32>,
    pre: PreTokenizer,
    byte_encode: bool,
    ignore_merges: bool,
    whole_newline_runs: bool,
    session: BpeSession,
    lowercase: bool,
}

/// A candidate merge: (rank, left symbol, right symbol, their lengths when queued).
type Candidate = Reverse<(u32, usize, usize, usize, usize)>;

impl Bpe {
    pub fn new(spec: &LlamaVocab) -> Result<Self, String> {
        let mut ranks = HashMap::with_capacity(spec.merges.len());
        for (rank, m) in spec.merges.iter().enumerate() {
            ranks.entry(m.clone()).or_insert(rank as u32);
        }
        Ok(Self {
            ranks,
            pre: PreTokenizer::new(&spec.pre_regexes, spec.byte_encode)?,
            byte_encode: spec.byte_encode,
            ignore_merges: spec.ignore_merges,
            whole_newline_runs: spec.whole_newline_runs,
            session: spec.bpe_session,
            lowercase: spec.lowercase,
        })
    }

    /// Tokenizes one stretch of text onto `out`.
    pub fn tokenize(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        match self.session {
            BpeSession::Plain => self.words(vocab, text, out),
            BpeSession::Whitespace => {
                // Whitespace separates the segments and is dropped.
                let mut segment = String::new();
                for c in text.chars() {
                    if is_whitespace(c) {
                        self.words(vocab, &segment, out)?;
                        segment.clear();
                    } else {
                        segment.push(if self.lowercase { to_lower(c) } else { c });
                    }
                }
                self.words(vocab, &segment, out)
            }
            BpeSession::HybridDna => self.hybrid_dna(vocab, text, out),
        }
    }

    /// llama.cpp's `llm_tokenizer_hybriddna_session`: plain BPE outside `<dna>…</dna>`;
    /// inside, the tags' own ids and the sequence as k-mers (an unclosed `<dna>` runs to
    /// the end). Without all of `<dna>`, `</dna>` and `<oov>` in the vocabulary, plain BPE.
    fn hybrid_dna(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        const OPEN: &str = "<dna>";
        const CLOSE: &str = "</dna>";
        let (Some(open), Some(close), Some(oov)) = (vocab.id(OPEN), vocab.id(CLOSE), vocab.id("<oov>")) else {
            return self.words(vocab, text, out);
        };
        let mut rest = text;
        while let Some(start) = rest.find(OPEN) {
            self.words(vocab, &rest[..start], out)?;
            out.push(open);
            let inside = &rest[start + OPEN.len()..];
            let Some(end) = inside.find(CLOSE) else {
                dna_kmers(vocab, inside.as_bytes(), oov, out);
                return Ok(());
            };
            dna_kmers(vocab, &inside.as_bytes()[..end], oov, out);
            out.push(close);
            rest = &inside[end + CLOSE.len()..];
        }
        self.words(vocab, rest, out)
    }

    fn words(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        for word in self.pre.split(text) {
            self.word(vocab, &word, out)?;
        }
        Ok(())
    }

    fn rank(&self, word: &str, l: Symbol, r: Symbol) -> Option<u32> {
        let key = format!("{} {}", &word[l.start..l.start + l.len], &word[r.start..r.start + r.len]);
        self.ranks.get(&key).copied()
    }

    fn word(&self, vocab: &Vocab, word: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let whole = (self.ignore_merges || (self.whole_newline_runs && word.bytes().all(|b| b == b'\n')))
            && vocab.id(word).is_some();
        let bytes = word.as_bytes();
        let mut symbols = match whole {
            true => vec![Symbol { start: 0, len: word.len(), prev: None, next: None }],
            false => utf8_symbols(bytes),
        };
        // Best rank first, then leftmost.
        let mut queue: BinaryHeap<Candidate> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, symbols: &[Symbol], left: Option<usize>, right: Option<usize>| {
            let (Some(left), Some(right)) = (left, right) else { return };
            let (l, r): (Symbol, Symbol) = (symbols[left], symbols[right]);
            if let Some(rank) = self.rank(word, l, r) {
                queue.push(Reverse((rank, left, right, l.len, r.len)));
            }
        };
        for i in 1..symbols.len() {
            push(&mut queue, &symbols, Some(i - 1), Some(i));
        }
        while let Some(Reverse((_, left, right, l_len, r_len))) = queue.pop() {
            let (l, r) = (symbols[left], symbols[right]);
            // Skip a pair one of whose symbols has changed since.
            if l.len == 0 || r.len == 0 || l.len != l_len || r.len != r_len {
                continue;
            }
            symbols[left].len += r.len;
            symbols[right].len = 0;
            symbols[left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(left);
            }
            push(&mut queue, &symbols, l.prev, Some(left));
            push(&mut queue, &symbols, Some(left), r.next);
        }
        for s in symbols.iter().filter(|s| s.len > 0) {
            let piece = &word[s.start..s.start + s.len];
            if let Some(id) = vocab.id(piece) {
                out.push(id);
                continue;
            }
            // Byte by byte; a byte with no token is dropped, as in llama.cpp.
            for &b in piece.as_bytes() {
                let id = match self.byte_encode {
                    true => std::str::from_utf8(&[b]).ok().and_then(|s| vocab.id(s)),
                    false => vocab.id(&format!("<0x{b:02X}>")),
                };
                out.extend(id);
            }
        }
        Ok(())
    }
}

/// Letters per DNA k-mer token.
const DNA_K: usize = 6;

/// A DNA sequence as k-mer tokens: ASCII letters uppercased, cut every [`DNA_K`] bytes
/// (a short last piece padded with `A`), each the token of its text plus the k-mer marker,
/// else `oov`. Bytes, not characters, as in llama.cpp: a piece that splits a character
/// is no token's text.
fn dna_kmers(vocab: &Vocab, seq: &[u8], oov: u32, out: &mut Vec<u32>) {
    for piece in seq.chunks(DNA_K) {
        let mut key: Vec<u8> = piece.iter().map(u8::to_ascii_uppercase).collect();
        key.resize(DNA_K, b'A');
        key.extend_from_slice(DNA_KMER_MARKER.as_bytes());
        out.push(String::from_utf8(key).ok().and_then(|k| vocab.id(&k)).unwrap_or(oov));
    }
}
