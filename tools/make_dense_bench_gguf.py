#!/usr/bin/env python3
"""Write a random-weight Llama-3-8B-shaped GGUF, quantized as llama.cpp's Q4_K_M lays it
out, to benchmark streaming a dense model (issue 16's 8B benchmark).

    python3 tools/make_dense_bench_gguf.py [--out /tmp/b8.q4_k_m.gguf] [--layers 32]
        [--seed 0] [--tokenizer-from tests/fixtures/gguf/llama3.gguf]
        [--llama-python PYTHON | --no-validate]

Needs numpy and gguf-py (the `gguf` package; `tools/gpu_check.sh pack` carries it as
gpu-run/gguf-py). Seconds instead of the minutes that writing a 16 GB BF16 checkpoint and
quantizing it take, and the streamed bytes are a real Q4_K_M 8B's: only the vocabulary is
small (the embedding and head stay resident and are not streamed).

Shape (Llama 3 8B): hidden 4096, 32 layers, 32 query and 8 KV heads of 128, FFN 14336,
rope theta 500000, RMS eps 1e-5. Types follow llama.cpp's Q4_K_M rule for the llama
architecture (src/llama-quant.cpp, `use_more_bits`: layer i of n when i < n/8, i >= 7n/8,
or (i - n/8) % 3 == 2): `attn_v` and `ffn_down` are Q6_K in those layers and Q4_K in the
others; every other matrix is Q4_K; norms F32. The embedding and output head (tiny
vocabulary) are F16.

Values are noise with a standard deviation near 0.02: Q4_K blocks as in
make_moe_bench_model.py; Q6_K blocks (ql, qh and the int8 sub-block scales random, d per
block) with w = d·scale·(q − 32). It measures speed, not quality. The output is a pure
function of --layers and --seed, written as OUT.tmp-PID, fsynced, and renamed.
"""

import argparse
import os
import sys
import time
import zlib

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_moe_bench_model as moe  # noqa: E402  (Q4_K blocks, tokenizer copy, validation)

HIDDEN = 4096
HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
FF = 14336
CONTEXT = 8192
ROPE_THETA = 500000.0
RMS_EPS = 1e-5
DEFAULT_LAYERS = 32
DEFAULT_OUT = "/tmp/b8.q4_k_m.gguf"
DEFAULT_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                 "tests", "fixtures", "gguf", "llama3.gguf")
WEIGHT_STD = 0.02
Q6_BLOCK, Q6_BYTES = gguf.GGML_QUANT_SIZES[QT.Q6_K]  # 256 weights, 210 bytes
# std of scale·(q − 32) over uniform int8 scales and 6-bit q, in units of d
Q6K_STD_PER_D = float(np.sqrt(((256 ** 2 - 1) / 12 + 0.5 ** 2) * ((64 ** 2 - 1) / 12 + 0.5 ** 2)))


def more_bits(i, n):
    """llama.cpp's `use_more_bits` for layer i of n."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_specs(layers, vocab):
    """(name, ne, kind) in file order; kind 'q4k', 'q6k', 'f16' or 'norm'."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    specs = [("token_embd.weight", (HIDDEN, vocab), "f16")]
    for i in range(layers):
        p, big = f"blk.{i}", "q6k" if more_bits(i, layers) else "q4k"
        specs += [
            (f"{p}.attn_norm.weight", (HIDDEN,), "norm"),
            (f"{p}.attn_q.weight", (HIDDEN, q), "q4k"),
            (f"{p}.attn_k.weight", (HIDDEN, kv), "q4k"),
            (f"{p}.attn_v.weight", (HIDDEN, kv), big),
            (f"{p}.attn_output.weight", (q, HIDDEN), "q4k"),
            (f"{p}.ffn_norm.weight", (HIDDEN,), "norm"),
            (f"{p}.ffn_gate.weight", (HIDDEN, FF), "q4k"),
            (f"{p}.ffn_up.weight", (HIDDEN, FF), "q4k"),
            (f"{p}.ffn_down.weight", (FF, HIDDEN), big),
        ]
    specs += [("output_norm.weight", (HIDDEN,), "norm"), ("output.weight", (HIDDEN, vocab), "f16")]
    return specs


