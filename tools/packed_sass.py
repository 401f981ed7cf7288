#!/usr/bin/env python3
"""How many instructions the packed matvecs spend per weight value on sm_90, from their
machine code: each `matvec_packed_FMT` kernel of kernels/matvec_packed.cu compiled for one
activation row (MATVEC_MAX_ROWS set to 1 in a copy, so the loop holds that path alone),
assembled by ptxas and disassembled by cuobjdump (both from pip wheels, no GPU), then its
innermost loop with 16-byte weight loads counted: instructions, and weight values per
iteration (its 16-byte loads over a unit's, times the unit's values).

A static figure, not a speed: it says where a kernel is bound. An H200 issues 128
instructions per SM and clock (4 schedulers of a warp each), so a kernel spending `n` per
value decodes at most 128/n values per SM and clock, 132 SMs at 1.98 GHz: it keeps up
with the 4.8 TB/s of HBM3e when 128/n · 132 · 1.98e9 · (bytes per value) ≥ 4.8e12.

    tools/packed_sass.py [FORMAT ...]     (default: every quantized packed format)

Makes (or reuses) a venv at target/sass-venv with tools/requirements-sass.txt.
"""
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "sass-venv")
# Per format: (16-byte loads a unit, values a unit, bytes a value as stored).
UNITS = {
    "q4_0": (1, 32, 18 / 32), "q4_1": (1, 32, 20 / 32), "q5_0": (1, 32, 22 / 32), "q5_1": (1, 32, 24 / 32),
    "q8_0": (2, 32, 34 / 32), "mxfp4": (1, 32, 17 / 32), "i8": (2, 32, 36 / 32), "affine_q4": (1, 32, 68 / 128),
    "q4_k": (1, 32, 144 / 256), "q5_k": (2, 32, 176 / 256), "q6_k": (3, 64, 210 / 256),
}
HBM_BYTES_S, SMS, CLOCK = 4.8e12, 132, 1.98e9


def venv_tools():
    """(libnvrtc, ptxas, cuobjdump) from the venv, made first when missing."""
    py = os.path.join(VENV, "bin", "python")
    req = os.path.join(ROOT, "tools", "requirements-sass.txt")
    stamp = os.path.join(VENV, ".requirements")
    if not os.path.exists(stamp) or open(stamp).read() != open(req).read():
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "-r", req], check=True)
        open(stamp, "w").write(open(req).read())
    site = glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages"))[0]
    find = lambda pattern: sorted(glob.glob(os.path.join(site, "nvidia", pattern)))[-1]
    tools = find("cuda_nvrtc/lib/libnvrtc.so.12"), find("cuda_nvcc/bin/ptxas"), find("*/bin/cuobjdump")
    for t in tools[1:] + (find("*/bin/nvdisasm"),):
        os.chmod(t, 0o755)
    # cuobjdump runs the nvdisasm beside it.
    os.environ["PATH"] = os.path.dirname(tools[2]) + os.pathsep + os.environ.get("PATH", "")
    return tools


def ptx(nvrtc: str) -> bytes:
    """kernels/matvec_packed.cu (with common.cuh and quant.cuh) for compute_90, one activation row."""
    parts = []
    for name in ("common.cuh", "quant.cuh", "matvec_packed.cu"):
        text = open(os.path.join(ROOT, "kernels", name)).read()
        text, n = re.subn(r"#define MATVEC_MAX_ROWS 8u", "#define MATVEC_MAX_ROWS 1u", text)
        parts.append(f'#line 1 "{name}"\n{text}\n')
    nv = ctypes.CDLL(nvrtc)
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), "".join(parts).encode(), b"matvec_packed.cu", 0, None, None) == 0
    opts = [b"--std=c++17", b"-default-device", b"--gpu-architecture=compute_90"]
    rc = nv.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"NVRTC failed:\n{log.value.decode()}")
    nv.nvrtcGetPTXSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetPTX(prog, buf)
    return buf.value


def hot_loop(sass: str):
    """The innermost loop (a backward branch's body) holding 16-byte global loads:
    (instructions, 16-byte loads, opcode counts), or None."""
    code = [(int(a, 16), ins.strip()) for a, ins in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    at = {a: i for i, (a, _) in enumerate(code)}
    best = None
    for i, (a, ins) in enumerate(code):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in at:
            continue
        body = [x for _, x in code[at[int(m.group(1), 16)]:i + 1]]
        loads = sum("LDG.E.128" in x for x in body)
        if loads and (best is None or len(body) < len(best[0])):
            best = (body, loads)
    if best is None:
        return None
    body, loads = best
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in body)
    return len(body), loads, ops


def main() -> int:
    formats = sys.argv[1:] or list(UNITS)
    nvrtc, ptxas, cuobjdump = venv_tools()
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "matvec.ptx"), os.path.join(tmp, "matvec.cubin")
        open(src, "wb").write(ptx(nvrtc))
        subprocess.run([ptxas, "-arch=sm_90", "-O3", src, "-o", cubin], check=True)
        print("format     instr/value  bound (of 4.8 TB/s)  loop: instructions, 16-byte loads, top opcodes")
        for f in formats:
            sass = subprocess.run([cuobjdump, "-sass", "-fun", f"matvec_packed_{f}", cubin],
                                  capture_output=True, text=True).stdout
            loop = hot_loop(sass)
            if loop is None:
                print(f"{f:10} no loop with 16-byte loads found")
                continue
            n, loads, ops = loop
            per_unit, unit_values, bytes_value = UNITS[f]
            values = loads // per_unit * unit_values
            per_value = n / values
            bound = 128 / per_value * SMS * CLOCK * bytes_value / HBM_BYTES_S
            top = ", ".join(f"{k} {v}" for k, v in ops.most_common(6))
            print(f"{f:10} {per_value:11.2f}  {100 * min(bound, 9.99):17.0f}%  {n}, {loads}, {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
