#!/usr/bin/env python3
"""MoE experts computed by the CPU beside a GPU: Strata's `auto` plan against its own
hand-set `--n-cpu-moe N` and against llama.cpp's `-ngl 99 --n-cpu-moe N`, within a VRAM
budget.

For each budget (`--budgets 4GiB,8GiB`), on the same GGUF, in interleaved rounds:
- `strata bench MODEL --device cuda:0 --memory-budget B` (auto), and with `--n-cpu-moe N`
  for each N of `--sweep`;
- `llama-bench -m MODEL -ngl 99 --n-cpu-moe N -p P -n G` for each N whose weights on the
  GPU fit the budget (the GGUF's bytes less the routed experts of its first N MoE layers;
  llama.cpp has no VRAM budget of its own, so a larger N is how its users fit a card).

Prints one JSON object: per budget, the median decode and prefill tok/s of every
configuration, llama.cpp's and Strata's best N, the ratios the issue asks for (auto over
llama.cpp's best, auto over Strata's best N), and beside them the rates and plan auto
measured and chose (`split` of `bench --json`: h2d, the CPU's expert rate, experts per
layer in VRAM / on the CPU / uploaded / on storage).

    python3 tools/bench_split.py MODEL --strata gpu-run/bin/strata \
        --llama-bench gpu-run/llamacpp-cuda/bin/llama-bench [--budgets 4GiB,8GiB]
        [--sweep 0,8,16,24,32,40,48] [--rounds 3] [--prompt-tokens 512] [--gen-tokens 128]
        [--threads 16] [--dry-run]

MODEL: the Qwen3-30B-A3B-shaped Q4_K_M GGUF `tools/make_moe_bench_model.py` writes. Needs
gguf-py (`PYTHONPATH=gpu-run/gguf-py`) to read the GGUF's tensor sizes.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys

UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}


def size(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"`{text}` is not a size")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def layer_bytes(model):
    """(total bytes, routed expert bytes per MoE layer in order) of a GGUF."""
    from gguf import GGUFReader

    total, experts = 0, {}
    for t in GGUFReader(model).tensors:
        total += int(t.n_bytes)
        m = re.fullmatch(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight", t.name)
        if m:
            experts[int(m.group(1))] = experts.get(int(m.group(1)), 0) + int(t.n_bytes)
    return total, [experts[l] for l in sorted(experts)]


def run(cmd, dry):
    print(" ".join(cmd), file=sys.stderr)
    if dry:
        return None
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-4000:]}")
    return out.stdout


def strata(args, budget, n):
    cmd = [args.strata, "bench", args.model, "--json", "--device", "cuda:0", "--memory-budget", str(budget),
           "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
           "--threads", str(args.threads), "--runs", "1"]
    if n is not None:
        cmd += ["--n-cpu-moe", str(n)]
    out = run(cmd, args.dry_run)
    if out is None:
        return None
    r = json.loads(out)
    return {"decode": r["decode_tok_s"], "prefill": r["prefill_tok_s"], "split": r.get("split")}


def llama(args, n):
    cmd = [args.llama_bench, "-m", args.model, "-ngl", "99", "--n-cpu-moe", str(n), "-p", str(args.prompt_tokens),
           "-n", str(args.gen_tokens), "-r", "1", "-o", "json"]
    out = run(cmd, args.dry_run)
    if out is None:
        return None
    rows = json.loads(out)
    pick = lambda key: next(r["avg_ts"] for r in rows if r[key] > 0)
    return {"decode": pick("n_gen"), "prefill": pick("n_prompt")}


def medians(samples):
    return {k: statistics.median(s[k] for s in samples) for k in ("decode", "prefill")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--strata", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--budgets", default="4GiB,8GiB")
    ap.add_argument("--sweep", default="0,8,16,24,32,40,48")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args()
    budgets = [size(b) for b in args.budgets.split(",")]
    sweep = [int(n) for n in args.sweep.split(",")]
    total, per_layer = layer_bytes(args.model)
    report = {"model": args.model, "bytes": total, "moe_layers": len(per_layer), "budgets": {}}
    for budget in budgets:
        # llama.cpp's N whose GPU weights fit the budget.
        fits = [n for n in sweep if total - sum(per_layer[:n]) <= budget]
        configs = [("strata", None)] + [("strata", n) for n in sweep] + [("llama", n) for n in fits]
        samples = {c: [] for c in configs}
        for _ in range(args.rounds):
            for who, n in configs:
                got = strata(args, budget, n) if who == "strata" else llama(args, n)
                if got is not None:
                    samples[(who, n)].append(got)
        if args.dry_run:
            continue
        med = {f"{who} {'auto' if n is None else f'n_cpu_moe={n}'}": medians(s) for (who, n), s in samples.items()}
        auto = med["strata auto"]
        best = lambda who: max((m for k, m in med.items() if k.startswith(who) and "n_cpu_moe" in k),
                               key=lambda m: m["decode"], default=None)
        lbest, sbest = best("llama"), best("strata")
        report["budgets"][str(budget)] = {
            "medians": med,
            "auto_decode_over_llama_best": lbest and auto["decode"] / lbest["decode"],
            "auto_prefill_over_llama_best": lbest and auto["prefill"] / lbest["prefill"],
            "auto_decode_over_strata_best_n": sbest and auto["decode"] / sbest["decode"],
            "llama_n_fitting": fits,
            "split": samples[("strata", None)][-1]["split"],
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
