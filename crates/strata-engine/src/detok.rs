//! Incremental detokenization: turns a stream of token ids into text pieces that are
//! always whole UTF-8 characters and concatenate to what decoding all ids at once gives.
//!
//! Decoding one id at a time is wrong in two ways: byte-level BPE (and SentencePiece byte
//! fallback) can split one character over several tokens, and many decoders treat the
//! first token of a sequence specially (SentencePiece strips its leading space). Like
//! text-generation-inference, we keep two offsets into the ids: `prefix_offset` (where the
//! decode window starts, a few tokens back) and `read_offset` (the end of what was already
//! emitted). Each step decodes `ids[prefix..read]` and `ids[prefix..]` and emits the
//! difference, unless the new text ends in U+FFFD (an incomplete character), in which case
//! it waits for more tokens.
//!
//! When the tokenizer asks for transformers' `clean_up_tokenization` (only non-BPE models),
//! the emitted text goes through a streaming version of it that holds back only the few
//! characters a rule could still touch.

use super::tokenizer::{TextError, TextTokenizer, clean_up_tokenization};

/// Decoding of id slices, implemented by the raw `tokenizers::Tokenizer` and by
/// [`TextTokenizer`].
pub trait TokenDecode {
    /// Decodes without any post-hoc clean-up.
    fn decode_ids(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError>;
    /// Whether `id` is a special added token (dropped by `skip_special_tokens`).
    fn is_special_id(&self, id: u32) -> bool;
    /// Whether transformers' `clean_up_tokenization` applies to the decoded text.
    fn cleans_up_spaces(&self) -> bool {
        false
    }
}

impl TokenDecode for tokenizers::Tokenizer {
    fn decode_ids(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.decode(ids, skip_special_tokens).map_err(|e| TextError::Decode(e.to_string()))
    }
    fn is_special_id(&self, id: u32) -> bool {
        let added = self.get_added_vocabulary();
        added.simple_id_to_token(id).is_some_and(|t| added.is_special_token(&t))
    }
}

impl TokenDecode for TextTokenizer {
    fn decode_ids(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.decode_raw(ids, skip_special_tokens)
    }
    fn is_special_id(&self, id: u32) -> bool {
        self.inner().is_special_id(id)
    }
    fn cleans_up_spaces(&self) -> bool {
        self.cleans_up_tokenization_spaces()
    }
}

/// Tokens of context kept before the emitted position.
const CONTEXT_TOKENS: usize = 5;
/// Pending tokens after which text is emitted even if it still ends in U+FFFD (the
/// model produced bytes that are not UTF-8; waiting longer cannot fix that).
const MAX_PENDING_TOKENS: usize = 16;

/// Streaming id → text decoder bound to a tokenizer: `new(tok, skip)`, `push(id)`,
/// `flush()`. `T` is `tokenizers::Tokenizer` or [`TextTokenizer`] (the latter also applies
/// transformers' space clean-up where the model asks for it).
pub struct IncrementalDecoder<'a, T: TokenDecode + ?Sized = tokenizers::Tokenizer> {
    tok: &'a T,
    state: DetokState,
}

impl<'a, T: TokenDecode + ?Sized> IncrementalDecoder<'a, T> {
    pub fn new(tok: &'a T, skip_special_tokens: bool) -> Self {
        let mut state = DetokState::new(skip_special_tokens);
        state.decide_cleanup(tok);
        Self { tok, state }
    }

    /// See [`DetokState::with_prompt_context`].
    pub fn with_prompt_context(mut self, prompt_ids: &[u32]) -> Self {
        self.state = self.state.with_prompt_context(prompt_ids);
        self
    }

    /// Adds one id and returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        self.state.push(self.tok, id)
    }

    /// End of the stream: whatever was held back.
    pub fn flush(&mut self) -> Result<String, TextError> {
        self.state.flush(self.tok)
    }
}

