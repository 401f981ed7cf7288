#!/usr/bin/env python3
"""Checks the PTX of the kernels that stage their reads in 16-byte loads: every
`matvec_packed_*`, `matvec_glu_packed_*`, `matvec_add_packed_*` and
`matvec_multi_packed_*` entry of a matvec PTX file (kernels/README.md,
"Packed weights"; set `matvec`, the default; set `elements`: only those of the F32, F16
and BF16 weights read in place) or every `attn_group_*` entry of an attention
PTX file (set `attention`: K/V head slices copied to shared memory) reads global memory
with 16-byte vector loads (`ld.global.nc.v4.u32` or `ld.global.v4.*`), and `ptxas -v`
assembles it with 0 spill bytes. Run by tools/cuda_toolchain.sh on the PTX it compiled:

    tools/check_packed_ptx.py PTXAS ARCH FILE.ptx [matvec|elements|attention]
"""
import re
import subprocess
import sys

# The formats with a packed layout (kernels/README.md, "Packed weights"), and the element
# formats the same kernels read in their stored layout.
PACKED_FORMATS = ["affine_q4", "i8", "mxfp4", "q4_0", "q4_1", "q4_k", "q5_0", "q5_1", "q5_k", "q6_k", "q8_0"]
ALIGNED_FORMATS = ["bf16", "f16", "f32"]
# The kernels that read packed weights, by name prefix (then the format).
KERNELS = ("matvec_packed_", "matvec_glu_packed_", "matvec_add_packed_", "matvec_multi_packed_")
# The entries each set checks, by name prefix, and the names it must find among them.
# `elements`: the element formats' packed matvecs alone (checked on every arch).
SETS = {
    "matvec": (KERNELS, sorted(f"{k}{f}" for k in KERNELS for f in PACKED_FORMATS + ALIGNED_FORMATS)),
    "elements": (tuple(f"{k}{f}" for k in KERNELS for f in ALIGNED_FORMATS),
                 sorted(f"{k}{f}" for k in KERNELS for f in ALIGNED_FORMATS)),
    "attention": (("attn_group_",), ["attn_group_f16", "attn_group_f32", "attn_group_q8_0"]),
}
V4_LOAD = re.compile(r"\bld\.global(\.nc)?\.v4\.(u32|b32|s32|f32)\b")


def entries(ptx: str) -> dict[str, str]:
    """Entry name -> its body (from `.entry NAME(` to the next `.entry` or the end)."""
    marks = [(m.group(1), m.start()) for m in re.finditer(r"\.entry\s+(\w+)\s*\(", ptx)]
    return {name: ptx[at:(marks[i + 1][1] if i + 1 < len(marks) else len(ptx))] for i, (name, at) in enumerate(marks)}


def main() -> int:
    ptxas, arch, path = sys.argv[1:4]
    which = sys.argv[4] if len(sys.argv) > 4 else "matvec"
    prefixes, want = SETS[which]
    ptx = open(path).read()
    packed = {n: b for n, b in entries(ptx).items() if n.startswith(prefixes) and (which != "elements" or n in want)}
    problems = []
    if sorted(packed) != want:
        problems.append(f"{which} entries are {sorted(packed)}")
    for name, body in sorted(packed.items()):
        loads = sorted({m.group(0) for m in V4_LOAD.finditer(body)})
        n = len(V4_LOAD.findall(body))
        if not loads:
            problems.append(f"{name}: no 16-byte global loads")
        print(f"{name}: {n} x {', '.join(loads) or 'none'}")
    out = subprocess.run([ptxas, f"-arch={arch}", "-v", path, "-o", "/dev/null"], capture_output=True, text=True)
    if out.returncode != 0:
        problems.append(f"ptxas failed: {out.stderr[-2000:]}")
    # ptxas -v: "Compiling entry function 'NAME' for 'sm_90'", then "N bytes stack frame,
    # N bytes spill stores, N bytes spill loads" and "Used N registers, ...".
    current = None
    seen = set()
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            continue
        if current not in packed:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            seen.add(current)
            if m.group(1) != "0" or m.group(2) != "0":
                problems.append(f"{current}: {line.strip()}")
        m = re.search(r"Used (\d+) registers", line)
        if m:
            print(f"{current}: {line.strip()}")
    for name in packed:
        if name not in seen:
            problems.append(f"{name}: ptxas -v reported no spill line")
    if problems:
        print("check_packed_ptx: " + "\n  ".join(problems), file=sys.stderr)
        return 1
    what = {"matvec": "packed matvecs (and fused GLU, add and multi matvecs)",
            "elements": "element formats' packed matvecs", "attention": "grouped attention kernels"}[which]
    print(f"check_packed_ptx: {arch} {what} use 16-byte global loads, 0 spill bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
