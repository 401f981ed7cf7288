"""A real `strata serve` for the client tests.

The release binary (target/release/strata, or $STRATA_BIN) serves the committed fixture
model tests/fixtures/hf/llama3 as `llama3` on a free port, with STRATA_HOME in a
temporary directory. The session fixture waits for /health 200 and, at the end, stops
the server with SIGTERM and asserts that it exits 0.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("STRATA_BIN", ROOT / "target" / "release" / "strata"))
MODEL = "llama3"
SMALL = ["--ctx-size", "256", "--threads", "1"]
MODEL_ARGS = ["--model", f"{MODEL}=tests/fixtures/hf/llama3", *SMALL]
API_KEY = "sk-strata-test-key"


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, json.loads(r.read())


@contextlib.contextmanager
def strata_serve(args=(), name="server", models=MODEL_ARGS, startup_timeout=60.0):
    """Runs `strata serve MODELS ARGS` until the block ends; yields a `Server`."""
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: run `cargo build --release` first")
    with tempfile.TemporaryDirectory(prefix=f"strata-{name}-") as home:
        port = free_port()
        log = Path(home) / "serve.log"
        env = dict(os.environ, STRATA_HOME=home)
        env.pop("STRATA_API_KEY", None)
        cmd = [str(BIN), "serve", *models, "--host", "127.0.0.1", "--port", str(port), *args]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        server = Server(url=f"http://127.0.0.1:{port}", process=proc, log=log)
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"strata serve exited with {proc.returncode} at start:\n{server.log_text()}")
                try:
                    status, _ = get_json(server.url + "/health", timeout=2)
                    if status == 200:
                        break
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"strata serve not healthy after {startup_timeout} s:\n{server.log_text()}")
                time.sleep(0.1)
            yield server
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    pytest.fail(f"strata serve did not exit within 30 s of SIGTERM:\n{server.log_text()}")
        assert proc.returncode == 0, f"strata serve exited with {proc.returncode}:\n{server.log_text()}"
        assert "panicked" not in server.log_text(), f"strata serve panicked:\n{server.log_text()}"


@pytest.fixture(scope="session")
def server():
    with strata_serve(name="main") as s:
        yield s


@pytest.fixture(scope="session")
def auth_server():
    with strata_serve(["--api-key", API_KEY], name="auth") as s:
        yield s


@pytest.fixture(scope="session")
def openai_client(server):
    import openai

    # No retries: a failure must show at once, and typed errors must not be retried.
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def ollama_client(server):
    import ollama

    return ollama.Client(host=server.url, timeout=60)