def nbytes(ne, kind):
    n = int(np.prod(ne))
    return {"q4k": n // moe.QK_BLOCK * moe.QK_BYTES, "q6k": n // Q6_BLOCK * Q6_BYTES, "f16": 2 * n}.get(kind, 4 * n)


def info(ne, kind):
    """(numpy shape, numpy dtype, raw type) for GGUFWriter.add_tensor_info."""
    shape = tuple(reversed(ne))
    if kind in ("q4k", "q6k"):
        block, size, qt = (moe.QK_BLOCK, moe.QK_BYTES, QT.Q4_K) if kind == "q4k" else (Q6_BLOCK, Q6_BYTES, QT.Q6_K)
        return (*shape[:-1], shape[-1] // block * size), np.uint8, qt
    return shape, (np.float16 if kind == "f16" else np.float32), None


def make_q6k(rng, ne):
    """Random Q6_K blocks (ql, qh, int8 scales, then f16 d), bytes last."""
    shape, _, _ = info(ne, "q6k")
    blocks = int(np.prod(ne)) // Q6_BLOCK
    raw = np.frombuffer(rng.bytes(blocks * Q6_BYTES), dtype=np.uint8).reshape(blocks, Q6_BYTES).copy()
    d = (WEIGHT_STD / Q6K_STD_PER_D * rng.uniform(0.5, 1.5, size=blocks)).astype(np.float16)
    raw[:, Q6_BYTES - 2:] = d.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(shape)


def make_tensor(name, ne, kind, seed):
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if kind == "q4k":
        return moe.make_q4k(rng, ne, WEIGHT_STD)
    if kind == "q6k":
        return make_q6k(rng, ne)
    shape = tuple(reversed(ne))
    if kind == "f16":
        return rng.normal(0.0, WEIGHT_STD, size=shape).astype(np.float16)
    return (1.0 + rng.normal(0.0, 0.02, size=shape)).astype(np.float32)


def write_model(out, layers, seed, tokenizer_path):
    tok_kvs, vocab = moe.read_tokenizer(tokenizer_path)
    specs = tensor_specs(layers, vocab)

    def metadata(w):
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(f"Strata dense bench: Llama-3-8B shape, {layers} layers, random Q4_K_M")
        w.add_block_count(layers)
        w.add_context_length(CONTEXT)
        w.add_embedding_length(HIDDEN)
        w.add_feed_forward_length(FF)
        w.add_head_count(HEADS)
        w.add_head_count_kv(KV_HEADS)
        w.add_rope_dimension_count(HEAD_DIM)
        w.add_layer_norm_rms_eps(RMS_EPS)
        w.add_rope_freq_base(ROPE_THETA)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

    moe.write_gguf(out, "llama", metadata, tok_kvs, specs, info, lambda name, ne, kind: make_tensor(name, ne, kind, seed),
                   "ffn_down.weight")
    return specs, vocab


def sanity(path):
    """Dequantizes rows of the first Q4_K and the first Q6_K matrix: finite, std near 0.02."""
    reader = gguf.GGUFReader(path)
    out, seen = {}, set()
    for t in reader.tensors:
        if t.tensor_type in (QT.Q4_K, QT.Q6_K) and t.tensor_type not in seen:
            seen.add(t.tensor_type)
            vals = gguf.quants.dequantize(np.asarray(t.data[:4]), t.tensor_type)
            assert np.isfinite(vals).all(), t.name
            out[t.name] = (t.tensor_type.name, float(vals.std()), float(np.abs(vals).max()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-from", default=DEFAULT_TOKENIZER)
    ap.add_argument("--llama-python", default=moe.DEFAULT_LLAMA_PY)
    ap.add_argument("--no-validate", action="store_true", help="skip llama.cpp's load and decode check")
    ap.add_argument("--bench-tokens", type=int, default=8)
    args = ap.parse_args()
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    t0 = time.time()
    specs, vocab = write_model(args.out, args.layers, args.seed, args.tokenizer_from)
    sizes = {name: nbytes(ne, kind) for name, ne, kind in specs}
    per_layer = [sum(v for n, v in sizes.items() if n.startswith(f"blk.{i}.")) for i in range(args.layers)]
    streamed = sum(per_layer)
    q6 = sum(1 for i in range(args.layers) if more_bits(i, args.layers))
    print(f"wrote {args.out} in {time.time() - t0:.1f} s: {os.path.getsize(args.out):,} B")
    print(f"  {args.layers} layers ({q6} with Q6_K attn_v and ffn_down), vocab {vocab}; layer bytes "
          f"{min(per_layer):,} to {max(per_layer):,}, {streamed:,} B streamed per token at budget 0")
    for name, (qt, std, amax) in sanity(args.out).items():
        print(f"  {name} ({qt}): std {std:.4f}, max |w| {amax:.4f}")
    if not args.no_validate and not moe.validate(args.out, args.llama_python, args.bench_tokens):
        sys.exit(1)


if __name__ == "__main__":
    main()
