//! A generation's request made ready for the step loop: its chat rendered, its prompt
//! tokenized (and cut to fit, where the request allows), its grammar compiled, its
//! tool-call and reasoning splitters set up. This runs on a thread of its own for each
//! request, never on the worker thread that steps the models (DESIGN.md §2): a 10 MB
//! prompt for one model does not hold up the tokens of another.
//!
//! A prompt far longer than its context is not tokenized whole: its text is tokenized in
//! windows from each end, doubling until each end holds more tokens than the context, so
//! that refusing it (or cutting it to its head and tail) costs about what a prompt of
//! twice the context costs, whatever the request's size.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc::UnboundedSender;

use super::truncate::{self, Truncation};
use super::{ChatTools, Event, GenerateJob, JobError, PromptInput, ToolChoice};
use crate::store::Modelfile;
use strata_engine::grammar::{Constraint, GrammarSpec, TokenEnvCell};
use strata_engine::reasoning::{ReasoningSplitter, ThinkMarkers};
use strata_engine::template::ChatMessage;
use strata_engine::tokenizer::{TextError, TextTokenizer};
use strata_engine::toolcall::{
    CallMarkers, HarmonyParser, ToolCallParser, ToolFormat, call_grammar, generic_system_prompt, harmony,
};

/// What its chat template and Modelfile (`POST /api/create`) mean for a model's chats.
pub(super) struct ChatTraits {
    modelfile: Option<Modelfile>,
    /// How its template writes tool calls.
    tool_format: ToolFormat,
    /// Whether the template shows `tools` itself (else the generic format's system
    /// message does).
    renders_tools: bool,
    /// Its reasoning markers, if it thinks.
    think: Option<ThinkMarkers>,
    /// Its tool-call markers' tokens and shape, for forced calls.
    markers: CallMarkers,
}

impl ChatTraits {
    pub(super) fn of(tok: &TextTokenizer, modelfile: Option<Modelfile>) -> Self {
        let source = tok.chat_template().map(|t| t.source()).unwrap_or_default();
        let tool_format = ToolFormat::detect(source);
        ChatTraits {
            modelfile,
            tool_format,
            renders_tools: tool_format != ToolFormat::Generic || source.contains("tools"),
            think: ThinkMarkers::detect(source),
            markers: CallMarkers::of(tool_format, source, |m| tok.token_to_id(m)),
        }
    }
}

/// What preparing a loaded model's requests needs of it, shared with the threads that
/// do it.
pub(super) struct Kit {
    pub tokenizer: Arc<TextTokenizer>,
    pub chat: ChatTraits,
    pub token_env: TokenEnvCell,
    /// Logits per position: token ids at or past it are refused.
    pub vocab: usize,
    /// Its context, for requests that do not ask for another (`num_ctx`).
    pub context_len: usize,
}

/// A generation ready to join the running ones.
pub(super) struct Prepared {
    pub job: GenerateJob,
    pub prompt: Vec<u32>,
    /// The request field the prompt came from (for a 400's `param`).
    pub param: &'static str,
    /// The context it runs in.
    pub ctx: usize,
    /// The grammar the reply follows (the request's, or a forced tool call's), compiled.
    pub grammar: Option<(GrammarSpec, Constraint)>,
    /// The request field that grammar came from.
    pub grammar_param: &'static str,
    pub tools: Option<ToolCallParser>,
    pub reasoning: Option<ReasoningSplitter>,
    /// A harmony chat's parser, in place of the two above.
    pub harmony: Option<HarmonyParser>,
}

pub(super) fn invalid(param: Option<&'static str>, message: impl ToString) -> JobError {
    JobError::Invalid { param, message: message.to_string() }
}

pub(super) fn text_error(param: &'static str, e: TextError) -> JobError {
    match e.is_client_error() {
        true => invalid(Some(param), e),
        false => JobError::Internal(e.to_string()),
    }
}

/// The message of a panic caught at a job or a step.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let msg = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
    tracing::error!(panic = ?msg, "the worker caught a panic");
    format!("internal error: {}", msg.unwrap_or_default())
}

