//! llama.cpp's SentencePiece BPE (`llm_tokenizer_spm`): start from single codepoints and
//! keep merging the adjacent pair whose joined text is the best-scoring token (leftmost
//! on ties); what is left and is not a token becomes byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{Symbol, Vocab, utf8_symbols};

/// A candidate merge of `left` and the symbol after it into a `len`-byte token.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// Higher score first, then the leftmost (a NaN score ties, as in llama.cpp).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal).then(other.left.cmp(&self.left))
    }
}

/// Tokenizes `text` (spaces already `▁`) onto `out`.
pub(super) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
    let bytes = text.as_bytes();
    let mut symbols = utf8_symbols(bytes);
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: Option<usize>, right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else { return };
        let (l, r) = (symbols[left], symbols[right]);
        let Some(joined) = text.get(l.start..l.start + l.len + r.len) else { return };
        if let Some(id) = vocab.id(joined) {
            queue.push(Bigram { score: vocab.score(id), left, right, len: joined.len() });
        }
    };
    for i in 1..symbols.len() {
        push(&mut queue, &symbols, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        push(&mut queue, &symbols, l.prev, Some(b.left));
        push(&mut queue, &symbols, Some(b.left), r.next);
    }
    // Every merged symbol is a token (only token texts are merged), so llama.cpp's
    // re-segmentation of non-tokens only ever meets single codepoints: their bytes.
    let mut i = (!symbols.is_empty()).then_some(0);
    while let Some(s) = i.map(|i| symbols[i]) {
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    out.push(vocab.byte_token(b)?);
                }
            }
        }
        i = s.next;
    }
    Ok(())
}
