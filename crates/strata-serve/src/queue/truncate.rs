//! Prompts longer than their context, cut Ollama's way (`/api/chat`, `/api/generate`,
//! and `/v1` under `--truncate-prompts`): a chat keeps every system message, the tools
//! and its newest message, and drops the oldest other messages until it fits; a prompt
//! that still does not fit keeps its first tokens (`num_keep`, and at least the system
//! side) and its tail.
//!
//! What "fits" means leaves room for the reply: Strata does not shift a full context
//! while generating, as Ollama does, so a prompt cut to the last position would get one
//! token of answer. The room is `max_tokens` when given, else an eighth of the context,
//! and never more than a quarter of it.

use strata_engine::template::ChatMessage;
use strata_engine::tokenizer::TextError;

/// How a prompt longer than its context is cut, when the request allows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// Tokens at the start that are always kept (Ollama's `num_keep`); a chat's system
    /// messages and tools are kept whatever it says.
    pub num_keep: usize,
}

/// Ollama's default `num_keep`.
pub const DEFAULT_NUM_KEEP: usize = 4;

impl Default for Truncation {
    fn default() -> Self {
        Truncation { num_keep: DEFAULT_NUM_KEEP }
    }
}

/// The most prompt tokens a cut prompt keeps in a `ctx`-token context, leaving room for
/// `max_tokens` (see the module docs).
pub fn prompt_limit(ctx: usize, max_tokens: Option<usize>) -> usize {
    let room = max_tokens.unwrap_or(ctx / 8).clamp(1, (ctx / 4).max(1));
    ctx.saturating_sub(room).max(1)
}

/// A chat cut to fit: the messages kept, and how many were dropped.
#[derive(Debug)]
pub struct FittedChat {
    pub messages: Vec<ChatMessage>,
    pub dropped: usize,
    /// Its tokens.
    pub tokens: Vec<u32>,
}

/// The longest tail of `messages` that fits `limit` tokens once `render` has turned it
/// into tokens, with every system message before it kept and the newest message kept
/// whatever its length. Messages go whole: a chat template sees only complete messages.
pub fn fit_chat(
    messages: &[ChatMessage],
    limit: usize,
    render: impl Fn(&[ChatMessage]) -> Result<Vec<u32>, TextError>,
) -> Result<FittedChat, TextError> {
    let kept_from = |start: usize| -> Vec<ChatMessage> {
        let system = messages[..start].iter().filter(|m| m.role == "system");
        system.chain(&messages[start..]).cloned().collect()
    };
    let last = messages.len().saturating_sub(1);
    // The smallest start whose tail fits; the tail only shrinks as the start grows.
    let (mut lo, mut hi) = (0, last);
    let mut best: Option<(usize, Vec<u32>)> = None;
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        let tokens = render(&kept_from(mid))?;
        if tokens.len() <= limit {
            best = Some((mid, tokens));
            match mid {
                0 => break,
                _ => hi = mid - 1,
            }
        } else {
            lo = mid + 1;
        }
    }
    let (start, tokens) = match best {
        Some(b) => b,
        None => (last, render(&kept_from(last))?),
    };
    let dropped = messages[..start].iter().filter(|m| m.role != "system").count();
    Ok(FittedChat { messages: kept_from(start), dropped, tokens })
}

/// Why a prompt cannot be cut to fit.
#[derive(Debug, PartialEq, Eq)]
pub struct HeadTooLong {
    pub head: usize,
    pub limit: usize,
}

