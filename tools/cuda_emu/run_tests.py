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
its .cu file, or a difference between this file's ABI table and kernels/README.md, counts
as a failure).

What it does: for each .cu file of kernels/README.md that exists, it concatenates
common.cuh (+ quant.cuh for embedding/dequant/matvec) + the .cu (with #line markers, so
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
import ctypes
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KDIR = Path(os.environ.get("CUDA_EMU_KERNELS", ROOT / "kernels")).resolve()  # override: mutation tests
BUILD = ROOT / "target" / "cuda_emu"
FAILURES = HERE / "FAILURES.md"

# The formats with a packed layout (kernels/README.md, "Packed weights").
PACKED_FMTS = ["q4_0", "q8_0", "q4_k", "q5_k", "q6_k"]
# The formats the packed matvecs also read in their stored layout (rows 16-byte aligned).
ALIGNED_FMTS = ["f32", "f16", "bf16"]
# Per packed format: the byte range of a stored block that holds its quants (the rest of
# the block, in stored order, is the block's scales).
PACKED_QUANTS = {"q4_0": (2, 18), "q8_0": (2, 34), "q4_k": (16, 144), "q5_k": (16, 176), "q6_k": (0, 192)}
FMTS = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "q4_k", "q5_k",
        "q6_k", "affine_q4", "i8"]

# ---------------------------------------------------------------- the binding ABI
# Signatures exactly as kernels/README.md gives them (checked against it by
# --python-only-check and at every run).
SIGS: dict[str, list[tuple[str, str]]] = {
    "elementwise.cu": [
        ("add_f32", "float* x, const float* y, unsigned n"),
        ("add_bias_f32", "float* x, const float* b, unsigned rows, unsigned width"),
        ("silu_mul_f32", "float* g, const float* u, unsigned n"),
        ("gelu_mul_f32", "float* g, const float* u, unsigned n"),
        ("sigmoid_mul_f32", "float* g, const float* u, unsigned n"),
        ("swiglu_oai_f32", "float* g, const float* u, unsigned n, float alpha, float limit"),
        ("scale_f32", "float* x, unsigned n, float factor"),
        ("softcap_f32", "float* x, unsigned n, float cap"),
        ("f32_to_f16", "const float* x, unsigned short* y, unsigned long long n"),
    ],
    "rows.cu": [
        ("gather_rows_f32", "const float* src, const unsigned* rows, float* dst, unsigned row_len, "
                            "unsigned n_rows"),
        ("add_rows_f32", "float* x, const float* y, const unsigned* rows, const float* w, "
                         "unsigned row_len, unsigned n_rows"),
        ("copy_cols_f32", "const float* src, unsigned src_stride, float* dst, unsigned dst_stride, "
                          "unsigned width, unsigned n_rows"),
    ],
    "norm.cu": [
        ("rms_norm_f32", "const float* x, const float* w, float* out, unsigned dim, float eps"),
    ],
    "rope.cu": [
        ("rope_f32", "float* x, const unsigned* pos, const float* inv_freq, unsigned n_heads, "
                     "unsigned head_dim, unsigned n_pairs, float attn_factor, int interleaved"),
    ],
    "embedding.cu": [
        (f"embed_{f}", "const unsigned char* table, const unsigned* ids, float* out, unsigned dim")
        for f in FMTS
    ] + [
        (f"embed_packed_{f}", "const unsigned char* q, const unsigned short* d, const unsigned* ids, float* out, "
                              "unsigned dim")
        for f in PACKED_FMTS
    ],
    "dequant.cu": [
        (f"dequant_{f}_f16", "const unsigned char* w, unsigned short* out, unsigned long long n")
        for f in FMTS
    ] + [
        (f"dequant_packed_{f}_f16", "const unsigned char* q, const unsigned short* d, unsigned short* out, "
                                    "unsigned long long n")
        for f in PACKED_FMTS
    ],
    "matvec.cu": [
        (f"matvec_{kind}{f}", "const unsigned char* w, const float* x, float* y, unsigned rows, "
                              "unsigned out, unsigned in")
        for kind in ("", "wide_") for f in FMTS
    ] + [
        (f"matvec_packed_{f}", "const unsigned char* q, const unsigned short* d, const float* x, float* y, "
                               "unsigned rows, unsigned out, unsigned in")
        for f in PACKED_FMTS + ALIGNED_FMTS
    ] + [
        (f"matvec_glu_packed_{f}", "const unsigned char* qg, const unsigned short* dg, const unsigned char* qu, "
                                   "const unsigned short* du, const float* x, float* y, unsigned rows, "
                                   "unsigned out, unsigned in, unsigned act, float alpha, float limit")
        for f in PACKED_FMTS + ALIGNED_FMTS
    ] + [
        (f"matvec_add_packed_{f}", "const unsigned char* q, const unsigned short* d, const float* x, float* y, "
                                   "unsigned rows, unsigned out, unsigned in")
        for f in PACKED_FMTS + ALIGNED_FMTS
    ] + [
        (f"matvec_multi_packed_{f}", "const unsigned char* q0, const unsigned short* d0, float* y0, unsigned out0, "
                                     "const unsigned char* q1, const unsigned short* d1, float* y1, unsigned out1, "
                                     "const unsigned char* q2, const unsigned short* d2, float* y2, unsigned out2, "
                                     "const float* x, unsigned rows, unsigned in")
        for f in PACKED_FMTS + ALIGNED_FMTS
    ],
    "attention.cu": [
        ("attn_partial_f32", "const float* q, const float* k, const float* v, float* part, "
                             "unsigned start_pos, unsigned n_heads, unsigned n_kv_heads, "
                             "unsigned head_dim, float scale, float softcap, unsigned window, "
                             "unsigned split_len"),
        ("attn_combine_f32", "const float* part, float* out, unsigned splits, unsigned head_dim"),
        ("attn_combine_sinks_f32", "const float* part, const float* sinks, float* out, unsigned splits, "
                                   "unsigned n_heads, unsigned head_dim"),
    ] + [
        (f"attn_partial_{t}", "const float* q, const float* k, const float* v, float* part, "
                              "unsigned start_pos, unsigned n_heads, unsigned n_kv_heads, "
                              "unsigned head_dim, float scale, float softcap, unsigned window, "
                              "unsigned split_len")
        for t in ("f16", "q8_0")
    ] + [
        (f"attn_group_{t}", "const float* q, const float* k, const float* v, float* part, "
                            "unsigned start_pos, unsigned n_heads, unsigned n_kv_heads, "
                            "unsigned head_dim, float scale, float softcap, unsigned window, "
                            "unsigned split_len")
        for t in ("f32", "f16", "q8_0")
    ] + [
        (f"kv_store_{t}", "const float* src, const unsigned* rows, float* dst, unsigned width, unsigned n_rows")
        for t in ("f16", "q8_0")
    ] + [
        (f"rope_store_{t}", "float* q, const float* k, const float* v, float* k_cache, float* v_cache, "
                            "unsigned pos0, unsigned n_heads, unsigned n_kv_heads, unsigned head_dim, "
                            "unsigned n_pairs, const float* inv_freq, float attn_factor, int interleaved")
        for t in ("f32", "f16", "q8_0")
    ],
    "deltanet.cu": [
        ("delta_conv_f32", "const float* qkvz, const float* conv_w, float* state, float* mixed, unsigned n, "
                           "unsigned nk, unsigned nv, unsigned dk, unsigned dv, unsigned taps, int grouped"),
        ("delta_rule_f32", "const float* mixed, const float* qkvz, const float* ba, const float* neg_a, "
                           "const float* dt_bias, const float* norm_w, float* s, float* out, unsigned n, "
                           "unsigned nk, unsigned nv, unsigned dk, unsigned dv, int qkvz_grouped, "
                           "int ba_grouped, int v_tiled, float eps"),
    ],
    "sample.cu": [
        ("argmax_f32", "const float* logits, unsigned vocab, unsigned* idx, float* val, float* lse"),
        ("topk_f32", "const float* logits, unsigned vocab, unsigned k, unsigned* idx, float* val, "
                     "float* lse"),
    ],
}
QUANT_FILES = {"embedding.cu", "dequant.cu", "matvec.cu"}
# The GLU activations of matvec_glu_packed_FMT: their `act` codes (common.cuh's
# STRATA_GLU_*) and the unfused kernel of each (elementwise.cu).
GLU_ACTS = {"silu": (0, "silu_mul_f32"), "gelu_tanh": (1, "gelu_mul_f32"), "sigmoid": (2, "sigmoid_mul_f32"),
            "swiglu_oai": (3, "swiglu_oai_f32")}
# Files whose kernels a file's cases launch too, from their own libraries in the same
# process (the fused GLU matvec's cases run the unfused matvec and GLU kernels, the fused
# RoPE + KV store's cases rope_f32 and the stores).
COMPANIONS = {"matvec.cu": ["elementwise.cu"], "attention.cu": ["rope.cu"]}
SELFTEST_SIGS = [
    ("st_block_sum", "const float* x, float* out, unsigned n"),
    ("st_shuffles", "const float* x, float* out"),
    ("st_rotate", "const float* x, float* out, unsigned rounds"),
    ("st_block_maxsum", "const float* x, float* out, unsigned n"),
    ("st_partial_warp", "const float* x, float* out"),
    ("bad_early_return", "const float* x, float* out, unsigned n"),
    ("bad_missing_lane", "const float* x, float* out"),
    ("bad_missing_lane_deadlock", "const float* x, float* out"),
    ("bad_divergent_sync", "const float* x, float* out"),
    ("bad_oob_write", "const float* x, float* out, unsigned n"),
    ("bad_race", "const float* x, float* out"),
    ("bad_misaligned", "const float* x, float* out"),
]


def parse_params(s: str) -> list[tuple[str, str]]:
    out = []
    for p in s.split(","):
        p = " ".join(p.split())
        m = re.match(r"(.*?)\s*(\w+)$", p)
        assert m, p
        out.append((m.group(1).replace(" *", "*"), m.group(2)))
    return out


def ctype_of(t: str):
    import ctypes as c
    if "*" in t:
        return c.c_void_p
    return {"unsigned": c.c_uint, "unsigned long long": c.c_ulonglong, "float": c.c_float,
            "int": c.c_int}[t]


def readme_sigs() -> dict[str, str]:
    """kernel name -> parameter string, from the table in kernels/README.md."""
    text = (KDIR / "README.md").read_text()
    sigs = {}
    for m in re.finditer(r"\|\s*`(\w+)\(([^`]*)\)`", text):
        name, params = m.group(1), m.group(2)
        if "_FMT" in name or "FMT_" in name:
            for f in FMTS:
                sigs[name.replace("FMT", f)] = params
        else:
            sigs[name] = params
    return sigs


def check_abi_table() -> list[str]:
    """Differences between SIGS and README.md (empty when they agree)."""
    try:
        rs = readme_sigs()
    except OSError as e:
        return [f"cannot read kernels/README.md: {e}"]
    probs = []
    for file, ks in SIGS.items():
        for name, params in ks:
            if name not in rs:
                probs.append(f"{name}: in the harness table but not in kernels/README.md")
            elif parse_params(rs[name]) != parse_params(params):
                probs.append(f"{name}: README.md says ({rs[name]}), harness has ({params})")
    known = {n for ks in SIGS.values() for n, _ in ks}
    for name in rs:
        if name not in known:
            probs.append(f"{name}: in kernels/README.md but not tested by the harness")
    return probs


# ---------------------------------------------------------------- building
def wrapper_source(sigs: list[tuple[str, str]]) -> str:
    out = ["\n#line 1 \"<cuda_emu host wrappers>\"\n"]
    for name, params in sigs:
        ps = parse_params(params)
        decl = ", ".join(f"{t} {n}" for t, n in ps)
        names = ", ".join(n for _, n in ps)
        # A weak redeclaration: a kernel that is not (yet) defined leaves a null address
        # (the wrapper returns -2), and one whose parameters differ from README.md fails
        # to compile ("conflicting declaration of C function").
        out.append(f'extern "C" void {name}({decl}) __attribute__((weak));\n')
        out.append(
            f'extern "C" int emuw_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, '
            f"unsigned by, unsigned bz, {decl}) {{\n"
            f"  if (!&{name}) return -2;\n"
            f"  return emu_launch({name}, dim3(gx, gy, gz), dim3(bx, by, bz), {names});\n}}\n")
    return "".join(out)


def combined_source(file: str, sigs) -> str:
    parts = []
    if file == "selftest.cu":
        srcs = [HERE / "selftest.cu"]
    else:
        srcs = [KDIR / "common.cuh"] + ([KDIR / "quant.cuh"] if file in QUANT_FILES else []) + [KDIR / file]
    for p in srcs:
        rel = os.path.relpath(p, ROOT) if p.is_relative_to(ROOT) else str(p)
        parts.append(f'#line 1 "{rel}"\n{p.read_text()}\n')
    parts.append(wrapper_source(sigs))
    return "".join(parts)


def sanitize_flags(mode: str) -> list[str]:
    if mode == "asan":
        return ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    if mode == "tsan":
        return ["-fsanitize=thread"]
    return []


