#!/usr/bin/env python3
"""Writes tests/fixtures/vocab/llamacpp_eog.json: for every vocabulary in llama.cpp's
models/ directory, the ids llama.cpp ends generation at (`llama_vocab_is_eog`) and its
fill-in-the-middle tokens (`llama_vocab_fim_pre` ... `llama_vocab_fim_sep`).
tests/it/llamacpp_vocab.rs checks Strata's against it.

    pip install llama-cpp-python==0.3.36
    python tools/make_eog_fixture.py path/to/llama_cpp_python-0.3.36/vendor/llama.cpp/models
"""

import json
import sys
from pathlib import Path

import llama_cpp

LLAMA_CPP_PYTHON = "0.3.36"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vocab" / "llamacpp_eog.json"
FIM = ["pre", "suf", "mid", "pad", "rep", "sep"]


def main() -> None:
    assert llama_cpp.__version__ == LLAMA_CPP_PYTHON, llama_cpp.__version__
    models = Path(sys.argv[1])
    out = {"generator": "tools/make_eog_fixture.py", "llama_cpp_python": LLAMA_CPP_PYTHON, "vocabs": {}}
    for path in sorted(models.glob("ggml-vocab-*.gguf")):
        name = path.name[len("ggml-vocab-") : -len(".gguf")]
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        eog = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        fim = {}
        for role in FIM:
            t = getattr(llama_cpp, f"llama_vocab_fim_{role}")(vocab)
            fim[role] = None if t < 0 else t
        out["vocabs"][name] = {"eog": eog, "fim": fim}
        print(name, eog, fim, file=sys.stderr)
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
