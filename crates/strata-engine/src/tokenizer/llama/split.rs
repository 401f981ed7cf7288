//! llama.cpp's BPE pre-tokenization (`unicode_regex_split`): regexes applied in order,
//! each splitting the pieces the previous one left into its matches and the text between.
//!
//! llama.cpp runs a few patterns, recognised by their exact text, with code of its own
//! whose results differ from the regex in places; those are ported here as code. Every
//! other pattern runs the way llama.cpp runs it with `std::regex`: when it uses `\p{..}`,
//! over a copy of the text where each non-ASCII codepoint is replaced by one symbol per
//! category (so `\p{Lu}` is any letter, and a lookahead for a letter never sees a
//! lowercase non-ASCII letter as `[a-z]`), else over the text with non-ASCII whitespace
//! replaced by `\v`; in both, `\s`, `\d` and `\w` are ASCII classes and `$` is the end of
//! the piece.

use tokenizers::utils::SysRegex;

use super::unicode::{Category, Flags, byte_char, to_lower};

/// The text of the patterns llama.cpp splits with its own code.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const KIMI_K2: &str = r"\p{Han}+";
const AFMOE_DIGITS: &str = r"\p{AFMoE_digits}";
const TINY_AYA_DIGITS: &str = r"\d{1,3}(?=(?:\d{3})*\b)";
const NEWLINE_RUNS: &str = r"[^\n]+|[\n]+";

/// `std::regex`'s `\s` in llama.cpp's texts (non-ASCII whitespace is rewritten to `\v`).
const SPACE_CLASS: &str = r"\t\n\x0B\f\r ";
/// The symbols that stand for non-ASCII codepoints of each category in a collapsed
/// text (private-use codepoints, which no regex here names).
const COLLAPSED_NUMBER: char = '\u{E0D1}';
const COLLAPSED_LETTER: char = '\u{E0D2}';
const COLLAPSED_PUNCTUATION: char = '\u{E0D3}';
const COLLAPSED_MARK: char = '\u{E0D4}';
const COLLAPSED_SYMBOL: char = '\u{E0D5}';
const COLLAPSED_OTHER: char = '\u{E0D0}';

/// One pre-tokenization step.
enum Step {
    Gpt2,
    /// Llama 3 (`max_digits` 3), Qwen 2 (1) and Qwen 3.5 (1, letters take marks).
    Llama3 {
        max_digits: usize,
        marks: bool,
    },
    KimiK2,
    /// AFMoE's digit grouping (also Tiny Aya's).
    DigitGroups,
    NewlineRuns,
    Regex {
        regex: SysRegex,
        collapsed: bool,
    },
}

/// A compiled list of llama.cpp pre-tokenizer regexes.
pub(super) struct PreTokenizer {
    steps: Vec<Step>,
    byte_encode: bool,
}

