#!/usr/bin/env python3
"""Speculative decoding's benchmark: servers with and without a draft, rounds interleaved.

    tools/bench_speculative.py --prompt-file PROMPT.txt [--max-tokens 200] [--rounds 3] \\
        --run 'plain=strata serve --model /tmp/spec/smollm2-f16.gguf --memory-budget 0' \\
        --run 'draft=strata serve --model /tmp/spec/smollm2-f16.gguf --memory-budget 0 --draft Q4_1.gguf' \\
        [--run 'llama=llama-server -m ... --model-draft ...'] [--json OUT.json]

Each `--run NAME=COMMAND` is a server command line (`strata` is this checkout's
target/release/strata; `llama-server` is run as given: pass its path). The port and, for
llama-server, nothing else is added: `--host 127.0.0.1 --port P` for both. Every round
starts each server in turn, sends one greedy streamed chat request (the prompt file's text
as the user's message, up to --max-tokens tokens, `stream_options.include_usage`), and
stops it. A request's decode rate is its completion tokens after the first over the time
from the first streamed content to the last, as the client sees it; the server's own
`timings` (tokens drafted and kept) are recorded beside it. Prints per run the median
over rounds, its ratio to the first run, and the acceptance, as JSON lines and a Markdown
table. Standard library only.
"""

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_batching import free_port, stop  # noqa: E402


def start(cmd, port, log):
    argv = shlex.split(cmd)
    if argv[0] == "strata":
        argv[0] = str(ROOT / "target/release/strata")
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{argv[0]} exited with {proc.returncode} (log: {log.name})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"{argv[0]} not healthy in time")


def model_id(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def ask(port, prompt, max_tokens):
    body = {
        "model": model_id(port),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    first = last = None
    text, usage, timings = [], None, None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    now = time.monotonic()
                    first = first or now
                    last = now
                    text.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    n = (usage or {}).get("completion_tokens", 0)
    rate = (n - 1) / (last - first) if first and last and last > first and n > 1 else float("nan")
    return {"tokens": n, "decode_tok_s": rate, "text": "".join(text), "timings": timings}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-file", required=True)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run", action="append", required=True, help="NAME=COMMAND")
    ap.add_argument("--json")
    a = ap.parse_args()
    prompt = Path(a.prompt_file).read_text()
    runs = [r.split("=", 1) for r in a.run]
    results = {name: [] for name, _ in runs}
    for rnd in range(a.rounds):
        for name, cmd in runs:
            port = free_port()
            with open(f"/tmp/bench_speculative_{name}.log", "ab") as log:
                proc = start(cmd, port, log)
                try:
                    res = ask(port, prompt, a.max_tokens)
                finally:
                    stop(proc)
            t = res["timings"] or {}
            res.update(round=rnd, run=name, draft_n=t.get("draft_n"), draft_n_accepted=t.get("draft_n_accepted"))
            results[name].append(res)
            print(json.dumps({k: v for k, v in res.items() if k not in ("text", "timings")}), flush=True)
    base = None
    rows = []
    for name, cmd in runs:
        rs = results[name]
        med = statistics.median(r["decode_tok_s"] for r in rs)
        base = base or med
        drafted = sum(r["draft_n"] or 0 for r in rs)
        kept = sum(r["draft_n_accepted"] or 0 for r in rs)
        row = {
            "run": name,
            "command": cmd,
            "decode_tok_s": med,
            "ratio": med / base,
            "tokens": statistics.median(r["tokens"] for r in rs),
            "acceptance": kept / drafted if drafted else None,
            "same_text_as_first": rs[0]["text"] == results[runs[0][0]][0]["text"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| run | decode tok/s (median) | ratio | acceptance | tokens |\n|---|---|---|---|---|")
    for r in rows:
        acc = "" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f}%"
        print(f"| {r['run']} | {r['decode_tok_s']:.2f} | {r['ratio']:.2f}x | {acc} | {r['tokens']:.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"rounds": results, "summary": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
