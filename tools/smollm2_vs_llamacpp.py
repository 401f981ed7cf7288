#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (or any GGUF chat model) against llama.cpp: log-probabilities on
real text, and greedy chat replies, on the same token ids.

    python3 tools/smollm2_vs_llamacpp.py MODEL.gguf [--tokens 1024] [--windows 32]
        [--chat-tokens 64] [--control] [--strata target/release/strata]

Needs llama-cpp-python (the reference stack, tools/requirements-ref.txt), jinja2 and numpy.
llama.cpp runs at its default settings except an F32 KV cache and every position's logits.

Perplexity: the text is Python's `pydoc_data.topics` (all topics), tokenized by llama.cpp
(the script checks `strata tokenize` gives the same ids) and cut into `--windows`
consecutive windows of `--tokens` ids, each scored from an empty context by both
(`strata perplexity --tokens-file`); `--windows 1` is the first 1024 tokens alone. Prints
both perplexities, their relative difference with its standard error, top-1 agreement and
the mean and max |Δ log-probability|.

Why the standard error matters: llama.cpp quantizes activations to 8 bits before every
quantized matmul, so a difference of one float ulp anywhere upstream flips a rounding
somewhere, and the flips cascade through the layers. Any two correct implementations (even
llama.cpp with and without flash attention, `--control`) end up with independent rounding
noise: |Δ log-prob| ≈ 0.06 per token and a perplexity difference of about ±0.3% (1 s.e.)
over 1024 tokens, shrinking as 1/√tokens (±0.05% over the default 32 × 1024).

