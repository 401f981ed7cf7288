"""The OpenAI Python SDK against `strata serve` on the llama3 fixture."""

import json
import math
import urllib.error
import urllib.request

import openai
import pytest

from conftest import API_KEY, MODEL

MESSAGES = [{"role": "user", "content": "Say hello."}]


def test_models_list_and_retrieve(openai_client):
    models = openai_client.models.list()
    ids = [m.id for m in models.data]
    assert MODEL in ids, ids
    for m in models.data:
        assert m.object == "model"
        assert isinstance(m.created, int)
        assert isinstance(m.owned_by, str)
    m = openai_client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"


def test_chat_non_streamed(openai_client):
    r = openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    assert r.id and r.model == MODEL and isinstance(r.created, int)
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streamed_matches_non_streamed(openai_client):
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    whole = openai_client.chat.completions.create(**kw)
    chunks = list(openai_client.chat.completions.create(stream=True, **kw))
    assert chunks, "no chunks"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1, "one id for the whole stream"
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason], "exactly one finish_reason, on the last choice chunk"
    assert chunks[-1].usage is None, "no usage chunk unless asked"


def test_stream_options_include_usage(openai_client):
    chunks = list(
        openai_client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens > 0
    assert 0 < last.usage.completion_tokens <= 6
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions(openai_client):
    r = openai_client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    assert isinstance(r.choices[0].text, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8

    chunks = list(
        openai_client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == r.choices[0].text


@pytest.mark.parametrize("limit", [1, 5])
def test_max_tokens_gives_length(openai_client, limit):
    r = openai_client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=limit, temperature=0
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == limit
    r = openai_client.completions.create(model=MODEL, prompt="The", max_tokens=limit, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == limit


def test_max_completion_tokens_is_honoured(openai_client):
    r = openai_client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, temperature=0
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_seed_reproducibility(openai_client):
    def sample(seed):
        r = openai_client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=16, temperature=1, seed=seed
        )
        return r.choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    # At temperature 1 over a 496-token vocabulary, other seeds give other text.
    assert any(sample(s) != first for s in (1, 2, 3))


def test_chat_logprobs(openai_client):
    r = openai_client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert len(lp.content) == r.usage.completion_tokens
    for tok in lp.content:
        assert isinstance(tok.token, str)
        assert tok.logprob <= 0 and math.isfinite(tok.logprob)
        assert len(tok.top_logprobs) == 3
        tops = [t.logprob for t in tok.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy: the sampled token is the most likely one.
        assert tok.top_logprobs[0].token == tok.token
        assert tok.top_logprobs[0].logprob == pytest.approx(tok.logprob, abs=1e-5)
        assert isinstance(tok.bytes, list)


def test_completion_logprobs(openai_client):
    r = openai_client.completions.create(model=MODEL, prompt="The", max_tokens=3, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, top in zip(lp.tokens, lp.top_logprobs):
        assert len(top) == 2
        assert tok in top


def test_embeddings_sdk_default_base64_and_float(openai_client):
    # The SDK asks for base64 by default and decodes it itself.
    default = openai_client.embeddings.create(model=MODEL, input=["hello world", "goodbye"])
    assert default.object == "list"
    assert [d.index for d in default.data] == [0, 1]
    assert all(d.object == "embedding" for d in default.data)
    vec = default.data[0].embedding
    assert len(vec) == 64, "the fixture's hidden size"
    assert all(math.isfinite(x) for x in vec)
    assert default.usage.prompt_tokens > 0

    floats = openai_client.embeddings.create(model=MODEL, input=["hello world", "goodbye"], encoding_format="float")
    for a, b in zip(default.data, floats.data):
        assert a.embedding == pytest.approx(b.embedding, rel=1e-6, abs=1e-7)
    assert default.data[0].embedding != default.data[1].embedding

    single = openai_client.embeddings.create(model=MODEL, input="hello world", encoding_format="float")
    assert single.data[0].embedding == pytest.approx(floats.data[0].embedding, rel=1e-6, abs=1e-7)


def test_unknown_model_is_not_found(openai_client):
    with pytest.raises(openai.NotFoundError) as e:
        openai_client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert e.value.status_code == 404
    assert e.value.code == "model_not_found"
    assert e.value.param == "model"
    assert e.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("no-such-model")
    with pytest.raises(openai.NotFoundError):
        openai_client.embeddings.create(model="no-such-model", input="x")


def test_several_choices(openai_client):
    """`n` choices, each what the request alone gives with the seed plus its index."""
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=1)
    r = openai_client.chat.completions.create(n=2, seed=21, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    for j, c in enumerate(r.choices):
        alone = openai_client.chat.completions.create(seed=21 + j, **kw)
        assert c.message.content == alone.choices[0].message.content
    texts = ["", ""]
    finishes = [None, None]
    stream = openai_client.chat.completions.create(
        n=2, seed=21, stream=True, stream_options={"include_usage": True}, **kw
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
    assert texts == [c.message.content for c in r.choices]
    assert finishes == [c.finish_reason for c in r.choices]
    assert usage.completion_tokens == r.usage.completion_tokens
    batch = openai_client.completions.create(model=MODEL, prompt=["Hello", "Once upon"], max_tokens=3, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]


def test_responses(openai_client):
    """The Responses API: the chat's reply as an output item, its stream of events, and
    the 400 for what needs stored responses."""
    kw = dict(model=MODEL, max_output_tokens=8, temperature=0)
    r = openai_client.responses.create(input="Say hello.", **kw)
    chat = openai_client.chat.completions.create(messages=MESSAGES, max_tokens=8, temperature=0, model=MODEL)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    events = list(openai_client.responses.create(input="Say hello.", stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text == events[-1].response.output_text
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.responses.create(input="x", previous_response_id=r.id, **kw)
    assert e.value.param == "previous_response_id"


@pytest.mark.parametrize("kwargs,param", [({"n": 17}, "n"), ({"top_p": 5}, "top_p"), ({"temperature": -1}, "temperature")])
def test_bad_values_are_bad_requests(openai_client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, **kwargs)
    assert e.value.status_code == 400
    assert e.value.type == "invalid_request_error"
    assert e.value.param == param
    assert param in e.value.message


def test_api_key(auth_server):
    url = auth_server.url + "/v1"
    bad = openai.OpenAI(base_url=url, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401
    assert e.value.code == "invalid_api_key"
    assert e.value.type == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)

    # No Authorization header at all.
    req = urllib.request.Request(url + "/models")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
    assert e.value.headers["WWW-Authenticate"] == "Bearer"
    assert json.loads(e.value.read())["error"]["code"] == "invalid_api_key"

    good = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0)
    assert MODEL in [m.id for m in good.models.list().data]
    r = good.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert r.usage.completion_tokens <= 2