/// The decoder's state without the tokenizer borrow, for callers that keep per-sequence
/// state in long-lived structs and pass the tokenizer on each call. Holds only a small
/// window of ids.
#[derive(Clone, Debug)]
pub struct DetokState {
    /// The ids from `prefix_offset` on (older ones are dropped once emitted).
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
    cleanup: Option<StreamingCleanup>,
    cleanup_decided: bool,
}

impl DetokState {
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            skip_special_tokens,
            cleanup: None,
            cleanup_decided: false,
        }
    }

    /// Starts after `prompt_ids`: their last few tokens become decode context, so the first
    /// generated token keeps the leading space it has in the running text (SentencePiece
    /// decoders strip it from the first token of a sequence). Nothing of the prompt is
    /// emitted. The concatenated output then equals decode(prompt + generated) minus
    /// decode(prompt), not decode(generated).
    pub fn with_prompt_context(mut self, prompt_ids: &[u32]) -> Self {
        let start = prompt_ids.len().saturating_sub(CONTEXT_TOKENS);
        self.ids = prompt_ids[start..].to_vec();
        self.prefix_offset = 0;
        self.read_offset = self.ids.len();
        self
    }

    fn decide_cleanup<T: TokenDecode + ?Sized>(&mut self, tok: &T) {
        if !self.cleanup_decided {
            self.cleanup_decided = true;
            if tok.cleans_up_spaces() {
                self.cleanup = Some(StreamingCleanup::default());
            }
        }
    }

    /// Adds one id and returns the text it completes (possibly empty).
    pub fn push<T: TokenDecode + ?Sized>(&mut self, tok: &T, id: u32) -> Result<String, TextError> {
        self.decide_cleanup(tok);
        if self.skip_special_tokens && tok.is_special_id(id) {
            // A full decode drops it before the decoder runs, so it is as if it never came
            // (and a run of them cannot grow the window).
            return Ok(String::new());
        }
        self.ids.push(id);
        let prefix_text = tok.decode_ids(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let new_text = tok.decode_ids(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        let pending = self.ids.len() - self.read_offset;
        let incomplete = new_text.ends_with('\u{FFFD}') && pending < MAX_PENDING_TOKENS;
        if new_text.len() <= prefix_text.len() || incomplete {
            return Ok(String::new());
        }
        let piece = text_after(&prefix_text, &new_text).to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Forget ids before the window.
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
        Ok(self.clean(piece))
    }

    /// End of the stream: whatever was held back (an incomplete character decodes as
    /// U+FFFD, as a full decode would show it).
    pub fn flush<T: TokenDecode + ?Sized>(&mut self, tok: &T) -> Result<String, TextError> {
        self.decide_cleanup(tok);
        let mut out = String::new();
        if self.read_offset < self.ids.len() {
            let prefix_text =
                tok.decode_ids(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
            let new_text = tok.decode_ids(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
            out = text_after(&prefix_text, &new_text).to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        out = self.clean(out);
        if let Some(c) = &mut self.cleanup {
            out.push_str(&c.finish());
        }
        Ok(out)
    }

    fn clean(&mut self, piece: String) -> String {
        match &mut self.cleanup {
            Some(c) => c.push(&piece),
            None => piece,
        }
    }
}

/// The part of `new` past `prefix`. Normally `prefix` is a prefix of `new`; if a decoder
/// rewrote earlier text, fall back to the longest common prefix at a char boundary.
fn text_after<'a>(prefix: &str, new: &'a str) -> &'a str {
    if let Some(rest) = new.strip_prefix(prefix) {
        return rest;
    }
    let common = prefix
        .char_indices()
        .zip(new.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| prefix.len().min(new.len()));
    let mut cut = common.min(new.len());
    while !new.is_char_boundary(cut) {
        cut -= 1;
    }
    &new[cut..]
}

/// Streaming `clean_up_tokenization`. Every rule starts with a space and only deletes that
/// space, so text can be released up to the last character that is neither a space nor a
/// character any rule contains after its space: no rule match (even one created by an
/// earlier rule deleting a space) can reach across such a character.
#[derive(Clone, Debug, Default)]
struct StreamingCleanup {
    pending: String,
}

impl StreamingCleanup {
    fn is_barrier(c: char) -> bool {
        !matches!(c, ' ' | '.' | '?' | '!' | ',' | '\'' | 'n' | 't' | 'm' | 's' | 'v' | 'e' | 'r')
    }

    fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        let cut = self.pending.char_indices().rev().find(|(_, c)| Self::is_barrier(*c)).map(|(i, c)| i + c.len_utf8());
        match cut {
            Some(cut) => {
                let ready: String = self.pending.drain(..cut).collect();
                clean_up_tokenization(&ready)
            }
            None => String::new(),
        }
    }

    fn finish(&mut self) -> String {
        clean_up_tokenization(&std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::{BOS, EOT, byte_level_tokenizer_json, sentencepiece_tokenizer_json};

    fn byte_tokenizer() -> tokenizers::Tokenizer {
        byte_level_tokenizer_json().parse().unwrap()
    }

    /// Byte-level id of each byte of `text` (ids 0..256 are the raw bytes).
    fn byte_ids(tok: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
        let chars = crate::tokenizer::tests::byte_level_chars();
        text.bytes().map(|b| tok.token_to_id(&chars[b as usize].to_string()).unwrap()).collect()
    }

    fn stream<T: TokenDecode>(tok: &T, ids: &[u32], skip: bool) -> (Vec<String>, String) {
        let mut d = IncrementalDecoder::new(tok, skip);
        let mut pieces = Vec::new();
        for &id in ids {
            pieces.push(d.push(id).unwrap());
        }
        pieces.push(d.flush().unwrap());
        let all = pieces.concat();
        (pieces, all)
    }

    #[test]
    fn emoji_and_cjk_split_byte_by_byte_never_emit_half_characters() {
        let tok = byte_tokenizer();
        let text = "Hi 😀 你好, wörld 🎉!";
        let ids = byte_ids(&tok, text);
        assert_eq!(ids.len(), text.len());
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(all, text);
        assert_eq!(all, tok.decode(&ids, false).unwrap());
        for p in &pieces {
            assert!(!p.contains('\u{FFFD}'), "half a character emitted: {pieces:?}");
        }
        // The 4-byte emoji comes out whole, on its last byte.
        assert!(pieces.contains(&"😀".to_string()), "{pieces:?}");
        assert!(pieces.contains(&"你".to_string()), "{pieces:?}");
    }

    #[test]
    fn merged_tokens_and_bpe_encoding_round_trip() {
        let tok = byte_tokenizer();
        let text = "hello world é😀 hello";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        // A merge covers the first two bytes of the emoji, so a token boundary falls
        // inside it.
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(all, text);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    }

    #[test]
    fn special_tokens_can_be_skipped_or_kept() {
        let tok = byte_tokenizer();
        let mut ids = vec![BOS];
        ids.extend(byte_ids(&tok, "ab"));
        ids.push(EOT);
        let (_, kept) = stream(&tok, &ids, false);
        assert_eq!(kept, tok.decode(&ids, false).unwrap());
        assert!(kept.contains("<s>") && kept.contains("<|eot|>"), "{kept}");
        let (_, skipped) = stream(&tok, &ids, true);
        assert_eq!(skipped, "ab");
    }

    #[test]
    fn skipped_special_tokens_do_not_grow_the_window() {
        let tok = byte_tokenizer();
        let mut d = DetokState::new(true);
        let mut out = d.push(&tok, byte_ids(&tok, "a")[0]).unwrap();
        for _ in 0..1000 {
            out.push_str(&d.push(&tok, EOT).unwrap());
        }
        assert!(d.ids.len() <= CONTEXT_TOKENS + 1, "{}", d.ids.len());
        out.push_str(&d.push(&tok, byte_ids(&tok, "b")[0]).unwrap());
        out.push_str(&d.flush(&tok).unwrap());
        assert_eq!(out, "ab");
        assert!(tok.is_special_id(EOT) && !tok.is_special_id(5));
    }

    #[test]
    fn incomplete_tail_is_flushed_as_replacement_char() {
        let tok = byte_tokenizer();
        let mut ids = byte_ids(&tok, "ok");
        ids.extend(&byte_ids(&tok, "😀")[..2]);
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(all, tok.decode(&ids, false).unwrap());
        assert!(all.starts_with("ok") && all.ends_with('\u{FFFD}'), "{all:?}");
        assert!(pieces[..pieces.len() - 1].iter().all(|p| !p.contains('\u{FFFD}')));
    }

    #[test]
    fn invalid_bytes_do_not_stall_forever() {
        let tok = byte_tokenizer();
        // A lone continuation byte never becomes valid.
        let lone = byte_ids(&tok, "é")[1];
        let mut d = DetokState::new(false);
        let mut out = String::new();
        out.push_str(&d.push(&tok, lone).unwrap());
        let more = byte_ids(&tok, "abc");
        for _ in 0..MAX_PENDING_TOKENS {
            out.push_str(&d.push(&tok, lone).unwrap());
        }
        for id in more {
            out.push_str(&d.push(&tok, id).unwrap());
        }
        assert!(out.ends_with("abc"), "{out:?}");
        assert!(d.ids.len() <= MAX_PENDING_TOKENS + CONTEXT_TOKENS + 1, "window bounded");
    }

    fn sentencepiece_tokenizer() -> tokenizers::Tokenizer {
        sentencepiece_tokenizer_json().parse().unwrap()
    }

    #[test]
    fn sentencepiece_leading_spaces_match_full_decode() {
        let tok = sentencepiece_tokenizer();
        let text = "Hi there 你 Hi";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        // Byte fallback must have been used for the CJK char.
        assert!(ids.iter().any(|&i| (3..259).contains(&i)), "{ids:?}");
        let (pieces, all) = stream(&tok, &ids, false);
        assert_eq!(all, tok.decode(&ids, false).unwrap());
        assert_eq!(all, text);
        // Decoding ids one at a time would lose every space.
        let naive: String = ids.iter().map(|&i| tok.decode(&[i], false).unwrap()).collect();
        assert_ne!(naive, text);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
        // With BOS in front and skipped, the text is the same.
        let mut with_bos = vec![1];
        with_bos.extend(&ids);
        let (_, all) = stream(&tok, &with_bos, true);
        assert_eq!(all, text);
    }

    #[test]
    fn prompt_context_keeps_the_leading_space_of_the_first_generated_token() {
        let tok = sentencepiece_tokenizer();
        let prompt = tok.encode("Hi", false).unwrap().get_ids().to_vec();
        let there = tok.token_to_id("▁there").unwrap();
        let mut d = IncrementalDecoder::new(&tok, true).with_prompt_context(&prompt);
        assert_eq!(d.push(there).unwrap(), " there");
        assert_eq!(d.flush().unwrap(), "");
        let mut d = IncrementalDecoder::new(&tok, true);
        assert_eq!(d.push(there).unwrap(), "there");
    }

    #[test]
    fn streaming_cleanup_equals_cleanup_of_the_whole() {
        let texts = [
            "Hello , world ! I do n't know . It 's ok ?",
            "a ' b  ' s x 're y 've z 'm",
            "ends with space ",
            "ends with n",
            "  .  ,",
        ];
        for text in texts {
            // Feed one char at a time and in uneven chunks.
            for chunk in [1usize, 2, 3, 7] {
                let mut c = StreamingCleanup::default();
                let mut out = String::new();
                let chars: Vec<char> = text.chars().collect();
                for part in chars.chunks(chunk) {
                    out.push_str(&c.push(&part.iter().collect::<String>()));
                }
                out.push_str(&c.finish());
                assert_eq!(out, clean_up_tokenization(text), "{text:?} chunk {chunk}");
            }
        }
    }

    #[test]
    fn text_after_handles_rewritten_prefixes() {
        assert_eq!(text_after("ab", "abc"), "c");
        assert_eq!(text_after("ab\u{FFFD}", "abé"), "é");
        assert_eq!(text_after("", "x"), "x");
    }
}
