#!/usr/bin/env python3
"""Writes tests/fixtures/vocab/llamacpp_strings.json: llama.cpp's token ids for our own
texts (code, several scripts, emoji with ZWJ sequences, whitespace runs, long digit runs,
special-token texts), for every vocabulary in llama.cpp's models/ directory and for
variants of them with other tokenizer metadata (each pre-tokenizer type llama.cpp knows
that no file there uses, other normalizer settings, and `hybriddna` vocabularies made by
adding DNA tokens to llama-bpe). tests/it/llamacpp_vocab.rs checks
Strata against it, applying the same metadata changes to the same files.

The reference is llama-cpp-python 0.3.36 (its vendored llama.cpp and the ggml-vocab-*.gguf
files of its sdist, which tools/llamacpp_vocab.sh downloads):

    pip install llama-cpp-python==0.3.36 gguf numpy
    python tools/make_vocab_fixtures.py path/to/llama_cpp_python-0.3.36/vendor/llama.cpp/models

Ids are taken as `llama_tokenize(text, add_special, parse_special=True)`: Strata's
`encode` always recognises special tokens written in the text.
"""

import itertools
import json
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp

LLAMA_CPP_PYTHON = "0.3.36"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vocab" / "llamacpp_strings.json"

TEXTS = [
    "",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * 2).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    "def f(a, b=3):\n    return a**b  # power\n\n\n",
    "我们今天去公园散步吧。東京タワーは高い！한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥",
    "नमस्ते दुनिया! यह एक परीक्षण है।",
    "Привет, МирДруг! ПРИВЕТ мир. ЁЖИК",
    "Family: \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466, flags \U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5, "
    "skin \U0001F44D\U0001F3FD, heart \u2764\uFE0F\u200D\U0001F525",
    "a  b   c\t\td\n\n\ne \r\n f    \n    g",
    "   leading and trailing   ",
    "1234567890123 and 3.14159 and 1,000,000 and \u0663\u0664\u0665\u0666\u0667 x12y345",
    "Hello w\u00f6rld! \u00c7a va? na\u00efve caf\u00e9 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \U0001D518\U0001D52B",
    "I'M don't WE'LL they'Re it's O'Neil's",
    "https://example.com/p?q=1&r=[2] <tag a=\"v\"> $100 + 50% = ~ ^_^ | `code`",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u1797\u17b6\u179f\u17b6\u1781\u17d2\u1798\u17c2\u179a "
    "\u0e9e\u0eb2\u0eaa\u0eb2\u0ea5\u0eb2\u0ea7",
    "e\u0301 a\u0308 n\u0303 Z\u0351\u0354 \u00c5\u212b \ufb01 \u2460 \u00bd",
    "\u00a0nbsp\u2003em\u3000ideo\u200bzw\u0085nel\u2028ls\u00ad\ue000pua",
    "\n",
    "\n\n\n",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "abc123def4567ghi 12ab 9x 2024-05-06T12:34:56Z",
    "<s>hi</s> <|endoftext|> [CLS] x [SEP] <mask> <unk> <|im_start|>user\nyo<|im_end|> <start_of_turn>",
]
# Texts also tokenized with the vocabulary's start/end tokens added.
SPECIAL_TEXTS = ["", "Hello world", "  two  spaces "]

# Every vocabulary file llama.cpp ships, and variants: (name, base file, metadata changes).
BASES = [
    "aquila", "baichuan", "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4",
    "gpt-2", "gpt-neox", "llama-bpe", "llama-spm", "mpt", "nomic-bert-moe", "phi-3", "qwen2", "qwen35",
    "refact", "starcoder",
]
BPE_PRES = [
    "minicpm5", "jais-2", "dbrx", "chatglm-bpe", "glm4", "deepseek-v3", "spark2_5", "youtu", "stablelm2",
    "poro-chat", "viking", "tekken", "exaone-moe", "chameleon", "gpt-4o", "granite-embed-multi-97m", "tiny_aya",
    "superbpe", "bailingmoe", "seed-coder", "kimi-k2", "ufakzeka", "afmoe", "laguna", "jina-v2-code", "default",
]
VARIANTS = [(f"pre={p}", "llama-bpe", {"tokenizer.ggml.pre": p}) for p in BPE_PRES] + [
    ("pre=sarvam-moe", "gemma-4", {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "sarvam-moe"}),
    ("pre=granite-embed-multi-311m", "gemma-4", {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "granite-embed-multi-311m"}),
    ("model=whitespace", "llama-bpe", {"tokenizer.ggml.model": "whitespace", "tokenizer.ggml.pre": "whitespace"}),
    ("bert cased", "bert-bge", {"tokenizer.ggml.normalizer.lowercase": False}),
    ("bert no accent stripping", "bert-bge", {"tokenizer.ggml.normalizer.strip_accents": False}),
    ("t5 keeps whitespace", "nomic-bert-moe", {"tokenizer.ggml.remove_extra_whitespaces": False}),
    ("t5 no space prefix", "nomic-bert-moe", {"tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.remove_extra_whitespaces": False}),
    ("spm no space prefix", "llama-spm", {"tokenizer.ggml.add_space_prefix": False}),
    ("model=plamo2", "llama-spm", {"tokenizer.ggml.model": "plamo2"}),
]
VALUE_TYPES = {bool: gguf.GGUFValueType.BOOL, str: gguf.GGUFValueType.STRING}

