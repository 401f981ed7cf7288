//! The CUDA kernel sources (`kernels/*.cu`), built into the binary so a GPU box needs
//! nothing but the driver and NVRTC.
//!
//! One op family per file (`kernels/README.md` gives each kernel's ABI). Before NVRTC sees
//! a file, [`full_source`] prepends `common.cuh` and, for the files that decode weights,
//! `quant.cuh`; `#line` markers keep NVRTC's messages pointing at the right file and line.

/// One `.cu` file of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFile {
    /// The file stem (`norm` for `kernels/norm.cu`); also its cache-file prefix.
    pub name: &'static str,
    /// The `.cu` text, without the shared headers.
    pub source: &'static str,
    /// Whether the file decodes stored weight blocks and so needs `quant.cuh`.
    pub needs_quant: bool,
}

/// `kernels/common.cuh`: half/bf16 conversions and warp reductions every file uses.
pub const COMMON: &str = include_str!("../../../../kernels/common.cuh");
/// `kernels/quant.cuh`: the per-format block decoders.
pub const QUANT: &str = include_str!("../../../../kernels/quant.cuh");

macro_rules! kernel_file {
    ($name:literal, $quant:expr) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../../kernels/", $name, ".cu")),
            needs_quant: $quant,
        }
    };
}

/// Every kernel file, in the order `strata doctor --compile-kernels` reports them.
pub const FILES: &[KernelFile] = &[
    kernel_file!("elementwise", false),
    kernel_file!("rows", false),
    kernel_file!("norm", false),
    kernel_file!("rope", false),
    kernel_file!("embedding", true),
    kernel_file!("dequant", true),
    kernel_file!("matvec", true),
    kernel_file!("matvec_packed", true),
    kernel_file!("attention", false),
    kernel_file!("sample", false),
    kernel_file!("deltanet", false),
];

/// The kernel file named `name` (its stem, e.g. `"matvec"`).
pub fn by_name(name: &str) -> Option<&'static KernelFile> {
    FILES.iter().find(|f| f.name == name)
}

/// What NVRTC compiles for `f`: `common.cuh`, then `quant.cuh` when the file needs it,
/// then the file itself, each introduced by a `#line 1 "NAME"` marker.
pub fn full_source(f: &KernelFile) -> String {
    let mut parts: Vec<(&str, &str)> = vec![("common.cuh", COMMON)];
    if f.needs_quant {
        parts.push(("quant.cuh", QUANT));
    }
    let cu_name = format!("{}.cu", f.name);
    parts.push((&cu_name, f.source));
    let mut out = String::with_capacity(parts.iter().map(|(_, s)| s.len() + 32).sum());
    for (name, text) in parts {
        out.push_str(&format!("#line 1 \"{name}\"\n"));
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The `extern "C" __global__` functions `f` defines (the symbols a launcher looks up), in
/// source order, with the macros of `common.cuh`/`quant.cuh`/the file expanded (so
/// `STRATA_BLOCK_FORMATS(MATVEC_BLOCK)` yields `matvec_q4_0`, …).
pub fn functions(f: &KernelFile) -> Vec<String> {
    kernel_names(&full_source(f))
}

/// The names of the `extern "C"` `__global__` functions declared in CUDA source `src`:
/// `extern "C" __global__ [__launch_bounds__(…)] void [__launch_bounds__(…)] NAME(`,
/// either directly after `extern "C"` or inside an `extern "C" { … }` block.
///
/// Comments are ignored and `#define`d macros expanded (object-like and function-like,
/// with `#` and `##`, arguments that name other macros, and rescanning), which is what
/// X-macro kernel families need. Conditionals (`#if…`) are not evaluated: every branch
/// counts, and a macro defined twice keeps its last definition. Templates and functions
/// without C linkage are not listed.
pub fn kernel_names(src: &str) -> Vec<String> {
    let toks = preprocess(src);
    let mut names = Vec::new();
    // One entry per open `{`: whether it opened an `extern "C"` block.
    let mut braces: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(w) if w == "extern" && matches!(toks.get(i + 1), Some(Tok::Str(s)) if s == "C") => {
                if toks.get(i + 2).is_some_and(|t| t.is('{')) {
                    braces.push(true);
                    i += 3;
                    continue;
                }
                if let Some((name, next)) = global_decl(&toks, i + 2) {
                    names.push(name);
                    i = next;
                    continue;
                }
                i += 2;
            }
            Tok::Ident(w) if w == "__global__" || w == "__launch_bounds__" => {
                let in_extern_c = braces.iter().any(|&c| c);
                match global_decl(&toks, i) {
                    Some((name, next)) => {
                        if in_extern_c {
                            names.push(name);
                        }
                        i = next;
                    }
                    None => i += 1,
                }
            }
            t if t.is('{') => {
                braces.push(false);
                i += 1;
            }
            t if t.is('}') => {
                braces.pop();
                i += 1;
            }
            _ => i += 1,
        }
    }
    names
}

