//! Reasoning text apart from the answer: models that think (Qwen3, QwQ, DeepSeek-R1,
//! SmolLM3, Magistral, ...) write their reasoning between markers, `<think>` and
//! `</think>` (or `[THINK]` and `[/THINK]`). Their chat templates show the markers, and
//! often open the reasoning in the generation prompt itself (DeepSeek-R1 ends it with
//! `<think>\n`), so the reply starts inside it.
//!
//! [`ReasoningSplitter`] takes the generated text as it streams and tells reasoning from
//! answer, holding back text that may be the start of a marker.

use super::toolcall::partial_suffix;

/// A pair of reasoning markers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThinkMarkers {
    pub open: &'static str,
    pub close: &'static str,
}

const PAIRS: [ThinkMarkers; 2] =
    [ThinkMarkers { open: "<think>", close: "</think>" }, ThinkMarkers { open: "[THINK]", close: "[/THINK]" }];

impl ThinkMarkers {
    /// The markers a chat template writes reasoning between, if any.
    pub fn detect(template: &str) -> Option<Self> {
        PAIRS.into_iter().find(|m| template.contains(m.close))
    }

    /// Whether a rendered prompt leaves the reasoning open (its last opening marker comes
    /// after its last closing one), so that the reply starts inside it.
    pub fn open_at_end(&self, prompt: &str) -> bool {
        match (prompt.rfind(self.open), prompt.rfind(self.close)) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// A piece of the reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Answer(String),
}

/// Splits streamed text into reasoning and answer.
#[derive(Debug)]
pub struct ReasoningSplitter {
    markers: ThinkMarkers,
    /// Inside the reasoning.
    thinking: bool,
    /// Whether the reply may still open reasoning (only at its start, after whitespace).
    at_start: bool,
    /// Text held back: a possible marker's start.
    held: String,
    /// The answer has had text that is not whitespace.
    answered: bool,
}

impl ReasoningSplitter {
    /// `inside`: the prompt left the reasoning open.
    pub fn new(markers: ThinkMarkers, inside: bool) -> Self {
        Self { markers, thinking: inside, at_start: !inside, held: String::new(), answered: false }
    }

    /// Whether the text so far leaves it inside the reasoning.
    pub fn thinking(&self) -> bool {
        self.thinking
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.advance(false, &mut out);
        out
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.advance(true, &mut out);
        out
    }

    fn advance(&mut self, eof: bool, out: &mut Vec<Piece>) {
        loop {
            if self.at_start {
                let trimmed = self.held.trim_start();
                if trimmed.is_empty() && !eof {
                    return;
                }
                if let Some(rest) = trimmed.strip_prefix(self.markers.open) {
                    self.held = rest.to_string();
                    self.thinking = true;
                    self.at_start = false;
                    continue;
                }
                if !eof && self.markers.open.starts_with(trimmed) {
                    return;
                }
                self.at_start = false;
            }
            let marker = if self.thinking { self.markers.close } else { "" };
            if marker.is_empty() {
                // The answer: everything, except the whitespace between reasoning and answer.
                let mut text = std::mem::take(&mut self.held);
                if !self.answered {
                    text = text.trim_start().to_string();
                }
                if !text.is_empty() {
                    self.answered = true;
                    out.push(Piece::Answer(text));
                }
                return;
            }
            if let Some(at) = self.held.find(marker) {
                let reasoning = self.held[..at].to_string();
                if !reasoning.is_empty() {
                    out.push(Piece::Reasoning(reasoning));
                }
                self.held.drain(..at + marker.len());
                self.thinking = false;
                continue;
            }
            let keep = if eof { 0 } else { partial_suffix(&self.held, marker) };
            let cut = self.held.len() - keep;
            if cut > 0 {
                out.push(Piece::Reasoning(self.held[..cut].to_string()));
                self.held.drain(..cut);
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(markers: ThinkMarkers, inside: bool, text: &str, step: usize) -> (String, String) {
        let mut s = ReasoningSplitter::new(markers, inside);
        let mut pieces = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step) {
            pieces.extend(s.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(s.finish());
        let (mut r, mut a) = (String::new(), String::new());
        for p in pieces {
            match p {
                Piece::Reasoning(t) => r.push_str(&t),
                Piece::Answer(t) => a.push_str(&t),
            }
        }
        (r, a)
    }

    #[test]
    fn splits_at_any_chunking() {
        let think = PAIRS[0];
        for step in [1, 2, 3, 7, 100] {
            assert_eq!(
                split(think, false, "<think>\nLet me see.\n</think>\n\nHello!", step),
                ("\nLet me see.\n".into(), "Hello!".into())
            );
            // The prompt opened it (DeepSeek-R1).
            assert_eq!(split(think, true, "ponder</think>Yes.", step), ("ponder".into(), "Yes.".into()));
            // No reasoning at all; a `<` that is no marker.
            assert_eq!(split(think, false, "a <b> c", step), ("".into(), "a <b> c".into()));
            // Cut off while thinking: all of it is reasoning.
            assert_eq!(split(think, false, "<think>hmm </th", step), ("hmm </th".into(), "".into()));
            // A marker later in the answer is answer text.
            assert_eq!(split(think, false, "x <think>y</think>", step), ("".into(), "x <think>y</think>".into()));
            assert_eq!(split(PAIRS[1], false, "[THINK]a[/THINK]b", step), ("a".into(), "b".into()));
        }
    }

    #[test]
    fn detects_markers_and_open_prompts() {
        let m = ThinkMarkers::detect("{{ '<think>' + reasoning + '</think>' }}").unwrap();
        assert_eq!(m, PAIRS[0]);
        assert!(ThinkMarkers::detect("{{ content }}").is_none());
        assert!(m.open_at_end("<|im_start|>assistant\n<think>\n"));
        assert!(!m.open_at_end("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!m.open_at_end("<|im_start|>assistant\n"));
    }
}
