#!/usr/bin/env python3
"""Write a Hugging Face directory for a random-weight, scaled-down Qwen3.5-MoE to benchmark with (issue 21).

    python3 tools/make_hybrid_bench_model.py OUT_DIR [--layers 4] [--seed S]
    target/release/strata convert OUT_DIR OUT_DIR.q4k --format flat --quant q4_k
    python3 tools/bench_moe.py OUT_DIR.q4k --configs 0,10

Each layer has the per-layer shape of Qwen3.5-35B-A3B (hidden 2048; full attention with 16 heads of 256, 2 KV heads,
partial RoPE over a quarter of each head and an output gate; gated-delta-rule layers with 16 key heads and 32 value
heads of 128 and a 4-tap convolution; 256 routed experts of width 512, top-8, and a shared expert of width 512),
and the same layer pattern (three linear-attention layers, then one of full attention), for `--layers` layers
(default 4: one period). Its vocabulary is tools/make_bench_model.py's 32,000-token byte-level BPE (Qwen3.5's is
248,320: the head would outweigh the layers of so short a model). BF16 weights drawn from N(0, 0.02) (RMS norm
weights, which Qwen3.5 scales as 1 + w, from N(0, 0.02); the gated norm's from N(1, 0.02); A_log and dt_bias from
N(0, 0.5); the convolution from N(0, 0.3)), written by tools/make_bench_model.py's streaming safetensors writer.
Its output is noise: it measures speed and bytes, not quality. Needs only numpy.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_bench_model as mbm  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 16, 2, 256
K_HEADS, V_HEADS, K_DIM, V_DIM, CONV = 16, 32, 128, 128, 4
EXPERTS, TOP_K, EXPERT_WIDTH, SHARED_WIDTH = 256, 8, 512, 512
VOCAB, MAX_POSITIONS = 32000, 4096
W, N = (0.0, 0.02), (0.0, 0.02)


def layer_types(layers):
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]


def config(layers):
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "hidden_size": HIDDEN,
        "num_hidden_layers": layers,
        "layer_types": layer_types(layers),
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "linear_num_key_heads": K_HEADS,
        "linear_num_value_heads": V_HEADS,
        "linear_key_head_dim": K_DIM,
        "linear_value_head_dim": V_DIM,
        "linear_conv_kernel_dim": CONV,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": EXPERT_WIDTH,
        "shared_expert_intermediate_size": SHARED_WIDTH,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": mbm.BOS_ID,
        "eos_token_id": mbm.EOS_ID,
        "torch_dtype": "bfloat16",
    }


def tensor_specs(layers):
    """(name, shape, mean, std) in file order: embeddings, layer by layer, norm, head."""
    key_dim, value_dim = K_HEADS * K_DIM, V_HEADS * V_DIM
    conv_dim = 2 * key_dim + value_dim
    specs = [("model.embed_tokens.weight", (VOCAB, HIDDEN), *W)]
    for i, kind in enumerate(layer_types(layers)):
        p = f"model.layers.{i}"
        specs.append((f"{p}.input_layernorm.weight", (HIDDEN,), *N))
        if kind == "full_attention":
            q = HEADS * HEAD_DIM
            specs += [
                (f"{p}.self_attn.q_proj.weight", (2 * q, HIDDEN), *W),  # queries and the output gate
                (f"{p}.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), *W),
                (f"{p}.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), *W),
                (f"{p}.self_attn.q_norm.weight", (HEAD_DIM,), *N),
                (f"{p}.self_attn.k_norm.weight", (HEAD_DIM,), *N),
                (f"{p}.self_attn.o_proj.weight", (HIDDEN, q), *W),
            ]
        else:
            la = f"{p}.linear_attn"
            specs += [
                (f"{la}.in_proj_qkv.weight", (conv_dim, HIDDEN), *W),
                (f"{la}.in_proj_z.weight", (value_dim, HIDDEN), *W),
                (f"{la}.in_proj_b.weight", (V_HEADS, HIDDEN), *W),
                (f"{la}.in_proj_a.weight", (V_HEADS, HIDDEN), *W),
                (f"{la}.conv1d.weight", (conv_dim, 1, CONV), 0.0, 0.3),
                (f"{la}.A_log", (V_HEADS,), 0.0, 0.5),
                (f"{la}.dt_bias", (V_HEADS,), 0.0, 0.5),
                (f"{la}.norm.weight", (V_DIM,), 1.0, 0.02),
                (f"{la}.out_proj.weight", (HIDDEN, value_dim), *W),
            ]
        specs.append((f"{p}.post_attention_layernorm.weight", (HIDDEN,), *N))
        specs += [
            (f"{p}.mlp.gate.weight", (EXPERTS, HIDDEN), *W),
            (f"{p}.mlp.shared_expert.gate_proj.weight", (SHARED_WIDTH, HIDDEN), *W),
            (f"{p}.mlp.shared_expert.up_proj.weight", (SHARED_WIDTH, HIDDEN), *W),
            (f"{p}.mlp.shared_expert.down_proj.weight", (HIDDEN, SHARED_WIDTH), *W),
            (f"{p}.mlp.shared_expert_gate.weight", (1, HIDDEN), *W),
        ]
        for e in range(EXPERTS):
            specs += [
                (f"{p}.mlp.experts.{e}.gate_proj.weight", (EXPERT_WIDTH, HIDDEN), *W),
                (f"{p}.mlp.experts.{e}.up_proj.weight", (EXPERT_WIDTH, HIDDEN), *W),
                (f"{p}.mlp.experts.{e}.down_proj.weight", (HIDDEN, EXPERT_WIDTH), *W),
            ]
    specs += [("model.norm.weight", (HIDDEN,), *N), ("lm_head.weight", (VOCAB, HIDDEN), *W)]
    return specs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-bytes", type=float, default=2e9)
    args = ap.parse_args()
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    t0 = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    _, generation, tokenizer_config = mbm.configs(args.layers)
    files = {"config.json": config(args.layers), "generation_config.json": generation,
             "tokenizer_config.json": tokenizer_config, "tokenizer.json": mbm.make_tokenizer()}
    for name, obj in files.items():
        with open(os.path.join(args.out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
    specs = tensor_specs(args.layers)
    tables = {key: mbm.bf16_quantile_table(*key) for key in {(s[2], s[3]) for s in specs}}
    shards = mbm.plan_shards(specs, int(args.max_shard_bytes))
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
    weight_map, total = {}, 0
    for fname, shard in zip(names, shards):
        total += mbm.write_safetensors(os.path.join(args.out_dir, fname), shard, tables, args.seed)
        weight_map.update({s[0]: fname for s in shard})
        print(f"  {fname}: {len(shard)} tensors ({time.time() - t0:.1f} s)", file=sys.stderr)
    if len(shards) > 1:
        with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
            f.write("\n")
    print(f"{args.out_dir}: {total / 1e9:.2f} GB of BF16 in {len(shards)} file(s), {time.time() - t0:.1f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