impl PreTokenizer {
    pub fn new(regexes: &[String], byte_encode: bool) -> Result<Self, String> {
        let steps = regexes
            .iter()
            .map(|r| {
                Ok(match r.as_str() {
                    GPT2 => Step::Gpt2,
                    r if LLAMA3.contains(&r) => Step::Llama3 { max_digits: 3, marks: false },
                    QWEN2 => Step::Llama3 { max_digits: 1, marks: false },
                    QWEN35 => Step::Llama3 { max_digits: 1, marks: true },
                    KIMI_K2 => Step::KimiK2,
                    AFMOE_DIGITS | TINY_AYA_DIGITS => Step::DigitGroups,
                    NEWLINE_RUNS => Step::NewlineRuns,
                    r => {
                        let collapsed = uses_categories(r);
                        let pattern = translate(r, collapsed).map_err(|e| format!("pre-tokenizer regex `{r}`: {e}"))?;
                        let regex = SysRegex::new(&pattern)
                            .map_err(|e| format!("pre-tokenizer regex `{r}` does not compile: {e}"))?;
                        Step::Regex { regex, collapsed }
                    }
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { steps, byte_encode })
    }

    /// The words of `text`, each in GPT-2's byte alphabet when the vocabulary is byte-level.
    pub fn split(&self, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let mut lens = vec![cpts.len()];
        let mut collapsed: Option<Recoded> = None;
        let mut wide: Option<Recoded> = None;
        for step in &self.steps {
            let mut out = Vec::with_capacity(lens.len());
            let mut start = 0;
            for &len in &lens {
                let chunk = Chunk { cpts: &cpts[start..start + len] };
                let mut emit = Emit { prev: 0, lens: &mut out };
                match step {
                    Step::Gpt2 => gpt2(&chunk, &mut emit),
                    &Step::Llama3 { max_digits, marks } => llama3(&chunk, &mut emit, max_digits, marks),
                    Step::KimiK2 => kimi_k2(&chunk, &mut emit),
                    Step::DigitGroups => digit_groups(&chunk, &mut emit),
                    Step::NewlineRuns => newline_runs(&chunk, &mut emit),
                    Step::Regex { regex, collapsed: true } => {
                        let text = collapsed.get_or_insert_with(|| Recoded::new(&cpts, collapse));
                        regex_split(regex, text, start, len, &mut out);
                    }
                    Step::Regex { regex, collapsed: false } => {
                        let text = wide.get_or_insert_with(|| Recoded::new(&cpts, widen));
                        regex_split(regex, text, start, len, &mut out);
                    }
                }
                start += len;
            }
            lens = out;
        }
        let mut words = Vec::with_capacity(lens.len());
        let mut start = 0;
        for len in lens {
            let word: String = cpts[start..start + len].iter().collect();
            start += len;
            if word.is_empty() {
                continue;
            }
            words.push(match self.byte_encode {
                true => word.bytes().map(byte_char).collect(),
                false => word,
            });
        }
        words
    }
}

/// Whether llama.cpp runs `regex` over the category-collapsed text.
fn uses_categories(regex: &str) -> bool {
    ["\\p{N}", "\\p{L}", "\\p{P}", "\\p{M}", "\\p{S}", "\\p{Lu}", "\\p{Ll}", "\\p{Lt}", "\\p{Lm}", "\\p{Lo}"]
        .iter()
        .any(|c| regex.contains(c))
}

/// A `std::regex` pattern as llama.cpp writes it, for Oniguruma over a recoded text.
fn translate(regex: &str, collapsed: bool) -> Result<String, String> {
    let mut out = String::with_capacity(regex.len() * 2);
    let mut inside = false;
    let mut chars = regex.chars().peekable();
    // A class written inside or outside brackets.
    let class = |out: &mut String, inside: bool, body: &str, negated: bool| {
        match (inside, negated) {
            (true, false) => out.push_str(body),
            (false, false) => out.push_str(&format!("[{body}]")),
            (false, true) => out.push_str(&format!("[^{body}]")),
            (true, true) => return Err(format!("a negated class escape inside brackets (`{body}`)")),
        }
        Ok(())
    };
    while let Some(c) = chars.next() {
        if collapsed && !c.is_ascii() {
            return Err("llama.cpp refuses a regex that has both \\p{..} and non-ASCII characters".into());
        }
        match c {
            '\\' => {
                let Some(e) = chars.next() else { return Err("ends in a backslash".into()) };
                match e {
                    's' | 'S' => class(&mut out, inside, SPACE_CLASS, e == 'S')?,
                    'd' | 'D' => class(&mut out, inside, "0-9", e == 'D')?,
                    'w' | 'W' => class(&mut out, inside, "0-9A-Za-z_", e == 'W')?,
                    'b' if !inside => {
                        out.push_str("(?:(?<=[0-9A-Za-z_])(?![0-9A-Za-z_])|(?<![0-9A-Za-z_])(?=[0-9A-Za-z_]))")
                    }
                    'p' if collapsed && chars.peek() == Some(&'{') => {
                        let name: String = chars.by_ref().skip(1).take_while(|&c| c != '}').collect();
                        let (symbol, ascii) = match name.as_str() {
                            "N" => (COLLAPSED_NUMBER, "0-9"),
                            "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => (COLLAPSED_LETTER, "A-Za-z"),
                            "P" => (COLLAPSED_PUNCTUATION, r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
                            "M" => (COLLAPSED_MARK, ""),
                            "S" => (COLLAPSED_SYMBOL, r"\$\+<->\^`\|\~"),
                            other => return Err(format!("unknown category \\p{{{other}}}")),
                        };
                        class(&mut out, inside, &format!("{symbol}{ascii}"), false)?;
                    }
                    e => {
                        out.push('\\');
                        out.push(e);
                    }
                }
            }
            '[' if !inside => {
                inside = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().unwrap_or('^'));
                }
            }
            ']' if inside => {
                inside = false;
                out.push(']');
            }
            '$' if !inside => out.push_str(r"\z"),
            '^' if !inside => out.push_str(r"\A"),
            '.' if !inside => out.push_str(r"[^\n\r]"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The text as llama.cpp hands it to `std::regex`, with each codepoint's byte offset.
struct Recoded {
    text: String,
    /// Byte offset of each codepoint, and the length at the end.
    offsets: Vec<usize>,
}

impl Recoded {
    fn new(cpts: &[char], f: fn(char) -> char) -> Self {
        let mut text = String::with_capacity(cpts.len());
        let mut offsets = Vec::with_capacity(cpts.len() + 1);
        for &c in cpts {
            offsets.push(text.len());
            text.push(f(c));
        }
        offsets.push(text.len());
        Self { text, offsets }
    }

    fn index(&self, byte: usize) -> usize {
        self.offsets.partition_point(|&o| o < byte)
    }
}

/// A non-ASCII codepoint as the symbol of its category (whitespace as `\v`).
fn collapse(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    let f = Flags::of(c);
    if f.whitespace() {
        return '\x0B';
    }
    match f.category() {
        Some(Category::Number) => COLLAPSED_NUMBER,
        Some(Category::Letter) => COLLAPSED_LETTER,
        Some(Category::Punctuation) => COLLAPSED_PUNCTUATION,
        Some(Category::Mark) => COLLAPSED_MARK,
        Some(Category::Symbol) => COLLAPSED_SYMBOL,
        _ => COLLAPSED_OTHER,
    }
}

/// Non-ASCII whitespace as `\v`, everything else as is.
fn widen(c: char) -> char {
    if !c.is_ascii() && Flags::of(c).whitespace() { '\x0B' } else { c }
}

/// Splits the chunk `[start, start + len)` of `text` into matches and the text between.
fn regex_split(regex: &SysRegex, text: &Recoded, start: usize, len: usize, out: &mut Vec<usize>) {
    let (lo, hi) = (text.offsets[start], text.offsets[start + len]);
    let mut prev = start;
    for (s, e) in regex.find_iter(&text.text[lo..hi]) {
        let (s, e) = (text.index(lo + s), text.index(lo + e));
        if s > prev {
            out.push(s - prev);
        }
        if e > s {
            out.push(e - s);
        }
        prev = e;
    }
    if start + len > prev {
        out.push(start + len - prev);
    }
}

/// One piece of the text being split, with llama.cpp's accessors: positions past either
/// end read as nothing.
struct Chunk<'a> {
    cpts: &'a [char],
}

impl Chunk<'_> {
    fn len(&self) -> usize {
        self.cpts.len()
    }

    fn cpt(&self, pos: usize) -> Option<char> {
        self.cpts.get(pos).copied()
    }

    fn flags(&self, pos: usize) -> Flags {
        self.cpt(pos).map_or(Flags::OUTSIDE, Flags::of)
    }

    fn is(&self, pos: usize, set: &[char]) -> bool {
        self.cpt(pos).is_some_and(|c| set.contains(&c))
    }

    fn is_han(&self, pos: usize) -> bool {
        self.cpt(pos).is_some_and(is_han)
    }

    /// The length of an English contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`)
    /// at `pos`, matched case-insensitively or not.
    fn contraction(&self, pos: usize, fold: bool) -> usize {
        let at = |i: usize| self.cpt(i).map(|c| if fold { to_lower(c) } else { c });
        if at(pos) != Some('\'') || pos + 1 >= self.len() {
            return 0;
        }
        if matches!(at(pos + 1), Some('s' | 't' | 'm' | 'd')) {
            return 2;
        }
        if pos + 2 < self.len()
            && matches!((at(pos + 1), at(pos + 2)), (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')))
        {
            return 3;
        }
        0
    }

    /// The whitespace run at `pos`: its length, and the end of its last `\r`/`\n`.
    fn whitespace_run(&self, pos: usize) -> (usize, Option<usize>) {
        let mut n = 0;
        let mut last_newline = None;
        while self.flags(pos + n).whitespace() {
            if self.is(pos + n, &['\r', '\n']) {
                last_newline = Some(pos + n + 1);
            }
            n += 1;
        }
        (n, last_newline)
    }
}

/// Pieces written as ends: each piece runs from the previous end.
struct Emit<'a> {
    prev: usize,
    lens: &'a mut Vec<usize>,
}

impl Emit<'_> {
    fn to(&mut self, end: usize) {
        if end > self.prev {
            self.lens.push(end - self.prev);
        }
        self.prev = end;
    }
}

/// `\s+(?!\S)` then `\s+`, after llama.cpp's other patterns failed at `pos`; returns the
/// new position.
fn trailing_whitespace(c: &Chunk, out: &mut Emit, pos: usize, n: usize) -> usize {
    let end = match n {
        0 => pos + 1,
        n if n > 1 && c.cpt(pos + n).is_some() => pos + n - 1,
        n => pos + n,
    };
    out.to(end);
    end
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn gpt2(c: &Chunk, out: &mut Emit) {
    let mut pos = 0;
    while pos < c.len() {
        let n = c.contraction(pos, false);
        if n > 0 {
            pos += n;
            out.to(pos);
            continue;
        }
        let space = c.cpt(pos) == Some(' ');
        let f = c.flags(pos + usize::from(space));
        let other = |f: Flags| !(f.whitespace() || f.letter() || f.number()) && f.inside();
        let run: Option<fn(Flags) -> bool> = if f.letter() {
            Some(Flags::letter)
        } else if f.number() {
            Some(Flags::number)
        } else if other(f) {
            Some(|f: Flags| !(f.whitespace() || f.letter() || f.number()) && f.inside())
        } else {
            None
        };
        if let Some(run) = run {
            pos += usize::from(space);
            while run(c.flags(pos)) {
                pos += 1;
            }
            out.to(pos);
            continue;
        }
        let (n, _) = c.whitespace_run(pos);
        pos = trailing_whitespace(c, out, pos, n);
    }
}

/// Llama 3's pattern and its Qwen variants:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// (Qwen: `\p{N}`; Qwen 3.5: marks count as letters).
fn llama3(c: &Chunk, out: &mut Emit, max_digits: usize, marks: bool) {
    let letter = |f: Flags| f.letter() || (marks && f.mark());
    let mut pos = 0;
    while pos < c.len() {
        let n = c.contraction(pos, true);
        if n > 0 {
            pos += n;
            out.to(pos);
            continue;
        }
        let f = c.flags(pos);
        if !(c.is(pos, &['\r', '\n']) || f.number()) && (letter(f) || letter(c.flags(pos + 1))) {
            pos += 1;
            while letter(c.flags(pos)) {
                pos += 1;
            }
            out.to(pos);
            continue;
        }
        if f.number() {
            let mut from = pos;
            while c.flags(pos).number() {
                pos += 1;
                if pos - from >= max_digits {
                    out.to(pos);
                    from = pos;
                }
            }
            out.to(pos);
            continue;
        }
        let f2 = if c.cpt(pos) == Some(' ') { c.flags(pos + 1) } else { f };
        let other = |f: Flags| !(f.whitespace() || letter(f) || f.number());
        if other(f2) && f.inside() {
            pos += usize::from(c.cpt(pos) == Some(' '));
            while other(c.flags(pos)) && c.flags(pos).inside() {
                pos += 1;
            }
            while c.is(pos, &['\r', '\n']) {
                pos += 1;
            }
            out.to(pos);
            continue;
        }
        let (n, last_newline) = c.whitespace_run(pos);
        if let Some(end) = last_newline {
            pos = end;
            out.to(pos);
            continue;
        }
        pos = trailing_whitespace(c, out, pos, n);
    }
}

/// Kimi K2's pattern as llama.cpp's code runs it: Han runs; letter runs without Han
/// (case is not looked at) with an optional leading non-letter and a contraction; digits
/// by three; then Llama 3's punctuation and whitespace rules.
fn kimi_k2(c: &Chunk, out: &mut Emit) {
    let mut pos = 0;
    while pos < c.len() {
        if c.is_han(pos) {
            while c.is_han(pos) {
                pos += 1;
            }
            out.to(pos);
            continue;
        }
        let f = c.flags(pos);
        let plain_letter = |p: usize| c.flags(p).letter() && !c.is_han(p);
        let lead = !(c.is(pos, &['\r', '\n']) || f.letter() || f.number());
        if plain_letter(pos) || (lead && plain_letter(pos + 1)) {
            pos += usize::from(lead);
            while plain_letter(pos) {
                pos += 1;
            }
            pos += c.contraction(pos, true);
            out.to(pos);
            continue;
        }
        if f.number() {
            let mut from = pos;
            while c.flags(pos).number() {
                pos += 1;
                if pos - from >= 3 {
                    out.to(pos);
                    from = pos;
                }
            }
            out.to(pos);
            continue;
        }
        let f2 = if c.cpt(pos) == Some(' ') { c.flags(pos + 1) } else { f };
        let other = |f: Flags| !(f.whitespace() || f.letter() || f.number()) && f.inside();
        if other(f2) {
            pos += usize::from(c.cpt(pos) == Some(' '));
            while other(c.flags(pos)) {
                pos += 1;
            }
            while c.is(pos, &['\r', '\n']) {
                pos += 1;
            }
            out.to(pos);
            continue;
        }
        let (n, last_newline) = c.whitespace_run(pos);
        if let Some(end) = last_newline {
            pos = end;
            out.to(pos);
            continue;
        }
        pos = trailing_whitespace(c, out, pos, n);
    }
}

/// Digit runs in groups of three from the right, as llama.cpp's AFMoE code does it: the
/// text before a run joins the run's first group.
fn digit_groups(c: &Chunk, out: &mut Emit) {
    let mut pos = 0;
    while pos < c.len() {
        if !c.flags(pos).number() {
            pos += 1;
            continue;
        }
        let start = pos;
        while c.flags(pos).number() {
            pos += 1;
        }
        let mut at = start + (pos - start) % 3;
        if at > start {
            out.to(at);
        }
        while at < pos {
            at += 3;
            out.to(at);
        }
    }
    out.to(c.len());
}

/// `[^\n]+|[\n]+`
fn newline_runs(c: &Chunk, out: &mut Emit) {
    let mut pos = 0;
    while pos < c.len() {
        let newline = c.cpts[pos] == '\n';
        while pos < c.len() && (c.cpts[pos] == '\n') == newline {
            pos += 1;
        }
        out.to(pos);
    }
}

/// llama.cpp's Han ranges (CJK ideographs, their extensions and compatibility forms).
fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(regexes: &[&str], text: &str) -> Vec<String> {
        let regexes: Vec<String> = regexes.iter().map(|r| r.to_string()).collect();
        PreTokenizer::new(&regexes, false).unwrap().split(text)
    }

    #[test]
    fn custom_splitters_follow_llama_cpp() {
        assert_eq!(
            split(&[GPT2], "Hello world's  end 123!!\n"),
            ["Hello", " world", "'s", " ", " end", " 123", "!!", "\n"]
        );
        assert_eq!(split(&[LLAMA3[1]], "I'M 12345  ok\n\n x"), ["I", "'M", " ", "123", "45", " ", " ok", "\n\n", " x"]);
        assert_eq!(split(&[QWEN2], "a12"), ["a", "1", "2"]);
        assert_eq!(split(&[KIMI_K2], "中文abc's 1234"), ["中文", "abc's", " ", "123", "4"]);
        assert_eq!(split(&[NEWLINE_RUNS], "a b\n\nc"), ["a b", "\n\n", "c"]);
        // The text before a digit run joins its first group.
        assert_eq!(split(&[AFMOE_DIGITS], "ab1234cd"), ["ab1", "234", "cd"]);
        assert_eq!(split(&[AFMOE_DIGITS], "x123456"), ["x123", "456"]);
    }

    #[test]
    fn regexes_run_over_llama_cpp_recoded_text() {
        // Any non-ASCII letter counts as upper and lower case at once.
        let gpt4o = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|\s+";
        assert_eq!(split(&[gpt4o], "ПриветМир HelloWorld"), ["ПриветМир", " Hello", "World"]);
        // `\d` is ASCII, and a lookahead split leaves empty matches out.
        assert_eq!(split(&[r"(?=(\d{3})+(?!\d))"], "1234567 ١٢٣٤"), ["1", "234", "567 ١٢٣٤"]);
        // Non-ASCII whitespace is `\s`.
        assert_eq!(split(&[r"\S+"], "a\u{3000}b"), ["a", "\u{3000}", "b"]);
        assert!(PreTokenizer::new(&[r"\p{L}é".to_string()], false).is_err());
    }
}