/// Parses `[__global__ | __launch_bounds__(…) | static | inline]* void
/// [__launch_bounds__(…)]* NAME (` from token `i`; returns the name and the index of the
/// `(` when it is a `__global__` function.
fn global_decl(toks: &[Tok], mut i: usize) -> Option<(String, usize)> {
    let mut global = false;
    loop {
        match toks.get(i)? {
            Tok::Ident(w) if w == "__global__" => {
                global = true;
                i += 1;
            }
            Tok::Ident(w) if w == "__launch_bounds__" => i = skip_parens(toks, i + 1)?,
            Tok::Ident(w) if w == "static" || w == "inline" || w == "__forceinline__" => i += 1,
            Tok::Ident(w) if w == "void" => break,
            _ => return None,
        }
    }
    i += 1;
    while matches!(toks.get(i)?, Tok::Ident(w) if w == "__launch_bounds__") {
        i = skip_parens(toks, i + 1)?;
    }
    match (toks.get(i)?, toks.get(i + 1)?) {
        (Tok::Ident(name), open) if global && open.is('(') => Some((name.clone(), i + 1)),
        _ => None,
    }
}

/// `toks[i]` must be `(`; returns the index after its matching `)`.
fn skip_parens(toks: &[Tok], i: usize) -> Option<usize> {
    if !toks.get(i)?.is('(') {
        return None;
    }
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(i) {
        if t.is('(') {
            depth += 1;
        } else if t.is(')') {
            depth -= 1;
            if depth == 0 {
                return Some(j + 1);
            }
        }
    }
    None
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// A string literal's contents (escapes kept as written).
    Str(String),
    /// A number or character literal, as written.
    Lit(String),
    /// Punctuation: one character, or `##`.
    Punct(String),
}

impl Tok {
    fn is(&self, p: char) -> bool {
        matches!(self, Tok::Punct(s) if s.len() == p.len_utf8() && s.starts_with(p))
    }

    fn text(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::Lit(s) | Tok::Punct(s) => s.clone(),
            Tok::Str(s) => format!("\"{s}\""),
        }
    }
}

/// Limits that keep a hostile or runaway macro from exhausting memory or the stack.
const MAX_EXPANSION_DEPTH: usize = 64;
const MAX_TOKENS: usize = 4 << 20;

#[derive(Debug)]
enum Macro {
    Object(Vec<Tok>),
    /// Parameter names (`...` for a variadic tail) and body.
    Function(Vec<String>, Vec<Tok>),
}

type Macros = std::collections::HashMap<String, Macro>;

/// The code tokens of `src` (directives removed) with every `#define` expanded.
fn preprocess(src: &str) -> Vec<Tok> {
    let text = strip_comments(&src.replace("\\\r\n", "").replace("\\\n", ""));
    let mut macros = Macros::new();
    let mut code = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let Some(directive) = t.strip_prefix('#') else {
            code.extend(tokenize(line));
            continue;
        };
        // Only #define matters. Conditionals are not evaluated, so #undef is ignored too
        // (every definition counts; the last of a name wins).
        if let Some(rest) = directive.trim_start().strip_prefix("define")
            && let Some((name, m)) = parse_define(rest)
        {
            macros.insert(name, m);
        }
    }
    let mut budget = MAX_TOKENS;
    expand(&code, &macros, &mut Vec::new(), 0, &mut budget)
}