/// Prepares `job` for the model `kit` describes (see the module docs).
pub(super) fn prepare(kit: &Kit, job: GenerateJob) -> Result<Prepared, JobError> {
    let tok = &*kit.tokenizer;
    let ctx = job.num_ctx.unwrap_or(kit.context_len).max(1);
    let mut prompt = job.context.clone();
    let mut tools = None;
    let mut reasoning = None;
    let mut harmony = None;
    let mut grammar = job.grammar.clone();
    let mut grammar_param = job.grammar_param;
    // A chat's messages as rendered, for a cut that drops the oldest.
    let mut chat_messages = None;
    let encode = |text: &str, special: bool| bounded_encode(tok, text, special, ctx);
    let new = match &job.prompt {
        PromptInput::Text { text, special } => encode(text, *special).map_err(|e| text_error("prompt", e))?,
        PromptInput::Chat(messages) => {
            let traits = &kit.chat;
            let messages = chat_messages.insert(with_modelfile(messages, traits.modelfile.as_ref()));
            let text = chat_text(tok, traits, messages, &job).map_err(|e| text_error(job.messages_param, e))?;
            if let Some(offer) = &job.tools {
                if offer.choice != ToolChoice::Auto {
                    let forced = tool_grammar(traits.tool_format, offer, &traits.markers);
                    grammar = Some(forced.map_err(|m| invalid(Some("tool_choice"), m))?);
                    grammar_param = "tool_choice";
                }
                let parser = ToolCallParser::new(traits.tool_format, &offer.tools, call_id_seed());
                tools = Some(if offer.one_call() { parser.single() } else { parser });
            }
            if traits.tool_format == ToolFormat::Harmony {
                // Its markers are no content whatever the request asks: reasoning, answer and
                // calls come apart always.
                let parser = HarmonyParser::new(job.tools.is_some(), call_id_seed());
                harmony =
                    Some(if job.tools.as_ref().is_some_and(ChatTools::one_call) { parser.single() } else { parser });
                tools = None;
                // A JSON schema (not a forced call) constrains the final message only.
                if grammar_param != "tool_choice"
                    && let Some(schema) = grammar.as_ref().and_then(GrammarSpec::json_schema)
                {
                    grammar = Some(GrammarSpec::Lark(harmony::final_grammar(&schema, &traits.markers)));
                }
            } else if let (true, Some(m)) = (job.split_reasoning, traits.think) {
                reasoning = Some(ReasoningSplitter::new(m, m.open_at_end(&text)));
            }
            encode(&text, false).map_err(|e| text_error(job.messages_param, e))?
        }
        PromptInput::Tokens(ids) => Bounded { tokens: ids.clone(), whole: true },
        PromptInput::Infill(infill) => {
            let tokens = tok.encode_infill(infill).map_err(|e| text_error("suffix", e))?;
            Bounded { tokens, whole: true }
        }
    };
    // A continuation of an earlier exchange already starts with BOS.
    let skip_bos = !prompt.is_empty() && new.tokens.first().is_some_and(|&t| Some(t) == tok.bos_id());
    prompt.extend(&new.tokens[skip_bos as usize..]);
    let vocab = kit.vocab;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(invalid(Some("prompt"), format!("token id {bad} is outside the vocabulary ({vocab} tokens)")));
    }
    // In id order: the last is the largest.
    if let Some(&(id, _)) = job.sampling.logit_bias.last().filter(|&&(id, _)| id as usize >= vocab) {
        return Err(invalid(
            Some("logit_bias"),
            format!("`logit_bias` names token {id}, outside the vocabulary ({vocab} tokens)"),
        ));
    }
    let param = match job.prompt {
        PromptInput::Chat(_) => job.messages_param,
        _ => "prompt",
    };
    if job.count_only {
        return Ok(Prepared { job, prompt, param, ctx, grammar: None, grammar_param, tools, reasoning, harmony });
    }
    if prompt.is_empty() {
        return Err(invalid(Some(param), "the prompt is empty"));
    }
    if prompt.len() >= ctx {
        prompt = cut_to_fit(kit, &job, (ctx, param), &prompt, new.whole, chat_messages.as_deref())?;
    }
    let grammar = match grammar {
        Some(spec) => {
            let env = kit.token_env.get(tok, vocab).map_err(|e| invalid(Some(grammar_param), e))?;
            let constraint = Constraint::new(&spec, env).map_err(|e| invalid(Some(grammar_param), e))?;
            Some((spec, constraint))
        }
        None => None,
    };
    Ok(Prepared { job, prompt, param, ctx, grammar, grammar_param, tools, reasoning, harmony })
}

