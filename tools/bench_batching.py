#!/usr/bin/env python3
"""Issue 18's benchmark: `strata serve` against llama.cpp's `llama-server -np N` under
concurrent HTTP load, rounds interleaved.

    tools/bench_batching.py MODEL.gguf [--llama-server PATH] [--strata PATH]
        [--concurrency 1,2,4,8,16] [--max-tokens 48] [--rounds 2] [--load-rounds 2]
        [--strata-args "--memory-budget 0"] [--no-llama]

Each round starts `strata serve` (at its defaults plus --strata-args), drives it with
tools/load_test.py (the OpenAI client, greedy streamed chat requests of up to
--max-tokens tokens), stops it, then does the same with `llama-server -m MODEL -np N`
(N the largest concurrency, everything else at its defaults). Prints, per server and
concurrency, the medians over rounds of aggregate decode tok/s, the one-after-another
rate, TTFT p50/p99 and the scaling against one request, as JSON lines and a Markdown
table. Needs `openai` (target/client-venv has it).
"""

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("server not healthy in time")


def serve(cmd, port):
    log = open(f"/tmp/bench_batching_{port}.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    return proc


def load(port, model, ns, max_tokens, rounds):
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/load_test.py"), f"http://127.0.0.1:{port}", model,
         "--concurrency", ",".join(map(str, ns)), "--max-tokens", str(max_tokens), "--rounds", str(rounds)],
        capture_output=True, text=True, check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--strata", default=str(ROOT / "target/release/strata"))
    ap.add_argument("--llama-server", default="/tmp/lsbuild/bin/llama-server")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--load-rounds", type=int, default=2)
    ap.add_argument("--strata-args", default="")
    ap.add_argument("--no-llama", action="store_true")
    a = ap.parse_args()
    ns = [int(x) for x in a.concurrency.split(",")]
    results = {}
    for _ in range(a.rounds):
        runs = [("strata", [a.strata, "serve", "-m", f"bench={a.model}", *shlex.split(a.strata_args)], "bench")]
        if not a.no_llama:
            runs.append(("llama-server", [a.llama_server, "-m", str(a.model), "-np", str(max(ns)),
                                          "--alias", "bench"], "bench"))
        for name, cmd, model in runs:
            port = free_port()
            proc = serve([*cmd, "--port", str(port)] + (["--host", "127.0.0.1"]), port)
            try:
                rows = load(port, model, ns, a.max_tokens, a.load_rounds)
            finally:
                stop(proc)
            for r in rows:
                results.setdefault((name, r["concurrency"]), []).append(r)
                print(json.dumps({"server": name, **r}), flush=True)
    med = statistics.median
    print("\n| server | concurrent requests | aggregate decode tok/s | one after another tok/s | "
          "scaling vs 1 | TTFT p50 | TTFT p99 | answers differing from solo |")
    print("|---|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(k[0] for k in results):
        base = med(r["aggregate_tok_s"] for r in results[(name, ns[0])])
        for n in ns:
            rs = results[(name, n)]
            agg = med(r["aggregate_tok_s"] for r in rs)
            print(f"| {name} | {n} | {agg:.1f} | {med(r['one_after_another_tok_s'] for r in rs):.1f} | "
                  f"{agg / base:.2f}× | {med(r['ttft_p50_s'] for r in rs) * 1000:.0f} ms | "
                  f"{med(r['ttft_p99_s'] for r in rs) * 1000:.0f} ms | "
                  f"{sum(r['answers_differing_from_solo'] for r in rs)}/{sum(r['answers'] for r in rs)} |")


if __name__ == "__main__":
    main()