/// `tokens` cut to `limit`: the first `head` and the tail. The tail starts on a token that
/// begins a character (`continues(id)`: the token's bytes continue a UTF-8 character
/// begun before it), so no character is cut in two; special tokens are single ids and
/// are never cut.
pub fn keep_head_and_tail(
    tokens: &[u32],
    head: usize,
    limit: usize,
    continues: impl Fn(u32) -> bool,
) -> Result<Vec<u32>, HeadTooLong> {
    if tokens.len() <= limit {
        return Ok(tokens.to_vec());
    }
    // At least one token of tail: the newest text is what the reply answers.
    if head >= limit {
        return Err(HeadTooLong { head, limit });
    }
    let mut start = tokens.len() - (limit - head);
    while start < tokens.len() && continues(tokens[start]) {
        start += 1;
    }
    let mut out = Vec::with_capacity(limit);
    out.extend_from_slice(&tokens[..head]);
    out.extend_from_slice(&tokens[start..]);
    Ok(out)
}

/// A prompt cut to fit.
#[derive(Debug)]
pub struct Cut {
    pub tokens: Vec<u32>,
    /// Chat messages dropped whole.
    pub dropped_messages: usize,
}

/// Why a prompt could not be cut.
#[derive(Debug)]
pub enum CutError {
    /// Rendering the kept messages failed.
    Text(TextError),
    /// What must be kept (`num_keep`, the system messages and tools) fills the limit.
    HeadTooLong(HeadTooLong),
}

/// How a chat's messages become tokens.
pub type Render<'a> = dyn Fn(&[ChatMessage]) -> Result<Vec<u32>, TextError> + 'a;

/// A chat, and how its messages become tokens.
pub struct Chat<'a> {
    pub messages: &'a [ChatMessage],
    pub render: &'a Render<'a>,
}

/// `prompt` cut to `limit` tokens: a chat first drops whole messages ([`fit_chat`]);
/// what is still too long keeps its head (`num_keep` tokens, and the system side of a
/// chat: its system messages and the tools rendered with them) and its tail
/// ([`keep_head_and_tail`]).
pub fn cut_prompt(
    prompt: &[u32],
    chat: Option<Chat<'_>>,
    truncation: Truncation,
    limit: usize,
    continues: impl Fn(u32) -> bool,
) -> Result<Cut, CutError> {
    let (tokens, dropped_messages, system_side) = match chat {
        None => (prompt.to_vec(), 0, 0),
        Some(Chat { messages, render }) => {
            let fitted = fit_chat(messages, limit, render).map_err(CutError::Text)?;
            // The system side: what the kept system messages alone render as, up to where
            // the conversation's first other message begins. A template that will not
            // render them alone protects only `num_keep`.
            let system: Vec<ChatMessage> = fitted.messages.iter().filter(|m| m.role == "system").cloned().collect();
            let side = match system.is_empty() {
                true => 0,
                false => {
                    render(&system).map_or(0, |s| s.iter().zip(&fitted.tokens).take_while(|(a, b)| a == b).count())
                }
            };
            (fitted.tokens, fitted.dropped, side)
        }
    };
    let head = truncation.num_keep.max(system_side).min(tokens.len());
    let tokens = keep_head_and_tail(&tokens, head, limit, continues).map_err(CutError::HeadTooLong)?;
    Ok(Cut { tokens, dropped_messages })
}

