#!/usr/bin/env python3
"""Strata against llama.cpp on a TinyLlama-shaped GGUF (random weights), same threads,
runs interleaved, medians reported next to the memory bandwidth measured in the same run.

    python3 tools/make_bench_model.py /tmp/bench1b          # HF directory, BF16
    /work/refvenv/bin/python tools/bench_vs_llamacpp.py /tmp/bench1b /tmp/benchgguf \
        [--types q4_0,q8_0,q4_k_m] [--rounds 3] [--threads 2] [--gguf MODEL.gguf ...]

`--gguf` adds GGUF files as they are (SmolLM2-135M-Instruct Q4_1, say) to the table;
with `--types ''` only those run (HF_DIR and OUT are then not used).

Needs the reference stack (tools/requirements-ref.txt) plus `gguf` and `llama-cpp-python`.
Writes <out>/bench-f16.gguf, quantizes it with llama.cpp's own quantizer into
<out>/bench-<type>.gguf, then alternates `strata bench --json` and llama.cpp (after a warm-up pass, prefill of
a 128-token prompt, then decode one token at a time) for each type and prints a markdown
table: tok/s of each, their ratio, and decode as a fraction of the bandwidth roofline.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf_fixtures import convert  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FTYPES = {"q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q6_k": 18, "q4_k_s": 14}


def quantize(src, dst, ftype, threads):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed for {dst}")


def no_extra_buffer_types():
    """llama.cpp's model defaults with `use_extra_bufts` off. Its AMX buffer type (picked
    for Q4_0/Q8_0 on CPUs that report AMX) dies with SIGILL in VMs whose kernel has not
    enabled AMX tile state; turning extra buffer types off also turns off its repacked
    Q4_0/Q4_K layouts, so on such machines llama.cpp runs its plain CPU kernels."""
    import llama_cpp

    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_cpp.llama_model_default_params = params


def llamacpp_run(path, prompt, gen, threads):
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=len(prompt) + gen + 8, n_batch=len(prompt), n_threads=threads,
                n_threads_batch=threads, verbose=False)
    # Warm-up (as llama-bench and `strata bench` do): the first pass over the mapped
    # weights pays their page faults.
    llm.eval(prompt[:8])
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t)
    t = time.perf_counter()
    # Decode cost does not depend on which token is fed: replay prompt ids.
    for i in range(gen):
        llm.eval([prompt[i % len(prompt)]])
    decode = gen / (time.perf_counter() - t)
    del llm
    return prefill, decode


def strata_run(path, prompt_tokens, gen, threads):
    exe = ROOT / "target/release/strata"
    env = dict(os.environ)
    out = subprocess.run([str(exe), "bench", str(path), "--threads", str(threads), "--prompt-tokens",
                          str(prompt_tokens), "--gen-tokens", str(gen), "--runs", "1", "--json"],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--types", default="q4_0,q8_0,q4_k_m")
    ap.add_argument("--gguf", type=Path, action="append", default=[], help="a GGUF file to add, as it is")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--llamacpp-extra-bufts", action="store_true",
                    help="(the default now; kept so older commands still run)")
    ap.add_argument("--no-llamacpp-extra-bufts", action="store_true",
                    help="turn off llama.cpp's extra buffer types (AMX, repacked layouts), for VMs where its "
                         "AMX path dies with SIGILL; the result is then not a comparison at llama.cpp's "
                         "default settings and must not be reported as one")
    args = ap.parse_args()
    if args.no_llamacpp_extra_bufts:
        no_extra_buffer_types()
    types = [t for t in args.types.split(",") if t]
    models = []
    if types:
        args.out.mkdir(parents=True, exist_ok=True)
        f16 = args.out / "bench-f16.gguf"
        if not f16.exists():
            convert(args.hf_dir, "llama", "gpt-2", f16, f16=True)
        for name in types:
            path = args.out / f"bench-{name}.gguf"
            if not path.exists():
                quantize(f16, path, FTYPES[name], args.threads)
            models.append((name, path))
    models += [(g.stem, g) for g in args.gguf]
    rng = np.random.default_rng(0)
    # Ids every vocabulary here has (SmolLM2's is 49152).
    prompt = [int(t) for t in rng.integers(300, 30000, args.prompt_tokens)]
    rows = []
    m = statistics.median
    for name, path in models:
        lp, ld = [], []
        x = {"sp": [], "sd": [], "bw": [], "roof": []}
        for _ in range(args.rounds):
            p, d = llamacpp_run(path, prompt, args.gen_tokens, args.threads)
            lp.append(p), ld.append(d)
            s = strata_run(path, args.prompt_tokens, args.gen_tokens, args.threads)
            x["sp"].append(s["prefill_tok_s"]), x["sd"].append(s["decode_tok_s"])
            x["bw"].append(s["mem_bandwidth_bytes_s"]), x["roof"].append(s["decode_roofline_tok_s"])
        rows.append((name, m(x["sp"]), m(lp), m(x["sd"]), m(ld), m(x["bw"]) / 1e9, m(x["roof"]), path.stat().st_size))
        print(json.dumps({"type": name, "strata_prefill": x["sp"], "llamacpp_prefill": lp,
                          "strata_decode": x["sd"], "llamacpp_decode": ld, "bandwidth": x["bw"]}), file=sys.stderr)
    print("| type | file | prefill Strata | prefill llama.cpp | ratio | decode Strata "
          "| decode llama.cpp | ratio | bandwidth | decode roofline | Strata / roofline | llama.cpp / roofline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, sp, lp, sd, ld, bw, roof, size in rows:
        print(f"| {name} | {size / 1e9:.2f} GB | {sp:.1f} | {lp:.1f} | {sp / lp:.2f} | {sd:.2f} | {ld:.2f} | "
              f"{sd / ld:.2f} | {bw:.1f} GB/s | {roof:.1f} | {sd / roof:.2f} | {ld / roof:.2f} |")

if __name__ == "__main__":
    main()
