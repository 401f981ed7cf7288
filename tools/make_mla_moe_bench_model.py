#!/usr/bin/env python3
"""Write a random-weight DeepSeek-V3- or GLM-4.5-Air-shaped MoE GGUF (Q4_K) to benchmark expert streaming.

    /work/venv/bin/python tools/make_mla_moe_bench_model.py {deepseek-v3,glm-4.5-air} \\
        [--out PATH] [--moe-layers N] [--seed 0]

Needs numpy and gguf-py (the `gguf` package). The sibling of tools/make_moe_bench_model.py
(Qwen3-30B-A3B's shape), whose Q4_K generator and GGUF writer it reuses: each tensor has
its own numpy stream keyed by the seed and its name, tensors are made and written one at a
time, the file is written under a temporary name, fsynced and renamed. Its output is
noise: it measures bytes and speed, not quality.

What it writes: one dense layer (as both real models start) and --moe-layers MoE layers at
the real model's per-layer widths, so the bytes of one routed expert, of a layer's core and
of the dense layer are the real model's at these types, with the tiny vocabulary of the
family's test fixture (tests/fixtures/gguf/deepseek_v3.f32.gguf or glm4_moe.f32.gguf,
whose tokenizer.* and other keys are copied and whose shape keys are set to the real
values). Every matrix whose rows are a multiple of 256 wide is Q4_K; the few that are not
(DeepSeek's attn_k_b, 128 wide; GLM's FFN down projections, 10944 and 1408 wide) are Q5_0,
llama.cpp's own fallback for Q4_K there. Norms, biases and routers are F32; the
embedding and output head F16.

DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3; llama.cpp `deepseek2` with the kv_b
projection split into attn_k_b / attn_v_b): hidden 7168, 128 heads, MLA q_lora 1536,
kv_lora 512, qk_nope 128, qk_rope 64, v_head 128; 256 routed experts of width 2048, 8 a
token, in 8 groups of which 4 are kept, sigmoid scores with a choice bias, weights
normalised and scaled by 2.5; one shared expert; dense intermediate 18432; YaRN factor 40
over 4096. Real model: 3 dense + 58 MoE layers. Default here: 1 dense + 2 MoE (~13.6 GB).

GLM-4.5-Air (transformers' Glm4MoeConfig defaults, which are the Air's config.json, with
its attention_bias true): hidden 4096, 96 query / 8 KV heads of 128, partial RoPE 0.5 (64
of 128), Q/K/V biases, no Q/K norms (use_qk_norm false); 128 routed experts of width 1408,
8 a token, sigmoid scores with a choice bias, one group, weights normalised, scale 1.0;
one shared expert; dense intermediate 10944 (first_k_dense_replace 1). Real model: 1 dense
+ 45 MoE layers (+1 MTP layer, not written). Default here: 1 dense + 3 MoE (~4.3 GB).

The script prints the bytes of one expert, of each layer's core, and the routed-experts-only
bytes a token (every core + top-k experts of each MoE layer), computed from the tensors it
wrote.
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

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gguf")
Q5_BLOCK, Q5_BYTES = gguf.GGML_QUANT_SIZES[QT.Q5_0]   # 32 weights, 22 bytes
Q5_STD_PER_D = float(np.sqrt((32 ** 2 - 1) / 12))     # std of q - 16 over uniform 5-bit q

DEEPSEEK = dict(
    arch="deepseek2", fixture="deepseek_v3.f32.gguf", label="DeepSeek-V3",
    hidden=7168, heads=128, q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128,
    experts=256, used=8, moe_ff=2048, dense_ff=18432, shared=1, real_dense=3, real_moe=58,
    default_moe=2,
    keys={
        "context_length": 163840, "embedding_length": 7168, "feed_forward_length": 18432,
        "attention.head_count": 128, "attention.head_count_kv": 1,
        "attention.key_length": 512 + 64, "attention.value_length": 512,
        "attention.key_length_mla": 128 + 64, "attention.value_length_mla": 128,
        "attention.q_lora_rank": 1536, "attention.kv_lora_rank": 512,
        "rope.dimension_count": 64, "rope.freq_base": 10000.0,
        "rope.scaling.factor": 40.0, "rope.scaling.original_context_length": 4096,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "expert_count": 256, "expert_used_count": 8, "expert_group_count": 8,
        "expert_group_used_count": 4, "expert_feed_forward_length": 2048,
        "expert_shared_count": 1, "expert_weights_scale": 2.5, "leading_dense_block_count": 1,
    },
)
GLM_AIR = dict(
    arch="glm4moe", fixture="glm4_moe.f32.gguf", label="GLM-4.5-Air",
    hidden=4096, heads=96, kv_heads=8, head_dim=128,
    experts=128, used=8, moe_ff=1408, dense_ff=10944, shared=1, real_dense=1, real_moe=45,
    default_moe=3,
    keys={
        "context_length": 131072, "embedding_length": 4096, "feed_forward_length": 10944,
        "attention.head_count": 96, "attention.head_count_kv": 8,
        "attention.key_length": 128, "attention.value_length": 128,
        "rope.dimension_count": 64, "rope.freq_base": 1e6,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "expert_count": 128, "expert_used_count": 8, "expert_group_count": 1,
        "expert_group_used_count": 1, "expert_feed_forward_length": 1408,
        "expert_shared_count": 1, "expert_weights_scale": 1.0, "leading_dense_block_count": 1,
        "nextn_predict_layers": 0,
    },
)
SHAPES = {"deepseek-v3": DEEPSEEK, "glm-4.5-air": GLM_AIR}


def mat(ne):
    """A matrix's kind: Q4_K where its rows are a multiple of 256 wide, else Q5_0."""
    return "q4k" if ne[0] % 256 == 0 else "q50"


