#!/usr/bin/env bash
# Checks the CUDA kernels compile, without a GPU or a CUDA install: NVRTC and ptxas come
# from pinned pip wheels (tools/requirements-cuda.txt) in a venv at target/cuda-venv.
#   1. `strata doctor --json` with no library hints succeeds (and says whether this
#      machine has NVRTC of its own).
#   2. `strata doctor --compile-kernels --json` with STRATA_CUDA_LIBS pointing at the
#      wheel's lib directory compiles every kernels/*.cu for sm_80, sm_86, sm_89 and
#      sm_90 (a cubin each, plus PTX for compute_XY) with no error.
#   3. The wheel's ptxas assembles every PTX file in the kernel cache for its sm_XY.
#   4. tools/check_packed_ptx.py: the sm_90 PTX of matvec_packed_*, matvec_glu_packed_*,
#      matvec_add_packed_* and matvec_multi_packed_* reads weights with 16-byte vector
#      loads and ptxas -v spills nothing for them; so do the F32/F16/BF16 ones and
#      attn_group_* for sm_80 to sm_90 (K/V head slices staged in shared memory).
#   5. tests/it/doctor.rs runs again with STRATA_TEST_NVRTC_LIBS set: one kernel compiled
#      twice (the second from the cache) and a corrupted cache entry recompiled.
# Needs python3 >= 3.11 and PyPI on first use; STRATA_BIN (default target/release/strata,
# built if missing). tests/run.sh runs this unless STRATA_SKIP_CUDA_TOOLCHAIN=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/clients/venv.sh

bin=${STRATA_BIN:-$PWD/target/release/strata}
[[ -x $bin ]] || cargo build --release --locked
venv=target/cuda-venv
ensure_venv "$venv" tools/requirements-cuda.txt
py=$venv/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
libdir=$site/nvidia/cuda_nvrtc/lib
ptxas=$site/nvidia/cuda_nvcc/bin/ptxas
[[ -f $libdir/libnvrtc.so.12 ]] || { echo "cuda_toolchain: no libnvrtc.so.12 in $libdir" >&2; exit 1; }
[[ -x $ptxas ]] || { echo "cuda_toolchain: no ptxas at $ptxas" >&2; exit 1; }

work=$(mktemp -d -t strata-cuda-toolchain.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== strata doctor --json (no library hints)"
env -u STRATA_CUDA_LIBS -u VIRTUAL_ENV STRATA_HOME="$work/plain" "$bin" doctor --json >"$work/plain.json"
"$py" - "$work/plain.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is True, d
for key in ("cpu", "ram", "odirect", "cuda", "gpus"):
    assert key in d, f"no {key!r} in the report"
n = d["cuda"]["nvrtc"]
print("NVRTC on this machine:", f"{n['version']} at {n['path']}" if n["present"] else f"absent ({n['reason'][:60]}...)")
print("driver:", d["cuda"]["driver"]["reason"] or d["cuda"]["driver"]["version"])
PY

echo "== strata doctor --compile-kernels --json (NVRTC from $libdir)"
status=0
STRATA_CUDA_LIBS=$libdir STRATA_HOME="$work/home" "$bin" doctor --compile-kernels --json >"$work/kernels.json" || status=$?
"$py" - "$work/kernels.json" "$status" "$work/ptx.list" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
status = int(sys.argv[2])
k = d["kernels"]
assert k["error"] is None, k["error"]
files = ["elementwise", "norm", "rope", "embedding", "dequant", "matvec", "matvec_packed", "attention", "sample", "rows"]
archs = ["sm_80", "sm_86", "sm_89", "sm_90"]
got = {(r["file"], r["arch"]): r for r in k["results"]}
problems = []
for f in files:
    for a in archs:
        r = got.get((f, a))
        if r is None:
            problems.append(f"{f} {a}: not compiled")
            continue
        for part in ("image", "ptx"):
            if r[part]["error"]:
                problems.append(f"{f} {a} {part}: {r[part]['error']}")
        if r["image"]["kind"] != "cubin":
            problems.append(f"{f} {a}: {r['image']['kind']} instead of a cubin")
        if r["ptx"].get("missing"):
            problems.append(f"{f} {a}: PTX lacks {r['ptx']['missing']}")
        if r["functions"] == 0:
            problems.append(f"{f}: declares no extern \"C\" kernel")
if problems:
    sys.exit("kernel compiles failed:\n  " + "\n  ".join(problems))
assert status == 0, f"doctor exited {status} with every compile ok"
with open(sys.argv[3], "w") as out:
    for r in k["results"]:
        sm = re.fullmatch(r"sm_(\d+)", r["arch"]).group(1)
        out.write(f"{sm} {r['ptx']['path']}\n")
print(f"{len(k['results'])} compiles (NVRTC {k['nvrtc_version']}), "
      f"{sum(r['image']['bytes'] for r in k['results'])} bytes of SASS")
PY

echo "== ptxas on every cached PTX"
# One ptxas per core; each prints its file on failure.
xargs -P "$(nproc)" -L 1 sh -c '"$0" -arch=sm_$1 "$2" -o /dev/null || { echo "ptxas -arch=sm_$1 $2 failed" >&2; exit 255; }' "$ptxas" \
  <"$work/ptx.list"
echo "ptxas $("$ptxas" --version | tail -1 | sed 's/^Build //'): $(wc -l <"$work/ptx.list") PTX files assemble"

echo "== packed matvecs: 16-byte weight loads, no spills (sm_90)"
"$py" tools/check_packed_ptx.py "$ptxas" sm_90 "$(awk '$1 == 90 && $2 ~ /\/matvec_packed-/ { print $2 }' "$work/ptx.list")"

echo "== element formats' packed matvecs: 16-byte weight loads, no spills (sm_80, sm_86, sm_89, sm_90)"
for sm in 80 86 89 90; do
  "$py" tools/check_packed_ptx.py "$ptxas" "sm_$sm" "$(awk -v sm=$sm '$1 == sm && $2 ~ /\/matvec_packed-/ { print $2 }' "$work/ptx.list")" elements
done

echo "== grouped attention: 16-byte K/V loads, no spills (sm_80, sm_86, sm_89, sm_90)"
for sm in 80 86 89 90; do
  "$py" tools/check_packed_ptx.py "$ptxas" "sm_$sm" "$(awk -v sm=$sm '$1 == sm && $2 ~ /\/attention-/ { print $2 }' "$work/ptx.list")" attention
done

echo "== tests/it/doctor.rs with NVRTC"
STRATA_TEST_NVRTC_LIBS=$libdir cargo test --release --locked --test it -- doctor:: --test-threads 1
