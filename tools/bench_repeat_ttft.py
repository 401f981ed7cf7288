#!/usr/bin/env python3
"""Time to first token of a prompt sent again, over HTTP: starts `strata serve` (or each
binary given) on MODEL, sends one streamed /api/generate request, then the same request
`--repeats` times, and prints the first request's and the repeats' times to the first
streamed token (a repeated prompt starts from the output its cache kept, see
`Sequence::new` in crates/strata-engine/src/batch.rs).

    python3 tools/bench_repeat_ttft.py MODEL [--strata BIN ...] [--repeats 5] [--chars 1500]

Needs only the standard library.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ttft(port, prompt):
    body = json.dumps({"model": "m", "prompt": prompt, "stream": True,
                       "options": {"num_predict": 4, "temperature": 0}}).encode()
    t = time.perf_counter()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/generate", body, {"Content-Type": "application/json"})
    first = None
    with urllib.request.urlopen(req) as r:
        for line in r:
            if first is None and json.loads(line).get("response"):
                first = time.perf_counter() - t
    return first


def run(binary, model, port, prompt, repeats, threads):
    with tempfile.TemporaryDirectory() as home:
        p = subprocess.Popen([binary, "serve", "--model", f"m={model}", "--port", str(port), "--threads", str(threads)],
                             env=dict(os.environ, STRATA_HOME=home), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=1)
                    break
                except OSError:
                    time.sleep(0.2)
            first = ttft(port, prompt)
            reps = [ttft(port, prompt) for _ in range(repeats)]
        finally:
            p.terminate()
            p.wait()
    print(f"{binary}: first request {first * 1e3:.0f} ms; repeated: median {statistics.median(reps) * 1e3:.1f} ms "
          f"({', '.join(f'{x * 1e3:.1f}' for x in reps)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--strata", action="append", default=[], help="binaries to compare (default target/release/strata)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chars", type=int, default=1500, help="prompt: the first CHARS characters of README.md")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=8790)
    args = ap.parse_args()
    prompt = (ROOT / "README.md").read_text()[:args.chars]
    for binary in args.strata or [str(ROOT / "target/release/strata")]:
        run(binary, args.model, args.port, prompt, args.repeats, args.threads)


if __name__ == "__main__":
    main()
