//! Structured output: sampling constrained by a JSON schema or a Lark grammar, with
//! [llguidance](https://github.com/guidance-ai/llguidance).
//!
//! Three pieces:
//! - [`GrammarSpec`]: what a request asks for. [`GrammarSpec::check`] compiles it without
//!   a tokenizer, so that the HTTP layer can refuse a bad schema or grammar (400) before
//!   the request is queued.
//! - [`TokenEnv`]: the model's vocabulary as llguidance's token trie, with the grammar
//!   compiler that uses it. Building it walks the whole vocabulary, so an engine builds
//!   it once, on the first constrained request ([`Engine::token_env`]).
//! - [`Constraint`]: one per sequence. [`Constraint::allowed`] is the set of tokens the
//!   grammar allows next, [`Constraint::commit`] advances it by the sampled token, and
//!   [`Constraint::is_done`] says when only the end of the text may follow.
//!
//! Special tokens (the tokenizer's added tokens marked special, and every end-of-sequence
//! id) are written into the trie behind a 0xFF byte, llguidance's convention: no UTF-8
//! text contains that byte, so JSON text can never contain them. A Lark grammar may still
//! name one (`<|im_end|>`). The first end-of-sequence id is the grammar's end token; any
//! of them ends a constrained generation.
//!
//! [`Engine::token_env`]: super::session::Engine::token_env

use std::sync::Arc;

use llguidance::api::{GrammarInit, ParserLimits, StopReason, TopLevelGrammar};
use llguidance::earley::{CGrammar, CSymIdx};
use llguidance::{JsonCompileOptions, Logger, ParserFactory};
use serde_json::{Value, json};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use super::tokenizer::TextTokenizer;

mod closed;
pub use closed::close_objects;

/// The tokens a grammar allows next: one bit per vocabulary id.
pub use toktrie::SimpleVob as TokenSet;

/// Whitespace a JSON grammar allows between two tokens of the JSON text: one space, or
/// one or two newlines followed by at most 20 spaces or tabs (what llama.cpp's JSON
/// grammars allow). Pretty-printed JSON fits, and a model cannot loop on whitespace:
/// every gap is bounded, and the text must move on after it.
pub const JSON_WHITESPACE: &str = r"\x20|\x0A{1,2}[\x20\x09]{0,20}";

