#!/usr/bin/env python3
"""Golden vectors for Strata's block-quantized formats (tests/it/quant_golden.rs).

Run with the reference venv (needs numpy, gguf-py and llama-cpp-python from PyPI):

    /work/refvenv/bin/pip install gguf llama-cpp-python
    /work/refvenv/bin/python tools/make_quant_fixtures.py

For each block type it writes, under tests/fixtures/quant/:
  <name>.blocks.bin   raw little-endian blocks
  <name>.f32.bin      the expected dequantized values (little-endian f32)
and, for Q8_0, Q4_0 and MXFP4, <name>.quant_input.f32.bin / <name>.quant_blocks.bin: an
f32 input and the bytes gguf.quants.quantize makes of it. For Q4_K, Q6_K and Q8_K,
k_quant.quant_input.f32.bin (one input shared by the three) and <name>.quant_blocks.bin:
the bytes llama.cpp's own reference quantizers (`quantize_row_q4_K_ref` etc., called
through ctypes from the libggml-base.so that llama-cpp-python ships) make of it; see
kquant_quantizer_fixtures. index.json lists them all.

Expected values come from gguf.quants.dequantize (an independent numpy
implementation) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and MXFP4. gguf-py has no
Q8_1, Q8_K or Strata's own AffineQ4/I8, so those are dequantized by the small numpy
functions below, written from ggml-common.h and the layouts documented in
crates/strata-quant/src/affine_q4.rs and crates/strata-quant/src/int8.rs.

gguf-py cannot quantize K-quants, so the K-quant dequantizer fixtures are random VALID
blocks: random bytes with the f16 scales overwritten by small finite values.

MXFP4 (see mxfp4_fixtures) needs only numpy and gguf-py (0.19.0 has it):
`python tools/make_quant_fixtures.py --mxfp4` rewrites just its files and its
index.json entry, for machines without llama-cpp-python.
"""

import ctypes
import importlib.metadata
import importlib.util
import json
import pathlib
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant"
RNG = np.random.default_rng(20240601)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8)


def random_blocks(n, size, f16_fields=(), f32_fields=(), scale=0.05, positive=()):
    """n random blocks of `size` bytes whose f16 (or f32) fields at the given byte
    offsets hold small finite values."""
    b = RNG.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in f16_fields:
        v = RNG.uniform(-scale, scale, size=n)
        if off in positive:
            v = np.abs(v)
        b[:, off : off + 2] = f16_bytes(v).reshape(n, 2)
    for off in f32_fields:
        v = RNG.uniform(-scale, scale, size=n).astype(np.float32)
        b[:, off : off + 4] = v.view(np.uint8).reshape(n, 4)
    return b


def quant_input(n_blocks, block):
    x = RNG.normal(0.0, 1.0, size=(n_blocks, block)).astype(np.float32)
    x[0] = 0.0  # an all-zero block
    x[1, 7] = 300.0  # one large value
    x[2] *= 1e-3  # small values
    x[3, :] = np.float32(0.5)  # a constant block
    return x.reshape(-1)


def kquant_input():
    """8 super-blocks of f32 for the K-quant quantizers, with the hard cases first.

    Drawn from its own generator so that adding it left RNG's stream, and with it every
    older fixture, unchanged."""
    rng = np.random.default_rng(20240602)
    x = rng.normal(0.0, 1.0, size=(8, 256)).astype(np.float32)
    x[0] = 0.0  # all zeros
    x[1, 37] = 1000.0  # one huge outlier: the other sub-block scales round to 0
    x[2] = -np.abs(x[2])  # all negative
    x[3] *= 1e-8  # tiny: the f16 super-block scales underflow to 0
    x[4, :] = np.float32(0.5)  # constant, positive
    x[5] *= np.repeat(np.float32(10.0) ** np.arange(-4, 4, dtype=np.float32), 32)  # scale per sub-block
    x[6] = rng.integers(-8, 8, size=256).astype(np.float32) / 2  # on a grid: rounding ties
    return x.reshape(-1)  # x[7] stays plain N(0, 1)


def ggml_base():
    """llama-cpp-python's libggml-base.so, which exports the `quantize_row_*_ref`s."""
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llama-cpp-python is not installed (pip install llama-cpp-python)")
    return ctypes.CDLL(str(pathlib.Path(spec.submodule_search_locations[0]) / "lib" / "libggml-base.so"))


