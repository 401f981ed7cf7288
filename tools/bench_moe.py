#!/usr/bin/env python3
"""Mixture-of-experts streaming against the storage roofline and the routed-experts limit.

Runs `strata bench --json --feed-random` on a MoE model at `--memory-budget 0` (every
layer core streams through the prefetch ring) with expert caches of 0, 10% and 25% of
all experts, and the baseline that loads every expert of every layer with its layer
(`--experts all`), in interleaved rounds, and prints a Markdown table of medians:
decode tok/s, bytes read per token (cores and experts apart), the routed-experts-only
limit (cores + the experts the routers chose, from the routing taken in the run),
expert hit rate, stall, and the storage roofline `strata bench` measures in the same run
(the model file read sequentially with O_DIRECT into expert-sized buffers, before and
after the runs, at 1 and 8 reads in flight, each probe the median of five passes over
bytes no other pass reads, the best probe counting; bytes per token / bandwidth).

    python3 tools/bench_moe.py MODEL [--rounds 3] [--gen-tokens 16] [--threads 2]
        [--configs 0,10,25,all] [--policy freq] [--device cpu|cuda:0]

MODEL: e.g. the Qwen3-30B-A3B-shaped file `tools/make_moe_bench_model.py` writes.
`--feed-random` feeds each decode step a pseudo-random token: random weights decoded
greedily repeat a few tokens, which would route to the same few experts and flatter the
cache (random tokens still route as the model's random routers are skewed; the table's
hit rates show how much). Needs only the
release binary (`cargo build --release`), or the one `STRATA_BIN` names.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("STRATA_BIN", ROOT / "target" / "release" / "strata"))


def bench(model, config, args):
    cmd = [str(BIN), "bench", model, "--json", "--feed-random", "--runs", "1", "--memory-budget", "0",
           "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
           "--threads", str(args.threads), "--expert-policy", args.policy, "--device", args.device]
    if config == "all":
        cmd += ["--experts", "all"]
    else:
        cmd += ["--expert-cache", f"{config}%"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="0,10,25,all")
    ap.add_argument("--policy", default="freq")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    configs = args.configs.split(",")
    runs = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            d = bench(args.model, c, args)
            runs[c].append(d)
            print(f"round {r + 1} {c}: {d['decode_tok_s']:.2f} tok/s", file=sys.stderr)

    med = statistics.median
    mib = 1 << 20
    first = runs[configs[0]][0]
    print(f"model `{Path(args.model).name}`, {first['device_name']}, {args.threads} threads, "
          f"{args.rounds} interleaved rounds of {args.gen_tokens} decode tokens after a "
          f"{args.prompt_tokens}-token prompt; policy {args.policy}\n")
    print("| experts | decode tok/s | read MiB/token (cores + experts) | routed-only limit MiB/token | read / limit "
          "| expert hit rate | stall | storage busy | storage GB/s (depth) | storage roofline tok/s | of roofline "
          "| own reads replayed GB/s | of replay |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        rs = runs[c]
        tok = med([d["decode_tok_s"] for d in rs])
        read = med([d["bytes_read_per_token"] for d in rs]) / mib
        bw = med([d["storage_bandwidth_bytes_s"] for d in rs])
        depth = sorted({d["storage_queue_depth"] for d in rs})
        roof = med([d["storage_roofline_tok_s"] for d in rs])
        frac = med([d["decode_fraction_of_storage_roofline"] for d in rs])
        stall = med([d["io_stall_fraction"] for d in rs])
        busy = med([d["storage_busy_fraction"] for d in rs])
        replay = med([d["storage_replay_bytes_s"] for d in rs])
        of_replay = med([d["decode_fraction_of_replay"] for d in rs])
        if c == "all":
            label, split, limit, ratio, hit = "all, with their layer", f"{read:.1f}", "-", "-", "-"
        else:
            m = [d["moe"] for d in rs]
            core = med([x["core_bytes_per_token"] for x in m]) / mib
            exp = med([x["expert_bytes_per_token"] for x in m]) / mib
            limit = f"{med([x['routed_limit_bytes_per_token'] for x in m]) / mib:.1f}"
            ratio = f"{med([x['fraction_of_routed_limit'] for x in m]):.3f}"
            hit = f"{med([x['expert_hit_rate'] for x in m]):.3f}"
            label, split = f"routed, cache {c}%", f"{read:.1f} ({core:.1f} + {exp:.1f})"
        print(f"| {label} | {tok:.2f} | {split} | {limit} | {ratio} | {hit} | {100 * stall:.0f}% | {100 * busy:.0f}% "
              f"| {bw / 1e9:.2f} ({'/'.join(map(str, depth))}) | {roof:.2f} | {100 * frac:.0f}% "
              f"| {replay / 1e9:.2f} | {100 * of_replay:.0f}% |")


if __name__ == "__main__":
    main()