/// `NAME body` or `NAME(params) body` (the `(` right after the name).
fn parse_define(rest: &str) -> Option<(String, Macro)> {
    if !rest.starts_with(|c: char| c.is_whitespace()) {
        return None;
    }
    let rest = rest.trim_start();
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
    let (name, after) = rest.split_at(end);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    if let Some(params) = after.strip_prefix('(') {
        let close = params.find(')')?;
        let list: Vec<String> =
            params[..close].split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
        return Some((name.to_string(), Macro::Function(list, tokenize(&params[close + 1..]))));
    }
    Some((name.to_string(), Macro::Object(tokenize(after))))
}

/// Expands the macros in `toks`; `active` holds the macros being expanded (not expanded
/// again inside themselves). Stops expanding past the depth or token limits.
fn expand(toks: &[Tok], macros: &Macros, active: &mut Vec<String>, depth: usize, budget: &mut usize) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let tok = &toks[i];
        let m = match tok {
            Tok::Ident(name) if depth < MAX_EXPANSION_DEPTH && *budget > 0 && !active.contains(name) => {
                macros.get(name).map(|m| (name, m))
            }
            _ => None,
        };
        let Some((name, m)) = m else {
            out.push(tok.clone());
            i += 1;
            continue;
        };
        let (replacement, next) = match m {
            Macro::Object(body) => (body.clone(), i + 1),
            Macro::Function(params, body) => match collect_args(toks, i + 1) {
                Some((args, next)) => (substitute(body, params, &args, macros, active, depth, budget), next),
                None => {
                    // A function-like macro's name without `(` is just a name.
                    out.push(tok.clone());
                    i += 1;
                    continue;
                }
            },
        };
        *budget = budget.saturating_sub(replacement.len());
        active.push(name.clone());
        out.extend(expand(&replacement, macros, active, depth + 1, budget));
        active.pop();
        i = next;
    }
    out
}

/// The arguments of a macro call whose `(` is at `toks[i]`, split at top-level commas,
/// and the index after the `)`.
fn collect_args(toks: &[Tok], i: usize) -> Option<(Vec<Vec<Tok>>, usize)> {
    if !toks.get(i)?.is('(') {
        return None;
    }
    let mut args = vec![Vec::new()];
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(i + 1) {
        if t.is('(') {
            depth += 1;
        } else if t.is(')') {
            if depth == 0 {
                if args.len() == 1 && args[0].is_empty() {
                    args.clear();
                }
                return Some((args, j + 1));
            }
            depth -= 1;
        } else if t.is(',') && depth == 0 {
            args.push(Vec::new());
            continue;
        }
        args.last_mut()?.push(t.clone());
    }
    None
}

