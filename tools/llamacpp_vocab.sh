#!/usr/bin/env bash
# Tokenizer parity with llama.cpp on its own test vocabularies, and chat-template parity
# with transformers on llama.cpp's real templates (tests/it/chat_templates.rs): downloads the
# llama-cpp-python sdist (pinned; PyPI, ~77 MB, kept in target/llamacpp-sdist), takes
# vendor/llama.cpp/models/ggml-vocab-*.gguf with their .inp/.out expectations, and runs
# tests/it/llamacpp_vocab.rs on them, which also checks our own texts against
# tests/fixtures/vocab/llamacpp_strings.json (tools/make_vocab_fixtures.py, same version).
# The templates (models/templates/*.jinja) are compared with transformers' renders in
# tests/fixtures/templates/renders.json (tools/make_template_fixtures.py).
# Nothing from the sdist is committed or compiled.
# tests/run.sh runs this unless STRATA_SKIP_LLAMACPP_VOCAB=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/clients/venv.sh

version=0.3.36
dir=target/llamacpp-sdist
models=$dir/llama_cpp_python-$version/vendor/llama.cpp/models
if [[ ! -f $models/ggml-vocab-gpt-2.gguf.out || ! -f $models/templates/Qwen3-Coder.jinja ]]; then
  ensure_venv target/llamacpp-sdist-venv tools/requirements-llamacpp-sdist.txt
  mkdir -p "$dir"
  PATH=$PWD/target/llamacpp-sdist-venv/bin:$PATH target/llamacpp-sdist-venv/bin/python -m pip download --quiet \
    --no-deps --no-binary :all: --no-build-isolation "llama-cpp-python==$version" -d "$dir"
  tar -xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir" --wildcards \
    "llama_cpp_python-$version/vendor/llama.cpp/models/ggml-vocab-*" \
    "llama_cpp_python-$version/vendor/llama.cpp/models/templates/*"
fi
STRATA_LLAMACPP_VOCAB_DIR=$PWD/$models STRATA_LLAMACPP_TEMPLATES_DIR=$PWD/$models/templates \
  cargo test --release --locked --test it -- llamacpp_vocab:: chat_templates:: --nocapture
