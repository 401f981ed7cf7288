#!/usr/bin/env python3
"""Write a random-weight gpt-oss-120b- or gpt-oss-20b-shaped GGUF (MXFP4 experts) to benchmark expert streaming.

    /work/venv/bin/python tools/make_gpt_oss_bench_model.py {gpt-oss-120b,gpt-oss-20b} [--out PATH] [--layers N]
        [--seed 0]

Needs numpy and gguf-py (the `gguf` package). A sibling of tools/make_moe_bench_model.py, whose GGUF writer it reuses
(each tensor its own numpy stream keyed by the seed and its name, written one at a time under a temporary name,
fsynced and renamed). Its output is noise: it measures bytes and speed, not quality.

The layout is llama.cpp's `gpt-oss` as its converter writes OpenAI's checkpoints: the routed experts MXFP4 (stacked
`ffn_{gate,up,down}_exps`, with F32 biases `[experts, width]`), attention projections Q8_0 (hidden 2880 is not a
whole number of 256-value K-quant blocks) with F32 biases, F32 norms, sinks and router (weight and bias), F16
embedding and output head. MXFP4 blocks are random bytes with exponents 119-121 (values of std ~0.02); Q8_0 blocks
random levels with scales for the same std. Metadata and tokenizer are the gpt-oss test fixture's
(tests/fixtures/gguf/gpt_oss.f32.gguf), shape keys set to the real model's:

  both: hidden 2880, 64 query and 8 KV heads of 64, expert width 2880, top-4, sliding window 128 on the even
        layers, YaRN factor 32 over 4096, RoPE theta 150000
  gpt-oss-120b: 128 experts, 36 layers (default here 4)
  gpt-oss-20b:  32 experts, 24 layers (default here 24: the whole model, ~12 GB)

It prints the bytes of one expert, of a layer's core, and the routed-experts-only bytes a token.
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
import make_moe_bench_model as base  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gguf",
                       "gpt_oss.f32.gguf")
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WIDTH, TOP_K = 2880, 64, 8, 64, 2880, 4
SHAPES = {"gpt-oss-120b": dict(experts=128, real_layers=36, layers=4),
          "gpt-oss-20b": dict(experts=32, real_layers=24, layers=24)}
STD = 0.02
MX_BLOCK, MX_BYTES = 32, 17
Q8_BLOCK, Q8_BYTES = 32, 34


def tensor_specs(experts, layers, vocab):
    """(name, ne, kind) in file order; ne is GGUF order (fastest-varying first)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    specs = [("token_embd.weight", (HIDDEN, vocab), "f16")]
    for i in range(layers):
        p = f"blk.{i}"
        specs += [
            (f"{p}.attn_norm.weight", (HIDDEN,), "norm"),
            (f"{p}.attn_q.weight", (HIDDEN, q), "q8"), (f"{p}.attn_q.bias", (q,), "f32"),
            (f"{p}.attn_k.weight", (HIDDEN, kv), "q8"), (f"{p}.attn_k.bias", (kv,), "f32"),
            (f"{p}.attn_v.weight", (HIDDEN, kv), "q8"), (f"{p}.attn_v.bias", (kv,), "f32"),
            (f"{p}.attn_output.weight", (q, HIDDEN), "q8"), (f"{p}.attn_output.bias", (HIDDEN,), "f32"),
            (f"{p}.attn_sinks.weight", (HEADS,), "f32"),
            (f"{p}.post_attention_norm.weight", (HIDDEN,), "norm"),
            (f"{p}.ffn_gate_inp.weight", (HIDDEN, experts), "f32"), (f"{p}.ffn_gate_inp.bias", (experts,), "f32"),
            (f"{p}.ffn_gate_exps.weight", (HIDDEN, WIDTH, experts), "mx"),
            (f"{p}.ffn_gate_exps.bias", (WIDTH, experts), "f32"),
            (f"{p}.ffn_up_exps.weight", (HIDDEN, WIDTH, experts), "mx"),
            (f"{p}.ffn_up_exps.bias", (WIDTH, experts), "f32"),
            (f"{p}.ffn_down_exps.weight", (WIDTH, HIDDEN, experts), "mx"),
            (f"{p}.ffn_down_exps.bias", (HIDDEN, experts), "f32"),
        ]
    return specs + [("output_norm.weight", (HIDDEN,), "norm"), ("output.weight", (HIDDEN, vocab), "f16")]


