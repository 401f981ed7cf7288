"""Prompts and contexts as real frontends meet them, on SmolLM2-135M-Instruct at the
server's defaults (its trained context, 8192) and on the committed fixture model:

- Open WebUI 0.12.4's own `/api/chat` request (tests/fixtures/clients/open-webui-chat.json:
  36 tools, about 6k tokens) answers, whole and streamed; `/api/ps` and `/api/show` report
  the context;
- a conversation longer than the context is cut Ollama's way on `/api/chat` (system
  prompt and newest message kept, the reply about them), refused with `truncate: false`;
- on `/v1` the same is OpenAI's `context_length_exceeded`, which the openai client raises
  as BadRequestError, litellm as ContextWindowExceededError, the anthropic client as
  BadRequestError; `--truncate-prompts` cuts it instead;
- every failed request has a log line with its id; a cached prefix is counted in
  `prompt_eval_count` and `prompt_eval_cached_count`;
- a 10 MB prompt is refused (or cut) without being tokenized whole, and another model
  answers meanwhile.
"""

import json
import subprocess
import threading
from pathlib import Path

import anthropic
import openai
import pytest

from conftest import MODEL, ROOT, get_json, strata_serve
from test_tools import SMOL, smollm2_gguf

FIXTURE = ROOT / "tests" / "fixtures" / "clients" / "open-webui-chat.json"
LITELLM = ROOT / "target" / "litellm-venv" / "bin" / "python"
TOO_LONG = "word " * 9000


@pytest.fixture(scope="module")
def smol():
    """SmolLM2 at the server's defaults, and the fixture model beside it."""
    models = ["--model", f"{SMOL}={smollm2_gguf()}", "--model", f"{MODEL}=tests/fixtures/hf/llama3"]
    with strata_serve(models=models, name="context") as s:
        yield s


def post(url: str, body: dict, timeout: float = 600):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_open_webui_request_answers_at_defaults(smol):
    body = json.loads(FIXTURE.read_text())
    assert len(body["tools"]) == 36
    body.update(model=SMOL, stream=False, options={"temperature": 0, "num_predict": 24})
    status, _, raw = post(smol.url + "/api/chat", body)
    reply = json.loads(raw)
    assert status == 200, reply
    assert reply["done"] and reply["prompt_eval_count"] > 4096, reply
    message = reply["message"]
    assert message.get("content") or message.get("tool_calls"), reply
    # Streamed: NDJSON lines to a final `done` (the prompt's cache is reused).
    body["stream"] = True
    status, headers, raw = post(smol.url + "/api/chat", body)
    assert status == 200, raw[:500]
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert lines[-1]["done"] and lines[-1]["prompt_eval_count"] == reply["prompt_eval_count"]
    assert lines[-1]["prompt_eval_cached_count"] > 4096, lines[-1]
    # The context it chose, where Ollama reports it.
    _, ps = get_json(smol.url + "/api/ps")
    (entry,) = [m for m in ps["models"] if m["name"].startswith(SMOL)]
    assert entry["context_length"] == 8192
    status, _, raw = post(smol.url + "/api/show", {"model": SMOL})
    show = json.loads(raw)
    assert any(line.split() == ["num_ctx", "8192"] for line in show["parameters"].splitlines()), show["parameters"]
    assert show["model_info"]["llama.context_length"] == 8192
    assert "context: 8192 tokens, the length the model was trained for" in smol.log_text()


def long_conversation() -> list:
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}]
    for i in range(12):
        messages.append({"role": "user", "content": f"Tell me about the history of Rome, part {i}, in detail. " * 3})
        messages.append({"role": "assistant", "content": "Rome was founded in 753 BC and grew into an empire. " * 2})
    messages.append({"role": "user", "content": "What is the capital of France?"})
    return messages


def test_a_conversation_longer_than_the_context_is_cut_keeping_system_and_newest(smol):
    body = {"model": SMOL, "messages": long_conversation(), "stream": False,
            "options": {"num_ctx": 512, "temperature": 0, "num_predict": 16}}
    status, _, raw = post(smol.url + "/api/chat", body)
    reply = json.loads(raw)
    assert status == 200, reply
    assert reply["prompt_eval_count"] < 512
    assert "Paris" in reply["message"]["content"], reply
    log = smol.log_text()
    assert "truncating input prompt" in log and "prompt=1" in log, log[-2000:]
    # `truncate: false`: refused, in Ollama's error shape.
    status, _, raw = post(smol.url + "/api/chat", dict(body, truncate=False))
    assert status == 400 and "maximum context length is 512 tokens" in json.loads(raw)["error"]
    # A `/api/generate` prompt keeps its first tokens and its tail.
    status, _, raw = post(smol.url + "/api/generate", {"model": SMOL, "prompt": TOO_LONG, "stream": False,
                                                        "options": {"num_ctx": 256, "num_predict": 2}})
    assert status == 200 and json.loads(raw)["prompt_eval_count"] < 256, raw