def ggml_quantize_ref(lib, name, x, block_bytes):
    """`void quantize_row_<name>_ref(const float * x, block_<name> * y, int64_t k)` on x."""
    fn = getattr(lib, f"quantize_row_{name}_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert x.size % 256 == 0
    y = np.zeros((x.size // 256, block_bytes), dtype=np.uint8)
    fn(x.ctypes.data, y.ctypes.data, x.size)
    return y


def kquant_quantizer_fixtures(index):
    """Writes the K-quant quantizer fixtures and adds them to the Q4_K, Q6_K and Q8_K
    entries of `index` (under the same keys as the Q8_0/Q4_0 quantizer fixtures)."""
    lib = ggml_base()
    x = kquant_input()
    (OUT / "k_quant.quant_input.f32.bin").write_bytes(x.astype("<f4").tobytes())
    for dtype, ref, size in [("Q4_K", "q4_K", 144), ("Q6_K", "q6_K", 210), ("Q8_K", "q8_K", 292)]:
        name = dtype.lower()
        (OUT / f"{name}.quant_blocks.bin").write_bytes(ggml_quantize_ref(lib, ref, x, size).tobytes())
        (entry,) = [e for e in index if e["dtype"] == dtype]
        entry.update(
            {
                "quant_input": "k_quant.quant_input.f32.bin",
                "quant_blocks": f"{name}.quant_blocks.bin",
                "quant_reference": f"llama.cpp quantize_row_{ref}_ref",
            }
        )


def mxfp4_quant_input():
    """12 MXFP4 blocks of f32 with the hard cases, from a generator of their own (RNG's
    stream, and every older fixture, stay as they were)."""
    rng = np.random.default_rng(20250805)
    x = rng.normal(0.0, 1.0, size=(12, 32)).astype(np.float32)
    x[0] = 0.0  # all zeros: e = 0
    x[1, 7] = 300.0  # one outlier: the rest round to 0 or ±1 step
    x[2] *= 1e-3
    x[3, :] = np.float32(0.5)  # constant
    # max 12 (e = 128, d = 1): ties halfway between grid values go to the first index
    # (0.5 → 0, 5 → 4, 10 → 8, -0.5 → 0), 14 clips to 12, -0.0 is 0
    ties = [12.0, 0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0, -0.5, -1.5, -2.5, -3.5, -5.0, -7.0, -10.0, 14.0]
    x[4] = np.array(ties + [-0.0, 0.25, 0.75, 1.25, 11.0, -11.0, 9.0, -9.0] + [0.0] * 8, dtype=np.float32)
    x[5] *= np.float32(2.0**-118)  # amax near 2^-117: e around 8
    x[6, :] = np.float32(2.0**-125)  # the smallest amax with e >= 0: e = 0, d = 2^-128
    x[6, 3] = np.float32(-(2.0**-125))
    x[7] *= np.float32(1e38)
    x[7, 0] = np.float32(3e38)  # e = 252, beyond 12 steps: clips
    x[8, 0] = np.float32(2.0**20 * (1 - 2.0**-24))  # just below a power of two: log2f rounds
    x[9] = np.clip(x[9] * np.float32(0.25), -0.9, 0.9)
    x[9, 0] = np.float32(1 - 2.0**-24)
    x[10] = rng.integers(-12, 13, size=32).astype(np.float32) * np.float32(2.0**-3)  # near the grid
    return x.reshape(-1)  # x[11] stays plain N(0, 1)


def mxfp4_blocks(q):
    """The MXFP4 dequantizer fixture: the gguf-py-quantized blocks `q`, then blocks of
    every nibble at the edge exponents (0, 1, 2, 127, 128, 254, 255; 12 · 2^126 and more
    overflow to inf in f32), then random bytes."""
    rng = np.random.default_rng(20250806)
    edge = []
    for i, e in enumerate([0, 1, 2, 127, 128, 254, 255]):
        qs = [(j + i) % 16 | ((15 - j) << 4) for j in range(16)]  # every nibble, both halves
        edge.append([e] + qs)
    rand = rng.integers(0, 256, size=(6, 17), dtype=np.uint8)
    return np.concatenate([q, np.array(edge, dtype=np.uint8), rand])


def mxfp4_fixtures(write):
    """MXFP4's dequantizer and quantizer fixtures, both from gguf-py."""
    x = mxfp4_quant_input()
    with np.errstate(over="ignore"):  # the 3e38 block: far candidates' errors are inf
        q = quantize(x.reshape(1, -1), T.MXFP4).reshape(-1, 17)
    (OUT / "mxfp4.quant_input.f32.bin").write_bytes(x.astype("<f4").tobytes())
    (OUT / "mxfp4.quant_blocks.bin").write_bytes(q.tobytes())
    blocks = mxfp4_blocks(q)
    with np.errstate(over="ignore"):
        expected = dequantize(blocks.reshape(-1), T.MXFP4).reshape(-1)
    extra = {
        "quant_input": "mxfp4.quant_input.f32.bin",
        "quant_blocks": "mxfp4.quant_blocks.bin",
        "quant_reference": "gguf.quants.quantize",
    }
    write("mxfp4", "MXFP4", blocks, expected, "gguf.quants.dequantize", extra)


def deq_q8_1(blocks):
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    return (blocks[:, 4:].copy().view(np.int8).astype(np.float32) * d).reshape(-1)


def deq_q8_k(blocks):
    d = blocks[:, 0:4].copy().view(np.float32)
    return (d * blocks[:, 4:260].copy().view(np.int8).astype(np.float32)).reshape(-1)


def deq_affine_q4(blocks):
    scale = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    bias = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:68]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # j, then j + 64
    return (q * scale + bias).reshape(-1)


def deq_i8(blocks):
    scale = blocks[:, 0:4].copy().view(np.float32)
    return (blocks[:, 4:36].copy().view(np.int8).astype(np.float32) * scale).reshape(-1)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    only_mxfp4 = sys.argv[1:] == ["--mxfp4"]
    index = []
    if only_mxfp4:
        meta = json.loads((OUT / "index.json").read_text())
        index = [e for e in meta["fixtures"] if e["dtype"] != "MXFP4"]

    def write(name, dtype, blocks, expected, reference, extra=None):
        blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
        expected = np.ascontiguousarray(expected, dtype="<f4")
        (OUT / f"{name}.blocks.bin").write_bytes(blocks.tobytes())
        (OUT / f"{name}.f32.bin").write_bytes(expected.tobytes())
        entry = {
            "dtype": dtype,
            "n_blocks": int(blocks.shape[0]),
            "block_bytes": int(blocks.shape[1]),
            "blocks": f"{name}.blocks.bin",
            "expected": f"{name}.f32.bin",
            "reference": reference,
        }
        entry.update(extra or {})
        index.append(entry)

    if only_mxfp4:
        mxfp4_fixtures(write)
        meta["fixtures"] = index
        meta["gguf_py"] = importlib.metadata.version("gguf")
        (OUT / "index.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"wrote the MXFP4 fixtures to {OUT}")
        return

    # 32-value GGML formats gguf-py can quantize: quantized blocks + random valid blocks.
    simple = {
        "Q4_0": (T.Q4_0, 18, [0], ()),
        "Q4_1": (T.Q4_1, 20, [0, 2], (0,)),
        "Q5_0": (T.Q5_0, 22, [0], ()),
        "Q5_1": (T.Q5_1, 24, [0, 2], (0,)),
        "Q8_0": (T.Q8_0, 34, [0], ()),
    }
    for dtype, (qt, size, f16s, pos) in simple.items():
        name = dtype.lower()
        x = quant_input(6, 32)
        q = quantize(x.reshape(1, -1), qt).reshape(-1, size)
        extra = None
        if dtype in ("Q8_0", "Q4_0"):
            (OUT / f"{name}.quant_input.f32.bin").write_bytes(x.astype("<f4").tobytes())
            (OUT / f"{name}.quant_blocks.bin").write_bytes(q.tobytes())
            extra = {
                "quant_input": f"{name}.quant_input.f32.bin",
                "quant_blocks": f"{name}.quant_blocks.bin",
                "quant_reference": "gguf.quants.quantize",
            }
        blocks = np.concatenate([q, random_blocks(2, size, f16s, positive=pos)])
        expected = dequantize(blocks.reshape(-1), qt).reshape(-1)
        write(name, dtype, blocks, expected, "gguf.quants.dequantize", extra)

    # K-quants: random valid blocks.
    kquants = {
        "Q4_K": (T.Q4_K, 144, [0, 2]),  # d, dmin at the start
        "Q5_K": (T.Q5_K, 176, [0, 2]),
        "Q6_K": (T.Q6_K, 210, [208]),  # d at the end
    }
    for dtype, (qt, size, f16s) in kquants.items():
        blocks = random_blocks(4, size, f16s, scale=0.01, positive=tuple(f16s))
        blocks[0, :] = 0  # one all-zero block
        if dtype != "Q6_K":
            blocks[0, 0:2] = f16_bytes([0.01])  # ...with a scale but zero levels and mins
        expected = dequantize(blocks.reshape(-1), qt).reshape(-1)
        write(dtype.lower(), dtype, blocks, expected, "gguf.quants.dequantize")

    # Formats gguf-py does not dequantize: numpy references in this file.
    blocks = random_blocks(6, 36, [0, 2])
    write("q8_1", "Q8_1", blocks, deq_q8_1(blocks), "numpy deq_q8_1 in make_quant_fixtures.py")
    blocks = random_blocks(4, 292, f32_fields=[0], scale=0.1)
    write("q8_k", "Q8_K", blocks, deq_q8_k(blocks), "numpy deq_q8_k in make_quant_fixtures.py")
    blocks = random_blocks(4, 68, [0, 2], scale=2.0, positive=(0,))
    write("affine_q4", "AffineQ4", blocks, deq_affine_q4(blocks), "numpy deq_affine_q4 in make_quant_fixtures.py")
    blocks = random_blocks(6, 36, f32_fields=[0], scale=0.1)
    write("i8", "I8", blocks, deq_i8(blocks), "numpy deq_i8 in make_quant_fixtures.py")

    # K-quant quantizers: llama.cpp's reference bytes (Q5_K too once Strata quantizes it).
    kquant_quantizer_fixtures(index)

    mxfp4_fixtures(write)

    meta = {
        "generator": "tools/make_quant_fixtures.py",
        "gguf_py": importlib.metadata.version("gguf"),
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "fixtures": index,
    }
    (OUT / "index.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {len(index)} fixtures to {OUT}")


if __name__ == "__main__":
    main()
