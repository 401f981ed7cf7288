"""Anthropic's Python SDK against `strata serve` on the llama3 fixture: the Messages API
whole and streamed (through the SDK's own accumulator), each the same reply as the
OpenAI chat gives, its errors in Anthropic's shape, and the key as `x-api-key`."""

import anthropic
import pytest

from conftest import API_KEY, MODEL

GREEDY = {"temperature": 0}  # The SDK no longer has `temperature` as a keyword.


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def test_message_is_the_chat_reply(claude, openai_client):
    m = claude.messages.create(model=MODEL, max_tokens=8, system="Be brief.",
                               messages=[{"role": "user", "content": "Say hello."}], extra_body=GREEDY)
    chat = openai_client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == chat.choices[0].message.content
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert m.usage.output_tokens == 8


def test_stream_accumulates_to_the_whole_message(claude):
    kw = dict(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Once upon"}], extra_body=GREEDY)
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    kinds = [e.type for e in claude.messages.create(stream=True, **kw)]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]


def test_count_tokens_is_the_prompt_s_size(claude):
    messages = [{"role": "user", "content": "Say hello."}]
    m = claude.messages.create(model=MODEL, max_tokens=2, system="Be brief.", messages=messages)
    n = claude.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages)
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_errors_have_anthropic_s_shape(claude):
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "system", "content": "x"}])
    assert e.value.body["type"] == "error"
    assert "messages[0].role" in e.value.body["error"]["message"]


def test_api_key_as_x_api_key(auth_server):
    good = anthropic.Anthropic(base_url=auth_server.url, api_key=API_KEY, max_retries=0)
    m = good.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert m.usage.output_tokens <= 2
    bad = anthropic.Anthropic(base_url=auth_server.url, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["error"]["type"] == "authentication_error"
