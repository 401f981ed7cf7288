#!/usr/bin/env python3
"""llama.cpp references for tests/it/llamacpp_parity.rs: tiny GGUF models of each
architecture, quantized by llama.cpp's own quantizer, with llama.cpp's per-token
log-probs, argmax and tokenization recorded next to each file.

How to run (from the repository root; needs llama-cpp-python, gguf, numpy, safetensors):

    /work/refvenv/bin/python tools/make_llamacpp_fixtures.py

Bases (F32 GGUF, converted the way tools/make_gguf_fixtures.py / convert_hf_to_gguf.py do):
    llama3, qwen2          the committed tests/fixtures/gguf/{llama3,qwen2}.gguf (reused as is)
    mistral                tests/fixtures/hf/mistral as arch `llama` (convert_hf_to_gguf.py maps
                           MistralForCausalLM to LlamaModel; llama.cpp has no sliding window there)
    qwen3                  tests/fixtures/hf/qwen3 as arch `qwen3`
    llama256               tests/fixtures/hf/llama_bf16_256 upcast to F32, first layer only: hidden
                           256 so that llama.cpp's K-quants apply (rows of 64 fall back to
                           Q5_0/Q8_0 for Q4_K/Q6_K)
Variants (llama_cpp.llama_model_quantize from the F32 base; base files not committed are
temporary):
    tests/fixtures/gguf/<model>.<variant>.gguf
    tests/fixtures/gguf/<model>[.<variant>].llamacpp.json   llama.cpp's view: tensor types,
        per prompt the token ids (llama.cpp's tokenizer), per-position log-prob of the next
        token and argmax; llama.cpp's tokenization of the reference's tricky strings.
llama.cpp runs on the CPU with an F32 KV cache (type_k = type_v = 0), no flash attention,
no extra (AMX/repacked) buffer types, 2 threads, n_ctx 64, every position's logits.
"""

import ctypes
import json
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_gguf_fixtures as mgf  # noqa: E402  (the HF -> GGUF conversion)

ROOT = mgf.ROOT
HF = mgf.HF
OUT = ROOT / "tests/fixtures/gguf"
REF = ROOT / "tests/fixtures/ref"

# llama_ftype values (llama.h)
FTYPES = {"f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_s": 14, "q4_k_m": 15, "q6_k": 18}

# model -> (reference json for prompts/tokenization, variants to commit, base path or None)
MODELS = {
    "llama3": ("llama3", [None, "f16", "q8_0", "q4_0"]),
    "qwen2": ("qwen2", [None, "f16", "q8_0", "q4_0"]),
    "mistral": ("mistral", ["f16"]),  # Q8_0/Q4_0 are covered by llama3 and qwen2; files stay small
    "qwen3": ("qwen3", ["f16"]),
    "llama256": ("llama_bf16_256", ["q4_k_s", "q6_k", "q4_k_m"]),
}


def quantize(src, dst, ftype):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, ftype {ftype}) returned {rc}")


def tensor_types(path):
    r = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in r.tensors}


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _no_extra_buffer_types():
    """llama.cpp's model defaults with `use_extra_bufts` off: the AMX buffer type (chosen
    for Q4_0/Q8_0 on CPUs reporting AMX) dies with SIGILL where the kernel has not enabled
    AMX tile state, as in the VM these fixtures were made in."""
    params = _default_model_params()
    params.use_extra_bufts = False
    return params


_default_model_params = llama_cpp.llama_cpp.llama_model_default_params
llama_cpp.llama_cpp.llama_model_default_params = _no_extra_buffer_types


def llama_view(path, ref, variant):
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=64,
        n_batch=64,
        n_ubatch=64,
        logits_all=True,
        type_k=0,
        type_v=0,
        flash_attn=False,
        n_threads=2,
        n_threads_batch=2,
        seed=1234,
        n_gpu_layers=0,
        verbose=False,
    )
    add_bos = bool(llm.metadata.get("tokenizer.ggml.add_bos_token") == "true")
    prompts = []
    for p in ref["prompts"]:
        ids = llm.tokenize(p["text"].encode(), add_bos=add_bos, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
        lp = log_softmax(logits)
        prompts.append({
            "text": p["text"],
            "ids": ids,
            "same_ids_as_transformers": ids == p["ids"],
            "logprobs": [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)],
            "argmax": [int(a) for a in logits.argmax(axis=-1)],
            # margin between the best and second-best logit at each position
            "top2_gap": [float(g) for g in np.diff(np.sort(logits, axis=-1)[:, -2:], axis=-1)[:, 0]],
        })
    tokenization = []
    for t in ref["tokenization"]:
        tokenization.append({
            "text": t["text"],
            "special": llm.tokenize(t["text"].encode(), add_bos=False, special=True),
            "no_special": llm.tokenize(t["text"].encode(), add_bos=False, special=False),
        })
    n_vocab = llm.n_vocab()
    del llm
    return {
        "generator": "tools/make_llamacpp_fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        "gguf_py": getattr(gguf, "__version__", None),
        "file": path.name,
        "variant": variant or "f32",
        "n_vocab": n_vocab,
        "add_bos": add_bos,
        "tensor_types": tensor_types(path),
        "prompts": prompts,
        "tokenization": tokenization,
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="strata-llamacpp-"))
    bases = {
        "llama3": OUT / "llama3.gguf",
        "qwen2": OUT / "qwen2.gguf",
    }
    mgf.convert(HF / "mistral", "llama", "gpt-2", tmp / "mistral.gguf")
    bases["mistral"] = tmp / "mistral.gguf"
    mgf.convert(HF / "qwen3", "qwen3", "qwen2", tmp / "qwen3.gguf")
    bases["qwen3"] = tmp / "qwen3.gguf"
    mgf.convert(HF / "llama_bf16_256", "llama", "gpt-2", tmp / "llama256.gguf", max_layers=1)
    bases["llama256"] = tmp / "llama256.gguf"

    for model, (ref_name, variants) in MODELS.items():
        ref = json.loads((REF / f"{ref_name}.json").read_text())
        for variant in variants:
            if variant is None:
                path = bases[model]
            else:
                path = OUT / f"{model}.{variant}.gguf"
                quantize(bases[model], path, FTYPES[variant])
            view = llama_view(path, ref, variant)
            view["model"] = model
            view["reference"] = f"tests/fixtures/ref/{ref_name}.json"
            stem = path.name[: -len(".gguf")]
            (OUT / f"{stem}.llamacpp.json").write_text(json.dumps(view, ensure_ascii=False, separators=(",", ":")) + "\n")
            kinds = sorted(set(view["tensor_types"].values()))
            same = all(p["same_ids_as_transformers"] for p in view["prompts"])
            print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {path.stat().st_size} bytes, "
                  f"types {kinds}, prompt ids as transformers: {same}")


if __name__ == "__main__":
    main()
