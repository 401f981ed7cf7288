#!/usr/bin/env python3
"""Expert-cache hit rate against cache size, per policy, on real text.

Runs `strata perplexity MODEL --tokens-file TOKENS --chunk 1 --json` (every token its own
forward pass, as decoding is) at `--memory-budget 0` with expert caches of 5, 10, 25 and
50% of all experts under each policy (lru, lfu, freq), and prints a Markdown table of the
hit rates (hits / experts asked for, every layer, whole run) with the log-likelihood
beside them (which must not move: the cache changes what is read, never the result).

    python3 tools/moe_cache_sweep.py [MODEL] [TOKENS] [--sizes 5,10,25,50]

Defaults: the Zipf-biased router fixture of tools/make_moe_zipf_fixture.py
(tests/fixtures/hf/qwen3_moe_zipf, 6 layers x 64 experts, top-4) and its 2048 tokens of
`pydoc_data.topics` text (tests/fixtures/ref/qwen3_moe_zipf.tokens.json). Counts, not
timings: the figures are the same on any machine. Needs the release binary.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "strata"
POLICIES = ["lru", "lfu", "freq"]


def run(model, tokens, size, policy):
    cmd = [str(BIN), "perplexity", model, "--tokens-file", tokens, "--chunk", "1", "--json", "--threads", "1",
           "--memory-budget", "0", "--expert-cache", f"{size}%", "--expert-policy", policy]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    d = json.loads(out.stdout)
    hits = sum(layer["hits"] for layer in d["experts"]["layers"])
    misses = sum(layer["misses"] for layer in d["experts"]["layers"])
    return hits / (hits + misses), d["nll_mean"], d["experts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=str(ROOT / "tests/fixtures/hf/qwen3_moe_zipf"))
    ap.add_argument("tokens", nargs="?", default=str(ROOT / "tests/fixtures/ref/qwen3_moe_zipf.tokens.json"))
    ap.add_argument("--sizes", default="5,10,25,50")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    n_tokens = len(json.loads(Path(args.tokens).read_text()))
    rows, nlls = [], set()
    for size in sizes:
        rates = []
        for policy in POLICIES:
            rate, nll, experts = run(args.model, args.tokens, size, policy)
            rates.append(rate)
            nlls.add(round(nll, 9))
        rows.append((size, rates))
    e = experts
    print(f"`{Path(args.model).name}`: {e['moe_layers']} MoE layers x {e['experts_per_layer']} experts; "
          f"{n_tokens} tokens fed one at a time; mean NLL {sorted(nlls)} at every size and policy\n")
    print("| cache (of all experts) | " + " | ".join(POLICIES) + " |")
    print("|---|" + "---|" * len(POLICIES))
    for size, rates in rows:
        print(f"| {size:g}% | " + " | ".join(f"{r:.3f}" for r in rates) + " |")


if __name__ == "__main__":
    main()
