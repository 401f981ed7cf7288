#!/usr/bin/env python3
"""Issue 16's benchmark: streamed decode on a GPU against min(storage, H2D) and against a
reload-every-layer baseline (docs/gpu.md, item 8).

    python3 tools/bench_tiers.py STRATA_BIN MODEL [MODEL ...] [--device cuda:0]
                                 [--rounds 5] [--gen-tokens 64] [--json OUT]

For each model, at VRAM budgets of 0 and 25% of its layer bytes, interleaved round by
round (A B C D, A B C D, ...), one `strata bench --json --runs 1` each of:
- `host`: every streamed layer in the host tier (page-locked RAM);
- `disk`: no host tier, read with O_DIRECT (bypassing the page cache), GPUDirect
  Storage where cuFile opens;
- `disk-nogds`: the same with `STRATA_GDS=off` (page-locked staging and the copy engine);
- `reload`: the baseline, `--stream-policy reload --prefetch-depth 0` (every layer read
  and copied tensor by tensor from pageable memory, every token, as AirLLM does).
Prints the medians: decode tok/s, the bound `upload.roofline_tok_s` measured in the same
run, the fraction of it, and the ratio to the baseline. Targets: >= 0.85 of the bound at
both budgets, >= 3x the baseline. With `--device cpu` it runs the same mechanics where
there is no GPU (no upload block: the bound is the storage roofline).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def bench(strata, model, device, gen, extra, env=None):
    args = [strata, "bench", model, "--json", "--device", device, "--runs", "1", "--prompt-tokens", "16",
            "--gen-tokens", str(gen)] + extra
    p = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)


def bound(r):
    up = r.get("upload")
    if up and up.get("roofline_tok_s"):
        return up["roofline_tok_s"]
    return r.get("storage_roofline_tok_s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("strata")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    def med_of(rs, group, key):
        vals = [(r.get(group) or {}) if group else r for r in rs]
        vals = [v.get(key) for v in vals if v.get(key) is not None]
        return statistics.median(vals) if vals else None

    out = []
    for model in args.models:
        streamable = bench(args.strata, model, args.device, 4, ["--memory-budget", "0", "--host-budget", "0"])[
            "streamable_bytes"]
        for pct in (0, 25):
            budget = ["--memory-budget", str(streamable * pct // 100)]
            variants = {
                "host": (budget + ["--host-budget", str(streamable)], None),
                "disk": (budget + ["--host-budget", "0"], None),
                "disk-nogds": (budget + ["--host-budget", "0"], {"STRATA_GDS": "off"}),
                "reload": (["--stream-policy", "reload", "--prefetch-depth", "0", "--host-budget", "0"], None),
            }
            runs = {k: [] for k in variants}
            for _ in range(args.rounds):
                for name, (extra, env) in variants.items():
                    runs[name].append(bench(args.strata, model, args.device, args.gen_tokens, extra, env))
            base = statistics.median(r["decode_tok_s"] for r in runs["reload"])
            for name, rs in runs.items():
                tok = statistics.median(r["decode_tok_s"] for r in rs)
                bounds = [b for b in (bound(r) for r in rs) if b]
                fr = statistics.median(r["decode_tok_s"] / bound(r) for r in rs if bound(r)) if bounds else None
                last = rs[-1]
                row = {"model": os.path.basename(model.rstrip("/")), "vram_budget_pct": pct, "variant": name,
                       "decode_tok_s": tok, "bound_tok_s": statistics.median(bounds) if bounds else None,
                       "fraction_of_bound": fr, "vs_reload": tok / base if base else None,
                       "gds": (last.get("upload") or {}).get("gds"),
                       "h2d_bandwidth_bytes_s": (last.get("upload") or {}).get("h2d_bandwidth_bytes_s"),
                       "storage_bandwidth_bytes_s": last.get("storage_bandwidth_bytes_s"),
                       # Where a step's time goes: the copy engine busy, the compute
                       # waiting on copies, the host thread inside small copies, storage
                       # busy; and the decode against its own reads replayed.
                       "copy_busy_fraction": med_of(rs, "upload", "copy_busy_fraction"),
                       "copy_stall_fraction": med_of(rs, "upload", "copy_stall_fraction"),
                       "host_copy_fraction": med_of(rs, None, "host_copy_fraction"),
                       "launch_overhead_fraction": med_of(rs, None, "launch_overhead_fraction"),
                       "storage_busy_fraction": med_of(rs, None, "storage_busy_fraction"),
                       "decode_fraction_of_replay": med_of(rs, None, "decode_fraction_of_replay"),
                       "device_name": last.get("device_name")}
                out.append(row)
                frs = f"{fr:.2f}" if fr is not None else "-"
                bnd = f"{row['bound_tok_s']:.2f}" if row["bound_tok_s"] else "-"
                pct_of = lambda k: f"{100 * row[k]:.0f}%" if row[k] is not None else "-"
                print(f"{row['model']:>24} VRAM {pct:>2}% {name:<10} {tok:8.2f} tok/s  bound {bnd:>8}  "
                      f"fraction {frs:>5}  x{row['vs_reload']:.2f} reload  gds {row['gds']}  "
                      f"copy busy {pct_of('copy_busy_fraction')} stall {pct_of('copy_stall_fraction')} "
                      f"host in copies {pct_of('host_copy_fraction')}")
                sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