/// Whether a token's bytes continue a UTF-8 character (start with a continuation byte).
pub fn continues_character(bytes: &[u8]) -> bool {
    bytes.first().is_some_and(|&b| b & 0xC0 == 0x80)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each message renders as its content's bytes as tokens, plus two tokens of markup.
    fn render(messages: &[ChatMessage]) -> Result<Vec<u32>, TextError> {
        Ok(messages.iter().flat_map(|m| [0, 1].into_iter().chain(m.content.bytes().map(u32::from))).collect())
    }

    fn chat(parts: &[(&str, &str)]) -> Vec<ChatMessage> {
        parts.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
    }

    #[test]
    fn the_limit_leaves_room_for_the_reply() {
        assert_eq!(prompt_limit(8192, None), 7168);
        assert_eq!(prompt_limit(8192, Some(100)), 8092);
        assert_eq!(prompt_limit(8192, Some(1 << 30)), 6144, "at most a quarter for the reply");
        assert_eq!(prompt_limit(2, None), 1);
        assert_eq!(prompt_limit(1, Some(5)), 1);
    }

    #[test]
    fn a_chat_drops_its_oldest_messages_and_keeps_system_ones_and_the_newest() {
        let m = chat(&[
            ("system", "sys"),
            ("user", "aaaaaaaaaa"),
            ("assistant", "bbbbbbbbbb"),
            ("system", "s2"),
            ("user", "cccccccccc"),
            ("assistant", "dddd"),
            ("user", "last"),
        ]);
        // Everything: 5 + 12 + 12 + 4 + 12 + 6 + 6 = 57 tokens.
        let all = fit_chat(&m, 57, render).unwrap();
        assert_eq!((all.messages.len(), all.dropped, all.tokens.len()), (7, 0, 57));
        // 40: drops the first user and assistant messages; both system messages stay.
        let f = fit_chat(&m, 40, render).unwrap();
        let roles: Vec<_> = f.messages.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(roles, ["sys", "s2", "cccccccccc", "dddd", "last"]);
        assert_eq!((f.dropped, f.tokens.len()), (2, 33));
        // Too small even for the newest: it is kept with the system messages, for the
        // caller to cut by tokens.
        let f = fit_chat(&m, 5, render).unwrap();
        let kept: Vec<_> = f.messages.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(kept, ["sys", "s2", "last"]);
        assert_eq!(f.dropped, 4);
    }

    #[test]
    fn a_cut_chat_keeps_its_system_side_whole() {
        let m = chat(&[("system", "tools and rules"), ("user", "old question"), ("user", &"x".repeat(40))]);
        let r = |m: &[ChatMessage]| render(m);
        let chat = || Chat { messages: &m, render: &r };
        // 17 + 14 + 42 tokens: the old question goes, then the newest message loses its
        // start; the 17 system tokens stay whole although `num_keep` is 4.
        let cut = cut_prompt(&[], Some(chat()), Truncation::default(), 30, |_| false).unwrap();
        assert_eq!(cut.dropped_messages, 1);
        assert_eq!(cut.tokens.len(), 30);
        assert_eq!(cut.tokens[..17], render(&m[..1]).unwrap()[..]);
        assert!(cut.tokens[17..].iter().all(|&t| t == u32::from(b'x')));
        // The system side alone fills the limit: refused.
        let refused = cut_prompt(&[], Some(chat()), Truncation::default(), 17, |_| false);
        assert!(matches!(refused, Err(CutError::HeadTooLong(HeadTooLong { head: 17, limit: 17 }))));
        // A text prompt keeps `num_keep`.
        let t: Vec<u32> = (0..100).collect();
        let cut = cut_prompt(&t, None, Truncation { num_keep: 2 }, 5, |_| false).unwrap();
        assert_eq!(cut.tokens, [0, 1, 97, 98, 99]);
    }

    #[test]
    fn a_token_cut_keeps_the_head_and_a_tail_that_starts_a_character() {
        let t: Vec<u32> = (0..20).collect();
        assert_eq!(keep_head_and_tail(&t, 4, 30, |_| false).unwrap(), t);
        let cut = keep_head_and_tail(&t, 4, 10, |_| false).unwrap();
        assert_eq!(cut, [0, 1, 2, 3, 14, 15, 16, 17, 18, 19]);
        // 14 and 15 continue a character: the tail starts at 16.
        let cut = keep_head_and_tail(&t, 4, 10, |id| id == 14 || id == 15).unwrap();
        assert_eq!(cut, [0, 1, 2, 3, 16, 17, 18, 19]);
        assert_eq!(keep_head_and_tail(&t, 10, 10, |_| false), Err(HeadTooLong { head: 10, limit: 10 }));
        assert!(continues_character(&[0x80]) && continues_character(&[0xBF, 0x41]));
        assert!(!continues_character(&[0xC3, 0xA9]) && !continues_character(b"a") && !continues_character(&[]));
    }
}