def ffn_specs(p, s, dense):
    """A layer's FFN tensors: the dense SwiGLU, or router + stacked experts + shared expert."""
    h = s["hidden"]
    if dense:
        f = s["dense_ff"]
        return [(f"{p}.ffn_gate.weight", (h, f)), (f"{p}.ffn_up.weight", (h, f)), (f"{p}.ffn_down.weight", (f, h))]
    e, f, sh = s["experts"], s["moe_ff"], s["shared"] * s["moe_ff"]
    return [
        (f"{p}.ffn_gate_inp.weight", (h, e), "f32"),
        (f"{p}.exp_probs_b.bias", (e,), "zero"),
        (f"{p}.ffn_gate_exps.weight", (h, f, e)),
        (f"{p}.ffn_up_exps.weight", (h, f, e)),
        (f"{p}.ffn_down_exps.weight", (f, h, e)),
        (f"{p}.ffn_gate_shexp.weight", (h, sh)),
        (f"{p}.ffn_up_shexp.weight", (h, sh)),
        (f"{p}.ffn_down_shexp.weight", (sh, h)),
    ]


def attn_specs(p, s):
    h = s["hidden"]
    if s["arch"] == "deepseek2":
        n, nope, rope, v = s["heads"], s["qk_nope"], s["qk_rope"], s["v_head"]
        return [
            (f"{p}.attn_q_a.weight", (h, s["q_lora"])),                  # (q_lora, hidden)
            (f"{p}.attn_q_a_norm.weight", (s["q_lora"],), "norm"),
            (f"{p}.attn_q_b.weight", (s["q_lora"], n * (nope + rope))),  # (heads*(nope+rope), q_lora)
            (f"{p}.attn_kv_a_mqa.weight", (h, s["kv_lora"] + rope)),     # (kv_lora+rope, hidden)
            (f"{p}.attn_kv_a_norm.weight", (s["kv_lora"],), "norm"),
            (f"{p}.attn_k_b.weight", (nope, s["kv_lora"], n)),           # (heads, kv_lora, nope)
            (f"{p}.attn_v_b.weight", (s["kv_lora"], v, n)),              # (heads, v_head, kv_lora)
            (f"{p}.attn_output.weight", (n * v, h)),                     # (hidden, heads*v_head)
        ]
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    return [
        (f"{p}.attn_q.weight", (h, q)), (f"{p}.attn_q.bias", (q,), "f32"),
        (f"{p}.attn_k.weight", (h, kv)), (f"{p}.attn_k.bias", (kv,), "f32"),
        (f"{p}.attn_v.weight", (h, kv)), (f"{p}.attn_v.bias", (kv,), "f32"),
        (f"{p}.attn_output.weight", (q, h)),
    ]


def tensor_specs(s, moe_layers, vocab):
    """(name, ne, kind) in file order; ne is GGUF order (fastest-varying first)."""
    h = s["hidden"]
    ffn_norm = "ffn_norm" if s["arch"] == "deepseek2" else "post_attention_norm"
    specs = [("token_embd.weight", (h, vocab), "f16")]
    for i in range(1 + moe_layers):
        p = f"blk.{i}"
        layer = [(f"{p}.attn_norm.weight", (h,), "norm")] + attn_specs(p, s)
        layer += [(f"{p}.{ffn_norm}.weight", (h,), "norm")] + ffn_specs(p, s, dense=i == 0)
        specs += [t if len(t) == 3 else (t[0], t[1], mat(t[1])) for t in layer]
    specs += [("output_norm.weight", (h,), "norm"), ("output.weight", (h, vocab), "f16")]
    return specs


