"""The ollama Python client on models of the store: imported with `strata import` into
the server's own STRATA_HOME while it runs, then listed, shown, run, copied and deleted."""

import os
import subprocess

import ollama
import pytest

from conftest import BIN, ROOT, strata_serve

GGUF = ROOT / "tests" / "fixtures" / "gguf" / "llama3.q4_0.gguf"


def strata(home, *args):
    env = dict(os.environ, STRATA_HOME=str(home))
    return subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True, timeout=60)


def test_store_models_through_the_ollama_client():
    with strata_serve(name="store") as server:
        home = server.log.parent  # the server's STRATA_HOME
        r = strata(home, "import", str(GGUF), "--name", "tiny:q4")
        assert r.returncode == 0, r.stderr
        client = ollama.Client(host=server.url, timeout=60)

        models = {m.model: m for m in client.list().models}
        assert models["tiny:q4"].details.format == "gguf"
        assert models["tiny:q4"].details.quantization_level == "Q4_0"
        assert models["tiny:q4"].size == GGUF.stat().st_size
        assert client.show("tiny:q4").details.family == "llama"
        assert client.generate(model="tiny:q4", prompt="hi", options={"num_predict": 2}).done

        client.copy("tiny:q4", "tiny:copy")
        assert "tiny:copy" in strata(home, "list").stdout
        client.delete("tiny:q4")
        assert "tiny:q4" not in [m.model for m in client.list().models]
        assert strata(home, "show", "tiny:q4").returncode != 0
        with pytest.raises(ollama.ResponseError) as e:
            client.delete("tiny:q4")
        assert e.value.status_code == 404
        # The model the server was started with is not the store's to delete.
        with pytest.raises(ollama.ResponseError) as e:
            client.delete("llama3")
        assert e.value.status_code == 400
        assert client.generate(model="tiny:copy", prompt="hi", options={"num_predict": 2}).done
