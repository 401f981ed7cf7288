"""The curl commands of the README's "HTTP API" section, run as written against a server
on the demo model (only the port differs), each exiting 0 with a JSON answer."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, strata_serve

README_URL = "http://localhost:8000"


def readme_curl_commands(readme: Path = ROOT / "README.md") -> list[str]:
    text = readme.read_text()
    section = re.search(r"^## HTTP API\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## HTTP API' section"
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", section.group(1), re.S | re.M):
        command = ""
        for line in block.splitlines():
            command += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                if command.strip().startswith("curl "):
                    commands.append(command.strip())
                command = ""
    return commands


COMMANDS = readme_curl_commands()


def test_the_readme_shows_both_apis():
    urls = [re.search(r"http://localhost:8000(\S*)", c).group(1) for c in COMMANDS]
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/chat", "/api/generate", "/api/tags"]:
        assert path in urls, f"the README's HTTP API section has no curl example for {path}"
    assert any('"stream": true' in c for c in COMMANDS), "a streamed OpenAI example"


@pytest.fixture(scope="module")
def demo_server():
    # `cargo run --release -- serve` as the README runs it: the demo model (with room for
    # the tool-call example's prompt, as the default context has).
    with strata_serve(name="readme", models=["--ctx-size", "1024", "--threads", "1"]) as s:
        yield s


def answers(out: str) -> list:
    """The JSON values in a response: one document, SSE `data:` lines or NDJSON lines."""
    out = out.strip()
    assert out, "empty answer"
    try:
        return [json.loads(out)]
    except json.JSONDecodeError:
        pass
    lines = [line for line in out.splitlines() if line.strip()]
    if lines[0].startswith("data:"):
        payloads = [line.removeprefix("data:").strip() for line in lines if line.startswith("data:")]
        assert payloads[-1] == "[DONE]", "an SSE stream ends with data: [DONE]"
        return [json.loads(p) for p in payloads[:-1]]
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("command", COMMANDS, ids=[re.search(r"localhost:8000(\S*)", c).group(1) for c in COMMANDS])
def test_readme_curl(demo_server, command):
    command = command.replace(README_URL, demo_server.url)
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{command}\nexit {run.returncode}: {run.stderr}"
    values = answers(run.stdout)
    assert values
    for v in values:
        assert isinstance(v, dict), v
        # A Responses API object always has `"error": null`.
        assert v.get("error") is None, f"{command}\n{v}"
