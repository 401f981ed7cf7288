#!/usr/bin/env bash
# Runs the CUDA kernels (kernels/*.cu) on the CPU against numpy references:
#   tools/cuda_emu/run.sh [run_tests.py ARGS]     e.g. tools/cuda_emu/run.sh matvec_q4_k
# Makes (or reuses) a Python venv at target/emu-venv with tools/cuda_emu/requirements.txt
# (needs python3 >= 3.11 and PyPI on first use) and g++ with C++20 and AddressSanitizer.
# No GPU needed. See tools/cuda_emu/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/clients/venv.sh
command -v g++ >/dev/null || { echo "tools/cuda_emu/run.sh: g++ is required" >&2; exit 1; }
ensure_venv target/emu-venv tools/cuda_emu/requirements.txt
exec target/emu-venv/bin/python tools/cuda_emu/run_tests.py "$@"
