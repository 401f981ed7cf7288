#!/usr/bin/env python3
"""Decode speed under a JSON-schema constraint against free decode, through the HTTP API
(issue 20's benchmark): starts `strata serve MODEL`, then alternates a free generation and
a constrained one (Ollama's `format` with a schema whose documents are long, so that both
run the same number of tokens), ROUNDS times, and prints the median decode tok/s of each
(eval_count / eval_duration, the server's own decode clock) and their ratio.

Usage: tools/bench_constrained.py MODEL [--tokens N] [--rounds R] [--bin target/release/strata]
       [--strata-args "--device cuda:0"]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 200,
            "items": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 16},
                "kind": {"enum": ["tool", "food", "animal", "place"]},
                "count": {"type": "integer", "minimum": 0, "maximum": 999},
            }, "required": ["name", "kind", "count"], "additionalProperties": False},
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bin", default="target/release/strata")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--strata-args", default="", help="more `strata serve` arguments")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tempfile.mkdtemp(prefix="strata-bench-constrained-")
    proc = subprocess.Popen([a.bin, "serve", "--model", f"m={a.model}", "--host", "127.0.0.1", "--port", str(port),
                             "--threads", str(a.threads), "--ctx-size", "2048", *a.strata_args.split()],
                            env=dict(os.environ, STRATA_HOME=home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        base = {"model": "m", "stream": False, "messages": [{"role": "user", "content": "List things as JSON."}],
                "options": {"num_predict": a.tokens, "temperature": 0}}
        post(url + "/api/chat", base)  # warm up (load)
        post(url + "/api/chat", {**base, "format": SCHEMA})
        free, constrained, counts = [], [], []
        for _ in range(a.rounds):
            for body, out in ((base, free), ({**base, "format": SCHEMA}, constrained)):
                r = post(url + "/api/chat", body)
                # A real model may end its free answer early: a rate over fewer tokens is
                # still a rate, but too few would measure the first steps only.
                assert r["eval_count"] >= a.tokens // 2, f"ran {r['eval_count']} of {a.tokens} tokens: {r}"
                out.append(r["eval_count"] / (r["eval_duration"] / 1e9))
                counts.append(r["eval_count"])
        f, c = statistics.median(free), statistics.median(constrained)
        print(json.dumps({"model": a.model, "tokens": a.tokens, "rounds": a.rounds, "free_tok_s": round(f, 2),
                          "constrained_tok_s": round(c, 2), "ratio": round(c / f, 4), "token_counts": counts,
                          "free_all": [round(x, 2) for x in free], "constrained_all": [round(x, 2) for x in constrained]}))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