def test_v1_refuses_as_openai_and_anthropic_do(smol):
    oa = openai.OpenAI(base_url=smol.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": TOO_LONG}], max_tokens=4)
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages", e.value.body
    assert e.value.type == "invalid_request_error"
    assert "maximum context length is 8192 tokens" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oa.completions.create(model=SMOL, prompt=TOO_LONG, max_tokens=4)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model=SMOL, input=TOO_LONG, max_output_tokens=16)
    assert e.value.code == "context_length_exceeded"
    an = anthropic.Anthropic(base_url=smol.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        an.messages.create(model=SMOL, max_tokens=4, messages=[{"role": "user", "content": TOO_LONG}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    # The other codes a client branches on.
    with pytest.raises(openai.NotFoundError) as e:
        oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"


def test_litellm_raises_its_context_window_error(smol):
    if not LITELLM.exists():
        pytest.skip(f"{LITELLM} is missing (tests/run.sh makes it from tests/clients/requirements-litellm.txt)")
    run = subprocess.run([str(LITELLM), str(Path(__file__).with_name("litellm_context.py")), smol.url, SMOL],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_truncate_prompts_cuts_on_v1_too():
    with strata_serve(["--truncate-prompts", "--ctx-size", "256", "--threads", "1"], name="truncate",
                      models=["--model", f"{MODEL}=tests/fixtures/hf/llama3"]) as s:
        oa = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = oa.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                                                               {"role": "user", "content": "hello " * 400}],
                                       max_tokens=4)
        assert r.usage.prompt_tokens < 256 and r.choices[0].finish_reason in ("length", "stop")
        assert "truncating input prompt" in s.log_text()


def test_failed_requests_are_logged_with_their_id(smol):
    status, headers, _ = post(smol.url + "/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404
    rid = {k.lower(): v for k, v in headers.items()}["x-request-id"]
    status, headers, _ = post(smol.url + "/v1/chat/completions", {"model": SMOL, "messages": "not a list"})
    assert status == 400
    log = smol.log_text()
    (line,) = [line for line in log.splitlines() if rid in line]
    assert "WARN" in line and "status=404" in line and 'path="/api/chat"' in line and "not found" in line, line
    assert any("/v1/chat/completions" in line and "status=400" in line for line in log.splitlines())
    # The fixture polled /health while the model loaded: its 503s are answers, not failures.
    assert not [line for line in log.splitlines() if "request_log" in line and 'path="/health"' in line]
    # A client's own id is kept.
    import urllib.request

    req = urllib.request.Request(smol.url + "/api/tags", headers={"x-request-id": "client-7"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["x-request-id"] == "client-7"


def test_a_reused_prefix_counts_in_prompt_eval_count(smol):
    body = {"model": MODEL, "prompt": "The quick brown fox jumps over the lazy dog. " * 4, "stream": False,
            "raw": True, "options": {"num_predict": 2, "temperature": 0}}
    first = json.loads(post(smol.url + "/api/generate", body)[2])
    again = json.loads(post(smol.url + "/api/generate", body)[2])
    assert again["prompt_eval_count"] == first["prompt_eval_count"]
    assert "prompt_eval_cached_count" not in first
    assert 0 < again["prompt_eval_cached_count"] <= again["prompt_eval_count"]


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_huge_prompt_is_not_tokenized_whole_and_holds_up_no_one():
    huge = "All work and no play makes Jack a dull boy. " * 230_000  # 10 MB, under the body limit
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False,
           "options": {"num_predict": 2, "temperature": 0}}
    models = ["--model", f"{SMOL}={smollm2_gguf()}", "--model", f"{MODEL}=tests/fixtures/hf/llama3"]
    with strata_serve(models=models, name="huge") as s:
        assert post(s.url + "/api/chat", ask)[0] == 200
        assert post(s.url + "/api/chat", {**ask, "model": SMOL})[0] == 200
        before = peak_rss(s.process.pid)
        big = {}
        chat = {"model": SMOL, "messages": [{"role": "user", "content": huge}], "max_tokens": 1}
        t = threading.Thread(target=lambda: big.update(r=post(s.url + "/v1/chat/completions", chat)))
        t.start()
        # The other model answers while the huge prompt is being looked at.
        status, _, raw = post(s.url + "/api/chat", ask)
        assert status == 200 and json.loads(raw)["done"], raw
        t.join()
        status, _, raw = big["r"]
        error = json.loads(raw)["error"]
        assert status == 400 and error["code"] == "context_length_exceeded", raw
        assert "resulted in more than" in error["message"], error
        # An embedding of it keeps its first tokens (Ollama's `truncate`, on by default).
        status, _, raw = post(s.url + "/api/embed", {"model": MODEL, "input": huge})
        assert status == 200 and json.loads(raw)["prompt_eval_count"] > 0, raw[:300]
        # Tokenized whole, its 2.5 million tokens took 300 MB more at the peak.
        grew = peak_rss(s.process.pid) - before
        assert grew < 200 << 20, f"the peak resident set grew by {grew >> 20} MiB"
        # Ollama's way cuts it to its head and tail, and answers.
        cut = {**ask, "model": SMOL, "messages": chat["messages"], "options": {"num_predict": 2, "num_ctx": 512}}
        status, _, raw = post(s.url + "/api/chat", cut)
        reply = json.loads(raw)
        assert status == 200 and 0 < reply["prompt_eval_count"] < 512, raw
        assert "truncating input prompt" in s.log_text()
