#!/usr/bin/env bash
# The one test command: builds Strata and runs every test.
#   tests/run.sh            all tests
#   tests/run.sh ARGS       ARGS go to `cargo test` (e.g. a test name filter)
# After the cargo tests come the HTTP client tests (tests/clients/: the real `openai` and
# `ollama` Python clients against `strata serve`, in a venv at target/client-venv) and the
# schemathesis fuzz run (tools/schemathesis.sh, venv at target/schemathesis-venv). Both
# need python3 >= 3.11 and PyPI on first use. STRATA_SKIP_CLIENTS=1 skips the former,
# STRATA_SKIP_SCHEMATHESIS=1 the latter. Last, tests/deploy.sh checks the deployment
# files (systemd/, Dockerfile, deploy/) and boots the daemon as the systemd unit runs
# it (venv at target/deploy-venv); STRATA_SKIP_DEPLOY=1 skips it.
# tools/cuda_toolchain.sh compiles every CUDA kernel with NVRTC and checks the PTX with
# ptxas, both from pinned pip wheels (venv at target/cuda-venv; no GPU needed);
# STRATA_SKIP_CUDA_TOOLCHAIN=1 skips it. tools/cuda_emu/run.sh runs every kernel on a CPU
# emulator against numpy and gguf-py references (venv at target/emu-venv, needs g++);
# STRATA_SKIP_CUDA_EMU=1 skips it. tools/llamacpp_vocab.sh checks tokenization against
# llama.cpp's test vocabularies from the llama-cpp-python sdist (downloaded from PyPI into
# target/, never committed); STRATA_SKIP_LLAMACPP_VOCAB=1 skips it.
# Without ARGS, the kernel and parity tests run a second time with STRATA_CPU_ISA=avx2,
# the paths of a machine without AVX-512, and tools/gpu_items.py runs its GPU checks' commands
# on the CPU.
# Fixtures under tests/fixtures/ are committed; tools/make_fixtures.py regenerates them
# (needs the reference stack in tools/requirements-ref.txt, never needed here).
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/clients/venv.sh
failed=()

cargo build --release --locked
cargo test --release --locked --workspace --no-fail-fast "$@" || failed+=("cargo test")
if (($# == 0)); then
  # The kernels an AVX2-only machine runs (AVX-512 capped off): against the scalar
  # references, llama.cpp's log-probs and the batching identities.
  STRATA_CPU_ISA=avx2 cargo test --release --locked --no-fail-fast --test it -- quant_matmul:: \
    llamacpp_parity:: quant_golden:: batching:: || failed+=("cargo test with STRATA_CPU_ISA=avx2")
  STRATA_CPU_ISA=avx2 cargo test --release --locked -p strata-quant -p strata-backend --lib -- panels:: cpu::bandwidth:: \
    || failed+=("AVX2 panels and probe (STRATA_CPU_ISA=avx2)")
  # The GPU machine's item checks, on the CPU: the commands and their judges stay runnable.
  python3 tools/gpu_items.py target/release/strata "$(mktemp -d)" cpu || failed+=("tools/gpu_items.py on the CPU")
fi

if [[ ${STRATA_SKIP_CUDA_TOOLCHAIN:-0} != 1 ]]; then
  tools/cuda_toolchain.sh || failed+=("CUDA kernel compiles (tools/cuda_toolchain.sh)")
fi

if [[ ${STRATA_SKIP_LLAMACPP_VOCAB:-0} != 1 ]]; then
  tools/llamacpp_vocab.sh || failed+=("tokenizer parity with llama.cpp's vocabularies (tools/llamacpp_vocab.sh)")
fi

if [[ ${STRATA_SKIP_CUDA_EMU:-0} != 1 ]]; then
  tools/cuda_emu/run.sh || failed+=("CUDA kernels on the CPU emulator (tools/cuda_emu/run.sh)")
fi

if [[ ${STRATA_SKIP_CLIENTS:-0} != 1 ]]; then
  ensure_venv target/client-venv tests/clients/requirements.txt
  # litellm pins its own openai: a venv of its own, driven from tests/clients/test_context.py.
  ensure_venv target/litellm-venv tests/clients/requirements-litellm.txt || failed+=("the litellm venv")
  target/client-venv/bin/python -m pytest tests/clients -q || failed+=("client tests (tests/clients)")
fi

if [[ ${STRATA_SKIP_SCHEMATHESIS:-0} != 1 ]]; then
  tools/schemathesis.sh || failed+=("schemathesis (tools/schemathesis.sh)")
fi

if [[ ${STRATA_SKIP_DEPLOY:-0} != 1 ]]; then
  tests/deploy.sh || failed+=("deployment checks (tests/deploy.sh)")
fi

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "all tests passed"