/// Tokens longer than this many bytes cannot be sampled under a grammar (llguidance's
/// token trie holds tokens up to about 1 KiB; real vocabularies stay far below).
const MAX_TOKEN_BYTES: usize = 1000;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`, Ollama's
    /// `format: "json"`).
    JsonObject,
    /// A JSON schema (OpenAI's `json_schema`, Ollama's `format` object). llguidance's
    /// own extension `x-guidance` (compile options) is honoured over Strata's defaults.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax
    /// (<https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md>).
    Lark(String),
}

impl GrammarSpec {
    /// A JSON request's schema as Strata compiles it (its options in `x-guidance`), to
    /// embed in a larger grammar (Lark's `%json`); `None` for a Lark grammar.
    pub fn json_schema(&self) -> Option<Value> {
        match self {
            GrammarSpec::JsonObject => Some(with_json_options(json!({"type": "object"}), false)),
            GrammarSpec::JsonSchema(schema) => Some(with_json_options(schema.clone(), false)),
            GrammarSpec::Lark(_) => None,
        }
    }

    /// Compiles the grammar without a tokenizer: an error names the problem (a bad
    /// `$ref`, an unsupported keyword, a Lark syntax error) in llguidance's words, as
    /// compiling it for a model would. A grammar that compiles is then refused when no
    /// text can complete it ([`dead_rules`]), and a JSON schema when it asks for
    /// integers llguidance cannot write ([`integer_bounds`]).
    pub fn check(&self) -> Result<(), String> {
        if let GrammarSpec::JsonSchema(schema) = self {
            integer_bounds(schema, 0)?;
        }
        self.compile_check(false)
    }

    /// The check for a JSON schema that is only shown to the model, never enforced (a
    /// tool's `parameters` when the call is not forced): what llguidance cannot enforce
    /// passes (an unsupported keyword or format, a 64-bit integer bound), and what is
    /// wrong in any JSON Schema reader is refused (an unknown `type`, a bad `$ref`, a
    /// subschema no value matches).
    pub fn check_shown(&self) -> Result<(), String> {
        self.compile_check(true)
    }

    fn compile_check(&self, lenient: bool) -> Result<(), String> {
        let mut logger = Logger::new(0, 0);
        let init = GrammarInit::Serialized(self.top_level_with(lenient));
        let grammar = llguidance::panic_utils::catch_unwind(std::panic::AssertUnwindSafe(|| {
            init.to_cgrammar(None, &mut logger, limits(), Vec::new())
        }))
        .map_err(message)?;
        dead_rules(&grammar, !matches!(self, GrammarSpec::Lark(_)))
    }

    /// The grammar as llguidance takes it, with Strata's JSON options.
    fn top_level(&self) -> TopLevelGrammar {
        self.top_level_with(false)
    }

    /// `lenient`: unsupported keywords are warnings, not errors (llguidance's option).
    fn top_level_with(&self, lenient: bool) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_json_options(json!({"type": "object"}), false))
            }
            GrammarSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_json_options(schema.clone(), lenient))
            }
            GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// `schema` with its objects closed ([`close_objects`]) and Strata's JSON compile
/// options in `x-guidance` (the schema's own
/// `x-guidance` entries win): whitespace bounded by [`JSON_WHITESPACE`], and `oneOf`
/// treated as `anyOf` (as llama.cpp does; exclusive alternatives cannot be checked while
/// generating). Keywords llguidance cannot enforce (`uniqueItems`, `not`, ...) stay errors,
/// so that a schema is never silently loosened, unless `lenient` (for a check only).
fn with_json_options(schema: Value, lenient: bool) -> Value {
    let options = JsonCompileOptions {
        whitespace_pattern: Some(JSON_WHITESPACE.to_string()),
        coerce_one_of: true,
        ..JsonCompileOptions::default()
    };
    let mut schema = match schema {
        // `true` is the schema that accepts anything.
        Value::Bool(true) => json!({}),
        Value::Object(map) => close_objects(Value::Object(map)),
        // Anything else is no schema: llguidance says so.
        other => return other,
    };
    let mut x_guidance = serde_json::to_value(&options).unwrap_or_else(|_| json!({}));
    if let Some(own) = schema.get("x-guidance") {
        llguidance::json_merge(&mut x_guidance, own);
    }
    if lenient {
        x_guidance["lenient"] = json!(true);
    }
    if let Value::Object(map) = &mut schema {
        map.insert("x-guidance".to_string(), x_guidance);
    }
    schema
}

/// Refuses a compiled grammar that no finite text completes: its start symbol, or with
/// `every_rule` any symbol reachable from it, is not *productive*. A symbol is
/// productive when it is a lexeme, derives the empty text, or has a rule whose symbols
/// are all productive (the textbook fixpoint, linear in the grammar's size). Without
/// this, such a grammar starts a text it cannot finish: the model is stopped at the
/// first token no rule allows, and the reply would be cut short.
///
/// Sound: every rule counts whatever its condition (parametric grammars), and every
/// lexeme is taken to match some text, so that only more symbols can be found
/// productive than truly are; a grammar refused here has no complete text. A JSON
/// schema is checked with `every_rule`: a subschema that has no finite instance (a
/// `$ref` that leads back to itself without consuming anything) is a schema mistake
/// even where it is optional, and llguidance would let the model start its value. A
/// Lark grammar may keep an unproductive alternative the parser never enters.
fn dead_rules(grammar: &CGrammar, every_rule: bool) -> Result<(), String> {
    // The reachable symbols (by index into `syms`) and their rules' right-hand sides.
    let mut syms = vec![grammar.start()];
    let mut index = std::collections::HashMap::from([(grammar.start(), 0)]);
    let mut rules: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut n = 0;
    while n < syms.len() {
        for &rule in grammar.rules_of(syms[n]) {
            let rhs = grammar
                .rule_rhs(rule)
                .0
                .iter()
                .map(|&s| {
                    *index.entry(s).or_insert_with(|| {
                        syms.push(s);
                        syms.len() - 1
                    })
                })
                .collect();
            rules.push((n, rhs));
        }
        n += 1;
    }
    let leaf = |s: CSymIdx| {
        let d = grammar.sym_data(s);
        d.is_terminal || d.lexeme.is_some() || d.gen_grammar.is_some() || d.is_nullable
    };
    let mut productive: Vec<bool> = syms.iter().map(|&s| leaf(s)).collect();
    // Per rule, how many of its symbols are not yet known to be productive.
    let mut missing: Vec<usize> = rules.iter().map(|(_, rhs)| rhs.len()).collect();
    let mut uses: Vec<Vec<usize>> = vec![Vec::new(); syms.len()];
    for (r, (_, rhs)) in rules.iter().enumerate() {
        for &s in rhs {
            uses[s].push(r);
        }
    }
    let mut found: Vec<usize> = (0..syms.len()).filter(|&s| productive[s]).collect();
    while let Some(s) = found.pop() {
        for &r in &uses[s] {
            missing[r] -= 1;
            let lhs = rules[r].0;
            if missing[r] == 0 && !productive[lhs] {
                productive[lhs] = true;
                found.push(lhs);
            }
        }
    }
    if productive[0] && (!every_rule || productive.iter().all(|&p| p)) {
        return Ok(());
    }
    let dead: Vec<String> = (0..syms.len())
        .filter(|&s| !productive[s])
        .take(4)
        .map(|s| format!("`{}`", grammar.sym_name(syms[s])))
        .collect();
    let what = if productive[0] { "part of it" } else { "it" };
    Err(format!(
        "no finite text can complete {what}: every way through {} leads back into itself (a rule or `$ref` \
         without a base case)",
        dead.join(", ")
    ))
}

/// The largest integer bound llguidance keeps: it writes integer ranges with 64-bit
/// bounds, and a bound past them is clamped, which would loosen a `minimum` above
/// `i64::MAX` (or a `maximum` below `i64::MIN`) into a range of one wrong number.
const INTEGER_LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63

/// Refuses an integer subschema whose range lies beyond the 64-bit integers: a
/// `minimum` (or `exclusiveMinimum`) of at least 2^63, or a `maximum` (or
/// `exclusiveMaximum`) below -2^63. Walks every subschema (values under `const`, `enum`,
/// `default` and `examples` are data, not schemas); `depth` bounds the walk as
/// serde_json bounds parsing.
fn integer_bounds(schema: &Value, depth: usize) -> Result<(), String> {
    bounds_within(schema, false, depth)
}

/// [`integer_bounds`] of `schema`, which an enclosing schema makes an integer
/// (`integer`) unless it names a type of its own: `allOf` parts are merged into one
/// schema, so `{"type": "integer", "allOf": [{"minimum": 1e19}]}` and
/// `{"allOf": [{"type": "integer"}, {"minimum": 1e19}]}` bound an integer too.
fn bounds_within(schema: &Value, integer: bool, depth: usize) -> Result<(), String> {
    if depth > 128 {
        return Ok(());
    }
    match schema {
        Value::Array(items) => items.iter().try_for_each(|v| bounds_within(v, false, depth + 1)),
        Value::Object(map) => {
            let names_integer = |s: &Value| match s.get("type") {
                Some(Value::String(t)) => Some(t == "integer"),
                Some(Value::Array(ts)) => Some(ts.iter().any(|t| t == "integer")),
                _ => None,
            };
            let all_of = map.get("allOf").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
            let integer =
                names_integer(schema).unwrap_or(integer) || all_of.iter().any(|part| names_integer(part) == Some(true));
            if integer {
                let bound = |key: &'static str| map.get(key).and_then(Value::as_f64).map(|v| (key, v));
                let low =
                    ["minimum", "exclusiveMinimum"].into_iter().filter_map(bound).find(|&(_, v)| v >= INTEGER_LIMIT);
                let high =
                    ["maximum", "exclusiveMaximum"].into_iter().filter_map(bound).find(|&(_, v)| v < -INTEGER_LIMIT);
                if let Some((key, v)) = low.or(high) {
                    return Err(format!(
                        "`{key}` {v} is beyond the integers structured output can write ({} to {})",
                        i64::MIN,
                        i64::MAX
                    ));
                }
            }
            all_of.iter().try_for_each(|part| bounds_within(part, integer, depth + 1))?;
            map.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "allOf" | "const" | "enum" | "default" | "examples" | "x-guidance")
                })
                .try_for_each(|(_, v)| bounds_within(v, false, depth + 1))
        }
        _ => Ok(()),
    }
}

/// llguidance's limits, with short errors (no parser state or grammar dump: the
/// message goes back to a client).
fn limits() -> ParserLimits {
    ParserLimits { verbose_errors: false, ..ParserLimits::default() }
}

/// An llguidance error as one message (without the backtrace a caught panic carries).
fn message(e: anyhow::Error) -> String {
    let text = e.to_string();
    match text.find("\n<backtrace>") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// A model's vocabulary as llguidance sees it, and the compiler of grammars over it.
pub struct TokenEnv {
    factory: ParserFactory,
    /// Only the end-of-sequence ids: what a finished grammar allows.
    eos_only: TokenSet,
    vocab: usize,
}

impl std::fmt::Debug for TokenEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEnv").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

/// A model's [`TokenEnv`], built on first use and shared: the engine and the threads that
/// prepare its requests (and compile their grammars) hold the same one.
#[derive(Clone, Default)]
pub struct TokenEnvCell(Arc<std::sync::OnceLock<Result<TokenEnv, String>>>);

impl TokenEnvCell {
    /// The token trie of `tokenizer` for `vocab` logits, built by the first caller.
    pub fn get(&self, tokenizer: &TextTokenizer, vocab: usize) -> Result<&TokenEnv, String> {
        let env = self.0.get_or_init(|| {
            TokenEnv::new(tokenizer, vocab)
                .map_err(|e| format!("structured output is not available for this model's vocabulary: {e}"))
        });
        env.as_ref().map_err(Clone::clone)
    }
}

impl TokenEnv {
    /// The token trie of `tokenizer` for a model whose logits have `vocab` entries (ids
    /// the tokenizer does not know are never allowed). Takes a fraction of a second for
    /// a 50k vocabulary: build it once per tokenizer.
    pub fn new(tokenizer: &TextTokenizer, vocab: usize) -> Result<Self, String> {
        if vocab == 0 || vocab >= 0xff_ffff {
            return Err(format!("a vocabulary of {vocab} tokens does not fit llguidance's token trie"));
        }
        let known = tokenizer.vocab_size().min(vocab);
        let added = tokenizer.inner().get_added_tokens_decoder();
        let eos: Vec<u32> = tokenizer.eos_ids().iter().copied().filter(|&id| (id as usize) < vocab).collect();
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                if id as usize >= known {
                    return Vec::new();
                }
                let special = added.get(&id).map(|t| (t.special, &t.content));
                let bytes = match special {
                    Some((true, content)) => [&[TokTrie::SPECIAL_TOKEN_MARKER], content.as_bytes()].concat(),
                    _ if eos.contains(&id) => {
                        let text = tokenizer.id_to_token(id).unwrap_or_default();
                        [&[TokTrie::SPECIAL_TOKEN_MARKER], text.as_bytes()].concat()
                    }
                    _ => tokenizer.token_bytes(id),
                };
                if bytes.len() > MAX_TOKEN_BYTES { Vec::new() } else { bytes }
            })
            .collect();
        let info = TokRxInfo::new(vocab as u32, eos.first().copied().unwrap_or(toktrie::INVALID_TOKEN));
        let trie = std::panic::catch_unwind(|| {
            let trie = TokTrie::from(&info, &words);
            if eos.is_empty() { trie } else { trie.with_eos_tokens(&eos) }
        })
        .map_err(|_| "the vocabulary does not fit llguidance's token trie".to_string())?;
        let eos_only = trie.eos_token_set();
        // Tokenizing (for tokens a grammar forces) is greedy over the trie; Strata does not
        // let grammars force tokens, so it is not used when sampling.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(message)?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(TokenEnv { factory, eos_only, vocab })
    }

    /// Entries in every mask (the model's logits).
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }
}

/// Where a [`Constraint`] stands between two tokens.
#[derive(Debug)]
enum State {
    /// The next token's mask is not computed yet.
    Stale,
    /// llguidance's last step result holds the next token's mask.
    Ready,
    /// The grammar is complete: only an end-of-sequence token may follow.
    Done,
    /// llguidance failed; the message is reported at every later call.
    Failed(String),
}

/// One sequence's grammar state.
pub struct Constraint {
    inner: llguidance::Constraint,
    state: State,
    /// Only the end-of-sequence ids.
    eos_only: TokenSet,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("state", &self.state).finish_non_exhaustive()
    }
}

impl Constraint {
    /// Compiles `spec` over `env`'s vocabulary (a few milliseconds for a JSON schema);
    /// the error names what does not compile, such as an unknown special token.
    pub fn new(spec: &GrammarSpec, env: &TokenEnv) -> Result<Self, String> {
        let parser = llguidance::panic_utils::catch_unwind(std::panic::AssertUnwindSafe(|| {
            env.factory.create_parser(spec.top_level())
        }))
        .map_err(message)?;
        Ok(Constraint {
            inner: llguidance::Constraint::new(parser),
            state: State::Stale,
            eos_only: env.eos_only.clone(),
        })
    }

    /// The tokens the grammar allows next (computed once per token, 0.1 to 1 ms for a
    /// 50k vocabulary: [`super::batch::step`] computes it while the forward pass runs).
    /// Once the grammar is complete, only the end-of-sequence ids.
    pub fn allowed(&mut self) -> Result<&TokenSet, String> {
        if let State::Stale = self.state {
            // (stopped, has a mask)
            let step = self.inner.compute_mask().map(|s| (s.is_stop(), s.sample_mask.is_some())).map_err(message);
            self.state = match step {
                // No token at all, while the text is not complete: a dead end (a rule
                // that cannot be finished, or text the vocabulary cannot spell).
                Ok((true, _)) if self.dead_end() => State::Failed(
                    "structured output reached a dead end: the grammar allows no token after the text so far, and does \
                     not accept it as it is (a rule that cannot be completed, or text the vocabulary cannot write)"
                        .into(),
                ),
                Ok((true, _)) => State::Done,
                Ok((false, true)) => State::Ready,
                Ok((false, false)) => {
                    State::Failed("the grammar asked to insert tokens, which Strata does not allow".into())
                }
                Err(e) => State::Failed(e),
            };
        }
        match &self.state {
            State::Ready => match &self.inner.step_result().sample_mask {
                Some(mask) => Ok(mask),
                None => Err("the grammar lost its mask".to_string()),
            },
            State::Done => Ok(&self.eos_only),
            State::Failed(e) => Err(e.clone()),
            State::Stale => unreachable!("the mask was computed above"),
        }
    }

    /// Whether llguidance stopped because no token may follow, and the text is not one
    /// the grammar accepts (an accepting grammar allows the end-of-sequence ids).
    fn dead_end(&mut self) -> bool {
        let parser = &mut self.inner.parser;
        parser.stop_reason() == StopReason::NoExtensionBias && !parser.is_accepting()
    }

    /// Advances the grammar by `token`, which must be one [`allowed`](Self::allowed)
    /// allows. An end-of-sequence token completes it.
    pub fn commit(&mut self, token: u32) -> Result<(), String> {
        let allowed = self.allowed()?;
        if !allows(allowed, token) {
            return Err(format!("token {token} is not allowed by the grammar here"));
        }
        if let State::Done = self.state {
            return Ok(());
        }
        match self.inner.commit_token(Some(token)) {
            Ok(r) if r.stop || self.inner.has_pending_stop() || self.eos_only.is_allowed(token) => {
                self.state = State::Done
            }
            Ok(_) => self.state = State::Stale,
            Err(e) => {
                let e = message(e);
                self.state = State::Failed(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether the grammar is complete (only an end-of-sequence token may follow).
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }
}

/// Whether `set` allows `token` (ids past its end are not allowed).
pub fn allows(set: &TokenSet, token: u32) -> bool {
    (token as usize) < set.len() && set.is_allowed(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The llama3 fixture's tokenizer: 480 byte-level BPE tokens and 11 special ones,
    /// end-of-sequence ids 481 and 482.
    fn fixture() -> TextTokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/llama3");
        TextTokenizer::from_dir(&dir).expect("the llama3 fixture's tokenizer")
    }

    fn env() -> (TextTokenizer, TokenEnv) {
        let tok = fixture();
        let env = TokenEnv::new(&tok, tok.vocab_size()).expect("the token trie");
        (tok, env)
    }

    /// Feeds `text`'s tokens; the error says which one was refused.
    fn feed(c: &mut Constraint, tok: &TextTokenizer, text: &str) -> Result<(), String> {
        for id in tok.encode(text, false).unwrap() {
            c.commit(id)?;
        }
        Ok(())
    }

    /// A small xorshift, so that the walks are reproducible.
    fn walk(c: &mut Constraint, tok: &TextTokenizer, seed: u64, steps: usize) -> (String, bool) {
        let mut state = seed.max(1);
        let mut ids = Vec::new();
        for _ in 0..steps {
            if c.is_done() {
                return (tok.decode(&ids, true).unwrap(), true);
            }
            let allowed = c.allowed().unwrap().to_list();
            assert!(!allowed.is_empty(), "a grammar in progress allows some token");
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let id = allowed[(state % allowed.len() as u64) as usize];
            c.commit(id).unwrap();
            if tok.is_eos(id) {
                return (tok.decode(&ids, true).unwrap(), true);
            }
            ids.push(id);
        }
        (tok.decode(&ids, true).unwrap(), false)
    }

    #[test]
    fn check_accepts_good_grammars() {
        GrammarSpec::JsonObject.check().unwrap();
        GrammarSpec::JsonSchema(json!(true)).check().unwrap();
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "pet": {"$ref": "#/$defs/pet"},
                "either": {"oneOf": [{"type": "integer"}, {"type": "null"}]}
            },
            "required": ["name"],
            "$defs": {"pet": {"enum": ["cat", "dog"]}}
        });
        GrammarSpec::JsonSchema(schema).check().unwrap();
        GrammarSpec::Lark("start: \"yes\" | \"no\"\n".into()).check().unwrap();
        // A special token is a tokenizer's business: checked when compiled for a model.
        GrammarSpec::Lark("start: \"a\" <|im_end|>\n".into()).check().unwrap();
    }

    #[test]
    fn check_names_the_problem() {
        let bad_ref = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}});
        let e = GrammarSpec::JsonSchema(bad_ref).check().unwrap_err();
        assert!(e.contains("missing"), "{e}");
        // A keyword llguidance cannot enforce is refused; one JSON Schema does not define
        // is ignored, as the standard says.
        let unsupported = json!({"type": "array", "uniqueItems": true});
        let e = GrammarSpec::JsonSchema(unsupported).check().unwrap_err();
        assert!(e.contains("uniqueItems"), "{e}");
        GrammarSpec::JsonSchema(json!({"type": "string", "frobnicate": 3})).check().unwrap();
        let e = GrammarSpec::JsonSchema(json!("object")).check().unwrap_err();
        assert!(!e.is_empty());
        let e = GrammarSpec::Lark("start: (\"a\"\n".into()).check().unwrap_err();
        assert!(!e.is_empty() && !e.contains("backtrace"), "{e}");
        let e = GrammarSpec::Lark("start: missing_rule\n".into()).check().unwrap_err();
        assert!(e.contains("missing_rule"), "{e}");
    }

    #[test]
    fn check_refuses_grammars_no_text_completes() {
        let empty = [
            GrammarSpec::JsonSchema(json!({"$ref": "#"})),
            GrammarSpec::JsonSchema(
                json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
            ),
            GrammarSpec::JsonSchema(json!({
                "type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]
            })),
            // Optional, but the model could start its value and never finish it.
            GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}})),
            GrammarSpec::Lark("start: start \"a\"\n".into()),
            GrammarSpec::Lark("start: a\na: a\n".into()),
            GrammarSpec::Lark("start: \"x\" a\na: \"(\" a \")\"\n".into()),
        ];
        for spec in empty {
            let e = spec.check().expect_err(&format!("{spec:?}"));
            assert!(e.contains("no finite text"), "{spec:?}: {e}");
        }
        // Recursion with a way out is fine, and so is an alternative no text takes.
        let fine = [
            GrammarSpec::JsonSchema(json!({
                "type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}, "required": ["v"]
            })),
            GrammarSpec::JsonSchema(json!({"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#"}}]})),
            GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"a": false}})),
            GrammarSpec::JsonSchema(json!({"type": "array", "items": false})),
            GrammarSpec::Lark("start: \"(\" start \")\" | \"x\"\n".into()),
            GrammarSpec::Lark("start: \"a\" | b\nb: b\n".into()),
        ];
        for spec in fine {
            spec.check().unwrap_or_else(|e| panic!("{spec:?}: {e}"));
        }
    }

    #[test]
    fn check_refuses_integer_ranges_past_64_bits() {
        for schema in [
            json!({"type": "integer", "minimum": 1e300, "maximum": 1e301}),
            json!({"type": "integer", "exclusiveMinimum": 1e19, "maximum": 1e20}),
            json!({"type": ["integer", "null"], "maximum": -1e300, "minimum": -1e301}),
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 18446744073709551615u64}}}),
            json!({"type": "integer", "minimum": 1e20}),
            // Bounds merged in from `allOf`, either way round.
            json!({"type": "integer", "allOf": [{"minimum": 1e19}]}),
            json!({"allOf": [{"type": "integer"}, {"maximum": -1e19}]}),
            json!({"allOf": [{"type": "integer"}, {"allOf": [{"exclusiveMinimum": 1e30}]}]}),
        ] {
            let e = GrammarSpec::JsonSchema(schema.clone()).check().expect_err(&schema.to_string());
            assert!(e.contains("imum"), "{schema}: {e}");
        }
        for schema in [
            json!({"type": "integer", "minimum": 9007199254740993u64}),
            json!({"enum": [{"type": "integer", "minimum": 1e300}]}),
            json!({"allOf": [{"type": "integer"}, {"minimum": 5, "maximum": 9223372036854775807u64}]}),
        ] {
            GrammarSpec::JsonSchema(schema.clone()).check().unwrap_or_else(|e| panic!("{schema}: {e}"));
        }
    }

    #[test]
    fn a_dead_end_is_an_error_not_a_stop() {
        let (tok, env) = env();
        // The check lets an unproductive Lark alternative through; taking it is an error
        // at the next token, not a finished text.
        let spec = GrammarSpec::Lark("start: \"a\" | \"b\" c\nc: c \"c\"\n".into());
        spec.check().unwrap();
        let mut c = Constraint::new(&spec, &env).unwrap();
        feed(&mut c, &tok, "b").unwrap_or_else(|e| panic!("{e}"));
        let e = c.allowed().map(|m| m.to_list()).unwrap_err();
        assert!(e.contains("allows no token"), "{e}");
        assert!(!c.is_done());
    }

    #[test]
    fn special_tokens_are_marked_and_eos_ends_the_grammar() {
        let (tok, env) = env();
        let mut c = Constraint::new(&GrammarSpec::Lark("start: \"ab\"\n".into()), &env).unwrap();
        let first = c.allowed().unwrap().clone();
        assert!((480..491).all(|id| !allows(&first, id)), "special tokens are never text");
        feed(&mut c, &tok, "ab").unwrap();
        assert!(c.is_done());
        let after = c.allowed().unwrap();
        assert_eq!(after.to_list(), vec![481, 482], "every eos id, nothing else");
        c.commit(482).unwrap();
        assert!(c.commit(5).is_err(), "nothing but eos after the end");
        // A Lark grammar may name a special token; compiling checks it exists.
        Constraint::new(&GrammarSpec::Lark("start: \"a\" <|im_end|>\n".into()), &env).unwrap();
        let e = Constraint::new(&GrammarSpec::Lark("start: <|nope|>\n".into()), &env).unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn a_refused_token_is_an_error_not_a_panic() {
        let (tok, env) = env();
        let mut c = Constraint::new(&GrammarSpec::JsonObject, &env).unwrap();
        let bracket = tok.encode("[", false).unwrap()[0];
        let e = c.commit(bracket).unwrap_err();
        assert!(e.contains("not allowed"), "{e}");
        assert!(c.commit(u32::MAX).is_err());
        // The constraint is still usable: `{` starts an object.
        feed(&mut c, &tok, "{}").unwrap();
        assert!(c.is_done());
    }

    #[test]
    fn json_object_accepts_objects_with_bounded_whitespace() {
        let (tok, env) = env();
        let mut c = Constraint::new(&GrammarSpec::JsonObject, &env).unwrap();
        feed(&mut c, &tok, "{\"a\": [1, 2.5, {\"b\": null}], \"c\": \"x\\n\", \"d\": true}").unwrap();
        assert!(c.is_done() || c.allowed().unwrap().is_allowed(481));
        // Pretty-printed: a newline and 20 spaces fit in a gap, a 21st space does not.
        let mut c = Constraint::new(&GrammarSpec::JsonObject, &env).unwrap();
        feed(&mut c, &tok, &format!("{{\n{}", " ".repeat(20))).unwrap();
        let space = tok.encode(" ", false).unwrap()[0];
        assert!(c.commit(space).is_err(), "whitespace is bounded");
        // One space, not two.
        let mut c = Constraint::new(&GrammarSpec::JsonObject, &env).unwrap();
        feed(&mut c, &tok, "{ ").unwrap();
        assert!(c.commit(space).is_err());
    }

    #[test]
    fn random_walks_give_json_that_matches_the_schema() {
        let (tok, env) = env();
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "kind": {"enum": ["cat", "dog", "fish"]},
                "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
                "age": {"type": "integer", "minimum": 0, "maximum": 99}
            },
            "required": ["name", "kind", "tags", "age"],
            "additionalProperties": false
        });
        let spec = GrammarSpec::JsonSchema(schema);
        for seed in 1..=20 {
            let mut c = Constraint::new(&spec, &env).unwrap();
            let (text, done) = walk(&mut c, &tok, seed, 400);
            assert!(done, "seed {seed}: the grammar did not end: {text:?}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
            let obj = v.as_object().unwrap();
            assert_eq!(obj.len(), 4, "{text}");
            assert!(obj["name"].as_str().unwrap().chars().count() <= 6, "{text}");
            assert!(["cat", "dog", "fish"].contains(&obj["kind"].as_str().unwrap()), "{text}");
            let tags = obj["tags"].as_array().unwrap();
            assert!((1..=3).contains(&tags.len()) && tags.iter().all(Value::is_boolean), "{text}");
            assert!((0..=99).contains(&obj["age"].as_i64().unwrap()), "{text}");
        }
    }

    #[test]
    fn an_object_without_additional_properties_admits_no_other_key() {
        let (tok, env) = env();
        let props = json!({"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number"}});
        let closed = GrammarSpec::JsonSchema(json!({"type": "object", "properties": props}));
        let mut c = Constraint::new(&closed, &env).unwrap();
        feed(&mut c, &tok, "{\"answer\": \"yes\", \"confidence\": 0.5").unwrap();
        let e = feed(&mut c, &tok, ", \"why\": 1}").unwrap_err();
        assert!(e.contains("not allowed"), "{e}");
        // The closing brace is what may come.
        let mut c = Constraint::new(&closed, &env).unwrap();
        feed(&mut c, &tok, "{\"answer\": \"yes\", \"confidence\": 0.5}").unwrap();
        assert!(c.is_done() || c.allowed().unwrap().is_allowed(481));
        // The schema's own `additionalProperties: true` keeps other keys.
        let open =
            GrammarSpec::JsonSchema(json!({"type": "object", "properties": props, "additionalProperties": true}));
        let mut c = Constraint::new(&open, &env).unwrap();
        feed(&mut c, &tok, "{\"answer\": \"yes\", \"confidence\": 0.5, \"why\": 1}").unwrap();
    }

    #[test]
    fn a_lark_grammar_forces_its_language() {
        let (tok, env) = env();
        let spec = GrammarSpec::Lark("start: (\"yes\" | \"no\") \"!\"\n".into());
        for seed in 1..=8 {
            let mut c = Constraint::new(&spec, &env).unwrap();
            let (text, done) = walk(&mut c, &tok, seed, 20);
            assert!(done && (text == "yes!" || text == "no!"), "{text:?}");
        }
    }
}
