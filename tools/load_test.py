#!/usr/bin/env python3
"""Concurrent load over HTTP with the real OpenAI client, for issue 18's benchmark.

    tools/load_test.py URL MODEL [--concurrency 1,2,4,8,16] [--max-tokens 48] [--rounds 3]

For each concurrency N it sends N greedy streamed chat requests at once (distinct
prompts from Python's `pydoc_data.topics`), rounds times, and prints per N the median
over rounds of: aggregate decode tok/s (completion tokens of all requests over the
wall time from the first to the last token), time to first token p50/p99, and the
aggregate rate of the same N requests sent one after another. It checks that every
concurrent answer equals its solo answer and says how many differ. Works against any
OpenAI-compatible server (`strata serve`, `llama-server -np N`). Needs `openai`
(tests/clients/requirements.txt).
"""

import argparse
import asyncio
import json
import statistics
import time

import openai
from openai import AsyncOpenAI


def prompts(n):
    from pydoc_data.topics import topics

    keys = sorted(topics)
    out = []
    for i in range(n):
        text = topics[keys[(i * 37) % len(keys)]].strip().split("\n\n")[0][:400]
        out.append(f"Summarise this in one sentence:\n\n{text}")
    return out


async def one(client, model, prompt, max_tokens):
    """Streams one answer: (text, completion tokens, t_first, t_last) in perf seconds."""
    t0 = time.perf_counter()
    first = last = None
    parts, tokens = [], 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            if c.delta and c.delta.content:
                parts.append(c.delta.content)
                first = first or now
                last = now
    return "".join(parts), tokens, (first or time.perf_counter()) - t0, (last or time.perf_counter()), t0


async def run(url, model, ns, max_tokens, rounds):
    # A fresh connection per request: llama-server closes kept-alive connections after a
    # few requests, and a reused one it has closed fails the request.
    import httpx2

    http = openai.DefaultAsyncHttpx2Client(limits=httpx2.Limits(max_keepalive_connections=0))
    client = AsyncOpenAI(
        base_url=url.rstrip("/") + "/v1", api_key="none", timeout=600, max_retries=0, http_client=http
    )
    all_prompts = prompts(max(ns))
    # Solo answers, and a warm-up.
    solo = {}
    solo_time = {}
    for p in all_prompts:
        text, toks, ttft, t_last, t0 = await one(client, model, p, max_tokens)
        solo[p] = text
        solo_time[p] = (toks, t_last - t0)
    results = []
    for n in ns:
        ps = all_prompts[:n]
        aggs, seq_aggs, ttfts, mismatched = [], [], [], 0
        for _ in range(rounds):
            # One after another.
            t = time.perf_counter()
            toks = 0
            for p in ps:
                _, k, _, _, _ = await one(client, model, p, max_tokens)
                toks += k
            seq_aggs.append(toks / (time.perf_counter() - t))
            # All at once.
            t = time.perf_counter()
            outs = await asyncio.gather(*(one(client, model, p, max_tokens) for p in ps))
            end = max(o[3] for o in outs)
            aggs.append(sum(o[1] for o in outs) / (end - t))
            ttfts.extend(o[2] for o in outs)
            mismatched += sum(o[0] != solo[p] for o, p in zip(outs, ps))
        ttfts.sort()
        row = {
            "concurrency": n,
            "aggregate_tok_s": statistics.median(aggs),
            "one_after_another_tok_s": statistics.median(seq_aggs),
            "ttft_p50_s": ttfts[len(ttfts) // 2],
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))],
            "answers_differing_from_solo": mismatched,
            "answers": n * rounds,
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ns = [int(x) for x in a.concurrency.split(",")]
    asyncio.run(run(a.url, a.model, ns, a.max_tokens, a.rounds))


if __name__ == "__main__":
    main()
