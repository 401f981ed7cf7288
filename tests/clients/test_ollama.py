"""The ollama Python client against `strata serve` on the llama3 fixture."""

import math

import ollama
import pytest

from conftest import MODEL

MESSAGES = [{"role": "user", "content": "Say hello."}]
OPTIONS = {"num_predict": 6, "seed": 7, "temperature": 0.8}


def base(name: str) -> str:
    """`llama3:latest` and `llama3` are the same model in Ollama."""
    return name.removesuffix(":latest")


def test_version(server):
    import json
    import urllib.request

    with urllib.request.urlopen(server.url + "/api/version", timeout=10) as r:
        v = json.loads(r.read())
    assert isinstance(v["version"], str) and v["version"]


def test_list(ollama_client):
    r = ollama_client.list()
    names = [base(m.model) for m in r.models]
    assert MODEL in names, names
    m = next(m for m in r.models if base(m.model) == MODEL)
    assert m.size > 0
    assert m.digest
    assert m.modified_at is not None
    assert m.details.family == "llama"
    assert m.details.format == "safetensors"


def test_show(ollama_client):
    r = ollama_client.show(MODEL)
    assert r.details.family == "llama"
    assert r.template, "the fixture has a chat template"
    assert r.modelinfo["general.architecture"] == "llama"
    assert r.modelinfo["llama.embedding_length"] == 64
    assert r.modelinfo["llama.context_length"] == 512
    assert "completion" in r.capabilities


def test_chat_non_streamed_and_streamed(ollama_client):
    opts = {"num_predict": 6, "temperature": 0}
    whole = ollama_client.chat(model=MODEL, messages=MESSAGES, options=opts)
    assert base(whole.model) == MODEL
    assert whole.done is True
    assert whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant"
    assert isinstance(whole.message.content, str)
    assert whole.prompt_eval_count > 0
    assert 0 < whole.eval_count <= 6
    assert whole.total_duration > 0

    parts = list(ollama_client.chat(model=MODEL, messages=MESSAGES, options=opts, stream=True))
    assert parts[-1].done is True and all(not p.done for p in parts[:-1])
    assert parts[-1].done_reason == whole.done_reason
    assert parts[-1].eval_count == whole.eval_count
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert all(p.message.role == "assistant" for p in parts)


def test_generate_with_options(ollama_client):
    a = ollama_client.generate(model=MODEL, prompt="Once upon a time", options=OPTIONS)
    assert a.done is True
    assert a.done_reason == "length"
    assert a.eval_count == OPTIONS["num_predict"]
    assert isinstance(a.response, str) and a.response
    assert a.context and all(isinstance(t, int) for t in a.context)
    assert len(a.context) == a.prompt_eval_count + a.eval_count

    b = ollama_client.generate(model=MODEL, prompt="Once upon a time", options=OPTIONS)
    assert b.response == a.response, "same seed, same text"

    parts = list(ollama_client.generate(model=MODEL, prompt="Once upon a time", options=OPTIONS, stream=True))
    assert parts[-1].done is True and all(not p.done for p in parts[:-1])
    assert "".join(p.response for p in parts) == a.response
    assert parts[-1].eval_count == OPTIONS["num_predict"]
    assert parts[-1].context == a.context

    others = {
        ollama_client.generate(model=MODEL, prompt="Once upon a time", options={**OPTIONS, "seed": s}).response
        for s in (1, 2, 3)
    }
    assert others != {a.response}, "other seeds give other text at temperature 0.8"


def test_load_ps_and_unload(ollama_client):
    # An empty prompt loads the model (Ollama's preload); keep_alive 0 unloads it.
    r = ollama_client.generate(model=MODEL, keep_alive="10m")
    assert r.done is True and r.done_reason == "load" and r.response == ""
    r = ollama_client.ps()
    names = [base(m.model) for m in r.models]
    assert MODEL in names, names
    m = next(m for m in r.models if base(m.model) == MODEL)
    assert m.size > 0
    assert m.expires_at is not None
    assert m.details.family == "llama"

    r = ollama_client.generate(model=MODEL, keep_alive=0)
    assert r.done is True and r.done_reason == "unload"
    assert MODEL not in [base(m.model) for m in ollama_client.ps().models]
    # The next request loads it again.
    assert ollama_client.generate(model=MODEL, prompt="hi", options={"num_predict": 1}).eval_count == 1


def test_embed(ollama_client):
    r = ollama_client.embed(model=MODEL, input=["hello world", "goodbye"])
    assert len(r.embeddings) == 2
    assert all(len(v) == 64 for v in r.embeddings)
    for v in r.embeddings:
        # /api/embed answers L2-normalized vectors, as Ollama does.
        assert math.sqrt(sum(x * x for x in v)) == pytest.approx(1.0, abs=1e-4)
    assert r.embeddings[0] != r.embeddings[1]
    assert r.prompt_eval_count > 0

    one = ollama_client.embed(model=MODEL, input="hello world")
    assert one.embeddings[0] == pytest.approx(r.embeddings[0], abs=1e-6)


def test_embeddings_legacy(ollama_client):
    r = ollama_client.embeddings(model=MODEL, prompt="hello world")
    assert len(r.embedding) == 64
    assert all(math.isfinite(x) for x in r.embedding)
    # The legacy endpoint is the same vector before normalization.
    norm = math.sqrt(sum(x * x for x in r.embedding))
    unit = ollama_client.embed(model=MODEL, input="hello world").embeddings[0]
    assert [x / norm for x in r.embedding] == pytest.approx(unit, abs=1e-5)


def test_copy_and_delete(ollama_client):
    ollama_client.copy(MODEL, "llama3-copy")
    assert "llama3-copy" in [base(m.model) for m in ollama_client.list().models]
    assert ollama_client.show("llama3-copy").details.family == "llama"
    r = ollama_client.generate(model="llama3-copy", prompt="hi", options={"num_predict": 2})
    assert r.done

    ollama_client.delete("llama3-copy")
    assert "llama3-copy" not in [base(m.model) for m in ollama_client.list().models]
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client.show("llama3-copy")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client.delete("llama3-copy")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client.copy("no-such-model", "x")
    assert e.value.status_code == 404
    # The original is untouched.
    assert MODEL in [base(m.model) for m in ollama_client.list().models]


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.chat(model="no-such-model", messages=MESSAGES),
        lambda c: c.generate(model="no-such-model", prompt="hi"),
        lambda c: c.show("no-such-model"),
        lambda c: c.embed(model="no-such-model", input="hi"),
        lambda c: list(c.chat(model="no-such-model", messages=MESSAGES, stream=True)),
    ],
    ids=["chat", "generate", "show", "embed", "chat-stream"],
)
def test_unknown_model_is_404(ollama_client, call):
    with pytest.raises(ollama.ResponseError) as e:
        call(ollama_client)
    assert e.value.status_code == 404
    assert "no-such-model" in e.value.error
