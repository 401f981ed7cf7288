#!/usr/bin/env python3
"""Streamed decode with and without the sparse FFN, run in pairs (docs/benchmarks.md,
"Sparse FFN: the feature's own figures"): on a disk whose speed drifts from run to run,
the ratio of two runs side by side says more than medians of separate runs.

    tools/bench_sparse_pairs.py MODEL [--budget 0] [--gen 64] [--pairs 10] [--setting topk=0.5]
        [--threads N] [--device cpu]

MODEL is a model converted with `strata convert … --sparse-ffn`. Each pair runs
`strata bench MODEL --memory-budget BUDGET --sparse-ffn off|SETTING --runs 1
--gen-tokens GEN --prompt-tokens 16 --json`, alternating which runs first; prints each
pair on stderr and a JSON summary (every ratio, their median, each run's decode against
its own storage reads replayed, the replays' rates, its storage-busy share, reads per
token and the kept share of groups) on stdout. On a drifting disk, run it under
`tools/steady_disk.sh` (docs/benchmarks.md, "Sparse FFN: the feature's own figures").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--strata", default=os.environ.get("STRATA_BIN", str(ROOT / "target/release/strata")))
    ap.add_argument("--budget", default="0")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--setting", default="topk=0.5")
    ap.add_argument("--threads", type=int, help="strata bench --threads (default: its own)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    extra = ["--device", args.device] + (["--threads", str(args.threads)] if args.threads else [])

    def run(setting):
        out = subprocess.run([args.strata, "bench", args.model, "--memory-budget", args.budget, "--sparse-ffn",
                              setting, "--runs", "1", "--gen-tokens", str(args.gen), "--prompt-tokens", "16",
                              "--json", *extra], capture_output=True, text=True, check=True)
        d = json.loads(out.stdout)
        of_replay[setting].append(d.get("decode_fraction_of_replay"))
        replay[setting].append(d.get("storage_replay_bytes_s"))
        busy[setting].append(d.get("storage_busy_fraction"))
        sp = d.get("sparse_ffn") or {}
        reads[setting].append(sp.get("reads_per_token"))
        kept[setting].append(sp.get("kept_fraction"))
        return d["decode_tok_s"], d["bytes_read_per_token"]

    of_replay = {"off": [], args.setting: []}
    replay = {"off": [], args.setting: []}
    busy = {"off": [], args.setting: []}
    reads = {"off": [], args.setting: []}
    kept = {"off": [], args.setting: []}
    dense, sparse, ratios, bytes_ = [], [], [], {}
    for i in range(args.pairs):
        order = ["off", args.setting] if i % 2 == 0 else [args.setting, "off"]
        got = {s: run(s) for s in order}
        dense.append(got["off"][0])
        sparse.append(got[args.setting][0])
        ratios.append(sparse[-1] / dense[-1])
        bytes_ = {s: b for s, (_, b) in got.items()}
        print(f"pair {i}: off {dense[-1]:.2f}, {args.setting} {sparse[-1]:.2f} tok/s, {ratios[-1]:.3f}x",
              file=sys.stderr, flush=True)
    print(json.dumps({"model": args.model, "budget": args.budget, "setting": args.setting, "off": dense,
                      "sparse": sparse, "ratios": ratios, "median_ratio": statistics.median(ratios),
                      "median_off": statistics.median(dense), "median_sparse": statistics.median(sparse),
                      "bytes_per_token_off": bytes_["off"], "bytes_per_token_sparse": bytes_[args.setting],
                      # Each run against its own reads replayed, and storage's busy share.
                      "of_replay_off": of_replay["off"], "of_replay_sparse": of_replay[args.setting],
                      "storage_busy_off": busy["off"], "storage_busy_sparse": busy[args.setting],
                      # The replays' rates (bytes/s): on a steady disk they agree.
                      "replay_bytes_s_off": replay["off"], "replay_bytes_s_sparse": replay[args.setting],
                      "reads_per_token_off": med(reads["off"]), "reads_per_token_sparse": med(reads[args.setting]),
                      "kept_fraction_sparse": med(kept[args.setting])}))


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


if __name__ == "__main__":
    main()
