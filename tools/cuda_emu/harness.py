"""The CUDA emulator harness's base (tools/cuda_emu/README.md): the binding ABI table
(checked against kernels/README.md), building a .cu file into a shared library with g++ and
emu.hpp, the ctypes library and its exactly-sized device buffers (Lib, Buf, Ctx), the
comparisons (NMSE, exact), the weight formats and their reference decodes, and Case.
Used by run_tests.py (the entry point) and the case modules under cases/."""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import subprocess
import threading
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
PACKED_FMTS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "q4_k", "q5_k", "q6_k", "affine_q4", "i8"]
# The formats the packed matvecs also read in their stored layout (rows 16-byte aligned).
ALIGNED_FMTS = ["f32", "f16", "bf16"]
# Per packed format: the byte range of a stored block that holds its quants (the rest of
# the block, in stored order, is the block's scales).
PACKED_QUANTS = {"q4_0": (2, 18), "q4_1": (4, 20), "q5_0": (6, 22), "q5_1": (8, 24), "q8_0": (2, 34),
                 "mxfp4": (1, 17), "q4_k": (16, 144), "q5_k": (16, 176), "q6_k": (0, 192), "affine_q4": (4, 68),
                 "i8": (4, 36)}
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
        ("pack_blocks_u8", "const unsigned char* src, unsigned char* dst, unsigned long long n_blocks, "
                           "unsigned block, unsigned q0, unsigned q_len"),
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
    ],
    "matvec_packed.cu": [
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
QUANT_FILES = {"embedding.cu", "dequant.cu", "matvec.cu", "matvec_packed.cu"}
# The GLU activations of matvec_glu_packed_FMT: their `act` codes (common.cuh's
# STRATA_GLU_*) and the unfused kernel of each (elementwise.cu).
GLU_ACTS = {"silu": (0, "silu_mul_f32"), "gelu_tanh": (1, "gelu_mul_f32"), "sigmoid": (2, "sigmoid_mul_f32"),
            "swiglu_oai": (3, "swiglu_oai_f32")}
# Files whose kernels a file's cases launch too, from their own libraries in the same
# process (the fused GLU matvec's cases run the unfused matvec and GLU kernels, the fused
# RoPE + KV store's cases rope_f32 and the stores).
COMPANIONS = {"matvec_packed.cu": ["elementwise.cu"], "attention.cu": ["rope.cu"]}
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