def build(file: str, sigs, mode: str) -> tuple[Path | None, str, list[str]]:
    """Returns (shared library, compiler output, kernels dropped for ABI mismatch)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    dropped: list[str] = []
    while True:
        src = combined_source(file, [s for s in sigs if s[0] not in dropped])
        flags = ["-std=c++20", "-O1", "-g1", "-fPIC", "-shared", "-pthread", "-w",
                 "-include", str(HERE / "emu.hpp")] + sanitize_flags(mode)
        key = hashlib.sha256((src + " ".join(flags) + (HERE / "emu.hpp").read_text()).encode()).hexdigest()[:16]
        stem = file.replace(".", "_")
        so = BUILD / f"{stem}-{mode}-{key}.so"
        if so.exists():
            return so, "", dropped
        me = f"{os.getpid()}-{threading.get_ident()}"  # a file and its companion's build may run at once
        cpp = BUILD / f"{stem}-{mode}-{key}.{me}.cpp"
        cpp.write_text(src)
        tmp = f"{so}.{me}.tmp"
        r = subprocess.run(["g++", *flags, "-o", tmp, str(cpp)], capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(tmp, so)
            cpp.unlink(missing_ok=True)  # kept only when the build fails
            for old in BUILD.glob(f"{stem}-{mode}-*.so"):  # stale builds of older sources
                if old != so:
                    old.unlink(missing_ok=True)
            return so, r.stderr, dropped
        # a kernel whose parameters differ from README.md: drop its wrapper and retry
        bad = set(re.findall(r"conflicting declaration of C function '[^']*?\b(\w+)\(", r.stderr.replace("‘", "'").replace("’", "'")))
        bad -= set(dropped)
        if not bad:
            return None, r.stderr, dropped
        dropped.extend(sorted(bad))


# ---------------------------------------------------------------- device buffers
class Lib:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.lib.emu_alloc.restype = ctypes.c_void_p
        self.lib.emu_alloc.argtypes = [ctypes.c_ulonglong]
        self.lib.emu_free.argtypes = [ctypes.c_void_p]
        self.lib.emu_last_error_cstr.restype = ctypes.c_char_p
        self.lib.emu_set_timeout.argtypes = [ctypes.c_double]
        self.sigs = {}

    def set_sigs(self, sigs):
        for name, params in sigs:
            f = getattr(self.lib, "emuw_" + name)
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_uint] * 6 + [ctype_of(t) for t, _ in parse_params(params)]
            self.sigs[name] = f

    def last_error(self) -> str:
        return self.lib.emu_last_error_cstr().decode(errors="replace")


class Buf:
    """An exactly-sized buffer allocated by the emulator (so ASan guards its end)."""

    def __init__(self, lib: Lib, arr, writable=False):
        import numpy as np
        self.lib = lib
        self.arr = np.ascontiguousarray(arr)
        self.nbytes = self.arr.nbytes
        self.ptr = lib.lib.emu_alloc(self.nbytes)
        ctypes.memmove(self.ptr, self.arr.ctypes.data, self.nbytes)
        self.writable = writable

    def read(self):
        import numpy as np
        out = np.empty_like(self.arr)
        ctypes.memmove(out.ctypes.data, self.ptr, self.nbytes)
        return out

    def free(self):
        self.lib.lib.emu_free(self.ptr)


def out_buf(lib, shape, dtype):
    """An output buffer pre-filled with NaN / all-ones bits, so unwritten outputs show."""
    import numpy as np
    a = np.full(shape, 0xFF, dtype=np.uint8) if dtype == np.uint8 else \
        np.frombuffer(b"\xff" * (int(np.prod(shape)) * np.dtype(dtype).itemsize), dtype=dtype).reshape(shape).copy()
    return Buf(lib, a, writable=True)


class CaseFail(Exception):
    pass


@dataclass
class Ctx:
    lib: Lib
    others: list = field(default_factory=list)  # the companion files' libraries
    launch_desc: str = ""
    bufs: list = field(default_factory=list)

    def buf(self, arr, writable=False):
        if arr is None:
            return None  # a null pointer
        b = Buf(self.lib, arr, writable)
        self.bufs.append(b)
        return b

    def out(self, shape, dtype):
        b = out_buf(self.lib, shape, dtype)
        self.bufs.append(b)
        return b

    def launch(self, name, grid, block, *args):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        self.launch_desc = f"`{name}` grid {grid} block {block}"
        f = next((l.sigs[name] for l in [self.lib, *self.others] if name in l.sigs), None)
        if f is None:
            raise CaseFail(f"MISSING: no wrapper for `{name}` (its parameters differ from README.md?)")
        cargs = [a.ptr if isinstance(a, Buf) else a for a in args]
        rc = f(*grid, *block, *cargs)
        if rc == -2:
            raise CaseFail(f"MISSING: `{name}` is not defined")
        if rc != 0:
            raise CaseFail(f"emulator error in {self.launch_desc}: {self.lib.last_error()}")
        return rc

    def check_inputs(self):
        import numpy as np
        for b in self.bufs:
            if not b.writable:
                now = b.read()
                if now.tobytes() != b.arr.tobytes():
                    diff = np.flatnonzero(now.view(np.uint8) != b.arr.view(np.uint8))
                    raise CaseFail(f"a const input buffer ({b.arr.dtype}, {b.arr.shape}) was modified; "
                                   f"first changed byte offsets {diff[:5].tolist()}")

    def free(self):
        for b in self.bufs:
            b.free()
        self.bufs.clear()


# ---------------------------------------------------------------- comparisons
def fmt_idx(i, shape):
    import numpy as np
    return str([int(j) for j in np.unravel_index(i, shape)]) if len(shape) > 1 else f"[{int(i)}]"


def compare_nmse(name, got, ref, tol, what=""):
    """Returns a summary; raises CaseFail with the first bad indices when NMSE > tol."""
    import numpy as np
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    assert g.shape == r.shape, (g.shape, r.shape)
    nonfinite = ~np.isfinite(g) & np.isfinite(r)
    den = float(np.sum(r * r))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(nonfinite, np.inf, (g - r) ** 2)
    num = float(np.sum(err))
    nmse = num / den if den > 0 else num
    if nmse <= tol and not nonfinite.any():
        return f"{name} nmse={nmse:.2e}"
    flat_g, flat_r, flat_e = g.ravel(), r.ravel(), err.ravel()
    rms = math.sqrt(den / max(1, r.size))
    thresh = max(tol, 1e-12) ** 0.5 * rms
    bad = np.flatnonzero(~(flat_e <= thresh * thresh))
    worst = int(np.nanargmax(np.where(np.isnan(flat_e), np.inf, flat_e)))
    lines = [f"{name}{what}: NMSE {nmse:.3e} > {tol:.0e}"
             + (f" ({int(nonfinite.sum())} non-finite outputs)" if nonfinite.any() else "")
             + f"; {bad.size} of {r.size} elements off by more than {thresh:.3g}"]
    lines.append("first bad: " + "; ".join(
        f"{fmt_idx(i, r.shape)} got {flat_g[i]:.6g} want {flat_r[i]:.6g}" for i in bad[:6]))
    lines.append(f"worst: {fmt_idx(worst, r.shape)} got {flat_g[worst]:.6g} want {flat_r[worst]:.6g}")
    raise CaseFail("\n".join(lines))


def compare_exact(name, got, ref):
    """Bit-exact comparison (NaN equals NaN)."""
    import numpy as np
    g, r = np.asarray(got), np.asarray(ref)
    assert g.shape == r.shape
    if g.dtype.kind == "f":
        eq = (g == r) | (np.isnan(g) & np.isnan(r))
    else:
        eq = g == r
    if eq.all():
        return f"{name} exact"
    bad = np.flatnonzero(~eq.ravel())
    gf, rf = g.ravel(), r.ravel()
    raise CaseFail(f"{name}: {bad.size} of {r.size} values differ (exact comparison)\nfirst bad: " + "; ".join(
        f"{fmt_idx(i, r.shape)} got {gf[i]!r} want {rf[i]!r}" for i in bad[:6]))


def nmse_or_exact(name, got, ref, tol):
    """Passes when exact, or when NMSE <= tol (reports the mismatch count)."""
    import numpy as np
    g, r = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    neq = int(np.sum(~((g == r) | (np.isnan(g) & np.isnan(r)))))
    if neq == 0:
        return f"{name} exact"
    s = compare_nmse(name, got, ref, tol)
    return f"{s} ({neq} values not bit-equal)"


# ---------------------------------------------------------------- weight formats
def f16_to_f32(u16):
    import numpy as np
    return np.asarray(u16, dtype=np.uint16).view(np.float16).astype(np.float32)


BLOCK = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q4_0": (32, 18), "q4_1": (32, 20),
         "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34), "mxfp4": (32, 17), "q4_k": (256, 144),
         "q5_k": (256, 176), "q6_k": (256, 210), "affine_q4": (128, 68), "i8": (32, 36)}


def decode_affine_q4(raw):
    """crates/strata-quant/src/affine_q4.rs: 68-byte blocks {f16 scale, f16 bias, u8 qs[64]}; value j is
    the low nibble of qs[j] (j < 64) or the high nibble of qs[j-64]; v = nibble*scale + bias."""
    import numpy as np
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, 68)
    scale = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    bias = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = b[:, 4:]
    lv = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return (lv * scale + bias).astype(np.float32).ravel()


def decode_i8(raw):
    """crates/strata-quant/src/int8.rs: 36-byte blocks {f32 scale, i8 qs[32]}; v = q * scale."""
    import numpy as np
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, 36)
    scale = b[:, 0:4].copy().view(np.float32)
    qs = b[:, 4:].copy().view(np.int8).astype(np.float32)
    return (qs * scale).astype(np.float32).ravel()


def gguf_type(fmt):
    from gguf import GGMLQuantizationType as T
    return {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q4_0": T.Q4_0, "q4_1": T.Q4_1,
            "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q8_0": T.Q8_0, "q4_k": T.Q4_K, "q5_k": T.Q5_K,
            "q6_k": T.Q6_K, "mxfp4": T.MXFP4}[fmt]


def decode(fmt, raw, n):
    """Reference decode of `n` values stored as `raw` bytes of format fmt, as f32."""
    import numpy as np
    raw = np.ascontiguousarray(np.asarray(raw, dtype=np.uint8).ravel())
    if fmt == "affine_q4":
        v = decode_affine_q4(raw)
    elif fmt == "i8":
        v = decode_i8(raw)
    else:
        import gguf
        with np.errstate(over="ignore"):  # mxfp4's e = 254 overflows f32 for |value| >= 4, as ggml does
            v = np.asarray(gguf.quants.dequantize(raw, gguf_type(fmt)), dtype=np.float32).ravel()
    assert v.size == n, (fmt, v.size, n)
    return v


def f16_bits(rng, shape, lo, hi):
    import numpy as np
    return rng.uniform(lo, hi, size=shape).astype(np.float16).view(np.uint16)


def mxfp4_edge_blocks(raw, exps):
    """Overwrites the first len(exps) blocks of an MXFP4 tensor (raw [rows, row_bytes]) with
    exponent byte exps[i] and quants holding every nibble in both the low and the high
    half of a byte (bytes j | ((j + 5 + i) % 16) << 4), in place."""
    import numpy as np
    blocks = raw.reshape(-1, 17)
    assert len(exps) <= blocks.shape[0], (len(exps), blocks.shape)
    for i, e in enumerate(exps):
        j = np.arange(16)
        blocks[i, 0] = e
        blocks[i, 1:] = (j | (((j + 5 + i) % 16) << 4)).astype(np.uint8)


def make_weights(fmt, rows, cols, rng, mxfp4_exps=()):
    """A [rows, cols] tensor in format fmt: (raw bytes [rows, row_bytes], f32 reference).
    mxfp4: gguf-py's quantizer, then the first blocks get the exponents `mxfp4_exps` and
    every nibble (mxfp4_edge_blocks)."""
    import numpy as np
    bs, ts = BLOCK[fmt]
    assert cols % bs == 0, (fmt, cols)
    nb = cols // bs
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if fmt == "f32":
        raw = w.view(np.uint8)
    elif fmt == "f16":
        raw = w.astype(np.float16).view(np.uint8)
    elif fmt in ("bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4"):
        import gguf
        raw = np.asarray(gguf.quants.quantize(w, gguf_type(fmt))).view(np.uint8)
        if fmt == "mxfp4" and mxfp4_exps:
            raw = np.ascontiguousarray(raw).reshape(rows, nb * ts)
            mxfp4_edge_blocks(raw, mxfp4_exps)
    elif fmt in ("q4_k", "q5_k"):
        raw = rng.integers(0, 256, size=(rows, nb, ts), dtype=np.uint8)
        raw[:, :, 0:2] = f16_bits(rng, (rows, nb), 0.002, 0.02).view(np.uint8).reshape(rows, nb, 2)
        raw[:, :, 2:4] = f16_bits(rng, (rows, nb), 0.001, 0.01).view(np.uint8).reshape(rows, nb, 2)
    elif fmt == "q6_k":
        raw = rng.integers(0, 256, size=(rows, nb, ts), dtype=np.uint8)
        raw[:, :, 208:210] = f16_bits(rng, (rows, nb), 0.0005, 0.003).view(np.uint8).reshape(rows, nb, 2)
    elif fmt == "affine_q4":
        raw = rng.integers(0, 256, size=(rows, nb, ts), dtype=np.uint8)
        raw[:, :, 0:2] = f16_bits(rng, (rows, nb), 0.01, 0.2).view(np.uint8).reshape(rows, nb, 2)
        raw[:, :, 2:4] = f16_bits(rng, (rows, nb), -1.5, -0.1).view(np.uint8).reshape(rows, nb, 2)
    elif fmt == "i8":
        raw = np.zeros((rows, nb, ts), dtype=np.uint8)
        scale = rng.uniform(0.005, 0.05, size=(rows, 1)).astype(np.float32)
        raw[:, :, 0:4] = np.repeat(scale, nb, axis=1).view(np.uint8).reshape(rows, nb, 4)
        raw[:, :, 4:] = rng.integers(-127, 128, size=(rows, nb, 32), dtype=np.int8).view(np.uint8)
    else:
        raise ValueError(fmt)
    raw = np.ascontiguousarray(raw).reshape(rows, nb * ts)
    ref = decode(fmt, raw, rows * cols).reshape(rows, cols)
    return raw, ref


# ---------------------------------------------------------------- cases
@dataclass
class Case:
    id: str
    kernel: str
    run: Callable[[Ctx, object], str]
    expect_error: str | None = None  # selftest: substring the failure must contain
    modes: tuple = ("asan", "tsan", "none")  # sanitizer modes the case runs in


def seed_of(s: str) -> int:
    return zlib.crc32(s.encode())


def cdiv(a, b):
    return (a + b - 1) // b


def cases_elementwise():
    import numpy as np
    cs = []

    def add(n, grid=None):
        def run(c: Ctx, rng):
            x = rng.standard_normal(n).astype(np.float32)
            y = rng.standard_normal(n).astype(np.float32)
            bx, by = c.buf(x, True), c.buf(y)
            c.launch("add_f32", (grid or cdiv(n, 256),), (256,), bx, by, n)
            return compare_nmse("x", bx.read(), x.astype(np.float64) + y, 1e-7)
        return run
    for n in (1, 255, 256, 1000, 4097):
        cs.append(Case(f"add_f32 n={n}", "add_f32", add(n)))
    cs.append(Case("add_f32 n=4097 capped grid 3", "add_f32", add(4097, 3)))

    def bias(rows, width):
        def run(c, rng):
            x = rng.standard_normal((rows, width)).astype(np.float32)
            b = rng.standard_normal(width).astype(np.float32)
            bx, bb = c.buf(x, True), c.buf(b)
            c.launch("add_bias_f32", (cdiv(rows * width, 256),), (256,), bx, bb, rows, width)
            return compare_nmse("x", bx.read(), x.astype(np.float64) + b[None, :], 1e-7)
        return run
    for rows, width in ((1, 7), (3, 300), (5, 1000), (8, 512)):
        cs.append(Case(f"add_bias_f32 rows={rows} width={width}", "add_bias_f32", bias(rows, width)))

    def silu(n):
        def run(c, rng):
            g = (rng.standard_normal(n) * 4).astype(np.float32)
            if n >= 16:  # extremes (e^100 overflows f32): only where they don't dominate the NMSE
                g[:4] = np.array([-100.0, 100.0, 0.0, -20.0], dtype=np.float32)
            u = rng.standard_normal(n).astype(np.float32)
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("silu_mul_f32", (cdiv(n, 256),), (256,), bg, bu, n)
            gd = g.astype(np.float64)
            return compare_nmse("g", bg.read(), gd / (1 + np.exp(-gd)) * u, 1e-7)
        return run
    for n in (1, 1000, 4097):
        cs.append(Case(f"silu_mul_f32 n={n}", "silu_mul_f32", silu(n)))

    def sigmoid_gate(n):
        def run(c, rng):
            g = (rng.standard_normal(n) * 4).astype(np.float32)
            if n >= 16:  # saturated gates and zero
                g[:4] = np.array([-100.0, 100.0, 0.0, -20.0], dtype=np.float32)
            u = rng.standard_normal(n).astype(np.float32)
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("sigmoid_mul_f32", (cdiv(n, 256),), (256,), bg, bu, n)
            gd = g.astype(np.float64)
            return compare_nmse("g", bg.read(), u / (1 + np.exp(-gd)), 1e-7)
        return run
    for n in (1, 1000, 4097):
        cs.append(Case(f"sigmoid_mul_f32 n={n}", "sigmoid_mul_f32", sigmoid_gate(n)))

    def swiglu_oai(n, alpha, limit, grid=None):
        def run(c, rng):
            a32, l32 = np.float32(alpha), np.float32(limit)
            g = (rng.standard_normal(n) * 2 * limit).astype(np.float32)
            u = (rng.standard_normal(n) * 2 * limit).astype(np.float32)
            if n >= 16:  # both clamps, exactly at the limits, saturated gates, zero
                g[:8] = np.array([limit + 1, limit, -100.0, 100.0, 0.0, -limit - 3, 1e30, -1e30], np.float32)
                u[:8] = np.array([-limit - 1, limit + 2, -limit, limit, 0.0, 1e30, -1e30, -1.0], np.float32)
                if not ((g > l32).any() and (u > l32).any() and (u < -l32).any()):
                    raise CaseFail("inputs do not reach both clamps")
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("swiglu_oai_f32", (grid or cdiv(n, 256),), (256,), bg, bu, n, a32, l32)
            x = np.minimum(g.astype(np.float64), float(l32))
            y = np.clip(u.astype(np.float64), -float(l32), float(l32))
            with np.errstate(over="ignore"):
                want = x / (1 + np.exp(-float(a32) * x)) * (y + 1)
            return compare_nmse("g", bg.read(), want, 1e-7)
        return run
    # gpt-oss's alpha 1.702 and limit 7; a tighter limit; a capped grid.
    for n, alpha, limit in ((1, 1.702, 7.0), (1000, 1.702, 7.0), (4097, 1.702, 7.0), (300, 0.5, 1.5)):
        cs.append(Case(f"swiglu_oai_f32 n={n} alpha={alpha} limit={limit}", "swiglu_oai_f32",
                       swiglu_oai(n, alpha, limit)))
    cs.append(Case("swiglu_oai_f32 n=4097 alpha=1.702 limit=7.0 capped grid 3", "swiglu_oai_f32",
                   swiglu_oai(4097, 1.702, 7.0, 3)))

    def gelu(n, grid=None):
        def run(c, rng):
            g = (rng.standard_normal(n) * 3).astype(np.float32)
            if n >= 16:  # saturated tails and zero
                g[:5] = np.array([-100.0, 100.0, 0.0, -8.0, 12.0], dtype=np.float32)
            u = rng.standard_normal(n).astype(np.float32)
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("gelu_mul_f32", (grid or cdiv(n, 256),), (256,), bg, bu, n)
            gd = g.astype(np.float64)
            ref = 0.5 * gd * (1 + np.tanh(math.sqrt(2 / math.pi) * (gd + 0.044715 * gd ** 3))) * u
            return compare_nmse("g", bg.read(), ref, 1e-7)
        return run
    for n in (1, 1000, 4097):
        cs.append(Case(f"gelu_mul_f32 n={n}", "gelu_mul_f32", gelu(n)))
    cs.append(Case("gelu_mul_f32 n=4097 capped grid 3", "gelu_mul_f32", gelu(4097, 3)))

    def scale(n, factor, grid=None):
        def run(c, rng):
            x = (rng.standard_normal(n) * 10).astype(np.float32)
            bx = c.buf(x, True)
            c.launch("scale_f32", (grid or cdiv(n, 256),), (256,), bx, n, np.float32(factor))
            return compare_nmse("x", bx.read(), x.astype(np.float64) * np.float32(factor), 1e-7)
        return run
    for n, factor in ((1, 0.125), (1000, -3.5), (4097, 48.0)):
        cs.append(Case(f"scale_f32 n={n} factor={factor}", "scale_f32", scale(n, factor)))
    cs.append(Case("scale_f32 n=4097 factor=0.5 capped grid 3", "scale_f32", scale(4097, 0.5, 3)))

    def softcap(n, cap, grid=None):
        def run(c, rng):
            x = (rng.standard_normal(n) * 2 * abs(cap)).astype(np.float32)
            if n >= 16:  # saturation, zero, infinities
                x[:6] = np.array([0.0, -0.0, 1e30, -1e30, np.inf, -np.inf], dtype=np.float32)
            bx = c.buf(x, True)
            c.launch("softcap_f32", (grid or cdiv(n, 256),), (256,), bx, n, np.float32(cap))
            capd = float(np.float32(cap))
            return compare_nmse("x", bx.read(), capd * np.tanh(x.astype(np.float64) / capd), 1e-7)
        return run
    for n, cap in ((1, 30.0), (1000, 50.0), (4097, 0.75), (300, -5.0)):
        cs.append(Case(f"softcap_f32 n={n} cap={cap}", "softcap_f32", softcap(n, cap)))
    cs.append(Case("softcap_f32 n=4097 cap=30.0 capped grid 3", "softcap_f32", softcap(4097, 30.0, 3)))

    def to_f16(n, grid=None):
        def run(c, rng):
            x = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 12, n))).astype(np.float32)
            special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, -65520.0,
                                1e-8, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1.0 + 2.0 ** -11,
                                1.0 + 3 * 2.0 ** -11, 6.097555e-05, 6.1035156e-05, -3.0517578e-05,
                                1e30, -1e-30], dtype=np.float32)
            x[: min(n, special.size)] = special[: min(n, special.size)]
            bx, by = c.buf(x), c.out((n,), np.uint16)
            c.launch("f32_to_f16", (grid or cdiv(n, 256),), (256,), bx, by, n)
            got = by.read()
            want = x.astype(np.float16).view(np.uint16)
            isnan = np.isnan(x)
            gnan = ((got & 0x7C00) == 0x7C00) & ((got & 0x3FF) != 0)
            if not gnan[isnan].all():
                raise CaseFail(f"y: NaN inputs at {np.flatnonzero(isnan & ~gnan)[:5].tolist()} did not give NaN")
            got = np.where(isnan, want, got)
            return compare_exact("y (f16 bits)", got, want)
        return run
    for n in (1, 20, 1000, 70001):
        cs.append(Case(f"f32_to_f16 n={n}", "f32_to_f16", to_f16(n)))
    cs.append(Case("f32_to_f16 n=70001 capped grid 7", "f32_to_f16", to_f16(70001, 7)))
    return cs


def rows_grid(n_rows, row_len):
    """README.md's launch of the row kernels: grid (n_rows, ceil(row_len / 256))."""
    return (n_rows, cdiv(row_len, 256))


