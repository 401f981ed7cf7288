"""gpt-oss's harmony format through the real `openai` and `ollama` clients, on the tiny
gpt-oss fixture tests/fixtures/hf/gpt_oss (tools/make_gpt_oss_fixtures.py: random
weights, the real harmony template, `<|channel|>`, `<|message|>`, `<|end|>`, `<|start|>`,
`<|return|>`, `<|call|>` and `<|constrain|>` as special tokens; `<|return|>` and
`<|call|>` are end-of-sequence ids).

Random weights write noise, so `tool_choice` and Lark grammars (which may name special
tokens) make the harmony messages; what is checked is what each client gets: reasoning
apart, calls as calls, no markers. Ollama's API has neither a grammar nor `tool_choice`
(`format` forces JSON content), so there the checks are `show`'s capabilities, `think`'s
levels reaching the template, and `thinking` and `tool_calls` in the history.
"""

import json

import jsonschema
import ollama
import openai
import pydantic
import pytest

from conftest import strata_serve

GPT_OSS = "gpt_oss"
# The fixture was trained for 256 positions; the template's system message and one tool
# take 330 tokens, so the server offers more (it warns; random weights do not mind).
MODELS = ["--model", f"{GPT_OSS}=tests/fixtures/hf/gpt_oss", "--ctx-size", "1024", "--threads", "1"]
CITY = {"type": "string", "maxLength": 24}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        # gpt-oss's template writes `// description` and fails without one.
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
MARKERS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>", "<|call|>", "<|constrain|>")
# Thinks (3 to 8 letters), then answers (2 to 6): the markers by token, the words as text.
THINK_THEN_ANSWER = ('start: <|channel|> "analysis" <|message|> /[a-z]{3,8}/ <|end|> <|start|> "assistant" '
                     '<|channel|> "final" <|message|> /[a-z]{2,6}/ <|return|>')
# Thinks, then calls get_weather with a capitalised city.
THINK_THEN_CALL = ('start: <|channel|> "analysis" <|message|> /[a-z]{3,8}/ <|end|> <|start|> "assistant" '
                   '<|channel|> "commentary to=functions.get_weather " <|constrain|> "json" <|message|> '
                   '"{\\"city\\": \\"" /[A-Z][a-z]{2,8}/ "\\"}" <|call|>')


def no_markers(*texts):
    return all(not any(m in (t or "") for m in MARKERS) for t in texts)


@pytest.fixture(scope="module")
def harmony_server():
    with strata_serve(models=MODELS, name="harmony") as s:
        yield s


@pytest.fixture(scope="module")
def oa(harmony_server):
    return openai.OpenAI(base_url=harmony_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ol(harmony_server):
    return ollama.Client(host=harmony_server.url, timeout=120)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_call_whole_and_streamed(oa, tool_choice):
    kw = dict(model=GPT_OSS, messages=QUESTION, tools=[WEATHER], tool_choice=tool_choice, temperature=0,
              max_tokens=200)
    r = oa.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content, choice.message
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert no_markers(call.function.arguments)

    firsts, streamed, content, finish = {}, {}, "", None
    for chunk in oa.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            if tc.index not in firsts:
                assert tc.id and tc.type == "function" and tc.function.name == "get_weather", tc
                firsts[tc.index] = tc
            else:
                assert tc.id is None and tc.function.name is None, "later deltas carry only arguments"
            streamed[tc.index] = streamed.get(tc.index, "") + (tc.function.arguments or "")
        finish = c.finish_reason or finish
    assert finish == "tool_calls" and not content
    assert list(streamed) == [0], "one call: <|call|> ends the generation"
    assert json.loads(streamed[0]) == args, "greedy: the same call streamed"


def test_call_round_trip_renders_as_harmony(oa):
    """The call and its result go back; the template renders them (the prompt grows by
    more than the result) and the next reply is a reply."""
    kw = dict(model=GPT_OSS, tools=[WEATHER], temperature=0)
    r = oa.chat.completions.create(messages=QUESTION, tool_choice="required", max_tokens=200, **kw)
    call = r.choices[0].message.tool_calls[0]
    history = [*QUESTION, r.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    r2 = oa.chat.completions.create(messages=history, max_tokens=4, **kw)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens + len('{"temperature": 18}') // 4


def test_analysis_then_final_whole_and_streamed(oa):
    kw = dict(model=GPT_OSS, messages=QUESTION, temperature=0, max_tokens=100,
              extra_body={"grammar": THINK_THEN_ANSWER})
    r = oa.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    reasoning, content = choice.message.reasoning_content, choice.message.content
    assert reasoning.isalpha() and reasoning.islower() and 3 <= len(reasoning) <= 8, choice.message
    assert content.isalpha() and content.islower() and 2 <= len(content) <= 6, choice.message
    assert r.usage.completion_tokens_details.reasoning_tokens > 0

    parts = {"reasoning_content": "", "content": ""}
    finish = None
    for chunk in oa.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        parts["content"] += d.content or ""
        parts["reasoning_content"] += (d.model_extra or {}).get("reasoning_content") or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert parts == {"reasoning_content": reasoning, "content": content}, "greedy: the same reply streamed"


def test_return_ends_the_reply(oa):
    """`<|return|>` is an end-of-sequence id: a grammar that would go on past it stops there."""
    grammar = THINK_THEN_ANSWER + " /[a-z]{20,30}/"
    r = oa.chat.completions.create(model=GPT_OSS, messages=QUESTION, temperature=0, max_tokens=100,
                                   extra_body={"grammar": grammar})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    assert len(msg.content) <= 6 and no_markers(msg.content, msg.reasoning_content), msg


def test_analysis_then_call(oa):
    r = oa.chat.completions.create(model=GPT_OSS, messages=QUESTION, tools=[WEATHER], temperature=0, max_tokens=200,
                                   extra_body={"grammar": THINK_THEN_CALL})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.reasoning_content.isalpha(), choice.message
    [call] = choice.message.tool_calls
    city = json.loads(call.function.arguments)["city"]
    assert call.function.name == "get_weather" and city.isalpha() and city[0].isupper(), call


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=20)
    age: int = pydantic.Field(ge=0, le=120)


def test_response_format_is_the_content(oa):
    """A JSON schema constrains the `final` message (after an optional analysis): the JSON is
    the content, the harmony header parsed away; these random weights do not think first."""
    r = oa.chat.completions.parse(model=GPT_OSS, messages=[{"role": "user", "content": "Invent a person."}],
                                  response_format=Person, temperature=0, max_tokens=120)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Person) and no_markers(choice.message.content)
    assert not (choice.message.model_extra or {}).get("reasoning_content")


