#!/usr/bin/env python3
"""Decode speed of a GGUF model (SmolLM2-135M-Instruct Q4_1, say) in Strata and in
llama.cpp at its default settings, interleaved round by round, same thread count.

    python3 tools/smollm2_decode_vs_llamacpp.py MODEL.gguf [--strata target/release/strata]...
        [--rounds 3] [--threads 2] [--tokens 128] [--prompt-tokens 16]

llama.cpp (llama-cpp-python, defaults but the thread count) evaluates a 16-token prompt,
then `--tokens` single tokens, timed; Strata runs `strata bench --feed-random` with the
same counts (its argmax on each step included). Prints each round and the medians.
`--strata` may be given several times (builds to compare, each run every round).
`--prompt-tokens 1` feeds llama.cpp single tokens only: on VMs where its AMX path dies
with SIGILL on multi-token batches, decode still runs at its defaults. Needs
llama-cpp-python.
"""

import argparse
import json
import statistics
import subprocess
import time

import llama_cpp


def llamacpp(model, threads, tokens, prompt_tokens):
    llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_ctx=512, verbose=False)
    prompt = llm.tokenize(b"The history of the Roman empire, told", add_bos=True)[:prompt_tokens]
    llm.reset()
    llm.eval(prompt)
    for _ in range(8):  # warm-up
        llm.eval([1000])
    llm.reset()
    llm.eval(prompt)
    t0 = time.perf_counter()
    for i in range(tokens):
        llm.eval([(i * 7919) % (llm.n_vocab() - 200) + 100])
    return tokens / (time.perf_counter() - t0)


def strata(binary, model, threads, tokens, prompt_tokens):
    out = subprocess.run([binary, "bench", model, "--device", "cpu", "--threads", str(threads), "--prompt-tokens",
                          str(prompt_tokens), "--gen-tokens", str(tokens), "--runs", "1", "--json", "--feed-random"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--strata", action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    args = ap.parse_args()
    binaries = args.strata or ["target/release/strata"]
    a, b = [], {s: [] for s in binaries}
    for r in range(args.rounds):
        a.append(llamacpp(args.model, args.threads, args.tokens, args.prompt_tokens))
        for s in binaries:
            b[s].append(strata(s, args.model, args.threads, args.tokens, args.prompt_tokens))
        runs = ", ".join(f"strata {s} {v[-1]:.1f}" for s, v in b.items())
        print(f"round {r + 1}: llama.cpp {a[-1]:.1f} tok/s, {runs}", flush=True)
    ma = statistics.median(a)
    print(f"median: llama.cpp {ma:.1f} tok/s")
    for s, v in b.items():
        mb = statistics.median(v)
        print(f"median: strata {s} {mb:.1f} tok/s, strata / llama.cpp {mb / ma:.2f}")


if __name__ == "__main__":
    main()