def cases_rows():
    import numpy as np
    cs = []

    def gather(src_rows, n_rows, row_len, grid=None):
        def run(c: Ctx, rng):
            src = rng.standard_normal((src_rows, row_len)).astype(np.float32)
            rows = rng.integers(0, src_rows, size=n_rows).astype(np.uint32)
            rows[0] = src_rows - 1  # the last row: an off-by-one reads past the buffer
            if n_rows > 2:
                rows[1] = rows[2] = 0  # a repeated row, and row 0
            bs, bi, bd = c.buf(src), c.buf(rows), c.out((n_rows, row_len), np.float32)
            c.launch("gather_rows_f32", grid or rows_grid(n_rows, row_len), (256,), bs, bi, bd, row_len, n_rows)
            return compare_exact("dst", bd.read(), src[rows])
        return run
    for src_rows, n_rows, row_len in ((1, 1, 1), (3, 1, 4097), (4, 8, 1), (7, 5, 300), (9, 7, 4097),
                                      (2, 40, 33)):
        cs.append(Case(f"gather_rows_f32 src_rows={src_rows} n_rows={n_rows} row_len={row_len}",
                       "gather_rows_f32", gather(src_rows, n_rows, row_len)))
    cs.append(Case("gather_rows_f32 src_rows=5 n_rows=9 row_len=1000 capped grid (2, 3)", "gather_rows_f32",
                   gather(5, 9, 1000, (2, 3))))

    def add(x_rows, n_rows, row_len, listed, weighted, grid=None):
        def run(c: Ctx, rng):
            x = rng.standard_normal((x_rows, row_len)).astype(np.float32)
            y = rng.standard_normal((n_rows, row_len)).astype(np.float32)
            if listed:  # distinct rows in a scrambled order, the last row among them
                rows = rng.permutation(x_rows)[:n_rows].astype(np.uint32)
                if x_rows - 1 not in rows:
                    rows[0] = x_rows - 1
            else:
                rows = np.arange(n_rows, dtype=np.uint32)
            w = rng.uniform(-2, 2, n_rows).astype(np.float32) if weighted else np.ones(n_rows, np.float32)
            bx, by = c.buf(x, True), c.buf(y)
            bi = c.buf(rows) if listed else None
            bw = c.buf(w) if weighted else None
            c.launch("add_rows_f32", grid or rows_grid(n_rows, row_len), (256,), bx, by, bi, bw, row_len, n_rows)
            ref = x.astype(np.float64)
            ref[rows] += w.astype(np.float64)[:, None] * y
            got = bx.read()
            untouched = np.setdiff1d(np.arange(x_rows), rows)
            if not np.array_equal(got[untouched], x[untouched]):
                raise CaseFail(f"x: rows not listed changed (rows {untouched[:5].tolist()}...)")
            return compare_nmse("x", got, ref, 1e-7)
        return run
    shapes = ((1, 1, 1), (3, 1, 4097), (9, 8, 1), (12, 5, 300), (10, 6, 4097))
    for listed in (True, False):
        for weighted in (True, False):
            what = f"rows={'list' if listed else 'null'} w={'set' if weighted else 'null'}"
            for x_rows, n_rows, row_len in shapes:
                if not listed:
                    x_rows = n_rows  # x points at the first row of the range
                cs.append(Case(f"add_rows_f32 {what} x_rows={x_rows} n_rows={n_rows} row_len={row_len}",
                               "add_rows_f32", add(x_rows, n_rows, row_len, listed, weighted)))
    cs.append(Case("add_rows_f32 rows=list w=set x_rows=20 n_rows=9 row_len=1000 capped grid (2, 3)",
                   "add_rows_f32", add(20, 9, 1000, True, True, (2, 3))))

    def copy_cols(n_rows, src_stride, src_col, dst_stride, dst_col, width, grid=None):
        # One head's columns of a row of heads into (or out of) a narrower buffer; the
        # pointers the host passes are already offset to the first column, and both
        # buffers end exactly at the last element the copy touches.
        def run(c: Ctx, rng):
            src = rng.standard_normal(src_col + (n_rows - 1) * src_stride + width).astype(np.float32)
            dst0 = rng.standard_normal(dst_col + (n_rows - 1) * dst_stride + width).astype(np.float32)
            bs, bd = c.buf(src[src_col:].copy()), c.buf(dst0[dst_col:].copy(), True)
            c.launch("copy_cols_f32", grid or rows_grid(n_rows, width), (256,), bs, src_stride, bd, dst_stride,
                     width, n_rows)
            ref = dst0[dst_col:].copy()
            for r in range(n_rows):
                ref[r * dst_stride:r * dst_stride + width] = src[src_col + r * src_stride:][:width]
            return compare_exact("dst", bd.read(), ref)
        return run
    for n_rows, ss, sc, ds, dc, w in ((1, 1, 0, 1, 0, 1), (3, 576, 512, 64, 0, 64), (4, 8, 0, 24, 16, 8),
                                     (5, 4097, 0, 4097, 0, 4097), (7, 300, 3, 1000, 700, 297),
                                     (40, 33, 1, 2, 0, 2)):
        cs.append(Case(f"copy_cols_f32 n_rows={n_rows} src {ss}@{sc} dst {ds}@{dc} width={w}", "copy_cols_f32",
                       copy_cols(n_rows, ss, sc, ds, dc, w)))
    cs.append(Case("copy_cols_f32 n_rows=9 src 1200@100 dst 1000@0 width=1000 capped grid (2, 3)",
                   "copy_cols_f32", copy_cols(9, 1200, 100, 1000, 0, 1000, (2, 3))))
    return cs


