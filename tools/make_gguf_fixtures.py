#!/usr/bin/env python3
"""Convert the committed HF fixtures into F32 GGUF files the way llama.cpp's
convert_hf_to_gguf.py does, and record gguf-py's own view of each file.

How to run (from the repository root, after tools/make_fixtures.py):

    /work/refvenv/bin/pip install gguf          # or any venv from tools/requirements-ref.txt
    /work/refvenv/bin/python tools/make_gguf_fixtures.py

Inputs   tests/fixtures/hf/llama3  (arch llama: Q/K rows permuted for interleaved RoPE,
                                    Llama 3 rope scaling written as a rope_freqs.weight tensor)
         tests/fixtures/hf/qwen2   (arch qwen2: NEOX RoPE, no permutation, tied embeddings)
Outputs  tests/fixtures/gguf/<name>.gguf
         tests/fixtures/gguf/<name>.view.json   gguf-py's GGUFReader view: every metadata key
                                                with its value types and value, every tensor with
                                                its ne (GGML order), type and a few values.
"""

import json
import math
import struct
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "tests/fixtures/hf"
OUT = ROOT / "tests/fixtures/gguf"

# HF name (after model.layers.N.) -> llama.cpp name (after blk.N.)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def permute(weights, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute: NEOX halves -> interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def llama3_rope_factors(cfg):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_type llama3)."""
    rs = cfg["rope_scaling"]
    base = cfg.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old_ctx = rs.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def vocab(hf_dir, n_vocab):
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    model = tok["model"]
    assert model["type"] == "BPE"
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok["added_tokens"]}
    tokens, types = [], []
    for i in range(n_vocab):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:  # padding up to the embedding rows
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.CONTROL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tok, tokens, types, merges


def load_safetensors(path):
    """numpy float32 arrays from a safetensors file (BF16 upcast exactly)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a : base + b]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name} has dtype {dt}")
        out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def load_hf_weights(hf_dir):
    weights = {}
    for p in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_safetensors(p))
    return weights


def convert(hf_dir, arch, pre, path, max_layers=None, f16=False):
    """Writes the HF model in `hf_dir` (single or sharded safetensors, F32/F16/BF16) as a
    GGUF at `path` the way convert_hf_to_gguf.py does: llama.cpp's metadata keys and
    tensor names, Q/K permuted for arch `llama`, Llama 3 rope scaling as rope_freqs, the
    gpt2 vocabulary, add_bos only when the post-processor really adds a token, the chat
    template from tokenizer_config.json or chat_template.jinja. `max_layers` keeps only
    the first layers; `f16` stores 2-D tensors as F16 (norms stay F32)."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    weights = load_hf_weights(hf_dir)
    n_layers = cfg["num_hidden_layers"] if max_layers is None else min(max_layers, cfg["num_hidden_layers"])
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // n_head)
    rope = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    n_vocab = weights["model.embed_tokens.weight"].shape[0]

    w = gguf.GGUFWriter(path, arch)
    w.add_name(path.stem)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    if "head_dim" in cfg:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)

    tok, tokens, types, merges = vocab(hf_dir, n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    if tok_cfg.get("bos_token"):
        w.add_bos_token_id(ids[tok_cfg["bos_token"]])
    if tok_cfg.get("eos_token"):
        w.add_eos_token_id(ids[tok_cfg["eos_token"]])
    if tok_cfg.get("pad_token"):
        w.add_pad_token_id(ids[tok_cfg["pad_token"]])
    post = tok.get("post_processor") or {}
    w.add_add_bos_token(any("SpecialToken" in s for s in post.get("single", [])))
    template = tok_cfg.get("chat_template")
    if template is None and (hf_dir / "chat_template.jinja").exists():
        template = (hf_dir / "chat_template.jinja").read_text()
    if template:
        w.add_chat_template(template)

    if (cfg.get("rope_scaling") or {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    for name in sorted(weights, key=lambda n: (n.count("."), n)):
        data = weights[name]
        if name in GLOBAL_NAMES:
            gg_name = GLOBAL_NAMES[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            if int(layer) >= n_layers:
                continue
            gg_name = f"blk.{layer}.{LAYER_NAMES[rest]}"
            if arch == "llama" and rest.startswith("self_attn.q_proj."):
                data = permute(data, n_head, n_head)
            elif arch == "llama" and rest.startswith("self_attn.k_proj."):
                data = permute(data, n_head, n_kv)
        w.add_tensor(gg_name, np.ascontiguousarray(data, dtype=np.float16 if f16 and data.ndim == 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def plain(v):
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return list(v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def record_view(path):
    r = gguf.GGUFReader(path)
    meta = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = {"types": [t.name for t in field.types], "value": plain(field.contents())}
    tensors = []
    for t in r.tensors:
        flat = np.asarray(t.data, dtype=np.float64).reshape(-1)
        tensors.append({
            "name": t.name,
            "ne": [int(d) for d in t.shape],
            "type": t.tensor_type.name,
            "type_id": int(t.tensor_type),
            "n_elements": int(t.n_elements),
            "offset": int(t.data_offset),
            "first": flat[:4].tolist(),
            "sum": float(flat.sum()),
        })
    view = {
        "generator": "tools/make_gguf_fixtures.py",
        "gguf_py": getattr(gguf, "__version__", None),
        "version": plain(r.fields["GGUF.version"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": meta,
        "tensors": tensors,
    }
    path.with_suffix(".view.json").write_text(json.dumps(view, indent=1, ensure_ascii=False) + "\n")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, arch, pre in [("llama3", "llama", "gpt-2"), ("qwen2", "qwen2", "qwen2")]:
        path = OUT / f"{name}.gguf"
        convert(HF / name, arch, pre, path)
        record_view(path)
    for p in sorted(OUT.iterdir()):
        print(f"{p.relative_to(ROOT)}  {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
