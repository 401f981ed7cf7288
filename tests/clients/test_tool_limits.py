"""Tool calls at the token limit and the closed-object rule, through the real clients on
SmolLM2-135M-Instruct (whose template has no tool markup: Strata asks it for the
`{"tool_calls": [...]}` wrapper):

- a forced call at max_tokens 24, 48 and 96 through openai Python (whole and streamed),
  openai-node (`create` and `runTools`, tests/clients/node/) and the Responses API:
  the calls that completed come back as calls, never the wrapper text as content, with
  finish reason `length` only when the limit cut a call;
- `parallel_tool_calls: false` makes exactly one call, `tool_choice` `auto` too (the reply
  ends as its first call does, whole and streamed);
- an object schema without `additionalProperties` admits no other keys, through
  `response_format`, Ollama's `format` and tool arguments.
"""

import json
import re
import shutil
import subprocess

import ollama
import openai
import pytest

from conftest import ROOT, strata_serve
from test_tools import SMOL, WEATHER, smollm2_gguf

FLAT_WEATHER = {"type": "function", **WEATHER["function"]}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
LIMITS = [24, 48, 96]
SEEDS = range(6)


@pytest.fixture(scope="module")
def server():
    with strata_serve(models=["--model", f"{SMOL}={smollm2_gguf()}", "--ctx-size", "1024", "--threads", "1"],
                      name="tool-limits") as s:
        yield s


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def check_calls(calls):
    for c in calls:
        assert c.function.name == "get_weather", c
        assert isinstance(json.loads(c.function.arguments)["city"], str), c


def check_choice(c, label):
    """A forced call's choice: never the wrapper as content; the calls that came are
    whole; `tool_calls` only with calls, `length` when the limit cut one."""
    assert not c.message.content, f"{label}: the wrapper came back as content: {c.message.content!r}"
    calls = c.message.tool_calls or []
    check_calls(calls)
    assert c.finish_reason in ("tool_calls", "length"), (label, c)
    assert c.finish_reason == "length" or calls, (label, c)
    return c.finish_reason, len(calls)


@pytest.mark.parametrize("max_tokens", LIMITS)
def test_forced_call_at_the_limit_is_a_call(oa, max_tokens):
    kw = dict(model=SMOL, messages=QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=max_tokens)
    r = oa.chat.completions.create(temperature=0, **kw)
    seen = [check_choice(r.choices[0], "greedy")]
    if max_tokens > 24:
        # Greedy, SmolLM2 writes one whole call in about 30 tokens and ends.
        assert seen[0] == ("tool_calls", 1), r.choices[0]
    # Sampled, it may repeat calls until the limit: the complete ones come back.
    for seed in SEEDS:
        r = oa.chat.completions.create(temperature=1, seed=seed, **kw)
        seen.append(check_choice(r.choices[0], f"seed {seed}"))
    print(f"max_tokens {max_tokens}: {seen}")


@pytest.mark.parametrize("max_tokens", LIMITS)
def test_forced_call_streams_its_arguments_as_they_generate(oa, max_tokens):
    stream = oa.chat.completions.create(model=SMOL, messages=QUESTION, tools=[WEATHER], tool_choice="required",
                                        temperature=0, max_tokens=max_tokens, stream=True)
    chunks = [ch for ch in stream if ch.choices]
    with_args = [i for i, ch in enumerate(chunks) for tc in ch.choices[0].delta.tool_calls or []
                 if tc.function.arguments]
    assert len(with_args) >= 2, "the arguments come in pieces, not whole at the end"
    assert all(not ch.choices[0].delta.content for ch in chunks), "no content"
    whole = oa.chat.completions.create(model=SMOL, messages=QUESTION, tools=[WEATHER], tool_choice="required",
                                       temperature=0, max_tokens=max_tokens).choices[0]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    args = "".join(tc.function.arguments or "" for ch in chunks for tc in ch.choices[0].delta.tool_calls or [])
    if whole.message.tool_calls:
        assert args == whole.message.tool_calls[0].function.arguments, "greedy: the same call"


@pytest.mark.parametrize("max_tokens", LIMITS)
def test_responses_forced_call_at_the_limit_is_a_function_call(oa, max_tokens):
    for seed in SEEDS:
        r = oa.responses.create(model=SMOL, input=QUESTION, tools=[FLAT_WEATHER], tool_choice="required",
                                temperature=1 if seed else 0, max_output_tokens=max_tokens, extra_body={"seed": seed})
        assert r.output_text == "", f"seed {seed}: the wrapper came back as output_text: {r.output_text!r}"
        calls = [o for o in r.output if o.type == "function_call"]
        assert [o.type for o in r.output] == ["function_call"] * len(calls), r.output
        for c in calls:
            assert c.status == "completed" and isinstance(json.loads(c.arguments)["city"], str), c
        assert r.status == "incomplete" or calls, r
        if seed == 0 and max_tokens > 24:
            assert r.status == "completed" and len(calls) == 1, r


def test_parallel_tool_calls_false_is_one_call(oa):
    for seed in SEEDS:
        r = oa.chat.completions.create(model=SMOL, messages=QUESTION, tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=False, temperature=1, seed=seed, max_tokens=96)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, (seed, c)
        check_calls(c.message.tool_calls)