/// The body with parameters replaced: `#p` becomes a string, `a ## b` pastes, other
/// parameters become their macro-expanded argument.
fn substitute(
    body: &[Tok],
    params: &[String],
    args: &[Vec<Tok>],
    macros: &Macros,
    active: &mut Vec<String>,
    depth: usize,
    budget: &mut usize,
) -> Vec<Tok> {
    let arg_of = |name: &str| -> Option<Vec<Tok>> {
        if name == "__VA_ARGS__" {
            let first = params.iter().position(|p| p == "...")?;
            let rest: Vec<Vec<Tok>> = args.iter().skip(first).cloned().collect();
            return Some(rest.join(&Tok::Punct(",".into())));
        }
        let k = params.iter().position(|p| p == name)?;
        Some(args.get(k).cloned().unwrap_or_default())
    };
    let is_paste = |t: Option<&Tok>| matches!(t, Some(Tok::Punct(s)) if s == "##");
    let mut out: Vec<Tok> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let t = &body[i];
        if t.is('#')
            && let Some(Tok::Ident(p)) = body.get(i + 1)
            && let Some(arg) = arg_of(p)
        {
            out.push(Tok::Str(arg.iter().map(Tok::text).collect::<Vec<_>>().join(" ")));
            i += 2;
            continue;
        }
        if is_paste(Some(t)) {
            // Paste the last token out with the first of what follows.
            let mut right = match body.get(i + 1) {
                Some(Tok::Ident(p)) => arg_of(p).unwrap_or_else(|| vec![body[i + 1].clone()]),
                Some(other) => vec![other.clone()],
                None => Vec::new(),
            };
            if let (Some(left), false) = (out.pop(), right.is_empty()) {
                let first = right.remove(0);
                out.extend(tokenize(&(left.text() + &first.text())));
            } else if let Some(left) = out.pop() {
                out.push(left);
            }
            out.extend(right);
            i += 2;
            continue;
        }
        match t {
            Tok::Ident(p) => match arg_of(p) {
                Some(arg) if is_paste(body.get(i + 1)) => out.extend(arg),
                Some(arg) => out.extend(expand(&arg, macros, active, depth + 1, budget)),
                None => out.push(t.clone()),
            },
            _ => out.push(t.clone()),
        }
        i += 1;
    }
    out
}