def blocks_of(kind):
    return {"mx": (MX_BLOCK, MX_BYTES, QT.MXFP4), "q8": (Q8_BLOCK, Q8_BYTES, QT.Q8_0)}[kind]


def nbytes(ne, kind):
    if kind in ("mx", "q8"):
        block, size, _ = blocks_of(kind)
        return int(np.prod(ne)) // block * size
    return base.spec_nbytes(ne, "f32" if kind == "norm" else kind)


def info(ne, kind):
    if kind in ("mx", "q8"):
        block, size, qt = blocks_of(kind)
        np_shape = tuple(reversed(ne))
        return (*np_shape[:-1], np_shape[-1] // block * size), np.uint8, qt
    return base.spec_info(ne, kind)


def make_tensor(name, ne, kind, seed):
    if kind not in ("mx", "q8"):
        return base.make_tensor(name, ne, kind, seed)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    np_shape, _, _ = info(ne, kind)
    block, size, _ = blocks_of(kind)
    n = int(np.prod(ne)) // block
    raw = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
    if kind == "mx":
        # |value| = kvalue * 2^(e - 128), kvalues of mean square ~40: e = 120 gives std ~0.025.
        raw[:, 0] = rng.integers(119, 122, size=n, dtype=np.uint8)
    else:
        # Uniform int8 levels (std ~74) times d.
        d = (STD / 74.0 * rng.uniform(0.5, 1.5, size=n)).astype(np.float16)
        raw[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    return raw.reshape(np_shape)


def fixture_kvs(experts, layers):
    """The gpt-oss fixture's key-values, shape keys set to the real model's (`base.fixture_kvs`)."""
    keys = {
        "context_length": 131072, "embedding_length": HIDDEN, "feed_forward_length": WIDTH,
        "block_count": layers, "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS,
        "attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM, "rope.dimension_count": HEAD_DIM,
        "rope.freq_base": 150000.0, "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
        "expert_count": experts, "expert_used_count": TOP_K, "expert_feed_forward_length": WIDTH,
        "attention.sliding_window": 128,
    }
    name = f"Strata MoE bench: gpt-oss shape, {experts} experts, {layers} layers, random MXFP4"
    return base.fixture_kvs(FIXTURE, "gpt-oss", keys, {"general.name": name})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--out")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    layers = args.layers or s["layers"]
    out = args.out or f"/tmp/moe_bench/{args.shape}-shape-{layers}l.gguf"
    kvs, vocab = fixture_kvs(s["experts"], layers)
    specs = tensor_specs(s["experts"], layers, vocab)
    t0 = time.time()

    def metadata(w):
        for key, val, vtype, sub in kvs:
            w.add_key_value(key, val, vtype, sub_type=sub)

    base.write_gguf(out, "gpt-oss", metadata, [], specs, info,
                    lambda name, ne, kind: make_tensor(name, ne, kind, args.seed), "ffn_down_exps.bias")
    b = {name: nbytes(ne, kind) for name, ne, kind in specs}
    exps = [n for n in b if n.startswith("blk.0.") and "_exps." in n]
    expert = sum(b[n] for n in exps) // s["experts"]
    core = sum(v for n, v in b.items() if n.startswith("blk.0.") and n not in exps)
    per_token = layers * (core + TOP_K * expert)
    real = s["real_layers"] * (core + TOP_K * expert)
    print(f"wrote {out} in {time.time() - t0:.1f} s, {os.path.getsize(out):,} B")
    print(f"  one expert (gate+up+down, biases): {expert:,} B; a layer's core: {core:,} B")
    print(f"  routed-experts-only bytes/token = {layers} x ({core:,} + {TOP_K} x {expert:,}) = {per_token:,} B "
          f"(real {s['real_layers']} layers: {real / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