/// A prompt longer than its context, cut to fit when the request allows it (Ollama's way,
/// [`truncate`]) and refused otherwise. `whole`: `prompt` holds every token of it, not
/// only its two ends ([`bounded_encode`]).
fn cut_to_fit(
    kit: &Kit,
    job: &GenerateJob,
    (ctx, param): (usize, &'static str),
    prompt: &[u32],
    whole: bool,
    chat_messages: Option<&[ChatMessage]>,
) -> Result<Vec<u32>, JobError> {
    let tok = &*kit.tokenizer;
    let what = if chat_messages.is_some() { "messages" } else { "prompt" };
    let count = match whole {
        true => format!("{} tokens", prompt.len()),
        false => format!("more than {} tokens", prompt.len()),
    };
    let too_long = || JobError::ContextLength {
        param,
        message: format!(
            "This model's maximum context length is {ctx} tokens. However, your {what} resulted in {count} (a \
             prompt must leave room for at least one generated token). Please reduce the length of the {what}."
        ),
    };
    let truncation: Truncation = match (&job.prompt, job.truncate) {
        (PromptInput::Infill(_), _) | (_, None) => return Err(too_long()),
        (_, Some(t)) => t,
    };
    let limit = truncate::prompt_limit(ctx, job.max_tokens);
    let render = |messages: &[ChatMessage]| {
        let text = chat_text(tok, &kit.chat, messages, job)?;
        bounded_encode(tok, &text, false, ctx).map(|b| b.tokens)
    };
    let chat = chat_messages.map(|messages| truncate::Chat { messages, render: &render });
    let continues = |id: u32| truncate::continues_character(&tok.token_bytes(id));
    let cut = match truncate::cut_prompt(prompt, chat, truncation, limit, continues) {
        Ok(cut) => cut,
        Err(truncate::CutError::Text(e)) => return Err(text_error(job.messages_param, e)),
        Err(truncate::CutError::HeadTooLong(h)) => {
            return Err(JobError::ContextLength {
                param,
                message: format!(
                    "the prompt is {count} long and the context holds {ctx}: cut to fit, it would keep {} tokens of \
                     system messages, tools and `num_keep`, leaving none of the {limit} a cut prompt may have for \
                     the conversation",
                    h.head
                ),
            });
        }
    };
    tracing::warn!(
        model = %job.model,
        prompt = %count,
        limit = ctx,
        new = cut.tokens.len(),
        keep = truncation.num_keep,
        dropped_messages = cut.dropped_messages,
        "truncating input prompt"
    );
    Ok(cut.tokens)
}

/// A text's tokens: all of them, or only its two ends when it holds far more than a
/// context (see [`bounded_encode`]).
#[derive(Debug, PartialEq)]
pub(super) struct Bounded {
    /// Every token (`whole`), or the first ones followed by the last ones.
    pub tokens: Vec<u32>,
    pub whole: bool,
}

/// Tokens beyond a context's that each end of a long text is tokenized to: the tokens
/// near a window's cut may differ from the whole text's, and none of them is used.
const END_MARGIN: usize = 64;

/// `text`'s tokens when it may fit in `ctx`; when even its first part holds more than
/// `ctx` tokens, its head and tail only, each more than `ctx` tokens long, so that any
/// cut to at most `ctx` tokens ([`truncate::keep_head_and_tail`]) takes the same tokens
/// from it as from the whole text, and a refusal can say it holds more than that.
pub(super) fn bounded_encode(tok: &TextTokenizer, text: &str, special: bool, ctx: usize) -> Result<Bounded, TextError> {
    ends_or_whole(text, ctx, |piece, at_start| tok.encode(piece, special && at_start))
}

/// [`bounded_encode`] over any tokenizer: `encode(piece, at_start)` tokenizes a piece of
/// the text, `at_start` when the piece begins it (the tokenizer may add BOS there).
fn ends_or_whole<'t, E>(
    text: &'t str,
    ctx: usize,
    encode: impl Fn(&str, bool) -> Result<Vec<u32>, E>,
) -> Result<Bounded, E> {
    let need = ctx + END_MARGIN;
    // At 8 bytes a token a text of this size holds more tokens than the context: past
    // it, look at its ends first, in windows that double until one holds more than
    // `need`. Most prompts are shorter and are tokenized once. `None`: the window
    // reached the whole text.
    let end = |piece: &dyn Fn(usize) -> (&'t str, bool)| -> Result<Option<Vec<u32>>, E> {
        let mut window = need.saturating_mul(8);
        while window < text.len() {
            let (part, at_start) = piece(window);
            let tokens = encode(part, at_start)?;
            if tokens.len() > need {
                return Ok(Some(tokens));
            }
            window = window.saturating_mul(2);
        }
        Ok(None)
    };
    let head = end(&|w| (&text[..floor_char_boundary(text, w)], true))?;
    let tail = match head {
        Some(_) => end(&|w| (&text[ceil_char_boundary(text, text.len() - w)..], false))?,
        None => None,
    };
    let (Some(head), Some(tail)) = (head, tail) else {
        return Ok(Bounded { tokens: encode(text, true)?, whole: true });
    };
    let mut tokens = head;
    tokens.extend(tail);
    Ok(Bounded { tokens, whole: false })
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// A seed for a request's tool-call ids: unique per request within a run, and unlikely
/// to repeat across runs.
fn call_id_seed() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    (now ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 1
}

/// A conversation with what a model's Modelfile puts first: its messages, and its
/// system message when the conversation brings none.
fn with_modelfile(messages: &[ChatMessage], modelfile: Option<&Modelfile>) -> Vec<ChatMessage> {
    let Some(m) = modelfile else { return messages.to_vec() };
    let text = |v: &serde_json::Value, key: &str| v.get(key).and_then(|x| x.as_str()).unwrap_or_default().to_string();
    let has_system = messages.first().is_some_and(|m| m.role == "system");
    let mut out = Vec::with_capacity(messages.len() + m.messages.len() + 1);
    let (system, rest) = match has_system {
        true => (Some(messages[0].clone()), &messages[1..]),
        false => (m.system.as_ref().map(|s| ChatMessage::new("system", s.clone())), messages),
    };
    out.extend(system);
    out.extend(m.messages.iter().map(|v| ChatMessage::new(text(v, "role"), text(v, "content"))));
    out.extend(rest.iter().cloned());
    out
}

/// Renders a chat with its tools and template variables. Tools go to the template as
/// transformers passes them; a template that never mentions them gets them in a system
/// message instead ([`ToolFormat::Generic`]).
fn chat_text(
    tok: &TextTokenizer,
    traits: &ChatTraits,
    messages: &[ChatMessage],
    job: &GenerateJob,
) -> Result<String, TextError> {
    let template = tok.chat_template().ok_or(TextError::NoChatTemplate)?;
    let mut extra = job.template_vars.clone();
    if traits.tool_format == ToolFormat::Harmony {
        harmony::effort_vars(&mut extra);
    }
    let Some(offer) = &job.tools else {
        return template.render_with(messages, true, &extra);
    };
    if traits.renders_tools {
        extra.insert("tools".into(), serde_json::Value::Array(offer.tools.clone()));
        return template.render_with(messages, true, &extra);
    }
    let prompt = generic_system_prompt(&offer.tools);
    let mut with_system = messages.to_vec();
    match with_system.first_mut() {
        Some(m) if m.role == "system" => m.content = format!("{}\n\n{prompt}", m.content),
        _ => with_system.insert(0, ChatMessage::new("system", prompt.clone())),
    }
    match template.render_with(&with_system, true, &extra) {
        // A template without a system role: the first user message carries it.
        Err(TextError::TemplateRaised(_)) if messages.first().is_none_or(|m| m.role != "system") => {
            let mut with_user = messages.to_vec();
            if let Some(m) = with_user.iter_mut().find(|m| m.role == "user") {
                m.content = format!("{prompt}\n\n{}", m.content);
            }
            template.render_with(&with_user, true, &extra)
        }
        other => other,
    }
}

/// The grammar that makes a reply call a tool (`tool_choice` `required`, or a named
/// function), in the model's format. A named function is called once (as vLLM's named
/// choice does); `required` makes several calls unless `parallel_tool_calls` is false.
fn tool_grammar(format: ToolFormat, offer: &ChatTools, markers: &CallMarkers) -> Result<GrammarSpec, String> {
    let functions: Vec<&serde_json::Value> = match &offer.choice {
        ToolChoice::Function(name) => {
            vec![
                offer
                    .function(name)
                    .ok_or_else(|| format!("`tool_choice` names `{name}`, which is not among `tools`"))?,
            ]
        }
        _ => offer.tools.iter().filter_map(|t| t.get("function")).collect(),
    };
    call_grammar(format, &functions, !offer.one_call(), markers)
}

/// A generation back from the thread that prepared it.
pub(super) struct Ready {
    pub prepared: Result<Prepared, JobError>,
    /// The model it was prepared for, as loaded then.
    pub kit: Arc<Kit>,
    pub events: UnboundedSender<Event>,
    pub admitted: Instant,
    /// How long its model took to load.
    pub load: Duration,
}

/// The threads that prepare generations, as the worker sees them: one per request, for
/// as long as it takes (the worker admits no more of a model's requests than it runs at
/// once, so there are few).
pub(super) struct Preparers {
    tx: Sender<Ready>,
    rx: Receiver<Ready>,
    /// Requests being prepared now.
    pub in_flight: usize,
}

impl Preparers {
    pub fn new() -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        Preparers { tx, rx, in_flight: 0 }
    }

    /// Prepares `job` for the model `kit` describes; the result comes back from
    /// [`Preparers::next`].
    pub fn start(
        &mut self,
        kit: Arc<Kit>,
        job: GenerateJob,
        events: UnboundedSender<Event>,
        admitted: Instant,
        load: Duration,
    ) -> Result<(), JobError> {
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name("strata-prepare".into())
            .spawn(move || {
                let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(&kit, job)))
                    .unwrap_or_else(|p| Err(JobError::Internal(panic_message(&*p))));
                let _ = tx.send(Ready { prepared, kit, events, admitted, load });
            })
            .map_err(|e| JobError::Internal(format!("starting a thread to prepare the request: {e}")))?;
        self.in_flight += 1;
        Ok(())
    }

    /// A prepared generation, waiting at most `wait` for one.
    pub fn next(&mut self, wait: Duration) -> Option<Ready> {
        let ready = match wait.is_zero() {
            true => self.rx.try_recv().ok(),
            false => self.rx.recv_timeout(wait).ok(),
        }?;
        self.in_flight -= 1;
        Some(ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every format's forced-call grammar compiles, for one function or several, named or
    /// not; Mistral's needs its marker tokens.
    #[test]
    fn tool_grammars_compile_in_every_format() {
        let f = |name: &str| {
            serde_json::json!({"type": "function", "function": {"name": name, "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}})
        };
        let tools = vec![f("get_weather"), f("search")];
        let formats = [
            ToolFormat::Hermes,
            ToolFormat::QwenXml,
            ToolFormat::Llama3,
            ToolFormat::Generic,
            ToolFormat::DeepSeek,
            ToolFormat::Kimi,
            ToolFormat::Glm,
            ToolFormat::Harmony,
        ];
        for format in formats {
            // Markers as text, and as tokens (ids 1000 on) where a template writes them.
            let as_tokens = CallMarkers::of(format, &format.markers().concat(), |m| {
                format.markers().iter().position(|x| *x == m).map(|i| 1000 + i as u32)
            });
            for markers in [CallMarkers::default(), as_tokens] {
                for choice in [ToolChoice::Required, ToolChoice::Function("search".into())] {
                    for parallel in [true, false] {
                        let offer = ChatTools { tools: tools.clone(), choice: choice.clone(), parallel };
                        let spec = tool_grammar(format, &offer, &markers).unwrap();
                        spec.check().unwrap_or_else(|e| panic!("{format:?} {choice:?}: {e}\n{spec:?}"));
                    }
                }
            }
        }
        let offer = ChatTools { tools, choice: ToolChoice::Required, parallel: true };
        let none = CallMarkers::default();
        assert!(tool_grammar(ToolFormat::Mistral, &offer, &none).unwrap_err().contains("[TOOL_CALLS]"));
        let offer = ChatTools { choice: ToolChoice::Function("nope".into()), ..offer };
        assert!(tool_grammar(ToolFormat::Hermes, &offer, &none).unwrap_err().contains("nope"));
    }

    /// One token per byte, BOS (id 0) at the start of the text: the windows' tokens are
    /// the whole text's, so what [`ends_or_whole`] keeps is exact.
    fn bytes(piece: &str, at_start: bool) -> Result<Vec<u32>, ()> {
        Ok(at_start.then_some(0).into_iter().chain(piece.bytes().map(|b| b as u32 + 1)).collect())
    }

    #[test]
    fn a_text_that_may_fit_is_tokenized_whole() {
        let text = "ab".repeat(500);
        let got = ends_or_whole(&text, 1000, bytes).unwrap();
        assert_eq!(got, Bounded { tokens: bytes(&text, true).unwrap(), whole: true });
        // Sparse in tokens: 100 bytes a token, far more bytes than 8 a token allows.
        let hundreds = |piece: &str, _| Ok::<_, ()>(vec![7; piece.len() / 100]);
        let text = "x".repeat(100 * 900);
        assert_eq!(ends_or_whole(&text, 1000, hundreds).unwrap(), Bounded { tokens: vec![7; 900], whole: true });
    }

    #[test]
    fn a_text_far_past_the_context_is_tokenized_at_its_ends_only() {
        use std::cell::Cell;
        let ctx = 100;
        // 10 MB for a 100-token context.
        let text: String = (0..10_000_000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
        let read = Cell::new(0);
        let counting = |piece: &str, at_start: bool| {
            read.set(read.get() + piece.len());
            bytes(piece, at_start)
        };
        let got = ends_or_whole(&text, ctx, counting).unwrap();
        assert!(!got.whole);
        assert!(read.get() < 64 * (ctx + END_MARGIN), "read {} bytes of {}", read.get(), text.len());
        // Any cut to the context takes the whole text's tokens from it.
        let all = bytes(&text, true).unwrap();
        let (head, tail) = (ctx / 2, ctx / 2);
        assert_eq!(got.tokens[..head], all[..head]);
        assert_eq!(got.tokens[got.tokens.len() - tail..], all[all.len() - tail..]);
        assert!(got.tokens.len() > 2 * (ctx + END_MARGIN));
    }

    #[test]
    fn windows_end_on_character_boundaries() {
        let text = "é".repeat(50_000);
        let got = ends_or_whole(&text, 10, |piece: &str, _| Ok::<_, ()>(piece.chars().map(|c| c as u32).collect()));
        let got = got.unwrap();
        assert!(!got.whole && got.tokens.iter().all(|&t| t == 'é' as u32));
    }
}