/// `src` with `//` and `/* */` comments replaced by a space (a block comment keeps its
/// newlines), string and character literals left intact.
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                out.push(' ');
                let mut prev = ' ';
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                    }
                    if prev == '*' && n == '/' {
                        break;
                    }
                    prev = n;
                }
            }
            '"' | '\'' => {
                out.push(c);
                while let Some(n) = chars.next() {
                    out.push(n);
                    if n == '\\' {
                        if let Some(e) = chars.next() {
                            out.push(e);
                        }
                    } else if n == c || n == '\n' {
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Identifiers, literals and punctuation of comment-free code.
fn tokenize(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'"' || c == b'\'' {
            let start = i + 1;
            i += 1;
            while i < b.len() && b[i] != c && b[i] != b'\n' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            let text = String::from_utf8_lossy(&b[start..i.min(b.len())]).into_owned();
            toks.push(if c == b'"' { Tok::Str(text) } else { Tok::Lit(format!("'{text}'")) });
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            toks.push(Tok::Ident(src[start..i].to_string()));
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
            }
            toks.push(Tok::Lit(src[start..i].to_string()));
        } else if b[i..].starts_with(b"##") {
            toks.push(Tok::Punct("##".into()));
            i += 2;
        } else {
            // Any other character (multi-byte UTF-8 included) stands alone.
            let ch = src.get(i..).and_then(|rest| rest.chars().next());
            toks.push(Tok::Punct(ch.unwrap_or('?').to_string()));
            i += ch.map_or(1, char::len_utf8);
        }
    }
    toks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_extern_c_global_functions() {
        let src = r#"
// extern "C" __global__ void commented_out(float* x) {}
/* extern "C" __global__ void also_commented(float* x) {} */
#define LAUNCH(x) extern "C" __global__ void not_real(x)
extern "C" __global__ void add_f32(float* x, const float* y, unsigned n) {
    if (n) { x[0] += y[0]; }
}
extern "C" __global__ __launch_bounds__(256, (2)) void rms_norm_f32(const float* x) {}
extern  "C"
__launch_bounds__(1024) __global__
void argmax_f32 (const float* logits) {}
__device__ float helper(float x) { return x; }
__global__ void cxx_linkage(float* x) {}
template <int N> __global__ void templated(float* x) {}
extern "C" __device__ void device_only(float* x) {}
extern "C" {
__global__ void in_block_a(float* x) { { } }
static __global__ void in_block_b(float* x) {}
}
__global__ void after_block(float* x) {}
"#;
        assert_eq!(kernel_names(src), ["add_f32", "rms_norm_f32", "argmax_f32", "in_block_a", "in_block_b"]);
    }

    #[test]
    fn expands_x_macro_kernel_families() {
        let src = r#"
#define FORMATS(X) X(q4_0, 32) \
    X(q8_0, 32)
#define ELEMS(X) X(f32, 4u) X(f16, 2u)
#define MATVEC(NAME, QK) \
    extern "C" __global__ void __launch_bounds__(256) \
        matvec_##NAME(const unsigned char* w) { int qk = (QK); /* comment */ }
#define DEQUANT(NAME, QK) extern "C" __global__ void dequant_##NAME##_f16(float* o) {}
#define NAMED(NAME, ...) extern "C" __global__ void NAME(__VA_ARGS__) { const char* s = #NAME; }
#define LB __launch_bounds__(128)
#define KERNEL extern "C" __global__ void LB
FORMATS(MATVEC)
ELEMS(MATVEC)
FORMATS(DEQUANT)
NAMED(named_one, float* x, float* y)
KERNEL plain_via_object_macro(float* x) {}
"#;
        assert_eq!(
            kernel_names(src),
            [
                "matvec_q4_0",
                "matvec_q8_0",
                "matvec_f32",
                "matvec_f16",
                "dequant_q4_0_f16",
                "dequant_q8_0_f16",
                "named_one",
                "plain_via_object_macro"
            ]
        );
    }

    #[test]
    fn self_referential_and_runaway_macros_terminate() {
        let src = "#define A A B\n#define B A\n#define F(x) F(x) x\n#define G(x) G(G(x))\n\
                   A F(1) G(2)\nextern \"C\" __global__ void ok() {}";
        assert_eq!(kernel_names(src), ["ok"]);
        // Exponential growth stops at the token budget.
        let mut bomb = String::from("#define L0 x x\n");
        for k in 1..40 {
            bomb.push_str(&format!("#define L{k} L{} L{}\n", k - 1, k - 1));
        }
        bomb.push_str("L39\nextern \"C\" __global__ void after_bomb() {}");
        assert_eq!(kernel_names(&bomb), ["after_bomb"]);
    }

    #[test]
    fn every_file_declares_kernels_and_no_name_repeats() {
        let mut all = Vec::new();
        for f in FILES {
            let names = functions(f);
            if f.source.contains("__global__") {
                assert!(!names.is_empty(), "{}.cu declares no extern \"C\" kernel", f.name);
            }
            all.extend(names);
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a kernel name appears twice across kernels/*.cu");
    }

    #[test]
    fn tolerates_unterminated_and_odd_input() {
        assert!(kernel_names("").is_empty());
        assert!(kernel_names("extern \"C").is_empty());
        assert!(kernel_names("extern \"C\" __global__ void").is_empty());
        assert!(kernel_names("extern \"C\" __global__ __launch_bounds__(256 void f(").is_empty());
        assert!(kernel_names("/* never closed extern \"C\" __global__ void f(").is_empty());
        assert!(kernel_names("}}} extern \"C\" { é 'x' 1.5f").is_empty());
        assert_eq!(kernel_names("}} extern \"C\" __global__ void ok() {}"), ["ok"]);
    }

    #[test]
    fn full_source_prepends_the_headers_in_order() {
        let f = KernelFile { name: "x", source: "int body;", needs_quant: true };
        let s = full_source(&f);
        let (c, q, b) = (s.find("\"common.cuh\""), s.find("\"quant.cuh\""), s.find("int body;"));
        assert!(c < q && q < b && c.is_some(), "{s}");
        assert!(s.ends_with("int body;\n"));
        let plain = full_source(&KernelFile { needs_quant: false, ..f });
        assert!(!plain.contains("\"quant.cuh\"") && plain.contains("#line 1 \"x.cu\""));
    }

    #[test]
    fn every_file_is_registered_once() {
        let names: Vec<_> = FILES.iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "elementwise",
                "rows",
                "norm",
                "rope",
                "embedding",
                "dequant",
                "matvec",
                "matvec_packed",
                "attention",
                "sample",
                "deltanet"
            ]
        );
        for f in FILES {
            assert_eq!(by_name(f.name), Some(f));
            assert_eq!(f.needs_quant, matches!(f.name, "embedding" | "dequant" | "matvec" | "matvec_packed"));
        }
    }
}