Chat: five prompts are rendered with the model's chat template and tokenized by llama.cpp
(special tokens parsed); both generate `--chat-tokens` tokens greedily from those ids
(Strata through `strata serve`'s Ollama API, whose returned `context` is checked to start
with exactly those ids). Prints whether the generated ids are identical, and otherwise the
first divergence with llama.cpp's logit margin between its token and Strata's there.
`--control` also runs everything with llama.cpp's flash attention against plain llama.cpp.
"""

import argparse
import json
import math
import socket
import subprocess
import tempfile
import time
import urllib.request

import jinja2
import numpy as np
import pydoc_data.topics
from llama_cpp import Llama, llama_cpp

CHAT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the sea.",
    "Explain what a hash table is to a beginner.",
    "Give me three tips for sleeping better.",
    "How do I reverse a list in Python?",
]


def log_probs(logits, ids):
    """log p(ids[i+1] | ids[..=i]) from a [len(ids), vocab] array of logits."""
    logits = np.asarray(logits, dtype=np.float64)
    top = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    return logits[np.arange(len(ids) - 1), ids[1:]] - lse[:-1]


def llamacpp_windows(llm, windows):
    """Per window: (log-probs, argmax) from one llama.cpp pass over an empty context."""
    out = []
    for w in windows:
        llm.reset()
        llm.eval(w)
        logits = np.array(llm.scores[: len(w)], dtype=np.float64)
        out.append((log_probs(logits, np.array(w)), logits.argmax(1)))
    return out


def strata_windows(strata, model, windows):
    out = []
    for w in windows:
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(w, f)
            f.flush()
            got = json.loads(subprocess.run([strata, "perplexity", model, "--tokens-file", f.name, "--json", "--kv-type", "f32",
                                             "--device", "cpu"], capture_output=True, text=True, check=True).stdout)
        out.append((np.array(got["logprobs"]), np.array(got["argmax"])))
    return out


def compare(name, ref, got):
    """Prints `got` (per-window results) against `ref` over all windows."""
    lr = np.concatenate([r[0] for r in ref])
    lg = np.concatenate([g[0] for g in got])
    agree = np.mean(np.concatenate([r[1] == g[1] for r, g in zip(ref, got)]))
    d = lg - lr
    ppl_r, ppl_g = math.exp(-lr.mean()), math.exp(-lg.mean())
    # The relative difference is about −mean(d). Its standard error from the spread of the
    # window means where there are enough windows (tokens of one window may be correlated),
    # else from the per-token spread.
    means = [g[0].mean() - r[0].mean() for r, g in zip(ref, got)]
    se = 100 * (np.std(means, ddof=1) / math.sqrt(len(means)) if len(means) >= 8 else d.std() / math.sqrt(len(d)))
    rel = 100 * (ppl_g / ppl_r - 1)
    print(f"perplexity: {name} {ppl_g:.4f}, llama.cpp {ppl_r:.4f} ({rel:+.3f}% ± {se:.3f}% s.e.)")
    print(f"top-1 agreement {agree:.4f}; |Δ log-prob| mean {np.abs(d).mean():.4f}, max {np.abs(d).max():.4f}")


def llamacpp_greedy(llm, ids, n):
    """Greedy continuation of `ids`: the generated ids (ending with an end-of-generation
    token if one came) and the logits before each of them."""
    vocab = llm._model.vocab
    llm.reset()
    llm.eval(ids)
    toks, logits = [], []
    for _ in range(n):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        t = int(row.argmax())
        toks.append(t)
        logits.append(row)
        if llama_cpp.llama_vocab_is_eog(vocab, t):
            break
        llm.eval([t])
    return toks, logits


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def strata_greedy(port, ids, tail, n):
    """Greedy continuation of `ids` through `strata serve`'s Ollama API. The API takes a
    `context` of ids plus a text prompt, so the last id goes in as its text `tail` (the
    rendered chat prompt ends in a plain newline); the returned context must start with
    exactly `ids`."""
    body = {"model": "m", "context": ids[:-1], "prompt": tail, "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": n, "repeat_penalty": 1.0}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        ctx = json.loads(r.read())["context"]
    if ctx[: len(ids)] != ids:
        raise SystemExit(f"strata's prompt ids differ from llama.cpp's: {ctx[: len(ids)]} vs {ids}")
    return ctx[len(ids):]


def chat(llm, strata, model, n, control):
    tpl = jinja2.Environment(loader=jinja2.BaseLoader()).from_string(llm.metadata["tokenizer.chat_template"])
    prompts = []
    for p in CHAT_PROMPTS:
        text = tpl.render(messages=[{"role": "user", "content": p}], add_generation_prompt=True,
                          bos_token="", eos_token="")
        prompts.append(llm.tokenize(text.encode(), add_bos=False, special=True))
    ref = [llamacpp_greedy(llm, ids, n) for ids in prompts]

    port = free_port()
    server = subprocess.Popen([strata, "serve", "-m", f"m={model}", "--port", str(port), "--device", "cpu"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit("strata serve exited")
                time.sleep(0.2)
        got = [strata_greedy(port, ids, llm.detokenize(ids[-1:]).decode(), n) for ids in prompts]
    finally:
        server.terminate()
        server.wait()
    report_chat("strata", llm, prompts, ref, got)
    if control:
        fa = Llama(model_path=model, n_ctx=llm.n_ctx(), logits_all=True, verbose=False, type_k=0, type_v=0,
                   flash_attn=True)
        got = [llamacpp_greedy(fa, ids, n)[0] for ids in prompts]
        report_chat("llama.cpp (flash attention)", llm, prompts, ref, got)


def report_chat(name, llm, prompts, ref, got):
    same = 0
    for i, ((want, logits), have) in enumerate(zip(ref, got)):
        if want == have:
            same += 1
            print(f"chat {i}: identical ({len(want)} tokens, {len(prompts[i])} prompt tokens)")
            continue
        j = next((k for k, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        if j >= min(len(want), len(have)):
            print(f"chat {i}: same first {j} tokens, then one stops ({len(want)} vs {len(have)} tokens)")
            continue
        a, b = want[j], have[j]
        margin = logits[j][a] - logits[j][b]
        print(f"chat {i}: first divergence at generated token {j}: llama.cpp {a} {llm.detokenize([a])!r}, "
              f"{name} {b} {llm.detokenize([b])!r}; llama.cpp's logit margin there {margin:.4f}")
    print(f"greedy chat, {name} vs llama.cpp: {same}/{len(ref)} identical")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per window")
    ap.add_argument("--windows", type=int, default=32, help="consecutive windows of the text to score")
    ap.add_argument("--chat-tokens", type=int, default=64, help="greedy tokens per chat reply (0: skip)")
    ap.add_argument("--control", action="store_true", help="also compare llama.cpp with flash attention")
    ap.add_argument("--strata", default="target/release/strata")
    a = ap.parse_args()

    text = "\n\n".join(pydoc_data.topics.topics.values())
    llm = Llama(model_path=a.model, n_ctx=max(2048, a.tokens), logits_all=True, verbose=False,
                type_k=0, type_v=0)
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
    if a.windows * a.tokens > len(ids):
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {a.windows} × {a.tokens}")
    ids = ids[: a.windows * a.tokens]
    windows = [ids[i: i + a.tokens] for i in range(0, len(ids), a.tokens)]

    tok = json.loads(subprocess.run([a.strata, "tokenize", a.model, "-", "--json", "--special"], input=text,
                                    capture_output=True, text=True, check=True).stdout)["ids"]
    print(f"tokenization: {'identical' if tok[: len(ids)] == ids else 'DIFFERENT'} on {len(ids)} tokens"
          f" ({a.windows} windows of {a.tokens})")
    ref = llamacpp_windows(llm, windows)
    compare("strata", ref, strata_windows(a.strata, a.model, windows))
    if a.control:
        fa = Llama(model_path=a.model, n_ctx=max(2048, a.tokens), logits_all=True, verbose=False,
                   type_k=0, type_v=0, flash_attn=True)
        compare("llama.cpp (flash attention)", ref, llamacpp_windows(fa, windows))
        del fa
    if a.chat_tokens > 0:
        chat(llm, a.strata, a.model, a.chat_tokens, a.control)


if __name__ == "__main__":
    main()
