#!/usr/bin/env python3
"""Layer streaming against the storage roofline.

Runs `strata bench --json` on each model at layer-weight budgets of 100/50/25/0% with
the pinned policy, and the two baselines at the same budgets (plain LRU; reload every
layer every token without prefetch, as AirLLM does), in interleaved rounds, and prints a
Markdown table of medians: decode tok/s, bytes read per token (Strata's count and
/proc/self/io's), hit rate, stall fraction, and the storage roofline `strata bench`
measures in the same run (the model's streamed files read sequentially with O_DIRECT,
up to 1 GiB, into a buffer of one layer's size; bytes per token / bandwidth), with the
same reads into a small 8 MiB buffer beside it.

    python3 tools/bench_streaming.py MODEL... [--rounds 3] [--gen-tokens 12] [--threads 2]
        [--configs pinned:0,pinned:25]

MODEL is anything `strata bench` takes (a .gguf, a flat directory, ...). Streamed reads
use O_DIRECT when the filesystem allows it, so the page cache is bypassed; the table says
which. Needs only the release binary (`cargo build --release`).
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "strata"

CONFIGS = [
    ("pinned", 100),
    ("pinned", 50),
    ("pinned", 25),
    ("pinned", 0),
    ("lru", 50),
    ("lru", 25),
    ("reload", 0),
]


def bench(model, budget, policy, args):
    cmd = [
        str(BIN), "bench", model, "--json",
        "--memory-budget", str(budget),
        "--stream-policy", policy,
        "--prompt-tokens", str(args.prompt_tokens),
        "--gen-tokens", str(args.gen_tokens),
        "--runs", str(args.runs),
        "--threads", str(args.threads),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", help="POLICY:PERCENT,... (default: all of CONFIGS)")
    args = ap.parse_args()
    configs = CONFIGS
    if args.configs:
        configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]

    streamable = {m: bench(m, 0, "pinned", argparse.Namespace(**{**vars(args), "gen_tokens": 1, "runs": 1}))["streamable_bytes"] for m in args.models}
    results = {}
    for r in range(args.rounds):
        for m in args.models:
            for policy, pct in configs:
                budget = streamable[m] * pct // 100
                rep = bench(m, budget, policy, args)
                results.setdefault((m, policy, pct), []).append(rep)
                print(f"round {r + 1} {Path(m).name} {policy} {pct}%: {rep['decode_tok_s']:.2f} tok/s", file=sys.stderr)

    mib = 1 << 20
    print("| model | policy | budget | resident layers | decode tok/s | MiB read/token (strata, /proc) | hit rate | stall | storage GB/s (small buffer) | storage roofline tok/s | of roofline | storage busy | of own reads replayed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (m, policy, pct), rows in results.items():
        plan = rows[-1]["plan"]
        bw = med(rows, "storage_bandwidth_bytes_s")
        small = med(rows, "storage_bandwidth_small_buffer_bytes_s")
        roof = med(rows, "storage_roofline_tok_s")
        frac = med(rows, "decode_fraction_of_storage_roofline")
        proc = med(rows, "proc_read_bytes_per_token")
        of_replay = med(rows, "decode_fraction_of_replay")
        direct = rows[-1].get("storage_direct_io")
        print(
            f"| {Path(m).name} | {policy} | {pct}% | {plan['resident_layers'] or '-'} "
            f"| {med(rows, 'decode_tok_s'):.2f} "
            f"| {med(rows, 'bytes_read_per_token') / mib:.1f}, {proc / mib if proc is not None else float('nan'):.1f} "
            f"| {med(rows, 'cache_hit_rate'):.2f} | {med(rows, 'io_stall_fraction'):.2f} "
            f"| {f'{bw / 1e9:.2f} ({small / 1e9:.2f})' + (' direct' if direct else ' buffered') if bw else '-'} "
            f"| {f'{roof:.2f}' if roof else '-'} | {f'{frac:.2f}' if frac else '-'} "
            f"| {med(rows, 'storage_busy_fraction'):.2f} | {f'{of_replay:.2f}' if of_replay else '-'} |"
        )


if __name__ == "__main__":
    main()