# `hybriddna` vocabularies: llama-bpe with `<dna>`, `</dna>`, `<oov>` (token types given)
# and then every 6-mer over KMER_ALPHABET (itertools.product order) with llama.cpp's k-mer
# marker suffix, as normal tokens. Each is checked on DNA_TEXTS with parse_special on
# ("dna_ids") and off ("dna_ids_plain"), and on TEXTS like the other variants.
KMER_MARKER = "\ue000"
KMER_ALPHABET = "ACGT"
NORMAL, CONTROL = 1, 3
DNA_VARIANTS = [
    ("model=hybriddna", [("<dna>", NORMAL), ("</dna>", NORMAL), ("<oov>", NORMAL)]),
    ("model=hybriddna control tags", [("<dna>", CONTROL), ("</dna>", CONTROL), ("<oov>", CONTROL)]),
    ("model=hybriddna without <oov>", [("<dna>", NORMAL), ("</dna>", NORMAL)]),
]
DNA_TEXTS = [
    "<dna>ACGTACGGTTAA</dna>",
    "hello <dna>acgtacGGTTAa</dna> world",
    "<dna>ACGTNNACGTAC</dna>",
    "<dna>ACGTACGT</dna>",
    "x <dna>ACGTACGTA",
    "<dna></dna><dna>ACG</dna>tail</dna> <dna>",
    "<dna>AC GT\nacgtac</dna>",
    "<dna>ACGTA\u00e9</dna>",
    "plain text ACGTAC CCCCCC",
    "<DNA>ACGTAC</DNA> <dna>ACGTAC</DNA>",
]


def dna_tokens(tags: list) -> list:
    """The (text, token type) pairs a DNA variant appends to the vocabulary."""
    kmers = ["".join(k) + KMER_MARKER for k in itertools.product(KMER_ALPHABET, repeat=6)]
    return list(tags) + [(k, NORMAL) for k in kmers]


def rewrite(src: Path, dst: Path, changes: dict, added: list = ()) -> None:
    """Copies a vocabulary-only GGUF with some metadata replaced or added, and the
    (text, token type) pairs of `added` appended to its tokens."""
    reader = gguf.GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in changes:
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [field.parts[i][0].item() for i in field.data]
            if name == "tokenizer.ggml.tokens":
                value += [t.encode() for t, _ in added]
            elif name == "tokenizer.ggml.token_type":
                value += [k for _, k in added]
            elif name == "tokenizer.ggml.scores":
                value += [0.0 for _ in added]
            writer.add_key_value(name, value, vtype, sub)
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[-1]), vtype)
        else:
            writer.add_key_value(name, field.parts[-1][0].item(), vtype)
    for name, value in changes.items():
        writer.add_key_value(name, value, VALUE_TYPES[type(value)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def ids(path: Path, dna: bool = False) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tok = lambda t, add, special=True: llm.tokenize(t.encode(), add_bos=add, special=special)  # noqa: E731
    out = {
        "ids": [tok(t, False) for t in TEXTS],
        "with_special": [tok(t, True) for t in SPECIAL_TEXTS],
    }
    if dna:
        out["dna_ids"] = [tok(t, False) for t in DNA_TEXTS]
        out["dna_ids_plain"] = [tok(t, False, False) for t in DNA_TEXTS]
        out["dna_pieces"] = [
            [llm.detokenize([i]).decode("utf-8", "replace") for i in tok(t, False)] for t in DNA_TEXTS[:2]
        ]
    return out


def main() -> None:
    assert llama_cpp.__version__ == LLAMA_CPP_PYTHON, llama_cpp.__version__
    models = Path(sys.argv[1])
    cases = []
    for name in BASES:
        cases.append({"name": name, "vocab": name, "metadata": {}, **ids(models / f"ggml-vocab-{name}.gguf")})
    with tempfile.TemporaryDirectory() as tmp:
        for name, base, changes in VARIANTS:
            path = Path(tmp) / "variant.gguf"
            rewrite(models / f"ggml-vocab-{base}.gguf", path, changes)
            cases.append({"name": name, "vocab": base, "metadata": changes, **ids(path)})
            print(name, file=sys.stderr)
        for name, tags in DNA_VARIANTS:
            path = Path(tmp) / "variant.gguf"
            changes = {"tokenizer.ggml.model": "hybriddna"}
            rewrite(models / "ggml-vocab-llama-bpe.gguf", path, changes, dna_tokens(tags))
            added = {"tokens": tags, "kmer_alphabet": KMER_ALPHABET, "kmer_marker": KMER_MARKER}
            cases.append({"name": name, "vocab": "llama-bpe", "metadata": changes, "added": added, **ids(path, True)})
            print(name, file=sys.stderr)
    out = {
        "generator": "tools/make_vocab_fixtures.py",
        "llama_cpp_python": LLAMA_CPP_PYTHON,
        "texts": TEXTS,
        "special_texts": SPECIAL_TEXTS,
        "dna_texts": DNA_TEXTS,
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # One case per line keeps the file small and its diffs readable.
    lines = [json.dumps({k: v for k, v in out.items() if k != "cases"}, ensure_ascii=False)[:-1] + ', "cases": [']
    lines += [json.dumps(c, ensure_ascii=False, separators=(",", ":")) + "," for c in cases]
    lines[-1] = lines[-1][:-1]
    lines.append("]}")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
