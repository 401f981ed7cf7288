"""Continuous batching through the real clients: concurrent requests of mixed lengths
and sampling settings, with stop strings and clients that disconnect mid-stream, each
give exactly what they give alone (text and log-probabilities)."""

import concurrent.futures
import json
import time
import urllib.request

import ollama
import openai
import pytest

from conftest import MODEL, strata_serve

LONG = " ".join(f"word{i}" for i in range(60))


@pytest.fixture(scope="module")
def batching_server():
    # Small prefill chunks, so that prompts share passes with other requests' decoding.
    with strata_serve(["--parallel", "4", "--prefill-chunk", "16"], name="batching") as s:
        yield s


def clients(server):
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ol = ollama.Client(host=server.url, timeout=120)
    return oa, ol


def requests(server, stop):
    """(name, thunk) pairs; each thunk returns what the request gave, comparably."""
    oa, ol = clients(server)

    def chat_logprobs():
        r = oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to ten."}],
            max_tokens=20,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
        )
        c = r.choices[0]
        lps = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in c.logprobs.content]
        return c.message.content, c.finish_reason, lps

    def completion_seeded():
        r = oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0.9, seed=5)
        return r.choices[0].text, r.choices[0].finish_reason

    def chat_stop():
        r = oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to ten."}],
            max_tokens=20,
            temperature=0,
            stop=[stop],
        )
        return r.choices[0].message.content, r.choices[0].finish_reason

    def chat_long_streamed():
        parts = []
        for chunk in oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": LONG}],
            max_tokens=16,
            temperature=0,
            stream=True,
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)

    def ollama_generate_penalized():
        r = ol.generate(
            model=MODEL,
            prompt="The weather today",
            options={"num_predict": 30, "temperature": 0.7, "seed": 3, "repeat_penalty": 1.2},
        )
        return r.response, r.done_reason, r.eval_count

    def ollama_chat_streamed():
        text = "".join(
            p.message.content
            for p in ol.chat(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi there" + LONG[:80]}],
                options={"num_predict": 10, "temperature": 0},
                stream=True,
            )
        )
        return text

    return [
        ("chat_logprobs", chat_logprobs),
        ("completion_seeded", completion_seeded),
        ("chat_stop", chat_stop),
        ("chat_long_streamed", chat_long_streamed),
        ("ollama_generate_penalized", ollama_generate_penalized),
        ("ollama_chat_streamed", ollama_chat_streamed),
    ]


def disconnect(server):
    """A streamed request whose client goes away after two chunks."""
    oa, _ = clients(server)
    stream = oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    for n, _ in enumerate(stream):
        if n == 2:
            break
    stream.close()
    return "gone"


def ps(server):
    with urllib.request.urlopen(server.url + "/api/ps", timeout=10) as r:
        return json.loads(r.read())["models"]


def test_concurrent_requests_give_what_they_give_alone(batching_server):
    oa, _ = clients(batching_server)
    # A stop string from the greedy answer's middle, so that it does stop.
    full = oa.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to ten."}], max_tokens=20, temperature=0
    )
    text = full.choices[0].message.content
    assert len(text) >= 6, text
    stop = text[3:6]
    reqs = requests(batching_server, stop)
    alone = {name: f() for name, f in reqs}
    assert alone["chat_stop"][1] == "stop" and stop not in alone["chat_stop"][0], alone["chat_stop"]
    for round_ in range(2):
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(reqs) + 2) as pool:
            futures = {name: pool.submit(f) for name, f in reqs}
            gone = [pool.submit(disconnect, batching_server) for _ in range(2)]
            together = {name: f.result() for name, f in futures.items()}
            assert [g.result() for g in gone] == ["gone", "gone"]
        for name in alone:
            assert together[name] == alone[name], f"round {round_}: {name} differs from its solo run"
    # Nothing is left running: the disconnected requests were retired.
    deadline = time.monotonic() + 10
    while (running := ps(batching_server)[0]["batching"]["running"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running == 0
    assert "panicked" not in batching_server.log_text()


def test_requests_beyond_parallel_wait_and_all_finish(batching_server):
    oa, _ = clients(batching_server)

    def one(i):
        r = oa.completions.create(model=MODEL, prompt=f"Item {i}:", max_tokens=12, temperature=0)
        return r.choices[0].text

    alone = [one(i) for i in range(10)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        together = list(pool.map(one, range(10)))
    assert together == alone
    b = ps(batching_server)[0]["batching"]
    assert b["parallel"] == 4 and b["running"] == 0 and b["waiting"] == 0, b