def cases_norm():
    import numpy as np
    cs = []

    def rms(rows, dim, eps):
        def run(c, rng):
            x = (rng.standard_normal((rows, dim)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
            w = rng.standard_normal(dim).astype(np.float32)
            bx, bw, bo = c.buf(x), c.buf(w), c.out((rows, dim), np.float32)
            c.launch("rms_norm_f32", (rows,), (256,), bx, bw, bo, dim, eps)
            xd = x.astype(np.float64)
            ref = w * xd / np.sqrt(np.mean(xd * xd, axis=1, keepdims=True) + np.float32(eps))
            return compare_nmse("out", bo.read(), ref, 1e-7)
        return run
    for rows, dim, eps in ((1, 512, 1e-5), (3, 1000, 1e-6), (2, 100, 1e-5), (8, 4096, 1e-5), (1, 7, 1e-6)):
        cs.append(Case(f"rms_norm_f32 rows={rows} dim={dim} eps={eps}", "rms_norm_f32", rms(rows, dim, eps)))
    return cs


def cases_rope():
    import numpy as np
    cs = []

    def rope(rows, n_heads, hd, inter, factor, maxpos, pairs=None):
        # `pairs` < hd/2: partial RoPE (only the first 2·pairs dims rotate); > hd/2: the
        # kernel must clamp to hd/2 (kernels/ABI_NOTES.md).
        def run(c, rng):
            n_arg = hd // 2 if pairs is None else pairs
            npr = min(n_arg, hd // 2)  # pairs that rotate
            x = rng.standard_normal((rows, n_heads * hd)).astype(np.float32)
            pos = rng.integers(1, maxpos, size=rows).astype(np.uint32)
            pos[0] = maxpos - 1
            if rows > 2:
                pos[-1] = 0
            inv = (10000.0 ** (-np.arange(n_arg, dtype=np.float64) * 2 / (2 * npr))).astype(np.float32)
            bx, bp, bi = c.buf(x, True), c.buf(pos), c.buf(inv)
            c.launch("rope_f32", (rows, n_heads), (n_arg,), bx, bp, bi, n_heads, hd, n_arg, np.float32(factor),
                     inter)
            ang = (pos[:, None].astype(np.float32) * inv[None, :npr]).astype(np.float64)  # f32 angle, as the kernel
            cs_, sn = np.cos(ang) * factor, np.sin(ang) * factor
            xr = x.astype(np.float64).reshape(rows, n_heads, hd)
            if inter:
                ia, ib = np.arange(npr) * 2, np.arange(npr) * 2 + 1
            else:
                ia, ib = np.arange(npr), np.arange(npr) + npr
            a, b = xr[..., ia], xr[..., ib]
            c_, s_ = cs_[:, None, :], sn[:, None, :]
            ref = xr.copy()  # dims past 2·npr pass through
            ref[..., ia], ref[..., ib] = a * c_ - b * s_, a * s_ + b * c_
            return compare_nmse("x", bx.read(), ref.reshape(rows, n_heads * hd), 1e-7)
        return run
    for rows, nh, hd, inter, factor, maxpos in (
            (1, 4, 64, 0, 1.0, 50), (3, 4, 128, 0, 1.0, 4000), (3, 4, 128, 1, 1.0, 4000),
            (2, 2, 64, 1, 0.8, 300), (5, 1, 128, 0, 1.2, 9000), (2, 3, 96, 0, 1.0, 100), (2, 3, 96, 1, 1.0, 100)):
        cs.append(Case(f"rope_f32 rows={rows} n_heads={nh} head_dim={hd} {'interleaved' if inter else 'neox'} "
                       f"attn_factor={factor} pos<{maxpos}", "rope_f32", rope(rows, nh, hd, inter, factor, maxpos)))
    # partial RoPE: head_dim 128 at 1/4 (StableLM), 80 with 16 pairs (Phi-2), 64 with 1 pair
    for rows, nh, hd, inter, factor, maxpos, pairs in (
            (3, 4, 128, 0, 1.0, 4000, 16), (3, 4, 128, 1, 1.0, 4000, 16), (2, 3, 80, 0, 1.0, 2000, 16),
            (2, 3, 80, 1, 0.9, 2000, 16), (2, 2, 64, 0, 1.0, 100, 1), (2, 2, 64, 0, 1.0, 100, 35)):
        what = "clamped" if pairs > hd // 2 else "partial"
        cs.append(Case(f"rope_f32 {what} rows={rows} n_heads={nh} head_dim={hd} n_pairs={pairs} "
                       f"{'interleaved' if inter else 'neox'} attn_factor={factor} pos<{maxpos}", "rope_f32",
                       rope(rows, nh, hd, inter, factor, maxpos, pairs)))
    return cs


EXACT_DECODE = {"f32", "f16", "bf16", "q4_0", "q5_0", "q8_0", "mxfp4", "i8"}
# The MXFP4 exponents the decode cases put in their first blocks (denormal scales 2^-128
# and 2^-127, the first normal one, the largest finite one: 12 · 2^126), and the ones the
# matvec cases use (the largest would overflow the f32 sums: 2^12 stands in for it).
MXFP4_DECODE_EXPS = (0, 1, 2, 254)
MXFP4_MATVEC_EXPS = (0, 1, 2, 140)


def pack_weights(fmt, raw, rows, cols):
    """The packed layout of kernels/README.md from stored blocks: (quants, scales) as two
    byte arrays, block i = o · nblk + b of the [rows, cols] tensor at i · QB and i · MB
    (the scales: the block's bytes outside its quants, in stored order)."""
    import numpy as np
    if fmt in ALIGNED_FMTS:
        return np.ascontiguousarray(raw).ravel(), None  # read as stored; no scales
    bs, ts = BLOCK[fmt]
    blocks = np.ascontiguousarray(raw).reshape(rows * (cols // bs), ts)
    q0, q1 = PACKED_QUANTS[fmt]
    qs = blocks[:, q0:q1]
    d = np.concatenate([blocks[:, :q0], blocks[:, q1:]], axis=1)
    assert qs.shape[1] % 16 == 0 and qs.shape[1] + d.shape[1] == ts
    return np.ascontiguousarray(qs).ravel(), np.ascontiguousarray(d).ravel()


def cases_embedding():
    import numpy as np
    cs = []

    def emb(fmt, vocab, dim, rows):
        def run(c, rng):
            exps = MXFP4_DECODE_EXPS if fmt == "mxfp4" else ()
            raw, ref = make_weights(fmt, vocab, dim, rng, exps)
            ids = rng.integers(0, vocab, size=rows).astype(np.uint32)
            ids[0] = vocab - 1
            if rows > 1:
                ids[1] = 0
            bt, bi, bo = c.buf(raw), c.buf(ids), c.out((rows, dim), np.float32)
            c.launch(f"embed_{fmt}", (rows,), (256,), bt, bi, bo, dim)
            if fmt in EXACT_DECODE:
                return compare_exact("out", bo.read(), ref[ids])
            return nmse_or_exact("out", bo.read(), ref[ids], 1e-7)
        return run
    for fmt in FMTS:
        bs = BLOCK[fmt][0]
        small = {1: 100, 32: 96, 128: 384, 256: 768}[bs]
        for vocab, dim, rows in ((37, 512, 3), (11, small, 8), (5, 2048, 1)):
            cs.append(Case(f"embed_{fmt} vocab={vocab} dim={dim} rows={rows}", f"embed_{fmt}", emb(fmt, vocab, dim, rows)))

    def emb_packed(fmt, vocab, dim, rows):
        def run(c, rng):
            raw, ref = make_weights(fmt, vocab, dim, rng)
            q, d = pack_weights(fmt, raw, vocab, dim)
            ids = rng.integers(0, vocab, size=rows).astype(np.uint32)
            ids[0] = vocab - 1
            if rows > 1:
                ids[1] = 0
            bq, bd, bi, bo = c.buf(q), c.buf(d), c.buf(ids), c.out((rows, dim), np.float32)
            c.launch(f"embed_packed_{fmt}", (rows,), (256,), bq, bd, bi, bo, dim)
            return compare_exact("out", bo.read(), ref[ids])
        return run
    for fmt in PACKED_FMTS:
        small = 96 if BLOCK[fmt][0] == 32 else 256
        for vocab, dim, rows in ((37, 512, 3), (11, small, 8), (5, 2048, 1)):
            cs.append(Case(f"embed_packed_{fmt} vocab={vocab} dim={dim} rows={rows}", f"embed_packed_{fmt}",
                           emb_packed(fmt, vocab, dim, rows)))
    return cs


def cases_dequant():
    import numpy as np
    cs = []

    def deq(fmt, nblocks, grid):
        def run(c, rng):
            bs, _ = BLOCK[fmt]
            n = nblocks * bs
            raw, ref = make_weights(fmt, 1, n, rng, MXFP4_DECODE_EXPS[:nblocks] if fmt == "mxfp4" else ())
            bw, bo = c.buf(raw), c.out((n,), np.uint16)
            g = {"n/256": cdiv(n, 256), "blocks/256": cdiv(nblocks, 256), "1": 1}[grid]
            c.launch(f"dequant_{fmt}_f16", (g,), (256,), bw, bo, n)
            want16 = ref.ravel().astype(np.float16)
            got16 = bo.read().view(np.float16)
            return nmse_or_exact("out (f16)", got16, want16, 1e-7)
        return run
    for fmt in FMTS:
        bs = BLOCK[fmt][0]
        sizes = (5, 37) if bs > 1 else (100, 1001)
        if bs == 32:
            sizes = (5, 37, 3)
        for nb in sizes:
            cs.append(Case(f"dequant_{fmt}_f16 n={nb * bs} grid n/256", f"dequant_{fmt}_f16", deq(fmt, nb, "n/256")))
        nb = 300 if bs > 1 else 3000
        cs.append(Case(f"dequant_{fmt}_f16 n={nb * bs} grid blocks/256", f"dequant_{fmt}_f16",
                       deq(fmt, nb, "blocks/256")))

    def deq_packed(fmt, rows, cols, o0, grid):
        # Rows o0.. of a packed [rows, cols] tensor, as the GEMM's tiles read them.
        def run(c, rng):
            raw, ref = make_weights(fmt, rows, cols, rng)
            q, d = pack_weights(fmt, raw, rows, cols)
            nblk = cols // BLOCK[fmt][0]
            qb, mb = q.size // (rows * nblk), d.size // (rows * nblk)
            n = (rows - o0) * cols
            bq, bd = c.buf(q[o0 * nblk * qb:]), c.buf(d[o0 * nblk * mb:])
            bo = c.out((n,), np.uint16)
            c.launch(f"dequant_packed_{fmt}_f16", (grid,), (256,), bq, bd, bo, n)
            return compare_exact("out (f16)", bo.read().view(np.float16), ref[o0:].ravel().astype(np.float16))
        return run
    for fmt in PACKED_FMTS:
        shapes = ((3, 160, 0, 1), (7, 512, 2, 3), (5, 96, 4, 40))
        if BLOCK[fmt][0] == 256:
            shapes = ((3, 256, 0, 1), (7, 512, 2, 3), (5, 768, 4, 40))
        for rows, cols, o0, grid in shapes:
            cs.append(Case(f"dequant_packed_{fmt}_f16 rows={rows} cols={cols} from row {o0} grid {grid}",
                           f"dequant_packed_{fmt}_f16", deq_packed(fmt, rows, cols, o0, grid)))
    return cs


def cases_matvec():
    import numpy as np
    cs = []

    def mv(fmt, rows, out, inn, wide=None):
        def run(c, rng):
            raw, wref = make_weights(fmt, out, inn, rng, MXFP4_MATVEC_EXPS if fmt == "mxfp4" else ())
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            bw, bx, by = c.buf(raw), c.buf(x), c.out((rows, out), np.float32)
            if wide:
                # A block of `wide` threads per output row.
                c.launch(f"matvec_wide_{fmt}", (out,), (wide,), bw, bx, by, rows, out, inn)
            else:
                c.launch(f"matvec_{fmt}", (cdiv(out, 8),), (256,), bw, bx, by, rows, out, inn)
            ref = x.astype(np.float64) @ wref.astype(np.float64).T
            return compare_nmse("y", by.read(), ref, 5e-4)
        return run
    for fmt in FMTS:
        bs = BLOCK[fmt][0]
        odd = {1: 200, 32: 288, 128: 384, 256: 768}[bs]
        for rows, out, inn in ((1, 67, 512), (3, 67, 512), (8, 16, 512), (5, 9, odd), (2, 1, 1024),
                               (8, 67, odd), (1, 9, 4096)):
            cs.append(Case(f"matvec_{fmt} rows={rows} out={out} in={inn}", f"matvec_{fmt}", mv(fmt, rows, out, inn)))
        # The wide kernel at its launch (128 threads), the most warps it takes (256) and
        # one warp; rows shorter than a block, and longer ones with a ragged last pass.
        for rows, out, inn, wide in ((1, 67, 512, 128), (8, 5, odd, 128), (3, 9, 4096, 256), (2, 3, 1024, 32),
                                     (5, 4, 2 * odd, 128)):
            cs.append(Case(f"matvec_wide_{fmt} rows={rows} out={out} in={inn} block={wide}", f"matvec_wide_{fmt}",
                           mv(fmt, rows, out, inn, wide)))

    def mv_packed(fmt, rows, out, inn, block, twice=False):
        # `twice`: also each activation row alone, which must give the same bits (the
        # order of the additions depends on the shape only).
        def run(c, rng):
            raw, wref = make_weights(fmt, out, inn, rng)
            q, d = pack_weights(fmt, raw, out, inn)
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            bq, bd, bx, by = c.buf(q), c.buf(d), c.buf(x), c.out((rows, out), np.float32)
            per_block = 2 * block // 32
            c.launch(f"matvec_packed_{fmt}", (cdiv(out, per_block),), (block,), bq, bd, bx, by, rows, out, inn)
            got = by.read()
            ref = x.astype(np.float64) @ wref.astype(np.float64).T
            if twice:
                for r in range(rows):
                    b1x, b1y = c.buf(np.ascontiguousarray(x[r:r + 1])), c.out((1, out), np.float32)
                    c.launch(f"matvec_packed_{fmt}", (cdiv(out, per_block),), (block,), bq, bd, b1x, b1y, 1, out,
                             inn)
                    if not np.array_equal(b1y.read()[0].view(np.uint32), got[r].view(np.uint32)):
                        raise CaseFail(f"row {r} alone differs from row {r} of {rows} (bits)")
            return compare_nmse("y", got, ref, 5e-4)
        return run
    # Odd `out` (a last warp with one row, a last block with idle warps), `in` of a few
    # blocks, more than one tile (rows=1: 256 blocks = 8192 values; rows=8: 1024 values),
    # a ragged last tile, 1 to 8 rows, blocks of 1, 4 and 8 warps.
    # K-quants (units of 32 or 64 values, 8 or 4 a super-block): a tile at rows=1 is
    # 8192 values, at rows=8 1024; Q6_K's tiles at 5 to 8 rows are fewer than 32 units
    # (1536 and 1024 values), so lanes start mid-tile.
    shapes_32 = ((1, 67, 512, 128, False), (3, 67, 512, 128, True), (8, 16, 512, 128, False),
                 (5, 9, 288, 128, False), (2, 1, 1024, 128, False), (8, 67, 3104, 128, True),
                 (1, 9, 8192 + 1056, 128, False), (4, 21, 2080, 256, True), (7, 5, 4128, 32, False),
                 (6, 3, 32, 128, False))
    shapes_256 = ((1, 67, 512, 128, False), (3, 67, 768, 128, True), (8, 16, 512, 128, False),
                  (5, 9, 2560, 128, True), (2, 1, 1024, 128, False), (8, 67, 3328, 128, True),
                  (1, 9, 8192 + 1280, 128, False), (4, 21, 2304, 256, True), (7, 5, 4352, 32, False),
                  (6, 3, 256, 128, False))
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        for rows, out, inn, block, twice in (shapes_32 if BLOCK[fmt][0] <= 32 else shapes_256):
            cs.append(Case(f"matvec_packed_{fmt} rows={rows} out={out} in={inn} block={block}",
                           f"matvec_packed_{fmt}", mv_packed(fmt, rows, out, inn, block, twice)))

    def mv_glu_packed(fmt, act, rows, out, inn, block):
        # act(x · gateᵀ) ⊙ (x · upᵀ) against float64 numpy, and bit for bit against
        # matvec_packed_FMT of each weight then the GLU kernel (elementwise.cu).
        def run(c, rng):
            code, unfused = GLU_ACTS[act]
            graw, gw = make_weights(fmt, out, inn, rng)
            uraw, uw = make_weights(fmt, out, inn, rng)
            (gq, gd), (uq, ud) = pack_weights(fmt, graw, out, inn), pack_weights(fmt, uraw, out, inn)
            x = rng.standard_normal((rows, inn))
            if act == "swiglu_oai":
                # Rows of zero mean: weights with an offset (K-quants' mins) then give sums
                # of both signs, so both clamps are met.
                x -= x.mean(axis=1, keepdims=True)
            g64 = x @ gw.astype(np.float64).T
            x = (x * 2 / max(float(np.std(g64)), 1e-30)).astype(np.float32)  # gate values of std ~2
            g64, u64 = x.astype(np.float64) @ gw.astype(np.float64).T, x.astype(np.float64) @ uw.astype(np.float64).T
            # SwigluOai: a limit inside the values, so both clamps and the gate's cap are met.
            alpha, limit = np.float32(1.702), np.float32(np.median(np.abs(u64)))
            bgq, bgd, buq, bud, bx = c.buf(gq), c.buf(gd), c.buf(uq), c.buf(ud), c.buf(x)
            by = c.out((rows, out), np.float32)
            grid = (cdiv(out, 2 * block // 32),)
            c.launch(f"matvec_glu_packed_{fmt}", grid, (block,), bgq, bgd, buq, bud, bx, by, rows, out, inn, code,
                     alpha, limit)
            got = by.read()
            bg, bu = c.out((rows, out), np.float32), c.out((rows, out), np.float32)
            c.launch(f"matvec_packed_{fmt}", grid, (block,), bgq, bgd, bx, bg, rows, out, inn)
            c.launch(f"matvec_packed_{fmt}", grid, (block,), buq, bud, bx, bu, rows, out, inn)
            n = rows * out
            if act == "swiglu_oai":
                c.launch(unfused, (cdiv(n, 256),), (256,), bg, bu, n, alpha, limit)
            else:
                c.launch(unfused, (cdiv(n, 256),), (256,), bg, bu, n)
            want_bits = bg.read()
            if not np.array_equal(got.view(np.uint32), want_bits.view(np.uint32)):
                bad = np.flatnonzero(got.view(np.uint32) != want_bits.view(np.uint32))
                raise CaseFail(f"{bad.size} of {n} outputs differ from matvec_packed x2 + {unfused} (bits); "
                               f"first {fmt_idx(bad[0], got.shape)}: {got.flat[bad[0]]!r} vs {want_bits.flat[bad[0]]!r}")
            if act == "swiglu_oai":
                xg = np.minimum(g64, float(limit))
                if not ((g64 > limit).any() and (u64 > limit).any() and (u64 < -limit).any()):
                    raise CaseFail("inputs do not reach both clamps")
                with np.errstate(over="ignore"):
                    ref = xg / (1 + np.exp(-float(alpha) * xg)) * (np.clip(u64, -float(limit), float(limit)) + 1)
            else:
                with np.errstate(over="ignore"):
                    ref = {"silu": lambda: g64 / (1 + np.exp(-g64)) * u64,
                           "gelu_tanh": lambda: 0.5 * g64 * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                                         * (g64 + 0.044715 * g64 ** 3))) * u64,
                           "sigmoid": lambda: u64 / (1 + np.exp(-g64))}[act]()
            return compare_nmse("y", got, ref, 5e-4) + ", = unfused (bits)"
        return run
    def mv_add_packed(fmt, rows, out, inn, block):
        # y += x · wᵀ against float64 numpy, and bit for bit against matvec_packed_FMT
        # into a buffer then add_f32 of it (elementwise.cu).
        def run(c, rng):
            raw, wref = make_weights(fmt, out, inn, rng)
            q, d = pack_weights(fmt, raw, out, inn)
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            y0 = rng.standard_normal((rows, out)).astype(np.float32) * 4
            bq, bd, bx = c.buf(q), c.buf(d), c.buf(x)
            by, bs, bw = c.buf(y0, writable=True), c.out((rows, out), np.float32), c.buf(y0, writable=True)
            grid = (cdiv(out, 2 * block // 32),)
            c.launch(f"matvec_add_packed_{fmt}", grid, (block,), bq, bd, bx, by, rows, out, inn)
            got = by.read()
            c.launch(f"matvec_packed_{fmt}", grid, (block,), bq, bd, bx, bs, rows, out, inn)
            c.launch("add_f32", (cdiv(rows * out, 256),), (256,), bw, bs, rows * out)
            want = bw.read()
            if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
                raise CaseFail(f"{bad.size} of {rows * out} outputs differ from matvec_packed + add_f32 (bits); "
                               f"first {fmt_idx(bad[0], got.shape)}: {got.flat[bad[0]]!r} vs {want.flat[bad[0]]!r}")
            ref = y0.astype(np.float64) + x.astype(np.float64) @ wref.astype(np.float64).T
            return compare_nmse("y", got, ref, 5e-4) + ", = matvec_packed + add_f32 (bits)"
        return run
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        shapes = shapes_32 if BLOCK[fmt][0] <= 32 else shapes_256
        for rows, out, inn, block, _ in shapes[:8]:
            cs.append(Case(f"matvec_add_packed_{fmt} rows={rows} out={out} in={inn} block={block}",
                           f"matvec_add_packed_{fmt}", mv_add_packed(fmt, rows, out, inn, block)))

    def mv_multi_packed(fmt, rows, outs, inn, block):
        # Up to 3 weights of one input against float64 numpy, and each output bit for bit
        # against its own matvec_packed_FMT launch; unused weights: null and out 0.
        def run(c, rng):
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            bx, per = c.buf(x), 2 * block // 32
            args, mine, summary = [], [], []
            for out in outs:
                raw, wref = make_weights(fmt, out, inn, rng)
                q, d = pack_weights(fmt, raw, out, inn)
                bq, bd, by = c.buf(q), c.buf(d), c.out((rows, out), np.float32)
                args += [bq, bd, by, out]
                mine.append((bq, bd, by, out, wref))
            args += [None, None, None, 0] * (3 - len(outs))
            grid = (sum(cdiv(o, per) for o in outs),)
            c.launch(f"matvec_multi_packed_{fmt}", grid, (block,), *args, bx, rows, inn)
            for i, (bq, bd, by, out, wref) in enumerate(mine):
                got, alone = by.read(), c.out((rows, out), np.float32)
                c.launch(f"matvec_packed_{fmt}", (cdiv(out, per),), (block,), bq, bd, bx, alone, rows, out, inn)
                if not np.array_equal(got.view(np.uint32), alone.read().view(np.uint32)):
                    raise CaseFail(f"weight {i}: outputs differ from its own matvec_packed launch (bits)")
                ref = x.astype(np.float64) @ wref.astype(np.float64).T
                summary.append(compare_nmse(f"y{i}", got, ref, 5e-4))
            return ", ".join(summary) + ", = separate launches (bits)"
        return run
    # q, k and v of GQA shapes (odd, sharing blocks' edges), two weights, one; 1 to 8
    # rows; blocks of 1, 4 and 8 warps; `in` past one tile.
    multi = ((1, (67, 17, 17), 0, 128), (3, (16, 9, 9), 1, 128), (8, (21, 5, 40), 0, 256), (2, (9, 9), 2, 32),
             (5, (33,), 0, 128), (4, (1, 8, 3), 3, 128))
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        ins = (512, 288, 2080, 8192 + 1056) if BLOCK[fmt][0] <= 32 else (512, 768, 2304, 8192 + 1280)
        for rows, outs, ii, block in multi:
            inn = ins[ii]
            cs.append(Case(f"matvec_multi_packed_{fmt} rows={rows} outs={outs} in={inn} block={block}",
                           f"matvec_multi_packed_{fmt}", mv_multi_packed(fmt, rows, outs, inn, block)))

    # Every activation at one decode row, then 2 to 8 rows (each activation again), odd
    # `out`, `in` of a few blocks and past one tile, blocks of 1, 4 and 8 warps.
    glu_32 = ((1, 67, 512, 128), (2, 9, 288, 128), (3, 21, 2080, 256), (4, 5, 8192 + 1056, 128),
              (5, 7, 4128, 32), (6, 3, 32, 128), (7, 11, 1056, 128), (8, 13, 3104, 128))
    glu_256 = ((1, 67, 512, 128), (2, 9, 768, 128), (3, 21, 2304, 256), (4, 5, 8192 + 1280, 128),
               (5, 7, 4352, 32), (6, 3, 256, 128), (7, 11, 1280, 128), (8, 13, 3328, 128))
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        shapes = glu_32 if BLOCK[fmt][0] <= 32 else glu_256
        runs = [(act, shapes[0]) for act in GLU_ACTS] + [(list(GLU_ACTS)[i % 4], sh) for i, sh in enumerate(shapes[1:])]
        for act, (rows, out, inn, block) in runs:
            cs.append(Case(f"matvec_glu_packed_{fmt} {act} rows={rows} out={out} in={inn} block={block}",
                           f"matvec_glu_packed_{fmt}", mv_glu_packed(fmt, act, rows, out, inn, block)))
    return cs


def attn_ref_heads(q, k, v, start_pos, nh, nkv, hd, window):
    """(row, head, pos, first visible key, the head's query, its KV head's keys and values
    [cap, hd]) for every query row and head, in float64."""
    import numpy as np
    rows = q.shape[0]
    qd = q.astype(np.float64).reshape(rows, nh, hd)
    kd = k.astype(np.float64).reshape(-1, nkv, hd)
    vd = v.astype(np.float64).reshape(-1, nkv, hd)
    grp = nh // nkv
    for r in range(rows):
        pos = start_pos + r
        first = max(0, pos + 1 - window) if window > 0 else 0
        for h in range(nh):
            yield r, h, pos, first, qd[r, h], kd[:, h // grp], vd[:, h // grp]


def attn_ref_partial(q, k, v, start_pos, nh, nkv, hd, scale, window, split_len, splits, softcap=0.0):
    import numpy as np
    part = np.zeros((q.shape[0], nh, splits, hd + 2))
    for r, h, pos, first, qh, kh, vh in attn_ref_heads(q, k, v, start_pos, nh, nkv, hd, window):
        for s in range(splits):
            lo, hi = max(first, s * split_len), min(pos + 1, (s + 1) * split_len)
            if lo >= hi:
                part[r, h, s, hd] = -np.inf
                continue
            sc = np.float32(scale) * (kh[lo:hi] @ qh)
            if softcap != 0:
                cap = float(np.float32(softcap))
                sc = cap * np.tanh(sc / cap)
            m = sc.max()
            e = np.exp(sc - m)
            part[r, h, s, :hd] = e @ vh[lo:hi]
            part[r, h, s, hd] = m
            part[r, h, s, hd + 1] = e.sum()
    return part


def attn_ref_combine(part, hd, sinks=None):
    """The merged attention of partials [rows, heads, splits, hd + 2]; with `sinks` (one
    logit per head) each head's sink joins the denominator: e^(sink - M), M the max of
    the sink and the scores."""
    import numpy as np
    m = part[..., hd]
    M = m.max(axis=-1, keepdims=True)
    if sinks is not None:
        sk = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None], M.shape)
        M = np.maximum(M, sk)
    w = np.where(np.isfinite(m), np.exp(np.where(np.isfinite(m), m - M, 0)), 0.0)
    num = (w[..., None] * part[..., :hd]).sum(axis=-2)
    den = (w * part[..., hd + 1]).sum(axis=-1)
    if sinks is not None:
        den = den + np.where(np.isfinite(sk[..., 0]), np.exp(np.where(np.isfinite(sk[..., 0]), sk[..., 0] - M[..., 0], 0)), 0)
    return num / den[..., None]


def attn_ref_sinks(q, k, v, start_pos, nh, nkv, hd, scale, window, sinks):
    """Attention with sinks written out (no splits): softmax over [scores, sink], the
    sink's weight dropped. An independent check of attn_ref_combine's sink term."""
    import numpy as np
    rows = q.shape[0]
    out = np.zeros((rows, nh, hd))
    for r, h, pos, first, qh, kh, vh in attn_ref_heads(q, k, v, start_pos, nh, nkv, hd, window):
        sc = np.float32(scale) * (kh[first:pos + 1] @ qh)
        allsc = np.append(sc, float(sinks[h]))
        e = np.exp(allsc - allsc.max())
        out[r, h] = (e[:-1] / e.sum()) @ vh[first:pos + 1]
    return out.reshape(rows, nh * hd)


def kv_encode(kv, x):
    """Rows of x (float32, [rows, width]) as the CPU stores them (crates/strata-backend/src/cpu/kv.rs), in a
    float32 buffer [rows, row_len]: f16 two per float; q8_0 per 32 values the scale
    max|x|/127 then 32 signed bytes round(x/d) (halves away from zero) clamped to ±127."""
    import numpy as np
    rows, width = x.shape
    if kv == "f32":
        return x.copy()
    if kv == "f16":
        h = np.zeros((rows, 2 * ((width + 1) // 2)), np.float16)
        h[:, :width] = x.astype(np.float16)
        return h.view(np.float32)
    nb = (width + 31) // 32
    out = np.zeros((rows, nb, 9), np.float32)
    for b in range(nb):
        blk = x[:, 32 * b:32 * b + 32]
        d = (np.abs(blk).max(axis=1) / np.float32(127)).astype(np.float32)
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
        y = (blk * inv[:, None]).astype(np.float32).astype(np.float64)  # exact: |y| + 0.5 cannot round
        q = np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5), -127, 127).astype(np.int8)
        qs = np.zeros((rows, 32), np.int8)
        qs[:, :blk.shape[1]] = q
        out[:, b, 0] = d
        out[:, b, 1:] = qs.view(np.float32)
    return out.reshape(rows, nb * 9)


def kv_decode(kv, buf, width):
    """The values a cache of kv_encode's layout holds, as float64 [rows, width]."""
    import numpy as np
    rows = buf.shape[0]
    if kv == "f32":
        return buf.astype(np.float64)
    if kv == "f16":
        return buf.view(np.float16)[:, :width].astype(np.float64)
    blocks = buf.reshape(rows, -1, 9)
    d = blocks[:, :, 0].astype(np.float32)
    q = blocks[:, :, 1:].copy().view(np.int8).astype(np.float32)
    return (d[:, :, None] * q).astype(np.float32).reshape(rows, -1)[:, :width].astype(np.float64)


def cases_kv_store():
    import numpy as np
    cs = []

    def store(kv, src_rows, n_rows, width, listed):
        def run(c: Ctx, rng):
            src = (rng.standard_normal((src_rows, width)) * rng.uniform(0.01, 100)).astype(np.float32)
            src[0, :min(width, 40)] = 0.0  # an all-zero block: d = 0
            if width > 3:
                src[-1, 1] = 0.5 * float(np.abs(src[-1, :32]).max()) / 127 * 3  # a value on a rounding tie
            rows = (rng.permutation(src_rows)[:n_rows] if listed else np.arange(n_rows)).astype(np.uint32)
            want = kv_encode(kv, src[rows])
            bs, bd = c.buf(src), c.out(want.shape, np.float32)
            bi = c.buf(rows) if listed else None
            blocks = (width + 31) // 32
            grid = (n_rows, (width + 255) // 256) if kv == "f16" else (n_rows, (blocks + 7) // 8)
            c.launch(f"kv_store_{kv}", grid, (256,), bs, bi, bd, width, n_rows)
            got = bd.read()
            if kv == "f16" and width % 2:
                got, want = got.view(np.uint16)[:, :width], want.view(np.uint16)[:, :width]  # padding untouched
            return compare_exact("dst", got.view(np.uint32) if got.dtype == np.float32 else got,
                                 want.view(np.uint32) if want.dtype == np.float32 else want)
        return run
    for kv in ("f16", "q8_0"):
        for src_rows, n_rows, width, listed in ((3, 3, 64, False), (5, 3, 77, True), (2, 2, 1, False),
                                                (4, 4, 300, True), (9, 6, 1024, False), (3, 2, 33, True)):
            cs.append(Case(f"kv_store_{kv} src_rows={src_rows} n_rows={n_rows} width={width} "
                           f"rows={'list' if listed else 'null'}", f"kv_store_{kv}",
                           store(kv, src_rows, n_rows, width, listed)))
    return cs


def cases_rope_store():
    """rope_store_KV against numpy's rotation (q) and, bit for bit, against the work it
    fuses: rope_f32 of q and of k (rope.cu), then kv_store_KV of k and of v."""
    import numpy as np
    cs = []

    def run_case(kv, rows, nh, nkv, hd, inter, factor, pos0, pairs=None):
        def run(c: Ctx, rng):
            n_arg = hd // 2 if pairs is None else pairs
            npr = min(n_arg, hd // 2)
            width = nkv * hd
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
            v = rng.standard_normal((rows, width)).astype(np.float32)
            inv = (10000.0 ** (-np.arange(n_arg, dtype=np.float64) * 2 / (2 * npr))).astype(np.float32)
            row_len = kv_encode(kv, np.zeros((1, width), np.float32)).shape[1]
            bq, bk, bv, bi = c.buf(q, True), c.buf(k), c.buf(v), c.buf(inv)
            bkc, bvc = c.out((rows, row_len), np.float32), c.out((rows, row_len), np.float32)
            c.launch(f"rope_store_{kv}", (rows, nh + 2 * nkv), (128,), bq, bk, bv, bkc, bvc, pos0, nh, nkv, hd,
                     n_arg, bi, np.float32(factor), inter)
            # The unfused kernels on copies: rope_f32 of q and k, then the stores.
            pos = (pos0 + np.arange(rows)).astype(np.uint32)
            uq, uk, bp = c.buf(q.copy(), True), c.buf(k.copy(), True), c.buf(pos)
            c.launch("rope_f32", (rows, nh), (n_arg,), uq, bp, bi, nh, hd, n_arg, np.float32(factor), inter)
            c.launch("rope_f32", (rows, nkv), (n_arg,), uk, bp, bi, nkv, hd, n_arg, np.float32(factor), inter)
            ukc, uvc = c.out((rows, row_len), np.float32), c.out((rows, row_len), np.float32)
            if kv == "f32":
                want_k, want_v = uk.read(), v
            else:
                blocks = (width + 31) // 32
                grid = (rows, (width + 255) // 256) if kv == "f16" else (rows, (blocks + 7) // 8)
                c.launch(f"kv_store_{kv}", grid, (256,), uk, None, ukc, width, rows)
                c.launch(f"kv_store_{kv}", grid, (256,), bv, None, uvc, width, rows)
                want_k, want_v = ukc.read(), uvc.read()
            bits = lambda a: np.ascontiguousarray(a, np.float32).view(np.uint32)
            compare_exact("q", bits(bq.read()), bits(uq.read()))
            compare_exact("k_cache", bits(bkc.read()), bits(want_k))
            compare_exact("v_cache", bits(bvc.read()), bits(want_v))
            ang = (pos[:, None].astype(np.float32) * inv[None, :npr]).astype(np.float64)
            cs_, sn = np.cos(ang) * factor, np.sin(ang) * factor
            xr = q.astype(np.float64).reshape(rows, nh, hd)
            ia, ib = (np.arange(npr) * 2, np.arange(npr) * 2 + 1) if inter else (np.arange(npr), np.arange(npr) + npr)
            a, b = xr[..., ia], xr[..., ib]
            ref = xr.copy()
            ref[..., ia], ref[..., ib] = a * cs_[:, None, :] - b * sn[:, None, :], a * sn[:, None, :] + b * cs_[:, None, :]
            return compare_nmse("q", bq.read(), ref.reshape(rows, nh * hd), 1e-7)
        return run
    for kv in ("f32", "f16", "q8_0"):
        for rows, nh, nkv, hd, inter, factor, pos0, pairs in (
                (1, 4, 2, 64, 0, 1.0, 37, None), (3, 8, 2, 128, 1, 1.0, 4000, None), (2, 3, 1, 96, 0, 0.8, 9000, None),
                (2, 4, 4, 128, 0, 1.0, 100, 16), (1, 2, 1, 256, 1, 1.0, 5, None), (1, 1, 1, 512, 0, 1.0, 3, None)):
            what = f" n_pairs={pairs}" if pairs else ""
            cs.append(Case(f"rope_store_{kv} rows={rows} n_heads={nh} n_kv_heads={nkv} head_dim={hd}{what} "
                           f"{'interleaved' if inter else 'neox'} attn_factor={factor} pos0={pos0}",
                           f"rope_store_{kv}", run_case(kv, rows, nh, nkv, hd, inter, factor, pos0, pairs)))
    return cs


def cases_attention():
    import numpy as np
    cs = []

    def compare_part(got, ref, hd):
        empty = ~np.isfinite(ref[..., hd])
        if empty.any():
            ge = got[empty]
            ok = (ge[:, hd] == -np.inf) & (ge[:, hd + 1] == 0) & np.all(ge[:, :hd] == 0, axis=1)
            if not ok.all():
                idx = np.argwhere(empty)[~ok][:4]
                bad = "; ".join(f"[r={a},h={b},s={s_}] m={got[a, b, s_, hd]!r} l={got[a, b, s_, hd + 1]!r} "
                                f"acc[0]={got[a, b, s_, 0]!r}" for a, b, s_ in idx)
                raise CaseFail(f"part: empty slices must be m=-inf, l=0, acc=0; bad [row, head, split]: {bad}")
        if empty.all():
            return "all slices empty"
        # indices below are [row, head, split, dim]; empty slices (checked above) count as 0
        z = lambda a: np.where(empty[..., None], 0.0, a)
        s1 = compare_nmse("part.acc", z(got[..., :hd]), z(ref[..., :hd]), 5e-4)
        z1 = lambda a: np.where(empty, 0.0, a)
        s2 = compare_nmse("part.m", z1(got[..., hd]), z1(ref[..., hd]), 5e-4)
        s3 = compare_nmse("part.l", z1(got[..., hd + 1]), z1(ref[..., hd + 1]), 5e-4)
        return f"{s1} m_{s2.split(' ')[1]} l_{s3.split(' ')[1]} ({int(empty.sum())} empty slices)"

    def attn(rows, start, nh, nkv, hd, window, split_len, splits, softcap, mode, kv="f32"):
        def run(c, rng):
            cap = start + rows
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            v = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            # The caches as stored; the reference attends over the values they hold.
            k, v = kv_encode(kv, k), kv_encode(kv, v)
            kd, vd = kv_decode(kv, k, nkv * hd), kv_decode(kv, v, nkv * hd)
            scale = 1.0 / math.sqrt(hd)
            ref = attn_ref_partial(q, kd, vd, start, nh, nkv, hd, scale, window, split_len, splits, softcap)
            if mode == "combine":
                bp, bo = c.buf(ref.astype(np.float32)), c.out((rows, nh * hd), np.float32)
                c.launch("attn_combine_f32", (rows * nh,), (hd,), bp, bo, splits, hd)
                want = attn_ref_combine(ref.astype(np.float32).astype(np.float64), hd).reshape(rows, nh * hd)
                return compare_nmse("out", bo.read(), want, 5e-4)
            bq, bk, bv = c.buf(q), c.buf(k), c.buf(v)
            bp = c.out((rows, nh, splits, hd + 2), np.float32)
            c.launch(f"attn_partial_{kv}", (rows * nh, splits), (128,), bq, bk, bv, bp, start, nh, nkv, hd,
                     np.float32(scale), np.float32(softcap), window, split_len)
            got = bp.read()
            s = compare_part(got.astype(np.float64), ref, hd)
            if mode == "partial":
                return s
            bo = c.out((rows, nh * hd), np.float32)
            c.launch("attn_combine_f32", (rows * nh,), (hd,), bp, bo, splits, hd)
            want = attn_ref_combine(ref, hd).reshape(rows, nh * hd)
            return compare_nmse("out", bo.read(), want, 5e-4) + " (partial+combine)"
        return run

    shapes = [
        # rows, start_pos, n_heads, n_kv_heads, head_dim, window, split_len, splits[, softcap]
        (1, 37, 4, 2, 64, 0, 38, 1),      # decode, one split
        (1, 37, 4, 2, 64, 0, 16, 3),      # decode, split_len not dividing 38
        (5, 0, 4, 2, 128, 0, 3, 2),       # prefill from 0, empty slices for early rows
        (7, 20, 4, 2, 64, 8, 7, 4),       # prefill at start_pos > 0 with a sliding window
        (2, 100, 4, 4, 128, 50, 23, 5),   # MHA, window, 5 splits
        (8, 3, 4, 1, 64, 0, 5, 3),        # MQA, 8 rows
        (3, 9, 4, 2, 64, 0, 5, 8),        # more splits than needed: trailing empty slices
        (1, 300, 4, 2, 128, 0, 64, 5),    # longer decode
        (2, 10, 2, 1, 256, 4, 6, 2),      # head_dim 256, window
        (3, 2, 4, 2, 64, 16, 4, 2),       # window wider than the context
        (1, 700, 4, 2, 128, 0, 256, 3),   # launch.rs-style split (multiple of 64, >= 256 keys)
        (2, 500, 4, 2, 64, 0, 192, 3),    # prefill with a launch.rs-style split
        # softcapped scores (Gemma 2): caps small enough to reshape a N(0, 1) score
        (1, 37, 4, 2, 64, 0, 16, 3, 1.0),      # decode, split
        (5, 0, 4, 2, 128, 0, 3, 2, 0.5),       # prefill from 0, empty slices
        (7, 20, 4, 2, 64, 8, 7, 4, 2.0),       # sliding window
        (2, 10, 2, 1, 256, 0, 6, 2, 50.0),     # head_dim 256, Gemma 2's attention cap
        (3, 9, 4, 2, 64, 0, 5, 2, -1.5),       # a negative cap equals its absolute value
    ]
    # partial -> combine end to end (the kernels' own partials) on a few of them
    e2e = {1, 2, 6, 10, 12, 14}
    def described(shp):
        """A shape's launch arguments (softcap 0 when not given) and its case description."""
        rows, start, nh, nkv, hd, window, sl, sp = shp[:8]
        softcap = shp[8] if len(shp) > 8 else 0.0
        desc = (f"rows={rows} start_pos={start} n_heads={nh} n_kv={nkv} head_dim={hd} window={window} "
                f"split_len={sl} splits={sp}" + (f" softcap={softcap}" if softcap else ""))
        return (rows, start, nh, nkv, hd, window, sl, sp, softcap), desc

    for si, shp in enumerate(shapes):
        args, desc = described(shp)
        cs.append(Case(f"attn_partial_f32 {desc}", "attn_partial_f32", attn(*args, "partial")))
        cs.append(Case(f"attn_combine_f32 {desc}", "attn_combine_f32", attn(*args, "combine")))
        if si in e2e:
            cs.append(Case(f"attn_partial+combine {desc}", "attn_partial_f32", attn(*args, "both")))
    # Caches stored as f16 and q8_0 (head_dim 80 and 96: heads that straddle q8_0 blocks;
    # 40 with one KV head and 27 with three: rows that end in a partial block, odd rows).
    kv_shapes = shapes[:3] + [shapes[6], shapes[8], (2, 40, 4, 2, 80, 0, 16, 3), (3, 9, 6, 3, 96, 8, 5, 2, 1.0),
                              (2, 30, 2, 1, 40, 0, 16, 2), (1, 12, 3, 3, 27, 0, 13, 1)]
    for kv in ("f16", "q8_0"):
        for shp in kv_shapes:
            args, desc = described(shp)
            cs.append(Case(f"attn_partial_{kv} {desc}", f"attn_partial_{kv}", attn(*args, "partial", kv)))

    def attn_sinks(rows, start, nh, nkv, hd, window, split_len, splits, mode):
        """attn_combine_sinks_f32 over reference partials (`combine`) or after
        attn_partial_f32 (`both`), against the written-out softmax with sinks."""
        def run(c, rng):
            cap = start + rows
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            v = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            # Sinks near the scores, one far above them (most of the weight: small outputs)
            # and one at -inf (no sink).
            sinks = (rng.standard_normal(nh) * 2).astype(np.float32)
            sinks[0] = 6.0
            if nh > 2:
                sinks[-1] = -np.inf
            scale = 1.0 / math.sqrt(hd)
            ref = attn_ref_partial(q, k, v, start, nh, nkv, hd, scale, window, split_len, splits)
            written = attn_ref_sinks(q, k, v, start, nh, nkv, hd, scale, window, sinks)
            want = attn_ref_combine(ref, hd, sinks).reshape(rows, nh * hd)
            if not np.allclose(want, written, rtol=1e-9, atol=1e-12):
                raise CaseFail("harness: the split reference with sinks differs from the written-out one")
            bs, bo = c.buf(sinks), c.out((rows, nh * hd), np.float32)
            if mode == "combine":
                bp = c.buf(ref.astype(np.float32))
                want = attn_ref_combine(ref.astype(np.float32).astype(np.float64), hd, sinks).reshape(rows, nh * hd)
            else:
                bq, bk, bv = c.buf(q), c.buf(k), c.buf(v)
                bp = c.out((rows, nh, splits, hd + 2), np.float32)
                c.launch("attn_partial_f32", (rows * nh, splits), (128,), bq, bk, bv, bp, start, nh, nkv, hd,
                         np.float32(scale), np.float32(0.0), window, split_len)
            c.launch("attn_combine_sinks_f32", (rows * nh,), (hd,), bp, bs, bo, splits, nh, hd)
            plain = attn_ref_combine(ref, hd).reshape(rows, nh * hd)
            if np.allclose(want, plain, rtol=1e-3):
                raise CaseFail("harness: the sinks do not change the reference")
            return compare_nmse("out", bo.read(), want, 5e-4) + (" (partial+combine)" if mode == "both" else "")
        return run
    sink_shapes = [
        # rows, start_pos, n_heads, n_kv_heads, head_dim, window, split_len, splits
        (1, 37, 4, 2, 64, 0, 38, 1),      # decode, one split
        (1, 37, 4, 2, 64, 0, 16, 3),      # decode, split partials (one empty slice per row)
        (5, 0, 4, 2, 128, 0, 3, 2),       # prefill from 0: rows whose second split is empty
        (7, 20, 4, 2, 64, 8, 7, 4),       # sliding window (gpt-oss's even layers), split
        (1, 300, 8, 2, 64, 128, 64, 5),   # decode with a window and 5 splits, some empty
        (2, 10, 2, 1, 256, 0, 6, 2),      # head_dim 256, two heads (no -inf sink)
    ]
    for shp in sink_shapes:
        rows, start, nh, nkv, hd, window, sl, sp = shp
        desc = (f"rows={rows} start_pos={start} n_heads={nh} n_kv={nkv} head_dim={hd} window={window} "
                f"split_len={sl} splits={sp}")
        cs.append(Case(f"attn_combine_sinks_f32 {desc}", "attn_combine_sinks_f32", attn_sinks(*shp, "combine")))
        cs.append(Case(f"attn_partial+combine_sinks {desc}", "attn_combine_sinks_f32", attn_sinks(*shp, "both")))

    def attn_group(rows, start, nh, nkv, hd, window, split_len, splits, softcap, kv, sinks):
        """attn_group_KV against the reference partials (NMSE) and attn_partial_KV's bits;
        with `sinks`, then attn_combine_sinks_f32 over its partials against the written-out
        softmax with sinks."""
        def run(c, rng):
            cap = start + rows
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = kv_encode(kv, rng.standard_normal((cap, nkv * hd)).astype(np.float32))
            v = kv_encode(kv, rng.standard_normal((cap, nkv * hd)).astype(np.float32))
            kd, vd = kv_decode(kv, k, nkv * hd), kv_decode(kv, v, nkv * hd)
            scale = 1.0 / math.sqrt(hd)
            ref = attn_ref_partial(q, kd, vd, start, nh, nkv, hd, scale, window, split_len, splits, softcap)
            bq, bk, bv = c.buf(q), c.buf(k), c.buf(v)
            args = (start, nh, nkv, hd, np.float32(scale), np.float32(softcap), window, split_len)
            bg = c.out((rows, nh, splits, hd + 2), np.float32)
            c.launch(f"attn_group_{kv}", (rows * nkv, splits), (128,), bq, bk, bv, bg, *args)
            bh = c.out((rows, nh, splits, hd + 2), np.float32)
            c.launch(f"attn_partial_{kv}", (rows * nh, splits), (128,), bq, bk, bv, bh, *args)
            got, old = bg.read(), bh.read()
            s = compare_part(got.astype(np.float64), ref, hd)
            same = (got == old) | (np.isnan(got) & np.isnan(old))
            if not same.all():
                i = tuple(np.argwhere(~same)[0])
                raise CaseFail(f"part differs from attn_partial_{kv}'s at [row, head, split, slot] {i}: "
                               f"{got[i]!r} vs {old[i]!r} ({int((~same).sum())} values)")
            s += f"; bit for bit attn_partial_{kv}"
            if not sinks:
                return s
            sk = (rng.standard_normal(nh) * 2).astype(np.float32)
            sk[0] = 6.0
            bs, bo = c.buf(sk), c.out((rows, nh * hd), np.float32)
            c.launch("attn_combine_sinks_f32", (rows * nh,), (hd,), bg, bs, bo, splits, nh, hd)
            want = attn_ref_combine(ref, hd, sk).reshape(rows, nh * hd)
            return s + "; sinks " + compare_nmse("out", bo.read(), want, 5e-4)
        return run
    group_shapes = [
        # rows, start_pos, n_heads, n_kv_heads, head_dim, window, split_len, splits, softcap, sinks
        (1, 36, 8, 2, 64, 0, 37, 1, 0.0, False),      # decode, group 4, one split, 37 keys
        (1, 300, 32, 8, 128, 0, 64, 5, 0.0, False),   # Llama-3-8B's heads, split decode
        (1, 200, 16, 2, 128, 0, 64, 4, 0.0, False),   # group 8 (a whole pass)
        (1, 77, 16, 1, 64, 0, 26, 3, 0.0, False),     # group 16: two passes over the keys
        (1, 45, 4, 4, 128, 0, 16, 3, 0.0, False),     # MHA (group 1)
        (1, 130, 8, 4, 256, 0, 64, 3, 0.0, False),    # head_dim 256, group 2
        (1, 61, 8, 1, 256, 0, 32, 2, 50.0, False),    # head_dim 256, group 8 (two passes), softcap
        (1, 140, 8, 2, 64, 64, 64, 3, 0.0, False),    # sliding window: an empty first split
        (1, 99, 12, 3, 64, 16, 25, 4, 1.0, False),    # window and softcap, group 4
        (1, 80, 8, 2, 64, 0, 64, 2, 0.0, True),       # gpt-oss-style sinks, group 4
        (1, 150, 16, 2, 64, 128, 64, 3, 0.0, True),   # sinks with a window, group 8
        (4, 21, 8, 2, 128, 0, 9, 3, 0.0, False),      # a verifying sequence's 4 rows
        (5, 0, 8, 4, 64, 8, 3, 2, 0.0, False),        # prefill from 0, window: empty slices
        (2, 40, 8, 2, 80, 0, 16, 3, 0.0, False),      # head_dim 80 (heads straddle q8_0 blocks)
        (3, 9, 6, 3, 96, 8, 5, 2, 1.0, False),        # head_dim 96, window, softcap
        (2, 30, 4, 1, 40, 0, 16, 2, 0.0, False),      # head_dim 40: a partial q8_0 block
        (1, 12, 6, 3, 27, 0, 13, 1, 0.0, False),      # head_dim 27: odd f16 rows, unaligned slices
    ]
    for kv in ("f32", "f16", "q8_0"):
        for rows, start, nh, nkv, hd, window, sl, sp, cap_, snk in group_shapes:
            desc = (f"rows={rows} start_pos={start} n_heads={nh} n_kv={nkv} head_dim={hd} window={window} "
                    f"split_len={sl} splits={sp}" + (f" softcap={cap_}" if cap_ else "") + (" sinks" if snk else ""))
            cs.append(Case(f"attn_group_{kv} {desc}", f"attn_group_{kv}",
                           attn_group(rows, start, nh, nkv, hd, window, sl, sp, cap_, kv, snk)))
    return cs + cases_kv_store() + cases_rope_store()


def distinct_logits(rng, rows, vocab):
    """Logits without ties: a random permutation of evenly spaced values in about [-8, 8)
    plus jitter smaller than the spacing."""
    import numpy as np
    step = 16.0 / vocab
    x = np.stack([(rng.permutation(vocab) - vocab / 2) * step for _ in range(rows)])
    x = (x + rng.uniform(0, 0.25 * step, size=x.shape)).astype(np.float32)
    assert all(np.unique(r).size == vocab for r in x)
    return x


def lse_ref(x):
    import numpy as np
    xd = x.astype(np.float64)
    m = xd.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(xd - m).sum(axis=1, keepdims=True))).ravel()


def topk_ref(x, k):
    import numpy as np
    # descending value, ties to the lower index
    order = np.lexsort((np.arange(x.shape[1])[None, :].repeat(x.shape[0], 0), -x.astype(np.float64)), axis=1)
    return order[:, :k]


def cases_sample():
    import numpy as np
    cs = []

    def argmax(rows, vocab, variant):
        def run(c, rng):
            x = distinct_logits(rng, rows, vocab)
            if variant == "last" and vocab > 1:
                x[0, -1] = x[0].max() + 1
            if variant == "first":
                x[0, 0] = x[0].max() + 1
            if variant == "masked" and vocab > 3:
                x[:, ::3] = -np.inf
            if variant == "ties" and vocab > 10:  # tie across threads' slices
                top = x.max() + 1
                x[:, vocab // 3] = top
                x[:, vocab - 2] = top
            if variant == "same-thread ties":  # tie inside one thread's strided slice
                top = x.max() + 1
                x[:, [5 + 2048, 5, 5 + 1024]] = top
            bl = c.buf(x)
            bi, bv, bs = c.out((rows,), np.uint32), c.out((rows,), np.float32), c.out((rows,), np.float32)
            c.launch("argmax_f32", (rows,), (1024,), bl, vocab, bi, bv, bs)
            want = topk_ref(x, 1)[:, 0].astype(np.uint32)
            r1 = compare_exact("idx", bi.read(), want)
            compare_exact("val", bv.read(), x[np.arange(rows), want])
            r3 = compare_nmse("lse", bs.read(), lse_ref(x), 1e-7)
            return f"{r1}, val exact, {r3}"
        return run
    for rows, vocab, variant in ((1, 1, ""), (2, 5, ""), (3, 1000, ""), (1, 3001, "last"), (2, 3001, "first"),
                                 (4, 32000, ""), (2, 2000, "masked"), (2, 2000, "ties"),
                                 (1, 3000, "same-thread ties")):
        cs.append(Case(f"argmax_f32 rows={rows} vocab={vocab}{' ' + variant if variant else ''}", "argmax_f32",
                       argmax(rows, vocab, variant)))

    def topk(rows, vocab, k, variant):
        def run(c, rng):
            x = distinct_logits(rng, rows, vocab)
            if variant == "ties":
                top = np.sort(x[0])[-3]
                x[:, [vocab // 5, vocab // 2, vocab - 1]] = top + 1  # three-way tie at the top
                x[:, [7, 3]] = top + 0.5  # a tie further down
            if variant == "masked":
                x[:, 1::2] = -np.inf
            if variant == "tie at the cut":  # k-th and (k+1)-th best tie: lower index wins
                top = x.max() + 1
                x[:, [vocab - 1, 900, 17, 2000, 1400]] = top
            if variant == "same-thread top":  # 10 of the top 12 in one thread's slice
                top = x.max() + 1
                x[:, [7 + 1024 * j for j in range(10)]] = top + np.arange(10, dtype=np.float32)[::-1]
                x[:, 3] = top + 0.5
            if variant == "same-thread ties":
                top = x.max() + 1
                x[:, [9 + 1024 * j for j in range(4)]] = top
            bl = c.buf(x)
            bi, bv, bs = c.out((rows, k), np.uint32), c.out((rows, k), np.float32), c.out((rows,), np.float32)
            c.launch("topk_f32", (rows,), (1024,), bl, vocab, k, bi, bv, bs)
            want = topk_ref(x, k).astype(np.uint32)
            r1 = compare_exact("idx", bi.read(), want)
            compare_exact("val", bv.read(), np.take_along_axis(x, want.astype(np.int64), axis=1))
            r3 = compare_nmse("lse", bs.read(), lse_ref(x), 1e-7)
            return f"{r1}, val exact, {r3}"
        return run
    for rows, vocab, k, variant in ((1, 10, 1, ""), (2, 300, 5, ""), (1, 3001, 40, ""), (1, 32000, 256, ""),
                                    (1, 1000, 256, ""), (1, 256, 256, ""), (1, 2000, 10, "ties"),
                                    (1, 600, 50, "masked"), (1, 3000, 3, "tie at the cut"),
                                    (1, 10300, 12, "same-thread top"), (1, 5000, 6, "same-thread ties")):
        cs.append(Case(f"topk_f32 rows={rows} vocab={vocab} k={k}{' ' + variant if variant else ''}", "topk_f32",
                       topk(rows, vocab, k, variant)))
    return cs


def delta_ref(qkvz, ba, conv_w, neg_a, dt_bias, norm_w, state, nk, nv, dk, dv, taps, qg, bg, vt, eps):
    """crates/strata-backend/src/delta.rs's `mix` in float64: (out, new state)."""
    import numpy as np
    r, key_dim, value_dim = nv // nk, nk * dk, nv * dv
    conv_dim, group = 2 * key_dim + value_dim, 2 * dk + 2 * r * dv
    n = qkvz.shape[0]
    hist = state[:(taps - 1) * conv_dim].reshape(taps - 1, conv_dim).astype(np.float64)
    S = state[(taps - 1) * conv_dim:].reshape(nv, dk, dv).astype(np.float64)
    out = np.zeros((n, value_dim))
    silu = lambda x: x / (1 + np.exp(-x))
    for t in range(n):
        row = qkvz[t].astype(np.float64)
        if qg:
            parts = [row[g * group:(g + 1) * group] for g in range(nk)]
            mixed = np.concatenate([p[:dk] for p in parts] + [p[dk:2 * dk] for p in parts]
                                   + [p[2 * dk:2 * dk + r * dv] for p in parts])
            z = np.concatenate([p[2 * dk + r * dv:] for p in parts])
        else:
            mixed, z = row[:conv_dim], row[conv_dim:]
        window = np.vstack([hist, mixed[None, :]])  # taps x conv_dim, oldest first
        conv = silu((window.T * conv_w.astype(np.float64)).sum(axis=1))
        hist = window[1:]
        q, k, v = conv[:key_dim].reshape(nk, dk), conv[key_dim:2 * key_dim].reshape(nk, dk), conv[2 * key_dim:]
        q = q / np.sqrt((q * q).sum(axis=1, keepdims=True) + 1e-6) / math.sqrt(dk)
        k = k / np.sqrt((k * k).sum(axis=1, keepdims=True) + 1e-6)
        bat = ba[t].astype(np.float64)
        for h in range(nv):
            g = h % nk if vt else h // r
            b, a = (bat[g * 2 * r + h % r], bat[g * 2 * r + r + h % r]) if bg else (bat[h], bat[nv + h])
            beta = 1 / (1 + math.exp(-b))
            x = a + dt_bias[h]
            decay = math.exp(neg_a[h] * (x if x > 20 else math.log1p(math.exp(x))))
            S[h] *= decay
            delta = (v[h * dv:(h + 1) * dv] - S[h].T @ k[g]) * beta
            S[h] += np.outer(k[g], delta)
            o = S[h].T @ q[g]
            o = o / math.sqrt((o * o).mean() + eps)
            out[t, h * dv:(h + 1) * dv] = norm_w * o * silu(z[h * dv:(h + 1) * dv])
    return out, np.concatenate([hist.ravel(), S.ravel()])


def cases_deltanet():
    import numpy as np
    cs = []

    def run_case(nk, nv, dk, dv, taps, qg, bg, vt, cuts):
        def run(c, rng):
            key_dim, value_dim = nk * dk, nv * dv
            conv_dim, row_len = 2 * key_dim + value_dim, 2 * key_dim + 2 * value_dim
            n = sum(cuts)
            qkvz = rng.standard_normal((n, row_len)).astype(np.float32)
            ba = rng.standard_normal((n, 2 * nv)).astype(np.float32)
            conv_w = (rng.standard_normal((conv_dim, taps)) * 0.5).astype(np.float32)
            neg_a = -np.exp(rng.standard_normal(nv)).astype(np.float32)
            dt_bias = rng.standard_normal(nv).astype(np.float32)
            norm_w = rng.standard_normal(dv).astype(np.float32)
            state0 = (rng.standard_normal((taps - 1) * conv_dim + nv * dk * dv) * 0.3).astype(np.float32)
            eps = 1e-6
            ref_out, ref_state = delta_ref(qkvz, ba, conv_w, neg_a, dt_bias, norm_w, state0, nk, nv, dk, dv,
                                           taps, qg, bg, vt, eps)
            bcw, bna, bdt, bnw = c.buf(conv_w), c.buf(neg_a), c.buf(dt_bias), c.buf(norm_w)
            # The state's two parts (one buffer on the GPU: the conv inputs, then S).
            split = (taps - 1) * conv_dim
            bconv, bs = c.buf(state0[:split].copy(), True), c.buf(state0[split:].copy(), True)
            outs = []
            at = 0
            for m in cuts:  # the state carries from call to call
                bq, bb = c.buf(qkvz[at:at + m].copy()), c.buf(ba[at:at + m].copy())
                bmix, bo = c.out((m, conv_dim), np.float32), c.out((m, value_dim), np.float32)
                c.launch("delta_conv_f32", (cdiv(conv_dim, 256),), (256,), bq, bcw, bconv, bmix, m, nk, nv, dk,
                         dv, taps, int(qg))
                c.launch("delta_rule_f32", (nv,), (cdiv(dv, 32) * 32,), bmix, bq, bb, bna, bdt, bnw, bs, bo, m,
                         nk, nv, dk, dv, int(qg), int(bg), int(vt), eps)
                outs.append(bo.read())
                at += m
            got = np.concatenate(outs)
            got_state = np.concatenate([bconv.read(), bs.read()])
            return (f'{compare_nmse("out", got, ref_out, 1e-9)}; '
                    f'{compare_nmse("state", got_state, ref_state, 1e-9)}')
        return run
    for nk, nv, dk, dv, taps, qg, bg, vt, cuts in (
            (2, 4, 8, 4, 4, True, True, False, (5,)),
            (2, 4, 24, 20, 4, False, False, False, (3, 1, 4)),
            (2, 6, 16, 40, 4, False, False, True, (1, 1)),
            (1, 2, 128, 128, 4, True, True, False, (2,)),
            (3, 3, 8, 33, 2, False, True, False, (6,))):
        lay = f"{'grouped' if qg else 'whole'}{' tiled' if vt else ''}"
        cs.append(Case(f"delta nk={nk} nv={nv} dk={dk} dv={dv} taps={taps} {lay} cuts={cuts}", "delta_conv_f32",
                       run_case(nk, nv, dk, dv, taps, qg, bg, vt, cuts)))
    return cs


def cases_selftest():
    import numpy as np
    cs = []

    def block_sum(c, rng):
        n = 1000
        x = rng.standard_normal(n).astype(np.float32)
        bx, bo = c.buf(x), c.out((4,), np.float32)
        c.launch("st_block_sum", (4,), (256,), bx, bo, n)
        ref = np.array([x[i * 256:(i + 1) * 256].astype(np.float64).sum() for i in range(4)])
        return compare_nmse("out", bo.read(), ref, 1e-12)

    def shuffles(c, rng):
        x = rng.standard_normal(64).astype(np.float32)
        bx, bo = c.buf(x), c.out((6, 64), np.float32)
        c.launch("st_shuffles", (1,), (64,), bx, bo)
        got = bo.read()
        xd = x.astype(np.float64).reshape(2, 32)
        ref = np.zeros((6, 2, 32))
        ref[0] = xd.sum(1, keepdims=True)
        for w in range(2):  # shfl_down tree: lane l sums a lane-dependent set; simulate
            b = xd[w].copy()
            for o in (16, 8, 4, 2, 1):
                b = b + np.array([b[l + o] if l + o < 32 else b[l] for l in range(32)])
            ref[1, w] = b
        ref[2] = xd[:, 7:8]
        ref[3] = np.cumsum(xd, axis=1)
        ref[4] = xd.reshape(2, 4, 8).sum(2, keepdims=True).repeat(8, 2).reshape(2, 32)
        ball = [sum(1 << l for l in range(32) if x[w * 32 + l] > 0) for w in range(2)]
        ref5 = np.array([ball[w] for w in range(2) for _ in range(32)], dtype=np.uint32)
        compare_exact("ballot", got[5].view(np.uint32), ref5)
        return compare_nmse("shuffles", got[:5], ref[:5].reshape(5, 64), 1e-12) + ", ballot exact"

    def rotate(c, rng):
        x = rng.standard_normal(3 * 128).astype(np.float32)
        bx, bo = c.buf(x), c.out((3 * 128,), np.float32)
        c.launch("st_rotate", (3,), (16, 8), bx, bo, 37)
        ref = np.concatenate([np.roll(x[i * 128:(i + 1) * 128], -37) for i in range(3)])
        return compare_exact("out", bo.read(), ref)

    def maxsum(c, rng):
        rows, n = 3, 5000
        x = rng.standard_normal((rows, n)).astype(np.float32)
        bx, bo = c.buf(x), c.out((2 * rows,), np.float32)
        c.launch("st_block_maxsum", (rows,), (1024,), bx, bo, n)
        ref = np.concatenate([x.max(1), x.astype(np.float64).sum(1)])
        return compare_nmse("out", bo.read(), ref, 1e-10)

    def partial(c, rng):
        x = rng.standard_normal(40).astype(np.float32)
        bx, bo = c.buf(x), c.out((40,), np.float32)
        c.launch("st_partial_warp", (1,), (40,), bx, bo)
        got = bo.read()
        ref = np.concatenate([x[16:32], x[16:32], x[40 - 8:40] * np.nan])
        ref[16:32] = x[16:32]  # lanes 16..31 of warp 0: delta past the warp, own value
        ref[32:40] = np.nan  # warp 1 lanes 0..7 read non-existent lanes 16..23
        return compare_exact("out", got, ref)

    def neg(name, block, extra=()):
        def run(c, rng):
            n = 64 if not extra else extra[0]
            x = rng.standard_normal(256).astype(np.float32)
            bx, bo = c.buf(x), c.out((n,), np.float32)
            if name == "bad_missing_lane_deadlock":
                c.lib.lib.emu_set_timeout(1.0)
            try:
                c.launch(name, (1,), (block,), bx, bo, *extra)
            finally:
                c.lib.lib.emu_set_timeout(20.0)
            return "no error reported"
        return run

    cs += [Case("selftest shared-memory tree reduction", "st_block_sum", block_sum),
           Case("selftest warp shuffles xor/down/idx/up/width/ballot", "st_shuffles", shuffles),
           Case("selftest __syncthreads ordering, 2-D block", "st_rotate", rotate),
           Case("selftest block max+sum (shuffles + shared), block 1024", "st_block_maxsum", maxsum),
           Case("selftest partial last warp reads poison", "st_partial_warp", partial),
           Case("selftest detects early return before __syncthreads", "bad_early_return",
                neg("bad_early_return", 64, (40,)), expect_error="every thread must reach every __syncthreads"),
           Case("selftest detects a lane missing from a shuffle (exited)", "bad_missing_lane",
                neg("bad_missing_lane", 64), expect_error="all named lanes must execute the intrinsic"),
           Case("selftest detects a lane missing from a shuffle (deadlock, 1 s timeout)", "bad_missing_lane_deadlock",
                neg("bad_missing_lane_deadlock", 64), expect_error="deadlock"),
           Case("selftest detects divergent __syncthreads", "bad_divergent_sync",
                neg("bad_divergent_sync", 64), expect_error="different __syncthreads"),
           Case("selftest ASan catches an out-of-bounds write", "bad_oob_write",
                neg("bad_oob_write", 128, (64,)), expect_error="AddressSanitizer", modes=("asan",)),
           Case("selftest UBSan catches a misaligned load", "bad_misaligned",
                neg("bad_misaligned", 32), expect_error="misaligned address", modes=("asan",)),
           Case("selftest TSan catches a missing __syncthreads", "bad_race",
                neg("bad_race", 64), expect_error="ThreadSanitizer: data race", modes=("tsan",))]
    return cs


FILES = {
    "selftest.cu": (cases_selftest, SELFTEST_SIGS),
    "elementwise.cu": (cases_elementwise, SIGS["elementwise.cu"]),
    "rows.cu": (cases_rows, SIGS["rows.cu"]),
    "norm.cu": (cases_norm, SIGS["norm.cu"]),
    "rope.cu": (cases_rope, SIGS["rope.cu"]),
    "embedding.cu": (cases_embedding, SIGS["embedding.cu"]),
    "dequant.cu": (cases_dequant, SIGS["dequant.cu"]),
    "matvec.cu": (cases_matvec, SIGS["matvec.cu"]),
    "attention.cu": (cases_attention, SIGS["attention.cu"]),
    "sample.cu": (cases_sample, SIGS["sample.cu"]),
    "deltanet.cu": (cases_deltanet, SIGS["deltanet.cu"]),
}


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
        slow = ["sample.cu", "attention.cu", "matvec.cu", "selftest.cu"]
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