def two_calls_format():
    """A `response_format` whose every reply is the wrapper with two calls: under
    `tool_choice` `auto` the model makes them because the schema says so."""
    call = {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string", "maxLength": 12}}}}}
    schema = {"type": "object", "required": ["tool_calls"],
              "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 2, "maxItems": 2}}}
    return {"type": "json_schema", "json_schema": {"name": "two_calls", "schema": schema}}


def test_parallel_tool_calls_false_caps_auto_at_one_call(oa):
    ask = dict(model=SMOL, messages=[{"role": "user", "content": "What is the weather in Paris and in Rome?"}],
               tools=[WEATHER], tool_choice="auto", response_format=two_calls_format(), max_tokens=200)
    for seed in range(3):
        both = oa.chat.completions.create(**ask, seed=seed).choices[0]
        assert both.finish_reason == "tool_calls" and len(both.message.tool_calls) == 2, (seed, both)
        r = oa.chat.completions.create(**ask, seed=seed, parallel_tool_calls=False)
        one = r.choices[0]
        assert one.finish_reason == "tool_calls" and not one.message.content, (seed, one)
        assert [c.function.arguments for c in one.message.tool_calls] == [both.message.tool_calls[0].function.arguments]
        check_calls(one.message.tool_calls)
        # The generation stopped with the first call: the second was never generated.
        assert r.usage.completion_tokens < 0.8 * oa.chat.completions.create(**ask, seed=seed).usage.completion_tokens
        chunks = list(oa.chat.completions.create(**ask, seed=seed, parallel_tool_calls=False, stream=True))
        deltas = [t for ch in chunks for t in (ch.choices[0].delta.tool_calls or [])]
        assert {t.index for t in deltas} == {0}, deltas
        args = "".join(t.function.arguments or "" for t in deltas)
        assert args == one.message.tool_calls[0].function.arguments, args
        assert chunks[-1].choices[0].finish_reason == "tool_calls", chunks[-1]


def test_openai_node_forced_calls_and_run_tools(server):
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("node and npm are needed for the openai-node test (tests/clients/node/)")
    src, work = ROOT / "tests/clients/node", ROOT / "target/node-clients"
    work.mkdir(parents=True, exist_ok=True)
    lock = (src / "package-lock.json").read_bytes()
    fresh = (work / "package-lock.json").exists() and (work / "package-lock.json").read_bytes() == lock
    for name in ("package.json", "package-lock.json", "forced_calls.mjs"):
        shutil.copy(src / name, work / name)
    if not fresh or not (work / "node_modules/openai").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=work, check=True, timeout=300)
    run = subprocess.run([node, "forced_calls.mjs", server.url, SMOL], cwd=work, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    cases = [json.loads(line) for line in run.stdout.splitlines()]
    want = [("create", 24)] + [(k, m) for m in LIMITS[1:] for k in ("create", "runTools")]
    assert [(c["case"], c["max_tokens"]) for c in cases] == want, run.stdout


ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["Paris", "London", "Rome"]}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
}
CAPITAL = [{"role": "user", "content": "What is the capital of France? Reply in JSON."}]


def keys_of(text):
    """The keys a JSON text (whole or cut) writes: its values here are enum strings and
    numbers, so every `"...":` is a key."""
    return set(re.findall(r'"(\w+)"\s*:', text))


def check_answer(text, finished, label):
    # Unbounded numbers may still run to the limit (`0.123...`): cut, the text is no
    # JSON, but it holds no other key either.
    assert keys_of(text) <= {"answer", "confidence"}, (label, text)
    if finished:
        assert set(json.loads(text)) == {"answer", "confidence"}, (label, text)
    return finished


def test_response_format_schema_admits_no_other_keys(oa):
    ends = []
    for seed in SEEDS:
        r = oa.chat.completions.create(
            model=SMOL, messages=CAPITAL, temperature=1, seed=seed, max_tokens=100,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}})
        c = r.choices[0]
        ends.append(check_answer(c.message.content, c.finish_reason == "stop", f"seed {seed}"))
    assert sum(ends) >= len(ends) // 2, ends


def test_ollama_format_admits_no_other_keys(server):
    ol = ollama.Client(host=server.url, timeout=300)
    ends = []
    for seed in SEEDS:
        r = ol.chat(model=SMOL, messages=CAPITAL, format=ANSWER,
                    options={"temperature": 1, "seed": seed, "num_predict": 100})
        ends.append(check_answer(r.message.content, r.done_reason == "stop", f"seed {seed}"))
    assert sum(ends) >= len(ends) // 2, ends


def test_tool_arguments_admit_no_other_keys(oa):
    tool = {"type": "function", "function": {"name": "report", "description": "Report the answer.", "parameters": {
        "type": "object", "properties": {"result": ANSWER}, "required": ["result"]}}}
    for seed in SEEDS:
        r = oa.chat.completions.create(model=SMOL, messages=CAPITAL, tools=[tool], temperature=1, seed=seed,
                                       tool_choice={"type": "function", "function": {"name": "report"}},
                                       max_tokens=100)
        c = r.choices[0]
        if c.finish_reason == "length":
            continue
        args = json.loads(c.message.tool_calls[0].function.arguments)
        assert set(args) == {"result"} and set(args["result"]) == {"answer", "confidence"}, (seed, args)
