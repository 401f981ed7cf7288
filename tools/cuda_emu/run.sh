#!/usr/bin/env bash
# Runs the CUDA kernels (kernels/*.cu) on the CPU against numpy references:
#   tools/cuda_emu/run.sh                 every case under ASan+UBSan, then the first case
#                                         of each kernel under ThreadSanitizer (data races)
#   tools/cuda_emu/run.sh ARGS            one run_tests.py run with ARGS, e.g. `matvec_q4_k`,
#                                         `--tsan attn`, `--python-only-check`
# Makes (or reuses) a Python venv at target/emu-venv with tools/cuda_emu/requirements.txt
# (needs python3 >= 3.11 and PyPI on first use) and g++ with C++20 and the sanitizers.
# No GPU needed. See tools/cuda_emu/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/clients/venv.sh
command -v g++ >/dev/null || { echo "tools/cuda_emu/run.sh: g++ is required" >&2; exit 1; }
ensure_venv target/emu-venv tools/cuda_emu/requirements.txt
py=target/emu-venv/bin/python
if (($#)); then
  exec "$py" tools/cuda_emu/run_tests.py "$@"
fi
status=0
"$py" tools/cuda_emu/run_tests.py || status=1
# the TSan pass leaves FAILURES.md to the full run above
"$py" tools/cuda_emu/run_tests.py --tsan --quick --no-failures-file || status=1
exit $status
