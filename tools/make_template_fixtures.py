#!/usr/bin/env python3
"""Renders every chat template that llama.cpp ships (vendor/llama.cpp/models/templates in
the llama-cpp-python sdist) with transformers, over a few conversations: plain chats,
`tools`, an assistant tool call with its result, reasoning content and an extra variable.
Writes tests/fixtures/templates/renders.json, which tests/it/chat_templates.rs compares
Strata's renderer against (the templates themselves are read from the sdist at test time,
never committed).

Usage: tools/make_template_fixtures.py TEMPLATES_DIR [OUT]
Needs transformers (tools/requirements-ref.txt). `strftime_now` is pinned to
2026-01-02 03:04:05 so that the renders do not depend on the day they were made.
"""
import datetime
import hashlib
import json
import pathlib
import sys

from transformers.utils import chat_template_utils as ctu

FIXED_NOW = datetime.datetime(2026, 1, 2, 3, 4, 5)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
                "required": ["query"],
            },
        },
    },
]

CALL = {
    "id": "abc123xyz",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}

CASES = {
    "chat": dict(
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "What is 2+2?"},
        ],
    ),
    "user_only": dict(messages=[{"role": "user", "content": "Hello"}]),
    "no_generation_prompt": dict(
        messages=[{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"}],
        add_generation_prompt=False,
    ),
    "tools": dict(
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the weather in Paris?"},
        ],
        tools=TOOLS,
    ),
    "tool_round_trip": dict(
        messages=[
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "abc123xyz", "name": "get_weather",
             "content": "{\"temperature\": 18, \"condition\": \"cloudy\"}"},
        ],
        tools=TOOLS,
    ),
    "two_calls_empty_content": dict(
        messages=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [
                CALL,
                {"id": "def456uvw", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            ]},
            {"role": "tool", "tool_call_id": "abc123xyz", "name": "get_weather", "content": "18 C"},
            {"role": "tool", "tool_call_id": "def456uvw", "name": "get_weather", "content": "24 C"},
            {"role": "assistant", "content": "Paris 18 C, Rome 24 C."},
            {"role": "user", "content": "Thanks"},
        ],
        tools=TOOLS,
    ),
    "reasoning": dict(
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "The user greets me."},
            {"role": "user", "content": "Bye"},
        ],
    ),
    "no_thinking": dict(messages=[{"role": "user", "content": "Hello"}], extra={"enable_thinking": False}),
}


def fixed_strftime(fmt):
    return FIXED_NOW.strftime(fmt)


def render(source, case):
    compiled = ctu._compile_jinja_template(source)
    compiled.globals["strftime_now"] = fixed_strftime
    return ctu.render_jinja_template(
        conversations=[case["messages"]],
        tools=case.get("tools"),
        chat_template=source,
        add_generation_prompt=case.get("add_generation_prompt", True),
        bos_token="<s>",
        eos_token="</s>",
        **case.get("extra", {}),
    )[0][0]


def main():
    src_dir = pathlib.Path(sys.argv[1])
    out = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/templates/renders.json")
    result = {"fixed_now_unix": int(FIXED_NOW.replace(tzinfo=datetime.timezone.utc).timestamp()),
              "cases": CASES, "templates": {}}
    for path in sorted(src_dir.glob("*.jinja")):
        source = path.read_text()
        entry = {"sha256": hashlib.sha256(source.encode()).hexdigest(), "renders": {}}
        for name, case in CASES.items():
            try:
                entry["renders"][name] = {"text": render(source, case)}
            except Exception as e:  # noqa: BLE001 - any failure is recorded as the expectation
                entry["renders"][name] = {"error": f"{type(e).__name__}: {e}"}
        result["templates"][path.name] = entry
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    ok = sum("text" in r for t in result["templates"].values() for r in t["renders"].values())
    total = sum(len(t["renders"]) for t in result["templates"].values())
    print(f"{len(result['templates'])} templates, {ok}/{total} renders, {out}")


if __name__ == "__main__":
    main()
