//! Codepoints as llama.cpp's tokenizers see them (`unicode.cpp`): one of eight category
//! classes (Unicode 15.1, like llama.cpp's table), its whitespace set, simple lowercase,
//! and the first codepoint of the canonical decomposition.

pub(super) use super::category::Category;
use super::unicode_table::CATEGORY_RANGES;

/// What llama.cpp knows of a codepoint of the text, or of a position outside it
/// ([`Flags::OUTSIDE`], llama.cpp's all-zero flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Flags {
    category: Option<Category>,
    whitespace: bool,
}

impl Flags {
    pub const OUTSIDE: Flags = Flags { category: None, whitespace: false };

    pub fn of(c: char) -> Flags {
        Flags { category: Some(category(c)), whitespace: is_whitespace(c) }
    }

    /// Inside the text (llama.cpp's `as_uint() != 0`).
    pub fn inside(self) -> bool {
        self.category.is_some()
    }

    pub fn category(self) -> Option<Category> {
        self.category
    }

    pub fn letter(self) -> bool {
        self.category == Some(Category::Letter)
    }

    pub fn number(self) -> bool {
        self.category == Some(Category::Number)
    }

    pub fn mark(self) -> bool {
        self.category == Some(Category::Mark)
    }

    pub fn punctuation(self) -> bool {
        self.category == Some(Category::Punctuation)
    }

    pub fn symbol(self) -> bool {
        self.category == Some(Category::Symbol)
    }

    pub fn control(self) -> bool {
        self.category == Some(Category::Control)
    }

    pub fn whitespace(self) -> bool {
        self.whitespace
    }
}

pub(super) fn category(c: char) -> Category {
    let cpt = c as u32;
    let at = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cpt);
    // The table starts at 0, so `at` is at least 1.
    CATEGORY_RANGES[at.saturating_sub(1)].1
}

/// The Unicode `White_Space` property.
pub(super) fn is_whitespace(c: char) -> bool {
    matches!(c as u32, 0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000)
}

/// Simple (one codepoint) lowercase, as `UnicodeData.txt` gives it.
pub(super) fn to_lower(c: char) -> char {
    // The only codepoint whose full lowercase is longer than one codepoint.
    if c == '\u{130}' {
        return 'i';
    }
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

/// The first codepoint of `c`'s canonical decomposition (llama.cpp's per-codepoint
/// "NFD", which keeps the base letter and drops what follows).
pub(super) fn nfd_first(c: char) -> char {
    // Nothing below U+00C0 decomposes.
    if (c as u32) < 0xC0 {
        return c;
    }
    let mut s = tokenizers::NormalizedString::from(c.to_string());
    s.nfd();
    s.get().chars().next().unwrap_or(c)
}

/// GPT-2's byte alphabet: the char that stands for byte `b` in byte-level vocabularies.
pub(super) fn byte_char(b: u8) -> char {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let b = u32::from(b);
    if printable(b) {
        return char::from_u32(b).unwrap_or('\0');
    }
    let shifted = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + shifted).unwrap_or('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_unicode() {
        assert_eq!(category('a'), Category::Letter);
        assert_eq!(category('Ж'), Category::Letter);
        assert_eq!(category('漢'), Category::Letter);
        assert_eq!(category('٣'), Category::Number);
        assert_eq!(category('\u{301}'), Category::Mark);
        assert_eq!(category('!'), Category::Punctuation);
        assert_eq!(category('$'), Category::Symbol);
        assert_eq!(category('😀'), Category::Symbol);
        assert_eq!(category(' '), Category::Separator);
        assert_eq!(category('\u{200D}'), Category::Control);
        // Assigned in Unicode 16, after llama.cpp's table.
        assert_eq!(category('\u{1C89}'), Category::Undefined);
        assert_eq!(category('\u{10FFFF}'), Category::Undefined);
        assert!(is_whitespace('\u{3000}') && !is_whitespace('\u{200B}'));
    }

    #[test]
    fn lowercase_nfd_and_byte_alphabet() {
        assert_eq!(to_lower('A'), 'a');
        assert_eq!(to_lower('\u{130}'), 'i');
        assert_eq!(to_lower('Σ'), 'σ');
        assert_eq!(to_lower('ß'), 'ß');
        assert_eq!(nfd_first('é'), 'e');
        assert_eq!(nfd_first('Å'), 'A');
        assert_eq!(nfd_first('가'), '\u{1100}');
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(0xAD), '\u{143}');
    }
}
