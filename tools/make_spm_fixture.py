#!/usr/bin/env python3
"""SentencePiece (`tokenizer.ggml.model = "llama"`) fixture for tests/it/spm_tokenizer.rs.

How to run (from the repository root; needs sentencepiece, gguf, numpy, llama-cpp-python):

    /work/refvenv/bin/pip install sentencepiece
    /work/refvenv/bin/python tools/make_spm_fixture.py

1. Trains a small BPE SentencePiece model (byte_fallback, one user-defined symbol) on the
   corpus below, sized so that the vocabulary has exactly the 496 rows of
   tests/fixtures/gguf/llama3.gguf's embedding (any shortfall is padded with UNUSED
   `[PAD<i>]` tokens, as convert_hf_to_gguf.py pads).
2. Writes tests/fixtures/gguf/spm.gguf: llama3.gguf's metadata and tensors, with the
   tokenizer keys replaced by the SentencePiece vocabulary (tokens, scores, token types
   as convert_hf_to_gguf.py's `_set_vocab_sentencepiece` writes them).
3. Records llama.cpp's tokenization (vocab-only load) of tricky strings with
   add_bos False/True and parse_special True/False, and llama.cpp's detokenization
   (llama_detokenize, remove_special False/True, unparse_special False/True) in
   tests/fixtures/gguf/spm.llamacpp.json.
"""

import ctypes
import json
import tempfile
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import sentencepiece as spm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/gguf"
BASE = OUT / "llama3.gguf"
N_VOCAB = 496
USER_DEFINED = ["<sep>"]

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
Hello world! Hello, hello, hello again. Say hello to the world of tokenizers.
Once upon a time there was a little model that learned to read and write text.
It read books, papers and letters, and it wrote stories about the sea and the stars.
Numbers like 12345, 2024, 3.14159 and 1000000 appear in text as well as words.
Tokenization splits text into pieces; pieces are merged by their scores.
Les élèves étudient à l'école. Ça va très bien, merci beaucoup!
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München.
Привет мир, как дела? Всё хорошо.
日本語のテキストも少しあります。東京は大きな都市です。
    indented code: def main(): return 0
if x == 1: print("one") else: print("other")
a  b   c    d     e
"""


def train(tmp):
    sentences = tmp / "corpus.txt"
    sentences.write_text((CORPUS * 4).strip() + "\n", encoding="utf-8")
    prefix = tmp / "spm"
    size = N_VOCAB
    while True:
        try:
            spm.SentencePieceTrainer.train(
                input=str(sentences),
                model_prefix=str(prefix),
                model_type="bpe",
                vocab_size=size,
                byte_fallback=True,
                character_coverage=1.0,
                user_defined_symbols=USER_DEFINED,
                unk_id=0,
                bos_id=1,
                eos_id=2,
                pad_id=-1,
                add_dummy_prefix=True,
                split_digits=False,
                remove_extra_whitespaces=False,
                normalization_rule_name="identity",
                num_threads=1,
                minloglevel=2,
            )
            return spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
        except RuntimeError as e:  # "Vocabulary size is too high": shrink and pad instead
            if size <= 300:
                raise
            size -= 8
            print(f"retrying with vocab_size {size}: {str(e).splitlines()[-1][:100]}")


def sp_vocab(sp):
    """convert_hf_to_gguf.py `_set_vocab_sentencepiece`."""
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.IdToPiece(i)
        ty = gguf.TokenType.NORMAL
        if sp.IsUnknown(i):
            ty = gguf.TokenType.UNKNOWN
        elif sp.IsControl(i):
            ty = gguf.TokenType.CONTROL
        elif sp.IsUnused(i):
            ty = gguf.TokenType.UNUSED
        elif sp.IsByte(i):
            ty = gguf.TokenType.BYTE
        if piece in USER_DEFINED:
            ty = gguf.TokenType.USER_DEFINED
        tokens.append(piece)
        scores.append(sp.GetScore(i))
        types.append(ty)
    for i in range(len(tokens), N_VOCAB):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    return tokens, scores, types


def write_gguf(path, tokens, scores, types):
    r = gguf.GGUFReader(BASE)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(path, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name.startswith("tokenizer.ggml.") or name == "general.architecture":
            continue
        if name == "general.name":
            w.add_name("spm")
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    for t in r.tensors:
        data = np.array(t.data)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


STRINGS = [
    "",
    "Hello world",
    " Hello world",
    "Hello world ",
    "  leading two spaces",
    "a  b   c    d     e",
    "trailing spaces   ",
    "line one\nline two\n\n  indented\tand tab",
    "\n",
    " ",
    "Numbers 12345 and 3.14159 and 1000000",
    "Les élèves étudient à l'école. Grüße aus München!",
    "Привет мир, 日本語のテキスト",
    "Emoji 🦀🚀 and rare chars ꙮ ∰ \u00a0nbsp",
    "<s>Hello</s> world",
    "Hello <s> world</s>",
    "<s> <s>  x",
    "text with <unk> and <sep> inside",
    "<sep>after sep<sep> and <sep>",
    "</s>",
    "The quick brown fox jumps over the lazy dog.",
]


class Vocab:
    def __init__(self, path):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        params.use_extra_bufts = False  # AMX buffer types die with SIGILL in some VMs
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def tokenize(self, text, add_special, parse_special):
        raw = text.encode()
        n_max = len(raw) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, n_max, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize({text!r}) needs {-n} tokens")
        return [int(buf[i]) for i in range(n)]

    def detokenize(self, ids, remove_special, unparse_special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 * len(ids) + 64
        out = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, size, remove_special, unparse_special)
        if n < 0:
            raise RuntimeError(f"llama_detokenize({ids}) needs {-n} bytes")
        return out.raw[:n].decode("utf-8", errors="replace")

    def close(self):
        llama_cpp.llama_model_free(self.model)


def main():
    tmp = Path(tempfile.mkdtemp(prefix="strata-spm-"))
    sp = train(tmp)
    tokens, scores, types = sp_vocab(sp)
    path = OUT / "spm.gguf"
    write_gguf(path, tokens, scores, types)

    v = Vocab(path)
    cases = []
    for text in STRINGS:
        case = {"text": text}
        for add_bos in (False, True):
            for special in (False, True):
                key = f"{'bos' if add_bos else 'nobos'}_{'special' if special else 'plain'}"
                case[key] = v.tokenize(text, add_bos, special)
        case["sentencepiece"] = sp.encode(text)
        dec = {}
        for key in ("nobos_special", "bos_special"):
            ids = case[key]
            dec[key] = {
                f"remove{int(rm)}_unparse{int(un)}": v.detokenize(ids, rm, un)
                for rm in (False, True)
                for un in (False, True)
            }
        case["detokenize"] = dec
        cases.append(case)
    v.close()
    view = {
        "generator": "tools/make_spm_fixture.py",
        "llama_cpp_python": llama_cpp.__version__,
        "sentencepiece": spm.__version__,
        "file": path.name,
        "n_vocab": len(tokens),
        "sp_vocab_size": sp.vocab_size(),
        "cases": cases,
    }
    (OUT / "spm.llamacpp.json").write_text(json.dumps(view, ensure_ascii=False, indent=0) + "\n")
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes, sp vocab {sp.vocab_size()}, "
          f"json {(OUT / 'spm.llamacpp.json').stat().st_size} bytes")
    same = sum(c["sentencepiece"] == c["nobos_plain"] for c in cases)
    print(f"sentencepiece == llama.cpp (no bos, plain) for {same}/{len(cases)} strings")


if __name__ == "__main__":
    main()
