#!/usr/bin/env python3
"""Runs Strata's CUDA kernels (kernels/*.cu) on the CPU and checks them against numpy.

Usage:
    tools/cuda_emu/run_tests.py [--python-only-check] [--no-sanitize] [--tsan] [--quick]
                                [--jobs N] [--no-failures-file] [FILTER]

    FILTER          substring of a case name (e.g. `matvec_q4_k`, `attn`, `selftest`);
                    only matching cases run.
    --python-only-check
                    no compiler: checks the harness itself (its ABI table against
                    kernels/README.md, its numpy reference decoders against a second
                    implementation) and exits.
    --no-sanitize   build without AddressSanitizer/UBSan (faster, catches less).
    --tsan          build with ThreadSanitizer instead (reports data races between the
                    threads of a block, e.g. a missing __syncthreads; slower).
    --quick         only the first case of each kernel (and every emulator selftest).
    --no-failures-file
                    do not update tools/cuda_emu/FAILURES.md.

Needs Python 3 with numpy and gguf (tools/cuda_emu/run.sh makes a venv with both) and
g++ with C++20. Exit status: 0 when every case passes, 1 otherwise (a kernel missing from
its .cu file, or a difference between harness.py's ABI table and kernels/README.md, counts
as a failure).

Files: this entry point runs the worker child processes, FAILURES.md, --python-only-check
and the report; harness.py builds the libraries and holds the ABI table, the ctypes device
buffers (Ctx, Buf), the comparisons and the weight formats; cases/ has the cases of each
kernel file (cases/__init__.py's FILES maps a .cu file to its cases and signatures).

What it does: for each .cu file of kernels/README.md that exists, it concatenates
common.cuh (+ quant.cuh for embedding/dequant/matvec/matvec_packed) + the .cu (with #line markers, so
reports name the real files) + small extern "C" host wrappers, one per kernel, and builds
a shared library with g++ -std=c++20 -O1 -include tools/cuda_emu/emu.hpp (by default also
-fsanitize=address,undefined). emu.hpp runs each block's threads as real concurrent
threads with CUDA's __syncthreads / warp-shuffle semantics (see its header). Each kernel
file's cases run in a child process (so a sanitizer abort or a hang only fails that
case); every case launches with exactly the grid/block README.md gives, on exactly-sized
buffers (so ASan sees any out-of-bounds access), with outputs pre-filled with NaN (so
unwritten outputs fail) and inputs checked to be unchanged afterwards. Results are
compared with an independent numpy reference (float64) by NMSE = Σ(a−b)²/Σb²:
≤ 1e-7 for elementwise/add_rows/norm/rope/embedding/dequant, ≤ 5e-4 for matvec/attention;
exact for row gathers, for pure decodes (f32 f16 bf16 q4_0 q5_0 q8_0 mxfp4 i8 embedding rows, f32->f16), for
argmax/top-k indices and values. Weight formats use gguf-py's `gguf.quants` (quantize
where it can, otherwise random blocks with sane f16 scales; `gguf.quants.dequantize` is
the reference decode); affine_q4 and i8 are decoded from crates/strata-quant/src/{affine_q4,int8}.rs.
One line per case is printed; failing cases are also written to
tools/cuda_emu/FAILURES.md (entries of cases that pass again are removed).

What it proves: that the kernels index, decode and compute correctly for the tested
shapes under CUDA's execution model as far as real threads expose it: barrier and
warp-intrinsic participation rules, shared-memory use across barriers, bounds of every
global buffer. What it does not prove: performance, behaviour under the GPU's weaker
memory model or true warp lock-step (races that x86 hides may remain; --tsan reports
the ones ThreadSanitizer sees in the tested runs), shared-memory
size limits, register pressure, NVRTC-specific compile errors (this is g++), and exact
GPU float results (fast-math intrinsics such as __expf are exact here).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness import (BLOCK, COMPANIONS, CaseFail, Ctx, FAILURES, FMTS, KDIR, Lib, QUANT_FILES, build,
                     check_abi_table, make_weights, seed_of)
from cases import FILES
from cases.attention import attn_ref_combine, attn_ref_partial, attn_ref_sinks
from cases.quant import MXFP4_DECODE_EXPS


MODE = "asan"  # the sanitizer mode of this run (set by main / the worker's --mode)


QUICK = False  # --quick: only the first case of each kernel


def selected_cases(file, flt):
    cs = [c for c in FILES[file][0]() if (not flt or flt in c.id) and MODE in c.modes]
    if QUICK:
        seen: set[str] = set()
        quick = []
        for c in cs:
            if c.kernel not in seen or c.expect_error is not None:
                quick.append(c)
                seen.add(c.kernel)
        cs = quick
    return cs


# ---------------------------------------------------------------- worker (child process)
def load_lib(file, so):
    lib = Lib(so)
    lib.set_sigs([s for s in FILES[file][1] if hasattr(lib.lib, "emuw_" + s[0])])
    return lib


def worker(file, so, flt, start, also=()):
    """`also`: FILE=SO of each companion library (COMPANIONS)."""
    import numpy as np
    lib = load_lib(file, so)
    others = [load_lib(*a.split("=", 1)) for a in also]
    cases = selected_cases(file, flt)
    for i, case in enumerate(cases):
        if i < start:
            continue
        print(f"@@START {i}", flush=True)
        rng = np.random.default_rng(seed_of(case.id))
        ctx = Ctx(lib, others)
        t0 = time.time()
        try:
            detail = case.run(ctx, rng)
            ctx.check_inputs()
            status = "PASS"
        except CaseFail as e:
            detail = str(e)
            status = "MISSING" if detail.startswith("MISSING") else "FAIL"
        except Exception as e:  # a harness bug: report it, keep going
            import traceback
            detail = "harness exception: " + "".join(traceback.format_exception_only(type(e), e)).strip() + \
                     "\n" + traceback.format_exc(limit=4)
            status = "FAIL"
        finally:
            ctx.free()
        print("@@RESULT " + json.dumps({"i": i, "status": status, "detail": detail,
                                        "launch": ctx.launch_desc, "secs": time.time() - t0}), flush=True)
    return 0


def sanitizer_env(mode):
    env = dict(os.environ)
    if mode == "asan":
        # libstdc++ preloaded too: otherwise ASan's __cxa_throw interceptor finds no real
        # __cxa_throw (python itself is not C++) and aborts on the emulator's first throw
        libs = [subprocess.run(["g++", f"-print-file-name={l}"], capture_output=True, text=True).stdout.strip()
                for l in ("libasan.so", "libstdc++.so")]
        env["LD_PRELOAD"] = " ".join(libs)
        env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:print_summary=1:allocator_may_return_null=1"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    elif mode == "tsan":
        libs = [subprocess.run(["g++", f"-print-file-name={l}"], capture_output=True, text=True).stdout.strip()
                for l in ("libtsan.so", "libstdc++.so")]
        env["LD_PRELOAD"] = " ".join(libs)
        env["TSAN_OPTIONS"] = "halt_on_error=1:report_signal_unsafe=0"
    return env


def crash_summary(stderr: str) -> str:
    """The informative lines of a sanitizer / emulator report."""
    keep = []
    lines = stderr.splitlines()
    for i, l in enumerate(lines):
        if re.search(r"ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer|EMU (ERROR|FATAL)|"
                     r"(READ|WRITE) of size|located \d+ bytes|is located|SUMMARY:|Previous (write|read)|^EMU: ", l):
            keep.append(l.strip())
            # the top user frames
            for l2 in lines[i + 1:i + 8]:
                if re.match(r"\s+#\d+ ", l2) and re.search(r"\.cuh?:\d+", l2):
                    keep.append("  " + l2.strip())
    if not keep:
        keep = [l for l in lines if l.strip()][-15:]
    out, seen = [], set()
    for l in keep:
        if l not in seen:
            out.append(l)
            seen.add(l)
    return "\n".join(out[:30])


def run_file(file, so, flt, mode, timeout=600, also=()):
    """Runs every case of `file` in child processes (with the companion libraries
    `also`, FILE=SO each); returns a list of result dicts."""
    cases = selected_cases(file, flt)
    results: dict[int, dict] = {}
    start = 0
    env = sanitizer_env(mode)
    while start < len(cases):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", file, "--so", str(so),
               "--mode", mode, "--start", str(start)] + [f"--also={a}" for a in also] + \
            (["--quick"] if QUICK else []) + [flt or ""]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
                f"\nEMU FATAL: worker timed out after {timeout} s"
            rc = -9
        last_start = None
        for line in out.splitlines():
            if line.startswith("@@START "):
                last_start = int(line.split()[1])
            elif line.startswith("@@RESULT "):
                r = json.loads(line[len("@@RESULT "):])
                results[r["i"]] = r
                last_start = None
        if rc == 0 and last_start is None:
            break
        # the child died in case `last_start` (or before any case started)
        bad = last_start if last_start is not None else start
        summ = crash_summary(err)
        results[bad] = {"i": bad, "status": "FAIL", "launch": "",
                        "detail": f"child process died (exit {rc}) in this case:\n{summ}", "secs": 0.0,
                        "crash": True}
        start = bad + 1
    out = []
    for i, c in enumerate(cases):
        r = results.get(i, {"status": "FAIL", "detail": "no result (harness bug)", "launch": "", "secs": 0})
        r = dict(r)
        r["id"], r["kernel"], r["file"] = c.id, c.kernel, file
        if c.expect_error is not None:  # a deliberately broken selftest kernel
            if r["status"] == "FAIL" and c.expect_error in r["detail"]:
                r["status"], r["detail"] = "PASS", "detected: " + r["detail"].splitlines()[0][:160] \
                    if not r.get("crash") else "detected: " + next(
                        (l for l in r["detail"].splitlines() if c.expect_error in l), "")[:160]
            else:
                r["status"] = "FAIL"
                r["detail"] = f"expected an error containing {c.expect_error!r}, got: {r['status']} {r['detail']}"
        out.append(r)
    return out


# ---------------------------------------------------------------- FAILURES.md
FAIL_HEADER = """# Kernel failures found by the CPU emulator