def test_reasoning_effort_reaches_the_template(oa):
    """"Reasoning: low/medium/high" in the system message: medium is the default and is
    spelled in more tokens than low and high in this vocabulary."""
    def prompt_tokens(**kw):
        return oa.chat.completions.create(model=GPT_OSS, messages=QUESTION, max_tokens=1, **kw).usage.prompt_tokens

    low, medium, high = (prompt_tokens(reasoning_effort=e) for e in ("low", "medium", "high"))
    assert low < medium and high < medium, (low, medium, high)
    assert prompt_tokens() == medium


def test_ollama_show_lists_thinking_and_tools(ol):
    r = ol.show(GPT_OSS)
    assert {"completion", "tools", "thinking"} <= set(r.capabilities), r.capabilities
    assert r.details.family == "gpt-oss"
    assert r.modelinfo["general.architecture"] == "gpt-oss"
    assert "<|channel|>" in r.template


def test_ollama_think_levels_reach_the_template(ol, oa):
    def prompt_tokens(think):
        r = ol.chat(model=GPT_OSS, messages=QUESTION, think=think, options={"num_predict": 1})
        assert r.done
        return r.prompt_eval_count

    def openai_tokens(effort):
        r = oa.chat.completions.create(model=GPT_OSS, messages=QUESTION, max_tokens=1, reasoning_effort=effort)
        return r.usage.prompt_tokens

    low, medium = openai_tokens("low"), openai_tokens("medium")
    assert prompt_tokens("low") == prompt_tokens(False) == low, "false is the template's lowest"
    assert prompt_tokens("medium") == prompt_tokens(True) == medium
    assert prompt_tokens("high") == openai_tokens("high")
    assert ol.generate(model=GPT_OSS, prompt="Hi", think="high", options={"num_predict": 1}).done


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The city's name
    """
    return "18 C"


def test_ollama_tools_and_thinking_in_history(ol):
    """Ollama cannot force a call (no `tool_choice`, no grammar), so random weights make
    none; what the client sends is checked instead: an assistant turn's `tool_calls` and
    `thinking` render into the harmony prompt (the template writes the thinking of a call
    after the last user message), and the reply comes back whole and streamed alike."""
    call = {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    result = {"role": "tool", "content": "18 C", "tool_name": "get_weather"}
    opts = {"temperature": 0, "num_predict": 8}

    def chat(assistant, **kw):
        return ol.chat(model=GPT_OSS, messages=[*QUESTION, assistant, result], tools=[get_weather], options=opts, **kw)

    plain = chat({"role": "assistant", "content": "", "tool_calls": [call]})
    thought = chat({"role": "assistant", "content": "", "thinking": "look it up", "tool_calls": [call]})
    asked = ol.chat(model=GPT_OSS, messages=QUESTION, tools=[get_weather], options=opts)
    assert asked.prompt_eval_count < plain.prompt_eval_count < thought.prompt_eval_count
    for made in thought.message.tool_calls or []:
        assert made.function.name == "get_weather" and isinstance(made.function.arguments, dict)
    assert no_markers(thought.message.content, thought.message.thinking)
    parts = list(chat({"role": "assistant", "content": "", "thinking": "look it up", "tool_calls": [call]},
                      stream=True))
    assert parts[-1].done and parts[-1].eval_count == thought.eval_count
    assert "".join(p.message.content or "" for p in parts) == thought.message.content
    assert "".join(p.message.thinking or "" for p in parts) == (thought.message.thinking or "")


def test_ollama_format_is_the_content(ol):
    """`format` with a JSON schema forces the `final` message's content (JSON; the harmony
    header parsed away), with or without `think`."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    for think in (None, "high"):
        r = ol.chat(model=GPT_OSS, messages=QUESTION, think=think, format=schema,
                    options={"temperature": 0, "num_predict": 60})
        assert r.done_reason == "stop", r
        jsonschema.validate(json.loads(r.message.content), schema)
        assert not r.message.thinking and not r.message.tool_calls