def nbytes(ne, kind):
    if kind == "q50":
        return int(np.prod(ne)) // Q5_BLOCK * Q5_BYTES
    if kind == "zero":
        kind = "f32"
    return base.spec_nbytes(ne, kind)


def info(ne, kind):
    if kind == "q50":
        np_shape = tuple(reversed(ne))
        return (*np_shape[:-1], np_shape[-1] // Q5_BLOCK * Q5_BYTES), np.uint8, QT.Q5_0
    return base.spec_info(ne, "f32" if kind == "zero" else kind)


def make_tensor(name, ne, kind, seed):
    if kind == "zero":      # the choice bias: zero, as a freshly initialised router's
        return np.zeros(tuple(reversed(ne)), dtype=np.float32)
    if kind != "q50":
        return base.make_tensor(name, ne, kind, seed)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    np_shape, _, _ = info(ne, kind)
    nblocks = int(np.prod(ne)) // Q5_BLOCK
    raw = np.frombuffer(rng.bytes(nblocks * Q5_BYTES), dtype=np.uint8).reshape(nblocks, Q5_BYTES).copy()
    d = (base.WEIGHT_STD / Q5_STD_PER_D * rng.uniform(0.5, 1.5, size=nblocks)).astype(np.float16)
    raw[:, 0:2] = d.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(np_shape)


def fixture_kvs(s, moe_layers):
    """The family's fixture's key-values, shape keys set to `s`'s (`base.fixture_kvs`)."""
    general = {
        "general.name": f"Strata MoE bench: {s['label']} shape, 1 dense + {moe_layers} MoE layers, random Q4_K",
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_K_S),
    }
    keys = dict(s["keys"], block_count=1 + moe_layers)
    return base.fixture_kvs(os.path.join(FIXTURES, s["fixture"]), s["arch"], keys, general)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--out", help="output GGUF (default /tmp/moe_bench/SHAPE-shape-1d+NM.gguf)")
    ap.add_argument("--moe-layers", type=int, help="MoE layers after the dense one")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    moe = s["default_moe"] if args.moe_layers is None else args.moe_layers
    if moe < 1:
        ap.error("--moe-layers must be at least 1")
    out = args.out or f"/tmp/moe_bench/{args.shape}-shape-1d+{moe}m.gguf"

    kvs, vocab = fixture_kvs(s, moe)
    specs = tensor_specs(s, moe, vocab)
    t0 = time.time()

    def metadata(w):
        for key, val, vtype, sub in kvs:
            w.add_key_value(key, val, vtype, sub_type=sub)

    base.write_gguf(out, s["arch"], metadata, [], specs, info,
                    lambda name, ne, kind: make_tensor(name, ne, kind, args.seed), "ffn_down_exps.weight")
    size = os.path.getsize(out)

    b = {name: nbytes(ne, kind) for name, ne, kind in specs}
    exps = [n for n in b if n.startswith("blk.1.") and "_exps." in n]
    expert = sum(b[n] for n in exps) // s["experts"]
    moe_core = sum(v for n, v in b.items() if n.startswith("blk.1.") and n not in exps)
    dense = sum(v for n, v in b.items() if n.startswith("blk.0."))
    resident = sum(v for n, v in b.items() if not n.startswith("blk."))
    per_token = dense + moe * (moe_core + s["used"] * expert)
    real = s["real_dense"] * dense + s["real_moe"] * (moe_core + s["used"] * expert)
    print(f"wrote {out} in {time.time() - t0:.1f} s")
    print(f"  file size:                      {size:,} B ({size / 1e9:.3f} GB)")
    print(f"  1 dense + {moe} MoE layers, vocab {vocab}, {s['experts']} experts, top-{s['used']}, "
          f"expert width {s['moe_ff']}, hidden {s['hidden']}")
    print(f"  one expert (gate+up+down):      {expert:,} B ({expert / 1e6:.3f} MB)")
    print(f"  one MoE layer's experts:        {expert * s['experts']:,} B")
    print(f"  one MoE layer's core:           {moe_core:,} B ({moe_core / 1e6:.3f} MB; attention, norms, "
          f"router, shared expert)")
    print(f"  the dense layer:                {dense:,} B ({dense / 1e6:.3f} MB)")
    print(f"  embedding+head+final norm:      {resident:,} B (resident)")
    print(f"  routed-experts-only bytes/token = {dense:,} + {moe} x ({moe_core:,} + {s['used']} x {expert:,})"
          f" = {per_token:,} B ({per_token / 2**20:.1f} MiB)")
    print(f"    (real {s['real_dense']} dense + {s['real_moe']} MoE layers: {real / 1e9:.2f} GB/token)")


if __name__ == "__main__":
    main()
