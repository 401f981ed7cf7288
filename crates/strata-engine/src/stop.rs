//! Stop strings over streamed text.
//!
//! Text that could still turn out to be the start of a stop string is held back until it
//! either completes one (generation stops; neither the stop string nor anything after it
//! is emitted) or can no longer match (it is released). Generation stops at the first
//! stop string to be completed, wherever it starts.

/// What one [`StopMatcher::push`] releases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to show the client now.
    pub emit: String,
    /// A stop string was found; nothing more will be emitted.
    pub stopped: bool,
}

/// Incremental stop-string matcher. Pure state machine: no allocation beyond the held text.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Longest stop string in bytes.
    max_len: usize,
    held: String,
    stopped: bool,
    /// The stop string that matched, once one did.
    matched: Option<usize>,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Self { stops, max_len, held: String::new(), stopped: false, matched: None }
    }

    /// Whether a stop string has been seen.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string that ended generation, if any.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Feeds newly generated text; returns what can be released.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stopped {
            return StopStep { emit: String::new(), stopped: true };
        }
        if self.stops.is_empty() {
            return StopStep { emit: text.to_string(), stopped: false };
        }
        self.held.push_str(text);

        // The earliest-starting complete stop string wins. Everything before the held
        // text was already proven not to start one, so searching the held text suffices.
        let mut best: Option<(usize, usize)> = None;
        for (i, stop) in self.stops.iter().enumerate() {
            if let Some(pos) = self.held.find(stop.as_str())
                && best.is_none_or(|(p, _)| pos < p)
            {
                best = Some((pos, i));
            }
        }
        if let Some((pos, i)) = best {
            self.stopped = true;
            self.matched = Some(i);
            let emit = self.held[..pos].to_string();
            self.held.clear();
            return StopStep { emit, stopped: true };
        }

        // Hold the longest suffix that is a proper prefix of some stop string.
        let keep_from = self.partial_match_start();
        let emit = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        StopStep { emit, stopped: false }
    }

    /// Byte offset in `held` where the longest possible stop-string prefix begins
    /// (`held.len()` if none).
    fn partial_match_start(&self) -> usize {
        let len = self.held.len();
        let earliest = len.saturating_sub(self.max_len.saturating_sub(1));
        for start in earliest..len {
            if !self.held.is_char_boundary(start) {
                continue;
            }
            let tail = &self.held[start..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                return start;
            }
        }
        len
    }

    /// End of generation: releases the held text (nothing if a stop string matched).
    pub fn finish(self) -> String {
        if self.stopped { String::new() } else { self.held }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        let mut stopped = false;
        for p in pieces {
            let step = m.push(p);
            assert!(!stopped || step.emit.is_empty(), "emitted after stop");
            out.push_str(&step.emit);
            stopped |= step.stopped;
        }
        let rest = m.finish();
        (out, stopped, rest)
    }

    #[test]
    fn no_stop_strings_pass_everything_through() {
        let mut m = StopMatcher::new(vec![]);
        assert_eq!(m.push("hello").emit, "hello");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_in_one_piece_cuts_before_it() {
        let (out, stopped, rest) = run(&["###"], &["Hello ### world"]);
        assert_eq!(out, "Hello ");
        assert!(stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn stop_split_across_many_pushes() {
        let pieces = ["Hi", " <", "|e", "n", "d", "|", ">", " more"];
        let (out, stopped, _) = run(&["<|end|>"], &pieces);
        assert_eq!(out, "Hi ");
        assert!(stopped);
    }

    #[test]
    fn prefix_is_held_then_released_when_it_cannot_match() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        let s = m.push("abc ST");
        assert_eq!(s.emit, "abc ");
        assert!(!s.stopped);
        let s = m.push("O");
        assert_eq!(s.emit, "");
        let s = m.push("NE");
        assert_eq!(s.emit, "STONE");
        assert!(!s.stopped);
        let s = m.push(" S");
        assert_eq!(s.emit, " ");
        assert_eq!(m.finish(), "S");
    }

    #[test]
    fn overlapping_stops_first_completed_wins() {
        // "abc" completes at the third char, before "bcd" could.
        let (out, stopped, _) = run(&["abc", "bcd"], &["a", "b", "c", "d"]);
        assert_eq!(out, "");
        assert!(stopped);
        let (out, stopped, _) = run(&["abc", "bcd"], &["abcd"]);
        assert_eq!(out, "");
        assert!(stopped);
        // A longer stop still pending does not delay a shorter one that completes.
        let (out, stopped, _) = run(&["bcd", "abcx"], &["a", "b", "c", "d"]);
        assert_eq!(out, "a");
        assert!(stopped);
        let (out, stopped, rest) = run(&["abcx"], &["a", "b", "c", "d"]);
        assert_eq!(out, "abcd");
        assert!(!stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn self_overlapping_stop() {
        // "aab" inside "aaab": the held "aa" must slide by one.
        let (out, stopped, _) = run(&["aab"], &["a", "a", "a", "b"]);
        assert_eq!(out, "a");
        assert!(stopped);
    }

    #[test]
    fn multibyte_text_and_stops() {
        let (out, stopped, _) = run(&["終わり"], &["こんに", "ちは終", "わ", "り!"]);
        assert_eq!(out, "こんにちは");
        assert!(stopped);
        // A stop sharing a first byte but not the character must not hold or split it.
        let mut m = StopMatcher::new(vec!["é!".into()]);
        let s = m.push("café");
        assert_eq!(s.emit, "caf");
        let s = m.push("è");
        assert_eq!(s.emit, "éè");
        let s = m.push("🎉");
        assert_eq!(s.emit, "🎉");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let (out, stopped, rest) = run(&["", "END"], &["abc", "E"]);
        assert_eq!(out, "abc");
        assert!(!stopped);
        assert_eq!(rest, "E");
    }

    #[test]
    fn nothing_after_stop_and_finish_is_empty() {
        let mut m = StopMatcher::new(vec!["x".into()]);
        assert!(m.push("ax").stopped);
        assert_eq!(m.matched_stop(), Some("x"));
        let s = m.push("more");
        assert!(s.stopped);
        assert_eq!(s.emit, "");
        assert!(m.is_stopped());
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn finish_releases_held_prefix() {
        let mut m = StopMatcher::new(vec!["</s>".into()]);
        assert_eq!(m.push("done</").emit, "done");
        assert_eq!(m.finish(), "</");
    }
}