Written by `tools/cuda_emu/run_tests.py` (entries of cases that pass again are removed on
the next run that includes them). Each entry: kernel, case, launch, what differed, the
first bad indices and, where the source shows it, a diagnosis (lines starting with
`Diagnosis:` are kept across runs). Reproduce one case with
`tools/cuda_emu/run.sh 'CASE NAME'` (any substring of the case name works as a filter).

"""


def parse_failures(text):
    entries = {}
    for m in re.finditer(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S):
        entries[m.group(1).strip()] = m.group(2)
    return entries


def update_failures(results, ran_ids, path=FAILURES):
    path = Path(path)
    old = parse_failures(path.read_text()) if path.exists() else {}
    entries = {k: v for k, v in old.items() if k not in ran_ids}
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in results:
        if r["status"] == "PASS":
            continue
        diag = [l for l in old.get(r["id"], "").splitlines() if l.startswith("Diagnosis:")]
        body = [f"- kernel: `{r['kernel']}` (kernels/{r['file']})" if r["file"] != "selftest.cu"
                else "- emulator selftest (tools/cuda_emu/selftest.cu)"]
        if r.get("launch"):
            body.append(f"- launch: {r['launch']}")
        body.append(f"- status: {r['status']} (last seen {now})")
        body.append("- what differed:")
        body.append("```")
        body.append(r["detail"].rstrip())
        body.append("```")
        body += diag
        entries[r["id"]] = "\n".join(body) + "\n\n"
    if not entries:
        text = FAIL_HEADER + "No failures: every case of the last run passed.\n"
    else:
        text = FAIL_HEADER + "".join(f"## {k}\n{v}" for k, v in sorted(entries.items()))
    path.write_text(text)


# ---------------------------------------------------------------- python-only self check
def python_only_check() -> int:
    import numpy as np
    ok = True

    def say(good, what):
        nonlocal ok
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} python-check {what}")

    probs = check_abi_table()
    say(not probs, "ABI table matches kernels/README.md" + ("" if not probs else ":\n  " + "\n  ".join(probs)))
    rng = np.random.default_rng(1)
    # affine_q4 / i8 decoders against a direct loop over the Rust layout
    raw, ref = make_weights("affine_q4", 2, 256, rng)
    loop = []
    for blk in raw.reshape(-1, 68):
        sc = float(blk[0:2].view(np.float16)[0])
        bi = float(blk[2:4].view(np.float16)[0])
        for i in range(128):
            lv = blk[4 + i] & 0xF if i < 64 else blk[4 + i - 64] >> 4
            loop.append(np.float32(np.float32(lv) * np.float32(sc) + np.float32(bi)))
    say(np.array_equal(np.array(loop, np.float32), ref.ravel()), "affine_q4 decoder matches a per-value loop")
    raw, ref = make_weights("i8", 3, 64, rng)
    loop = [np.float32(np.float32(np.int8(b[4 + i].astype(np.int8))) * b[0:4].view(np.float32)[0])
            for b in raw.reshape(-1, 36) for i in range(32)]
    say(np.array_equal(np.array(loop, np.float32), ref.ravel()), "i8 decoder matches a per-value loop")
    rows_same = np.all(raw.reshape(3, 2, 36)[:, :, :4] == raw.reshape(3, 2, 36)[:, :1, :4])
    say(bool(rows_same), "i8 test weights repeat one scale per row")
    # gguf Q4_0 reference against a hand decode of the GGML layout
    raw, ref = make_weights("q4_0", 1, 64, rng)
    hand = []
    for b in raw.reshape(-1, 18):
        d = np.float32(b[0:2].view(np.float16)[0])
        qs = b[2:]
        hand += [np.float32((int(qs[j] & 0xF) - 8)) * d for j in range(16)]
        hand += [np.float32((int(qs[j] >> 4) - 8)) * d for j in range(16)]
    say(np.array_equal(np.array(hand, np.float32), ref.ravel()), "gguf Q4_0 decode matches the GGML layout")
    # gguf MXFP4 reference against a hand decode of crates/strata-quant/src/mxfp4.rs's layout,
    # over the edge blocks (exponents 0, 1, 2, 254, every nibble)
    kvalues = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
    hand = []
    with np.errstate(over="ignore"):  # e = 254: |value| >= 4 is past f32's range, inf as in ggml
        raw, ref = make_weights("mxfp4", 1, 256, rng, MXFP4_DECODE_EXPS)
    for b in raw.reshape(-1, 17):
        d = np.float32(2.0 ** (int(b[0]) - 128))
        with np.errstate(over="ignore"):
            hand += [np.float32(kvalues[b[1 + j] & 0xF]) * d for j in range(16)]
            hand += [np.float32(kvalues[b[1 + j] >> 4]) * d for j in range(16)]
    nibbles = {int(x) for b in raw.reshape(-1, 17)[:4] for x in np.concatenate([b[1:] & 0xF, b[1:] >> 4])}
    good = np.array_equal(np.array(hand, np.float32).view(np.uint32), ref.ravel().view(np.uint32))
    say(good and nibbles == set(range(16)) and list(raw.reshape(-1, 17)[:4, 0]) == list(MXFP4_DECODE_EXPS),
        "gguf MXFP4 decode matches the GGML layout (exponents 0, 1, 2, 254, every nibble)")
    for fmt in FMTS:
        bs, ts = BLOCK[fmt]
        raw, ref = make_weights(fmt, 3, 512, rng)
        good = raw.shape == (3, 512 // bs * ts) and np.isfinite(ref).all() and 0.01 < np.abs(ref).mean() < 10
        say(bool(good), f"{fmt} test weights: {raw.shape[1]} bytes/row, mean |w| {np.abs(ref).mean():.3g}")
    # attention reference: one split equals plain softmax attention
    q = rng.standard_normal((2, 4 * 8)).astype(np.float32)
    k = rng.standard_normal((6, 2 * 8)).astype(np.float32)
    v = rng.standard_normal((6, 2 * 8)).astype(np.float32)
    p1 = attn_ref_combine(attn_ref_partial(q, k, v, 4, 4, 2, 8, 0.3, 0, 100, 1), 8)
    p3 = attn_ref_combine(attn_ref_partial(q, k, v, 4, 4, 2, 8, 0.3, 0, 2, 3), 8)
    say(bool(np.allclose(p1, p3)), "attention reference: splits merge to the single-split result")
    c1 = attn_ref_combine(attn_ref_partial(q, k, v, 4, 4, 2, 8, 0.3, 0, 100, 1, 0.7), 8)
    c3 = attn_ref_combine(attn_ref_partial(q, k, v, 4, 4, 2, 8, 0.3, 0, 2, 3, 0.7), 8)
    say(bool(np.allclose(c1, c3)) and not np.allclose(c1, p1), "attention reference: softcapped splits merge too")
    sk = np.array([0.5, -1.0, 3.0, -np.inf], np.float32)
    s3 = attn_ref_combine(attn_ref_partial(q, k, v, 4, 4, 2, 8, 0.3, 0, 2, 3), 8, sk)
    sw = attn_ref_sinks(q, k, v, 4, 4, 2, 8, 0.3, 0, sk)
    say(bool(np.allclose(s3.reshape(sw.shape), sw)) and not np.allclose(s3, p3)
        and bool(np.allclose(s3[:, 3], p3[:, 3])), "attention reference: sinks merge over splits, -inf is none")
    total = sum(len(FILES[f][0]()) for f in FILES)
    say(total > 0, f"{total} cases generated")
    return 0 if ok else 1


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("filter", nargs="?", default="")
    ap.add_argument("--python-only-check", action="store_true")
    ap.add_argument("--no-sanitize", action="store_true")
    ap.add_argument("--tsan", action="store_true")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--no-failures-file", action="store_true")
    ap.add_argument("--failures-file", default=str(FAILURES), help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--so", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--also", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    global MODE, QUICK
    QUICK = a.quick
    MODE = a.mode or ("tsan" if a.tsan else ("none" if a.no_sanitize else "asan"))
    if a.worker:
        return worker(a.worker, a.so, a.filter, a.start, a.also)
    if a.python_only_check:
        return python_only_check()
    t0 = time.time()
    mode = MODE
    probs = check_abi_table()
    for p in probs:  # the harness must follow README.md: drift fails the run
        print(f"FAIL    ABI table vs kernels/README.md: {p}")

    files = []
    missing_files = []
    for f in FILES:
        if f != "selftest.cu" and not (KDIR / f).exists():
            missing_files.append(f)
            continue
        if selected_cases(f, a.filter):
            files.append(f)
    if not (KDIR / "common.cuh").exists():
        files = [f for f in files if f == "selftest.cu"]
        missing_files = [f for f in FILES if f != "selftest.cu"]
    if any(f in QUANT_FILES for f in files) and not (KDIR / "quant.cuh").exists():
        missing_files += [f for f in files if f in QUANT_FILES]
        files = [f for f in files if f not in QUANT_FILES]

    results = []
    n_fail = 0

    def build_and_run(f):
        so, log, dropped = build(f, FILES[f][1], mode)
        if so is None:
            errs = "\n".join(l for l in log.splitlines() if "error" in l)[:3000] or log[-3000:]
            return [{"id": c.id, "kernel": c.kernel, "file": f, "status": "FAIL", "launch": "", "secs": 0,
                     "detail": f"does not compile (g++ with emu.hpp):\n{errs}"} for c in selected_cases(f, a.filter)]
        also = []
        for cf_ in COMPANIONS.get(f, []):
            cso, clog, _ = build(cf_, FILES[cf_][1], mode)
            if cso is None:
                errs = "\n".join(l for l in clog.splitlines() if "error" in l)[:3000] or clog[-3000:]
                return [{"id": c.id, "kernel": c.kernel, "file": f, "status": "FAIL", "launch": "", "secs": 0,
                         "detail": f"its companion {cf_} does not compile (g++ with emu.hpp):\n{errs}"}
                        for c in selected_cases(f, a.filter)]
            also.append(f"{cf_}={cso}")
        rs = run_file(f, so, a.filter, mode, also=also)
        for r in rs:
            if r["kernel"] in dropped:
                r["status"] = "FAIL"
                r["detail"] = f"`{r['kernel']}`'s parameters differ from kernels/README.md (conflicting declaration)"
        return rs

    with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        # the slowest files first, so that the 1024-thread sample kernels overlap the rest
        slow = ["sample.cu", "attention.cu", "matvec_packed.cu", "matvec.cu", "selftest.cu"]
        order = sorted(files, key=lambda f: slow.index(f) if f in slow else len(slow))
        futs = {f: ex.submit(build_and_run, f) for f in order}
        for f in files:  # print in a stable order
            rs = futs[f].result()
            for r in rs:
                first = r["detail"].splitlines()[0] if r["detail"] else ""
                print(f"{r['status']:7} {r['id']}  ({r['secs']:.1f}s) {first}", flush=True)
                if r["status"] != "PASS":
                    for l in r["detail"].splitlines()[1:8]:
                        print(f"        {l}")
                    n_fail += 1
            results += rs
    for f in missing_files:
        for c in selected_cases(f, a.filter):
            r = {"id": c.id, "kernel": c.kernel, "file": f, "status": "MISSING", "launch": "", "secs": 0,
                 "detail": f"MISSING: kernels/{f} (or common.cuh/quant.cuh) does not exist yet"}
            results.append(r)
        if selected_cases(f, a.filter):
            print(f"MISSING kernels/{f}: {len(selected_cases(f, a.filter))} cases not run")
            n_fail += len(selected_cases(f, a.filter))
    if not a.no_failures_file:
        update_failures([r for r in results if r["status"] != "MISSING" or r["file"] not in missing_files],
                        {r["id"] for r in results}, a.failures_file)
    npass = sum(r["status"] == "PASS" for r in results)
    print(f"{npass} passed, {len(results) - npass} failed or missing, {time.time() - t0:.1f}s "
          f"(sanitizer: {mode})")
    return 0 if n_fail == 0 and not probs else 1


if __name__ == "__main__":
    sys.exit(main())
