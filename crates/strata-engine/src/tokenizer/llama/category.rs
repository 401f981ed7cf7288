//! The eight codepoint classes of llama.cpp's tokenizers, shared by `unicode.rs` and its
//! generated table.

/// A general category collapsed to its first letter (`Cn`, unassigned, apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Category {
    Undefined,
    Number,
    Letter,
    Separator,
    Mark,
    Punctuation,
    Symbol,
    Control,
}
